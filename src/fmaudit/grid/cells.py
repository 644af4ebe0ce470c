"""Cell-level probes (CellPath-Bench, seed 002), declared ahead of their rules: feature fields per (encoder,
section, magnification) and probes per protocol (IS, IOCD, MOCV, LOOO) and evaluation unit."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fmaudit.grid.frames import concat_runs, product_frame
from fmaudit.grid.studies import parts_with, require_tasks
from fmaudit.io import FmauditInputError

CELL_PROTOCOLS = ("IS", "IOCD", "MOCV", "LOOO")

__all__ = ["CELL_PROTOCOLS", "cell_feature_runs", "cell_runs", "check_cell_protocols"]


def _cell_units(cells: Mapping[str, Any], protocol: str, spec: Mapping[str, Any],
                where: str) -> tuple[list[str], list[str]]:
    """(units, organ of each unit) of one cell protocol; see the cells section of the config schema."""
    sections = cells["sections"]
    if protocol == "IS":
        units = [(s, organ) for organ, secs in sections.items() for s in secs]
    elif protocol == "IOCD":
        min_sections = int(spec["min_sections_per_organ"])
        units = [(s, organ) for organ, secs in sections.items() if len(secs) >= min_sections for s in secs]
    elif protocol == "MOCV":
        units = [(f"fold{i}", "") for i in range(int(spec["folds"]))]
    elif protocol == "LOOO":
        units = [(organ, organ) for organ in sections]
    else:  # the schema lists the protocols; this guards direct callers
        raise FmauditInputError(f"config '{where}': unknown cell protocol {protocol!r} ({', '.join(CELL_PROTOCOLS)})")
    if not units:
        raise FmauditInputError(f"config '{where}': protocol {protocol} has no evaluation unit")
    return [u for u, _ in units], [o for _, o in units]


def _check_cells(part: Mapping[str, Any], cells: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    require_tasks(part, cells["taxonomies"].values(), f"{where}.taxonomies")
    seen: dict[str, str] = {}
    for organ, secs in cells["sections"].items():
        for s in secs:
            if s in seen:
                raise FmauditInputError(f"config '{where}.sections.{organ}': section {s!r} is also under {seen[s]!r}")
            seen[s] = organ
    return cells


def cell_feature_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Cell features (CellPath-Bench): each encoder's feature field of each section at each magnification,
    sampled at the registered nuclei once for every readout."""
    frames = []
    for where, part, cells in parts_with(config, "cells"):
        _check_cells(part, cells, where)
        sections = [s for secs in cells["sections"].values() for s in secs]
        frames.append(product_frame({"encoder": part["encoders"], "section": sections,
                                      "magnification": list(cells["magnifications"])}, analysis="cell_features"))
    return concat_runs(frames, ["analysis", "encoder", "section", "magnification"])


def cell_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Cell-level probes (CellPath-Bench): per protocol, encoder × magnification × taxonomy × readout × seed ×
    evaluation unit (IS: section; IOCD: section of an organ with enough sections; MOCV: fold; LOOO: organ)."""
    frames = []
    for where, part, cells in parts_with(config, "cells"):
        _check_cells(part, cells, where)
        for protocol in CELL_PROTOCOLS:
            spec = (cells.get("protocols") or {}).get(protocol)
            if spec is None:
                continue
            units, organs = _cell_units(cells, protocol, spec, f"{where}.protocols.{protocol}")
            frame = product_frame({
                "encoder": part["encoders"], "magnification": list(cells["magnifications"]),
                "taxonomy": list(cells["taxonomies"]), "readout": list(cells["readouts"]),
                "seed": [int(s) for s in spec["seeds"]], "unit": units,
            }, analysis="cells", protocol=protocol)
            organ_of = dict(zip(units, organs))
            frame["organ"] = frame["unit"].map(organ_of).astype("category")
            frames.append(frame)
    cols = ["analysis", "protocol", "encoder", "magnification", "taxonomy", "readout", "seed", "unit", "organ"]
    return concat_runs(frames, cols)


def check_cell_protocols(config: Mapping[str, Any]) -> None:
    """The checks of :func:`cell_runs` without building its run table (cheap enough for every dry-run)."""
    for where, part, cells in parts_with(config, "cells"):
        _check_cells(part, cells, where)
        for protocol, spec in (cells.get("protocols") or {}).items():
            _cell_units(cells, protocol, spec, f"{where}.protocols.{protocol}")

"""Cell-level probes (CellPath-Bench), declared ahead of their rules: feature fields per (encoder,
section, magnification) and probes per protocol (IS, IOCD, MOCV, LOOO) and evaluation unit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.grid.frames import concat_runs, product_frame
from fmaudit.grid.studies import parts_with, require_tasks
from fmaudit.io import FmauditInputError

CELL_PROTOCOLS = ("IS", "IOCD", "MOCV", "LOOO")

__all__ = ["CELL_PROTOCOLS", "CellPlan", "cell_feature_runs", "cell_plan", "cell_run_counts", "cell_runs",
           "check_cell_protocols", "protocol_sections"]


def _cell_units(cells: Mapping[str, Any], protocol: str, spec: Mapping[str, Any],
                where: str) -> tuple[list[str], list[str]]:
    """(units, organ of each unit) of one cell protocol; see the cells block of the config schema."""
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
    sampled at the registered nuclei once for every readout.

    Parameters
    ----------
    config : Mapping
        The filled config (or one study part of it) with a ``cells`` block.
    dataset_registry : Mapping, optional
        Unused; taken for the common signature of the analyses' run builders.

    Returns
    -------
    DataFrame
        One row per feature field, columns ``analysis`` (``cell_features``), ``encoder``, ``section``,
        ``magnification``.

    Raises
    ------
    FmauditInputError
        When a taxonomy names an unknown task, or a section is under two organs.
    """
    frames = []
    for where, part, cells in parts_with(config, "cells"):
        _check_cells(part, cells, where)
        sections = [s for secs in cells["sections"].values() for s in secs]
        frames.append(product_frame({"encoder": part["encoders"], "section": sections,
                                      "magnification": list(cells["magnifications"])}, analysis="cell_features"))
    return concat_runs(frames, ["analysis", "encoder", "section", "magnification"])


def cell_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Cell-level probes (CellPath-Bench): per protocol, encoder × magnification × taxonomy × readout × seed ×
    evaluation unit (IS: section; IOCD: section of an organ with enough sections; MOCV: fold; LOOO: organ).

    Parameters
    ----------
    config : Mapping
        The filled config with a ``cells`` block.
    dataset_registry : Mapping, optional
        Unused; taken for the common signature of the analyses' run builders.

    Returns
    -------
    DataFrame
        One row per run, columns ``analysis`` (``cells``), ``protocol``, ``encoder``, ``magnification``,
        ``taxonomy``, ``readout``, ``seed``, ``unit`` and ``organ`` (empty for MOCV folds).

    Raises
    ------
    FmauditInputError
        When a taxonomy names an unknown task, a section is under two organs, or a protocol has no unit.
    """
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


def cell_run_counts(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """:func:`cell_runs` counted, not built: one row per job (its job keys and ``protocol``) with ``runs``,
    the number of its rows in :func:`cell_runs` (taxonomies x readouts x seeds x units of the protocol), in
    the same job order. A few hundred rows where the run table has ~300,000.

    Parameters
    ----------
    config : Mapping
        The filled config with a ``cells`` block.
    dataset_registry : Mapping, optional
        Unused; taken for the common signature of the analyses' run counters.

    Returns
    -------
    DataFrame
        Columns ``protocol``, ``encoder``, ``magnification``, ``runs``.

    Raises
    ------
    FmauditInputError
        As :func:`cell_runs`.
    """
    rows = []
    for where, part, cells in parts_with(config, "cells"):
        _check_cells(part, cells, where)
        for protocol in CELL_PROTOCOLS:
            spec = (cells.get("protocols") or {}).get(protocol)
            if spec is None:
                continue
            units, _ = _cell_units(cells, protocol, spec, f"{where}.protocols.{protocol}")
            per_job = len(cells["taxonomies"]) * len(cells["readouts"]) * len(spec["seeds"]) * len(units)
            rows += [{"protocol": protocol, "encoder": e, "magnification": m, "runs": per_job}
                     for e in part["encoders"] for m in cells["magnifications"]]
    frame = pd.DataFrame(rows, columns=["protocol", "encoder", "magnification", "runs"])
    return frame.drop_duplicates(["encoder", "magnification", "protocol"], ignore_index=True)


def check_cell_protocols(config: Mapping[str, Any]) -> None:
    """The checks of :func:`cell_runs` without building its run table (cheap enough for every dry-run).

    Parameters
    ----------
    config : Mapping
        The filled config; a config without ``cells`` passes.

    Raises
    ------
    FmauditInputError
        When a taxonomy names an unknown task, a section is under two organs, or a protocol is unknown or has
        no unit.
    """
    for where, part, cells in parts_with(config, "cells"):
        _check_cells(part, cells, where)
        for protocol, spec in (cells.get("protocols") or {}).items():
            _cell_units(cells, protocol, spec, f"{where}.protocols.{protocol}")


# --------------------------------------------------------------------------------------------------------
# what the workflow plans (rules/cells.smk)
# --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CellPlan:
    """The cell branch of a config as the workflow plans it.

    Attributes
    ----------
    where : str
        The config path of the study part holding the ``cells`` block (``cells``, or ``studies.<name>.cells``).
    cells : Mapping
        The (filled) ``cells`` section.
    encoders : tuple of str
        The study's encoders.
    taxonomy_tasks : Mapping of str to str
        Taxonomy -> the task whose label space it maps cells into.
    organ_of : Mapping of str to str
        Section -> its organ, in config order.
    dataset_of : Mapping of str to str
        Section -> the data set listing it.
    feature_jobs : tuple of (str, str)
        ``(encoder, section)`` of every feature job (one job embeds a section at every magnification, the
        encoder loaded once), in grid order (:data:`fmaudit.grid.JOB_KEYS`).
    shard_jobs : tuple of (str, float, str)
        ``(encoder, magnification, protocol)`` of every shard job, in grid order.
    """

    where: str
    cells: Mapping[str, Any]
    encoders: tuple[str, ...]
    taxonomy_tasks: Mapping[str, str]
    organ_of: Mapping[str, str]
    dataset_of: Mapping[str, str]
    feature_jobs: tuple[tuple[str, str], ...]
    shard_jobs: tuple[tuple[str, float, str], ...]

    @property
    def sections(self) -> list[str]:
        """Every section of the plan, in config order (the keys of ``organ_of``)."""
        return list(self.organ_of)


def protocol_sections(cells: Mapping[str, Any], protocol: str) -> list[str]:
    """Sections a protocol's shard reads (IOCD: those of organs with enough sections; others: every one).

    Parameters
    ----------
    cells : Mapping
        The filled ``cells`` block (``sections``: organ -> section ids; ``protocols``).
    protocol : str
        ``IS``, ``IOCD``, ``MOCV`` or ``LOOO``.

    Returns
    -------
    list of str
        Section ids in config order.
    """
    sections = cells["sections"]
    if protocol == "IOCD":
        min_sections = int(cells["protocols"]["IOCD"]["min_sections_per_organ"])
        return [s for secs in sections.values() if len(secs) >= min_sections for s in secs]
    return [s for secs in sections.values() for s in secs]


def cell_plan(config: Mapping[str, Any], section_lists: Mapping[str, Sequence[str] | None]) -> CellPlan | None:
    """The cell branch of ``config`` (None without a ``cells`` section), the data set of each section found
    from ``section_lists`` (data set -> the section ids its parameters list, or None for a data set that
    lists none yet, e.g. a preset's placeholder panel): a section belongs to the one data set of its
    taxonomies' tasks that lists it, or to the only data set of those tasks. Job lists are built from the
    config's factors directly (the shard jobs are the distinct job keys of :func:`cell_runs`), so the
    dry-run of a 300,000-run grid never builds its run table.

    Parameters
    ----------
    config : Mapping
        The filled config.
    section_lists : Mapping
        Data set -> the section ids its params list, or None where it lists none yet.

    Returns
    -------
    CellPlan or None
        The plan, None when the config has no ``cells`` block.

    Raises
    ------
    FmauditInputError
        When several study parts have a ``cells`` block, a section is listed by no data set (with several
        candidates) or by several, or the protocols fail their checks.
    """
    parts = list(parts_with(config, "cells"))
    if not parts:
        return None
    if len(parts) > 1:
        raise FmauditInputError(f"config: the cell branch plans one study's cells; "
                                f"found {', '.join(w for w, _, _ in parts)}")
    where, part, cells = parts[0]
    _check_cells(part, cells, where)
    check_cell_protocols(config)
    tasks = dict(cells["taxonomies"])
    datasets = list(dict.fromkeys(ds for t in tasks.values() for ds in part["tasks"][t]["datasets"]))
    organ_of = {s: organ for organ, secs in cells["sections"].items() for s in secs}
    dataset_of = {}
    for s in organ_of:
        listing = [ds for ds in datasets if s in (section_lists.get(ds) or ())]
        if len(listing) == 1 or (not listing and len(datasets) == 1):
            dataset_of[s] = (listing or datasets)[0]
        elif not listing:
            raise FmauditInputError(f"config '{where}.sections': section {s!r} is listed by none of the data sets "
                                    f"{datasets} of the taxonomy tasks (dataset_params.<dataset>.sections)")
        else:
            raise FmauditInputError(f"config '{where}.sections': section {s!r} is listed by several data sets "
                                    f"{listing}")
    mags = [float(m) for m in cells["magnifications"]]
    encoders = tuple(part["encoders"])
    features = tuple((e, s) for e in encoders for s in organ_of)
    protocols = [p for p in CELL_PROTOCOLS if (cells.get("protocols") or {}).get(p) is not None]
    shard_jobs = tuple((e, m, p) for p in protocols for e in encoders for m in mags)
    return CellPlan(where=where, cells=cells, encoders=encoders, taxonomy_tasks=tasks, organ_of=organ_of,
                    dataset_of=dataset_of, feature_jobs=features, shard_jobs=shard_jobs)

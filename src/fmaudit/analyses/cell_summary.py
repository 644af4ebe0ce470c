"""The cell branch's report results (CellPath-Bench, seed 002), computed from the aggregated run table of every
cell shard with :mod:`fmaudit.cells.metrics`; :mod:`fmaudit.report.cells` only formats them.

Magnifications: the CRA, CRT, win and readout tables are given at every magnification of the config; the
landscape figure at the *main* magnification (20x when the config has it, else the highest), the retention
table against the highest magnification (the seed's 40x reference). Every summary is over units (sections,
folds, organs), each first averaged over its valid seeds; every spread says its unit and count.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.cells.metrics import (
    CRT_DEFINITION,
    cra_per_section,
    cra_table,
    crt_table,
    magnification_retention,
    pretraining_scale,
    readout_table,
    win_matrix,
)
from fmaudit.stats import wilcoxon_smallest_p

__all__ = ["main_magnification", "summarize_cell_runs"]

UNIT_NAMES = {"IS": "section", "IOCD": "held-out section", "MOCV": "fold", "LOOO": "organ"}


def main_magnification(magnifications: Sequence[float]) -> float:
    """20x when the config has it (the seed's headline), else the highest."""
    mags = [float(m) for m in magnifications]
    return 20.0 if any(np.isclose(m, 20.0) for m in mags) else max(mags)


def summarize_cell_runs(runs: pd.DataFrame, settings: Mapping[str, Any], qc: Mapping[str, str],
                        alpha: float = 0.05) -> dict[str, Any]:
    """Everything the report's cell section shows.

    ``runs``: the aggregated cell runs (rows of :func:`fmaudit.analyses.cell_suite.run_cell_shard`);
    ``settings``: ``magnifications``, ``protocols``, ``taxonomies``, ``pretraining_wsis`` (encoder -> the
    registry's WSI-equivalent pretraining count or None); ``qc``: section -> QC overlay PNG."""
    mags = [float(m) for m in settings["magnifications"]]
    main = main_magnification(mags)
    ok = runs[runs["status"].astype(str) == "ok"] if len(runs) else runs
    cra = cra_table(runs, magnification=None, alpha=alpha) if len(ok) else pd.DataFrame()
    if len(cra):
        cra["unit"] = [f"section (IS), n={n}; mean over seeds first; SD ddof=1" for n in cra["n_sections"]]
        # the smallest p the two-sided Wilcoxon test can reach on this many sections: at or above alpha, a
        # significant win is impossible and nuc_beats_mean / significant_wins say nothing
        cra["wilcoxon_smallest_p"] = [wilcoxon_smallest_p(int(n)) for n in cra["n_sections"]]
    crt = pd.concat([crt_table(runs, magnification=m) for m in mags], ignore_index=True) if len(ok) else pd.DataFrame()
    if len(crt):
        crt["unit"] = [f"protocol units (IOCD held-out section, MOCV fold, LOOO organ), n={n}" for n in crt["n_units"]]
    wins = []
    per_section = cra_per_section(runs) if len(ok) else pd.DataFrame()
    for (m, tax), group in (per_section.groupby(["magnification", "taxonomy"], sort=False) if len(per_section) else []):
        table = group.pivot_table(index="section", columns="encoder", values="cra_pp", aggfunc="mean")
        if table.shape[1] < 2:
            continue
        matrix = win_matrix(table, alpha)
        matrix.insert(0, "taxonomy", tax)
        matrix.insert(1, "magnification", m)
        matrix["unit"] = "section (IS): paired Wilcoxon of CRA over common sections"
        wins.append(matrix)
    win = pd.concat(wins, ignore_index=True) if wins else pd.DataFrame()
    if len(mags) > 1 and len(ok):
        retention = magnification_retention(runs, protocol="IS", readout="nuc", reference=max(mags))
        retention["unit"] = "section (IS), units valid at every magnification"
    else:
        retention = pd.DataFrame({"note": [f"one magnification ({mags[0]:g}x): no retention to compute"]})
    readouts = (pd.concat([readout_table(runs, "IS", m) for m in mags], ignore_index=True) if len(ok)
                else pd.DataFrame())
    scale = pretraining_scale({e: {"pretraining_wsis": v} for e, v in settings.get("pretraining_wsis", {}).items()},
                              list(settings.get("pretraining_wsis", {})))
    status = (runs.groupby(["protocol", "status"], sort=False).size().rename("runs").reset_index()
              if len(runs) else pd.DataFrame())
    return {"cra": cra, "crt": crt, "win_matrix": win, "retention": retention, "readouts": readouts,
            "status": status, "scale": scale, "main_magnification": main, "qc": dict(qc),
            "crt_definition": CRT_DEFINITION, "taxonomies": list(settings.get("taxonomies", {})),
            "n_runs": int(len(runs)), "n_ok": int(len(ok))}

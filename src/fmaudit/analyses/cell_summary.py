"""The cell branch's report results (CellPath-Bench), computed from the aggregated run table of every
cell shard with :mod:`fmaudit.cells.metrics`; :mod:`fmaudit.report.cells` only formats them.

Headlines are organ-balanced, as CellPath-Bench's tables (its units averaged within each organ, mean ± SD across
organs; MOCV across its folds); each has its unit-level form beside it (mean ± SD over sections, held-out
sections, folds, organs). Significant wins are paired Wilcoxon tests over every common valid (unit, seed) run.
Magnifications: the CRA, CRT, decodability, win and readout tables are given at every magnification of the
config; the landscape figure at the *main* magnification (20x when the config has it, else the highest), the
retention table against the highest magnification (CellPath-Bench's 40x reference).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.cells.metrics import (
    CRT_DEFINITION,
    WIN_UNITS,
    check_nested,
    cra_per_run,
    cra_table,
    crt_table,
    magnification_retention,
    nested_section_subsets,
    pretraining_scale,
    protocol_table,
    readout_table,
    run_level_table,
    subset_table,
    taxonomy_rank_consistency,
    win_matrix,
)
from fmaudit.io import FmauditInputError
from fmaudit.stats import wilcoxon_smallest_p

__all__ = ["main_magnification", "section_subsets", "summarize_cell_runs"]

UNIT_NAMES = {"IS": "section", "IOCD": "held-out section", "MOCV": "fold", "LOOO": "organ"}
#: The readouts of the decodability table: Nuc (absolute decodability) and Mean beside it under IS.
DECODABILITY_READOUTS = {"IS": ("nuc", "mean")}


def main_magnification(magnifications: Sequence[float]) -> float:
    """20x when the config has it (CellPath-Bench's headline), else the highest.

    Parameters
    ----------
    magnifications : sequence of float
        The config's ``cells.magnifications`` (at least one).

    Returns
    -------
    float
        The main magnification.
    """
    mags = [float(m) for m in magnifications]
    return 20.0 if any(np.isclose(m, 20.0) for m in mags) else max(mags)


def section_subsets(subsets: Mapping[str, Any] | None, scores: pd.DataFrame | None,
                    sections: Sequence[str]) -> tuple[dict[str, list[str]] | None, str]:
    """The nested section subsets (``S<n>``) of ``cells.subsets`` and why there are none: explicit ``lists``
    (checked nested), else the top-n sections by ``scores`` (a table with columns section, score; CellPath-Bench ranks
    by morphology-annotation concordance) at each of ``sizes`` that the panel can fill.

    Parameters
    ----------
    subsets : mapping or None
        The config's ``cells.subsets``: ``lists`` (subset name -> sections, nested) or ``sizes`` (numbers of
        top-scored sections).
    scores : DataFrame or None
        The section ranking (columns ``section``, ``score``; higher first), read when ``lists`` is not given.
    sections : sequence of str
        Every section of the panel; scored sections outside it are ignored.

    Returns
    -------
    subsets : dict of str to list of str, or None
        Subset name -> its sections; None when there are none.
    reason : str
        Why there are none (empty when there are).

    Raises
    ------
    FmauditInputError
        A list names a section outside the panel or the lists are not nested, or the scores table lacks
        ``section`` or ``score``.
    """
    subsets = dict(subsets or {})
    if subsets.get("lists"):
        lists = {str(k): [str(s) for s in v] for k, v in subsets["lists"].items()}
        unknown = sorted({s for v in lists.values() for s in v} - set(sections))
        if unknown:
            raise FmauditInputError(f"config 'cells.subsets.lists': {unknown[:3]} are not sections of cells.sections")
        check_nested(lists)
        return lists, ""
    if scores is None:
        return None, "no section ranking (config cells.subsets.scores or cells.subsets.lists)"
    missing = [c for c in ("section", "score") if c not in scores.columns]
    if missing:
        raise FmauditInputError(f"config 'cells.subsets.scores': the table has no column(s) {missing}")
    ranked = scores.set_index(scores["section"].astype(str))["score"]
    ranked = ranked[ranked.index.isin(list(sections))]
    sizes = [int(n) for n in subsets.get("sizes") or [] if int(n) <= len(ranked)]
    if not sizes:
        return None, f"no subset size fits the {len(ranked)} scored sections (cells.subsets.sizes)"
    return nested_section_subsets(ranked, sizes), ""


def _decodability(runs: pd.DataFrame, protocols: Sequence[str], mags: Sequence[float], alpha: float,
                  balance: str) -> pd.DataFrame:
    parts = []
    for protocol in protocols:
        for readout in DECODABILITY_READOUTS.get(protocol, ("nuc",)):
            for m in mags:
                table = protocol_table(runs, protocol, m, readout=readout, alpha=alpha, balance=balance)
                if len(table):
                    parts.append(table)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def summarize_cell_runs(runs: pd.DataFrame, settings: Mapping[str, Any], qc: Mapping[str, str],
                        alpha: float = 0.05, subset_scores: pd.DataFrame | None = None) -> dict[str, Any]:
    """Everything the report's cell section shows.

    ``runs``: the aggregated cell runs (rows of :func:`fmaudit.analyses.cell_suite.run_cell_shard`);
    ``settings``: ``magnifications``, ``protocols``, ``taxonomies``, ``pretraining_wsis`` (encoder -> the
    registry's WSI-equivalent pretraining count or None), ``sections`` (every section of the panel) and
    ``subsets`` (``cells.subsets``); ``qc``: section -> QC overlay PNG; ``subset_scores``: the table of
    ``cells.subsets.scores`` (section, score) when the config names one.

    Parameters
    ----------
    runs : DataFrame
        The aggregated cell runs; only ``status == "ok"`` rows carry metrics.
    settings : mapping
        ``magnifications``, ``protocols``, ``taxonomies``, ``pretraining_wsis``, ``sections`` and ``subsets``
        (above).
    qc : mapping of str to str
        Section -> the path of its QC overlay PNG.
    alpha : float
        Significance level of the paired Wilcoxon tests; default 0.05.
    subset_scores : DataFrame or None
        The section ranking for the subsets.

    Returns
    -------
    dict
        DataFrames ``cra`` (organ-balanced) and ``cra_sections`` (over sections), both with
        ``wilcoxon_smallest_p``; ``crt`` (every magnification, with ``unit``), ``decodability`` and
        ``decodability_units``, ``taxonomy_consistency``, ``win_matrix``, ``retention``, ``readouts``,
        ``subsets``, ``subset_ranks``, ``status`` (runs per protocol and status) and ``scale``; and
        ``main_magnification`` (float), ``qc`` (dict), ``crt_definition`` (str), ``taxonomies`` (list),
        ``n_runs`` and ``n_ok`` (int). A table that cannot be computed holds a ``note`` column saying why, or is
        empty without valid runs.

    Raises
    ------
    FmauditInputError
        As :func:`section_subsets`.
    """
    mags = [float(m) for m in settings["magnifications"]]
    main = main_magnification(mags)
    ok = runs[runs["status"].astype(str) == "ok"] if len(runs) else runs
    protocols = [p for p in UNIT_NAMES if p in set(ok["protocol"].astype(str))] if len(ok) else []
    empty = pd.DataFrame()
    cra = cra_table(runs, magnification=None, alpha=alpha, balance="organ") if len(ok) else empty
    cra_sections = cra_table(runs, magnification=None, alpha=alpha, balance="unit") if len(ok) else empty
    crt = pd.concat([crt_table(runs, magnification=m, alpha=alpha) for m in mags], ignore_index=True) \
        if len(ok) else empty
    for table in (cra, cra_sections):
        if len(table):
            # the smallest p the two-sided Wilcoxon test can reach over this many (section, seed) runs: at or above
            # alpha, a significant win is impossible and nuc_beats_mean / significant_wins say nothing
            counts = table["n_win_units"] if "n_win_units" in table.columns else table["n_sections"]
            table["wilcoxon_smallest_p"] = [wilcoxon_smallest_p(int(n)) for n in counts]
    if len(crt):
        crt["unit"] = [f"wins over {WIN_UNITS}; relative macro-F1 over protocol units (IOCD held-out section, MOCV "
                       f"fold, LOOO organ), n={n}" for n in crt["n_units"]]
    decodability = _decodability(runs, protocols, mags, alpha, "organ") if len(ok) else empty
    decodability_units = _decodability(runs, protocols, mags, alpha, "unit") if len(ok) else empty
    consistency = (pd.concat([taxonomy_rank_consistency(runs, m) for m in mags], ignore_index=True)
                   if len(ok) and len(settings.get("taxonomies", {})) >= 2 else empty)
    wins = []
    per_run = cra_per_run(runs, None) if len(ok) else empty
    for (m, tax), group in (per_run.groupby(["magnification", "taxonomy"], sort=False) if len(per_run) else []):
        table = run_level_table(group, "cra_pp")
        if table.shape[1] < 2:
            continue
        matrix = win_matrix(table, alpha)
        matrix.insert(0, "taxonomy", tax)
        matrix.insert(1, "magnification", m)
        matrix["unit"] = f"IS CRA, paired Wilcoxon over {WIN_UNITS}"
        wins.append(matrix)
    win = pd.concat(wins, ignore_index=True) if wins else empty
    if len(mags) > 1 and len(ok):
        retention = magnification_retention(runs, protocol="IS", readout="nuc", reference=max(mags))
        retention["unit"] = "section (IS), units valid at every magnification"
    else:
        retention = pd.DataFrame({"note": [f"one magnification ({mags[0]:g}x): no retention to compute"]})
    readouts = (pd.concat([readout_table(runs, "IS", m) for m in mags], ignore_index=True) if len(ok)
                else empty)
    subsets, why = section_subsets(settings.get("subsets"), subset_scores, settings.get("sections") or [])
    if subsets and len(ok) and "IS" in protocols:
        tables = [(m, *subset_table(runs, subsets, m, alpha)) for m in mags]
        subset_cra = pd.concat([t for _, t, _ in tables], ignore_index=True)
        subset_ranks = pd.concat([r.assign(magnification=m) for m, _, r in tables], ignore_index=True)
    else:
        note = why or "no valid IS run to re-summarise on section subsets"
        subset_cra, subset_ranks = pd.DataFrame({"note": [note]}), pd.DataFrame({"note": [note]})
    scale = pretraining_scale({e: {"pretraining_wsis": v} for e, v in settings.get("pretraining_wsis", {}).items()},
                              list(settings.get("pretraining_wsis", {})))
    status = (runs.groupby(["protocol", "status"], sort=False).size().rename("runs").reset_index()
              if len(runs) else empty)
    return {"cra": cra, "cra_sections": cra_sections, "crt": crt, "decodability": decodability,
            "decodability_units": decodability_units, "taxonomy_consistency": consistency, "win_matrix": win,
            "retention": retention, "readouts": readouts, "subsets": subset_cra, "subset_ranks": subset_ranks,
            "status": status, "scale": scale, "main_magnification": main, "qc": dict(qc),
            "crt_definition": CRT_DEFINITION, "taxonomies": list(settings.get("taxonomies", {})),
            "n_runs": int(len(runs)), "n_ok": int(len(ok))}

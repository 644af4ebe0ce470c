"""The OOD section's results, from the aggregated OOD shard tables (the report formats them and computes nothing).

Tasks are *categorical* or *grading* (ordinal labels, ``tasks.<t>.ordinal``); the audit paper summarises the two kinds
apart. The per-tier summary is the mean detection AUROC over a tier's conditions (and tasks) per encoder and
scorer, with the spread over conditions; it has no interval of its own (each condition's row carries its
cluster-bootstrap interval, unit and count).
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fmaudit.ood.gate import DIVISION_MEAN

#: Tiers in report order.
TIER_ORDER = ("far", "blur", "near", "artefact", "image_artefact")
GATE_QUANTITIES = ("coverage", "reject_novel", "reject_unconfident", "reject_any", "accuracy_ungated",
                   "accuracy_accepted")

__all__ = ["DIVISION_MEAN", "GATE_QUANTITIES", "TIER_ORDER", "summarize_ood", "task_kind"]


def task_kind(ordinal: bool) -> str:
    """The kind of a task, as the audit paper summarises tasks apart.

    Parameters
    ----------
    ordinal : bool
        The task's labels are ordered grades (``tasks.<t>.ordinal``).

    Returns
    -------
    str
        ``grading`` for an ordinal task, else ``categorical``.
    """
    return "grading" if ordinal else "categorical"


def _kinds(df: pd.DataFrame, settings: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    if len(df) == 0 or "task" not in df.columns:
        return df
    df = df.copy()
    df.insert(df.columns.get_loc("task") + 1, "task_kind",
              [task_kind(bool((settings.get(t) or {}).get("ordinal", False))) for t in df["task"]])
    return df


def _tier_rank(tiers: pd.Series) -> pd.Series:
    order = {t: i for i, t in enumerate(TIER_ORDER)}
    return tiers.map(order).fillna(len(order))


def detection_by_tier(detection: pd.DataFrame) -> pd.DataFrame:
    """Mean, min and max detection AUROC over the conditions of each (task kind, tier, scorer, encoder), with
    the mean FPR at 95% TPR and how many conditions and tasks were averaged.

    Parameters
    ----------
    detection : DataFrame
        The detection rows with their ``task_kind`` (as :func:`summarize_ood` adds it): ``task``, ``tier``,
        ``condition``, ``scorer``, ``encoder``, ``auroc``, ``fpr_at_95tpr``.

    Returns
    -------
    DataFrame
        One row per task kind, tier, scorer and encoder: ``mean_auroc``, ``min_auroc``, ``max_auroc``,
        ``mean_fpr_at_95tpr``, ``n_conditions``, ``n_tasks``; sorted by kind, tier (:data:`TIER_ORDER`),
        scorer and descending mean AUROC. Empty without detection rows.
    """
    if len(detection) == 0:
        return pd.DataFrame()
    keys = ["task_kind", "tier", "scorer", "encoder"]
    out = (detection.groupby(keys, sort=False)
           .agg(mean_auroc=("auroc", "mean"), min_auroc=("auroc", "min"), max_auroc=("auroc", "max"),
                mean_fpr_at_95tpr=("fpr_at_95tpr", "mean"), n_conditions=("condition", "nunique"),
                n_tasks=("task", "nunique"))
           .reset_index())
    out = out.assign(_t=_tier_rank(out["tier"])).sort_values(["task_kind", "_t", "scorer", "mean_auroc"],
                                                            ascending=[True, True, True, False])
    return out.drop(columns="_t").reset_index(drop=True)


def gate_summary(gate: pd.DataFrame) -> pd.DataFrame:
    """One row per (encoder, task, setting, set): each main quantity of the gate as the paper reports it (the
    gate of one fit/validation division, division 0, which is also the exported gate: column ``<quantity>``),
    and, as a separately named second form, its mean over the divisions with the percentile interval of the
    bootstrap draws pooled over them (``<quantity>_mean_over_divisions``, ``..._ci_lo``, ``..._ci_hi``).

    Parameters
    ----------
    gate : DataFrame
        The long gate table of the shards (:func:`fmaudit.ood.gate.gate_operating_points` with ``encoder``,
        ``task``, ``task_kind``, ``setting``): a row per setting, set and ``quantity`` with ``value``,
        ``mean_over_divisions`` and its interval, ``n_items``, ``n_splits``, ``n_boot``, ``ci_unit``,
        ``ci_n_units``; the ``validation`` set's rows hold the thresholds.

    Returns
    -------
    DataFrame
        One row per encoder, task, task kind, setting, set and tier (the validation set aside): every
        :data:`GATE_QUANTITIES` name present with its ``_mean_over_divisions`` and interval, ``n_items``,
        ``n_splits``, ``n_boot``, ``ci_unit``, ``ci_n_units``, ``division_strata`` (where given) and the
        division-0 thresholds ``tau_novelty``, ``tau_confidence`` and ``gate_C``. Empty without gate rows.
    """
    if len(gate) == 0:
        return pd.DataFrame()
    keys = ["encoder", "task", "task_kind", "setting", "set", "tier"]
    rows = []
    for key, part in gate[gate["set"] != "validation"].groupby(keys, sort=False):
        row = dict(zip(keys, key))
        q = part.set_index("quantity")
        for name in GATE_QUANTITIES:
            if name in q.index:
                row[name] = float(q.loc[name, "value"])
                mean = f"{name}_{DIVISION_MEAN}"
                row[mean] = float(q.loc[name, DIVISION_MEAN])
                row[f"{mean}_ci_lo"] = float(q.loc[name, f"{DIVISION_MEAN}_ci_lo"])
                row[f"{mean}_ci_hi"] = float(q.loc[name, f"{DIVISION_MEAN}_ci_hi"])
        first = part.iloc[0]
        row.update(n_items=int(first["n_items"]), n_splits=int(first["n_splits"]), n_boot=int(first["n_boot"]),
                   ci_unit=first["ci_unit"], ci_n_units=int(first["ci_n_units"]))
        if "division_strata" in part.columns:
            row["division_strata"] = first["division_strata"]
        rows.append(row)
    thresholds = gate[(gate["set"] == "validation") & gate["quantity"].isin(["tau_novelty", "tau_confidence", "C"])]
    out = pd.DataFrame(rows)
    if len(thresholds):
        wide = thresholds.pivot_table(index=["encoder", "task", "setting"], columns="quantity", values="value",
                                      sort=False).reset_index()
        wide = wide.rename(columns={"C": "gate_C", "tau_novelty": "tau_novelty", "tau_confidence": "tau_confidence"})
        out = out.merge(wide, on=["encoder", "task", "setting"], how="left")
    return out


def _with_splits(stored: pd.DataFrame, further: pd.DataFrame) -> pd.DataFrame:
    """The stored split's rows (``splits`` = stored) and, after them, the further splits' pooled rows (the audit paper's
    probe metrics, slide aggregation and coarsening controls; ``splits`` = further)."""
    parts = []
    if len(stored):
        parts.append(stored.assign(splits="stored") if "splits" not in stored.columns else stored)
    if len(further):
        parts.append(further)
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    front = [c for c in ("encoder", "task", "task_kind", "readout", "splits") if c in out.columns]
    return out[front + [c for c in out.columns if c not in front]]


def summarize_ood(tables: Mapping[str, pd.DataFrame], settings: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Everything the OOD report chapter writes: ``tables`` are the aggregated shard tables by name
    (:data:`fmaudit.jobs.ood.AGGREGATE_TABLES`: the stored split's and the further splits'); ``settings`` maps
    each task to its reported OOD settings
    (``ordinal``, ``scorers``, ``n_boot``, ``n_splits`` ...).

    Parameters
    ----------
    tables : mapping of str to DataFrame
        The aggregated shard tables by name; a missing table gives an empty frame.
    settings : mapping of str to mapping
        Task -> its reported OOD settings; ``ordinal`` sets each row's ``task_kind``.

    Returns
    -------
    dict
        ``detection`` (sorted by kind, task, tier, condition, scorer, encoder), ``detection_by_tier``,
        ``gate``, ``gate_summary``, ``selective``, ``slides`` and ``coarsening`` (the stored split's rows, then
        the further splits', with ``splits``), ``curves``, ``blur``, ``histograms``, ``probe_sensitivity``,
        ``scorer_sensitivity`` (DataFrames, every table with ``task`` gaining ``task_kind`` after it),
        ``settings`` (task -> dict) and ``scorer_for_figures`` (``maha`` when it ran, else the first scorer;
        None without detection rows).
    """
    t = {name: _kinds(df, settings) for name, df in tables.items()}
    detection = t.get("detection", pd.DataFrame())
    if len(detection):
        detection = detection.assign(_t=_tier_rank(detection["tier"])).sort_values(
            ["task_kind", "task", "_t", "condition", "scorer", "encoder"], kind="stable").drop(columns="_t")
        detection = detection.reset_index(drop=True)
    selective = _with_splits(t.get("selective", pd.DataFrame()), t.get("split_selective", pd.DataFrame()))
    return {
        "detection": detection,
        "detection_by_tier": detection_by_tier(detection),
        "gate": t.get("gate", pd.DataFrame()),
        "gate_summary": gate_summary(t.get("gate", pd.DataFrame())),
        "selective": selective,
        "curves": t.get("curves", pd.DataFrame()),
        "blur": t.get("blur", pd.DataFrame()),
        "histograms": t.get("histograms", pd.DataFrame()),
        "slides": _with_splits(t.get("slides", pd.DataFrame()), t.get("split_slides", pd.DataFrame())),
        "coarsening": _with_splits(t.get("coarsening", pd.DataFrame()), t.get("split_coarsening", pd.DataFrame())),
        "probe_sensitivity": t.get("probe_sensitivity", pd.DataFrame()),
        "scorer_sensitivity": t.get("scorer_sensitivity", pd.DataFrame()),
        "settings": {task: dict(s) for task, s in settings.items()},
        "scorer_for_figures": _figure_scorer(detection),
    }


def _figure_scorer(detection: pd.DataFrame) -> str | None:
    """The scorer whose ID-vs-OOD histograms are drawn: Mahalanobis (the gate's) when it ran, else the first."""
    if len(detection) == 0:
        return None
    scorers = list(pd.unique(detection["scorer"]))
    return "maha" if "maha" in scorers else str(scorers[0])


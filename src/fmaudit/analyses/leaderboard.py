"""Leaderboards of the probe suite from the aggregated runs and the shard predictions: macro-F1 and ECE per
encoder and target with cluster-bootstrap intervals, paired differences to the in-domain best encoder, the
calibration ladder, the in-domain vs off-domain summary, and the data of the report's figures.

Intervals are percentile cluster-bootstrap intervals over the manifest's groups of the seed-averaged metric,
so that they describe the test-set sampling of the reported mean (:func:`fmaudit.stats.seed_mean_bootstrap`).
Every interval names its resampling unit and count (``ci_resampling``: ``unit=patient, n=43``; ``unit=item``
for data sets without patient ids, whose groups are their items). The paired differences' reference encoder
is the best on the source validation split (mean over seeds of its macro-F1 there), never on the test set
the intervals describe. Every function takes its settings explicitly: ``ece_bins`` (``calibration.ece_bins``),
``include_bound_temperatures`` (``calibration``), ``n_boot`` and ``seed`` (``bootstrap``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fmaudit.analyses.transfer import seed_means
from fmaudit.metrics import binned_metric_columns, ece, ece_column, ece_convention, reliability_bins, softmax
from fmaudit.stats import cell_resample_counts, percentile_interval, seed_mean_bootstrap

RUN_KEYS = ["task", "head", "fraction", "encoder", "source_domain", "target_domain"]
RESAMPLING = "cluster bootstrap of each row's unit (ci_resampling)"
#: What the paired differences' reference encoder is chosen on, in order of preference.
REFERENCE_CRITERIA = (("source_val_macro_f1", "macro-F1 on the source validation split, mean over seeds"),
                      ("source_train_macro_f1", "macro-F1 on the source training subset, mean over seeds "
                                                "(no validation items)"))

__all__ = [
    "RUN_KEYS",
    "bound_temperature_rule",
    "calibration_table",
    "cell_units",
    "exclude_bound_temperatures",
    "reference_encoder",
    "ece_by_fraction",
    "leaderboard",
    "paired_differences",
    "reliability_curves",
    "shift_summary",
]


def ci_convention(n_boot: int, alpha: float = 0.05) -> str:
    """How the intervals of a table were made, in words.

    Parameters
    ----------
    n_boot : int
        Bootstrap resamples behind the intervals (the schema's ``bootstrap.n_boot``).
    alpha : float
        One minus the intervals' coverage; default 0.05 (95% intervals).

    Returns
    -------
    str
        ``"95% percentile, cluster bootstrap of each row's unit (ci_resampling), B=1000, over the seed mean"``.
    """
    return f"{100 * (1 - alpha):g}% percentile, {RESAMPLING}, B={n_boot}, over the seed mean"


def cell_units(preds: pd.DataFrame) -> dict[str, Any]:
    """``ci_unit``, ``ci_n_units`` and ``ci_resampling`` (``unit=patient, n=43``) of one prediction cell.

    Parameters
    ----------
    preds : DataFrame
        The predictions of one cell (task, head, fraction, encoder, source and target domain), a row per seed and
        item: ``group`` and optionally ``group_unit``.

    Returns
    -------
    dict
        ``ci_unit`` (the cell's group units, ``+``-joined; ``group`` without the column), ``ci_n_units`` (its
        distinct groups) and ``ci_resampling``.
    """
    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.analyses.probe_suite import interval_resampling

    unit = ("+".join(sorted(set(preds["group_unit"].astype(str)))) if "group_unit" in preds.columns
            else "group")
    n = int(preds["group"].nunique())
    return {"ci_unit": unit, "ci_n_units": n, "ci_resampling": interval_resampling(unit, n)}


def _first(cell: pd.DataFrame, column: str, default: Any = None) -> Any:
    return cell[column].iloc[0] if column in cell.columns else default


def leaderboard(runs: pd.DataFrame, preds: pd.DataFrame, *, n_boot: int, seed: int, ece_bins: int,
                alpha: float = 0.05) -> pd.DataFrame:
    """In-domain and per-target macro-F1 (and ECE at ``ece_bins`` bins) at the largest label fraction, mean over
    seeds, with cluster-bootstrap CIs (one resample of the cell's groups for both metrics).

    Parameters
    ----------
    runs : DataFrame
        The probe suite's metric rows (:func:`fmaudit.analyses.probe_suite.run_probe_suite`, every shard): a row
        per run, target domain and ladder stage; only ``stage == "raw"`` at each task's largest fraction is read.
    preds : DataFrame
        The suite's predictions, a row per run and target item: :data:`RUN_KEYS`, ``seed``, ``group``,
        ``group_unit``, ``label``, ``logits``. Every raw cell of ``runs`` must have predictions.
    n_boot : int
        Bootstrap resamples of the cell's groups (keyword-only: the schema's ``bootstrap.n_boot``).
    seed : int
        Seed of the resampling (``bootstrap.seed``).
    ece_bins : int
        Equal-width bins of the top-label ECE (``calibration.ece_bins``).
    alpha : float
        One minus the intervals' coverage; default 0.05.

    Returns
    -------
    DataFrame
        One row per :data:`RUN_KEYS` cell: ``in_domain``, ``n_seeds``, ``n_test``, ``n_test_groups``,
        ``macro_f1`` with ``macro_f1_ci_lo``/``_ci_hi``, ``balanced_accuracy``, ``auroc_ovr_macro`` (seed means),
        ``ece_top_<bins>_lohi`` with ``ece_ci_lo``/``_ci_hi``, ``ci_unit``, ``ci_n_units``, ``ci_resampling``, the
        reference criteria's columns (``source_val_macro_f1``, ``source_train_macro_f1``) present in ``runs``,
        ``calibration_mode``, ``task_split``, ``rank_macro_f1`` (1 = best within task, head, fraction, source
        and target) and ``ci_convention``. Empty without raw runs.
    """
    raw = runs[runs["stage"] == "raw"]
    top = raw.groupby("task")["fraction"].transform("max")
    raw = raw[raw["fraction"] == top]
    cells = dict(tuple(preds.groupby(RUN_KEYS)))
    ece_col = ece_column(ece_bins)
    rows = []
    for key, cell in raw.groupby(RUN_KEYS, sort=True):
        sel = cells[key]
        order, labels, counts = cell_resample_counts(sel, n_boot, seed)
        f1, f1_boot = seed_mean_bootstrap(sel, "macro_f1", counts, order, labels)
        ece, ece_boot = seed_mean_bootstrap(sel, "ece", counts, order, labels, n_bins=ece_bins)
        f1_lo, f1_hi, _ = percentile_interval(f1_boot, alpha)
        ece_lo, ece_hi, _ = percentile_interval(ece_boot, alpha)
        rows.append({
            **dict(zip(RUN_KEYS, key)), "in_domain": bool(cell["in_domain"].iloc[0]), "n_seeds": cell["seed"].nunique(),
            "n_test": int(cell["n_test"].iloc[0]), "n_test_groups": int(cell["n_test_groups"].iloc[0]),
            "macro_f1": f1, "macro_f1_ci_lo": f1_lo, "macro_f1_ci_hi": f1_hi,
            "balanced_accuracy": cell["balanced_accuracy"].mean(), "auroc_ovr_macro": cell["auroc_ovr_macro"].mean(),
            ece_col: ece, "ece_ci_lo": ece_lo, "ece_ci_hi": ece_hi, **cell_units(sel),
            **{c: cell[c].mean() for c, _ in REFERENCE_CRITERIA if c in cell.columns},
            "calibration_mode": _first(cell, "calibration_mode"), "task_split": _first(cell, "task_split"),
        })
    df = pd.DataFrame(rows)
    if len(df):
        df["rank_macro_f1"] = df.groupby(["task", "head", "fraction", "source_domain", "target_domain"])[
            "macro_f1"].rank(ascending=False, method="min").astype(int)
        df["ci_convention"] = ci_convention(n_boot, alpha)
    return df


def reference_encoder(in_domain: pd.DataFrame) -> tuple[str, str] | None:
    """(encoder, criterion in words) of the best encoder of one (task, head, fraction, source) on data other
    than the evaluated test set: the source validation split's macro-F1 (mean over seeds), else, where no run
    had validation items, the source training subset's; ties to the first encoder name. None without either.

    Parameters
    ----------
    in_domain : DataFrame
        The leaderboard's in-domain rows of one (task, head, fraction, source): ``encoder`` and the columns of
        :data:`REFERENCE_CRITERIA`.

    Returns
    -------
    tuple of (str, str) or None
        The encoder and the criterion it was chosen on, in words.
    """
    for column, words in REFERENCE_CRITERIA:
        if column in in_domain.columns and in_domain[column].notna().any():
            ok = in_domain.dropna(subset=[column])
            return ok.sort_values([column, "encoder"], ascending=[False, True])["encoder"].iloc[0], words
    return None


def paired_differences(board: pd.DataFrame, preds: pd.DataFrame, *, n_boot: int, seed: int,
                       metric: str = "macro_f1", alpha: float = 0.05) -> pd.DataFrame:
    """Paired cluster bootstrap of each encoder's ``metric`` minus the reference encoder's, per target; the
    reference is the best encoder on the source's validation data (:func:`reference_encoder`), not on the
    test set the differences are computed on.

    One resample of groups is shared by every encoder and seed of a (task, head, fraction, s→t) cell.

    Parameters
    ----------
    board : DataFrame
        The :func:`leaderboard`; a (task, head, fraction, source) with fewer than two encoders in-domain, or
        without a reference criterion, is skipped.
    preds : DataFrame
        The suite's predictions (as :func:`leaderboard` takes them).
    n_boot : int
        Bootstrap resamples of the cell's groups (keyword-only: ``bootstrap.n_boot``).
    seed : int
        Seed of the resampling (``bootstrap.seed``).
    metric : str
        The metric to difference, a metric name of :func:`fmaudit.stats.seed_mean_bootstrap`; default
        ``macro_f1``.
    alpha : float
        One minus the intervals' coverage; default 0.05.

    Returns
    -------
    DataFrame
        One row per (task, head, fraction, source, target, encoder other than the reference): ``in_domain``,
        ``encoder``, ``reference``, ``reference_chosen_on``, ``metric``, ``difference`` (encoder minus reference,
        seed means), ``ci_lo``, ``ci_hi``, ``ci_excludes_zero``, ``ci_unit``, ``ci_n_units``, ``ci_resampling``,
        ``n_boot`` and ``resampling``.
    """
    rows = []
    keys = ["task", "head", "fraction", "source_domain"]
    cells = dict(tuple(preds.groupby(keys + ["target_domain"])))
    for key, cell in board.groupby(keys):
        ind = cell[cell["in_domain"]]
        if ind["encoder"].nunique() < 2:
            continue
        chosen = reference_encoder(ind)
        if chosen is None:
            continue
        reference, criterion = chosen
        for target in cell["target_domain"].unique():
            sel = cells[(*key, target)]
            order, labels, counts = cell_resample_counts(sel, n_boot, seed)
            res = {enc: seed_mean_bootstrap(p, metric, counts, order, labels) for enc, p in sel.groupby("encoder")}
            ref_point, ref_boot = res[reference]
            for enc, (point, boot) in res.items():
                if enc == reference:
                    continue
                lo, hi, _ = percentile_interval(boot - ref_boot, alpha)
                rows.append({**dict(zip(keys, key)), "target_domain": target, "in_domain": target == key[3],
                             "encoder": enc, "reference": reference, "reference_chosen_on": criterion,
                             "metric": metric, "difference": point - ref_point, "ci_lo": lo, "ci_hi": hi,
                             "ci_excludes_zero": bool(lo > 0 or hi < 0), **cell_units(sel), "n_boot": n_boot,
                             "resampling": "paired cluster bootstrap of the row's unit, shared across encoders "
                                           "and seeds"})
    return pd.DataFrame(rows)


def bound_temperature_rule(include_bound_temperatures: bool) -> str:
    """How a table's post-temperature means treat temperatures at a search bound, in words.

    Parameters
    ----------
    include_bound_temperatures : bool
        The schema's ``calibration.include_bound_temperatures``.

    Returns
    -------
    str
        The sentence for the tables' ``bound_temperatures`` column.
    """
    return ("temperatures at a bound included in the means" if include_bound_temperatures
            else "temperatures at a bound left out of the means (counted in n_at_bound)")


def exclude_bound_temperatures(runs: pd.DataFrame, metrics: list[str],
                               include_bound_temperatures: bool) -> pd.DataFrame:
    """``runs`` with ``metrics`` set to NaN on single-temperature rows (source_ts, oracle_ts) whose temperature
    sits at a bound, unless ``include_bound_temperatures``; K-shot rows already average only the draws the
    setting keeps (:func:`fmaudit.calibration.calibration_ladder`).

    Parameters
    ----------
    runs : DataFrame
        The probe suite's metric rows: ``stage`` and, where fitted, ``temperature_at_bound``.
    metrics : list of str
        The columns to blank on those rows.
    include_bound_temperatures : bool
        Keep them (``calibration.include_bound_temperatures``): ``runs`` is returned as it is.

    Returns
    -------
    DataFrame
        ``runs`` itself when nothing is left out, else a copy with ``metrics`` NaN on the bound rows.
    """
    if include_bound_temperatures or "temperature_at_bound" not in runs.columns:
        return runs
    out = runs.copy()
    drop = out["temperature_at_bound"].fillna(False).astype(bool) & out["stage"].isin(["source_ts", "oracle_ts"])
    out.loc[drop, metrics] = np.nan
    return out


def calibration_table(runs: pd.DataFrame, *, ece_bins: int, include_bound_temperatures: bool) -> pd.DataFrame:
    """The calibration ladder at the largest label fraction, mean over seeds; temperatures at a search bound are
    left out of the post-temperature means unless ``include_bound_temperatures`` (``n_temperatures``: runs, or
    K-shot draws, behind a row; ``n_at_bound``: how many of them sit at a bound).

    Parameters
    ----------
    runs : DataFrame
        The probe suite's metric rows (every stage).
    ece_bins : int
        Equal-width bins of the binned calibration metrics (keyword-only: ``calibration.ece_bins``).
    include_bound_temperatures : bool
        Keep temperatures at a search bound in the means (``calibration.include_bound_temperatures``).

    Returns
    -------
    DataFrame
        One row per :data:`RUN_KEYS`, ``in_domain``, ``stage``, ``k`` (NaN but for ``kshot_ts``) and
        ``deployable``: the seed means of the top-label, adaptive and classwise ECE at ``ece_bins``, ``nll``,
        ``brier_sum`` and ``temperature`` (those present), ``n_temperatures`` and ``n_at_bound`` (where the runs
        count draws; 0 on raw rows), ``calibration_mode``, ``task_split``, ``ece_convention`` and
        ``bound_temperatures``.
    """
    top = runs.groupby("task")["fraction"].transform("max")
    cal = runs[runs["fraction"] == top].copy()
    cal["k"] = cal["k"].fillna(-1)
    binned = binned_metric_columns(ece_bins)
    metrics = [binned["ece"], binned["adaptive_ece"], binned["classwise_ece"], "nll", "brier_sum", "temperature"]
    metrics = [m for m in metrics if m in cal.columns]
    cal = exclude_bound_temperatures(cal, metrics, include_bound_temperatures)
    keys = RUN_KEYS + ["in_domain", "stage", "k", "deployable"]
    out = cal.groupby(keys, sort=True)[metrics].mean().reset_index()
    if {"n_draws", "n_draws_at_bound"} <= set(cal.columns):
        counts = cal.groupby(keys, sort=True)[["n_draws", "n_draws_at_bound"]].sum().reset_index()
        out = out.merge(counts.rename(columns={"n_draws": "n_temperatures", "n_draws_at_bound": "n_at_bound"}), on=keys)
        raw = out["stage"] == "raw"
        out.loc[raw, ["n_temperatures", "n_at_bound"]] = 0
    for column in ("calibration_mode", "task_split"):
        if column in cal.columns:
            out = out.merge(cal.groupby(keys, sort=True)[column].first().reset_index(), on=keys)
    out["k"] = out["k"].where(out["k"] >= 0)
    out["ece_convention"] = f"{ece_convention(ece_bins)}; Brier summed over classes"
    out["bound_temperatures"] = bound_temperature_rule(include_bound_temperatures)
    return out


def shift_summary(board: pd.DataFrame, *, ece_bins: int) -> pd.DataFrame:
    """Per task, head and encoder: in-domain vs mean off-domain macro-F1 and ECE.

    Parameters
    ----------
    board : DataFrame
        The :func:`leaderboard`.
    ece_bins : int
        Bins of the leaderboard's ECE column (keyword-only: ``calibration.ece_bins``).

    Returns
    -------
    DataFrame
        One row per task, head and encoder: ``macro_f1_in_domain``, ``macro_f1_off_domain`` (mean over the
        targets; NaN for a one-domain task), ``ece_in_domain``, ``ece_off_domain`` and ``ece_convention``.
    """
    ece_col = ece_column(ece_bins)
    rows = []
    for (task, head, enc), cell in board.groupby(["task", "head", "encoder"]):
        ind, off = cell[cell["in_domain"]], cell[~cell["in_domain"]]
        rows.append({"task": task, "head": head, "encoder": enc,
                     "macro_f1_in_domain": ind["macro_f1"].mean(), "macro_f1_off_domain": off["macro_f1"].mean(),
                     "ece_in_domain": ind[ece_col].mean(), "ece_off_domain": off[ece_col].mean()})
    out = pd.DataFrame(rows)
    out["ece_convention"] = ece_convention(ece_bins)
    return out


def reliability_curves(preds: pd.DataFrame, *, n_bins: int) -> pd.DataFrame:
    """Reliability-diagram data of each encoder (first head, first seed, largest fraction), in-domain and
    off-domain, raw and after the source temperature: one row per (encoder, part, calibration, bin) with
    ``confidence``, ``accuracy`` and ``count`` (:func:`fmaudit.metrics.reliability_bins`), ``n_items`` and the
    ``ece`` of those bins (top-label, ``n_bins`` equal-width bins).

    Parameters
    ----------
    preds : DataFrame
        The suite's predictions: :data:`RUN_KEYS`, ``seed``, ``label``, ``logits`` and ``temperature_source``.
    n_bins : int
        Equal-width confidence bins (keyword-only: ``calibration.ece_bins``).

    Returns
    -------
    DataFrame
        The rows of :func:`fmaudit.metrics.reliability_bins` with ``encoder``, ``part`` (``in-domain`` or
        ``off-domain``), ``calibration`` (``raw`` or ``source TS``, the latter left out where the source
        temperature could not be fitted), ``n_items`` and ``ece``; a part without items is one row with
        ``n_items`` 0.
    """
    top = preds["fraction"].max()
    sel = preds[(preds["fraction"] == top) & (preds["seed"] == preds["seed"].min())]
    sel = sel[sel["head"] == sel["head"].iloc[0]]
    frames = []
    for enc in sorted(sel["encoder"].unique()):
        e = sel[sel["encoder"] == enc]
        for part_name, part in (("in-domain", e[e["source_domain"] == e["target_domain"]]),
                                ("off-domain", e[e["source_domain"] != e["target_domain"]])):
            if len(part) == 0:
                frames.append(pd.DataFrame({"encoder": [enc], "part": [part_name], "n_items": [0]}))
                continue
            logits = np.stack(part["logits"].to_numpy())
            labels = part["label"].to_numpy().astype(int)
            for name, temp in (("raw", np.ones(len(part))), ("source TS", part["temperature_source"].to_numpy())):
                if not np.isfinite(temp).all():  # no source temperature (a budget without validation items)
                    continue
                probs = softmax(logits / temp[:, None])
                bins = reliability_bins(probs, labels, n_bins=n_bins)
                frames.append(bins.assign(encoder=enc, part=part_name, calibration=name, n_items=len(part),
                                          ece=ece(probs, labels, n_bins=n_bins)))
    return pd.concat(frames, ignore_index=True)


def ece_by_fraction(runs: pd.DataFrame, preds: pd.DataFrame, *, ece_bins: int, n_boot: int, seed: int,
                    alpha: float = 0.05) -> pd.DataFrame:
    """Target ECE (raw, seed mean) per label fraction on each transfer pair (in-domain when there is none), with
    its cluster-bootstrap interval at every fraction (``ece_ci_lo``, ``ece_ci_hi``: resampling the target's test
    patients/slides, one draw shared by the seeds of a cell, as the leaderboard's).

    Parameters
    ----------
    runs : DataFrame
        The probe suite's metric rows.
    preds : DataFrame
        The suite's predictions (as :func:`leaderboard` takes them).
    ece_bins : int
        Equal-width bins of the top-label ECE (keyword-only: ``calibration.ece_bins``).
    n_boot : int
        Bootstrap resamples of the target's groups (``bootstrap.n_boot``).
    seed : int
        Seed of the resampling (``bootstrap.seed``).
    alpha : float
        One minus the intervals' coverage; default 0.05.

    Returns
    -------
    DataFrame
        The raw rows of :func:`fmaudit.analyses.transfer.seed_means` off-domain (in-domain when no task has a
        target), one per :data:`RUN_KEYS`, with ``ece_ci_lo``, ``ece_ci_hi``, ``n_test_groups`` and
        ``ci_convention``.
    """
    means = seed_means(runs, ece_bins)
    off = means[~means["in_domain"]]
    out = (off if len(off) else means).reset_index(drop=True)
    cells = dict(tuple(preds.groupby(RUN_KEYS)))
    lo, hi, groups = [], [], []
    for r in out[RUN_KEYS].itertuples(index=False):
        sel = cells[tuple(r)]
        order, labels, counts = cell_resample_counts(sel, n_boot, seed)
        _, draws = seed_mean_bootstrap(sel, "ece", counts, order, labels, n_bins=ece_bins)
        interval = percentile_interval(draws, alpha)
        lo.append(interval[0])
        hi.append(interval[1])
        groups.append(sel["group"].nunique())
    out["ece_ci_lo"], out["ece_ci_hi"], out["n_test_groups"] = lo, hi, groups
    out["ci_convention"] = ci_convention(n_boot, alpha)
    return out

"""Label-free encoder selection on an unlabelled target, and its regret (hema paper;
docs/methods.md#label-free-encoder-selection).

On each target draw a user without labels must pick one encoder. A *rule* scores every encoder from its own
predictions on the draw and picks the best score; the *oracle* picks the encoder with the best macro-F1.
Selection regret = ``max_m F1_m - F1_{picked}``, per task x source x target x prior x source seed x draw x
adaptation method (the pipeline whose predictions are scored and whose F1 is compared).

Rules (:data:`SELECTION_RULES`); each names the column of the prior-shift rows it reads:

- ``max_marginal_entropy`` (the project default, docs/methods.md#label-free-encoder-selection): ``argmax_m H(mean_i
  p_i)``; a balanced, uncollapsed marginal looks good on a balanced target, which is exactly what fails under clinical
  priors.
- ``min_mean_entropy``: ``argmin_m mean_i H(p_i)``, the alternative docs/methods.md#label-free-encoder-selection names.
- ``max_mean_max_prob``: ``argmax_m mean_i max_k p_ik`` (mean confidence).
- ``max_bbse_macro_f1`` / ``max_bbse_accuracy``: the macro-F1 / accuracy of the unadapted probe that BBSE
  predicts for the target from the source hold-out confusion reweighted by the estimated label shift; defined
  for the ``none`` pipeline only (other methods change the predictions the confusion describes).

Ties go to the first encoder in sorted name order, for the rule and for the oracle alike.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError

SELECTION_RULES: dict[str, tuple[str, str]] = {
    "max_marginal_entropy": ("marginal_entropy", "max"),
    "min_mean_entropy": ("mean_entropy", "min"),
    "max_mean_max_prob": ("mean_max_prob", "max"),
    "max_bbse_macro_f1": ("bbse_estimated_macro_f1", "max"),
    "max_bbse_accuracy": ("bbse_estimated_accuracy", "max"),
}
#: Columns that identify one selection problem (those present in the rows are used).
SELECTION_KEYS = ("task", "source_domain", "target_domain", "prior", "seed", "draw", "method")


def _best(frame: pd.DataFrame, keys: list[str], column: str, direction: str) -> pd.DataFrame:
    """The row of each group with the best ``column`` (ties: first encoder by name)."""
    ok = frame[np.isfinite(frame[column].to_numpy(dtype=np.float64))]
    ordered = ok.sort_values([*keys, "encoder"], kind="stable")
    score = ordered[column] if direction == "max" else -ordered[column]
    winners = score.groupby([ordered[k] for k in keys], sort=False, observed=True).idxmax()
    return ordered.loc[winners.to_numpy()]


def selection_regret(rows: pd.DataFrame, rules: Sequence[str] = tuple(SELECTION_RULES), metric: str = "macro_f1",
                     keys: Sequence[str] = SELECTION_KEYS) -> pd.DataFrame:
    """One row per selection problem x rule: the encoder each rule picks, the oracle's, and the regret.

    ``rows``: per-encoder prior-shift rows (e.g. concatenated shard outputs) with an ``encoder`` column, the
    ``keys`` present, ``metric`` and each rule's score column. A problem where a rule's score is NaN for every
    encoder (e.g. a BBSE rule on an adapted pipeline) gets no row for that rule; encoders with a NaN score are
    not candidates. Columns: keys, rule, n_encoders, selected_encoder, oracle_encoder, selected_<metric>,
    oracle_<metric>, regret.

    Parameters
    ----------
    rows : DataFrame
        Per-encoder prior-shift rows, as described above.
    rules : sequence of str
        Rules of ``SELECTION_RULES`` (default all).
    metric : str
        Labelled metric the oracle maximises and the regret is measured in (default ``macro_f1``).
    keys : sequence of str
        Columns that identify one selection problem (those absent from ``rows`` are dropped).

    Returns
    -------
    DataFrame
        One row per problem and rule, columns as listed above.

    Raises
    ------
    FmauditInputError
        An unknown rule, ``encoder`` or ``metric`` or a rule's score column missing, or an encoder twice in one
        problem.
    """
    unknown = [r for r in rules if r not in SELECTION_RULES]
    if unknown:
        raise FmauditInputError(f"unknown selection rule(s) {unknown}; rules: {', '.join(SELECTION_RULES)}")
    keys = [k for k in keys if k in rows.columns]
    missing = [c for c in ["encoder", metric] if c not in rows.columns]
    if missing:
        raise FmauditInputError(f"selection rows: column(s) {missing} missing")
    dup = rows.duplicated([*keys, "encoder"])
    if dup.any():
        first = rows[dup].iloc[0]
        raise FmauditInputError(f"selection rows: encoder {first['encoder']!r} appears twice in one problem "
                                f"({', '.join(f'{k}={first[k]!r}' for k in keys)})")
    oracle = _best(rows, keys, metric, "max")[[*keys, "encoder", metric]]
    oracle = oracle.rename(columns={"encoder": "oracle_encoder", metric: f"oracle_{metric}"})
    sizes = rows.groupby(keys, observed=True).size().rename("n_encoders").reset_index()
    out = []
    for rule in rules:
        column, direction = SELECTION_RULES[rule]
        if column not in rows.columns:
            raise FmauditInputError(f"selection rule {rule!r} needs column {column!r}, which the rows lack")
        picked = _best(rows, keys, column, direction)[[*keys, "encoder", metric]]
        picked = picked.rename(columns={"encoder": "selected_encoder", metric: f"selected_{metric}"})
        merged = picked.merge(oracle, on=keys, how="left").merge(sizes, on=keys, how="left")
        merged.insert(len(keys), "rule", rule)
        merged["regret"] = merged[f"oracle_{metric}"] - merged[f"selected_{metric}"]
        out.append(merged)
    cols = [*keys, "rule", "n_encoders", "selected_encoder", "oracle_encoder", f"selected_{metric}",
            f"oracle_{metric}", "regret"]
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)


def regret_table(regret: pd.DataFrame, by: Sequence[str] = ("rule", "method", "prior")) -> pd.DataFrame:
    """The hema paper's regret table: per ``by`` group, mean and max regret over selection problems, the share of
    problems where the rule picked the oracle's encoder, and how many problems (unit: problem = target x prior x
    source seed x draw).

    Parameters
    ----------
    regret : DataFrame
        Rows of :func:`selection_regret`.
    by : sequence of str
        Grouping columns (those absent are dropped).

    Returns
    -------
    DataFrame
        One row per group, columns ``by`` then ``mean_regret``, ``max_regret``, ``n_problems``,
        ``share_oracle_choice``.
    """
    by = [b for b in by if b in regret.columns]
    hit = regret.assign(_hit=(regret["selected_encoder"] == regret["oracle_encoder"]).astype(float))
    return hit.groupby(by, sort=False, observed=True).agg(
        mean_regret=("regret", "mean"), max_regret=("regret", "max"), n_problems=("regret", "size"),
        share_oracle_choice=("_hit", "mean")).reset_index()

"""Declared encoder variants beside their base encoder: the hema paper's 224-vs-518 input-resolution check.

A variant (registry ``variants:``, config ``variants``) is a second preprocessing of the same weights, embedded
once and run through the same probe grid as its base. It is kept out of every table that ranks encoders and
compared here with its base on the same test items: per (task, head, source, target) at the largest label
fraction, both macro-F1 (means over seeds) with their intervals, and the paired difference variant - base with
one shared patient/slide cluster resample for both (the pairing of :func:`fmaudit.analyses.leaderboard.
paired_differences`).
"""

from __future__ import annotations

from typing import Mapping

import pandas as pd

from fmaudit.analyses.leaderboard import RESAMPLING
from fmaudit.stats import cell_resample_counts, percentile_interval, seed_mean_bootstrap

KEYS = ["task", "head", "fraction", "source_domain", "target_domain"]

__all__ = ["split_variant_runs", "variant_pairs"]


def split_variant_runs(frame: pd.DataFrame, variants: Mapping[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows of the ranked encoders, rows of the declared variants and their bases) of a probe table.

    Parameters
    ----------
    frame : DataFrame or None
        A probe table with an ``encoder`` column (run rows, predictions ...).
    variants : mapping of str to str
        Variant slug -> its base encoder's slug (the config's ``variants``).

    Returns
    -------
    ranked : DataFrame or None
        ``frame`` without the variants' rows (``frame`` itself when it is empty or there are no variants).
    paired : DataFrame or None
        The rows of the variants and their bases (empty when there are no variants).
    """
    if frame is None or len(frame) == 0 or not variants:
        return frame, frame.iloc[0:0] if frame is not None else frame
    enc = frame["encoder"].astype(str)
    ranked = frame[~enc.isin(list(variants))].reset_index(drop=True)
    paired = frame[enc.isin([*variants, *variants.values()])].reset_index(drop=True)
    return ranked, paired


def variant_pairs(runs: pd.DataFrame, preds: pd.DataFrame, variants: Mapping[str, str], *, n_boot: int, seed: int,
                  alpha: float = 0.05) -> pd.DataFrame:
    """One row per variant x (task, head, source, target) at the task's largest label fraction: base and variant
    macro-F1 with percentile intervals, and the paired difference (variant - base) with its interval.

    ``runs`` / ``preds``: probe-suite run rows (stage ``raw``) and per-item predictions holding both encoders;
    ``variants``: variant slug -> base slug.

    Parameters
    ----------
    runs : DataFrame or None
        The probe suite's metric rows holding both encoders of each pair.
    preds : DataFrame
        The suite's predictions holding both encoders (:data:`KEYS`, ``encoder``, ``seed``, ``group``,
        ``label``, ``logits``).
    variants : mapping of str to str
        Variant slug -> base slug.
    n_boot : int
        Bootstrap resamples of the test groups (keyword-only: ``bootstrap.n_boot``).
    seed : int
        Seed of the resampling (``bootstrap.seed``).
    alpha : float
        One minus the intervals' coverage; default 0.05.

    Returns
    -------
    DataFrame
        Columns :data:`KEYS`, ``in_domain``, ``base``, ``variant``, ``n_seeds``, ``n_test``, ``n_test_groups``,
        ``base_macro_f1``, ``base_ci_lo``, ``base_ci_hi``, ``variant_macro_f1``, ``variant_ci_lo``,
        ``variant_ci_hi``, ``difference`` (variant - base), ``difference_ci_lo``, ``difference_ci_hi``,
        ``ci_excludes_zero``, ``n_boot`` and ``unit``; a cell missing either encoder is skipped.
    """
    cols = [*KEYS, "in_domain", "base", "variant", "n_seeds", "n_test", "n_test_groups", "base_macro_f1",
            "base_ci_lo", "base_ci_hi", "variant_macro_f1", "variant_ci_lo", "variant_ci_hi", "difference",
            "difference_ci_lo", "difference_ci_hi", "ci_excludes_zero", "n_boot", "unit"]
    if runs is None or len(runs) == 0 or not variants:
        return pd.DataFrame(columns=cols)
    raw = runs[runs["stage"] == "raw"]
    raw = raw[raw["fraction"] == raw.groupby("task")["fraction"].transform("max")]
    out = []
    for variant, base in variants.items():
        both = raw[raw["encoder"].isin([base, variant])]
        cells = dict(tuple(preds[preds["encoder"].isin([base, variant])].groupby(KEYS)))
        for key, cell in both.groupby(KEYS, sort=True):
            if set(cell["encoder"]) != {base, variant} or key not in cells:
                continue
            sel = cells[key]
            order, labels, counts = cell_resample_counts(sel, n_boot, seed)
            res = {enc: seed_mean_bootstrap(p, "macro_f1", counts, order, labels) for enc, p in sel.groupby("encoder")}
            (b_point, b_boot), (v_point, v_boot) = res[base], res[variant]
            b_lo, b_hi, _ = percentile_interval(b_boot, alpha)
            v_lo, v_hi, _ = percentile_interval(v_boot, alpha)
            d_lo, d_hi, _ = percentile_interval(v_boot - b_boot, alpha)
            first = cell.iloc[0]
            out.append({**dict(zip(KEYS, key)), "in_domain": bool(first["in_domain"]), "base": base, "variant": variant,
                        "n_seeds": int(cell["seed"].nunique()), "n_test": int(first["n_test"]),
                        "n_test_groups": int(first["n_test_groups"]), "base_macro_f1": b_point, "base_ci_lo": b_lo,
                        "base_ci_hi": b_hi, "variant_macro_f1": v_point, "variant_ci_lo": v_lo, "variant_ci_hi": v_hi,
                        "difference": v_point - b_point, "difference_ci_lo": d_lo, "difference_ci_hi": d_hi,
                        "ci_excludes_zero": bool(d_lo > 0 or d_hi < 0), "n_boot": int(n_boot),
                        "unit": f"{RESAMPLING} (paired: one resample of the test groups for both), over the seed mean"})
    return pd.DataFrame(out, columns=cols)

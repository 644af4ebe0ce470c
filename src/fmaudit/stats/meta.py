"""Meta-analysis: DerSimonian-Laird random-effects pooling of correlations on the Fisher-z scale
(docs/methods.md#rank-transfer-and-meta-analysis)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fmaudit.io import FmauditInputError

__all__ = ["fisher_z_meta"]


def fisher_z_meta(rhos: Sequence[float], ns: Sequence[int], z_crit: float = 1.96) -> dict[str, float]:
    """DerSimonian-Laird random-effects pooling of correlations on the Fisher-z scale
    (docs/methods.md#rank-transfer-and-meta-analysis).

    ``z_i = arctanh(clip(rho_i, -0.999, 0.999))``, ``v_i = 1/(n_i - 3)``. Returns pooled_rho
    (``tanh(mu_RE)``), ci_lo/ci_hi (``tanh(mu_RE -/+ z_crit * SE)``), Q, df, tau2, I2
    (``max(0, (Q - df)/Q)``, 0 when Q = 0), mu_fixed and mu_random (both on the z scale), se_random,
    pooled_rho_fixed (``tanh(mu_fixed)``) and n_studies.

    Parameters
    ----------
    rhos : sequence of float
        One correlation per study (e.g. Spearman ρ per transfer pair), each in [-1, 1].
    ns : sequence of int
        Sample size of each correlation (e.g. number of models ranked), each above 3.
    z_crit : float, default 1.96
        Normal quantile of the interval (1.96: 95%).

    Returns
    -------
    dict
        The keys listed above; ``df`` and ``n_studies`` are int, the others float.

    Raises
    ------
    FmauditInputError
        When ``rhos`` and ``ns`` are not 1-D of one non-zero length, are non-finite, a correlation lies outside
        [-1, 1] or an ``n`` is at most 3.
    """
    r = np.asarray(rhos, dtype=np.float64)
    n = np.asarray(ns, dtype=np.float64)
    if r.ndim != 1 or r.shape != n.shape or r.size == 0:
        raise FmauditInputError(
            f"fisher_z_meta: rhos and ns must be 1-D of equal, non-zero length ({r.shape}, {n.shape})"
        )
    if not (np.isfinite(r).all() and np.isfinite(n).all()):
        raise FmauditInputError("fisher_z_meta: non-finite rho or n")
    if (np.abs(r) > 1).any():
        raise FmauditInputError("fisher_z_meta: a correlation lies outside [-1, 1]")
    if (n <= 3).any():
        raise FmauditInputError("fisher_z_meta: every n must exceed 3 (v = 1/(n - 3))")
    z = np.arctanh(np.clip(r, -0.999, 0.999))
    v = 1.0 / (n - 3.0)
    w = 1.0 / v
    mu_fixed = float((w * z).sum() / w.sum())
    q = float((w * (z - mu_fixed) ** 2).sum())
    df = int(r.size - 1)
    c = float(w.sum() - (w**2).sum() / w.sum())
    tau2 = max(0.0, (q - df) / c) if df > 0 and c > 0 else 0.0
    w_re = 1.0 / (v + tau2)
    mu_re = float((w_re * z).sum() / w_re.sum())
    se = float(np.sqrt(1.0 / w_re.sum()))
    i2 = max(0.0, (q - df) / q) if q > 0 else 0.0
    return {
        "pooled_rho": float(np.tanh(mu_re)),
        "ci_lo": float(np.tanh(mu_re - z_crit * se)),
        "ci_hi": float(np.tanh(mu_re + z_crit * se)),
        "Q": q,
        "df": df,
        "tau2": float(tau2),
        "I2": float(i2),
        "mu_fixed": mu_fixed,
        "mu_random": mu_re,
        "se_random": se,
        "pooled_rho_fixed": float(np.tanh(mu_fixed)),
        "n_studies": int(r.size),
    }

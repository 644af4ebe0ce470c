"""Two-way cluster and hierarchical bootstraps."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fmaudit import stats
from fmaudit.io import FmauditInputError


# --------------------------------------------------------------------------------- structured bootstraps
@pytest.fixture(scope="module")
def transfer_grid():
    rng = np.random.default_rng(0)
    rows = [
        {"model": m, "source": s, "target": t, "auroc": 0.7 + 0.05 * i + 0.02 * rng.normal()}
        for i, m in enumerate(["m1", "m2", "m3"])
        for s in ["h1", "h2", "h3", "h4"]
        for t in ["h1", "h2", "h3", "h4"]
    ]
    return pd.DataFrame(rows)


def test_two_way_cluster_bootstrap(transfer_grid):
    seen = []

    def mean_auroc(frame: pd.DataFrame) -> float:
        seen.append(frame)
        return float(frame["auroc"].mean())

    result = stats.two_way_cluster_bootstrap(transfer_grid, mean_auroc, n_boot=50, random_state=7)
    off_diagonal = transfer_grid[transfer_grid["source"] != transfer_grid["target"]]
    assert result["point"] == pytest.approx(off_diagonal["auroc"].mean())
    assert result["ci_lo"] <= result["point"] <= result["ci_hi"]
    assert result["n_models"] == 3 and result["n_hospitals"] == 4 and result["n_valid"] == 50
    assert len(seen[0]) == len(off_diagonal)
    # first resample: models then hospitals from default_rng(7); every pair of hospital slots with
    # different hospitals, times every model slot
    rng = np.random.default_rng(7)
    model_slots, hospital_slots = rng.integers(0, 3, 3), rng.integers(0, 4, 4)
    n_pairs = int((hospital_slots[:, None] != hospital_slots[None, :]).sum())
    first = seen[1]
    assert len(first) == 3 * n_pairs
    assert (first["source"] != first["target"]).all()
    assert first["model"].value_counts().to_dict() == {
        m: n_pairs * c for m, c in pd.Series(np.array(["m1", "m2", "m3"])[model_slots]).value_counts().items()
    }
    assert {"model_slot", "source_slot", "target_slot"} <= set(first.columns)
    again = stats.two_way_cluster_bootstrap(transfer_grid, lambda f: f["auroc"].mean(), n_boot=50, random_state=7)
    assert again["ci_lo"] == result["ci_lo"] and again["ci_hi"] == result["ci_hi"]


def test_two_way_cluster_bootstrap_bad_input(transfer_grid):
    with pytest.raises(FmauditInputError, match="'hospital'"):
        stats.two_way_cluster_bootstrap(transfer_grid, len, source_col="hospital", n_boot=2000)


def test_hierarchical_bootstrap_variance_matches_closed_form():
    # balanced two-level design: the bootstrap mean has variance (S_between + mean S_within / m) / n
    rng = np.random.default_rng(1)
    n_enc, m = 6, 5
    enc = np.repeat(np.arange(n_enc), m)
    values = rng.normal(size=n_enc)[enc] + rng.normal(size=n_enc * m) * 2.0
    df = pd.DataFrame({"encoder": enc, "seed": np.tile(np.arange(m), n_enc), "gain": values})
    by_enc = df.groupby("encoder")["gain"]
    expected_var = (by_enc.mean().var(ddof=0) + by_enc.var(ddof=0).mean() / m) / n_enc
    draws = stats.hierarchical_bootstrap_draws(df, ["encoder", "seed"], "gain", n_boot=4000, random_state=0)
    assert draws.var() == pytest.approx(expected_var, rel=0.15)
    assert draws.mean() == pytest.approx(values.mean(), abs=4 * math.sqrt(expected_var / 4000) + 1e-12)


def test_hierarchical_bootstrap_mean_summary():
    rng = np.random.default_rng(2)
    df = pd.DataFrame(
        {
            "encoder": np.repeat(["a", "b", "c", "d"], 12),
            "source_seed": np.tile(np.repeat([0, 1, 2], 4), 4),
            "draw": np.tile(np.arange(4), 12),
            "gain": rng.normal(loc=0.03, scale=0.02, size=48),
        }
    )
    result = stats.hierarchical_bootstrap_mean(df, ["encoder", "source_seed", "draw"], "gain", n_boot=500)
    assert result["point"] == pytest.approx(df["gain"].mean())
    assert result["ci_lo"] < result["point"] < result["ci_hi"]
    assert result["levels"] == ["encoder", "source_seed", "draw"]
    assert result == stats.hierarchical_bootstrap_mean(df, ["encoder", "source_seed", "draw"], "gain", n_boot=500)
    constant = df.assign(gain=0.5)
    flat = stats.hierarchical_bootstrap_mean(constant, ["encoder", "source_seed"], "gain", n_boot=50)
    assert flat["ci_lo"] == pytest.approx(0.5) and flat["ci_hi"] == pytest.approx(0.5)
    with pytest.raises(FmauditInputError, match="missing"):
        stats.hierarchical_bootstrap_mean(df, ["encoder", "hospital"], "gain", n_boot=2000)
    with pytest.raises(FmauditInputError, match="NaN"):
        stats.hierarchical_bootstrap_mean(df.assign(gain=np.nan), ["encoder"], "gain", n_boot=2000)

"""DerSimonian-Laird Fisher-z pooling against a hand-made example."""

from __future__ import annotations

import math

import pytest

from fmaudit import stats
from fmaudit.io import FmauditInputError


# ------------------------------------------------------------------------------------- meta-analysis
def test_fisher_z_hand_made_example():
    # rho = (0.1, 0.5), n = (13, 23): v = (0.1, 0.05), w = (10, 20)
    z1, z2 = math.atanh(0.1), math.atanh(0.5)
    mu_fe = (10 * z1 + 20 * z2) / 30
    q = 10 * (z1 - mu_fe) ** 2 + 20 * (z2 - mu_fe) ** 2
    tau2 = (q - 1) / (30 - (100 + 400) / 30)
    w1, w2 = 1 / (0.1 + tau2), 1 / (0.05 + tau2)
    mu_re = (w1 * z1 + w2 * z2) / (w1 + w2)
    se = math.sqrt(1 / (w1 + w2))
    result = stats.fisher_z_meta([0.1, 0.5], [13, 23])
    assert result["mu_fixed"] == pytest.approx(mu_fe) and result["Q"] == pytest.approx(q)
    assert result["df"] == 1 and result["tau2"] == pytest.approx(tau2)
    assert result["I2"] == pytest.approx((q - 1) / q)
    assert result["pooled_rho"] == pytest.approx(math.tanh(mu_re))
    assert result["ci_lo"] == pytest.approx(math.tanh(mu_re - 1.96 * se))
    assert result["ci_hi"] == pytest.approx(math.tanh(mu_re + 1.96 * se))
    # the same numbers worked by hand to 3 decimals
    assert (round(q, 3), round(tau2, 4), round(result["I2"], 3), round(result["pooled_rho"], 3)) == (
        1.344, 0.0258, 0.256, 0.363,
    )  # fmt: skip


def test_fisher_z_equal_rhos_have_no_heterogeneity():
    result = stats.fisher_z_meta([0.4, 0.4, 0.4], [10, 50, 200])
    assert result["I2"] == 0.0 and result["tau2"] == 0.0 and result["Q"] == pytest.approx(0.0, abs=1e-24)
    assert result["pooled_rho"] == pytest.approx(0.4)
    assert result["ci_lo"] < 0.4 < result["ci_hi"]


def test_fisher_z_clips_perfect_correlations_and_rejects_small_n():
    result = stats.fisher_z_meta([1.0, 1.0], [10, 10])
    assert result["pooled_rho"] == pytest.approx(0.999)
    with pytest.raises(FmauditInputError, match="exceed 3"):
        stats.fisher_z_meta([0.5, 0.2], [3, 10])
    with pytest.raises(FmauditInputError, match="equal"):
        stats.fisher_z_meta([0.5, 0.2], [10])

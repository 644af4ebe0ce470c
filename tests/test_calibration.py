"""fmaudit.calibration: temperature scaling and the calibration ladder (METHODS 2)."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import minimize_scalar
from scipy.special import expit

from fmaudit import metrics
from fmaudit.calibration import TemperatureScaler, calibration_ladder, fit_temperature, kshot_temperature_draws
from fmaudit.io import FmauditInputError


def _sample_labels(logits: np.ndarray, temperature: float, seed: int) -> np.ndarray:
    """Labels drawn from softmax(logits / temperature), so the true temperature is known."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(metrics.softmax(logits, temperature), axis=1)
    u = rng.random(len(logits))[:, None]
    return np.minimum((u > cdf).sum(1), logits.shape[1] - 1)


@pytest.fixture(scope="module")
def overconfident_logits():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(8000, 5)) * 3.0
    return z, _sample_labels(z, 2.0, seed=1)


def test_temperature_recovery(overconfident_logits):
    z, y = overconfident_logits
    scaler = TemperatureScaler().fit(z, y)
    assert scaler.temperature_ == pytest.approx(2.0, abs=0.1)
    assert scaler.confidence_ == "overconfident"
    assert not scaler.at_bound_
    assert scaler.n_fit_ == len(y)
    assert scaler.nll_after_ < scaler.nll_before_
    assert scaler.nll_after_ == pytest.approx(metrics.nll_from_logits(z, y, scaler.temperature_))


def test_fitted_temperature_is_the_nll_minimum(overconfident_logits):
    z, y = overconfident_logits
    z, y = z[:500], y[:500]
    reference = minimize_scalar(
        lambda t: metrics.nll_from_logits(z, y, t), bounds=(0.05, 20.0), method="bounded", options={"xatol": 1e-9}
    ).x
    assert fit_temperature(z, y) == pytest.approx(reference, rel=1e-4)


def test_underconfident_logits_get_temperature_below_one():
    rng = np.random.default_rng(2)
    z = rng.normal(size=(4000, 4))
    y = _sample_labels(z, 0.5, seed=3)
    scaler = TemperatureScaler().fit(z, y)
    assert scaler.temperature_ == pytest.approx(0.5, abs=0.05)
    assert scaler.confidence_ == "underconfident"


def test_all_correct_confident_fit_runs_to_the_lower_bound():
    z = np.array([[6.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 7.0], [4.0, 0.0, 0.0]])
    y = z.argmax(1)
    scaler = TemperatureScaler().fit(z, y)
    assert scaler.at_bound_
    assert scaler.temperature_ == pytest.approx(0.05)
    narrow = TemperatureScaler(bounds=(0.5, 2.0)).fit(z, y)
    assert narrow.at_bound_ and narrow.temperature_ == pytest.approx(0.5)


def test_transform_and_fit_transform(overconfident_logits):
    z, y = overconfident_logits
    scaler = TemperatureScaler()
    assert scaler.fit(z[:300], y[:300]) is scaler
    np.testing.assert_allclose(scaler.transform(z[:10]), metrics.softmax(z[:10] / scaler.temperature_), rtol=1e-12)
    np.testing.assert_allclose(TemperatureScaler().fit_transform(z[:300], y[:300]), scaler.transform(z[:300]))
    # argmax is unchanged by a positive temperature
    np.testing.assert_array_equal(scaler.transform(z).argmax(1), z.argmax(1))


def test_binary_temperature_convention():
    rng = np.random.default_rng(4)
    d = rng.normal(size=2000) * 4
    y = (rng.random(2000) < expit(d / 1.5)).astype(int)
    t_half = fit_temperature(metrics.binary_logits_from_decision(d), y)
    # the same T as fitting sigmoid(d / T) directly ...
    bernoulli_nll = lambda t: -np.mean(y * np.log(expit(d / t)) + (1 - y) * np.log(expit(-d / t)))  # noqa: E731
    direct = minimize_scalar(bernoulli_nll, bounds=(0.05, 20), method="bounded", options={"xatol": 1e-9}).x
    assert t_half == pytest.approx(direct, rel=1e-4)
    # ... while PRISM's (-d, d) logits double it
    assert fit_temperature(np.column_stack([-d, d]), y) == pytest.approx(2 * t_half, rel=1e-4)


def test_scaler_bad_input():
    z = np.zeros((3, 2))
    with pytest.raises(FmauditInputError, match="bounds"):
        TemperatureScaler(bounds=(0.0, 5.0)).fit(z, [0, 1, 0])
    with pytest.raises(FmauditInputError, match="outside"):
        TemperatureScaler().fit(z, [0, 1, 2])
    with pytest.raises(FmauditInputError, match="non-finite"):
        TemperatureScaler().fit(np.array([[np.nan, 0.0]]), [0])
    with pytest.raises(FmauditInputError, match="fit"):
        TemperatureScaler().transform(z)


# -------------------------------------------------------------------------------------------- ladder
@pytest.fixture(scope="module")
def ladder_inputs():
    rng = np.random.default_rng(5)
    z_source = rng.normal(size=(300, 4)) * 3
    z_target = rng.normal(size=(200, 4)) * 3
    return z_source, _sample_labels(z_source, 1.5, 6), z_target, _sample_labels(z_target, 2.5, 7)


def test_ladder_shape_and_flags(ladder_inputs):
    zs, ys, zt, yt = ladder_inputs
    table = calibration_ladder(zs, ys, zt, yt, ks=(4, 16), draws=5, random_state=0)
    assert table["stage"].tolist() == ["raw", "source_ts", "oracle_ts", "kshot_ts", "kshot_ts"]
    assert table["k"].isna().tolist() == [True, True, True, False, False]
    assert table["k"].iloc[3:].tolist() == [4.0, 16.0]
    assert table["n_draws"].tolist() == [1, 1, 1, 5, 5]
    assert table["n_eval"].tolist() == [200, 200, 200, 196, 184]
    assert table["deployable"].tolist() == [True, True, False, True, True]
    assert set(metrics.summary_metric_keys()) <= set(table.columns)
    raw, source, oracle = table.iloc[0], table.iloc[1], table.iloc[2]
    assert raw["temperature"] == 1.0 and np.isnan(raw["temperature_at_bound_share"])
    assert source["temperature"] == pytest.approx(fit_temperature(zs, ys))
    assert oracle["temperature"] == pytest.approx(fit_temperature(zt, yt))
    # oracle T minimises the NLL on the full target set; accuracy does not move with T
    assert oracle["nll"] <= min(raw["nll"], source["nll"])
    assert raw["accuracy"] == source["accuracy"] == oracle["accuracy"]
    assert source["nll"] == pytest.approx(metrics.nll_from_logits(zt, yt, source["temperature"]))


def test_kshot_rows_are_means_of_the_draws(ladder_inputs):
    zs, ys, zt, yt = ladder_inputs
    table = calibration_ladder(zs, ys, zt, yt, ks=(8,), draws=4, random_state=3)
    draws = kshot_temperature_draws(zt, yt, k=8, draws=4, random_state=3)
    assert len(draws) == 4 and (draws["n_fit"] == 8).all() and (draws["n_eval"] == 192).all()
    row = table[table["stage"] == "kshot_ts"].iloc[0]
    assert row["temperature"] == pytest.approx(draws["temperature"].mean())
    assert row["ece_top_15_lohi"] == pytest.approx(draws["ece_top_15_lohi"].mean())
    assert row["temperature_at_bound_share"] == pytest.approx(draws["temperature_at_bound"].mean())


def test_ladder_is_deterministic_and_seeded(ladder_inputs):
    zs, ys, zt, yt = ladder_inputs
    a = calibration_ladder(zs, ys, zt, yt, ks=(4, 8), draws=3, random_state=11)
    b = calibration_ladder(zs, ys, zt, yt, ks=(4, 8), draws=3, random_state=11)
    pd.testing.assert_frame_equal(a, b)
    c = calibration_ladder(zs, ys, zt, yt, ks=(4, 8), draws=3, random_state=12)
    assert not np.allclose(a["temperature"].iloc[3:], c["temperature"].iloc[3:])
    # a K's draws do not depend on which other K are run
    only_8 = calibration_ladder(zs, ys, zt, yt, ks=(8,), draws=3, random_state=11)
    pd.testing.assert_series_equal(only_8.iloc[-1], a.iloc[-1], check_names=False)


def test_ladder_without_source_and_with_too_large_k(ladder_inputs, caplog):
    _, _, zt, yt = ladder_inputs
    with caplog.at_level(logging.WARNING, logger="fmaudit.calibration"):
        table = calibration_ladder(None, None, zt[:20], yt[:20], ks=(4, 20, 64), draws=2)
    assert table["stage"].tolist() == ["raw", "oracle_ts", "kshot_ts"]
    assert table["k"].iloc[-1] == 4.0
    assert "K = 20" in caplog.text and "K = 64" in caplog.text


def test_stratified_draws_follow_class_shares():
    labels = np.array([0] * 60 + [1] * 30 + [2] * 10)
    z = np.eye(3)[labels] * 2.0
    draws = kshot_temperature_draws(z, labels, k=10, draws=3, stratified=True)
    assert (draws["sampling"] == "stratified").all()
    # with stratification the fitting set holds 6/3/1 of the classes, so the rest holds 54/27/9
    from fmaudit.calibration import _draw_fit_indices

    idx = _draw_fit_indices(labels, 10, np.random.default_rng(0), stratified=True)
    assert np.bincount(labels[idx], minlength=3).tolist() == [6, 3, 1]
    assert len(np.unique(idx)) == 10


def test_ladder_bad_input(ladder_inputs):
    zs, ys, zt, yt = ladder_inputs
    with pytest.raises(FmauditInputError, match="classes"):
        calibration_ladder(zs[:, :3], ys, zt, yt, ks=(4,), draws=1)
    with pytest.raises(FmauditInputError, match="source_val_labels"):
        calibration_ladder(zs, None, zt, yt, ks=(4,), draws=1)
    with pytest.raises(FmauditInputError, match="target_labels"):
        calibration_ladder(zs, ys, zt, yt[:-1], ks=(4,), draws=1)
    with pytest.raises(FmauditInputError, match="k = 200"):
        kshot_temperature_draws(zt, yt, k=200, draws=1)

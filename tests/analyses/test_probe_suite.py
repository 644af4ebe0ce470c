import numpy as np
import pandas as pd
import pytest

from fmaudit.analyses.probe_suite import run_probe_suite
from fmaudit.io import FmauditInputError
from fmaudit.metrics import softmax, summary_metrics

from .conftest import BOOT, CALIB, DOMAINS, make_task_data, probe_config, runs_for


def test_rows_cover_every_run_target_and_stage(suite_results):
    rows, preds = suite_results
    one = rows[rows["encoder"] == "enc0"]
    n_runs = len(DOMAINS) * 2 * 2  # sources × fractions × seeds
    # each run: 3 targets × (raw, source_ts, oracle_ts, 2 kshot)
    assert len(one) == n_runs * 3 * 5
    assert set(one["stage"]) == {"raw", "source_ts", "oracle_ts", "kshot_ts"}
    assert not one.loc[one["stage"] == "oracle_ts", "deployable"].any()
    assert (one["label_budget"] == one["n_train"] + one["n_val"]).all()


def test_fraction_subsamples_are_stratified(suite_results):
    rows, _ = suite_results
    raw = rows[(rows["stage"] == "raw") & (rows["encoder"] == "enc0")]
    # 12 train items per class × 3 classes; fraction 0.5 -> 6 per class
    assert set(raw.loc[raw["fraction"] == 0.5, "n_train"]) == {18}
    assert set(raw.loc[raw["fraction"] == 1.0, "n_train"]) == {36}


def test_in_domain_beats_shifted_domains(suite_results):
    rows, _ = suite_results
    raw = rows[(rows["stage"] == "raw") & (rows["encoder"] == "enc3")]
    assert raw[raw["in_domain"]]["macro_f1"].mean() > raw[~raw["in_domain"]]["macro_f1"].mean()


def test_metrics_recompute_from_stored_logits(suite_results):
    rows, preds = suite_results
    cell = preds[(preds["encoder"] == "enc1") & (preds["run_id"] == preds["run_id"].iloc[0])
                 & (preds["target_domain"] == "b")]
    logits = np.stack(cell["logits"].to_numpy()).astype(float)
    labels = cell["label"].to_numpy()
    raw = rows[(rows["encoder"] == "enc1") & (rows["run_id"] == cell["run_id"].iloc[0])
               & (rows["target_domain"] == "b") & (rows["stage"] == "raw")].iloc[0]
    expect = summary_metrics(softmax(logits), labels)
    assert raw["macro_f1"] == pytest.approx(expect["macro_f1"])
    assert raw["ece_top_15_lohi"] == pytest.approx(expect["ece_top_15_lohi"], abs=1e-6)
    ts = rows[(rows["encoder"] == "enc1") & (rows["run_id"] == cell["run_id"].iloc[0])
              & (rows["target_domain"] == "b") & (rows["stage"] == "source_ts")].iloc[0]
    t = cell["temperature_source"].iloc[0]
    assert ts["nll"] == pytest.approx(summary_metrics(softmax(logits, temperature=t), labels)["nll"], rel=1e-5)


def test_cis_bracket_points(suite_results):
    rows, _ = suite_results
    raw = rows[rows["stage"] == "raw"]
    assert (raw["macro_f1_ci_lo"] <= raw["macro_f1"] + 1e-9).all()
    assert (raw["macro_f1"] <= raw["macro_f1_ci_hi"] + 1e-9).all()


def test_same_seed_same_numbers():
    data = make_task_data(1.0, 2.0)
    probe = probe_config()
    a, _ = run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)
    b, _ = run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)
    pd.testing.assert_frame_equal(a, b)


def test_other_heads_run_through_the_same_suite():
    data = make_task_data(1.0, 2.0)
    heads = ["1nn", "knn", "nearest_centroid", "cosine_centroid", "linear_svm", "logistic_cv"]
    probe = probe_config(heads=heads, fractions=[1.0], seeds=[0])
    rows, _ = run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)
    assert set(rows["head"]) == set(heads)
    assert rows["macro_f1"].notna().all()


def test_single_class_source_is_a_clear_error():
    data = make_task_data(1.0, 2.0)
    keep = ~((data.domains == "a") & (data.splits == "train") & (data.labels > 0))
    for f in ("features", "labels", "item_ids", "groups", "domains", "splits"):
        setattr(data, f, getattr(data, f)[keep])
    probe = probe_config(fractions=[1.0], seeds=[0])
    with pytest.raises(FmauditInputError, match="source domain 'a'.*single class"):
        run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)


def test_confidence_flag_follows_temperature(suite_results):
    rows, _ = suite_results
    fitted = rows[rows["stage"] != "raw"]
    assert (fitted.loc[fitted["temperature"] > 1.001, "confidence"] == "overconfident").all()
    assert (fitted.loc[fitted["temperature"] < 0.999, "confidence"] == "underconfident").all()
    assert (rows.loc[rows["stage"] == "raw", "confidence"] == "n/a").all()


def test_unscaled_features_give_a_different_probe():
    data = make_task_data(1.0, 2.0)
    data.features = data.features * np.linspace(0.01, 100, data.features.shape[1])
    a_cfg, b_cfg = probe_config(fractions=[1.0], seeds=[0]), probe_config(fractions=[1.0], seeds=[0], standardize=False)
    a, _ = run_probe_suite(data, runs_for("e", a_cfg), a_cfg, CALIB, BOOT)
    b, _ = run_probe_suite(data, runs_for("e", b_cfg), b_cfg, CALIB, BOOT)
    assert not np.allclose(a["nll"], b["nll"])


def test_binary_task_uses_top_label_ece_and_half_logits():
    data = make_task_data(1.5, 1.0, k=2)
    probe = probe_config(fractions=[1.0], seeds=[0])
    rows, preds = run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)
    cell = preds[preds["target_domain"] == "b"]
    cell = cell[cell["run_id"] == cell["run_id"].iloc[0]]
    logits = np.stack(cell["logits"].to_numpy()).astype(float)
    np.testing.assert_allclose(logits[:, 0], -logits[:, 1], atol=1e-5)  # (-d/2, d/2)
    probs = softmax(logits)
    conf = probs.max(1)
    correct = probs.argmax(1) == cell["label"].to_numpy()
    edges = np.linspace(0, 1, 16)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (conf > lo) & (conf <= hi)
        if m.any():
            ece += m.mean() * abs(correct[m].mean() - conf[m].mean())
    raw = rows[(rows["run_id"] == cell["run_id"].iloc[0]) & (rows["target_domain"] == "b") & (rows["stage"] == "raw")]
    assert raw["ece_top_15_lohi"].iloc[0] == pytest.approx(ece, abs=1e-6)

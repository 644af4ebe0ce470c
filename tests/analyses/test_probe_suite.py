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
    # a K-shot row is a mean over draws that leaves out temperatures at a bound: NaN when every draw is there
    # (1-NN's one-hot probabilities push T to a bound); every other row has its metrics, bound or not
    all_bound = (rows["stage"] == "kshot_ts") & (rows["n_draws_at_bound"] == rows["n_draws"])
    assert all_bound.any() and rows.loc[all_bound, "macro_f1"].isna().all()
    assert rows.loc[~all_bound, "macro_f1"].notna().all()


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


# ---------------------------------------------------------------- units, calibration budgets, bounds, PRISM's draw
def _with_units(data, unit="patient"):
    data.group_units = np.full(len(data.labels), unit)
    data.datasets = np.full(len(data.labels), "d")
    return data


def test_rows_name_the_unit_and_count_of_their_intervals():
    data = _with_units(make_task_data(1.0, 2.0))
    probe = probe_config(fractions=[1.0], seeds=[0])
    rows, preds = run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)
    # 8 test items per class in groups of 4 (patients p0, p1 of each domain's test split)
    assert (rows["ci_unit"] == "patient").all() and (rows["ci_n_units"] == 2).all()
    assert (rows["ci_resampling"] == "unit=patient, n=2").all()
    assert rows["ci_convention"].str.contains("unit=patient, n=2, B=50").all()
    assert (preds["group_unit"] == "patient").all()
    # groups nobody declared are called groups, never patients
    rows, _ = run_probe_suite(make_task_data(1.0, 2.0), runs_for("e", probe), probe, CALIB, BOOT)
    assert (rows["ci_resampling"] == "unit=group, n=2").all()


def test_pooled_units_are_named_together():
    data = _with_units(make_task_data(1.0, 2.0))
    data.group_units[data.labels == 2] = "item"
    probe = probe_config(fractions=[1.0], seeds=[0])
    rows, _ = run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)
    assert (rows["ci_unit"] == "item+patient").all()


def test_budget_mode_takes_validation_labels_out_of_the_fractions_budget():
    data = make_task_data(1.0, 2.0)
    data.groups = data.item_ids.copy()  # item-level groups: a class-stratified carve of the budget
    probe = probe_config(fractions=[0.5, 1.0], seeds=[0])
    calib = {**CALIB, "validation_labels": "budget", "budget_validation_share": 0.25}
    rows, _ = run_probe_suite(data, runs_for("e", probe), probe, calib, BOOT)
    raw = rows[rows["stage"] == "raw"].drop_duplicates("run_id")
    # 12 train items per class: fraction 0.5 -> 6 per class, of which round(6 * 0.25) = 2 fit the temperature
    half, full_fraction = raw[raw["fraction"] == 0.5], raw[raw["fraction"] == 1.0]
    assert (half["label_budget"] == 18).all() and (half["n_val"] == 6).all() and (half["n_train"] == 12).all()
    assert (full_fraction["label_budget"] == 36).all() and (full_fraction["n_val"] == 9).all()
    assert (rows["calibration_mode"] == "budget: 0.25 of the fraction's labels").all()
    published, _ = run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)
    published = published[published["stage"] == "raw"]
    assert (published["n_val"] == 12).all()  # the whole validation split (4 per class), whatever the fraction
    assert (published["calibration_mode"] == "full validation split (published)").all()


def test_budget_mode_keeps_patients_whole():
    data = make_task_data(1.0, 2.0)  # training patients hold items of every class
    probe = probe_config(fractions=[1.0], seeds=[0])
    calib = {**CALIB, "validation_labels": "budget"}
    rows, _ = run_probe_suite(data, runs_for("e", probe), probe, calib, BOOT)
    raw = rows[rows["stage"] == "raw"]
    assert (raw["label_budget"] == 36).all() and (raw["n_val"] > 0).all()
    assert (raw["n_val"] % 3 == 0).all()  # whole patients (each holds the same count of every class) went to validation


def test_proportional_mode_subsamples_the_validation_split():
    data = make_task_data(1.0, 2.0)
    probe = probe_config(fractions=[0.5], seeds=[0])
    rows, _ = run_probe_suite(data, runs_for("e", probe), probe, {**CALIB, "validation_labels": "proportional"}, BOOT)
    raw = rows[rows["stage"] == "raw"]
    assert (raw["n_val"] == 6).all() and (raw["n_train"] == 18).all()  # 4 val per class x 0.5


def test_a_budget_without_validation_items_says_so_instead_of_fitting():
    data = make_task_data(1.0, 2.0)
    # one item per class: no group-disjoint carve keeps every class with the probe, and per class nothing is
    # left to validate on
    probe = probe_config(fractions=[0.1], seeds=[0])
    rows, preds = run_probe_suite(data, runs_for("e", probe), probe, {**CALIB, "validation_labels": "budget"}, BOOT)
    ts = rows[rows["stage"] == "source_ts"]
    assert (ts["n_val"] == 0).all() and ts["temperature"].isna().all() and ts["nll"].isna().all()
    assert (ts["temperature_note"] == "not fitted: no validation labels").all()
    assert (ts["confidence"] == "n/a").all() and ts["macro_f1_ci_lo"].isna().all()
    assert rows.loc[rows["stage"] == "raw", "nll"].notna().all() and preds["temperature_source"].isna().all()


def test_temperatures_at_a_bound_are_flagged_per_run():
    data = make_task_data(0.05, 0.0)  # separable classes: confident probes, temperatures pushed to a bound
    probe = probe_config(fractions=[1.0], seeds=[0], C=100.0)
    rows, _ = run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)
    fitted = rows[rows["stage"].isin(["source_ts", "oracle_ts"])]
    assert fitted["temperature_at_bound"].any()
    at = fitted[fitted["temperature_at_bound"]]
    assert at["temperature_note"].str.startswith("at the lower bound").all()
    assert (np.isclose(at["temperature"], 0.05, rtol=1e-2)).all()
    assert not rows.loc[rows["stage"] == "raw", "temperature_at_bound"].any()


def test_prism_subsample_draws_prisms_subsets():
    from fmaudit.probes.subsample import prism_subsample

    data = make_task_data(1.0, 2.0)
    probe = probe_config(fractions=[0.25], seeds=[42], subsample="prism")
    rows, _ = run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)
    assert (rows["subsample"] == "prism").all()
    train = data.domain_split("a", "train")
    assert rows.loc[rows["source_domain"] == "a", "n_train"].iloc[0] == len(
        prism_subsample(data.labels[train], 0.25, 42))
    with pytest.raises(FmauditInputError, match="probe.subsample"):
        bad = {**probe, "subsample": "random"}
        run_probe_suite(data, runs_for("e", bad), bad, CALIB, BOOT)


def test_leaky_split_is_counted_and_named():
    data = _with_units(make_task_data(1.0, 2.0))
    probe = probe_config(fractions=[1.0], seeds=[0])
    clean, _ = run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)
    assert (clean["n_test_groups_in_source_train"] == 0).all() and (clean["task_split"] == "manifest").all()
    # relabel one training patient's items as test items of the same patient group: a patch-level split
    data.groups[(data.splits == "test") & (data.domains == "a")] = "a_train_p0"
    data.split_name = "patch (leaky, as published)"
    leaky, _ = run_probe_suite(data, runs_for("e", probe), probe, CALIB, BOOT)
    ind = leaky[leaky["source_domain"] == "a"]
    assert (ind.loc[ind["in_domain"], "n_test_groups_in_source_train"] == 1).all()
    assert (leaky["task_split"] == "patch (leaky, as published)").all() and (leaky["datasets"] == "d").all()


def test_validation_and_training_macro_f1_are_recorded_for_choosing_references(suite_results):
    rows, _ = suite_results
    assert rows["source_val_macro_f1"].between(0, 1).all() and rows["source_train_macro_f1"].between(0, 1).all()


def test_assembled_task_data_reads_units_and_the_tasks_split():
    from fmaudit.analyses.task_data import assemble_task_data

    man = pd.DataFrame({"dataset": "c17", "item_id": [f"i{i}" for i in range(6)], "label": [0, 1, 0, 1, 0, 1],
                        "label_name": ["n", "t"] * 3, "group": ["p1", "p1", "p1", "p2", "p2", "p2"],
                        "group_unit": "patient", "domain": "h0", "split": ["train"] * 3 + ["test"] * 3,
                        "split_patch": ["train", "test", "train", "test", "train", "test"]})
    feats = (man["item_id"].to_numpy(), np.eye(6))
    grouped = assemble_task_data([man], [feats], task="t")
    assert grouped.group_unit(np.arange(6)) == "patient" and grouped.dataset_names() == "c17"
    assert list(grouped.splits) == list(man["split"]) and grouped.split_name == "manifest"
    leaky = assemble_task_data([man], [feats], task="t", split="patch (leaky, as published)")
    assert list(leaky.splits) == list(man["split_patch"]) and leaky.split_name == "patch (leaky, as published)"
    with pytest.raises(FmauditInputError, match="split_patch"):
        assemble_task_data([man.drop(columns="split_patch")], [feats], task="t", split="patch (leaky, as published)")
    undeclared = assemble_task_data([man.drop(columns="group_unit")], [feats], task="t")
    assert undeclared.group_unit(np.arange(6)) == "group"

"""The OOD shard of one (encoder, task): arrays in, the detection / selective / blur / gate frames out."""

from __future__ import annotations

import numpy as np
import pytest

from fmaudit import grid
from fmaudit.analyses.ood_suite import OODCondition, bootstrap_detection_auroc, run_ood_suite
from fmaudit.analyses.task_data import TaskData
from fmaudit.io import FmauditInputError
from fmaudit.metrics import detection_auroc
from fmaudit.ood.gate import GateSet, evaluate_gate
from fmaudit.ood.scorers import Mahalanobis

CLASSES = ["ADI", "BACK", "DEB", "TUM"]
SCORERS = ["maha", "knn", "energy", "msp"]


def make_data(seed=0, d=10):
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=2.5, size=(4, d))
    rows = []
    for split, n in (("train", 200), ("val", 40), ("test", 120)):
        y = np.arange(n) % 4
        g = np.array([f"{split}_p{i // 6}" for i in range(n)])
        rows.append((means[y] + rng.normal(size=(n, d)), y, g, np.full(n, split)))
    X, y, g, s = (np.concatenate(parts) for parts in zip(*rows))
    data = TaskData(features=X, labels=y, item_ids=np.array([f"i{i}" for i in range(len(y))]), groups=g,
                    domains=np.full(len(y), "all"), splits=s, class_names=CLASSES)
    test = s == "test"
    donor = rng.normal(loc=6.0, size=(50, d))
    conditions = [
        OODCondition("far", "far_other", donor, np.array([f"d{i // 5}" for i in range(50)])),
        OODCondition("blur", "blur_s1", X[test] + rng.normal(scale=1.0, size=(test.sum(), d)), sigma=1.0),
        OODCondition("blur", "blur_s3", X[test] + rng.normal(scale=3.0, size=(test.sum(), d)), sigma=3.0),
        OODCondition("near", "holdout_TUM", held_out=("TUM",)),
        OODCondition("artefact", "artefact", held_out=("BACK", "DEB")),
        OODCondition("image_artefact", "pen_seed0", X[test] + 2.0),
    ]
    return data, conditions


@pytest.fixture(scope="module")
def suite():
    data, conditions = make_data()
    result = run_ood_suite(data, conditions, encoder="enc", task="t", readout="cls", scorers=SCORERS, ordinal=True,
                           n_boot=40, gate_params={"random_state": 0}, gate_splits=2)
    return data, conditions, result


def test_detection_rows_are_the_grid_runs(suite):
    data, conditions, res = suite
    config = {"encoders": ["enc"], "tasks": {"t": {"datasets": ["d"]}, "other": {"datasets": ["e"]}},
              "ood": {"scorers": SCORERS, "far": {"t": "other"}, "blur": {"sigmas": [1.0, 3.0], "tasks": ["t"]},
                      "near": {"t": ["TUM"]}, "artefact": {"t": ["BACK", "DEB"]}, "gate": {"id_reject": 0.05}}}
    runs = grid.ood_runs(config)
    planned = set(zip(runs["tier"], runs["condition"], runs["scorer"]))
    produced = set(zip(res.detection["tier"], res.detection["condition"], res.detection["scorer"]))
    assert planned <= produced  # the image_artefact tier is new (not in the grid yet)
    assert produced - planned == {("image_artefact", "pen_seed0", s) for s in SCORERS}
    gate_settings = set(grid.ood_gate_runs(config)["setting"])
    assert set(res.gate["setting"]) == gate_settings == {"t", "t:artefact"}


def test_detection_matches_independent_scorers(suite):
    data, conditions, res = suite
    X, y = data.features, data.labels
    train, test = np.isin(data.splits, ["train", "val"]), data.splits == "test"
    rows = res.detection.set_index(["condition", "scorer"])
    full = Mahalanobis().fit(X[train], y[train])
    assert rows.loc[("far_other", "maha"), "auroc"] == pytest.approx(
        detection_auroc(full.score(X[test]), full.score(conditions[0].features)))
    keep = train & (y != 3)
    near = Mahalanobis().fit(X[keep], y[keep])
    ref = detection_auroc(near.score(X[test & (y != 3)]), near.score(X[test & (y == 3)]))
    assert rows.loc[("holdout_TUM", "maha"), "auroc"] == pytest.approx(ref)
    assert rows.loc[("holdout_TUM", "maha"), "n_ood"] == (test & (y == 3)).sum()
    assert rows.loc[("artefact", "knn"), "n_ood"] == (test & np.isin(y, [1, 2])).sum()
    assert rows.loc[("far_other", "maha"), "auroc"] > 0.95
    for _, r in res.detection.iterrows():
        assert r["auroc_ci_lo"] <= r["auroc"] + 1e-12 and r["auroc"] <= r["auroc_ci_hi"] + 1e-12
    # the synthetic groups declare no unit: "group"; far conditions resample donor groups as well
    units = res.detection.set_index("condition")["ci_unit"]
    assert set(units.drop("far_other")) == {"group"} and set(units.loc[["far_other"]]) == {"group+donor group"}
    # far: ID test patients (20) and donor groups (10) are the units
    assert rows.loc[("far_other", "energy"), "ci_n_units"] == 30
    assert rows.loc[("blur_s1", "energy"), "ci_n_units"] == 20  # blurred copies share their patients
    assert rows.loc[("blur_s3", "maha"), "auroc"] > rows.loc[("blur_s1", "maha"), "auroc"]
    assert len(res.histograms) == len(res.detection) * 2 * 30


def test_selective_blur_and_curves(suite):
    data, _, res = suite
    row = res.selective.iloc[0]
    assert row["set"] == "test" and row["n"] == 120 and "qwk" in row and row["ci_unit"] == "group"
    assert row["probe_C"] in np.logspace(-6, 0, 7)
    assert res.curves["coverage"].iloc[-1] == 1.0 and len(res.curves) == 100
    assert res.curves["risk"].iloc[-1] == pytest.approx(row["error_rate"])
    assert res.blur["sigma"].tolist() == [0.0, 1.0, 3.0]
    assert res.blur["accuracy"].iloc[0] == pytest.approx(row["accuracy"])
    assert res.blur["accuracy"].iloc[2] < res.blur["accuracy"].iloc[0]
    assert {"accuracy_change_ci_lo", "qwk_change"} <= set(res.blur.columns)


def test_gate_table_is_reproduced_by_the_exported_gate(suite):
    data, conditions, res = suite
    test = data.splits == "test"
    gate = res.gate_model
    assert gate.readout_ == "cls" and gate.encoder_ == "enc" and gate.n_classes_ == 4
    sets = [GateSet("test", data.features[test], data.labels[test], None, "id"),
            GateSet("far_other", conditions[0].features, None, None, "far"),
            GateSet("blur_s3", conditions[2].features, data.labels[test], None, "blur")]
    point = evaluate_gate(gate, sets, ordinal=True).set_index(["set", "quantity"])["value"]
    main = res.gate[res.gate["setting"] == "t"].set_index(["set", "quantity"])["value"]
    for key, v in point.items():
        assert main[key] == pytest.approx(v, abs=1e-12, nan_ok=True), key
    assert set(res.gate.loc[res.gate["setting"] == "t", "set"]) == {"validation", "test", "far_other", "blur_s1",
                                                                     "blur_s3", "pen_seed0"}
    art = res.gate[res.gate["setting"] == "t:artefact"].set_index(["set", "quantity"])
    mean = "mean_over_divisions"
    assert art.loc[("artefact", "reject_novel"), mean] > art.loc[("test", "reject_novel"), mean]
    assert art.loc[("test", "coverage"), "n_items"] == (test & np.isin(data.labels, [0, 3])).sum()


def test_bootstrap_detection_auroc_matches_weighted_roc_auc():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    s_id, s_ood = np.round(rng.normal(size=30), 1), np.round(rng.normal(1, 1, size=20), 1)
    counts = rng.integers(0, 3, size=(5, 50))
    got = bootstrap_detection_auroc(s_id, s_ood, counts)
    y = np.r_[np.zeros(30), np.ones(20)]
    for b in range(5):
        assert got[b] == pytest.approx(roc_auc_score(y, np.r_[s_id, s_ood], sample_weight=counts[b]))
    assert np.isnan(bootstrap_detection_auroc(s_id, s_ood, np.c_[np.ones((1, 30)), np.zeros((1, 20))].astype(int))[0])


def test_suite_input_errors():
    data, conditions = make_data()
    kw = dict(encoder="enc", task="t", n_boot=0, gate_params=None)
    with pytest.raises(FmauditInputError, match="9 dimensions|the task's have 10"):
        run_ood_suite(data, [OODCondition("far", "far_x", np.zeros((5, 9)))], **kw)
    with pytest.raises(FmauditInputError, match="perturbed items for 120 test items"):
        run_ood_suite(data, [OODCondition("blur", "blur_s1", np.zeros((7, 10)), sigma=1.0)], **kw)
    with pytest.raises(FmauditInputError, match="ViM is not implemented"):
        run_ood_suite(data, conditions[:1], scorers=["vim"], **kw)
    with pytest.raises(FmauditInputError, match="repeat"):
        run_ood_suite(data, [conditions[0], conditions[0]], **kw)
    with pytest.raises(FmauditInputError, match="not classes of the task"):
        run_ood_suite(data, [OODCondition("near", "holdout_X", held_out=("X",))], **kw)
    with pytest.raises(FmauditInputError, match="unknown tier"):
        run_ood_suite(data, [OODCondition("weird", "w", np.zeros((5, 10)))], **kw)
    bad = np.array(conditions[0].features)
    bad[2, 3] = np.nan
    with pytest.raises(FmauditInputError, match="NaN/inf features in row 2"):
        run_ood_suite(data, [OODCondition("far", "far_x", bad)], **kw)
    no_test = TaskData(data.features, data.labels, data.item_ids, data.groups, data.domains,
                       np.where(data.splits == "test", "train", data.splits), data.class_names)
    with pytest.raises(FmauditInputError, match="need training"):
        run_ood_suite(no_test, conditions[:1], **kw)

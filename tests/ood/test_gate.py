"""The two-threshold abstention gate: its definition, its evaluation, export and load."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold

from fmaudit.io import FmauditInputError
from fmaudit.ood.gate import (
    AbstentionGate,
    GateSet,
    evaluate_gate,
    fit_validation_split,
    gate_operating_points,
    load_gate,
    save_gate,
)
from fmaudit.ood.scorers import Mahalanobis


def id_classes(split, keep=(0, 1, 2)):
    X, y, g = split
    m = np.isin(y, keep)
    return X[m], y[m], g[m]


@pytest.fixture(scope="module")
def fitted(task):
    X, y, g = id_classes(task["train"])
    return AbstentionGate().fit(X, y, g, encoder="enc", readout="cls"), (X, y, g)


def test_thresholds_follow_the_audit_paper(fitted):
    gate, (X, y, g) = fitted
    fit, val = gate.fit_index_, gate.validation_index_
    assert set(g[fit]).isdisjoint(g[val])
    assert abs(val.size / y.size - 0.2) < 0.05
    scorer = Mahalanobis("ledoit_wolf").fit(X[fit], y[fit])
    novelty = scorer.score(X[val])
    np.testing.assert_allclose(gate.novelty(X[val]), novelty, rtol=1e-10)
    assert gate.novelty_threshold_ == pytest.approx(np.quantile(novelty, 0.95), rel=1e-10)
    probs = gate.probe_.predict_proba(X[val])
    passed = novelty <= gate.novelty_threshold_
    assert gate.confidence_threshold_ == pytest.approx(np.quantile(probs.max(1)[passed], 0.2), rel=1e-10)
    assert gate.C_ in np.logspace(-6, 0, 7)
    vp = gate.validation_point_
    assert vp["reject_novel"] == pytest.approx(1 - passed.mean())
    assert 0.75 <= vp["retain_confident"] <= 0.85


def test_decide_applies_novelty_first_then_confidence(fitted, task):
    gate, _ = fitted
    Xt = task["test"][0]
    table = gate.decide(Xt)
    assert list(table.columns) == ["decision", "novelty", "confidence", "prediction"]
    novel = table["novelty"] > gate.novelty_threshold_
    assert (table.loc[novel, "decision"] == "reject_novel").all()
    unconfident = ~novel & (table["confidence"] < gate.confidence_threshold_)
    assert (table.loc[unconfident, "decision"] == "reject_unconfident").all()
    assert (table.loc[~novel & ~unconfident, "decision"] == "accept").all()
    np.testing.assert_array_equal(table["prediction"], gate.logits(Xt).argmax(1))


def test_held_out_class_is_rejected_more_often_than_the_id_test_split(fitted, task):
    gate, _ = fitted
    X_id, _, _ = id_classes(task["test"])
    X_near, _, _ = id_classes(task["test"], keep=(3,))
    id_reject = (gate.decide(X_id)["decision"] != "accept").mean()
    near_reject = (gate.decide(X_near)["decision"] != "accept").mean()
    near_novel = (gate.decide(X_near)["decision"] == "reject_novel").mean()
    assert near_reject > id_reject + 0.3
    assert near_novel > 0.5


def test_fit_validation_split_is_the_audit_papers_split_indices():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 100)
    fit, val = fit_validation_split(y, validation_fraction=0.2, random_state=3)
    _, ref = next(StratifiedKFold(5, shuffle=True, random_state=3).split(np.zeros(100), y))
    np.testing.assert_array_equal(val, np.sort(ref))
    np.testing.assert_array_equal(np.sort(np.r_[fit, val]), np.arange(100))
    groups = np.repeat(np.arange(25), 4)
    fit, val = fit_validation_split(y, groups, 0.2, random_state=0)
    assert set(groups[fit]).isdisjoint(groups[val]) and np.unique(groups[val]).size == 5
    fit, val = fit_validation_split(y, groups, 0.3, random_state=0)  # not 1/k: the group-drawing fallback
    assert set(groups[fit]).isdisjoint(groups[val]) and 0.2 < val.size / 100 < 0.45


def test_fixed_C_and_other_scorers(task):
    X, y, g = id_classes(task["train"])
    gate = AbstentionGate(C=0.5, scorer="knn", scorer_params={"k": 5}, retain=1.0).fit(X, y)
    assert gate.C_ == 0.5
    assert gate.validation_point_["retain_confident"] == 1.0
    assert AbstentionGate(scorer="relative_maha").fit(X, y, g).scorer_.name == "relative_maha"


def test_operating_points_table(task):
    X, y, g = id_classes(task["train"])
    Xt, yt, gt = id_classes(task["test"])
    Xn, _, gn = id_classes(task["test"], keep=(3,))
    sets = [GateSet("test", Xt, yt, gt, "id"), GateSet("holdout_3", Xn, None, gn, "near")]
    table, gate = gate_operating_points(X, y, g, sets, gate_params={"random_state": 0}, n_splits=3, n_boot=60,
                                        ordinal=True)
    point = evaluate_gate(gate, sets, ordinal=True)
    merged = table.merge(point, on=["set", "quantity"], suffixes=("", "_single"))
    np.testing.assert_allclose(merged["value"], merged["value_single"], rtol=0, atol=1e-12, equal_nan=True)
    row = table.set_index(["set", "quantity"])
    mean = "mean_over_divisions"
    assert row.loc[("holdout_3", "reject_novel"), mean] > row.loc[("test", "reject_novel"), mean]
    cov = row.loc[("test", "coverage")]
    assert cov[f"{mean}_ci_lo"] <= cov[mean] <= cov[f"{mean}_ci_hi"]
    assert cov["ci_unit"] == "group" and cov["ci_n_units"] == np.unique(gt).size
    assert cov["n_boot"] == 60 and cov["n_splits"] == 3 and cov["n_valid"] == 180
    taus = [AbstentionGate(random_state=s).fit(X, y, g).novelty_threshold_ for s in range(3)]
    assert row.loc[("validation", "tau_novelty"), mean] == pytest.approx(np.mean(taus))
    assert row.loc[("validation", "tau_novelty"), "value"] == pytest.approx(taus[0])
    assert ("test", "qwk_accepted") in row.index and ("holdout_3", "accuracy_accepted") not in row.index
    assert row.loc[("holdout_3", "reject_any"), "ci_unit"] == "group"


def test_save_and_load_reproduce_every_decision(fitted, task, tmp_path):
    gate, _ = fitted
    card_path = save_gate(gate, tmp_path / "gate", class_names=["a", "b", "c"])
    assert sorted(p.name for p in (tmp_path / "gate").iterdir()) == ["gate.json", "gate.safetensors"]
    card = json.loads(card_path.read_text())
    assert card["encoder"] == "enc" and card["readout"] == "cls" and card["n_features"] == 10
    assert card["thresholds"] == {"novelty": gate.novelty_threshold_, "confidence": gate.confidence_threshold_}
    assert card["fmaudit_version"] and card["data_hash"] == gate.training_data_hash_
    assert card["validation_operating_point"]["n_validation"] == gate.validation_index_.size
    loaded = load_gate(tmp_path / "gate")
    Xt = task["test"][0]
    a, b = gate.decide(Xt), loaded.decide(Xt)
    np.testing.assert_array_equal(a["decision"], b["decision"])
    np.testing.assert_array_equal(a["prediction"], b["prediction"])
    np.testing.assert_allclose(b["novelty"], a["novelty"], rtol=1e-12)
    np.testing.assert_allclose(b["confidence"], a["confidence"], rtol=1e-12)


def test_loaded_gate_refuses_other_dimensions_and_readouts(fitted, task, tmp_path):
    gate, _ = fitted
    save_gate(gate, tmp_path / "g")
    loaded = load_gate(tmp_path / "g")
    Xt = task["test"][0]
    with pytest.raises(FmauditInputError,
                       match=r"9 features, but the gate \(encoder 'enc', readout 'cls'\) was fitted on 10"):
        loaded.decide(Xt[:, :9])
    with pytest.raises(FmauditInputError, match="fitted on readout 'cls'.*readout 'mean'"):
        loaded.decide(Xt, readout="mean")
    assert len(loaded.decide(Xt, readout="cls")) == len(Xt)


def test_load_refuses_broken_exports(fitted, tmp_path):
    gate, _ = fitted
    with pytest.raises(FmauditInputError, match="no gate.json"):
        load_gate(tmp_path)
    save_gate(gate, tmp_path / "g")
    arrays = tmp_path / "g" / "gate.safetensors"
    arrays.write_bytes(arrays.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(FmauditInputError, match="sha256"):
        load_gate(tmp_path / "g")
    card = tmp_path / "g" / "gate.json"
    card.write_text(json.dumps({**json.loads(card.read_text()), "format": "other"}))
    with pytest.raises(FmauditInputError, match="format 'other'"):
        load_gate(tmp_path / "g")


def test_gate_input_errors(task):
    X, y, g = id_classes(task["train"])
    with pytest.raises(FmauditInputError, match="single class"):
        AbstentionGate().fit(X[y == 0], y[y == 0])
    bad = X.copy()
    bad[4, 1] = np.inf
    with pytest.raises(FmauditInputError, match="NaN/inf"):
        AbstentionGate().fit(bad, y)
    with pytest.raises(FmauditInputError, match="not fitted"):
        AbstentionGate().decide(X)
    with pytest.raises(FmauditInputError, match="id_reject"):
        AbstentionGate(id_reject=1.5).fit(X, y)
    with pytest.raises(FmauditInputError, match="groups cannot fill 5"):
        AbstentionGate().fit(X, y, np.repeat(["a", "b", "c"], len(y) // 3))
    with pytest.raises(FmauditInputError, match="labels"):
        AbstentionGate().fit(X, y[:-1])


def test_unknown_gate_parameter_is_named(task):
    X, y, g = id_classes(task["train"])
    with pytest.raises(FmauditInputError, match=r"unknown parameter\(s\) \['retention'\]"):
        gate_operating_points(X, y, g, [], gate_params={"retention": 0.8}, n_splits=1, n_boot=1)


def test_a_validation_split_of_few_groups_per_class_stays_group_disjoint():
    """Three patients per class and five folds: StratifiedKFold refuses, the groups are dealt unstratified."""
    from fmaudit.ood.gate import fit_validation_split

    labels = np.repeat(np.arange(3), 12)
    groups = np.repeat([f"p{i}" for i in range(9)], 4)  # each patient one class, three per class
    fit, val = fit_validation_split(labels, groups, validation_fraction=0.2, random_state=0)
    assert len(val) and len(fit) and not set(groups[fit]) & set(groups[val])
    assert sorted(np.concatenate([fit, val]).tolist()) == list(range(len(labels)))

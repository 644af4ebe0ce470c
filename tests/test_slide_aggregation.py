"""Slide-level aggregation (the six aggregators, the two neural ones seeded on the CPU), label coarsening, the task
without some classes, and the audit paper's pooling of several splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import cohen_kappa_score

from fmaudit.io import FmauditInputError
from fmaudit.slide_aggregation import (
    AttentionMILClassifier,
    TransformerMILClassifier,
    coarsen_to_slide,
    label_coarsening,
    label_coarsening_predictions,
    majority_vote,
    make_bags,
    mean_probability,
    slide_aggregation,
    summarize_splits,
    without_classes,
)

SMALL_MIL = {"embed_dim": 16, "attention_dim": 8, "epochs": 12, "lr": 1e-2, "weight_decay": 0.0, "device": "cpu"}
SMALL_TRANSFORMER = {"embed_dim": 16, "n_heads": 2, "feedforward_dim": 32, "epochs": 20, "lr": 1e-3,
                     "weight_decay": 0.0}
SMALL = {"mil": SMALL_MIL, "transformer": SMALL_TRANSFORMER}


def graded_slides(n_slides=60, tiles=8, d=6, seed=0):
    """Slide grade g in 0..2: a share g/2 of its tiles are 'tumour' tiles (shifted), the rest benign."""
    rng = np.random.default_rng(seed)
    tumour = rng.normal(scale=2.0, size=d)
    X, y, slides = [], [], []
    for s in range(n_slides):
        grade = s % 3
        n_tumour = int(round(tiles * grade / 2 * 0.6))
        for t in range(tiles):
            X.append(rng.normal(size=d) + (tumour if t < n_tumour else 0))
            y.append(grade)
            slides.append(f"s{s:03d}")
    return np.array(X), np.array(y), np.array(slides)


def test_bags_votes_and_means():
    ids, index, labels = make_bags(["b", "a", "b", "a", "c"], [1, 0, 1, 0, 2])
    assert ids.tolist() == ["a", "b", "c"] and [i.tolist() for i in index] == [[1, 3], [0, 2], [4]]
    assert labels.tolist() == [0, 1, 2]
    with pytest.raises(FmauditInputError, match="slide 'a'.*different labels"):
        make_bags(["a", "a"], [0, 1])
    pred, conf = majority_vote(np.array([2, 1, 1, 2, 0]), [np.array([0, 1, 2, 3]), np.array([4])], 3)
    assert pred.tolist() == [1, 0] and conf.tolist() == [0.5, 1.0]  # tie 1 vs 2 goes to the lowest grade
    probs = np.array([[0.2, 0.8], [0.6, 0.4], [1.0, 0.0]])
    np.testing.assert_allclose(mean_probability(probs, [np.array([0, 1]), np.array([2])]), [[0.4, 0.6], [1.0, 0.0]])
    np.testing.assert_array_equal(coarsen_to_slide([0, 2, 1, 0, 1], ["x", "x", "y", "y", "z"]), [2, 2, 1, 1, 1])


def test_attention_mil_learns_seeded_on_cpu():
    X, y, slides = graded_slides()
    _, index, labels = make_bags(slides, y)
    train, test = np.arange(0, 45), np.arange(45, 60)
    mil = AttentionMILClassifier(random_state=3, **SMALL_MIL).fit(X, [index[i] for i in train], labels[train], 3)
    probs = mil.predict_proba(X, [index[i] for i in test])
    assert probs.shape == (15, 3) and np.allclose(probs.sum(1), 1)
    assert (probs.argmax(1) == labels[test]).mean() >= 0.6  # chance is 1/3
    assert mil.losses_[-1] < mil.losses_[0]
    torch_state = torch.get_rng_state()
    again = AttentionMILClassifier(random_state=3, **SMALL_MIL).fit(X, [index[i] for i in train], labels[train], 3)
    np.testing.assert_array_equal(again.predict_proba(X, [index[i] for i in test]), probs)
    assert torch.equal(torch.get_rng_state(), torch_state)  # the global torch RNG is left as it was
    with pytest.raises(FmauditInputError, match="single class"):
        AttentionMILClassifier(**SMALL_MIL).fit(X, [index[0], index[3]], np.array([0, 0]), 3)
    with pytest.raises(FmauditInputError, match="dimensions"):
        mil.predict_proba(X[:, :3], [index[0]])


def test_slide_aggregation_table():
    X, y, slides = graded_slides(n_slides=72)
    test = np.isin(slides, [f"s{s:03d}" for s in range(54, 72)])
    table = slide_aggregation(X[~test], y[~test], slides[~test], X[test], y[test], slides[test], n_classes=3,
                              ordinal=True, neural_params=SMALL, n_boot=50)
    assert table["aggregator"].tolist() == ["tile_level", "majority_vote", "mean_probability", "mean_embedding",
                                            "max_embedding", "attention_mil", "transformer_mil"]
    assert table["paper_name"].tolist() == ["patch-level probe", "patch_vote", "", "mean_pool", "max_pool", "abmil",
                                            "transformer"]
    tile = table.iloc[0]
    assert tile["n"] == test.sum() and tile["ci_unit"] == "slide" and tile["ci_n_units"] == 18
    slide_rows = table.iloc[1:]
    assert (slide_rows["n"] == 18).all() and (slide_rows["n_test_slides"] == 18).all()
    assert (slide_rows["ci_unit"] == "item").all()  # slides are the items; no patients given
    assert slide_rows["accuracy"].max() > 0.6
    assert np.isfinite(table["qwk"]).all() and (table["aurc"] >= 0).all()
    with pytest.raises(FmauditInputError, match="both sides"):
        slide_aggregation(X, y, slides, X[test], y[test], slides[test], n_classes=3, aggregators=["majority_vote"],
                          n_boot=0)
    with pytest.raises(FmauditInputError, match="unknown aggregator"):
        slide_aggregation(X[~test], y[~test], slides[~test], X[test], y[test], slides[test], n_classes=3,
                          aggregators=["transformer"], n_boot=0)  # the paper's name; fmaudit's is transformer_mil


def test_majority_vote_row_matches_a_direct_computation():
    X, y, slides = graded_slides(n_slides=48, seed=1)
    test = np.isin(slides, [f"s{s:03d}" for s in range(36, 48)])
    table = slide_aggregation(X[~test], y[~test], slides[~test], X[test], y[test], slides[test], n_classes=3,
                              aggregators=["majority_vote"], probe_C=1.0, n_boot=0)
    from fmaudit.probes import LogisticProbe

    pred = LogisticProbe(C=1.0, max_iter=10000, tol=1e-6, n_classes=3).fit(X[~test], y[~test]).predict(X[test])
    ids, index, labels = make_bags(slides[test], y[test])
    vote = np.array([np.bincount(pred[i], minlength=3).argmax() for i in index])
    row = table.set_index("aggregator").loc["majority_vote"]
    assert row["accuracy"] == pytest.approx((vote == labels).mean())
    assert row["qwk"] == pytest.approx(cohen_kappa_score(labels, vote, weights="quadratic", labels=range(3)))


def test_label_coarsening_and_without_benign():
    X, y_slide, slides = graded_slides(n_slides=48, seed=2)
    rng = np.random.default_rng(0)
    region = np.minimum(y_slide, rng.integers(0, 3, y_slide.size))  # region labels never above the slide's
    region[np.r_[[np.flatnonzero(slides == s)[0] for s in np.unique(slides)]]] = y_slide[
        np.r_[[np.flatnonzero(slides == s)[0] for s in np.unique(slides)]]]  # one tile carries the slide grade
    patients = np.char.add("p", (np.char.lstrip(slides, "s").astype(int) // 2).astype(str))
    is_test = np.char.lstrip(slides, "s").astype(int) >= 36
    table = label_coarsening(X, region, slides, patients, is_test, n_classes=3, neural_params=SMALL, probe_C=1.0,
                             n_boot=0)
    assert list(zip(table["arm"], table["evaluation"])) == [("patch", "patch_labels"), ("slide", "slide_labels"),
                                                            ("slide", "patch_labels"), ("slide_mil", "slide_labels")]
    assert table["relabelled_share"].iloc[0] == pytest.approx((coarsen_to_slide(region, slides) != region).mean())
    assert table.loc[3, "n"] == 12 and table.loc[0, "n"] == is_test.sum()
    names = ["NC", "G3", "G4"]
    out = without_classes(X[~is_test], region[~is_test], patients[~is_test], X[is_test], region[is_test],
                          patients[is_test], class_names=names, removed=("NC",), probe_C=1.0, n_boot=0)
    assert out["n_train"] == (region[~is_test] != 0).sum() and out["n_test"] == (region[is_test] != 0).sum()
    assert out["removed"] == "NC" and out["removed_patients"] == np.unique(patients[region == 0]).size
    with pytest.raises(FmauditInputError, match="not classes of the task"):
        without_classes(X, region, patients, X, region, patients, class_names=names, removed=("benign",), n_boot=0)


def test_transformer_mil_learns_seeded_on_cpu_and_leaves_the_torch_rng_alone():
    X, y, slides = graded_slides(n_slides=90)
    _, index, labels = make_bags(slides, y)
    train, test = np.arange(0, 60), np.arange(60, 90)
    torch_state = torch.get_rng_state()
    model = TransformerMILClassifier(random_state=5, **SMALL_TRANSFORMER).fit(X, [index[i] for i in train],
                                                                              labels[train], 3)
    assert model.device_ == "cpu"  # the audit paper trains its neural aggregators on the CPU by default
    assert torch.equal(torch.get_rng_state(), torch_state)  # dropout drew from a forked RNG
    probs = model.predict_proba(X, [index[i] for i in test])
    assert probs.shape == (30, 3) and np.allclose(probs.sum(1), 1)
    assert (probs.argmax(1) == labels[test]).mean() >= 0.6  # chance is 1/3
    assert model.losses_[-1] < model.losses_[0]
    again = TransformerMILClassifier(random_state=5, **SMALL_TRANSFORMER).fit(X, [index[i] for i in train],
                                                                              labels[train], 3)
    np.testing.assert_array_equal(again.predict_proba(X, [index[i] for i in test]), probs)
    other = TransformerMILClassifier(random_state=6, **SMALL_TRANSFORMER).fit(X, [index[i] for i in train],
                                                                              labels[train], 3)
    assert not np.array_equal(other.predict_proba(X, [index[i] for i in test]), probs)
    with pytest.raises(FmauditInputError, match="multiple of n_heads"):
        TransformerMILClassifier(embed_dim=10, n_heads=4).fit(X, [index[i] for i in train], labels[train], 3)


def test_max_embedding_is_the_probe_on_per_slide_maxima():
    from fmaudit.probes import LogisticProbe

    X, y, slides = graded_slides(n_slides=48, seed=4)
    test = np.isin(slides, [f"s{s:03d}" for s in range(36, 48)])
    table = slide_aggregation(X[~test], y[~test], slides[~test], X[test], y[test], slides[test], n_classes=3,
                              aggregators=["max_embedding"], probe_C=1.0, n_boot=0).set_index("aggregator")
    _, idx_tr, lab_tr = make_bags(slides[~test], y[~test])
    _, idx_te, lab_te = make_bags(slides[test], y[test])
    Xtr, Xte = X[~test], X[test]
    probe = LogisticProbe(C=1.0, max_iter=10000, tol=1e-6, n_classes=3).fit(
        np.stack([Xtr[i].max(0) for i in idx_tr]), lab_tr)
    pred = probe.predict(np.stack([Xte[i].max(0) for i in idx_te]))
    assert table.loc["max_embedding", "accuracy"] == pytest.approx((pred == lab_te).mean())
    assert table.loc["max_embedding", "slide_probe_C"] == 1.0


def test_splits_pool_their_bootstrap_draws_and_average_their_points():
    """The audit paper: the point is the mean over the splits, the interval the percentiles of the draws of every split
    pooled; each split's resamples are seeded by the bootstrap seed plus the split seed."""
    from fmaudit.ood.selective import prediction_draws

    X, y, slides = graded_slides(n_slides=48, seed=2)
    region = y.copy()
    patients = np.char.add("p", (np.char.lstrip(slides, "s").astype(int) // 2).astype(str))
    number = np.char.lstrip(slides, "s").astype(int)
    splits = {seed: label_coarsening_predictions(X, region, slides, patients, (number + seed) % 4 == 0, n_classes=3,
                                                 probe_C=1.0, neural_params=SMALL)
              for seed in (0, 1)}
    table = summarize_splits(splits, n_boot=40, bootstrap_seed=7)
    row = table.iloc[0]
    assert (row["arm"], row["evaluation"]) == ("patch", "patch_labels")
    per = [prediction_draws(a.labels, a.predictions, a.confidence, 3, ordinal=True, groups=a.groups, n_boot=40,
                            random_state=7 + seed, unit=a.unit) for seed, a in ((s, splits[s][0]) for s in (0, 1))]
    assert row["accuracy"] == pytest.approx(np.mean([p.point["accuracy"] for p in per]))
    pooled = np.concatenate([p.draws["accuracy"] for p in per])
    assert row["accuracy_ci_lo"] == pytest.approx(np.percentile(pooled, 2.5))
    assert row["accuracy_ci_hi"] == pytest.approx(np.percentile(pooled, 97.5))
    assert row["n_splits"] == 2 and row["n_boot"] == 40 and row["n_boot_pooled"] == 80 and row["split_seeds"] == "0,1"
    assert row["accuracy_sd_over_splits"] == pytest.approx(np.std([p.point["accuracy"] for p in per], ddof=1))
    assert len(table) == 4 and row["ci_unit"] == "patient"

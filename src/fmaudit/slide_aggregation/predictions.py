"""The predictions of each arm of the slide-label analyses on one train/test split: the aggregators beside the
tile probe, label coarsening to the slide, and the task without some of its classes (see
:mod:`fmaudit.slide_aggregation`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from fmaudit.io import FmauditInputError
from fmaudit.ood.conditions import hold_out_classes
from fmaudit.probes import LogisticCVProbe, LogisticProbe
from fmaudit.slide_aggregation.bags import coarsen_to_slide, majority_vote, make_bags, mean_probability, pool_bags
from fmaudit.slide_aggregation.mil import neural_aggregator

#: Every aggregator, in the order of the tables.
AGGREGATORS = ("majority_vote", "mean_probability", "mean_embedding", "max_embedding", "attention_mil",
               "transformer_mil")
#: The audit paper's name of each aggregator (``slide_aggregation.py``); ``mean_probability`` is fmaudit's own.
PAPER_NAMES = {"majority_vote": "patch_vote", "mean_probability": "", "mean_embedding": "mean_pool",
               "max_embedding": "max_pool", "attention_mil": "abmil", "transformer_mil": "transformer",
               "tile_level": "patch-level probe"}


@dataclass
class ArmPredictions:
    """One arm's predictions on the test side of one split: ``key`` names the arm (aggregator, or arm and
    evaluation, and level), ``groups`` / ``unit`` what its bootstrap resamples, ``extra`` constant columns
    (slide counts, the probe's C ...).

    Parameters
    ----------
    key : dict
        The arm's identifying columns, e.g. ``{"aggregator": ..., "paper_name": ..., "level": ...}`` or
        ``{"arm": ..., "evaluation": ..., "level": ...}``.
    labels : ndarray of int, shape (n,)
        True class of each evaluated unit (tile or slide).
    predictions : ndarray of int, shape (n,)
        Predicted class of each unit.
    confidence : ndarray of float, shape (n,)
        Confidence of each prediction, in [0, 1].
    groups : ndarray of shape (n,) or None
        Bootstrap cluster of each unit (slide or patient); None resamples the units themselves.
    unit : str
        What the bootstrap resamples, for the ``ci_unit`` column (``"slide"``, ``"patient"``).
    n_classes : int
        K.
    extra : dict
        Constant columns added to the arm's row.
    """

    key: dict[str, Any]
    labels: np.ndarray
    predictions: np.ndarray
    confidence: np.ndarray
    groups: np.ndarray | None
    unit: str
    n_classes: int
    extra: dict[str, Any] = field(default_factory=dict)


def _fit_probe(X, y, groups, n_classes, C=None, random_state=0):
    if C is not None:
        return LogisticProbe(C=float(C), max_iter=10000, tol=1e-6, n_classes=n_classes).fit(X, y)
    probe = LogisticCVProbe(max_iter=10000, tol=1e-6, random_state=random_state, n_classes=n_classes)
    return probe.fit(X, y, groups=groups)


def _probe_C(probe, probe_C) -> float:
    return float(getattr(probe, "C_", probe_C if probe_C is not None else np.nan))


def slide_aggregation_predictions(X_train: Any, y_train: Any, slides_train: Any, X_test: Any, y_test: Any,
                                  slides_test: Any, *, n_classes: int, groups_train: Any = None,
                                  slide_groups_test: Any = None, probe_C: float | None = None,
                                  aggregators: Sequence[str] = AGGREGATORS,
                                  neural_params: Mapping[str, Mapping[str, Any]] | None = None,
                                  random_state: int = 0) -> list[ArmPredictions]:
    """The ``tile_level`` row (the tile probe on the test tiles, resampled by slide) and one entry per
    aggregator, on one split; see :func:`slide_aggregation`.

    Parameters
    ----------
    X_train : array-like of shape (n_train_tiles, D)
        Frozen tile embeddings of the training slides.
    y_train : array-like of shape (n_train_tiles,)
        Class index of each training tile (its slide's label: every tile of a slide carries it).
    slides_train : array-like of shape (n_train_tiles,)
        Slide id of each training tile.
    X_test : array-like of shape (n_test_tiles, D)
        Tile embeddings of the test slides.
    y_test : array-like of shape (n_test_tiles,)
        Class index of each test tile (its slide's label).
    slides_test : array-like of shape (n_test_tiles,)
        Slide id of each test tile; no slide may be on both sides.
    n_classes : int
        K, the number of classes (keyword-only).
    groups_train : array-like of shape (n_train_tiles,), optional
        Group (patient) of each training tile for the probe's group-disjoint CV folds; default the slides.
    slide_groups_test : array-like of shape (n_test_tiles,), optional
        Patient of each test tile; the slide-level bootstrap then resamples patients instead of slides.
    probe_C : float, optional
        Inverse L2 strength of every logistic probe; None selects C by group-disjoint cross-validation
        (:class:`fmaudit.probes.LogisticCVProbe`).
    aggregators : sequence of str, default AGGREGATORS
        Which of :data:`AGGREGATORS` to run.
    neural_params : Mapping, optional
        ``{"mil": {...}, "transformer": {...}}``: constructor keywords of :class:`AttentionMILClassifier` and
        :class:`TransformerMILClassifier` (the config's settings).
    random_state : int, default 0
        Seed of the probes' CV folds and of the neural aggregators (unless their settings give one).

    Returns
    -------
    list of ArmPredictions
        ``tile_level`` first, then the aggregators in the order given.

    Raises
    ------
    FmauditInputError
        On an unknown aggregator, a slide on both sides of the split, or tiles of a slide with different labels.
    """
    unknown = [a for a in aggregators if a not in AGGREGATORS]
    if unknown:
        raise FmauditInputError(f"unknown aggregator(s) {unknown}; known: {list(AGGREGATORS)}")
    X_train, X_test = np.asarray(X_train, np.float64), np.asarray(X_test, np.float64)
    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    ids_tr, idx_tr, lab_tr = make_bags(slides_train, y_train)
    ids_te, idx_te, lab_te = make_bags(slides_test, y_test)
    both = set(ids_tr.tolist()) & set(ids_te.tolist())
    if both:
        raise FmauditInputError(f"slide {sorted(both)[0]!r} has tiles on both sides of the split")
    k = int(n_classes)
    groups_train = np.asarray(slides_train) if groups_train is None else np.asarray(groups_train)
    probe = _fit_probe(X_train, y_train, groups_train, k, probe_C, random_state)
    probs = probe.predict_proba(X_test)
    tile_pred, tile_conf = probs.argmax(axis=1), probs.max(axis=1)
    bag_groups = None
    if slide_groups_test is not None:
        sg = np.asarray(slide_groups_test)
        bag_groups = np.array([sg[i[0]] for i in idx_te])
    unit = "patient" if bag_groups is not None else "slide"
    extra = {"n_train_slides": len(ids_tr), "n_test_slides": len(ids_te), "probe_C": _probe_C(probe, probe_C)}
    out = [ArmPredictions({"aggregator": "tile_level", "paper_name": PAPER_NAMES["tile_level"], "level": "tile"},
                          y_test, tile_pred, tile_conf, np.asarray(slides_test), "slide", k, extra)]
    for name in aggregators:
        slide_C = np.nan
        if name == "majority_vote":
            pred, conf = majority_vote(tile_pred, idx_te, k)
        elif name == "mean_probability":
            p = mean_probability(probs, idx_te)
            pred, conf = p.argmax(axis=1), p.max(axis=1)
        elif name in ("mean_embedding", "max_embedding"):
            how = "mean" if name == "mean_embedding" else "max"
            slide_probe = _fit_probe(pool_bags(X_train, idx_tr, how), lab_tr, None, k, probe_C, random_state)
            p = slide_probe.predict_proba(pool_bags(X_test, idx_te, how))
            pred, conf = p.argmax(axis=1), p.max(axis=1)
            slide_C = _probe_C(slide_probe, probe_C)
        else:
            model = neural_aggregator(name, neural_params, random_state)
            p = model.fit(X_train, idx_tr, lab_tr, k).predict_proba(X_test, idx_te)
            pred, conf = p.argmax(axis=1), p.max(axis=1)
        out.append(ArmPredictions({"aggregator": name, "paper_name": PAPER_NAMES[name], "level": "slide"},
                                  lab_te, pred, conf, bag_groups, unit, k, {**extra, "slide_probe_C": slide_C}))
    return out


def label_coarsening_predictions(X: Any, labels: Any, slides: Any, groups: Any, is_test: Any, *, n_classes: int,
                                 probe_C: float | None = None,
                                 neural_params: Mapping[str, Mapping[str, Any]] | None = None,
                                 random_state: int = 0) -> list[ArmPredictions]:
    """The four arms of :func:`label_coarsening` on one split.

    Parameters
    ----------
    X : array-like of shape (n_tiles, D)
        Tile embeddings, training and test tiles together.
    labels : array-like of shape (n_tiles,)
        Region-level class index (grade) of each tile; larger is more severe.
    slides : array-like of shape (n_tiles,)
        Slide id of each tile; no slide may be on both sides.
    groups : array-like of shape (n_tiles,)
        Patient of each tile (CV folds and bootstrap clusters).
    is_test : array-like of bool, shape (n_tiles,)
        True for the test tiles; both sides must be non-empty.
    n_classes : int
        K, the number of grades (keyword-only).
    probe_C : float, optional
        Inverse L2 strength of the probes; None selects it by group-disjoint cross-validation.
    neural_params : Mapping, optional
        ``{"mil": {...}}``: constructor keywords of the :class:`AttentionMILClassifier` arm.
    random_state : int, default 0
        Seed of the probes' CV folds and of the MIL model.

    Returns
    -------
    list of ArmPredictions
        ``patch``/patch_labels, ``slide``/slide_labels, ``slide``/patch_labels, ``slide_mil``/slide_labels.

    Raises
    ------
    FmauditInputError
        On inputs of different lengths, an empty side, or a slide on both sides.
    """
    X = np.asarray(X, np.float64)
    y = np.asarray(labels).astype(np.int64)
    s = np.asarray(slides)
    g = np.asarray(groups)
    test = np.asarray(is_test, dtype=bool)
    if not (X.shape[0] == y.size == s.size == g.size == test.size):
        raise FmauditInputError("label_coarsening: features, labels, slides, groups and is_test differ in length")
    if not test.any() or test.all():
        raise FmauditInputError("label_coarsening: need tiles on both sides of the split (is_test)")
    leaky = set(s[test].tolist()) & set(s[~test].tolist())
    if leaky:
        raise FmauditInputError(f"slide {sorted(leaky)[0]!r} has tiles on both sides of the split")
    coarse = coarsen_to_slide(y, s)
    k = int(n_classes)
    tr, te = ~test, test
    extra = {"relabelled_share": float((coarse != y).mean())}
    out = []
    probe = _fit_probe(X[tr], y[tr], g[tr], k, probe_C, random_state)
    p = probe.predict_proba(X[te])
    out.append(ArmPredictions({"arm": "patch", "evaluation": "patch_labels", "level": "tile"}, y[te], p.argmax(1),
                              p.max(1), g[te], "patient", k, {**extra, "probe_C": _probe_C(probe, probe_C)}))
    probe = _fit_probe(X[tr], coarse[tr], g[tr], k, probe_C, random_state)
    p = probe.predict_proba(X[te])
    for evaluation, target in (("slide_labels", coarse[te]), ("patch_labels", y[te])):
        out.append(ArmPredictions({"arm": "slide", "evaluation": evaluation, "level": "tile"}, target, p.argmax(1),
                                  p.max(1), g[te], "patient", k, {**extra, "probe_C": _probe_C(probe, probe_C)}))
    _, idx_tr, bag_tr = make_bags(s[tr], coarse[tr])
    _, idx_te, bag_te = make_bags(s[te], coarse[te])
    model = neural_aggregator("attention_mil", neural_params, random_state)
    p = model.fit(X[tr], idx_tr, bag_tr, k).predict_proba(X[te], idx_te)
    bag_groups = np.array([g[te][i[0]] for i in idx_te])
    out.append(ArmPredictions({"arm": "slide_mil", "evaluation": "slide_labels", "level": "slide"}, bag_te,
                              p.argmax(1), p.max(1), bag_groups, "patient", k, {**extra, "probe_C": np.nan}))
    return out


def without_classes_predictions(X_train: Any, y_train: Any, groups_train: Any, X_test: Any, y_test: Any,
                                groups_test: Any, *, class_names: Sequence[str], removed: Sequence[str] = ("NC",),
                                probe_C: float | None = None, random_state: int = 0) -> ArmPredictions:
    """The one arm of :func:`without_classes` on one split.

    Parameters
    ----------
    X_train : array-like of shape (n_train, D)
        Training tile embeddings.
    y_train : array-like of shape (n_train,)
        Training class indices, into ``class_names``.
    groups_train : array-like of shape (n_train,)
        Patient of each training tile (group-disjoint CV folds).
    X_test : array-like of shape (n_test, D)
        Test tile embeddings.
    y_test : array-like of shape (n_test,)
        Test class indices, into ``class_names``.
    groups_test : array-like of shape (n_test,)
        Patient of each test tile (the bootstrap's unit).
    class_names : sequence of str
        Name of each class index (keyword-only).
    removed : sequence of str, default ("NC",)
        Names of the classes dropped from both splits.
    probe_C : float, optional
        Inverse L2 strength of the probe; None selects it by group-disjoint cross-validation.
    random_state : int, default 0
        Seed of the probe's CV folds.

    Returns
    -------
    ArmPredictions
        Key ``arm="without <removed>"``; the remaining classes renumbered in order.
    """
    tr = hold_out_classes(y_train, class_names, removed, condition="without " + "+".join(removed))
    te = hold_out_classes(y_test, class_names, removed)
    Xtr, Xte = np.asarray(X_train, np.float64)[tr.keep], np.asarray(X_test, np.float64)[te.keep]
    gtr, gte = np.asarray(groups_train)[tr.keep], np.asarray(groups_test)
    k = len(tr.class_names)
    probe = _fit_probe(Xtr, tr.labels[tr.keep], gtr, k, probe_C, random_state)
    p = probe.predict_proba(Xte)
    removed_groups = np.r_[np.asarray(groups_train)[tr.held_out], gte[te.held_out]]
    extra = {"removed": "+".join(removed), "n_train": int(tr.keep.sum()), "n_test": int(te.keep.sum()),
             "removed_patients": int(np.unique(removed_groups).size),
             "removed_test_patients": int(np.unique(gte[te.held_out]).size), "probe_C": _probe_C(probe, probe_C)}
    return ArmPredictions({"arm": f"without {extra['removed']}", "evaluation": "patch_labels", "level": "tile"},
                          te.labels[te.keep], p.argmax(1), p.max(1), gte[te.keep], "patient", k, extra)

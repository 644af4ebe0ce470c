"""PRISM's exact label-fraction draw, and PRISM's per-run numbers reproduced with the batched engine.

The references are written here from PRISM's code (``alicemkyn/prism-benchmark``, ``prism_bench/evaluator.py``
``stratified_sample`` and ``PRISMEvaluator.evaluate``; ``prism_bench/metrics.py`` ``compute_ece``): they use
numpy's global generator and scikit-learn exactly as PRISM calls them.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from fmaudit.io import FmauditInputError
from fmaudit.probes import fit_logistic_batch
from fmaudit.probes.subsample import prism_subsample
from prism_reference import prism_metrics, prism_notebook_sample, prism_stratified_sample

PRISM_SEEDS = (42, 123, 456)
PRISM_FRACTIONS = (0.01, 0.05, 0.10, 0.25, 0.50, 1.00)


# ------------------------------------------------------------------------------------------------ the draw
def unbalanced_labels(seed=0):
    """Nine classes of very different sizes (3 to 400 items), shuffled, with non-contiguous values."""
    rng = np.random.default_rng(seed)
    sizes = [400, 250, 120, 60, 33, 17, 9, 5, 3]
    labels = np.repeat(np.array([7, 0, 3, 12, 5, 1, 9, 2, 4]), sizes)
    return labels[rng.permutation(labels.size)]


@pytest.mark.parametrize("seed", PRISM_SEEDS + (0, 2**32 - 1))
@pytest.mark.parametrize("fraction", PRISM_FRACTIONS + (0.333,))
def test_prism_subsample_is_prisms_draw(fraction, seed):
    labels = unbalanced_labels()
    got = prism_subsample(labels, fraction, seed)
    np.testing.assert_array_equal(got, prism_stratified_sample(labels, fraction, seed))
    classes, counts = np.unique(labels, return_counts=True)
    kept = np.unique(labels[got], return_counts=True)
    np.testing.assert_array_equal(kept[0], classes)
    np.testing.assert_array_equal(kept[1], np.maximum(1, (counts * fraction).astype(int)))
    assert np.unique(got).size == got.size and np.all(np.diff(got) > 0)


@pytest.mark.parametrize("fraction", (0.01, 0.1, 0.5, 1.0))
def test_prism_subsample_class_agnostic_is_the_notebooks_draw(fraction):
    labels = unbalanced_labels(1)
    for seed in PRISM_SEEDS:
        got = prism_subsample(labels, fraction, seed, per_class=False)
        np.testing.assert_array_equal(got, np.sort(prism_notebook_sample(labels.size, fraction, seed)))


def test_prism_subsample_string_labels_follow_sorted_class_order_and_global_state_is_untouched():
    labels = np.array(["tumor", "normal", "stroma", "normal", "tumor", "tumor", "stroma", "normal"] * 5)
    np.random.seed(7)
    before = np.random.get_state()[1].copy()
    got = prism_subsample(labels, 0.5, 123)
    np.testing.assert_array_equal(np.random.get_state()[1], before)
    np.testing.assert_array_equal(got, prism_stratified_sample(labels, 0.5, 123))
    # Different seeds give different subsets; the same seed the same one.
    assert not np.array_equal(got, prism_subsample(labels, 0.5, 456))
    np.testing.assert_array_equal(got, prism_subsample(labels, 0.5, 123))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(fraction=0.0, seed=42), "fraction"),
        (dict(fraction=1.5, seed=42), "fraction"),
        (dict(fraction=0.5, seed=-1), "seed"),
        (dict(fraction=0.5, seed=2**32), "seed"),
        (dict(fraction=0.5, seed=1.5), "seed"),
        (dict(fraction=0.5, seed=None), "seed"),
        (dict(fraction=0.001, seed=42, per_class=False), "0 rows"),
    ],
)
def test_prism_subsample_rejects_bad_input(kwargs, message):
    with pytest.raises(FmauditInputError, match=message):
        prism_subsample(unbalanced_labels(), **kwargs)


def test_prism_subsample_rejects_missing_labels():
    with pytest.raises(FmauditInputError, match="NaN label at row 2"):
        prism_subsample(np.array([0.0, 1.0, np.nan, 1.0]), 0.5, 42)


# ------------------------------------------------------------------------- PRISM's per-run numbers, reproduced
def raw_embeddings(n_train, n_test, dim, n_classes, seed):
    """Unscaled, overlapping classes: means in noise of unequal per-feature scales, off the origin."""
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((n_classes, dim)) * 0.4
    scales = np.exp(0.3 * rng.standard_normal(dim))
    offset = 0.5 * rng.standard_normal(dim)
    y = rng.integers(0, n_classes, n_train + n_test)
    X = (means[y] + rng.standard_normal((y.size, dim))) * scales + offset
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


@pytest.mark.parametrize("n_classes", [2, 3])
def test_unscaled_engine_with_prisms_draw_reproduces_prisms_per_run_metrics(n_classes):
    X, y, X_test, y_test = raw_embeddings(1000, 2000, 5, n_classes, seed=n_classes)
    runs = [(f, s) for f in PRISM_FRACTIONS for s in PRISM_SEEDS]  # PRISM's grid for one model
    subsets = [prism_subsample(y, f, s) for f, s in runs]
    # The engine as the pipeline runs it: all runs in one batch, unscaled features, the pipeline's tol.
    engine = fit_logistic_batch(X, y, subsets, 1.0, n_classes, standardize=False)
    engine_proba = engine.predict_proba(X_test)
    converged_runs = 0
    for r, ((fraction, seed), idx) in enumerate(zip(runs, subsets)):
        # PRISMEvaluator.evaluate's own call, and the same problem solved to convergence.
        prism = LogisticRegression(max_iter=1000, C=1.0, random_state=seed).fit(X[idx], y[idx])
        tight = LogisticRegression(max_iter=100_000, C=1.0, tol=1e-10).fit(X[idx], y[idx])
        prism_proba, tight_proba = prism.predict_proba(X_test), tight.predict_proba(X_test)
        engine_error = np.abs(engine_proba[r] - tight_proba).max()
        assert engine_error < 1e-4, (fraction, seed)
        expected, optimum = prism_metrics(prism_proba, y_test), prism_metrics(tight_proba, y_test)
        got = prism_metrics(engine_proba[r], y_test)
        # macro-F1 and ECE are step functions of the probabilities: within 1e-4 of the optimum, an item that
        # sits on the decision boundary (or a bin edge) may still fall on the other side; at most one does
        flips = int((engine_proba[r].argmax(1) != tight_proba.argmax(1)).sum())
        assert flips <= 1, (fraction, seed, flips)
        assert got["auroc"] == pytest.approx(optimum["auroc"], abs=1e-4), (fraction, seed)
        if flips == 0:
            assert got["f1_macro"] == pytest.approx(optimum["f1_macro"], abs=1e-12), (fraction, seed)
        assert got["ece_fixed"] == pytest.approx(optimum["ece_fixed"], abs=1e-4 + 2.0 / len(y_test)), (fraction, seed)
        # ECE moves in steps when an item crosses a bin edge, so PRISM's lbfgs at tol 1e-4 (probabilities
        # 1e-4 to 1e-3 off the optimum here) can report an ECE 1e-3 off the optimum's. Its fit counts as
        # converged where the numbers it reports are the optimum's.
        if all(abs(expected[name] - optimum[name]) <= 2.5e-4 for name in expected):
            converged_runs += 1
            for name in expected:
                assert got[name] == pytest.approx(expected[name], abs=1e-3), (fraction, seed, name)
        else:  # where PRISM's lbfgs stopped early, its numbers are the ones off the optimum
            assert engine_error < np.abs(prism_proba - tight_proba).max()
    assert converged_runs >= len(runs) // 2, "too few converged PRISM fits for the comparison to mean anything"

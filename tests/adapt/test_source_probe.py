"""The source probe of the prior-shift audit: the standardised logistic probe, its hold-out measurements, and
its refusals."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from fmaudit import metrics
from fmaudit.adapt import methods as m
from fmaudit.adapt.source_probe import SourceProbe, fit_source_probes
from fmaudit.calibration import fit_temperature
from fmaudit.io import FmauditInputError


def gaussian_world(seed, d=8, k=5, n_source=300, n_target=200):
    """Gaussian classes with unit noise; the target is scaled and shifted per feature (a scanner shift)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=1 / np.sqrt(2), size=(k, d))
    ys = np.repeat(np.arange(k), n_source // k)
    xs = means[ys] + rng.normal(size=(ys.size, d))
    yt = np.repeat(np.arange(k), n_target // k)
    xt = (means[yt] + rng.normal(size=(yt.size, d))) * np.exp(rng.normal(scale=0.3, size=d)) + rng.normal(size=d)
    return xs, ys, xt


def test_source_probe_is_the_standardised_logistic_probe():
    xs, ys, xt = gaussian_world(0)
    probe = SourceProbe(random_state=1).fit(xs, ys, n_classes=5)
    train, val = probe.train_index_, probe.val_index_
    assert np.intersect1d(train, val).size == 0 and train.size + val.size == ys.size
    ref = make_pipeline(StandardScaler(),
                        LogisticRegression(C=1.0, tol=1e-10, max_iter=10_000)).fit(xs[train], ys[train])
    np.testing.assert_allclose(metrics.softmax(probe.decision_logits(xt)), ref.predict_proba(xt), atol=1e-4)
    assert probe.temperature_ == pytest.approx(fit_temperature(probe.decision_logits(xs[val]), ys[val]), rel=1e-6)
    np.testing.assert_allclose(probe.source_prior_, np.bincount(ys[train], minlength=5) / train.size)
    np.testing.assert_allclose(probe.confusion_, m.bbse_confusion(ys[val], probe.decision_logits(xs[val]).argmax(1), 5))
    # one batched call fits every seed; seeds differ in their splits
    a, b = fit_source_probes(xs, ys, 5, [1, 2])
    # a batched fit converges to the engine's tolerance, not bit for bit the single fit (float32 products whose
    # summation order depends on the batch, and the batch's subsets may take the engine's whitened form, which
    # approaches the same optimum from other coordinates): weights agree to ~3e-5 here, probabilities closer
    np.testing.assert_allclose(a.W_, probe.W_, atol=1e-4)
    np.testing.assert_allclose(metrics.softmax(a.decision_logits(xt)), metrics.softmax(probe.decision_logits(xt)),
                               atol=1e-4)
    assert not np.array_equal(a.val_index_, b.val_index_)


def test_standardized_logits_are_those_of_the_raw_features():
    xs, ys, xt = gaussian_world(1)
    probe = SourceProbe().fit(xs, ys)
    Z = probe.standardize(xt)
    np.testing.assert_allclose(Z, (xt - probe.mean_) / probe.scale_)
    np.testing.assert_allclose(probe.logits_standardized(Z), probe.decision_logits(xt))


def test_source_probe_refuses_what_it_cannot_fit():
    xs, ys, xt = gaussian_world(2)
    with pytest.raises(FmauditInputError, match="call fit first"):
        SourceProbe().standardize(xt)
    with pytest.raises(FmauditInputError, match="none given"):
        fit_source_probes(xs, ys, 5, [])
    with pytest.raises(FmauditInputError, match="single class"):
        SourceProbe().fit(xs, np.zeros_like(ys))
    probe = SourceProbe().fit(xs, ys)
    with pytest.raises(FmauditInputError, match="fitted on 8"):
        probe.decision_logits(xt[:, :3])

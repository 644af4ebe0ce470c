"""Each adaptation method against an independent few-line reference on fixed inputs (METHODS 6)."""

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy

from fmaudit.adapt import methods as m
from fmaudit.io import FmauditInputError


def _rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- global standardisation


def test_global_standardize_matches_reference_and_batches():
    Z = _rng().normal(loc=3.0, scale=2.0, size=(3, 40, 6))
    Z[1, :, 2] = 5.0  # a constant feature: (z - mean) = 0, so it maps to 0, not to NaN
    out = m.global_standardize(Z)
    for r in range(3):
        ref = (Z[r] - Z[r].mean(axis=0)) / (Z[r].std(axis=0, ddof=0) + 1e-8)
        np.testing.assert_allclose(out[r], ref, rtol=0, atol=1e-12)
    assert np.all(out[1, :, 2] == 0)


# ---------------------------------------------------------------- CBR


def cbr_reference(Z, y, source_std, K, eps=1e-8):
    """METHODS 6, written out with loops over the classes."""
    means, ss, dof = [], np.zeros(Z.shape[1]), 0
    for k in range(K):
        rows = Z[y == k]
        if len(rows) == 0:
            continue
        mu_k = rows.mean(axis=0)
        means.append(mu_k)
        ss += ((rows - mu_k) ** 2).sum(axis=0)
        dof += len(rows) - 1
    mu = np.mean(means, axis=0)
    # step 5: a full collapse onto one pseudo-class, or no within-class spread, falls back to the source std
    sigma = np.sqrt(ss / dof) if dof > 0 and len(means) > 1 else source_std
    return (Z - mu) / (sigma + eps), mu, sigma


def test_cbr_matches_reference_with_empty_and_singleton_classes():
    rng = _rng(1)
    Z = rng.normal(size=(30, 5)) * rng.uniform(0.5, 3, size=5) + rng.normal(scale=4, size=5)
    y = np.array([0] * 20 + [1] * 9 + [3])  # class 2 empty, class 3 a singleton
    source_std = rng.uniform(1, 2, size=5)
    Z_std, mean, std = m.cbr_standardize(Z, y, source_std, n_classes=4)
    ref = cbr_reference(Z, y, source_std, 4)
    for got, want in zip((Z_std, mean, std), ref):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the singleton moves the mean (a third class mean) but adds nothing to the pooled std
    no_single = cbr_reference(Z[:29], y[:29], source_std, 4)
    assert not np.allclose(mean, no_single[1])
    np.testing.assert_allclose(std ** 2 * 27, no_single[2] ** 2 * 27, rtol=1e-12)


def test_cbr_is_prior_invariant_unlike_the_batch_mean():
    """With exact pseudo-labels, CBR's mean is the mean of class means whatever the class shares."""
    rng = _rng(2)
    centres = np.array([[0.0, 0.0], [10.0, 0.0]])
    y_bal = np.repeat([0, 1], 50)
    y_skew = np.repeat([0, 1], [95, 5])
    for y in (y_bal, y_skew):
        Z = centres[y] + rng.normal(scale=0.01, size=(len(y), 2))
        _, mean, _ = m.cbr_standardize(Z, y, np.ones(2), 2)
        np.testing.assert_allclose(mean, [5.0, 0.0], atol=0.01)
    assert abs(m.global_statistics(centres[y_skew])[0][0] - 0.5) < 1e-12


def test_cbr_falls_back_to_the_source_std_when_every_class_is_a_singleton():
    Z = _rng(3).normal(size=(3, 4))
    source_std = np.array([1.0, 2.0, 3.0, 4.0])
    _, mean, std = m.cbr_standardize(Z, np.array([0, 1, 2]), source_std, 3)
    np.testing.assert_allclose(std, source_std)
    np.testing.assert_allclose(mean, Z.mean(axis=0))


def test_cbr_falls_back_to_the_source_std_when_every_item_collapses_to_one_pseudo_class():
    """The seed: "if all target cells collapse to one pseudo-class we fall back to the source standard
    deviation" (METHODS 6 step 5), even when that class has many items; its mean is still the class mean. The
    batched engine of the prior-shift shards applies the same rule."""
    from fmaudit.adapt.evaluate import _draw_statistics

    Z = _rng(6).normal(loc=2.0, scale=3.0, size=(2, 40, 4))
    source_std = np.array([1.0, 2.0, 3.0, 4.0])
    y = np.zeros((2, 40), dtype=int)
    y[1, :20] = 1  # the second draw keeps two classes: its own pooled std
    _, mean, std = m.cbr_standardize(Z, y, source_std, 3)
    np.testing.assert_allclose(std[0], source_std)
    np.testing.assert_allclose(mean[0], Z[0].mean(axis=0))
    assert not np.allclose(std[1], source_std)
    np.testing.assert_allclose(std[1], cbr_reference(Z[1], y[1], source_std, 3)[2], atol=1e-12)
    _, _, [(cb_mean, cb_std, collapsed, _)] = _draw_statistics(Z, [y], 3)
    assert collapsed.tolist() == [True, False]
    np.testing.assert_allclose(cb_std[0], 1.0)  # the source std in the source-standardised space
    np.testing.assert_allclose(cb_std[1], std[1], atol=1e-9)


def test_cbr_batched_equals_each_batch_alone():
    rng = _rng(4)
    Z = rng.normal(size=(4, 25, 3))
    y = rng.integers(0, 3, size=(4, 25))
    y[2] = [0, 1, 2] + [3] * 22  # one draw with singletons and one big class
    src = np.full(3, 1.5)
    Z_std, mean, std = m.cbr_standardize(Z, y, src, 4)
    for r in range(4):
        ref = cbr_reference(Z[r], y[r], src, 4)
        np.testing.assert_allclose(Z_std[r], ref[0], atol=1e-12)
        np.testing.assert_allclose(std[r], ref[2], atol=1e-12)


def test_oracle_is_cbr_with_true_labels():
    rng = _rng(5)
    Z, y = rng.normal(size=(20, 3)), rng.integers(0, 2, size=20)
    for a, b in zip(m.oracle_standardize(Z, y, np.ones(3), 2), m.cbr_standardize(Z, y, np.ones(3), 2)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", ["nan", "labels", "std"])
def test_cbr_rejects_bad_input(bad):
    Z = np.ones((4, 2))
    y = np.array([0, 0, 1, 1])
    std = np.ones(2)
    if bad == "nan":
        Z[1, 1] = np.nan
    elif bad == "labels":
        y = np.array([0, 0, 1, 5])
    else:
        std = np.ones(3)
    with pytest.raises(FmauditInputError):
        m.cbr_standardize(Z, y, std, 2)


# ---------------------------------------------------------------- BBSE


def bbse_reference(y_val, pred_val, pred_t, K):
    C = np.zeros((K, K))
    for yi, pi in zip(y_val, pred_val):
        C[pi, yi] += 1.0 / len(y_val)
    mu = np.array([(pred_t == i).mean() for i in range(K)])
    return np.clip(np.linalg.pinv(C) @ mu, 0, None)


def test_bbse_matches_reference_on_a_confused_classifier():
    rng = _rng(6)
    y_val = rng.integers(0, 3, size=300)
    pred_val = np.where(rng.random(300) < 0.8, y_val, rng.integers(0, 3, size=300))
    pred_t = rng.choice(3, size=200, p=[0.6, 0.3, 0.1])
    w = m.bbse_weights(y_val, pred_val, pred_t, 3)
    np.testing.assert_allclose(w, bbse_reference(y_val, pred_val, pred_t, 3), rtol=1e-10)
    batched = m.bbse_weights(y_val, pred_val, np.stack([pred_t, pred_t[::-1]]), 3)
    np.testing.assert_allclose(batched[0], w)


def test_bbse_perfect_classifier_gives_the_prior_ratio():
    y_val = np.repeat([0, 1, 2], [50, 30, 20])
    pred_t = np.repeat([0, 1, 2], [10, 10, 80])
    w = m.bbse_weights(y_val, y_val, pred_t, 3)
    np.testing.assert_allclose(w, np.array([0.1, 0.1, 0.8]) / np.array([0.5, 0.3, 0.2]))
    q = m.bbse_target_prior(w, [0.5, 0.3, 0.2])
    np.testing.assert_allclose(q, [0.1, 0.1, 0.8])


def test_bbse_singular_confusion_uses_least_squares_and_clips():
    y_val = np.array([0, 0, 1, 1, 2, 2])
    pred_val = np.array([0, 0, 1, 1, 1, 1])  # class 2 is never predicted: C is singular
    pred_t = np.array([0, 1, 1, 1, 2, 2])
    w = m.bbse_weights(y_val, pred_val, pred_t, 3)
    np.testing.assert_allclose(w, bbse_reference(y_val, pred_val, pred_t, 3), atol=1e-12)
    assert (w >= 0).all()


def test_bbse_adjust_reweights_and_renormalises():
    P = np.array([[0.5, 0.5], [0.2, 0.8]])
    out = m.bbse_adjust(P, [3.0, 1.0])
    np.testing.assert_allclose(out, [[0.75, 0.25], [0.6 / 1.4, 0.8 / 1.4]])
    np.testing.assert_allclose(m.bbse_adjust(np.array([[1.0, 0.0]]), [0.0, 1.0]), [[1.0, 0.0]])


# ---------------------------------------------------------------- Saerens EM


def em_reference(P, ps, tol=1e-12):
    q = ps.copy()
    for _ in range(100_000):
        post = P * q / ps
        post /= post.sum(axis=1, keepdims=True)
        new = post.mean(axis=0)
        if np.abs(new - q).max() < tol:
            q = new
            break
        q = new
    post = P * q / ps
    return q, post / post.sum(axis=1, keepdims=True)


def test_saerens_em_matches_reference_and_recovers_a_planted_prior():
    """Calibrated posteriors of two 1-D Gaussians (means -1, +1) under a balanced source; the target holds 80%
    of class 1. EM's fixed point is the reference's, and close to 0.8."""
    rng = _rng(7)
    y = (rng.random(4000) < 0.8).astype(int)
    x = rng.normal(loc=np.where(y == 1, 1.0, -1.0))
    p1 = 1 / (1 + np.exp(-2 * x))  # Bayes posterior under equal priors
    P = np.column_stack([1 - p1, p1])
    q, post = m.saerens_em(P, np.array([0.5, 0.5]))
    q_ref, post_ref = em_reference(P, np.array([0.5, 0.5]))
    np.testing.assert_allclose(q, q_ref, atol=1e-10)
    np.testing.assert_allclose(post, post_ref, atol=1e-10)
    assert abs(q[1] - 0.8) < 0.03
    np.testing.assert_allclose(post.mean(axis=0), q, atol=1e-10)  # the fixed point
    qb, _ = m.saerens_em(np.stack([P, P[::-1]]), np.array([0.5, 0.5]))
    np.testing.assert_allclose(qb[0], q, atol=1e-12)


def test_saerens_em_rejects_bad_priors_and_probabilities():
    P = np.array([[0.2, 0.8], [0.6, 0.4]])
    with pytest.raises(FmauditInputError, match="source_prior"):
        m.saerens_em(P, [0.5, 0.6])
    with pytest.raises(FmauditInputError, match="sum to 1"):
        m.saerens_em(np.array([[2.0, 0.0]]), [0.5, 0.5])


# ---------------------------------------------------------------- SHOT-IM


def test_im_loss_matches_reference_and_its_gradient_matches_autograd():
    z = _rng(8).normal(size=(2, 16, 4)) * 3
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    eps = 1e-5
    ref = (-(p * np.log(p + eps)).sum(-1).mean(-1)
           + (p.mean(-2) * np.log(p.mean(-2) + eps)).sum(-1))
    np.testing.assert_allclose(m.im_loss(z), ref, rtol=1e-12)
    zt = torch.tensor(z, requires_grad=True)
    m.im_loss(zt).sum().backward()
    loss, grad = m.im_loss_gradient(torch.tensor(z))
    np.testing.assert_allclose(loss.numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(grad.numpy(), zt.grad.numpy(), rtol=1e-9, atol=1e-12)


def shot_reference(Z, W, b, epochs=3, lr=0.01, batch=8, seed=0):
    """tim-learn/SHOT's target loop (object/image_target.py train_target), step by step, with autograd and
    torch.optim.SGD on the head: max_iter = epochs x batches per pass (the last batch may be smaller, drop_last
    False); batches stream pass after pass (a fresh shuffle each) until max_iter steps are taken; a batch of one
    item is skipped without counting (``if inputs_test.size(0) == 1: continue``); the iteration is incremented
    before the learning-rate step (``iter_num += 1; lr_scheduler(...)``), so step t = 1..max_iter runs at
    lr (1 + 10 t / max_iter) ** -0.75."""
    Wt = torch.nn.Parameter(torch.tensor(W))
    bt = torch.nn.Parameter(torch.tensor(b))
    opt = torch.optim.SGD([Wt, bt], lr=lr, momentum=0.9, weight_decay=1e-3, nesterov=True)
    rng = np.random.default_rng(seed)
    n = Z.shape[0]
    max_iter, iter_num = epochs * -(-n // batch), 0
    X = torch.tensor(Z)
    batches = iter(())
    while iter_num < max_iter:
        try:
            rows = next(batches)
        except StopIteration:
            order = rng.permutation(n)
            batches = iter([order[s:s + batch] for s in range(0, n, batch)])
            rows = next(batches)
        if rows.size == 1:
            continue
        iter_num += 1
        for g in opt.param_groups:
            g["lr"] = lr * (1 + 10 * iter_num / max_iter) ** -0.75
        logits = X[rows] @ Wt + bt
        p = torch.softmax(logits, 1)
        loss = (-(p * torch.log(p + 1e-5)).sum(1)).mean()
        pm = p.mean(0)
        loss = loss + (pm * torch.log(pm + 1e-5)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return Wt.detach().numpy(), bt.detach().numpy()


def test_shot_im_head_matches_torch_sgd_on_autograd_and_batches():
    rng = _rng(9)
    Z = rng.normal(size=(3, 30, 6))
    W, b = rng.normal(size=(6, 3)), rng.normal(size=3) * 0.1
    head = m.ShotIMHead(epochs=3, batch_size=8, dtype="float64").fit(Z, W, b)
    for r in range(3):
        W_ref, b_ref = shot_reference(Z[r], W, b)
        np.testing.assert_allclose(head.W_[r], W_ref, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(head.b_[r], b_ref, rtol=1e-9, atol=1e-12)
    assert head.loss_.shape == (3,) and head.n_steps_ == 12
    # it moves the head towards confident, diverse predictions: the IM loss falls
    before = m.im_loss(np.matmul(Z, W) + b).mean()
    assert m.im_loss(head.decision_logits(Z)).mean() < before
    single = m.ShotIMHead(epochs=3, batch_size=8, dtype="float64").fit(Z[1], W, b)
    np.testing.assert_allclose(single.W_, head.W_[1], atol=1e-12)
    f32 = m.ShotIMHead(epochs=3, batch_size=8).fit(Z, W, b)
    np.testing.assert_allclose(f32.W_, head.W_, atol=1e-4)


def test_shot_im_head_follows_shots_schedule_and_skips_batches_of_one_item():
    """25 items in batches of 8: every pass ends with a batch of one, which SHOT skips without counting, so its
    12 steps (3 epochs x 4 batches) take four passes of three steps (the loop ends before the fourth pass's
    singleton); the first step already runs at the decayed learning rate of iteration 1. Compared step by step
    with the re-derivation above."""
    rng = _rng(10)
    Z = rng.normal(size=(2, 25, 5))
    W, b = rng.normal(size=(5, 3)), rng.normal(size=3) * 0.1
    head = m.ShotIMHead(epochs=3, batch_size=8, dtype="float64", random_state=4).fit(Z, W, b)
    assert head.n_steps_ == 12 and head.n_skipped_batches_ == 3
    for r in range(2):
        W_ref, b_ref = shot_reference(Z[r], W, b, seed=4)
        np.testing.assert_allclose(head.W_[r], W_ref, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(head.b_[r], b_ref, rtol=1e-9, atol=1e-12)
    one_step = m.ShotIMHead(epochs=1, batch_size=25, dtype="float64").fit(Z[0], W, b)
    W_ref, _ = shot_reference(Z[0], W, b, epochs=1, batch=25)
    np.testing.assert_allclose(one_step.W_, W_ref, rtol=1e-9, atol=1e-12)  # lr 0.01 * 11 ** -0.75, not 0.01
    with pytest.raises(FmauditInputError, match="batch of one"):
        m.ShotIMHead(batch_size=1).fit(Z[0], W, b)
    with pytest.raises(FmauditInputError, match="batch of one"):
        m.ShotIMHead().fit(Z[:, :1], W, b)


def test_shot_im_head_rejects_bad_input():
    with pytest.raises(FmauditInputError):
        m.ShotIMHead().fit(np.ones((5, 3)), np.ones((4, 2)), np.ones(2))
    with pytest.raises(FmauditInputError):
        m.ShotIMHead(dtype="float16").fit(np.ones((5, 3)), np.ones((3, 2)), np.ones(2))
    with pytest.raises(FmauditInputError):
        m.ShotIMHead().decision_logits(np.ones((2, 3)))


# ---------------------------------------------------------------- selection scores


def test_selection_scores_match_scipy():
    P = _rng(10).dirichlet(np.ones(4), size=(2, 50))
    for r in range(2):
        assert m.marginal_entropy(P[r]) == pytest.approx(scipy_entropy(P[r].mean(0)), rel=1e-12)
        assert m.mean_entropy(P[r]) == pytest.approx(np.mean([scipy_entropy(p) for p in P[r]]), rel=1e-12)
        assert m.mean_max_probability(P[r]) == pytest.approx(P[r].max(1).mean())
    np.testing.assert_allclose(m.marginal_entropy(P), [scipy_entropy(P[r].mean(0)) for r in range(2)])
    # a collapsed marginal has entropy 0, a balanced one log K
    assert m.marginal_entropy(np.eye(3)[[0, 0, 0]]) == 0.0
    assert m.marginal_entropy(np.eye(3)) == pytest.approx(np.log(3))


def test_selection_scores_reject_logits():
    with pytest.raises(FmauditInputError, match="sum to 1"):
        m.marginal_entropy(np.array([[2.0, 1.0]]))

"""Label-free adaptation of a source probe on frozen features, and what label-free selection reads
(docs/methods.md#adaptation-methods).

Every function is pure and takes arrays with optional leading batch dimensions: features ``Z`` of shape
(..., n, D), labels (..., n), probabilities ``P`` (..., n, K). A batch dimension is one resampled target
draw, so R draws are adapted in one call; statistics are always taken over the n items of each draw.

- :func:`global_standardize`: the BN-adapt analogue (AdaBN, Li 2016): the target batch's own mean and std
  (ddof 0) replace the source scaler, ``(z - mean_t) / (std_t + eps)`` with eps 1e-8.
- :func:`cbr_standardize`: class-balanced re-standardisation (hema paper): the mean of the per-pseudo-class
  means over the non-empty classes and the pooled within-class std ``sqrt(sum_k sum_{i in k} (z_i - mu_k)^2 /
  sum_k (n_k - 1))``. Empty pseudo-classes are dropped, singletons enter the mean only (n_k - 1 = 0); when every
  item falls in one pseudo-class (full collapse) or no class has two items the std falls back to the source std.
- :func:`oracle_standardize`: the same statistics from the *true* labels: an upper reference, not deployable.
- :func:`bbse_weights` / :func:`bbse_adjust`: black-box shift estimation (Lipton 2018).
- :func:`saerens_em`: the EM prior re-estimation of Saerens et al. (2002).
- :func:`im_loss`, :class:`ShotIMHead`: SHOT's information-maximisation loss (Liang 2020), here optimising the
  linear head on frozen features (SHOT itself freezes the head and tunes the encoder; with a frozen encoder
  the head is what can move).
- :func:`marginal_entropy`, :func:`mean_entropy`, :func:`mean_max_probability`: label-free selection scores.

The space CBR standardises in is not stated by the hema paper; the project's assumption
(docs/methods.md#adaptation-methods) is raw feature space, with pseudo-labels from the unadapted pipeline (source
scaler + source probe).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from fmaudit.devices import resolve_device
from fmaudit.io import FmauditInputError
from fmaudit.probes.logistic_batch import _cpu_threads

log = logging.getLogger(__name__)

# docs/methods.md#adaptation-methods: global and class-balanced standardisation, (z - mean) / (std + eps)
STD_EPS = 1e-8
SHOT_EPS = 1e-5  # tim-learn/SHOT adds this inside its logarithms
EM_TOL = 1e-12  # docs/methods.md#adaptation-methods: stop when the prior moves less than this (max norm)
EM_MAX_ITER = 10_000


def _features(Z: Any, name: str = "Z") -> np.ndarray:
    Z = np.asarray(Z, dtype=np.float64)
    if Z.ndim < 2:
        raise FmauditInputError(f"{name}: expected features of shape (..., n_items, n_features), got {Z.shape}")
    if Z.shape[-2] == 0:
        raise FmauditInputError(f"{name}: no items")
    if not np.isfinite(Z).all():
        raise FmauditInputError(f"{name}: NaN or infinite features")
    return Z


def _class_indices(labels: Any, shape: tuple[int, ...], n_classes: int, name: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.shape != shape:
        raise FmauditInputError(f"{name}: shape {labels.shape} does not match the items {shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise FmauditInputError(f"{name}: expected integer class indices, got dtype {labels.dtype}")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise FmauditInputError(f"{name}: class index out of 0..{n_classes - 1}")
    return labels.astype(np.int64)


def _probabilities(P: Any, name: str = "P") -> np.ndarray:
    P = np.asarray(P, dtype=np.float64)
    if P.ndim < 2 or P.shape[-1] < 2 or P.shape[-2] == 0:
        raise FmauditInputError(f"{name}: expected probabilities of shape (..., n_items, n_classes >= 2), "
                                f"got {P.shape}")
    if not np.isfinite(P).all() or (P < 0).any():
        raise FmauditInputError(f"{name}: probabilities must be finite and >= 0")
    if not np.allclose(P.sum(axis=-1), 1.0, atol=1e-6):
        raise FmauditInputError(f"{name}: rows must sum to 1")
    return P


# --------------------------------------------------------------------------------------------------
# feature re-standardisation
# --------------------------------------------------------------------------------------------------
def global_statistics(Z: Any) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) of the items of each batch, ddof 0: shapes (..., D).

    Parameters
    ----------
    Z : array-like of shape (..., n_items, n_features)
        Features; leading axes are batches (draws), statistics are taken over each batch's items.

    Returns
    -------
    mean, std : ndarray of shape (..., n_features)
        Per-batch mean and std (ddof 0).

    Raises
    ------
    FmauditInputError
        Fewer than 2 axes, no items, or NaN/inf features.
    """
    Z = _features(Z)
    return Z.mean(axis=-2), Z.std(axis=-2)


def global_standardize(Z: Any, eps: float | np.ndarray = STD_EPS) -> np.ndarray:
    """``(Z - mean_t) / (std_t + eps)`` with the batch's own mean and std (ddof 0);
    docs/methods.md#adaptation-methods.

    Parameters
    ----------
    Z : array-like of shape (..., n_items, n_features)
        Features; leading axes are batches (draws), statistics are taken over each batch's items.
    eps : float or ndarray of shape (n_features,)
        Added to the std before dividing (default 1e-8; an array expresses a raw-space eps in another space).

    Returns
    -------
    ndarray of shape (..., n_items, n_features)
        The re-standardised features.
    """
    mean, std = global_statistics(Z)
    return (np.asarray(Z, dtype=np.float64) - mean[..., None, :]) / (std[..., None, :] + eps)


def class_balanced_statistics(Z: Any, labels: Any, n_classes: int,
                              fallback_std: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, std, n_per_class) of the class-balanced statistics of ``labels`` (see :func:`cbr_standardize`).

    Shapes: mean and std (..., D), n_per_class (..., K). ``fallback_std`` (D,) or (..., D) is the std of a batch
    whose items all fall in one class (full collapse, the hema paper's rule) or where no class holds two items.

    Parameters
    ----------
    Z : array-like of shape (..., n_items, n_features)
        Features; leading axes are batches (draws), statistics are taken over each batch's items.
    labels : array-like of shape (..., n_items)
        Integer class indices 0..K-1 (pseudo-labels or true labels).
    n_classes : int
        K, at least 1.
    fallback_std : array-like of shape (n_features,) or (..., n_features)
        Finite, non-negative std used on collapse (the source std).

    Returns
    -------
    mean : ndarray of shape (..., n_features)
        Unweighted mean of the non-empty classes' means.
    std : ndarray of shape (..., n_features)
        Pooled within-class std, or ``fallback_std``.
    n_per_class : ndarray of shape (..., n_classes), int64
        Items per class in each batch.

    Raises
    ------
    FmauditInputError
        Invalid features, ``n_classes`` below 1, labels not integer indices in range, or an invalid
        ``fallback_std``.
    """
    Z = _features(Z)
    n_classes = int(n_classes)
    if n_classes < 1:
        raise FmauditInputError(f"n_classes={n_classes}: need at least one class")
    y = _class_indices(labels, Z.shape[:-1], n_classes, "labels")
    fallback = np.asarray(fallback_std, dtype=np.float64)
    if fallback.shape[-1:] != Z.shape[-1:] or not np.isfinite(fallback).all() or (fallback < 0).any():
        raise FmauditInputError(
            f"source_std: expected {Z.shape[-1]} finite non-negative values, got shape {fallback.shape}")
    onehot = (y[..., None] == np.arange(n_classes)).astype(np.float64)  # (..., n, K)
    n_k = onehot.sum(axis=-2)  # (..., K)
    sums = np.einsum("...nk,...nd->...kd", onehot, Z)
    present = n_k > 0
    means_k = sums / np.where(present, n_k, 1.0)[..., None]
    mean = (means_k * present[..., None]).sum(axis=-2) / present.sum(axis=-1, keepdims=True)
    # Within-class sum of squares from the residuals themselves (no sum-of-squares cancellation).
    resid = Z - np.take_along_axis(means_k, y[..., None], axis=-2)
    within = np.einsum("...nd,...nd->...d", resid, resid)
    dof = (n_k - present).sum(axis=-1)  # sum_k (n_k - 1) over non-empty classes
    # the hema paper: "if all target cells collapse to one pseudo-class we fall back to the source standard
    # deviation"; also when no class has two items (no within-class spread to pool)
    collapsed = (present.sum(axis=-1) == 1) | (dof == 0)
    std = np.sqrt(within / np.where(dof == 0, 1.0, dof)[..., None])
    if collapsed.any():
        std = np.where(collapsed[..., None], np.broadcast_to(fallback, std.shape), std)
    return mean, std, n_k.astype(np.int64)


def cbr_standardize(Z: Any, pseudo_labels: Any, source_std: Any, n_classes: int,
                    eps: float | np.ndarray = STD_EPS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Class-balanced re-standardisation (hema paper): ``(Z_std, mean, std)``.

    ``mean`` is the unweighted mean of the per-pseudo-class means over non-empty classes; ``std`` the pooled
    within-class std (each class's squared deviations from its own mean over sum_k (n_k - 1)), so singletons
    shape the mean only; when every item falls in one pseudo-class (full collapse: "we fall back to the source
    standard deviation") or no class has two or more items, ``std`` is ``source_std`` (the mean is still the one
    class's). ``Z_std = (Z - mean) / (std + eps)``. Pseudo-labels come from the unadapted pipeline (source
    scaler, source probe).

    Parameters
    ----------
    Z : array-like of shape (..., n_items, n_features)
        Features; leading axes are batches (draws), statistics are taken over each batch's items.
    pseudo_labels : array-like of shape (..., n_items)
        Integer class indices predicted by the unadapted pipeline.
    source_std : array-like of shape (n_features,) or (..., n_features)
        The source scaler's std, the fallback on collapse.
    n_classes : int
        Size of the label space K.
    eps : float or ndarray of shape (n_features,)
        Added to the std before dividing (default 1e-8; an array expresses a raw-space eps in another space).

    Returns
    -------
    Z_std : ndarray of shape (..., n_items, n_features)
        ``(Z - mean) / (std + eps)``.
    mean : ndarray of shape (..., n_features)
        The class-balanced mean.
    std : ndarray of shape (..., n_features)
        The pooled within-class std (or ``source_std`` on collapse).

    Raises
    ------
    FmauditInputError
        Invalid features, labels not integer indices in 0..K-1 of the items' shape, or an invalid ``source_std``.
    """
    mean, std, _ = class_balanced_statistics(Z, pseudo_labels, n_classes, source_std)
    Z_std = (np.asarray(Z, dtype=np.float64) - mean[..., None, :]) / (std[..., None, :] + eps)
    return Z_std, mean, std


def oracle_standardize(Z: Any, labels: Any, source_std: Any, n_classes: int,
                       eps: float | np.ndarray = STD_EPS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CBR's statistics from the true target labels. NOT deployable: it reads target labels; it bounds what
    class-balanced statistics can do and is reported as such.

    Parameters
    ----------
    Z : array-like of shape (..., n_items, n_features)
        Features; leading axes are batches (draws), statistics are taken over each batch's items.
    labels : array-like of shape (..., n_items)
        The true target class indices.
    source_std : array-like of shape (n_features,) or (..., n_features)
        The source scaler's std, the fallback on collapse.
    n_classes : int
        Size of the label space K.
    eps : float or ndarray of shape (n_features,)
        Added to the std before dividing (default 1e-8; an array expresses a raw-space eps in another space).

    Returns
    -------
    Z_std : ndarray of shape (..., n_items, n_features)
        ``(Z - mean) / (std + eps)``.
    mean : ndarray of shape (..., n_features)
        The class-balanced mean.
    std : ndarray of shape (..., n_features)
        The pooled within-class std (or ``source_std`` on collapse).

    Raises
    ------
    FmauditInputError
        Invalid features, labels not integer indices in 0..K-1 of the items' shape, or an invalid ``source_std``.
    """
    return cbr_standardize(Z, labels, source_std, n_classes, eps)


# --------------------------------------------------------------------------------------------------
# label-shift estimators
# --------------------------------------------------------------------------------------------------
def bbse_confusion(y_val: Any, pred_val: Any, n_classes: int) -> np.ndarray:
    """Joint confusion on the labelled source hold-out: ``C[i, j] = P_s(pred = i, y = j)``.

    Parameters
    ----------
    y_val : array-like of shape (n_items,)
        True class indices of the hold-out, non-empty.
    pred_val : array-like of shape (n_items,)
        The source probe's predictions on it.
    n_classes : int
        Size of the label space K.

    Returns
    -------
    ndarray of shape (n_classes, n_classes)
        Joint shares (rows predicted, columns true), summing to 1.

    Raises
    ------
    FmauditInputError
        Empty or non-1-D labels, or indices outside 0..K-1.
    """
    y_val = np.asarray(y_val)
    if y_val.ndim != 1 or y_val.size == 0:
        raise FmauditInputError(f"y_val: expected non-empty 1-D labels, got shape {y_val.shape}")
    y = _class_indices(y_val, y_val.shape, n_classes, "y_val")
    pred = _class_indices(pred_val, y_val.shape, n_classes, "pred_val")
    counts = np.bincount(pred * n_classes + y, minlength=n_classes * n_classes).reshape(n_classes, n_classes)
    return counts / y.size


def bbse_weights(y_val: Any, pred_val: Any, pred_target: Any, n_classes: int) -> np.ndarray:
    """BBSE importance weights ``w = C^-1 mu_t`` clipped at 0 (docs/methods.md#adaptation-methods; Lipton 2018).

    ``C`` is :func:`bbse_confusion` of the source hold-out and ``mu_t[i]`` the share of target predictions
    equal to i. A singular ``C`` (e.g. a class never predicted on the hold-out) is solved by least squares.
    ``pred_target`` may carry leading batch dimensions (one weight vector per draw: (..., K)).

    Parameters
    ----------
    y_val : array-like of shape (n_val,)
        True class indices of the source hold-out.
    pred_val : array-like of shape (n_val,)
        The source probe's predictions on the hold-out.
    pred_target : array-like of shape (..., n_items)
        The source probe's predictions on the target (batches: draws).
    n_classes : int
        Size of the label space K.

    Returns
    -------
    ndarray of shape (..., n_classes)
        Importance weights ``q_t(y) / p_s(y)`` estimates, >= 0.

    Raises
    ------
    FmauditInputError
        Invalid hold-out labels or predictions, or empty target predictions.
    """
    n_classes = int(n_classes)
    C = bbse_confusion(y_val, pred_val, n_classes)
    pred_target = np.asarray(pred_target)
    if pred_target.ndim < 1 or pred_target.shape[-1] == 0:
        raise FmauditInputError(f"pred_target: expected (..., n_items) predictions, got shape {pred_target.shape}")
    return bbse_weights_from_confusion(C, _class_indices(pred_target, pred_target.shape, n_classes, "pred_target"))


def bbse_weights_from_confusion(confusion: np.ndarray, pred_target: np.ndarray) -> np.ndarray:
    """:func:`bbse_weights` from a precomputed joint confusion (K, K) and target predictions (..., n).

    Parameters
    ----------
    confusion : ndarray of shape (n_classes, n_classes)
        Joint confusion of the source hold-out (:func:`bbse_confusion`).
    pred_target : ndarray of shape (..., n_items)
        Integer target predictions 0..K-1 (not checked here).

    Returns
    -------
    ndarray of shape (..., n_classes)
        Importance weights, clipped at 0.
    """
    n_classes = confusion.shape[0]
    mu = (pred_target[..., None] == np.arange(n_classes)).mean(axis=-2)  # (..., K)
    rhs = mu.reshape(-1, n_classes).T
    if np.linalg.matrix_rank(confusion) == n_classes:
        w = np.linalg.solve(confusion, rhs)
    else:
        w = np.linalg.lstsq(confusion, rhs, rcond=None)[0]
    return np.clip(w.T.reshape(mu.shape), 0.0, None)


def bbse_adjust(P: Any, weights: Any) -> np.ndarray:
    """``p'(y|x) ∝ w_y p(y|x)``, renormalised; a row whose reweighted mass is 0 (every class with probability
    has weight 0) keeps its original probabilities. ``weights`` (K,) or (..., K) for batched ``P``.

    Parameters
    ----------
    P : array-like of shape (..., n_items, n_classes)
        Class probabilities, rows summing to 1; leading axes are batches.
    weights : array-like of shape (n_classes,) or (..., n_classes)
        Class weights (BBSE's), one vector per batch or one for all.

    Returns
    -------
    ndarray of shape (..., n_items, n_classes)
        The reweighted probabilities, rows summing to 1.

    Raises
    ------
    FmauditInputError
        ``P`` not probabilities of at least two classes.
    """
    P = _probabilities(P)
    w = np.asarray(weights, dtype=np.float64)[..., None, :]
    adjusted = P * w
    total = adjusted.sum(axis=-1, keepdims=True)
    return np.where(total > 0, adjusted / np.where(total > 0, total, 1.0), P)


def bbse_target_prior(weights: Any, source_prior: Any) -> np.ndarray:
    """The BBSE estimate of the target prior ``q = w * p_s``, renormalised to sum to 1 (after clipping).

    Parameters
    ----------
    weights : array-like of shape (..., n_classes)
        BBSE weights.
    source_prior : array-like of shape (n_classes,)
        Class shares of the source (in BBSE's use: the column sums of the hold-out confusion).

    Returns
    -------
    ndarray of shape (..., n_classes)
        Estimated target shares summing to 1 (the source prior where every weight is 0).
    """
    q = np.asarray(weights, dtype=np.float64) * np.asarray(source_prior, dtype=np.float64)
    total = q.sum(axis=-1, keepdims=True)
    return np.where(total > 0, q / np.where(total > 0, total, 1.0), np.asarray(source_prior, dtype=np.float64))


def _saerens_em(P: np.ndarray, source_prior: np.ndarray, tol: float, max_iter: int):
    """(target_prior, posteriors, n_iter, converged) with per-batch convergence."""
    batch_shape = P.shape[:-2]
    K = P.shape[-1]
    P2 = P.reshape(-1, *P.shape[-2:])
    ps = np.broadcast_to(source_prior, (P2.shape[0], K)).astype(np.float64)
    q = ps.copy()
    n_iter = np.zeros(P2.shape[0], dtype=np.int64)
    active = np.ones(P2.shape[0], dtype=bool)
    inv_ps = np.divide(1.0, ps, out=np.zeros_like(ps), where=ps > 0)  # a class absent from the source stays 0
    post = P2.copy()
    for _ in range(int(max_iter)):
        a = np.flatnonzero(active)
        if a.size == 0:
            break
        unnorm = P2[a] * (q[a] * inv_ps[a])[:, None, :]
        total = unnorm.sum(axis=-1, keepdims=True)
        post[a] = np.where(total > 0, unnorm / np.where(total > 0, total, 1.0), P2[a])
        q_new = post[a].mean(axis=-2)
        moved = np.abs(q_new - q[a]).max(axis=-1)
        q[a] = q_new
        n_iter[a] += 1
        active[a[moved < tol]] = False
    converged = ~active
    # Posteriors at the final prior (the prior above is their mean): one last E-step for the converged state.
    unnorm = P2 * (q * inv_ps)[:, None, :]
    total = unnorm.sum(axis=-1, keepdims=True)
    post = np.where(total > 0, unnorm / np.where(total > 0, total, 1.0), P2)
    return (q.reshape(*batch_shape, K), post.reshape(P.shape), n_iter.reshape(batch_shape),
            converged.reshape(batch_shape))


def saerens_em(P_target: Any, source_prior: Any, tol: float = EM_TOL,
               max_iter: int = EM_MAX_ITER) -> tuple[np.ndarray, np.ndarray]:
    """EM re-estimation of the target prior (Saerens et al. 2002): ``(target_prior, posteriors)``.

    Iterates ``p'_i ∝ p_i * q / p_s`` and ``q <- mean_i p'_i`` from ``q = p_s`` until ``max|Δq| < tol``
    (docs/methods.md#adaptation-methods: 1e-12). The posteriors returned are those at the returned prior. EM can drift
    to degenerate priors on small or overconfident batches; calibrating the probabilities first helps (Alexandari 2020).
    A batch that has not converged after ``max_iter`` iterations is logged.

    Parameters
    ----------
    P_target : array-like of shape (..., n_items, n_classes)
        The source probe's probabilities on the target, rows summing to 1 (batches: draws).
    source_prior : array-like of shape (n_classes,)
        Source class shares, >= 0, summing to 1.
    tol : float
        Stop when no class share moves more than this in an iteration (default 1e-12).
    max_iter : int
        Iteration cap per batch.

    Returns
    -------
    target_prior : ndarray of shape (..., n_classes)
        The estimated target prior.
    posteriors : ndarray of shape (..., n_items, n_classes)
        The probabilities adjusted to it.

    Raises
    ------
    FmauditInputError
        Invalid probabilities, or a source prior of another length, negative or not summing to 1.
    """
    P = _probabilities(P_target, "P_target")
    ps = np.asarray(source_prior, dtype=np.float64)
    if ps.shape != (P.shape[-1],) or not np.isfinite(ps).all() or (ps < 0).any() or not np.isclose(ps.sum(), 1.0):
        raise FmauditInputError(f"source_prior: expected {P.shape[-1]} shares >= 0 summing to 1, got {ps.tolist()}")
    q, post, n_iter, converged = _saerens_em(P, ps, float(tol), int(max_iter))
    if not np.all(converged):
        log.warning("saerens_em: %d batch(es) did not converge in %d iterations", int((~converged).sum()), max_iter)
    return q, post


# --------------------------------------------------------------------------------------------------
# SHOT information maximisation
# --------------------------------------------------------------------------------------------------
def im_loss(logits: Any, eps: float = SHOT_EPS):
    """SHOT's information-maximisation loss: ``mean_i H(p_i) - H(mean_i p_i)`` with ``log(p + eps)`` inside
    both entropies, as tim-learn/SHOT computes it. Batched over leading dimensions.

    A torch tensor gives a (differentiable) tensor; anything else a float or numpy array.

    Parameters
    ----------
    logits : array-like or torch.Tensor of shape (..., n_items, n_classes)
        Head logits of each batch's items.
    eps : float
        Added inside the logarithms (default 1e-5, SHOT's).

    Returns
    -------
    float, ndarray of shape (...) or torch.Tensor
        The loss per batch (lower: confident and diverse predictions).

    Raises
    ------
    FmauditInputError
        Fewer than 2 axes.
    """
    as_torch = isinstance(logits, torch.Tensor)
    z = logits if as_torch else torch.as_tensor(np.asarray(logits, dtype=np.float64))
    if z.ndim < 2:
        raise FmauditInputError(f"logits: expected shape (..., n_items, n_classes), got {tuple(z.shape)}")
    p = torch.softmax(z, dim=-1)
    entropy = -(p * torch.log(p + eps)).sum(dim=-1).mean(dim=-1)
    p_bar = p.mean(dim=-2)
    diversity = -(p_bar * torch.log(p_bar + eps)).sum(dim=-1)
    loss = entropy - diversity
    if as_torch:
        return loss
    out = loss.numpy()
    return float(out) if out.ndim == 0 else out


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # On CPU the skinny batched products go through numpy's BLAS, which ran them several times faster than
    # torch's CPU kernels on the machines this was measured on (as in fmaudit.probes.logistic_batch).
    if a.device.type == "cpu":
        return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))
    return a @ b


def im_loss_gradient(logits: torch.Tensor, eps: float = SHOT_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """(:func:`im_loss` per batch, its gradient with respect to ``logits``), in closed form.

    With p = softmax(z), n items and p̄ their mean: dL/dp_ik = (-log(p_ik + eps) - p_ik / (p_ik + eps)
    + log(p̄_k + eps) + p̄_k / (p̄_k + eps)) / n, then through the softmax dL/dz = p * (g - sum_k p g).

    Parameters
    ----------
    logits : torch.Tensor of shape (..., n_items, n_classes)
        Head logits of each batch's items.
    eps : float
        Added inside the logarithms (default 1e-5, SHOT's).

    Returns
    -------
    loss : torch.Tensor of shape (...)
        The loss per batch.
    grad : torch.Tensor of shape (..., n_items, n_classes)
        Its gradient with respect to ``logits``.
    """
    n = logits.shape[-2]
    p = torch.softmax(logits, dim=-1)
    log_p = torch.log(p + eps)
    p_bar = p.mean(dim=-2, keepdim=True)
    log_p_bar = torch.log(p_bar + eps)
    loss = -(p * log_p).sum(dim=-1).mean(dim=-1) + (p_bar * log_p_bar).sum(dim=(-1, -2))
    g = (-(log_p + p / (p + eps)) + (log_p_bar + p_bar / (p_bar + eps))) / n
    grad = p * (g - (p * g).sum(dim=-1, keepdim=True))
    return loss, grad


class ShotIMHead:
    """SHOT-IM on frozen features: the source probe's linear head tuned on unlabelled target features by
    minimising :func:`im_loss`.

    Optimiser and loop as tim-learn/SHOT's target stage (``object/image_target.py``): SGD with momentum 0.9,
    Nesterov, weight decay 1e-3 (on the weights and the bias, as SHOT's parameter groups), ``n_steps = epochs x
    ceil(n / batch_size)`` steps (SHOT's ``max_iter``) over mini-batches of 64 reshuffled each pass (the last may
    be smaller), streamed pass after pass until ``n_steps`` steps are taken; a batch of one item is skipped
    without counting as SHOT does; step t = 1..n_steps runs at learning rate ``lr * (1 + 10 t / n_steps) ** -0.75``
    (SHOT increments its iteration before the schedule), lr 0.01, 15 epochs, eps 1e-5 in the logarithms,
    float32 as SHOT trains. The features are the source-standardised target features the
    source probe reads. The gradient is the closed form of :func:`im_loss_gradient` (the same updates as
    torch.optim.SGD on autograd's gradient, without the graph).

    A leading batch dimension (R draws) gives every draw its own head; the heads are optimised in lock-step
    with one shared shuffle per epoch, which gives each the updates it would get alone.

    Parameters
    ----------
    epochs : int
        Passes' worth of steps (default 15, SHOT's).
    lr : float
        Base learning rate of the decaying schedule (default 0.01).
    momentum : float
        Nesterov momentum (default 0.9).
    weight_decay : float
        L2 decay on weights and bias (default 1e-3).
    batch_size : int
        Items per mini-batch, at least 2 (default 64).
    eps : float
        Added inside the loss's logarithms (default 1e-5).
    random_state : int
        Seed of the mini-batch order.
    device : str or None
        None or ``"cpu"``, ``"cuda"`` or ``"auto"``.
    dtype : {"float32", "float64"}
        Precision of the optimisation (default float32, as SHOT trains).
    present : array-like of shape (n_classes,) of bool or None
        Classes the source probe knows; absent classes keep probability 0. None: all present.

    Attributes
    ----------
    W_ : ndarray of shape (R, D, K) or (D, K), float64
        The tuned weights (one head per draw with batched features).
    b_ : ndarray of shape (R, K) or (K,), float64
        The tuned intercepts.
    loss_ : ndarray of shape (epochs,)
        Mean IM loss of each epoch's worth of steps (averaged over the draws).
    n_steps_ : int
        Steps taken, ``epochs x ceil(n / batch_size)``.
    n_skipped_batches_ : int
        Batches of one item skipped.
    """

    def __init__(self, epochs: int = 15, lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 1e-3,
                 batch_size: int = 64, eps: float = SHOT_EPS, random_state: int = 0, device: Any = None,
                 dtype: str = "float32", present: Any = None):
        self.epochs = epochs
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.eps = eps
        self.random_state = random_state
        self.device = device
        self.dtype = dtype
        self.present = present

    def fit(self, Z: Any, W: Any, b: Any) -> "ShotIMHead":
        """Tune the head (W (D, K), b (K,)) on target features Z (n, D) or (R, n, D).

        Parameters
        ----------
        Z : array-like of shape (n_items, n_features) or (..., n_items, n_features)
            Source-standardised target features (unlabelled); leading axes give one head each.
        W : array-like of shape (n_features, n_classes)
            The source probe's weights, the starting point.
        b : array-like of shape (n_classes,)
            The source probe's intercepts.

        Returns
        -------
        ShotIMHead
            ``self``, fitted.

        Raises
        ------
        FmauditInputError
            An unknown dtype, non-finite or empty features, ``W`` / ``b`` of the wrong shape, non-positive
            settings, or batches that would hold one item only.
        """
        if self.dtype not in ("float32", "float64"):
            raise FmauditInputError(f"ShotIMHead: dtype must be 'float32' or 'float64', got {self.dtype!r}")
        np_dtype = np.dtype(self.dtype)
        Z = np.asarray(Z)
        if Z.ndim < 2 or Z.shape[-2] == 0 or not np.isfinite(Z).all():
            raise FmauditInputError(f"Z: expected finite features of shape (..., n_items, n_features), got {Z.shape}")
        single = Z.ndim == 2
        Zb = np.ascontiguousarray(Z.reshape(-1, *Z.shape[-2:]), dtype=np_dtype)
        W = np.asarray(W, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        D, K = Zb.shape[-1], b.shape[-1]
        if W.shape != (D, K) or b.shape != (K,):
            raise FmauditInputError(f"W, b: expected shapes (D={D}, K={K}) and ({K},), got {W.shape} and {b.shape}")
        if int(self.epochs) < 1 or int(self.batch_size) < 1 or not self.lr > 0:
            raise FmauditInputError(f"ShotIMHead: epochs, batch_size and lr must be positive "
                                    f"(got {self.epochs}, {self.batch_size}, {self.lr})")
        if int(self.batch_size) < 2 or Zb.shape[1] < 2:
            raise FmauditInputError(f"ShotIMHead: {Zb.shape[1]} target items in batches of {self.batch_size}: every "
                                    "batch would hold one item, and SHOT skips a batch of one item (its loop would "
                                    "never take a step); give at least two items and a batch size of at least two")
        device = resolve_device(self.device)
        with _cpu_threads(device, 1):
            return self._fit(Zb, W, b, device, np_dtype, single, Z.shape)

    def _fit(self, Zb, W, b, device, np_dtype, single, shape) -> "ShotIMHead":
        D, K = W.shape
        R, n = Zb.shape[0], Zb.shape[1]
        tdtype = getattr(torch, self.dtype)
        feats = torch.as_tensor(Zb, device=device)
        # The head is kept transposed, (R, K, D): products with a K-row left operand ran 2-3x faster through
        # BLAS than the (b, D) x (D, K) orientation for K = 5 (benchmarks/bench_prior_shift.py).
        WT = torch.as_tensor(np.broadcast_to(W.T, (R, K, D)).copy(), dtype=tdtype, device=device)
        bt = torch.as_tensor(np.broadcast_to(b, (R, K)).copy(), dtype=tdtype, device=device)
        mask = None
        if self.present is not None and not np.asarray(self.present, dtype=bool).all():
            mask = torch.as_tensor(~np.asarray(self.present, dtype=bool), device=device)
        momentum, decay = float(self.momentum), float(self.weight_decay)
        buf_W = buf_b = None
        batch = int(self.batch_size)
        per_pass = -(-n // batch)
        n_steps = int(self.epochs) * per_pass  # SHOT: max_iter = max_epoch * len(loader), drop_last=False
        rng = np.random.default_rng(self.random_state)
        step_losses, step_sizes = [], []
        step = skipped = 0
        while step < n_steps:  # batches stream pass after pass until n_steps steps are taken, as SHOT's loop
            order = rng.permutation(n)
            for start in range(0, n, batch):
                if step == n_steps:
                    break
                rows = order[start:start + batch]
                if rows.size == 1:  # SHOT: `if inputs_test.size(0) == 1: continue`, before counting the step
                    skipped += 1
                    continue
                step += 1  # SHOT increments iter_num before its lr_scheduler call: step t runs at t / n_steps
                x = torch.from_numpy(Zb[:, rows]) if device.type == "cpu" \
                    else feats[:, torch.as_tensor(rows, device=device)]
                logits = _matmul(WT, x.transpose(1, 2)).transpose(1, 2) + bt[:, None, :]
                if mask is not None:
                    logits = logits.masked_fill(mask, -1e4)
                loss, grad_z = im_loss_gradient(logits, float(self.eps))
                grad_WT = _matmul(grad_z.transpose(1, 2).contiguous(), x)
                grad_b = grad_z.sum(dim=1)
                # torch.optim.SGD(nesterov=True, dampening=0): d = g + wd * p; buf = m * buf + d; p -= lr (d + m buf)
                d_W, d_b = grad_WT.add_(WT, alpha=decay), grad_b + decay * bt
                if buf_W is None:
                    buf_W, buf_b = d_W.clone(), d_b.clone()
                else:
                    buf_W.mul_(momentum).add_(d_W)
                    buf_b.mul_(momentum).add_(d_b)
                lr = float(self.lr) * (1.0 + 10.0 * step / n_steps) ** -0.75
                WT.sub_(d_W.add_(buf_W, alpha=momentum), alpha=lr)
                bt.sub_(d_b.add_(buf_b, alpha=momentum), alpha=lr)
                step_losses.append(float(loss.sum()) / R)
                step_sizes.append(rows.size)
        # the mean IM loss of each epoch's worth of steps (per_pass steps), weighted by batch size
        losses = [float(np.average(step_losses[e * per_pass:(e + 1) * per_pass],
                                   weights=step_sizes[e * per_pass:(e + 1) * per_pass]))
                  for e in range(int(self.epochs))]
        W_out = WT.transpose(1, 2).cpu().numpy().astype(np.float64)
        b_out = bt.cpu().numpy().astype(np.float64)
        self.W_ = W_out[0] if single else W_out.reshape(*shape[:-2], D, K)
        self.b_ = b_out[0] if single else b_out.reshape(*shape[:-2], K)
        self.loss_ = np.asarray(losses)
        self.n_steps_ = n_steps
        self.n_skipped_batches_ = skipped
        return self

    def decision_logits(self, Z: Any) -> np.ndarray:
        """Logits of the tuned head (absent classes at -1e4).

        Parameters
        ----------
        Z : array-like of shape (n_items, n_features) or (R, n_items, n_features)
            Source-standardised features, batched like the features the head was fitted on.

        Returns
        -------
        ndarray of shape (..., n_items, n_classes)
            ``Z @ W_ + b_``.

        Raises
        ------
        FmauditInputError
            The head is not fitted, or invalid features.
        """
        if not hasattr(self, "W_"):
            raise FmauditInputError("ShotIMHead: call fit before decision_logits")
        Z = _features(Z)
        logits = np.matmul(Z, self.W_) + self.b_[..., None, :]
        if self.present is not None and not np.asarray(self.present, bool).all():
            logits = np.where(np.asarray(self.present, bool), logits, -1e4)
        return logits


# --------------------------------------------------------------------------------------------------
# label-free selection scores
# --------------------------------------------------------------------------------------------------
def _entropy(p: np.ndarray) -> np.ndarray:
    # 0 log 0 = 0
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def marginal_entropy(P: Any) -> np.ndarray | float:
    """``H(mean_i p_i)``, natural log: the entropy of the mean prediction of each batch
    (docs/methods.md#label-free-encoder-selection).

    Parameters
    ----------
    P : array-like of shape (..., n_items, n_classes)
        Class probabilities, rows summing to 1; leading axes are batches.

    Returns
    -------
    float or ndarray of shape (...)
        Per batch; a float for unbatched ``P``.
    """
    P = _probabilities(P)
    out = _entropy(P.mean(axis=-2))
    return float(out) if np.ndim(out) == 0 else out


def mean_entropy(P: Any) -> np.ndarray | float:
    """``mean_i H(p_i)``: mean per-item entropy (the argmin alternative of
    docs/methods.md#label-free-encoder-selection).

    Parameters
    ----------
    P : array-like of shape (..., n_items, n_classes)
        Class probabilities, rows summing to 1; leading axes are batches.

    Returns
    -------
    float or ndarray of shape (...)
        Per batch; a float for unbatched ``P``.
    """
    P = _probabilities(P)
    out = _entropy(P).mean(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def mean_max_probability(P: Any) -> np.ndarray | float:
    """``mean_i max_k p_ik``: mean confidence.

    Parameters
    ----------
    P : array-like of shape (..., n_items, n_classes)
        Class probabilities, rows summing to 1; leading axes are batches.

    Returns
    -------
    float or ndarray of shape (...)
        Per batch; a float for unbatched ``P``.
    """
    P = _probabilities(P)
    out = P.max(axis=-1).mean(axis=-1)
    return float(out) if np.ndim(out) == 0 else out

"""Novelty scorers on frozen embeddings and on probe logits (docs/methods.md#novelty-scorers). Higher = more
out-of-distribution.

Feature-space scorers are estimator-style (``fit`` returns self, fitted attributes end in ``_``):

- :class:`Mahalanobis` (``maha``): squared Mahalanobis distance to the nearest class mean under one pooled
  within-class covariance, ``covariance="ledoit_wolf"`` (audit paper: ``LedoitWolf().fit(Z - mu_y)``) or
  ``"empirical"`` (Lee et al. 2018: ``EmpiricalCovariance``, divides by N, no shrinkage); the inverse is the
  pseudo-inverse (numpy's default cutoff, ``max(D, D) * eps`` relative to the largest eigenvalue), never
  ``inv``. Raw embeddings unless ``normalize=True`` (L2 first).
- :class:`RelativeMahalanobis` (``relative_maha``, Ren et al. 2021): ``min_k MD_k(z) - MD_0(z)``, MD_0 under
  the global training mean and the global covariance (same estimator). Default estimator ``"empirical"`` as
  Ren et al.; pass ``covariance="ledoit_wolf"`` for the audit paper's estimator.
- :class:`KNNDistance` (``knn``, Sun et al. 2022): L2-normalise bank and queries, score = Euclidean distance
  to the k-th nearest bank embedding (k = 50 by default; a k above the bank size is capped at the bank size
  with a warning). A query that is itself in the bank counts as its own neighbour: score a disjoint set.

Logit scorers are functions of the probe's logits (N, K); a 1-D array is a binary decision value d and is
turned into the (-d/2, d/2) logit pair first (docs/methods.md#binary-logits; softmax then equals sigmoid(d)):

- :func:`energy_score` ``-T * logsumexp(logits / T)`` (Liu et al. 2020 at T = 1; the ID score is -E).
- :func:`msp_score` ``1 - max softmax`` (Hendrycks & Gimpel 2017).

Every feature scorer can give its fitted state as plain float arrays (``state_arrays``) and be rebuilt from
them (``from_state``), which is how an exported abstention gate stores it (safetensors, no pickle).
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import numpy as np

from fmaudit.io import FmauditInputError
from fmaudit.metrics import (
    binary_logits_from_decision,
    float_array,
    reject_missing_labels,
    softmax_last_axis,
    validate_logits,
)

FEATURE_SCORERS = ("maha", "relative_maha", "knn")
LOGIT_SCORERS = ("energy", "msp")
SCORERS = FEATURE_SCORERS + LOGIT_SCORERS
COVARIANCES = ("ledoit_wolf", "empirical")
DEFAULT_KNN_K = 50

__all__ = [
    "COVARIANCES",
    "FEATURE_SCORERS",
    "LOGIT_SCORERS",
    "SCORERS",
    "KNNDistance",
    "Mahalanobis",
    "RelativeMahalanobis",
    "as_logits",
    "check_embeddings",
    "energy_score",
    "l2_normalize",
    "make_feature_scorer",
    "max_softmax",
    "msp_score",
    "pooled_within_class_covariance",
    "scorer_from_state",
]


# --------------------------------------------------------------------------------------------------
# validation and helpers
# --------------------------------------------------------------------------------------------------
def check_embeddings(Z: Any, name: str = "Z", n_features: int | None = None, fitted_on: str = "") -> np.ndarray:
    """``Z`` as a float64 (N, D) array; raises FmauditInputError on a wrong shape, no rows, NaN/inf, or a
    dimension other than ``n_features``.

    Parameters
    ----------
    Z : array-like of shape (n_items, n_features)
        Embeddings, one row per item.
    name : str
        What ``Z`` is, for the error messages (e.g. ``"X"``, ``"set 'far'"``).
    n_features : int or None
        Feature dimension ``Z`` must have (that of a fitted scorer or gate); None accepts any.
    fitted_on : str
        What was fitted on ``n_features`` features, for the message (default "the scorer").

    Returns
    -------
    ndarray of shape (n_items, n_features), float64
        ``Z`` converted, every value finite.

    Raises
    ------
    FmauditInputError
        ``Z`` is not 2-D, has no rows, holds NaN/inf (the first offending rows are named) or has another width
        than ``n_features``.
    """
    arr = float_array(Z, name, 2, "embedding array (n_items, n_features)")
    if arr.shape[0] == 0:
        raise FmauditInputError(f"{name}: no rows")
    if n_features is not None and arr.shape[1] != n_features:
        raise FmauditInputError(
            f"{name}: {arr.shape[1]} features, but {fitted_on or 'the scorer'} was fitted on {n_features}")
    finite = np.isfinite(arr).all(axis=1)
    if not finite.all():
        rows = np.flatnonzero(~finite)
        raise FmauditInputError(f"{name}: {rows.size} row(s) with NaN/inf features (first rows {rows[:5].tolist()})")
    return arr


def _check_class_labels(y: Any, n_items: int, name: str = "y") -> np.ndarray:
    arr = np.asarray(y)
    if arr.ndim != 1 or arr.shape[0] != n_items:
        raise FmauditInputError(f"{name}: expected {n_items} labels (one per row), got shape {arr.shape}")
    reject_missing_labels(arr, name)
    return arr


def l2_normalize(Z: np.ndarray) -> np.ndarray:
    """Rows divided by their Euclidean norm; all-zero rows stay zero (as ``sklearn.preprocessing.normalize``).

    Parameters
    ----------
    Z : ndarray of shape (n_items, n_features)
        Embeddings, one row per item.

    Returns
    -------
    ndarray of shape (n_items, n_features)
        Rows of unit L2 norm (zero rows unchanged).
    """
    norm = np.linalg.norm(Z, axis=1, keepdims=True)
    return Z / np.where(norm > 0, norm, 1.0)


def _covariance(residuals: np.ndarray, estimator: str) -> np.ndarray:
    # store_precision=False: the pseudo-inverse is taken once, by _pinv_factor (scikit-learn's own pinvh
    # would double the cost of a fit)
    if estimator == "ledoit_wolf":
        from sklearn.covariance import LedoitWolf

        return LedoitWolf(store_precision=False).fit(residuals).covariance_
    if estimator == "empirical":
        from sklearn.covariance import EmpiricalCovariance

        return EmpiricalCovariance(store_precision=False).fit(residuals).covariance_
    raise FmauditInputError(f"covariance={estimator!r}: expected one of {COVARIANCES}")


def pooled_within_class_covariance(Z: np.ndarray, y: np.ndarray, estimator: str = "ledoit_wolf"
                                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(classes, class means (K, D), covariance (D, D)) of the class-centred rows ``Z - mu_y``.

    A class with one row still gives a mean; its residual is 0. The estimator sees every residual at once
    (one shared covariance, the audit paper and Lee et al.).

    Parameters
    ----------
    Z : ndarray of shape (n_items, n_features)
        Training embeddings.
    y : ndarray of shape (n_items,)
        Class of each row (any sortable labels; no missing values).
    estimator : {"ledoit_wolf", "empirical"}
        Covariance estimator of the residuals: scikit-learn's ``LedoitWolf`` (shrunk, the audit paper's) or
        ``EmpiricalCovariance`` (divides by N, no shrinkage).

    Returns
    -------
    classes : ndarray of shape (n_classes,)
        The sorted distinct labels of ``y``.
    means : ndarray of shape (n_classes, n_features)
        Class means, rows in the order of ``classes``.
    covariance : ndarray of shape (n_features, n_features)
        The pooled within-class covariance.

    Raises
    ------
    FmauditInputError
        ``estimator`` is not one of ``COVARIANCES``.
    """
    classes, codes = np.unique(y, return_inverse=True)
    codes = codes.reshape(-1)
    counts = np.bincount(codes, minlength=classes.size).astype(np.float64)
    means = np.zeros((classes.size, Z.shape[1]))
    np.add.at(means, codes, Z)
    means /= counts[:, None]
    return classes, means, _covariance(Z - means[codes], estimator)


def _pinv_factor(cov: np.ndarray) -> np.ndarray:
    """W (D, r) with ``W @ W.T == pinv(cov)`` for a symmetric PSD ``cov``.

    Eigenvalues at or below ``max(D, D) * eps * largest`` are dropped, numpy's ``pinv`` default cutoff, so the
    squared distance ``||(z - mu) @ W||^2`` equals ``(z - mu) pinv(cov) (z - mu)^T`` up to rounding; scoring
    through W costs one (N, D) x (D, r) product instead of one (D, D) product per class.
    """
    cov = (cov + cov.T) / 2.0
    eigval, eigvec = np.linalg.eigh(cov)
    top = float(np.abs(eigval).max()) if eigval.size else 0.0
    keep = eigval > cov.shape[0] * np.finfo(np.float64).eps * top
    if not keep.any():
        raise FmauditInputError("covariance: all eigenvalues are zero (every embedding equals its class mean)")
    return eigvec[:, keep] / np.sqrt(eigval[keep])


def _squared_distances(Zw: np.ndarray, centres_w: np.ndarray) -> np.ndarray:
    """(N, K) squared Euclidean distances between whitened rows and whitened centres (direct differences,
    no norm expansion, so no cancellation)."""
    out = np.empty((Zw.shape[0], centres_w.shape[0]))
    for k in range(centres_w.shape[0]):
        diff = Zw - centres_w[k]
        out[:, k] = np.einsum("ij,ij->i", diff, diff)
    return out


def _check_fitted(obj: Any, attr: str) -> None:
    if not hasattr(obj, attr):
        raise FmauditInputError(f"{type(obj).__name__} is not fitted yet: call fit first")


# --------------------------------------------------------------------------------------------------
# feature-space scorers
# --------------------------------------------------------------------------------------------------
class Mahalanobis:
    """Squared Mahalanobis distance to the nearest class mean under one pooled within-class covariance.

    Parameters
    ----------
    covariance : {"ledoit_wolf", "empirical"}
        Estimator of the pooled within-class covariance (default Ledoit-Wolf, the audit paper's; "empirical" is
        Lee et al. 2018's).
    normalize : bool
        L2-normalise embeddings before fitting and scoring (default False: raw embeddings).

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Training classes, the columns of :meth:`class_distances`.
    means_ : ndarray of shape (n_classes, n_features)
        Class means.
    covariance_ : ndarray of shape (n_features, n_features)
        Pooled within-class covariance (absent on a scorer rebuilt by :func:`scorer_from_state`).
    whitening_ : ndarray of shape (n_features, rank)
        ``whitening_ @ whitening_.T = pinv(covariance_)``; distances are Euclidean after it.
    n_features_in_ : int
        Feature dimension seen in ``fit``.
    """

    name = "maha"

    def __init__(self, covariance: str = "ledoit_wolf", normalize: bool = False):
        self.covariance = covariance
        self.normalize = normalize

    def _prepare(self, Z: Any, name: str = "Z") -> np.ndarray:
        Z = check_embeddings(Z, name, getattr(self, "n_features_in_", None), type(self).__name__)
        return l2_normalize(Z) if self.normalize else Z

    def fit(self, Z: Any, y: Any) -> "Mahalanobis":
        """Fit the class means and the pooled within-class covariance on training embeddings.

        Parameters
        ----------
        Z : array-like of shape (n_items, n_features)
            Training embeddings (at least 2 rows, finite).
        y : array-like of shape (n_items,)
            Class of each row.

        Returns
        -------
        Mahalanobis
            ``self``, fitted (earlier fitted attributes are cleared first).

        Raises
        ------
        FmauditInputError
            Unknown ``covariance``, fewer than 2 rows, labels not one per row or missing, or a covariance whose
            eigenvalues are all zero.
        """
        if self.covariance not in COVARIANCES:
            raise FmauditInputError(f"covariance={self.covariance!r}: expected one of {COVARIANCES}")
        for attr in [a for a in vars(self) if a.endswith("_")]:
            delattr(self, attr)
        Z = self._prepare(Z)
        if Z.shape[0] < 2:
            raise FmauditInputError(f"{type(self).__name__}: need at least 2 training rows, got {Z.shape[0]}")
        y = _check_class_labels(y, Z.shape[0])
        self.classes_, self.means_, self.covariance_ = pooled_within_class_covariance(Z, y, self.covariance)
        self.whitening_ = _pinv_factor(self.covariance_)
        self.n_features_in_ = Z.shape[1]
        return self

    @property
    def precision_(self) -> np.ndarray:
        """(D, D) pseudo-inverse of the pooled covariance, ``whitening_ @ whitening_.T``."""
        _check_fitted(self, "whitening_")
        return self.whitening_ @ self.whitening_.T

    def class_distances(self, Z: Any) -> np.ndarray:
        """(N, K) squared Mahalanobis distance of every row to every class mean (columns follow ``classes_``).

        Parameters
        ----------
        Z : array-like of shape (n_items, n_features)
            Embeddings to score (L2-normalised first when ``normalize``).

        Returns
        -------
        ndarray of shape (n_items, n_classes)
            ``(z - mu_k)^T pinv(Sigma) (z - mu_k)`` per row and class.
        """
        _check_fitted(self, "whitening_")
        Z = self._prepare(Z)
        return _squared_distances(Z @ self.whitening_, self.means_ @ self.whitening_)

    def score(self, Z: Any) -> np.ndarray:
        """(N,) ``min_k (z - mu_k)^T pinv(Sigma) (z - mu_k)``.

        Parameters
        ----------
        Z : array-like of shape (n_items, n_features)
            Embeddings to score.

        Returns
        -------
        ndarray of shape (n_items,)
            Novelty score per row, higher = more out-of-distribution.
        """
        return self.class_distances(Z).min(axis=1)

    # export -------------------------------------------------------------------------------------------
    def params(self) -> dict[str, Any]:
        """The constructor parameters as JSON-ready values (what an exported gate's card records).

        Returns
        -------
        dict
            Keys ``covariance`` (str) and ``normalize`` (bool).
        """
        return {"covariance": self.covariance, "normalize": bool(self.normalize)}

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The fitted state as plain arrays, enough for :func:`scorer_from_state` to rebuild the scorer.

        Returns
        -------
        dict of str to ndarray
            ``means`` (K, D), ``whitening`` (D, r), ``classes`` (K,) int64.
        """
        _check_fitted(self, "whitening_")
        return {"means": self.means_, "whitening": self.whitening_, "classes": np.asarray(self.classes_, np.int64)}

    def _set_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.means_ = np.asarray(arrays["means"], np.float64)
        self.whitening_ = np.asarray(arrays["whitening"], np.float64)
        self.classes_ = np.asarray(arrays["classes"])
        self.n_features_in_ = self.means_.shape[1]


class RelativeMahalanobis(Mahalanobis):
    """Ren et al. 2021: ``min_k MD_k(z) - MD_0(z)``; MD_0 is the distance to the global training mean under the
    global covariance (the same estimator as the class part). Fitted adds ``background_mean_`` (D,) and
    ``background_whitening_`` (D, r0).

    Parameters
    ----------
    covariance : {"empirical", "ledoit_wolf"}
        Estimator of both covariances, the class-pooled and the global one (default "empirical", Ren et al.'s;
        "ledoit_wolf" is the audit paper's).
    normalize : bool
        L2-normalise embeddings before fitting and scoring (default False).
    """

    name = "relative_maha"

    def __init__(self, covariance: str = "empirical", normalize: bool = False):
        super().__init__(covariance=covariance, normalize=normalize)

    def fit(self, Z: Any, y: Any) -> "RelativeMahalanobis":
        """Fit the class part (:meth:`Mahalanobis.fit`) and the background mean and covariance of all rows.

        Parameters
        ----------
        Z : array-like of shape (n_items, n_features)
            Training embeddings (at least 2 rows).
        y : array-like of shape (n_items,)
            Class of each row.

        Returns
        -------
        RelativeMahalanobis
            ``self``, fitted.
        """
        super().fit(Z, y)
        Z = self._prepare(Z)
        self.background_mean_ = Z.mean(axis=0)
        self.background_whitening_ = _pinv_factor(_covariance(Z - self.background_mean_, self.covariance))
        return self

    def background_distance(self, Z: Any) -> np.ndarray:
        """(N,) squared Mahalanobis distance ``MD_0`` to the global training mean under the global covariance.

        Parameters
        ----------
        Z : array-like of shape (n_items, n_features)
            Embeddings to score.

        Returns
        -------
        ndarray of shape (n_items,)
            ``MD_0(z)`` per row.
        """
        _check_fitted(self, "background_whitening_")
        Zp = self._prepare(Z)
        return _squared_distances(Zp @ self.background_whitening_,
                                  (self.background_mean_ @ self.background_whitening_)[None, :])[:, 0]

    def score(self, Z: Any) -> np.ndarray:
        """(N,) relative Mahalanobis score ``min_k MD_k(z) - MD_0(z)``.

        Parameters
        ----------
        Z : array-like of shape (n_items, n_features)
            Embeddings to score.

        Returns
        -------
        ndarray of shape (n_items,)
            Novelty score per row, higher = more out-of-distribution (may be negative).
        """
        return self.class_distances(Z).min(axis=1) - self.background_distance(Z)

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The fitted state as plain arrays (:meth:`Mahalanobis.state_arrays` plus the background part).

        Returns
        -------
        dict of str to ndarray
            ``means``, ``whitening``, ``classes``, ``background_mean`` (D,), ``background_whitening`` (D, r0).
        """
        out = super().state_arrays()
        out.update(background_mean=self.background_mean_, background_whitening=self.background_whitening_)
        return out

    def _set_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        super()._set_state(arrays)
        self.background_mean_ = np.asarray(arrays["background_mean"], np.float64)
        self.background_whitening_ = np.asarray(arrays["background_whitening"], np.float64)


class KNNDistance:
    """Distance to the k-th nearest training embedding (Sun et al. 2022), L2-normalised by default.

    Fitted: ``bank_`` (M, D) (normalised when ``normalize``), ``k_`` = min(k, M), ``n_features_in_``.
    Squared distances use ``|q|^2 + |b|^2 - 2 q.b`` in float64 (scikit-learn's ``euclidean_distances``
    expansion), clipped at 0, in blocks of ``block_size`` queries to bound memory.

    Parameters
    ----------
    k : int
        Rank of the neighbour whose distance is the score (default 50, Sun et al.'s; capped at the bank size
        with a warning).
    normalize : bool
        L2-normalise bank and queries (default True, as Sun et al.).
    block_size : int
        Queries scored per block (memory: ``block_size x M`` float64 distances).
    """

    name = "knn"

    def __init__(self, k: int = DEFAULT_KNN_K, normalize: bool = True, block_size: int = 2048):
        self.k = k
        self.normalize = normalize
        self.block_size = block_size

    def _prepare(self, Z: Any, name: str = "Z") -> np.ndarray:
        Z = check_embeddings(Z, name, getattr(self, "n_features_in_", None), type(self).__name__)
        return l2_normalize(Z) if self.normalize else Z

    def fit(self, Z: Any, y: Any = None) -> "KNNDistance":
        """Store the training embeddings as the neighbour bank.

        Parameters
        ----------
        Z : array-like of shape (n_bank, n_features)
            Training embeddings (the bank).
        y : ignored
            Accepted so that every feature scorer fits as ``fit(Z, y)``.

        Returns
        -------
        KNNDistance
            ``self``, fitted.

        Raises
        ------
        FmauditInputError
            ``k`` is not a positive integer, or ``Z`` is not a finite 2-D array.
        """
        if int(self.k) != self.k or int(self.k) < 1:
            raise FmauditInputError(f"k={self.k!r}: must be a positive integer")
        for attr in [a for a in vars(self) if a.endswith("_")]:
            delattr(self, attr)
        bank = self._prepare(Z, "bank")
        k = int(self.k)
        if k > bank.shape[0]:
            warnings.warn(f"KNNDistance: k={k} exceeds the bank of {bank.shape[0]} embeddings; using "
                          f"k={bank.shape[0]} (the farthest bank embedding)", UserWarning, stacklevel=2)
            k = bank.shape[0]
        self.bank_ = bank
        self.k_ = k
        self.n_features_in_ = bank.shape[1]
        return self

    def score(self, Z: Any) -> np.ndarray:
        """(N,) Euclidean distance to the ``k_``-th nearest bank embedding.

        Parameters
        ----------
        Z : array-like of shape (n_items, n_features)
            Query embeddings (normalised like the bank).

        Returns
        -------
        ndarray of shape (n_items,)
            Novelty score per query, higher = more out-of-distribution.
        """
        _check_fitted(self, "bank_")
        Q = self._prepare(Z)
        bank_sq = np.einsum("ij,ij->i", self.bank_, self.bank_)
        out = np.empty(Q.shape[0])
        k = self.k_
        for start in range(0, Q.shape[0], int(self.block_size)):
            q = Q[start:start + int(self.block_size)]
            d2 = np.einsum("ij,ij->i", q, q)[:, None] + bank_sq[None, :] - 2.0 * (q @ self.bank_.T)
            kth = np.partition(d2, k - 1, axis=1)[:, k - 1]
            out[start:start + q.shape[0]] = np.sqrt(np.maximum(kth, 0.0))
        return out

    def params(self) -> dict[str, Any]:
        """The constructor parameters a card records (``block_size`` only bounds memory and is left out).

        Returns
        -------
        dict
            Keys ``k`` (int, as asked) and ``normalize`` (bool).
        """
        return {"k": int(self.k), "normalize": bool(self.normalize)}

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The fitted state as plain arrays, enough for :func:`scorer_from_state` to rebuild the scorer.

        Returns
        -------
        dict of str to ndarray
            ``bank`` (M, D) and ``k_effective`` (1,) int64, the k used after capping.
        """
        _check_fitted(self, "bank_")
        return {"bank": self.bank_, "k_effective": np.asarray([self.k_], np.int64)}

    def _set_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.bank_ = np.asarray(arrays["bank"], np.float64)
        self.k_ = int(np.asarray(arrays["k_effective"]).reshape(-1)[0])
        self.n_features_in_ = self.bank_.shape[1]


_FEATURE_CLASSES = {"maha": Mahalanobis, "relative_maha": RelativeMahalanobis, "knn": KNNDistance}


def make_feature_scorer(name: str, **params: Any):
    """A feature-space scorer by name: ``maha``, ``relative_maha`` or ``knn`` (constructor parameters as kwargs).

    Parameters
    ----------
    name : {"maha", "relative_maha", "knn"}
        The scorer (``FEATURE_SCORERS``).
    **params
        Constructor parameters of its class, e.g. ``covariance="empirical"`` or ``k=10``.

    Returns
    -------
    Mahalanobis or RelativeMahalanobis or KNNDistance
        An unfitted scorer.

    Raises
    ------
    FmauditInputError
        Unknown name (a logit scorer's name says to use its function instead) or a parameter the class does
        not take.
    """
    if name not in _FEATURE_CLASSES:
        hint = " (a logit scorer: use energy_score / msp_score on the probe's logits)" if name in LOGIT_SCORERS else ""
        raise FmauditInputError(f"unknown feature scorer {name!r}{hint}; known: {', '.join(FEATURE_SCORERS)}")
    try:
        return _FEATURE_CLASSES[name](**params)
    except TypeError as err:
        raise FmauditInputError(f"scorer {name!r}: {err}") from None


def scorer_from_state(name: str, params: Mapping[str, Any], arrays: Mapping[str, np.ndarray]):
    """Rebuild a fitted feature scorer from :meth:`params` and :meth:`state_arrays` (no pickle).

    Parameters
    ----------
    name : {"maha", "relative_maha", "knn"}
        The scorer's ``name``.
    params : mapping
        Its constructor parameters, as ``params()`` gave them.
    arrays : mapping of str to ndarray
        Its fitted state, as ``state_arrays()`` gave it (an exported gate's ``scorer.*`` arrays).

    Returns
    -------
    Mahalanobis or RelativeMahalanobis or KNNDistance
        A fitted scorer that scores as the original did.

    Raises
    ------
    FmauditInputError
        Unknown name or parameter, or a state array missing.
    """
    scorer = make_feature_scorer(name, **dict(params))
    try:
        scorer._set_state(arrays)
    except KeyError as err:
        raise FmauditInputError(f"scorer {name!r}: missing state array {err}") from None
    return scorer


# --------------------------------------------------------------------------------------------------
# logit scorers
# --------------------------------------------------------------------------------------------------
def as_logits(values: Any, name: str = "logits") -> np.ndarray:
    """(N, K) float64 logits; a 1-D array is a binary decision value d and becomes (-d/2, d/2).

    Parameters
    ----------
    values : array-like of shape (n_items, n_classes) or (n_items,)
        Probe logits, or one binary decision value per item (docs/methods.md#binary-logits).
    name : str
        What the values are, for the error messages.

    Returns
    -------
    ndarray of shape (n_items, n_classes), float64
        Logits; two columns for a decision value.

    Raises
    ------
    FmauditInputError
        Not 1-D or 2-D, or not finite.
    """
    arr = np.asarray(values)
    if arr.ndim == 1:
        return binary_logits_from_decision(arr)
    return validate_logits(arr, name)


def _logsumexp(z: np.ndarray) -> np.ndarray:
    top = z.max(axis=1)
    return top + np.log(np.exp(z - top[:, None]).sum(axis=1))


def energy_score(logits: Any, T: float = 1.0) -> np.ndarray:
    """(N,) ``-T * logsumexp(logits / T)``: the free energy E(x; f), higher = more OOD (Liu et al. 2020).

    Parameters
    ----------
    logits : array-like of shape (n_items, n_classes) or (n_items,)
        Probe logits, or binary decision values (see :func:`as_logits`).
    T : float
        Energy temperature, > 0 (default 1, Liu et al.'s).

    Returns
    -------
    ndarray of shape (n_items,)
        Energy score per item.

    Raises
    ------
    FmauditInputError
        ``T`` not positive, or invalid logits.
    """
    if not float(T) > 0:
        raise FmauditInputError(f"T: the energy temperature must be > 0, got {T!r}")
    z = as_logits(logits)
    return -float(T) * _logsumexp(z / float(T))


def max_softmax(logits: Any) -> np.ndarray:
    """(N,) maximum softmax probability: the probe's confidence.

    Parameters
    ----------
    logits : array-like of shape (n_items, n_classes) or (n_items,)
        Probe logits, or binary decision values (see :func:`as_logits`).

    Returns
    -------
    ndarray of shape (n_items,)
        Largest class probability per item, in [1/K, 1].
    """
    return softmax_last_axis(as_logits(logits)).max(axis=1)


def msp_score(logits: Any) -> np.ndarray:
    """(N,) ``1 - max softmax`` (Hendrycks & Gimpel 2017).

    Parameters
    ----------
    logits : array-like of shape (n_items, n_classes) or (n_items,)
        Probe logits, or binary decision values (see :func:`as_logits`).

    Returns
    -------
    ndarray of shape (n_items,)
        Novelty score per item, higher = more out-of-distribution.
    """
    return 1.0 - max_softmax(logits)

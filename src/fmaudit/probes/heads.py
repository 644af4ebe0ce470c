"""Probe heads on frozen embeddings: scikit-learn classifiers with one output convention.

Every head is a scikit-learn estimator (``BaseEstimator``, ``ClassifierMixin``: ``get_params``,
``set_params``, ``sklearn.base.clone``, pipelines and ``GridSearchCV`` work) with ``fit(X, y, n_classes=None)
-> self`` and, after fitting, ``classes_``, ``decision_logits(X) -> (N, K)`` (the fmaudit convention: K logit
columns whatever K, what calibration and the OOD scorers read), ``decision_function(X)`` (scikit-learn's:
the same (N, K), or (N,) = logit 1 - logit 0 when there are two classes), ``predict_proba(X)`` (the softmax
of the logits), ``predict(X)`` (argmax of the logits, ties to the lowest class index, returned as
``classes_`` values), ``score(X, y)`` (accuracy) and the attribute ``probabilistic`` (True for the logistic
heads, whose softmax is a fitted probability; for the others the softmax of a score, usable for temperature
scaling but not calibrated by construction).

Conventions
- Labels: with ``n_classes=K`` (constructor or ``fit`` keyword) labels must be class indices 0..K-1 and the
  outputs have K columns even when some classes are absent from the training set, so runs on different
  subsets stay aligned; ``classes_`` is ``arange(K)``. Without it, ``classes_`` is ``np.unique(y)`` (any
  sortable labels) and columns follow it.
- A class absent from the training set gets a logit ``ABSENT_CLASS_LOGIT_GAP`` below the row's lowest
  present-class logit (probability 0, finite logits) for the logistic, SVM and centroid heads; the k-NN head
  gives it its natural vote share, 0.
- ``standardize=True`` (default) fits a StandardScaler-equivalent (ddof 0, near-constant features scale 1)
  on the training rows only and applies it inside the head, before any normalisation of the head's own.
- Binary logistic and SVM decision values d become the two logits (-d/2, d/2) (docs/methods.md#binary-logits), so the
  softmax equals sigmoid(d), the head's own probability.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

from fmaudit.io import FmauditInputError
from fmaudit.metrics import reject_missing_labels, softmax_last_axis
from fmaudit.probes._row_store import subset_scaler
from fmaudit.probes.logistic_batch import (
    ABSENT_CLASS_LOGIT_GAP,
    check_features,
    check_labels,
    fit_logistic_batch,
)

DEFAULT_CV_CS = np.logspace(-6, 0, 7)


def fill_absent_classes(scores: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Logits of every class from the scores of the classes present in training.

    Parameters
    ----------
    scores : ndarray of shape (N, K_present)
        Scores of the present classes, in class order.
    present : ndarray of bool, shape (K,)
        Which classes were present in training.

    Returns
    -------
    ndarray of shape (N, K)
        The scores in their columns; an absent class gets ``ABSENT_CLASS_LOGIT_GAP`` below the row's lowest
        score (probability 0 after a softmax, finite logits).
    """
    out = np.empty((scores.shape[0], present.size), dtype=np.float64)
    out[:, present] = scores
    if not present.all():
        out[:, ~present] = scores.min(axis=1, keepdims=True) - ABSENT_CLASS_LOGIT_GAP
    return out


def _binary_logits(d: np.ndarray) -> np.ndarray:
    return np.stack([-d / 2.0, d / 2.0], axis=1)


class ProbeHead(ClassifierMixin, BaseEstimator):
    """Shared fitting plumbing: label encoding, optional standardisation, output checks.

    Parameters
    ----------
    standardize : bool, default True
        Fit a StandardScaler-equivalent on the training rows and apply it inside the head.
    n_classes : int or None, default None
        Fix the label space to class indices 0..K-1 (module doc); None: the labels seen in ``fit``.
    """

    probabilistic = False

    def __init__(self, standardize: bool = True, n_classes: int | None = None):
        self.standardize = standardize
        self.n_classes = n_classes

    # -- subclasses implement these two, on standardised features and encoded labels 0..K-1 --------------
    def _fit(self, X: np.ndarray, codes: np.ndarray, n_classes: int, present: np.ndarray, **kwargs) -> None:
        raise NotImplementedError

    def _scores(self, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def fit(self, X, y, n_classes: int | None = None, **kwargs) -> "ProbeHead":
        """Fit the head.

        Parameters
        ----------
        X : array-like of shape (N, D)
            Training features.
        y : array-like of shape (N,)
            Training labels: class indices 0..K-1 with ``n_classes``, else any sortable labels.
        n_classes : int or None, default None
            Overrides the constructor's ``n_classes`` for this fit.
        **kwargs
            Head-specific fit arguments (``groups`` for :class:`LogisticCVProbe`).

        Returns
        -------
        self
        """
        X = check_features(X)
        y = np.asarray(y)
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise FmauditInputError(f"y: {y.shape} labels for {X.shape[0]} feature rows (expected 1-D, same length)")
        if X.shape[0] == 0:
            raise FmauditInputError("X: no training rows")
        n_classes = n_classes if n_classes is not None else self.n_classes
        if n_classes is not None:
            n_classes = int(n_classes)
            codes = check_labels(y, X.shape[0], n_classes)
            self.classes_ = np.arange(n_classes)
        else:
            reject_missing_labels(y, "y")
            self.classes_, codes = np.unique(y, return_inverse=True)
            n_classes = self.classes_.size
        present = np.bincount(codes, minlength=n_classes) > 0
        self.present_ = present
        self.n_features_in_ = X.shape[1]
        if self.standardize:
            self.mean_, self.scale_ = subset_scaler(X)
            X = (X - self.mean_) / self.scale_
        self._fit(X, codes, n_classes, present, **kwargs)
        return self

    def _transform(self, X) -> np.ndarray:
        if not hasattr(self, "classes_"):
            raise FmauditInputError(f"{type(self).__name__} is not fitted yet: call fit(X, y) first")
        X = check_features(X)
        if X.shape[1] != self.n_features_in_:
            raise FmauditInputError(
                f"X has {X.shape[1]} features but {type(self).__name__} was fitted on {self.n_features_in_}"
            )
        if self.standardize:
            X = (X - self.mean_) / self.scale_
        return X

    def decision_logits(self, X) -> np.ndarray:
        """Scores usable as logits.

        Parameters
        ----------
        X : array-like of shape (N, D)

        Returns
        -------
        ndarray of shape (N, K)
            One column per class of ``classes_``, whatever K.
        """
        return self._scores(self._transform(X))

    def decision_function(self, X) -> np.ndarray:
        """scikit-learn's decision values.

        Parameters
        ----------
        X : array-like of shape (N, D)

        Returns
        -------
        ndarray of shape (N, K), or (N,) with two classes
            :meth:`decision_logits`; with two classes the score of ``classes_[1]`` over ``classes_[0]``
            (logit 1 - logit 0), as scikit-learn's binary classifiers give it.
        """
        logits = self.decision_logits(X)
        return logits[:, 1] - logits[:, 0] if logits.shape[1] == 2 else logits

    def predict_proba(self, X) -> np.ndarray:
        """Softmax of :meth:`decision_logits`, (N, K).

        Parameters
        ----------
        X : array-like of shape (N, D)
            Features with the fitted width D.

        Returns
        -------
        ndarray of shape (N, K)
            Rows summing to 1, columns in the order of ``classes_`` (a class absent from training gets about 0:
            :func:`fill_absent_classes`).

        Raises
        ------
        FmauditInputError
            When the head is not fitted or ``X`` has another width or non-finite values.
        """
        return softmax_last_axis(self.decision_logits(X))

    def predict(self, X) -> np.ndarray:
        """``classes_`` value of the largest logit; ties go to the lowest class index.

        Parameters
        ----------
        X : array-like of shape (N, D)
            Features with the fitted width D.

        Returns
        -------
        ndarray of shape (N,)
            Values of ``classes_``.

        Raises
        ------
        FmauditInputError
            When the head is not fitted or ``X`` has another width or non-finite values.
        """
        winners = self.decision_logits(X).argmax(axis=1)
        return self.classes_[winners]

    @staticmethod
    def _require_two_classes(present: np.ndarray, name: str) -> None:
        if present.sum() < 2:
            raise FmauditInputError(
                f"{name}: the training set has a single class (index {int(np.flatnonzero(present)[0])}); "
                "a discriminative probe needs at least 2"
            )


class LogisticProbe(ProbeHead):
    """L2 multinomial logistic regression, scikit-learn's ``LogisticRegression(C, lbfgs)`` objective.

    Both backends give the same probabilities up to ``tol`` (scikit-learn's stopping semantics).

    Parameters
    ----------
    C : float, default 1.0
        Inverse penalty strength.
    max_iter : int, default 1000
    tol : float, default 1e-6
        Stopping tolerance (max-abs gradient of the scaled objective).
    standardize, n_classes
        See :class:`ProbeHead`.
    backend : {"auto", "torch", "sklearn"}, default "auto"
        "torch" runs :func:`~fmaudit.probes.fit_logistic_batch` with one problem on ``device``, "sklearn"
        runs scikit-learn; "auto" is "torch".
    device : str or None, default None
        The torch backend's device (None: CPU).

    Attributes
    ----------
    coef_ : ndarray of shape (K, D)
        Weights on the standardised features (absent classes 0).
    intercept_ : ndarray of shape (K,)
    n_iter_ : int
    converged_ : bool
    """

    probabilistic = True

    def __init__(
        self,
        C: float = 1.0,
        max_iter: int = 1000,
        tol: float = 1e-6,
        standardize: bool = True,
        backend: str = "auto",
        device: str | None = None,
        n_classes: int | None = None,
    ):
        super().__init__(standardize=standardize, n_classes=n_classes)
        self.C = C
        self.max_iter = max_iter
        self.tol = tol
        self.backend = backend
        self.device = device

    def _fit(self, X, codes, n_classes, present, **kwargs):
        self._require_two_classes(present, type(self).__name__)
        backend = _resolve_backend(self.backend)
        if backend == "torch":
            fit = fit_logistic_batch(
                X, codes, [np.arange(X.shape[0])], self.C, n_classes, standardize=False,
                device=self.device, max_iter=self.max_iter, tol=self.tol,
            )
            self.coef_ = fit.W_[0].T.copy()
            self.intercept_ = fit.b_[0].copy()
            self.n_iter_ = int(fit.n_iter_[0])
            self.converged_ = bool(fit.converged_[0])
        else:
            from sklearn.exceptions import ConvergenceWarning
            from sklearn.linear_model import LogisticRegression

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ConvergenceWarning)
                model = LogisticRegression(C=self.C, max_iter=self.max_iter, tol=self.tol).fit(X, codes)
            self.converged_ = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
            self.n_iter_ = int(model.n_iter_[0])
            coef = np.zeros((n_classes, X.shape[1]))
            intercept = np.zeros(n_classes)
            seen = model.classes_
            if seen.size == 2:
                # Symmetric split of sklearn's single vector: softmax of (-d/2, d/2) is sigmoid(d).
                coef[seen[0]], coef[seen[1]] = -model.coef_[0] / 2, model.coef_[0] / 2
                intercept[seen[0]], intercept[seen[1]] = -model.intercept_[0] / 2, model.intercept_[0] / 2
            else:
                coef[seen], intercept[seen] = model.coef_, model.intercept_
            self.coef_, self.intercept_ = coef, intercept

    def _scores(self, X):
        return fill_absent_classes(X @ self.coef_[self.present_].T + self.intercept_[self.present_], self.present_)


class LogisticCVProbe(ProbeHead):
    """The audit preset's probe: C chosen by grouped, stratified k-fold CV on log-loss, then refit on all rows.

    As in the audit paper the scaler is fitted once on the whole training set, outside the folds. Folds come
    from ``StratifiedGroupKFold(n_folds, shuffle=True, random_state)`` with ``fit(X, y, groups=...)``, or
    ``StratifiedKFold`` without groups. The mean held-out log-loss (probabilities clipped at float64 eps, as
    scikit-learn's ``log_loss``) picks ``C_``; ties go to the first C in ``Cs``. The torch backend fits all
    fold x C problems in one batch; "sklearn" uses ``LogisticRegressionCV`` with the same folds.

    Parameters
    ----------
    Cs : array-like, default ``DEFAULT_CV_CS`` (1e-6 ... 1)
        The C grid.
    n_folds : int, default 3
    max_iter, tol, standardize, backend, device, n_classes
        See :class:`LogisticProbe`.
    random_state : int or None, default 0
        Seed of the folds' shuffling.

    Attributes
    ----------
    C_ : float
        The chosen C.
    cv_scores_ : ndarray of shape (n_folds, n_Cs)
        Negative held-out log-loss.
    coef_, intercept_, n_iter_, converged_
        Those of the refit :class:`LogisticProbe`.
    """

    probabilistic = True

    def __init__(
        self,
        Cs=DEFAULT_CV_CS,
        n_folds: int = 3,
        max_iter: int = 10000,
        tol: float = 1e-6,
        standardize: bool = True,
        random_state: int | None = 0,
        backend: str = "auto",
        device: str | None = None,
        n_classes: int | None = None,
    ):
        super().__init__(standardize=standardize, n_classes=n_classes)
        self.Cs = Cs
        self.n_folds = n_folds
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.backend = backend
        self.device = device

    def fit(self, X, y, n_classes: int | None = None, groups=None) -> "LogisticCVProbe":
        """Fit as :meth:`ProbeHead.fit`; ``groups`` (N,) (patient or slide per row) make the folds
        group-disjoint.

        Parameters
        ----------
        X : array-like of shape (N, D)
            Training features.
        y : array-like of shape (N,)
            Training labels (as :meth:`ProbeHead.fit`).
        n_classes : int or None, default None
            Overrides the constructor's ``n_classes`` for this fit.
        groups : array-like of shape (N,), optional
            Group of each row; None gives stratified folds that ignore groups.

        Returns
        -------
        self
        """
        return super().fit(X, y, n_classes=n_classes, groups=groups)

    def _folds(self, X, codes, groups):
        from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

        if groups is None:
            splitter = StratifiedKFold(self.n_folds, shuffle=True, random_state=self.random_state)
            return list(splitter.split(X, codes))
        groups = np.asarray(groups)
        if groups.shape != codes.shape:
            raise FmauditInputError(f"groups: {groups.shape[0] if groups.ndim else 0} groups for {codes.size} rows")
        if np.unique(groups).size < self.n_folds:
            raise FmauditInputError(
                f"groups: {np.unique(groups).size} distinct groups cannot fill {self.n_folds} group-disjoint folds"
            )
        splitter = StratifiedGroupKFold(self.n_folds, shuffle=True, random_state=self.random_state)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "least populated class" notes
            return list(splitter.split(X, codes, groups))

    def _fit(self, X, codes, n_classes, present, groups=None):
        self._require_two_classes(present, type(self).__name__)
        Cs = np.asarray(self.Cs, dtype=np.float64).ravel()
        if Cs.size == 0 or not (Cs > 0).all():
            raise FmauditInputError(f"Cs: need positive values, got {Cs.tolist()}")
        folds = self._folds(X, codes, groups)
        backend = _resolve_backend(self.backend)
        if backend == "torch":
            subsets = [train for train, _ in folds for _ in Cs]
            fold_fits = fit_logistic_batch(
                X, codes, subsets, np.tile(Cs, len(folds)), n_classes, standardize=False,
                device=self.device, max_iter=self.max_iter, tol=self.tol,
            )
            scores = np.empty((len(folds), Cs.size))
            for f, (_, test) in enumerate(folds):
                for c in range(Cs.size):
                    P = fold_fits.predict_proba(X[test], f * Cs.size + c)
                    scores[f, c] = -_log_loss(codes[test], P)
        else:
            from sklearn.linear_model import LogisticRegressionCV

            model = LogisticRegressionCV(
                Cs=Cs, cv=folds, scoring="neg_log_loss", tol=self.tol, max_iter=self.max_iter, l1_ratios=(0,),
                use_legacy_attributes=False, refit=False,
            ).fit(X, codes)
            scores = np.asarray(model.scores_)[:, 0, :]  # (n_folds, n_l1_ratios=1, n_Cs)
        self.cv_scores_ = scores
        self.C_ = float(Cs[int(np.argmax(scores.sum(axis=0)))])
        final = LogisticProbe(
            C=self.C_, max_iter=self.max_iter, tol=self.tol, standardize=False, backend=backend,
            device=self.device, n_classes=n_classes,
        ).fit(X, codes)
        self.coef_, self.intercept_ = final.coef_, final.intercept_
        self.n_iter_, self.converged_ = final.n_iter_, final.converged_

    def _scores(self, X):
        return fill_absent_classes(X @ self.coef_[self.present_].T + self.intercept_[self.present_], self.present_)


def _log_loss(codes: np.ndarray, P: np.ndarray) -> float:
    eps = np.finfo(np.float64).eps
    return float(-np.mean(np.log(np.clip(P[np.arange(codes.size), codes], eps, 1 - eps))))


def _resolve_backend(backend: str) -> str:
    if backend not in ("auto", "torch", "sklearn"):
        raise FmauditInputError(f"backend={backend!r}: expected 'auto', 'torch' or 'sklearn'")
    return "torch" if backend == "auto" else backend


class LinearSVMProbe(ProbeHead):
    """scikit-learn ``LinearSVC(C)`` (squared hinge, one-vs-rest); its decision values are the logits.

    Parameters
    ----------
    C : float, default 1.0
    max_iter : int, default 1000
    standardize, n_classes
        See :class:`ProbeHead`.
    random_state : int or None, default 0
    """

    def __init__(
        self,
        C: float = 1.0,
        max_iter: int = 1000,
        standardize: bool = True,
        random_state: int | None = 0,
        n_classes: int | None = None,
    ):
        super().__init__(standardize=standardize, n_classes=n_classes)
        self.C = C
        self.max_iter = max_iter
        self.random_state = random_state

    def _fit(self, X, codes, n_classes, present, **kwargs):
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.svm import LinearSVC

        self._require_two_classes(present, type(self).__name__)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            self.model_ = LinearSVC(C=self.C, max_iter=self.max_iter, random_state=self.random_state).fit(X, codes)
        self.converged_ = not any(issubclass(w.category, ConvergenceWarning) for w in caught)

    def _scores(self, X):
        d = self.model_.decision_function(X)
        scores = _binary_logits(d) if d.ndim == 1 else d
        return fill_absent_classes(scores, self.present_)


class NearestCentroidProbe(ProbeHead):
    """Euclidean nearest class mean; logits are minus the squared distances to the class means.

    Parameters
    ----------
    standardize, n_classes
        See :class:`ProbeHead`.
    """

    def _fit(self, X, codes, n_classes, present, **kwargs):
        centroids = np.zeros((n_classes, X.shape[1]))
        np.add.at(centroids, codes, X)
        counts = np.bincount(codes, minlength=n_classes)
        centroids[present] /= counts[present, None]
        self.centroids_ = centroids

    def _scores(self, X):
        C = self.centroids_[self.present_]
        sq = (X * X).sum(axis=1, keepdims=True) - 2.0 * X @ C.T + (C * C).sum(axis=1)
        return fill_absent_classes(-sq, self.present_)


def _l2_normalise(X: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norm > 0, norm, 1.0)


class CosineCentroidProbe(ProbeHead):
    """L2-normalise, average per class; logits are the cosine similarities to the class means.

    Parameters
    ----------
    standardize, n_classes
        See :class:`ProbeHead`.
    """

    def _fit(self, X, codes, n_classes, present, **kwargs):
        Xn = _l2_normalise(X)
        centroids = np.zeros((n_classes, X.shape[1]))
        np.add.at(centroids, codes, Xn)
        self.centroids_ = _l2_normalise(centroids)

    def _scores(self, X):
        return fill_absent_classes(_l2_normalise(X) @ self.centroids_[self.present_].T, self.present_)


class KNNProbe(ProbeHead):
    """k nearest neighbours in the training bank; ``metric`` "cosine" (L2-normalise first) or "euclidean".

    Logits are the neighbours' vote shares per class (k=1: 1 for the nearest neighbour's class, 0 elsewhere;
    absent classes 0). Distance ties go to the earlier row in the bank's (training) order, vote ties to the
    lowest class index.

    Parameters
    ----------
    k : int, default 1
    metric : {"cosine", "euclidean"}, default "cosine"
    standardize, n_classes
        See :class:`ProbeHead`.
    chunk_size : int, default 2048
        Query rows per distance block (memory, not results).
    """

    def __init__(
        self,
        k: int = 1,
        metric: str = "cosine",
        standardize: bool = True,
        n_classes: int | None = None,
        chunk_size: int = 2048,
    ):
        super().__init__(standardize=standardize, n_classes=n_classes)
        self.k = k
        self.metric = metric
        self.chunk_size = chunk_size

    def _fit(self, X, codes, n_classes, present, **kwargs):
        if self.metric not in ("cosine", "euclidean"):
            raise FmauditInputError(f"metric={self.metric!r}: expected 'cosine' or 'euclidean'")
        if int(self.k) < 1 or int(self.k) > X.shape[0]:
            raise FmauditInputError(f"k={self.k}: must lie in 1..{X.shape[0]} (the training rows)")
        self.bank_ = _l2_normalise(X) if self.metric == "cosine" else X.copy()
        self.bank_codes_ = codes.copy()
        self._bank_sq = (self.bank_ * self.bank_).sum(axis=1)

    def neighbours(self, X) -> np.ndarray:
        """The k nearest training rows of each query.

        Parameters
        ----------
        X : array-like of shape (N, D)

        Returns
        -------
        ndarray of shape (N, k)
            Bank (training) row indices, nearest first, ties in bank order.
        """
        return self._neighbours(self._transform(X))

    def _neighbours(self, X):
        k = int(self.k)
        Q = _l2_normalise(X) if self.metric == "cosine" else X
        out = np.empty((Q.shape[0], k), dtype=np.int64)
        for start in range(0, Q.shape[0], self.chunk_size):
            q = Q[start : start + self.chunk_size]
            # Squared distance up to a per-query constant; for unit vectors this orders like 1 - cosine.
            dist = self._bank_sq[None, :] - 2.0 * q @ self.bank_.T
            out[start : start + q.shape[0]] = _k_smallest_stable(dist, k)
        return out

    def _scores(self, X):
        nn = self._neighbours(X)
        votes = np.zeros((X.shape[0], self.classes_.size))
        np.add.at(votes, (np.repeat(np.arange(X.shape[0]), nn.shape[1]), self.bank_codes_[nn].ravel()), 1.0)
        return votes / nn.shape[1]


def _k_smallest_stable(dist: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k smallest entries per row, ascending, equal values in index order."""
    if k == 1:
        return dist.argmin(axis=1)[:, None]  # argmin returns the first of equal minima
    if k < dist.shape[1]:
        kth = np.partition(dist, k - 1, axis=1)[:, k - 1 : k]
        out = np.empty((dist.shape[0], k), dtype=np.int64)
        for i in range(dist.shape[0]):
            candidates = np.flatnonzero(dist[i] <= kth[i, 0])
            order = np.argsort(dist[i, candidates], kind="stable")
            out[i] = candidates[order[:k]]
        return out
    return np.argsort(dist, axis=1, kind="stable")[:, :k]


HEADS = {
    "logistic": LogisticProbe,
    "logistic_cv": LogisticCVProbe,
    "linear_svm": LinearSVMProbe,
    "nearest_centroid": NearestCentroidProbe,
    "cosine_centroid": CosineCentroidProbe,
    "knn": KNNProbe,
    "1nn": KNNProbe,
}


def make_head(name: str, **params) -> ProbeHead:
    """A head by name.

    Parameters
    ----------
    name : str
        One of :data:`HEADS`: logistic, logistic_cv, linear_svm, nearest_centroid, cosine_centroid, knn, 1nn.
    **params
        The head's constructor parameters.

    Returns
    -------
    ProbeHead
        Unfitted.
    """
    if name not in HEADS:
        raise FmauditInputError(f"unknown probe head {name!r}; known heads: {', '.join(sorted(HEADS))}")
    if name == "1nn":
        params = {"k": 1, "metric": "cosine", **params}
        if params["k"] != 1:
            raise FmauditInputError(f"head '1nn' has k=1, got k={params['k']} (use 'knn')")
    try:
        return HEADS[name](**params)
    except TypeError as error:
        raise FmauditInputError(f"probe head {name!r}: {error}") from None

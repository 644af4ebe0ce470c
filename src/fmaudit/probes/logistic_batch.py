"""Batched multinomial logistic regression: many L2 probes fitted at once in torch (CPU or CUDA).

Each problem r is scikit-learn's ``LogisticRegression(C=C_r, solver="lbfgs")`` objective on its own subset
of rows of a shared feature matrix, optionally standardised with that subset's mean and standard deviation
(ddof 0, the ``StandardScaler`` convention: near-constant features get scale 1):

    minimise  C_r * sum_i CE(softmax(x_i W + b), y_i) + 0.5 * ||W||_F^2      (intercept b unpenalised)

Conventions
- Parameters always have K = ``n_classes`` columns. A class absent from a subset is left out of that
  problem's softmax (its column stays 0); at prediction time its logit is ``ABSENT_CLASS_LOGIT_GAP`` below
  the row's smallest present-class logit, so its probability is 0 while logits stay finite (entropies,
  energies and temperature scaling never meet ``0 * inf``).
- A subset with exactly two classes uses scikit-learn's *binary* objective, whose single vector
  v = w_1 - w_0 carries the penalty 0.5 * ||v||^2. With two symmetric columns that penalty is ||W||_F^2, so
  the penalty is doubled for those problems and the fitted probabilities equal scikit-learn's.
- Subsets may repeat rows (a repeated row counts twice, as in scikit-learn on ``X[idx]``).
- Stopping follows scikit-learn's lbfgs semantics: on the rescaled objective
  ``mean CE + ||W||^2 / (2 C n)`` a problem stops when the max-abs gradient (intercepts included, in the
  coordinates of W) is at most ``tol``, or when the objective's relative decrease falls below 64 float64
  epsilons. ``tol=1e-4`` is scikit-learn's default and leaves probabilities up to 0.2-0.3 away from the
  optimum on the 1,024-feature benchmark grid (either optimiser); ``tol=1e-6`` (the default here) leaves
  ~7e-3 there, and max |delta P| <= 1e-3 needs ~1e-7 (scikit-learn) to ~5e-8 (this engine);
  ``tol=1e-8`` agrees with a converged scikit-learn fit to 1e-3 on the small problems of the tests.
- Identical (subset, C) problems are fitted once and shared. Features constant within a subset (a zero
  column once standardised) get weight exactly 0.

How it works (as scikit-learn splits its logistic regression: this module is the estimator level, the
objective is :mod:`~fmaudit.probes._logistic_loss`, the row layouts :mod:`~fmaudit.probes._row_store`, the
solver :mod:`~fmaudit.probes._lbfgs`). The problems are optimised in lock-step by L-BFGS (history 10,
per-problem steps, line searches and stopping; a step is accepted on Armijo's sufficient decrease or on Hager
and Zhang's approximate Wolfe conditions, which rest on the directional derivative and so keep working where
float32 rounding hides f's decrease). Each evaluation runs two matrix products per block of rows, spread
over ``n_threads`` threads on CPU. Given a ``pool`` of worker processes, a CPU call large enough to pay for it
is split by problem over them instead, each share fitted in lock-step on one thread (:func:`problem_shares`;
the probe suite passes :func:`fmaudit.probes.pool.shared_pool`). Two row layouts, picked per call (or share)
by a modelled evaluation cost:
- shared rows: rows stored once, globally standardised, grouped by the set of problems containing them,
  each problem's standardisation folded into its weights, so a row shared by several problems (nested
  label fractions) is read once per evaluation in one wider product;
- groups: one block per distinct subset with its C values side by side (many small, weakly overlapping
  subsets: cell units, seeds, folds), standardised on itself, in one of three forms of the same problem
  picked per subset by a modelled cost (:class:`~fmaudit.probes._row_store.Group`): dense; where a subset has
  fewer distinct rows n than features D, the exact row-space form (n coordinates per class); or the
  whitened form, the coefficients in the eigenbasis of the subset's covariance scaled by
  1 / sqrt(lambda_j + l2) per problem (a fixed preconditioner: the Hessian's data and penalty parts
  balanced), which on CellPath units takes 2-4x fewer L-BFGS iterations to the same optimum. A cell shard's
  fine and coarse calls of a readout share one eigendecomposition per subset
  (:func:`~fmaudit.probes._row_store.reuse_whitened`).
Precision: by default the store and the products are float32 (embeddings are float32 anyway; wide float32
products run ~2x faster than float64) while every sum over rows or blocks, the parameters and the L-BFGS
state are float64; a problem whose float32 gradient meets ``tol`` is confirmed with float64 products, and
one that does not pass, or that float32 rounding stalls, continues in float64, so ``tol`` keeps its
float64 meaning. A warm start (``init``) is checked in float64 first: one that meets ``tol`` is returned
unchanged, and one whose float32 gradient is mostly rounding starts in float64 (float32 steps from there
would wander by an amount that depends on the CPU's rounding). Without ``standardize`` the problems are
solved in the globally rescaled variables V = s * W (the same optimum, penalty ||V / s||^2), which
conditions raw embeddings far better than scikit-learn's lbfgs on the raw features. Things tried that did
not pay (float64, 2 cores): warm starts from the nested smaller fraction or along the C grid (about the same
iterations: 36, 54, 101, 196 from the smaller C against 36, 55, 105, 200 cold on a CellPath unit), larger
L-BFGS histories, per-class subspace minimisation over the last steps (23 instead of 26 passes), Newton-CG.
Measured ratios against scikit-learn at equal accuracy: benchmarks/bench_probe_engine.py (tile grid) and
benchmarks/bench_cell_shard.py (cell shards).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from fmaudit.devices import resolve_device
from fmaudit.io import FmauditInputError
from fmaudit.metrics import softmax_last_axis
from fmaudit.probes._logistic_loss import _deal, cpu_threads
from fmaudit.probes._logistic_path import Problems, solve_grouped, solve_shared
from fmaudit.probes._row_store import grouped_layout_pays

# adapt.methods runs its own torch work under the engine's thread settings.
_cpu_threads = cpu_threads

ABSENT_CLASS_LOGIT_GAP = 1e4


def check_features(X, name: str = "X") -> np.ndarray:
    """Validated features.

    Parameters
    ----------
    X : array-like of shape (N, D)
        Real numbers, finite.
    name : str, default "X"
        What error messages call it.

    Returns
    -------
    ndarray of shape (N, D)
        X itself if floating, else as float64.

    Raises
    ------
    FmauditInputError
        On a wrong shape or dtype, or NaN / infinite rows (naming the first rows).
    """
    X = np.asarray(X)
    if X.ndim != 2:
        raise FmauditInputError(f"{name}: expected a 2-D feature array (n_items, n_features), got shape {X.shape}")
    if not np.issubdtype(X.dtype, np.floating):
        if not np.issubdtype(X.dtype, np.number) or np.issubdtype(X.dtype, np.complexfloating):
            raise FmauditInputError(f"{name}: expected real numeric features, got dtype {X.dtype}")
        X = X.astype(np.float64)
    finite = np.isfinite(X).all(axis=1)
    if not finite.all():
        rows = np.flatnonzero(~finite)
        raise FmauditInputError(
            f"{name}: {rows.size} row(s) contain NaN or infinite features (first rows: {rows[:5].tolist()})"
        )
    return X


def check_labels(y, n_items: int, n_classes: int | None, name: str = "y") -> np.ndarray:
    """Validated class indices.

    Parameters
    ----------
    y : array-like of shape (n_items,)
        Integer class indices (integral floats accepted).
    n_items : int
        The number of feature rows they label.
    n_classes : int or None
        Labels must lie in [0, n_classes); None: any non-negative index.
    name : str, default "y"

    Returns
    -------
    ndarray of int64, shape (n_items,)

    Raises
    ------
    FmauditInputError
        On a wrong shape, a non-integer label, a negative or out-of-range label.
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise FmauditInputError(f"{name}: expected 1-D labels, got shape {y.shape}")
    if y.shape[0] != n_items:
        raise FmauditInputError(f"{name}: {y.shape[0]} labels for {n_items} feature rows")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        integral = np.issubdtype(y.dtype, np.floating) and np.isfinite(y).all() and (y == np.round(y)).all()
        if not integral:
            raise FmauditInputError(f"{name}: labels must be integer class indices 0..K-1, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.size and y.min() < 0:
        raise FmauditInputError(f"{name}: negative label {int(y.min())}; labels are class indices 0..K-1")
    if n_classes is not None and y.size and y.max() >= n_classes:
        raise FmauditInputError(f"{name}: label {int(y.max())} is out of range for n_classes={n_classes}")
    return y


def _subsets_as_indices(subsets, n_items: int) -> list[np.ndarray]:
    if isinstance(subsets, (np.ndarray, torch.Tensor)) and np.asarray(subsets).dtype == bool:
        subsets = np.asarray(subsets)
        if subsets.ndim != 2 or subsets.shape[1] != n_items:
            raise FmauditInputError(f"subsets: a boolean mask must have shape (R, {n_items}), got {subsets.shape}")
        subsets = list(subsets)
    out = []
    for r, s in enumerate(subsets):
        s = np.asarray(s)
        if s.dtype == bool:
            if s.shape != (n_items,):
                raise FmauditInputError(f"subsets[{r}]: boolean mask of shape {s.shape}, expected ({n_items},)")
            s = np.flatnonzero(s)
        elif s.size and not np.issubdtype(s.dtype, np.integer):
            raise FmauditInputError(f"subsets[{r}]: expected integer row indices, got dtype {s.dtype}")
        s = s.astype(np.int64).ravel()
        if s.size == 0:
            raise FmauditInputError(f"subsets[{r}]: empty subset")
        if s.min() < -n_items or s.max() >= n_items:
            raise FmauditInputError(f"subsets[{r}]: row index out of range for {n_items} rows")
        out.append(np.where(s < 0, s + n_items, s))
    return out


class BatchLogistic:
    """R fitted multinomial logistic problems sharing one feature space and label space.

    Made by :func:`fit_logistic_batch`. R problems, D features, K classes.

    Parameters
    ----------
    W, b, mean, scale, present, n_iter, converged, Cs, problem_index
        The fitted arrays, stored as the attributes below with a trailing underscore (``W`` is ``W_``, ...);
        :func:`fit_logistic_batch` builds them.

    Attributes
    ----------
    W_ : ndarray of shape (R, D, K)
    b_ : ndarray of shape (R, K)
        Weights and intercepts acting on the standardised features ``(x - mean_[r]) / scale_[r]``.
    mean_, scale_ : ndarray of shape (R, D)
        Each subset's scaler (0 and 1 when ``standardize=False``).
    present_ : ndarray of bool, shape (R, K)
        The classes seen in each subset.
    n_iter_ : ndarray of int, shape (R,)
        L-BFGS iterations.
    converged_ : ndarray of bool, shape (R,)
        Whether the stopping rule (module doc) was met before ``max_iter``.
    Cs_ : ndarray of shape (R,)
    problem_index_ : ndarray of int, shape (R,)
        The distinct fit each problem shares (identical (subset, C) problems are fitted once).
    """

    def __init__(self, W, b, mean, scale, present, n_iter, converged, Cs, problem_index):
        self.W_ = W
        self.b_ = b
        self.mean_ = mean
        self.scale_ = scale
        self.present_ = present
        self.n_iter_ = n_iter
        self.converged_ = converged
        self.Cs_ = Cs
        self.problem_index_ = problem_index

    @property
    def n_problems(self) -> int:
        """R, the number of problems."""
        return self.W_.shape[0]

    @property
    def n_features_in_(self) -> int:
        """D, the number of features."""
        return self.W_.shape[1]

    @property
    def n_classes_(self) -> int:
        """K, the number of classes."""
        return self.W_.shape[2]

    def decision_logits(self, X, r: int | None = None) -> np.ndarray:
        """Logits of every problem, or of one.

        Parameters
        ----------
        X : array-like of shape (N, D)
            Raw features (each problem applies its own scaler).
        r : int or None, default None
            One problem's index.

        Returns
        -------
        ndarray of shape (R, N, K), or (N, K) for problem ``r``
            The softmax of a row is its probability; an absent class's logit is ``ABSENT_CLASS_LOGIT_GAP``
            below the row's lowest present one.
        """
        X = check_features(X)
        if X.shape[1] != self.n_features_in_:
            raise FmauditInputError(
                f"X has {X.shape[1]} features but the probes were fitted on {self.n_features_in_}"
            )
        problems = np.arange(self.n_problems) if r is None else np.array([int(r)])
        # Folding each scaler into its weights turns R standardise-then-multiply passes into one product.
        W = self.W_[problems] / self.scale_[problems][:, :, None]
        b = self.b_[problems] - np.einsum("rd,rdk->rk", self.mean_[problems], W)
        R, D, K = W.shape
        Z = (X.astype(np.float64, copy=False) @ W.transpose(1, 0, 2).reshape(D, R * K)).reshape(-1, R, K)
        Z = Z.transpose(1, 0, 2) + b[:, None, :]
        absent = ~self.present_[problems]
        if absent.any():
            masked = np.where(absent[:, None, :], np.inf, Z)
            floor = masked.min(axis=2, keepdims=True) - ABSENT_CLASS_LOGIT_GAP
            Z = np.where(absent[:, None, :], floor, Z)
        return Z[0] if r is not None else Z

    def predict_proba(self, X, r: int | None = None) -> np.ndarray:
        """Softmax of :meth:`decision_logits`, (R, N, K) or (N, K).

        Parameters
        ----------
        X : array-like of shape (N, D)
            Raw features (each problem applies its own scaler).
        r : int or None, default None
            One problem's index; None gives every problem.

        Returns
        -------
        ndarray of shape (R, N, K), or (N, K) for problem ``r``
            Rows summing to 1; an absent class gets about 0.
        """
        return softmax_last_axis(self.decision_logits(X, r))

    def predict(self, X, r: int | None = None) -> np.ndarray:
        """Argmax of the logits, (R, N) or (N,); ties go to the lowest class index.

        Parameters
        ----------
        X : array-like of shape (N, D)
            Raw features.
        r : int or None, default None
            One problem's index; None gives every problem.

        Returns
        -------
        ndarray of int, shape (R, N), or (N,) for problem ``r``
            Class indices 0..K-1.
        """
        return self.decision_logits(X, r).argmax(axis=-1)


# Splitting a call's problems over processes (problem_shares). Measured on the PRISM tile grid (16 distinct
# problems of 100-10,000 rows x 1,024 features, 9 classes; 2 cores, 2026-12-03): the lock-step call took
# 3.5 s on 1 thread and 5.2 s with its products spread over 2 threads (between products, the solver's many
# small torch operations each release and retake the GIL, and two threads contending for it ran each other's
# work ~1.7x slower; two such calls in two threads of one process took no less time than one after the
# other), while two processes fitting half the problems each single-threaded took 1.9 s.
# The cost model's constants, measured there: a problem takes ~35 evaluations at tol 2e-7 (554 float32 and
# 35 float64 problem-evaluations for the 16 problems; fewer at the default tol), and the call's 3.6 s over
# those evaluations come to ~3e-10 s per (row x feature x class) evaluated, all of the solver's work
# included; sending a share's rows to a worker costs ~6e-9 s per float32 value (pickling and the pipe, both
# ends), plus ~5 ms per call.
_SECONDS_PER_VALUE_EVALUATION = 3e-10
_EVALUATIONS_PER_FIT = 30
_SECONDS_PER_SENT_VALUE = 6e-9
_SECONDS_PER_SENT_CALL = 5e-3
_SPLIT_MIN_SAVING_S = 0.1


def problem_shares(index_sets: Sequence[np.ndarray], D: int, n_classes: int, workers: int,
                   device: torch.device) -> list[np.ndarray] | None:
    """How :func:`fit_logistic_batch` splits a call's distinct problems over a pool of ``workers`` processes
    on CPU, or None to fit them together in this process.

    Each problem's modelled cost is its rows x D x K; the problems are dealt largest first to the least
    loaded share, at most one share per worker. The split is taken when the modelled fit time it saves (the
    whole call's single-threaded time less its largest share's) exceeds the time to send the other shares'
    rows to worker processes by at least ``_SPLIT_MIN_SAVING_S``. Deterministic: the same problems and
    ``workers`` give the same shares, so the same numbers.

    Parameters
    ----------
    index_sets : sequence of ndarray
        The row indices of each distinct problem.
    D, n_classes : int
        Features and classes.
    workers : int
        The pool's cores (:class:`fmaudit.probes.pool.FitPool`).
    device : torch.device
        Where the call runs; only CPU calls are split.

    Returns
    -------
    list of ndarray or None
        The problem positions of each share (the largest share first), or None.
    """
    if device.type != "cpu" or workers < 2 or len(index_sets) < 2:
        return None
    costs = np.array([idx.size for idx in index_sets], dtype=np.float64) * D * n_classes
    shares = [np.sort(np.array(share)) for share in _deal(costs, min(int(workers), len(index_sets)))]
    if len(shares) < 2:
        return None
    per_fit = _SECONDS_PER_VALUE_EVALUATION * _EVALUATIONS_PER_FIT
    loads = [float(costs[share].sum()) * per_fit for share in shares]
    shares = [shares[i] for i in np.argsort(loads, kind="stable")[::-1]]
    sent = sum(np.unique(np.concatenate([index_sets[u] for u in share])).size * D * _SECONDS_PER_SENT_VALUE
               + _SECONDS_PER_SENT_CALL for share in shares[1:])
    saving = sum(loads) - max(loads) - sent
    return shares if saving >= _SPLIT_MIN_SAVING_S else None


def _fit_shares(X: np.ndarray, y: np.ndarray, index_sets: list[np.ndarray], Cs: np.ndarray, K: int,
                shares: list[np.ndarray], init, pool, engine: dict) -> dict[str, np.ndarray]:
    """Fit each share of the distinct problems as its own single-threaded call, side by side in ``pool``
    (a :class:`~fmaudit.probes.pool.FitPool`; each share gets only its rows); the fitted arrays of every
    distinct problem, in order."""
    futures = []
    for share in shares:
        rows = np.unique(np.concatenate([index_sets[u] for u in share]))
        subsets = [np.searchsorted(rows, index_sets[u]) for u in share]
        start = None if init is None else (init[0][share], init[1][share])
        futures.append(pool.submit(X[rows], y[rows], subsets, Cs[share], K, init=start, **engine))
    U, D = len(index_sets), X.shape[1]
    fitted = dict(W=np.empty((U, D, K)), b=np.empty((U, K)), mean=np.empty((U, D)), scale=np.empty((U, D)),
                  present=np.empty((U, K), dtype=bool), n_iter=np.empty(U, dtype=np.int64),
                  converged=np.empty(U, dtype=bool))
    for share, future in zip(shares, futures):
        model = future.result()
        for name, value in fitted.items():
            value[share] = getattr(model, f"{name}_")
    return fitted


def fit_logistic_batch(
    X,
    y,
    subsets: Sequence[np.ndarray] | np.ndarray,
    Cs: float | Sequence[float] | np.ndarray,
    n_classes: int,
    standardize: bool = True,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    max_iter: int = 1000,
    tol: float = 1e-6,
    history_size: int = 10,
    init: tuple[np.ndarray, np.ndarray] | None = None,
    n_threads: int | None = None,
    layout: str = "auto",
    forms: Sequence[str] | None = None,
    pool=None,
) -> BatchLogistic:
    """Fit R L2 multinomial logistic problems at once (objective and conventions: module docstring).

    Parameters
    ----------
    X : array-like of shape (N, D)
        Features shared by every problem (float32 is kept as is).
    y : array-like of shape (N,)
        Class indices 0..n_classes-1.
    subsets : sequence of R index arrays or boolean masks, or a boolean array of shape (R, N)
        The rows of each problem (a repeated index counts twice).
    Cs : float or array-like of shape (R,)
        Inverse penalty strengths.
    n_classes : int
        K; every result has K columns (module doc: absent classes).
    standardize : bool, default True
        Standardise each subset on itself (scikit-learn's ``StandardScaler``), else raw features.
    device : str, torch.device or None, default None
        None or "cpu", "cuda", or "auto" (CUDA when there is one).
    dtype : {None, torch.float32, torch.float64}, default None
        The row store's and the products' dtype. None: float32 products (embeddings are float32; wide
        float32 products run ~2x faster) with float64 softmax sums, losses and optimiser state; a problem
        whose float32 gradient meets ``tol`` is confirmed by one evaluation with float64 products, and one
        that does not pass, or that float32 can move no further, continues with float64 products, so every
        ``tol`` is reached as in float64. ``torch.float64``: float64 throughout. ``torch.float32``: float32
        products only; a problem stops where float32 makes no more progress (``converged_`` False if that
        is short of ``tol``).
    max_iter : int, default 1000
        L-BFGS iterations per problem at most.
    tol : float, default 1e-6
        scikit-learn's lbfgs stopping tolerance (module doc).
    history_size : int, default 10
        L-BFGS memory.
    init : (W (R, D, K), b (R, K)) or None, default None
        A start in the result's coordinates (standardised features, or raw ones without ``standardize``),
        e.g. a fitted :class:`BatchLogistic`'s ``W_`` and ``b_``; checked in float64 first, so a start that
        meets ``tol`` is returned unchanged.
    n_threads : int or None, default None
        CPU threads its products are spread over (default ``torch.get_num_threads()``); ignored on GPU.
        Several cores pay better through ``pool``.
    layout : {"auto", "shared", "grouped"}, default "auto"
        How rows are laid out (:mod:`fmaudit.probes._row_store`): "auto" picks the cheaper by its cost model;
        the optimum is the same either way.
    forms : sequence of {"dense", "row_space", "whitened"} or None, default None
        The grouped layout's allowed forms of a group (:class:`fmaudit.probes._row_store.Group`); None: the
        cheapest by its cost model; a form a group cannot take (row-space where it has as many rows as
        features; any but dense without ``standardize``) falls back to dense. The optimum is the same in
        every form; the whitened form's preconditioner takes fewer iterations to reach it.
    pool : fmaudit.probes.pool.FitPool or None, default None
        Worker processes (e.g. :func:`fmaudit.probes.pool.shared_pool`): on CPU, a call large enough to pay
        for it is split by problem over ``pool.workers`` processes, each share fitted single-threaded
        (:func:`problem_shares`: the same problems and workers give the same shares, so the same numbers);
        each share's rows are copied to the process that fits it.

    Returns
    -------
    BatchLogistic

    Raises
    ------
    FmauditInputError
        On bad features, labels, subsets (empty, out of range, a single class), Cs, tol, dtype, threads,
        ``init`` shapes or layout.
    """
    X = check_features(X)
    y = check_labels(y, X.shape[0], n_classes)
    if int(n_classes) < 2:
        raise FmauditInputError(f"n_classes={n_classes}: a logistic probe needs at least 2 classes")
    n_classes = int(n_classes)
    index_sets = _subsets_as_indices(subsets, X.shape[0])
    n_problems = len(index_sets)
    if n_problems == 0:
        raise FmauditInputError("subsets: no problems given")
    Cs = np.broadcast_to(np.asarray(Cs, dtype=np.float64), (n_problems,)).copy()
    if not (np.isfinite(Cs).all() and (Cs > 0).all()):
        raise FmauditInputError(f"Cs: every C must be a positive finite number, got {Cs.tolist()}")
    if not (tol >= 0 and max_iter >= 1):
        raise FmauditInputError(f"tol={tol}, max_iter={max_iter}: need tol >= 0 and max_iter >= 1")
    if dtype not in (None, torch.float32, torch.float64):
        raise FmauditInputError(f"dtype={dtype}: expected None, torch.float32 or torch.float64")
    if n_threads is not None and int(n_threads) < 1:
        raise FmauditInputError(f"n_threads={n_threads}: need at least 1")
    device = resolve_device(device)
    n_threads = int(n_threads) if n_threads is not None else torch.get_num_threads()
    # Precision phases: the product dtypes a problem goes through; it moves to the next when stalled.
    phases = {None: (torch.float32, torch.float64), torch.float32: (torch.float32,), torch.float64: (torch.float64,)}[
        dtype
    ]
    D, K = X.shape[1], n_classes

    # Identical (subset, C) pairs share one fit: a fraction-1.0 subset is the same under every seed.
    unique_of: dict[tuple[bytes, float], int] = {}
    problem_index = np.empty(n_problems, dtype=np.int64)
    representatives: list[int] = []
    for r, idx in enumerate(index_sets):
        key = (np.sort(idx).tobytes(), float(Cs[r]))
        if key not in unique_of:
            unique_of[key] = len(representatives)
            representatives.append(r)
        problem_index[r] = unique_of[key]
    unique_sets = [index_sets[r] for r in representatives]
    U = len(unique_sets)

    present = np.zeros((U, K), dtype=bool)
    log_prior = np.zeros((U, K))
    l2 = np.empty(U)
    for u, (r, idx) in enumerate(zip(representatives, unique_sets)):
        counts = np.bincount(y[idx], minlength=K)
        present[u] = counts > 0
        if present[u].sum() < 2:
            raise FmauditInputError(
                f"subsets[{r}]: only class {int(np.flatnonzero(present[u])[0])} is present "
                f"({idx.size} rows); a logistic probe needs at least 2 classes"
            )
        l2[u] = (2.0 if present[u].sum() == 2 else 1.0) / (Cs[r] * idx.size)
        log_p = np.log(np.maximum(counts, 1) / idx.size)
        log_prior[u] = np.where(present[u], log_p - log_p[present[u]].mean(), 0.0)
    if init is not None:
        W0, b0 = (np.asarray(a, dtype=np.float64) for a in init)
        if W0.shape != (n_problems, D, K) or b0.shape != (n_problems, K):
            raise FmauditInputError(
                f"init: expected W of shape {(n_problems, D, K)} and b of shape {(n_problems, K)}, "
                f"got {W0.shape} and {b0.shape}"
            )
        init = W0[representatives], b0[representatives]
    if layout not in ("auto", "shared", "grouped"):
        raise FmauditInputError(f"layout={layout!r}: expected 'auto', 'shared' or 'grouped'")
    if forms is not None:
        forms = tuple(forms)
        unknown = sorted(set(forms) - {"dense", "row_space", "whitened"})
        if unknown or not forms:
            raise FmauditInputError(f"forms={list(forms)}: expected some of 'dense', 'row_space', 'whitened'")
    shares = None
    if pool is not None and pool.parallel:
        shares = problem_shares(unique_sets, D, K, pool.workers, device)
    if shares is not None:
        fitted = _fit_shares(X, y, unique_sets, Cs[representatives], K, shares, init, pool,
                             dict(standardize=standardize, device="cpu", dtype=dtype, max_iter=max_iter, tol=tol,
                                  history_size=history_size, layout=layout, forms=forms))
        pi = problem_index
        return BatchLogistic(**{name: value[pi] for name, value in fitted.items()}, Cs=Cs, problem_index=pi)
    if layout == "auto":
        layout = "grouped" if grouped_layout_pays(unique_sets, y, X.shape[0], D, K, standardize) else "shared"

    problem = Problems(present=present, log_prior=log_prior, l2=l2, init=init, standardize=standardize,
                        device=device, phases=phases, tol=tol, max_iter=max_iter, history_size=history_size,
                        n_threads=n_threads, forms=forms)
    solve = solve_grouped if layout == "grouped" else solve_shared
    with cpu_threads(device, n_threads):
        W, b, mean, scale, n_iter, converged = solve(X, y, unique_sets, problem)
    pi = problem_index
    return BatchLogistic(
        W=W[pi],
        b=b[pi],
        mean=mean[pi],
        scale=scale[pi],
        present=present[pi],
        n_iter=n_iter[pi],
        converged=converged[pi],
        Cs=Cs,
        problem_index=pi,
    )

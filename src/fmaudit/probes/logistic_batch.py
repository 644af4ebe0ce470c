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

How it works: the problems are optimised in lock-step by L-BFGS (history 10, per-problem steps, ring-buffer
histories and convergence; a step is accepted on Armijo's sufficient decrease or on Hager and Zhang's
approximate Wolfe conditions, which rest on the directional derivative and so keep working where float32
rounding hides f's decrease). Rows are stored globally standardised, grouped by the set of problems that
contain them; each problem's own standardisation is folded into its weights, so a row shared by several
problems (nested label fractions, seeds, CV folds) is read once per evaluation in one wider product.
Rows of rare membership patterns are chunked and evaluated for the union of their problems or per
problem, whichever a cost model of the products says is cheaper. An evaluation runs two products per block
(spread over ``n_threads`` threads on CPU) and one element-wise softmax pass over all (row, problem) pairs.
Precision: by default the store and the products are float32 (embeddings are float32 anyway; wide float32
products run ~2x faster than float64) while every sum over rows or blocks, the parameters and the L-BFGS
state are float64; a problem whose float32 gradient meets ``tol`` is confirmed with float64 products, and
one that does not pass, or that float32 rounding stalls, continues in float64, so ``tol`` keeps its
float64 meaning. Without ``standardize`` the problems are solved in the globally rescaled variables
V = s * W (the same optimum, penalty ||V / s||^2), which conditions raw embeddings far better than
scikit-learn's lbfgs on the raw features. Things tried that did not pay on the benchmark grid (float64,
2 cores): warm starts from the nested smaller fraction (same iteration count), larger L-BFGS histories,
and per-class subspace minimisation over the last steps (23 instead of 26 passes). Measured ratios
against scikit-learn at equal accuracy: benchmarks/bench_probe_engine.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch
from scipy import linalg as scipy_linalg

from fmaudit.devices import resolve_device
from fmaudit.io import FmauditInputError
from fmaudit.probes._lbfgs import lbfgs
from fmaudit.probes._logistic_loss import GroupedObjective, SharedRowsObjective, cpu_threads
from fmaudit.probes._row_store import (
    build_blocks,
    build_groups,
    grouped_layout_pays,
    numpy_dtype,
    standardised_store,
    subset_scaler,
)

# adapt.methods runs its own torch work under the engine's thread settings.
_cpu_threads = cpu_threads

ABSENT_CLASS_LOGIT_GAP = 1e4



def softmax_last_axis(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of logits of any shape ((N, K) or (R, N, K)): a probe's ``predict_proba``.

    (:func:`fmaudit.metrics.softmax` is the validated (N, K) form with a temperature, for calibration.)"""
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def check_features(X, name: str = "X") -> np.ndarray:
    """Return X as a 2-D float array; raise FmauditInputError on NaN/inf or a wrong shape."""
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
    """Return y as int64 class indices in [0, n_classes); raise FmauditInputError otherwise."""
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

    Attributes (R problems, D features, K classes): ``W_`` (R, D, K) and ``b_`` (R, K) act on the
    standardised features ``(x - mean_[r]) / scale_[r]`` (``mean_`` 0 and ``scale_`` 1 when
    ``standardize=False``); ``present_`` (R, K) marks the classes seen in each subset; ``n_iter_`` (R,),
    ``converged_`` (R,), ``Cs_`` (R,), and ``problem_index_`` (R,) mapping each problem to the fit it shares.
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
        return self.W_.shape[0]

    @property
    def n_features_in_(self) -> int:
        return self.W_.shape[1]

    @property
    def n_classes_(self) -> int:
        return self.W_.shape[2]

    def decision_logits(self, X, r: int | None = None) -> np.ndarray:
        """Logits (R, N, K), or (N, K) for problem ``r``; the softmax of a row is its predict_proba."""
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
        return softmax_last_axis(self.decision_logits(X, r))

    def predict(self, X, r: int | None = None) -> np.ndarray:
        """Argmax of the logits; ties go to the lowest class index."""
        return self.decision_logits(X, r).argmax(axis=-1)


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
) -> BatchLogistic:
    """Fit R L2 multinomial logistic problems at once (objective and conventions: module docstring).

    ``subsets``: R index arrays (or boolean masks) into the rows of ``X``, or an (R, N) boolean mask.
    ``Cs``: a scalar or (R,) inverse penalty strengths. ``device``: None/"cpu", "cuda" or "auto".
    ``dtype``: the dtype of the row store and the matrix products. None (default): float32 (embeddings are
    stored in float32; wide float32 products run ~2x faster) with float64 softmax, losses, sums and
    optimiser state; a problem whose float32 gradient meets ``tol`` is confirmed by one evaluation with
    float64 products, and one that does not pass, or that float32 can move no further, continues with
    float64 products, so every ``tol`` is reached as in float64. ``torch.float64``: float64 throughout.
    ``torch.float32``: float32 products only; a problem stops where float32 makes no more progress
    (``converged_`` False if that is short of ``tol``). ``init``: optional start (W (R, D, K), b (R, K)) in
    the coordinates of the result (standardised features, or raw ones without ``standardize``), e.g. a
    fitted ``BatchLogistic``'s ``W_`` and ``b_``. ``n_threads``: CPU threads (default
    ``torch.get_num_threads()``); ignored on GPU.
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
    if layout == "auto":
        layout = "grouped" if grouped_layout_pays(unique_sets, y, X.shape[0], D, K, standardize) else "shared"

    problem = _Problems(present=present, log_prior=log_prior, l2=l2, init=init, standardize=standardize,
                        device=device, phases=phases, tol=tol, max_iter=max_iter, history_size=history_size,
                        n_threads=n_threads)
    solve = _solve_grouped if layout == "grouped" else _solve_shared
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


@dataclass
class _Problems:
    """What every layout's solve needs about the U distinct problems (shapes (U, K) and (U,))."""

    present: np.ndarray
    log_prior: np.ndarray
    l2: np.ndarray
    init: tuple[np.ndarray, np.ndarray] | None  # (W (U, D, K), b (U, K)) in the result's coordinates
    standardize: bool
    device: torch.device
    phases: tuple
    tol: float
    max_iter: int
    history_size: int
    n_threads: int

    def tensor(self, a) -> torch.Tensor:
        return torch.as_tensor(a, dtype=torch.float64, device=self.device)

    def start(self, problems: np.ndarray, width: int, coefficients=None) -> torch.Tensor:
        """theta (len(problems), width + 1, K): the given coefficients (width rows) and intercepts of
        ``init``, or the class priors (the intercept-only optimum, a free head start over zeros)."""
        K = self.present.shape[1]
        theta = torch.zeros((problems.size, width + 1, K), dtype=torch.float64, device=self.device)
        if coefficients is not None:
            theta[:, : coefficients.shape[1]] = self.tensor(coefficients)
            theta[:, width] = self.tensor(self.init[1][problems])
        else:
            theta[:, width] = self.tensor(self.log_prior[problems])
        theta.masked_fill_(~torch.as_tensor(self.present[problems], device=self.device)[:, None, :], 0.0)
        return theta

    def run(self, objective, theta) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        try:
            theta, n_iter, converged = lbfgs(objective, theta, tol=self.tol, max_iter=self.max_iter,
                                             history_size=self.history_size, phases=self.phases,
                                             check_start=self.init is not None)
        finally:
            objective.close()
        return theta.cpu().numpy().astype(np.float64), n_iter, converged


def _solve_shared(X, y, unique_sets, problem: _Problems):
    """The shared-rows layout (:mod:`fmaudit.probes._row_store`): one objective over every problem."""
    device, K, D = problem.device, problem.present.shape[1], X.shape[1]
    U = len(unique_sets)
    store_rows, blocks = build_blocks(unique_sets, y, X.shape[0], device)
    store, centre, spread, mean, scale, mu_prime, sigma_prime, constant = standardised_store(
        X, store_rows, blocks, np.array([idx.size for idx in unique_sets]), problem.standardize, torch.float64
    )
    # The store is kept in the first phase's dtype; a float64 phase after float32 reads the float32 rows in
    # float64 (their rounding moves the optimum by ~1e-7 relative, far below any tol's effect).
    store = torch.from_numpy(store.astype(numpy_dtype(problem.phases[0]), copy=False)).to(device)
    if problem.standardize:
        penalty_weight = grad_scale = None
    else:
        # Unstandardised problems are solved in V = spread * W on the globally standardised store: the same
        # optimum with far better conditioning. The penalty ||W||^2 becomes sum_d V_d^2 / spread_d^2, and the
        # stopping test uses the gradient in W (= spread * gradient in V), as scikit-learn would see it.
        penalty_weight = problem.tensor(1.0 / spread**2)
        grad_scale = torch.ones((D + 1, K), dtype=torch.float64, device=device)
        grad_scale[:D] = problem.tensor(spread)[:, None]
        grad_scale = grad_scale.reshape(1, -1)
    objective = SharedRowsObjective(
        store=store,
        blocks=blocks,
        mu=problem.tensor(mu_prime),
        sigma=problem.tensor(sigma_prime),
        present=torch.as_tensor(problem.present, device=device),
        l2=problem.tensor(problem.l2),
        n_features=D,
        n_classes=K,
        penalty_weight=penalty_weight,
        n_threads=problem.n_threads,
        free=torch.as_tensor(~constant, dtype=torch.float64, device=device) if constant.any() else None,
        grad_scale=grad_scale,
    )
    everything = np.arange(U)
    coefficients = None
    if problem.init is not None:
        coefficients, b0 = problem.init
        if not problem.standardize:
            problem.init = coefficients, b0 + np.einsum("d,udk->uk", centre, coefficients)
            coefficients = coefficients * spread[None, :, None]
    theta = problem.start(everything, D, coefficients)
    # A feature constant within a subset is a zero column after standardisation: its weight is exactly 0.
    theta[:, :D].masked_fill_(torch.as_tensor(constant, device=device)[:, :, None], 0.0)
    theta, n_iter, converged = problem.run(objective, theta)
    W, b = theta[:, :D], theta[:, D]
    if not problem.standardize:
        W, b = _from_global_scale(W, b, centre, spread)
    return W, b, mean, scale, n_iter, converged


def _from_global_scale(V, b, centre, spread):
    """Back from V on globally standardised rows to W on raw rows."""
    W = V / spread[None, :, None]
    return W, b - np.einsum("d,udk->uk", centre, W)


def _solve_grouped(X, y, unique_sets, problem: _Problems):
    """The grouped layout (:mod:`fmaudit.probes._row_store`): dense groups in one solve, row-space groups
    (coefficients in n_g instead of D coordinates per class) in another."""
    device, K, D = problem.device, problem.present.shape[1], X.shape[1]
    U = len(unique_sets)
    groups, centre, spread = build_groups(X, y, unique_sets, K, problem.standardize, problem.phases[0], device)
    W = np.zeros((U, D, K))
    b = np.zeros((U, K))
    mean, scale = np.zeros((U, D)), np.ones((U, D))
    n_iter = np.zeros(U, dtype=np.int64)
    converged = np.zeros(U, dtype=bool)
    init_W = None
    if problem.init is not None:
        init_W, b0 = problem.init
        if not problem.standardize:
            problem.init = init_W, b0 + np.einsum("d,udk->uk", centre, init_W)
            init_W = init_W * spread[None, :, None]
    for row_space in (False, True):
        chosen = [g for g in groups if g.row_space == row_space]
        if not chosen:
            continue
        problems = np.concatenate([g.problems for g in chosen])
        local = np.empty(U, dtype=np.int64)
        local[problems] = np.arange(problems.size)
        width = max(g.width for g in chosen)
        local_groups = [replace(g, problems=local[g.problems]) for g in chosen]
        penalty_weight = grad_scale = None
        if not problem.standardize:
            penalty_weight = problem.tensor(1.0 / spread**2)
            grad_scale = torch.ones((width + 1, K), dtype=torch.float64, device=device)
            grad_scale[:D] = problem.tensor(spread)[:, None]
        objective = GroupedObjective(local_groups, torch.as_tensor(problem.present[problems], device=device),
                                     problem.tensor(problem.l2[problems]), width, K, problem.n_threads,
                                     penalty_weight=penalty_weight, grad_scale=grad_scale)
        coefficients = None
        if init_W is not None:
            coefficients = np.zeros((problems.size, width, K))
            for g in chosen:
                rows = local[g.problems]
                if g.row_space:  # B = L^-1 Z W: the start's component in the rows' span
                    ZW = g.basis.double().cpu().numpy() @ init_W[g.problems]
                    coefficients[rows, : g.width] = _solve_lower(g.factor.cpu().numpy(), ZW)
                else:
                    start = init_W[g.problems].copy()
                    start[:, g.constant] = 0.0
                    coefficients[rows] = start
        theta, iters, conv = problem.run(objective, problem.start(problems, width, coefficients))
        n_iter[problems], converged[problems] = iters, conv
        for g in chosen:
            rows = local[g.problems]
            coef, intercept = theta[rows, : g.width], theta[rows, width]
            if g.row_space:  # W = Z^T L^-T B (Group)
                turned = _solve_upper(g.factor.cpu().numpy().T, coef)
                coef = np.einsum("nd,cnk->cdk", g.basis.double().cpu().numpy(), turned)
            W[g.problems], b[g.problems] = coef, intercept
            mean[g.problems], scale[g.problems] = g.mean, g.scale
    if not problem.standardize:
        W, b = _from_global_scale(W, b, centre, spread)
    return W, b, mean, scale, n_iter, converged


def _solve_lower(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """L^-1 B for lower-triangular L (n, n) and B (c, n, K)."""
    c, n, K = B.shape
    out = scipy_linalg.solve_triangular(L, B.transpose(1, 0, 2).reshape(n, c * K), lower=True)
    return out.reshape(n, c, K).transpose(1, 0, 2)


def _solve_upper(U_: np.ndarray, B: np.ndarray) -> np.ndarray:
    """U^-1 B for upper-triangular U (n, n) and B (c, n, K)."""
    c, n, K = B.shape
    out = scipy_linalg.solve_triangular(U_, B.transpose(1, 0, 2).reshape(n, c * K), lower=False)
    return out.reshape(n, c, K).transpose(1, 0, 2)

"""Batched multinomial logistic regression: many L2 probes fitted at once in torch.

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
  optimum on the 1,024-feature benchmark grid (either optimiser); ``tol=1e-6`` leaves under 1e-2 there,
  and ``tol=1e-8`` agrees with a converged scikit-learn fit to 1e-3 on the small problems of the tests.
- Identical (subset, C) problems are fitted once and shared.

How it is fast: the problems are optimised in lock-step by L-BFGS (history 10, backtracking Armijo line
search, per-problem steps, histories and convergence). Rows are stored once, globally standardised; each
problem's own standardisation is folded into its weights, so rows shared by several problems (nested label
fractions, seeds, CV folds) are read once per evaluation in one wider matrix product instead of once per
problem. Without ``standardize`` the problems are solved in the globally rescaled variables V = s * W (the
same optimum, penalty ||V / s||^2), which conditions raw embeddings far better than scikit-learn's lbfgs on
the raw features. Measured ratios: benchmarks/bench_probe_engine.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from fmaudit.devices import resolve_device
from fmaudit.io import FmauditInputError

ABSENT_CLASS_LOGIT_GAP = 1e4

_ARMIJO_C1 = 1e-4
_MAX_LINE_SEARCH = 30
# Rows sharing a problem set are evaluated together when there are at least this many of them; rarer
# membership patterns are evaluated per problem. Blocks are cut at _MAX_BLOCK_ROWS rows to bound memory.
_MIN_SHARED_ROWS = 64
_MAX_BLOCK_ROWS = 4096


def softmax_last_axis(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of logits of any shape ((N, K) or (R, N, K)): a probe's ``predict_proba``.

    (:func:`fmaudit.metrics.softmax` is the validated (N, K) form with a temperature, for calibration.)"""
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # On CPU the skinny (N x D) @ (D x K) products go through numpy: the OpenBLAS that numpy ships ran them
    # 1.5-6x faster than the MKL of torch's CPU wheels on the AMD machines this was measured on
    # (benchmarks/bench_probe_engine.py --matmul-check). The tensors share memory; nothing is copied.
    if a.device.type == "cpu":
        return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))
    return a @ b


@contextlib.contextmanager
def _single_torch_thread_on_cpu(device: torch.device) -> Iterator[None]:
    # The heavy CPU products run in numpy's BLAS threads (see _matmul); torch's OpenMP workers spinning on
    # the same cores for the small element-wise ops made fits 3-4x slower when measured.
    if device.type != "cpu":
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


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


def subset_scaler(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) of ``rows`` as StandardScaler computes them: float64, ddof 0, near-constant -> 1."""
    mean = rows.mean(axis=0, dtype=np.float64)
    var = rows.var(axis=0, dtype=np.float64)
    eps = np.finfo(np.float64).eps
    n = rows.shape[0]
    constant = var <= n * eps * var + (n * mean * eps) ** 2
    scale = np.sqrt(var)
    scale[constant] = 1.0
    return mean, scale


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


@dataclass
class _Block:
    """Rows ``start:stop`` of the row store, evaluated for the problems ``problems`` at once."""

    start: int
    stop: int
    problems: torch.Tensor  # (k,) unique-problem ids
    weights: torch.Tensor  # (n_b, k): multiplicity / n_r, 0 where a row is not in that problem
    y: torch.Tensor  # (n_b,)


class _SharedRowsObjective:
    """Mean cross-entropy + l2/2 ||W||^2 and its gradient, for any set of problems, in standardised coords.

    Rows are stored once, transformed by a global affine map (x - m) / s. Problem r's standardisation
    (x - mu_r) / sigma_r equals (x' - mu'_r) / sigma'_r with mu' = (mu - m) / s and sigma' = sigma / s, so
    its logits are x' (W / sigma') + (b - mu' . W / sigma'); the global map keeps mu' and sigma' near 0 and 1
    and so avoids cancellation in float32.
    """

    def __init__(self, store, blocks, mu, sigma, present, l2, n_features, n_classes, penalty_weight=None):
        self.store = store
        self.blocks = blocks
        self.mu = mu  # (U, D)
        self.sigma = sigma  # (U, D)
        self.present = present  # (U, K) bool
        self.l2 = l2  # (U,)
        self.D = n_features
        self.K = n_classes
        self.penalty_weight = penalty_weight  # (D,) or None: weights of the squared coefficients

    def __call__(self, theta: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """theta (A, D+1, K) for problems ``ids`` (A,) -> objective (A,) float64 and gradient like theta."""
        D, K = self.D, self.K
        A = ids.shape[0]
        device = theta.device
        W, b = theta[:, :D], theta[:, D]
        mu, sigma = self.mu[ids], self.sigma[ids]
        W_fold = W / sigma[:, :, None]
        b_fold = b - torch.einsum("ad,adk->ak", mu, W_fold)
        present = self.present[ids]
        position = torch.full((self.mu.shape[0],), -1, dtype=torch.long, device=device)
        position[ids] = torch.arange(A, device=device)

        loss = torch.zeros(A, dtype=torch.float64, device=device)
        grad_W_fold = torch.zeros_like(W)
        grad_b = torch.zeros_like(b)
        for block in self.blocks:
            local = position[block.problems]
            keep = local >= 0
            if not bool(keep.any()):
                continue
            cols = local[keep]
            weights = block.weights[:, keep]
            X_block = self.store[block.start : block.stop]
            n_b, k = X_block.shape[0], cols.shape[0]
            W_cat = W_fold[cols].permute(1, 0, 2).reshape(D, k * K)
            Z = _matmul(X_block, W_cat).view(n_b, k, K) + b_fold[cols]
            Z.masked_fill_(~present[cols].unsqueeze(0), float("-inf"))
            lse = torch.logsumexp(Z, dim=2)
            rows = torch.arange(n_b, device=device)
            z_true = Z[rows, :, block.y]
            # Rows outside a problem (weight 0) may carry a class absent from it: keep their inf out of the sum.
            row_loss = torch.where(weights > 0, (lse - z_true) * weights, torch.zeros_like(weights))
            loss.index_add_(0, cols, row_loss.sum(dim=0).double())
            G = torch.exp(Z - lse.unsqueeze(2))
            G[rows, :, block.y] -= 1.0
            G *= weights.unsqueeze(2)
            grad_cat = _matmul(X_block.T, G.view(n_b, k * K)).view(D, k, K).permute(1, 0, 2)
            grad_W_fold.index_add_(0, cols, grad_cat)
            grad_b.index_add_(0, cols, G.sum(dim=0))
        l2 = self.l2[ids]
        W_penalised = W if self.penalty_weight is None else W * self.penalty_weight[:, None]
        grad = torch.empty_like(theta)
        grad[:, :D] = (grad_W_fold - mu[:, :, None] * grad_b[:, None, :]) / sigma[:, :, None]
        grad[:, :D] += l2[:, None, None] * W_penalised
        grad[:, D] = grad_b
        value = loss + 0.5 * l2.double() * (W * W_penalised).sum(dim=(1, 2)).double()
        return value, grad


def _build_blocks(index_sets, y, n_rows, device, dtype):
    """Group rows by the set of problems containing them; returns (row ids of the store, blocks)."""
    n_problems = len(index_sets)
    counts = np.zeros((n_problems, n_rows), dtype=np.int32)
    for u, idx in enumerate(index_sets):
        np.add.at(counts[u], idx, 1)
    # A random projection of each row's membership counts names its pattern (int64 arithmetic wraps, which
    # a hash may). A collision would only put rows with different patterns in one block, which the per-row
    # weights still handle exactly.
    projection = np.random.default_rng(0).integers(1, 2**62, size=n_problems, dtype=np.int64)
    signature = np.zeros(n_rows, dtype=np.int64)
    for u in range(n_problems):
        signature += projection[u] * counts[u]
    used = np.flatnonzero(counts.any(axis=0))
    _, pattern, pattern_size = np.unique(signature[used], return_inverse=True, return_counts=True)
    n = np.array([idx.size for idx in index_sets], dtype=np.float64)

    store_rows: list[np.ndarray] = []
    blocks: list[_Block] = []
    offset = 0

    def add(rows: np.ndarray, problems: np.ndarray) -> None:
        nonlocal offset
        for start in range(0, rows.size, _MAX_BLOCK_ROWS):
            chunk = rows[start : start + _MAX_BLOCK_ROWS]
            weights = counts[problems][:, chunk].T / n[problems]
            blocks.append(
                _Block(
                    start=offset,
                    stop=offset + chunk.size,
                    problems=torch.as_tensor(problems, device=device),
                    weights=torch.as_tensor(weights, dtype=dtype, device=device),
                    y=torch.as_tensor(y[chunk], device=device),
                )
            )
            store_rows.append(chunk)
            offset += chunk.size

    order = np.argsort(pattern, kind="stable")
    bounds = np.r_[0, np.cumsum(pattern_size)]
    for p in np.flatnonzero(pattern_size >= _MIN_SHARED_ROWS):
        rows = used[order[bounds[p] : bounds[p + 1]]]
        add(rows, np.flatnonzero(counts[:, rows].any(axis=1)))
    rare = np.zeros(n_rows, dtype=bool)
    rare[used[pattern_size[pattern] < _MIN_SHARED_ROWS]] = True
    for u in range(n_problems):
        rows = np.flatnonzero(rare & (counts[u] > 0))
        if rows.size:
            add(rows, np.array([u]))
    return np.concatenate(store_rows), blocks



def _standardised_store(X, store_rows, blocks, sizes, standardize, dtype):
    """Rows of the store, globally standardised, and every problem's scaler, in one streaming pass.

    Returns (store (T, D) numpy in ``dtype``, centre (D,), spread (D,), mean (U, D), scale (U, D),
    mu' (U, D), sigma' (U, D)); the store is (x - centre) / spread, see _SharedRowsObjective for mu' and
    sigma'. Without ``standardize`` the problems keep raw features (mean 0, scale 1, mu' 0, sigma' 1).
    """
    D = X.shape[1]
    n_problems = sizes.size
    # Any centre and scale near the data's own make mu' and sigma' close to 0 and 1; a sample is enough.
    sample = store_rows[:: max(1, store_rows.size // 4096)]
    centre, spread = subset_scaler(X[sample])
    store = np.empty((store_rows.size, D), dtype=torch.empty(0, dtype=dtype).numpy().dtype)
    first = np.zeros((n_problems, D))
    second = np.zeros((n_problems, D))
    low = np.full((n_problems, D), np.inf)
    high = np.full((n_problems, D), -np.inf)
    for block in blocks:
        rows = X[store_rows[block.start : block.stop]].astype(np.float64)
        rows -= centre
        rows /= spread
        store[block.start : block.stop] = rows
        if not standardize:
            continue
        ids = block.problems.cpu().numpy()
        weights = block.weights.cpu().numpy().astype(np.float64)
        first[ids] += weights.T @ rows
        second[ids] += weights.T @ (rows * rows)
        block_range = None
        for j, u in enumerate(ids):
            member = weights[:, j] > 0
            if member.all():
                if block_range is None:
                    block_range = rows.min(axis=0), rows.max(axis=0)
                row_low, row_high = block_range
            elif member.any():
                row_low, row_high = rows[member].min(axis=0), rows[member].max(axis=0)
            else:
                continue
            np.minimum(low[u], row_low, out=low[u])
            np.maximum(high[u], row_high, out=high[u])
    if not standardize:
        zeros, ones = np.zeros((n_problems, D)), np.ones((n_problems, D))
        return store, centre, spread, zeros, ones, zeros, ones
    # E[x'^2] - E[x']^2 is accurate because x' is centred and scaled near 0 and 1. Features constant within
    # a subset are detected exactly (max == min) and get scale 1, as StandardScaler gives them.
    var_prime = np.maximum(second - first * first, 0.0)
    mean = centre + spread * first
    n = sizes[:, None].astype(np.float64)
    eps = np.finfo(np.float64).eps
    var = spread**2 * var_prime
    constant = (high <= low) | (var <= n * eps * var + (n * mean * eps) ** 2)
    var_prime[constant] = 0.0
    scale = spread * np.sqrt(var_prime)
    scale[constant] = 1.0
    return store, centre, spread, mean, scale, first, scale / spread


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
) -> BatchLogistic:
    """Fit R L2 multinomial logistic problems at once (objective and conventions: module docstring).

    ``subsets``: R index arrays (or boolean masks) into the rows of ``X``, or an (R, N) boolean mask.
    ``Cs``: a scalar or (R,) inverse penalty strengths. ``dtype``: float64 by default; float32 is about twice
    as fast on CPU and reliable down to ``tol`` of about 1e-6 (below that it stops when float32 can make no
    further progress). ``device``: None/"cpu", "cuda" or "auto". ``init``: optional start (W (R, D, K),
    b (R, K)) in the coordinates of the result (standardised features, or raw ones without ``standardize``),
    e.g. a fitted ``BatchLogistic``'s ``W_`` and ``b_``.
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
    device = resolve_device(device)
    dtype = torch.float64 if dtype is None else dtype
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

    store_rows, blocks = _build_blocks(unique_sets, y, X.shape[0], device, dtype)
    store, centre, spread, mean, scale, mu_prime, sigma_prime = _standardised_store(
        X, store_rows, blocks, np.array([idx.size for idx in unique_sets]), standardize, dtype
    )
    store = torch.from_numpy(store).to(device)
    if standardize:
        penalty_weight = grad_scale = None
    else:
        # Unstandardised problems are solved in V = spread * W on the globally standardised store: the same
        # optimum with far better conditioning. The penalty ||W||^2 becomes sum_d V_d^2 / spread_d^2, and the
        # stopping test uses the gradient in W (= spread * gradient in V), as scikit-learn would see it.
        penalty_weight = torch.as_tensor(1.0 / spread**2, dtype=dtype, device=device)
        grad_scale = torch.ones((D + 1, K), dtype=dtype, device=device)
        grad_scale[:D] = torch.as_tensor(spread, dtype=dtype, device=device)[:, None]

    def as_tensor(a):
        return torch.as_tensor(a, dtype=dtype, device=device)

    objective = _SharedRowsObjective(
        store=store,
        blocks=blocks,
        mu=as_tensor(mu_prime),
        sigma=as_tensor(sigma_prime),
        present=torch.as_tensor(present, device=device),
        l2=as_tensor(l2),
        n_features=D,
        n_classes=K,
        penalty_weight=penalty_weight,
    )

    theta = torch.zeros((U, D + 1, K), dtype=dtype, device=device)
    if init is not None:
        W0, b0 = (np.asarray(a, dtype=np.float64) for a in init)
        if W0.shape != (n_problems, D, K) or b0.shape != (n_problems, K):
            raise FmauditInputError(
                f"init: expected W of shape {(n_problems, D, K)} and b of shape {(n_problems, K)}, "
                f"got {W0.shape} and {b0.shape}"
            )
        W0, b0 = W0[representatives], b0[representatives]
        if not standardize:
            b0 = b0 + np.einsum("d,udk->uk", centre, W0)
            W0 = W0 * spread[None, :, None]
        theta[:, :D] = as_tensor(W0)
        theta[:, D] = as_tensor(b0)
    else:
        # The class priors are the optimum of the intercept-only model: a free head start over zeros.
        theta[:, D] = as_tensor(log_prior)
    theta.masked_fill_(~torch.as_tensor(present, device=device)[:, None, :], 0.0)

    with _single_torch_thread_on_cpu(device):
        theta, n_iter, converged = _lbfgs(
            objective, theta, tol=tol, max_iter=max_iter, history_size=history_size, grad_scale=grad_scale
        )

    theta_np = theta.cpu().numpy().astype(np.float64)
    W, b = theta_np[:, :D], theta_np[:, D]
    if not standardize:
        # Back from V on globally standardised rows to W on raw rows.
        W = W / spread[None, :, None]
        b = b - np.einsum("d,udk->uk", centre, W)
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


def _lbfgs(objective, theta: torch.Tensor, tol: float, max_iter: int, history_size: int, grad_scale=None):
    """Lock-step L-BFGS over problems; returns (theta, n_iter (R,), converged (R,)).

    ``grad_scale`` (D+1, K), if given, multiplies the gradient before the max-abs ``tol`` test.
    """
    R = theta.shape[0]
    shape = theta.shape[1:]
    flat = theta.reshape(R, -1).clone()
    dtype, device = flat.dtype, flat.device
    ftol = 64 * np.finfo(np.float64).eps  # scikit-learn passes this to L-BFGS-B whatever the data dtype
    all_ids = torch.arange(R, device=device)
    scale = None if grad_scale is None else grad_scale.reshape(1, -1)

    def small_gradient(grads: torch.Tensor) -> np.ndarray:
        grads = grads if scale is None else grads * scale
        return (grads.abs().amax(dim=1) <= tol).cpu().numpy()

    f, g = objective(flat.view(R, *shape), all_ids)
    f = f.cpu()
    g = g.reshape(R, -1)
    S = torch.zeros((R, history_size, flat.shape[1]), dtype=dtype, device=device)
    Y = torch.zeros_like(S)
    rho = torch.zeros((R, history_size), dtype=dtype, device=device)
    has_history = np.zeros(R, dtype=bool)
    n_iter = np.zeros(R, dtype=np.int64)
    converged = small_gradient(g)
    done = converged.copy()

    for _ in range(max_iter):
        active = np.flatnonzero(~done)
        if active.size == 0:
            break
        a = torch.as_tensor(active, device=device)
        d = -_two_loop(g[a], S[a], Y[a], rho[a])
        gd = (g[a] * d).sum(dim=1)
        # A non-descent direction means the curvature pairs went stale: restart from steepest descent.
        stale = (gd >= 0).cpu().numpy()
        if stale.any():
            for j in np.flatnonzero(stale):
                r = active[j]
                d[j] = -g[r]
                gd[j] = -(g[r] ** 2).sum()
                rho[r] = 0
                has_history[r] = False
        step = torch.ones(active.size, dtype=dtype, device=device)
        first = torch.as_tensor(~has_history[active], device=device)
        step[first] = torch.clamp(1.0 / d[first].norm(dim=1), max=1.0)

        new_f = torch.empty(active.size, dtype=torch.float64)
        new_g = torch.empty((active.size, flat.shape[1]), dtype=dtype, device=device)
        accepted = np.zeros(active.size, dtype=bool)
        gd64 = gd.double().cpu().numpy()
        f_active = f[torch.as_tensor(active)].numpy()
        for _ls in range(_MAX_LINE_SEARCH):
            todo = np.flatnonzero(~accepted)
            if todo.size == 0:
                break
            t_todo = torch.as_tensor(todo, device=device)
            trial = flat[a[t_todo]] + step[t_todo, None] * d[t_todo]
            values, grads = objective(trial.view(todo.size, *shape), a[t_todo])
            values = values.cpu().numpy()
            steps = step[t_todo].double().cpu().numpy()
            ok = np.isfinite(values) & (values <= f_active[todo] + _ARMIJO_C1 * steps * gd64[todo])
            for i, j in enumerate(todo):
                if ok[i]:
                    accepted[j] = True
                    new_f[j] = float(values[i])
                    new_g[j] = grads[i].reshape(-1)
                else:
                    # Minimiser of the quadratic through f(0), f'(0) and f(t), kept within [0.1 t, 0.5 t].
                    t = steps[i]
                    curvature = 2.0 * (values[i] - f_active[j] - t * gd64[j])
                    t_new = -gd64[j] * t * t / curvature if np.isfinite(values[i]) and curvature > 0 else 0.5 * t
                    step[j] = min(max(t_new, 0.1 * t), 0.5 * t)
        for j, r in enumerate(active):
            n_iter[r] += 1
            if not accepted[j]:
                # No decrease found along a descent direction: this precision allows no further progress.
                done[r] = True
                converged[r] = bool(small_gradient(g[r : r + 1])[0])
                continue
            s = step[j] * d[j]
            y_diff = new_g[j] - g[r]
            sy = float((s * y_diff).sum())
            f_old, f_new = float(f[r]), float(new_f[j])
            flat[r] += s
            g[r] = new_g[j]
            f[r] = f_new
            if sy > 1e-10 * float((y_diff * y_diff).sum()):
                S[r] = torch.roll(S[r], -1, dims=0)
                Y[r] = torch.roll(Y[r], -1, dims=0)
                rho[r] = torch.roll(rho[r], -1, dims=0)
                S[r, -1] = s
                Y[r, -1] = y_diff
                rho[r, -1] = 1.0 / sy
                has_history[r] = True
            if small_gradient(g[r : r + 1])[0] or f_old - f_new <= ftol * max(abs(f_old), abs(f_new), 1.0):
                done[r] = converged[r] = True
    return flat.view(R, *shape), n_iter, converged


def _two_loop(g: torch.Tensor, S: torch.Tensor, Y: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """H g for a batch of L-BFGS histories (oldest first; empty slots have rho = 0)."""
    q = g.clone()
    m = S.shape[1]
    alpha = torch.zeros((g.shape[0], m), dtype=g.dtype, device=g.device)
    for i in range(m - 1, -1, -1):
        alpha[:, i] = rho[:, i] * (S[:, i] * q).sum(dim=1)
        q -= alpha[:, i : i + 1] * Y[:, i]
    yy = (Y[:, -1] * Y[:, -1]).sum(dim=1)
    sy = (S[:, -1] * Y[:, -1]).sum(dim=1)
    gamma = torch.where(rho[:, -1] > 0, sy / torch.where(yy > 0, yy, torch.ones_like(yy)), torch.ones_like(sy))
    q *= gamma[:, None]
    for i in range(m):
        beta = rho[:, i] * (Y[:, i] * q).sum(dim=1)
        q += (alpha[:, i] - beta)[:, None] * S[:, i]
    return q

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
# Rows sharing a problem set form their own blocks when there are at least this many of them; rows of
# rarer membership patterns are chunked (_build_blocks). Blocks are cut at _MAX_BLOCK_ROWS rows so that a
# block's rows stay in cache between its two products and its temporaries stay small.
_MIN_SHARED_ROWS = 32
_RARE_CHUNK_ROWS = 256
_MAX_BLOCK_ROWS = 1024


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
def _cpu_threads(device: torch.device, n_threads: int) -> Iterator[None]:
    """On CPU: torch runs single-threaded and BLAS single-threaded when the objective spreads its blocks
    over ``n_threads`` threads of its own (with one thread, BLAS gets that one too)."""
    # Measured: torch's OpenMP workers spinning on the same cores for the small element-wise ops, or OpenBLAS
    # threads splitting skinny products, made fits several times slower than one thread per block.
    if device.type != "cpu":
        yield
        return
    from threadpoolctl import threadpool_limits

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
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
    weights: torch.Tensor  # (k, n_b) float64: multiplicity / n_r, 0 where a row is not in that problem
    y: torch.Tensor  # (n_b,)
    cost: float  # modelled cost of one evaluation, for balancing blocks over threads


@dataclass
class _Layout:
    """Where the (row, problem) pairs of one evaluation sit, for one set of active problems and one dtype.

    Every evaluated block contributes ``n_b * k`` consecutive pairs, row-major over (row, problem), so its
    logits ``X_block @ W_cat`` (n_b, k*K) are a contiguous slice of the evaluation's (T, K) logits and all
    element-wise work runs once over those T pairs instead of once per block. Built once per set of
    problems and reused (the problems still active change only when one finishes).
    """

    parts: list  # (rows of the store in the product dtype, cols (k,) local problem positions, Z slice, G slice)
    local: torch.Tensor  # (T,) local problem position of each pair
    weight: torch.Tensor  # (T,) multiplicity / n of the row in the problem (0 outside it), product dtype
    label: torch.Tensor  # (T, 1) class of the row
    absent: torch.Tensor | None  # (T, K) True where the pair's problem lacks the class; None if none does
    Z: torch.Tensor  # (T, K) logits in the product dtype, filled block by block
    G: torch.Tensor  # (T, K) softmax minus one-hot, times the weight, in the product dtype
    shares: list  # part indices per thread, balanced by modelled cost


class _SharedRowsObjective:
    """Mean cross-entropy + l2/2 ||W||^2 and its gradient, for any set of problems, in standardised coords.

    Rows are stored once per block, transformed by a global affine map (x - m) / s. Problem r's
    standardisation (x - mu_r) / sigma_r equals (x' - mu'_r) / sigma'_r with mu' = (mu - m) / s and
    sigma' = sigma / s, so its logits are x' (W / sigma') + (b - mu' . W / sigma'); the global map keeps mu'
    and sigma' near 0 and 1 and so avoids cancellation in float32.

    Precision: the two matrix products of each block (logits, and the gradient's G^T X) and the
    element-wise softmax run in the ``product_dtype`` asked for, float32 or float64 (a float32 store is read
    in float64 for float64 products); the sums over rows of the losses and of the intercept gradient, the
    sums over blocks of the weight gradient, the parameters and the optimiser state are float64, so float32
    costs ~1e-7 relative error in each logit, probability and block gradient and does not accumulate. On CPU the blocks'
    products are spread over ``n_threads`` threads (each with single-threaded BLAS, see fit_logistic_batch).
    """

    _LAYOUT_CACHE = 32

    def __init__(
        self, store, blocks, mu, sigma, present, l2, n_features, n_classes, penalty_weight, n_threads, free=None
    ):
        self.store = store  # (T, D), float32 or float64
        self.blocks = blocks
        self.mu = mu  # (U, D) float64
        self.sigma = sigma  # (U, D) float64
        self.present = present  # (U, K) bool
        self.l2 = l2  # (U,) float64
        self.D = n_features
        self.K = n_classes
        self.penalty_weight = penalty_weight  # (D,) float64 or None: weights of the squared coefficients
        # (U, D) float64 or None: 0 for features constant within a subset, whose weights stay exactly 0 (their
        # gradient is 0 up to the rounding of x' - mu', which float32 products would otherwise feed in).
        self.free = free
        self.device = mu.device
        self.n_threads = n_threads if self.device.type == "cpu" else 1
        self._pool = None
        if self.n_threads > 1:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=self.n_threads)
        self._layouts: dict[tuple, _Layout] = {}
        self._store_as: dict[torch.dtype, torch.Tensor] = {store.dtype: store}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _store_in(self, dtype: torch.dtype) -> torch.Tensor:
        # A float32 store read in float64 (the float64 phase) is converted once and kept while it is used.
        if dtype not in self._store_as:
            self._store_as[dtype] = self.store.to(dtype)
        return self._store_as[dtype]

    def _layout(self, ids: torch.Tensor, product_dtype: torch.dtype) -> _Layout:
        key = (ids.cpu().numpy().tobytes(), product_dtype)
        layout = self._layouts.get(key)
        if layout is not None:
            return layout
        A, K = ids.shape[0], self.K
        device = self.device
        store = self._store_in(product_dtype)
        position = torch.full((self.mu.shape[0],), -1, dtype=torch.long, device=device)
        position[ids] = torch.arange(A, device=device)
        blocks, local, weight, label, costs = [], [], [], [], []
        for block in self.blocks:
            where = position[block.problems]
            keep = where >= 0
            k = int(keep.sum())
            if k == 0:
                continue
            n_b = block.stop - block.start
            blocks.append((block, where[keep], k))
            local.append(where[keep].repeat(n_b))
            weight.append(block.weights[keep].T.reshape(-1))
            label.append(block.y.repeat_interleave(k))
            costs.append(_block_cost(n_b, k))
        local = torch.cat(local)
        Z = torch.empty((local.shape[0], K), dtype=product_dtype, device=device)
        G = torch.empty_like(Z)
        parts, offset = [], 0
        for block, cols, k in blocks:
            n_b = block.stop - block.start
            pairs = slice(offset, offset + n_b * k)
            parts.append((store[block.start : block.stop], cols, Z[pairs].view(n_b, k * K), G[pairs].view(n_b, k * K)))
            offset += n_b * k
        absent = ~self.present[ids][local]
        # Blocks dealt to threads by modelled cost, largest first, to the least loaded thread.
        loads = [0.0] * self.n_threads
        shares: list[list[int]] = [[] for _ in range(self.n_threads)]
        for i in np.argsort(costs, kind="stable")[::-1]:
            t = loads.index(min(loads))
            shares[t].append(int(i))
            loads[t] += costs[i]
        layout = _Layout(
            parts=parts,
            local=local,
            weight=torch.cat(weight).to(product_dtype),
            label=torch.cat(label).unsqueeze(1),
            absent=absent if bool(absent.any()) else None,
            Z=Z,
            G=G,
            shares=[share for share in shares if share],
        )
        if len(self._layouts) >= self._LAYOUT_CACHE:
            self._layouts.pop(next(iter(self._layouts)))
        self._layouts[key] = layout
        return layout

    def _run(self, fn, shares) -> list:
        if self._pool is None or len(shares) == 1:
            return [fn(share) for share in shares]
        return list(self._pool.map(fn, shares))

    def __call__(self, theta: torch.Tensor, ids: torch.Tensor, product_dtype: torch.dtype):
        """theta (A, D+1, K) float64 for problems ``ids`` (A,) -> objective (A,) and gradient like theta."""
        D, K = self.D, self.K
        A = ids.shape[0]
        device = self.device
        layout = self._layout(ids, product_dtype)
        W, b = theta[:, :D], theta[:, D]
        mu, sigma = self.mu[ids], self.sigma[ids]
        W_fold = W / sigma[:, :, None]
        b_fold = b - torch.einsum("ad,adk->ak", mu, W_fold)
        # (D, A, K): the columns of a block's problems are one index_select away from a (D, k*K) matrix.
        W_product = W_fold.permute(1, 0, 2).to(product_dtype).contiguous()
        parts = layout.parts

        def forward(share):
            for i in share:
                X_block, cols, Z_block, _ = parts[i]
                Z_block.copy_(_matmul(X_block, W_product.index_select(1, cols).view(D, -1)))

        self._run(forward, layout.shares)
        # Element-wise, once over all pairs, in the product dtype; the sums over pairs in float64.
        Z, G, weight = layout.Z, layout.G, layout.weight
        Z += b_fold.to(product_dtype)[layout.local]
        if layout.absent is not None:
            Z.masked_fill_(layout.absent, float("-inf"))
        lse = torch.logsumexp(Z, dim=1)
        z_true = Z.gather(1, layout.label).squeeze(1)
        # Pairs outside a problem (weight 0) may carry a class absent from it: keep their inf out of the sum.
        pair_loss = torch.where(weight > 0, (lse - z_true) * weight, torch.zeros_like(lse))
        loss = torch.zeros(A, dtype=torch.float64, device=device).index_add_(0, layout.local, pair_loss.double())
        torch.sub(Z, lse.unsqueeze(1), out=G)
        G.exp_()
        G.scatter_add_(1, layout.label, torch.full_like(lse, -1.0).unsqueeze(1))
        G *= weight.unsqueeze(1)
        grad_b = torch.zeros((A, K), dtype=torch.float64, device=device).index_add_(0, layout.local, G.double())

        def backward(share):
            # Summed over this thread's blocks in the product dtype (a problem's rows sit in few blocks),
            # then across threads in float64.
            grad_Wt = torch.zeros((A, K, D), dtype=product_dtype, device=device)
            for i in share:
                X_block, cols, _, G_block = parts[i]
                grad_Wt.index_add_(0, cols, _matmul(G_block.T, X_block).view(-1, K, D))
            return grad_Wt.double()

        grad_Wt = sum(self._run(backward, layout.shares))
        l2 = self.l2[ids]
        W_penalised = W if self.penalty_weight is None else W * self.penalty_weight[:, None]
        grad = torch.empty_like(theta)
        grad[:, :D] = (grad_Wt.transpose(1, 2) - mu[:, :, None] * grad_b[:, None, :]) / sigma[:, :, None]
        grad[:, :D] += l2[:, None, None] * W_penalised
        if self.free is not None:
            grad[:, :D] *= self.free[ids][:, :, None]
        grad[:, D] = grad_b
        value = loss + 0.5 * l2 * (W * W_penalised).sum(dim=(1, 2))
        return value, grad


# Modelled cost of evaluating one block row for k problems: reading the row (BLAS packing, memory) plus a
# per-problem part, in units of one problem's products. Fitted to float32 OpenBLAS CPU times of the
# (1024 x 1024) @ (1024 x 9k) and (9k x 1024) @ (1024 x 1024) products on the 2-core benchmark machine (the
# pair for 1 problem ~1.4 us per row, for 16 problems ~9.7 us per row).
_ROW_READ_COST = 1.0
_BLOCK_OVERHEAD_ROWS = 24  # fixed cost of a block (two BLAS calls and ~15 small torch ops), in rows


def _block_cost(n_rows: int, n_problems: int) -> float:
    return (n_rows + _BLOCK_OVERHEAD_ROWS) * (_ROW_READ_COST + n_problems)


def _build_blocks(index_sets, y, n_rows, device):
    """Group rows by the set of problems containing them; returns (row ids of the store, blocks).

    Rows with the same membership pattern form blocks evaluated for all their problems in one pair of wide
    products. Rows of rare patterns (a block would be too small to pay its overhead) are sorted by pattern and
    cut into chunks; each chunk is evaluated either for the union of its problems (rows outside a problem
    get weight 0) or problem by problem, whichever the cost model says is cheaper.
    """
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
            weights = counts[problems][:, chunk] / n[problems][:, None]
            blocks.append(
                _Block(
                    start=offset,
                    stop=offset + chunk.size,
                    problems=torch.as_tensor(problems, device=device),
                    weights=torch.as_tensor(weights, dtype=torch.float64, device=device),
                    y=torch.as_tensor(y[chunk], device=device),
                    cost=_block_cost(chunk.size, problems.size),
                )
            )
            store_rows.append(chunk)
            offset += chunk.size

    order = np.argsort(pattern, kind="stable")
    bounds = np.r_[0, np.cumsum(pattern_size)]
    for p in np.flatnonzero(pattern_size >= _MIN_SHARED_ROWS):
        rows = used[order[bounds[p] : bounds[p + 1]]]
        add(rows, np.flatnonzero(counts[:, rows].any(axis=1)))
    rare = used[pattern_size[pattern] < _MIN_SHARED_ROWS]
    if rare.size:
        # Lexicographic order of membership, largest problems most significant: similar rows end up together.
        by_size = np.argsort(-n, kind="stable")
        rare = rare[np.lexsort((counts[by_size][::-1][:, rare] > 0))[::-1]]
        for start in range(0, rare.size, _RARE_CHUNK_ROWS):
            chunk = rare[start : start + _RARE_CHUNK_ROWS]
            member = counts[:, chunk] > 0
            union = np.flatnonzero(member.any(axis=1))
            per_problem = sum(_block_cost(int(member[u].sum()), 1) for u in union)
            if _block_cost(chunk.size, union.size) <= per_problem:
                add(chunk, union)
            else:
                for u in union:
                    add(chunk[member[u]], np.array([u]))
    return np.concatenate(store_rows), blocks


def _standardised_store(X, store_rows, blocks, sizes, standardize, dtype):
    """Rows of the store, globally standardised, and every problem's scaler, in one streaming pass.

    Returns (store (T, D) numpy in ``dtype``, centre (D,), spread (D,), mean (U, D), scale (U, D),
    mu' (U, D), sigma' (U, D), constant (U, D)); the store is (x - centre) / spread, see
    _SharedRowsObjective for mu' and sigma'; ``constant`` marks features exactly constant within a subset,
    whose standardised column is 0. Without ``standardize`` the problems keep raw features (mean 0, scale
    1, mu' 0, sigma' 1, nothing constant).
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
        weights = block.weights.T.cpu().numpy().astype(np.float64)
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
        return store, centre, spread, zeros, ones, zeros, ones, np.zeros((n_problems, D), dtype=bool)
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
    return store, centre, spread, mean, scale, first, scale / spread, high <= low


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

    store_rows, blocks = _build_blocks(unique_sets, y, X.shape[0], device)
    store, centre, spread, mean, scale, mu_prime, sigma_prime, constant = _standardised_store(
        X, store_rows, blocks, np.array([idx.size for idx in unique_sets]), standardize, torch.float64
    )
    # The store is kept in the first phase's dtype; a float64 phase after float32 reads the float32 rows in
    # float64 (their rounding moves the optimum by ~1e-7 relative, far below any tol's effect).
    store = torch.from_numpy(store.astype(_numpy_dtype(phases[0]), copy=False)).to(device)

    def as_tensor(a):
        return torch.as_tensor(a, dtype=torch.float64, device=device)

    if standardize:
        penalty_weight = grad_scale = None
    else:
        # Unstandardised problems are solved in V = spread * W on the globally standardised store: the same
        # optimum with far better conditioning. The penalty ||W||^2 becomes sum_d V_d^2 / spread_d^2, and the
        # stopping test uses the gradient in W (= spread * gradient in V), as scikit-learn would see it.
        penalty_weight = as_tensor(1.0 / spread**2)
        grad_scale = torch.ones((D + 1, K), dtype=torch.float64, device=device)
        grad_scale[:D] = as_tensor(spread)[:, None]

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
        n_threads=n_threads,
        free=torch.as_tensor(~constant, dtype=torch.float64, device=device) if constant.any() else None,
    )

    theta = torch.zeros((U, D + 1, K), dtype=torch.float64, device=device)
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
    # A feature constant within a subset is a zero column after standardisation: its weight is exactly 0.
    theta[:, :D].masked_fill_(torch.as_tensor(constant, device=device)[:, :, None], 0.0)

    try:
        with _cpu_threads(device, n_threads):
            theta, n_iter, converged = _lbfgs(
                objective, theta, tol=tol, max_iter=max_iter, history_size=history_size, grad_scale=grad_scale,
                phases=phases,
            )
    finally:
        objective.close()

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


def _numpy_dtype(dtype: torch.dtype):
    return torch.empty(0, dtype=dtype).numpy().dtype


# Line search: Armijo sufficient decrease, or Hager & Zhang's approximate Wolfe conditions (their eq. 4.1,
# delta 0.1, sigma 0.9, energy tolerance eps |f|), which rest on the directional derivative and so still
# accept good steps where rounding hides the decrease of f (float32 products near the optimum).
_ARMIJO_C1 = 1e-4
_WOLFE_DELTA, _WOLFE_SIGMA = 0.1, 0.9
_ENERGY_EPS = {torch.float32: 1e-6, torch.float64: 1e-12}
# Trial steps before a problem is deemed stalled: in float32 it then moves on to float64 products.
_MAX_LINE_SEARCH = {torch.float32: 6, torch.float64: 30}


def _lbfgs(objective, theta, tol, max_iter, history_size, grad_scale=None, phases=(torch.float64,)):
    """Lock-step L-BFGS over problems; returns (theta, n_iter (R,), converged (R,)).

    Each problem has its own history, step and stopping, as scikit-learn's lbfgs on that problem alone: it
    stops when the max-abs gradient (times ``grad_scale`` (D+1, K) if given) is at most ``tol``, or, in
    float64, when f decreases by less than 64 float64 epsilons (relative). ``phases`` are the product dtypes
    a problem goes through: when a phase stalls (no acceptable step, or no decrease) the problem continues
    from the same point, and with the same history, in the next phase.
    """
    R = theta.shape[0]
    shape = theta.shape[1:]
    x = theta.reshape(R, -1).clone()
    P = x.shape[1]
    device = x.device
    ftol = 64 * np.finfo(np.float64).eps  # scikit-learn passes this to L-BFGS-B whatever the data dtype
    scale = None if grad_scale is None else grad_scale.reshape(1, -1)
    last_phase = len(phases) - 1
    phase = np.zeros(R, dtype=np.int64)

    def gradient_norm(grads: torch.Tensor) -> np.ndarray:
        grads = grads if scale is None else grads * scale
        return grads.abs().amax(dim=1).cpu().numpy()

    f = torch.empty(R, dtype=torch.float64, device=device)
    g = torch.empty_like(x)

    def evaluate(points: torch.Tensor, problems: np.ndarray, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(problems, device=device)
        values, grads = objective(points.view(len(problems), *shape), ids, dtype)
        return values, grads.reshape(len(problems), P)

    def refresh(problems: np.ndarray) -> None:
        """f and g of ``problems`` at x in their current phase (after a change of phase)."""
        for p in np.unique(phase[problems]):
            group = problems[phase[problems] == p]
            values, grads = evaluate(x[group], group, phases[p])
            f[group], g[group] = values, grads

    refresh(np.arange(R))
    # Histories are ring buffers: problem r's newest pair is in slot newest[r]; empty slots have rho = 0.
    S = torch.zeros((R, history_size, P), dtype=torch.float64, device=device)
    Y = torch.zeros_like(S)
    rho = torch.zeros((R, history_size), dtype=torch.float64, device=device)
    newest = torch.full((R,), history_size - 1, dtype=torch.long, device=device)
    has_history = np.zeros(R, dtype=bool)
    n_iter = np.zeros(R, dtype=np.int64)
    converged = np.zeros(R, dtype=bool)
    done = np.zeros(R, dtype=bool)

    def advance_phase(problems: np.ndarray) -> None:
        """Problems stalled, or meeting tol, in their phase: on to the next phase (f and g evaluated there,
        and tol checked again) if there is one, else stop."""
        final = problems[phase[problems] == last_phase]
        done[final] = True
        converged[final] = gradient_norm(g[final]) <= tol
        later = problems[phase[problems] < last_phase]
        if later.size:
            phase[later] += 1
            refresh(later)
            check_tol(later)

    def check_tol(problems: np.ndarray) -> np.ndarray:
        """Problems whose gradient meets tol stop in the last phase; in an earlier one, the next phase
        confirms it (a float32 gradient is not trusted to certify tol on its own)."""
        met = gradient_norm(g[problems]) <= tol
        final = met & (phase[problems] == last_phase)
        done[problems[final]] = converged[problems[final]] = True
        advance_phase(problems[met & ~final])
        return met

    check_tol(np.arange(R))

    for _ in range(max_iter):
        active_all = np.flatnonzero(~done)
        if active_all.size == 0:
            break
        for p in np.unique(phase[active_all]):
            active = active_all[phase[active_all] == p]
            dtype = phases[p]
            a = torch.as_tensor(active, device=device)
            d = -_two_loop(g[a], S, Y, rho, a, newest)
            gd = (g[a] * d).sum(dim=1)
            # A non-descent direction means the curvature pairs went stale: restart from steepest descent.
            stale = gd >= 0
            if bool(stale.any()):
                d[stale] = -g[a[stale]]
                gd[stale] = -(g[a[stale]] ** 2).sum(dim=1)
                rho[a[stale]] = 0
                has_history[active[stale.cpu().numpy()]] = False
            step = torch.ones(active.size, dtype=torch.float64, device=device)
            first = torch.as_tensor(~has_history[active], device=device)
            step[first] = torch.clamp(1.0 / d[first].norm(dim=1), max=1.0)

            new_f = torch.empty(active.size, dtype=torch.float64, device=device)
            new_g = torch.empty((active.size, P), dtype=torch.float64, device=device)
            accepted = np.zeros(active.size, dtype=bool)
            f0 = f[a].cpu().numpy()
            gd0 = gd.cpu().numpy()
            for _trial in range(_MAX_LINE_SEARCH[dtype]):
                todo = np.flatnonzero(~accepted)
                if todo.size == 0:
                    break
                t_todo = torch.as_tensor(todo, device=device)
                values, grads = evaluate(x[a[t_todo]] + step[t_todo, None] * d[t_todo], active[todo], dtype)
                slopes = (grads * d[t_todo]).sum(dim=1).cpu().numpy()
                values_np = values.cpu().numpy()
                steps = step[t_todo].cpu().numpy()
                finite = np.isfinite(values_np)
                armijo = values_np <= f0[todo] + _ARMIJO_C1 * steps * gd0[todo]
                approximate_wolfe = (
                    (values_np <= f0[todo] + _ENERGY_EPS[dtype] * np.abs(f0[todo]))
                    & (slopes >= _WOLFE_SIGMA * gd0[todo])
                    & (slopes <= (2 * _WOLFE_DELTA - 1) * gd0[todo])
                )
                ok = finite & (armijo | approximate_wolfe)
                ok_t = torch.as_tensor(ok, device=device)
                accepted[todo[ok]] = True
                new_f[t_todo[ok_t]] = values[ok_t]
                new_g[t_todo[ok_t]] = grads[ok_t]
                # Rejected: minimiser of the quadratic through f(0), f'(0) and f(t), kept within [0.1 t, 0.5 t].
                t = steps[~ok]
                curvature = 2.0 * (values_np[~ok] - f0[todo[~ok]] - t * gd0[todo[~ok]])
                with np.errstate(invalid="ignore", divide="ignore"):
                    t_new = np.where(finite[~ok] & (curvature > 0), -gd0[todo[~ok]] * t * t / curvature, 0.5 * t)
                step[t_todo[~ok_t]] = torch.as_tensor(np.clip(t_new, 0.1 * t, 0.5 * t), device=device)

            n_iter[active] += 1
            advance_phase(active[~accepted])  # no acceptable step along a descent direction: stalled
            acc = np.flatnonzero(accepted)
            if acc.size == 0:
                continue
            rows, acc_t = active[acc], torch.as_tensor(acc, device=device)
            rows_t = torch.as_tensor(rows, device=device)
            s = step[acc_t, None] * d[acc_t]
            y_diff = new_g[acc_t] - g[rows_t]
            f_old, f_new = f[rows_t].cpu().numpy(), new_f[acc_t].cpu().numpy()
            x[rows_t] += s
            g[rows_t] = new_g[acc_t]
            f[rows_t] = new_f[acc_t]
            sy = (s * y_diff).sum(dim=1)
            keep = (sy > 1e-10 * (y_diff * y_diff).sum(dim=1)).cpu().numpy()
            if keep.any():
                k_rows = torch.as_tensor(rows[keep], device=device)
                k_acc = torch.as_tensor(np.flatnonzero(keep), device=device)
                newest[k_rows] = (newest[k_rows] + 1) % history_size
                slots = newest[k_rows]
                S[k_rows, slots] = s[k_acc]
                Y[k_rows, slots] = y_diff[k_acc]
                rho[k_rows, slots] = 1.0 / sy[k_acc]
                has_history[rows[keep]] = True
            # Too small a decrease: scikit-learn's stop in float64; in float32, rounding's limit (stalled).
            no_progress = f_old - f_new <= ftol * np.maximum(np.maximum(np.abs(f_old), np.abs(f_new)), 1.0)
            met = check_tol(rows)
            no_progress &= ~met
            if dtype == torch.float64:  # scikit-learn's relative-reduction stop counts as converged
                done[rows[no_progress]] = converged[rows[no_progress]] = True
            else:  # float32 rounding's limit: the next phase, or a stop that is converged only if tol is met
                advance_phase(rows[no_progress])
    return x.view(R, *shape), n_iter, converged


def _two_loop(g, S, Y, rho, rows, newest) -> torch.Tensor:
    """H g for the L-BFGS histories of problems ``rows`` (A,): ring buffers S, Y (R, m, P) and rho (R, m)
    with the newest pair of problem r in slot ``newest[r]``; empty slots have rho = 0."""
    m = S.shape[1]
    # Problems that accepted every step together share their slots: plain slices then, no gathers.
    in_step = rows.shape[0] == S.shape[0] and bool((newest == newest[0]).all())

    def pair(i: int):
        if in_step:
            slot = int((newest[0] - i) % m)
            return S[:, slot], Y[:, slot], rho[:, slot]
        slot = (newest[rows] - i) % m
        return S[rows, slot], Y[rows, slot], rho[rows, slot]

    q = g.clone()
    alpha = []
    for i in range(m):  # newest to oldest
        s_i, y_i, rho_i = pair(i)
        a_i = rho_i * (s_i * q).sum(dim=1)
        q -= a_i[:, None] * y_i
        alpha.append(a_i)
    s_0, y_0, rho_0 = pair(0)
    yy = (y_0 * y_0).sum(dim=1)
    sy = (s_0 * y_0).sum(dim=1)
    gamma = torch.where(rho_0 > 0, sy / torch.where(yy > 0, yy, torch.ones_like(yy)), torch.ones_like(sy))
    q *= gamma[:, None]
    for i in range(m - 1, -1, -1):  # oldest to newest
        s_i, y_i, rho_i = pair(i)
        beta = rho_i * (y_i * q).sum(dim=1)
        q += (alpha[i] - beta)[:, None] * s_i
    return q

"""How the batched logistic engine lays out its rows: shared blocks, or one group per distinct subset.

Two layouts (the engine picks one per call, :func:`grouped_layout_pays`):
- *Shared rows*: rows with the same membership pattern (the set of problems containing them) form blocks
  evaluated for all their problems in one pair of wide products; rows of rare patterns are chunked
  (:func:`build_blocks`). The store holds the rows once, globally standardised, and every problem's own
  scaler is computed in the same pass (:func:`standardised_store`) and folded into its weights. Best where
  subsets nest and overlap heavily (label fractions of one training set).
- *Groups*: the problems fitted on one subset (the C values of a grid) form a group holding that subset's
  distinct rows (rows of identical features merged, their labels kept as class weights:
  :func:`merge_identical_rows`), standardised on the subset itself (:func:`build_groups`): one pair of
  products per group, no folding, rows copied once per subset. Best for many small, weakly overlapping
  subsets (cell units, folds, seeds). A group holds its problem in one of three forms (:class:`Group`, picked by
  :func:`group_form`'s modelled cost): dense; where a subset has fewer distinct rows n than features D, the
  exact row-space form (the optimum's weights lie in the span of the subset's rows: n coordinates per class
  on an n x n factor of the rows' Gram matrix); or the whitened form, the coefficients in the eigenbasis of
  the subset's covariance, rescaled per problem so that L-BFGS sees a better-conditioned Hessian (a fixed
  preconditioner; min(n, D) coordinates per class).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from scipy.linalg import blas as scipy_blas

# Rows sharing a problem set form their own blocks when there are at least this many of them; rows of
# rarer membership patterns are chunked (build_blocks). Blocks are cut at _MAX_BLOCK_ROWS rows so that a
# block's rows stay in cache between its two products and its temporaries stay small.
_MIN_SHARED_ROWS = 32
_RARE_CHUNK_ROWS = 256
_MAX_BLOCK_ROWS = 1024

def subset_scaler(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The standardisation of ``rows`` as scikit-learn's ``StandardScaler`` computes it.

    Parameters
    ----------
    rows : ndarray of shape (N, D)

    Returns
    -------
    (mean, scale) : tuple of float64 ndarrays of shape (D,)
        Column means and standard deviations (ddof 0); a near-constant column gets scale 1.
    """
    mean = rows.mean(axis=0, dtype=np.float64)
    var = rows.var(axis=0, dtype=np.float64)
    eps = np.finfo(np.float64).eps
    n = rows.shape[0]
    constant = var <= n * eps * var + (n * mean * eps) ** 2
    scale = np.sqrt(var)
    scale[constant] = 1.0
    return mean, scale


@dataclass
class Block:
    """Rows ``start:stop`` of the row store, evaluated for the problems ``problems`` at once."""

    start: int
    stop: int
    problems: torch.Tensor  # (k,) unique-problem ids
    weights: torch.Tensor  # (k, n_b) float64: multiplicity / n_r, 0 where a row is not in that problem
    y: torch.Tensor  # (n_b,)
    cost: float  # modelled cost of one evaluation, for balancing blocks over threads


# Modelled cost of evaluating one block row for k problems: reading the row (BLAS packing, memory) plus a
# per-problem part, in units of one problem's products. Fitted to float32 OpenBLAS CPU times of the
# (1024 x 1024) @ (1024 x 9k) and (9k x 1024) @ (1024 x 1024) products on the 2-core benchmark machine (the
# pair for 1 problem ~1.4 us per row, for 16 problems ~9.7 us per row).
_ROW_READ_COST = 1.0
_BLOCK_OVERHEAD_ROWS = 24  # fixed cost of a block (two BLAS calls and ~15 small torch ops), in rows


def block_cost(n_rows: int, n_problems: int) -> float:
    return (n_rows + _BLOCK_OVERHEAD_ROWS) * (_ROW_READ_COST + n_problems)


def build_blocks(index_sets, y, n_rows, device):
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
    blocks: list[Block] = []
    offset = 0

    def add(rows: np.ndarray, problems: np.ndarray) -> None:
        nonlocal offset
        for start in range(0, rows.size, _MAX_BLOCK_ROWS):
            chunk = rows[start : start + _MAX_BLOCK_ROWS]
            weights = counts[problems][:, chunk] / n[problems][:, None]
            blocks.append(
                Block(
                    start=offset,
                    stop=offset + chunk.size,
                    problems=torch.as_tensor(problems, device=device),
                    weights=torch.as_tensor(weights, dtype=torch.float64, device=device),
                    y=torch.as_tensor(y[chunk], device=device),
                    cost=block_cost(chunk.size, problems.size),
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
            per_problem = sum(block_cost(int(member[u].sum()), 1) for u in union)
            if block_cost(chunk.size, union.size) <= per_problem:
                add(chunk, union)
            else:
                for u in union:
                    add(chunk[member[u]], np.array([u]))
    return np.concatenate(store_rows), blocks


def standardised_store(X, store_rows, blocks, sizes, standardize, dtype):
    """Rows of the store, globally standardised, and every problem's scaler, in one streaming pass.

    Returns (store (T, D) numpy in ``dtype``, centre (D,), spread (D,), mean (U, D), scale (U, D),
    mu' (U, D), sigma' (U, D), constant (U, D)); the store is (x - centre) / spread, see
    SharedRowsObjective for mu' and sigma'; ``constant`` marks features exactly constant within a subset,
    whose standardised column is 0. Without ``standardize`` the problems keep raw features (mean 0, scale
    1, mu' 0, sigma' 1, nothing constant).
    """
    D = X.shape[1]
    n_problems = sizes.size
    # Any centre and scale near the data's own make mu' and sigma' close to 0 and 1; a sample is enough.
    sample = store_rows[:: max(1, store_rows.size // 4096)]
    centre, spread = subset_scaler(X[sample])
    store = np.empty((store_rows.size, D), dtype=numpy_dtype(dtype))
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




@dataclass
class Group:
    """One distinct subset (its distinct rows, each once, weighted by multiplicity / subset size; rows of
    identical features are one row whose ``targets`` split its weight by its copies' labels) and the
    problems fitted on it.

    Dense: ``features`` (n, D) are the rows standardised on the subset (``standardize``; a feature constant
    within the subset is a zero column) or globally (centre, spread; without ``standardize``).

    Row-space (``standardize`` and n < D): the standardised rows Z are centred with the rows' weights w, so
    Z^T u = 0 for u = w / |w|. With A = [Z, sqrt(c) u] (c the rows' mean squared norm) and A A^T = L L^T
    (Cholesky), Q = A^T L^-T has orthonormal columns and its last row q (= sqrt(c) L^-1 u, a unit vector) is
    the one direction of coefficient space that the original problem lacks. The problem on features L with
    coefficients B (n, K) kept orthogonal to q (the gradient is projected; a start W0 maps to L^-1 Z W0,
    already orthogonal) and the same penalty ||B||^2 is the original one turned by Q: W = Z^T L^-T B. L-BFGS
    is invariant under that turn (its iterates from such a start stay in the span), so it takes the same
    steps in n instead of D coordinates per class.

    Whitened (``standardize``): a fixed preconditioner per problem. With the rows' weighted covariance
    Z^T diag(w) Z = V diag(lambda) V^T (eigenvalues below 1e-11 of the largest dropped: the rows' centring
    direction, constant features, exact collinearity; r = the rank, at most min(n, D)), problem u's
    coefficients are W = V diag(a_u) B with a_uj = 1 / sqrt(kappa lambda_j + max(l_u, mean lambda)) (l_u its
    penalty), its logits (Z V)(a_u * B) and its penalty ||W||^2 = sum_j a_uj^2 ||B_j||^2. Any positive a gives
    the same problem, and the optimum's W lies in the span of V (its gradient always does); this a shrinks
    the directions of large variance, where the Hessian's data part (about kappa lambda_j along v_j) is
    largest, and leaves those below the mean variance about as they are (stretching them to the penalty's
    scale made L-BFGS slower on strongly collinear features). L-BFGS then takes 1.2-4x fewer iterations
    (measured: the constants below). The rows Z V (n x r, r <= min(n, D)) are shared by the group's
    problems: a_u scales each problem's coefficients before the products and its gradient after.
    """

    problems: np.ndarray  # (c,) problem ids (local to the objective that evaluates the group)
    rows: np.ndarray  # (n,) distinct row ids of X (one per distinct feature row: merge_identical_rows)
    weight: torch.Tensor  # (n,) float64: multiplicity / subset size
    y: torch.Tensor  # (n,) int64 labels
    features: torch.Tensor  # (n, p) in the store dtype: standardised rows (p = D) or the factor L (p = n)
    mean: np.ndarray  # (D,) the subset's scaler (0 and 1 without standardize)
    scale: np.ndarray
    constant: np.ndarray  # (D,) bool: features constant within the subset
    # (n, K) float64: each row's weight per class, where rows of identical features but different labels were
    # merged (their columns sum to ``weight``); None: each row has its one label ``y``
    targets: torch.Tensor | None = None
    basis: torch.Tensor | None = None  # row-space: (n, D) standardised rows Z, store dtype
    factor: torch.Tensor | None = None  # row-space: (n, n) float64 L
    augment: float = 0.0  # row-space: c
    constant_direction: torch.Tensor | None = None  # row-space: (n,) float64 q = sqrt(c) L^-1 u
    # whitened: (D, r) float64 V, orthonormal columns spanning the subset's standardised rows (zero on its
    # constant features), and (r,) float64 their eigenvalues; ``features`` holds the rows Z V
    eigenbasis: torch.Tensor | None = None
    eigenvalues: torch.Tensor | None = None
    whitened64: torch.Tensor | None = None  # whitened: the rows Z V in float64, for the float64 phase
    _weights: dict | None = None  # weight in each product dtype, made on first use

    def weight_in(self, dtype: torch.dtype) -> torch.Tensor:
        if self._weights is None:
            self._weights = {}
        if dtype not in self._weights:
            self._weights[dtype] = self.weight.to(dtype)
        return self._weights[dtype]

    @property
    def row_space(self) -> bool:
        return self.factor is not None

    @property
    def whitened(self) -> bool:
        return self.eigenbasis is not None

    @property
    def turned(self) -> bool:
        """Whether W's gradient is a map of the group's coordinates' (row-space or whitened)."""
        return self.row_space or self.whitened

    @property
    def form(self) -> str:
        """``dense``, ``row_space`` or ``whitened``."""
        return "row_space" if self.row_space else "whitened" if self.whitened else "dense"

    def stretch(self, l2: torch.Tensor) -> torch.Tensor:
        """Whitened form: a (len(l2), r) float64, 1 / sqrt(kappa lambda_j + max(l, mean lambda)) for each
        penalty l (:class:`Group`)."""
        floor = torch.clamp(l2[:, None], min=_WHITEN_FLOOR * float(self.eigenvalues.mean()))
        return torch.rsqrt(_WHITEN_KAPPA * self.eigenvalues[None, :] + floor)

    def features_in(self, dtype: torch.dtype) -> torch.Tensor:
        """The features the products read in ``dtype``: in float64 the row-space form's factor and the
        whitened form's float64 rows, else the stored features, converted once where ``dtype`` is not theirs
        (dense float32 rows read in float64 move the optimum by ~1e-7 relative)."""
        if dtype == torch.float64 and self.row_space:
            return self.factor
        if dtype == torch.float64 and self.whitened:
            return self.whitened64
        if self.features.dtype == dtype:
            return self.features
        if self._weights is None:
            self._weights = {}
        key = ("features", dtype)
        if key not in self._weights:
            self._weights[key] = self.features.to(dtype)
        return self._weights[key]

    @property
    def width(self) -> int:
        return int(self.features.shape[1])


# Row-space form: a subset of n distinct rows uses it where its modelled cost is lower than the dense
# form's, in float32 product flops. Per evaluation the two products cost 4 n D w flops dense and 4 n n w in
# the row-space form (w = problems x classes columns), and the two-loop recursion ~4 m flops per coordinate
# (D or n per class and problem), memory-bound, weighted _STATE_COST. Once per subset the row-space form pays
# the float64 Gram matrix and Cholesky factor (2 n^2 D + n^3 / 3 flops) and, near convergence, exact checks
# of the stopping gradient (a float64 n x D product each, about _ROW_SPACE_CHECKS per problem); float64 flops
# weigh _FLOAT64_COST. _EXPECTED_EVALUATIONS: about the median evaluations per problem on the benchmark
# shards (benchmarks/bench_cell_shard.py); the weights were measured on the 2-core benchmark machine.
_EXPECTED_EVALUATIONS = 100
_ROW_SPACE_CHECKS = 15
_FLOAT64_COST = 2.2
_STATE_COST = 4.0
_HISTORY = 10


# Whitened form. kappa: the data Hessian's modelled weight per unit of covariance; the floor of the penalty
# term, in units of the mean eigenvalue. The most L-BFGS iterations of any problem (tol 1e-7 to 2e-7) on four
# synthetic sets (Gaussian classes; rank-6 latent classes behind 60 nearly collinear features; a power-law
# spectrum at D 60 and 384) and five engine calls of benchmarks/bench_cell_shard.py's simulated panel (IS
# and LOOO units, D 384 and 768, 9 and 3 classes): dense 26, 243, 36, 89 | 403, 65, 151, 393, 325; kappa 1
# without a floor 43, 308, 137, 666 | 180, 63, 85, 101, 80; kappa 1, floor 0.1: 32, 86, 48, 103 | 151, 59,
# 74, 100, 77; floor 1: 25, 104, 31, 42 | 121, 49, 58, 127, 88; kappa 0.5 and 2 did no better.
_WHITEN_KAPPA = 1.0
_WHITEN_FLOOR = 1.0
_WHITEN_DROP = 1e-11

# Tried and not kept (problems of a CellPath IS unit's engine calls, tol 2e-7, L-BFGS iterations): a
# class-aware stretch a_jk = 1 / sqrt(lambda_j mu_k + l), the classes turned to the eigenbasis of the
# subset's diag(pi) - pi pi^T (the Hessian at the start), cut them only at C = 1e-3 (29 -> 5) and not at all
# from C = 0.1 on, where most of them are spent; the same class factor taken from the current probabilities
# at each iteration, as L-BFGS's initial Hessian, did likewise (C = 1: 46 -> 52); a floor of l / mean(mu)
# instead of l gave 4% fewer and no less time; the intercept scaled by 0.25 to 6 gave 1.4-2.7x more.

# The forms' modelled costs (group_form), in float32 product flops on the 2-core benchmark machine: the two
# products per evaluation (4 n p w for p coordinates and w = problems x classes columns) and the two-loop
# recursion's state; a fixed cost per group and evaluation (its ~25 torch operations and its share of the
# solver's, ~0.5 ms); evaluations per problem, the dense form's (_FORM_EVALUATIONS) and the whitened form's
# share of them (0.3-0.8 measured on simulated CellPath IS and LOOO units); one-off float64 work, weighed by float64
# speed against float32 products: the row-space factor, or the covariance matrix and its eigendecomposition
# (~9 m^3 flops, m = min(n, D), at ~40 GFLOP/s against ~90 for the products: 20 per m^3, halved because a
# cell shard's fine and coarse calls of a readout share it, reuse_whitened) and the whitened rows.
_FORM_EVALUATIONS = 150
_WHITENED_EVALUATIONS = 0.45
_EVALUATION_OVERHEAD = 5e7
_EIGH_COST = 10.0
# The whitened form's one-off work (covariance or Gram matrix, eigendecomposition, float64 rows) runs at
# about half the time per modelled flop of the evaluations it saves, so it is weighed by this share. Measured
# per modelled unit on the 2-core benchmark machine (single-threaded, the engine calls of
# benchmarks/bench_cell_shard.py at tol 2e-7, each call forced to one form): one-off 0.014, 0.019, 0.011 and
# 0.013 ns against dense evaluations' 0.024, 0.029, 0.039 and 0.039 ns on CellPath IS and LOOO units at
# widths 384 and 1,536 (shares 0.58, 0.66, 0.28 and 0.33). Unweighted, a LOOO unit at width 1,536 (2,000
# training cells, 1,536 and 3,072 features) was modelled cheaper dense and fitted dense in 43.7 s; whitened
# it took 20.0 s.
_WHITEN_ONE_OFF = 0.45
# Bytes the grouped layout may hold per training row and feature of a subset, the bound of its largest form:
# the whitened form's float32 and float64 rows (12 per kept direction, at most one per feature) and its share
# of the eigenbasis (8 D r / n <= 8 D). Measured on single subsets of 764 and 2,000 rows at widths 384 to
# 3,072: 11.0-18.2 (the dense form: 4). What a caller budgeting the engine's memory counts.
ENGINE_BYTES_PER_VALUE = 20


def _form_cost(form: str, n: int, D: int, n_problems: int, n_classes: int, kept: bool = False) -> float:
    """Modelled cost of fitting one group in ``form``, in float32 product flops (module constants); ``kept``:
    the whitened form is made already (:func:`reuse_whitened`)."""
    width = n_problems * n_classes
    m = min(n, D)
    p = {"dense": D, "row_space": n, "whitened": m}[form]
    evaluations = _FORM_EVALUATIONS * (_WHITENED_EVALUATIONS if form == "whitened" else 1.0)
    per_evaluation = p * width * (4 * n + _STATE_COST * 4 * _HISTORY) + _EVALUATION_OVERHEAD
    if form == "dense" or (form == "whitened" and kept):
        one_off = 0.0
    elif form == "row_space":
        one_off = _FLOAT64_COST * (2 * n * n * D + n**3 / 3 + _ROW_SPACE_CHECKS * n_problems * 2 * n * D * n_classes)
    else:
        checks = _ROW_SPACE_CHECKS * n_problems * 2 * m * D * n_classes
        one_off = _WHITEN_ONE_OFF * (_EIGH_COST * m**3 + _FLOAT64_COST * (2 * n * m * D + checks) + 2 * n * D * m)
    return evaluations * per_evaluation + one_off


def group_form(n: int, D: int, n_problems: int, n_classes: int, standardize: bool, kept: bool = False,
               allowed=None) -> str:
    """The cheapest form (:class:`Group`) by the modelled cost: ``dense``, ``row_space`` or ``whitened``
    (the last two only with ``standardize``; row-space only where n < D); ``kept``: the whitened form is
    made already; ``allowed``: the forms to choose among (None: all; dense where none of them applies)."""
    forms = ["dense"]
    if standardize:
        forms.append("whitened")
        if n < D:
            forms.append("row_space")
    if allowed is not None:
        forms = [form for form in forms if form in allowed] or ["dense"]
    return min(forms, key=lambda form: _form_cost(form, n, D, n_problems, n_classes, kept))


def row_space_pays(n: int, D: int, n_problems: int, n_classes: int) -> bool:
    """Whether a subset of ``n`` distinct rows and ``D`` features is cheaper in the row-space form."""
    if n >= D:
        return False
    width = n_problems * n_classes
    saving = _EXPECTED_EVALUATIONS * (D - n) * width * (4 * n + _STATE_COST * 4 * _HISTORY)
    one_off = _FLOAT64_COST * (2 * n * n * D + n**3 / 3 + _ROW_SPACE_CHECKS * n_problems * 2 * n * D * n_classes)
    return saving > one_off


def group_subsets(index_sets) -> list[tuple[np.ndarray, list[int]]]:
    """Distinct subsets (sorted indices, repeats kept) and the problems on each, in first-seen order."""
    groups: dict[bytes, tuple[np.ndarray, list[int]]] = {}
    for u, idx in enumerate(index_sets):
        key = np.sort(idx)
        entry = groups.setdefault(key.tobytes(), (key, []))
        entry[1].append(u)
    return list(groups.values())


def build_groups(X, y, index_sets, n_classes, standardize, store_dtype, device, row_space=True,
                 choose_form=False, forms=None):
    """One :class:`Group` per distinct subset of ``index_sets`` (a list per unique problem); returns
    (groups, centre, spread): without ``standardize`` the rows are globally standardised by (centre,
    spread) as in the shared layout; with it centre 0 and spread 1. The row-space form is used where
    ``row_space`` and :func:`row_space_pays` say so (``standardize`` only: the raw-feature problems are
    solved in globally rescaled coordinates, which a turn of the rows does not preserve). With
    ``choose_form`` each group takes the form :func:`group_form` models cheapest, the whitened form among
    them; ``forms`` restricts the choice (e.g. ``("dense",)``)."""
    D = X.shape[1]
    eps = np.finfo(np.float64).eps
    numpy_store = numpy_dtype(store_dtype)
    if standardize:
        centre, spread = np.zeros(D), np.ones(D)
    else:
        used = np.unique(np.concatenate(index_sets))
        centre, spread = subset_scaler(X[used[:: max(1, used.size // 4096)]])
    groups = []
    for idx, problems in group_subsets(index_sets):
        rows, counts = np.unique(idx, return_counts=True)
        n = idx.size
        Xr = X[rows].astype(np.float64)
        rows, counts, labels, targets, Xr = merge_identical_rows(rows, counts, y[rows], n_classes, Xr)
        weight = counts / n
        if standardize:
            mean = weight @ Xr
            Z = Xr - mean
            var = weight @ (Z * Z)
            constant = (Xr.max(axis=0) <= Xr.min(axis=0)) | (var <= n * eps * var + (n * mean * eps) ** 2)
            scale = np.sqrt(var)
            scale[constant] = 1.0
            Z /= scale
            Z[:, constant] = 0.0
        else:
            Z = (Xr - centre) / spread
            mean, scale, constant = np.zeros(D), np.ones(D), np.zeros(D, dtype=bool)
        group = Group(
            problems=np.asarray(problems),
            rows=rows,
            weight=torch.as_tensor(weight, dtype=torch.float64, device=device),
            y=torch.as_tensor(labels, device=device),
            targets=None if targets is None else torch.as_tensor(targets / n, device=device),
            features=torch.as_tensor(Z.astype(numpy_store), device=device),
            mean=mean,
            scale=scale,
            constant=constant,
        )
        if choose_form and standardize:
            key = whiten_key(X[rows], counts, numpy_store)
            form = group_form(rows.size, D, len(problems), n_classes, standardize, whitened_is_kept(key), forms)
            if form == "whitened":
                _to_whitened(group, Z, numpy_store, device, key)
            elif form == "row_space":
                _to_row_space(group, Z, numpy_store, device)
        elif standardize and row_space and row_space_pays(rows.size, D, len(problems), n_classes):
            _to_row_space(group, Z, numpy_store, device)
        groups.append(group)
    return groups, centre, spread


# Rows with identical features (a patch's mean or class-token readout, shared by every cell of the patch) are
# merged into one row of the group before anything is built on them: the loss of m copies of a row with labels
# y_1..y_m is the row's loss against its class counts, so each product reads the row once. A seeded random
# projection of each row names it; rows that share a name are compared exactly, and a group whose names collide
# on different rows is left unmerged (never seen; it would only cost the merge).
_ROW_NAME_SEED = 20261204


def merge_identical_rows(rows: np.ndarray, counts: np.ndarray, labels: np.ndarray, n_classes: int,
                         Xr: np.ndarray):
    """Merge the rows of a subset whose features are identical.

    Parameters
    ----------
    rows : ndarray of shape (n,)
        Distinct row ids of X, sorted.
    counts : ndarray of shape (n,)
        Each row's multiplicity in the subset.
    labels : ndarray of shape (n,)
        Each row's class index.
    n_classes : int
        K.
    Xr : ndarray of shape (n, D)
        The rows' float64 features.

    Returns
    -------
    rows, counts, labels, targets, Xr
        One entry per distinct feature row (the first of its copies, in ``rows``' order): its row id, its copies'
        summed multiplicity, a label (the first copy's) and its features; ``targets`` (n', K) the copies'
        multiplicities per class, or None where no merged row has two classes (``labels`` is then exact).
        Unchanged, with ``targets`` None, where no two rows are identical.
    """
    if rows.size < 2:
        return rows, counts, labels, None, Xr
    name = Xr @ np.random.default_rng(_ROW_NAME_SEED).standard_normal(Xr.shape[1])
    _, first, inverse = np.unique(name, return_index=True, return_inverse=True)
    if first.size == rows.size:
        return rows, counts, labels, None, Xr
    # number the distinct rows by first appearance, so that the merged rows keep the rows' order
    by_appearance = np.argsort(first)
    rank = np.empty(first.size, dtype=np.int64)
    rank[by_appearance] = np.arange(first.size)
    first, inverse = first[by_appearance], rank[inverse.ravel()]
    if not np.array_equal(Xr[first][inverse], Xr):
        return rows, counts, labels, None, Xr
    merged = np.bincount(inverse, weights=counts, minlength=first.size)
    per_class = np.bincount(inverse * n_classes + labels, weights=counts,
                            minlength=first.size * n_classes).reshape(first.size, n_classes)
    mixed = bool(((per_class > 0).sum(axis=1) > 1).any())
    return (rows[first], merged.astype(counts.dtype), labels[first], per_class if mixed else None, Xr[first])


def _to_row_space(group: Group, Z: np.ndarray, numpy_store, device) -> None:
    """Turn a dense group into its row-space form (:class:`Group`); leave it dense where the Cholesky
    factor does not exist or is too ill-conditioned to map the coefficients back accurately."""
    weight = group.weight.cpu().numpy()
    u = weight / np.linalg.norm(weight)  # Z^T u = 0: the rows are centred with these weights
    augment = float((Z * Z).sum() / Z.shape[0]) or 1.0
    try:
        L = np.linalg.cholesky(Z @ Z.T + augment * np.outer(u, u))
    except np.linalg.LinAlgError:
        return
    diagonal = np.diag(L)
    if diagonal.min() ** 2 < 1e-10 * diagonal.max() ** 2:
        return
    L_t = torch.as_tensor(L, device=device)
    u_t = torch.as_tensor(u[:, None], dtype=torch.float64, device=device)
    group.constant_direction = np.sqrt(augment) * torch.linalg.solve_triangular(L_t, u_t, upper=False)[:, 0]
    group.basis = group.features
    group.features = torch.as_tensor(L.astype(numpy_store), device=device)
    group.factor = L_t
    group.augment = augment


# Inside reuse_whitened(), whitened forms are kept by the content of their rows (a readout's fine and coarse
# calls fit the same subsets of the same features: the second call reuses the first's eigendecomposition),
# least recently used dropped past _WHITEN_CACHE_BYTES; outside, none is kept.
_WHITEN_CACHE_BYTES = 128 * 2**20
_whiten_cache: OrderedDict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
_whiten_cache_lock = threading.Lock()
_whiten_reuse = [0]  # open reuse_whitened() contexts


@contextlib.contextmanager
def reuse_whitened() -> Iterator[None]:
    """Engine calls inside share the whitened forms of identical subsets of identical rows (made once, kept
    until the outermost such context ends).

    Yields
    ------
    None
    """
    with _whiten_cache_lock:
        _whiten_reuse[0] += 1
    try:
        yield
    finally:
        with _whiten_cache_lock:
            _whiten_reuse[0] -= 1
            if _whiten_reuse[0] == 0:
                _whiten_cache.clear()


def whiten_key(rows: np.ndarray, counts: np.ndarray, numpy_store) -> bytes | None:
    """The key a subset's whitened form is kept under (:func:`reuse_whitened`): a digest of its distinct
    raw rows (X[rows], from which its standardised rows follow), their multiplicities and the store dtype;
    None outside :func:`reuse_whitened`."""
    if not _whiten_reuse[0]:
        return None
    digest = hashlib.blake2b(digest_size=20)
    for part in (rows, counts, np.array([str(numpy_store), str(rows.dtype)])):
        digest.update(np.ascontiguousarray(part).view(np.uint8))
    return digest.digest()


def whitened_is_kept(key: bytes | None) -> bool:
    """Whether the whitened form under ``key`` (:func:`whiten_key`) is kept, so costs nothing more."""
    return key is not None and key in _whiten_cache


def _to_whitened(group: Group, Z: np.ndarray, numpy_store, device, key: bytes | None = None) -> None:
    """Turn a dense group into its whitened form (:class:`Group`). The covariance (or Gram) matrix and its
    eigendecomposition are float64 (its small eigenvalues set the preconditioner along nearly collinear
    directions, which float32 rounding would hide), and so are the rows Z V, stored also in the store dtype.
    ``key`` (:func:`whiten_key`): where the form is kept for later calls."""
    free = ~group.constant
    if not free.any():
        return
    weight = group.weight.cpu().numpy()
    with _whiten_cache_lock:
        made = _whiten_cache.get(key) if key is not None else None
        if made is not None:
            _whiten_cache.move_to_end(key)
    if made is None:
        made = _whiten(Z[:, free], weight, numpy_store)
        with _whiten_cache_lock:
            if key is not None and _whiten_reuse[0]:
                _whiten_cache[key] = made
                while len(_whiten_cache) > 1 and sum(a.nbytes for v in _whiten_cache.values()
                                                     for a in v) > _WHITEN_CACHE_BYTES:
                    _whiten_cache.popitem(last=False)
    V, eigenvalues, whitened = made
    basis = np.zeros((Z.shape[1], eigenvalues.size))
    basis[free] = V
    group.eigenbasis = torch.as_tensor(basis, device=device)
    group.eigenvalues = torch.as_tensor(eigenvalues, device=device)
    group.whitened64 = torch.as_tensor(whitened, device=device)
    group.features = torch.as_tensor(whitened.astype(numpy_store), device=device)


def _whiten(Zf: np.ndarray, weight: np.ndarray, numpy_store) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(V (d, r), eigenvalues (r,), float64 rows Zf V (n, r)) of standardised rows Zf (n, d)."""
    n, d = Zf.shape
    Zw = Zf * np.sqrt(weight)[:, None]
    if n >= d:  # the lower triangle of Zw^T Zw (one BLAS syrk) is all eigh reads
        eigenvalues, V = np.linalg.eigh(scipy_blas.dsyrk(1.0, Zw, trans=1, lower=1))
    else:  # through the n x n Gram matrix of the weighted rows: the same nonzero eigenvalues
        eigenvalues, U = np.linalg.eigh(scipy_blas.dsyrk(1.0, Zw, trans=0, lower=1))
    keep = eigenvalues > _WHITEN_DROP * max(float(eigenvalues[-1]), np.finfo(np.float64).tiny)
    eigenvalues = eigenvalues[keep]
    # float64 rows Z V: the float64 phase's rows, whose rounding W's gradient would magnify by 1 / a
    if n >= d:
        V = V[:, keep]
        whitened = Zf @ V
    else:  # V = Zw^T U / sqrt(lambda), so Zf V = diag(1 / sqrt w) (Zw Zw^T) U / sqrt(lambda) = U sqrt(lambda) / sqrt w
        U = U[:, keep]
        root = np.sqrt(eigenvalues)
        V = Zw.T @ (U / root)
        whitened = U * (root / np.sqrt(weight)[:, None])
    return V, eigenvalues, whitened


def numpy_dtype(dtype: torch.dtype):
    return torch.empty(0, dtype=dtype).numpy().dtype


# Modelled cost of one evaluation, per layout, in the same units: a block or group of n rows and p features
# evaluated for w = problems x classes columns costs (n + _BLOCK_OVERHEAD_ROWS) * p * (_ROW_READ_COLUMNS + w).
# Fitted to single-threaded float32 CPU times of both products (n = 769, p = 384, w = 9 ... 180, measured on
# the 2-core benchmark machine: reading a row costs as much as ~19 columns).
_ROW_READ_COLUMNS = 19.0
# The shared layout's extra work per modelled unit (each problem's scaler folded into its weights, the
# per-pair layout arrays): measured CPU time per modelled cost ~1.2x the groups' on the CellPath IS shard's
# engine calls (benchmarks/bench_cell_shard.py, 2-core machine), while on the tile grid's nested subsets
# the shared rows stay cheaper (measured 2x) whatever this factor.
_SHARED_OVERHEAD = 1.2


def _evaluation_cost(n_rows: int, width: int, columns: int) -> float:
    return (n_rows + _BLOCK_OVERHEAD_ROWS) * width * (_ROW_READ_COLUMNS + columns)


def grouped_layout_pays(index_sets, y, n_rows: int, D: int, n_classes: int, standardize: bool) -> bool:
    """Whether the grouped layout's modelled evaluation cost is below the shared one's (module doc):
    subsets that share rows in a few large membership patterns (nested label fractions) favour the shared
    rows, many weakly overlapping subsets (seeds, folds, cell units) the groups."""
    groups = group_subsets(index_sets)
    grouped = 0.0
    for idx, problems in groups:
        n = np.unique(idx).size
        width = n if (standardize and row_space_pays(n, D, len(problems), n_classes)) else D
        grouped += _evaluation_cost(n, width, len(problems) * n_classes)
    if len(groups) == 1:
        return True
    _, blocks = build_blocks(index_sets, y, n_rows, torch.device("cpu"))
    shared = sum(_evaluation_cost(b.stop - b.start, D, int(b.problems.numel()) * n_classes) for b in blocks)
    return grouped <= _SHARED_OVERHEAD * shared

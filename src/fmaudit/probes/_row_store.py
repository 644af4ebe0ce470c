"""How the batched logistic engine lays out its rows: blocks of rows shared by sets of problems.

Rows with the same membership pattern (the set of problems containing them) form blocks evaluated for all
their problems in one pair of wide products; rows of rare patterns are chunked (:func:`build_blocks`). The
store holds the rows globally standardised, and every problem's own scaler is computed in the same pass
(:func:`standardised_store`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


# Rows sharing a problem set form their own blocks when there are at least this many of them; rows of
# rarer membership patterns are chunked (build_blocks). Blocks are cut at _MAX_BLOCK_ROWS rows so that a
# block's rows stay in cache between its two products and its temporaries stay small.
_MIN_SHARED_ROWS = 32
_RARE_CHUNK_ROWS = 256
_MAX_BLOCK_ROWS = 1024

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




def numpy_dtype(dtype: torch.dtype):
    return torch.empty(0, dtype=dtype).numpy().dtype

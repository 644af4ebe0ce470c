"""The objective of the batched logistic engine: mean cross-entropy + L2 and its gradient for many problems.

(scikit-learn's ``_linear_loss`` role.) One evaluation runs two matrix products per block of rows and one
element-wise softmax pass over every (row, problem) pair of the evaluation.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from fmaudit.probes._row_store import block_cost

def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # On CPU the skinny (N x D) @ (D x K) products go through numpy: the OpenBLAS that numpy ships ran them
    # 1.5-6x faster than the MKL of torch's CPU wheels on the AMD machines this was measured on
    # (benchmarks/bench_probe_engine.py --matmul-check). The tensors share memory; nothing is copied.
    if a.device.type == "cpu":
        return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))
    return a @ b


@contextlib.contextmanager
def cpu_threads(device: torch.device, n_threads: int) -> Iterator[None]:
    """On CPU: torch runs single-threaded and BLAS single-threaded when the objective spreads its blocks
    over ``n_threads`` threads of its own (with one thread, BLAS gets that one too)."""
    # Measured: torch's OpenMP workers spinning on the same cores for the small element-wise ops, or OpenBLAS
    # threads splitting skinny products, made fits several times slower than one thread per block.
    if device.type != "cpu":
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(previous)


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


class SharedRowsObjective:
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
    products are spread over ``n_threads`` threads (each with single-threaded BLAS, see cpu_threads).
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
            costs.append(block_cost(n_b, k))
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



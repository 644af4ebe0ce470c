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
        self, store, blocks, mu, sigma, present, l2, n_features, n_classes, penalty_weight, n_threads, free=None,
        grad_scale=None,
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
        # (1, (D+1) K) float64 or None: the stopping measure's coordinates (the raw features' W, not V)
        self.grad_scale = grad_scale
        self.device = mu.device
        self.n_threads = n_threads if self.device.type == "cpu" else 1
        self.pool = None
        if self.n_threads > 1:
            self.pool = ThreadPoolExecutor(max_workers=self.n_threads)
        self._layouts: dict[tuple, _Layout] = {}
        self._store_as: dict[torch.dtype, torch.Tensor] = {store.dtype: store}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

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
        if self.pool is None or len(shares) == 1:
            return [fn(share) for share in shares]
        return list(self.pool.map(fn, shares))

    def __call__(self, points: torch.Tensor, ids: np.ndarray, product_dtype: torch.dtype):
        """points (A, (D+1) K) float64 for problems ``ids`` (A,) -> objective (A,) and gradient like points."""
        D, K = self.D, self.K
        ids = torch.as_tensor(ids, device=self.device)
        theta = points.view(ids.shape[0], D + 1, K)
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
        return value, grad.view(A, -1)



    def gradient_max_abs(self, grads: torch.Tensor, ids: np.ndarray, exact: bool = False) -> np.ndarray:
        """Stopping measure per problem: the max-abs gradient in W's coordinates (intercepts included)."""
        grads = grads if self.grad_scale is None else grads * self.grad_scale
        return grads.abs().amax(dim=1).cpu().numpy()

    def gradient_bounds(self, grads: torch.Tensor, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        measure = self.gradient_max_abs(grads, ids)
        return measure, measure


class GroupedObjective:
    """The objective over problems laid out in :class:`~fmaudit.probes._row_store.Group` s: per group one
    product for the logits and one for the gradient, each as wide as the group's requested problems.

    Parameters of problem u are theta (width + 1, K): rows 0..p_g-1 are its coefficients on its group's
    ``features`` (p_g = D dense, n_g row-space; rows past p_g are padding and stay exactly 0), the last row its
    intercept. Logits are computed transposed, (problems x classes, rows), so the softmax reductions run over
    a leading axis. Per group: products in the asked dtype, the softmax and weighting in that dtype, the sums
    over rows (loss, intercept gradient) in float64; groups are spread over ``n_threads`` threads on CPU.
    ``penalty_weight`` (width,) and ``grad_scale`` (width + 1, K): the raw-feature problems' rescaled
    coordinates (see the shared objective). Stopping measure: the max-abs gradient in W's coordinates; for
    row-space groups W's gradient is Q_W g_B (Q_W = Z^T L^-T), bounded above by the columns' norms of g_B
    and below by those norms less Q's constant row, over sqrt(D): the exact value is computed only where the
    bounds straddle tol (:func:`fmaudit.probes._lbfgs.lbfgs` asks).
    """

    def __init__(self, groups, present, l2, width, n_classes, n_threads, penalty_weight=None, grad_scale=None):
        self.groups = groups
        self.present = present  # (U, K) bool tensor
        self.l2 = l2  # (U,) float64 tensor
        self.width = width
        self.K = n_classes
        self.penalty_weight = penalty_weight
        self.grad_scale = grad_scale
        self.device = l2.device
        n_problems = l2.shape[0]
        self.group_of = np.full(n_problems, -1, dtype=np.int64)
        for gi, group in enumerate(groups):
            self.group_of[group.problems] = gi
        # groups whose stopping measure needs a map back to W's coordinates (bounded cheaply, else exact)
        self.turned = any(group.turned for group in groups)
        self.n_threads = n_threads if self.device.type == "cpu" else 1
        self.pool = ThreadPoolExecutor(max_workers=self.n_threads) if self.n_threads > 1 else None
        self._free_features = {gi: int((~g.constant).sum()) for gi, g in enumerate(groups)}
        # whitened groups: each problem's a_u (Group), zero past its group's r
        self.stretch = None
        if any(group.whitened for group in groups):
            self.stretch = torch.zeros((n_problems, width), dtype=torch.float64, device=self.device)
            for group in groups:
                if group.whitened:
                    ids = torch.as_tensor(group.problems, device=self.device)
                    self.stretch[ids, : group.width] = group.stretch(l2[ids])

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def _tasks(self, ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(group, positions in ``ids``) per group touched, dealt to threads by modelled cost."""
        gid = self.group_of[ids]
        order = np.argsort(gid, kind="stable")
        cuts = np.flatnonzero(np.diff(gid[order])) + 1
        return [(int(gid[part[0]]), part) for part in np.split(order, cuts)]

    def _shares(self, tasks) -> list[list]:
        if self.n_threads == 1 or len(tasks) == 1:
            return [tasks]
        costs = [self.groups[gi].features.shape[0] * self.groups[gi].width * (len(pos) + 1) for gi, pos in tasks]
        loads = [0.0] * self.n_threads
        shares: list[list] = [[] for _ in range(self.n_threads)]
        for i in np.argsort(costs, kind="stable")[::-1]:
            t = loads.index(min(loads))
            shares[t].append(tasks[i])
            loads[t] += costs[i]
        return [share for share in shares if share]

    def __call__(self, points: torch.Tensor, ids: np.ndarray, product_dtype: torch.dtype):
        """points (A, P) float64 for problems ``ids`` (A,) -> objective (A,) and gradient (A, P)."""
        A = points.shape[0]
        K, width = self.K, self.width
        theta = points.view(A, width + 1, K)
        values = torch.empty(A, dtype=torch.float64, device=self.device)
        grads = torch.zeros((A, width + 1, K), dtype=torch.float64, device=self.device)
        ids_t = torch.as_tensor(ids, device=self.device)

        def run(share):
            for gi, positions in share:
                self._evaluate(gi, torch.as_tensor(positions, device=self.device), theta, ids_t, product_dtype,
                               values, grads)

        shares = self._shares(self._tasks(ids))
        if self.pool is None or len(shares) == 1:
            for share in shares:
                run(share)
        else:
            list(self.pool.map(run, shares))
        return values, grads.view(A, -1)

    def _evaluate(self, gi, positions, theta, ids, dtype, values, grads) -> None:
        group = self.groups[gi]
        K, width = self.K, self.width
        c = positions.shape[0]
        p = group.width
        n = group.y.shape[0]
        problems = ids[positions]
        params = theta[positions]
        W = params[:, :p]  # (c, p, K)
        X = group.features_in(dtype)
        stretch = self.stretch[problems, :p, None] if group.whitened else None  # (c, p, 1)
        Wt = (W if stretch is None else W * stretch).transpose(1, 2).reshape(c * K, p).to(dtype)
        Z = _matmul(Wt, X.T)  # (c*K, n)
        Z += params[:, width].reshape(c * K, 1).to(dtype)
        Z3 = Z.view(c, K, n)
        labels = group.y.view(1, 1, n).expand(c, 1, n)
        true_logit = Z3.gather(1, labels)  # (c, 1, n)
        absent = ~self.present[problems]
        if bool(absent.any()):
            Z3.masked_fill_(absent[:, :, None], float("-inf"))
        top = Z3.amax(dim=1, keepdim=True)
        Z3 -= top
        Z3.exp_()
        total = Z3.sum(dim=1, keepdim=True)
        weight = group.weight
        loss = (total.log() + top - true_logit).view(c, n).double() @ weight  # sum of w * (lse - z_true)
        # G = w * (softmax - onehot), in two passes: scale by w / total, then subtract w at the labels
        weight_in = group.weight_in(dtype).view(1, 1, n)
        Z3 *= weight_in / total
        Z3.scatter_add_(1, labels, -weight_in.expand(c, 1, n))
        grad_W = _matmul(Z, X).double().view(c, K, p).transpose(1, 2)  # (c, p, K)
        if stretch is not None:
            grad_W = grad_W * stretch
        grad_b = Z.sum(dim=1, dtype=torch.float64).view(c, K)
        l2 = self.l2[problems]
        if stretch is not None:
            W_penalised = W * (stretch * stretch)
        else:
            W_penalised = W if self.penalty_weight is None else W * self.penalty_weight[:p, None]
        grad_W = grad_W + l2[:, None, None] * W_penalised
        if group.row_space:  # kept orthogonal to q, the direction the original problem lacks (Group)
            q = group.constant_direction
            grad_W -= q[None, :, None] * torch.einsum("n,cnk->ck", q, grad_W)[:, None, :]
        grads[positions, :p] = grad_W
        grads[positions, width] = grad_b
        values[positions] = loss + 0.5 * l2 * (W * W_penalised).sum(dim=(1, 2))

    def _unstretched(self, g: torch.Tensor, problems: np.ndarray, group) -> torch.Tensor:
        """diag(1/a_u) g_B (c, r, K) of a whitened group's problems: V times it is W's gradient."""
        stretch = self.stretch[torch.as_tensor(problems, device=self.device), : group.width, None]
        return g[:, : group.width] / stretch

    def gradient_max_abs(self, grads: torch.Tensor, ids: np.ndarray, exact: bool = True) -> np.ndarray:
        """Stopping measure per problem: the max-abs gradient in W's coordinates (intercepts included)."""
        A = grads.shape[0]
        g = grads.view(A, self.width + 1, self.K)
        if self.grad_scale is not None:
            g = g * self.grad_scale
        if not self.turned:
            return g.abs().amax(dim=(1, 2)).cpu().numpy()
        out = g[:, self.width].abs().amax(dim=1).cpu().numpy()
        for gi, positions in self._tasks(ids):
            group = self.groups[gi]
            pos = torch.as_tensor(positions, device=self.device)
            if not group.turned:
                out[positions] = np.maximum(out[positions], g[pos].abs().amax(dim=(1, 2)).cpu().numpy())
                continue
            if group.whitened:  # W's gradient V diag(1/a) g_B, all problems of the group in one product
                c = positions.size
                turned = self._unstretched(g[pos], ids[positions], group).permute(1, 0, 2).reshape(group.width, -1)
                grad_W = group.eigenbasis @ turned  # (D, c*K)
                out[positions] = np.maximum(out[positions],
                                            grad_W.abs().view(-1, c, self.K).amax(dim=(0, 2)).cpu().numpy())
                continue
            n = group.width
            coefficients = g[pos, :n]  # (c, n, K)
            c = positions.size
            # W's gradient Z^T L^-T g_B, all problems of the group in one solve and one product
            turned = torch.linalg.solve_triangular(group.factor.T, coefficients.permute(1, 0, 2).reshape(n, -1),
                                                   upper=True)
            grad_W = group.basis.T.double() @ turned  # (D, c*K)
            out[positions] = np.maximum(out[positions], grad_W.abs().view(-1, c, self.K).amax(dim=(0, 2)).cpu().numpy())
        return out

    def gradient_bounds(self, grads: torch.Tensor, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) bounds of :meth:`gradient_max_abs`, equal for dense groups."""
        if not self.turned:
            measure = self.gradient_max_abs(grads, ids)
            return measure, measure
        A = grads.shape[0]
        g = grads.view(A, self.width + 1, self.K)
        intercept = g[:, self.width].abs().amax(dim=1).cpu().numpy()
        lower, upper = intercept.copy(), intercept.copy()
        for gi, positions in self._tasks(ids):
            group = self.groups[gi]
            pos = torch.as_tensor(positions, device=self.device)
            if not group.turned:
                dense = g[pos].abs().amax(dim=(1, 2)).cpu().numpy()
                lower[positions] = upper[positions] = np.maximum(intercept[positions], dense)
                continue
            if group.whitened:  # V has orthonormal columns: the columns' norms of diag(1/a) g_B are W's
                norms = self._unstretched(g[pos], ids[positions], group).norm(dim=1)  # (c, K)
                up = norms.amax(dim=1).cpu().numpy()
                upper[positions] = np.maximum(upper[positions], up)
                lower[positions] = np.maximum(lower[positions], up / np.sqrt(max(self._free_features[gi], 1)))
                continue
            coefficients = g[pos, : group.width]  # (c, n, K)
            norms2 = (coefficients * coefficients).sum(dim=1)  # (c, K)
            along_constant = torch.einsum("n,cnk->ck", group.constant_direction, coefficients)
            # rows of Q = [Q_W; q^T] have norm <= 1; ||Q_W g||^2 = ||g||^2 - (q . g)^2 over <= D_free entries
            up = norms2.sqrt().amax(dim=1).cpu().numpy()
            low = ((norms2 - along_constant**2).clamp_min(0).sqrt() / np.sqrt(max(self._free_features[gi], 1)))
            upper[positions] = np.maximum(upper[positions], up)
            lower[positions] = np.maximum(lower[positions], low.amax(dim=1).cpu().numpy())
        return lower, upper

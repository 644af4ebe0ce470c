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


def _matmul_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out = a @ b, written into ``out`` (a strided view of a larger buffer: BLAS reads its row stride)."""
    if a.device.type == "cpu":
        np.matmul(a.numpy(), b.numpy(), out=out.numpy())
    else:
        torch.matmul(a, b, out=out)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # On CPU the skinny (N x D) @ (D x K) products go through numpy: the OpenBLAS that numpy ships ran them
    # 1.5-6x faster than the MKL of torch's CPU wheels on the AMD machines this was measured on
    # (benchmarks/bench_probe_engine.py --matmul-check). The tensors share memory; nothing is copied.
    if a.device.type == "cpu":
        return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))
    return a @ b


def _deal(costs, n_threads: int) -> list[list[int]]:
    """Indices of ``costs`` dealt to ``n_threads`` threads, largest first, each to the least loaded thread;
    the non-empty shares."""
    loads = [0.0] * n_threads
    shares: list[list[int]] = [[] for _ in range(n_threads)]
    for i in np.argsort(costs, kind="stable")[::-1]:
        t = loads.index(min(loads))
        shares[t].append(int(i))
        loads[t] += costs[i]
    return [share for share in shares if share]


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
        shares = _deal(costs, self.n_threads)
        layout = _Layout(
            parts=parts,
            local=local,
            weight=torch.cat(weight).to(product_dtype),
            label=torch.cat(label).unsqueeze(1),
            absent=absent if bool(absent.any()) else None,
            Z=Z,
            G=G,
            shares=shares,
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


# A plan pads its groups' rows to the largest of them; groups whose row counts differ more than this factor
# are evaluated in separate plans (their padding would cost more than the batching saves).
_BUCKET_SPREAD = 1.5


@dataclass
class _GroupPlan:
    """One batched evaluation of the groups ``groups`` for the problems of ``ids`` at ``positions``.

    The groups' logits sit in one padded (G, c_max, K, n_max) buffer: group i's problems in slots
    0..c_i-1 of row i, its rows in columns 0..n_i-1. Each group's two products read and write its own part
    (strided views, no copies); every element-wise step of the softmax runs once over the whole buffer.
    Padding columns have weight 0 and padding slots are discarded, so neither changes a result. Built once
    per set of problems and product dtype, and reused.
    """

    groups: list  # (group index, c, n, p) per group of the plan, in the buffer's order
    positions: torch.Tensor  # (A_s,) positions in ``ids`` of the plan's problems
    slot: torch.Tensor  # (A_s,) flat slot i * c_max + s of each
    c_max: int
    p_max: int
    labels: torch.Tensor  # (G, c_max, 1, n_max) class of each row (an expanded view)
    weight: torch.Tensor  # (G, n_max, 1) float64: multiplicity / n, 0 in the padding
    weight_in: torch.Tensor  # (G, 1, 1, n_max) the same in the product dtype
    # (G, 1, K, n_max) in the product dtype: each row's weight per class, where a group merged identical rows of
    # different labels (Group.targets; one-hot times weight for the bucket's other groups); else None
    targets_in: torch.Tensor | None
    absent: torch.Tensor | None  # (G, c_max, K, 1) True where a slot's problem lacks the class
    stretch: torch.Tensor | None  # (G * c_max, p_max, 1) float64: whitened problems' a_u (0 elsewhere)
    l2: torch.Tensor  # (G * c_max,) float64 (0 in padding slots)
    direction: torch.Tensor | None  # (G * c_max, p_max) float64: row-space groups' q, per slot
    Z: torch.Tensor  # (G, c_max, K, n_max) logits, then softmax minus one-hot times weight
    grad_W: torch.Tensor  # (G * c_max, K, p_max) the gradient's products, zero in the padding


class GroupedObjective:
    """The objective over problems laid out in :class:`~fmaudit.probes._row_store.Group` s: per group one
    product for the logits and one for the gradient, each as wide as the group's requested problems.

    Parameters of problem u are theta (width + 1, K): rows 0..p_g-1 are its coefficients on its group's
    ``features`` (p_g = D dense, n_g row-space; rows past p_g are padding and stay exactly 0), the last row its
    intercept. Logits are computed transposed, (problems x classes, rows), so the softmax reductions run over
    a leading axis. The groups an evaluation touches are evaluated together (:class:`_GroupPlan`): their
    products one by one, the element-wise softmax once over all of them. Products in the asked dtype, the
    softmax and weighting in that dtype, the sums over rows (loss, intercept gradient) in float64; groups
    are spread over ``n_threads`` threads on CPU (one plan each).
    ``penalty_weight`` (width,) and ``grad_scale`` (width + 1, K): the raw-feature problems' rescaled
    coordinates (see the shared objective). Stopping measure: the max-abs gradient in W's coordinates; for
    row-space groups W's gradient is Q_W g_B (Q_W = Z^T L^-T), bounded above by the columns' norms of g_B
    and below by those norms less Q's constant row, over sqrt(D): the exact value is computed only where the
    bounds straddle tol (:func:`fmaudit.probes._lbfgs.lbfgs` asks).
    """

    _PLAN_CACHE = 32

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
        self.slot_of = np.zeros(n_problems, dtype=np.int64)  # a problem's place among its group's
        for gi, group in enumerate(groups):
            self.group_of[group.problems] = gi
            self.slot_of[group.problems] = np.arange(len(group.problems))
        # groups whose stopping measure needs a map back to W's coordinates (bounded cheaply, else exact)
        self.turned = any(group.turned for group in groups)
        self.n_threads = n_threads if self.device.type == "cpu" else 1
        self.pool = ThreadPoolExecutor(max_workers=self.n_threads) if self.n_threads > 1 else None
        # per problem, for the stopping bounds: sqrt of its group's free features, and its group's form
        free = np.array([max(int((~g.constant).sum()), 1) for g in groups] or [1], dtype=np.float64)
        self._sqrt_free = np.sqrt(free)[self.group_of]
        self._form_of = np.array([g.form for g in groups] or ["dense"])[self.group_of]
        # whitened groups: each problem's a_u (Group), zero past its group's r, and its inverse (zero there)
        self.stretch = self.unstretch = None
        if any(group.whitened for group in groups):
            self.stretch = torch.zeros((n_problems, width), dtype=torch.float64, device=self.device)
            for group in groups:
                if group.whitened:
                    ids = torch.as_tensor(group.problems, device=self.device)
                    self.stretch[ids, : group.width] = group.stretch(l2[ids])
            self.unstretch = torch.where(self.stretch > 0, 1.0 / self.stretch.clamp_min(1e-300),
                                         torch.zeros_like(self.stretch))
        # row-space groups: each problem's q (zero past its group's n)
        self.direction = None
        if any(group.row_space for group in groups):
            self.direction = torch.zeros((n_problems, width), dtype=torch.float64, device=self.device)
            for group in groups:
                if group.row_space:
                    ids = torch.as_tensor(group.problems, device=self.device)
                    self.direction[ids, : group.width] = group.constant_direction[None, :]
        self._plans: dict[tuple, list[list[_GroupPlan]]] = {}
        self._buckets()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def _tasks(self, ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(group, positions in ``ids``) per group touched."""
        gid = self.group_of[ids]
        order = np.argsort(gid, kind="stable")
        cuts = np.flatnonzero(np.diff(gid[order])) + 1
        return [(int(gid[part[0]]), part) for part in np.split(order, cuts)]

    def _buckets(self) -> None:
        """Groups of similar row counts share padded label and weight arrays (a plan pads its groups' rows to
        the largest of them: at most _BUCKET_SPREAD times a group's own)."""
        sizes = np.array([g.y.shape[0] for g in self.groups])
        order = np.argsort(sizes, kind="stable")
        self._bucket_of = np.zeros(len(self.groups), dtype=np.int64)
        self._index_in_bucket = np.zeros(len(self.groups), dtype=np.int64)
        # per bucket: labels, weight (members, n_max) and, where a member has targets, all members' (members, K, n_max)
        self._bucket_rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        start = 0
        while start < order.size:
            stop = start + 1
            while stop < order.size and sizes[order[stop]] <= _BUCKET_SPREAD * max(sizes[order[start]], 1):
                stop += 1
            members = order[start:stop]
            n_max = int(sizes[members].max())
            labels = torch.zeros((members.size, n_max), dtype=torch.long, device=self.device)
            weight = torch.zeros((members.size, n_max), dtype=torch.float64, device=self.device)
            targets = None
            if any(self.groups[gi].targets is not None for gi in members):
                targets = torch.zeros((members.size, self.K, n_max), dtype=torch.float64, device=self.device)
            for i, gi in enumerate(members):
                group = self.groups[gi]
                labels[i, : sizes[gi]] = group.y
                weight[i, : sizes[gi]] = group.weight
                if targets is not None and group.targets is not None:
                    targets[i, :, : sizes[gi]] = group.targets.T
                elif targets is not None:
                    targets[i, group.y, torch.arange(sizes[gi], device=self.device)] = group.weight
            self._bucket_of[members] = len(self._bucket_rows)
            self._index_in_bucket[members] = np.arange(members.size)
            self._bucket_rows.append((labels, weight, targets))
            start = stop

    def _plans_for(self, ids: np.ndarray, dtype: torch.dtype) -> list[list[_GroupPlan]]:
        """Per thread, the plans (one per bucket of groups touched) that evaluate ``ids``."""
        key = (ids.tobytes(), dtype)
        plans = self._plans.get(key)
        if plans is not None:
            return plans
        # positions sorted by (group, place in the group); a problem's slot is its rank among its group's
        gid = self.group_of[ids]
        order = np.lexsort((self.slot_of[ids], gid))
        sorted_gid = gid[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_gid)) + 1]
        counts = np.diff(np.r_[starts, order.size])
        touched = sorted_gid[starts]
        rank = np.arange(order.size) - np.repeat(starts, counts)
        shares = [np.arange(touched.size)]
        if self.n_threads > 1 and touched.size > 1:
            costs = [self.groups[gi].y.shape[0] * self.groups[gi].width * (c + 1) for gi, c in zip(touched, counts)]
            shares = [np.sort(np.array(d)) for d in _deal(costs, self.n_threads)]
        plans = []
        for share in shares:
            buckets = self._bucket_of[touched[share]]
            plans.append([self._plan(share[buckets == bucket], touched, counts, starts, order, rank, ids, dtype)
                          for bucket in np.unique(buckets)])
        if len(self._plans) >= self._PLAN_CACHE:
            self._plans.pop(next(iter(self._plans)))
        self._plans[key] = plans
        return plans

    def _plan(self, members, touched, counts, starts, order, rank, ids, dtype) -> _GroupPlan:
        """The plan of the touched groups ``members`` (indices into ``touched``), all of one bucket."""
        device, K = self.device, self.K
        groups = touched[members]
        G = groups.size
        c_max = int(counts[members].max())
        labels_all, weight_all, targets_all = self._bucket_rows[self._bucket_of[groups[0]]]
        index = torch.as_tensor(self._index_in_bucket[groups], device=device)
        labels, weight = labels_all[index], weight_all[index]
        targets_in = None if targets_all is None else targets_all[index].to(dtype).view(G, 1, K, -1)
        n_max = labels.shape[1]
        p_max = max(self.groups[gi].width for gi in groups)
        # the members' positions in ids, and their slots
        sel = np.concatenate([np.arange(starts[m], starts[m] + counts[m]) for m in members])
        local = np.repeat(np.arange(G), counts[members])
        positions = order[sel]
        slot = local * c_max + rank[sel]
        problems = torch.as_tensor(ids[positions], device=device)
        filled = torch.as_tensor(slot, device=device)
        S = G * c_max
        absent = torch.zeros((S, K), dtype=torch.bool, device=device)
        absent[filled] = ~self.present[problems]
        l2 = torch.zeros(S, dtype=torch.float64, device=device)
        l2[filled] = self.l2[problems]
        stretch = direction = None
        if self.stretch is not None:
            stretch = torch.zeros((S, p_max), dtype=torch.float64, device=device)
            stretch[filled] = self.stretch[problems, :p_max]
            stretch = stretch[:, :, None]
        if self.direction is not None:
            direction = torch.zeros((S, p_max), dtype=torch.float64, device=device)
            direction[filled] = self.direction[problems, :p_max]
        described = [(int(gi), int(c), int(self.groups[gi].y.shape[0]), int(self.groups[gi].width))
                     for gi, c in zip(groups, counts[members])]
        return _GroupPlan(
            groups=described,
            positions=torch.as_tensor(positions, device=device),
            slot=filled,
            c_max=c_max,
            p_max=p_max,
            labels=labels.view(G, 1, 1, n_max).expand(G, c_max, 1, n_max),
            weight=weight.view(G, n_max, 1),
            weight_in=weight.view(G, 1, 1, n_max).to(dtype),
            targets_in=targets_in,
            absent=absent.view(G, c_max, K, 1) if bool(absent.any()) else None,
            stretch=stretch,
            l2=l2,
            direction=direction,
            Z=torch.zeros((G, c_max, K, n_max), dtype=dtype, device=device),
            grad_W=torch.zeros((S, K, p_max), dtype=dtype, device=device),
        )

    def __call__(self, points: torch.Tensor, ids: np.ndarray, product_dtype: torch.dtype):
        """points (A, P) float64 for problems ``ids`` (A,) -> objective (A,) and gradient (A, P)."""
        A = points.shape[0]
        K, width = self.K, self.width
        theta = points.view(A, width + 1, K)
        values = torch.empty(A, dtype=torch.float64, device=self.device)
        grads = torch.zeros((A, width + 1, K), dtype=torch.float64, device=self.device)
        plans = self._plans_for(np.ascontiguousarray(ids), product_dtype)

        def run(share):
            for plan in share:
                self._evaluate(plan, theta, product_dtype, values, grads)

        if self.pool is None or len(plans) == 1:
            for share in plans:
                run(share)
        else:
            list(self.pool.map(run, plans))
        return values, grads.view(A, -1)

    def _evaluate(self, plan: _GroupPlan, theta, dtype, values, grads) -> None:
        K, width = self.K, self.width
        c_max, p_max = plan.c_max, plan.p_max
        G = len(plan.groups)
        S = G * c_max
        W = torch.zeros((S, p_max, K), dtype=torch.float64, device=self.device)
        W[plan.slot] = theta[plan.positions, :p_max]
        b = torch.zeros((S, K), dtype=torch.float64, device=self.device)
        b[plan.slot] = theta[plan.positions, width]
        stretch = plan.stretch
        Wt = (W if stretch is None else W * stretch).transpose(1, 2).to(dtype).contiguous()  # (S, K, p_max)
        Z = plan.Z
        n_max = Z.shape[3]
        for i, (gi, c, n, p) in enumerate(plan.groups):
            X = self.groups[gi].features_in(dtype)
            _matmul_into(Wt[i * c_max : i * c_max + c, :, :p].reshape(c * K, p), X.T,
                         Z[i, :c].view(c * K, n_max)[:, :n])
        Z += b.view(G, c_max, K, 1).to(dtype)
        targets = plan.targets_in
        if targets is None:
            true_logit = Z.gather(2, plan.labels)  # (G, c_max, 1, n_max)
        else:  # merged rows: sum_k t_k z_k, the true logits of the row's copies, weighted
            true_part = (Z * targets).sum(dim=(2, 3), dtype=torch.float64).view(S)
        if plan.absent is not None:
            Z.masked_fill_(plan.absent, float("-inf"))
        top = Z.amax(dim=2, keepdim=True)
        Z -= top
        Z.exp_()
        total = Z.sum(dim=2, keepdim=True)
        if targets is None:
            per_row = total.log() + top - true_logit  # lse - z_true
            loss = torch.matmul(per_row.view(G, c_max, n_max).double(), plan.weight).view(S)
        else:
            per_row = total.log() + top  # lse
            loss = torch.matmul(per_row.view(G, c_max, n_max).double(), plan.weight).view(S) - true_part
        # G = w * (softmax - onehot), in two passes: scale by w / total, then subtract w at the labels (merged
        # rows: subtract each class's weight t_k)
        weight_in = plan.weight_in
        Z *= weight_in / total
        if targets is None:
            Z.scatter_add_(2, plan.labels, -weight_in.expand(G, c_max, 1, n_max))
        else:
            Z -= targets
        grad_products = plan.grad_W
        for i, (gi, c, n, p) in enumerate(plan.groups):
            X = self.groups[gi].features_in(dtype)
            _matmul_into(Z[i, :c].view(c * K, n_max)[:, :n], X,
                         grad_products[i * c_max : i * c_max + c].view(c * K, p_max)[:, :p])
        grad_W = grad_products.double().transpose(1, 2)  # (S, p_max, K)
        grad_b = Z.sum(dim=3, dtype=torch.float64).view(S, K)
        if stretch is not None:
            grad_W = grad_W * stretch
            W_penalised = W * (stretch * stretch)
        else:
            W_penalised = W if self.penalty_weight is None else W * self.penalty_weight[:p_max, None]
        grad_W = grad_W + plan.l2[:, None, None] * W_penalised
        if plan.direction is not None:  # kept orthogonal to q, the direction the original problem lacks (Group)
            q = plan.direction
            grad_W -= q[:, :, None] * torch.einsum("sp,spk->sk", q, grad_W)[:, None, :]
        value = loss + 0.5 * plan.l2 * (W * W_penalised).sum(dim=(1, 2))
        grads[plan.positions, :p_max] = grad_W[plan.slot]
        grads[plan.positions, width] = grad_b[plan.slot]
        values[plan.positions] = value[plan.slot]

    def _unstretched(self, g: torch.Tensor, problems: np.ndarray, width: int) -> torch.Tensor:
        """diag(1/a_u) g_B (c, width, K) of whitened problems (0 past each one's r): V times it is W's
        gradient."""
        return g[:, :width] * self.unstretch[torch.as_tensor(problems, device=self.device), :width, None]

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
                turned = self._unstretched(g[pos], ids[positions], group.width)
                turned = turned.permute(1, 0, 2).reshape(group.width, -1)
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
        """(lower, upper) bounds of :meth:`gradient_max_abs`, equal for dense groups; all problems of a form
        at once."""
        if not self.turned:
            measure = self.gradient_max_abs(grads, ids)
            return measure, measure
        A, width = grads.shape[0], self.width
        g = grads.view(A, width + 1, self.K)
        intercept = g[:, width].abs().amax(dim=1).cpu().numpy()
        lower, upper = intercept.copy(), intercept.copy()
        form = self._form_of[ids]
        for code in np.unique(form):
            rows = np.flatnonzero(form == code)
            part = g if rows.size == A else g[torch.as_tensor(rows, device=self.device)]
            if code == "dense":
                dense = part.abs().amax(dim=(1, 2)).cpu().numpy()
                lower[rows] = upper[rows] = np.maximum(intercept[rows], dense)
                continue
            coefficients = part[:, :width]
            if code == "whitened":  # V has orthonormal columns: the columns' norms of diag(1/a) g_B are W's
                up = self._unstretched(part, ids[rows], width).norm(dim=1).amax(dim=1).cpu().numpy()
                low = up / self._sqrt_free[ids[rows]]
            else:  # row-space: rows of Q = [Q_W; q^T] have norm <= 1; ||Q_W g||^2 = ||g||^2 - (q . g)^2
                norms2 = (coefficients * coefficients).sum(dim=1)  # (a, K)
                direction = self.direction[torch.as_tensor(ids[rows], device=self.device)]
                along_constant = torch.einsum("aw,awk->ak", direction, coefficients)
                up = norms2.sqrt().amax(dim=1).cpu().numpy()
                low = (norms2 - along_constant**2).clamp_min(0).sqrt().amax(dim=1).cpu().numpy()
                low = low / self._sqrt_free[ids[rows]]
            upper[rows] = np.maximum(upper[rows], up)
            lower[rows] = np.maximum(lower[rows], low)
        return lower, upper

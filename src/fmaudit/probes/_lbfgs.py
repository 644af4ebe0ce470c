"""The solver of the batched logistic engine: lock-step L-BFGS over many problems (scikit-learn's lbfgs role).

Each problem has its own history, step, line search and stopping, as scikit-learn's lbfgs on that problem
alone; the problems only share the calls to the objective, which evaluates many of them at once
(:mod:`fmaudit.probes._logistic_loss`). The objective is any callable
``objective(points (A, P), problems (A,), dtype) -> (values (A,), gradients (A, P))`` (float64 tensors,
``problems`` an int array of problem ids) with a method ``gradient_max_abs(gradients, problems, exact)``
giving each problem's stopping measure (the max-abs gradient in the coordinates scikit-learn would see).

Bookkeeping that stays cheap with thousands of problems:
- the histories are one ring buffer shared by all problems (every problem writes its slot each iteration;
  a pair that fails the curvature test, or a problem that took no step, writes an empty pair, rho = 0), so
  the two-loop recursion runs on plain slices, never gathers;
- finished problems stay in the working arrays until they are a tenth of them, then the arrays are
  compacted in one gather (finished problems are never evaluated, only carried).
"""

from __future__ import annotations

import numpy as np
import torch

# Line search: Armijo sufficient decrease, or Hager & Zhang's approximate Wolfe conditions (their eq. 4.1,
# delta 0.1, sigma 0.9, energy tolerance eps |f|), which rest on the directional derivative and so still
# accept good steps where rounding hides the decrease of f (float32 products near the optimum).
_ARMIJO_C1 = 1e-4
_WOLFE_DELTA, _WOLFE_SIGMA = 0.1, 0.9
_ENERGY_EPS = {torch.float32: 1e-6, torch.float64: 1e-12}
# Trial steps before a problem is deemed stalled: in float32 it then moves on to float64 products.
_MAX_LINE_SEARCH = {torch.float32: 6, torch.float64: 30}
# scikit-learn passes this relative-reduction tolerance to L-BFGS-B whatever the data dtype.
_FTOL = 64 * np.finfo(np.float64).eps
# Where a stopping measure is only bounded cheaply (row-space problems), its exact value is computed at the
# first uncertain test and every this many after: a problem stops at most that many iterations late.
_EXACT_CHECK_EVERY = 4
# Float32 steps in a row that do not decrease f before a problem is deemed stalled in float32. Measured on a
# CellPath IS unit at tol 2e-7: after 3 such steps 1,016 of its evaluations ran in float64 (the stalls were
# f's rounding, not the gradient's), after 20 only 34, and the fit took 0.7x the CPU time.
_FLAT_STEPS = 20
# An earlier phase (float32 products) hands a problem on once its measure is this share of tol: a float32
# gradient just below tol is often above it in float64, and each float64 step then costs an evaluation of its
# own (the float32 steps of other problems share theirs). Measured on a CellPath IS unit at tol 2e-7
# (benchmarks/bench_cell_shard.py's engine calls, one thread): float64 evaluations of a problem 901 -> 594,
# 0.9x the CPU time, and max |delta P| from the converged fit 6.8e-4 -> 2.2e-4; on a LOOO unit the time the
# same. 0.25 was slower than 0.5 on both.
_EARLY_MARGIN = 0.5
# The two-loop recursion is split over the objective's threads from this many working problems on.
_PARALLEL_ROWS = 32
# Working arrays are compacted once this share of their problems has finished.
_COMPACT_SHARE = 0.1
# A warm start is checked in float64 first. A float32 gradient whose difference from the float64 one is this
# share of it or more is mostly rounding: float32 steps from there would wander (a start at or near the
# optimum; how far they wander before float32 stalls depends on the CPU's rounding), so the problem starts in
# float64, where scikit-learn's relative-decrease stop applies at once.
_ROUNDING_SHARE = 0.1
# Likewise where the first step's expected decrease of f is within this many times f's float32 rounding.
_ROUNDING_DECREASE = 100.0


class _Working:
    """The solver state of the problems not yet compacted away: row i is problem ``ids[i]``."""

    def __init__(self, x: torch.Tensor, history_size: int):
        R, P = x.shape
        self.ids = np.arange(R)
        self.x = x
        self.f = torch.empty(R, dtype=torch.float64, device=x.device)
        self.g = torch.empty_like(x)
        self.S = torch.zeros((history_size, R, P), dtype=torch.float64, device=x.device)
        self.Y = torch.zeros_like(self.S)
        self.rho = torch.zeros((history_size, R), dtype=torch.float64, device=x.device)
        self.gamma = torch.ones(R, dtype=torch.float64, device=x.device)
        self.has_history = np.zeros(R, dtype=bool)
        self.done = np.zeros(R, dtype=bool)
        self.phase = np.zeros(R, dtype=np.int64)
        self.flat = np.zeros(R, dtype=np.int64)  # float32 steps in a row without a decrease of f
        self.head = history_size - 1  # slot of the newest pair

    def compact(self, out: torch.Tensor) -> None:
        """Write the finished problems' points to ``out`` and drop them from the working arrays."""
        finished = np.flatnonzero(self.done)
        out[torch.as_tensor(self.ids[finished], device=out.device)] = self.x[
            torch.as_tensor(finished, device=out.device)]
        keep = np.flatnonzero(~self.done)
        k = torch.as_tensor(keep, device=self.x.device)
        self.ids, self.has_history, self.phase = self.ids[keep], self.has_history[keep], self.phase[keep]
        self.flat = self.flat[keep]
        self.done = self.done[keep]
        self.x, self.f, self.g, self.gamma = self.x[k], self.f[k], self.g[k], self.gamma[k]
        self.S, self.Y, self.rho = self.S[:, k], self.Y[:, k], self.rho[:, k]


def lbfgs(objective, theta, tol, max_iter, history_size, phases=(torch.float64,), check_start=False):
    """Lock-step L-BFGS over problems; returns (theta, n_iter (R,), converged (R,)).

    A problem stops when its stopping measure (``objective.gradient_max_abs``) is at most ``tol``, or, in
    float64, when f decreases by less than 64 float64 epsilons (relative), scikit-learn's two stops.
    ``phases`` are the product dtypes a problem goes through: when a phase stalls (no acceptable step, or
    no decrease) or meets ``_EARLY_MARGIN * tol`` before the last, the problem continues from the same point,
    and with the same history, in the next phase (a float32 gradient is not trusted to certify ``tol`` on its
    own).
    ``check_start`` (a warm start): the start is evaluated in float64 first; a problem that already meets
    ``tol`` there stops at once (0 iterations), and one whose float32 gradient is mostly rounding starts in
    float64.
    """
    R = theta.shape[0]
    shape = theta.shape[1:]
    out = theta.reshape(R, -1).clone()
    device = out.device
    last_phase = len(phases) - 1
    state = _Working(out.clone(), history_size)
    n_iter = np.zeros(R, dtype=np.int64)
    converged = np.zeros(R, dtype=bool)

    def evaluate(points: torch.Tensor, rows: np.ndarray, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        values, grads = objective(points, state.ids[rows], dtype)
        return values, grads.reshape(rows.size, -1)

    checks = np.zeros(R, dtype=np.int64)

    def measure(grads: torch.Tensor, rows: np.ndarray, exact: bool = False) -> np.ndarray:
        """Stopping measure of ``rows``; where the objective's cheap bounds straddle tol, the exact value
        every _EXACT_CHECK_EVERY-th time (else the upper bound: not yet met)."""
        ids = state.ids[rows]
        if exact:
            return objective.gradient_max_abs(grads, ids, exact=True)
        lower, upper = objective.gradient_bounds(grads, ids)
        unsure = np.flatnonzero((lower <= tol) & (upper > tol))
        if unsure.size:
            checks[ids[unsure]] += 1
            due = unsure[checks[ids[unsure]] % _EXACT_CHECK_EVERY == 1 % _EXACT_CHECK_EVERY]
            if due.size:
                upper[due] = objective.gradient_max_abs(grads[torch.as_tensor(due, device=grads.device)], ids[due])
        return upper

    def refresh(rows: np.ndarray) -> None:
        """f and g of ``rows`` at x in their current phase (after a change of phase)."""
        for p in np.unique(state.phase[rows]):
            group = rows[state.phase[rows] == p]
            t = torch.as_tensor(group, device=device)
            state.f[t], state.g[t] = evaluate(state.x[t], group, phases[p])

    def finish(rows: np.ndarray, met: np.ndarray) -> None:
        state.done[rows] = True
        converged[state.ids[rows]] = met

    pending: list[np.ndarray] = []  # moved on to a later phase, not yet evaluated there

    def advance_phase(rows: np.ndarray) -> None:
        """Problems stalled, or meeting tol, in their phase: on to the next phase (f and g evaluated there,
        and tol checked again, by ``flush``) if there is one, else stop."""
        final = rows[state.phase[rows] == last_phase]
        if final.size:
            finish(final, measure(state.g[torch.as_tensor(final, device=device)], final, exact=True) <= tol)
        later = rows[state.phase[rows] < last_phase]
        if later.size:
            state.phase[later] += 1
            pending.append(later)

    def flush() -> None:
        """f and g of the problems that moved on to a later phase, all of an iteration's in one evaluation
        per phase, and their tol checked there (which may move some on again)."""
        while pending:
            rows = np.concatenate(pending)
            pending.clear()
            refresh(rows)
            check_tol(rows)

    def check_tol(rows: np.ndarray) -> np.ndarray:
        """Problems whose stopping measure meets tol stop in the last phase; in an earlier one, where it
        meets _EARLY_MARGIN tol, the next phase confirms it."""
        last = state.phase[rows] == last_phase
        met = measure(state.g[torch.as_tensor(rows, device=device)], rows) <= np.where(last, tol, _EARLY_MARGIN * tol)
        final = met & last
        if final.any():
            finish(rows[final], True)
        advance_phase(rows[met & ~final])
        return met

    everything = np.arange(R)
    f64 = phases.index(torch.float64) if torch.float64 in phases else None
    if check_start and f64 is not None and f64 > 0:
        state.f, state.g = evaluate(state.x, everything, torch.float64)
        at_optimum = measure(state.g, everything, exact=True) <= tol
        finish(everything[at_optimum], True)
        rest = everything[~at_optimum]
        if rest.size:
            t = torch.as_tensor(rest, device=device)
            f_low, g_low = evaluate(state.x[t], rest, phases[0])
            noise = measure(g_low - state.g[t], rest, exact=True)
            rounding = noise >= _ROUNDING_SHARE * measure(state.g[t], rest, exact=True)
            # The first step (steepest descent, length min(1, 1 / |g|)) decreases f by about min(|g|^2, |g|):
            # where that is within the rounding of f, float32 could not tell a good step from a bad one.
            norm = state.g[t].norm(dim=1).cpu().numpy()
            f_rounding = np.abs((f_low - state.f[t]).cpu().numpy())
            rounding |= np.minimum(norm**2, norm) <= _ROUNDING_DECREASE * f_rounding
            state.phase[rest[rounding]] = f64
            low = torch.as_tensor(~rounding, device=device)
            state.f[t[low]], state.g[t[low]] = f_low[low], g_low[low]
            check_tol(rest)
    else:
        refresh(everything)
        check_tol(everything)
    flush()

    for _ in range(max_iter):
        if state.done.all():
            break
        if state.done.sum() >= max(1, _COMPACT_SHARE * state.done.size):
            state.compact(out)
        # Directions for every working problem at once (finished ones are at most a tenth of them).
        directions = -_two_loop(state, getattr(objective, "pool", None))
        state.head = (state.head + 1) % history_size
        slot = state.head
        # The new slot is empty unless a problem fills it below.
        state.S[slot].zero_()
        state.Y[slot].zero_()
        state.rho[slot].zero_()
        active_all = np.flatnonzero(~state.done)
        n_iter[state.ids[active_all]] += 1
        # Grouped by phase before any of them moves on: a problem takes one step per iteration.
        by_phase = [(p, active_all[state.phase[active_all] == p]) for p in np.unique(state.phase[active_all])]
        for p, rows in by_phase:
            _iterate(state, rows, directions, phases[p], slot, evaluate, check_tol, advance_phase, finish)
        flush()
    if not state.done.all():
        unfinished = np.flatnonzero(~state.done)
        finish(unfinished, measure(state.g[torch.as_tensor(unfinished, device=device)], unfinished, exact=True) <= tol)
    state.compact(out)
    return out.view(R, *shape), n_iter, converged


def _iterate(state, active, directions, dtype, slot, evaluate, check_tol, advance_phase, finish) -> None:
    """One iteration (direction, line search, history update, stopping tests) of the problems ``active``,
    all in the same phase (product dtype)."""
    device = state.x.device
    a = torch.as_tensor(active, device=device)
    # All working problems (the usual case right after a compaction): views, not gathers.
    full = active.size == state.x.shape[0]
    d = directions if full else directions[a]
    g = state.g if full else state.g[a]
    gd = torch.linalg.vecdot(g, d)
    # A non-descent direction means the curvature pairs went stale: restart from steepest descent.
    stale = gd >= 0
    if bool(stale.any()):
        d[stale] = -g[stale]
        gd[stale] = -(g[stale] ** 2).sum(dim=1)
        stale_rows = a[stale]
        state.rho[:, stale_rows] = 0
        state.gamma[stale_rows] = 1.0
        state.has_history[active[stale.cpu().numpy()]] = False
    step = torch.ones(active.size, dtype=torch.float64, device=device)
    first = torch.as_tensor(~state.has_history[active], device=device)
    step[first] = torch.clamp(1.0 / d[first].norm(dim=1), max=1.0)

    new_f = torch.empty(active.size, dtype=torch.float64, device=device)
    new_g = torch.empty_like(d)
    accepted = np.zeros(active.size, dtype=bool)
    f0 = state.f[a].cpu().numpy()
    gd0 = gd.cpu().numpy()
    x0 = state.x if full else state.x[a]
    for _trial in range(_MAX_LINE_SEARCH[dtype]):
        todo = np.flatnonzero(~accepted)
        if todo.size == 0:
            break
        t_todo = torch.as_tensor(todo, device=device)
        everyone = todo.size == active.size
        points = torch.addcmul(x0, step[:, None], d) if everyone else x0[t_todo] + step[t_todo, None] * d[t_todo]
        values, grads = evaluate(points, active[todo], dtype)
        slopes = torch.linalg.vecdot(grads, d if everyone else d[t_todo]).cpu().numpy()
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
        accepted[todo[ok]] = True
        if ok.all():
            new_f[t_todo], new_g[t_todo] = values, grads
            break
        ok_t = torch.as_tensor(ok, device=device)
        new_f[t_todo[ok_t]] = values[ok_t]
        new_g[t_todo[ok_t]] = grads[ok_t]
        # Rejected: minimiser of the quadratic through f(0), f'(0) and f(t), kept within [0.1 t, 0.5 t].
        t = steps[~ok]
        curvature = 2.0 * (values_np[~ok] - f0[todo[~ok]] - t * gd0[todo[~ok]])
        with np.errstate(invalid="ignore", divide="ignore"):
            t_new = np.where(finite[~ok] & (curvature > 0), -gd0[todo[~ok]] * t * t / curvature, 0.5 * t)
        step[t_todo[~ok_t]] = torch.as_tensor(np.clip(t_new, 0.1 * t, 0.5 * t), device=device)

    advance_phase(active[~accepted])  # no acceptable step along a descent direction: stalled
    acc = np.flatnonzero(accepted)
    if acc.size == 0:
        return
    rows = active[acc]
    acc_t = torch.as_tensor(acc, device=device)
    rows_t = torch.as_tensor(rows, device=device)
    s = step[acc_t, None] * d[acc_t]
    y_diff = new_g[acc_t] - g[acc_t]
    f_old, f_new = f0[acc], new_f[acc_t].cpu().numpy()
    state.x[rows_t] = x0[acc_t] + s
    state.g[rows_t] = new_g[acc_t]
    state.f[rows_t] = new_f[acc_t]
    sy = torch.linalg.vecdot(s, y_diff)
    yy = torch.linalg.vecdot(y_diff, y_diff)
    keep = (sy > 1e-10 * yy).cpu().numpy()
    if keep.any():
        k_rows = rows_t[torch.as_tensor(keep, device=device)]
        k_acc = torch.as_tensor(np.flatnonzero(keep), device=device)
        state.S[slot, k_rows] = s[k_acc]
        state.Y[slot, k_rows] = y_diff[k_acc]
        state.rho[slot, k_rows] = 1.0 / sy[k_acc]
        state.gamma[k_rows] = sy[k_acc] / yy[k_acc]
        state.has_history[rows[keep]] = True
    # Too small a decrease: scikit-learn's stop in float64. In float32, f carries the products' rounding (~1e-9
    # here, more than a step's decrease near a tight tol), so a step that does not decrease it (accepted on
    # the approximate Wolfe conditions, which rest on the slopes) says little; only _FLAT_STEPS such steps in
    # a row mean rounding's limit (stalled).
    no_progress = f_old - f_new <= _FTOL * np.maximum(np.maximum(np.abs(f_old), np.abs(f_new)), 1.0)
    met = check_tol(rows)
    no_progress &= ~met & ~state.done[rows]
    if dtype == torch.float64:  # scikit-learn's relative-reduction stop counts as converged
        finish(rows[no_progress], True)
    else:  # float32 rounding's limit: the next phase, or a stop that is converged only if tol is met
        state.flat[rows] = np.where(no_progress, state.flat[rows] + 1, 0)
        advance_phase(rows[no_progress & (state.flat[rows] >= _FLAT_STEPS)])


def _two_loop(state: _Working, pool=None) -> torch.Tensor:
    """H g for every working problem: the L-BFGS two-loop recursion over the shared ring buffer (empty
    slots have rho = 0 and change nothing), newest pair in slot ``state.head``; with a thread pool, its
    rows split over the pool's threads (torch releases the GIL; each thread's rows stay in its cache)."""
    R = state.g.shape[0]
    threads = getattr(pool, "_max_workers", 1) if pool is not None else 1
    if threads < 2 or R < _PARALLEL_ROWS:
        return _two_loop_rows(state, slice(0, R))
    cuts = np.linspace(0, R, threads + 1).astype(int)
    parts = list(pool.map(lambda ab: _two_loop_rows(state, slice(*ab)), zip(cuts[:-1], cuts[1:])))
    return torch.cat(parts)


def _two_loop_rows(state: _Working, rows: slice) -> torch.Tensor:
    S, Y, rho = state.S[:, rows], state.Y[:, rows], state.rho[:, rows]
    m = S.shape[0]
    q = state.g[rows].clone()
    alpha = [None] * m
    for i in range(m):  # newest to oldest
        slot = (state.head - i) % m
        a_i = rho[slot] * torch.linalg.vecdot(S[slot], q)
        q.addcmul_(a_i[:, None], Y[slot], value=-1.0)
        alpha[i] = a_i
    q *= state.gamma[rows, None]
    for i in range(m - 1, -1, -1):  # oldest to newest
        slot = (state.head - i) % m
        beta = rho[slot] * torch.linalg.vecdot(Y[slot], q)
        q.addcmul_((alpha[i] - beta)[:, None], S[slot])
    return q

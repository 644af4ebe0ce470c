"""The solver of the batched logistic engine: lock-step L-BFGS over many problems (scikit-learn's lbfgs role).

Each problem has its own history, step, line search and stopping, as scikit-learn's lbfgs on that problem
alone; the problems only share the calls to the objective, which evaluates many of them at once
(:mod:`fmaudit.probes._logistic_loss`).
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


def lbfgs(objective, theta, tol, max_iter, history_size, grad_scale=None, phases=(torch.float64,)):
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

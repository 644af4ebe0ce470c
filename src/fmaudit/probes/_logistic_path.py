"""The path from validated problems to fitted coefficients, per row layout (scikit-learn's
``_logistic_regression_path`` role): build the layout's rows (:mod:`~fmaudit.probes._row_store`), its
objective (:mod:`~fmaudit.probes._logistic_loss`), a start, run the solver (:mod:`~fmaudit.probes._lbfgs`) and
map the coefficients back to each subset's standardised (or raw) features."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy import linalg as scipy_linalg

from fmaudit.probes._lbfgs import lbfgs
from fmaudit.probes._logistic_loss import GroupedObjective, SharedRowsObjective
from fmaudit.probes._row_store import build_blocks, build_groups, numpy_dtype, standardised_store


@dataclass
class Problems:
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
    forms: tuple | None = None  # the grouped layout's allowed group forms (None: any, by the cost model)

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


def solve_shared(X, y, unique_sets, problem: Problems):
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


def solve_grouped(X, y, unique_sets, problem: Problems):
    """The grouped layout (:mod:`fmaudit.probes._row_store`): dense groups in one solve, row-space groups
    (coefficients in n_g instead of D coordinates per class) in another."""
    device, K, D = problem.device, problem.present.shape[1], X.shape[1]
    U = len(unique_sets)
    groups, centre, spread = build_groups(X, y, unique_sets, K, problem.standardize, problem.phases[0], device,
                                          choose_form=True, forms=problem.forms)
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
    for form in ("dense", "row_space", "whitened"):
        chosen = [g for g in groups if g.form == form]
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
                elif g.whitened:  # B = diag(1/a_u) V^T W: the start's component in V's span
                    VW = np.matmul(g.eigenbasis.cpu().numpy().T, init_W[g.problems])  # (c, r, K)
                    stretch = g.stretch(problem.tensor(problem.l2[g.problems])).cpu().numpy()
                    coefficients[rows, : g.width] = VW / stretch[:, :, None]
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
                coef = np.matmul(g.basis.double().cpu().numpy().T, turned)  # (c, D, K)
            elif g.whitened:  # W = V diag(a_u) B (Group)
                stretched = coef * g.stretch(problem.tensor(problem.l2[g.problems])).cpu().numpy()[:, :, None]
                coef = np.matmul(g.eigenbasis.cpu().numpy(), stretched)  # (c, D, K)
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

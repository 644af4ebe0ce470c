"""The cell-shard engine against scikit-learn at equal accuracy and equal work (used by bench_cell_shard.py).

The work: every (run, C) probe of a shard's first units, as ``fmaudit.analyses.cell_suite.run_cell_shard``
fits them (the same partitions, readouts, rows and C grid), C chosen on the same validation cells, scored on
the same test cells.

- Problems. One untimed shard run records every engine call (features, labels, training subsets, Cs).
- Reference. Each call refitted by the engine in float64 at tol 1e-10; checked against scikit-learn lbfgs at
  tol 1e-10 on the first call's largest-C problems (the slowest to converge), printed.
- Accuracy. max |delta P| over every (run, C) probe and every row of its call (the training and
  validation cells of the units fitted together) against the reference. Each side's tol is the largest of
  ``tols`` whose fits reach ``target`` (found per side, untimed, largest tol first).
- Timing (interleaved repeats, medians, wall and CPU seconds): the engine is the whole shard,
  ``run_cell_shard`` at its tol with ``n_threads`` threads (reading the features, every fit, the choice of C,
  the test scores; the engine calls side by side on ``n_threads`` cores, in worker processes and the shard's
  own, the workers started before timing as scikit-learn's are, their CPU seconds counted);
  scikit-learn is the same work as a loop, ``make_pipeline(StandardScaler(), LogisticRegression(C, tol,
  max_iter))`` on float64 features, one fit per (run, C), sequential with one BLAS thread, and the same loop
  split over worker processes (one thread each; two by default), its runs dealt to them one by one
  (``split_groups``). CPU seconds include the workers' (each reports its own).
- Bounds (``--ceiling``): ``ceiling``, the products of the engine's own iterations at the hot speed of one
  product repeated; ``loop_floor``, a lean lock-step L-BFGS at exactly the engine's iteration counts, timed.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from fmaudit.analyses import cell_suite
from fmaudit.cells.features import open_cell_features, readout_width
from fmaudit.cells.metrics import macro_auroc_present, macro_f1_present
from fmaudit.cells.protocols import make_partition, panel_from_manifests, read_fold_manifest
from fmaudit.probes import fit_logistic_batch
from fmaudit.probes import pool as fit_pool
from fmaudit.probes._lbfgs import _two_loop_rows
from fmaudit.probes._logistic_loss import cpu_threads
from fmaudit.probes._row_store import group_form, reuse_whitened

TOLS = (1e-3, 5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5, 5e-6, 2e-6, 1e-6, 5e-7, 2e-7, 1e-7, 5e-8, 2e-8, 1e-8)


@dataclass
class Call:
    """One engine call of the shard: its problems and the reference probabilities on its rows."""

    X: np.ndarray
    y: np.ndarray
    subsets: list
    Cs: np.ndarray
    n_classes: int
    engine: dict
    reference: np.ndarray | None = None  # (R, N, K)


def record_calls(runs, features, manifests, sections, kw) -> list[Call]:
    """The engine calls one shard run makes (untimed), with the keyword arguments it passes."""
    calls: list[Call] = []
    real = fit_pool.fit_logistic_batch

    def spy(X, y, subsets, Cs, n_classes, **engine):
        calls.append(Call(X=X, y=y, subsets=list(subsets), Cs=np.asarray(Cs, dtype=float), n_classes=n_classes,
                          engine=dict(engine)))
        return real(X, y, subsets, Cs, n_classes=n_classes, **engine)

    # the calls fitted here, one after another (worker processes would not see the spy)
    fit_pool.fit_logistic_batch = spy
    try:
        cell_suite.run_cell_shard(runs, features, manifests, sections, **dict(kw, call_workers=1))
    finally:
        fit_pool.fit_logistic_batch = real
    return calls


def add_references(calls: list[Call]) -> None:
    for call in calls:
        fit = fit_logistic_batch(call.X, call.y, call.subsets, call.Cs, call.n_classes, dtype=torch.float64,
                                 tol=1e-10, max_iter=100_000, standardize=call.engine.get("standardize", True),
                                 n_threads=call.engine.get("n_threads"))
        if not fit.converged_.all():
            raise SystemExit("reference: the float64 engine did not converge at tol 1e-10")
        call.reference = fit.predict_proba(call.X)


def sklearn_probe(X, y, C, tol, max_iter=1000):
    return make_pipeline(StandardScaler(), LogisticRegression(C=C, tol=tol, max_iter=max_iter)).fit(X, y)


def sklearn_proba(model, X, n_classes):
    out = np.zeros((X.shape[0], n_classes))
    out[:, model[-1].classes_] = model.predict_proba(X)
    return out


def check_reference(calls: list[Call]) -> float:
    """max |delta P| between the reference and scikit-learn lbfgs at tol 1e-10 on the first call's
    problems at its largest C."""
    call = calls[0]
    X64 = call.X.astype(np.float64)
    worst = 0.0
    with threadpool_limits(1):
        for r in np.flatnonzero(call.Cs == call.Cs.max()):
            idx = call.subsets[r]
            model = sklearn_probe(X64[idx], call.y[idx], call.Cs[r], 1e-10, 100_000)
            worst = max(worst, float(np.abs(sklearn_proba(model, X64, call.n_classes) - call.reference[r]).max()))
    return worst


def engine_error(calls: list[Call], tol: float, n_threads: int) -> float:
    worst = 0.0
    for call in calls:
        engine = dict(call.engine, tol=tol, n_threads=n_threads)
        fit = fit_logistic_batch(call.X, call.y, call.subsets, call.Cs, call.n_classes, **engine)
        worst = max(worst, float(np.abs(fit.predict_proba(call.X) - call.reference).max()))
    return worst


def sklearn_error(calls: list[Call], tol: float) -> float:
    worst = 0.0
    with threadpool_limits(1):
        for call in calls:
            X64 = call.X.astype(np.float64)
            for r, idx in enumerate(call.subsets):
                model = sklearn_probe(X64[idx], call.y[idx], call.Cs[r], tol)
                worst = max(worst, float(np.abs(sklearn_proba(model, X64, call.n_classes) - call.reference[r]).max()))
    return worst


def pick_tol(name: str, error_at, target: float, tols=TOLS, start: float | None = None, log=print):
    """The largest tol of ``tols`` whose error is at most ``target`` (the error grows with tol): from
    ``start`` (default: the middle of ``tols``) up while the target is met, or down until it is."""
    tols = sorted(tols, reverse=True)
    i = tols.index(min(tols, key=lambda t: abs(np.log(t / start)))) if start else len(tols) // 2
    errors: dict[float, float] = {}

    def error(j):
        if tols[j] not in errors:
            errors[tols[j]] = error_at(tols[j])
            log(f"  tol search {name}: tol {tols[j]:g} -> max |dP| {errors[tols[j]]:.2e}")
        return errors[tols[j]]

    if error(i) <= target:
        while i > 0 and error(i - 1) <= target:
            i -= 1
        return tols[i], errors[tols[i]]
    while i + 1 < len(tols):
        i += 1
        if error(i) <= target:
            return tols[i], errors[tols[i]]
    raise SystemExit(f"{name}: no tol in {tols} reaches max |dP| <= {target:g}")


class SklearnShard:
    """The shard's work with scikit-learn: per (unit, seed), per run, one pipeline per C."""

    def __init__(self, root: Path, protocol: str, sections: dict, kw: dict, features: dict, manifests: dict,
                 folds_path: Path):
        self.root, self.protocol, self.sections, self.kw = Path(root), protocol, sections, kw
        self.features, self.manifests, self.folds_path = features, manifests, folds_path
        self._opened = None

    def _open(self):
        if self._opened is None:
            panel = panel_from_manifests(self.manifests, ["fine", "coarse"], self.kw["n_classes"])
            folds = read_fold_manifest(self.folds_path, self.sections, self.kw["n_folds"])
            opened = {s: open_cell_features(p) for s, p in self.features.items()}
            self._opened = panel, folds, opened
        return self._opened

    def run(self, groups, tol: float) -> tuple[dict, float]:
        """Fit every run of ``groups`` [(unit, seed, [(index, taxonomy, readout), ...]), ...]; returns
        ({index: (macro_f1, C)}, CPU seconds)."""
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = time.process_time()
        panel, folds, opened = self._open()
        kw = self.kw

        def rows_readout(rows, readout):
            parts = []
            for code in np.unique(panel.section_code[rows]):
                s = panel.sections[code]
                local = rows[panel.section_code[rows] == code] - panel.offsets[code]
                parts.append(opened[s].readout(readout, local))
            return np.concatenate(parts).astype(np.float64)

        out = {}
        with threadpool_limits(1):
            for unit, seed, runs in groups:
                part = make_partition(panel, self.protocol, str(unit), int(seed), sections_by_organ=self.sections,
                                      folds=folds, taxonomies=["fine", "coarse"], roi_fraction=kw["roi_fraction"],
                                      val_fraction=kw["val_fraction"], max_train_cells=kw["max_train_cells"],
                                      max_val_cells=kw["max_val_cells"])
                for index, taxonomy, readout in runs:
                    lab = panel.labels[taxonomy]
                    k = panel.n_classes[taxonomy]
                    tr, va, te = (r[lab[r] >= 0] for r in (part.train, part.val, part.test))
                    Xtr, Xva, Xte = (rows_readout(r, readout) for r in (tr, va, te))
                    best = None
                    for C in kw["Cs"]:
                        model = sklearn_probe(Xtr, lab[tr], C, tol)
                        f1 = macro_f1_present(lab[va], model.predict(Xva), k)
                        if best is None or f1 > best[0]:
                            best = (f1, C, model)
                    proba = sklearn_proba(best[2], Xte, k).astype(np.float32)
                    f1 = macro_f1_present(lab[te], proba.argmax(1), k)
                    macro_auroc_present(lab[te].astype(np.int64), proba)
                    out[index] = (f1, best[1])
        return out, time.process_time() - start


def _worker_run(shard: SklearnShard, groups, tol):
    return shard.run(groups, tol)


def run_groups(runs) -> list:
    """(unit, seed, [(index, taxonomy, readout), ...]) per (unit, seed) of a shard's runs."""
    out = []
    for (unit, seed), group in runs.groupby(["unit", "seed"], sort=False, observed=True):
        out.append((str(unit), int(seed), [(int(i), str(r.taxonomy), str(r.readout)) for i, r in group.iterrows()]))
    return out


def split_groups(groups, parts: int) -> list[list]:
    """``parts`` shares of the runs with about as much work each: runs dealt one by one, largest first (a
    run's work taken as its readout's width), to the least loaded share, then regrouped by (unit, seed)
    within each share (a share draws a (unit, seed)'s partition once). Dealt by run, not by (unit, seed): a
    shard's first unit has only a few seeds, and whole (unit, seed) groups would leave one process idle
    (one seed: all the work in one process) and make the baseline weaker than it is."""
    runs = [(unit, seed, run) for unit, seed, group in groups for run in group]
    order = sorted(range(len(runs)), key=lambda i: -readout_width(runs[i][2][2], 1))
    shares: list[dict] = [{} for _ in range(parts)]
    loads = [0] * parts
    for i in order:
        unit, seed, run = runs[i]
        p = loads.index(min(loads))
        shares[p].setdefault((unit, seed), []).append(run)
        loads[p] += readout_width(run[2], 1)
    return [[(unit, seed, share[(unit, seed)]) for unit, seed in share] for share in shares if share]


def children_cpu() -> float:
    """CPU seconds of this process's ended children (the shard's engine workers once the shard returns)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def processes_cpu(pids) -> float:
    """CPU seconds so far of the running processes ``pids`` (Linux /proc; user + system)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def time_sides(repeats: int, engine_run, shard: SklearnShard, groups, sk_tol: float, processes: int = 2,
               log=print, engine_pids=()) -> dict:
    """Interleaved repeats of: the engine's shard, scikit-learn sequential, scikit-learn in ``processes``
    processes. Returns per side the wall and CPU seconds of each repeat and the last repeat's per-run
    results. ``engine_pids``: the engine's worker processes started before timing, whose CPU seconds count
    as the engine's."""
    parallel = f"sklearn, {processes} processes"
    times = {name: {"wall": [], "cpu": []} for name in ("engine", "sklearn, sequential", parallel)}
    results = {}
    shares = split_groups(groups, processes)
    with ProcessPoolExecutor(max_workers=processes) as pool:
        list(pool.map(abs, range(processes)))  # start the workers before anything is timed
        for rep in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time() + children_cpu() + processes_cpu(engine_pids)
            results["engine"] = engine_run()
            times["engine"]["wall"].append(time.perf_counter() - wall)
            # a shard's own worker processes have ended with it (their CPU seconds are the children's); those
            # started before timing are read while they run
            times["engine"]["cpu"].append(time.process_time() + children_cpu() + processes_cpu(engine_pids) - cpu)
            wall = time.perf_counter()
            results["sklearn"], seconds = shard.run(groups, sk_tol)
            times["sklearn, sequential"]["wall"].append(time.perf_counter() - wall)
            times["sklearn, sequential"]["cpu"].append(seconds)
            wall = time.perf_counter()
            parts = list(pool.map(_worker_run, [shard] * len(shares), shares, [sk_tol] * len(shares)))
            times[parallel]["wall"].append(time.perf_counter() - wall)
            times[parallel]["cpu"].append(sum(seconds for _, seconds in parts))
            log(f"  repeat {rep + 1}: " + ", ".join(f"{name} {t['wall'][-1]:.1f} s" for name, t in times.items())
                + f"; load average {os.getloadavg()[0]:.1f}")
    return {"times": times, "results": results}


def product_gflops(rows: int, width: int, columns: int, repeats: int = 20) -> float:
    """Single-threaded float32 GFLOP/s of one evaluation's two products on ``rows`` x ``width`` features for
    ``columns`` (problems x classes) columns, in the groups' (columns, rows) layout."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((rows, width), dtype=np.float32)
    W = rng.standard_normal((columns, width), dtype=np.float32)
    G = rng.standard_normal((columns, rows), dtype=np.float32)
    times = []
    with threadpool_limits(1):
        W @ X.T, G @ X
        for _ in range(repeats):
            start = time.perf_counter()
            W @ X.T
            G @ X
            times.append(time.perf_counter() - start)
    return 4 * rows * width * columns / statistics.median(times) / 1e9


def ceiling(calls: list[Call], tol: float, threads: int, baseline_seconds: float) -> dict:
    """What any engine of this kind could reach here: the FLOPs of the two products per L-BFGS iteration the
    engine itself takes at ``tol`` (every (row, problem) pair, on each subset's features or, where the
    engine's cost model picks them, its n x n row-space factor or its min(n, D) whitened coordinates
    (the model as it would choose without a kept whitened form); line-search retries and confirmations left
    out), at this machine's single-threaded float32 product speed on ``threads`` threads, one problem wide
    (K columns) and all of a subset's C values wide (len(Cs) x K); returns those times and the ratios to
    ``baseline_seconds`` (the strongest baseline's whole run: fits, scoring and reading) they allow."""
    flops = 0.0
    seconds = {"narrow": 0.0, "wide": 0.0}
    speeds: dict[tuple, float] = {}
    for call in calls:
        fit = fit_logistic_batch(call.X, call.y, call.subsets, call.Cs, call.n_classes,
                                 **dict(call.engine, tol=tol, n_threads=threads))
        per_subset = max(1, len(call.Cs) // max(1, len({np.sort(s).tobytes() for s in call.subsets})))
        for subset, iterations in zip(call.subsets, fit.n_iter_):
            rows = np.unique(subset).size
            width = call.X.shape[1]
            form = group_form(rows, width, per_subset, call.n_classes, call.engine.get("standardize", True))
            width = {"dense": width, "row_space": rows, "whitened": min(rows, width)}[form]
            work = 4.0 * rows * width * call.n_classes * int(iterations)
            flops += work
            for name, columns in (("narrow", call.n_classes), ("wide", call.n_classes * per_subset)):
                key = (rows, width, columns)
                if key not in speeds:
                    speeds[key] = product_gflops(rows, width, columns)
                seconds[name] += work / (threads * speeds[key] * 1e9)
    return {"gflop": flops / 1e9, "seconds": seconds,
            "ratio": {name: baseline_seconds / t for name, t in seconds.items()}}


def _engine_groups(call: Call, tol: float) -> dict:
    """The engine's own fit of ``call`` at ``tol`` on one CPU thread (as a shard's worker runs it), with what the
    grouped layout built for it: its groups (rows, features, labels, weights, whitening), the distinct
    problems' penalties and iteration counts, and the CPU seconds of building the groups (the forms' one-off
    work: scaling, covariance or Gram matrices, eigendecompositions, whitened rows)."""
    from fmaudit.probes import _logistic_path, logistic_batch

    seen: dict = {"build": 0.0}
    build, solve = _logistic_path.build_groups, logistic_batch.solve_grouped

    def timed_build(*args, **kwargs):
        start = time.process_time()
        out = build(*args, **kwargs)
        seen["build"] += time.process_time() - start
        seen["groups"] = out[0]
        return out

    def kept_solve(X, y, unique_sets, problem):
        seen["l2"] = problem.l2
        return solve(X, y, unique_sets, problem)

    _logistic_path.build_groups, logistic_batch.solve_grouped = timed_build, kept_solve
    try:
        fit = fit_logistic_batch(call.X, call.y, call.subsets, call.Cs, call.n_classes,
                                 **dict(call.engine, tol=tol, n_threads=1, device="cpu"))
    finally:
        _logistic_path.build_groups, logistic_batch.solve_grouped = build, solve
    if "groups" not in seen:
        raise SystemExit("floor: an engine call used the shared layout; the floor covers the grouped layout only")
    n_iter = np.zeros(len(seen["l2"]), dtype=np.int64)
    n_iter[fit.problem_index_] = fit.n_iter_
    return {"groups": seen["groups"], "l2": seen["l2"], "n_iter": n_iter, "K": call.n_classes,
            "build": seen["build"]}


def _lean_loop(call: dict, products: bool = True, history: int = 10) -> float:
    """CPU seconds of a lean lock-step L-BFGS over ``call``'s groups (:func:`_engine_groups`) that runs each
    problem for exactly the engine's own iteration count, with one evaluation per iteration (no line-search
    retries, no float64 phase, no stopping tests beyond one max-abs gradient), the engine's product layout
    (per group one float32 product for the logits and one for the gradient, as wide as the group's problems
    still running, written into one padded buffer whose softmax runs once) and the engine's float64 state
    and two-loop recursion (its own function); working arrays gathered down to the running problems whenever one stops.
    ``products=False``: the same loop without the two products (what the rest of it costs)."""
    K = call["K"]
    groups = sorted(call["groups"], key=lambda g: -int(call["n_iter"][g.problems].max()))
    l2_all = torch.as_tensor(call["l2"], dtype=torch.float64)
    slots = []  # (group index, problem id), groups in order, each group's problems longest first
    for gi, g in enumerate(groups):
        slots += [(gi, int(u)) for u in sorted(g.problems, key=lambda u: -int(call["n_iter"][u]))]
    group_of = np.array([gi for gi, _ in slots])
    problem_of = np.array([u for _, u in slots])
    iters = call["n_iter"][problem_of]
    n_max = max(int(g.y.shape[0]) for g in groups)
    p_max = max(int(g.width) for g in groups)
    U, P = len(slots), (p_max + 1) * K
    features = [g.features_in(torch.float32).numpy() for g in groups]
    stretch = torch.ones((U, p_max, 1), dtype=torch.float64)
    labels = torch.zeros((U, 1, n_max), dtype=torch.long)
    weight = torch.zeros((U, n_max, 1), dtype=torch.float64)
    for k, (gi, u) in enumerate(slots):
        g = groups[gi]
        n, p = int(g.y.shape[0]), int(g.width)
        if g.whitened:
            stretch[k, :p, 0] = g.stretch(l2_all[[u]])[0]
        stretch[k, p:, 0] = 0.0
        labels[k, 0, :n] = g.y
        weight[k, :n, 0] = g.weight
    l2 = l2_all[problem_of]

    def evaluate(x, rows):
        A = rows.size
        theta = x.view(A, p_max + 1, K)
        W, b = theta[:, :p_max], theta[:, p_max]
        st, lab, w, pen = stretch[rows], labels[rows], weight[rows], l2[rows]
        Wt = (W * st).transpose(1, 2).to(torch.float32).contiguous()  # (A, K, p_max)
        Z = torch.zeros((A, K, n_max), dtype=torch.float32)
        grad_products = torch.zeros((A, K, p_max), dtype=torch.float32)
        cuts = np.searchsorted(group_of[rows], np.arange(len(groups) + 1))
        if products:
            for gi, X in enumerate(features):
                a0, a1 = cuts[gi], cuts[gi + 1]
                if a1 > a0:
                    n, p = X.shape
                    np.matmul(Wt[a0:a1, :, :p].reshape(-1, p).numpy(), X.T,
                              out=Z[a0:a1].view(-1, n_max)[:, :n].numpy())
        Z += b.to(torch.float32)[:, :, None]
        true_logit = Z.gather(1, lab)
        top = Z.amax(dim=1, keepdim=True)
        Z -= top
        Z.exp_()
        total = Z.sum(dim=1, keepdim=True)
        loss = torch.matmul((total.log() + top - true_logit).double(), w).view(A)
        w_in = w.view(A, 1, n_max).to(torch.float32)
        Z *= w_in / total
        Z.scatter_add_(1, lab, -w_in)
        if products:
            for gi, X in enumerate(features):
                a0, a1 = cuts[gi], cuts[gi + 1]
                if a1 > a0:
                    n, p = X.shape
                    np.matmul(Z[a0:a1].view(-1, n_max)[:, :n].numpy(), X,
                              out=grad_products[a0:a1].view(-1, p_max)[:, :p].numpy())
        W_penalised = W * (st * st)
        grad = torch.empty((A, p_max + 1, K), dtype=torch.float64)
        grad[:, :p_max] = grad_products.double().transpose(1, 2) * st + pen[:, None, None] * W_penalised
        grad[:, p_max] = Z.sum(dim=2, dtype=torch.float64)
        return loss + 0.5 * pen * (W * W_penalised).sum(dim=(1, 2)), grad.view(A, P)

    start = time.process_time()
    rows = np.arange(U)
    x = torch.zeros((U, P), dtype=torch.float64)
    S = torch.zeros((history, U, P), dtype=torch.float64)
    Y, rho = torch.zeros_like(S), torch.zeros((history, U), dtype=torch.float64)
    gamma, head = torch.ones(U, dtype=torch.float64), history - 1
    f, g = evaluate(x, rows)
    t = 0
    while True:
        running = iters[rows] > t
        if not running.all():
            if not running.any():
                break
            keep = torch.as_tensor(np.flatnonzero(running))
            rows = rows[running]
            x, g, f, gamma, S, Y, rho = x[keep], g[keep], f[keep], gamma[keep], S[:, keep], Y[:, keep], rho[:, keep]
        # the engine's own two-loop recursion over the ring buffer
        d = -_two_loop_rows(SimpleNamespace(S=S, Y=Y, rho=rho, gamma=gamma, g=g, head=head), slice(None))
        step = torch.clamp(1.0 / d.norm(dim=1), max=1.0) if t == 0 else torch.ones(rows.size, dtype=torch.float64)
        slope = torch.linalg.vecdot(g, d)
        x_new = torch.addcmul(x, step[:, None], d)
        f_new, g_new = evaluate(x_new, rows)
        # the line search's tests and the stopping measure, read on the host as the engine does
        (f_new <= f + 1e-4 * step * slope).numpy(), torch.linalg.vecdot(g_new, d).numpy()
        g_new.abs().amax(dim=1).numpy()
        s, y_diff = x_new - x, g_new - g
        sy, yy = torch.linalg.vecdot(s, y_diff), torch.linalg.vecdot(y_diff, y_diff)
        curved = sy > 1e-10 * yy
        head = (head + 1) % history
        S[head], Y[head] = s, y_diff
        rho[head] = torch.where(curved, 1.0 / sy, torch.zeros_like(sy))
        gamma = torch.where(curved, sy / yy, gamma)
        x, g, f = x_new, g_new, f_new
        t += 1
    return time.process_time() - start


def loop_floor(calls: list[Call], tol: float, threads: int, baseline_seconds: float) -> dict:
    """A measured floor of this engine's design on this machine: each call fitted by the engine at ``tol``
    on one thread (its groups, forms and iteration counts recorded), then a lean lock-step L-BFGS
    (:func:`_lean_loop`) run at exactly those iteration counts. Returns the CPU seconds of: the lean loop's
    products alone (the loop with them less the loop without), the forms' one-off work (the engine's own,
    fine and coarse calls sharing eigendecompositions as in a shard; the lesser of two passes), and the rest
    of the lean loop; each cumulative sum spread over ``threads`` threads without loss, as ratios to
    ``baseline_seconds`` (the strongest baseline's whole run). What the floor leaves out (line-search
    retries, the float64 phase, the shard's reading and scoring) only adds to a real engine's time."""
    with cpu_threads(torch.device("cpu"), 1):  # one torch and one BLAS thread, as a shard's worker fits
        # Two passes, each sharing forms between a readout's calls as a shard does and nothing with the other
        # pass; the lesser one-off counts (the first fits of a process also pay their allocations).
        with reuse_whitened():
            recorded = [_engine_groups(call, tol) for call in calls]
        with reuse_whitened():
            again = [_engine_groups(call, tol) for call in calls]
        for call, other in zip(recorded, again):
            call["build"] = min(call["build"], other["build"])
        with_products = sum(_lean_loop(call) for call in recorded)
        without = sum(_lean_loop(call, products=False) for call in recorded)
    one_off = sum(call["build"] for call in recorded)
    products = max(with_products - without, 0.0)
    seconds = {"products": products, "products + one-off": products + one_off,
               "lean loop + one-off": with_products + one_off}
    return {"cpu": seconds, "iterations": int(sum(call["n_iter"].sum() for call in recorded)),
            # on toy calls the products can vanish in the timing noise (no bound then: inf)
            "ratio": {name: baseline_seconds * threads / t if t > 0 else float("inf") for name, t in seconds.items()}}


def summarise(times: dict, n_runs: int) -> dict:
    medians = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
    baselines = [name for name in medians if name != "engine"]
    best = min(baselines, key=lambda name: medians[name]["wall"])
    return {
        "medians": medians,
        "runs_per_s": {name: n_runs / m["wall"] for name, m in medians.items()},
        "strongest": best,
        "ratio_wall": medians[best]["wall"] / medians["engine"]["wall"],
        "ratio_cpu": min(medians[name]["cpu"] for name in baselines) / medians["engine"]["cpu"],
    }

"""FitPool: engine calls side by side in worker processes and this one give what they give one after another."""

from __future__ import annotations

import numpy as np
import pytest

from fmaudit.io import FmauditInputError
from fmaudit.probes import fit_logistic_batch
from fmaudit.probes.pool import FitPool, WorkerError


def _calls(n_calls=4, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_calls):
        X = rng.standard_normal((120, 6)).astype(np.float32)
        y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 1).astype(np.int64)
        subsets = [np.arange(0, 80), np.arange(40, 120)]
        out.append((X, y, subsets, np.array([0.1, 1.0 + i])))
    return out


def test_calls_side_by_side_equal_the_calls_here():
    calls = _calls()
    engine = dict(tol=1e-10, max_iter=5000, dtype=None, device="cpu")
    alone = [fit_logistic_batch(X, y, s, Cs, n_classes=3, n_threads=1, **engine) for X, y, s, Cs in calls]
    with FitPool(2) as pool:
        assert pool.parallel and len(pool._processes) == 1  # one worker process and this one
        futures = [pool.submit(X, y, s, Cs, 3, n_threads=2, **engine) for X, y, s, Cs in calls]
        together = [f.result(timeout=120) for f in futures]
        processes = list(pool._processes)
    assert all(p.poll() is not None for p in processes), "close() leaves a worker running"
    for (X, *_), a, b in zip(calls, alone, together):
        np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), atol=1e-9)
        assert b.converged_.all()


def test_one_worker_fits_here_at_once():
    X, y, s, Cs = _calls(1)[0]
    with FitPool(1) as pool:
        assert not pool.parallel
        future = pool.submit(X, y, s, Cs, 3, tol=1e-8)
        assert future.done()
        np.testing.assert_allclose(future.result().predict_proba(X).sum(axis=-1), 1.0)
        bad = pool.submit(X, np.full_like(y, 7), s, Cs, 3)
        with pytest.raises(FmauditInputError):
            bad.result()


def test_a_failing_call_reaches_the_caller_and_the_pool_goes_on():
    X, y, s, Cs = _calls(1)[0]
    with FitPool(2) as pool:
        bad = [pool.submit(X, np.full_like(y, 7), s, Cs, 3) for _ in range(4)]
        good = pool.submit(X, y, s, Cs, 3, tol=1e-8)
        for future in bad:
            # in this process the engine's own error; from the worker, its traceback naming that error
            with pytest.raises((FmauditInputError, WorkerError), match="label|FmauditInputError"):
                future.result(timeout=120)
        assert good.result(timeout=120).converged_.all()


def test_calls_submitted_together_run_in_one_process_in_order():
    calls = _calls(3, seed=2)
    engine = dict(tol=1e-10, max_iter=5000, dtype=None, device="cpu", forms=["whitened"], layout="grouped")
    alone = [fit_logistic_batch(X, y, s, Cs, n_classes=3, n_threads=1, **engine) for X, y, s, Cs in calls]
    for workers in (1, 2):
        with FitPool(workers) as pool:
            pool.wait_ready()
            assert len(pool.worker_pids) == workers - 1
            futures = pool.submit_together([((X, y, s, Cs, 3), engine) for X, y, s, Cs in calls])
            together = [f.result(timeout=120) for f in futures]
        for (X, *_), a, b in zip(calls, alone, together):
            np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), atol=1e-9)


def test_problem_shares_split_only_calls_that_pay_and_always_the_same_way():
    import torch

    from fmaudit.probes.logistic_batch import problem_shares

    cpu = torch.device("cpu")
    rng = np.random.default_rng(0)
    # the PRISM tile grid's shape: nested fractions of 10,000 rows, 1,024 features, 9 classes
    sizes = [100] * 3 + [500] * 3 + [1000] * 3 + [2500] * 3 + [5000] * 3 + [10_000]
    grid = [np.sort(rng.choice(10_000, n, replace=False)) for n in sizes]
    shares = problem_shares(grid, 1024, 9, 2, cpu)
    assert shares is not None and len(shares) == 2
    assert sorted(np.concatenate(shares).tolist()) == list(range(len(grid)))  # a partition of the problems
    loads = [sum(sizes[u] for u in share) for share in shares]
    assert max(loads) <= 0.55 * sum(sizes)  # dealt largest first: balanced
    again = problem_shares(grid, 1024, 9, 2, cpu)
    assert all(np.array_equal(a, b) for a, b in zip(shares, again))
    assert len(problem_shares(grid, 1024, 9, 8, cpu)) == 8
    # one worker, one problem, or a GPU: nothing to split; a small call: the split would not pay its sending
    assert problem_shares(grid, 1024, 9, 1, cpu) is None
    assert problem_shares(grid[-1:], 1024, 9, 2, cpu) is None
    assert problem_shares(grid, 1024, 9, 2, torch.device("cuda")) is None
    assert problem_shares([np.arange(80), np.arange(40, 120)], 6, 3, 2, cpu) is None


def test_a_call_split_over_processes_gives_each_problem_its_own_fit(monkeypatch):
    import torch

    from fmaudit.probes import logistic_batch
    from fmaudit.probes.pool import close_shared_pools, shared_pool

    rng = np.random.default_rng(3)
    X = rng.standard_normal((300, 8)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5).astype(np.int64)
    base = [np.arange(0, 150), np.arange(100, 300), np.arange(0, 300)]
    # a repeated row counts twice; an identical (subset, C) pair is fitted once and shared
    subsets = base + [np.concatenate([np.arange(50, 200), np.arange(50, 60)]), np.arange(0, 150)]
    Cs = np.array([0.5, 1.0, 2.0, 1.0, 0.5])
    engine = dict(tol=1e-10, max_iter=5000, device="cpu")
    alone = fit_logistic_batch(X, y, subsets, Cs, 3, n_threads=1, **engine)
    close_shared_pools()
    fit_logistic_batch(X, y, subsets, Cs, 3, pool=shared_pool(2), **engine)
    assert not shared_pool(2).worker_pids, "the shared pool started processes for a call it does not split"
    assert logistic_batch.problem_shares(subsets[:4], 8, 3, 2, torch.device("cpu")) is None  # too small...
    monkeypatch.setattr(logistic_batch, "_SPLIT_MIN_SAVING_S", float("-inf"))  # ...so the split is forced
    try:
        split = fit_logistic_batch(X, y, subsets, Cs, 3, pool=shared_pool(2), **engine)
        assert shared_pool(2).worker_pids, "no worker process took a share"
        again = fit_logistic_batch(X, y, subsets, Cs, 3, pool=shared_pool(2), **engine)
        # a warm start reaches each share's problems: one step from the start, as without the split
        start = fit_logistic_batch(X, y, subsets, Cs * 3, 3, n_threads=1, **engine)
        one_step = dict(engine, max_iter=1, init=(start.W_, start.b_), layout="shared")  # one form either way
        warm = fit_logistic_batch(X, y, subsets, Cs, 3, pool=shared_pool(2), **one_step)
        # a pool without workers splits nothing
        unsplit = fit_logistic_batch(X, y, subsets, Cs, 3, n_threads=1, pool=shared_pool(1), **engine)
        np.testing.assert_array_equal(unsplit.W_, alone.W_)
    finally:
        close_shared_pools()
    assert split.converged_.all()
    np.testing.assert_array_equal(split.problem_index_, alone.problem_index_)
    for r in range(len(subsets)):
        # the same optimum, reached by other lock-step paths: within tol's reach
        np.testing.assert_allclose(split.predict_proba(X, r), alone.predict_proba(X, r), atol=1e-6)
        np.testing.assert_allclose(split.mean_[r], alone.mean_[r], rtol=1e-6)
    np.testing.assert_array_equal(split.W_, again.W_)  # the same shares every time: the same numbers
    warm_alone = fit_logistic_batch(X, y, subsets, Cs, 3, n_threads=1, **one_step)
    cold = fit_logistic_batch(X, y, subsets, Cs, 3, n_threads=1, **dict(engine, max_iter=1))
    np.testing.assert_allclose(warm.W_, warm_alone.W_, atol=1e-5)
    assert np.abs(cold.W_ - warm_alone.W_).max() > 1e-2

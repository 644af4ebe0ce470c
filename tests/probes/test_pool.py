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

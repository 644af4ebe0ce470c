"""Independent engine calls side by side: on CPU, one worker process per thread, each call single-threaded.

A cell shard makes one engine call per (readout, taxonomy) of a group of units; the calls share nothing but
their inputs. Within one call, the engine can split each evaluation's products over threads
(:func:`fmaudit.probes.fit_logistic_batch`'s ``n_threads``), which pays when one evaluation is large (the tile
grid's 10,000-row problems). On small problems it does not: between two products the solver runs many small
torch and numpy operations that hold Python's GIL, and a thread that hands its product back waits for the GIL
for up to the interpreter's switch interval. Measured on a CellPath IS unit (14 calls of 20 problems,
~764 cells x 384 or 768 features; ``benchmarks/bench_cell_shard.py``): the calls one after another, each on 2
threads, took longer than on 1 thread. Worker processes share no GIL: each call runs single-threaded in its own
process, so two cores do two calls at once.

:class:`FitPool` is that: ``submit`` sends one call to a worker and returns a future of the fitted
:class:`~fmaudit.probes.logistic_batch.BatchLogistic`; with ``workers <= 1`` it fits at once in this process
with the ``n_threads`` it is given (a future already done), so a caller has one code path either way. Workers
are spawned (not forked: torch's thread pools do not survive a fork), start single-threaded (torch and BLAS),
and are started once per pool, so a shard pays their start (about a second each, importing torch) once.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from fmaudit.probes.logistic_batch import BatchLogistic, fit_logistic_batch

# The limits set in a worker: kept for the worker's life (threadpoolctl restores them only when asked).
_WORKER_LIMITS: list = []


def _start_worker() -> None:
    torch.set_num_threads(1)
    _WORKER_LIMITS.append(threadpool_limits(limits=1))


def _fit_call(X: np.ndarray, y: np.ndarray, subsets: list, Cs: np.ndarray, n_classes: int,
              engine: dict[str, Any]) -> BatchLogistic:
    return fit_logistic_batch(X, y, subsets, Cs, n_classes=n_classes, **dict(engine, n_threads=1))


class FitPool:
    """Engine calls fitted in ``workers`` single-threaded worker processes, or here when ``workers <= 1``.

    Parameters
    ----------
    workers : int
        Worker processes (the cores the calls may use). ``<= 1``: no process is started, and each call is
        fitted in this process when it is submitted, with the ``n_threads`` of its engine settings.

    Examples
    --------
    >>> with FitPool(2) as pool:  # doctest: +SKIP
    ...     futures = [pool.submit(X, y, subsets, Cs, n_classes=9, tol=1e-6) for X in readouts]
    ...     models = [f.result() for f in futures]
    """

    def __init__(self, workers: int):
        self.workers = max(1, int(workers))
        self._executor: ProcessPoolExecutor | None = None
        if self.workers > 1:
            self._executor = ProcessPoolExecutor(max_workers=self.workers, initializer=_start_worker,
                                                 mp_context=multiprocessing.get_context("spawn"))

    @property
    def parallel(self) -> bool:
        """True when calls run in worker processes (each single-threaded)."""
        return self._executor is not None

    def submit(self, X: np.ndarray, y: np.ndarray, subsets: list, Cs: np.ndarray, n_classes: int,
               **engine: Any) -> Future:
        """One engine call, :func:`~fmaudit.probes.logistic_batch.fit_logistic_batch`'s arguments.

        Parameters
        ----------
        X : ndarray of shape (N, D)
            The call's feature rows (sent to a worker by pickling: only the rows its subsets use).
        y : ndarray of shape (N,)
            Class index of each row.
        subsets : list of ndarray
            Row indices of ``X`` per problem.
        Cs : ndarray of shape (R,)
            Inverse L2 strength per problem.
        n_classes : int
            K, the columns of every problem's parameters.
        **engine
            The engine's keyword settings (tol, max_iter, standardize, dtype, device, n_threads). In a worker,
            ``n_threads`` is 1 whatever is given.

        Returns
        -------
        concurrent.futures.Future
            Its ``result()`` is the fitted :class:`~fmaudit.probes.logistic_batch.BatchLogistic` (or raises
            the call's exception).
        """
        if self._executor is not None:
            return self._executor.submit(_fit_call, X, y, subsets, Cs, n_classes, engine)
        future: Future = Future()
        try:
            future.set_result(fit_logistic_batch(X, y, subsets, Cs, n_classes=n_classes, **engine))
        except Exception as exc:  # the caller sees it at result(), as from a worker
            future.set_exception(exc)
        return future

    def close(self) -> None:
        """Stop the workers (waiting for calls in flight); the pool cannot be used after."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> FitPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

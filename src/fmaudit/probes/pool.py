"""Independent engine calls side by side: on CPU, one process per thread, each call single-threaded.

A cell shard makes one engine call per (readout, taxonomy) of a group of units; the calls share nothing but
their inputs. Within one call, the engine can split each evaluation's products over threads
(:func:`fmaudit.probes.fit_logistic_batch`'s ``n_threads``), but that rarely pays: between two products the
solver runs many small torch and numpy operations that take Python's GIL, and threads contend for it (on the
tile grid's 10,000-row problems, 2 threads took 5.2 s where 1 took 3.5 s). So a large call given a ``pool``
(this module's :func:`shared_pool`) is itself split by problem over its processes. Measured on a CellPath
IS unit too (14 calls of 20 problems, ~764 cells x 384 or 768 features; ``benchmarks/bench_cell_shard.py``):
the calls one after another, each on 2 threads, took longer than on 1 thread. Worker processes share no GIL:
each call runs single-threaded in its own process, so two cores do two calls at once.

:class:`FitPool` is that: ``submit`` queues one call and returns a future of the fitted
:class:`~fmaudit.probes.logistic_batch.BatchLogistic`. With ``workers = N > 1``, N - 1 worker processes and one
thread of this process take the queued calls as they come free, each fitting single-threaded: this process
fits from the first call on, while the workers start. With ``workers <= 1`` a call is fitted at once in this
process with the ``n_threads`` it is given (a future already done), so a caller has one code path either way.

The workers are plain ``python -m fmaudit.probes.pool`` processes, fed over their stdin and stdout: not
multiprocessing's spawn or forkserver, which re-run the parent's main module in each worker (a Snakemake
``script:`` is a main module without a ``__main__`` guard), and not fork, which torch's thread pools do not
survive. Each starts single-threaded (torch, OpenMP and BLAS), once per pool (about a second, importing
torch), and exits when its stdin closes, so a killed shard leaves none behind. What crosses the pipes is
pickled by this module and read only by it, between this process and its own children.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import traceback
from concurrent.futures import Future
from typing import Any, BinaryIO

import numpy as np
import torch

from fmaudit.devices import hold_freed_memory
from fmaudit.probes._row_store import reuse_whitened
from fmaudit.probes.logistic_batch import BatchLogistic, fit_logistic_batch

_HEADER = struct.Struct("<Q")
_SINGLE_THREADED = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def _send(stream: BinaryIO, payload: Any) -> None:
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the other end closed the pipe")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the other end closed the pipe mid-message")
    return pickle.loads(data)


def _fit_into(future: Future, X, y, subsets, Cs, n_classes: int, engine: dict[str, Any]) -> None:
    """Fit one call in this process; its model, or its exception, completes ``future``."""
    try:
        future.set_result(fit_logistic_batch(X, y, subsets, Cs, n_classes=n_classes, **engine))
    except Exception as exc:  # the caller sees it at result(), as from a worker
        future.set_exception(exc)


def _claim(future: Future) -> bool:
    """Mark ``future`` running (a call handed back after a worker stopped is running already); False if it
    was cancelled."""
    return future.running() or future.set_running_or_notify_cancel()


class WorkerError(RuntimeError):
    """An engine call failed in a worker process; the message carries the worker's traceback."""


class FitPool:
    """Engine calls fitted side by side, each single-threaded: in ``workers - 1`` worker processes and here.

    Parameters
    ----------
    workers : int
        The cores the calls may use: ``workers - 1`` worker processes are started and one thread of this process
        fits too. ``<= 1``: no process is started, and each call is fitted in this process when it is
        submitted, with the ``n_threads`` of its engine settings.
    start : bool, default True
        Start the workers now (they warm up while the caller prepares its calls), else on the first submit.

    Examples
    --------
    >>> with FitPool(2) as pool:  # doctest: +SKIP
    ...     futures = [pool.submit(X, y, subsets, Cs, n_classes=9, tol=1e-6) for X in readouts]
    ...     models = [f.result() for f in futures]
    """

    def __init__(self, workers: int, start: bool = True):
        self.workers = max(1, int(workers))
        self._tasks: queue.Queue = queue.Queue()
        self._processes: list[subprocess.Popen] = []
        self._threads: list[threading.Thread] = []
        self._ready: list[threading.Event] = []
        self._closed = False
        self._start_lock = threading.Lock()
        if start:
            self._start()

    def _start(self) -> None:
        """Start the worker processes, their feeding threads and this process's fitting thread (once)."""
        with self._start_lock:
            if self._threads or self._closed or self.workers <= 1:
                return
            env = dict(os.environ, **_SINGLE_THREADED,
                       PYTHONPATH=os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)))
            for _ in range(self.workers - 1):
                process = subprocess.Popen([sys.executable, "-m", "fmaudit.probes.pool"], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, env=env)
                ready = threading.Event()
                thread = threading.Thread(target=self._feed, args=(process, ready), daemon=True)
                self._ready.append(ready)
                thread.start()
                self._processes.append(process)
                self._threads.append(thread)
            # the last core's share is fitted here, by one thread, from the first call on: the workers' start
            # (importing torch, about a second) is not time the shard waits for
            thread = threading.Thread(target=self._fit_here, daemon=True)
            thread.start()
            self._threads.append(thread)

    @property
    def parallel(self) -> bool:
        """True when calls run side by side (``workers - 1`` processes and this one, each single-threaded)."""
        return self.workers > 1 and not self._closed

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids (none without workers)."""
        return [process.pid for process in self._processes]

    def wait_ready(self) -> None:
        """Wait until every worker process has started (imported the engine) or stopped."""
        for ready in self._ready:
            ready.wait()

    def _feed(self, process: subprocess.Popen, ready: threading.Event) -> None:
        """One worker's thread: hand it the next queued task's calls, wait for their answers one by one,
        complete their futures. A worker that stops fails the call it had; the task's other calls and the tasks
        still queued go to the others and to this process."""
        try:
            _receive(process.stdout)  # the worker's first message: started
        except (EOFError, OSError, pickle.PickleError):
            pass  # it stopped at once: the first task it is handed fails with WorkerError
        finally:
            ready.set()
        while True:
            task = self._tasks.get()
            if task is None:
                return
            task = [(future, call) for future, call in task if _claim(future)]
            if not task:
                continue
            answered = 0
            try:
                _send(process.stdin, [call for _, call in task])
                for future, _ in task:
                    status, value = _receive(process.stdout)
                    answered += 1
                    if status == "ok":
                        future.set_result(value)
                    else:
                        future.set_exception(WorkerError(f"engine call failed in worker {process.pid}:\n{value}"))
            except (EOFError, OSError, pickle.PickleError) as exc:
                task[answered][0].set_exception(WorkerError(f"engine worker (pid {process.pid}) stopped: {exc}"))
                if task[answered + 1 :]:
                    self._tasks.put(task[answered + 1 :])
                return

    def _fit_here(self) -> None:
        """The in-process share: queued tasks fitted by this thread, single-threaded (its torch and BLAS work
        releases the GIL; the threads feeding the workers only wait on pipes)."""
        while True:
            task = self._tasks.get()
            if task is None:
                return
            with reuse_whitened():
                for future, call in task:
                    if _claim(future):
                        _fit_into(future, *call)

    def submit_together(self, calls: list[tuple[tuple, dict[str, Any]]]) -> list[Future]:
        """Several engine calls fitted one after another by the same process (with workers: the same worker), so
        that what one call's engine keeps for later calls (the whitened form of a subset's rows, made once for
        a readout's fine and coarse taxonomies) is there for the next.

        Parameters
        ----------
        calls : list of (args, engine)
            Each call's positional arguments ``(X, y, subsets, Cs, n_classes)`` and its engine keyword settings,
            as :meth:`submit` takes them.

        Returns
        -------
        list of concurrent.futures.Future
            One per call, in order (:meth:`submit`).
        """
        futures = [Future() for _ in calls]
        if self.parallel:
            self._start()
            self._tasks.put([(future, (X, y, list(subsets), Cs, n_classes, dict(engine, n_threads=1)))
                             for future, ((X, y, subsets, Cs, n_classes), engine) in zip(futures, calls)])
        else:
            with reuse_whitened():
                for future, ((X, y, subsets, Cs, n_classes), engine) in zip(futures, calls):
                    _fit_into(future, X, y, subsets, Cs, n_classes, engine)
        return futures

    def submit(self, X: np.ndarray, y: np.ndarray, subsets: list, Cs: np.ndarray, n_classes: int,
               **engine: Any) -> Future:
        """One engine call, :func:`~fmaudit.probes.logistic_batch.fit_logistic_batch`'s arguments.

        Parameters
        ----------
        X : ndarray of shape (N, D)
            The call's feature rows (sent to a worker by pickling).
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
            ``n_threads`` is 1 whatever is given (and in this process's fitting thread).

        Returns
        -------
        concurrent.futures.Future
            Its ``result()`` is the fitted :class:`~fmaudit.probes.logistic_batch.BatchLogistic`, or raises the
            call's exception (from a worker process: :class:`WorkerError` with the worker's traceback).
        """
        return self.submit_together([((X, y, subsets, Cs, n_classes), engine)])[0]

    def close(self) -> None:
        """Let the workers finish the calls in flight and exit; the pool cannot be used after."""
        with self._start_lock:
            self._closed = True
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join()
        for process in self._processes:
            process.stdin.close()
            process.wait()
            process.stdout.close()
        self._processes, self._threads = [], []

    def __enter__(self) -> FitPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_SHARED: dict[int, FitPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(workers: int) -> FitPool:
    """This process's :class:`FitPool` of ``workers`` cores, started on first use and kept until the process
    exits (or :func:`close_shared_pools`). Given as :func:`~fmaudit.probes.fit_logistic_batch`'s ``pool``, it
    takes a large CPU call's problems split in shares, so a job pays the workers' start (importing torch, about
    a second, while this process already fits a share) once, not per call. Its ``workers - 1`` processes stay
    idle between calls (each holds torch's memory, ~0.3 GB) and exit with this process; with ``workers <= 1``
    it starts none.

    Parameters
    ----------
    workers : int
        The cores the pool's calls may use (:class:`FitPool`).

    Returns
    -------
    FitPool
    """
    workers = max(1, int(workers))
    with _SHARED_LOCK:
        pool = _SHARED.get(workers)
        if pool is None:  # its processes start with the first call it takes
            pool = _SHARED[workers] = FitPool(workers, start=False)
        return pool


def close_shared_pools() -> None:
    """Close the pools :func:`shared_pool` started (their workers finish the calls in flight and exit)."""
    with _SHARED_LOCK:
        pools = list(_SHARED.values())
        _SHARED.clear()
    for pool in pools:
        pool.close()


atexit.register(close_shared_pools)


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """A worker's loop: engine calls in from ``stdin``, fitted models (or tracebacks) out to ``stdout``.

    Parameters
    ----------
    stdin, stdout : binary streams
        The pipes from and to the :class:`FitPool` that started this process: first a message that it has
        started, then a task's calls come in as one list, and their answers go out one by one.
    """
    torch.set_num_threads(1)
    hold_freed_memory()  # as the job that started it (fmaudit.devices.job_threads)
    _send(stdout, ("started", os.getpid()))
    while True:
        try:
            calls = _receive(stdin)
        except EOFError:
            return
        with reuse_whitened():  # a task's calls share what they can (FitPool.submit_together)
            for X, y, subsets, Cs, n_classes, engine in calls:
                try:
                    model: BatchLogistic = fit_logistic_batch(X, y, subsets, Cs, n_classes=n_classes, **engine)
                    answer = ("ok", model)
                except Exception:
                    answer = ("error", traceback.format_exc())
                _send(stdout, answer)


if __name__ == "__main__":
    # the answers get file descriptor 1 to themselves: anything else printed there goes to stderr
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, answers)

"""Which torch device a computation runs on: one rule for the embedding engine and the probe engine; and
how a job's process is set up to compute (its threads, its allocator).

Foundation layer (imports torch only). ``"auto"`` means CUDA when it is available, else the CPU, so the same
config runs on a laptop and on a GPU node; an explicit CUDA request on a machine without one falls back to the
CPU with a warning instead of failing a cluster job that landed on the wrong node.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

import torch

__all__ = ["hold_freed_memory", "job_threads", "resolve_device"]

_log = logging.getLogger(__name__)


def resolve_device(device: str | torch.device | None, logger: logging.Logger | None = None) -> torch.device:
    """``None`` -> CPU; ``"auto"`` -> CUDA if available, else CPU; an unavailable CUDA request -> CPU with a
    warning (to ``logger``, or this module's logger); anything else as ``torch.device(device)``.

    Parameters
    ----------
    device : str, torch.device or None
        A config's ``device``: None, ``"auto"``, or anything ``torch.device`` accepts (``"cpu"``, ``"cuda"``,
        ``"cuda:1"``, ``"mps"`` ...).
    logger : logging.Logger, optional
        Where the fallback warning goes (None: ``fmaudit.devices``).

    Returns
    -------
    torch.device
        The device to run on.
    """
    if device is None:
        return torch.device("cpu")
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        (logger or _log).warning("CUDA requested but not available: running on the CPU")
        return torch.device("cpu")
    return dev


# glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_MAX; and the environment variables that set
# the same two in a process started later (glibc reads them at start)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_HELD_TRIM = 2**31 - 1  # mallopt takes an int: free memory at the heap's top is returned past 2 GiB only
_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(_HELD_TRIM)}


def hold_freed_memory(children: bool = False) -> bool:
    """Keep the memory this process frees for its next allocations instead of handing it back to the system.

    By default glibc serves every allocation above 32 MiB (and, until its threshold adapts, above 128 KiB)
    with a fresh ``mmap`` and unmaps it when freed, so each large array a job makes and drops again (a
    readout's rows, a subset's whitened rows, test-cell scores) is faulted in page by page and zeroed by the
    kernel once more. In a virtual machine each such fault also exits to the hypervisor. Measured on a CellPath
    LOOO unit at width 1,536 (benchmarks/bench_cell_shard.py's panel, 2 fitting processes, 2 cores): 8.3 s
    of system CPU and 3.4 s stolen by the hypervisor in a 25 s shard; with this, 1.4 s and 0.3 s, and the
    shard took 19 s. Here: no ``mmap`` for allocations (glibc falls back to it only where its heaps cannot
    grow) and the heap's free top kept up to 2 GiB, so the process's resident memory stays at its peak,
    which the jobs' memory budgets bound already.

    Parameters
    ----------
    children : bool, default False
        Also set glibc's environment variables for the same two settings, so that processes started later
        from this one (any program: worker processes, scikit-learn's) hold their freed memory too; a
        benchmark gives both of its sides the same allocator this way.

    Returns
    -------
    bool
        Whether this process's allocator took the settings (False where it is not glibc's).
    """
    if children:
        os.environ.update(_MALLOC_ENV)
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, _HELD_TRIM) == 1


def job_threads(threads: int) -> int:
    """Set up a job's process: give torch the job's cores (a Snakemake ``script:`` job is not limited to its
    rule's ``threads``: Snakemake sets ``OMP_NUM_THREADS`` for ``shell:`` jobs only, so torch would take every
    core of the machine), and keep the memory it frees for reuse (:func:`hold_freed_memory`).

    Parameters
    ----------
    threads : int
        The rule's ``threads`` (at least 1 is used).

    Returns
    -------
    int
        The threads torch now runs on.
    """
    threads = max(1, int(threads))
    torch.set_num_threads(threads)
    hold_freed_memory()
    return threads

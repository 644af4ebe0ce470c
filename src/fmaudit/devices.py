"""Which torch device a computation runs on: one rule for the embedding engine and the probe engine.

Foundation layer (imports torch only). ``"auto"`` means CUDA when it is available, else the CPU, so the same
config runs on a laptop and on a GPU node; an explicit CUDA request on a machine without one falls back to the
CPU with a warning instead of failing a cluster job that landed on the wrong node.
"""

from __future__ import annotations

import logging

import torch

__all__ = ["job_threads", "resolve_device"]

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


def job_threads(threads: int) -> int:
    """Give torch a job's cores: a Snakemake ``script:`` job is not limited to its rule's ``threads`` (Snakemake
    sets ``OMP_NUM_THREADS`` for ``shell:`` jobs only), so torch would take every core of the machine.

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
    return threads

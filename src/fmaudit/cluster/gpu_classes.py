"""The site's GPU classes (a Slurm profile's ``gpu_classes`` resource) and the smallest class that holds a job."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from fmaudit.io import FmauditInputError


@dataclass(frozen=True)
class GpuClass:
    """GPUs of ``memory_gb`` and the Slurm constraint that asks for them ('' for none: any GPU).

    Parameters
    ----------
    memory_gb : float
        Memory of one GPU of the class, in GB (> 0).
    constraint : str
        The Slurm ``--constraint`` that selects it; ``""`` for any GPU.
    """

    memory_gb: float
    constraint: str


def parse_gpu_classes(text: str | None) -> tuple[GpuClass, ...]:
    """``"24:,48:gpu48g,80:a100_80g|h100"`` (GPU memory in GB: constraint, comma-separated) -> classes by
    memory. An empty text means no classes (no constraint is ever set).

    Parameters
    ----------
    text : str or None
        The profile's ``gpu_classes`` resource.

    Returns
    -------
    tuple of GpuClass
        Sorted by ascending memory; empty for an empty text.

    Raises
    ------
    FmauditInputError
        When an item is not ``<GB>:<constraint>`` with a positive number and a constraint of Slurm's characters.
    """
    if not text or not str(text).strip():
        return ()
    classes = []
    for item in str(text).split(","):
        if not item.strip():
            continue
        memory, sep, constraint = item.partition(":")
        try:
            gb = float(memory)
        except ValueError:
            gb = float("nan")
        if (not sep or not math.isfinite(gb) or gb <= 0
                or not re.fullmatch(r"[A-Za-z0-9_.|&\[\]*-]*", constraint.strip())):
            raise FmauditInputError(f"gpu_classes {text!r}: {item.strip()!r} is not '<GPU memory in GB>:<constraint>' "
                                    "(e.g. 80:a100_80g; an empty constraint means any GPU)")
        classes.append(GpuClass(gb, constraint.strip()))
    return tuple(sorted(classes, key=lambda c: c.memory_gb))


def gpu_class(gpu_memory_mb: float, classes: Sequence[GpuClass]) -> GpuClass | None:
    """The smallest class whose memory holds ``gpu_memory_mb``; the largest when none does; None without
    classes or for a job that needs no GPU.

    Parameters
    ----------
    gpu_memory_mb : float
        A job's estimated GPU memory in MB (0 for a CPU job).
    classes : sequence of GpuClass
        The site's classes, sorted by memory (as :func:`parse_gpu_classes` returns them).

    Returns
    -------
    GpuClass or None
    """
    if not classes or gpu_memory_mb <= 0:
        return None
    for c in classes:
        if gpu_memory_mb <= c.memory_gb * 1024:
            return c
    return classes[-1]

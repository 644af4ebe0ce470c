"""What an earlier run of a rule and encoder measured: the wall time and peak memory of its jobs, from
Snakemake's benchmark files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fmaudit.io import PathLike

#: What a benchmark file's peak memory and wall time are read from (Snakemake's benchmark columns).
BENCHMARK_COLUMNS = ("s", "max_rss")


@dataclass(frozen=True)
class Measured:
    """Benchmark rows of one rule and encoder: per job, its wall seconds, peak MB and wildcards-path.

    Parameters
    ----------
    jobs : tuple of (str, float, float)
        One entry per benchmark file: its path relative to ``benchmarks/<rule>/<encoder>`` without ``.tsv`` (the
        job's wildcards), wall seconds and peak resident memory in MB (NaN when not sampled).
    """

    jobs: tuple[tuple[str, float, float], ...]  # (path relative to the rule's encoder folder, s, max_rss MB)

    @property
    def peak_mb(self) -> float | None:
        """Largest peak resident memory in MB over the jobs, or None when none was sampled.
        """
        values = [m for _, _, m in self.jobs if np.isfinite(m)]
        return max(values) if values else None

    @property
    def max_s(self) -> float | None:
        """Longest wall time in seconds over the jobs, or None when none was sampled.
        """
        values = [s for _, s, _ in self.jobs if np.isfinite(s)]
        return max(values) if values else None


def read_benchmarks(folder: PathLike) -> Measured | None:
    """Every benchmark file under ``folder`` (``benchmarks/<rule>/<encoder>``): its wall time (``s``, summed
    over repeats) and peak resident memory (``max_rss``, MB, the largest); None when there is none. A value
    Snakemake could not sample (``NA``: a job too short) is NaN and ignored.

    Parameters
    ----------
    folder : str or Path
        ``results/<study>/benchmarks/<rule>/<encoder>``; read recursively for ``*.tsv`` files with columns
        ``s`` and ``max_rss`` (unreadable or other files are skipped).

    Returns
    -------
    Measured or None
    """
    root = Path(folder)
    if not root.is_dir():
        return None
    jobs = []
    for path in sorted(root.rglob("*.tsv")):
        try:
            table = pd.read_csv(path, sep="\t")
        except (OSError, ValueError, pd.errors.EmptyDataError):
            continue
        if not set(BENCHMARK_COLUMNS) <= set(table.columns) or table.empty:
            continue
        s = pd.to_numeric(table["s"], errors="coerce")
        rss = pd.to_numeric(table["max_rss"], errors="coerce")
        jobs.append((str(path.relative_to(root).with_suffix("")), float(s.sum(min_count=1)),
                     float(rss.max()) if rss.notna().any() else float("nan")))
    return Measured(tuple(jobs)) if jobs else None

"""Benchmark: what validating a 300,000-item manifest costs, as a multiple of reading it, in the same process.

Workload: one slide-tile manifest of 300,000 labelled items (3 domains, 3,000 patients, 9 classes, train/val/test
by patient), as the workflow's ``validate`` stage would see it right after preparation. Timed: (a) the
baseline, ``fmaudit.io.read_table`` of the manifest's parquet file, which every consumer of a manifest pays;
(b) ``fmaudit.split_checks.validate_task_splits`` on it for one transfer task over the three domains (every
check: columns, duplicate ids and tiles, leakage, label range, training and evaluated classes). Medians of
``--repeats`` runs, one thread, same process. The figures in ``fmaudit.split_checks`` (0.5-1.3 s for 300k
items, 4-7 times the parquet read, on loaded 2-core machines) are this measurement.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_validation.py [--items 300000] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from fmaudit.datasets.manifest import make_manifest
from fmaudit.io import read_table, write_table
from fmaudit.split_checks import validate_task_splits


def make(n_items: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n_patients = max(30, n_items // 100)
    patient = rng.integers(0, n_patients, n_items)
    domain = np.array(["scanner-a", "scanner-b", "scanner-c"])[patient % 3]
    split = np.array(["train", "train", "train", "val", "test"])[patient % 5]
    label = rng.integers(0, 9, n_items)
    i = np.arange(n_items)
    return make_manifest(pd.DataFrame({
        "dataset": "bench", "item_id": [f"t{k:07d}" for k in i],
        "source": [f"/data/slides/p{p:05d}.svs" for p in patient],
        "x": (i % 1000) * 224, "y": (i // 1000) * 224, "level": 0, "size": 224,
        "label": label, "label_name": np.array([f"class{k}" for k in range(9)])[label],
        "group": [f"p{p:05d}" for p in patient], "domain": domain, "split": split,
    }))


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=300_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    df = make(args.items)
    tasks = {"bench": {"datasets": ["bench"], "domains": ["scanner-a", "scanner-b", "scanner-c"]}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.parquet"
        write_table(path, df)
        read = median_seconds(lambda: read_table(path), args.repeats)
        manifest = read_table(path)
        report = validate_task_splits({"bench": manifest}, tasks, files={"bench": str(path)})
        assert report.ok, report.problems
        check = median_seconds(lambda: validate_task_splits({"bench": manifest}, tasks), args.repeats)
    print(f"items={args.items} repeats={args.repeats} checks={len(report.checks)}")
    print(f"baseline read_table (parquet): {read:.3f} s")
    print(f"validate_task_splits:          {check:.3f} s")
    print(f"ratio validate / read:         {check / read:.2f}")


if __name__ == "__main__":
    main()

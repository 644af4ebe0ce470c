"""Compare the demo's result tables of two checkouts' runs (a restructuring's before and after).

``python tests/compare_results.py BEFORE AFTER``: every parquet and csv under ``<checkout>/results/demo``
(``benchmarks/`` and ``logs/`` aside): the same files, columns and rows, every value equal (floats to 1e-9
relative, NaN equal to NaN; strings with each checkout's path replaced by ROOT). Columns that hold the run's
own measured cost (seconds, hours, images/s, RSS) are left out: they differ from run to run.
"""

import pathlib
import re
import sys

import numpy as np
import pandas as pd

SKIP_DIRS = ("benchmarks", "logs")
# measured costs of the run itself (its Snakemake benchmark files), not results
TIMING = re.compile(r"(seconds|elapsed|_s$|runs_per_s|wall|cpu_hours|gpu_hours|images_per_s|time|rss)")


def files(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.suffix in (".parquet", ".csv")
                  and p.relative_to(root).parts[0] not in SKIP_DIRS)


def main(argv: list[str]) -> int:
    A, B = (pathlib.Path(p) / "results/demo" for p in argv[:2])
    fa, fb = files(A), files(B)
    print(f"tables: before {len(fa)}, after {len(fb)}")
    for p in sorted(set(fa) ^ set(fb)):
        print("  only in", "before" if p in fa else "after", p)
    same = differ = 0
    for p in sorted(set(fa) & set(fb)):
        read = pd.read_parquet if p.suffix == ".parquet" else pd.read_csv
        a, b = read(A / p), read(B / p)
        problems = []
        if list(a.columns) != list(b.columns):
            problems.append(f"columns differ: {sorted(set(a.columns) ^ set(b.columns))}")
        if len(a) != len(b):
            problems.append(f"rows {len(a)} vs {len(b)}")
        if not problems:
            for c in a.columns:
                if TIMING.search(str(c)):
                    continue
                x, y = a[c], b[c]
                if pd.api.types.is_float_dtype(x) and pd.api.types.is_float_dtype(y):
                    xv, yv = x.to_numpy(float), y.to_numpy(float)
                    ok = np.allclose(xv, yv, rtol=1e-9, atol=1e-12, equal_nan=True)
                    if not ok:
                        problems.append(f"{c}: max |diff| {np.nanmax(np.abs(xv - yv)):.3g}")
                else:
                    xs, ys = (v.astype(object).where(v.notna(), "<NA>").astype(str) for v in (x, y))
                    for root in (A.parents[1], B.parents[1]):
                        xs, ys = xs.str.replace(str(root), "ROOT"), ys.str.replace(str(root), "ROOT")
                    if not (xs.to_numpy() == ys.to_numpy()).all():
                        n = int((xs.to_numpy() != ys.to_numpy()).sum())
                        first = (xs != ys).to_numpy().argmax()
                        problems.append(f"{c}: {n} values differ, e.g. {xs.iloc[first]!r} vs {ys.iloc[first]!r}")
        if problems:
            differ += 1
            print(f"  DIFFERS {p}: " + "; ".join(problems)[:600])
        else:
            same += 1
    print(f"identical: {same}, differing: {differ}")
    return 1 if differ or set(fa) ^ set(fb) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

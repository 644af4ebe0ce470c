"""The command line: the same analysis functions as the workflow, on files the user brings.

    fmaudit probe --train-features X.npy --train-labels y.npy --test-features ... --test-labels ... --out runs.csv
    fmaudit grid --configfile resources/presets/prism.yaml [--json]
    fmaudit check-config --configfile config.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError, load_feature_array, write_table


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.replace(",", " ").split()]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.replace(",", " ").split()]


def _labels(path: str | None, n: int | None = None, what: str = "labels") -> np.ndarray | None:
    if path is None:
        return None
    arr = load_feature_array(path, key=None if Path(path).suffix == ".npy" else "labels")
    arr = np.asarray(arr).reshape(-1)
    if n is not None and len(arr) != n:
        raise FmauditInputError(f"{path}: {len(arr)} {what} but {n} feature rows")
    return arr


def wide_probe_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (fraction, seed): raw metrics, then ``<metric>__<stage>`` for each calibration stage."""
    from fmaudit.metrics import CONVENTIONS

    keys = ["head", "C", "fraction", "seed", "n_train", "n_val", "label_budget", "n_test"]
    metrics = [m for m in CONVENTIONS if m in rows.columns] + ["temperature"]
    out = []
    for key, cell in rows.groupby(keys, sort=True, dropna=False):
        rec = dict(zip(keys, key))
        for r in cell.itertuples(index=False):
            stage = r.stage if r.stage != "kshot_ts" else f"kshot{int(r.k)}_ts"
            suffix = "" if stage == "raw" else f"__{stage}"
            for m in metrics:
                rec[f"{m}{suffix}"] = getattr(r, m)
            if stage == "raw":
                for m in ("macro_f1_ci_lo", "macro_f1_ci_hi", "ece_ci_lo", "ece_ci_hi"):
                    rec[m] = getattr(r, m)
        out.append(rec)
    df = pd.DataFrame(out)
    df["ece_convention"] = rows["ece_convention"].iloc[0]
    return df


def cmd_probe(args: argparse.Namespace) -> int:
    from fmaudit import grid
    from fmaudit.analyses.probe_suite import run_probe_suite
    from fmaudit.analyses.task_data import from_arrays

    xtr = load_feature_array(args.train_features, key=args.features_key)
    xte = load_feature_array(args.test_features, key=args.features_key)
    xva = load_feature_array(args.val_features, key=args.features_key) if args.val_features else None
    data = from_arrays(
        xtr, _labels(args.train_labels, len(xtr)), xte, _labels(args.test_labels, len(xte)),
        train_groups=_labels(args.train_groups, len(xtr), "groups"),
        test_groups=_labels(args.test_groups, len(xte), "groups"),
        val_x=xva, val_y=_labels(args.val_labels, len(xva) if xva is not None else None),
    )
    probe = {**grid.PROBE_DEFAULTS, "heads": args.heads, "C": args.C[0] if len(args.C) == 1 else args.C,
             "fractions": args.fractions,
             "seeds": args.seeds, "val_fraction": args.val_fraction}
    calibration = {**grid.CALIBRATION_DEFAULTS, "kshot_k": args.kshot_k, "kshot_draws": args.kshot_draws,
                   "ece_bins": args.ece_bins}
    bootstrap = {"n_boot": args.n_boot, "seed": args.bootstrap_seed}
    config = {"encoders": ["arrays"], "tasks": {"arrays": {"datasets": ["arrays"], "domains": ["all"]}},
              "probe": probe}
    runs = grid.probe_runs(config)
    rows, preds = run_probe_suite(data, runs, probe, calibration, bootstrap, transfer=False)
    out = wide_probe_rows(rows) if not args.long else rows
    write_table(args.out, out)
    if args.predictions:
        write_table(args.predictions, preds)
    print(f"wrote {len(out)} rows to {args.out}")
    return 0


def cmd_grid(args: argparse.Namespace) -> int:
    from fmaudit import grid
    from fmaudit.config import load_config, load_yaml

    config = load_config(args.configfile)
    registry = load_yaml(config.get("dataset_registry", "resources/datasets.yaml"))
    summary = grid.summarize(config, registry)
    if args.json:
        print(json.dumps(summary.to_dict(orient="records"), indent=2))
    else:
        print(summary.to_string(index=False))
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from fmaudit.config import check_names, load_config, load_yaml

    config = load_config(args.configfile)
    check_names(config, load_yaml(config.get("encoder_registry", "resources/encoders.yaml")),
                load_yaml(config.get("dataset_registry", "resources/datasets.yaml")))
    print(f"{args.configfile}: ok")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from fmaudit.config import load_yaml
    from fmaudit.datasets.download import download_dataset

    registry = load_yaml(args.registry)
    if args.dataset not in registry:
        from fmaudit.config import _unknown

        raise _unknown("dataset", args.dataset, list(registry), args.registry)
    download_dataset(args.dataset, registry[args.dataset], args.data_root)
    print(f"{args.dataset}: ready under {args.data_root}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fmaudit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    pr = sub.add_parser("probe", help="label-fraction probe grid with the calibration ladder on your own arrays")
    pr.add_argument("--train-features", required=True, help=".npy, .npz or .h5 (dataset 'features')")
    pr.add_argument("--train-labels", required=True, help=".npy of integer labels 0..K-1 (or .npz/.h5 'labels')")
    pr.add_argument("--test-features", required=True)
    pr.add_argument("--test-labels", required=True)
    pr.add_argument("--val-features", help="held-out source validation features for temperature fitting "
                    "(default: hold out --val-fraction of the training groups)")
    pr.add_argument("--val-labels")
    pr.add_argument("--train-groups", help="patient/slide id per training item (grouped val split)")
    pr.add_argument("--test-groups", help="patient/slide id per test item (cluster bootstrap)")
    pr.add_argument("--features-key", help="array name inside .npz/.h5 files (default 'features')")
    pr.add_argument("--fractions", type=_floats, default=[1.0], help="label fractions, e.g. '0.01,0.1,1'")
    pr.add_argument("--seeds", type=_ints, default=[0], help="seeds, e.g. '0,1,2'")
    pr.add_argument("--C", type=_floats, default=[1.0],
                    help="inverse L2 strength of the logistic head; several values fit one probe each, e.g. '0.01,1,100'")
    pr.add_argument("--heads", type=lambda s: s.split(","), default=["logistic"], help="comma-separated heads")
    pr.add_argument("--val-fraction", type=float, default=0.2)
    pr.add_argument("--kshot-k", type=_ints, default=[4, 8, 16, 32, 64])
    pr.add_argument("--kshot-draws", type=int, default=25)
    pr.add_argument("--ece-bins", type=int, default=15)
    pr.add_argument("--n-boot", type=int, default=1000)
    pr.add_argument("--bootstrap-seed", type=int, default=0)
    pr.add_argument("--long", action="store_true", help="one row per calibration stage instead of one per run")
    pr.add_argument("--predictions", help="also write per-item logits (.parquet)")
    pr.add_argument("--out", required=True, help="output table (.csv, .tsv, .parquet, .md)")
    pr.set_defaults(func=cmd_probe)

    gr = sub.add_parser("grid", help="count runs and jobs of a config without running anything")
    gr.add_argument("--configfile", required=True)
    gr.add_argument("--json", action="store_true")
    gr.set_defaults(func=cmd_grid)

    dl = sub.add_parser("download", help="fetch and unpack one registered data set (resumable, checksummed)")
    dl.add_argument("dataset", help="slug of resources/datasets.yaml")
    dl.add_argument("--data-root", required=True)
    dl.add_argument("--registry", default="resources/datasets.yaml")
    dl.set_defaults(func=cmd_download)

    cc = sub.add_parser("check-config", help="validate a config and the names it uses")
    cc.add_argument("--configfile", required=True)
    cc.set_defaults(func=cmd_check_config)
    __import__("fmaudit.commands.adapt", fromlist=["register"]).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FmauditInputError, FileNotFoundError) as e:
        print(f"fmaudit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``fmaudit probe``: the label-fraction probe grid with the calibration ladder, on arrays made elsewhere.

    fmaudit probe --train-features X.npy --train-labels y.npy --test-features ... --test-labels ... --out runs.csv

The same functions as the workflow's probe shards (:func:`fmaudit.analyses.probe_suite.run_probe_suite`), with
settings built from the config schema (:func:`fmaudit.config.fill_section`), so the numbers are the workflow's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from fmaudit import grid
from fmaudit.analyses.task_data import from_arrays
from fmaudit.commands import floats, ints, words
from fmaudit.config import fill_section, schema_default
from fmaudit.datasets import GROUP_UNITS
from fmaudit.io import FmauditInputError, load_feature_array, write_table
from fmaudit.metrics import summary_metric_keys
from fmaudit.split_checks import validate_task_splits

__all__ = ["register", "run", "wide_probe_rows"]


def _labels(path: str | None, n: int | None = None, what: str = "labels") -> np.ndarray | None:
    if path is None:
        return None
    arr = load_feature_array(path, key=None if Path(path).suffix == ".npy" else "labels")
    arr = np.asarray(arr).reshape(-1)
    if n is not None and len(arr) != n:
        raise FmauditInputError(f"{path}: {len(arr)} {what} but {n} feature rows")
    return arr


def wide_probe_rows(rows: pd.DataFrame, n_bins: int) -> pd.DataFrame:
    """One row per (fraction, seed): raw metrics, then ``<metric>__<stage>`` for each calibration stage; the
    binned metrics are named at ``n_bins`` bins (``ece_top_<n_bins>_lohi``; PRISM's ``ece_prism_<n_bins>_fixed``
    when asked for). Every row says how it was made (``subsample``, ``standardize``, ``calibration_mode``) and
    what its intervals resample (``ci_resampling``: ``unit=item, n=...`` without ``--test-groups``).

    Parameters
    ----------
    rows : DataFrame
        The long rows of :func:`fmaudit.analyses.probe_suite.run_probe_suite`: one per run and calibration
        ``stage`` (``raw``, ``kshot_ts`` with its ``k``, ...), with the metric columns.
    n_bins : int
        ECE bins of the run (``calibration.ece_bins``), which name the binned metric columns.

    Returns
    -------
    DataFrame
        One row per (head, C, fraction, seed, ...): the settings columns, the raw metrics and their
        ``macro_f1_ci_*``/``ece_ci_*`` intervals, ``<metric>__<stage>`` (``__kshot<k>_ts`` for K-shot) and
        ``ece_convention``.
    """
    keys = ["head", "C", "fraction", "seed", "n_train", "n_val", "label_budget", "n_test", "subsample", "standardize",
            "calibration_mode", "source_val_macro_f1", "ci_unit", "ci_n_units", "ci_resampling"]
    keys = [k for k in keys if k in rows.columns]
    metrics = ([m for m in summary_metric_keys(n_bins, prism_ece=True) if m in rows.columns]
               + ["temperature", "temperature_at_bound", "n_draws_at_bound"])
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


def run(args: argparse.Namespace) -> int:
    """Run ``fmaudit probe``: the label-fraction probe grid with the calibration ladder on the given arrays.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options of :func:`register` (feature, label and group files, ``group_unit``, probe,
        calibration and bootstrap settings, ``long``, ``predictions``, ``out``).

    Returns
    -------
    int
        Exit status 0.

    Raises
    ------
    FmauditInputError
        When ``--group-unit`` is unknown, a label or group file's length differs from its feature rows, or the
        splits fail their checks (a group on both sides without ``--allow-group-overlap``, too few classes ...).
    """
    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.analyses.probe_suite import run_probe_suite

    if args.group_unit not in (*GROUP_UNITS, "group"):
        raise FmauditInputError(f"--group-unit {args.group_unit!r}: expected one of {', '.join(GROUP_UNITS)} or group")
    xtr = load_feature_array(args.train_features, key=args.features_key)
    xte = load_feature_array(args.test_features, key=args.features_key)
    xva = load_feature_array(args.val_features, key=args.features_key) if args.val_features else None
    data = from_arrays(
        xtr, _labels(args.train_labels, len(xtr)), xte, _labels(args.test_labels, len(xte)),
        train_groups=_labels(args.train_groups, len(xtr), "groups"),
        test_groups=_labels(args.test_groups, len(xte), "groups"),
        val_x=xva, val_y=_labels(args.val_labels, len(xva) if xva is not None else None),
        group_unit=args.group_unit,
    )

    validate_task_splits({f"arrays of {args.train_labels} and {args.test_labels}": {
        "item_id": data.item_ids, "label": data.labels, "group": data.groups, "domain": data.domains,
        "split": data.splits}}, allow_group_overlap=args.allow_group_overlap)
    probe = fill_section("probe", {"heads": args.heads, "C": args.C[0] if len(args.C) == 1 else args.C,
                                   "fractions": args.fractions, "seeds": args.seeds, "val_fraction": args.val_fraction,
                                   "standardize": args.standardize, "subsample": args.subsample},
                         source="fmaudit probe options")
    calibration = fill_section("calibration", {"kshot_k": args.kshot_k, "kshot_draws": args.kshot_draws,
                                               "ece_bins": args.ece_bins, "validation_labels": args.validation_labels,
                                               "budget_validation_share": args.budget_validation_share,
                                               "include_bound_temperatures": args.include_bound_temperatures,
                                               "prism_ece": args.prism_ece}, source="fmaudit probe options")
    bootstrap = fill_section("bootstrap", {"n_boot": args.n_boot, "seed": args.bootstrap_seed},
                             source="fmaudit probe options")
    task = {"datasets": ["arrays"], "domains": ["all"], "transfer": False}
    runs = grid.probe_runs({"encoders": ["arrays"], "tasks": {"arrays": task}, "probe": probe})
    rows, preds = run_probe_suite(data, runs, probe, calibration, bootstrap, transfer=False)
    out = wide_probe_rows(rows, calibration["ece_bins"]) if not args.long else rows
    write_table(args.out, out)
    if args.predictions:
        write_table(args.predictions, preds)
    print(f"wrote {len(out)} rows to {args.out}")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``probe`` to the ``fmaudit`` command line, its defaults read from the config schema.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.

    Returns
    -------
    argparse.ArgumentParser
        The ``probe`` parser, its ``func`` set to :func:`run`.
    """
    def default(section: str, key: str):
        return schema_default(section, key)

    pr = subparsers.add_parser("probe", help="label-fraction probe grid with the calibration ladder on your own arrays")
    pr.add_argument("--train-features", required=True, help=".npy, .npz or .h5 (dataset 'features')")
    pr.add_argument("--train-labels", required=True, help=".npy of integer labels 0..K-1 (or .npz/.h5 'labels')")
    pr.add_argument("--test-features", required=True)
    pr.add_argument("--test-labels", required=True)
    pr.add_argument("--val-features", help="held-out source validation features for temperature fitting "
                    "(default: hold out --val-fraction of the training groups)")
    pr.add_argument("--val-labels")
    pr.add_argument("--train-groups", help="patient/slide id per training item (grouped val split)")
    pr.add_argument("--test-groups", help="patient/slide id per test item: intervals resample these groups "
                    "(without it they resample items, and every row says unit=item)")
    pr.add_argument("--group-unit", default="group",
                    help="what the groups are, named in every interval (unit=patient, n=...): patient, slide, "
                         "biopsy, section, item; default 'group' (not said)")
    pr.add_argument("--allow-group-overlap", action="store_true",
                    help="accept groups on both the training and the test side (an error otherwise: leakage)")
    pr.add_argument("--features-key", help="array name inside .npz/.h5 files (default 'features')")
    fractions = default("probe", "fractions")
    pr.add_argument("--fractions", type=floats, default=fractions,
                    help=f"label fractions, e.g. '0.01,0.1,1' (default {fractions})")
    pr.add_argument("--seeds", type=ints, default=default("probe", "seeds"), help="seeds, e.g. '0,1,2'")
    c = default("probe", "C")
    pr.add_argument("--C", type=floats, default=c if isinstance(c, list) else [c],
                    help="inverse L2 strength of the logistic head; several values fit one probe each, "
                         "e.g. '0.01,1,100'")
    pr.add_argument("--heads", type=words, default=default("probe", "heads"), help="comma-separated heads")
    pr.add_argument("--val-fraction", type=float, default=default("probe", "val_fraction"))
    pr.add_argument("--no-standardize", dest="standardize", action="store_false",
                    default=default("probe", "standardize"),
                    help="fit the probes on unscaled features (PRISM) instead of standardising them with each "
                         "training subset's statistics")
    pr.add_argument("--subsample", choices=["label_fraction", "prism"], default=default("probe", "subsample"),
                    help="how a label fraction's subset is drawn: label_fraction (nested across fractions) or prism "
                         "(PRISM's own draw; with --seeds 42,123,456 PRISM's subsets)")
    pr.add_argument("--kshot-k", type=ints, default=default("calibration", "kshot_k"))
    pr.add_argument("--kshot-draws", type=int, default=default("calibration", "kshot_draws"))
    pr.add_argument("--ece-bins", type=int, default=default("calibration", "ece_bins"))
    pr.add_argument("--validation-labels", choices=["full", "proportional", "budget"],
                    default=default("calibration", "validation_labels"),
                    help="labels of the source temperature: the full validation split (published), the split "
                         "subsampled by the fraction, or a share of the fraction's own label budget")
    pr.add_argument("--budget-validation-share", type=float, default=default("calibration", "budget_validation_share"),
                    help="with --validation-labels budget: share of the fraction's labels that fit the temperature")
    pr.add_argument("--include-bound-temperatures", action="store_true",
                    default=default("calibration", "include_bound_temperatures"),
                    help="keep K-shot draws whose temperature sits at a search bound in the K-shot means")
    pr.add_argument("--prism-ece", action="store_true", default=default("calibration", "prism_ece"),
                    help="also report PRISM's ECE (ece_prism_<bins>_fixed: [lo,hi) bins, binary p(class 1))")
    pr.add_argument("--n-boot", type=int, default=default("bootstrap", "n_boot"))
    pr.add_argument("--bootstrap-seed", type=int, default=default("bootstrap", "seed"))
    pr.add_argument("--long", action="store_true", help="one row per calibration stage instead of one per run")
    pr.add_argument("--predictions", help="also write per-item logits (.parquet)")
    pr.add_argument("--out", required=True, help="output table (.csv, .tsv, .parquet, .md)")
    pr.set_defaults(func=run)
    return pr

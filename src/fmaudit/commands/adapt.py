"""``fmaudit adapt``: label-free adaptation of a source probe to a target, on arrays made elsewhere.

    fmaudit adapt --source-features Xs.npy --source-labels ys.npy --target-features Xt.npy \\
        --target-labels yt.npy [--methods none,global_standardization,...] \\
        [--prior NAME | --prior-shares 0.01,0.03,0.30,0.06,0.60] [--sample-size 500 --draws 25] --out gains.csv

One row per method (``none`` first): macro-F1 and its gain over ``none``, ECE without and with the source
temperature and their change against ``none``, per-class recall and the label-free selection scores; with a
prior, means over the resampled draws (``--draws-out`` keeps every draw). The same functions as the workflow's
prior-shift shards (``fmaudit.adapt.evaluate``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from fmaudit.config import schema_default
from fmaudit.io import FmauditInputError, load_feature_array, write_table

HELP = "label-free adaptation (CBR, global standardisation, SHOT-IM, BBSE, EM) of a source probe on your arrays"


def _labels(path: str, n: int, what: str) -> np.ndarray:
    arr = np.asarray(load_feature_array(path, key=None if Path(path).suffix == ".npy" else "labels")).reshape(-1)
    if len(arr) != n:
        raise FmauditInputError(f"{path}: {len(arr)} {what} but {n} feature rows")
    return arr


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.replace(",", " ").split()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from err


def _shot_im_settings() -> dict:
    """SHOT-IM's settings as the workflow's schema defaults them (prior_shift.shot_im)."""
    keys = ("epochs", "lr", "momentum", "weight_decay", "batch_size")
    return {key: schema_default("prior_shift", "shot_im", key) for key in keys}


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``adapt`` command to ``fmaudit``'s sub-commands.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.

    Returns
    -------
    argparse.ArgumentParser
        The ``adapt`` parser, its ``func`` set to :func:`cmd_adapt`.
    """
    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.adapt.evaluate import METHODS

    p = subparsers.add_parser("adapt", help=HELP, description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source-features", required=True, help=".npy, .npz or .h5 (dataset 'features')")
    p.add_argument("--source-labels", required=True, help="integer labels 0..K-1 (.npy, or .npz/.h5 'labels')")
    p.add_argument("--target-features", required=True)
    p.add_argument("--target-labels", required=True, help="target labels (for scoring only; no method reads them "
                   "except oracle_restandardization, which is reported as not deployable)")
    p.add_argument("--source-groups", help="patient/slide id per source item (group-disjoint source hold-out)")
    p.add_argument("--features-key", help="array name inside .npz/.h5 files (default 'features')")
    p.add_argument("--methods", type=lambda s: [m for m in s.split(",") if m], default=list(METHODS),
                   help=f"comma-separated, from {','.join(METHODS)} (default: all)")
    prior = p.add_mutually_exclusive_group()
    prior.add_argument("--prior", help="resample the target to a named prior (balanced, mild, peripheral-blood "
                       "(= clinical), neutrophil-heavy, lymphocytosis, rare-enriched: the WBC scenarios, which need "
                       "the five WBC classes) or 'balanced' for any task")
    prior.add_argument("--prior-shares", type=_floats, help="resample the target to these class shares, in label order")
    p.add_argument("--class-names", type=lambda s: s.split(","),
                   help="class names in label order (default: the WBC classes with a WBC prior, else class_0 ...)")
    p.add_argument("--sample-size", type=int, default=500, help="items per resampled draw")
    p.add_argument("--draws", type=int, default=schema_default("prior_shift", "draws"), help="resampled draws")
    p.add_argument("--seed", type=int, default=0, help="source split and draw seed")
    p.add_argument("--C", type=float, default=schema_default("prior_shift", "C"),
                   help="inverse L2 strength of the logistic probe")
    p.add_argument("--val-fraction", type=float, default=schema_default("prior_shift", "val_fraction"),
                   help="source hold-out for temperature and BBSE")
    p.add_argument("--ece-bins", type=int, default=schema_default("calibration", "ece_bins"))
    p.add_argument("--device", default=None, help="cpu (default), cuda or auto")
    p.add_argument("--draws-out", help="also write the per-draw rows (.csv, .tsv, .parquet)")
    p.add_argument("--out", required=True, help="output table (.csv, .tsv, .parquet, .md)")
    p.set_defaults(func=cmd_adapt)
    return p


def cmd_adapt(args: argparse.Namespace) -> int:
    """Run ``fmaudit adapt``: every label-free method on the source and target arrays, the table written to ``--out``.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options of :func:`register` (feature and label files, ``methods``, ``prior`` or
        ``prior_shares``, ``sample_size``, ``draws``, ``seed``, ``C``, ``val_fraction``, ``ece_bins``, ``out`` ...).

    Returns
    -------
    int
        Exit status 0; the summary (one row per method, ``none`` first) is in ``--out``, the per-draw rows in
        ``--draws-out`` when given.

    Raises
    ------
    FmauditInputError
        When a label or group file's length differs from its feature rows, or labels are not class indices
        0..K-1 and no ``--class-names`` or WBC prior names the classes.
    """
    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.adapt.evaluate import evaluate_draws, summarize_draws
    from fmaudit.adapt.priors import WBC5_CLASS_ORDER, balanced_prior, named_scenario

    xs = load_feature_array(args.source_features, key=args.features_key)
    xt = load_feature_array(args.target_features, key=args.features_key)
    ys = _labels(args.source_labels, len(xs), "labels")
    yt = _labels(args.target_labels, len(xt), "labels")
    groups = _labels(args.source_groups, len(xs), "groups") if args.source_groups else None
    names = args.class_names
    prior, prior_name, note = None, None, ""
    if args.prior not in (None, "balanced"):
        scenario = named_scenario(args.prior)
        names = names or list(WBC5_CLASS_ORDER)
        prior, prior_name, note = scenario.shares, scenario.name, scenario.assumption
    elif args.prior_shares is not None:
        prior, prior_name = args.prior_shares, "custom"
    if names is None:
        labels = np.concatenate([np.asarray(ys).ravel(), np.asarray(yt).ravel()])
        if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
            raise FmauditInputError(f"{args.source_labels}, {args.target_labels}: labels must be integer class "
                                    "indices 0..K-1")
        names = [f"class_{c}" for c in range(int(labels.max()) + 1)]
    if args.prior == "balanced":
        prior, prior_name = balanced_prior(names), "balanced"
    rows = evaluate_draws(
        xs, ys, xt, yt, args.methods, n_classes=len(names), class_names=names, prior=prior, prior_name=prior_name,
        sample_size=args.sample_size, n_draws=args.draws, random_state=args.seed, C=args.C,
        val_fraction=args.val_fraction, n_bins=args.ece_bins, source_groups=groups, device=args.device,
        shot_im=_shot_im_settings())
    summary = summarize_draws(rows)
    write_table(args.out, summary)
    if args.draws_out:
        write_table(args.draws_out, rows)
    if note:
        print(f"prior {prior_name!r}: {note}")
    replaced = str(rows["classes_with_replacement"].iloc[0]) if "classes_with_replacement" in rows.columns else ""
    if replaced:
        counts = np.bincount(np.asarray(yt, dtype=np.int64), minlength=len(names))
        print(f"note: --sample-size {args.sample_size} asks for more items of class(es) {replaced} than the "
              f"target's {len(yt)} items hold ({', '.join(f'{n}: {c}' for n, c in zip(names, counts))}), so those "
              "classes are drawn WITH replacement: a draw repeats items, and its spread across draws understates "
              "the sampling variance of a real target of that size; a smaller --sample-size avoids it "
              "(column classes_with_replacement)", file=sys.stderr)
    print(f"wrote {len(summary)} methods to {args.out}")
    return 0

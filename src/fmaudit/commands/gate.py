"""``fmaudit gate``: fit and export the abstention gate on your own embeddings, and apply an exported gate.

    fmaudit gate export --features F --labels Y [--groups G] [--encoder E --readout R] --out GATE/
    fmaudit gate apply --gate GATE/ --features X [--readout R] --out decisions.csv

Features: .npy, .npz (``--features-key``, else ``feat__<readout>`` of an fmaudit embeddings file when
``--readout`` is given, else ``features`` or the single array), or .h5 (dataset ``features``). Labels:
integer class indices 0..K-1, or class names (text), in a .npy/.npz/.h5 or a one-column .csv/.txt (one per
line); groups (patients / slides) likewise. ``apply`` writes one row per input row, in input order: the item's
id (``item_id``: the file's ids where it has them, an fmaudit embeddings file or an HDF5/npz with an id array,
else ``row``, the 0-based input row), decision (accept / reject_novel / reject_unconfident), novelty,
confidence, prediction (class index) and prediction_name when the gate knows the class names. A file with
several readouts (``feat__cls``, ``feat__mean`` ...) needs ``--readout`` (or ``--features-key``): the gate never
picks one silently.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from fmaudit.datasets.own import FEATURE_ID_KEYS
from fmaudit.io import FmauditInputError, load_feature_array, write_table
from fmaudit.ood.gate import AbstentionGate, load_gate, save_gate

READOUT_PREFIX = "feat__"  # an fmaudit embeddings file's readout arrays (fmaudit.embed.FEATURE_PREFIX)


def _read_vector(path: str, what: str, n: int | None = None) -> np.ndarray:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if p.suffix.lower() in (".csv", ".txt", ".tsv"):
        lines = [line.strip() for line in p.read_text().splitlines()]
        values = [v.split(",")[0].split("\t")[0] for v in lines if v]
        arr = np.asarray(values, dtype=object)
        try:
            as_int = np.asarray([int(v) for v in values])
            arr = as_int
        except ValueError:
            arr = np.asarray(values, dtype=str)
    else:
        arr = np.asarray(load_feature_array(path, key=None if p.suffix.lower() == ".npy" else what)).reshape(-1)
    if n is not None and arr.shape[0] != n:
        raise FmauditInputError(f"{path}: {arr.shape[0]} {what} but {n} feature rows")
    return arr


def _array_names(path: Path) -> list[str]:
    """The arrays an .npz or HDF5 file holds (nothing for other files)."""
    import h5py

    if path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return [k for k in z.files if k != "provenance"]
    if path.suffix.lower() in (".h5", ".hdf5"):
        with h5py.File(path, "r") as f:
            return list(f.keys())
    return []


def _read_features(path: str, key: str | None, readout: str | None) -> np.ndarray:
    p = Path(path)
    names = _array_names(p) if p.exists() else []
    readouts = [n[len(READOUT_PREFIX):] for n in names if n.startswith(READOUT_PREFIX)]
    if key is None and readouts:
        if readout is None and len(readouts) > 1:
            raise FmauditInputError(f"{path}: holds several readouts ({', '.join(readouts)}); say which these gate "
                                    "decisions are for with --readout (or --features-key)")
        chosen = readout or readouts[0]
        if chosen not in readouts:
            raise FmauditInputError(f"{path}: no readout {chosen!r} (it holds {', '.join(readouts)})")
        key = READOUT_PREFIX + chosen
    arr = np.asarray(load_feature_array(path, key=key))
    if arr.ndim != 2:
        raise FmauditInputError(f"{path}: expected a 2-D feature array (items, features), got shape {arr.shape}")
    return arr


def _read_item_ids(path: str, n: int) -> np.ndarray | None:
    """The item ids a feature file holds (``item_id``, ``ids``, ``filenames`` ...), one per feature row, or None."""
    p = Path(path)
    names = _array_names(p)
    key = next((k for k in FEATURE_ID_KEYS if k in names), None)
    if key is None:
        return None
    ids = np.asarray(load_feature_array(path, key=key)).reshape(-1)
    if len(ids) != n:
        raise FmauditInputError(f"{path}: {len(ids)} ids in {key!r} but {n} feature rows")
    return np.asarray([v.decode() if isinstance(v, bytes) else str(v) for v in ids], dtype=object)


def _encode_labels(labels: np.ndarray, path: str) -> tuple[np.ndarray, list[str] | None]:
    if labels.dtype.kind in "iu":
        if labels.size and labels.min() < 0:
            raise FmauditInputError(f"{path}: negative label {int(labels.min())}; labels are class indices 0..K-1")
        return labels.astype(np.int64), None
    if labels.dtype.kind == "f":
        if not np.isfinite(labels).all():
            raise FmauditInputError(f"{path}: missing (NaN) label at row "
                                    f"{int(np.flatnonzero(~np.isfinite(labels))[0])}")
        if (labels != np.round(labels)).any():
            raise FmauditInputError(f"{path}: non-integer labels; give class indices or class names")
        return labels.astype(np.int64), None
    names, codes = np.unique(labels.astype(str), return_inverse=True)
    return codes.reshape(-1).astype(np.int64), [str(n) for n in names]


def cmd_gate_export(args: argparse.Namespace) -> int:
    """Run ``fmaudit gate export``: fit the abstention gate on the training features and write it to ``--out``.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options of ``gate export`` (``features``, ``labels``, ``groups``, ``features_key``, ``encoder``,
        ``readout``, ``C``, ``scorer``, ``covariance``, ``knn_k``, ``id_reject``, ``retain``,
        ``validation_fraction``, ``seed``, ``out``).

    Returns
    -------
    int
        Exit status 0; ``--out`` holds ``gate.safetensors`` and its card ``gate.json``.

    Raises
    ------
    FmauditInputError
        When the features are not 2-D, a file holds several readouts and none is named, or the labels are
        negative, missing or not integral, or their length differs from the feature rows.
    """
    X = _read_features(args.features, args.features_key, args.readout)
    labels, names = _encode_labels(_read_vector(args.labels, "labels", len(X)), args.labels)
    groups = _read_vector(args.groups, "groups", len(X)) if args.groups else None
    scorer_params: dict[str, Any] = {}
    if args.scorer in ("maha", "relative_maha") and args.covariance:
        scorer_params["covariance"] = args.covariance
    if args.scorer == "knn":
        scorer_params["k"] = args.knn_k
    gate = AbstentionGate(id_reject=args.id_reject, retain=args.retain, validation_fraction=args.validation_fraction,
                          random_state=args.seed, C=args.C, scorer=args.scorer, scorer_params=scorer_params,
                          n_classes=len(names) if names else None)
    gate.fit(X, labels, groups, encoder=args.encoder, readout=args.readout)
    card = save_gate(gate, args.out, class_names=names)
    vp = gate.validation_point_
    print(f"wrote {card.parent}: {gate.n_features_in_} features, {gate.n_classes_} classes, thresholds novelty "
          f"{gate.novelty_threshold_:.6g} / confidence {gate.confidence_threshold_:.6g}; validation coverage "
          f"{vp['coverage']:.3f}, accuracy of accepted {vp['accuracy_accepted']:.3f}")
    return 0


def cmd_gate_apply(args: argparse.Namespace) -> int:
    """Run ``fmaudit gate apply``: one decision per feature row from an exported gate, written to ``--out``.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options of ``gate apply`` (``gate``, ``features``, ``features_key``, ``readout``, ``out``).

    Returns
    -------
    int
        Exit status 0; ``--out`` holds ``item_id`` (or ``row``), ``decision``, ``novelty``, ``confidence``,
        ``prediction`` and, where the gate knows the class names, ``prediction_name``.

    Raises
    ------
    FmauditInputError
        When the features are not 2-D, their readout is ambiguous or differs from the gate's.
    """
    gate = load_gate(args.gate)
    X = _read_features(args.features, args.features_key, args.readout)
    table = gate.decide(X, readout=args.readout or gate.readout_)
    ids = _read_item_ids(args.features, len(X))
    if ids is not None:
        table.insert(0, "item_id", ids)
    else:
        table.insert(0, "row", np.arange(len(X)))
    names = (getattr(gate, "card_", {}) or {}).get("class_names")
    if names and not all(n == f"class_{i}" for i, n in enumerate(names)):
        table["prediction_name"] = np.asarray(names, dtype=object)[table["prediction"].to_numpy()]
    write_table(args.out, table)
    counts = table["decision"].value_counts()
    print(f"wrote {len(table)} decisions to {args.out} (one per row, by {'item_id' if ids is not None else 'row'}): "
          + ", ".join(f"{k} {int(v)}" for k, v in counts.items()))
    return 0


def register(subparsers: Any) -> None:
    """Add ``gate export`` and ``gate apply`` to the ``fmaudit`` command line.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`; ``gate`` gets its own ``export`` and ``apply``.
    """
    gate = subparsers.add_parser("gate", help="fit/export the two-threshold abstention gate, or apply an exported one")
    sub = gate.add_subparsers(dest="gate_command", required=True)

    ex = sub.add_parser("export", help="fit the gate on training embeddings and write it to a folder")
    ex.add_argument("--features", required=True, help="training features: .npy, .npz or .h5")
    ex.add_argument("--labels", required=True, help="class index or class name per row (.npy/.npz/.h5/.csv/.txt)")
    ex.add_argument("--groups", help="patient/slide per row: the fit/validation division and CV keep groups whole")
    ex.add_argument("--features-key", help="array name inside .npz/.h5 files")
    ex.add_argument("--encoder", help="encoder the features come from (recorded in the card)")
    ex.add_argument("--readout", help="readout the features come from (recorded; apply refuses other readouts)")
    ex.add_argument("--C", type=float, default=None,
                    help="fixed inverse L2 strength of the probe (default: grouped 3-fold CV, the audit paper's)")
    ex.add_argument("--scorer", default="maha", choices=["maha", "relative_maha", "knn"], help="novelty scorer")
    ex.add_argument("--covariance", default=None, choices=["ledoit_wolf", "empirical"],
                    help="covariance estimator of the Mahalanobis scorers (default: ledoit_wolf for maha)")
    ex.add_argument("--knn-k", type=int, default=50, help="k of the kNN scorer")
    ex.add_argument("--id-reject", type=float, default=0.05, help="nominal ID reject rate of the novelty threshold")
    ex.add_argument("--retain", type=float, default=0.8, help="share of novelty-passing validation items kept")
    ex.add_argument("--validation-fraction", type=float, default=0.2)
    ex.add_argument("--seed", type=int, default=0, help="seed of the fit/validation division and CV folds")
    ex.add_argument("--out", required=True, help="output folder (gate.safetensors + gate.json)")
    ex.set_defaults(func=cmd_gate_export)

    ap = sub.add_parser("apply", help="apply an exported gate to features; one decision per row")
    ap.add_argument("--gate", required=True, help="folder written by 'fmaudit gate export'")
    ap.add_argument("--features", required=True, help=".npy, .npz or .h5")
    ap.add_argument("--features-key", help="array name inside .npz/.h5 files")
    ap.add_argument("--readout", help="readout of these features (required where the file holds several); a gate "
                    "fitted on another readout refuses")
    ap.add_argument("--out", required=True, help="decisions table (.csv, .tsv, .parquet)")
    ap.set_defaults(func=cmd_gate_apply)

"""The abstention gate exported and read back: ``gate.safetensors`` (arrays) and ``gate.json`` (the card),
nothing pickled, the card written last (:mod:`fmaudit.ood.gate`)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from fmaudit.io import FmauditInputError, PathLike, atomic_path, provenance, sha256_file, write_json
from fmaudit.ood.gate.estimator import AbstentionGate
from fmaudit.ood.scorers import scorer_from_state

GATE_FORMAT = "fmaudit-abstention-gate"
GATE_FORMAT_VERSION = 1
ARRAYS_FILE = "gate.safetensors"
CARD_FILE = "gate.json"

__all__ = ["ARRAYS_FILE", "CARD_FILE", "GATE_FORMAT", "GATE_FORMAT_VERSION", "load_gate", "save_gate"]


def save_gate(gate: AbstentionGate, directory: PathLike, *, encoder: str | None = None, readout: str | None = None,
              data_hash: str | None = None, class_names: Sequence[str] | None = None,
              extra: Mapping[str, Any] | None = None) -> Path:
    """Write a fitted gate to ``directory`` (``gate.safetensors`` + ``gate.json``); returns the card's path.

    ``encoder`` / ``readout`` default to those given to ``fit``; ``data_hash`` to the gate's training-data
    hash (pass the manifest/embedding hash of a workflow run instead). Arrays go first and the card last, each
    atomically; the card records the arrays' sha256.

    Parameters
    ----------
    gate : AbstentionGate
        A fitted gate.
    directory : path-like
        Folder to write (created if missing); its ``gate.safetensors`` and ``gate.json`` are replaced.
    encoder, readout : str or None
        Recorded on the card (keyword-only; default: those the gate was fitted with).
    data_hash : str or None
        Hash of the training data recorded as the card's ``data_hash`` (default the gate's own hash).
    class_names : sequence of str or None
        One name per class index (default ``class_0`` ...).
    extra : mapping or None
        JSON-ready values stored under the card's ``extra`` key (e.g. the task and setting).

    Returns
    -------
    Path
        The card's path, ``directory / "gate.json"``.

    Raises
    ------
    FmauditInputError
        The gate is not fitted, or ``class_names`` has not one name per class.
    """
    from safetensors.numpy import save_file

    gate._check_fitted()
    probe = gate.probe_
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {
        "scaler.mean": probe.mean_, "scaler.scale": probe.scale_,
        "probe.coef": probe.coef_, "probe.intercept": probe.intercept_,
        "probe.present": probe.present_.astype(np.uint8),
    }
    tensors.update({f"scorer.{k}": v for k, v in gate.scorer_.state_arrays().items()})
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    arrays_path = directory / ARRAYS_FILE
    with atomic_path(arrays_path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": GATE_FORMAT})
    encoder = encoder if encoder is not None else gate.encoder_
    readout = readout if readout is not None else gate.readout_
    k = gate.n_classes_
    names = [str(c) for c in class_names] if class_names is not None else [f"class_{i}" for i in range(k)]
    if len(names) != k:
        raise FmauditInputError(f"class_names: {len(names)} names for a gate with {k} classes")
    card = {
        "format": GATE_FORMAT, "format_version": GATE_FORMAT_VERSION,
        **provenance(),
        "encoder": encoder, "readout": readout,
        "data_hash": data_hash if data_hash is not None else gate.training_data_hash_,
        "training_data_hash": gate.training_data_hash_,
        "n_features": int(gate.n_features_in_), "n_classes": int(k), "class_names": names,
        "probe": {"kind": "logistic", "standardized": True, "C": gate.C_,
                  "selection": "fixed C" if gate.C is not None else
                  f"{gate.cv_folds}-fold {'grouped ' if getattr(gate, 'grouped_', False) else ''}CV on log-loss "
                  f"over {len(np.ravel(gate.Cs))} values"},
        "scorer": {"name": gate.scorer_.name, "params": gate.scorer_.params()},
        "thresholds": {"novelty": gate.novelty_threshold_, "confidence": gate.confidence_threshold_},
        "rules": {"reject_novel": "novelty > thresholds.novelty",
                  "reject_unconfident": "not novel and confidence < thresholds.confidence",
                  "confidence": "max softmax of the probe logits"},
        "settings": gate.get_params(),
        "validation_operating_point": gate.validation_point_,
        "arrays": ARRAYS_FILE, "arrays_sha256": sha256_file(arrays_path),
        **({"extra": dict(extra)} if extra else {}),
    }
    write_json(directory / CARD_FILE, card)
    return directory / CARD_FILE


def load_gate(directory: PathLike) -> AbstentionGate:
    """A fitted :class:`AbstentionGate` from a folder written by :func:`save_gate` (no pickle).

    Parameters
    ----------
    directory : path-like
        A folder holding ``gate.json`` and ``gate.safetensors``.

    Returns
    -------
    AbstentionGate
        The gate with its probe, scorer, thresholds, validation point, hash, encoder and readout restored, and
        the card itself as ``card_``; it decides as the saved gate did.

    Raises
    ------
    FmauditInputError
        No card (not a gate folder, or an unfinished export), a card that is not JSON or of another format or a
        newer version, missing or unreadable arrays, arrays whose sha256 differs from the card's, or array
        shapes that disagree with the card.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.probes import LogisticProbe

    directory = Path(directory)
    card_path, arrays_path = directory / CARD_FILE, directory / ARRAYS_FILE
    if not card_path.exists():
        raise FmauditInputError(f"{directory}: no {CARD_FILE}; not an exported fmaudit gate (or an unfinished one)")
    try:
        card = json.loads(card_path.read_text())
    except json.JSONDecodeError as err:
        raise FmauditInputError(f"{card_path}: not valid JSON ({err})") from err
    if card.get("format") != GATE_FORMAT:
        raise FmauditInputError(f"{card_path}: format {card.get('format')!r} is not {GATE_FORMAT!r}")
    if int(card.get("format_version", -1)) > GATE_FORMAT_VERSION:
        raise FmauditInputError(f"{card_path}: gate format version {card.get('format_version')} is newer than this "
                                f"fmaudit reads ({GATE_FORMAT_VERSION}); upgrade fmaudit")
    if not arrays_path.exists():
        raise FmauditInputError(f"{directory}: {ARRAYS_FILE} is missing")
    if sha256_file(arrays_path) != card.get("arrays_sha256"):
        raise FmauditInputError(f"{arrays_path}: contents do not match the card's sha256 (a partial or mixed export)")
    try:
        arrays = load_file(str(arrays_path))
    except (SafetensorError, OSError, ValueError) as err:
        raise FmauditInputError(f"{arrays_path}: unreadable safetensors file ({err})") from err
    need = ["scaler.mean", "scaler.scale", "probe.coef", "probe.intercept", "probe.present"]
    missing = [n for n in need if n not in arrays]
    if missing:
        raise FmauditInputError(f"{arrays_path}: missing array(s) {missing}")
    known = set(inspect.signature(AbstentionGate).parameters)
    settings = {k: v for k, v in dict(card.get("settings") or {}).items() if k in known}
    gate = AbstentionGate(**settings)
    k, d = int(card["n_classes"]), int(card["n_features"])
    probe = LogisticProbe(standardize=True, n_classes=k)
    probe.classes_ = np.arange(k)
    probe.present_ = arrays["probe.present"].astype(bool)
    probe.n_features_in_ = d
    probe.mean_, probe.scale_ = arrays["scaler.mean"], arrays["scaler.scale"]
    probe.coef_, probe.intercept_ = arrays["probe.coef"], arrays["probe.intercept"]
    if probe.coef_.shape != (k, d) or probe.mean_.shape != (d,) or probe.present_.shape != (k,):
        raise FmauditInputError(f"{arrays_path}: array shapes do not match the card ({k} classes, {d} features)")
    scorer_state = {n[len("scorer."):]: v for n, v in arrays.items() if n.startswith("scorer.")}
    gate.probe_ = probe
    gate.scorer_ = scorer_from_state(card["scorer"]["name"], card["scorer"]["params"], scorer_state)
    gate.C_ = float(card["probe"]["C"]) if card["probe"].get("C") is not None else float("nan")
    gate.novelty_threshold_ = float(card["thresholds"]["novelty"])
    gate.confidence_threshold_ = float(card["thresholds"]["confidence"])
    gate.n_features_in_, gate.n_classes_ = d, k
    gate.validation_point_ = dict(card.get("validation_operating_point") or {})
    gate.training_data_hash_ = card.get("training_data_hash")
    gate.encoder_, gate.readout_ = card.get("encoder"), card.get("readout")
    gate.grouped_ = "grouped" in str(card["probe"].get("selection", ""))
    gate.card_ = card
    return gate

"""Shared machinery of the public-data-set preparers: parameters, the missing-data message, file listing,
label maps, and the common tail (exact-duplicate removal, subsampling, splits, checks).

Manifest conventions of every public preparer
- ``source`` is the absolute path of the image file (or of the slide for slide tiles).
- ``label`` is the index of the class in the preparer's fixed class list (so labels agree across runs
  and, under a shared ``label_map``, across data sets); ``label_name`` is the class name.
- ``group`` is the patient / slide / biopsy where the release identifies one, else the item id (then the
  grouped split is an item-level split).
- ``domain`` is the acquisition site / scanner / hospital where the data set has several, else the data
  set's slug.
- ``split`` is the release's official split where it has one, else a grouped, label-stratified split.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.datasets.manifest import check_group_disjoint
from fmaudit.datasets.splits import (
    carve_validation,
    grouped_split,
    paper_stratified_sample,
    remove_exact_duplicates,
    stratified_row_sample,
)
from fmaudit.io import FmauditInputError, atomic_path

log = logging.getLogger("fmaudit.datasets.public")

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")

# Parameters every image-folder preparer accepts, with their defaults.
COMMON_DEFAULTS: dict[str, Any] = {
    "seed": 0,  # seed of the split (and of any subsample)
    "fractions": [0.6, 0.2, 0.2],  # train/val/test fractions of the grouped split when there is no official one
    "val_fraction": 0.0,  # share of an official train split moved to val (grouped, stratified); 0 keeps it
    "dedup": "bytes",  # exact-duplicate removal: bytes (sha256 of the file), pixels (decoded RGB), none
    "subsample": None,  # class-stratified sample of this many items after duplicate removal (None: all)
    # how the subsample is drawn: stratified (each class its largest-remainder share, numpy draw) or audit
    # (the audit paper's train_test_split(train_size=n, stratify=labels, random_state=seed) on its listing order)
    "subsample_method": "stratified",
}
SUBSAMPLE_METHODS = ("stratified", "audit")

# The fixed five-class WBC intersection of the hema paper (basophil, eosinophil, lymphocyte, monocyte, neutrophil).
WBC5_CLASSES = ("basophil", "eosinophil", "lymphocyte", "monocyte", "neutrophil")


class Source:
    """Where a data set comes from, for the missing-data message and the registry."""

    def __init__(self, name: str, url: str, how: str):
        self.name, self.url, self.how = name, url, how


def missing_data_error(dataset: str, source: Source, path: Path, data_root: Path) -> FmauditInputError:
    """The one message for a data set the user has not got (yet)."""
    rel = path.relative_to(data_root) if path.is_relative_to(data_root) else path
    return FmauditInputError(
        f"{source.name} ({dataset}): expected {rel} under data_root {data_root}; "
        f"get it from {source.url} ({source.how}) and unpack it there"
    )


def require(dataset: str, source: Source, data_root: Path, *candidates: str) -> Path:
    """The first candidate path (relative to data_root) that exists, else the missing-data error for the first."""
    for rel in candidates:
        p = data_root / rel
        if p.exists():
            return p
    raise missing_data_error(dataset, source, data_root / candidates[0], data_root)


def resolve_params(preparer: str, params: Mapping[str, Any] | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults overridden by ``params``; an unknown key raises naming it and the known ones."""
    params = dict(params or {})
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise FmauditInputError(
            f"preparer {preparer!r}: unknown parameter {unknown[0]!r} (known: {', '.join(sorted(defaults))})"
        )
    out = dict(defaults)
    out.update(params)
    return out


def choice(preparer: str, params: Mapping[str, Any], key: str, allowed: Sequence[Any]) -> Any:
    value = params[key]
    norm = value.lower() if isinstance(value, str) else value
    allowed_norm = [a.lower() if isinstance(a, str) else a for a in allowed]
    if norm not in allowed_norm:
        raise FmauditInputError(f"preparer {preparer!r}: parameter {key!r} must be one of {list(allowed)}, "
                                f"got {value!r}")
    return allowed[allowed_norm.index(norm)]


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_id(*parts: object) -> str:
    """A filename-safe item id: parts joined by ``__``, other characters replaced by ``_``."""
    return "__".join(_UNSAFE.sub("_", str(p)).strip("_") or "x" for p in parts)


def list_images(folder: Path, extensions: Iterable[str] = IMAGE_EXTENSIONS, recursive: bool = False) -> list[Path]:
    """Image files in ``folder`` (by extension, case-insensitive), sorted by path; hidden files skipped."""
    exts = tuple(e.lower() for e in extensions)
    it = folder.rglob("*") if recursive else folder.iterdir()
    files = [p for p in it if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in exts]
    return sorted(files)


def class_folders(root: Path, classes: Sequence[str], *, dataset: str,
                  case_insensitive: bool = True) -> dict[str, Path]:
    """Map each known class to its sub-folder of ``root``; folders of unknown classes raise (a wrong root)."""
    present = {p.name: p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    norm = (lambda s: s.lower()) if case_insensitive else (lambda s: s)
    known = {norm(c): c for c in classes}
    out: dict[str, Path] = {}
    for name, p in sorted(present.items()):
        if norm(name) not in known:
            raise FmauditInputError(
                f"{dataset}: {p} is not a class folder (expected some of {list(classes)}); is the data set unpacked "
                f"at the expected place?"
            )
        out[known[norm(name)]] = p
    if not out:
        raise FmauditInputError(f"{dataset}: no class folders in {root} (expected some of {list(classes)})")
    return out


def apply_labels(
    df: pd.DataFrame, native_classes: Sequence[str], label_map: str | None, maps: Mapping[str, Mapping[str, str]],
    *, dataset: str, native_col: str = "native_class",
) -> pd.DataFrame:
    """Set ``label`` / ``label_name`` from the native class: the native list, or a named label map.

    A label map sends native classes to the classes of the map (``wbc5``: :data:`WBC5_CLASSES`); native
    classes outside the map are dropped. Label indices follow the fixed class order of the target list.
    """
    name = (label_map or "none").lower()
    if name == "none":
        classes = list(native_classes)
        mapping = {c: c for c in classes}
    elif name in maps:
        classes = list(WBC5_CLASSES) if name == "wbc5" else sorted(set(maps[name].values()))
        mapping = dict(maps[name])
    else:
        raise FmauditInputError(f"{dataset}: unknown label_map {label_map!r} (known: none, {', '.join(sorted(maps))})")
    unknown = sorted(set(df[native_col]) - set(native_classes))
    if unknown:
        raise FmauditInputError(f"{dataset}: unknown class {unknown[0]!r} (expected one of {list(native_classes)})")
    target = df[native_col].map(mapping)
    out = df[target.notna().to_numpy()].copy()
    out["label_name"] = target[target.notna()].to_numpy()
    index = {c: i for i, c in enumerate(classes)}
    out["label"] = out["label_name"].map(index).astype("Int64")
    dropped = len(df) - len(out)
    if dropped:
        log.info("%s: label_map %s dropped %d items of classes outside the map", dataset, name, dropped)
    return out


def finish(
    df: pd.DataFrame,
    dataset: str,
    params: Mapping[str, Any],
    *,
    official_split: bool,
    stratify_by: Sequence[str] = ("label",),
    dedup_digests: Sequence[str] | None = None,
    extra_provenance: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Common tail: duplicate removal, optional subsample, split, group-disjointness check, provenance.

    ``df`` holds one row per item with at least item_id, source, label, label_name, group, domain and,
    when ``official_split``, split. Provenance (duplicates removed, counts, split mode) goes to a log line
    and ``df.attrs['provenance']``.
    """
    n_found = len(df)
    if n_found == 0:
        raise FmauditInputError(f"{dataset}: no items found (check the data set's layout under data_root)")
    df = df.copy()
    df["dataset"] = dataset
    mode = str(params.get("dedup", "bytes")).lower()
    if mode not in ("bytes", "pixels", "none"):
        raise FmauditInputError(f"{dataset}: dedup must be 'bytes', 'pixels' or 'none', got {params.get('dedup')!r}")
    n_dup = 0
    if mode != "none":
        df, n_dup = remove_exact_duplicates(df, mode=mode, digests=dedup_digests)
    else:
        df = df.sort_values("source", kind="stable").reset_index(drop=True)
    if n_dup:
        log.info("%s: removed %d exact duplicate(s) (%s), kept the first in sorted path order", dataset, n_dup, mode)
    n_sub = params.get("subsample")
    if n_sub is not None:
        # an official test set is kept whole; the sample is drawn from the rest
        held = ((df["split"] == "test").to_numpy() if official_split and "split" in df.columns
                else np.zeros(len(df), bool))
        method = params.get("subsample_method", "stratified")
        if method == "seed003":
            raise FmauditInputError(f"{dataset}: subsample_method 'seed003' is now called 'audit' (the audit paper's "
                                    "stratified draw); write subsample_method: audit")
        if method == "audit":
            sampled = paper_stratified_sample(df[~held], int(n_sub), int(params.get("seed", 0)))
        elif method == "stratified":
            sampled = stratified_row_sample(df[~held], int(n_sub), int(params.get("seed", 0)), stratify_by=stratify_by)
        else:
            raise FmauditInputError(f"{dataset}: subsample_method must be one of {SUBSAMPLE_METHODS}, got {method!r}")
        df = pd.concat([sampled, df[held]]).sort_values("source", kind="stable").reset_index(drop=True)
    if official_split:
        if "split" not in df.columns or df["split"].isna().any():
            raise FmauditInputError(f"{dataset}: official split missing for some items")
        df = carve_validation(df, float(params.get("val_fraction", 0.0) or 0.0), int(params.get("seed", 0)),
                              stratify_by=stratify_by)
    else:
        df = grouped_split(df, params.get("fractions", (0.6, 0.2, 0.2)), int(params.get("seed", 0)),
                           stratify_by=stratify_by)
    check_group_disjoint(df, name=f"manifest of {dataset}")
    df = df.sort_values(["split", "item_id"], key=_split_order, kind="stable").reset_index(drop=True)
    prov = {
        "items_found": n_found,
        "duplicates_removed": n_dup,
        "dedup": mode,
        "items": len(df),
        "split_mode": "official" if official_split else "grouped",
        "split_counts": {k: int(v) for k, v in df["split"].value_counts().sort_index().items()},
        **dict(extra_provenance or {}),
    }
    df.attrs["provenance"] = prov
    log.info("%s: %d items (%d found, %d duplicates removed), splits %s", dataset, len(df), n_found, n_dup,
             prov["split_counts"])
    return df


def _split_order(col: pd.Series) -> pd.Series:
    if col.name == "split":
        order = {"train": 0, "val": 1, "test": 2, "unassigned": 3}
        return col.map(order).fillna(9)
    return col


def first_missing(paths: Iterable[str | Path]) -> tuple[int, str | None]:
    """Number of paths that do not exist, and the first of them."""
    n, first = 0, None
    for p in paths:
        if not Path(p).exists():
            n += 1
            first = first or str(p)
    return n, first


def png_write(array: np.ndarray, path: Path) -> None:
    """Write an RGB uint8 array as PNG atomically; an existing file is left alone (idempotent preparers)."""
    from PIL import Image

    if path.exists():
        return
    with atomic_path(path, suffix=".png") as tmp:
        Image.fromarray(np.ascontiguousarray(array)).save(tmp, format="PNG")


def array_digest(array: np.ndarray) -> str:
    """sha256 of an image array's shape and pixels (the same digest ``dedup: pixels`` gives its PNG)."""
    import hashlib

    arr = np.ascontiguousarray(array)
    h = hashlib.sha256(str(arr.shape).encode())
    h.update(arr.tobytes())
    return h.hexdigest()

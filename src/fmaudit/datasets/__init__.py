"""Data sets: manifests (the one table downstream rules read), the demo generator, slide tiling, preparers.

A *preparer* turns a data set as it lies under ``data_root`` (its real layout) into a manifest. Preparers
register themselves by name; ``resources/datasets.yaml`` names the preparer of every known data set.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from fmaudit.io import FmauditInputError

Preparer = Callable[[str, Path, dict[str, Any]], pd.DataFrame]
PREPARERS: dict[str, Preparer] = {}

# modules whose import registers preparers
_PREPARER_MODULES = ("fmaudit.datasets.demo", "fmaudit.datasets.slide_tiles", "fmaudit.datasets.public",
                     "fmaudit.cells.prepare")


def register_preparer(name: str) -> Callable[[Preparer], Preparer]:
    """Decorator: ``@register_preparer("nct_crc_he_100k")`` on ``fn(dataset, data_root, params) -> manifest``."""

    def deco(fn: Preparer) -> Preparer:
        if name in PREPARERS and PREPARERS[name] is not fn:
            raise ValueError(f"preparer {name!r} registered twice")
        PREPARERS[name] = fn
        return fn

    return deco


def _load_preparers() -> None:
    for mod in _PREPARER_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:  # a real missing dependency inside the module
                raise


def get_preparer(name: str) -> Preparer:
    # Preparers the data-set registry already names (entries with status: pending) whose code arrives with a
    # later piece of work: asking for one says why it is missing rather than calling it unknown.
    pending: dict[str, str] = {}
    _load_preparers()
    if name in PREPARERS:
        return PREPARERS[name]
    if name in pending:
        raise FmauditInputError(f"preparer {name!r} is not implemented yet: {pending[name]}")
    raise FmauditInputError(f"unknown preparer {name!r}; known: {sorted(PREPARERS)}")


def prepare_dataset(dataset: str, preparer: str, data_root: str | Path, params: dict[str, Any] | None = None) -> pd.DataFrame:
    """Run a data set's preparer and return its validated manifest."""
    from fmaudit.datasets.manifest import make_manifest, validate_manifest

    fn = get_preparer(preparer)
    raw = fn(dataset, Path(data_root), dict(params or {}))
    df = make_manifest(raw)
    df.attrs = dict(raw.attrs)  # preparer provenance (duplicates removed, split mode) travels to the parquet
    return validate_manifest(df, name=f"manifest of {dataset}")

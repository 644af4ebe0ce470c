"""Simulated cell panels in the real on-disk format: manifests and feature folders of several sections."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import pytest

from fmaudit.cells.features import write_cell_features

SECTIONS = {"breast": ["breast-1", "breast-2", "breast-3"], "lung": ["lung-1", "lung-2"], "skin": ["skin-1"]}


def simulate_section(section: str, organ: str, n_cells: int, dim: int, rng: np.random.Generator,
                     class_means: np.ndarray, coarse_of: np.ndarray, has_cls: bool = True,
                     cells_per_patch: int = 8, nuc_signal: float = 1.0, unlabelled: float = 0.05):
    """A section whose class is planted in Nuc (strongly) and diluted in the patch Mean (the patch averages
    its cells' classes); a section offset shifts every readout (domain shift)."""
    k_fine = class_means.shape[0]
    labels = rng.integers(0, k_fine, n_cells)
    n_patches = max(1, n_cells // cells_per_patch)
    side = int(np.ceil(np.sqrt(n_patches)))
    cell_patch = np.sort(rng.integers(0, n_patches, n_cells))
    uv = rng.uniform(0, 1, (n_cells, 2))
    x = (cell_patch % side + uv[:, 0]) * 64.0
    y = (cell_patch // side + uv[:, 1]) * 64.0
    offset = rng.normal(scale=0.3, size=dim)
    nuc = nuc_signal * class_means[labels] + rng.normal(size=(n_cells, dim)) + offset
    sums = np.zeros((n_patches, dim))
    np.add.at(sums, cell_patch, class_means[labels])
    counts = np.maximum(np.bincount(cell_patch, minlength=n_patches), 1)[:, None]
    mean = 0.5 * sums / counts + 0.5 * rng.normal(size=(n_patches, dim)) + offset
    cls = mean + 0.5 * rng.normal(size=(n_patches, dim)) if has_cls else None
    ids = [f"{section}/c{i}" for i in range(n_cells)]
    fine = pd.array(labels, dtype="Int64")
    missing = rng.uniform(size=n_cells) < unlabelled
    fine[missing] = pd.NA
    coarse = pd.array(coarse_of[labels], dtype="Int64")
    coarse[missing] = pd.NA
    manifest = pd.DataFrame({
        "item_id": ids, "cell_id": [f"c{i}" for i in range(n_cells)], "section": section, "organ": organ,
        "slide": f"/nonexistent/{section}.tif", "mpp": 0.25, "he_x": x, "he_y": y, "centre_source": "nucleus",
        "label_fine": fine, "label_coarse": coarse,
        "label_fine_name": [f"type{v}" if v is not pd.NA else None for v in fine],
        "label_coarse_name": [f"group{v}" if v is not pd.NA else None for v in coarse]})
    return manifest, dict(item_ids=ids, cell_patch=cell_patch, uv=uv, nuc=nuc, patch_mean=mean, patch_cls=cls)


def make_panel(root: Path, sections_by_organ: Mapping[str, Sequence[str]] = SECTIONS, n_cells: int = 300,
               dim: int = 8, has_cls: bool = True, seed: int = 0, encoder: str = "sim", magnification: float = 20,
               **kwargs):
    """(manifests, feature folders) of a simulated panel; features written by the real writer."""
    rng = np.random.default_rng(seed)
    class_means = rng.normal(scale=1.2, size=(5, dim))
    coarse_of = np.array([0, 0, 1, 1, 2])
    manifests, folders = {}, {}
    for organ, sections in sections_by_organ.items():
        for section in sections:
            manifest, arrays = simulate_section(section, organ, n_cells, dim, rng, class_means, coarse_of,
                                                has_cls=has_cls, **kwargs)
            manifests[section] = manifest
            folders[section] = write_cell_features(root / encoder / f"mag{magnification:g}" / section, **arrays,
                                                   meta={"encoder": encoder, "magnification": float(magnification)})
    return manifests, folders


def cell_config(sections_by_organ=SECTIONS, readouts=("nuc", "mean", "cls", "nuc_add_mean", "nuc_add_cls",
                                                      "nuc_cat_mean", "nuc_cat_cls"),
                encoders=("sim",), magnifications=(20,), protocols=None):
    protocols = protocols or {"IS": {"seeds": [0, 1]}, "IOCD": {"seeds": [0], "min_sections_per_organ": 2},
                              "MOCV": {"seeds": [0], "folds": 3}, "LOOO": {"seeds": [0]}}
    return {"encoders": list(encoders), "datasets": ["x"],
            "tasks": {"cf": {"datasets": ["x"]}, "cc": {"datasets": ["x"]}},
            "cells": {"taxonomies": {"fine": "cf", "coarse": "cc"},
                      "sections": {o: list(s) for o, s in sections_by_organ.items()},
                      "magnifications": list(magnifications), "readouts": list(readouts), "protocols": protocols}}


@pytest.fixture
def sim_panel(tmp_path):
    return make_panel(tmp_path)

"""OOD conditions of a task as index and label arrays (the audit paper's tiers; grid names in ``fmaudit.grid``).

- near (``holdout_<class>``) and artefact-class (``artefact``) conditions: :func:`hold_out_classes` removes
  one or several classes; probe and scorers are refitted on the remaining training items (labels renumbered
  0..K'-1 in their original order), the ID set is the remaining test items and the OOD set the held-out
  classes' test items.
- far (``far_<donor>``): :func:`far_ood_items`, the donor task's test items (its features from the same
  encoder and readout); nothing is refitted.
- perturbed (``blur_s<sigma>``, image artefacts): :func:`align_perturbed` puts the embeddings of a derived
  manifest (:func:`fmaudit.ood.perturb.derive_manifest`) in the order of the ID test items they were made
  from, so ID and OOD sets are paired item by item.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fmaudit.io import FmauditInputError
from fmaudit.ood.perturb import ID_SEPARATOR

__all__ = ["HeldOutClasses", "align_perturbed", "far_ood_items", "hold_out_classes"]


@dataclass
class HeldOutClasses:
    """A task with some classes held out.

    ``keep`` (N,) bool: items of the remaining classes; ``held_out`` (N,) bool: items of the held-out
    classes; ``labels`` (N,) int: remaining items renumbered 0..K'-1, -1 for held-out items;
    ``class_names``: the K' remaining names; ``held_out_names``: the held-out names.
    """

    keep: np.ndarray
    held_out: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    held_out_names: list[str]


def hold_out_classes(labels: Any, class_names: Sequence[str], held_out: Sequence[str], *,
                     condition: str = "") -> HeldOutClasses:
    """Hold out the classes named ``held_out`` (the audit paper's ``hold_out``); at least two classes must remain."""
    names = [str(c) for c in class_names]
    y = np.asarray(labels)
    where = f"condition {condition!r}: " if condition else ""
    if y.ndim != 1:
        raise FmauditInputError(f"{where}labels must be 1-D, got shape {y.shape}")
    held = [str(c) for c in held_out]
    if not held:
        raise FmauditInputError(f"{where}no class to hold out")
    if len(set(held)) != len(held):
        raise FmauditInputError(f"{where}held-out classes repeat: {held}")
    unknown = [c for c in held if c not in names]
    if unknown:
        raise FmauditInputError(f"{where}class(es) {unknown} are not classes of the task ({names})")
    drop = np.array([names.index(c) for c in held])
    remaining = np.setdiff1d(np.arange(len(names)), drop)
    if remaining.size < 2:
        raise FmauditInputError(f"{where}holding out {held} leaves {remaining.size} class(es); a probe needs two")
    if y.size and (y.min() < 0 or y.max() >= len(names)):
        raise FmauditInputError(f"{where}labels outside 0..{len(names) - 1}")
    out_mask = np.isin(y, drop)
    remap = np.full(len(names), -1, dtype=np.int64)
    remap[remaining] = np.arange(remaining.size)
    return HeldOutClasses(keep=~out_mask, held_out=out_mask, labels=remap[y.astype(np.int64)],
                          class_names=[names[i] for i in remaining], held_out_names=held)


def far_ood_items(donor_splits: Any, donor_name: str = "donor", split: str = "test") -> np.ndarray:
    """Row indices of the donor task's ``split`` items (its test split, the audit paper); all its items when the
    donor has no such split (a data set used only as an OOD source)."""
    splits = np.asarray(donor_splits).astype(str)
    idx = np.flatnonzero(splits == split)
    if idx.size == 0:
        idx = np.arange(splits.size)
    if idx.size == 0:
        raise FmauditInputError(f"far-OOD donor {donor_name!r} has no items")
    return idx


def align_perturbed(test_item_ids: Sequence[str], derived_item_ids: Sequence[str], derived_features: Any,
                    tag: str) -> np.ndarray:
    """(n_test, D) embeddings of the perturbed copies, row i being the copy of ``test_item_ids[i]``.

    The copies are found by their derived ids ``<item_id>__<tag>``; a missing copy raises naming it (the
    derived manifest was made from another test split: re-derive and re-embed it).
    """
    feats = np.asarray(derived_features)
    ids = [str(i) for i in derived_item_ids]
    if feats.ndim != 2 or feats.shape[0] != len(ids):
        raise FmauditInputError(f"condition {tag!r}: {feats.shape} features for {len(ids)} derived item ids")
    position = {item: i for i, item in enumerate(ids)}
    if len(position) != len(ids):
        raise FmauditInputError(f"condition {tag!r}: duplicated derived item ids")
    wanted = [f"{item}{ID_SEPARATOR}{tag}" for item in test_item_ids]
    missing = [w for w in wanted if w not in position]
    if missing:
        raise FmauditInputError(f"condition {tag!r}: {len(missing)} test item(s) have no perturbed copy, e.g. "
                                f"{missing[0]!r}; re-derive the manifest from this test split and re-embed it")
    return feats[[position[w] for w in wanted]]

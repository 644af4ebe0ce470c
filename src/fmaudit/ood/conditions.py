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

    Parameters
    ----------
    keep : ndarray of shape (n_items,), bool
        Items of the remaining classes.
    held_out : ndarray of shape (n_items,), bool
        Items of the held-out classes (``~keep``).
    labels : ndarray of shape (n_items,), int64
        Remaining items renumbered 0..K'-1 in their original order, -1 for held-out items.
    class_names : list of str
        The K' remaining class names, in the order of the new labels.
    held_out_names : list of str
        The held-out class names, as given.
    """

    keep: np.ndarray
    held_out: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    held_out_names: list[str]


def hold_out_classes(labels: Any, class_names: Sequence[str], held_out: Sequence[str], *,
                     condition: str = "") -> HeldOutClasses:
    """Hold out the classes named ``held_out`` (the audit paper's ``hold_out``); at least two classes must remain.

    Parameters
    ----------
    labels : array-like of shape (n_items,)
        Class indices 0..K-1 of the task.
    class_names : sequence of str
        The task's K class names, index order.
    held_out : sequence of str
        Names of the classes to hold out (distinct, at least one).
    condition : str
        The condition's name (e.g. ``holdout_blast``), prefixed to the error messages (keyword-only).

    Returns
    -------
    HeldOutClasses
        The masks, renumbered labels and names.

    Raises
    ------
    FmauditInputError
        Labels not 1-D or outside 0..K-1, no, repeated or unknown held-out class, or fewer than two classes
        left.
    """
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
    donor has no such split (a data set used only as an OOD source).

    Parameters
    ----------
    donor_splits : array-like of shape (n_donor_items,)
        The split of each donor item (``train`` / ``val`` / ``test`` ...).
    donor_name : str
        The donor task's name, for the error message.
    split : str
        Split whose items are the far-OOD set (default ``test``).

    Returns
    -------
    ndarray of int
        Sorted row indices into the donor's arrays.

    Raises
    ------
    FmauditInputError
        The donor has no items.
    """
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

    Parameters
    ----------
    test_item_ids : sequence of str
        Item ids of the ID test split, in the order of its feature rows.
    derived_item_ids : sequence of str
        Item ids of the derived manifest's embeddings (``<item_id>__<tag>``), unique.
    derived_features : array-like of shape (n_derived, n_features)
        Embeddings of the derived manifest, one row per derived id.
    tag : str
        The perturbation's tag (:func:`fmaudit.ood.perturb.perturbation_tag`), also the condition name.

    Returns
    -------
    ndarray of shape (n_test, n_features)
        Row i is the perturbed copy of ``test_item_ids[i]``.

    Raises
    ------
    FmauditInputError
        Features not one row per derived id, duplicated derived ids, or a test item without its copy.
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

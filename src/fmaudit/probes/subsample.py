"""Label-fraction subsampling and train/validation splits of a training set.

Conventions
- ``label_fraction_subsample`` keeps ``max(1, int(n_c * fraction))`` items of every class c present (PRISM,
  METHODS section 8). Each class is shuffled once by ``numpy.random.default_rng(random_state)`` in sorted
  class order and its first items are kept, so for one seed a smaller fraction's subset is contained in a
  larger fraction's subset (nested label fractions, as in a learning curve).
- ``split_train_val`` without groups is a stratified shuffle split; with groups it keeps every group on one
  side and chooses, among a few seeded candidate splits, one whose train side has every class.
"""

from __future__ import annotations

import numpy as np

from fmaudit.io import FmauditInputError


def _as_labels(labels, name: str = "labels") -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise FmauditInputError(f"{name}: expected 1-D labels, got shape {labels.shape}")
    if labels.size == 0:
        raise FmauditInputError(f"{name}: no labels")
    if labels.dtype.kind == "f" and not np.isfinite(labels).all():
        raise FmauditInputError(f"{name}: NaN label at row {int(np.flatnonzero(~np.isfinite(labels))[0])}")
    if labels.dtype == object and any(v is None for v in labels):
        raise FmauditInputError(f"{name}: missing label (None) at row {[v is None for v in labels].index(True)}")
    return labels


def label_fraction_subsample(labels, fraction: float, random_state: int | None = 0) -> np.ndarray:
    """Sorted row indices keeping ``max(1, int(n_c * fraction))`` items of each class (see module doc)."""
    labels = _as_labels(labels)
    fraction = float(fraction)
    if not 0.0 < fraction <= 1.0:
        raise FmauditInputError(f"fraction={fraction}: a label fraction must lie in (0, 1]")
    if fraction == 1.0:
        return np.arange(labels.size)
    rng = np.random.default_rng(random_state)
    classes, codes = np.unique(labels, return_inverse=True)
    keep = []
    for c in range(classes.size):
        members = np.flatnonzero(codes == c)
        n_keep = max(1, int(members.size * fraction))
        keep.append(members[rng.permutation(members.size)[:n_keep]])
    return np.sort(np.concatenate(keep))


def split_train_val(
    labels,
    groups=None,
    val_fraction: float = 0.2,
    random_state: int | None = 0,
    n_candidates: int = 20,
) -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, val_idx), sorted; group-disjoint when ``groups`` is given.

    Without groups: per class, ``round(n_c * val_fraction)`` items go to validation, but a class keeps at
    least one training item. With groups: whole groups are drawn at random until about ``val_fraction`` of
    the items are in validation; of ``n_candidates`` seeded draws the first whose train side holds every
    class is kept (else the one missing the fewest classes), and the validation side never takes the last
    group. Deterministic for a given ``random_state``.
    """
    labels = _as_labels(labels)
    val_fraction = float(val_fraction)
    if not 0.0 < val_fraction < 1.0:
        raise FmauditInputError(f"val_fraction={val_fraction}: must lie in (0, 1)")
    rng = np.random.default_rng(random_state)
    n = labels.size
    if groups is None:
        classes, codes = np.unique(labels, return_inverse=True)
        val = []
        for c in range(classes.size):
            members = np.flatnonzero(codes == c)
            n_val = min(int(round(members.size * val_fraction)), members.size - 1)
            val.append(members[rng.permutation(members.size)[:n_val]])
        val_idx = np.sort(np.concatenate(val))
    else:
        groups = np.asarray(groups)
        if groups.shape != labels.shape:
            raise FmauditInputError(f"groups: {groups.shape[0] if groups.ndim else 0} groups for {n} labels")
        if groups.dtype.kind == "f" and not np.isfinite(groups).all():
            raise FmauditInputError(f"groups: missing group at row {int(np.flatnonzero(~np.isfinite(groups))[0])}")
        unique_groups, group_codes = np.unique(groups, return_inverse=True)
        if unique_groups.size < 2:
            raise FmauditInputError("groups: a group-disjoint split needs at least 2 groups")
        all_classes = np.unique(labels)
        group_sizes = np.bincount(group_codes)
        best, best_missing = None, None
        for _ in range(max(1, n_candidates)):
            order = rng.permutation(unique_groups.size)
            in_val = np.zeros(unique_groups.size, dtype=bool)
            filled = 0
            for g in order[:-1]:
                if filled >= val_fraction * n:
                    break
                in_val[g] = True
                filled += group_sizes[g]
            val_mask = in_val[group_codes]
            missing = np.setdiff1d(all_classes, labels[~val_mask]).size
            if best is None or missing < best_missing:
                best, best_missing = val_mask, missing
            if missing == 0:
                break
        val_idx = np.flatnonzero(best)
    train_mask = np.ones(n, dtype=bool)
    train_mask[val_idx] = False
    return np.flatnonzero(train_mask), val_idx

"""Grouped, stratified splits, class-stratified subsamples and exact-duplicate removal for manifests.

Conventions
- A *group* is the unit that must not straddle splits (patient, slide, biopsy). Items without a known
  group carry their own item id as group, which makes a grouped split an item-level split.
- *Stratified* means each split receives about its fraction of every stratum (by default the label;
  PANDA uses label x provider). With singleton groups the per-stratum counts are exact up to rounding;
  with real groups a greedy assignment keeps them as close as group sizes allow.
- Randomness only through ``np.random.default_rng(seed)``: same seed, same split.
- Duplicates are exact: the sha256 of a file's bytes (or of its decoded pixels). The first item in
  sorted ``source`` order is kept.
"""

from __future__ import annotations

import hashlib
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from fmaudit.datasets.manifest import check_group_disjoint
from fmaudit.io import FmauditInputError, sha256_file

log = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "val", "test")
#: The audit paper's class-stratified sample of NCT-CRC-HE-100K and PatchCamelyon: 9,000 patches, seed 42.
PAPER_SAMPLE_SIZE = 9000
PAPER_SAMPLE_SEED = 42


def _check_fractions(fractions: Sequence[float], split_names: Sequence[str]) -> np.ndarray:
    frac = np.asarray([float(f) for f in fractions], dtype=float)
    if len(frac) != len(split_names):
        raise FmauditInputError(
            f"split fractions {list(fractions)} do not match split names {list(split_names)} (one fraction per split)"
        )
    if (frac < 0).any() or not np.isfinite(frac).all():
        raise FmauditInputError(f"split fractions must be finite and non-negative, got {list(fractions)}")
    if abs(frac.sum() - 1.0) > 1e-6:
        raise FmauditInputError(f"split fractions must sum to 1, got {list(fractions)} (sum {frac.sum():.6g})")
    return frac


def _strata(df: pd.DataFrame, stratify_by: Sequence[str]) -> pd.Series:
    """One string key per row: the joint value of the stratification columns (NA is its own value)."""
    if not stratify_by:
        return pd.Series("all", index=df.index)
    missing = [c for c in stratify_by if c not in df.columns]
    if missing:
        raise FmauditInputError(f"grouped_split: stratification column(s) {missing} not in the table")
    parts = [df[c].astype("string").fillna("<NA>") for c in stratify_by]
    key = parts[0]
    for p in parts[1:]:
        key = key + "|" + p
    return key


def _largest_remainder(n: int, frac: np.ndarray) -> np.ndarray:
    """Integer counts summing to n, closest to n*frac (largest-remainder rounding; ties to earlier splits)."""
    raw = n * frac
    base = np.floor(raw).astype(int)
    rest = n - base.sum()
    order = np.argsort(-(raw - base), kind="stable")
    base[order[:rest]] += 1
    return base


def grouped_split(
    df: pd.DataFrame,
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    seed: int = 0,
    *,
    group_col: str = "group",
    stratify_by: Sequence[str] = ("label",),
    split_names: Sequence[str] = SPLIT_NAMES,
    split_col: str = "split",
) -> pd.DataFrame:
    """Return a copy of ``df`` whose ``split_col`` assigns every row to one of ``split_names``.

    Group-disjoint: all rows of a group land in the same split (checked before returning). Stratified where
    possible: singleton groups are dealt per stratum with largest-remainder counts; larger groups are placed
    greedily, largest first (ties in a seeded random order), each into the split whose per-stratum deficit
    it fills best, with strata weighted by the inverse of their size so rare classes count (equal costs go to
    the split least filled relative to its target). A split with fraction 0 receives nothing; a split with a
    positive fraction left empty by the greedy pass takes the smallest group of the split holding the most
    groups, so every such split is non-empty when there are enough groups.

    Parameters
    ----------
    df : DataFrame
        The table to split, one row per item.
    fractions : sequence of float
        One fraction per name in ``split_names``, non-negative, summing to 1 (default 60/20/20).
    seed : int
        Seed of ``np.random.default_rng``, which orders items and breaks ties.
    group_col : str
        Column whose values must not straddle splits (default ``group``); NA raises.
    stratify_by : sequence of str
        Manifest columns whose joint value is the stratum (default ``("label",)``; empty: one stratum; NA is a value of
        its own).
    split_names : sequence of str
        Names of the splits, in the order of ``fractions`` (default train, val, test).
    split_col : str
        Column written with the assignment (default ``split``; Camelyon17's patch-level split writes ``split_patch``).

    Returns
    -------
    DataFrame
        A copy of ``df`` with ``split_col`` (string dtype) set on every row.

    Raises
    ------
    FmauditInputError
        On fractions that do not match the names, are negative or do not sum to 1, a missing group or stratum column, or
        a row without a group.
    """
    frac = _check_fractions(fractions, split_names)
    if group_col not in df.columns:
        raise FmauditInputError(f"grouped_split: group column {group_col!r} not in the table")
    if df[group_col].isna().any():
        i = int(np.flatnonzero(df[group_col].isna().to_numpy())[0])
        raise FmauditInputError(f"grouped_split: row {i} has no {group_col!r}")
    out = df.copy()
    if len(out) == 0:
        out[split_col] = pd.Series(dtype="string")
        return out
    rng = np.random.default_rng(seed)
    strata = _strata(out, stratify_by)
    groups = out[group_col].astype(str)
    assignment = np.empty(len(out), dtype=object)

    sizes = groups.value_counts()
    if (sizes == 1).all():
        # item-level split: exact per-stratum proportions
        pos = np.arange(len(out))
        for key in sorted(strata.unique()):
            idx = pos[(strata == key).to_numpy()]
            idx = idx[rng.permutation(len(idx))]
            counts = _largest_remainder(len(idx), frac)
            start = 0
            for name, c in zip(split_names, counts):
                assignment[idx[start : start + c]] = name
                start += c
    else:
        keys = sorted(strata.unique())
        key_index = {k: i for i, k in enumerate(keys)}
        codes = strata.map(key_index).to_numpy()
        group_codes, group_names = pd.factorize(groups, sort=True)
        n_groups, n_strata = len(group_names), len(keys)
        composition = np.zeros((n_groups, n_strata))
        np.add.at(composition, (group_codes, codes), 1.0)
        stratum_total = composition.sum(axis=0)
        target = frac[:, None] * stratum_total[None, :]
        current = np.zeros_like(target)
        weight = 1.0 / stratum_total
        open_splits = frac > 0
        group_size = composition.sum(axis=1)
        tiebreak = rng.permutation(n_groups)
        order = np.lexsort((tiebreak, -group_size))
        chosen = np.empty(n_groups, dtype=int)
        for g in order:
            v = composition[g]
            # increase of the weighted squared deviation from the targets if g joins each split
            cost = ((2.0 * (current - target) + v[None, :]) * v[None, :] * weight[None, :]).sum(axis=1)
            cost[~open_splits] = np.inf
            # ties go to the split that is least filled relative to its target
            tied = np.flatnonzero(cost <= cost.min() + 1e-12)
            fill = current[tied].sum(axis=1) / np.maximum(target[tied].sum(axis=1), 1e-12)
            s = int(tied[np.argmin(fill)])
            chosen[g] = s
            current[s] += v
        # an open split left empty takes the smallest group of the split holding the most groups
        for s in np.flatnonzero(open_splits):
            if (chosen == s).any():
                continue
            counts = np.bincount(chosen, minlength=len(frac))
            donor = int(np.argmax(counts))
            if counts[donor] < 2:
                break
            members = np.flatnonzero(chosen == donor)
            chosen[members[np.argmin(group_size[members])]] = s
        names = np.asarray(split_names, dtype=object)
        assignment[:] = names[chosen[group_codes]]

    out[split_col] = pd.array(assignment, dtype="string")
    _check_disjoint_by(out, group_col, split_col)
    if split_col == "split" and group_col == "group" and "domain" in out.columns:
        check_group_disjoint(out, name="grouped_split")
    return out


def _check_disjoint_by(df: pd.DataFrame, group_col: str, split_col: str) -> None:
    per_group = df.groupby(group_col)[split_col].nunique()
    if (per_group > 1).any():
        raise FmauditInputError(f"group {per_group[per_group > 1].index[0]!r} is on several splits")


def carve_validation(
    df: pd.DataFrame,
    val_fraction: float,
    seed: int = 0,
    *,
    from_split: str = "train",
    group_col: str = "group",
    stratify_by: Sequence[str] = ("label",),
) -> pd.DataFrame:
    """Move about ``val_fraction`` of the ``from_split`` rows (whole groups, stratified) to ``val``.

    For data sets whose official split has only train and test. ``val_fraction`` 0 returns a copy unchanged.

    Parameters
    ----------
    df : DataFrame
        A table with a ``split`` column.
    val_fraction : float
        Share of the ``from_split`` rows to move, in [0, 1).
    seed : int
        Seed of the grouped split that picks them.
    from_split : str
        The split that gives rows (default ``train``).
    group_col : str
        Column whose groups are moved whole (default ``group``).
    stratify_by : sequence of str
        Manifest columns whose joint value is the stratum (default ``("label",)``; empty: one stratum; NA is a value of
        its own).

    Returns
    -------
    DataFrame
        A copy of ``df`` in which some ``from_split`` rows now have ``split`` ``val``.

    Raises
    ------
    FmauditInputError
        When ``val_fraction`` is outside [0, 1), or it is positive and no row is on ``from_split``.
    """
    val_fraction = float(val_fraction)
    if not 0.0 <= val_fraction < 1.0:
        raise FmauditInputError(f"val_fraction must be in [0, 1), got {val_fraction}")
    out = df.copy()
    if val_fraction == 0.0:
        return out
    mask = (out["split"] == from_split).to_numpy()
    if not mask.any():
        raise FmauditInputError(f"carve_validation: no rows on split {from_split!r} to take a validation set from")
    sub = grouped_split(
        out[mask], (1.0 - val_fraction, val_fraction), seed,
        group_col=group_col, stratify_by=stratify_by, split_names=(from_split, "val"),
    )
    out.loc[mask, "split"] = sub["split"].to_numpy()
    return out


def _sample_strata(df: pd.DataFrame, n: int, seed: int, stratify_by: Sequence[str],
                   allocate: Callable[[int, np.ndarray], np.ndarray]) -> pd.DataFrame:
    """``allocate(n, stratum sizes)`` rows of each stratum (sorted stratum keys), drawn without replacement by
    ``default_rng(seed)``; rows keep their original order; ``n`` at least the table size keeps every row."""
    n = int(n)
    if n <= 0:
        raise FmauditInputError(f"subsample size must be positive, got {n}")
    if n >= len(df):
        return df.copy()
    rng = np.random.default_rng(seed)
    strata = _strata(df, stratify_by)
    keys = sorted(strata.unique())
    sizes = np.array([(strata == k).sum() for k in keys])
    keep = np.zeros(len(df), dtype=bool)
    pos = np.arange(len(df))
    for k, c in zip(keys, allocate(n, sizes)):
        idx = pos[(strata == k).to_numpy()]
        keep[rng.choice(idx, size=int(c), replace=False)] = True
    return df[keep].copy()


def _proportional(n: int, sizes: np.ndarray) -> np.ndarray:
    return np.minimum(_largest_remainder(n, sizes / sizes.sum()), sizes)


def _water_filling(n: int, sizes: np.ndarray) -> np.ndarray:
    """Equal shares, capped by what each stratum has; what a small stratum cannot give goes to the others."""
    take = np.zeros(len(sizes), dtype=int)
    left = n
    while left > 0:
        room = sizes - take
        open_ = np.flatnonzero(room > 0)
        share = max(1, left // len(open_))
        for i in open_:
            add = min(share, room[i], left)
            take[i] += add
            left -= add
            if left == 0:
                break
    return take


def stratified_row_sample(
    df: pd.DataFrame, n: int, seed: int = 0, *, stratify_by: Sequence[str] = ("label",)
) -> pd.DataFrame:
    """``n`` rows drawn without replacement, each stratum keeping its share (largest-remainder rounding).

    Rows keep their original order. ``n`` at least the table size returns the table unchanged.

    Parameters
    ----------
    df : DataFrame
        The table to sample.
    n : int
        Number of rows to keep, positive.
    seed : int
        Seed of ``np.random.default_rng`` for the draw.
    stratify_by : sequence of str
        Manifest columns whose joint value is the stratum (default ``("label",)``; empty: one stratum; NA is a value of
        its own).

    Returns
    -------
    DataFrame
        A copy of the ``n`` kept rows (all rows when ``n >= len(df)``), in their original order and index.

    Raises
    ------
    FmauditInputError
        When ``n`` is not positive.
    """
    return _sample_strata(df, n, seed, stratify_by, _proportional)


def balanced_subsample(
    df: pd.DataFrame, n: int, seed: int = 0, *, stratify_by: Sequence[str] = ("label",)
) -> pd.DataFrame:
    """``n`` rows split as equally as possible over the strata (e.g. 50/50 tumour/normal), without replacement.

    A stratum with fewer rows than its share gives all it has and the rest goes to the others, so the result
    has ``min(n, len(df))`` rows. Rows keep their original order.

    Parameters
    ----------
    df : DataFrame
        The table to sample.
    n : int
        Number of rows to keep, positive.
    seed : int
        Seed of ``np.random.default_rng`` for the draw.
    stratify_by : sequence of str
        Manifest columns whose joint value is the stratum (default ``("label",)``; empty: one stratum; NA is a value of
        its own).

    Returns
    -------
    DataFrame
        A copy of the kept rows in their original order and index.

    Raises
    ------
    FmauditInputError
        When ``n`` is not positive.
    """
    return _sample_strata(df, n, seed, stratify_by, _water_filling)


def pixel_digest(path: str | Path) -> str:
    """sha256 of an image's decoded RGB pixels and shape: equal for the same picture saved differently.

    Parameters
    ----------
    path : str or Path
        An image file PIL can open; it is converted to RGB.

    Returns
    -------
    str
        Hex sha256 of the array's shape string followed by its bytes (the digest ``array_digest`` gives the array).
    """
    from PIL import Image

    with Image.open(path) as im:
        arr = np.asarray(im.convert("RGB"))
    h = hashlib.sha256(str(arr.shape).encode())
    h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def file_digests(paths: Iterable[str | Path], mode: str = "bytes", max_workers: int = 4) -> list[str]:
    """Digest of every file: ``bytes`` (sha256 of the file) or ``pixels`` (:func:`pixel_digest`).

    Parameters
    ----------
    paths : iterable of str or Path
        The files to hash.
    mode : str
        ``bytes`` (default) or ``pixels``.
    max_workers : int
        Threads that hash at once (default 4); 1 or fewer, or fewer than 64 files, hashes in this thread.

    Returns
    -------
    list of str
        Hex digests in the order of ``paths``.

    Raises
    ------
    FmauditInputError
        On an unknown ``mode``.
    """
    if mode not in ("bytes", "pixels"):
        raise FmauditInputError(f"duplicate detection mode must be 'bytes' or 'pixels', got {mode!r}")
    fn = sha256_file if mode == "bytes" else pixel_digest
    paths = [str(p) for p in paths]
    if max_workers <= 1 or len(paths) < 64:
        return [fn(p) for p in paths]
    # hashlib and PIL decoding release the GIL on large buffers, so threads overlap the reads
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        return list(pool.map(fn, paths, chunksize=64))


def remove_exact_duplicates(
    df: pd.DataFrame,
    *,
    source_col: str = "source",
    mode: str = "bytes",
    digest_col: str = "sha256",
    digests: Sequence[str] | None = None,
    max_workers: int = 4,
) -> tuple[pd.DataFrame, int]:
    """Drop rows whose file is an exact duplicate of an earlier one; return (kept rows, number removed).

    Rows are ordered by ``source`` first, so the copy kept is the first in sorted path order whatever the
    input order. The digest of each kept row is stored in ``digest_col``. ``digests`` may be given when
    the caller already hashed the content (e.g. pixel arrays read from an HDF5 file).

    Parameters
    ----------
    df : DataFrame
        The table, one row per file.
    source_col : str
        Column with the file paths (default ``source``).
    mode : str
        ``bytes`` (default: sha256 of the file) or ``pixels`` (of the decoded RGB pixels).
    digest_col : str
        Column the digests are written to (default ``sha256``).
    digests : sequence of str, optional
        Precomputed digests, one per row of ``df`` in its order; None hashes the files.
    max_workers : int
        Threads for hashing (see :func:`file_digests`).

    Returns
    -------
    tuple of (DataFrame, int)
        The kept rows sorted by ``source_col`` (index reset, with ``digest_col``), and the number of rows removed.

    Raises
    ------
    FmauditInputError
        When ``source_col`` is missing or ``digests`` does not have one entry per row.
    """
    if source_col not in df.columns:
        raise FmauditInputError(f"remove_exact_duplicates: column {source_col!r} not in the table")
    out = df.copy()
    if digests is None:
        digests = file_digests(out[source_col], mode=mode, max_workers=max_workers)
    if len(digests) != len(out):
        raise FmauditInputError(f"remove_exact_duplicates: {len(digests)} digests for {len(out)} rows")
    out[digest_col] = list(digests)
    out = out.sort_values(source_col, kind="stable")
    dup = out[digest_col].duplicated(keep="first")
    n_removed = int(dup.sum())
    return out[~dup.to_numpy()].reset_index(drop=True), n_removed


def paper_stratified_sample(manifest: pd.DataFrame, n: int = PAPER_SAMPLE_SIZE, seed: int = PAPER_SAMPLE_SEED
                            ) -> pd.DataFrame:
    """The audit paper's class-stratified sample of ``n`` items (NCT-CRC-HE-100K and PatchCamelyon: 9,000, seed 42).

    Reproduces ``train_test_split(paths, labels, train_size=n, random_state=seed, stratify=labels)`` on the
    items in the audit paper's listing order (class by class in label order, paths sorted within a class), after
    duplicate removal; the kept rows are returned in the manifest's own order. A manifest of at most ``n``
    labelled items is returned unchanged.

    Parameters
    ----------
    manifest : DataFrame
        A manifest with ``label`` (no NA) and ``source``.
    n : int
        Items to keep, positive (default 9,000, the audit paper's).
    seed : int
        ``random_state`` of the draw (default 42, the audit paper's).

    Returns
    -------
    DataFrame
        A copy of the kept rows in the manifest's order and index.

    Raises
    ------
    FmauditInputError
        When ``label`` or ``source`` is missing, a row is unlabelled, or ``n`` is not positive.
    """
    if "label" not in manifest.columns or "source" not in manifest.columns:
        raise FmauditInputError("paper_stratified_sample: the manifest needs 'label' and 'source' columns")
    if manifest["label"].isna().any():
        raise FmauditInputError("paper_stratified_sample: unlabelled rows; a class-stratified sample needs labels")
    n = int(n)
    if n <= 0:
        raise FmauditInputError(f"paper_stratified_sample: n must be positive, got {n}")
    if len(manifest) <= n:
        return manifest.copy()
    labels_all = manifest["label"].astype(int).to_numpy()
    order = np.lexsort((manifest["source"].astype(str).to_numpy(), labels_all))  # by label, then path
    # imported here, not with the module: the workflow's planning imports this module, and scikit-learn's
    # model_selection took a fifth of a second of every `snakemake` call's start-up
    from sklearn.model_selection import train_test_split

    kept, _ = train_test_split(order, train_size=n, random_state=seed, stratify=labels_all[order])
    return manifest.iloc[np.sort(kept)].copy()

"""CellPath-Bench evaluation protocols: which cells train, validate and test a probe of one run.

A run is (protocol, unit, seed, taxonomy, readout) of one encoder and magnification (:func:`fmaudit.grid.cell_runs`).
The partition depends on (protocol, unit, seed) only, not on the taxonomy or the readout: both taxonomies and
all readouts of a seed see the same cells, so their comparisons are paired. Partitions are drawn among the
*labelled* cells (labelled in at least one of the shard's taxonomies); a run then keeps the cells labelled in
its own taxonomy.

Protocols (units as :func:`fmaudit.grid.cell_runs` declares them):

- **IS** (intra-section), unit = section. The region of interest (ROI) of seed s is a square block of the
  section: a centre cell drawn with the seed, and the ``roi_fraction`` of the section's cells nearest to it
  in L-infinity distance (ties by cell order). Training and validation cells come from inside the ROI, test
  cells are every labelled cell outside it. The ROI is drawn over all cells of the section (labelled or
  not), so it is a spatial block and not a label-dependent sample.
- **IOCD** (intra-organ cross-dataset), unit = held-out section of an organ with at least
  ``min_sections_per_organ`` sections. Training and validation from the organ's other sections, test = the
  held-out section.
- **MOCV** (multi-organ cross-validation), unit = fold k of a fixed, organ-aware fold manifest (section ->
  fold, ``resources/cells/``). Training and validation from the other folds' sections, test = the pooled
  sections of fold k.
- **LOOO** (leave one organ out), unit = organ. Training and validation from every other organ's sections,
  test = the organ's sections.

Seeds act on the partition: the IS ROI, and in every protocol the validation draw and the training
subsample. From the training pool (the cells on the training side), ``val_fraction`` of the cells (at most
``max_val_cells``) are drawn uniformly for validation and the rest (at most ``max_train_cells``, drawn
uniformly) train the probe; ``None`` means no cap. Test cells are never subsampled. Random numbers come from
``numpy.random.default_rng(SeedSequence([seed, crc32(protocol), crc32(unit)]))``, so a run's partition does
not depend on which other runs share its job.

Leakage: every partition is checked before use (:func:`check_partition`): no cell of a held-out unit (IS: the
outside of the ROI; other protocols: every cell of the test sections) is a training or validation cell.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError, PathLike, read_table

CELL_PROTOCOLS = ("IS", "IOCD", "MOCV", "LOOO")
FOLD_MANIFEST_COLUMNS = ("section", "organ", "fold")


def label_column(taxonomy: str) -> str:
    """Manifest column holding a taxonomy's integer labels (``label_fine``, ``label_coarse``).

    Parameters
    ----------
    taxonomy : str
        The taxonomy's name (``fine`` or ``coarse``).

    Returns
    -------
    str
        ``label_<taxonomy>``.
    """
    return f"label_{taxonomy}"


# --------------------------------------------------------------------------------------------------------
# the panel: every cell of every section, as flat arrays
# --------------------------------------------------------------------------------------------------------

@dataclass
class PanelCells:
    """The cells of a panel of sections as flat arrays (global row = section offset + manifest row).

    The item ids themselves are not kept (7 million of them would cost more memory than everything else here),
    only a digest per section. ``len()`` is the number of cells. Built by :func:`panel_from_manifests`.

    Parameters
    ----------
    sections : list of str
        The sections, in panel order.
    organ_of : dict of str to str
        Section -> its organ.
    offsets : ndarray of shape (n_sections + 1,), int64
        Row offsets: section i holds global rows ``offsets[i]:offsets[i + 1]``.
    section_code : ndarray of shape (n,), int32
        Each cell's index into ``sections``.
    x, y : ndarray of shape (n,), float64
        The cells' nucleus centres in level-0 H&E pixels of their section.
    id_digest : dict of str to str
        Section -> :func:`ids_digest` of its item ids in order (checked against a feature folder).
    labels : dict of str to ndarray of shape (n,), int16
        Taxonomy -> class codes (-1 = unlabelled).
    n_classes : dict of str to int
        Taxonomy -> its number of classes K.
    class_names : dict of str to list of str
        Taxonomy -> the K class names ('' where no cell names the code).
    """

    sections: list[str]
    organ_of: dict[str, str]
    offsets: np.ndarray
    section_code: np.ndarray
    x: np.ndarray
    y: np.ndarray
    id_digest: dict[str, str]
    labels: dict[str, np.ndarray]
    n_classes: dict[str, int]
    class_names: dict[str, list[str]]

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def rows_of(self, section: str) -> np.ndarray:
        """The global rows of one section's cells.

        Parameters
        ----------
        section : str
            A section of ``sections``.

        Returns
        -------
        ndarray of int
            ``offsets[i]`` .. ``offsets[i + 1] - 1`` for the section's index i, ascending.
        """
        i = self.sections.index(section)
        return np.arange(self.offsets[i], self.offsets[i + 1])

    def describe(self, row: int) -> str:
        """A panel row as 'section row r' (for messages).

        Parameters
        ----------
        row : int
            A global row.

        Returns
        -------
        str
            The section and the row within its manifest, e.g. ``"lung-1 row 17"``.
        """
        code = int(self.section_code[row])
        return f"{self.sections[code]} row {int(row - self.offsets[code])}"

    def labelled(self, taxonomies: Sequence[str] | None = None) -> np.ndarray:
        """Mask of cells labelled in at least one of ``taxonomies`` (all by default).

        Parameters
        ----------
        taxonomies : sequence of str, optional
            Taxonomy names of ``labels``; None or empty: all of them.

        Returns
        -------
        ndarray of shape (n,), bool
            True for a cell with a class code >= 0 in any of them.
        """
        taxonomies = list(taxonomies or self.labels)
        mask = np.zeros(len(self), dtype=bool)
        for t in taxonomies:
            mask |= self.labels[t] >= 0
        return mask


def panel_from_manifests(manifests: Mapping[str, pd.DataFrame | PathLike], taxonomies: Sequence[str],
                         n_classes: Mapping[str, int] | None = None) -> PanelCells:
    """Stack per-section cell manifests (section -> frame or parquet path) into a :class:`PanelCells`.

    Parameters
    ----------
    manifests : mapping of str to DataFrame or str or Path
        Section -> its cell manifest (columns ``item_id``, ``section``, ``organ``, ``he_x``, ``he_y`` and
        ``label_<taxonomy>`` of each taxonomy, optionally ``label_<taxonomy>_name``); panel order is the mapping's.
    taxonomies : sequence of str
        The taxonomies to read (``fine``, ``coarse``).
    n_classes : mapping of str to int, optional
        K per taxonomy (e.g. from the taxonomy table); by default one more than the largest code in the panel.

    Returns
    -------
    PanelCells
        The panel's cells as flat arrays.

    Raises
    ------
    FmauditInputError
        When no section is given, a manifest lacks a column or has no cell, its ``section`` column does not name its
        key, a section spans several organs, a label is not an integer code in [0, K) or NA, or a taxonomy has fewer
        than 2 classes.
    """
    sections = list(manifests)
    if not sections:
        raise FmauditInputError("no sections given")
    offsets = [0]
    parts: dict[str, list[np.ndarray]] = {"x": [], "y": []}
    digests: dict[str, str] = {}
    labels: dict[str, list[np.ndarray]] = {t: [] for t in taxonomies}
    names: dict[str, dict[int, str]] = {t: {} for t in taxonomies}
    organ_of: dict[str, str] = {}
    for section in sections:
        m = manifests[section]
        where = str(m) if isinstance(m, (str, Path)) else f"cell manifest of section {section!r}"
        frame = read_table(m) if isinstance(m, (str, Path)) else m
        for col in ("item_id", "section", "organ", "he_x", "he_y", *(label_column(t) for t in taxonomies)):
            if col not in frame.columns:
                raise FmauditInputError(f"{where}: no column {col!r}")
        if len(frame) == 0:
            raise FmauditInputError(f"{where}: no cells")
        if set(frame["section"].astype(str)) != {section}:
            raise FmauditInputError(f"{where}: its section column holds "
                                    f"{sorted(set(frame['section'].astype(str)))[:3]}, "
                                    f"not {section!r}")
        organs = set(frame["organ"].astype(str))
        if len(organs) != 1:
            raise FmauditInputError(f"{where}: a section lies in one organ, found {sorted(organs)}")
        organ_of[section] = organs.pop()
        parts["x"].append(frame["he_x"].to_numpy(dtype=np.float64))
        parts["y"].append(frame["he_y"].to_numpy(dtype=np.float64))
        digests[section] = ids_digest(frame["item_id"])
        for t in taxonomies:
            col = frame[label_column(t)]
            values = pd.to_numeric(col, errors="coerce")
            if (values.isna() & col.notna()).any() or ((values.dropna() % 1) != 0).any():
                raise FmauditInputError(f"{where}: {label_column(t)} must hold integer class codes or NA")
            codes = values.fillna(-1).to_numpy(dtype=np.int64)
            if (codes < -1).any():
                raise FmauditInputError(f"{where}: negative code in {label_column(t)}")
            labels[t].append(codes)
            name_col = f"{label_column(t)}_name"
            if name_col in frame.columns:
                known = frame.loc[values.notna(), [label_column(t), name_col]].drop_duplicates()
                for code, name in zip(known[label_column(t)], known[name_col]):
                    names[t].setdefault(int(code), str(name))
        offsets.append(offsets[-1] + len(frame))
    label_arrays = {t: np.concatenate(v) for t, v in labels.items()}
    ks: dict[str, int] = {}
    for t, codes in label_arrays.items():
        k_data = int(codes.max()) + 1 if (codes >= 0).any() else 0
        k = int(n_classes[t]) if n_classes and t in n_classes else k_data
        if k_data > k:
            raise FmauditInputError(f"taxonomy {t!r}: label code {k_data - 1} is out of range for {k} classes")
        if k < 2:
            raise FmauditInputError(f"taxonomy {t!r}: fewer than 2 classes in the panel")
        ks[t] = k
        label_arrays[t] = codes.astype(np.int16)
    offsets_arr = np.asarray(offsets, dtype=np.int64)
    return PanelCells(
        sections=sections, organ_of=organ_of, offsets=offsets_arr,
        section_code=np.repeat(np.arange(len(sections), dtype=np.int32), np.diff(offsets_arr)),
        x=np.concatenate(parts["x"]), y=np.concatenate(parts["y"]), id_digest=digests,
        labels=label_arrays, n_classes=ks,
        class_names={t: [names[t].get(c, "") for c in range(ks[t])] for t in taxonomies})


def ids_digest(item_ids) -> str:
    """Order-sensitive hash of a sequence of item ids (compares a manifest with a feature folder cheaply).

    Parameters
    ----------
    item_ids : sequence of str
        The item ids, in order.

    Returns
    -------
    str
        16 hex digits of a sha256 over pandas' per-value hashes.
    """
    import hashlib

    values = pd.util.hash_pandas_object(pd.Series(item_ids, dtype="string"), index=False).to_numpy()
    return hashlib.sha256(values.tobytes()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------------------
# fold manifest (MOCV)
# --------------------------------------------------------------------------------------------------------

def make_fold_manifest(sections_by_organ: Mapping[str, Sequence[str]], n_folds: int) -> pd.DataFrame:
    """An organ-aware assignment of sections to ``n_folds`` folds (deterministic, no randomness).

    Organs are taken largest first (ties by name), their sections in the given order, and each section goes
    to the fold with the fewest sections so far that holds no section of its organ yet (ties: the lower fold);
    when every fold holds the organ, to the fold with the fewest sections. An organ's sections are so spread
    over distinct folds, and folds differ in size by at most one section.

    Parameters
    ----------
    sections_by_organ : mapping of str to sequence of str
        Organ -> its sections (the config's ``cells.sections``, in config order).
    n_folds : int
        Number of MOCV folds, at least 2 and at most the number of sections.

    Returns
    -------
    DataFrame
        Columns ``section``, ``organ``, ``fold`` (0..n_folds-1), one row per section in the given order.

    Raises
    ------
    FmauditInputError
        When ``n_folds`` is below 2 or above the number of sections.
    """
    if n_folds < 2:
        raise FmauditInputError(f"n_folds={n_folds}: MOCV needs at least 2 folds")
    n_sections = sum(len(v) for v in sections_by_organ.values())
    if n_sections < n_folds:
        raise FmauditInputError(f"{n_sections} section(s) cannot fill {n_folds} folds")
    size = [0] * n_folds
    organs_in: list[set[str]] = [set() for _ in range(n_folds)]
    rows = []
    for organ in sorted(sections_by_organ, key=lambda o: (-len(sections_by_organ[o]), o)):
        for section in sections_by_organ[organ]:
            free = [f for f in range(n_folds) if organ not in organs_in[f]] or list(range(n_folds))
            fold = min(free, key=lambda f: (size[f], f))
            size[fold] += 1
            organs_in[fold].add(organ)
            rows.append((section, organ, fold))
    order = {s: i for i, s in enumerate(s for secs in sections_by_organ.values() for s in secs)}
    rows.sort(key=lambda r: order[r[0]])
    return pd.DataFrame(rows, columns=list(FOLD_MANIFEST_COLUMNS))


def read_fold_manifest(fold_manifest: pd.DataFrame | PathLike, sections_by_organ: Mapping[str, Sequence[str]],
                       n_folds: int) -> dict[str, list[str]]:
    """MOCV unit (``fold<k>``) -> its sections, from a TSV/frame with columns section, organ, fold.

    Every section of the config appears exactly once, with the config's organ; folds are 0..n_folds-1 and
    none is empty. Errors name the file and the row.

    Parameters
    ----------
    fold_manifest : DataFrame or str or Path
        The fold manifest (a frame, or a TSV/parquet path read by :func:`fmaudit.io.read_table`).
    sections_by_organ : mapping of str to sequence of str
        Organ -> its sections (the config's ``cells.sections``, in config order).
    n_folds : int
        The number of folds the config asks for.

    Returns
    -------
    dict of str to list of str
        ``"fold<k>"`` -> its sections, for k = 0..n_folds-1, sections in file order.

    Raises
    ------
    FmauditInputError
        On a missing column, a non-integer or out-of-range fold, a section not in the config or under another
        organ, a section given twice or not at all, or an empty fold.
    """
    where = str(fold_manifest) if isinstance(fold_manifest, (str, Path)) else "fold manifest"
    df = read_table(fold_manifest) if isinstance(fold_manifest, (str, Path)) else fold_manifest
    missing = [c for c in FOLD_MANIFEST_COLUMNS if c not in df.columns]
    if missing:
        raise FmauditInputError(f"{where}: missing column(s) {missing}; expected {list(FOLD_MANIFEST_COLUMNS)}")
    organ_of = {s: o for o, secs in sections_by_organ.items() for s in secs}
    seen: set[str] = set()
    units: dict[str, list[str]] = {f"fold{k}": [] for k in range(n_folds)}
    for i, row in enumerate(df.itertuples(index=False)):
        section, organ = str(row.section), str(row.organ)
        try:
            fold = int(row.fold)
        except (TypeError, ValueError):
            raise FmauditInputError(f"{where}: row {i + 1}: fold {row.fold!r} is not an integer") from None
        if section not in organ_of:
            raise FmauditInputError(f"{where}: row {i + 1}: section {section!r} is not in the config's cells.sections")
        if organ_of[section] != organ:
            raise FmauditInputError(f"{where}: row {i + 1}: section {section!r} is under organ {organ_of[section]!r} "
                                    f"in the config, not {organ!r}")
        if section in seen:
            raise FmauditInputError(f"{where}: row {i + 1}: section {section!r} appears twice")
        if not 0 <= fold < n_folds:
            raise FmauditInputError(f"{where}: row {i + 1}: fold {fold} outside 0..{n_folds - 1} (folds: {n_folds})")
        seen.add(section)
        units[f"fold{fold}"].append(section)
    absent = [s for s in organ_of if s not in seen]
    if absent:
        raise FmauditInputError(f"{where}: section(s) {absent[:5]} of the config have no fold")
    empty = [u for u, secs in units.items() if not secs]
    if empty:
        raise FmauditInputError(f"{where}: fold(s) {empty} hold no section")
    return units


# --------------------------------------------------------------------------------------------------------
# units -> sections
# --------------------------------------------------------------------------------------------------------

def unit_sections(protocol: str, unit: str, sections_by_organ: Mapping[str, Sequence[str]],
                  folds: Mapping[str, Sequence[str]] | None = None) -> tuple[list[str], list[str]]:
    """(test sections, training sections) of a unit; for IS both are the unit's section (split by the ROI).

    Parameters
    ----------
    protocol : {"IS", "IOCD", "MOCV", "LOOO"}
        The protocol.
    unit : str
        The unit: a section (IS, IOCD), a fold ``fold<k>`` (MOCV) or an organ (LOOO).
    sections_by_organ : mapping of str to sequence of str
        Organ -> its sections (the config's ``cells.sections``, in config order).
    folds : mapping of str to sequence of str, optional
        MOCV's fold -> sections (:func:`read_fold_manifest`); required for MOCV only.

    Returns
    -------
    test : list of str
        The sections tested on.
    train : list of str
        The sections trained (and validated) on.

    Raises
    ------
    FmauditInputError
        When the unit is not one of the protocol's, there is nothing left to train on, MOCV has no fold manifest,
        or the protocol is unknown.
    """
    organ_of = {s: o for o, secs in sections_by_organ.items() for s in secs}
    if protocol == "IS":
        if unit not in organ_of:
            raise FmauditInputError(f"IS unit {unit!r} is not a section of cells.sections")
        return [unit], [unit]
    if protocol == "IOCD":
        if unit not in organ_of:
            raise FmauditInputError(f"IOCD unit {unit!r} is not a section of cells.sections")
        others = [s for s in sections_by_organ[organ_of[unit]] if s != unit]
        if not others:
            raise FmauditInputError(f"IOCD unit {unit!r}: organ {organ_of[unit]!r} has no other section to train on")
        return [unit], others
    if protocol == "MOCV":
        if folds is None:
            raise FmauditInputError("MOCV needs a fold manifest")
        if unit not in folds:
            raise FmauditInputError(f"MOCV unit {unit!r} is not a fold of the fold manifest ({sorted(folds)})")
        test = list(folds[unit])
        return test, [s for u, secs in folds.items() if u != unit for s in secs]
    if protocol == "LOOO":
        if unit not in sections_by_organ:
            raise FmauditInputError(f"LOOO unit {unit!r} is not an organ of cells.sections")
        others = [s for o, secs in sections_by_organ.items() if o != unit for s in secs]
        if not others:
            raise FmauditInputError(f"LOOO unit {unit!r}: no other organ to train on")
        return list(sections_by_organ[unit]), others
    raise FmauditInputError(f"unknown cell protocol {protocol!r} ({', '.join(CELL_PROTOCOLS)})")


# --------------------------------------------------------------------------------------------------------
# partitions
# --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Partition:
    """Global panel rows of one (protocol, unit, seed): sorted, disjoint ``train``, ``val`` and ``test``.

    Parameters
    ----------
    protocol : str
        The protocol (``IS``, ``IOCD``, ``MOCV``, ``LOOO``).
    unit : str
        The unit (section, fold or organ).
    seed : int
        The run's seed (the IS ROI, the validation draw and the training subsample).
    train, val, test : ndarray of int
        Sorted global rows of the panel (:class:`PanelCells`): the training, validation and test cells, all
        labelled in at least one taxonomy.
    held_out : ndarray of int
        Every panel row of the held-out unit, labelled or not (IS: the cells outside the ROI; otherwise all cells of
        the test sections).
    test_sections : tuple of str
        The sections tested on.
    train_sections : tuple of str
        The sections trained on (for IS the unit's section itself).
    """

    protocol: str
    unit: str
    seed: int
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    held_out: np.ndarray
    test_sections: tuple[str, ...]
    train_sections: tuple[str, ...]


def partition_rng(protocol: str, unit: str, seed: int) -> np.random.Generator:
    """The generator of one (protocol, unit, seed): independent of the other runs of the job.

    Parameters
    ----------
    protocol : str
        The protocol.
    unit : str
        The unit.
    seed : int
        The run's seed.

    Returns
    -------
    numpy.random.Generator
        ``default_rng(SeedSequence([seed, crc32(protocol), crc32(unit)]))``.
    """
    return np.random.default_rng(np.random.SeedSequence(
        [int(seed), zlib.crc32(protocol.encode()), zlib.crc32(unit.encode())]))


def roi_mask(x: np.ndarray, y: np.ndarray, roi_fraction: float, rng: np.random.Generator) -> np.ndarray:
    """IS region of interest: the ``roi_fraction`` of cells nearest (L-infinity) to a centre cell drawn with
    ``rng``, i.e. a square block of the section; ties by cell order.

    Parameters
    ----------
    x, y : ndarray of shape (n,)
        The section's nucleus centres (every cell, labelled or not), H&E pixels.
    roi_fraction : float
        The share of the section's cells inside the ROI, in (0, 1); at least one cell is inside and one outside.
    rng : numpy.random.Generator
        Draws the centre cell (:func:`partition_rng`).

    Returns
    -------
    ndarray of shape (n,), bool
        True inside the ROI.

    Raises
    ------
    FmauditInputError
        When ``roi_fraction`` is outside (0, 1).
    """
    n = len(x)
    if not 0.0 < roi_fraction < 1.0:
        raise FmauditInputError(f"roi_fraction={roi_fraction}: must lie in (0, 1)")
    centre = int(rng.integers(n))
    dist = np.maximum(np.abs(np.asarray(x) - x[centre]), np.abs(np.asarray(y) - y[centre]))
    n_roi = min(max(1, int(round(roi_fraction * n))), n - 1)
    mask = np.zeros(n, dtype=bool)
    mask[np.argsort(dist, kind="stable")[:n_roi]] = True
    return mask


def _split_pool(pool: np.ndarray, rng: np.random.Generator, val_fraction: float, max_train_cells: int | None,
                max_val_cells: int | None) -> tuple[np.ndarray, np.ndarray]:
    if not 0.0 < val_fraction < 1.0:
        raise FmauditInputError(f"val_fraction={val_fraction}: must lie in (0, 1)")
    shuffled = pool[rng.permutation(pool.size)]
    n_val = int(round(val_fraction * pool.size))
    if max_val_cells is not None:
        n_val = min(n_val, int(max_val_cells))
    val = shuffled[:n_val]
    train = shuffled[n_val:]
    if max_train_cells is not None:
        train = train[: int(max_train_cells)]
    return np.sort(train), np.sort(val)


def make_partition(panel: PanelCells, protocol: str, unit: str, seed: int, *,
                   sections_by_organ: Mapping[str, Sequence[str]], folds: Mapping[str, Sequence[str]] | None,
                   taxonomies: Sequence[str], roi_fraction: float, val_fraction: float,
                   max_train_cells: int | None, max_val_cells: int | None) -> Partition:
    """The partition of one (protocol, unit, seed) over the panel (see the module doc); checked for leakage.

    Parameters
    ----------
    panel : PanelCells
        Every cell of the shard's sections.
    protocol : {"IS", "IOCD", "MOCV", "LOOO"}
        The protocol.
    unit : str
        The unit (section, fold or organ).
    seed : int
        The run's seed.
    sections_by_organ : mapping of str to sequence of str
        Organ -> its sections (the config's ``cells.sections``, in config order).
        Keyword-only, as are all that follow.
    folds : mapping of str to sequence of str or None
        MOCV's fold -> sections; None for the other protocols.
    taxonomies : sequence of str
        The taxonomies a cell may be labelled in to be drawn.
    roi_fraction : float
        The IS ROI's share of the section's cells, in (0, 1).
    val_fraction : float
        The share of the training pool drawn for validation, in (0, 1).
    max_train_cells : int or None
        At most this many training cells (a uniform draw); None: no cap.
    max_val_cells : int or None
        At most this many validation cells; None: no cap.

    Returns
    -------
    Partition
        The run's training, validation and test rows, checked by :func:`check_partition`.

    Raises
    ------
    FmauditInputError
        When a section of the unit has no cells in the panel, a fraction is outside (0, 1), the unit is not the
        protocol's (:func:`unit_sections`), or the partition leaks.
    """
    test_sections, train_sections = unit_sections(protocol, unit, sections_by_organ, folds)
    missing = [s for s in {*test_sections, *train_sections} if s not in panel.sections]
    if missing:
        raise FmauditInputError(f"{protocol} unit {unit!r}: section(s) {sorted(missing)} have no cells in the panel")
    labelled = panel.labelled(taxonomies)
    rng = partition_rng(protocol, unit, seed)
    if protocol == "IS":
        rows = panel.rows_of(unit)
        inside = roi_mask(panel.x[rows], panel.y[rows], roi_fraction, rng)
        pool = rows[inside & labelled[rows]]
        held_out = rows[~inside]
        test = held_out[labelled[held_out]]
    else:
        held_out = np.concatenate([panel.rows_of(s) for s in test_sections])
        test = held_out[labelled[held_out]]
        train_rows = np.concatenate([panel.rows_of(s) for s in train_sections])
        pool = train_rows[labelled[train_rows]]
    train, val = _split_pool(pool, rng, val_fraction, max_train_cells, max_val_cells)
    part = Partition(protocol=protocol, unit=unit, seed=int(seed), train=train, val=val, test=np.sort(test),
                     held_out=np.sort(held_out), test_sections=tuple(test_sections),
                     train_sections=tuple(train_sections))
    check_partition(part, panel)
    return part


def check_partition(part: Partition, panel: PanelCells) -> None:
    """Raise if a held-out cell, or any cell of a test section outside IS, is used for fitting or selection.

    Parameters
    ----------
    part : Partition
        The partition to check.
    panel : PanelCells
        The panel its rows index.

    Raises
    ------
    FmauditInputError
        When a training or validation cell is held out (naming one), or train, validation and test overlap.
    """
    fitting = np.concatenate([part.train, part.val])
    leaked = np.intersect1d(fitting, part.held_out)
    if part.protocol != "IS":
        test_codes = [panel.sections.index(s) for s in part.test_sections]
        leaked = np.union1d(leaked, fitting[np.isin(panel.section_code[fitting], test_codes)])
    if leaked.size:
        raise FmauditInputError(
            f"{part.protocol} unit {part.unit!r} seed {part.seed}: {leaked.size} held-out cell(s) in training or "
            f"validation, e.g. {panel.describe(leaked[0])}")
    if np.intersect1d(part.train, part.val).size or np.intersect1d(fitting, part.test).size:
        raise FmauditInputError(f"{part.protocol} unit {part.unit!r} seed {part.seed}: train, validation and "
                                f"test cells overlap")


def mask_excluded(manifests: Mapping[str, pd.DataFrame], excluded: Mapping[str, str],
                  taxonomies: Sequence[str]) -> dict[str, pd.DataFrame]:
    """The manifests with every label of an excluded section (fewer than two valid classes, see
    :func:`fmaudit.cells.qc.section_eligibility`) set to NA: its cells then train, validate and test nothing,
    in the split checks and the shards alike, while the section keeps its place (and its features) in the
    panel.

    Parameters
    ----------
    manifests : mapping of str to DataFrame
        Section -> its cell manifest.
    excluded : mapping of str to str
        Excluded section -> the reason.
    taxonomies : sequence of str
        The taxonomies whose ``label_<taxonomy>`` columns are cleared.

    Returns
    -------
    dict of str to DataFrame
        The same sections in the same order; excluded ones copied with their label columns all NA (Int64), the
        others as given.
    """
    out = {}
    for section, frame in manifests.items():
        if section in excluded:
            frame = frame.copy()
            for tax in taxonomies:
                frame[label_column(tax)] = pd.array([pd.NA] * len(frame), dtype="Int64")
        out[section] = frame
    return out

"""The labelled items of one task with their features, in one aligned set of arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.datasets.manifest import label_names as manifest_label_names
from fmaudit.io import FmauditInputError

# the task splits a config can choose (config schema ``tasks.<name>.split``) -> the manifest column they read
from fmaudit.split_checks import SPLIT_COLUMNS

#: The unit of groups nobody declared (hand-made manifests, arrays with groups and no ``group_unit``).
UNDECLARED_UNIT = "group"


@dataclass
class TaskData:
    """Features and metadata of a task's labelled items (row i of every array is the same item).

    ``group_units`` says what each item's group is (patient, slide, biopsy, section, or item where the data
    identify none; ``group`` where nobody said); ``split_name`` is the task's split (config ``split``).

    Attributes
    ----------
    features : ndarray of shape (n_items, n_features)
        The items' embeddings, float64.
    labels : ndarray of shape (n_items,)
        Class indices 0..K-1, int.
    item_ids : ndarray of shape (n_items,)
        The manifests' ``item_id`` (str), unique within a data set.
    groups : ndarray of shape (n_items,)
        Each item's group (patient, slide ...; the item itself where the data have none), str: the unit that
        splits and bootstrap intervals keep together.
    domains : ndarray of shape (n_items,)
        Each item's domain (scanner, centre ...), str; ``all`` for a task over all domains pooled.
    splits : ndarray of shape (n_items,)
        Each item's split, str: ``train``, ``val`` or ``test``, read from the manifest column of ``split_name``.
    class_names : list of str
        Name of class k at index k.
    group_units : ndarray of shape (n_items,) or None
        What each item's group is (str); None: every group is :data:`UNDECLARED_UNIT`.
    datasets : ndarray of shape (n_items,) or None
        The data set of each item (str); None for arrays brought on the command line.
    split_name : str
        The task's split, a key of :data:`fmaudit.split_checks.SPLIT_COLUMNS` (default ``manifest``).
    """

    features: np.ndarray  # (N, D) float
    labels: np.ndarray  # (N,) int
    item_ids: np.ndarray  # (N,) str
    groups: np.ndarray  # (N,) str, patient/slide/... (the item itself where the data have no groups)
    domains: np.ndarray  # (N,) str
    splits: np.ndarray  # (N,) str
    class_names: list[str]
    group_units: np.ndarray | None = None  # (N,) str; None: UNDECLARED_UNIT
    datasets: np.ndarray | None = None  # (N,) str, the data set of each item
    split_name: str = "manifest"

    @property
    def n_classes(self) -> int:
        """The number of classes K (``len(class_names)``)."""
        return len(self.class_names)

    def domain_split(self, domain: str, split: str) -> np.ndarray:
        """The row indices of one domain's split.

        Parameters
        ----------
        domain : str
            A value of :attr:`domains` (``all`` for a pooled task).
        split : str
            ``train``, ``val`` or ``test``.

        Returns
        -------
        ndarray of int
            Ascending row indices into every array; empty when the domain has no such split.
        """
        return np.flatnonzero((self.domains == domain) & (self.splits == split))

    def group_unit(self, idx: np.ndarray) -> str:
        """The resampling unit of the items ``idx`` (``patient``; ``item``; ``patient+item`` when data sets
        of several units are pooled).

        Parameters
        ----------
        idx : ndarray of int
            Row indices of the items (e.g. :meth:`domain_split`'s).

        Returns
        -------
        str
            Their group units, sorted and ``+``-joined; :data:`UNDECLARED_UNIT` without declared units.
        """
        if self.group_units is None:
            return UNDECLARED_UNIT
        return "+".join(sorted(set(np.asarray(self.group_units)[idx].astype(str)))) or UNDECLARED_UNIT

    def dataset_names(self) -> str:
        """The task's data sets, comma-joined (``arrays`` for arrays brought on the command line).

        Returns
        -------
        str
            Sorted data set names joined by ``,``, or ``arrays``.
        """
        return ",".join(sorted(set(self.datasets.astype(str)))) if self.datasets is not None else "arrays"


def assemble_task_data(manifests: Sequence[pd.DataFrame], features: Sequence[tuple[np.ndarray, np.ndarray]],
                       task: str, domains: Sequence[str] | None = None,
                       sources: Sequence[str] | None = None, split: str = "manifest") -> TaskData:
    """Join each data set's manifest with its embeddings (ids + features), keep labelled items of ``domains``.

    ``features[i]`` is ``(item_ids, array)`` of the embedding of ``manifests[i]``; ``sources`` names them for
    error messages. Items are matched by id, so an embedding made from another manifest fails loudly.
    ``split`` (a key of :data:`SPLIT_COLUMNS`) picks the manifest column that splits the items; the manifests'
    ``group_unit`` column (where present) says what their groups are.

    Parameters
    ----------
    manifests : sequence of DataFrame
        One per data set: ``item_id``, ``label`` (NaN for unlabelled items, which are left out), ``group``,
        ``domain``, the split's column and optionally ``group_unit``, ``dataset`` and the label names.
    features : sequence of (ndarray, ndarray)
        ``(item_ids, array)`` per manifest, in the same order: ids of shape (n,) and features of shape
        (n, n_features), the same ``n_features`` for every data set.
    task : str
        The task's name, for error messages.
    domains : sequence of str or None
        The domains to keep; ``["all"]`` keeps every item and labels its domain ``all`` (one pooled domain);
        None keeps every item with its own domain.
    sources : sequence of str or None
        A name per manifest for error messages (the embedding files); default ``dataset <i>``.
    split : str
        The task's split, a key of :data:`SPLIT_COLUMNS` (default ``manifest``: the manifest's ``split``).

    Returns
    -------
    TaskData
        The labelled items of the kept domains, data set by data set in manifest order, features as float64.

    Raises
    ------
    FmauditInputError
        An unknown split, or a manifest without its column; features whose shape does not match their ids or
        whose dimension differs between data sets; duplicated embedding ids; a labelled item without an
        embedding; non-finite features; a domain not in the data; no data sets or no labelled items.
    """
    if split not in SPLIT_COLUMNS:
        raise FmauditInputError(f"task {task}: split {split!r} is not one of {list(SPLIT_COLUMNS)}")
    split_col = SPLIT_COLUMNS[split]
    sources = list(sources or [f"dataset {i}" for i in range(len(manifests))])
    parts, feats = [], []
    dim = None
    for man, (ids, arr), src in zip(manifests, features, sources):
        arr = np.asarray(arr)
        if arr.ndim != 2 or len(arr) != len(ids):
            raise FmauditInputError(f"{src}: features of shape {arr.shape} do not match {len(ids)} item ids")
        if dim is not None and arr.shape[1] != dim:
            raise FmauditInputError(f"{src}: feature dimension {arr.shape[1]} differs from {dim} "
                                    "of the other data sets")
        dim = arr.shape[1]
        pos = pd.Series(np.arange(len(ids)), index=pd.Index(np.asarray(ids).astype(str)))
        if pos.index.has_duplicates:
            raise FmauditInputError(f"{src}: duplicated item ids in the embedding")
        if split_col not in man.columns:
            raise FmauditInputError(
                f"{src}: task {task} uses split {split!r}, read from the manifest column {split_col!r}, which this "
                "data set's manifest does not have (only the camelyon17_wilds preparer writes split_patch)"
            )
        lab = man[man["label"].notna()]
        missing = ~lab["item_id"].isin(pos.index)
        if missing.any():
            raise FmauditInputError(
                f"{src}: {int(missing.sum())} labelled item(s) of the manifest have no embedding, "
                f"e.g. {lab['item_id'][missing].iloc[0]!r}; re-embed this data set"
            )
        rows = pos.loc[lab["item_id"].astype(str)].to_numpy()
        x = arr[rows]
        bad = ~np.isfinite(x).all(axis=1)
        if bad.any():
            raise FmauditInputError(f"{src}: non-finite features for item "
                                    f"{lab['item_id'].iloc[int(np.flatnonzero(bad)[0])]!r}")
        parts.append(lab)
        feats.append(x)
    if not parts:
        raise FmauditInputError(f"task {task}: no data sets")
    man = pd.concat(parts, ignore_index=True)
    x = np.concatenate(feats).astype(np.float64)
    if domains is not None and list(domains) != ["all"]:
        present = set(man["domain"].astype(str))
        absent = [d for d in domains if d not in present]
        if absent:
            raise FmauditInputError(f"task {task}: domain(s) {absent} not in the data (present: {sorted(present)})")
        keep = man["domain"].isin(list(domains)).to_numpy()
        man, x = man[keep].reset_index(drop=True), x[keep]
        dom = man["domain"].astype(str).to_numpy()
    else:
        dom = np.full(len(man), "all", dtype=object) if domains is not None else man["domain"].astype(str).to_numpy()
    if len(man) == 0:
        raise FmauditInputError(f"task {task}: no labelled items")
    names = manifest_label_names(man)
    units = (man["group_unit"].astype("string").fillna(UNDECLARED_UNIT) if "group_unit" in man.columns
             else pd.Series(UNDECLARED_UNIT, index=man.index))
    datasets = man["dataset"].astype(str).to_numpy() if "dataset" in man.columns else None
    return TaskData(
        features=x, labels=man["label"].astype(int).to_numpy(), item_ids=man["item_id"].astype(str).to_numpy(),
        groups=man["group"].astype(str).to_numpy(), domains=np.asarray(dom, dtype=str),
        splits=man[split_col].astype(str).to_numpy(), class_names=names,
        group_units=units.astype(str).to_numpy(), datasets=datasets, split_name=split,
    )


def from_arrays(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                train_groups: np.ndarray | None = None, test_groups: np.ndarray | None = None,
                val_x: np.ndarray | None = None, val_y: np.ndarray | None = None,
                class_names: Mapping[int, str] | None = None, group_unit: str = UNDECLARED_UNIT) -> TaskData:
    """A one-domain task from arrays made elsewhere (``fmaudit probe``): train/val/test splits, domain ``all``.

    Items of a side without groups are their own groups (unit ``item``); ``group_unit`` names what given
    groups are (``patient``, ``slide`` ...; ``group`` when the caller does not say).

    Parameters
    ----------
    train_x, test_x : ndarray of shape (n_train, n_features), (n_test, n_features)
        Features of the train and test items.
    train_y, test_y : ndarray of shape (n_train,), (n_test,)
        Their labels, integers 0..K-1 (floats with integral values are accepted).
    train_groups, test_groups : ndarray of shape (n_train,), (n_test,), or None
        Each item's group (patient, slide ...); None: every item of that side is its own group.
    val_x, val_y : ndarray or None
        Optional validation items and labels; the validation items are ungrouped.
    class_names : mapping of int to str, or None
        Class index -> name; missing classes are named ``class_<k>``.
    group_unit : str
        What the given groups are; default :data:`UNDECLARED_UNIT`.

    Returns
    -------
    TaskData
        Items train, then test, then val, with ids ``<split>_<row>``, domain ``all`` and no data sets.

    Raises
    ------
    FmauditInputError
        Features of different dimensions, row counts that differ between features, labels or groups,
        non-finite features, or labels that are not non-negative integers.
    """
    xs = [np.asarray(train_x, float), np.asarray(test_x, float)]
    ys = [np.asarray(train_y), np.asarray(test_y)]
    splits = ["train"] * len(ys[0]) + ["test"] * len(ys[1])
    if val_x is not None:
        xs.append(np.asarray(val_x, float))
        ys.append(np.asarray(val_y))
        splits += ["val"] * len(ys[2])
    for name, a, b in (("test", xs[0], xs[1]),) + ((("val", xs[0], xs[2]),) if val_x is not None else ()):
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
            raise FmauditInputError(f"train features {a.shape} and {name} features {b.shape} differ in dimension")
    for name, x, y in zip(("train", "test", "val"), xs, ys):
        if len(x) != len(y):
            raise FmauditInputError(f"{name}: {len(x)} feature rows but {len(y)} labels")
        if not np.isfinite(x).all():
            raise FmauditInputError(f"{name} features: non-finite value in row "
                                    f"{int(np.flatnonzero(~np.isfinite(x).all(1))[0])}")
    y = np.concatenate(ys)
    if not np.issubdtype(y.dtype, np.integer):
        if np.any(np.asarray(y, float) != np.round(np.asarray(y, float))):
            raise FmauditInputError("labels must be integers 0..K-1")
        y = y.astype(int)
    if y.min() < 0:
        raise FmauditInputError("labels must be integers 0..K-1 (found a negative label)")
    n = len(y)
    groups, units, offset = [], [], 0
    for name, g, x in zip(("train", "test", "val"), (train_groups, test_groups, None), xs):
        if g is None:  # ungrouped: every item is its own resampling unit
            g = np.array([f"item{offset + i}" for i in range(len(x))])
            units.append(np.full(len(x), "item", dtype=object))
        elif len(g) != len(x):
            raise FmauditInputError(f"{name}: {len(x)} feature rows but {len(g)} groups")
        else:
            units.append(np.full(len(x), str(group_unit), dtype=object))
        groups.append(np.asarray(g).astype(str))
        offset += len(x)
    k = int(y.max()) + 1
    names = [str((class_names or {}).get(i, f"class_{i}")) for i in range(k)]
    ids = np.array([f"{s}_{i}" for i, s in enumerate(splits)])
    return TaskData(features=np.concatenate(xs), labels=y, item_ids=ids, groups=np.concatenate(groups),
                    domains=np.full(n, "all"), splits=np.array(splits), class_names=names,
                    group_units=np.concatenate(units).astype(str))


def item_strata(data: TaskData, manifests: Sequence[pd.DataFrame],
                strata_columns: Mapping[str, Sequence[str]] | None) -> tuple[np.ndarray, str]:
    """(one stratum key per item of ``data``, its description): the joint value of the manifest columns each
    data set's split was stratified by (``strata_columns``: data set -> columns, e.g. PANDA's ``label`` and
    ``domain``, the data provider; :func:`fmaudit.datasets.preparer_split_strata`). ``label`` is the task's
    label. A data set without an entry is stratified by label; without ``strata_columns`` every item's stratum
    is its label. The description names the columns (``label x domain``).

    Parameters
    ----------
    data : TaskData
        The task's items.
    manifests : sequence of DataFrame
        The data sets' manifests (``item_id``, ``dataset`` and the stratifying columns).
    strata_columns : mapping of str to sequence of str, or None
        Data set -> the manifest columns its split was stratified by.

    Returns
    -------
    keys : ndarray of shape (n_items,)
        One stratum per item (str): the item's values of its data set's columns, ``|``-joined.
    description : str
        The columns of each data set (``label x domain``), ``; ``-joined, each once.

    Raises
    ------
    FmauditInputError
        A data set's manifest lacks a stratifying column, or an item has no value in one.
    """
    labels = np.asarray(data.labels).astype(str)
    if not strata_columns:
        return labels, "label"
    man = pd.concat(list(manifests), ignore_index=True) if manifests else pd.DataFrame()
    datasets = data.datasets if data.datasets is not None else np.full(len(labels), "", dtype=object)
    keys = np.array(labels, dtype=object)
    described = []
    for ds in pd.unique(np.asarray(datasets).astype(str)):
        columns = [str(c) for c in (strata_columns.get(ds) or ("label",))]
        described.append(" x ".join(columns))
        extra = [c for c in columns if c != "label"]
        if not extra:
            continue
        rows = man[man["dataset"].astype(str) == ds] if "dataset" in man.columns else man
        missing = [c for c in extra if c not in rows.columns]
        if missing:
            raise FmauditInputError(f"data set {ds}: its split is stratified by {columns}, but its manifest has no "
                                    f"column(s) {missing}")
        rows = rows.drop_duplicates("item_id").set_index(rows.drop_duplicates("item_id")["item_id"].astype(str))
        mine = np.flatnonzero(np.asarray(datasets).astype(str) == ds)
        ids = pd.Index(data.item_ids[mine])
        parts = []
        for c in columns:
            if c == "label":
                parts.append(labels[mine])
                continue
            values = rows[c].reindex(ids)
            if values.isna().any():
                item = ids[int(np.flatnonzero(values.isna().to_numpy())[0])]
                raise FmauditInputError(f"data set {ds}: item {item!r} has no {c!r}, a column its split is "
                                        "stratified by")
            parts.append(values.astype(str).to_numpy())
        keys[mine] = ["|".join(v) for v in zip(*parts)]
    return keys.astype(str), "; ".join(dict.fromkeys(described))

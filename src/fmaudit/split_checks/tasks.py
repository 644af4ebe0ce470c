"""Checks of a task's splits that can fail on data or config, run before any embedding is spent.

One function, :func:`validate_task_splits`, serves both faces: the workflow's ``validate`` stage (manifests
of a config's tasks, right after preparation) and ``fmaudit probe`` (arrays brought on the command line).
It runs every check, collects every problem, and raises one :class:`SplitValidationError` listing them all
(each naming the task, the manifest file or data set, the group, the split or the class at fault); when
nothing is wrong it returns a :class:`SplitValidationReport` saying what was checked.

Checks (``CHECKS``) and their conventions:

- ``columns``: item_id, label, group, domain and split are present; split values are train, val, test or
  unassigned.
- ``duplicate_item_ids``: an item id occurs once per manifest (embeddings are aligned by id).
- ``duplicate_files``: one file is one item: the same ``source`` path (image files) or the same
  source + x + y + level + size (slide tiles) under two item ids is an error; across the data sets of one
  task too, since ``source`` is an absolute path.
- ``task_domains``: every domain the task names has labelled items.
- ``group_disjoint``: within a data set and domain, a group (patient, slide) with labelled items on two of
  train/val/test is leakage. ``allow_group_overlap`` turns the error into an ``allowed`` row and a warning.
  A task pooled over its domains (domains ``["all"]``) checks groups across domains.
- ``label_range``: labels of the task are integers 0..K-1, every one of them has items, one name per label
  and one label per name across the task's data sets.
- ``training_classes``: every source domain has a training split holding at least two classes.
- ``evaluated_classes``: every class a source domain's probe is evaluated on (its own test split and, for
  transfer tasks, every other domain's test split, or all of that domain's items when it has none) is
  present in the source's training split; a label above the training range is named as such. Class names
  listed in the task's ``allow_missing_classes`` are reported as ``allowed`` instead.

Only labelled items take part in the task checks, as in the probes. String columns are factorised once and
every check works on integer codes: a 300,000-item manifest takes about 0.5-1.3 s on the shared 2-core
development machines, 4-7 times the time to read its parquet file (``benchmarks/bench_validation.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError
from fmaudit.split_checks.report import SplitValidationError, SplitValidationReport, name_examples

log = logging.getLogger(__name__)

CHECKS = ("columns", "duplicate_item_ids", "duplicate_files", "task_domains", "group_disjoint", "label_range",
          "training_classes", "evaluated_classes")
REQUIRED_COLUMNS = ("item_id", "label", "group", "domain", "split")
# a task's ``split`` setting -> the manifest column holding its splits (as fmaudit.analyses.task_data reads them)
SPLIT_COLUMNS = {"manifest": "split", "patch (leaky, as published)": "split_patch"}
SPLIT_VALUES = ("train", "val", "test", "unassigned")
EVALUATED_SPLITS = ("train", "val", "test")
POOLED_DOMAIN = "all"
TILE_KEY = ("source", "x", "y", "level", "size")


def _as_frame(name: str, manifest: pd.DataFrame | Mapping[str, Any]) -> pd.DataFrame:
    if isinstance(manifest, pd.DataFrame):
        return manifest
    try:
        return pd.DataFrame({k: np.asarray(v) for k, v in manifest.items()})
    except ValueError as e:  # columns of different lengths
        raise FmauditInputError(f"{name}: the columns given do not have one value per item ({e})") from e


def validate_task_splits(
    manifests: Mapping[str, pd.DataFrame | Mapping[str, Any]],
    tasks: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    files: Mapping[str, str] | None = None,
    allow_group_overlap: bool = False,
    max_examples: int = 10,
) -> SplitValidationReport:
    """Check every task's splits; return the report, or raise :class:`SplitValidationError` listing all problems.

    ``manifests`` maps a data-set name to its manifest: a DataFrame with the manifest columns
    (:mod:`fmaudit.datasets.manifest`), or a mapping of column name -> array (``fmaudit probe`` builds one
    from the arrays it was given). ``tasks`` maps a task name to its spec: ``datasets`` (names in
    ``manifests``), ``domains`` (the resolved domain list, e.g. from :func:`fmaudit.grid.task_domains`;
    ``["all"]`` pools the data, None or absent means every domain present), ``transfer`` (default True)
    and ``allow_missing_classes`` (class names a source's training split may lack). Without ``tasks``, each
    manifest is one pooled task named after it, without transfer. ``files`` maps a data-set name to its
    manifest file, for the messages. ``allow_group_overlap`` accepts groups on two splits (with a warning).
    At most ``max_examples`` ids, groups or files are named per problem, with the total count.

    Parameters
    ----------
    manifests : Mapping of str to DataFrame or Mapping
        Data-set name to its manifest, as above.
    tasks : Mapping of str to Mapping, optional
        Task name to its spec, as above.
    files : Mapping of str to str, optional
        Data-set name to its manifest file (keyword-only).
    allow_group_overlap : bool, default False
        Accept groups on two splits, with a warning (keyword-only).
    max_examples : int, default 10
        Largest number of examples named per problem (keyword-only).

    Returns
    -------
    SplitValidationReport
        Every check, when none failed.

    Raises
    ------
    SplitValidationError
        Listing every problem (its ``report`` holds all checks).
    FmauditInputError
        When a manifest given as columns has columns of different lengths.
    """
    frames = {name: _as_frame(name, m) for name, m in manifests.items()}
    if tasks is None:
        tasks = {name: {"datasets": [name], "domains": [POOLED_DOMAIN], "transfer": False} for name in frames}
    files = dict(files or {})
    report = SplitValidationReport()

    def scope_of(dataset: str) -> str:
        return f"manifest {files[dataset]} (dataset {dataset!r})" if dataset in files else f"dataset {dataset!r}"

    usable: dict[str, pd.DataFrame] = {}
    used = [ds for spec in tasks.values() for ds in spec.get("datasets", [])]
    for dataset in dict.fromkeys(used):
        if dataset not in frames:
            report.add("", "columns", scope_of(dataset), [f"no manifest given for data set {dataset!r}"], "")
            continue
        df = frames[dataset]
        problems = _check_columns(df)
        report.add("", "columns", scope_of(dataset), problems, f"{len(df)} items, columns and split values valid")
        if problems:
            continue
        usable[dataset] = df
        report.add("", "duplicate_item_ids", scope_of(dataset), _duplicate_ids(df, max_examples),
                   f"{len(df)} distinct item ids")
        report.add("", "duplicate_files", scope_of(dataset), _duplicate_files(df, max_examples),
                   "every file (or tile) under one item id" if "source" in df.columns else "no source column")

    for task, spec in tasks.items():
        datasets = [d for d in spec.get("datasets", []) if d in usable]
        if len(datasets) < len(spec.get("datasets", [])):
            continue  # the manifest-level error above already names the data set
        task_frames = {d: usable[d] for d in datasets}
        split = spec.get("split", "manifest")
        if split != "manifest":
            # a declared leaky split (PRISM's Camelyon17 patch split, flagged in every table): its split column
            # is checked, and its group overlap is the declared leak, not an error
            column = SPLIT_COLUMNS.get(split)
            missing = [d for d, df in task_frames.items() if column is None or column not in df.columns]
            if missing:
                report.add(task, "columns", ", ".join(scope_of(d) for d in missing),
                           [f"split {split!r} needs the column {column!r}, which the manifest lacks"], "")
                continue
            task_frames = {d: df.assign(split=df[column]) for d, df in task_frames.items()}
            _check_task(report, task, spec, task_frames, scope_of, True, max_examples)
            continue
        _check_task(report, task, spec, task_frames, scope_of, allow_group_overlap, max_examples)

    if not report.ok:
        problems = report.problems
        raise SplitValidationError(
            f"{len(problems)} problem(s) in the task splits:\n"
            + "\n".join(f"  - {p}" for p in problems), report)
    return report


# ------------------------------------------------------------------ manifest-level checks

def _check_columns(df: pd.DataFrame) -> list[str]:
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        return [f"missing column(s) {missing}"]
    problems = []
    if len(df) == 0:
        problems.append("the manifest has no rows")
    for col in ("item_id", "group", "domain", "split"):
        n_na = int(df[col].isna().sum())
        if n_na:
            first = int(np.flatnonzero(df[col].isna().to_numpy())[0])
            problems.append(f"{n_na} row(s) have no {col!r} (first: row {first})")
    bad = ~df["split"].isin(SPLIT_VALUES) & df["split"].notna()
    if bad.any():
        values = sorted(df.loc[bad, "split"].astype(str).unique())
        problems.append(f"split value(s) {values} in {int(bad.sum())} row(s); expected one of {list(SPLIT_VALUES)}")
    return problems


def _codes(values: pd.Series | np.ndarray, sort: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes and unique values (NA gets -1): string columns are compared as codes, never iterated.

    ``sort`` orders the codes by value (messages then list groups and splits alphabetically); ids and paths
    skip it, as sorting 300,000 unique strings costs more than all the checks."""
    codes, uniques = pd.factorize(values, sort=sort)
    return codes.astype(np.int64), np.asarray(uniques, dtype=object)


def _duplicate_ids(df: pd.DataFrame, max_examples: int) -> list[str]:
    codes, uniques = _codes(df["item_id"], sort=False)
    if len(uniques) == len(codes):
        return []
    counts = np.bincount(codes[codes >= 0], minlength=len(uniques))
    ids = [str(v) for v in uniques[counts > 1]]
    return [f"{len(ids)} item id(s) occur more than once: {name_examples(ids, max_examples)}"]


def _duplicate_files(df: pd.DataFrame, max_examples: int, dataset_col: str | None = None) -> list[str]:
    """Files (or slide tiles) listed under more than one item id; ``dataset_col`` names ids across data sets."""
    if "source" not in df.columns:
        return []
    source, source_names = _codes(df["source"], sort=False)
    tile = df["x"].notna().to_numpy() if "x" in df.columns else np.zeros(len(df), dtype=bool)
    has_tile_key = all(c in df.columns for c in TILE_KEY)
    problems = []
    for is_tile in (False, True):
        mask = tile == is_tile
        if not mask.any() or (is_tile and not has_tile_key):
            continue
        cols = {"source": source[mask]}
        if is_tile:
            for c in TILE_KEY[1:]:
                cols[c] = pd.to_numeric(df[c], errors="coerce").fillna(-1).to_numpy(np.int64)[mask]
        keys = pd.DataFrame(cols)
        dup = keys.duplicated(keep=False).to_numpy()
        if not dup.any():
            continue
        # a key under two distinct ids (the same id twice is the duplicate-id check's business)
        ids = df["item_id"].astype("string")[mask][dup]
        if dataset_col is not None:
            ids = df[dataset_col].astype("string")[mask][dup] + ":" + ids
        id_codes, id_names = _codes(ids)
        pairs = keys[dup].assign(item=id_codes).drop_duplicates()
        n_ids = pairs.groupby(list(cols), sort=True).size()
        clashing = n_ids[n_ids > 1]
        if not len(clashing):
            continue
        shown = []
        for key in clashing.index[:max_examples]:
            key = key if isinstance(key, tuple) else (key,)
            match = np.ones(len(pairs), dtype=bool)
            for col, value in zip(cols, key):
                match &= pairs[col].to_numpy() == value
            hit = pairs[match]
            what = " ".join([str(source_names[key[0]])] + [str(v) for v in key[1:]])
            shown.append(f"{what} -> {sorted(str(id_names[i]) for i in hit['item'])}")
        more = len(clashing) - len(shown)
        what = "slide tile(s) (source x y level size)" if is_tile else "file(s)"
        problems.append(f"{len(clashing)} {what} under more than one item id: " + ", ".join(shown)
                        + (f" and {more} more" if more > 0 else ""))
    return problems


# ------------------------------------------------------------------ task-level checks

@dataclass
class _TaskCodes:
    """The labelled rows of one task as integer codes (row i of each array is the same item)."""

    dataset: np.ndarray
    domain: np.ndarray
    group: np.ndarray
    split: np.ndarray
    label_raw: pd.Series
    label_name: pd.Series | None
    datasets: list[str]
    domains: list[str]
    groups: list[str]
    splits: list[str]


def _task_rows(spec: Mapping[str, Any],
               frames: Mapping[str, pd.DataFrame]) -> tuple[pd.DataFrame, list[str], list[str]]:
    """Labelled rows of the task (with a ``dataset`` column and the task's ``domain``), its domains, problems."""
    parts = []
    for dataset, df in frames.items():
        cols = [c for c in ("item_id", "source", *TILE_KEY[1:], "label", "label_name", "group", "domain", "split")
                if c in df.columns]
        part = df.loc[df["label"].notna().to_numpy(), cols]
        parts.append(part.assign(dataset=dataset))
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["dataset", *REQUIRED_COLUMNS])
    problems = []
    domains = spec.get("domains")
    present = pd.unique(rows["domain"].astype("string").dropna())
    if domains is None:
        domains = sorted(str(d) for d in present)
    elif list(domains) == [POOLED_DOMAIN]:
        rows["domain"] = POOLED_DOMAIN
    else:
        absent = [d for d in domains if d not in set(map(str, present))]
        if absent:
            problems.append(f"domain(s) {absent} of the task have no labelled items "
                            f"(present: {sorted(map(str, present))})")
        rows = rows[rows["domain"].isin(list(domains)).to_numpy()].reset_index(drop=True)
    return rows, list(domains), problems


def _encode(rows: pd.DataFrame) -> _TaskCodes:
    dataset, datasets = _codes(rows["dataset"])
    domain, domains = _codes(rows["domain"].astype("string"))
    group, groups = _codes(rows["group"].astype("string"))
    split, splits = _codes(rows["split"].astype("string"))
    return _TaskCodes(dataset, domain, group, split, rows["label"],
                      rows["label_name"] if "label_name" in rows.columns else None,
                      [str(d) for d in datasets], [str(d) for d in domains], [str(g) for g in groups],
                      [str(v) for v in splits])


def _check_task(report: SplitValidationReport, task: str, spec: Mapping[str, Any],
                frames: Mapping[str, pd.DataFrame], scope_of, allow_group_overlap: bool, max_examples: int) -> None:
    names = ", ".join(scope_of(d) for d in frames)
    rows, domains, domain_problems = _task_rows(spec, frames)
    report.add(task, "task_domains", names, domain_problems, f"{len(rows)} labelled items in {len(domains)} domain(s)")
    if len(rows) == 0:
        report.add(task, "label_range", names, ["the task has no labelled items"], "")
        return

    if len(frames) > 1:  # the same file in two data sets of one task
        report.add(task, "duplicate_files", names, _duplicate_files(rows, max_examples, dataset_col="dataset"),
                   "no file under two data sets")

    codes = _encode(rows)
    for d, dataset in enumerate(codes.datasets):
        problems, n_groups = _leaky_groups(codes, d, max_examples)
        if problems and allow_group_overlap:
            for p in problems:
                log.warning("task %s, %s: %s (allowed by allow_group_overlap)", task, scope_of(dataset), p)
            report.add(task, "group_disjoint", scope_of(dataset), [], "", allowed=problems)
        else:
            report.add(task, "group_disjoint", scope_of(dataset), problems,
                       f"{n_groups} groups, each on one split per domain")

    labels, names_by_label, label_problems = _label_space(codes, max_examples)
    report.add(task, "label_range", names, label_problems,
               f"labels 0..{len(names_by_label) - 1} ({', '.join(names_by_label)})" if names_by_label else "")
    if labels is None:
        return  # labels are not integers: the class checks below would only repeat that

    allowance = [str(c) for c in spec.get("allow_missing_classes") or []]
    unknown = [c for c in allowance if c not in names_by_label]
    if unknown:
        report.add(task, "evaluated_classes", "allow_missing_classes", [
            f"names class(es) {unknown} that the task does not have (classes: {names_by_label})"], "")

    transfer = bool(spec.get("transfer", True)) and len(domains) > 1
    # present[domain, split, label]: which classes have items on each split of each domain
    present = np.zeros((len(codes.domains), len(codes.splits), len(names_by_label)), dtype=bool)
    present[codes.domain, codes.split, labels] = True
    domain_index = {str(d): i for i, d in enumerate(codes.domains)}
    split_index = {str(s): i for i, s in enumerate(codes.splits)}

    def classes(domain: str, split: str | None) -> list[int] | None:
        if domain not in domain_index or (split is not None and split not in split_index):
            return None
        cube = present[domain_index[domain]]
        found = cube.any(axis=0) if split is None else cube[split_index[split]]
        if split is not None and not found.any():
            return None
        return np.flatnonzero(found).tolist()

    for source in domains:
        scope = f"source domain {source!r}"
        train = classes(source, "train")
        if train is None:
            report.add(task, "training_classes", scope,
                       [f"no labelled items on the train split of domain {source!r}"], "")
            continue
        if len(train) < 2:
            report.add(task, "training_classes", scope, [
                f"the train split of domain {source!r} holds a single class ({names_by_label[train[0]]!r}); "
                "a probe needs at least two"], "")
        else:
            report.add(task, "training_classes", scope, [], f"{len(train)} classes on the train split")
        targets = [source] + ([d for d in domains if d != source] if transfer else [])
        problems, allowed = [], []
        for target in targets:
            evaluated = classes(target, "test")
            where = f"the test split of domain {target!r}"
            if evaluated is None:
                if target == source:
                    problems.append(f"domain {source!r} has no test items to evaluate its probe on")
                    continue
                evaluated = classes(target, None) or []
                where = f"domain {target!r} (no test split: all its items)"
            top = max(train)
            for c in sorted(set(evaluated) - set(train)):
                name = names_by_label[c]
                text = (f"class {name!r} (label {c}) is evaluated on {where} but absent from the train split of "
                        f"domain {source!r}")
                if c > top:
                    text += f" (label {c} is outside the training labels 0..{top})"
                if name in allowance:
                    allowed.append(text + " (allowed by allow_missing_classes)")
                else:
                    problems.append(text + "; list it in the task's allow_missing_classes to accept this")
        report.add(task, "evaluated_classes", scope, problems,
                   f"every evaluated class is in training ({len(targets)} target domain(s))", allowed=allowed)


def _leaky_groups(codes: _TaskCodes, dataset: int, max_examples: int) -> tuple[list[str], int]:
    """Groups of one data set with labelled items on two or more of train/val/test, within one domain."""
    in_dataset = codes.dataset == dataset
    n_groups = len(np.unique(codes.group[in_dataset]))
    evaluated = [i for i, s in enumerate(codes.splits) if s in EVALUATED_SPLITS]
    keep = in_dataset & np.isin(codes.split, evaluated)
    if not keep.any():
        return [], n_groups
    n_split = len(codes.splits)
    # one integer per (domain, group, split); distinct triples, then splits per (domain, group)
    pair = codes.domain[keep] * (len(codes.groups) + 1) + codes.group[keep]
    triple, count = np.unique(pair * n_split + codes.split[keep], return_counts=True)
    pairs, n_splits = np.unique(triple // n_split, return_counts=True)
    leaky = pairs[n_splits > 1]
    problems = []
    for dom in np.unique(leaky // (len(codes.groups) + 1)):
        groups = leaky[leaky // (len(codes.groups) + 1) == dom]
        described = []
        for p in groups[:max_examples]:
            hits = (triple // n_split) == p
            per_split = ", ".join(f"{codes.splits[t % n_split]} ({n} items)"
                                  for t, n in zip(triple[hits], count[hits]))
            described.append(f"{codes.groups[p % (len(codes.groups) + 1)]!r} on {per_split.replace(', ', ' and ')}")
        more = len(groups) - max_examples
        name = codes.domains[dom]
        where = "the pooled domains" if name == POOLED_DOMAIN else f"domain {name!r}"
        problems.append(f"{len(groups)} group(s) of {where} are on more than one split (leakage): "
                        + "; ".join(described) + (f"; and {more} more" if more > 0 else ""))
    return problems, n_groups


def _label_space(codes: _TaskCodes, max_examples: int) -> tuple[np.ndarray | None, list[str], list[str]]:
    """Integer labels of the rows, the class name of each label 0..K-1, and the problems found."""
    raw = pd.to_numeric(codes.label_raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    bad = np.isnan(raw) | (raw != np.round(raw)) | (raw < 0)
    if bad.any():
        values = pd.unique(codes.label_raw[bad].astype(str)).tolist()
        return None, [], [f"labels must be integers 0..K-1; found {name_examples(values, max_examples)}"]
    labels = raw.astype(np.int64)
    k = int(labels.max()) + 1
    problems = []
    empty = np.flatnonzero(np.bincount(labels, minlength=k) == 0).tolist()
    if empty:
        problems.append(f"label(s) {empty} have no items although labels go up to {k - 1}; labels must be 0..K-1 "
                        "with every class present (check the label map and the task's domains)")
    names = [f"class_{i}" for i in range(k)]
    if codes.label_name is not None:
        name_code, name_values = _codes(codes.label_name.astype("string"))
        named = name_code >= 0
        pairs = np.unique(labels[named] * (len(name_values) + 1) + name_code[named])
        pair_label, pair_name = pairs // (len(name_values) + 1), pairs % (len(name_values) + 1)
        for label in np.unique(pair_label):
            values = sorted(str(name_values[n]) for n in pair_name[pair_label == label])
            if len(values) > 1:
                problems.append(f"label {label} has several names: {values}")
            names[int(label)] = str(name_values[pair_name[pair_label == label][0]])
        for n in np.unique(pair_name):
            values = sorted(int(v) for v in pair_label[pair_name == n])
            if len(values) > 1:
                problems.append(f"class name {str(name_values[n])!r} has several labels: {values}")
    return labels, names, problems

"""The data stage of the pre-flight (:func:`check_data`, the ``validate`` rule): on prepared manifests, every
split check of every tile-level task, every class name the config mentions against its task's classes, whether the
files can be read, and warnings for test splits with few groups; every problem collected into one error.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.config import manifest_file
from fmaudit.datasets.files import check_image_decode, check_image_headers, check_slides
from fmaudit.grid import embed_pairs, parts_with, resolved_tile_tasks, study_parts
from fmaudit.io import read_table
from fmaudit.registry import unknown_name_error
from fmaudit.split_checks import SPLIT_COLUMNS, SplitValidationError, SplitValidationReport, validate_task_splits

__all__ = [
    "FILE_CHECKS",
    "MIN_TEST_GROUPS",
    "ClassReference",
    "DataChecks",
    "check_class_references",
    "check_data",
    "check_files",
    "check_test_groups",
    "class_references",
    "data_checks",
]

#: Test groups (patients, slides) per domain below which the validation log and the report warn: the interval
#: of a metric over so few clusters is wide and its own width uncertain. Below 2 there is no interval at all.
MIN_TEST_GROUPS = 5
#: The checks that read the files of a manifest (:func:`check_files`).
FILE_CHECKS = ("image_headers", "image_decode", "slides")


@dataclass(frozen=True)
class ClassReference:
    """Class names that a config key gives for a task (``key`` as the error names it).

    Parameters
    ----------
    key : str
        The config key that names the classes, dotted as an error prints it (``ood.near.<task>``,
        ``studies.<s>.prior_shift.priors.<prior>``...).
    task : str
        The tile-level task whose manifests' classes the names must be.
    names : tuple of str
        The class names the key gives (sorted by :func:`class_references`).
    """

    key: str
    task: str
    names: tuple[str, ...]


def class_references(config: Mapping[str, Any]) -> list[ClassReference]:
    """Every class name the config mentions for a tile-level task, with the key that mentions it: the classes held
    out by ``ood.near.<task>`` and ``ood.artefact.<task>``, the classes ``ood.coarsening.without`` removes from
    each coarsening task, the classes of every ``prior_shift.priors.<prior>``, and each task's
    ``allow_missing_classes``. Studies' own sections are prefixed with their key (``studies.<s>.ood.near...``).

    Parameters
    ----------
    config : Mapping
        A filled config (:func:`fmaudit.config.fill_config`), its studies' own sections included.

    Returns
    -------
    list of ClassReference
        One per key and task that names at least one class, its names sorted, the list sorted by (key, task) so
        that the ``validate`` rule's params do not depend on the YAML's order.
    """
    refs: list[ClassReference] = []
    for where, _, ood in parts_with(config, "ood"):
        for tier in ("near", "artefact"):
            for task, names in (ood.get(tier) or {}).items():
                refs.append(ClassReference(f"{where}.{tier}.{task}", task, tuple(str(n) for n in names or [])))
        coarsening = ood.get("coarsening") or {}
        for task in coarsening.get("tasks") or []:
            refs.append(ClassReference(f"{where}.coarsening.without", task,
                                       tuple(str(n) for n in coarsening.get("without") or [])))
    for where, _, prior_shift in parts_with(config, "prior_shift"):
        for prior, shares in prior_shift["priors"].items():
            refs.append(ClassReference(f"{where}.priors.{prior}", prior_shift["task"], tuple(str(n) for n in shares)))
    for prefix, part in study_parts(config):
        for task, spec in (part.get("tasks") or {}).items():
            if spec.get("allow_missing_classes"):
                refs.append(ClassReference(f"{prefix}tasks.{task}.allow_missing_classes", task,
                                           tuple(str(n) for n in spec["allow_missing_classes"])))
    # in a fixed order, whatever order the YAML lists them in: the validate rule's params are compared by their
    # printed form, and a config written back with sorted keys must not rerun the checks
    return sorted((ClassReference(r.key, r.task, tuple(sorted(r.names))) for r in refs if r.names),
                  key=lambda r: (r.key, r.task))


@dataclass(frozen=True)
class DataChecks:
    """What :func:`check_data` checks: ``manifests`` (data set -> manifest file), ``tasks`` (task -> its spec as
    :func:`fmaudit.grid.resolved_tile_tasks` gives it), the config's ``class_references``, and ``files`` (data set
    -> manifest file of every data set whose files an embedding job will read) with the image sample fully
    decoded (``decode_sample`` files per data set, drawn with ``decode_seed``).

    Parameters
    ----------
    manifests : Mapping of str to str
        Data set -> manifest file of every data set of the checked tasks.
    tasks : Mapping of str to Mapping
        Task -> its spec (``datasets``, ``split``, ``domains``...) as :func:`fmaudit.grid.resolved_tile_tasks`
        gives it.
    class_references : sequence of ClassReference
        The class names the config mentions (:func:`class_references`); empty by default.
    files : Mapping of str to str
        Data set -> manifest file of every data set whose image and slide files are checked (empty: no file
        checks; ``preflight.read_files: false`` in the config).
    decode_sample : int
        Images per data set fully decoded (``preflight.decode_sample``; 0 decodes none).
    decode_seed : int
        Seed of the draw of the decoded sample (``preflight.seed``).
    """

    manifests: Mapping[str, str]
    tasks: Mapping[str, Mapping[str, Any]]
    class_references: Sequence[ClassReference] = field(default_factory=tuple)
    files: Mapping[str, str] = field(default_factory=dict)
    decode_sample: int = 64
    decode_seed: int = 0

    def as_params(self) -> dict[str, Any]:
        """Plain data, for a Snakemake rule's params (compared by their printed form); :meth:`from_params`
        reads it back.

        Returns
        -------
        dict
            Keys ``manifests``, ``tasks`` (sorted by name), ``class_references`` (``[key, task, names]`` lists),
            ``files``, ``decode_sample`` and ``decode_seed``: only dicts, lists, strings and ints.
        """
        return {"manifests": dict(sorted(self.manifests.items())),
                "tasks": {t: copy.deepcopy(dict(s)) for t, s in sorted(self.tasks.items())},
                "class_references": [[r.key, r.task, list(r.names)] for r in self.class_references],
                "files": dict(sorted(self.files.items())), "decode_sample": int(self.decode_sample),
                "decode_seed": int(self.decode_seed)}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "DataChecks":
        """The checks that :meth:`as_params` wrote as plain data (a missing ``files``, ``decode_sample`` or
        ``decode_seed`` takes the field's default).

        Parameters
        ----------
        params : Mapping
            A mapping with the keys :meth:`as_params` writes (a Snakemake rule's ``params.checks``).

        Returns
        -------
        DataChecks
        """
        return cls(manifests=dict(params["manifests"]), tasks=dict(params["tasks"]),
                   class_references=tuple(ClassReference(k, t, tuple(n)) for k, t, n in params["class_references"]),
                   files=dict(params.get("files") or {}), decode_sample=int(params.get("decode_sample", 64)),
                   decode_seed=int(params.get("decode_seed", 0)))

    @property
    def inputs(self) -> list[str]:
        """Every manifest the checks read (the ``validate`` rule's inputs)."""
        return list(dict.fromkeys([*self.manifests.values(), *self.files.values()]))

    def restricted_to(self, tasks: Sequence[str]) -> "DataChecks":
        """The checks of ``tasks`` only (``fmaudit check-config`` on the tasks whose manifests are prepared).

        Parameters
        ----------
        tasks : sequence of str
            Tasks to keep; each must be a key of :attr:`tasks` (KeyError otherwise).

        Returns
        -------
        DataChecks
            The same checks with only the manifests, files and class references of those tasks' data sets.
        """
        keep = {t: self.tasks[t] for t in tasks}
        datasets = {ds for spec in keep.values() for ds in spec["datasets"]}
        return DataChecks({ds: p for ds, p in self.manifests.items() if ds in datasets}, keep,
                          tuple(r for r in self.class_references if r.task in keep),
                          {ds: p for ds, p in self.files.items() if ds in datasets}, self.decode_sample,
                          self.decode_seed)


def data_checks(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> DataChecks:
    """The data stage's checks of a filled config: its tile-level tasks, the manifests the workflow prepares for
    them (:func:`fmaudit.config.manifest_file`), the class names it mentions and the files of every data set it
    embeds (features computed elsewhere have none).

    Parameters
    ----------
    config : Mapping
        A filled config; its tasks, ``preflight`` block (``read_files``, ``decode_sample``, ``seed``) and
        embedding pairs are read.
    dataset_registry : Mapping
        Data-set name -> registry entry, as the config sees it (:func:`fmaudit.preflight.check_config`).

    Returns
    -------
    DataChecks
        Ready for :func:`check_data`, or for the ``validate`` rule's params (:meth:`DataChecks.as_params`).
    """
    tasks = resolved_tile_tasks(config, dataset_registry)
    manifests = {ds: manifest_file(config, ds) for spec in tasks.values() for ds in spec["datasets"]}
    refs = [r for r in class_references(config) if r.task in tasks]
    pre = config["preflight"]
    embedded = dict.fromkeys(ds for _, ds in embed_pairs(config)) if pre["read_files"] else {}
    files = {ds: manifest_file(config, ds) for ds in embedded if dataset_registry[ds]["kind"] != "features"}
    return DataChecks(manifests, tasks, tuple(refs), files, int(pre["decode_sample"]), int(pre["seed"]))


def check_files(report: SplitValidationReport, frames: Mapping[str, pd.DataFrame], files: Mapping[str, str],
                decode_sample: int, decode_seed: int) -> None:
    """Add the file checks of every data set's manifest to ``report`` (:mod:`fmaudit.datasets.files`): every image
    header, a full decode of a seeded sample, every slide opened; rows ``image_headers``, ``image_decode`` and
    ``slides``, each problem naming the file and the item (and the sheet line of a user's sheet).

    Parameters
    ----------
    report : SplitValidationReport
        The report the rows are added to (changed in place).
    frames : Mapping of str to DataFrame
        Data set -> its manifest, read; a data set absent here is skipped.
    files : Mapping of str to str
        Data set -> its manifest file (named in each row's scope).
    decode_sample : int
        Images per data set fully decoded, only when every header read; 0 decodes none.
    decode_seed : int
        Seed of the draw of the decoded images.
    """
    for ds, path in files.items():
        frame = frames.get(ds)
        if frame is None:
            continue
        scope = f"manifest {path} (dataset {ds!r})"
        images = frame[frame["x"].isna()] if "x" in frame.columns else frame
        if len(images):
            problems, detail = check_image_headers(images)
            report.add("", "image_headers", scope, problems, detail)
            if not problems and decode_sample > 0:
                problems, detail = check_image_decode(images, decode_sample, decode_seed)
                report.add("", "image_decode", scope, problems, detail)
        if "x" in frame.columns and frame["x"].notna().any():
            problems, detail = check_slides(frame)
            report.add("", "slides", scope, problems, detail)


def check_test_groups(report: SplitValidationReport, tasks: Mapping[str, Mapping[str, Any]],
                      frames: Mapping[str, pd.DataFrame]) -> None:
    """A ``test_groups`` row per task and domain: a warning where the domain's labelled test split holds fewer
    than :data:`MIN_TEST_GROUPS` groups (intervals over so few clusters are wide and unstable), saying that
    there is no interval at all below 2 (the report then gives none and says why).

    Parameters
    ----------
    report : SplitValidationReport
        The report the rows are added to (changed in place).
    tasks : Mapping of str to Mapping
        Task -> its spec (``datasets``, ``split``, ``domains``); a task with a manifest missing is skipped.
    frames : Mapping of str to DataFrame
        Data set -> its manifest (columns ``label``, ``group``, ``domain``, the split column, optionally
        ``group_unit``: the unit the warning names, ``patient`` or ``slide``).
    """
    for task, spec in tasks.items():
        present = [ds for ds in spec["datasets"] if ds in frames]
        if len(present) < len(spec["datasets"]):
            continue
        split_col = SPLIT_COLUMNS.get(spec.get("split", "manifest"), "split")
        parts = [frames[ds] for ds in present if split_col in frames[ds].columns]
        if not parts:
            continue
        rows = pd.concat([p[["label", "group", "domain", split_col]] for p in parts], ignore_index=True)
        rows = rows[rows["label"].notna() & (rows[split_col] == "test")]
        unit = "+".join(sorted({str(u) for ds in present for u in frames[ds].get("group_unit", pd.Series(["group"]))
                                .dropna().unique()})) or "group"
        domains = spec.get("domains") or sorted(rows["domain"].astype(str).unique())
        pooled = list(domains) == ["all"]
        for domain in domains:
            test = rows if pooled else rows[rows["domain"] == domain]
            n = int(test["group"].nunique())
            scope = f"test split of domain {domain!r}"
            if n == 0:
                continue  # the split checks name a domain without test items
            if n < 2:
                warning = (f"{n} test {unit}: no interval (a cluster bootstrap needs at least 2 {unit}s); the report "
                           f"gives this domain's metrics without an interval and says why")
            elif n < MIN_TEST_GROUPS:
                warning = (f"{n} test {unit}s: intervals over fewer than {MIN_TEST_GROUPS} {unit}s are wide and their "
                           "own width is uncertain; more test groups, or fewer splits (fractions), help")
            else:
                report.add(task, "test_groups", scope, [], f"{n} test {unit}s")
                continue
            report.add(task, "test_groups", scope, [], "", warnings=[warning])


def check_class_references(report: SplitValidationReport, refs: Sequence[ClassReference],
                           tasks: Mapping[str, Mapping[str, Any]], frames: Mapping[str, pd.DataFrame],
                           files: Mapping[str, str]) -> None:
    """Add a ``class_names`` row to ``report`` for each reference: an error naming the key, the unknown names and
    the task's classes (with a close spelling where there is one) when a name is not a class of the task's
    manifests.

    Parameters
    ----------
    report : SplitValidationReport
        The report the rows are added to (changed in place).
    refs : sequence of ClassReference
        The class names to check (:func:`class_references`).
    tasks : Mapping of str to Mapping
        Task -> its spec; a reference to a task not here is skipped.
    frames : Mapping of str to DataFrame
        Data set -> its manifest; a task's classes are the ``label_name`` values of its data sets' manifests.
    files : Mapping of str to str
        Data set -> its manifest file, named in the error.
    """
    for ref in refs:
        spec = tasks.get(ref.task)
        if spec is None:
            continue  # not a tile task of this config (the grid check names unknown tasks)
        present = [ds for ds in spec["datasets"] if ds in frames]
        if len(present) < len(spec["datasets"]):
            continue  # a missing manifest is reported by the split checks
        classes = sorted({str(n) for ds in present for n in frames[ds]["label_name"].dropna().unique()})
        unknown = [n for n in ref.names if n not in classes]
        where = ", ".join(files.get(ds, ds) for ds in present)
        problems = [f"{unknown_name_error('class', name, classes)} (classes of task {ref.task!r} in {where})"
                    for name in unknown]
        report.add(ref.task, "class_names", f"config '{ref.key}'", problems,
                   f"{len(ref.names)} class name(s) of task {ref.task!r}: {', '.join(ref.names)}")


def check_data(checks: DataChecks, frames: Mapping[str, pd.DataFrame] | None = None) -> SplitValidationReport:
    """Every check of the data stage on prepared manifests (see the module doc): returns the report of every
    check, or raises :class:`~fmaudit.split_checks.SplitValidationError` listing every problem of every check.
    ``frames`` gives manifests already in memory (``fmaudit check-config`` prepares a user's own data sets
    there); the others are read from their files.

    Parameters
    ----------
    checks : DataChecks
        What to check (:func:`data_checks`).
    frames : Mapping of str to DataFrame, optional
        Data set -> manifest already in memory; the others are read from ``checks``' files.

    Returns
    -------
    SplitValidationReport
        One row per check and scope (the validate rule writes it as ``validation/preflight.tsv``); warnings only.

    Raises
    ------
    SplitValidationError
        Listing every problem of every check, with the full report attached (``.report``).
    """
    given = dict(frames or {})
    paths = {**checks.files, **checks.manifests}
    frames = {ds: given[ds] if ds in given else read_table(path) for ds, path in paths.items()}
    task_frames = {ds: frames[ds] for ds in checks.manifests}
    try:
        report = validate_task_splits(task_frames, checks.tasks, files=dict(checks.manifests))
    except SplitValidationError as e:
        report = e.report
    check_class_references(report, checks.class_references, checks.tasks, task_frames, checks.manifests)
    check_files(report, frames, checks.files, checks.decode_sample, checks.decode_seed)
    check_test_groups(report, checks.tasks, task_frames)
    if not report.ok:
        problems = report.problems
        raise SplitValidationError(f"{len(problems)} problem(s) found before the first embedding:\n"
                                   + "\n".join(f"  - {p}" for p in problems), report)
    return report

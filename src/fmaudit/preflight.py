"""Pre-flight: every check that a config or its data can fail, run before the first GPU hour is spent.

One home for both faces: the workflow (``rules/common.smk`` when it plans, the ``validate`` rule before any
embedding job) and ``fmaudit check-config`` call exactly these functions, so a mistake that the command line
accepts is one the workflow accepts too, and the reverse. Two stages:

- :func:`check_config`, at plan time (every ``snakemake -n``, every ``fmaudit grid``): the config and both
  registries against their schemas, every name the config uses, every analysis grid, slide sheets, local
  weight files. Cheap: it reads no data. :func:`unusable_encoders` says which encoders could not be embedded as
  configured (remote code without a pinned commit, a registry weight file that is not there); the workflow
  warns when it plans and stops before the first job of a run that would embed one.
- :func:`check_data`, once the manifests are prepared (the ``validate`` rule; ``fmaudit check-config`` on the
  manifests already prepared): every split check of every tile-level task (:mod:`fmaudit.split_checks`:
  leakage across splits, classes missing from training, label ranges, duplicate ids and files) and every class
  name the config mentions (:func:`class_references`: ``ood.near``, ``ood.artefact``, ``ood.coarsening.without``,
  prior-shift priors, ``allow_missing_classes``) against the classes of its task's manifests. It collects every
  problem of every check and raises one :class:`~fmaudit.split_checks.SplitValidationError` listing them all,
  each naming the file, the config key, the group or the class; otherwise it returns the report of every check
  (``results/<study>/validation/preflight.tsv`` in the workflow).

What :func:`check_data` checks is described by a :class:`DataChecks`, which :func:`data_checks` builds from a
config: the workflow passes it to the ``validate`` rule as params (:meth:`DataChecks.as_params`), so editing a
class name of ``ood.near`` reruns the checks, and ``fmaudit check-config`` builds the same object.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.config import apply_encoder_revisions, dataset_params, manifest_file
from fmaudit.datasets.slide_tiles import read_slide_sheet
from fmaudit.grid import check_grid, parts_with, resolved_tile_tasks, study_parts
from fmaudit.io import FmauditInputError, read_table
from fmaudit.registry import check_encoder_usable, load_dataset_registry, load_registry, unknown_name_error
from fmaudit.split_checks import SplitValidationError, SplitValidationReport, validate_task_splits

__all__ = [
    "ClassReference",
    "DataChecks",
    "check_class_references",
    "check_config",
    "check_data",
    "check_encoder_weights",
    "check_names",
    "check_slide_sheets",
    "class_references",
    "data_checks",
    "unusable_encoders",
]


# ---------------------------------------------------------------------------------------------- plan stage


def check_names(config: Mapping[str, Any], encoder_registry: Mapping[str, Any],
                dataset_registry: Mapping[str, Any]) -> None:
    """Every encoder, data set and task reference of the config exists; raise naming the first that doesn't."""
    for enc in config["encoders"]:
        if enc not in encoder_registry:
            raise unknown_name_error("encoder", enc, list(encoder_registry), "config 'encoders'")
    for ds in config["datasets"]:
        if ds not in dataset_registry:
            raise unknown_name_error("dataset", ds, list(dataset_registry), "config 'datasets'")
    declared = [name for name, entry in encoder_registry.items() if entry.get("variant_of")]
    for variant in config["variants"]:
        if variant not in declared:
            raise unknown_name_error("declared encoder variant", variant, declared, "config 'variants'")
        base = encoder_registry[variant]["variant_of"]
        if base not in config["encoders"]:
            raise FmauditInputError(f"config 'variants': {variant!r} is a variant of {base!r}, which is not in the "
                                    f"config's encoders ({', '.join(config['encoders'])}); a variant is checked "
                                    "beside its base")
    for ds in config["dataset_params"]:
        if ds not in config["datasets"]:
            raise unknown_name_error("dataset", ds, list(config["datasets"]), "config 'dataset_params'")
    for key in ("encoder_weights", "encoder_revisions"):
        for enc in config[key]:
            if enc not in config["encoders"]:
                raise unknown_name_error("encoder", enc, list(config["encoders"]), f"config '{key}'")
    for task, spec in config["tasks"].items():
        for ds in spec["datasets"]:
            if ds not in config["datasets"]:
                raise unknown_name_error("dataset", ds, list(config["datasets"]), f"config 'tasks.{task}.datasets'")


def check_slide_sheets(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> None:
    """Validate every slide sheet the config's data sets use, so a bad sheet stops the run before any job."""
    for ds in config["datasets"]:
        sheet = dataset_params(config, dataset_registry, ds).get("slides")
        if sheet:
            read_slide_sheet(sheet)


def check_encoder_weights(config: Mapping[str, Any]) -> None:
    """Every ``encoder_weights.<slug>`` override of the config is an existing file; the error names the key."""
    for enc, path in config["encoder_weights"].items():
        where = "" if Path(path).is_absolute() else f" (relative to {Path.cwd()})"
        if not Path(path).exists():
            raise FmauditInputError(f"config 'encoder_weights.{enc}': weight file {path} does not exist{where}")
        if not Path(path).is_file():
            raise FmauditInputError(f"config 'encoder_weights.{enc}': {path} is not a file{where}")


def unusable_encoders(config: Mapping[str, Any], encoder_registry: Mapping[str, Any],
                      encoders: list[str] | None = None) -> dict[str, str]:
    """``{slug: why}`` for the config's encoders (or ``encoders``) that cannot be embedded as the registry and the
    config stand, each message naming the key to set: remote code without a pinned commit
    (:func:`fmaudit.registry.check_encoder_usable`; ``encoder_revisions.<slug>``), or a registry weight file
    (``source: file``) that is not there and no ``encoder_weights.<slug>`` override."""
    registry_file = str(config["encoder_registry"])
    problems = {}
    for enc in config["encoders"] if encoders is None else encoders:
        entry = encoder_registry[enc]
        try:
            check_encoder_usable(enc, entry, source=registry_file, config_key=f"encoder_revisions.{enc}")
        except FmauditInputError as e:
            problems[enc] = str(e)
            continue
        weights = entry["weights"]
        if weights["source"] == "file" and enc not in config["encoder_weights"] and not Path(weights["path"]).is_file():
            problems[enc] = (f"{registry_file}: encoder {enc!r}: weight file {weights['path']} (weights.path) does not "
                             f"exist (relative to {Path.cwd()}); give a local copy in the config's "
                             f"'encoder_weights.{enc}', or fix weights.path")
    return problems


def check_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every check of the plan stage, on a filled config (:func:`fmaudit.config.fill_config`); returns the
    (encoder, data-set) registries as the config sees them (``encoder_revisions`` applied). The workflow
    (``rules/common.smk``) and ``fmaudit check-config`` both call this."""
    encoders = load_registry(config["encoder_registry"])
    datasets = load_dataset_registry(config["dataset_registry"])
    check_names(config, encoders, datasets)
    encoders = apply_encoder_revisions(config, encoders)
    check_encoder_weights(config)
    check_grid(config, datasets)
    check_slide_sheets(config, datasets)
    return encoders, datasets


# ---------------------------------------------------------------------------------------------- data stage


@dataclass(frozen=True)
class ClassReference:
    """Class names that a config key gives for a task (``key`` as the error names it)."""

    key: str
    task: str
    names: tuple[str, ...]


def class_references(config: Mapping[str, Any]) -> list[ClassReference]:
    """Every class name the config mentions for a tile-level task, with the key that mentions it: the classes held
    out by ``ood.near.<task>`` and ``ood.artefact.<task>``, the classes ``ood.coarsening.without`` removes from
    each coarsening task, the classes of every ``prior_shift.priors.<prior>``, and each task's
    ``allow_missing_classes``. Studies' own sections are prefixed with their key (``studies.<s>.ood.near...``)."""
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
    :func:`fmaudit.grid.resolved_tile_tasks` gives it) and the config's ``class_references``."""

    manifests: Mapping[str, str]
    tasks: Mapping[str, Mapping[str, Any]]
    class_references: Sequence[ClassReference] = field(default_factory=tuple)

    def as_params(self) -> dict[str, Any]:
        """Plain data, for a Snakemake rule's params (compared by their printed form); :meth:`from_params`
        reads it back."""
        return {"manifests": dict(sorted(self.manifests.items())),
                "tasks": {t: copy.deepcopy(dict(s)) for t, s in sorted(self.tasks.items())},
                "class_references": [[r.key, r.task, list(r.names)] for r in self.class_references]}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "DataChecks":
        return cls(manifests=dict(params["manifests"]), tasks=dict(params["tasks"]),
                   class_references=tuple(ClassReference(k, t, tuple(n)) for k, t, n in params["class_references"]))

    def restricted_to(self, tasks: Sequence[str]) -> "DataChecks":
        """The checks of ``tasks`` only (``fmaudit check-config`` on the tasks whose manifests are prepared)."""
        keep = {t: self.tasks[t] for t in tasks}
        datasets = {ds for spec in keep.values() for ds in spec["datasets"]}
        return DataChecks({ds: p for ds, p in self.manifests.items() if ds in datasets}, keep,
                          tuple(r for r in self.class_references if r.task in keep))


def data_checks(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> DataChecks:
    """The data stage's checks of a filled config: its tile-level tasks, the manifests the workflow prepares for
    them (:func:`fmaudit.config.manifest_file`) and the class names it mentions."""
    tasks = resolved_tile_tasks(config, dataset_registry)
    manifests = {ds: manifest_file(config, ds) for spec in tasks.values() for ds in spec["datasets"]}
    refs = [r for r in class_references(config) if r.task in tasks]
    return DataChecks(manifests, tasks, tuple(refs))


def check_class_references(report: SplitValidationReport, refs: Sequence[ClassReference],
                           tasks: Mapping[str, Mapping[str, Any]], frames: Mapping[str, pd.DataFrame],
                           files: Mapping[str, str]) -> None:
    """Add a ``class_names`` row to ``report`` for each reference: an error naming the key, the unknown names and
    the task's classes (with a close spelling where there is one) when a name is not a class of the task's
    manifests."""
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


def check_data(checks: DataChecks) -> SplitValidationReport:
    """Every check of the data stage on prepared manifests (see the module doc): returns the report of every
    check, or raises :class:`~fmaudit.split_checks.SplitValidationError` listing every problem of every check."""
    frames = {ds: read_table(path) for ds, path in checks.manifests.items()}
    try:
        report = validate_task_splits(frames, checks.tasks, files=dict(checks.manifests))
    except SplitValidationError as e:
        report = e.report
    check_class_references(report, checks.class_references, checks.tasks, frames, checks.manifests)
    if not report.ok:
        problems = report.problems
        raise SplitValidationError(f"{len(problems)} problem(s) found before the first embedding:\n"
                                   + "\n".join(f"  - {p}" for p in problems), report)
    return report

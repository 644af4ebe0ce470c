"""Studies and settings blocks of a (filled) config, and the domains of a task.

Combined configs (``studies:``): each study runs its own encoders on its own tasks with its own blocks
(``probe``, ``calibration`` ... ``cells``), so a combined config plans exactly the union of its studies' runs
instead of every encoder on every task. Without ``studies`` the whole config is one study.

Domains of a task come from the config (``tasks.<t>.domains``), else from the data-set registry
(``domains:`` of each data set), else the task is a single pooled domain ``"all"``: the grid never reads data.

Every function here takes a config filled from its schema (:func:`fmaudit.config.fill_config`): blocks are
read as they are, never completed with defaults of their own.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

from fmaudit.config import dataset_params
from fmaudit.datasets import dataset_group_unit
from fmaudit.io import FmauditInputError

POOLED_DOMAIN = "all"
#: Blocks a study may override; a study's own block replaces the top-level one for its tasks.
SETTINGS_BLOCKS = ("probe", "calibration", "bootstrap")
#: Analysis blocks declared ahead of their rules; with ``studies`` they live inside a study.
DECLARED_BLOCKS = ("head_sweep", "cross_dataset", "ood", "prior_shift", "cells")

__all__ = [
    "DECLARED_BLOCKS",
    "POOLED_DOMAIN",
    "SETTINGS_BLOCKS",
    "cell_tasks",
    "probe_encoders",
    "check_studies",
    "parts_with",
    "require_domains",
    "require_tasks",
    "resolved_tile_tasks",
    "config_block",
    "settings_by_task",
    "study_of",
    "study_parts",
    "task_domains",
    "task_group_units",
    "tile_tasks",
]


def config_block(config: Mapping[str, Any], name: str, task: str | None = None) -> dict[str, Any]:
    """A copy of a config block; with ``task``, the block of the study that holds the task when that
    study has its own.

    Parameters
    ----------
    config : Mapping
        The filled config.
    name : str
        The block's key (``probe``, ``calibration``, ``bootstrap``, ``ood`` ...).
    task : str, optional
        A task; its study's own block is taken where the study has one.

    Returns
    -------
    dict
        A shallow copy of the block.

    Raises
    ------
    FmauditInputError
        When the config has no such block (it was not filled from its schema).
    """
    source: Mapping[str, Any] = config
    if task is not None:
        study = study_of(config, task)
        if study is not None and name in config["studies"][study]:
            source = config["studies"][study]
    if name not in source:
        raise FmauditInputError(f"config has no {name!r} block (was the config filled from its schema?)")
    return dict(source[name])


def settings_by_task(config: Mapping[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """``{task: its block}`` for every tile-level task (the report's settings, which may differ by study).

    Parameters
    ----------
    config : Mapping
        The filled config.
    name : str
        The block's key (``probe``, ``calibration``, ``bootstrap``).

    Returns
    -------
    dict of str to dict
        Tile-level task -> a copy of the block that applies to it.
    """
    return {task: config_block(config, name, task=task) for _, part in study_parts(config) for task in tile_tasks(part)}


def task_domains(config: Mapping[str, Any], task: str, dataset_registry: Mapping[str, Any] | None = None) -> list[str]:
    """Domains transfer runs go between, from the config or the data-set registry (see module doc).

    Parameters
    ----------
    config : Mapping
        The filled config (or one study part of it).
    task : str
        A task of ``config["tasks"]``.
    dataset_registry : Mapping, optional
        Data-set slug -> registry entry; its ``domains`` are read when the task names none.

    Returns
    -------
    list of str
        The domains in config (or registry) order; ``["all"]`` (:data:`POOLED_DOMAIN`) when neither names any.

    Raises
    ------
    FmauditInputError
        When ``task`` is not a task of the config.
    """
    tasks = config.get("tasks") or {}
    if task not in tasks:
        raise FmauditInputError(f"unknown task {task!r}; tasks in the config: {sorted(tasks)}")
    spec = tasks[task]
    if spec.get("domains"):
        return list(spec["domains"])
    domains: list[str] = []
    for ds in spec["datasets"]:
        entry = (dataset_registry or {}).get(ds) or {}
        for d in entry.get("domains") or []:
            if d not in domains:
                domains.append(d)
    return domains or [POOLED_DOMAIN]


def task_group_units(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> dict[str, str]:
    """``{task: the unit its intervals resample}`` for every tile-level task, from the registry's ``group_unit``
    of its data sets under the config's parameters (``patient``; ``item`` for data sets without patient ids;
    ``patient+item`` for a task pooling both). The report's captions state it; the tables carry the unit
    each row's data really had.

    Parameters
    ----------
    config : Mapping
        The filled config.
    dataset_registry : Mapping
        Data-set slug -> registry entry (``group_unit``, ``params``) for every data set of the tasks.

    Returns
    -------
    dict of str to str
        Tile-level task -> unit, several units joined by ``+`` in sorted order.
    """
    units = {}
    for _, part in study_parts(config):
        for task in tile_tasks(part):
            found = {dataset_group_unit(dataset_registry[ds], dataset_params(config, dataset_registry, ds))
                     for ds in config["tasks"][task]["datasets"]}
            units[task] = "+".join(sorted(found))
    return units


def study_of(config: Mapping[str, Any], task: str) -> str | None:
    """The study that holds ``task`` (None without ``studies`` or for a task of no study).

    Parameters
    ----------
    config : Mapping
        The filled config.
    task : str
        A task name.

    Returns
    -------
    str or None
        The name of the study under ``studies`` whose ``tasks`` list it.
    """
    for name, study in (config.get("studies") or {}).items():
        if task in study["tasks"]:
            return name
    return None


def check_studies(config: Mapping[str, Any]) -> None:
    """Every study names encoders, data sets and tasks of the config; each task is in exactly one study and
    every encoder and data set in at least one; analysis blocks live inside studies.

    Parameters
    ----------
    config : Mapping
        The filled config; one without ``studies`` passes.

    Raises
    ------
    FmauditInputError
        Naming the ``studies.<name>.<key>`` that refers to something the config lacks, the task in two studies,
        the study lacking a data set its task uses, the top-level analysis block that belongs in a study, or the
        encoders, data sets and tasks in no study.
    """
    studies = config.get("studies") or {}
    if not studies:
        return
    for name in DECLARED_BLOCKS:
        if config.get(name):
            raise FmauditInputError(f"config {name!r}: with 'studies', put this block inside the study it belongs to")
    owner: dict[str, str] = {}
    used_encoders: set[str] = set()
    used_datasets: set[str] = set()
    for name, study in studies.items():
        where = f"config 'studies.{name}"
        for key, known in (("encoders", config["encoders"]), ("tasks", list(config["tasks"])),
                           ("datasets", config["datasets"])):
            for item in study.get(key) or []:
                if item not in known:
                    raise FmauditInputError(
                        f"{where}.{key}': {item!r} is not in the config's {key} ({', '.join(known)})")
        datasets = _study_datasets(config, study)
        for task in study["tasks"]:
            if task in owner:
                raise FmauditInputError(f"{where}.tasks': task {task!r} is already in study {owner[task]!r}")
            owner[task] = name
            for ds in config["tasks"][task]["datasets"]:
                if ds not in datasets:
                    raise FmauditInputError(f"{where}.datasets': task {task!r} uses {ds!r}, which the study lacks")
        used_encoders.update(study["encoders"])
        used_datasets.update(datasets)
    for key, known, used in (("tasks", list(config["tasks"]), set(owner)),
                             ("encoders", config["encoders"], used_encoders),
                             ("datasets", config["datasets"], used_datasets)):
        orphans = [x for x in known if x not in used]
        if orphans:
            raise FmauditInputError(f"config {key!r}: {', '.join(map(repr, orphans))} in no study (config 'studies')")


def _study_datasets(config: Mapping[str, Any], study: Mapping[str, Any]) -> list[str]:
    if study.get("datasets"):
        return list(study["datasets"])
    out: list[str] = []
    for task in study["tasks"]:
        for ds in config["tasks"][task]["datasets"]:
            if ds not in out:
                out.append(ds)
    return out


def study_parts(config: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(key prefix for messages, config of one study): the whole config when it has no studies.

    Parameters
    ----------
    config : Mapping
        The filled config; checked with :func:`check_studies` when it has ``studies``.

    Returns
    -------
    list of (str, Mapping)
        ``("", config)`` without studies; else ``("studies.<name>.", part)`` per study, ``part`` being the config
        restricted to the study's encoders, data sets and tasks with its own blocks in place of the top-level ones.
    """
    studies = config.get("studies") or {}
    if not studies:
        return [("", config)]
    check_studies(config)
    parts = []
    for name, study in studies.items():
        part = {k: v for k, v in config.items() if k not in ("studies", *DECLARED_BLOCKS)}
        part["encoders"] = list(study["encoders"])
        part["datasets"] = _study_datasets(config, study)
        part["tasks"] = {t: config["tasks"][t] for t in study["tasks"]}
        for key in (*SETTINGS_BLOCKS, *DECLARED_BLOCKS):
            if key in study:
                part[key] = study[key]
        parts.append((f"studies.{name}.", part))
    return parts


def parts_with(config: Mapping[str, Any], name: str) -> Iterator[tuple[str, Mapping[str, Any], dict[str, Any]]]:
    """(config key of the block for messages, study part, its block) of every part with a ``name`` block:
    what each declared analysis enumerates over.

    Parameters
    ----------
    config : Mapping
        The filled config.
    name : str
        A block's key (``ood``, ``prior_shift``, ``cells`` ...); parts where it is missing or empty are skipped.

    Yields
    ------
    where : str
        The block's config key for messages (``ood`` or ``studies.<name>.ood``).
    part : Mapping
        The study part (:func:`study_parts`).
    block : dict
        A copy of the part's block.
    """
    for prefix, part in study_parts(config):
        if part.get(name):
            yield f"{prefix}{name}", part, config_block(part, name)


def cell_tasks(config: Mapping[str, Any]) -> list[str]:
    """Tasks that are cell-level label spaces (``cells.taxonomies``), across studies: they leave the tile
    probe grid, and a data set used only by them is not embedded tile-wise.

    Parameters
    ----------
    config : Mapping
        The filled config.

    Returns
    -------
    list of str
        Task names in first-seen order, without repeats.
    """
    out: list[str] = []
    for _, part in study_parts(config):
        for task in ((part.get("cells") or {}).get("taxonomies") or {}).values():
            if task not in out:
                out.append(task)
    return out


def variant_base(slug: str) -> str:
    """The base encoder of a declared variant slug ``<encoder>.<variant>`` (variant names hold no '.').

    Parameters
    ----------
    slug : str
        An encoder slug; one without ``.`` is its own base.

    Returns
    -------
    str
        The slug up to its last ``.``.
    """
    return slug.rsplit(".", 1)[0]


def probe_encoders(part: Mapping[str, Any]) -> list[str]:
    """Encoders the probe grid runs in one study part: its encoders, then the config's declared ``variants``
    whose base is one of them (embedded and probed beside their base, never in the other analyses).

    Parameters
    ----------
    part : Mapping
        A study part (:func:`study_parts`) with ``encoders`` and optional ``variants``.

    Returns
    -------
    list of str
        The part's encoders, then the variants of those encoders, each once.
    """
    encoders = list(part["encoders"])
    extra = [v for v in part.get("variants") or [] if variant_base(v) in encoders and v not in encoders]
    return encoders + extra


def tile_tasks(part: Mapping[str, Any]) -> list[str]:
    """Tasks of one study part that are tile-level (not a cell taxonomy).

    Parameters
    ----------
    part : Mapping
        A study part (:func:`study_parts`).

    Returns
    -------
    list of str
        The part's tasks in config order, without those named by ``cells.taxonomies``.
    """
    cells = set(((part.get("cells") or {}).get("taxonomies") or {}).values())
    return [t for t in part["tasks"] if t not in cells]


def require_tasks(part: Mapping[str, Any], names: Iterable[str], where: str) -> None:
    """Raise naming the config key ``where`` if one of ``names`` is not a task of the part.

    Parameters
    ----------
    part : Mapping
        A study part (:func:`study_parts`).
    names : iterable of str
        The task names a block gives.
    where : str
        The config key that gives them, for the message.

    Raises
    ------
    FmauditInputError
        Naming ``where``, the unknown task and the part's tasks.
    """
    for t in names:
        if t not in part["tasks"]:
            raise FmauditInputError(f"config {where!r}: unknown task {t!r} (tasks: {', '.join(part['tasks'])})")


def require_domains(part: Mapping[str, Any], task: str, wanted: Iterable[str],
                    registry: Mapping[str, Any] | None, where: str) -> list[str]:
    """The task's domains; raise naming ``where`` if one of ``wanted`` is not among them.

    Parameters
    ----------
    part : Mapping
        A study part (:func:`study_parts`).
    task : str
        A task of the part.
    wanted : iterable of str
        The domains a block gives for the task.
    registry : Mapping or None
        The data-set registry (:func:`task_domains` reads its ``domains``).
    where : str
        The config key that gives them, for the message.

    Returns
    -------
    list of str
        The task's domains (:func:`task_domains`).

    Raises
    ------
    FmauditInputError
        Naming ``where``, the domain and the task's domains.
    """
    domains = task_domains(part, task, registry)
    for d in wanted:
        if d not in domains:
            raise FmauditInputError(f"config {where!r}: {d!r} is not a domain of task {task!r} ({', '.join(domains)})")
    return domains


def resolved_tile_tasks(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None
                        ) -> dict[str, dict[str, Any]]:
    """Every tile-level task of the config (all studies) as the split checks take it
    (:func:`fmaudit.split_checks.validate_task_splits`): its ``datasets``, resolved ``domains``
    (:func:`task_domains`), ``transfer``, ``allow_missing_classes`` and ``split``.

    Parameters
    ----------
    config : Mapping
        The filled config.
    dataset_registry : Mapping, optional
        Data-set slug -> registry entry, for the tasks' domains.

    Returns
    -------
    dict of str to dict
        Task -> ``{"datasets", "domains", "transfer", "allow_missing_classes", "split"}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for _, part in study_parts(config):
        for task in tile_tasks(part):
            spec = part["tasks"][task]
            out[task] = {"datasets": list(spec["datasets"]), "domains": task_domains(part, task, dataset_registry),
                         "transfer": bool(spec["transfer"]),
                         "allow_missing_classes": list(spec["allow_missing_classes"]),
                         "split": spec.get("split", "manifest")}
    return out

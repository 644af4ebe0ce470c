"""Out-of-distribution detection and the abstention gate (audit paper): novelty scorers on OOD conditions by tier
(far, blur, near, artefact, image_artefact), the two-threshold gate per task setting, and the perturbed copies
of the test split (blur and image artefacts) the workflow embeds as derived data sets.

Tiers, in the order a task's conditions are listed (the audit paper's, then the image artefacts):

- ``far``: ``ood.far.<task>`` names a donor, another task (its test split) or a data set of the config (all
  its items, e.g. unlabelled slide tiles); condition ``far_<donor>``.
- ``blur``: ``ood.blur.sigmas`` on ``ood.blur.tasks``; condition ``blur_s<sigma>``.
- ``near``: ``ood.near.<task>``, each class held out in turn; condition ``holdout_<class>``.
- ``artefact``: ``ood.artefact.<task>``, classes held out jointly; condition ``artefact``.
- ``image_artefact``: ``ood.image_artefact.specs`` on its tasks; condition = the spec's tag (``pen_seed0``,
  ``jpeg_q20`` ..., :func:`fmaudit.ood.perturb.perturbation_tag`).

A blurred or artefact copy of a data set's test split is a *derived data set* ``<dataset>__<tag>`` (its
manifest made by :func:`fmaudit.ood.perturb.derive_manifest`), embedded through the embedding rule like any
other, so adding one sigma or spec embeds only that copy (:func:`derived_datasets`).

:func:`ood_shard_plan` is everything one (encoder, task) shard needs from the config: its conditions with
their donors and copies, and its settings, so the rule's inputs and params depend on that task alone.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping

import pandas as pd

from fmaudit.grid.studies import parts_with, require_tasks, study_parts, tile_tasks
from fmaudit.io import FmauditInputError
from fmaudit.ood.perturb import perturbation_string, perturbation_tag

DERIVED_SEPARATOR = "__"

#: The tables of one OOD shard, each one parquet file (aggregated across shards into one file each). Declared
#: here, with the plan, so that the workflow's rules name them without importing the jobs (and torch).
SHARD_TABLES = ("detection", "selective", "curves", "blur", "gate", "histograms", "probe_sensitivity",
                "scorer_sensitivity", "slides", "coarsening")
#: The tables of a further-splits job: the probe metrics, slide aggregation, the coarsening controls.
SPLIT_TABLES = ("split_selective", "split_slides", "split_coarsening")
#: Every aggregated OOD table: the stored split's shard tables, then the further splits'.
AGGREGATE_TABLES = SHARD_TABLES + SPLIT_TABLES

__all__ = [
    "AGGREGATE_TABLES",
    "DERIVED_SEPARATOR",
    "EXTRA_KEYS",
    "TIER_KEYS",
    "derived_datasets",
    "ood_blur_runs",
    "ood_gate_runs",
    "ood_image_artefact_runs",
    "ood_runs",
    "ood_shard_plan",
    "ood_shards",
    "ood_split_plan",
    "ood_split_runs",
    "ood_split_shards",
    "SHARD_TABLES",
    "SPLIT_KEYS",
    "SPLIT_PARTS",
    "SPLIT_TABLES",
]


def _perturbation(spec: Mapping[str, Any], where: str) -> tuple[str, str]:
    """(tag, canonical spec string) of a perturbation spec; an error names the config key."""
    try:
        return perturbation_tag(spec), perturbation_string(spec)
    except FmauditInputError as err:
        raise FmauditInputError(f"config {where!r}: {err}") from err


def _image_artefacts(part: Mapping[str, Any], ood: Mapping[str, Any],
                     where: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(tasks, [(tag, spec string)]) of the image-artefact tier."""
    section = ood.get("image_artefact") or {}
    if not section:
        return [], []
    tasks = list(section.get("tasks") or tile_tasks(part))  # cell taxonomies have no tile test split
    require_tasks(part, tasks, f"{where}.image_artefact.tasks")
    specs = [_perturbation(s, f"{where}.image_artefact.specs[{i}]") for i, s in enumerate(section["specs"])]
    tags = [t for t, _ in specs]
    if len(set(tags)) != len(tags):
        raise FmauditInputError(f"config '{where}.image_artefact.specs': two specs make the same artefact ({tags})")
    return tasks, specs


def _far_donor(part: Mapping[str, Any], task: str, donor: str, where: str) -> dict[str, Any]:
    """The far-OOD donor of a task: another task (its test split) or a data set of the config (all items)."""
    if donor == task:
        raise FmauditInputError(f"config '{where}.far.{task}': the donor must be another task or a data set")
    if donor in part["tasks"]:
        return {"kind": "task", "name": donor, "datasets": list(part["tasks"][donor]["datasets"])}
    if donor in part["datasets"]:
        return {"kind": "dataset", "name": donor, "datasets": [donor]}
    raise FmauditInputError(f"config '{where}.far.{task}': unknown donor {donor!r}; a donor is a task "
                            f"({', '.join(part['tasks'])}) or a data set ({', '.join(part['datasets'])})")


def _conditions(part: Mapping[str, Any], ood: Mapping[str, Any], where: str) -> dict[str, list[dict[str, Any]]]:
    """task -> its conditions, each a dict with tier, name and what the tier needs (donor, sigma, tag, spec,
    held_out), in tier order (module doc)."""
    far = ood.get("far") or {}
    require_tasks(part, far, f"{where}.far")
    blur = ood.get("blur") or {}
    require_tasks(part, blur.get("tasks") or [], f"{where}.blur.tasks")
    near = ood.get("near") or {}
    require_tasks(part, near, f"{where}.near")
    artefact = ood.get("artefact") or {}
    require_tasks(part, artefact, f"{where}.artefact")
    artefact_tasks, artefact_specs = _image_artefacts(part, ood, where)
    for key in EXTRA_KEYS:
        require_tasks(part, (ood.get(key) or {}).get("tasks") or [], f"{where}.{key}.tasks")
    out: dict[str, list[dict[str, Any]]] = {}
    for task in tile_tasks(part):
        conds: list[dict[str, Any]] = []
        if task in far:
            donor = _far_donor(part, task, far[task], where)
            conds.append({"tier": "far", "name": f"far_{far[task]}", "donor": donor})
        if task in (blur.get("tasks") or []):
            for s in blur.get("sigmas") or []:
                tag, spec = _perturbation({"kind": "blur", "sigma": float(s)}, f"{where}.blur.sigmas")
                conds.append({"tier": "blur", "name": tag, "sigma": float(s), "tag": tag, "spec": spec})
        conds += [{"tier": "near", "name": f"holdout_{c}", "held_out": [str(c)]} for c in near.get(task) or []]
        if task in artefact:
            conds.append({"tier": "artefact", "name": "artefact", "held_out": [str(c) for c in artefact[task]]})
        if task in artefact_tasks:
            conds += [{"tier": "image_artefact", "name": tag, "tag": tag, "spec": spec} for tag, spec in artefact_specs]
        if conds:
            out[task] = conds
    return out


def _gate_settings(part: Mapping[str, Any], ood: Mapping[str, Any], where: str,
                   conditions: Mapping[str, list[dict[str, Any]]]) -> list[tuple[str, str]]:
    """(task, setting) of the gate: each gated task on its own split, with its artefact classes held out
    (``<task>:artefact``) and, with ``gate.near``, each near class held out (``<task>:holdout_<class>``)."""
    gate = ood.get("gate")
    if not gate:
        return []
    tasks = list(gate.get("tasks") or conditions)
    require_tasks(part, tasks, f"{where}.gate.tasks")
    settings = []
    for t in tasks:
        settings.append((t, t))
        for c in conditions.get(t, []):
            if c["tier"] == "artefact" or (c["tier"] == "near" and gate.get("near")):
                settings.append((t, f"{t}:{c['name']}"))
    return settings


def ood_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Novelty detection (audit paper): encoder × task × OOD condition × scorer. Far, blur and image-artefact
    conditions reuse the task's probe and scorers; near and artefact conditions refit them without the
    held-out classes.

    Parameters
    ----------
    config : Mapping
        The filled config with an ``ood`` block (the tiers of the module doc, ``scorers``).
    dataset_registry : Mapping, optional
        Unused; taken for the common signature of the analyses' run builders.

    Returns
    -------
    DataFrame
        One row per detection, columns ``analysis`` (``ood``), ``encoder``, ``task``, ``tier``, ``condition``,
        ``scorer``.

    Raises
    ------
    FmauditInputError
        When a tier names an unknown task or donor, a perturbation spec is invalid, or two image-artefact specs
        make the same artefact (naming the config key).
    """
    rows = []
    for where, part, ood in parts_with(config, "ood"):
        for task, conds in _conditions(part, ood, where).items():
            for enc, cond, scorer in itertools.product(part["encoders"], conds, ood["scorers"]):
                rows.append({"analysis": "ood", "encoder": enc, "task": task, "tier": cond["tier"],
                             "condition": cond["name"], "scorer": scorer})
    return pd.DataFrame(rows, columns=["analysis", "encoder", "task", "tier", "condition", "scorer"])


def ood_gate_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The abstention gate (audit paper): per encoder, each gated task on its own split, plus each artefact task
    with its artefact classes removed (``setting`` ``<task>:artefact``) and, with ``gate.near``, each near
    class removed (``<task>:holdout_<class>``). It runs in the task's OOD shard.

    Parameters
    ----------
    config : Mapping
        The filled config with an ``ood.gate`` block (``tasks``, ``near``).
    dataset_registry : Mapping, optional
        Unused; taken for the common signature of the analyses' run builders.

    Returns
    -------
    DataFrame
        One row per (encoder, setting), columns ``analysis`` (``ood_gate``), ``encoder``, ``task``, ``setting``.

    Raises
    ------
    FmauditInputError
        When the gate or a tier names an unknown task (naming the config key).
    """
    rows = []
    for where, part, ood in parts_with(config, "ood"):
        settings = _gate_settings(part, ood, where, _conditions(part, ood, where))
        for enc, (task, setting) in itertools.product(part["encoders"], settings):
            rows.append({"analysis": "ood_gate", "encoder": enc, "task": task, "setting": setting})
    return pd.DataFrame(rows, columns=["analysis", "encoder", "task", "setting"])


def ood_blur_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Test splits re-embedded under Gaussian blur (the audit paper's blur tier): encoder × task × data set of the
    task × sigma; one embedding job per (encoder, data set, sigma), shared by the tasks of that data set.

    Parameters
    ----------
    config : Mapping
        The filled config with an ``ood.blur`` block (``tasks``, ``sigmas`` in pixels of the image).
    dataset_registry : Mapping, optional
        Unused; taken for the common signature of the analyses' run builders.

    Returns
    -------
    DataFrame
        Columns ``analysis`` (``ood_blur``), ``encoder``, ``task``, ``dataset``, ``sigma`` (float).

    Raises
    ------
    FmauditInputError
        When ``ood.blur.tasks`` names an unknown task.
    """
    rows = []
    for where, part, ood in parts_with(config, "ood"):
        blur = ood.get("blur") or {}
        require_tasks(part, blur.get("tasks") or [], f"{where}.blur.tasks")
        for enc, task, sigma in itertools.product(part["encoders"], blur.get("tasks") or [], blur.get("sigmas") or []):
            for ds in part["tasks"][task]["datasets"]:
                rows.append({"analysis": "ood_blur", "encoder": enc, "task": task, "dataset": ds,
                             "sigma": float(sigma)})
    return pd.DataFrame(rows, columns=["analysis", "encoder", "task", "dataset", "sigma"])


def ood_image_artefact_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None
                            ) -> pd.DataFrame:
    """Test splits re-embedded with a synthetic image artefact (pen, bubble, fold, exposure, JPEG): encoder ×
    task × data set of the task × artefact spec; one embedding job per (encoder, data set, artefact).

    Parameters
    ----------
    config : Mapping
        The filled config with an ``ood.image_artefact`` block (``tasks``, ``specs``).
    dataset_registry : Mapping, optional
        Unused; taken for the common signature of the analyses' run builders.

    Returns
    -------
    DataFrame
        Columns ``analysis`` (``ood_image_artefact``), ``encoder``, ``task``, ``dataset``, ``condition`` (the spec's
        tag, e.g. ``jpeg_q20``) and ``spec`` (its canonical string).

    Raises
    ------
    FmauditInputError
        When the block names an unknown task, a spec is invalid, or two specs make the same artefact.
    """
    rows = []
    for where, part, ood in parts_with(config, "ood"):
        tasks, specs = _image_artefacts(part, ood, where)
        for enc, task, (tag, spec) in itertools.product(part["encoders"], tasks, specs):
            for ds in part["tasks"][task]["datasets"]:
                rows.append({"analysis": "ood_image_artefact", "encoder": enc, "task": task, "dataset": ds,
                             "condition": tag, "spec": spec})
    return pd.DataFrame(rows, columns=["analysis", "encoder", "task", "dataset", "condition", "spec"])


def ood_shards(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(encoder, task) of every OOD shard job: each task with an OOD condition or a gate, by each encoder of
    its study.

    Parameters
    ----------
    config : Mapping
        The filled config.

    Returns
    -------
    list of (str, str)
        ``(encoder, task)``, tasks in config order, each task's encoders together.

    Raises
    ------
    FmauditInputError
        As :func:`ood_runs`.
    """
    out: list[tuple[str, str]] = []
    for where, part, ood in parts_with(config, "ood"):
        conditions = _conditions(part, ood, where)
        tasks = list(conditions)
        tasks += [t for t, _ in _gate_settings(part, ood, where, conditions) if t not in tasks]
        tasks = [t for t in part["tasks"] if t in tasks]
        out += [(enc, task) for task in tasks for enc in part["encoders"]]
    return out


def derived_datasets(config: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """``{"<dataset>__<tag>": {"dataset", "tag", "spec"}}``: every perturbed copy of a test split the OOD
    conditions need (blur sigmas and image artefacts of each task's data sets), once each.

    Parameters
    ----------
    config : Mapping
        The filled config.

    Returns
    -------
    dict of str to dict
        Derived data-set name -> ``dataset`` (the source data set), ``tag`` (``blur_s2`` ...) and ``spec`` (the
        canonical perturbation string), in first-seen order.

    Raises
    ------
    FmauditInputError
        As :func:`ood_runs`.
    """
    out: dict[str, dict[str, str]] = {}
    for where, part, ood in parts_with(config, "ood"):
        for task, conds in _conditions(part, ood, where).items():
            for cond in conds:
                if "spec" not in cond:
                    continue
                for ds in part["tasks"][task]["datasets"]:
                    out.setdefault(f"{ds}{DERIVED_SEPARATOR}{cond['tag']}",
                                   {"dataset": ds, "tag": cond["tag"], "spec": cond["spec"]})
    return out


#: Keys of the ``ood`` block that declare conditions or the gate (the shard plan resolves them per task).
TIER_KEYS = ("far", "blur", "near", "artefact", "image_artefact", "gate")
#: Keys whose block applies to the tasks it lists (``tasks``; sensitivity: every task when omitted).
EXTRA_KEYS = ("sensitivity", "slides", "coarsening")
#: Keys of the further train/test splits (their own shard job; the stored split's shard does not read them).
SPLIT_KEYS = ("extra_splits",)
#: What the further splits evaluate, in order: the probe metrics of every task, and, where the ``ood`` block
#: declares them for the task, slide aggregation, label coarsening and the task without some classes.
SPLIT_PARTS = ("probe_metrics", "slide_aggregation", "label_coarsening", "without_classes")


def _split_parts(ood: Mapping[str, Any], task: str) -> list[str]:
    parts = ["probe_metrics"]
    if task in ((ood.get("slides") or {}).get("tasks") or []):
        parts.append("slide_aggregation")
    coarse = ood.get("coarsening") or {}
    if task in (coarse.get("tasks") or []):
        parts.append("label_coarsening")
        if coarse.get("without"):
            parts.append("without_classes")
    return parts


def ood_split_shards(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(encoder, task) of every further-splits job: each OOD shard's task when ``ood.extra_splits.seeds`` is not
    empty (the audit paper's five further splits, seeds 0-4).

    Parameters
    ----------
    config : Mapping
        The filled config.

    Returns
    -------
    list of (str, str)
        ``(encoder, task)``, tasks in config order; empty when no study has split seeds.
    """
    out: list[tuple[str, str]] = []
    for _, part, ood in parts_with(config, "ood"):
        if not (ood.get("extra_splits") or {}).get("seeds"):
            continue
        shard_tasks = {t for _, t in ood_shards({**part, "studies": {}})}
        out += [(enc, task) for task in part["tasks"] if task in shard_tasks for enc in part["encoders"]]
    return out


def ood_split_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The further train/test splits of the audit paper (``ood.extra_splits``): encoder x task x part x split seed,
    where the parts are the probe metrics of every OOD task and, where declared for the task, slide aggregation,
    label coarsening and the task without some classes (:data:`SPLIT_PARTS`). The stored split stays the one of
    detection, blur, scorer sensitivity and the gate. One job per (encoder, task) runs every split of it.

    Parameters
    ----------
    config : Mapping
        The filled config (``ood.extra_splits.seeds``; ``ood.slides.tasks`` and ``ood.coarsening`` add parts).
    dataset_registry : Mapping, optional
        Unused; taken for the common signature of the analyses' run builders.

    Returns
    -------
    DataFrame
        Columns ``analysis`` (``ood_splits``), ``encoder``, ``task``, ``part`` (one of :data:`SPLIT_PARTS`),
        ``split_seed`` (int).
    """
    rows = []
    for _, part, ood in parts_with(config, "ood"):
        seeds = list((ood.get("extra_splits") or {}).get("seeds") or [])
        if not seeds:
            continue
        shard_tasks = {t for _, t in ood_shards({**part, "studies": {}})}
        for task in part["tasks"]:
            if task not in shard_tasks:
                continue
            for enc, name, seed in itertools.product(part["encoders"], _split_parts(ood, task), seeds):
                rows.append({"analysis": "ood_splits", "encoder": enc, "task": task, "part": name,
                             "split_seed": int(seed)})
    return pd.DataFrame(rows, columns=["analysis", "encoder", "task", "part", "split_seed"])


def ood_split_plan(config: Mapping[str, Any], task: str) -> dict[str, Any] | None:
    """What the further-splits job of ``task`` needs beyond the task's OOD settings: ``seeds``,
    ``test_fraction`` and the ``parts`` it evaluates; None when the task has no further splits.

    Parameters
    ----------
    config : Mapping
        The filled config.
    task : str
        A task of the config.

    Returns
    -------
    dict or None
        ``{"seeds": list of int, "test_fraction": float, "parts": list of str}``, or None.
    """
    for _, part, ood in parts_with(config, "ood"):
        if task not in part["tasks"]:
            continue
        splits = ood.get("extra_splits") or {}
        if not splits.get("seeds"):
            return None
        return {"seeds": [int(s) for s in splits["seeds"]], "test_fraction": float(splits["test_fraction"]),
                "parts": _split_parts(ood, task)}
    return None


def ood_shard_plan(config: Mapping[str, Any], task: str) -> dict[str, Any]:
    """What the OOD shard of ``task`` needs, and nothing about other tasks (so editing another task's entry
    does not rerun it): ``conditions`` (each with tier and name, and donor, sigma, tag, spec, ``derived`` data
    sets or held_out as its tier needs), ``gate`` (the gate block without ``tasks`` plus the task's
    ``settings``, or None when the task is not gated) and ``settings`` (the rest of the ``ood`` block, the
    sensitivity / slides / coarsening blocks only where they apply to the task, else None).

    Parameters
    ----------
    config : Mapping
        The filled config.
    task : str
        A task of a study part with an ``ood`` block.

    Returns
    -------
    dict
        Keys ``conditions`` (list of dict, tier order), ``gate`` (dict or None) and ``settings`` (dict).

    Raises
    ------
    FmauditInputError
        When no study part with an ``ood`` block holds ``task``, or a tier fails its checks.
    """
    for where, part, ood in parts_with(config, "ood"):
        if task not in part["tasks"]:
            continue
        conditions = _conditions(part, ood, where)
        conds = []
        for cond in conditions.get(task, []):
            cond = dict(cond)
            if "spec" in cond:
                cond["derived"] = [f"{ds}{DERIVED_SEPARATOR}{cond['tag']}" for ds in part["tasks"][task]["datasets"]]
            conds.append(cond)
        gate_settings = [s for t, s in _gate_settings(part, ood, where, conditions) if t == task]
        gate = None
        if gate_settings:
            gate = {k: v for k, v in ood["gate"].items() if k != "tasks"}
            gate["settings"] = gate_settings
        settings = {k: v for k, v in ood.items() if k not in TIER_KEYS + EXTRA_KEYS + SPLIT_KEYS}
        for key in EXTRA_KEYS:
            extra = ood.get(key)
            applies = extra is not None and task in (
                extra.get("tasks") or (tile_tasks(part) if key == "sensitivity" else []))
            settings[key] = {k: v for k, v in extra.items() if k != "tasks"} if applies else None
        return {"conditions": conds, "gate": gate, "settings": settings}
    known = [t for _, part in study_parts(config) for t in part["tasks"]]
    raise FmauditInputError(f"task {task!r} has no OOD section (tasks: {', '.join(known)})")

"""Out-of-distribution detection and the abstention gate (seed 003), declared ahead of their rules: novelty
scorers on OOD conditions by tier (far, blur, near, artefact), the two-threshold gate per task setting, and
the blurred test embeddings the blur tier needs."""

from __future__ import annotations

import itertools
from typing import Any, Mapping

import pandas as pd

from fmaudit.grid.studies import parts_with, require_tasks
from fmaudit.io import FmauditInputError

__all__ = ["ood_blur_runs", "ood_gate_runs", "ood_runs"]


def _ood_conditions(part: Mapping[str, Any], ood: Mapping[str, Any], where: str) -> dict[str, list[tuple[str, str]]]:
    """task -> [(tier, condition)] in seed 003's order: far, blur, near, artefact."""
    conditions: dict[str, list[tuple[str, str]]] = {}
    far = ood.get("far") or {}
    require_tasks(part, list(far) + list(far.values()), f"{where}.far")
    blur = ood.get("blur") or {}
    require_tasks(part, blur.get("tasks") or [], f"{where}.blur.tasks")
    near = ood.get("near") or {}
    require_tasks(part, near, f"{where}.near")
    artefact = ood.get("artefact") or {}
    require_tasks(part, artefact, f"{where}.artefact")
    for task in part["tasks"]:
        conds = []
        if task in far:
            if far[task] == task:
                raise FmauditInputError(f"config '{where}.far.{task}': the donor must be another task")
            conds.append(("far", f"far_{far[task]}"))
        if task in (blur.get("tasks") or []):
            conds += [("blur", f"blur_s{float(s):g}") for s in blur.get("sigmas") or []]
        conds += [("near", f"holdout_{c}") for c in near.get(task) or []]
        if task in artefact:
            conds.append(("artefact", "artefact"))
        if conds:
            conditions[task] = conds
    return conditions


def ood_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Novelty detection (seed 003): encoder × task × OOD condition × scorer. Far and blur conditions reuse the
    task's probe and scorers; near and artefact conditions refit them without the held-out classes."""
    rows = []
    for where, part, ood in parts_with(config, "ood"):
        for task, conds in _ood_conditions(part, ood, where).items():
            for enc, (tier, cond), scorer in itertools.product(part["encoders"], conds, ood["scorers"]):
                rows.append({"analysis": "ood", "encoder": enc, "task": task, "tier": tier, "condition": cond,
                             "scorer": scorer})
    return pd.DataFrame(rows, columns=["analysis", "encoder", "task", "tier", "condition", "scorer"])


def ood_gate_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The abstention gate (seed 003): per encoder, each gated task on its own split, plus each artefact task
    with its artefact classes removed (``setting`` ``<task>:artefact``)."""
    rows = []
    for where, part, ood in parts_with(config, "ood"):
        if not ood.get("gate"):
            continue
        conditions = _ood_conditions(part, ood, where)
        tasks = list(ood["gate"].get("tasks") or conditions)
        require_tasks(part, tasks, f"{where}.gate.tasks")
        settings = [(t, t) for t in tasks]
        settings += [(t, f"{t}:artefact") for t in tasks if t in (ood.get("artefact") or {})]
        for enc, (task, setting) in itertools.product(part["encoders"], settings):
            rows.append({"analysis": "ood_gate", "encoder": enc, "task": task, "setting": setting})
    return pd.DataFrame(rows, columns=["analysis", "encoder", "task", "setting"])


def ood_blur_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Test splits re-embedded under Gaussian blur (seed 003's blur tier): encoder × task × sigma."""
    rows = []
    for where, part, ood in parts_with(config, "ood"):
        blur = ood.get("blur") or {}
        require_tasks(part, blur.get("tasks") or [], f"{where}.blur.tasks")
        for enc, task, sigma in itertools.product(part["encoders"], blur.get("tasks") or [], blur.get("sigmas") or []):
            rows.append({"analysis": "ood_blur", "encoder": enc, "task": task, "sigma": float(sigma)})
    return pd.DataFrame(rows, columns=["analysis", "encoder", "task", "sigma"])

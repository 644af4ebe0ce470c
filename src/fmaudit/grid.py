"""The run grid: a pure function of the config.

A *run* is one probe fit and its evaluation; a *shard* is one Snakemake job that loops over a whole sub-grid
of runs in-process. The same enumeration serves the dry-run summary (``fmaudit grid``), the shard jobs and
the tests, so the counts a user sees before submitting are the runs the jobs execute.

Domains of a task come from the config (``tasks.<t>.domains``), else from the data-set registry
(``domains:`` of each data set), else the task is a single pooled domain ``"all"``: the grid never reads data.

Analyses, what one run is, and the jobs the runs are batched into (a job loops over its runs in-process, so
a paper-scale grid of ~300,000 runs stays a DAG of a few thousand jobs):

- ``embed``: the embedding of one data set by one encoder; a job per (encoder, data set).
- ``probe``: one probe fit, evaluated in-domain and on the task's other domains; a job (``Shard``) per
  (encoder, task).
- ``head_sweep``: one fit of an extra source-only head or logistic C; a job per (encoder, task).
- ``cross_dataset``: one probe fit of a source task evaluated on a target task; a job per (encoder, source
  task, target task).
- ``ood``: one novelty scorer on one OOD condition (far, blur, near or artefact tier); a job per (encoder,
  task), which also runs ``ood_gate``, the two-threshold abstention gate on one task setting.
- ``ood_blur``: the embedding of a task's test split under one blur sigma; a job per (encoder, task).
- ``prior_shift``: one target draw resampled to one class prior, every adaptation method evaluated on it; a
  job per (encoder, source domain, target domain).
- ``cell_features``: one encoder's feature field of one section at one magnification, sampled at the
  nuclei; a job per (encoder, section) reads every magnification.
- ``cells``: one cell-level probe (unit x seed x readout x taxonomy at one magnification and protocol); a
  job per (encoder, magnification, protocol).

Only ``embed`` and ``probe`` have rules today (:data:`RULED_ANALYSES`); the others are *declared*: their config
sections are validated and counted now, and their rules plan exactly these jobs when they land.

Tasks named by ``cells.taxonomies`` are label spaces of cells, not of tiles: they leave the tile probe grid,
and a data set used only by them is not embedded tile-wise.

Combined configs (``studies:``): each study runs its own encoders on its own tasks with its own sections
(``probe``, ``calibration`` ... ``cells``), so a combined config plans exactly the union of its studies' runs
instead of every encoder on every task. Without ``studies`` the whole config is one study.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError

POOLED_DOMAIN = "all"
PROBE_DEFAULTS: dict[str, Any] = {
    "heads": ["logistic"],
    "C": 1.0,
    "fractions": [1.0],
    "seeds": [0],
    "val_fraction": 0.2,
    "standardize": True,
    "readout": "default",
}
CALIBRATION_DEFAULTS: dict[str, Any] = {"ece_bins": 15, "kshot_k": [4, 8, 16, 32, 64], "kshot_draws": 25}
BOOTSTRAP_DEFAULTS: dict[str, Any] = {"n_boot": 1000, "seed": 0}
HEAD_SWEEP_DEFAULTS: dict[str, Any] = {"logistic_C": [1.0], "heads": [], "fractions": [1.0], "seeds": [0]}
OOD_DEFAULTS: dict[str, Any] = {"scorers": ["maha", "knn", "energy", "msp"]}
PRIOR_SHIFT_DEFAULTS: dict[str, Any] = {"seeds": [0], "draws": 25}
CELLS_DEFAULTS: dict[str, Any] = {"magnifications": [20], "readouts": ["nuc", "mean"]}

#: Sections a study may override; a study's own section replaces the top-level one for its tasks.
SETTINGS_SECTIONS = ("probe", "calibration", "bootstrap")
#: Analysis sections declared ahead of their rules; with ``studies`` they live inside a study.
DECLARED_SECTIONS = ("head_sweep", "cross_dataset", "ood", "prior_shift", "cells")
#: Run tables :func:`enumerate_runs` returns, in summary order.
ANALYSES = ("embed", "probe", "head_sweep", "cross_dataset", "ood", "ood_gate", "ood_blur", "prior_shift",
            "cell_features", "cells")
#: Analyses the workflow plans today (their rules exist); update when a rule lands.
RULED_ANALYSES = frozenset({"embed", "probe"})
#: Columns of a run table that name the job it runs in.
JOB_KEYS: dict[str, tuple[str, ...]] = {
    "embed": ("encoder", "dataset"),
    "probe": ("encoder", "task"),
    "head_sweep": ("encoder", "task"),
    "cross_dataset": ("encoder", "source_task", "target_task"),
    "ood": ("encoder", "task"),
    "ood_gate": ("encoder", "task"),
    "ood_blur": ("encoder", "task"),
    "prior_shift": ("encoder", "source_domain", "target_domain"),
    "cell_features": ("encoder", "section"),
    "cells": ("encoder", "magnification", "protocol"),
}
CELL_PROTOCOLS = ("IS", "IOCD", "MOCV", "LOOO")
PROBE_COLUMNS = ["analysis", "encoder", "task", "source_domain", "head", "C", "probe", "fraction", "seed",
                 "n_targets"]
C_HEADS = ("logistic", "linear_svm")  # heads whose fit takes the config's C (a number or a grid)


def probe_variants(probe: Mapping[str, Any]) -> list[tuple[str, float, str]]:
    """(head, C, label) per probe variant: one per head, and one per C value for the heads that take C when
    ``probe.C`` is a list (labels such as ``logistic_C0.01``, so reports keep the variants apart)."""
    cs = probe["C"] if isinstance(probe["C"], (list, tuple)) else [probe["C"]]
    out = []
    for head in probe["heads"]:
        if head not in C_HEADS:
            out.append((head, float("nan"), head))
        else:
            out += [(head, float(c), head if len(cs) == 1 else f"{head}_C{float(c):g}") for c in cs]
    return out

_DEFAULTS = {"probe": PROBE_DEFAULTS, "calibration": CALIBRATION_DEFAULTS, "bootstrap": BOOTSTRAP_DEFAULTS,
             "head_sweep": HEAD_SWEEP_DEFAULTS, "ood": OOD_DEFAULTS, "prior_shift": PRIOR_SHIFT_DEFAULTS,
             "cells": CELLS_DEFAULTS, "cross_dataset": {}}


@dataclass(frozen=True)
class Shard:
    """One analysis job: everything an (analysis, encoder, task) cell needs, and nothing about other encoders."""

    analysis: str
    encoder: str
    task: str


def section(config: Mapping[str, Any], name: str, task: str | None = None) -> dict[str, Any]:
    """A config section with its defaults filled in; with ``task``, the section of the study that holds it."""
    defaults = _DEFAULTS[name]
    source: Mapping[str, Any] = config
    if task is not None:
        study = study_of(config, task)
        if study is not None and name in config["studies"][study]:
            source = config["studies"][study]
    return {**defaults, **dict(source.get(name) or {})}


def task_domains(config: Mapping[str, Any], task: str, dataset_registry: Mapping[str, Any] | None = None) -> list[str]:
    """Domains transfer runs go between, from the config or the data-set registry (see module doc)."""
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


# ---- studies ------------------------------------------------------------------------------------------


def study_of(config: Mapping[str, Any], task: str) -> str | None:
    """The study that holds ``task`` (None without ``studies`` or for a task of no study)."""
    for name, study in (config.get("studies") or {}).items():
        if task in study.get("tasks", ()):
            return name
    return None


def check_studies(config: Mapping[str, Any]) -> None:
    """Every study names encoders, data sets and tasks of the config; each task is in exactly one study and
    every encoder and data set in at least one; analysis sections live inside studies."""
    studies = config.get("studies") or {}
    if not studies:
        return
    for name in DECLARED_SECTIONS:
        if config.get(name):
            raise FmauditInputError(f"config {name!r}: with 'studies', put this section inside the study it belongs to")
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


def _parts(config: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(key prefix for messages, config of one study): the whole config when it has no studies."""
    studies = config.get("studies") or {}
    if not studies:
        return [("", config)]
    check_studies(config)
    parts = []
    for name, study in studies.items():
        part = {k: v for k, v in config.items() if k not in ("studies", *DECLARED_SECTIONS)}
        part["encoders"] = list(study["encoders"])
        part["datasets"] = _study_datasets(config, study)
        part["tasks"] = {t: config["tasks"][t] for t in study["tasks"]}
        for key in (*SETTINGS_SECTIONS, *DECLARED_SECTIONS):
            if key in study:
                part[key] = study[key]
        parts.append((f"studies.{name}.", part))
    return parts


# ---- tile probes ----------------------------------------------------------------------------------------


def cell_tasks(config: Mapping[str, Any]) -> list[str]:
    """Tasks that are cell-level label spaces (``cells.taxonomies``), across studies."""
    out: list[str] = []
    for _, part in _parts(config):
        for task in ((part.get("cells") or {}).get("taxonomies") or {}).values():
            if task not in out:
                out.append(task)
    return out


def _tile_tasks(part: Mapping[str, Any]) -> list[str]:
    cells = set(((part.get("cells") or {}).get("taxonomies") or {}).values())
    return [t for t in part["tasks"] if t not in cells]


def probe_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None,
               encoders: Iterable[str] | None = None, tasks: Iterable[str] | None = None) -> pd.DataFrame:
    """Every probe fit of the tile-level suite: encoder × task × source domain × head × fraction × seed.

    Each fit is evaluated in-domain and, when the task has ``transfer``, on every other domain; the
    ``n_targets`` column says on how many. Cell-level tasks are left out unless named in ``tasks``; with
    ``studies``, each task runs with its study's encoders and ``probe`` section.
    """
    encoders = list(encoders) if encoders is not None else None
    tasks = list(tasks) if tasks is not None else None
    for task in tasks or []:
        task_domains(config, task)  # an unknown task raises, naming the config's tasks
    frames = []
    for _, part in _parts(config):
        part_encoders = [e for e in part["encoders"] if encoders is None or e in encoders]
        part_tasks = _tile_tasks(part) if tasks is None else [t for t in tasks if t in part["tasks"]]
        frames.append(_probe_runs(part, dataset_registry, part_encoders, part_tasks))
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    df["run_id"] = [run_id(r) for r in df.itertuples(index=False)]
    return df


def _probe_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None,
                encoders: list[str], tasks: list[str]) -> pd.DataFrame:
    probe = section(config, "probe")
    rows = []
    for task in tasks:
        domains = task_domains(config, task, dataset_registry)
        transfer = (config["tasks"][task].get("transfer", True)) and len(domains) > 1
        n_targets = len(domains) if transfer else 1
        for enc, src, (head, c, label), frac, seed in itertools.product(
            encoders, domains, probe_variants(probe), probe["fractions"], probe["seeds"]
        ):
            rows.append({
                "analysis": "probe", "encoder": enc, "task": task, "source_domain": src, "head": head,
                "C": c, "probe": label, "fraction": float(frac), "seed": int(seed), "n_targets": n_targets,
            })
    return pd.DataFrame(rows, columns=PROBE_COLUMNS)


def run_id(row: Any) -> str:
    """A readable, unique id of a probe run within its shard."""
    c = "" if pd.isna(row.C) else f"_C{row.C:g}"
    return f"{row.source_domain}__{row.head}{c}__f{row.fraction:g}__s{row.seed}"


def shards(config: Mapping[str, Any]) -> list[Shard]:
    """The analysis jobs the workflow plans: one per (analysis, encoder, task), within each study."""
    return [Shard("probe", enc, task) for _, part in _parts(config)
            for task in _tile_tasks(part) for enc in part["encoders"]]


def embed_pairs(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(encoder, data set) pairs to embed tile-wise: within each study, every encoder on every data set except
    those only cell-level tasks use; a pair shared by two studies is embedded once."""
    pairs: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for _, part in _parts(config):
        tile = set(_tile_tasks(part))
        cell_only = {ds for t, spec in part["tasks"].items() if t not in tile for ds in spec["datasets"]}
        cell_only -= {ds for t in tile for ds in part["tasks"][t]["datasets"]}
        for enc in part["encoders"]:
            for ds in part["datasets"]:
                if ds not in cell_only and (enc, ds) not in seen:
                    seen.add((enc, ds))
                    pairs.append((enc, ds))
    return pairs


# ---- declared analyses --------------------------------------------------------------------------------


def _require_tasks(part: Mapping[str, Any], names: Iterable[str], where: str) -> None:
    for t in names:
        if t not in part["tasks"]:
            raise FmauditInputError(f"config {where!r}: unknown task {t!r} (tasks: {', '.join(part['tasks'])})")


def _require_domains(part: Mapping[str, Any], task: str, wanted: Iterable[str],
                     registry: Mapping[str, Any] | None, where: str) -> list[str]:
    domains = task_domains(part, task, registry)
    for d in wanted:
        if d not in domains:
            raise FmauditInputError(f"config {where!r}: {d!r} is not a domain of task {task!r} ({', '.join(domains)})")
    return domains


def head_sweep_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Extra source-only heads (seed 000's sweep): logistic at each of ``logistic_C`` plus ``heads``, fitted on
    each source domain × fraction × seed and evaluated like the probe grid (``n_targets``)."""
    rows = []
    for prefix, part in _parts(config):
        if not part.get("head_sweep"):
            continue
        sweep = section(part, "head_sweep")
        where = f"{prefix}head_sweep"
        tasks = list(sweep.get("tasks") or _tile_tasks(part))
        _require_tasks(part, tasks, f"{where}.tasks")
        heads = [("logistic", float(c)) for c in sweep["logistic_C"]] + [(h, float("nan")) for h in sweep["heads"]]
        for task in tasks:
            domains = _require_domains(part, task, sweep.get("source_domains") or [], dataset_registry,
                                       f"{where}.source_domains")
            sources = [d for d in domains if d in sweep["source_domains"]] if sweep.get("source_domains") else domains
            transfer = part["tasks"][task].get("transfer", True) and len(domains) > 1
            for enc, src, (head, c), frac, seed in itertools.product(
                part["encoders"], sources, heads, sweep["fractions"], sweep["seeds"]
            ):
                rows.append({"analysis": "head_sweep", "encoder": enc, "task": task, "source_domain": src,
                             "head": head, "C": c, "probe": head if np.isnan(c) else f"{head}_C{c:g}",
                             "fraction": float(frac), "seed": int(seed),
                             "n_targets": len(domains) if transfer else 1})
    df = pd.DataFrame(rows, columns=PROBE_COLUMNS)
    df["run_id"] = [run_id(r) for r in df.itertuples(index=False)]
    return df


def cross_dataset_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Each probe fit of a source task evaluated on the test items of a target task (labels mapped onto the
    source's label space by ``label_map``): PRISM's label-definition pairs. One row per (fit, pair)."""
    frames = []
    for prefix, part in _parts(config):
        pairs = (part.get("cross_dataset") or {}).get("pairs") or []
        for i, pair in enumerate(pairs):
            _require_tasks(part, [pair["source"], pair["target"]], f"{prefix}cross_dataset.pairs[{i}]")
            if pair["source"] == pair["target"]:
                raise FmauditInputError(
                    f"config '{prefix}cross_dataset.pairs[{i}]': source and target are the same task")
            fits = _probe_runs(part, dataset_registry, list(part["encoders"]), [pair["source"]])
            fits = fits.rename(columns={"task": "source_task"}).drop(columns=["n_targets"])
            fits.insert(3, "target_task", pair["target"])
            fits["label_map"] = pair.get("label_map", "")
            fits["analysis"] = "cross_dataset"
            frames.append(fits)
    cols = ["analysis", "encoder", "source_task", "target_task", "source_domain", "head", "C", "fraction", "seed",
            "label_map"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def _ood_conditions(part: Mapping[str, Any], prefix: str) -> dict[str, list[tuple[str, str]]]:
    """task -> [(tier, condition)] in seed 003's order: far, blur, near, artefact."""
    ood = section(part, "ood")
    where = f"{prefix}ood"
    conditions: dict[str, list[tuple[str, str]]] = {}
    far = ood.get("far") or {}
    _require_tasks(part, list(far) + list(far.values()), f"{where}.far")
    blur = ood.get("blur") or {}
    _require_tasks(part, blur.get("tasks") or [], f"{where}.blur.tasks")
    near = ood.get("near") or {}
    _require_tasks(part, near, f"{where}.near")
    artefact = ood.get("artefact") or {}
    _require_tasks(part, artefact, f"{where}.artefact")
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
    for prefix, part in _parts(config):
        if not part.get("ood"):
            continue
        scorers = section(part, "ood")["scorers"]
        for task, conds in _ood_conditions(part, prefix).items():
            for enc, (tier, cond), scorer in itertools.product(part["encoders"], conds, scorers):
                rows.append({"analysis": "ood", "encoder": enc, "task": task, "tier": tier, "condition": cond,
                             "scorer": scorer})
    return pd.DataFrame(rows, columns=["analysis", "encoder", "task", "tier", "condition", "scorer"])


def ood_gate_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The abstention gate (seed 003): per encoder, each gated task on its own split, plus each artefact task
    with its artefact classes removed (``setting`` ``<task>:artefact``)."""
    rows = []
    for prefix, part in _parts(config):
        ood = part.get("ood") or {}
        if not ood.get("gate"):
            continue
        conditions = _ood_conditions(part, prefix)
        tasks = list(ood["gate"].get("tasks") or conditions)
        _require_tasks(part, tasks, f"{prefix}ood.gate.tasks")
        settings = [(t, t) for t in tasks]
        settings += [(t, f"{t}:artefact") for t in tasks if t in (ood.get("artefact") or {})]
        for enc, (task, setting) in itertools.product(part["encoders"], settings):
            rows.append({"analysis": "ood_gate", "encoder": enc, "task": task, "setting": setting})
    return pd.DataFrame(rows, columns=["analysis", "encoder", "task", "setting"])


def ood_blur_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Test splits re-embedded under Gaussian blur (seed 003's blur tier): encoder × task × sigma."""
    rows = []
    for prefix, part in _parts(config):
        blur = (part.get("ood") or {}).get("blur") or {}
        _require_tasks(part, blur.get("tasks") or [], f"{prefix}ood.blur.tasks")
        for enc, task, sigma in itertools.product(part["encoders"], blur.get("tasks") or [], blur.get("sigmas") or []):
            rows.append({"analysis": "ood_blur", "encoder": enc, "task": task, "sigma": float(sigma)})
    return pd.DataFrame(rows, columns=["analysis", "encoder", "task", "sigma"])


def check_priors(priors: Mapping[str, Mapping[str, float]], where: str = "prior_shift.priors") -> None:
    """Each prior is a class -> share mapping over the same classes, shares >= 0 summing to 1."""
    classes = None
    for name, prior in priors.items():
        total = float(sum(prior.values()))
        if not math.isclose(total, 1.0, abs_tol=1e-6) or min(prior.values()) < 0:
            raise FmauditInputError(f"config '{where}.{name}': shares must be >= 0 and sum to 1 (sum {total:g})")
        if classes is None:
            classes = set(prior)
        elif set(prior) != classes:
            raise FmauditInputError(f"config '{where}.{name}': classes {sorted(prior)} differ from {sorted(classes)}")


def prior_shift_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Class-prior shift (seed 000): encoder × source domain × source seed × target domain × prior × draw.
    Every adaptation method is evaluated on each draw, so methods do not multiply runs."""
    frames = []
    for prefix, part in _parts(config):
        if not part.get("prior_shift"):
            continue
        ps = section(part, "prior_shift")
        where = f"{prefix}prior_shift"
        task = ps["task"]
        _require_tasks(part, [task], f"{where}.task")
        check_priors(ps["priors"], f"{where}.priors")
        domains = _require_domains(part, task, ps.get("source_domains") or [], dataset_registry,
                                   f"{where}.source_domains")
        _require_domains(part, task, ps.get("target_domains") or [], dataset_registry, f"{where}.target_domains")
        sources = list(ps.get("source_domains") or domains)
        for src in sources:
            targets = [d for d in (ps.get("target_domains") or domains) if d != src]
            frames.append(_product_frame({
                "encoder": part["encoders"], "source_domain": [src], "seed": [int(s) for s in ps["seeds"]],
                "target_domain": targets, "prior": list(ps["priors"]), "draw": list(range(int(ps["draws"]))),
            }, analysis="prior_shift", task=task))
    cols = ["analysis", "task", "encoder", "source_domain", "seed", "target_domain", "prior", "draw"]
    return _concat(frames, cols)


def _cell_units(cells: Mapping[str, Any], protocol: str, spec: Mapping[str, Any],
                where: str) -> tuple[list[str], list[str]]:
    """(units, organ of each unit) of one cell protocol; see the cells section of the config schema."""
    sections = cells["sections"]
    if protocol == "IS":
        units = [(s, organ) for organ, secs in sections.items() for s in secs]
    elif protocol == "IOCD":
        min_sections = int(spec.get("min_sections_per_organ", 2))
        units = [(s, organ) for organ, secs in sections.items() if len(secs) >= min_sections for s in secs]
    elif protocol == "MOCV":
        units = [(f"fold{i}", "") for i in range(int(spec["folds"]))]
    elif protocol == "LOOO":
        units = [(organ, organ) for organ in sections]
    else:  # the schema lists the protocols; this guards direct callers
        raise FmauditInputError(f"config '{where}': unknown cell protocol {protocol!r} ({', '.join(CELL_PROTOCOLS)})")
    if not units:
        raise FmauditInputError(f"config '{where}': protocol {protocol} has no evaluation unit")
    return [u for u, _ in units], [o for _, o in units]


def _check_cells(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    cells = section(part, "cells")
    _require_tasks(part, cells["taxonomies"].values(), f"{where}.taxonomies")
    seen: dict[str, str] = {}
    for organ, secs in cells["sections"].items():
        for s in secs:
            if s in seen:
                raise FmauditInputError(f"config '{where}.sections.{organ}': section {s!r} is also under {seen[s]!r}")
            seen[s] = organ
    return cells


def cell_feature_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Cell features (CellPath-Bench): each encoder's feature field of each section at each magnification,
    sampled at the registered nuclei once for every readout."""
    frames = []
    for prefix, part in _parts(config):
        if not part.get("cells"):
            continue
        cells = _check_cells(part, f"{prefix}cells")
        sections = [s for secs in cells["sections"].values() for s in secs]
        frames.append(_product_frame({"encoder": part["encoders"], "section": sections,
                                      "magnification": list(cells["magnifications"])}, analysis="cell_features"))
    return _concat(frames, ["analysis", "encoder", "section", "magnification"])


def cell_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Cell-level probes (CellPath-Bench): per protocol, encoder × magnification × taxonomy × readout × seed ×
    evaluation unit (IS: section; IOCD: section of an organ with enough sections; MOCV: fold; LOOO: organ)."""
    frames = []
    for prefix, part in _parts(config):
        if not part.get("cells"):
            continue
        where = f"{prefix}cells"
        cells = _check_cells(part, where)
        for protocol in CELL_PROTOCOLS:
            spec = (cells.get("protocols") or {}).get(protocol)
            if spec is None:
                continue
            units, organs = _cell_units(cells, protocol, spec, f"{where}.protocols.{protocol}")
            frame = _product_frame({
                "encoder": part["encoders"], "magnification": list(cells["magnifications"]),
                "taxonomy": list(cells["taxonomies"]), "readout": list(cells["readouts"]),
                "seed": [int(s) for s in spec["seeds"]], "unit": units,
            }, analysis="cells", protocol=protocol)
            organ_of = dict(zip(units, organs))
            frame["organ"] = frame["unit"].map(organ_of).astype("category")
            frames.append(frame)
    cols = ["analysis", "protocol", "encoder", "magnification", "taxonomy", "readout", "seed", "unit", "organ"]
    return _concat(frames, cols)


def _product_frame(levels: Mapping[str, Sequence[Any]], **constants: Any) -> pd.DataFrame:
    """The Cartesian product of ``levels`` (first level slowest) as a frame, built from integer codes so a
    grid of hundreds of thousands of runs takes milliseconds; string levels become categoricals."""
    sizes = [len(v) for v in levels.values()]
    n = int(np.prod(sizes)) if sizes else 0
    data: dict[str, Any] = {k: pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[v])
                            for k, v in constants.items()}
    inner = n
    for (name, values), size in zip(levels.items(), sizes):
        inner //= max(size, 1)
        codes = np.tile(np.repeat(np.arange(size), inner), n // max(size * inner, 1)) if n else np.array([], int)
        values = list(values)
        if values and all(isinstance(v, str) for v in values):
            data[name] = pd.Categorical.from_codes(codes, categories=list(dict.fromkeys(values))) \
                if len(set(values)) == len(values) else np.asarray(values, dtype=object)[codes]
        else:
            data[name] = np.asarray(values)[codes] if values else np.array([], dtype=object)
    return pd.DataFrame(data)


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    if not frames:
        return pd.DataFrame(columns=columns)
    frames = [f.copy(deep=False) for f in frames]
    for col in columns:
        if all(isinstance(f[col].dtype, pd.CategoricalDtype) for f in frames):
            # one set of categories, or concat would fall back to (slow, large) strings
            union = list(dict.fromkeys(c for f in frames for c in f[col].cat.categories))
            for f in frames:
                f[col] = f[col].cat.set_categories(union)
    return pd.concat(frames, ignore_index=True)[columns]


# ---- the whole grid -----------------------------------------------------------------------------------

_ENUMERATORS = {
    "probe": probe_runs,
    "head_sweep": head_sweep_runs,
    "cross_dataset": cross_dataset_runs,
    "ood": ood_runs,
    "ood_gate": ood_gate_runs,
    "ood_blur": ood_blur_runs,
    "prior_shift": prior_shift_runs,
    "cell_features": cell_feature_runs,
    "cells": cell_runs,
}


def enumerate_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None,
                   analysis: str | None = None) -> pd.DataFrame | dict[str, pd.DataFrame]:
    """The run table of one analysis (see :data:`ANALYSES` and the module doc), or all of them by name.

    ``embed`` rows are (encoder, data set) pairs; the other tables have one row per run and the columns of
    :data:`JOB_KEYS` say which job runs it.
    """
    if analysis is None:
        return {name: enumerate_runs(config, dataset_registry, name) for name in ANALYSES}
    if analysis == "embed":
        pairs = embed_pairs(config)
        return pd.DataFrame({"analysis": "embed", "encoder": [p[0] for p in pairs], "dataset": [p[1] for p in pairs]},
                            columns=["analysis", "encoder", "dataset"])
    if analysis not in _ENUMERATORS:
        raise FmauditInputError(f"unknown analysis {analysis!r}; analyses: {', '.join(ANALYSES)}")
    return _ENUMERATORS[analysis](config, dataset_registry)


def jobs(runs: pd.DataFrame, analysis: str) -> pd.DataFrame:
    """The jobs a run table of ``analysis`` is batched into: its distinct :data:`JOB_KEYS`, in run order."""
    keys = list(JOB_KEYS[analysis])
    if runs.empty:
        return pd.DataFrame(columns=keys)
    return runs[keys].drop_duplicates().reset_index(drop=True).astype(object)


def check_grid(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`FmauditInputError` naming the key of the first bad reference in any analysis section.

    Cheap enough for every dry-run: the cell grid is checked without building its run table."""
    check_studies(config)
    for name in ANALYSES:
        if name not in ("cells", "cell_features"):
            enumerate_runs(config, dataset_registry, name)
    for prefix, part in _parts(config):
        if part.get("cells"):
            cells = _check_cells(part, f"{prefix}cells")
            for protocol, spec in (cells.get("protocols") or {}).items():
                _cell_units(cells, protocol, spec, f"{prefix}cells.protocols.{protocol}")


def summarize(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Runs and jobs by analysis and protocol: what ``fmaudit grid`` prints.

    Each row counts one kind of unit, so ``runs`` do not add up across rows (fits and their evaluations are
    separate rows); ``jobs`` do: a job is counted on one row of its analysis and 0 elsewhere. ``planned`` says
    whether the workflow has rules for it yet (:data:`RULED_ANALYSES`); declared analyses are counted all the same.
    """
    tables = enumerate_runs(config, dataset_registry)
    rows: list[dict[str, Any]] = []

    def add(analysis: str, protocol: str, runs: int, n_jobs: int) -> None:
        rows.append({"analysis": analysis, "protocol": protocol, "runs": int(runs), "jobs": int(n_jobs),
                     "planned": analysis in RULED_ANALYSES})

    n_embed = len(tables["embed"])
    add("embed", "encoder x dataset", n_embed, n_embed)
    probe = tables["probe"]
    single = probe["n_targets"] == 1
    add("probe", "fits (in-domain)", len(probe), len(shards(config)))
    add("probe", "evaluations (source x target)", probe["n_targets"].sum(), 0)
    add("probe", "evaluations: single-domain tasks", probe.loc[single, "n_targets"].sum(), 0)
    add("probe", "evaluations: transfer tasks (source x target)", probe.loc[~single, "n_targets"].sum(), 0)

    sweep = tables["head_sweep"]
    if len(sweep):
        add("head_sweep", "fits (in-domain)", len(sweep), len(jobs(sweep, "head_sweep")))
        add("head_sweep", "evaluations (source x target)", sweep["n_targets"].sum(), 0)
    cross = tables["cross_dataset"]
    if len(cross):
        add("cross_dataset", "evaluations (source task -> target task)", len(cross), len(jobs(cross, "cross_dataset")))
    ood, gate, blur = tables["ood"], tables["ood_gate"], tables["ood_blur"]
    if len(ood) or len(gate):
        ood_jobs = pd.concat([jobs(ood, "ood"), jobs(gate, "ood_gate")]).drop_duplicates()
        add("ood", "detection (condition x scorer)", len(ood), len(ood_jobs))
        if len(gate):
            add("ood", "abstention gate (task setting)", len(gate), 0)
    if len(blur):
        add("ood", "blurred test embeddings (task x sigma)", len(blur), len(jobs(blur, "ood_blur")))
    prior = tables["prior_shift"]
    if len(prior):
        add("prior_shift", "source seed x target x prior x draw", len(prior), len(jobs(prior, "prior_shift")))
    features, cells = tables["cell_features"], tables["cells"]
    if len(features):
        add("cells", "features (section x magnification)", len(features), len(jobs(features, "cell_features")))
    for protocol in CELL_PROTOCOLS:
        sub = cells[cells["protocol"] == protocol] if len(cells) else cells
        if len(sub):
            add("cells", protocol, len(sub), len(jobs(sub, "cells")))
    return pd.DataFrame(rows, columns=["analysis", "protocol", "runs", "jobs", "planned"])

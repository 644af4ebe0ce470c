"""The tile-level probe grid: probe runs and their shards, the embeddings they need, and the two probe-like
declared analyses (``head_sweep``, ``cross_dataset``).

A *run* is one probe fit and its evaluation; a *shard* is one Snakemake job that loops over a whole sub-grid
of runs in-process. Each fit is evaluated in-domain and, when the task has ``transfer``, on every other domain
of the task (``n_targets``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from fmaudit.grid.studies import (
    config_block,
    parts_with,
    probe_encoders,
    require_domains,
    require_tasks,
    study_parts,
    task_domains,
    tile_tasks,
)
from fmaudit.io import FmauditInputError

PROBE_COLUMNS = ["analysis", "encoder", "task", "source_domain", "head", "C", "probe", "fraction", "seed",
                 "n_targets"]
C_HEADS = ("logistic", "linear_svm")  # heads whose fit takes the config's C (a number or a grid)

__all__ = [
    "C_HEADS",
    "PROBE_COLUMNS",
    "Shard",
    "cross_dataset_runs",
    "embed_pairs",
    "embed_runs",
    "head_sweep_runs",
    "probe_runs",
    "probe_variants",
    "run_id",
    "shards",
]


@dataclass(frozen=True)
class Shard:
    """One analysis job: everything an (analysis, encoder, task) cell needs, and nothing about other encoders.

    Attributes
    ----------
    analysis : str
        The analysis the job runs (``probe``).
    encoder : str
        The job's encoder (or declared variant).
    task : str
        The job's tile-level task.
    """

    analysis: str
    encoder: str
    task: str


def probe_variants(probe: Mapping[str, Any]) -> list[tuple[str, float, str]]:
    """(head, C, label) per probe variant: one per head, and one per C value for the heads that take C when
    ``probe.C`` is a list (labels such as ``logistic_C0.01``, so reports keep the variants apart).

    Parameters
    ----------
    probe : Mapping
        The filled ``probe`` block: ``heads`` and ``C`` (a number, or a list of them).

    Returns
    -------
    list of (str, float, str)
        ``(head, C, label)`` in head order then C order; ``C`` is NaN for heads that take none.
    """
    cs = probe["C"] if isinstance(probe["C"], (list, tuple)) else [probe["C"]]
    out = []
    for head in probe["heads"]:
        if head not in C_HEADS:
            out.append((head, float("nan"), head))
        else:
            out += [(head, float(c), head if len(cs) == 1 else f"{head}_C{float(c):g}") for c in cs]
    return out


def _n_targets(part: Mapping[str, Any], task: str, domains: Sequence[str]) -> int:
    """Domains each fit is evaluated on: all of them for a transfer task, else its own."""
    return len(domains) if part["tasks"][task]["transfer"] and len(domains) > 1 else 1


def _fit_rows(analysis: str, encoders: Iterable[str], task: str, sources: Iterable[str],
              variants: Iterable[tuple[str, float, str]], fractions: Iterable[float], seeds: Iterable[int],
              n_targets: int) -> list[dict[str, Any]]:
    return [{"analysis": analysis, "encoder": enc, "task": task, "source_domain": src, "head": head, "C": c,
             "probe": label, "fraction": float(frac), "seed": int(seed), "n_targets": n_targets}
            for enc, src, (head, c, label), frac, seed in itertools.product(
                encoders, sources, list(variants), list(fractions), list(seeds))]


def probe_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None,
               encoders: Iterable[str] | None = None, tasks: Iterable[str] | None = None) -> pd.DataFrame:
    """Every probe fit of the tile-level suite: encoder × task × source domain × head × fraction × seed.

    Each fit is evaluated in-domain and, when the task has ``transfer``, on every other domain; the
    ``n_targets`` column says on how many. Cell-level tasks are left out unless named in ``tasks``; with
    ``studies``, each task runs with its study's encoders and ``probe`` block.

    Parameters
    ----------
    config : Mapping
        The filled config.
    dataset_registry : Mapping, optional
        Data-set slug -> registry entry, for the tasks' domains.
    encoders : iterable of str, optional
        Only these encoders (None: every encoder and declared variant of each study).
    tasks : iterable of str, optional
        Only these tasks (None: every tile-level task).

    Returns
    -------
    DataFrame
        One row per fit, the columns of :data:`PROBE_COLUMNS` (``C`` NaN for heads without one, ``probe`` the
        variant's label) and ``run_id`` (:func:`run_id`).

    Raises
    ------
    FmauditInputError
        When a task of ``tasks`` is not in the config, or a ``probe`` block is missing.
    """
    encoders = list(encoders) if encoders is not None else None
    tasks = list(tasks) if tasks is not None else None
    for task in tasks or []:
        task_domains(config, task)  # an unknown task raises, naming the config's tasks
    frames = []
    for _, part in study_parts(config):
        part_encoders = [e for e in probe_encoders(part) if encoders is None or e in encoders]
        part_tasks = tile_tasks(part) if tasks is None else [t for t in tasks if t in part["tasks"]]
        frames.append(_probe_runs(part, dataset_registry, part_encoders, part_tasks))
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    df["run_id"] = [run_id(r) for r in df.itertuples(index=False)]
    return df


def _probe_runs(part: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None,
                encoders: list[str], tasks: list[str]) -> pd.DataFrame:
    probe = config_block(part, "probe")
    rows = []
    for task in tasks:
        domains = task_domains(part, task, dataset_registry)
        rows += _fit_rows("probe", encoders, task, domains, probe_variants(probe), probe["fractions"],
                          probe["seeds"], _n_targets(part, task, domains))
    return pd.DataFrame(rows, columns=PROBE_COLUMNS)


def run_id(row: Any) -> str:
    """A readable, unique id of a probe run within its shard.

    Parameters
    ----------
    row : namedtuple
        A row of a probe run table (``itertuples``) with ``source_domain``, ``head``, ``C``, ``fraction``, ``seed``.

    Returns
    -------
    str
        ``<source_domain>__<head>[_C<C>]__f<fraction>__s<seed>``, e.g. ``scanner-a__logistic_C1__f0.1__s0``.
    """
    c = "" if pd.isna(row.C) else f"_C{row.C:g}"
    return f"{row.source_domain}__{row.head}{c}__f{row.fraction:g}__s{row.seed}"


def shards(config: Mapping[str, Any]) -> list[Shard]:
    """The analysis jobs the workflow plans: one per (analysis, encoder, task), within each study.

    Parameters
    ----------
    config : Mapping
        The filled config.

    Returns
    -------
    list of Shard
        Study by study, task by task, then encoder (declared variants after their bases).
    """
    return [Shard("probe", enc, task) for _, part in study_parts(config)
            for task in tile_tasks(part) for enc in probe_encoders(part)]


def embed_pairs(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(encoder, data set) pairs to embed tile-wise: within each study, every encoder (and declared variant of
    one, :func:`~fmaudit.grid.studies.probe_encoders`) on every data set except those only cell-level tasks
    use; a pair shared by two studies is embedded once.

    Parameters
    ----------
    config : Mapping
        The filled config.

    Returns
    -------
    list of (str, str)
        ``(encoder, dataset)`` in study, encoder, data-set order, each once.
    """
    pairs: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for _, part in study_parts(config):
        tile = set(tile_tasks(part))
        cell_only = {ds for t, spec in part["tasks"].items() if t not in tile for ds in spec["datasets"]}
        cell_only -= {ds for t in tile for ds in part["tasks"][t]["datasets"]}
        for enc in probe_encoders(part):
            for ds in part["datasets"]:
                if ds not in cell_only and (enc, ds) not in seen:
                    seen.add((enc, ds))
                    pairs.append((enc, ds))
    return pairs


def embed_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The embedding table: one row per (encoder, data set) pair of :func:`embed_pairs`.

    Parameters
    ----------
    config : Mapping
        The filled config.
    dataset_registry : Mapping, optional
        Unused; taken for the common signature of the analyses' run builders.

    Returns
    -------
    DataFrame
        Columns ``analysis`` (``embed``), ``encoder``, ``dataset``.
    """
    pairs = embed_pairs(config)
    return pd.DataFrame({"analysis": "embed", "encoder": [p[0] for p in pairs], "dataset": [p[1] for p in pairs]},
                        columns=["analysis", "encoder", "dataset"])


def head_sweep_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Extra source-only heads (the hema paper's sweep): logistic at each of ``logistic_C`` plus ``heads``, fitted on
    each source domain × fraction × seed and evaluated like the probe grid (``n_targets``).

    Parameters
    ----------
    config : Mapping
        The filled config (``head_sweep`` blocks: ``tasks``, ``logistic_C``, ``heads``, ``source_domains``,
        ``fractions``, ``seeds``).
    dataset_registry : Mapping, optional
        Data-set slug -> registry entry, for the tasks' domains.

    Returns
    -------
    DataFrame
        One row per fit, the columns of :data:`PROBE_COLUMNS` (``analysis`` = ``head_sweep``) and ``run_id``.

    Raises
    ------
    FmauditInputError
        When the block names an unknown task or a source domain the task lacks.
    """
    rows = []
    for where, part, sweep in parts_with(config, "head_sweep"):
        tasks = list(sweep.get("tasks") or tile_tasks(part))
        require_tasks(part, tasks, f"{where}.tasks")
        variants = [("logistic", float(c), f"logistic_C{float(c):g}") for c in sweep["logistic_C"]]
        variants += [(h, float("nan"), h) for h in sweep["heads"]]
        wanted = sweep.get("source_domains") or []
        for task in tasks:
            domains = require_domains(part, task, wanted, dataset_registry, f"{where}.source_domains")
            sources = [d for d in domains if d in wanted] if wanted else domains
            rows += _fit_rows("head_sweep", part["encoders"], task, sources, variants, sweep["fractions"],
                              sweep["seeds"], _n_targets(part, task, domains))
    df = pd.DataFrame(rows, columns=PROBE_COLUMNS)
    df["run_id"] = [run_id(r) for r in df.itertuples(index=False)]
    return df


def cross_dataset_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Each probe fit of a source task evaluated on the test items of a target task (labels mapped onto the
    source's label space by ``label_map``): PRISM's label-definition pairs. One row per (fit, pair).

    Parameters
    ----------
    config : Mapping
        The filled config (``cross_dataset.pairs``: ``source``, ``target``, optional ``label_map``).
    dataset_registry : Mapping, optional
        Data-set slug -> registry entry, for the source task's domains.

    Returns
    -------
    DataFrame
        Columns ``analysis`` (``cross_dataset``), ``encoder``, ``source_task``, ``target_task``,
        ``source_domain``, ``head``, ``C``, ``fraction``, ``seed``, ``label_map`` (empty: no mapping).

    Raises
    ------
    FmauditInputError
        When a pair names an unknown task, or the same task as source and target.
    """
    frames = []
    for prefix, part in study_parts(config):
        pairs = (part.get("cross_dataset") or {}).get("pairs") or []
        for i, pair in enumerate(pairs):
            require_tasks(part, [pair["source"], pair["target"]], f"{prefix}cross_dataset.pairs[{i}]")
            if pair["source"] == pair["target"]:
                raise FmauditInputError(
                    f"config '{prefix}cross_dataset.pairs[{i}]': source and target are the same task")
            fits = _probe_runs(part, dataset_registry, list(part["encoders"]), [pair["source"]])
            fits = fits.rename(columns={"task": "source_task"}).drop(columns=["n_targets"])
            fits.insert(3, "target_task", pair["target"])
            fits["label_map"] = pair.get("label_map", "")  # optional in the schema: no mapping
            fits["analysis"] = "cross_dataset"
            frames.append(fits)
    cols = ["analysis", "encoder", "source_task", "target_task", "source_domain", "head", "C", "fraction", "seed",
            "label_map"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)

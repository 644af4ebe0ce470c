"""Jobs of the prior-shift rules (hema paper): one (encoder, source domain, target domain) shard of resampled
target draws with every label-free adaptation method, the aggregation of all shards, and the ResNet-18 trained
from scratch on one source domain (the non-frozen reference row).

Pools (the same for the shards and the scratch reference, so their numbers compare):

- source pool: the labelled items of the source domain in its ``train`` and ``val`` splits (its test split
  stays out); each source seed draws its own group-disjoint hold-out of ``prior_shift.val_fraction`` of it.
- target pool: the labelled items of the target domain, every split (``prior_shift.target_pool: all``; the
  target is never trained on) or only its ``test`` split (``test``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping as MappingABC
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit import grid
from fmaudit.datasets.manifest import label_names
from fmaudit.io import FmauditInputError, dataframe_hash, provenance, read_npz_provenance, read_table, write_table
from fmaudit.jobs.probe import load_task_data
from fmaudit.logs import setup_logging

__all__ = ["SOURCE_SPLITS", "aggregate_prior_shift_job", "pool_index", "prior_shift_shard_job", "scratch_reference_job"]

#: Splits of the source domain a probe (or the scratch network) may learn from.
SOURCE_SPLITS = ("train", "val")


def pool_index(domains: np.ndarray, splits: np.ndarray, domain: str, role: str, target_pool: str = "all") -> np.ndarray:
    """Rows of the source pool (``role="source"``) or the target pool (``role="target"``) of ``domain``.

    Parameters
    ----------
    domains : ndarray of str, shape (n_items,)
        The domain of each item of the task.
    splits : ndarray of str, shape (n_items,)
        The split (``train``, ``val``, ``test``) of each item.
    domain : str
        The pool's domain.
    role : str
        ``source`` (splits ``train`` and ``val``, :data:`SOURCE_SPLITS`) or ``target``.
    target_pool : str
        For a target pool: ``all`` (every split) or ``test`` (its test split only).

    Returns
    -------
    ndarray of int
        Row indices into ``domains``, ascending.

    Raises
    ------
    FmauditInputError
        When ``target_pool`` is neither ``all`` nor ``test``, or the pool is empty.
    """
    in_domain = domains == domain
    if role == "source":
        keep = in_domain & np.isin(splits, SOURCE_SPLITS)
    elif target_pool == "all":
        keep = in_domain
    elif target_pool == "test":
        keep = in_domain & (splits == "test")
    else:
        raise FmauditInputError(f"prior_shift.target_pool: expected 'all' or 'test', got {target_pool!r}")
    idx = np.flatnonzero(keep)
    if idx.size == 0:
        what = f"splits {', '.join(SOURCE_SPLITS)}" if role == "source" else f"target pool {target_pool!r}"
        raise FmauditInputError(f"{role} domain {domain!r}: no labelled items in its {what}")
    return idx


def _job_runs(encoder: str, task: str, task_spec: Mapping[str, Any], prior_shift: Mapping[str, Any],
              source_domain: str, target_domain: str) -> pd.DataFrame:
    """This job's rows of :func:`fmaudit.grid.prior_shift_runs` (the grid is the one source of what runs)."""
    shard_config = {"encoders": [encoder], "tasks": {task: dict(task_spec)}, "prior_shift": dict(prior_shift)}
    runs = grid.prior_shift_runs(shard_config)
    runs = runs[(runs["source_domain"].astype(str) == source_domain)
                & (runs["target_domain"].astype(str) == target_domain)]
    if runs.empty:
        raise FmauditInputError(f"prior_shift: ({source_domain} -> {target_domain}) is not a (source, target) pair "
                                f"of task {task!r}'s prior-shift grid")
    return runs.reset_index(drop=True)


def prior_shift_shard_job(encoder: str, task: str, task_spec: Mapping[str, Any], source_domain: str,
                          target_domain: str, manifests: Sequence[str], embeddings: Sequence[str],
                          prior_shift: Mapping[str, Any], calibration: Mapping[str, Any], readout: str,
                          out_runs: str, out_pool: str, log: str | None = None) -> None:
    """Every prior-shift run of one (encoder, source domain, target domain), and its pool rows.

    Parameters
    ----------
    encoder : str
        The job's encoder.
    task : str
        The prior-shift task.
    task_spec : Mapping
        The task's config entry with its resolved ``domains`` and ``split``.
    source_domain : str
        The domain the probe is trained on (its source pool, module doc).
    target_domain : str
        The domain resampled to each prior (its target pool).
    manifests : sequence of str
        The manifest files of the task's data sets.
    embeddings : sequence of str
        The encoder's embeddings file of each manifest, in the same order.
    prior_shift : Mapping
        The task's filled ``prior_shift`` block (``priors``, ``methods``, ``sample_size``, ``C``,
        ``val_fraction``, ``target_pool``, ``shot_im``, seeds and draws).
    calibration : Mapping
        The task's ``calibration`` block; only ``ece_bins`` is read.
    readout : str
        The embedding readout (the probe grid's, resolved for this encoder).
    out_runs : str
        The run rows to write: one per run (seed x prior x draw) x adaptation method.
    out_pool : str
        The pool rows to write (what each source and target pool held).
    log : str, optional
        Log file; None logs to stderr.

    Raises
    ------
    FmauditInputError
        When (source, target) is not a pair of the task's prior-shift grid, a pool has no labelled item, or
        ``target_pool`` is neither ``all`` nor ``test``.
    """
    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.analyses.prior_shift import run_prior_shift_job

    logger = setup_logging(log)
    runs = _job_runs(encoder, task, task_spec, prior_shift, source_domain, target_domain)
    mans = [read_table(p) for p in manifests]
    data = load_task_data(task, task_spec, mans, embeddings, readout)
    src = pool_index(data.domains, data.splits, source_domain, "source")
    tgt = pool_index(data.domains, data.splits, target_domain, "target", prior_shift["target_pool"])
    methods = list(prior_shift["methods"])
    logger.info("%s × %s: %s -> %s, %d runs x %d methods; source pool %d items, target pool %d items "
                "(%d features, readout %s)", encoder, task, source_domain, target_domain, len(runs),
                len(set(methods) | {"none"}), src.size, tgt.size, data.features.shape[1], readout)
    start = time.perf_counter()
    result = run_prior_shift_job(
        runs, data.features[src], data.labels[src], data.features[tgt], data.labels[tgt], prior_shift["priors"],
        data.class_names, int(prior_shift["sample_size"]), methods, source_groups=data.groups[src],
        C=float(prior_shift["C"]), val_fraction=float(prior_shift["val_fraction"]),
        n_bins=int(calibration["ece_bins"]), shot_im=dict(prior_shift["shot_im"]), device="auto")
    elapsed = time.perf_counter() - start
    # runs/s of the whole job (probe fits included): what benchmarks/bench_prior_shift.py measures per shard
    logger.info("%d runs in %.1f s: %.1f runs/s", len(runs), elapsed, len(runs) / max(elapsed, 1e-9))
    prov = provenance(encoder=encoder, task=task, source_domain=source_domain, target_domain=target_domain,
                      embeddings={p: read_npz_provenance(p).get("encoder_config_hash") for p in embeddings},
                      manifests={p: dataframe_hash(m) for p, m in zip(manifests, mans)},
                      seconds=round(elapsed, 3), runs_per_second=round(len(runs) / max(elapsed, 1e-9), 3))
    write_table(out_pool, result.pool, provenance=prov)
    write_table(out_runs, result.rows, provenance=prov)
    logger.info("wrote %d run x method rows and %d pool rows", len(result.rows), len(result.pool))


def aggregate_prior_shift_job(runs: Sequence[str], pools: Sequence[str], scratch: Sequence[str], out_runs: str,
                              out_pool: str, out_scratch: str, log: str | None = None) -> None:
    """Concatenate the shard rows, the pool rows and the scratch-reference rows of every job, one table each.

    Parameters
    ----------
    runs : sequence of str
        The shards' run-row tables.
    pools : sequence of str
        The shards' pool tables.
    scratch : sequence of str
        The scratch-reference jobs' tables (empty when the reference is not enabled).
    out_runs : str
        The aggregated run rows to write.
    out_pool : str
        The aggregated pool rows to write.
    out_scratch : str
        The aggregated scratch-reference rows to write (an empty table when there are none).
    log : str, optional
        Log file; None logs to stderr.
    """
    logger = setup_logging(log)
    for files, out, what in ((runs, out_runs, "run x method"), (pools, out_pool, "pool"),
                             (scratch, out_scratch, "scratch-reference")):
        frames = [read_table(p) for p in files]
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        write_table(out, df, provenance=provenance(shards=[str(p) for p in files]))
        logger.info("aggregated %d %s rows from %d files", len(df), what, len(files))


class _LazyImages(MappingABC):
    """target domain -> (images, labels), read when asked for: one target's images in memory at a time."""

    def __init__(self, read, targets: Mapping[str, np.ndarray], labels: np.ndarray):
        self._read, self._targets, self._labels = read, dict(targets), labels

    def __getitem__(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        rows = self._targets[name]
        return self._read(rows), self._labels[rows]

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)


def read_images(manifest: pd.DataFrame, rows: np.ndarray, size: int) -> np.ndarray:
    """The manifest rows' images (files or slide tiles, :class:`fmaudit.embed.ItemDataset`), each resized to
    ``size`` x ``size`` (bilinear, whole image), as one (N, size, size, 3) uint8 array.

    Parameters
    ----------
    manifest : DataFrame
        A manifest (``path`` and, for slide tiles, the tile's coordinates).
    rows : ndarray of int
        Positions (``iloc``) of the items to read.
    size : int
        Side of the output images in pixels.

    Returns
    -------
    ndarray of uint8, shape (len(rows), size, size, 3)
        RGB images in the order of ``rows``.
    """
    from PIL import Image

    # imported here: torch and PIL load only when this runs
    from fmaudit.embed import ItemDataset

    items = ItemDataset(manifest.iloc[rows].reset_index(drop=True), transform=None)
    out = np.empty((len(rows), size, size, 3), dtype=np.uint8)
    try:
        for i in range(len(rows)):
            out[i] = np.asarray(items.load_image(i).resize((size, size), Image.BILINEAR))
    finally:
        items.close()
    return out


def scratch_reference_job(task: str, task_spec: Mapping[str, Any], source_domain: str, target_domains: Sequence[str],
                          seed: int, manifests: Sequence[str], target_pool: str, val_fraction: float,
                          settings: Mapping[str, Any], ece_bins: int, out: str, threads: int = 1,
                          log: str | None = None) -> None:
    """Train the hema paper's ResNet-18 from scratch on the source pool of ``source_domain`` (source split ``seed``, the
    hold-out ``val_fraction`` of it, as the prior-shift shards draw it) and score it on the hold-out and on the
    target pool of each of ``target_domains``. ``settings``: ``prior_shift.scratch_reference``.

    Parameters
    ----------
    task : str
        The prior-shift task.
    task_spec : Mapping
        The task's config entry with its resolved ``domains``.
    source_domain : str
        The domain the network is trained on.
    target_domains : sequence of str
        The domains it is scored on besides the hold-out.
    seed : int
        The source split seed (the hold-out draw and the network's initialisation).
    manifests : sequence of str
        The manifest files of the task's data sets.
    target_pool : str
        ``all`` or ``test`` (``prior_shift.target_pool``).
    val_fraction : float
        Share of the source pool's groups held out (``prior_shift.val_fraction``).
    settings : Mapping
        ``prior_shift.scratch_reference``: ``input_size`` (pixels), ``epochs``, ``lr``, ``batch_size``,
        ``weight_decay``.
    ece_bins : int
        The task's ``calibration.ece_bins``.
    out : str
        The table to write: one row per ``target_domain`` (``in_domain`` marks the source hold-out), with
        ``task``, ``macro_f1``, ``balanced_accuracy``, ``ece_raw`` and ``ece_source_t`` (ECE without and with the
        source temperature), ``ece_convention`` and ``input_size``.
    threads : int
        Torch threads.
    log : str, optional
        Log file; None logs to stderr.

    Raises
    ------
    FmauditInputError
        When the task has no labelled item in its domains, or a pool is empty.
    """
    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.adapt.scratch import evaluate_scratch
    from fmaudit.devices import job_threads

    logger = setup_logging(log)
    job_threads(threads)
    mans = [read_table(p) for p in manifests]
    man = pd.concat([m[m["label"].notna()] for m in mans], ignore_index=True)
    domains = list(task_spec.get("domains") or [])
    if domains and domains != [grid.POOLED_DOMAIN]:
        man = man[man["domain"].astype(str).isin(domains)].reset_index(drop=True)
    if man.empty:
        raise FmauditInputError(f"task {task!r}: no labelled items in {', '.join(manifests)}")
    names = label_names(man)
    labels = man["label"].astype(int).to_numpy()
    dom, splits = man["domain"].astype(str).to_numpy(), man["split"].astype(str).to_numpy()
    src = pool_index(dom, splits, source_domain, "source")
    pools = {t: pool_index(dom, splits, t, "target", target_pool) for t in target_domains}
    size = int(settings["input_size"])
    logger.info("ResNet-18 from scratch, %s source %s seed %d: %d source images, targets %s, %d px, %d epochs",
                task, source_domain, seed, src.size, {t: int(i.size) for t, i in pools.items()}, size,
                int(settings["epochs"]))
    start = time.perf_counter()
    images = read_images(man, src, size)
    rows = evaluate_scratch(images, labels[src], _LazyImages(lambda r: read_images(man, r, size), pools, labels),
                            names, source_domain=source_domain, val_fraction=float(val_fraction),
                            random_state=int(seed), n_bins=int(ece_bins),
                            source_groups=man["group"].astype(str).to_numpy()[src], epochs=int(settings["epochs"]),
                            lr=float(settings["lr"]), batch_size=int(settings["batch_size"]),
                            weight_decay=float(settings["weight_decay"]), device="auto")
    rows.insert(0, "task", task)
    rows["input_size"] = size
    elapsed = time.perf_counter() - start
    write_table(out, rows, provenance=provenance(task=task, source_domain=source_domain, seed=int(seed),
                                                 settings=dict(settings), seconds=round(elapsed, 3),
                                                 manifests={p: dataframe_hash(m) for p, m in zip(manifests, mans)}))
    logger.info("trained and scored in %.1f s: in-domain macro-F1 %.3f", elapsed,
                float(rows.loc[rows["in_domain"], "macro_f1"].iloc[0]))

"""Jobs of the probe rules: one (encoder, task) shard of the probe suite, and the aggregation of every shard."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit import grid
from fmaudit.analyses.task_data import TaskData, assemble_task_data
from fmaudit.io import dataframe_hash, provenance, read_npz_provenance, read_table, write_table
from fmaudit.logs import setup_logging

__all__ = ["aggregate_job", "load_task_data", "probe_shard_job"]


def load_task_data(task: str, task_spec: Mapping[str, Any], manifests: Sequence[pd.DataFrame],
                   embeddings: Sequence[str], readout: str) -> TaskData:
    """A task's manifests and one encoder's embeddings of them (checked by ``read_embeddings``) as a TaskData,
    split as the task says (``task_spec["split"]``).

    Parameters
    ----------
    task : str
        The task's name (for messages).
    task_spec : Mapping
        The task's config entry: ``domains`` (None: all) and ``split`` (a key of
        :data:`fmaudit.analyses.task_data.SPLIT_COLUMNS`).
    manifests : sequence of DataFrame
        The manifests of the task's data sets, in the order of ``embeddings``.
    embeddings : sequence of str
        One embeddings file per manifest, all of the same encoder.
    readout : str
        The readout to read from each file (``cls``, ``mean`` ...).

    Returns
    -------
    TaskData
        The task's labelled items of its domains, row i of every array the same item.

    Raises
    ------
    FmauditInputError
        When an embedding's item ids do not match its manifest, or the split is unknown.
    """
    # imported here: torch and PIL load only when this runs
    from fmaudit.embed import read_embeddings

    feats = [read_embeddings(p, readout) for p in embeddings]
    return assemble_task_data(manifests, feats, task=task, domains=task_spec.get("domains"), sources=list(embeddings),
                              split=task_spec["split"])


def probe_shard_job(encoder: str, task: str, task_spec: Mapping[str, Any], manifests: Sequence[str],
                    embeddings: Sequence[str], probe: Mapping[str, Any], calibration: Mapping[str, Any],
                    bootstrap: Mapping[str, Any], out_runs: str, out_predictions: str, log: str | None = None,
                    threads: int = 1) -> None:
    """Every probe run of one (encoder, task): ``task_spec`` is the task's config entry with its resolved
    domains; ``probe``, ``calibration``, ``bootstrap`` are the task's (filled) config blocks, the probe's
    ``readout`` resolved to a readout of the encoder.

    Parameters
    ----------
    encoder : str
        The shard's encoder.
    task : str
        The shard's task.
    task_spec : Mapping
        The task's config entry, ``domains`` resolved, with ``split`` and ``transfer`` (evaluate on every other
        domain too).
    manifests : sequence of str
        The manifest files of the task's data sets.
    embeddings : sequence of str
        The encoder's embeddings file of each manifest, in the same order.
    probe : Mapping
        The filled ``probe`` block (heads, C, fractions, seeds, ``readout`` resolved to one of the encoder's).
    calibration : Mapping
        The filled ``calibration`` block (``ece_bins``, K-shot settings, validation labels).
    bootstrap : Mapping
        The filled ``bootstrap`` block (``n_boot``, ``seed``).
    out_runs : str
        The metric rows to write: one per run x target domain x calibration stage.
    out_predictions : str
        The predictions to write: one per run x target item, raw logits and the source temperature.
    log : str, optional
        Log file; None logs to stderr.
    threads : int, default 1
        The job's cores (the rule's ``threads``): torch's threads; on CPU the probe suite splits a large
        logistic grid's problems over that many processes (:func:`fmaudit.probes.pool.shared_pool`). A
        Snakemake ``script:`` job is not limited to its threads otherwise.
    """
    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.analyses.probe_suite import run_probe_suite
    from fmaudit.devices import job_threads

    logger = setup_logging(log)
    job_threads(threads)
    mans = [read_table(p) for p in manifests]
    data = load_task_data(task, task_spec, mans, embeddings, probe["readout"])
    shard_config = {"encoders": [encoder], "tasks": {task: dict(task_spec)}, "probe": dict(probe)}
    runs = grid.probe_runs(shard_config)
    logger.info("%s × %s: %d runs on %d items (%d features, %d classes)", encoder, task, len(runs),
                len(data.labels), data.features.shape[1], data.n_classes)
    rows, preds = run_probe_suite(data, runs, probe, calibration, bootstrap, transfer=bool(task_spec["transfer"]))
    prov = provenance(encoder=encoder, task=task,
                      embeddings={p: read_npz_provenance(p).get("encoder_config_hash") for p in embeddings},
                      manifests={p: dataframe_hash(m) for p, m in zip(manifests, mans)})
    write_table(out_predictions, preds, provenance=prov)
    write_table(out_runs, rows, provenance=prov)
    logger.info("wrote %d metric rows and %d predictions", len(rows), len(preds))


def aggregate_job(run_files: Sequence[str], out: str, log: str | None = None) -> None:
    """Concatenate the metric rows of every shard into one table.

    Parameters
    ----------
    run_files : sequence of str
        The metric-row tables of the shards; none gives an empty table.
    out : str
        The table to write, with the shard files in its provenance.
    log : str, optional
        Log file; None logs to stderr.
    """
    logger = setup_logging(log)
    frames = [read_table(p) for p in run_files]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    write_table(out, df, provenance=provenance(shards=[str(p) for p in run_files]))
    logger.info("aggregated %d rows from %d shards", len(df), len(run_files))

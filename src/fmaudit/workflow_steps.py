"""File-level steps of the workflow: read inputs, call the library, write outputs atomically.

The Snakemake script adapters and the command line both call these, so the two faces give the same numbers.
Nothing here imports snakemake.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit import grid
from fmaudit.analyses.task_data import assemble_task_data
from fmaudit.datasets import prepare_dataset
from fmaudit.io import dataframe_hash, provenance, read_npz_provenance, read_table, write_table
from fmaudit.logs import setup_logging

log = logging.getLogger(__name__)


def prepare_manifest_step(dataset: str, entry: Mapping[str, Any], data_root: str, out: str, log: str | None = None) -> None:
    logger = setup_logging(log)
    manifest = prepare_dataset(dataset, entry["preparer"], data_root, entry.get("params") or {})
    prov = provenance(dataset=dataset, preparer=entry["preparer"], params=entry.get("params") or {},
                      manifest_hash=dataframe_hash(manifest), preparation=manifest.attrs.get("provenance", {}))
    write_table(out, manifest, provenance=prov)
    logger.info("manifest of %s: %d items, %d labelled, domains %s", dataset, len(manifest),
                int(manifest["label"].notna().sum()), sorted(manifest["domain"].unique()))


def embed_step(encoder: str, spec: Mapping[str, Any], manifest: str, out: str, weights: str | None = None,
               batch_size: int = 64, threads: int = 1, log: str | None = None) -> None:
    from fmaudit.embed import embed_manifest

    logger = setup_logging(log)
    man = read_table(manifest)
    spec = dict(spec)
    spec.setdefault("name", encoder)
    logger.info("embedding %d items of %s with %s", len(man), manifest, encoder)
    # GPU jobs decode images in worker processes while the GPU computes; on CPU the workers would only
    # compete with the model for the same cores
    workers = max(0, int(threads) - 1) if spec.get("gpu", False) else 0
    embed_manifest(man, spec, out, batch_size=batch_size, num_workers=workers, num_threads=int(threads),
                   weights_path=weights, log=logger)


def load_task_data(task: str, task_spec: Mapping[str, Any], manifests: Sequence[pd.DataFrame],
                   embeddings: Sequence[str], readout: str):
    """A task's manifests and one encoder's embeddings of them (checked by ``read_embeddings``) as a TaskData."""
    from fmaudit.embed import read_embeddings

    feats = [read_embeddings(p, readout) for p in embeddings]
    return assemble_task_data(manifests, feats, task=task, domains=task_spec.get("domains"), sources=list(embeddings))


def probe_shard_step(encoder: str, task: str, task_spec: Mapping[str, Any], manifests: Sequence[str],
                     embeddings: Sequence[str], probe: Mapping[str, Any], calibration: Mapping[str, Any],
                     bootstrap: Mapping[str, Any], out_runs: str, out_predictions: str, log: str | None = None) -> None:
    from fmaudit.analyses.probe_suite import run_probe_suite

    logger = setup_logging(log)
    mans = [read_table(p) for p in manifests]
    data = load_task_data(task, task_spec, mans, embeddings, probe.get("readout", "cls"))
    shard_config = {"encoders": [encoder], "tasks": {task: dict(task_spec)}, "probe": dict(probe)}
    runs = grid.probe_runs(shard_config)
    logger.info("%s × %s: %d runs on %d items (%d features, %d classes)", encoder, task, len(runs),
                len(data.labels), data.features.shape[1], data.n_classes)
    rows, preds = run_probe_suite(data, runs, probe, calibration, bootstrap,
                                  transfer=bool(task_spec.get("transfer", True)))
    prov = provenance(encoder=encoder, task=task,
                      embeddings={p: read_npz_provenance(p).get("encoder_config_hash") for p in embeddings},
                      manifests={p: dataframe_hash(m) for p, m in zip(manifests, mans)})
    write_table(out_predictions, preds, provenance=prov)
    write_table(out_runs, rows, provenance=prov)
    logger.info("wrote %d metric rows and %d predictions", len(rows), len(preds))


def aggregate_step(run_files: Sequence[str], out: str, log: str | None = None) -> None:
    logger = setup_logging(log)
    frames = [read_table(p) for p in run_files]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    write_table(out, df, provenance=provenance(shards=[str(p) for p in run_files]))
    logger.info("aggregated %d rows from %d shards", len(df), len(run_files))


def report_step(runs: str, predictions: Sequence[str], embeddings: Sequence[str], out_dir: str,
                log: str | None = None) -> None:
    from fmaudit.report import write_report

    logger = setup_logging(log)
    write_report(read_table(runs), [Path(p) for p in predictions], [Path(p) for p in embeddings], Path(out_dir))
    logger.info("report written to %s", out_dir)


def download_step(dataset: str, entry: Mapping[str, Any], data_root: str, done: str, log: str | None = None) -> None:
    from fmaudit.datasets.download import download_dataset
    from fmaudit.io import write_json

    logger = setup_logging(log)
    download_dataset(dataset, entry, data_root)
    write_json(done, provenance(dataset=dataset, files=entry.get("files") or []))
    logger.info("%s downloaded under %s", dataset, data_root)

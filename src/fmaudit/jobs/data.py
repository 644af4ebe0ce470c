"""Jobs of the data rules: a data set's manifest, the split checks of every task before anything is embedded,
and a data set's download."""

from __future__ import annotations

from typing import Any, Mapping

from fmaudit.datasets import prepare_dataset
from fmaudit.io import dataframe_hash, provenance, read_table, write_json, write_table
from fmaudit.logs import setup_logging
from fmaudit.validation import SplitValidationError, SplitValidationReport, validate_task_splits

__all__ = ["download_job", "prepare_manifest_job", "validate_job", "validate_manifests"]


def prepare_manifest_job(dataset: str, entry: Mapping[str, Any], data_root: str, out: str,
                         log: str | None = None) -> None:
    """Run the data set's preparer with ``entry["params"]`` (registry defaults with the config's overrides) and
    write the manifest with its provenance."""
    logger = setup_logging(log)
    params = dict(entry["params"])
    manifest = prepare_dataset(dataset, entry["preparer"], data_root, params)
    prov = provenance(dataset=dataset, preparer=entry["preparer"], params=params,
                      manifest_hash=dataframe_hash(manifest), preparation=manifest.attrs.get("provenance", {}))
    write_table(out, manifest, provenance=prov)
    logger.info("manifest of %s: %d items, %d labelled, domains %s", dataset, len(manifest),
                int(manifest["label"].notna().sum()), sorted(manifest["domain"].unique()))


def validate_manifests(manifests: Mapping[str, str], tasks: Mapping[str, Mapping[str, Any]],
                       allow_group_overlap: bool = False) -> SplitValidationReport:
    """Read each data set's manifest file and run every split check of ``tasks`` on them
    (:func:`fmaudit.validation.validate_task_splits`, messages naming the files); ``tasks`` as
    :func:`fmaudit.grid.resolved_tile_tasks` gives them. Raises :class:`SplitValidationError` listing every
    problem; returns the report otherwise."""
    frames = {dataset: read_table(path) for dataset, path in manifests.items()}
    return validate_task_splits(frames, tasks, files=dict(manifests), allow_group_overlap=allow_group_overlap)


def validate_job(manifests: Mapping[str, str], tasks: Mapping[str, Mapping[str, Any]], out: str,
                 log: str | None = None) -> None:
    """The workflow's ``validate`` stage: every split check of every tile-level task, after the manifests and
    before any embedding. Writes the report (one row per check and scope: task, check, scope, status, detail)
    to ``out`` when every check passes; otherwise logs every check and raises the error that lists each
    problem (the group and both splits of a leak, the class missing from training ...)."""
    logger = setup_logging(log)
    logger.info("checking the splits of %d task(s) over %d manifest(s)", len(tasks), len(manifests))
    try:
        report = validate_manifests(manifests, tasks)
    except SplitValidationError as e:
        logger.info("every check:\n%s", e.report.to_frame().to_string(index=False))
        raise
    table = report.to_frame()
    write_table(out, table)
    counts = table["status"].value_counts().to_dict() if len(table) else {}
    logger.info("splits valid: %s; report %s", ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no task",
                out)


def download_job(dataset: str, entry: Mapping[str, Any], data_root: str, done: str, log: str | None = None) -> None:
    """Fetch and unpack the data set's files under ``data_root``; ``done`` records what was fetched, with the
    sha256 of every file (published, or recorded at its first download when the source publishes none)."""
    from fmaudit.datasets.download import download_dataset, downloaded_checksums

    logger = setup_logging(log)
    download_dataset(dataset, entry, data_root)
    checksums = downloaded_checksums(dataset, entry, data_root)
    write_json(done, provenance(dataset=dataset, files=entry.get("files") or [], checksums=checksums))
    for row in checksums:
        logger.info("%s: sha256 %s (%s)", row["path"], row["sha256"], row["sha256_source"])
    logger.info("%s downloaded under %s", dataset, data_root)

"""Jobs of the data rules: a data set's manifest, the split checks of every task before anything is embedded,
and a data set's download."""

from __future__ import annotations

from typing import Any, Mapping

from fmaudit.datasets import dataset_group_unit, prepare_dataset
from fmaudit.datasets.download import download_dataset, downloaded_checksums
from fmaudit.io import dataframe_hash, provenance, write_json, write_table
from fmaudit.logs import setup_logging
from fmaudit.preflight import FILE_CHECKS, DataChecks, check_data
from fmaudit.split_checks import SplitValidationError

__all__ = ["download_job", "prepare_manifest_job", "validate_job"]


def prepare_manifest_job(dataset: str, entry: Mapping[str, Any], data_root: str, out: str,
                         log: str | None = None) -> None:
    """Run the data set's preparer with ``entry["params"]`` (registry defaults with the config's overrides) and
    write the manifest with its provenance; its ``group_unit`` column says what ``group`` is (the registry's
    ``group_unit``, or the preparer's ``group_by``), so every interval downstream can name its unit.

    Parameters
    ----------
    dataset : str
        The data set's slug (registry key).
    entry : Mapping
        Its registry entry as the config resolved it: ``preparer``, ``params`` (registry defaults merged with the
        config's overrides), ``group_unit`` where the registry states one.
    data_root : str
        Folder under which the data set's files lie (the config's ``data_root``).
    out : str
        The manifest file to write (one row per item: ``item_id``, ``label``, ``group``, ``domain``, ``split``,
        ``group_unit`` ...); written atomically with its provenance.
    log : str, optional
        Log file; None logs to stderr.

    Raises
    ------
    FmauditInputError
        When the preparer finds a bad input (it names the file and row).
    """
    logger = setup_logging(log)
    params = dict(entry["params"])
    manifest = prepare_dataset(dataset, entry["preparer"], data_root, params,
                               group_unit=dataset_group_unit(entry, params))
    prov = provenance(dataset=dataset, preparer=entry["preparer"], params=params,
                      manifest_hash=dataframe_hash(manifest), preparation=manifest.attrs.get("provenance", {}))
    write_table(out, manifest, provenance=prov)
    logger.info("manifest of %s: %d items, %d labelled, domains %s", dataset, len(manifest),
                int(manifest["label"].notna().sum()), sorted(manifest["domain"].unique()))


def validate_job(checks: Mapping[str, Any], out: str, log: str | None = None) -> None:
    """The workflow's ``validate`` stage: every check of :func:`fmaudit.preflight.check_data` (the split checks of
    every tile-level task and the class names the config mentions), after the manifests and before any
    embedding. ``checks``: :meth:`fmaudit.preflight.DataChecks.as_params`. Writes the report (one row per check
    and scope: task, check, scope, status, detail) to ``out`` when every check passes; otherwise logs every
    check and raises the error that lists each problem (the group and both splits of a leak, the class missing
    from training, the config key naming an unknown class, an unreadable file ...). Warnings (test splits with
    fewer than 5 groups) are logged as such and kept in the report.

    Parameters
    ----------
    checks : Mapping
        The checks to run, as :meth:`fmaudit.preflight.DataChecks.as_params` wrote them into the rule's params
        (tasks with their data sets, the manifest of each data set, the files to read).
    out : str
        The report table to write (columns ``task``, ``check``, ``scope``, ``status``, ``detail``).
    log : str, optional
        Log file; None logs to stderr.

    Raises
    ------
    SplitValidationError
        When any check fails; the message lists every problem, and nothing is written to ``out``.
    """
    logger = setup_logging(log)
    spec = DataChecks.from_params(checks)
    logger.info("checking %d task(s) over %d manifest(s)", len(spec.tasks), len(spec.manifests))
    try:
        report = check_data(spec)
    except SplitValidationError as e:
        logger.info("every check:\n%s", e.report.to_frame().to_string(index=False))
        raise
    for check in report.checks:  # what was read of the files: every header, a decoded sample, every slide
        if check.check in FILE_CHECKS and check.status == "ok":
            logger.info("%s: %s", check.scope, check.detail)
    for warning in report.warnings:
        logger.warning("%s", warning)
    table = report.to_frame()
    write_table(out, table)
    counts = table["status"].value_counts().to_dict() if len(table) else {}
    logger.info("checks passed: %s; report %s", ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no task",
                out)


def download_job(dataset: str, entry: Mapping[str, Any], data_root: str, done: str, log: str | None = None) -> None:
    """Fetch and unpack the data set's files under ``data_root``; ``done`` records what was fetched, with the
    sha256 of every file (published, or recorded at its first download when the source publishes none).

    Parameters
    ----------
    dataset : str
        The data set's slug (registry key).
    entry : Mapping
        Its registry entry (``files`` with their URLs and published sha256 where the source gives one).
    data_root : str
        Folder to unpack the files under.
    done : str
        The JSON marker to write once every file is in place: the provenance with ``files`` and ``checksums``
        (``path``, ``sha256``, ``sha256_source`` per file).
    log : str, optional
        Log file; None logs to stderr.
    """
    logger = setup_logging(log)
    download_dataset(dataset, entry, data_root)
    checksums = downloaded_checksums(dataset, entry, data_root)
    write_json(done, provenance(dataset=dataset, files=entry.get("files") or [], checksums=checksums))
    for row in checksums:
        logger.info("%s: sha256 %s (%s)", row["path"], row["sha256"], row["sha256_source"])
    logger.info("%s downloaded under %s", dataset, data_root)

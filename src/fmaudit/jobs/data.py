"""Jobs of the data rules: a data set's manifest, and its download."""

from __future__ import annotations

from typing import Any, Mapping

from fmaudit.datasets import dataset_group_unit, prepare_dataset
from fmaudit.io import dataframe_hash, provenance, write_json, write_table
from fmaudit.logs import setup_logging

__all__ = ["download_job", "prepare_manifest_job"]


def prepare_manifest_job(dataset: str, entry: Mapping[str, Any], data_root: str, out: str,
                         log: str | None = None) -> None:
    """Run the data set's preparer with ``entry["params"]`` (registry defaults with the config's overrides) and
    write the manifest with its provenance; its ``group_unit`` column says what ``group`` is (the registry's
    ``group_unit``, or the preparer's ``group_by``), so every interval downstream can name its unit."""
    logger = setup_logging(log)
    params = dict(entry["params"])
    manifest = prepare_dataset(dataset, entry["preparer"], data_root, params,
                               group_unit=dataset_group_unit(entry, params))
    prov = provenance(dataset=dataset, preparer=entry["preparer"], params=params,
                      manifest_hash=dataframe_hash(manifest), preparation=manifest.attrs.get("provenance", {}))
    write_table(out, manifest, provenance=prov)
    logger.info("manifest of %s: %d items, %d labelled, domains %s", dataset, len(manifest),
                int(manifest["label"].notna().sum()), sorted(manifest["domain"].unique()))


def download_job(dataset: str, entry: Mapping[str, Any], data_root: str, done: str, log: str | None = None) -> None:
    """Fetch and unpack the data set's files under ``data_root``; ``done`` records what was fetched."""
    from fmaudit.datasets.download import download_dataset

    logger = setup_logging(log)
    download_dataset(dataset, entry, data_root)
    write_json(done, provenance(dataset=dataset, files=entry.get("files") or []))
    logger.info("%s downloaded under %s", dataset, data_root)

"""Jobs of the cell branch (rules/cells.smk, CellPath-Bench): one section's preparation, the split
checks of the panel, one (encoder, section, magnification) feature folder, one (encoder, magnification,
protocol) probe shard, and the aggregation of every shard. Each job sends its log records and a failure's
full exception to its ``log:`` file (:func:`fmaudit.logs.setup_logging`), and writes atomically.

Excluded sections (fewer than two valid classes, :func:`fmaudit.cells.qc.section_eligibility`, recorded in
the cell manifest's provenance at preparation) keep their features but take no part in any probe: their
labels are masked (:func:`fmaudit.cells.protocols.mask_excluded`) in the validation and in every shard alike,
and the runs whose held-out unit is excluded say so in their ``status``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.cells.demo import demo_section_specs, write_demo_section
from fmaudit.cells.prepare import XENIUM_CELLS_DEFAULTS, prepare_section, resolve_section, write_cell_manifest
from fmaudit.cells.protocols import make_fold_manifest, mask_excluded, read_fold_manifest, unit_sections
from fmaudit.cells.table import prepare_table_section
from fmaudit.cells.taxonomy import load_taxonomy
from fmaudit.grid import cell_runs
from fmaudit.io import (
    FmauditInputError,
    dataframe_hash,
    provenance,
    read_provenance,
    read_table,
    write_json,
    write_table,
)
from fmaudit.logs import setup_logging, switch_log_file
from fmaudit.split_checks import SplitValidationError, validate_cell_panel

__all__ = ["aggregate_cells_job", "cell_feature_set_job", "cell_features_job", "cell_shard_job", "excluded_sections",
           "prepare_section_job", "section_source_spec", "shard_runs", "validate_cells_job"]


# --------------------------------------------------------------------------------------------------------
# preparation
# --------------------------------------------------------------------------------------------------------

def section_source_spec(section: str, organ: str, dataset: str, params: Mapping[str, Any],
                        data_root: str | Path) -> dict[str, Any]:
    """Where one section's files are: its entry under the data set's ``sections`` parameter, or, for a demo
    data set (``params.demo``), the demo section of that id written under ``data_root/<dataset>/`` (by
    :mod:`fmaudit.cells.demo`, from the real CC0 slide; kept when already written with the same
    specification). Errors name the config key to fill.

    Parameters
    ----------
    section : str
        The section's id (as under the config's ``cells.sections``).
    organ : str
        The organ the config puts the section under; an entry naming another organ is an error.
    dataset : str
        The data set listing the section (its slug, for messages and the demo folder).
    params : Mapping
        The data set's params: ``sections`` (section -> files) or ``demo`` (the demo's specification).
    data_root : str or Path
        Folder the listed paths are relative to, and under which demo sections are written.

    Returns
    -------
    dict
        The section's entry: ``bundle``, ``he_image``, ``alignment``, ``cell_types`` (paths; absolute for a demo
        section) and ``organ``, plus whatever else the entry holds (``he_mpp`` ...).

    Raises
    ------
    FmauditInputError
        When the section is not listed (or not a demo section), or its entry names another organ.
    """
    demo = params.get("demo")
    if demo:
        specs = {s.section: s for s in demo_section_specs(**dict(demo))}
        if section not in specs:
            raise FmauditInputError(f"data set {dataset!r}: the demo sections (params.demo) are {sorted(specs)}, "
                                    f"not {section!r}; list those under cells.sections")
        paths = write_demo_section(specs[section], (Path(data_root) / dataset).resolve())
        spec = dict(paths)  # absolute paths
    else:
        listed = params.get("sections") or {}
        if section not in listed:
            raise FmauditInputError(
                f"section {section!r} (organ {organ!r}) is not listed under dataset_params.{dataset}.sections: "
                f"give its bundle, he_image, alignment and cell_types there (paths relative to data_root "
                f"{data_root}); see resources/datasets.yaml, {dataset}.how_to_get")
        spec = dict(listed[section])
    if str(spec.get("organ", organ)) != str(organ):
        raise FmauditInputError(f"section {section!r}: cells.sections puts it under organ {organ!r}, data set "
                                f"{dataset!r} under {spec.get('organ')!r}")
    spec["organ"] = organ
    return spec


def prepare_section_job(section: str, organ: str, dataset: str, params: Mapping[str, Any], data_root: str,
                        out: str, qc_png: str, log: str | None = None, kind: str = "xenium_cells") -> None:
    """Register and label one section (:func:`fmaudit.cells.prepare.prepare_section`; a slide of a ``cell_table``
    data set: :func:`fmaudit.cells.table.prepare_table_section`) into its cell manifest ``out`` (parquet with
    provenance: counts, alignment, eligibility) and its QC overlay ``qc_png``. A section with fewer than two
    valid classes is written, marked ineligible, and the reason is logged (WARNING).

    Parameters
    ----------
    section : str
        The section's id.
    organ : str
        Its organ (config ``cells.sections``).
    dataset : str
        The data set listing it.
    params : Mapping
        The data set's params (``sections`` or ``demo``; the taxonomy tables and ``min_cells_per_class``, filled
        from :data:`fmaudit.cells.prepare.XENIUM_CELLS_DEFAULTS`; for a ``cell_table``, its sheet's settings).
    data_root : str
        Folder the section's paths are relative to.
    out : str
        The cell manifest to write (parquet, one row per registered cell, with provenance).
    qc_png : str
        The QC overlay image to write.
    log : str, optional
        Log file; None logs to stderr.
    kind : str
        The data set's kind: ``xenium_cells`` (a Xenium bundle registered on its H&E) or ``cell_table``.

    Raises
    ------
    FmauditInputError
        When the section is not listed or its entry names another organ (:func:`section_source_spec`), or the
        preparer finds a bad input (it names the file).
    """
    logger = setup_logging(log)
    if kind == "cell_table":
        result = prepare_table_section(section, organ, dataset, params, out, qc_png)
    else:
        p = {**XENIUM_CELLS_DEFAULTS, **dict(params)}
        spec = section_source_spec(section, organ, dataset, p, data_root)
        source = resolve_section(section, spec, data_root)
        taxonomy = load_taxonomy(p["taxonomy_fine"], p["taxonomy_coarse"])
        result = prepare_section(source, taxonomy, int(p["min_cells_per_class"]), qc_png=qc_png)
        write_cell_manifest(out, result)
    if result.eligible:
        logger.info("section %s (%s): %d cells registered, eligible; wrote %s", section, organ,
                    len(result.manifest), out)
    else:
        logger.warning("section %s (%s) is EXCLUDED from the cell-level analyses: %s", section, organ,
                       result.exclusion_reason)


def excluded_sections(manifests: Mapping[str, str]) -> dict[str, str]:
    """section -> exclusion reason, from each cell manifest's provenance (written at preparation).

    Parameters
    ----------
    manifests : Mapping of str to str
        Section -> its cell manifest file.

    Returns
    -------
    dict of str to str
        Section -> why it is excluded, for the sections whose provenance says ``eligible: false`` only.
    """
    out = {}
    for section, path in manifests.items():
        prov = read_provenance(path)
        if prov.get("eligible") is False:
            out[section] = str(prov.get("exclusion_reason") or "ineligible")
    return out


def _folds(cells: Mapping[str, Any]) -> dict[str, list[str]] | None:
    spec = (cells.get("protocols") or {}).get("MOCV")
    if not spec:
        return None
    source = spec.get("fold_manifest") or make_fold_manifest(cells["sections"], int(spec["folds"]))
    return read_fold_manifest(source, cells["sections"], int(spec["folds"]))


def validate_cells_job(manifests: Mapping[str, str], cells: Mapping[str, Any],
                       taxonomies: Mapping[str, Mapping[str, Any]], out: str, log: str | None = None) -> None:
    """The cell branch's split checks (:func:`fmaudit.split_checks.validate_cell_panel`) after every section is
    prepared and before the first feature job: excluded sections, leakage of every partition, two classes in
    training, every test class in training. Writes the report (task, check, scope, status, detail) when
    nothing is wrong; otherwise logs every check and raises the error listing each problem.

    Parameters
    ----------
    manifests : Mapping of str to str
        Section -> its cell manifest file.
    cells : Mapping
        The filled ``cells`` block: ``sections`` (organ -> section ids), ``protocols``, ``probe``.
    taxonomies : Mapping
        Taxonomy -> its settings (the classes each cell label maps to), as the rule passes them.
    out : str
        The report table to write.
    log : str, optional
        Log file; None logs to stderr.

    Raises
    ------
    SplitValidationError
        When a check fails; the message lists every problem and nothing is written.
    """
    logger = setup_logging(log)
    frames = {s: read_table(p) for s, p in manifests.items()}
    excluded = excluded_sections(manifests)
    for s, why in excluded.items():
        logger.warning("section %s is excluded: %s", s, why)
    logger.info("checking the cell panel: %d sections (%d excluded), protocols %s", len(frames), len(excluded),
                ", ".join(p for p, v in cells["protocols"].items() if v))
    try:
        report = validate_cell_panel(frames, cells["sections"], taxonomies, cells["protocols"], cells["probe"],
                                     excluded=excluded, folds=_folds(cells))
    except SplitValidationError as e:
        logger.info("every check:\n%s", e.report.to_frame().to_string(index=False))
        raise
    table = report.to_frame()
    write_table(out, table)
    counts = table["status"].value_counts().to_dict()
    logger.info("cell panel valid: %s; report %s", ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), out)


# --------------------------------------------------------------------------------------------------------
# features
# --------------------------------------------------------------------------------------------------------

def cell_features_job(encoder: str, spec: Mapping[str, Any], manifest: str, magnifications: Sequence[float],
                      outs: Sequence[str], weights: str | None, batch_size: int, chunk_size: int, threads: int,
                      logs: Sequence[str] | None = None) -> None:
    """Nucleus-anchored features of one (encoder, section) at every one of ``magnifications``
    (:func:`fmaudit.cells.features.extract_section_features`): a folder per magnification (``outs``, in the same
    order), each written under a temporary name and renamed into place and resumable in chunks of ``chunk_size``
    patches, with the encoder loaded once for all of them (and not at all when every chunk is reused). Each
    magnification's records go to its own log (``logs``, same order: a failure's exception lands in the log of
    the magnification it failed on), and every log ends with the process's count of encoder loads.

    Parameters
    ----------
    encoder : str
        The encoder's name.
    spec : Mapping
        The embedding part of its registry entry.
    manifest : str
        The section's cell manifest.
    magnifications : sequence of float
        Magnifications to extract at (e.g. 20.0, 40.0).
    outs : sequence of str
        One output folder per magnification, same order.
    weights : str or None
        A local checkpoint replacing the entry's weights (None or empty: the entry's own).
    batch_size : int
        Patches per forward pass.
    chunk_size : int
        Patches per resumable chunk.
    threads : int
        Torch threads; on a GPU, ``threads - 1`` data-loader workers besides.
    logs : sequence of str, optional
        One log file per magnification, same order; None logs to stderr.

    Raises
    ------
    FmauditInputError
        When ``outs`` or ``logs`` do not have one entry per magnification.
    """
    # imported here: torch loads only when this runs
    from fmaudit.cells.features import extract_section_features
    from fmaudit.devices import resolve_device

    magnifications = [float(m) for m in magnifications]
    if len(outs) != len(magnifications) or (logs and len(logs) != len(magnifications)):
        raise FmauditInputError(f"cell features of {encoder!r}: {len(magnifications)} magnifications, {len(outs)} "
                                f"output folders and {len(logs or [])} logs; the workflow must give one of each")
    log_of = dict(zip(magnifications, logs or []))
    logger = setup_logging(logs[0] if logs else None)
    spec = dict(spec)
    spec.setdefault("name", encoder)
    device = resolve_device("auto", logger)
    workers = max(0, int(threads) - 1) if device.type == "cuda" else 0

    def on_output(magnification: float) -> None:
        if log_of:
            switch_log_file(log_of[magnification])

    extract_section_features(manifest, spec, dict(zip(magnifications, outs)), batch_size=int(batch_size),
                             chunk_size=int(chunk_size), num_workers=workers, device=device,
                             weights_path=weights or None, num_threads=int(threads), overwrite=True, logger=logger,
                             on_output=on_output)


def cell_feature_set_job(features: Mapping[str, str], manifests: Mapping[str, str], out: str,
                         log: str | None = None) -> None:
    """Merge one encoder's feature folders at one magnification (section -> folder) into ``out`` (JSON):
    ``{"encoder", "magnification", "sections": {section: {"features", "manifest", "n_cells"}}}``. Each folder
    must have been computed from its section's current manifest (``manifest_hash`` of its ``meta.json``), all
    of one encoder and magnification: a stale folder is an error naming it.

    Parameters
    ----------
    features : Mapping of str to str
        Section -> its feature folder (one encoder, one magnification).
    manifests : Mapping of str to str
        Section -> its cell manifest; the same sections as ``features``.
    out : str
        The JSON to write.
    log : str, optional
        Log file; None logs to stderr.

    Raises
    ------
    FmauditInputError
        When the sections of ``features`` and ``manifests`` differ, a folder was computed from another manifest,
        or the folders mix encoders or magnifications.
    """
    # imported here: torch loads only when this runs
    from fmaudit.cells.features import open_cell_features

    logger = setup_logging(log)
    if set(features) != set(manifests):
        raise FmauditInputError(f"feature set: sections with features {sorted(features)} differ from sections with "
                                f"manifests {sorted(manifests)}")
    entries: dict[str, dict[str, Any]] = {}
    seen: set[tuple[Any, Any]] = set()
    for section, folder in features.items():
        meta = open_cell_features(folder).meta
        expected = dataframe_hash(read_table(manifests[section]))
        if meta.get("manifest_hash") != expected:
            raise FmauditInputError(f"{folder}: computed from another manifest of section {section!r} "
                                    f"(hash {meta.get('manifest_hash')}, now {expected}); extract it again")
        seen.add((meta.get("encoder"), float(meta.get("magnification"))))
        entries[section] = {"features": str(folder), "manifest": str(manifests[section]),
                            "n_cells": meta.get("n_cells")}
    if len(seen) > 1:
        raise FmauditInputError(f"feature set: folders of several encoders or magnifications {sorted(seen)}")
    encoder, magnification = seen.pop() if seen else (None, None)
    write_json(out, {"encoder": encoder, "magnification": magnification, "sections": entries})
    logger.info("feature set of %s at %sx: %d sections, %d cells", encoder, magnification, len(entries),
                sum(int(e["n_cells"] or 0) for e in entries.values()))


# --------------------------------------------------------------------------------------------------------
# probe shards
# --------------------------------------------------------------------------------------------------------

def shard_runs(encoder: str, magnification: float, protocol: str, cells: Mapping[str, Any],
               taxonomy_tasks: Sequence[str]) -> pd.DataFrame:
    """The runs of one (encoder, magnification, protocol) job, exactly as :func:`fmaudit.grid.cell_runs`
    declares them for the config (the job's slice of the grid).

    Parameters
    ----------
    encoder : str
        The job's encoder.
    magnification : float
        The job's magnification.
    protocol : str
        The job's protocol, one of :data:`fmaudit.grid.CELL_PROTOCOLS` (``IS``, ``IOCD``, ``MOCV``, ``LOOO``).
    cells : Mapping
        The filled ``cells`` block.
    taxonomy_tasks : sequence of str
        The tasks the taxonomies name (enough for the grid's task checks).

    Returns
    -------
    DataFrame
        One row per run, columns ``analysis``, ``protocol``, ``encoder``, ``magnification``, ``taxonomy``,
        ``readout``, ``seed``, ``unit``, ``organ``.
    """
    one = {**dict(cells), "magnifications": [magnification],
           "protocols": {protocol: cells["protocols"][protocol]}}
    config = {"encoders": [encoder], "tasks": {t: {} for t in taxonomy_tasks}, "cells": one}
    runs = cell_runs(config)
    return runs[runs["protocol"].astype(str) == protocol].reset_index(drop=True)


def cell_shard_job(encoder: str, magnification: float, protocol: str, cells: Mapping[str, Any],
                   taxonomy_tasks: Sequence[str], feature_set: str, out: str, device: str = "auto",
                   log: str | None = None, threads: int = 1) -> None:
    """Every run of one (encoder, magnification, protocol) (:func:`fmaudit.analyses.cell_suite.run_cell_shard`),
    one row per run of the grid; runs whose held-out unit is an excluded section carry
    ``status = "excluded: <reason>"``. ``feature_set``: the JSON of :func:`cell_feature_set_job`; the sections
    read are ``cells["read_sections"]`` when given (IOCD: organs with enough sections), else all of it.

    Parameters
    ----------
    encoder : str
        The job's encoder.
    magnification : float
        The job's magnification.
    protocol : str
        The job's protocol (``IS``, ``IOCD``, ``MOCV``, ``LOOO``).
    cells : Mapping
        The filled ``cells`` block (``sections``, ``protocols``, ``probe``, optional ``read_sections``).
    taxonomy_tasks : sequence of str
        The tasks the taxonomies name.
    feature_set : str
        The feature-set JSON of this encoder and magnification.
    out : str
        The run rows to write: the grid's columns, ``status`` (``ok`` or ``excluded: ...``) and the metrics
        (``macro_f1``, ``macro_auroc``, ``accuracy``; NaN for excluded units).
    device : str
        ``auto``, ``cpu``, ``cuda`` or ``cuda:N``, for the probes.
    log : str, optional
        Log file; None logs to stderr.
    threads : int, default 1
        The job's cores (the rule's ``threads``): torch's threads, and on CPU the engine calls run side by side
        on that many (:class:`fmaudit.probes.pool.FitPool`). A Snakemake ``script:`` job is not limited to its
        threads otherwise.

    Raises
    ------
    FmauditInputError
        When the feature set lacks a section the shard reads.
    """
    import json

    # imported here: torch and scikit-learn load only when this runs
    from fmaudit.analyses.cell_suite import run_cell_shard, shard_settings
    from fmaudit.devices import job_threads

    logger = setup_logging(log)
    threads = job_threads(threads)
    listed = json.loads(Path(feature_set).read_text())["sections"]
    wanted = list(cells.get("read_sections") or listed)
    missing = [s for s in wanted if s not in listed]
    if missing:
        raise FmauditInputError(f"{feature_set}: no features of section(s) {missing}")
    manifests = {s: listed[s]["manifest"] for s in wanted}
    features = {s: listed[s]["features"] for s in wanted}
    runs = shard_runs(encoder, float(magnification), protocol, cells, taxonomy_tasks)
    taxonomies = list(dict.fromkeys(runs["taxonomy"].astype(str)))
    excluded = excluded_sections(manifests)
    frames = mask_excluded({s: read_table(p) for s, p in manifests.items()}, excluded, taxonomies)
    settings = shard_settings(cells, protocol)
    logger.info("%s %gx %s: %d runs over %d sections (%d excluded)", encoder, magnification, protocol, len(runs),
                len(frames), len(excluded))
    rows = run_cell_shard(runs, dict(features), frames, cells["sections"], device=device, logger=logger,
                          n_threads=threads, **settings)
    if excluded:
        folds = _folds(cells) if protocol == "MOCV" else None
        for unit in dict.fromkeys(rows["unit"].astype(str)):
            tests = unit_sections(protocol, unit, cells["sections"], folds)[0]
            if all(s in excluded for s in tests):
                mask = rows["unit"].astype(str) == unit
                rows.loc[mask, "status"] = "excluded: " + "; ".join(f"{s}: {excluded[s]}" for s in tests)
                rows.loc[mask, ["macro_f1", "macro_auroc", "accuracy"]] = float("nan")
    prov = provenance(encoder=encoder, magnification=float(magnification), protocol=protocol,
                      sections=sorted(frames), excluded=excluded, n_runs=len(rows))
    write_table(out, rows, provenance=prov)
    logger.info("wrote %d run rows (%d ok) to %s", len(rows), int((rows["status"] == "ok").sum()), out)


def aggregate_cells_job(shards: Sequence[str], out: str, log: str | None = None) -> None:
    """Every shard's run rows in one table (the report's input).

    Parameters
    ----------
    shards : sequence of str
        The run-row tables of the shards; none gives an empty table.
    out : str
        The table to write; its key columns (``protocol``, ``encoder``, ``taxonomy``, ``unit`` ...) as text.
    log : str, optional
        Log file; None logs to stderr.
    """
    logger = setup_logging(log)
    frames = [read_table(p) for p in shards]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    for col in ("analysis", "protocol", "encoder", "taxonomy", "readout", "unit", "organ"):
        if col in df.columns:
            df[col] = df[col].astype(str)
    write_table(out, df, provenance=provenance(shards=[str(p) for p in shards]))
    logger.info("aggregated %d cell runs from %d shards", len(df), len(shards))


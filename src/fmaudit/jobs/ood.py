"""Jobs of the OOD rules (audit paper): the perturbed copy of a test split (a derived manifest), the OOD shard of one
(encoder, task) with its exported gate, and the aggregation of every shard.

A shard's conditions come from :func:`fmaudit.grid.ood_shard_plan` (the rule's ``plan`` param); its settings
are the task's filled ``ood`` block with the readout resolved for the encoder. The far donor, the perturbed
copies and the held-out classes are turned into :class:`fmaudit.analyses.ood_suite.OODCondition` here:

- far: the donor's test split (a donor task's labelled test items; a donor data set's test split, or all its
  items when it has none, e.g. unlabelled slide tiles), its groups (patients / slides) as resampling units.
- blur / image_artefact: the derived embeddings of every data set of the task, aligned item by item with the
  task's test split (:func:`fmaudit.ood.conditions.align_perturbed`).
- near / artefact: the held-out class names.

Extras declared in the ``ood`` block for the task run in the same job: the probe and scorer sensitivity
tables, slide aggregation, and the label-coarsening / without-classes controls.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.analyses.ood_splits import run_extra_splits
from fmaudit.analyses.ood_suite import OODCondition, ProbeSettings, run_ood_suite
from fmaudit.analyses.task_data import item_strata
from fmaudit.devices import job_threads
from fmaudit.grid.ood import AGGREGATE_TABLES, SHARD_TABLES, SPLIT_TABLES
from fmaudit.io import (
    FmauditInputError,
    dataframe_hash,
    provenance,
    read_npz_provenance,
    read_table,
    write_json,
    write_table,
)
from fmaudit.jobs.probe import load_task_data
from fmaudit.logs import setup_logging
from fmaudit.ood.conditions import align_perturbed, far_ood_items
from fmaudit.ood.gate import save_gate
from fmaudit.ood.perturb import derive_manifest, perturbation_tag
from fmaudit.ood.sensitivity import probe_sensitivity, scorer_sensitivity
from fmaudit.slide_aggregation import label_coarsening, slide_aggregation, without_classes

NO_GATE_CARD = "no_gate.json"
PROTOCOL_NAMES = {"grouped_log_loss": ("grouped", "log_loss"), "grouped_accuracy": ("grouped", "accuracy"),
                  "ungrouped_log_loss": ("ungrouped", "log_loss"), "ungrouped_accuracy": ("ungrouped", "accuracy")}

__all__ = ["AGGREGATE_TABLES", "NO_GATE_CARD", "SHARD_TABLES", "SPLIT_TABLES", "aggregate_ood_job",
           "derive_manifest_job", "ood_shard_job", "ood_split_shard_job"]


def derive_manifest_job(dataset: str, tag: str, spec: str, manifest: str, out: str, log: str | None = None) -> None:
    """The perturbed copy of ``dataset``'s test split: its manifest with the perturbation ``spec`` on every row
    (:func:`fmaudit.ood.perturb.derive_manifest`), embedded next by the embedding rule.

    Parameters
    ----------
    dataset : str
        The source data set's slug.
    tag : str
        The derived data set's tag (``blur_s2``, ``jpeg_q20`` ...); it must be the tag of ``spec``.
    spec : str
        The canonical perturbation string (:func:`fmaudit.ood.perturb.perturbation_string`).
    manifest : str
        The source data set's manifest file.
    out : str
        The derived manifest to write, with the perturbation and both manifests' hashes in its provenance.
    log : str, optional
        Log file; None logs to stderr.

    Raises
    ------
    FmauditInputError
        When ``spec`` does not make ``tag``.
    """
    logger = setup_logging(log)
    if perturbation_tag(spec) != tag:
        raise FmauditInputError(f"derived data set {dataset}__{tag}: the spec {spec} makes {perturbation_tag(spec)!r}")
    man = read_table(manifest)
    derived = derive_manifest(man, spec)
    write_table(out, derived, provenance=provenance(dataset=dataset, tag=tag, perturbation=spec,
                                                    source_manifest_hash=dataframe_hash(man),
                                                    manifest_hash=dataframe_hash(derived)))
    logger.info("%s__%s: %d test items of %s, perturbation %s", dataset, tag, len(derived), dataset, spec)


# --------------------------------------------------------------------------------------------------
# the shard
# --------------------------------------------------------------------------------------------------
def _items(manifests: Sequence[pd.DataFrame], embeddings: Sequence[str], readout: str, where: str
           ) -> tuple[pd.DataFrame, np.ndarray]:
    """Every row of the manifests with its features (matched by item id), in manifest order."""
    # imported here: torchvision and PIL load only when this runs
    from fmaudit.embed import read_embeddings

    rows, feats = [], []
    for man, path in zip(manifests, embeddings):
        ids, x = read_embeddings(path, readout)
        pos = pd.Series(np.arange(len(ids)), index=pd.Index(np.asarray(ids).astype(str)))
        missing = ~man["item_id"].astype(str).isin(pos.index)
        if missing.any():
            raise FmauditInputError(f"{where}: {path} has no embedding of item {man['item_id'][missing].iloc[0]!r}; "
                                    "re-embed this data set")
        rows.append(man)
        feats.append(np.asarray(x)[pos.loc[man["item_id"].astype(str)].to_numpy()])
    return pd.concat(rows, ignore_index=True), np.concatenate(feats).astype(np.float64)


def _far_condition(cond: Mapping[str, Any], manifests: Sequence[str], embeddings: Sequence[str], readout: str,
                   task_domains: Sequence[str] | None):
    donor = cond["donor"]
    mans = [read_table(p) for p in manifests]
    if donor["kind"] == "task":  # the donor task's labelled items, in its domains
        mans = [m[m["label"].notna()] for m in mans]
        if task_domains and list(task_domains) != ["all"]:
            mans = [m[m["domain"].isin(list(task_domains))] for m in mans]
    rows, X = _items(mans, embeddings, readout, f"far donor {donor['name']!r}")
    idx = far_ood_items(rows["split"].astype(str).to_numpy(), donor["name"])
    return OODCondition("far", cond["name"], X[idx], rows["group"].astype(str).to_numpy()[idx])


def _perturbed_condition(cond: Mapping[str, Any], derived_embeddings: Mapping[str, str], test_ids: np.ndarray,
                         readout: str):
    # imported here: torchvision and PIL load only when this runs
    from fmaudit.embed import read_embeddings

    ids, feats = [], []
    for name in cond["derived"]:
        if name not in derived_embeddings:
            raise FmauditInputError(f"condition {cond['name']!r}: no embedding of the derived data set {name!r}")
        i, x = read_embeddings(derived_embeddings[name], readout)
        ids.append(np.asarray(i).astype(str))
        feats.append(np.asarray(x, dtype=np.float64))
    X = align_perturbed(test_ids, np.concatenate(ids), np.concatenate(feats), cond["tag"])
    return OODCondition(cond["tier"], cond["name"], X, sigma=cond.get("sigma"))


def _column_of(manifests: Sequence[pd.DataFrame], item_ids: np.ndarray, column: str, what: str) -> np.ndarray:
    """A manifest column for each item of the task (e.g. the slide of each tile)."""
    man = pd.concat(manifests, ignore_index=True)
    if column not in man.columns:
        raise FmauditInputError(f"config 'ood.{what}.slide_column': the task's manifests have no column {column!r} "
                                f"(columns: {', '.join(map(str, man.columns))})")
    values = man.drop_duplicates("item_id").set_index(man.drop_duplicates("item_id")["item_id"].astype(str))[column]
    out = values.reindex(pd.Index(item_ids)).to_numpy()
    if pd.isna(out).any():
        raise FmauditInputError(f"ood.{what}: item {item_ids[int(np.flatnonzero(pd.isna(out))[0])]!r} has no "
                                f"{column!r}")
    return out.astype(str)


def _meta(df: pd.DataFrame, encoder: str, task: str, readout: str) -> pd.DataFrame:
    for key, value in reversed([("encoder", encoder), ("task", task), ("readout", readout)]):
        if key not in df.columns:
            df.insert(0, key, value)
    return df


def _neural_params(section: Mapping[str, Any]) -> dict[str, Any]:
    """The neural aggregators' settings of a ``slides`` or ``coarsening`` block, by their config key."""
    return {key: dict(section[key]) for key in ("mil", "transformer") if key in section}


def _extras(data, conditions, settings: Mapping[str, Any], task: str, ordinal: bool, manifests: Sequence[pd.DataFrame],
            n_boot: int, seed: int, ece_bins: int, logger) -> dict[str, pd.DataFrame]:
    """The sensitivity tables, slide aggregation and the coarsening controls the block declares for the task."""
    out = {name: pd.DataFrame() for name in ("probe_sensitivity", "scorer_sensitivity", "slides", "coarsening")}
    X, y, groups = data.features, data.labels, data.groups
    train = np.isin(data.splits, ["train", "val"])
    test = data.splits == "test"
    probe_C = settings["probe"]["C"]
    coverages = settings["coverages"]
    sens = settings.get("sensitivity")
    if sens:
        logger.info("sensitivity tables")
        out["probe_sensitivity"] = probe_sensitivity(
            X[train], y[train], groups[train], X[test], y[test], n_classes=data.n_classes, groups_test=groups[test],
            Cs=sens["Cs"], protocols=[PROTOCOL_NAMES[p] for p in sens["protocols"]],
            n_folds=settings["probe"]["cv_folds"], random_state=seed, ordinal=ordinal, coverages=coverages,
            n_bins=ece_bins)
        sets = {c.name: (c.tier, c.features) for c in conditions if c.features is not None}
        if sets:
            out["scorer_sensitivity"] = scorer_sensitivity(
                X[train], y[train], X[test], sets, readout=settings["readout"], knn_ks=sens["knn_ks"],
                covariances=sens["covariances"], normalize=sens["normalize"])
    slides = settings.get("slides")
    if slides:
        logger.info("slide aggregation over %r", slides["slide_column"])
        slide = _column_of(manifests, data.item_ids, slides["slide_column"], "slides")
        out["slides"] = slide_aggregation(
            X[train], y[train], slide[train], X[test], y[test], slide[test], n_classes=data.n_classes,
            ordinal=ordinal, groups_train=groups[train],
            slide_groups_test=groups[test] if slides["slide_column"] != "group" else None, probe_C=probe_C,
            aggregators=slides["aggregators"], neural_params=_neural_params(slides), coverages=coverages,
            n_boot=n_boot, bootstrap_seed=seed, random_state=seed, n_bins=ece_bins)
    coarse = settings.get("coarsening")
    if coarse:
        logger.info("label coarsening over %r", coarse["slide_column"])
        slide = _column_of(manifests, data.item_ids, coarse["slide_column"], "coarsening")
        keep = train | test
        table = label_coarsening(X[keep], y[keep], slide[keep], groups[keep], test[keep], n_classes=data.n_classes,
                                 ordinal=ordinal, probe_C=probe_C, neural_params=_neural_params(coarse),
                                 coverages=coverages,
                                 n_boot=n_boot, bootstrap_seed=seed, random_state=seed, n_bins=ece_bins)
        table.insert(0, "control", "label_coarsening")
        parts = [table]
        if coarse["without"]:
            row = without_classes(X[train], y[train], groups[train], X[test], y[test], groups[test],
                                  class_names=data.class_names, removed=coarse["without"], ordinal=ordinal,
                                  probe_C=probe_C, coverages=coverages, n_boot=n_boot, bootstrap_seed=seed,
                                  random_state=seed, n_bins=ece_bins)
            parts.append(pd.DataFrame([{"control": "without_classes", "arm": f"without {row['removed']}",
                                        "evaluation": "patch_labels", "level": "tile", **row}]))
        out["coarsening"] = pd.concat(parts, ignore_index=True)
    return out


def _data_hash(manifests: Sequence[pd.DataFrame], embeddings: Sequence[str]) -> str:
    """What the gate was trained on: the task's manifests and its embeddings' encoder configurations."""
    h = hashlib.sha256()
    for man, path in zip(manifests, embeddings):
        h.update(dataframe_hash(man).encode())
        h.update(str(read_npz_provenance(path).get("encoder_config_hash")).encode())
    return h.hexdigest()[:16]


def ood_shard_job(encoder: str, task: str, task_spec: Mapping[str, Any], plan: Mapping[str, Any],
                  settings: Mapping[str, Any], bootstrap: Mapping[str, Any], ece_bins: int, manifests: Sequence[str],
                  embeddings: Sequence[str], far_manifests: Sequence[str], far_embeddings: Sequence[str],
                  derived_embeddings: Mapping[str, str], out: Mapping[str, str], gate_dir: str,
                  log: str | None = None, threads: int = 1) -> None:
    """Every OOD analysis of one (encoder, task) (:func:`fmaudit.analyses.ood_suite.run_ood_suite` and the
    extras), written as the tables of :data:`SHARD_TABLES` (``out[name]``) and the exported gate (``gate_dir``).

    Parameters
    ----------
    encoder : str
        The shard's encoder.
    task : str
        The shard's task.
    task_spec : Mapping
        The task's config entry with its resolved ``domains``, ``split``, ``ordinal`` and ``split_strata`` (data
        set -> the manifest columns its split is stratified by; the gate's divisions are stratified the same way).
    plan : Mapping
        :func:`fmaudit.grid.ood_shard_plan` of the task: its ``conditions`` and ``gate`` (None: not gated).
    settings : Mapping
        The task's filled ``ood`` block as the plan gives it, ``readout`` resolved for the encoder (``scorers``,
        ``probe``, ``knn_k``, ``covariance``, ``coverages``, ``hist_bins`` and the extras that apply).
    bootstrap : Mapping
        ``n_boot`` (resamples of each interval) and ``seed``, also the seed of the probe and gate.
    ece_bins : int
        The task's ``calibration.ece_bins``: the bins of the top-label ECE of the selective tables.
    manifests : sequence of str
        The manifest files of the task's data sets.
    embeddings : sequence of str
        The encoder's embeddings file of each manifest, in the same order.
    far_manifests : sequence of str
        The manifests of the far donor's data sets (empty without a far condition).
    far_embeddings : sequence of str
        The encoder's embeddings of the far donor's data sets, same order.
    derived_embeddings : Mapping of str to str
        Derived data set (``<dataset>__<tag>``) -> its embeddings file, for the blur and image-artefact tiers.
    out : Mapping of str to str
        Table name of :data:`SHARD_TABLES` -> the parquet file to write (an empty table where it does not apply).
    gate_dir : str
        The folder of the exported gate (``gate.safetensors`` and ``gate.json``); an ungated task's holds only
        ``no_gate.json``, saying so.
    log : str, optional
        Log file; None logs to stderr.
    threads : int, default 1
        The job's cores (the rule's ``threads``), torch's threads: a Snakemake ``script:`` job is not limited to
        its threads otherwise.

    Raises
    ------
    FmauditInputError
        When an embedding lacks an item of its manifest, a derived embedding is missing, or a ``slide_column``
        is not a manifest column.
    """
    logger = setup_logging(log)
    job_threads(threads)
    readout = settings["readout"]
    mans = [read_table(p) for p in manifests]
    data = load_task_data(task, task_spec, mans, embeddings, readout)
    strata, strata_name = item_strata(data, mans, task_spec.get("split_strata"))
    test_ids = data.item_ids[data.splits == "test"]
    conditions = []
    for cond in plan["conditions"]:
        if cond["tier"] == "far":
            conditions.append(_far_condition(cond, far_manifests, far_embeddings, readout, task_spec.get("domains")))
        elif cond["tier"] in ("blur", "image_artefact"):
            conditions.append(_perturbed_condition(cond, derived_embeddings, test_ids, readout))
        else:
            conditions.append(OODCondition(cond["tier"], cond["name"], held_out=tuple(cond["held_out"])))
    gate = plan.get("gate")
    gate_params = None
    if gate is not None:
        scorer_params = {"covariance": settings["covariance"]} if gate["scorer"] in ("maha", "relative_maha") else {
            "k": settings["knn_k"]}
        gate_params = {"id_reject": gate["id_reject"], "retain": gate["retain"],
                       "validation_fraction": gate["validation_fraction"], "random_state": gate["seed"],
                       "scorer": gate["scorer"], "scorer_params": scorer_params}
    probe = ProbeSettings(C=settings["probe"]["C"], Cs=tuple(settings["probe"]["Cs"]),
                          cv_folds=settings["probe"]["cv_folds"], tol=settings["probe"]["tol"],
                          max_iter=settings["probe"]["max_iter"])
    ordinal = bool(task_spec.get("ordinal", False))
    logger.info("%s x %s: %d items (%d test), %d features, %d classes; %d conditions %s; gate %s (divisions "
                "stratified by %s)", encoder, task, len(data.labels), len(test_ids), data.features.shape[1],
                data.n_classes, len(conditions), [c.name for c in conditions], "on" if gate else "off", strata_name)
    res = run_ood_suite(data, conditions, encoder=encoder, task=task, readout=readout, scorers=settings["scorers"],
                        ordinal=ordinal, knn_k=settings["knn_k"], covariance=settings["covariance"],
                        coverages=settings["coverages"], n_boot=int(bootstrap["n_boot"]),
                        bootstrap_seed=int(bootstrap["seed"]), gate_params=gate_params,
                        gate_splits=int(gate["n_splits"]) if gate else 1, gate_near=bool(gate and gate["near"]),
                        hist_bins=settings["hist_bins"], random_state=int(bootstrap["seed"]), probe=probe,
                        ece_bins=int(ece_bins), strata=strata, strata_name=strata_name)
    tables = {"detection": res.detection, "selective": res.selective, "curves": res.curves, "blur": res.blur,
              "gate": res.gate, "histograms": res.histograms}
    tables.update(_extras(data, conditions, settings, task, ordinal, mans, int(bootstrap["n_boot"]),
                          int(bootstrap["seed"]), int(ece_bins), logger))
    tier = {c.name: c.tier for c in conditions}
    data_hash = _data_hash(mans, embeddings)
    prov = provenance(encoder=encoder, task=task, readout=readout, data_hash=data_hash,
                      embeddings={p: read_npz_provenance(p).get("encoder_config_hash") for p in embeddings},
                      manifests={p: dataframe_hash(m) for p, m in zip(manifests, mans)},
                      conditions={c.name: c.tier for c in conditions})
    gate_path = Path(gate_dir)
    gate_path.mkdir(parents=True, exist_ok=True)
    if res.gate_model is not None:
        save_gate(res.gate_model, gate_path, encoder=encoder, readout=readout, data_hash=data_hash,
                  class_names=data.class_names, extra={"task": task, "ordinal": ordinal,
                                                       "operating_points": f"setting {task} of the gate table",
                                                       "conditions": tier})
    else:
        write_json(gate_path / NO_GATE_CARD, provenance(encoder=encoder, task=task, gated=False,
                                                        reason="the task is not gated "
                                                               "(config ood.gate, ood.gate.tasks)"))
    for name in SHARD_TABLES:
        df = tables[name]
        write_table(out[name], _meta(df, encoder, task, readout) if len(df.columns) else df, provenance=prov)
    logger.info("wrote %d detection rows, %d gate rows; probe C %s", len(res.detection), len(res.gate), res.probe_C)


def ood_split_shard_job(encoder: str, task: str, task_spec: Mapping[str, Any], plan: Mapping[str, Any],
                        settings: Mapping[str, Any], bootstrap: Mapping[str, Any], ece_bins: int,
                        manifests: Sequence[str], embeddings: Sequence[str], out: Mapping[str, str],
                        log: str | None = None, threads: int = 1) -> None:
    """The audit paper's further train/test splits of one (encoder, task)
    (:func:`fmaudit.analyses.ood_splits.run_extra_splits`), written as the tables of
    :data:`~fmaudit.grid.ood.SPLIT_TABLES` (``out[name]``).

    Parameters
    ----------
    encoder : str
        The job's encoder.
    task : str
        The job's task.
    task_spec : Mapping
        As :func:`ood_shard_job`'s; the splits are stratified by its ``split_strata``.
    plan : Mapping
        :func:`fmaudit.grid.ood_split_plan` of the task (``seeds``, ``test_fraction``, ``parts``).
    settings : Mapping
        The OOD settings the job reads: ``readout``, ``probe`` (the shard's), ``coverages``, and the ``slides``
        and ``coarsening`` blocks (None where they do not apply).
    bootstrap : Mapping
        ``n_boot`` and ``seed``.
    ece_bins : int
        The task's ``calibration.ece_bins``.
    manifests : sequence of str
        The manifest files of the task's data sets.
    embeddings : sequence of str
        The encoder's embeddings file of each manifest, in the same order.
    out : Mapping of str to str
        Table name of :data:`~fmaudit.grid.ood.SPLIT_TABLES` -> the parquet file to write.
    log : str, optional
        Log file; None logs to stderr.
    threads : int, default 1
        The job's cores (the rule's ``threads``), torch's threads: a Snakemake ``script:`` job is not limited to
        its threads otherwise.

    Raises
    ------
    FmauditInputError
        When an embedding lacks an item of its manifest, or a ``slide_column`` is not a manifest column.
    """
    logger = setup_logging(log)
    job_threads(threads)
    readout = settings["readout"]
    mans = [read_table(p) for p in manifests]
    data = load_task_data(task, task_spec, mans, embeddings, readout)
    strata, strata_name = item_strata(data, mans, task_spec.get("split_strata"))
    parts = list(plan["parts"])
    slides, coarse = settings.get("slides"), settings.get("coarsening")
    slide_ids = _column_of(mans, data.item_ids, slides["slide_column"], "slides") if slides else None
    coarse_ids = _column_of(mans, data.item_ids, coarse["slide_column"], "coarsening") if coarse else None
    probe = ProbeSettings(C=settings["probe"]["C"], Cs=tuple(settings["probe"]["Cs"]),
                          cv_folds=settings["probe"]["cv_folds"], tol=settings["probe"]["tol"],
                          max_iter=settings["probe"]["max_iter"])
    logger.info("%s x %s: %d items, further splits %s (test fraction %g, stratified by %s): %s", encoder, task,
                len(data.labels), plan["seeds"], plan["test_fraction"], strata_name, parts)
    tables = run_extra_splits(data, seeds=plan["seeds"], test_fraction=plan["test_fraction"], parts=parts,
                              strata=strata, probe=probe, ordinal=bool(task_spec.get("ordinal", False)),
                              coverages=settings["coverages"], n_boot=int(bootstrap["n_boot"]),
                              bootstrap_seed=int(bootstrap["seed"]), n_bins=int(ece_bins), slides=slides,
                              slide_ids=slide_ids, coarsening=coarse, coarse_slide_ids=coarse_ids)
    prov = provenance(encoder=encoder, task=task, readout=readout, split_seeds=list(plan["seeds"]),
                      test_fraction=plan["test_fraction"], split_strata=strata_name,
                      embeddings={p: read_npz_provenance(p).get("encoder_config_hash") for p in embeddings},
                      manifests={p: dataframe_hash(m) for p, m in zip(manifests, mans)})
    for name in SPLIT_TABLES:
        df = tables[name]
        if len(df.columns):
            df["split_strata"] = strata_name
        write_table(out[name], _meta(df, encoder, task, readout) if len(df.columns) else df, provenance=prov)
    logger.info("wrote %s", {name: len(tables[name]) for name in SPLIT_TABLES})


def aggregate_ood_job(shards: Mapping[str, Sequence[str]], out: Mapping[str, str], log: str | None = None) -> None:
    """Concatenate each table of every OOD shard and further-splits job (``shards[name]``: the jobs' files of
    table ``name``, of :data:`AGGREGATE_TABLES`) into ``out[name]``.

    Parameters
    ----------
    shards : Mapping of str to sequence of str
        Table name -> the jobs' files of that table; a missing name gives an empty table.
    out : Mapping of str to str
        Table name -> the aggregated file to write, for every name of :data:`AGGREGATE_TABLES`.
    log : str, optional
        Log file; None logs to stderr.
    """
    logger = setup_logging(log)
    for name in AGGREGATE_TABLES:
        paths = list(shards.get(name) or [])
        frames = [df for df in (read_table(p) for p in paths) if len(df.columns)]
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        write_table(out[name], df, provenance=provenance(shards=[str(p) for p in paths]))
        logger.info("%s: %d rows from %d shards", name, len(df), len(paths))

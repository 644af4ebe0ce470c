"""The plan stage of the pre-flight (:func:`check_config`): the config, its registries and every name it uses,
the analysis grids, the sheets of the user's own data sets, local weight files and the encoders' pre-flight; run at
every ``snakemake -n`` and every ``fmaudit grid``, cheap for the data (sheets and headers, never an image).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from huggingface_hub import try_to_load_from_cache

from fmaudit.cells.table import check_cell_table
from fmaudit.claims import load_claims
from fmaudit.config import (
    add_hub_encoders,
    apply_encoder_revisions,
    dataset_params,
    embedded_encoders,
    results_dir,
    weights_override,
)
from fmaudit.datasets import preparer_names
from fmaudit.datasets.own import (
    feature_encoders,
    precomputed_encoders,
    read_feature_table,
    read_image_table,
    read_slide_table,
)
from fmaudit.datasets.slide_tiles import read_slide_sheet
from fmaudit.grid import check_grid, derived_datasets, embed_pairs, parts_with
from fmaudit.io import FmauditInputError, read_json, stable_hash, write_json
from fmaudit.registry import (
    check_encoder_usable,
    embedding_spec,
    load_dataset_registries,
    load_encoder_registries,
    unknown_name_error,
)

__all__ = [
    "check_config",
    "check_encoder_weights",
    "check_encoders_before_embedding",
    "check_feature_imports",
    "check_names",
    "check_own_data",
    "check_preparers",
    "check_slide_sheets",
    "feature_imports",
    "registries",
    "unusable_encoders",
]

def check_names(config: Mapping[str, Any], encoder_registry: Mapping[str, Any],
                dataset_registry: Mapping[str, Any]) -> None:
    """Every encoder, data set and task reference of the config exists; raise naming the first that doesn't.

    Parameters
    ----------
    config : Mapping
        A filled config (:func:`fmaudit.config.fill_config`): its ``encoders``, ``datasets``, ``variants``,
        ``dataset_params``, ``encoder_weights``, ``encoder_revisions`` and ``tasks`` are read.
    encoder_registry : Mapping
        Encoder slug -> registry entry, as the config sees it (its own registries and feature-only encoders added).
    dataset_registry : Mapping
        Data-set name -> registry entry, as the config sees it.

    Raises
    ------
    FmauditInputError
        For the first unknown encoder, data set or variant (with a close spelling where there is one), a variant
        whose base encoder is not in the config, or a per-encoder or per-data-set key naming one the config lacks.
    """
    for enc in config["encoders"]:
        if enc not in encoder_registry:
            raise unknown_name_error("encoder", enc, list(encoder_registry), "config 'encoders'")
    for ds in config["datasets"]:
        if ds not in dataset_registry:
            raise unknown_name_error("dataset", ds, list(dataset_registry), "config 'datasets'")
    declared = [name for name, entry in encoder_registry.items() if entry.get("variant_of")]
    for variant in config["variants"]:
        if variant not in declared:
            raise unknown_name_error("declared encoder variant", variant, declared, "config 'variants'")
        base = encoder_registry[variant]["variant_of"]
        if base not in config["encoders"]:
            raise FmauditInputError(f"config 'variants': {variant!r} is a variant of {base!r}, which is not in the "
                                    f"config's encoders ({', '.join(config['encoders'])}); a variant is checked "
                                    "beside its base")
    for ds in config["dataset_params"]:
        if ds not in config["datasets"]:
            raise unknown_name_error("dataset", ds, list(config["datasets"]), "config 'dataset_params'")
    for key in ("encoder_weights", "encoder_revisions"):
        for enc in config[key]:
            if enc not in config["encoders"]:
                raise unknown_name_error("encoder", enc, list(config["encoders"]), f"config '{key}'")
    for task, spec in config["tasks"].items():
        for ds in spec["datasets"]:
            if ds not in config["datasets"]:
                raise unknown_name_error("dataset", ds, list(config["datasets"]), f"config 'tasks.{task}.datasets'")


def check_preparers(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> None:
    """Every data set of the config names a registered preparer (own-data kinds: the kind's own); the error names
    the data set and its registry entry's key, at plan time rather than in the prepare job.

    Parameters
    ----------
    config : Mapping
        A filled config; its ``datasets`` are checked.
    dataset_registry : Mapping
        Data-set name -> registry entry; each entry's ``preparer`` must be one of
        :func:`fmaudit.datasets.preparer_names`.

    Raises
    ------
    FmauditInputError
        Naming the data set and the unknown preparer.
    """
    known = preparer_names()
    for ds in config["datasets"]:
        preparer = dataset_registry[ds]["preparer"]
        if preparer not in known:
            raise unknown_name_error("preparer", preparer, known, f"data set {ds!r} (its registry entry's 'preparer')")


def check_own_data(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> dict[str, list[str]]:
    """The sheets of every own-data set of the config (``image_table``, ``slide_table``, ``cell_table``,
    ``features``): every bad line named (:mod:`fmaudit.datasets.own`, :mod:`fmaudit.cells.table`), before any
    job runs; no image is read. Returns each tile-level one's domains, as its sheet lists them.

    Parameters
    ----------
    config : Mapping
        A filled config; its ``datasets`` and per-data-set ``dataset_params``, and the sections of its ``cells``
        blocks (to know each tissue section's organ), are read.
    dataset_registry : Mapping
        Data-set name -> registry entry; an entry's ``kind`` says which sheet reader applies.

    Returns
    -------
    dict of str to list of str
        Data set -> the sorted domains its sheet lists, for every ``image_table``, ``slide_table`` and ``features``
        data set (``cell_table`` sets are checked but have no entry).

    Raises
    ------
    FmauditInputError
        Naming the sheet and the line of the first bad row (a missing file, an unknown class, an empty label...).
    """
    organ_of = {s: organ for _, _, cells in parts_with(config, "cells")
                for organ, secs in cells["sections"].items() for s in secs}
    domains: dict[str, list[str]] = {}
    for ds in config["datasets"]:
        kind = dataset_registry[ds]["kind"]
        params = dataset_params(config, dataset_registry, ds)
        rows = None
        if kind == "image_table":
            rows = read_image_table(ds, params)
        elif kind == "slide_table":
            rows = read_slide_table(ds, params)
        elif kind == "features":
            rows = read_feature_table(ds, params)
        elif kind == "cell_table":
            check_cell_table(ds, params, organ_of, where=f"data set {ds!r}: ")
        if rows is not None:
            domains[ds] = sorted(str(d) for d in rows["domain"].dropna().unique())
    return domains


def feature_imports(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> dict[tuple[str, str], Any]:
    """``{(encoder, data set): file, features_key, ids_key, readout}`` of every ``features`` data set of the
    config (:func:`fmaudit.datasets.own.feature_encoders`): the embeddings the workflow imports instead of
    computing.

    Parameters
    ----------
    config : Mapping
        A filled config; its ``datasets`` and their ``dataset_params`` (``files`` per encoder) are read.
    dataset_registry : Mapping
        Data-set name -> registry entry; names of the config absent from it are skipped (:func:`check_names`
        reports them).

    Returns
    -------
    dict of (str, str) to Any
        ``(encoder, data set)`` -> the imported file's description (path, HDF5/NPZ keys of the features and ids,
        readout), one entry per feature file of a ``features`` data set.
    """
    known = [ds for ds in config["datasets"] if ds in dataset_registry]
    return feature_encoders(known, dataset_registry,
                            {ds: dataset_params(config, dataset_registry, ds) for ds in known
                             if dataset_registry[ds]["kind"] == "features"})


def check_feature_imports(config: Mapping[str, Any], dataset_registry: Mapping[str, Any],
                          encoder_registry: Mapping[str, Any], imports: Mapping[tuple[str, str], Any]) -> None:
    """Embeddings computed elsewhere stand in for an embedding job, so: every (encoder, data set) pair the config
    embeds whose data set is a ``features`` one has a file of that encoder; no OOD tier perturbs the images of
    such a data set (it has none); an encoder known only by its feature files (``loader: precomputed``) embeds
    no other data set and no cell.

    Parameters
    ----------
    config : Mapping
        A filled config; its embedding pairs (:func:`fmaudit.grid.embed_pairs`), OOD derived conditions and
        ``cells`` blocks are read.
    dataset_registry : Mapping
        Data-set name -> registry entry (``kind: features`` marks embeddings computed elsewhere).
    encoder_registry : Mapping
        Encoder slug -> registry entry (``loader: precomputed`` marks an encoder known only by its feature files).
    imports : Mapping
        The config's feature imports, as :func:`feature_imports` returns them.

    Raises
    ------
    FmauditInputError
        For an (encoder, ``features`` data set) pair without a file, a precomputed encoder asked to embed other data,
        an OOD tier that perturbs images of a ``features`` data set, or a precomputed encoder in ``cells``.
    """
    features = {ds for ds in config["datasets"] if dataset_registry[ds]["kind"] == "features"}
    for encoder, ds in embed_pairs(config):
        if ds in features and (encoder, ds) not in imports:
            have = sorted(e for e, d in imports if d == ds)
            raise FmauditInputError(
                f"data set {ds!r} holds embeddings computed elsewhere (kind: features, files of {', '.join(have)}), "
                f"but the config also asks encoder {encoder!r} to embed it: add its file under "
                f"dataset_entries.{ds}.params.files.{encoder}, or run {encoder!r} in a study without {ds!r} "
                "(config 'studies')")
        if encoder_registry[encoder].get("loader") == "precomputed" and (encoder, ds) not in imports:
            known = ", ".join(d for e, d in imports if e == encoder)
            raise FmauditInputError(
                f"encoder {encoder!r} is known only by its feature files ({known}), so it cannot embed data set "
                f"{ds!r}: give its features of {ds!r} too, or a registry entry that loads its weights")
    for derived in derived_datasets(config).values():
        if derived["dataset"] in features:
            raise FmauditInputError(
                f"config 'ood': the {derived['tag']} condition re-embeds perturbed images of data set "
                f"{derived['dataset']!r}, which holds embeddings computed elsewhere (kind: features) and no images; "
                "keep its task out of ood.blur and ood.image_artefact")
    for _, part, _cells in parts_with(config, "cells"):
        for encoder in part["encoders"]:
            if encoder_registry[encoder].get("loader") == "precomputed":
                raise FmauditInputError(f"config 'cells': encoder {encoder!r} is known only by its feature files and "
                                        "cannot extract cell features; give it a registry entry that loads its weights")


def check_slide_sheets(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> None:
    """Validate every slide sheet the config's data sets use, so a bad sheet stops the run before any job.

    Parameters
    ----------
    config : Mapping
        A filled config; the ``slides`` sheet of every ``slide_tiles`` data set's params is read.
    dataset_registry : Mapping
        Data-set name -> registry entry (its ``preparer``).

    Raises
    ------
    FmauditInputError
        Naming the sheet and the bad line (:func:`fmaudit.datasets.slide_tiles.read_slide_sheet`).
    """
    for ds in config["datasets"]:
        if dataset_registry[ds]["preparer"] != "slide_tiles":
            continue  # (a cell_table's `slides` is a sheet of its own kind, checked with it)
        sheet = dataset_params(config, dataset_registry, ds).get("slides")
        if sheet:
            read_slide_sheet(sheet)


def check_encoder_weights(config: Mapping[str, Any]) -> None:
    """Every ``encoder_weights.<slug>`` override of the config is an existing file; the error names the key.

    Parameters
    ----------
    config : Mapping
        A filled config; its ``encoder_weights`` (slug -> local weight file, relative paths to the working
        directory).

    Raises
    ------
    FmauditInputError
        Naming ``encoder_weights.<slug>`` when its path does not exist or is not a file.
    """
    for enc, path in config["encoder_weights"].items():
        where = "" if Path(path).is_absolute() else f" (relative to {Path.cwd()})"
        if not Path(path).exists():
            raise FmauditInputError(f"config 'encoder_weights.{enc}': weight file {path} does not exist{where}")
        if not Path(path).is_file():
            raise FmauditInputError(f"config 'encoder_weights.{enc}': {path} is not a file{where}")


def unusable_encoders(config: Mapping[str, Any], encoder_registry: Mapping[str, Any],
                      encoders: list[str] | None = None) -> dict[str, str]:
    """``{slug: why}`` for the config's encoders (or ``encoders``) that cannot be embedded as the registry and the
    config stand, each message naming the key to set: remote code without a pinned commit
    (:func:`fmaudit.registry.check_encoder_usable`; ``encoder_revisions.<slug>``), or a registry weight file
    (``source: file``) that is not there and no ``encoder_weights.<slug>`` override.

    Parameters
    ----------
    config : Mapping
        A filled config; its ``encoders``, ``encoder_registry`` (file or files, named in messages) and
        ``encoder_weights`` are read.
    encoder_registry : Mapping
        Encoder slug -> registry entry, with ``encoder_revisions`` applied.
    encoders : list of str, optional
        The slugs to check; None (the default) checks every encoder of the config.

    Returns
    -------
    dict of str to str
        Slug -> why it cannot be embedded, only for the encoders that cannot; empty when all can.
    """
    files = config["encoder_registry"]
    registry_file = ", ".join(files) if isinstance(files, list) else str(files)
    problems = {}
    for enc in config["encoders"] if encoders is None else encoders:
        entry = encoder_registry[enc]
        try:
            check_encoder_usable(enc, entry, source=registry_file, config_key=f"encoder_revisions.{enc}")
        except FmauditInputError as e:
            problems[enc] = str(e)
            continue
        weights = entry["weights"]
        if weights["source"] == "file" and enc not in config["encoder_weights"] and not Path(weights["path"]).is_file():
            problems[enc] = (f"{registry_file}: encoder {enc!r}: weight file {weights['path']} (weights.path) does not "
                             f"exist (relative to {Path.cwd()}); give a local copy in the config's "
                             f"'encoder_weights.{enc}', or fix weights.path")
    return problems


# config files of a hub repo the pre-flight compares an entry with (fmaudit.encoders.hub)
_HUB_CONFIG_FILES = ("config.json", "preprocessor_config.json", "open_clip_config.json")


def _preflight_inputs(spec: Mapping[str, Any], override: str | None) -> list[list[Any]]:
    """What the pre-flight of an entry would read on this machine now: local weight files and cached hub config
    files, each ``[path, size, mtime_ns]``; cheap (no torch), so an unchanged encoder is not checked twice."""
    weights = spec["weights"]
    paths = []
    if override:
        paths.append(override)
    elif weights["source"] == "file":
        paths.append(weights["path"])
    if weights["source"] == "hf_hub":
        # the cache the embedding job reads (fmaudit.encoders.weights), from the environment as it is now
        cache = os.environ.get("HF_HUB_CACHE") or (os.path.join(os.environ["HF_HOME"], "hub")
                                                   if os.environ.get("HF_HOME") else None)
        default = "model.safetensors" if weights["format"] == "safetensors" else "pytorch_model.bin"
        names = list(_HUB_CONFIG_FILES) + ([] if override else [weights.get("filename") or default])
        for filename in names:
            hit = try_to_load_from_cache(weights["hf_hub_id"], filename, cache_dir=cache,
                                         revision=weights.get("revision"))
            if isinstance(hit, str):
                paths.append(hit)
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append([str(path), st.st_size, st.st_mtime_ns])
    return out


def check_encoders_before_embedding(config: Mapping[str, Any], encoder_registry: Mapping[str, Any]) -> dict[str, Any]:
    """The pre-flight of every encoder the config embeds
    (:func:`fmaudit.encoders.checks.check_encoder_before_embedding`: the entry against its hub repo's cached
    config, the sha256 of local weight files, their keys and shapes against the architecture on the meta device);
    raise one error listing every failure.

    Each encoder that passed is recorded in ``results/<study>/validation/encoders/<slug>.json`` with what was read
    (files with their size and modification time); while none of it changes, the checks are not run again, so a
    dry run or a job's own parse of the workflow pays them once. Returns ``{slug: record}`` of the encoders
    checked now.

    Parameters
    ----------
    config : Mapping
        A filled config; its embedded encoders (:func:`fmaudit.config.embedded_encoders`), ``encoder_weights``
        and results folder (where the records are written) are read.
    encoder_registry : Mapping
        Encoder slug -> registry entry, with ``encoder_revisions`` applied.

    Returns
    -------
    dict of str to Any
        Slug -> the record of its checks (:meth:`fmaudit.encoders.checks.PreflightRecord.as_dict`), for the encoders
        checked in this call; empty when every encoder was unchanged, random-initialised or not on this machine yet.

    Raises
    ------
    FmauditInputError
        One error listing every encoder that failed its checks.
    """
    registry_file = str(config["encoder_registry"])
    todo = {}
    for enc in embedded_encoders(config):
        spec = encoder_registry[enc]
        override = weights_override(config, encoder_registry, enc)
        inputs = _preflight_inputs(spec, override)
        if not inputs:  # random init, or nothing on this machine yet: the embedding job checks what it downloads
            continue
        key = stable_hash({"spec": embedding_spec(spec), "override": override, "inputs": inputs})
        record_path = Path(results_dir(config)) / "validation" / "encoders" / f"{enc}.json"
        try:
            if read_json(record_path).get("key") == key:
                continue
        except (OSError, ValueError):
            pass
        todo[enc] = (spec, override, key, record_path)
    if not todo:
        return {}
    # torch, timm, transformers and open_clip are imported only when there are weights or hub configs to check
    from fmaudit.encoders.checks import check_encoder_before_embedding

    problems, records = [], {}
    for enc, (spec, override, key, record_path) in todo.items():
        try:
            record = check_encoder_before_embedding(enc, spec, override=override,
                                                    override_key=f"encoder_weights.{enc}", source=registry_file)
        except FmauditInputError as e:
            problems.append(str(e))
            continue
        records[enc] = record.as_dict()
        write_json(record_path, {"key": key, **records[enc]})
    if problems:
        raise FmauditInputError("pre-flight of the encoders failed, before any embedding job:\n"
                                + "\n".join(f"  - {p}" for p in problems))
    return records


def registries(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (encoder, data-set) registries of a filled config: the built-in ones extended by the config's own
    files and inline entries (:func:`fmaudit.registry.load_encoder_registries`), with the encoders known only by
    feature files (``features`` data sets, :func:`fmaudit.datasets.own.precomputed_encoders`) added.

    Parameters
    ----------
    config : Mapping
        A filled config (:func:`fmaudit.config.fill_config`); its ``encoder_registry``, ``encoder_entries``,
        ``dataset_registry`` and ``dataset_entries`` are read, and the hub encoders it names are added.

    Returns
    -------
    tuple of (dict, dict)
        The encoder registry (slug -> entry) and the data-set registry (name -> entry). Unlike
        :func:`check_config`, nothing is checked and ``encoder_revisions`` are not applied.
    """
    encoders = add_hub_encoders(config, load_encoder_registries(config["encoder_registry"], config["encoder_entries"]))
    datasets = load_dataset_registries(config["dataset_registry"], config["dataset_entries"])
    encoders.update(precomputed_encoders(feature_imports(config, datasets), encoders))
    return encoders, datasets


def check_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every check of the plan stage, on a filled config (:func:`fmaudit.config.fill_config`); returns the
    (encoder, data-set) registries as the config sees them (its own registries added, ``encoder_revisions``
    applied). The workflow (``rules/common.smk``) and ``fmaudit check-config`` both call this.

    Parameters
    ----------
    config : Mapping
        A filled config (:func:`fmaudit.config.fill_config`).

    Returns
    -------
    tuple of (dict, dict)
        The encoder registry (slug -> entry, ``encoder_revisions`` applied, precomputed encoders added) and the
        data-set registry (name -> entry; an own data set without ``domains`` gets those its sheet lists).

    Raises
    ------
    FmauditInputError
        At the first failed check, naming the file, key or row.
    """
    encoders = add_hub_encoders(config, load_encoder_registries(config["encoder_registry"], config["encoder_entries"]))
    datasets = load_dataset_registries(config["dataset_registry"], config["dataset_entries"])
    for ds in config["datasets"]:
        if ds not in datasets:
            raise unknown_name_error("dataset", ds, list(datasets), "config 'datasets'")
    check_preparers(config, datasets)
    for ds, domains in check_own_data(config, datasets).items():
        # a task over one's own data without `domains:` transfers between the domains its sheet names
        datasets[ds] = {**datasets[ds], "domains": datasets[ds].get("domains") or domains}
    imports = feature_imports(config, datasets)
    encoders.update(precomputed_encoders(imports, encoders))
    check_names(config, encoders, datasets)
    encoders = apply_encoder_revisions(config, encoders)
    check_encoder_weights(config)
    check_grid(config, datasets)
    check_slide_sheets(config, datasets)
    check_feature_imports(config, datasets, encoders, imports)
    check_encoders_before_embedding(config, encoders)
    for path in config.get("claims") or []:  # a bad claims file stops the run now, not at the report
        load_claims(path)
    return encoders, datasets

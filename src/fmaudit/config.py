"""The workflow config: filled from its schema once, at load, and checked the same way by both faces.

``resources/schemas/config.schema.yaml`` is the one home of every workflow default. :func:`fill_config`
validates a config against it and writes every missing default into it (also inside ``studies.<name>.<section>``
and inside each task), so that code downstream reads ``config["calibration"]["ece_bins"]`` and never carries a
fallback of its own. The Snakefile (through ``rules/common.smk``) and the command line (:func:`load_config`)
both call it, so a config means the same numbers in the workflow and on the command line.

:func:`check_config` is every check the workflow runs before it plans a job (registries against their
schemas, names, the analysis grids, slide sheets, local weight files, and the encoders' pre-flight:
:func:`check_encoders_before_embedding`); ``fmaudit check-config`` runs exactly this function. It returns the
registries as this config sees them: encoders named by their hub repo added (:func:`add_hub_encoders`),
``encoder_revisions`` applied.

Encoders may be named by their Hugging Face repo (``timm:<org>/<repo>``, ``hf:<org>/<repo>``): :func:`fill_config`
replaces each such name by its slug (:func:`fmaudit.registry.hub_name_slug`) wherever the config names encoders
(``encoders``, each study's ``encoders``, the keys of ``encoder_weights`` and ``encoder_revisions``), so the
workflow's paths and wildcards only ever see slugs.
:func:`unusable_encoders` says which encoders cannot be embedded yet (remote code without a pinned commit):
the workflow warns about them when it plans and stops before the first job of a run that would embed one.

Everything a study writes goes under :func:`results_dir` (``results/<study>/``).

A study's section (``studies.<name>.probe`` ...) replaces the top-level one for the study's tasks; a study
without it uses the top-level section (:func:`fmaudit.grid.section`).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Mapping

from huggingface_hub import try_to_load_from_cache

from fmaudit.io import FmauditInputError, PathLike, read_json, stable_hash, write_json
from fmaudit.registry import (
    embedding_spec,
    hub_name_of_slug,
    hub_name_slug,
    is_hub_name,
    load_dataset_registry,
    load_registry,
    unknown_name_error,
)
from fmaudit.schema import load_schema, load_yaml, validate_against_schema

CONFIG_SCHEMA = "config.schema.yaml"

RESULTS_ROOT = "results"

__all__ = [
    "CONFIG_SCHEMA",
    "RESULTS_ROOT",
    "add_hub_encoders",
    "apply_encoder_revisions",
    "check_config",
    "check_encoder_weights",
    "check_encoders_before_embedding",
    "embedded_encoders",
    "encoder_from_reference",
    "check_names",
    "check_slide_sheets",
    "dataset_params",
    "fill_config",
    "fill_section",
    "load_config",
    "manifest_file",
    "results_dir",
    "normalise_encoder_names",
    "schema_default",
    "unusable_encoders",
    "weights_override",
]


def results_dir(config: Mapping[str, Any]) -> str:
    """``results/<study>``: the folder everything of this config's study goes under (relative to the working
    directory, the repository root for the workflow)."""
    return f"{RESULTS_ROOT}/{config['study']}"


def manifest_file(config: Mapping[str, Any], dataset: str) -> str:
    """Where the workflow writes a data set's manifest (``dataset`` may be the ``{dataset}`` wildcard)."""
    return f"{results_dir(config)}/manifests/{dataset}.parquet"


def fill_config(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Validate ``config`` against the config schema and fill in every default, in place; returns it.

    The error names ``source`` and every offending key (``probe.fractions.0: ...``). Encoders named by their hub
    repo are then replaced by their slugs (:func:`normalise_encoder_names`)."""
    validate_against_schema(config, load_schema(CONFIG_SCHEMA), name=source, fill_defaults=True, sep=".")
    return normalise_encoder_names(config, source)


def normalise_encoder_names(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Every ``timm:<org>/<repo>`` / ``hf:<org>/<repo>`` encoder name of a filled config replaced by its slug, in
    place (module doc); a name given twice, as a hub name and as its slug, is an error naming the key."""
    def slug(name: str) -> str:
        return hub_name_slug(name) if is_hub_name(name) else name

    def slugs(names: list[str], key: str) -> list[str]:
        out = [slug(n) for n in names]
        if len(set(out)) != len(out):
            twice = next(n for n in out if out.count(n) > 1)
            raise FmauditInputError(f"{source}: '{key}' names encoder {twice!r} twice (as a hub name and as its slug)")
        return out

    config["encoders"] = slugs(config["encoders"], "encoders")
    for study, spec in (config.get("studies") or {}).items():
        spec["encoders"] = slugs(spec["encoders"], f"studies.{study}.encoders")
    for key in ("encoder_weights", "encoder_revisions"):
        renamed = slugs(list(config[key]), key)
        config[key] = dict(zip(renamed, config[key].values()))
    return config


def load_config(path: PathLike) -> dict[str, Any]:
    """Read a config file and :func:`fill_config` it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: config file not found")
    config = load_yaml(path) or {}
    if not isinstance(config, dict):
        raise FmauditInputError(f"{path}: a config must be a mapping of keys to values")
    return fill_config(config, source=str(path))


def _section_schema(name: str) -> dict[str, Any]:
    schema = load_schema(CONFIG_SCHEMA)
    if name not in schema["properties"]:
        raise FmauditInputError(f"unknown config section {name!r}")
    return {"$schema": schema["$schema"], "$defs": schema.get("$defs", {}), **schema["properties"][name]}


def fill_section(name: str, values: Mapping[str, Any], source: str | None = None) -> dict[str, Any]:
    """One top-level section (``probe``, ``calibration``, ``bootstrap`` ...) validated and filled from the
    schema: the command line builds its settings this way, so they mean what the workflow's mean."""
    section = dict(values)
    return validate_against_schema(section, _section_schema(name), name=source or f"config {name!r}",
                                   fill_defaults=True, sep=".")


def schema_default(*keys: str) -> Any:
    """The schema's default of a setting, e.g. ``schema_default("calibration", "kshot_k")`` or
    ``schema_default("dataset_registry")`` (command-line option defaults read it)."""
    node: Mapping[str, Any] = load_schema(CONFIG_SCHEMA)
    for key in keys:
        node = node["properties"][key]
    if "default" not in node:
        raise KeyError(f"config schema: {'.'.join(keys)} has no default")
    return copy.deepcopy(node["default"])


def add_hub_encoders(config: Mapping[str, Any], encoder_registry: Mapping[str, Any]) -> dict[str, Any]:
    """The encoder registry with an entry for every encoder the config names by its hub repo, built from the
    repo's config files in the local Hugging Face cache (:func:`fmaudit.encoders.hub.resolve_hub_encoder`, at
    the config's ``encoder_revisions.<slug>`` when set); an uncached or unusable repo is an error naming the
    config key and the name, before any job."""
    named = [enc for enc in config["encoders"] if hub_name_of_slug(enc) and enc not in encoder_registry]
    if not named:
        return dict(encoder_registry)
    # torch, timm, transformers and open_clip are imported only when a config names an encoder by its hub repo
    from fmaudit.encoders.hub import resolve_hub_encoder

    registry = dict(encoder_registry)
    for enc in named:
        try:
            registry[enc] = resolve_hub_encoder(hub_name_of_slug(enc), revision=config["encoder_revisions"].get(enc))
        except FmauditInputError as e:
            raise FmauditInputError(f"config 'encoders': {hub_name_of_slug(enc)}: {e}") from e
    return registry


#: Suffixes of a checkpoint file named where an encoder is expected (``fmaudit embed --encoder FILE``).
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")


def encoder_from_reference(reference: str, encoder_registry: Mapping[str, Any], architecture: str | None = None,
                           where: str = "--encoder") -> tuple[str, dict[str, Any], str | None]:
    """``(slug, entry, weights override)`` of an encoder as a user names it outside a config (``fmaudit embed``):
    a registry slug, a hub name (``timm:<org>/<repo>``, ``hf:<org>/<repo>``, resolved from the local cache as in
    a config), or a local checkpoint file, whose architecture and preprocessing are those of ``architecture`` (a
    registry slug or hub name) and which overrides that entry's weights. Errors name ``where``."""
    path = Path(reference)
    if is_hub_name(reference):
        from fmaudit.encoders.hub import resolve_hub_encoder  # torch and the model libraries: only for hub names

        try:
            entry = resolve_hub_encoder(reference)
        except FmauditInputError as e:
            raise FmauditInputError(f"{where} {reference}: {e}") from e
        return entry["name"], {k: v for k, v in entry.items() if k != "name"}, None
    if reference in encoder_registry:
        return reference, dict(encoder_registry[reference]), None
    if path.suffix.lower() in CHECKPOINT_SUFFIXES or path.exists():
        if not path.is_file():
            raise FmauditInputError(f"{where} {reference}: checkpoint file not found")
        if architecture is None:
            raise FmauditInputError(
                f"{where} {reference}: a checkpoint file holds weights, not the network they fit; name its "
                f"architecture with --architecture (a registry slug, or timm:<org>/<repo> / hf:<org>/<repo>)")
        slug, entry, _ = encoder_from_reference(architecture, encoder_registry, where="--architecture")
        return slug, entry, str(path)
    raise unknown_name_error("encoder", reference, list(encoder_registry), where)


def check_names(config: Mapping[str, Any], encoder_registry: Mapping[str, Any],
                dataset_registry: Mapping[str, Any]) -> None:
    """Every encoder, data set and task reference of the config exists; raise naming the first that doesn't."""
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


def dataset_params(config: Mapping[str, Any], dataset_registry: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    """Preparer parameters of one data set: the registry's (the preparer's defaults) overridden by the config."""
    entry = dataset_registry[dataset]
    params = dict(entry["params"])
    overrides = config["dataset_params"].get(dataset) or {}
    unknown = [k for k in overrides if params and k not in params]
    if unknown:
        raise unknown_name_error("parameter", unknown[0], list(params), f"config 'dataset_params.{dataset}'")
    params.update(overrides)
    return params


def check_slide_sheets(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> None:
    """Validate every slide sheet the config's data sets use, so a bad sheet stops the run before any job."""
    from fmaudit.datasets.slide_tiles import read_slide_sheet

    for ds in config["datasets"]:
        sheet = dataset_params(config, dataset_registry, ds).get("slides")
        if sheet:
            read_slide_sheet(sheet)


def apply_encoder_revisions(config: Mapping[str, Any], encoder_registry: Mapping[str, Any]) -> dict[str, Any]:
    """The encoder registry as this config sees it: ``encoder_revisions.<slug>`` replaces that (hub) entry's
    ``weights.revision``; the other entries are shared, unchanged."""
    registry = dict(encoder_registry)
    for enc, revision in config["encoder_revisions"].items():
        entry = copy.deepcopy(dict(registry[enc]))
        if entry["weights"]["source"] != "hf_hub":
            raise FmauditInputError(
                f"config 'encoder_revisions.{enc}': encoder {enc!r} does not load its weights from the Hugging Face "
                f"hub (weights.source: {entry['weights']['source']}); a revision applies to hub entries only")
        entry["weights"]["revision"] = revision
        registry[enc] = entry
    return registry


def check_encoder_weights(config: Mapping[str, Any]) -> None:
    """Every ``encoder_weights.<slug>`` override of the config is an existing file; the error names the key."""
    for enc, path in config["encoder_weights"].items():
        where = "" if Path(path).is_absolute() else f" (relative to {Path.cwd()})"
        if not Path(path).exists():
            raise FmauditInputError(f"config 'encoder_weights.{enc}': weight file {path} does not exist{where}")
        if not Path(path).is_file():
            raise FmauditInputError(f"config 'encoder_weights.{enc}': {path} is not a file{where}")


def embedded_encoders(config: Mapping[str, Any]) -> list[str]:
    """Every encoder the config embeds: its encoders, then their declared variants (``variants``)."""
    return list(dict.fromkeys([*config["encoders"], *config["variants"]]))


def weights_override(config: Mapping[str, Any], encoder_registry: Mapping[str, Any], encoder: str) -> str | None:
    """The config's local checkpoint for ``encoder`` (``encoder_weights``), or None; a declared variant uses its
    base's."""
    base = encoder_registry[encoder].get("variant_of")
    return config["encoder_weights"].get(encoder) or (config["encoder_weights"].get(base) if base else None) or None


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
    checked now."""
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


def unusable_encoders(config: Mapping[str, Any], encoder_registry: Mapping[str, Any],
                      encoders: list[str] | None = None) -> dict[str, str]:
    """``{slug: why}`` for the config's encoders (or ``encoders``) that cannot be embedded as the registry and the
    config stand, each message naming the key to set: remote code without a pinned commit
    (:func:`fmaudit.registry.check_encoder_usable`; ``encoder_revisions.<slug>``), or a registry weight file
    (``source: file``) that is not there and no ``encoder_weights.<slug>`` override."""
    from fmaudit.registry import check_encoder_usable

    registry_file = str(config["encoder_registry"])
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


def check_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every check the workflow runs before planning a job, on a filled config; returns the (encoder, data-set)
    registries as the config sees them (``encoder_revisions`` applied). The workflow (``rules/common.smk``) and
    ``fmaudit check-config`` both call this."""
    from fmaudit.grid import check_grid

    encoders = add_hub_encoders(config, load_registry(config["encoder_registry"]))
    datasets = load_dataset_registry(config["dataset_registry"])
    check_names(config, encoders, datasets)
    encoders = apply_encoder_revisions(config, encoders)
    check_encoder_weights(config)
    check_grid(config, datasets)
    check_slide_sheets(config, datasets)
    check_encoders_before_embedding(config, encoders)
    return encoders, datasets

"""The workflow config: filled from its schema once, at load, the same way by both faces.

``resources/schemas/config.schema.yaml`` is the one home of every workflow default. :func:`fill_config`
validates a config against it and writes every missing default into it (also inside ``studies.<name>.<section>``
and inside each task), so that code downstream reads ``config["calibration"]["ece_bins"]`` and never carries a
fallback of its own. The Snakefile (through ``rules/common.smk``) and the command line (:func:`load_config`)
both call it, so a config means the same numbers in the workflow and on the command line.

Encoders may be named by their Hugging Face repo (``timm:<org>/<repo>``, ``hf:<org>/<repo>``): :func:`fill_config`
replaces each such name by its slug (:func:`fmaudit.registry.hub_name_slug`) wherever the config names encoders
(``encoders``, each study's ``encoders``, the keys of ``encoder_weights`` and ``encoder_revisions``), so the
workflow's paths and wildcards only ever see slugs; :func:`add_hub_encoders` adds their registry entries.

The checks a config can fail before its first job (names, grids, registries, weight files, the encoders'
pre-flight, and the data checks of the ``validate`` stage) live one layer up, in :mod:`fmaudit.preflight`.

Everything a study writes goes under :func:`results_dir` (``results/<study>/``).

A study's section (``studies.<name>.probe`` ...) replaces the top-level one for the study's tasks; a study
without it uses the top-level section (:func:`fmaudit.grid.section`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

from fmaudit.io import FmauditInputError, PathLike
from fmaudit.registry import hub_name_of_slug, hub_name_slug, is_hub_name, unknown_name_error
from fmaudit.schema import load_schema, load_yaml, validate_against_schema

CONFIG_SCHEMA = "config.schema.yaml"

RESULTS_ROOT = "results"

__all__ = [
    "CONFIG_SCHEMA",
    "RESULTS_ROOT",
    "add_hub_encoders",
    "apply_encoder_revisions",
    "dataset_params",
    "embedded_encoders",
    "encoder_from_reference",
    "fill_config",
    "fill_section",
    "load_config",
    "manifest_file",
    "normalise_encoder_names",
    "results_dir",
    "schema_default",
    "weights_override",
]


def results_dir(config: Mapping[str, Any]) -> str:
    """``results/<study>``: the folder everything of this config's study goes under (relative to the working
    directory, the repository root for the workflow).

    Parameters
    ----------
    config : Mapping
        A config with ``study`` (the study's name).

    Returns
    -------
    str
    """
    return f"{RESULTS_ROOT}/{config['study']}"


def manifest_file(config: Mapping[str, Any], dataset: str) -> str:
    """Where the workflow writes a data set's manifest (``dataset`` may be the ``{dataset}`` wildcard).

    Parameters
    ----------
    config : Mapping
        A config with ``study``.
    dataset : str
        A data-set name, or the ``{dataset}`` wildcard.

    Returns
    -------
    str
        ``results/<study>/manifests/<dataset>.parquet``.
    """
    return f"{results_dir(config)}/manifests/{dataset}.parquet"


def fill_config(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Validate ``config`` against the config schema and fill in every default, in place; returns it.

    The error names ``source`` and every offending key (``probe.fractions.0: ...``). Encoders named by their hub
    repo are then replaced by their slugs (:func:`normalise_encoder_names`).

    Parameters
    ----------
    config : dict
        A config as parsed from YAML; filled in place.
    source : str
        What the config is (its file), first in the error.

    Returns
    -------
    dict
        ``config`` itself, filled.

    Raises
    ------
    FmauditInputError
        Listing every key that does not match the schema, or an encoder named twice.
    """
    validate_against_schema(config, load_schema(CONFIG_SCHEMA), name=source, fill_defaults=True, sep=".")
    return normalise_encoder_names(config, source)


def normalise_encoder_names(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Every ``timm:<org>/<repo>`` / ``hf:<org>/<repo>`` encoder name of a filled config replaced by its slug, in
    place (module doc); a name given twice, as a hub name and as its slug, is an error naming the key.

    Parameters
    ----------
    config : dict
        A filled config; changed in place.
    source : str
        What the config is (its file), for the error.

    Returns
    -------
    dict
        ``config`` itself.

    Raises
    ------
    FmauditInputError
        When a list or mapping names the same encoder as a hub name and as its slug.
    """
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
    """Read a config file and :func:`fill_config` it.

    Parameters
    ----------
    path : path-like
        The config's YAML file.

    Returns
    -------
    dict
        The filled config.

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        When it is not a mapping, or does not match the schema.
    """
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
        raise FmauditInputError(f"unknown config block {name!r}")
    return {"$schema": schema["$schema"], "$defs": schema.get("$defs", {}), **schema["properties"][name]}


def fill_section(name: str, values: Mapping[str, Any], source: str | None = None) -> dict[str, Any]:
    """One top-level section (``probe``, ``calibration``, ``bootstrap`` ...) validated and filled from the
    schema: the command line builds its settings this way, so they mean what the workflow's mean.

    Parameters
    ----------
    name : str
        A top-level key of the config schema that is a block.
    values : Mapping
        The block's values as given (copied, not changed).
    source : str, optional
        What the values are, first in the error; None: ``config '<name>'``.

    Returns
    -------
    dict
        The block validated, with every default filled.

    Raises
    ------
    FmauditInputError
        For an unknown block, or values that do not match its schema.
    """
    section = dict(values)
    return validate_against_schema(section, _section_schema(name), name=source or f"config {name!r}",
                                   fill_defaults=True, sep=".")


def schema_default(*keys: str) -> Any:
    """The schema's default of a setting, e.g. ``schema_default("calibration", "kshot_k")`` or
    ``schema_default("dataset_registry")`` (command-line option defaults read it).

    Parameters
    ----------
    *keys : str
        The setting's path, one key per argument (``"probe", "C"``).

    Returns
    -------
    Any
        A deep copy of the default.

    Raises
    ------
    KeyError
        When the path does not exist in the schema or has no default.
    """
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
    config key and the name, before any job.

    Parameters
    ----------
    config : Mapping
        A filled config (encoders already slugs; ``encoder_revisions``).
    encoder_registry : Mapping
        Slug -> registry entry, not changed; a hub-named slug already in it is kept.

    Returns
    -------
    dict
        A new registry with the hub-named encoders' entries added.

    Raises
    ------
    FmauditInputError
        Naming the encoder when its repo cannot be resolved from the cache.
    """
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
    registry slug or hub name) and which overrides that entry's weights. Errors name ``where``.

    Parameters
    ----------
    reference : str
        A registry slug, a hub name, or a checkpoint file path.
    encoder_registry : Mapping
        Slug -> registry entry.
    architecture : str, optional
        For a checkpoint file: the slug or hub name of the entry whose network and preprocessing it fits.
    where : str
        The option or key that named ``reference``, for errors.

    Returns
    -------
    tuple of (str, dict, str or None)
        The slug, its registry entry (without ``name``) and the checkpoint path that overrides its weights (None
        unless ``reference`` is a file).

    Raises
    ------
    FmauditInputError
        For an unknown name (with a close spelling), a missing checkpoint file, or a checkpoint without
        ``architecture``.
    """
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


def dataset_params(config: Mapping[str, Any], dataset_registry: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    """Preparer parameters of one data set: the registry's (the preparer's defaults) overridden by the config.

    Parameters
    ----------
    config : Mapping
        A filled config; its ``dataset_params.<dataset>``.
    dataset_registry : Mapping
        Data-set name -> registry entry (its ``params``).
    dataset : str
        The data set.

    Returns
    -------
    dict
        A new dict: the entry's params updated by the config's.

    Raises
    ------
    FmauditInputError
        When the config sets a parameter the entry does not have (an entry without params accepts any).
    """
    entry = dataset_registry[dataset]
    params = dict(entry["params"])
    overrides = config["dataset_params"].get(dataset) or {}
    unknown = [k for k in overrides if params and k not in params]
    if unknown:
        raise unknown_name_error("parameter", unknown[0], list(params), f"config 'dataset_params.{dataset}'")
    params.update(overrides)
    return params


def apply_encoder_revisions(config: Mapping[str, Any], encoder_registry: Mapping[str, Any]) -> dict[str, Any]:
    """The encoder registry as this config sees it: ``encoder_revisions.<slug>`` replaces that (hub) entry's
    ``weights.revision``; the other entries are shared, unchanged.

    Parameters
    ----------
    config : Mapping
        A filled config; its ``encoder_revisions`` (slug -> branch, tag or commit).
    encoder_registry : Mapping
        Slug -> registry entry; not changed.

    Returns
    -------
    dict
        A new registry; revised entries are deep copies.

    Raises
    ------
    FmauditInputError
        When a revised encoder's weights are not on the hub.
    """
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


def embedded_encoders(config: Mapping[str, Any]) -> list[str]:
    """Every encoder the config embeds: its encoders, then their declared variants (``variants``).

    Parameters
    ----------
    config : Mapping
        A filled config (``encoders``, ``variants``).

    Returns
    -------
    list of str
        Slugs in that order, each once.
    """
    return list(dict.fromkeys([*config["encoders"], *config["variants"]]))


def weights_override(config: Mapping[str, Any], encoder_registry: Mapping[str, Any], encoder: str) -> str | None:
    """The config's local checkpoint for ``encoder`` (``encoder_weights``), or None; a declared variant uses its
    base's.

    Parameters
    ----------
    config : Mapping
        A filled config (``encoder_weights``: slug -> local file).
    encoder_registry : Mapping
        Slug -> registry entry (``variant_of``).
    encoder : str
        The encoder's slug.

    Returns
    -------
    str or None
    """
    base = encoder_registry[encoder].get("variant_of")
    return config["encoder_weights"].get(encoder) or (config["encoder_weights"].get(base) if base else None) or None

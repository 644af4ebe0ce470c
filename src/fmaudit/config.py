"""The workflow config: filled from its schema once, at load, and checked the same way by both faces.

``resources/schemas/config.schema.yaml`` is the one home of every workflow default. :func:`fill_config`
validates a config against it and writes every missing default into it (also inside ``studies.<name>.<section>``
and inside each task), so that code downstream reads ``config["calibration"]["ece_bins"]`` and never carries a
fallback of its own. The Snakefile (through ``rules/common.smk``) and the command line (:func:`load_config`)
both call it, so a config means the same numbers in the workflow and on the command line.

:func:`check_config` is every check the workflow runs before it plans a job (registries against their
schemas, names, the analysis grids, slide sheets); ``fmaudit check-config`` runs exactly this function.

A study's section (``studies.<name>.probe`` ...) replaces the top-level one for the study's tasks; a study
without it uses the top-level section (:func:`fmaudit.grid.section`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

from fmaudit.io import FmauditInputError, PathLike
from fmaudit.registry import load_dataset_registry, load_registry, unknown_name_error
from fmaudit.schema import load_schema, load_yaml, validate_against_schema

CONFIG_SCHEMA = "config.schema.yaml"

__all__ = [
    "CONFIG_SCHEMA",
    "check_config",
    "check_names",
    "check_slide_sheets",
    "dataset_params",
    "fill_config",
    "fill_section",
    "load_config",
    "schema_default",
]


def fill_config(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Validate ``config`` against the config schema and fill in every default, in place; returns it.

    The error names ``source`` and every offending key (``probe.fractions.0: ...``)."""
    return validate_against_schema(config, load_schema(CONFIG_SCHEMA), name=source, fill_defaults=True, sep=".")


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
    for enc in config["encoder_weights"]:
        if enc not in config["encoders"]:
            raise unknown_name_error("encoder", enc, list(config["encoders"]), "config 'encoder_weights'")
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


def check_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every check the workflow runs before planning a job, on a filled config; returns the (encoder, data-set)
    registries it loaded. The workflow (``rules/common.smk``) and ``fmaudit check-config`` both call this."""
    from fmaudit.grid import check_grid

    encoders = load_registry(config["encoder_registry"])
    datasets = load_dataset_registry(config["dataset_registry"])
    check_names(config, encoders, datasets)
    check_grid(config, datasets)
    check_slide_sheets(config, datasets)
    return encoders, datasets

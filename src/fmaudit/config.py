"""The workflow config: filled from its schema once, at load, and checked the same way by both faces.

``resources/schemas/config.schema.yaml`` is the one home of every workflow default. :func:`fill_config`
validates a config against it and writes every missing default into it (also inside ``studies.<name>.<section>``
and inside each task), so that code downstream reads ``config["calibration"]["ece_bins"]`` and never carries a
fallback of its own. The Snakefile (through ``rules/common.smk``) and the command line (:func:`load_config`)
both call it, so a config means the same numbers in the workflow and on the command line.

:func:`check_config` is every check the workflow runs before it plans a job (registries against their
schemas, names, the analysis grids, slide sheets, local weight files); ``fmaudit check-config`` runs exactly
this function. It returns the registries as this config sees them: ``encoder_revisions`` applied.
:func:`unusable_encoders` says which encoders cannot be embedded yet (remote code without a pinned commit):
the workflow warns about them when it plans and stops before the first job of a run that would embed one.

Everything a study writes goes under :func:`results_dir` (``results/<study>/``).

A study's section (``studies.<name>.probe`` ...) replaces the top-level one for the study's tasks; a study
without it uses the top-level section (:func:`fmaudit.grid.section`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

from fmaudit.claims import load_claims
from fmaudit.io import FmauditInputError, PathLike
from fmaudit.registry import load_dataset_registry, load_registry, unknown_name_error
from fmaudit.schema import load_schema, load_yaml, validate_against_schema

CONFIG_SCHEMA = "config.schema.yaml"

RESULTS_ROOT = "results"

__all__ = [
    "CONFIG_SCHEMA",
    "RESULTS_ROOT",
    "apply_encoder_revisions",
    "check_config",
    "check_encoder_weights",
    "check_names",
    "check_slide_sheets",
    "dataset_params",
    "fill_config",
    "fill_section",
    "load_config",
    "manifest_file",
    "results_dir",
    "schema_default",
    "unusable_encoders",
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

    encoders = load_registry(config["encoder_registry"])
    datasets = load_dataset_registry(config["dataset_registry"])
    check_names(config, encoders, datasets)
    encoders = apply_encoder_revisions(config, encoders)
    check_encoder_weights(config)
    check_grid(config, datasets)
    check_slide_sheets(config, datasets)
    for path in config.get("claims") or []:  # a bad claims file stops the run now, not at the report
        load_claims(path)
    return encoders, datasets

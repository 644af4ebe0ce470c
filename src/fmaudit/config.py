"""The workflow config: filled from its schema once, at load, the same way by both faces.

``resources/schemas/config.schema.yaml`` is the one home of every workflow default. :func:`fill_config`
validates a config against it and writes every missing default into it (also inside ``studies.<name>.<section>``
and inside each task), so that code downstream reads ``config["calibration"]["ece_bins"]`` and never carries a
fallback of its own. The Snakefile (through ``rules/common.smk``) and the command line (:func:`load_config`)
both call it, so a config means the same numbers in the workflow and on the command line.

The checks a config can fail before its first job (names, grids, registries, weight files, and the data
checks of the ``validate`` stage) live one layer up, in :mod:`fmaudit.preflight`.

Everything a study writes goes under :func:`results_dir` (``results/<study>/``).

A study's section (``studies.<name>.probe`` ...) replaces the top-level one for the study's tasks; a study
without it uses the top-level section (:func:`fmaudit.grid.section`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

from fmaudit.io import FmauditInputError, PathLike
from fmaudit.registry import unknown_name_error
from fmaudit.schema import load_schema, load_yaml, validate_against_schema

CONFIG_SCHEMA = "config.schema.yaml"

RESULTS_ROOT = "results"

__all__ = [
    "CONFIG_SCHEMA",
    "RESULTS_ROOT",
    "apply_encoder_revisions",
    "dataset_params",
    "fill_config",
    "fill_section",
    "load_config",
    "manifest_file",
    "results_dir",
    "schema_default",
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

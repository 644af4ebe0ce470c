"""Loading and checking a workflow config outside Snakemake (the command line uses this).

The Snakefile validates with ``snakemake.utils.validate`` against the same schema and then calls
:func:`check_names`, so a typo stops both faces with the same message.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any, Mapping

import yaml

from fmaudit.io import FmauditInputError

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_SCHEMA = REPO_ROOT / "resources" / "schemas" / "config.schema.yaml"


def _validator_with_defaults(schema: Mapping[str, Any]):
    import jsonschema

    base = jsonschema.Draft202012Validator

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    cls = jsonschema.validators.extend(base, {"properties": set_defaults})
    return cls(schema)


def validate_config(config: dict[str, Any], schema_path: str | Path = CONFIG_SCHEMA, source: str = "config") -> dict[str, Any]:
    """Validate (filling defaults) and return the config; the error names the offending key."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = _validator_with_defaults(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        raise FmauditInputError(f"{source}: invalid value at {where!r}: {e.message}")
    return config


def load_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: config file not found")
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise FmauditInputError(f"{path}: not valid YAML ({e})") from e
    return validate_config(config, source=str(path))


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = REPO_ROOT / path
    if not path.exists():
        raise FileNotFoundError(f"{path}: registry not found")
    return yaml.safe_load(path.read_text()) or {}


def _unknown(kind: str, name: str, known: list[str], where: str) -> FmauditInputError:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    return FmauditInputError(f"{where}: unknown {kind} {name!r}{hint} (known: {', '.join(sorted(known))})")


def check_names(config: Mapping[str, Any], encoder_registry: Mapping[str, Any],
                dataset_registry: Mapping[str, Any]) -> None:
    """Every encoder, data set and task reference of the config exists; raise naming the first that doesn't."""
    for enc in config["encoders"]:
        if enc not in encoder_registry:
            raise _unknown("encoder", enc, list(encoder_registry), "config 'encoders'")
    for ds in config["datasets"]:
        if ds not in dataset_registry:
            raise _unknown("dataset", ds, list(dataset_registry), "config 'datasets'")
    for ds in config.get("dataset_params") or {}:
        if ds not in config["datasets"]:
            raise _unknown("dataset", ds, list(config["datasets"]), "config 'dataset_params'")
    for enc in config.get("encoder_weights") or {}:
        if enc not in config["encoders"]:
            raise _unknown("encoder", enc, list(config["encoders"]), "config 'encoder_weights'")
    for task, spec in config["tasks"].items():
        for ds in spec["datasets"]:
            if ds not in config["datasets"]:
                raise _unknown("dataset", ds, list(config["datasets"]), f"config 'tasks.{task}.datasets'")


def dataset_params(config: Mapping[str, Any], dataset_registry: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    """Preparer parameters of one data set: registry defaults overridden by the config."""
    entry = dataset_registry[dataset]
    params = dict(entry.get("params") or {})
    overrides = (config.get("dataset_params") or {}).get(dataset) or {}
    unknown = [k for k in overrides if params and k not in params]
    if unknown:
        raise _unknown("parameter", unknown[0], list(params), f"config 'dataset_params.{dataset}'")
    params.update(overrides)
    return params


def check_slide_sheets(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> None:
    """Validate every slide sheet the config's data sets use, so a bad sheet stops the run before any job."""
    from fmaudit.datasets.slide_tiles import read_slide_sheet

    for ds in config["datasets"]:
        sheet = dataset_params(config, dataset_registry, ds).get("slides")
        if sheet:
            read_slide_sheet(sheet)

"""Registries of named things (encoders, data sets): YAML files validated against a JSON schema at load.

Foundation layer: imports only :mod:`fmaudit.io`. A registry is a mapping ``slug -> entry``; an unknown slug
raises :class:`~fmaudit.io.FmauditInputError` with close matches. Conventions:

- The encoder registry is ``resources/encoders.yaml`` of the source tree, unless the environment variable
  ``FMAUDIT_ENCODER_REGISTRY`` or the ``path`` argument names another file (the argument wins).
- YAML anchors and ``<<`` merges are allowed; a key repeated within one mapping is an error (plain YAML would
  silently keep the last one).
- An entry returned by :func:`get_encoder_spec` is a copy with its slug added under ``name``;
  :func:`encoder_config_hash` ignores ``name``, so the hash is that of the entry as written in the registry.
"""

from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from fmaudit.io import FmauditInputError, PathLike, stable_hash

REPO_ROOT = Path(__file__).resolve().parents[2]
RESOURCES = REPO_ROOT / "resources"
ENCODER_REGISTRY = RESOURCES / "encoders.yaml"
ENCODER_SCHEMA = RESOURCES / "schemas" / "encoders.schema.yaml"
ENCODER_REGISTRY_ENV = "FMAUDIT_ENCODER_REGISTRY"

READOUT_WIDTH_FACTOR = {"cls": 1, "mean": 1, "cls_mean": 2, "patch_grid": 1}


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml parses ~10x faster
    """SafeLoader that rejects a key repeated within one mapping (merge keys excepted)."""

    def construct_mapping(self, node, deep=False):  # noqa: D102 - yaml hook
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml(path: PathLike) -> Any:
    """Parse a YAML file (anchors allowed, duplicate keys rejected); errors name the file and line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with open(path) as fh:
            return yaml.load(fh, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise FmauditInputError(f"{path}: invalid YAML: {e}") from e


def _error_location(error) -> str:
    parts = [str(p) for p in error.absolute_path]
    return "/".join(parts) if parts else "(top level)"


def validate_against_schema(data: Any, schema: Mapping[str, Any], name: str) -> None:
    """Validate ``data`` against a JSON schema; raise one FmauditInputError listing every violation by key."""
    import jsonschema

    validator_cls = jsonschema.validators.validator_for(schema)
    validator = validator_cls(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])
    if not errors:
        return
    lines = []
    for err in errors:
        # anyOf/oneOf failures carry the branch errors in .context; the deepest one names the key best
        leaf = err
        while leaf.context:
            leaf = max(leaf.context, key=lambda e: len(e.absolute_path))
        lines.append(f"  {_error_location(leaf)}: {leaf.message}")
    raise FmauditInputError(f"{name}: does not match its schema:\n" + "\n".join(lines))


def load_yaml_registry(path: PathLike, schema_path: PathLike) -> dict[str, dict[str, Any]]:
    """A registry file (mapping slug -> entry) validated against ``schema_path``."""
    data = load_yaml(path)
    if not isinstance(data, dict) or not data:
        raise FmauditInputError(f"{path}: a registry must be a non-empty mapping of slug -> entry")
    validate_against_schema(data, load_yaml(schema_path), name=str(path))
    return data


def encoder_registry_path(path: PathLike | None = None) -> Path:
    """The encoder registry in use: ``path``, else $FMAUDIT_ENCODER_REGISTRY, else resources/encoders.yaml."""
    if path is not None:
        return Path(path)
    env = os.environ.get(ENCODER_REGISTRY_ENV)
    return Path(env) if env else ENCODER_REGISTRY


def check_encoder_entry(name: str, entry: Mapping[str, Any], source: str = "encoder registry") -> None:
    """Consistency rules a JSON schema cannot state (raise FmauditInputError naming the entry)."""
    where = f"{source}: encoder {name!r}"
    readouts = list(entry["readouts"])
    default = entry.get("default_readout")
    if default is not None and default not in readouts:
        raise FmauditInputError(f"{where}: default_readout {default!r} is not among readouts {readouts}")
    prefix = entry.get("num_prefix_tokens")
    if prefix == 0 and {"cls", "cls_mean"} & set(readouts):
        raise FmauditInputError(f"{where}: readouts cls/cls_mean need a class token but num_prefix_tokens is 0")
    weights = entry["weights"]
    if weights.get("allow_pickle") and weights.get("format") != "torch":
        raise FmauditInputError(f"{where}: allow_pickle only applies to format: torch")
    if entry.get("trust_remote_code") and entry["loader"] != "transformers":
        raise FmauditInputError(f"{where}: trust_remote_code only applies to the transformers loader")


def load_registry(path: PathLike | None = None, schema_path: PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The encoder registry, validated (schema + :func:`check_encoder_entry`); see module doc for the path."""
    reg_path = encoder_registry_path(path)
    registry = load_yaml_registry(reg_path, schema_path or ENCODER_SCHEMA)
    for name, entry in registry.items():
        check_encoder_entry(name, entry, source=str(reg_path))
    return registry


def unknown_name_error(kind: str, name: str, known: list[str], where: str = "") -> FmauditInputError:
    """FmauditInputError for an unknown slug, with difflib suggestions and the known slugs."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    prefix = f"{where}: " if where else ""
    return FmauditInputError(f"{prefix}unknown {kind} {name!r}{hint} known: {', '.join(sorted(known))}")


def check_encoder_usable(name: str, entry: Mapping[str, Any], source: str = "encoder registry") -> None:
    """Rules for an entry a config actually uses (the registry may list entries not usable yet).

    An entry with ``trust_remote_code: true`` runs Python code from its hub repo, so it must pin the commit
    of that code: ``weights.revision: null`` (no published commit known) stops here, naming the key. Call it
    for every encoder a config names, at config time, and before building a network with remote code.
    """
    weights = entry.get("weights") or {}
    if entry.get("trust_remote_code") and not weights.get("revision"):
        repo = weights.get("hf_hub_id", "its hub repo")
        raise FmauditInputError(
            f"{source}: encoder {name!r}: weights.revision is not set, and trust_remote_code: true runs Python "
            f"code from {repo} in the embedding job; set weights.revision to the 40-character commit hash of "
            f"the {repo} revision whose code you reviewed (its 'Files and versions' history on the hub)")


def get_encoder_spec(name: str, registry: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A copy of encoder ``name``'s registry entry, with ``name`` added."""
    registry = load_registry() if registry is None else registry
    if name not in registry:
        raise unknown_name_error("encoder", name, list(registry))
    spec = copy.deepcopy(dict(registry[name]))
    spec["name"] = name
    return spec


def encoder_config_hash(spec: Mapping[str, Any]) -> str:
    """Provenance hash of an encoder entry (the key ``name`` is ignored): any change to the entry changes it."""
    return stable_hash({k: v for k, v in spec.items() if k != "name"})


def readout_dims(spec: Mapping[str, Any], readouts: list[str] | None = None) -> dict[str, int]:
    """Declared feature width of each readout (channels for patch_grid), from embed_dim and pooled_dim."""
    dims = {}
    for r in readouts or spec["readouts"]:
        if r == "pooled":
            dims[r] = int(spec.get("pooled_dim", spec["embed_dim"]))
        else:
            dims[r] = int(spec["embed_dim"]) * READOUT_WIDTH_FACTOR[r]
    return dims

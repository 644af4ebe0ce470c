"""Registries of named things (encoders, data sets): YAML files validated against a JSON schema at load.

Foundation layer: imports only :mod:`fmaudit.io` and :mod:`fmaudit.schema`. A registry is a mapping
``slug -> entry``; an unknown slug raises :class:`~fmaudit.io.FmauditInputError` with close matches. Conventions:

- The encoder registry is ``resources/encoders.yaml`` of the source tree, unless the environment variable
  ``FMAUDIT_ENCODER_REGISTRY`` or the ``path`` argument names another file (the argument wins).
- The data-set registry is ``resources/datasets.yaml`` unless the config's ``dataset_registry`` names another;
  it is checked against ``resources/schemas/datasets.schema.yaml`` when loaded.
- YAML anchors and ``<<`` merges are allowed; a key repeated within one mapping is an error
  (:func:`fmaudit.schema.load_yaml`).
- An entry returned by :func:`get_encoder_spec` is a copy with its slug added under ``name``.
- An entry's keys are of two kinds, listed once here: :data:`EMBEDDING_KEYS` decide the numbers of its
  embeddings (architecture, weights and their identity, preprocessing, readouts, precision);
  :data:`DESCRIPTIVE_KEYS` describe it (description, licence, pretraining corpora, exposure, paper ...).
  :func:`embedding_spec` keeps only the former and :func:`encoder_config_hash` hashes only them, so editing a
  description or a licence changes no embedding key and reruns nothing.
- Declared variants (an entry's ``variants:``, e.g. seed 000's 224-vs-518 input-resolution check) become
  entries of their own, ``<slug>.<variant>``, when the registry is loaded (:func:`expand_variants`): the base
  entry with the variant's keys deep-merged over it, marked ``variant_of`` / ``variant``, validated like any
  entry. Everything downstream (embedding, hashing, output folders) treats them as encoders.
"""

from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path
from typing import Any, Mapping

from fmaudit.io import FmauditInputError, PathLike, stable_hash
from fmaudit.schema import RESOURCES, SCHEMAS, load_yaml, repo_path, validate_against_schema

ENCODER_REGISTRY = RESOURCES / "encoders.yaml"
ENCODER_SCHEMA = SCHEMAS / "encoders.schema.yaml"
ENCODER_REGISTRY_ENV = "FMAUDIT_ENCODER_REGISTRY"
DATASET_REGISTRY = RESOURCES / "datasets.yaml"
DATASET_SCHEMA = SCHEMAS / "datasets.schema.yaml"

READOUT_WIDTH_FACTOR = {"cls": 1, "mean": 1, "cls_mean": 2, "patch_grid": 1}

#: Keys of an encoder entry that decide the numbers of its embeddings: the workflow's embedding jobs take only
#: these as parameters, and the embedding key and provenance hash are computed from them.
EMBEDDING_KEYS = ("loader", "architecture", "weights", "trust_remote_code", "preprocessing", "readouts",
                  "embed_dim", "pooled_dim", "patch_size", "num_prefix_tokens", "precision")
#: Keys that describe an entry (or place its job: ``gpu``) without changing a single number of its embeddings;
#: ``default_readout`` picks which readout the probes use, which the probe jobs take as their own parameter.
DESCRIPTIVE_KEYS = ("description", "licence", "gated", "pretraining_corpora", "exposure", "paper", "magnification",
                    "family", "params_m", "gpu", "verify", "notes", "default_readout", "variants", "variant",
                    "variant_of", "pretraining_wsis")


def load_yaml_registry(path: PathLike, schema_path: PathLike) -> dict[str, dict[str, Any]]:
    """A registry file (mapping slug -> entry) validated against ``schema_path``."""
    data = load_yaml(path)
    if not isinstance(data, dict) or not data:
        raise FmauditInputError(f"{path}: a registry must be a non-empty mapping of slug -> entry")
    return validate_against_schema(data, load_yaml(schema_path), name=str(path))


def encoder_registry_path(path: PathLike | None = None) -> Path:
    """The encoder registry in use: ``path``, else $FMAUDIT_ENCODER_REGISTRY, else resources/encoders.yaml."""
    if path is not None:
        return repo_path(path)
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


VARIANT_KEYS = ("variant_of", "variant")


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged over it: mappings merge key by key, any other value is replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def variant_slug(base: str, variant: str) -> str:
    """The registry slug of a declared variant: ``<base>.<variant>`` (e.g. ``dinov2-vitl14.res518``)."""
    return f"{base}.{variant}"


def expand_variants(registry: Mapping[str, Mapping[str, Any]], schema: Mapping[str, Any],
                    source: str = "encoder registry") -> dict[str, dict[str, Any]]:
    """The registry with every declared variant as an entry of its own (module doc); ``schema`` is the encoder
    registry's schema, which validates each derived entry. Base entries lose their ``variants`` key, so a
    variant declaration does not change the base's own config hash."""
    out: dict[str, dict[str, Any]] = {}
    derived: dict[str, dict[str, Any]] = {}
    for name, entry in registry.items():
        hand_written = [k for k in VARIANT_KEYS if k in entry]
        if hand_written:
            raise FmauditInputError(f"{source}: encoder {name!r}: {hand_written[0]} is set by the registry loader "
                                    "for declared variants; declare a variant under the base's `variants:` instead")
        base = {k: v for k, v in entry.items() if k != "variants"}
        out[name] = base
        for vname, override in (entry.get("variants") or {}).items():
            slug = variant_slug(name, vname)
            spec = deep_merge(base, override)
            spec["description"] = f"{base['description']} Declared variant {vname!r} of {name}."
            spec["variant_of"], spec["variant"] = name, vname
            derived[slug] = spec
    clash = sorted(set(derived) & set(out))
    if clash:
        raise FmauditInputError(f"{source}: variant slug {clash[0]!r} is also an entry of its own; rename one")
    if derived:
        validate_against_schema(derived, schema, name=f"{source} (declared variants)")
    out.update(derived)
    return out


def load_registry(path: PathLike | None = None, schema_path: PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The encoder registry, validated (schema + :func:`check_encoder_entry`), with its declared variants as
    entries of their own (:func:`expand_variants`); see module doc for the path."""
    reg_path = encoder_registry_path(path)
    schema = load_yaml(schema_path or ENCODER_SCHEMA)
    registry = expand_variants(load_yaml_registry(reg_path, schema_path or ENCODER_SCHEMA), schema,
                               source=str(reg_path))
    for name, entry in registry.items():
        check_encoder_entry(name, entry, source=str(reg_path))
    return registry


def load_dataset_registry(path: PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The data-set registry (``resources/datasets.yaml`` by default), validated against its schema."""
    return load_yaml_registry(repo_path(path) if path is not None else DATASET_REGISTRY, DATASET_SCHEMA)


def unknown_name_error(kind: str, name: str, known: list[str], where: str = "") -> FmauditInputError:
    """FmauditInputError for an unknown name (encoder, data set, task, parameter ...), with difflib
    suggestions and the known names; ``where`` says which file or config key named it."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    prefix = f"{where}: " if where else ""
    return FmauditInputError(f"{prefix}unknown {kind} {name!r}{hint} (known: {', '.join(sorted(known))})")


def check_encoder_usable(name: str, entry: Mapping[str, Any], source: str = "encoder registry",
                         config_key: str | None = None) -> None:
    """Rules for an entry a config actually uses (the registry may list entries not usable yet).

    An entry with ``trust_remote_code: true`` runs Python code from its hub repo, so it must pin the commit
    of that code: ``weights.revision: null`` (no published commit known) stops here, naming the key to set:
    ``config_key`` (the config's ``encoder_revisions.<name>``) when given, and the registry's
    ``weights.revision`` (entries without an ``hf_hub_id`` fetch no code). The workflow calls it for every encoder it is about to embed, before the first job,
    and the encoder builder calls it before building a network with remote code.
    """
    weights = entry.get("weights") or {}
    # only code fetched from a hub repo is someone else's: random-init and local weights run no downloaded code
    if entry.get("trust_remote_code") and weights.get("hf_hub_id") and not weights.get("revision"):
        repo = weights.get("hf_hub_id", "its hub repo")
        where = (f"set `{config_key}: <commit>` in your config (or weights.revision in {source})" if config_key
                 else "set weights.revision")
        raise FmauditInputError(
            f"{source}: encoder {name!r}: weights.revision is not set, and trust_remote_code: true runs Python "
            f"code from {repo} in the embedding job; {where} to the 40-character commit hash of "
            f"the {repo} revision whose code you reviewed (its 'Files and versions' history on the hub)")


def get_encoder_spec(name: str, registry: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A copy of encoder ``name``'s registry entry, with ``name`` added."""
    registry = load_registry() if registry is None else registry
    if name not in registry:
        raise unknown_name_error("encoder", name, list(registry))
    spec = copy.deepcopy(dict(registry[name]))
    spec["name"] = name
    return spec


def embedding_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an encoder entry that decides its embeddings' numbers (:data:`EMBEDDING_KEYS`), a deep copy;
    ``name`` is kept when present (it names the encoder in messages, not in the numbers)."""
    keep = EMBEDDING_KEYS + ("name",)
    return {k: copy.deepcopy(v) for k, v in spec.items() if k in keep}


def encoder_config_hash(spec: Mapping[str, Any]) -> str:
    """Provenance hash of what decides an encoder's embeddings (:func:`embedding_spec`, ``name`` ignored): a
    change to the architecture, weights, preprocessing, readouts or precision changes it; a description,
    licence or exposure edit does not."""
    return stable_hash({k: v for k, v in embedding_spec(spec).items() if k != "name"})


def embedding_key(spec: Mapping[str, Any], weights_override: str | None = None, length: int = 12) -> str:
    """The key of an encoder's embeddings as a config sets them: :func:`encoder_config_hash` and the config's
    local weights override (``encoder_weights``), if any. The workflow puts it in the embedding's path, so that
    embeddings of another key never replace these (docs/design.md#runs-you-can-trust, "No lost work")."""
    return stable_hash({"encoder_config_hash": encoder_config_hash(spec), "weights_override": weights_override or None},
                       length=length)


def readout_dims(spec: Mapping[str, Any], readouts: list[str] | None = None) -> dict[str, int]:
    """Declared feature width of each readout (channels for patch_grid), from embed_dim and pooled_dim."""
    dims = {}
    for r in readouts or spec["readouts"]:
        if r == "pooled":
            dims[r] = int(spec.get("pooled_dim", spec["embed_dim"]))
        else:
            dims[r] = int(spec["embed_dim"]) * READOUT_WIDTH_FACTOR[r]
    return dims

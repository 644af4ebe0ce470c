"""Registries of named things (encoders, data sets): YAML files validated against a JSON schema at load.

Foundation layer: imports only :mod:`fmaudit.io` and :mod:`fmaudit.schema`. A registry is a mapping
``slug -> entry``; an unknown slug raises :class:`~fmaudit.io.FmauditInputError` with close matches. Conventions:

- The built-in encoder registry is ``resources/encoders.yaml`` of the source tree, unless the environment
  variable ``FMAUDIT_ENCODER_REGISTRY`` or the ``path`` argument of :func:`load_registry` names another file
  (the argument wins). The built-in data-set registry is ``resources/datasets.yaml``; it is checked against
  ``resources/schemas/datasets.schema.yaml`` when loaded.
- A config's own registries *extend* the built-in ones (:func:`load_encoder_registries`,
  :func:`load_dataset_registries`): the files of its ``encoder_registry`` / ``dataset_registry`` (one path or a
  list; the built-in file itself is skipped) and the entries given inline under ``encoder_entries`` /
  ``dataset_entries`` are added to the built-in entries, each validated on its own. A slug defined twice, in
  two files or twice in one, is an error naming both places: an entry is never silently replaced.
- A data-set entry without ``preparer`` uses the preparer named after its ``kind`` (the own-data kinds
  ``image_table``, ``slide_table``, ``cell_table``, ``features``); its parameters get the defaults of their
  kind's schema.
- YAML anchors and ``<<`` merges are allowed; a key repeated within one mapping is an error
  (:func:`fmaudit.schema.load_yaml`).
- An entry returned by :func:`get_encoder_spec` is a copy with its slug added under ``name``.
- An entry's keys are of two kinds, listed once here: :data:`EMBEDDING_KEYS` decide the numbers of its
  embeddings (architecture, weights and their identity, preprocessing, readouts, precision);
  :data:`DESCRIPTIVE_KEYS` describe it (description, licence, pretraining corpora, exposure, paper ...).
  :func:`embedding_spec` keeps only the former and :func:`encoder_config_hash` hashes only them, so editing a
  description or a licence changes no embedding key and reruns nothing.
- An encoder can also be named by its Hugging Face repo instead of a slug: ``timm:<org>/<repo>`` or
  ``hf:<org>/<repo>`` (:func:`is_hub_name`). Its slug is :func:`hub_name_slug` (``timm--<org>--<repo>``, the
  Hugging Face cache's own folder naming; hub repo ids never contain ``--``, so the slug names one repo), and
  :mod:`fmaudit.encoders.hub` builds its entry from the repo's config files. Registry slugs that start with
  ``timm--`` or ``hf--`` are refused, so the two kinds of name never meet.
- Declared variants (an entry's ``variants:``, e.g. the hema paper's 224-vs-518 input-resolution check) become
  entries of their own, ``<slug>.<variant>``, when the registry is loaded (:func:`expand_variants`): the base
  entry with the variant's keys deep-merged over it, marked ``variant_of`` / ``variant``, validated like any
  entry. Everything downstream (embedding, hashing, output folders) treats them as encoders.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

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
                    "family", "params_m", "gpu", "verify", "verify_reason", "checked_against", "notes",
                    "default_readout", "variants", "variant", "variant_of", "pretraining_wsis", "hub_name",
                    "departs_from_hub_config")
#: Descriptive keys the embedding job needs as well: it compares the entry with the hub repo's cached config
#: when it loads the encoder (:mod:`fmaudit.encoders.hub`), and a field the entry departs from on purpose is
#: not a mismatch. They travel in :func:`embedding_spec` but are not hashed (:func:`encoder_config_hash`).
JOB_KEYS = ("departs_from_hub_config",)

#: Fields of an entry that :mod:`fmaudit.encoders.hub` compares with its hub repo's config (the keys a
#: ``departs_from_hub_config`` mapping may name).
HUB_CONFIG_FIELDS = ("architecture.model_name", "preprocessing.input_size", "preprocessing.resize_size",
                     "preprocessing.crop", "preprocessing.interpolation", "preprocessing.mean", "preprocessing.std",
                     "embed_dim", "pooled_dim", "patch_size", "num_prefix_tokens")

#: Libraries an encoder named by its hub repo can be built with (``timm:<repo>``, ``hf:<repo>``).
HUB_NAME_PREFIXES = ("timm", "hf")
_HUB_NAME = re.compile(r"^(timm|hf):([A-Za-z0-9][A-Za-z0-9_.-]*)/([A-Za-z0-9][A-Za-z0-9_.-]*)$")
_HUB_SLUG = re.compile(r"^(timm|hf)--([A-Za-z0-9][A-Za-z0-9_.-]*)--([A-Za-z0-9][A-Za-z0-9_.-]*)$")


def is_hub_name(name: str) -> bool:
    """Whether ``name`` names an encoder by its Hugging Face repo (``timm:org/repo``, ``hf:org/repo``).

    Parameters
    ----------
    name : str
        An encoder name as a config or the command line gives it (non-strings give False).

    Returns
    -------
    bool
        True for a ``timm:`` or ``hf:`` prefix; the rest is checked by :func:`parse_hub_name`.
    """
    return isinstance(name, str) and name.split(":", 1)[0] in HUB_NAME_PREFIXES and ":" in name


def parse_hub_name(name: str) -> tuple[str, str]:
    """``("timm" | "hf", "org/repo")`` of a hub name; an error naming it when it is not one.

    Parameters
    ----------
    name : str
        ``timm:<org>/<repo>`` or ``hf:<org>/<repo>``.

    Returns
    -------
    tuple of (str, str)
        The library prefix and the repo id.

    Raises
    ------
    FmauditInputError
        When ``name`` is not of that form, or contains ``--`` or ``..``.
    """
    m = _HUB_NAME.match(name)
    if m is None or "--" in name or ".." in name:
        raise FmauditInputError(
            f"encoder {name!r}: a hub name is timm:<org>/<repo> or hf:<org>/<repo> (a Hugging Face repo id: letters, "
            f"digits, '-', '_', '.', without '--' or '..')")
    return m.group(1), f"{m.group(2)}/{m.group(3)}"


def hub_name_slug(name: str) -> str:
    """The filename-safe slug of a hub name: ``timm:org/repo`` -> ``timm--org--repo``.

    Parameters
    ----------
    name : str
        A hub name (:func:`parse_hub_name`).

    Returns
    -------
    str

    Raises
    ------
    FmauditInputError
        When ``name`` is not a hub name.
    """
    library, repo = parse_hub_name(name)
    return f"{library}--{repo.replace('/', '--')}"


def hub_name_of_slug(slug: str) -> str | None:
    """The hub name a slug of :func:`hub_name_slug` stands for, or None for a registry slug.

    Parameters
    ----------
    slug : str
        An encoder slug.

    Returns
    -------
    str or None
    """
    m = _HUB_SLUG.match(slug)
    return f"{m.group(1)}:{m.group(2)}/{m.group(3)}" if m else None


def load_yaml_registry(path: PathLike, schema_path: PathLike) -> dict[str, dict[str, Any]]:
    """A registry file (mapping slug -> entry) validated against ``schema_path``.

    Parameters
    ----------
    path : path-like
        The registry's YAML file.
    schema_path : path-like
        Its JSON Schema (YAML).

    Returns
    -------
    dict of str to dict
        Slug -> entry, as in the file (no defaults filled).

    Raises
    ------
    FmauditInputError
        When the file is empty or not a mapping, or an entry violates the schema (every violation listed).
    """
    data = load_yaml(path)
    if not isinstance(data, dict) or not data:
        raise FmauditInputError(f"{path}: a registry must be a non-empty mapping of slug -> entry")
    return validate_against_schema(data, load_yaml(schema_path), name=str(path))


def validate_encoder_entry(entry: Mapping[str, Any], name: str) -> dict[str, Any]:
    """One encoder entry checked against the registry schema's entry definition (and :func:`check_encoder_entry`),
    e.g. one built from a hub repo's config; errors name ``name`` and the key.

    Parameters
    ----------
    entry : Mapping
        An encoder entry, without ``name``.
    name : str
        What to call it in errors (``encoder 'timm:org/repo'``).

    Returns
    -------
    dict
        A shallow copy of the entry.

    Raises
    ------
    FmauditInputError
        When it violates the schema or a rule of :func:`check_encoder_entry`.
    """
    schema = load_yaml(ENCODER_SCHEMA)
    entry_schema = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": "#/$defs/encoder"}
    validate_against_schema(entry, entry_schema, name=name)
    check_encoder_entry(name, entry, source=name)
    return dict(entry)


def encoder_registry_path(path: PathLike | None = None) -> Path:
    """The encoder registry in use: ``path``, else $FMAUDIT_ENCODER_REGISTRY, else resources/encoders.yaml.

    Parameters
    ----------
    path : path-like, optional
        A registry file; a relative path that does not exist is looked up in the repository.

    Returns
    -------
    Path
    """
    if path is not None:
        return repo_path(path)
    env = os.environ.get(ENCODER_REGISTRY_ENV)
    return Path(env) if env else ENCODER_REGISTRY


def check_encoder_entry(name: str, entry: Mapping[str, Any], source: str = "encoder registry") -> None:
    """Consistency rules a JSON schema cannot state (raise FmauditInputError naming the entry).

    Parameters
    ----------
    name : str
        The entry's slug.
    entry : Mapping
        The entry, schema-valid.
    source : str
        The registry file, for the message.

    Raises
    ------
    FmauditInputError
        For a ``default_readout`` not among the readouts, ``cls`` readouts without a class token, ``allow_pickle``
        on a safetensors entry, ``trust_remote_code`` outside transformers, or an unknown ``departs_from_hub_config``
        field.
    """
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
    unknown = sorted(set(entry.get("departs_from_hub_config") or {}) - set(HUB_CONFIG_FIELDS))
    if unknown:
        raise FmauditInputError(f"{where}: departs_from_hub_config names {unknown[0]!r}, which is not a compared "
                                f"field ({', '.join(HUB_CONFIG_FIELDS)})")


VARIANT_KEYS = ("variant_of", "variant")


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged over it: mappings merge key by key, any other value is replaced.

    Parameters
    ----------
    base : Mapping
        The mapping merged into (not changed).
    override : Mapping
        The values that win.

    Returns
    -------
    dict
        A new, deep-copied mapping.
    """
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def variant_slug(base: str, variant: str) -> str:
    """The registry slug of a declared variant: ``<base>.<variant>`` (e.g. ``dinov2-vitl14.res518``).

    Parameters
    ----------
    base : str
        The base entry's slug.
    variant : str
        The variant's name under the base's ``variants:``.

    Returns
    -------
    str
    """
    return f"{base}.{variant}"


def expand_variants(registry: Mapping[str, Mapping[str, Any]], schema: Mapping[str, Any],
                    source: str = "encoder registry") -> dict[str, dict[str, Any]]:
    """The registry with every declared variant as an entry of its own (module doc); ``schema`` is the encoder
    registry's schema, which validates each derived entry. Base entries lose their ``variants`` key, so a
    variant declaration does not change the base's own config hash.

    Parameters
    ----------
    registry : Mapping of str to Mapping
        Slug -> entry, schema-valid.
    schema : Mapping
        The encoder registry's JSON Schema.
    source : str
        The registry file, for messages.

    Returns
    -------
    dict of str to dict
        Base entries (without ``variants``) then the variants, ``<slug>.<variant>`` -> entry with ``variant_of``,
        ``variant`` and, for the hub-config fields it changes, ``departs_from_hub_config``.

    Raises
    ------
    FmauditInputError
        When an entry sets ``variant_of`` or ``variant`` itself, a variant slug is also a plain entry, or a derived
        entry violates the schema.
    """
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
            # what the variant changes departs from the hub repo's config by declaration (e.g. a 518 px input)
            changed = [f for f in HUB_CONFIG_FIELDS if _has_path(override, f)]
            if changed:
                spec["departs_from_hub_config"] = {
                    **(base.get("departs_from_hub_config") or {}),
                    **{f: f"declared variant {vname!r} of {name}" for f in changed}}
            derived[slug] = spec
    clash = sorted(set(derived) & set(out))
    if clash:
        raise FmauditInputError(f"{source}: variant slug {clash[0]!r} is also an entry of its own; rename one")
    if derived:
        validate_against_schema(derived, schema, name=f"{source} (declared variants)")
    out.update(derived)
    return out


def _has_path(mapping: Mapping[str, Any], dotted: str) -> bool:
    node: Any = mapping
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def load_registry(path: PathLike | None = None, schema_path: PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The encoder registry, validated (schema + :func:`check_encoder_entry`), with its declared variants as
    entries of their own (:func:`expand_variants`); see module doc for the path.

    Parameters
    ----------
    path : path-like, optional
        The registry file; None: :func:`encoder_registry_path`.
    schema_path : path-like, optional
        Its schema; None: ``resources/schemas/encoders.schema.yaml``.

    Returns
    -------
    dict of str to dict
        Slug -> entry, variants included.

    Raises
    ------
    FmauditInputError
        For a schema violation, a broken consistency rule, or a slug starting with ``timm--`` or ``hf--``.
    """
    reg_path = encoder_registry_path(path)
    schema = load_yaml(schema_path or ENCODER_SCHEMA)
    registry = expand_variants(load_yaml_registry(reg_path, schema_path or ENCODER_SCHEMA), schema,
                               source=str(reg_path))
    for name, entry in registry.items():
        if hub_name_of_slug(name):
            raise FmauditInputError(f"{reg_path}: encoder {name!r}: slugs starting with timm-- or hf-- stand for "
                                    f"encoders named by their hub repo ({hub_name_of_slug(name)}); rename the entry")
        check_encoder_entry(name, entry, source=str(reg_path))
    return registry


def load_dataset_registry(path: PathLike | None = None) -> dict[str, dict[str, Any]]:
    """One data-set registry file (``resources/datasets.yaml`` by default), validated against its schema, its
    parameters filled with their kind's defaults and a missing ``preparer`` set to the entry's ``kind``.

    Parameters
    ----------
    path : path-like, optional
        The registry file; None: ``resources/datasets.yaml``.

    Returns
    -------
    dict of str to dict
        Name -> entry, every entry with ``preparer`` and filled ``params``.

    Raises
    ------
    FmauditInputError
        When the file is empty, not a mapping, or violates the schema.
    """
    reg_path = repo_path(path) if path is not None else DATASET_REGISTRY
    return _dataset_entries(load_yaml(reg_path), str(reg_path))


def _dataset_entries(data: Any, source: str) -> dict[str, dict[str, Any]]:
    if not isinstance(data, dict) or not data:
        raise FmauditInputError(f"{source}: a registry must be a non-empty mapping of slug -> entry")
    registry = validate_against_schema(copy.deepcopy(data), load_yaml(DATASET_SCHEMA), name=source,
                                       fill_defaults=True)
    for entry in registry.values():
        entry.setdefault("preparer", entry["kind"])
    return registry


def _registry_files(paths: PathLike | Sequence[PathLike] | None, builtin: Path) -> list[Path]:
    """A config's own registry files (one path or a list), without the built-in file itself: the config's default
    names it, and a copy of the repository (a workflow run in another folder) has a byte-identical one."""
    if paths is None:
        return []
    listed = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out = []
    for p in listed:
        path = repo_path(p)
        if not path.exists():
            raise FileNotFoundError(f"{p}: registry file not found (relative to {Path.cwd()})")
        same = path.resolve() == builtin.resolve() or path.read_bytes() == builtin.read_bytes()
        if not same and path not in out:
            out.append(path)
    return out


def merge_registries(kind: str, parts: Sequence[tuple[str, Mapping[str, Mapping[str, Any]]]]
                     ) -> dict[str, dict[str, Any]]:
    """The entries of every ``(source, registry)`` part, in order; a slug defined by two parts with different
    entries raises naming both sources (a user's registry adds entries, it never replaces one silently). An entry
    equal to the one already defined (a copy of the built-in registry with entries added) adds nothing.

    Parameters
    ----------
    kind : str
        What the entries are (``encoder``, ``data set``), for the message.
    parts : sequence of (str, Mapping)
        ``(source, slug -> entry)`` pairs, built-in first.

    Returns
    -------
    dict of str to dict
        Slug -> entry (shallow copies), in first-defined order.

    Raises
    ------
    FmauditInputError
        For a slug that two parts define differently.
    """
    merged: dict[str, dict[str, Any]] = {}
    where: dict[str, str] = {}
    for source, registry in parts:
        for slug, entry in registry.items():
            if slug in where and merged[slug] == dict(entry):
                continue
            if slug in where:
                raise FmauditInputError(
                    f"{kind} {slug!r} is defined twice: in {where[slug]} and in {source}; a registry of your own adds "
                    f"entries to the built-in ones, so give yours another slug")
            where[slug] = source
            merged[slug] = dict(entry)
    return merged


def load_encoder_registries(paths: PathLike | Sequence[PathLike] | None = None,
                            entries: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The built-in encoder registry (:func:`encoder_registry_path`) extended by the registry files ``paths``
    and the inline ``entries`` (a config's ``encoder_registry`` and ``encoder_entries``), each validated like the
    built-in one (:func:`load_registry`); see the module doc.

    Parameters
    ----------
    paths : path-like or sequence of path-like, optional
        The config's ``encoder_registry`` files; the built-in file among them is skipped.
    entries : Mapping, optional
        The config's ``encoder_entries`` (slug -> entry).

    Returns
    -------
    dict of str to dict
        Slug -> entry, built-in entries first.

    Raises
    ------
    FmauditInputError
        For an invalid entry, or a slug defined twice.
    FileNotFoundError
        For a registry file that does not exist.
    """
    builtin = encoder_registry_path()
    parts = [(str(builtin), load_registry(builtin))]
    parts += [(str(p), load_registry(p)) for p in _registry_files(paths, builtin)]
    if entries:
        source = "config 'encoder_entries'"
        schema = load_yaml(ENCODER_SCHEMA)
        inline = expand_variants(validate_against_schema(copy.deepcopy(dict(entries)), schema, name=source), schema,
                                 source=source)
        for name, entry in inline.items():
            if hub_name_of_slug(name):
                raise FmauditInputError(f"{source}: encoder {name!r}: slugs starting with timm-- or hf-- stand for "
                                        f"encoders named by their hub repo ({hub_name_of_slug(name)}); "
                                        "rename the entry")
            check_encoder_entry(name, entry, source=source)
        parts.append((source, inline))
    return merge_registries("encoder", parts)


def load_dataset_registries(paths: PathLike | Sequence[PathLike] | None = None,
                            entries: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The built-in data-set registry extended by the registry files ``paths`` and the inline ``entries`` (a
    config's ``dataset_registry`` and ``dataset_entries``); see the module doc.

    Parameters
    ----------
    paths : path-like or sequence of path-like, optional
        The config's ``dataset_registry`` files; the built-in file among them is skipped.
    entries : Mapping, optional
        The config's ``dataset_entries`` (name -> entry).

    Returns
    -------
    dict of str to dict
        Name -> entry, built-in entries first.

    Raises
    ------
    FmauditInputError
        For an invalid entry, or a name defined twice.
    FileNotFoundError
        For a registry file that does not exist.
    """
    parts = [(str(DATASET_REGISTRY), load_dataset_registry(DATASET_REGISTRY))]
    parts += [(str(p), load_dataset_registry(p)) for p in _registry_files(paths, DATASET_REGISTRY)]
    if entries:
        parts.append(("config 'dataset_entries'", _dataset_entries(dict(entries), "config 'dataset_entries'")))
    return merge_registries("data set", parts)


def unknown_name_error(kind: str, name: str, known: list[str], where: str = "") -> FmauditInputError:
    """FmauditInputError for an unknown name (encoder, data set, task, parameter ...), with difflib
    suggestions and the known names; ``where`` says which file or config key named it.

    Parameters
    ----------
    kind : str
        What the name is (``encoder``, ``dataset``, ``parameter``, ``class``...).
    name : str
        The unknown name.
    known : list of str
        The names it could have been.
    where : str
        The file or config key that named it; '' leaves the prefix out.

    Returns
    -------
    FmauditInputError
        Not raised: the caller raises it (or puts its text in a report).
    """
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
    ``weights.revision`` (entries without an ``hf_hub_id`` fetch no code). The workflow calls it for every
    encoder it is about to embed, before the first job, and the encoder builder calls it before building a
    network with remote code.

    Parameters
    ----------
    name : str
        The encoder's slug.
    entry : Mapping
        Its registry entry as the config sees it (``encoder_revisions`` applied).
    source : str
        The registry file, for the message.
    config_key : str, optional
        The config key that would pin the commit (``encoder_revisions.<slug>``).

    Raises
    ------
    FmauditInputError
        When remote code from a hub repo has no pinned revision.
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
    """A copy of encoder ``name``'s registry entry, with ``name`` added.

    Parameters
    ----------
    name : str
        The encoder's slug.
    registry : Mapping, optional
        Slug -> entry; None: :func:`load_registry`.

    Returns
    -------
    dict
        A deep copy of the entry with ``name``.

    Raises
    ------
    FmauditInputError
        For an unknown slug (with close spellings).
    """
    registry = load_registry() if registry is None else registry
    if name not in registry:
        raise unknown_name_error("encoder", name, list(registry))
    spec = copy.deepcopy(dict(registry[name]))
    spec["name"] = name
    return spec


def embedding_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What the embedding job takes of an encoder entry, a deep copy: the keys that decide its embeddings'
    numbers (:data:`EMBEDDING_KEYS`), the few descriptive keys its load-time checks read (:data:`JOB_KEYS`), and
    ``name`` when present (it names the encoder in messages, not in the numbers).

    Parameters
    ----------
    spec : Mapping
        An encoder entry.

    Returns
    -------
    dict
    """
    keep = EMBEDDING_KEYS + JOB_KEYS + ("name",)
    return {k: copy.deepcopy(v) for k, v in spec.items() if k in keep}


def encoder_config_hash(spec: Mapping[str, Any]) -> str:
    """Provenance hash of what decides an encoder's embeddings (:data:`EMBEDDING_KEYS` only): a change to the
    architecture, weights, preprocessing, readouts or precision changes it; a description, licence, exposure or
    ``departs_from_hub_config`` edit does not.

    Parameters
    ----------
    spec : Mapping
        An encoder entry.

    Returns
    -------
    str
        16 hex characters (:func:`fmaudit.io.stable_hash`).
    """
    return stable_hash({k: copy.deepcopy(v) for k, v in spec.items() if k in EMBEDDING_KEYS})


def embedding_key(spec: Mapping[str, Any], weights_override: str | None = None, length: int = 12) -> str:
    """The key of an encoder's embeddings as a config sets them: :func:`encoder_config_hash` and the config's
    local weights override (``encoder_weights``), if any. The workflow puts it in the embedding's path, so that
    embeddings of another key never replace these (docs/design.md#runs-you-can-trust, "No lost work").

    Parameters
    ----------
    spec : Mapping
        An encoder entry.
    weights_override : str, optional
        The config's ``encoder_weights.<slug>`` path.
    length : int
        Hex characters of the key.

    Returns
    -------
    str
    """
    return stable_hash({"encoder_config_hash": encoder_config_hash(spec), "weights_override": weights_override or None},
                       length=length)


def readout_dims(spec: Mapping[str, Any], readouts: list[str] | None = None) -> dict[str, int]:
    """Declared feature width of each readout (channels for patch_grid), from embed_dim and pooled_dim.

    Parameters
    ----------
    spec : Mapping
        An encoder entry (``readouts``, ``embed_dim``, ``pooled_dim``).
    readouts : list of str, optional
        The readouts; None: the entry's.

    Returns
    -------
    dict of str to int
        Readout -> width (``cls_mean`` twice ``embed_dim``; ``pooled`` is ``pooled_dim``, default ``embed_dim``).
    """
    dims = {}
    for r in readouts or spec["readouts"]:
        if r == "pooled":
            dims[r] = int(spec.get("pooled_dim", spec["embed_dim"]))
        else:
            dims[r] = int(spec["embed_dim"]) * READOUT_WIDTH_FACTOR[r]
    return dims

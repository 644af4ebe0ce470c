"""YAML files of the repository and their JSON schemas: one loader, one validator, one repository root.

Foundation layer: imports only :mod:`fmaudit.io`. Everything that reads a YAML file (config, encoder and
data-set registries, presets) or checks data against a schema in ``resources/schemas/`` (config, registries,
slide sheets) goes through here, so a duplicated key, a bad value or a missing file is reported the same way
everywhere: the file, then each offending key.

- :func:`load_yaml`: anchors and ``<<`` merges allowed; a key repeated within one mapping is an error (plain
  YAML would silently keep the last one); an empty file is ``None``.
- :func:`schema_violations` / :func:`validate_against_schema`: every violation with the key path where it
  happened (for ``oneOf``/``anyOf`` failures, the deepest branch error, which names the key best); with
  ``fill_defaults`` each ``default`` of the schema is written into the data where the key is missing
  (deep-copied), also inside ``$ref``'d sub-schemas, which is how the config gets its defaults.
- :data:`REPO_ROOT`: the source tree (the package is installed editable from it, and the Snakefile puts its
  ``src/`` first on ``sys.path``); :func:`repo_path` resolves a relative resource path against the working
  directory first, then against the repository.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

from fmaudit.io import FmauditInputError, PathLike

REPO_ROOT = Path(__file__).resolve().parents[2]
RESOURCES = REPO_ROOT / "resources"
SCHEMAS = RESOURCES / "schemas"

__all__ = [
    "REPO_ROOT",
    "RESOURCES",
    "SCHEMAS",
    "load_schema",
    "load_yaml",
    "repo_path",
    "schema_violations",
    "validate_against_schema",
]


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml parses ~10x faster
    """SafeLoader that rejects a key repeated within one mapping (merge keys excepted)."""

    def construct_mapping(self, node, deep=False):  # yaml hook
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


def repo_path(path: PathLike) -> Path:
    """``path`` as given when it exists (or is absolute), else the same relative path inside the repository:
    ``resources/encoders.yaml`` works from any working directory.

    Parameters
    ----------
    path : path-like
        A path, absolute or relative to the working directory or to the repository root.

    Returns
    -------
    Path
        ``path`` when it exists or is absolute; else the repository's file of that relative path when it exists;
        else ``path`` unchanged (so that the error that follows names what the user wrote).
    """
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path
    return REPO_ROOT / path if (REPO_ROOT / path).exists() else path


def load_yaml(path: PathLike) -> Any:
    """Parse a YAML file (anchors allowed, duplicate keys rejected); errors name the file and line.

    Parameters
    ----------
    path : path-like
        The YAML file.

    Returns
    -------
    Any
        The parsed document (None for an empty file).

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        When it is not valid YAML or repeats a key of a mapping.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with open(path) as fh:
            return yaml.load(fh, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as e:
        raise FmauditInputError(f"{path}: invalid YAML: {e}") from e


def load_schema(name_or_path: PathLike) -> dict[str, Any]:
    """A schema of ``resources/schemas/`` by file name (``"config.schema.yaml"``), or any schema file.

    Parameters
    ----------
    name_or_path : path-like
        A file name of ``resources/schemas/`` or a path to a schema file.

    Returns
    -------
    dict of str to Any
        The JSON Schema, as parsed from YAML.
    """
    path = Path(name_or_path)
    if not path.exists() and (SCHEMAS / path).exists():
        path = SCHEMAS / path
    return load_yaml(path)


def _validator(schema: Mapping[str, Any], fill_defaults: bool):
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    if fill_defaults:
        properties = cls.VALIDATORS["properties"]

        def set_defaults(validator, props, instance, subschema):
            if isinstance(instance, dict):
                for name, sub in props.items():
                    if isinstance(sub, dict) and "default" in sub and name not in instance:
                        instance[name] = copy.deepcopy(sub["default"])
            yield from properties(validator, props, instance, subschema)

        cls = jsonschema.validators.extend(cls, {"properties": set_defaults})
    return cls(schema)


def schema_violations(data: Any, schema: Mapping[str, Any],
                      fill_defaults: bool = False) -> Iterator[tuple[list[str], str]]:
    """``(key path, message)`` of every violation, in key order; fills defaults into ``data`` when asked.

    Parameters
    ----------
    data : Any
        The parsed document to check; changed in place when ``fill_defaults``.
    schema : Mapping
        A JSON Schema (:func:`load_schema`).
    fill_defaults : bool
        Whether to fill each absent property that has a ``default`` in the schema, at every level validated.

    Yields
    ------
    tuple of (list of str, str)
        The key path of the violation (list indices as strings; empty at the top level) and jsonschema's message
        (of the deepest sub-error for a ``oneOf``/``anyOf``).
    """
    errors = sorted(_validator(schema, fill_defaults).iter_errors(data),
                    key=lambda e: [str(p) for p in e.absolute_path])
    for err in errors:
        leaf = err
        while leaf.context:
            leaf = max(leaf.context, key=lambda e: len(e.absolute_path))
        yield [str(p) for p in leaf.absolute_path], leaf.message


def validate_against_schema(data: Any, schema: Mapping[str, Any], name: str, fill_defaults: bool = False,
                            sep: str = "/") -> Any:
    """Validate ``data`` (filling defaults when asked) and return it; raise one :class:`FmauditInputError`
    that names ``name`` and lists every violation by key (parts joined by ``sep``).

    Parameters
    ----------
    data : Any
        The parsed document; changed in place when ``fill_defaults``.
    schema : Mapping
        A JSON Schema.
    name : str
        What ``data`` is (a file name, ``encoder 'uni'``), first in the error.
    fill_defaults : bool
        Whether to fill the schema's defaults into ``data``.
    sep : str
        What joins a key path in the error (``/``; ``.`` for a config's dotted keys).

    Returns
    -------
    Any
        ``data`` itself.

    Raises
    ------
    FmauditInputError
        Listing every violation, one line per key path.
    """
    lines = [f"  {sep.join(path) or '(top level)'}: {message}"
             for path, message in schema_violations(data, schema, fill_defaults)]
    if lines:
        raise FmauditInputError(f"{name}: does not match its schema:\n" + "\n".join(lines))
    return data

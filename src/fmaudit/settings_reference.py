"""The settings reference, ``docs/settings.md``, generated from the config schema.

``resources/schemas/config.schema.yaml`` is the one home of every setting: its description, its default and,
under ``x-reruns`` (on the key or on a block above it), the workflow rules whose jobs a change of it reruns
(``everything``: every job). :func:`settings` lists every key with those three, :func:`reruns_of` says what
one key reruns (the workflow test that edits every setting of the demo checks it against ``snakemake -n``),
and :func:`settings_reference` renders the page (``fmaudit docs settings`` writes it; a test fails while the
page differs from it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from fmaudit.config import CONFIG_SCHEMA
from fmaudit.schema import load_schema

__all__ = ["EVERYTHING", "RERUNS_KEY", "Setting", "reruns_of", "settings", "settings_reference"]

RERUNS_KEY = "x-reruns"
#: ``x-reruns: everything``: a change reruns every job (a new results folder, or the data every job reads).
EVERYTHING = "everything"
#: the block of the reference that lists the config's top-level keys that are not blocks
TOP_LEVEL = "top level"
# keys whose values are keyed by a name of the config (a task, a data set ...): shown as ``<name>`` in paths
_NAMED = {"tasks": "<task>", "dataset_params": "<dataset>", "encoder_weights": "<encoder>",
          "encoder_revisions": "<encoder>", "studies": "<study>"}


@dataclass(frozen=True)
class Setting:
    """One key of the config: its dotted path (``probe.C``, ``tasks.<task>.ordinal``), type, default (``None``
    with ``has_default`` false when it has none), description, and the rules a change of it reruns.

    Parameters
    ----------
    path : str
        Dotted key path; names of tasks, data sets, encoders, studies as placeholders (``tasks.<task>.ordinal``).
    type : str
        The schema's type(s) joined by ``or`` (``name`` for a slug reference, ``any`` where the schema gives none).
    default : Any
        The schema's default (None when it has none).
    has_default : bool
        Whether the schema gives a default.
    description : str
        The schema's description, whitespace collapsed.
    reruns : tuple of str
        The rules a change of it reruns (``x-reruns`` of the key or its nearest block that declares one;
        ``("everything",)`` for every job; empty: nothing).
    block : str
        The top-level key it belongs to, or :data:`TOP_LEVEL` for the top-level keys that are not blocks.
    declared_at : str
        The path whose ``x-reruns`` gives ``reruns``.
    """

    path: str
    type: str
    default: Any
    has_default: bool
    description: str
    reruns: tuple[str, ...]
    block: str
    declared_at: str


def _type(node: Mapping[str, Any]) -> str:
    if "type" in node:
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        return " or ".join(kinds)
    if "oneOf" in node or "anyOf" in node:
        return " or ".join(dict.fromkeys(_type(n) for n in node.get("oneOf") or node.get("anyOf")))
    if "$ref" in node:
        return "name" if node["$ref"].endswith("/slug") else "object"
    if "enum" in node:
        return "string"
    return "any"


Reruns = tuple[tuple[str, ...], str]  # (rules, the path where they are declared)


def _reruns(node: Mapping[str, Any], path: str, inherited: Reruns) -> Reruns:
    value = node.get(RERUNS_KEY)
    if value is None:
        return inherited
    return ((EVERYTHING,) if value == EVERYTHING else tuple(value)), path


def _leaf(node: Mapping[str, Any], path: str, block: str, reruns: Reruns) -> Setting:
    return Setting(path, _type(node), node.get("default"), "default" in node,
                   " ".join(str(node.get("description", "")).split()), reruns[0], block, reruns[1])


def _walk(node: Mapping[str, Any], path: str, block: str, reruns: Reruns, out: list[Setting]) -> None:
    reruns = _reruns(node, path, reruns)
    properties = node.get("properties")
    if properties:
        for key, child in properties.items():
            _walk(child, f"{path}.{key}", block, reruns, out)
        return
    out.append(_leaf(node, path, block, reruns))


def settings(schema: Mapping[str, Any] | None = None) -> list[Setting]:
    """Every key of the config schema, in the schema's order (a block's keys after it; a task's keys under
    ``tasks.<task>.``).

    Parameters
    ----------
    schema : Mapping, optional
        The config schema; None reads ``resources/schemas/config.schema.yaml``.

    Returns
    -------
    list of Setting
        One per leaf key (a key with ``properties`` is walked into; a name-keyed mapping such as
        ``dataset_params`` is one setting).
    """
    schema = load_schema(CONFIG_SCHEMA) if schema is None else schema
    out: list[Setting] = []
    for key, node in schema["properties"].items():
        if key == "tasks":
            reruns = _reruns(node, key, ((), key))
            out.append(_leaf(node, key, key, reruns))
            task = schema["$defs"]["task"]
            for name, child in task["properties"].items():
                _walk(child, f"tasks.<task>.{name}", key, reruns, out)
        elif key in _NAMED or not node.get("properties"):
            out.append(_leaf(node, key, TOP_LEVEL, _reruns(node, key, ((), key))))
        else:
            _walk(node, key, key, ((), key), out)
    return out


def reruns_of(path: str, schema: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The rules a change of the setting at ``path`` reruns (``("everything",)``: every job). ``path`` is dotted;
    the names of tasks and data sets may be given as they are (``tasks.demo-tissue.ordinal``,
    ``dataset_params.demo-tiles.seed``) or as their placeholder.

    Parameters
    ----------
    path : str
        A dotted setting path.
    schema : Mapping, optional
        The config schema; None reads the repository's.

    Returns
    -------
    tuple of str
        The rules, as :attr:`Setting.reruns`; a path below a leaf setting gets that setting's.

    Raises
    ------
    KeyError
        When no prefix of ``path`` is a setting of the schema.
    """
    parts = path.split(".")
    if parts[0] in _NAMED and len(parts) > 1:
        parts[1] = _NAMED[parts[0]]
    by_path = {s.path: s for s in settings(schema)}
    for n in range(len(parts), 0, -1):  # a named block's own key (dataset_params.<dataset>.seed -> dataset_params)
        candidate = ".".join(parts[:n])
        if candidate in by_path:
            return by_path[candidate].reruns
    raise KeyError(f"{path!r} is not a setting of the config schema")


def _default(setting: Setting) -> str:
    if not setting.has_default:
        return "(none)"
    text = json.dumps(setting.default, ensure_ascii=False)
    return f"`{text}`"


def _cell(text: str) -> str:
    """Text for a Markdown table cell: pipes escaped, and angle brackets outside code spans (`<encoder>`)."""
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _reruns_text(reruns: tuple[str, ...]) -> str:
    if reruns == (EVERYTHING,):
        return "everything"
    return ", ".join(f"`{r}`" for r in reruns) if reruns else "nothing"


def _node_description(schema: Mapping[str, Any], path: str) -> str:
    node: Mapping[str, Any] = schema
    for part in path.split("."):
        if part == "<task>":
            node = schema["$defs"]["task"]
        else:
            node = node["properties"][part]
    return " ".join(str(node.get("description", "")).split())


_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Z`(])")


def _first_sentence(text: str) -> str:
    """The description up to its first full stop (not that of "e.g." or "i.e.")."""
    match = _SENTENCE_END.search(text)
    return text[: match.start() + 1] if match else text


HEADER = """\
# Settings

<!-- Generated from resources/schemas/config.schema.yaml by `fmaudit docs settings`; do not edit by hand
(tests/test_settings_reference.py fails while this page differs from the schema). -->

Every setting of a config lives in `resources/schemas/config.schema.yaml`, with its description, its default
and what a change of it reruns; this page is generated from there. The config is validated against the
schema and filled with its defaults once, when it is loaded (`fmaudit.config.fill_config`: the workflow in
`rules/common.smk`, the command line in `fmaudit.config.load_config`), also inside each task and inside each
study's blocks (`studies.<study>.probe` ...), so the library reads settings as they are and keeps no default of
its own. A setting shows up in every table and caption that depends on it.

`fmaudit check-config --configfile my.yaml` runs every check the workflow runs before it plans a job, and
`snakemake -n --configfile my.yaml` shows what a change would rerun before you run it.

## What a change reruns

Each job's parameters hold only the settings it reads, so a change reruns the jobs it feeds and nothing else
(the report is cheap and reruns with every analysis it shows). The rules are those of `rules/*.smk`:
`prepare_manifest`, `validate`, `derive_manifest` and `embed` make the data and embeddings; `probe_shard`,
`ood_shard`, `prior_shift_shard`, `scratch_reference`, `cell_features` and `cell_shard` are the analyses'
jobs, each followed by its aggregation (`aggregate_probe`, `aggregate_ood`, `aggregate_prior_shift`,
`aggregate_cells`); `report` writes the report. A rule listed here reruns only for the jobs the setting
touches (a task's setting, only that task's shards). `tests/test_workflow.py` edits every setting of the
demo's `config.yaml` in turn and checks that `snakemake -n` plans exactly these rules.

"""


def settings_reference(schema: Mapping[str, Any] | None = None) -> str:
    """The text of ``docs/settings.md``.

    Parameters
    ----------
    schema : Mapping, optional
        The config schema; None reads the repository's.

    Returns
    -------
    str
        Markdown: :data:`HEADER`, the table of what each ``x-reruns`` declaration reruns, then one table per block
        of every setting's type, default, description and reruns; ends with a newline.
    """
    schema = load_schema(CONFIG_SCHEMA) if schema is None else schema
    rows = settings(schema)
    lines = [HEADER.rstrip("\n"), "", "| setting | what it changes | reruns |", "| --- | --- | --- |"]
    paths = [s.path for s in rows]

    def first_under(declared_at: str) -> int:  # a block's row before the rows of its own keys
        return min(i for i, p in enumerate(paths) if p == declared_at or p.startswith(declared_at + "."))

    for declared_at in sorted(dict.fromkeys(s.declared_at for s in rows),
                              key=lambda path: (first_under(path), path.count("."))):
        group = [s for s in rows if s.declared_at == declared_at]
        under = [s for s in rows if s.path.startswith(declared_at + ".")]
        if len(group) == 1 and group[0].path == declared_at:
            name, what = f"`{declared_at}`", group[0].description
        else:
            name = f"`{declared_at}.*`" + (" (the keys not listed on their own)" if len(group) < len(under) else "")
            what = _node_description(schema, declared_at)
        lines.append(f"| {name} | {_cell(_first_sentence(what))} | {_reruns_text(group[0].reruns)} |")
    lines += ["", "## Every setting", ""]
    rows = [r for r in rows if r.block == TOP_LEVEL] + [r for r in rows if r.block != TOP_LEVEL]
    block = None
    for setting in rows:
        if setting.block != block:
            block = setting.block
            if block == TOP_LEVEL:
                title, about = ("Top-level keys",
                                "What the study runs on: its name, data, encoders, data sets and tasks.")
            else:
                title, about = f"`{block}`", _node_description(schema, block)
            lines += [f"### {title}", "", _cell(about), "",
                      "| key | type | default | description | reruns |", "| --- | --- | --- | --- | --- |"]
        lines.append(f"| `{setting.path}` | {setting.type} | {_cell(_default(setting))} | "
                     f"{_cell(setting.description)} | {_reruns_text(setting.reruns)} |")
        next_index = rows.index(setting) + 1
        if next_index == len(rows) or rows[next_index].block != block:
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"

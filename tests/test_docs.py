"""The repository's own documentation: every reference of the code to docs/ resolves to a heading, no reference
points at a file outside the repository, links between pages resolve, docs/settings.md is the schema's, and the
README stays a front door."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fmaudit.schema import load_schema
from fmaudit.settings_reference import RERUNS_KEY, settings, settings_reference

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
CODE = [REPO / d for d in ("src", "rules", "scripts", "resources", "profiles", "benchmarks")] + [REPO / "Snakefile"]
TEXT_SUFFIXES = {".py", ".smk", ".yaml", ".yml", ".rst", ".md", ".tsv", ""}
DOC_REFERENCE = re.compile(r"docs/([a-z_]+)\.md#([a-z0-9_-]+)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    in_code = False
    anchors = set()
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            anchors.add(_anchor(line.lstrip("#")))
    return anchors


def _text_files():
    for root in CODE:
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in paths:
            if path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts:
                try:
                    yield path, path.read_text()
                except UnicodeDecodeError:
                    continue


def test_every_reference_of_the_code_to_docs_resolves_to_a_heading():
    anchors = {page.stem: _anchors(page) for page in DOCS.glob("*.md")}
    found, broken = 0, []
    for path, text in _text_files():
        for match in DOC_REFERENCE.finditer(text):
            found += 1
            page, anchor = match.groups()
            if anchor not in anchors.get(page, set()):
                broken.append(f"{path.relative_to(REPO)}: {match.group(0)}")
    assert not broken, broken
    assert found > 50  # the code cites its methods


def test_the_code_cites_no_file_outside_the_repository():
    outside = re.compile(r"METHODS(\.md)?\s+(section\s+)?\d|METHODS\.md|DESIGN\.md|/work/shared")
    hits = [f"{path.relative_to(REPO)}: {m.group(0)}" for path, text in _text_files() for m in outside.finditer(text)]
    assert not hits, hits


@pytest.mark.parametrize("page", sorted([*DOCS.glob("*.md"), REPO / "README.md"]), ids=lambda p: p.name)
def test_links_between_pages_resolve(page):
    for target, anchor in re.findall(r"\]\(([^)#\s]*\.md)(?:#([a-z0-9_-]+))?\)", page.read_text()):
        linked = (page.parent / target).resolve()
        assert linked.is_file(), f"{page.name} links to {target}, which does not exist"
        if anchor:
            assert anchor in _anchors(linked), f"{page.name} links to {target}#{anchor}, which has no such heading"


def test_the_settings_page_is_the_schemas():
    assert (DOCS / "settings.md").read_text() == settings_reference(), (
        "docs/settings.md is stale: run `fmaudit docs settings` after editing resources/schemas/config.schema.yaml")


def test_every_setting_says_what_a_change_of_it_reruns():
    schema = load_schema("config.schema.yaml")

    def node(path: str):
        current = schema
        for part in path.split("."):
            current = schema["$defs"]["task"] if part == "<task>" else current["properties"][part]
        return current

    undeclared = [s.path for s in settings(schema) if RERUNS_KEY not in node(s.declared_at)]
    assert not undeclared, f"add {RERUNS_KEY} to these keys (or a block above them): {undeclared}"
    rules = set(re.findall(r"^rule (\w+):", "\n".join(p.read_text() for p in (REPO / "rules").glob("*.smk")),
                           re.MULTILINE))
    named = {r for s in settings(schema) for r in s.reruns if r != "everything"}
    assert named <= rules, f"{RERUNS_KEY} names rules the workflow does not have: {sorted(named - rules)}"


def test_the_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 10_000
    for command in ("make demo", "make test"):
        assert command in readme
    for page in ("methods", "design", "settings", "cluster", "datasets", "contributing"):
        assert f"docs/{page}.md" in readme, page
    assert not re.search(r"seed 00\d", readme)

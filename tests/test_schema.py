"""One YAML loader and one schema validator for every file of the repository; the data-set registry's schema."""

import copy

import pytest
import yaml

from fmaudit.io import FmauditInputError
from fmaudit.registry import DATASET_SCHEMA, load_dataset_registry
from fmaudit.schema import REPO_ROOT, load_schema, load_yaml, repo_path, schema_violations, validate_against_schema

SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "additionalProperties": False,
          "properties": {"a": {"type": "object", "default": {}, "properties": {"n": {"type": "integer", "default": 3}}},
                         "b": {"oneOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]}}}


def test_validator_fills_nested_defaults_as_copies():
    data = {}
    validate_against_schema(data, SCHEMA, "x", fill_defaults=True)
    assert data == {"a": {"n": 3}}
    data["a"]["n"] = 4
    assert SCHEMA["properties"]["a"]["default"] == {}  # the schema's default was copied, not shared
    untouched = {}
    validate_against_schema(untouched, SCHEMA, "x")
    assert untouched == {}


def test_validator_lists_every_violation_by_key():
    with pytest.raises(FmauditInputError) as err:
        validate_against_schema({"a": {"n": "three"}, "b": ["x"], "c": 1}, SCHEMA, "cfg.yaml", sep=".")
    text = str(err.value)
    assert text.startswith("cfg.yaml: does not match its schema")
    assert "a.n: 'three' is not of type 'integer'" in text
    assert "b.0: 'x' is not of type 'integer'" in text  # the deepest branch of the oneOf names the key
    assert "(top level): Additional properties are not allowed ('c' was unexpected)" in text
    assert [path for path, _ in schema_violations({"a": {"n": 1.5}}, SCHEMA)] == [["a", "n"]]


def test_load_yaml_rejects_duplicate_keys_and_names_the_file(tmp_path):
    (tmp_path / "d.yaml").write_text("a: 1\na: 2\n")
    with pytest.raises(FmauditInputError, match=r"d\.yaml.*duplicate key 'a'"):
        load_yaml(tmp_path / "d.yaml")
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_yaml(tmp_path / "nope.yaml")


def test_repo_path_finds_resources_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert repo_path("resources/datasets.yaml") == REPO_ROOT / "resources" / "datasets.yaml"
    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "datasets.yaml").write_text("x: 1\n")
    assert repo_path("resources/datasets.yaml").resolve() == (tmp_path / "resources" / "datasets.yaml").resolve()


def test_the_dataset_registry_matches_its_schema():
    registry = load_dataset_registry()
    assert "demo-tiles" in registry and load_schema("datasets.schema.yaml") == load_yaml(DATASET_SCHEMA)


@pytest.mark.parametrize("change, message", [
    (lambda r: r["demo-tiles"].pop("preparer"), "demo-tiles: 'preparer' is a required property"),
    (lambda r: r["demo-tiles"].update(kind="movies"), "demo-tiles/kind: 'movies' is not one of"),
    (lambda r: r["demo-tiles"].update(licence_typo="CC0"), "'licence_typo' was unexpected"),
    (lambda r: r["nct-crc-he-100k"]["files"][0].update(sha256="abc"),
     "nct-crc-he-100k/files/0/sha256: 'abc' does not match"),
    (lambda r: r["nct-crc-he-100k"]["files"][0].update(url="ftp://x"), "files/0/url: 'ftp://x' does not match"),
    (lambda r: r.update({"Bad Slug": r["demo-tiles"]}), "'Bad Slug' does not match"),
])
def test_a_bad_dataset_registry_is_refused_naming_the_entry_and_key(tmp_path, change, message):
    registry = yaml.safe_load((REPO_ROOT / "resources" / "datasets.yaml").read_text())
    registry = copy.deepcopy(registry)
    change(registry)
    (tmp_path / "datasets.yaml").write_text(yaml.safe_dump(registry))
    with pytest.raises(FmauditInputError, match="datasets.yaml") as err:
        load_dataset_registry(tmp_path / "datasets.yaml")
    assert message in str(err.value)

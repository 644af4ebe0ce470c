"""The settings reference read from the config schema: every key, its default, and what a change reruns."""

from __future__ import annotations

import copy

import pytest

from fmaudit.schema import load_schema
from fmaudit.settings_reference import EVERYTHING, RERUNS_KEY, reruns_of, settings, settings_reference


@pytest.fixture(scope="module")
def schema():
    return load_schema("config.schema.yaml")


def test_every_leaf_key_of_the_schema_is_a_setting_with_its_default(schema):
    by_path = {s.path: s for s in settings(schema)}
    assert by_path["calibration.ece_bins"].default == 15 and by_path["calibration.ece_bins"].has_default
    assert by_path["bootstrap.n_boot"].default == 1000
    assert "tasks.<task>.ordinal" in by_path and "probe" not in by_path  # blocks are not settings, their keys are
    assert not by_path["data_root"].has_default


def test_what_a_change_reruns_is_inherited_from_the_block_unless_the_key_says_otherwise(schema):
    assert reruns_of("probe.C", schema) == ("probe_shard", "aggregate_probe", "report")
    assert "prior_shift_shard" in reruns_of("probe.readout", schema)
    assert reruns_of("bootstrap.paired_n_boot", schema) == ("report",)
    assert reruns_of("tasks.demo-tissue.description", schema) == ()
    assert reruns_of("dataset_params.demo-tiles.seed", schema) == reruns_of("dataset_params", schema)
    assert reruns_of("study", schema) == (EVERYTHING,)
    with pytest.raises(KeyError):
        reruns_of("probe.nonsense", schema)


def test_the_page_lists_every_setting_and_follows_the_schema(schema):
    page = settings_reference(schema)
    for setting in settings(schema):
        assert f"| `{setting.path}` |" in page, setting.path
    edited = copy.deepcopy(schema)
    edited["properties"]["bootstrap"]["properties"]["seed"][RERUNS_KEY] = ["report"]
    assert settings_reference(edited) != page
    assert "| `bootstrap.seed` | seed of the resampling. | `report` |" in settings_reference(edited)

"""Studies: each runs its own encoders on its own tasks with its own sections; bad studies name the key."""

from __future__ import annotations

import pytest

from fmaudit import grid
from fmaudit.config import fill_config
from fmaudit.io import FmauditInputError


def _two_studies() -> dict:
    return {
        "data_root": "x",
        "encoders": ["a", "b", "c"],
        "datasets": ["d1", "d2"],
        "tasks": {"t1": {"datasets": ["d1"], "domains": ["p", "q"]}, "t2": {"datasets": ["d2"]}},
        "studies": {
            "s1": {"encoders": ["a", "b"], "tasks": ["t1"], "probe": {"fractions": [0.5, 1.0], "seeds": [0, 1]}},
            "s2": {"encoders": ["b", "c"], "tasks": ["t2"], "probe": {"heads": ["1nn"]}},
        },
    }


def test_studies_scope_encoders_tasks_and_probe_settings():
    config = fill_config(_two_studies())
    runs = grid.probe_runs(config)
    t1, t2 = runs[runs["task"] == "t1"], runs[runs["task"] == "t2"]
    assert set(t1["encoder"]) == {"a", "b"} and set(t2["encoder"]) == {"b", "c"}
    assert len(t1) == 2 * 2 * 2 * 2 and set(t2["head"]) == {"1nn"} and len(t2) == 2
    assert grid.config_block(config, "probe", task="t2")["heads"] == ["1nn"]
    assert grid.config_block(config, "probe")["heads"] == ["logistic"]  # the top-level section, defaults filled
    assert [(s.encoder, s.task) for s in grid.shards(config)] == [("a", "t1"), ("b", "t1"), ("b", "t2"), ("c", "t2")]
    assert grid.embed_pairs(config) == [("a", "d1"), ("b", "d1"), ("b", "d2"), ("c", "d2")]


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["studies"]["s2"]["tasks"].append("t1"), "already in study"),
    (lambda c: c["studies"]["s1"].update(encoders=["a", "zz"]), "'zz' is not in the config's encoders"),
    (lambda c: c["studies"]["s1"].update(datasets=["d2"]), "task 't1' uses 'd1', which the study lacks"),
    (lambda c: c["encoders"].append("orphan"), "'orphan' in no study"),
    (lambda c: c.update(ood={"far": {"t1": "t2"}}), "put this block inside the study"),
])
def test_bad_studies_name_the_key(mutate, message):
    config = _two_studies()
    mutate(config)
    with pytest.raises(FmauditInputError, match=message):
        grid.check_grid(fill_config(config))


def _probe_config(**probe):
    return fill_config({
        "data_root": "data",
        "encoders": ["a", "b"],
        "datasets": ["d1"],
        "tasks": {"t": {"datasets": ["d1"], "domains": ["x", "y", "z"]}, "u": {"datasets": ["d1"], "transfer": False}},
        "probe": {"fractions": [0.1, 1.0], "seeds": [0, 1, 2], "heads": ["logistic", "1nn"], **probe},
    })


def test_domains_from_registry_then_pooled():
    cfg = _probe_config()
    assert grid.task_domains(cfg, "u", {"d1": {"domains": ["p", "q"]}}) == ["p", "q"]
    assert grid.task_domains(cfg, "u", {}) == [grid.POOLED_DOMAIN]


def test_resolved_tile_tasks_are_what_the_split_checks_take():
    config = _two_studies()
    config["tasks"]["t2"]["allow_missing_classes"] = ["rare"]
    config["tasks"]["cells-t"] = {"datasets": ["d2"]}
    config["studies"]["s2"]["tasks"].append("cells-t")
    config["studies"]["s2"]["cells"] = {"taxonomies": {"fine": "cells-t"}, "sections": {"o": ["s"]},
                                        "protocols": {"IS": {"seeds": [0]}}}
    tasks = grid.resolved_tile_tasks(fill_config(config), {"d2": {"domains": ["m", "n"]}})
    assert tasks == {  # every study's tile tasks, domains resolved, cell taxonomies left to the cell rules
        "t1": {"datasets": ["d1"], "domains": ["p", "q"], "transfer": True, "allow_missing_classes": [],
               "split": "manifest"},
        "t2": {"datasets": ["d2"], "domains": ["m", "n"], "transfer": True, "allow_missing_classes": ["rare"],
               "split": "manifest"},
    }

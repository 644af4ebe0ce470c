"""The cell-level grid: cell tasks leave the tile grid, protocols and units, errors naming the key."""

from __future__ import annotations

import pytest

from fmaudit import grid
from fmaudit.config import fill_config
from fmaudit.io import FmauditInputError


def _cells_config(**cells) -> dict:
    spec = {"taxonomies": {"fine": "cf"}, "sections": {"o1": ["s1", "s2"], "o2": ["s3"]},
            "protocols": {"IOCD": {"seeds": [0]}, "LOOO": {"seeds": [0, 1]}}, **cells}
    return fill_config({"data_root": "x", "encoders": ["a"], "datasets": ["xen", "tiles"],
                            "tasks": {"cf": {"datasets": ["xen"]}, "tile": {"datasets": ["tiles"]}}, "cells": spec})


def test_cell_tasks_leave_the_tile_grid():
    config = _cells_config()
    assert set(grid.probe_runs(config)["task"]) == {"tile"}
    assert grid.embed_pairs(config) == [("a", "tiles")]
    cells = grid.enumerate_runs(config, analysis="cells")
    # IOCD: the two sections of o1 (o2 has one); LOOO: both organs; defaults: magnification 20, nuc and mean
    assert cells.groupby("protocol", observed=True).size().to_dict() == {"IOCD": 2 * 2, "LOOO": 2 * 2 * 2}
    assert set(cells["magnification"]) == {20} and set(cells["readout"]) == {"nuc", "mean"}


@pytest.mark.parametrize("cells, message", [
    ({"taxonomies": {"fine": "nope"}}, "unknown task 'nope'"),
    ({"sections": {"o1": ["s1"], "o2": ["s1"]}}, "also under 'o1'"),
    ({"sections": {"o1": ["s1"], "o2": ["s2"]}, "protocols": {"IOCD": {"seeds": [0]}}}, "no evaluation unit"),
])
def test_bad_cells_name_the_key(cells, message):
    with pytest.raises(FmauditInputError, match=message):
        grid.check_grid(_cells_config(**cells))


# ---- the workflow's plan (fmaudit.grid.cell_plan) ---------------------------------------------------------


def _preset():
    from fmaudit.config import load_config
    from fmaudit.schema import REPO_ROOT

    return load_config(REPO_ROOT / "resources" / "presets" / "cellpath.yaml")


def test_the_plan_has_the_grids_jobs():
    from fmaudit.grid import cell_plan, enumerate_runs, jobs

    config = _preset()
    plan = cell_plan(config, {"cellpath-xenium": None})
    features = jobs(enumerate_runs(config, None, "cell_features"), "cell_features")
    shards = jobs(enumerate_runs(config, None, "cells"), "cells")
    assert sorted(plan.feature_jobs) == sorted((e, s) for e, s in features.itertuples(index=False))
    assert len(plan.feature_jobs) == 30 * 25  # one job per (encoder, section): its three magnifications in one
    assert sorted(plan.shard_jobs) == sorted((e, float(m), p) for e, m, p in shards.itertuples(index=False))
    assert set(plan.dataset_of.values()) == {"cellpath-xenium"} and len(plan.organ_of) == 25


def test_adding_an_encoder_adds_only_its_feature_and_shard_jobs():
    from fmaudit.grid import cell_plan

    config = _preset()
    before = cell_plan(config, {})
    config["encoders"] = [*config["encoders"], "uni2-h-copy"]
    after = cell_plan(config, {})
    new_features = set(after.feature_jobs) - set(before.feature_jobs)
    new_shards = set(after.shard_jobs) - set(before.shard_jobs)
    assert set(before.feature_jobs) <= set(after.feature_jobs) and set(before.shard_jobs) <= set(after.shard_jobs)
    assert {e for e, _ in new_features} == {"uni2-h-copy"} and len(new_features) == 25
    assert {e for e, _, _ in new_shards} == {"uni2-h-copy"} and len(new_shards) == 3 * 4
    # what a shard's parameters hold (rules/cells_helpers.smk: cell_shard_settings) does not name the encoders
    assert before.cells == after.cells


def test_a_section_no_data_set_lists_is_an_error_naming_the_key():
    from fmaudit.grid import cell_plan

    config = _preset()
    config["tasks"]["cellpath-fine"]["datasets"] = ["cellpath-xenium", "xenium-breast-cancer-rep1"]
    with pytest.raises(FmauditInputError, match=r"cells.sections.*'breast-1'.*none of the data sets"):
        cell_plan(config, {"cellpath-xenium": ["lung-1"], "xenium-breast-cancer-rep1": ["breast-rep1"]})
    assert cell_plan({k: v for k, v in config.items() if k != "cells"}, {}) is None

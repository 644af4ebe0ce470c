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

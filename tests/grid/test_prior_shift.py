"""The prior-shift grid checks its priors and domains, naming the key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from fmaudit import grid
from fmaudit.config import fill_config
from fmaudit.io import FmauditInputError

REPO = Path(__file__).resolve().parents[2]


PRESETS = REPO / "resources" / "presets"


def raw(name: str) -> dict:
    return yaml.safe_load((PRESETS / f"{name}.yaml").read_text())


def loaded(name: str) -> dict:
    return fill_config(raw(name), source=f"{name}.yaml")


def test_prior_shift_checks_priors_and_domains():
    config = loaded("hema")
    bad = copy.deepcopy(config)
    bad["prior_shift"]["priors"]["balanced"]["basophil"] = 0.5
    with pytest.raises(FmauditInputError, match="prior_shift.priors.balanced"):
        grid.prior_shift_runs(bad)
    bad = copy.deepcopy(config)
    bad["prior_shift"]["target_domains"] = ["mars"]
    with pytest.raises(FmauditInputError, match="'mars' is not a domain of task 'hema-wbc5'"):
        grid.prior_shift_runs(bad)


def test_prior_shift_and_its_scratch_reference_are_ruled_and_counted():
    config = loaded("hema")
    assert grid.ANALYSES["prior_shift"].ruled and grid.ANALYSES["scratch_reference"].ruled
    runs = grid.prior_shift_runs(config)
    jobs = grid.jobs(runs, "prior_shift")
    assert len(runs) == 33_750 and len(jobs) == 15 * 3
    scratch = grid.scratch_reference_runs(config)
    assert len(scratch) == len(grid.jobs(scratch, "scratch_reference")) == 5
    assert set(scratch["source_domain"]) == {"bloodmnist-wbc5"}
    # the variant of the resolution check is probed, never adapted
    assert "dinobloom-l.res518" not in set(runs["encoder"].astype(str))
    off = copy.deepcopy(config)
    off["prior_shift"]["scratch_reference"]["enabled"] = False
    assert grid.scratch_reference_runs(off).empty


def test_domains_that_cannot_name_a_shard_file_are_named():
    config = loaded("hema")
    config["tasks"]["hema-wbc5"]["domains"] = ["bloodmnist-wbc5", "matek19-wbc5", "mll23-wbc5", "raabin wbc"]
    config["prior_shift"]["target_domains"] = ["matek19-wbc5"]
    with pytest.raises(FmauditInputError, match="domain 'raabin wbc' of task 'hema-wbc5' names shard files"):
        grid.prior_shift_runs(config)

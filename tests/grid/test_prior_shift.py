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

"""The OOD grid checks its donors, naming the key."""

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


def test_ood_rejects_unknown_donor_and_self_donor():
    config = loaded("audit")
    bad = copy.deepcopy(config)
    bad["ood"]["far"]["audit-nct"] = "audit-unknown"
    with pytest.raises(FmauditInputError, match="ood.far"):
        grid.ood_runs(bad)
    bad["ood"]["far"]["audit-nct"] = "audit-nct"
    with pytest.raises(FmauditInputError, match="another task"):
        grid.ood_runs(bad)

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


def demo() -> dict:
    return fill_config(yaml.safe_load((REPO / "config.yaml").read_text()), source="config.yaml")


def test_demo_plans_every_tier_and_its_copies():
    config = demo()
    runs = grid.ood_runs(config)
    assert list(dict.fromkeys(runs["tier"])) == ["far", "blur", "near", "artefact", "image_artefact"]
    assert set(runs["condition"]) == {"far_cmu-small-region", "blur_s4", "holdout_mucus", "artefact", "pen_seed0"}
    assert len(runs) == len(config["encoders"]) * 5 * len(config["ood"]["scorers"])
    # the gate: the task's own split, its artefact setting and (gate.near) its near setting
    assert set(grid.ood_gate_runs(config)["setting"]) == {"demo-tissue", "demo-tissue:artefact",
                                                          "demo-tissue:holdout_mucus"}
    assert grid.derived_datasets(config) == {
        "demo-tiles__blur_s4": {"dataset": "demo-tiles", "tag": "blur_s4",
                                "spec": '{"kind":"blur","sigma":4.0}'},
        "demo-tiles__pen_seed0": {"dataset": "demo-tiles", "tag": "pen_seed0",
                                  "spec": '{"color":"green","kind":"pen","opacity":0.75,"seed":0,'
                                          '"strokes":2,"width":0.04}'},
    }
    assert grid.ood_shards(config) == [(e, "demo-tissue") for e in config["encoders"]]
    summary = grid.summarize(config)
    ood = summary[summary["analysis"] == "ood"].set_index("protocol")
    assert ood.loc["detection (condition x scorer)", "jobs"] == len(config["encoders"])
    assert ood.loc["blurred test embeddings (task x sigma)", "jobs"] == len(config["encoders"])
    assert ood.loc["artefact test embeddings (task x artefact)", "jobs"] == len(config["encoders"])
    assert summary["planned"].all()


def test_far_donor_may_be_a_data_set_and_a_plan_names_only_its_task():
    config = demo()
    plan = grid.ood_shard_plan(config, "demo-tissue")
    far = plan["conditions"][0]
    assert far["donor"] == {"kind": "dataset", "name": "cmu-small-region", "datasets": ["cmu-small-region"]}
    blur = plan["conditions"][1]
    assert blur["derived"] == ["demo-tiles__blur_s4"] and blur["sigma"] == 4.0
    assert plan["gate"]["settings"] == ["demo-tissue", "demo-tissue:holdout_mucus", "demo-tissue:artefact"]
    assert plan["settings"]["probe"]["C"] == 1.0 and plan["settings"]["sensitivity"] is None
    assert not {"far", "blur", "near", "artefact", "image_artefact", "gate"} & set(plan["settings"])
    bad = copy.deepcopy(config)
    bad["ood"]["far"]["demo-tissue"] = "nowhere"
    with pytest.raises(FmauditInputError, match="ood.far.demo-tissue.*unknown donor 'nowhere'"):
        grid.ood_runs(bad)


def test_bad_artefact_spec_and_extra_tasks_name_their_key():
    config = demo()
    bad = copy.deepcopy(config)
    bad["ood"]["image_artefact"]["specs"] = [{"kind": "jpeg", "quality": 200}]
    with pytest.raises(FmauditInputError, match=r"ood.image_artefact.specs\[0\].*quality"):
        grid.check_grid(bad)
    bad["ood"]["image_artefact"]["specs"] = [{"kind": "pen"}, {"kind": "pen", "seed": 0}]
    with pytest.raises(FmauditInputError, match="same artefact"):
        grid.check_grid(bad)
    bad = copy.deepcopy(config)
    bad["ood"]["slides"] = {"tasks": ["no-such-task"]}
    with pytest.raises(FmauditInputError, match="ood.slides.tasks"):
        grid.check_grid(fill_config(bad))


def test_a_data_set_shared_by_two_tasks_is_perturbed_and_embedded_once():
    config = loaded("audit")
    config["tasks"]["audit-nct-bis"] = dict(config["tasks"]["audit-nct"])
    config["ood"]["blur"]["tasks"].append("audit-nct-bis")
    derived = grid.derived_datasets(config)
    assert len(derived) == 5 * 3  # five blurred data sets x three sigmas
    blur = grid.ood_blur_runs(config)
    assert len(blur) == 13 * 6 * 3
    assert len(grid.jobs(blur, "ood_blur")) == 13 * 5 * 3  # one embedding job per (encoder, data set, sigma)


def test_audit_extras_apply_to_their_tasks_only():
    config = loaded("audit")
    panda = grid.ood_shard_plan(config, "audit-panda")["settings"]
    sicap = grid.ood_shard_plan(config, "audit-sicap")["settings"]
    assert panda["slides"]["slide_column"] == "group" and panda["coarsening"] is None
    assert sicap["coarsening"]["without"] == ["NC"] and sicap["slides"] is None
    assert panda["sensitivity"]["knn_ks"] == [1, 10, 50, 200] and sicap["sensitivity"] is not None
    assert panda["probe"]["C"] is None and panda["probe"]["Cs"] == [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0]

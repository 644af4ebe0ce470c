"""Config validation and name checks: a typo stops the run with a message that names the key."""

import copy

import pytest
import yaml

from fmaudit.config import (
    dataset_params,
    fill_config,
    fill_section,
    load_config,
    manifest_file,
    results_dir,
    schema_default,
)
from fmaudit.io import FmauditInputError
from fmaudit.schema import REPO_ROOT, load_yaml


@pytest.fixture()
def demo_config():
    return yaml.safe_load((REPO_ROOT / "config.yaml").read_text())


@pytest.fixture()
def registries():
    return load_yaml(REPO_ROOT / "resources" / "encoders.yaml"), load_yaml(REPO_ROOT / "resources" / "datasets.yaml")


def _remote_registry(tmp_path):
    registry = load_yaml(REPO_ROOT / "resources" / "encoders.yaml")
    registry["remote-demo"] = {**registry["demo-dinov2-tiny"], "trust_remote_code": True,
                               "weights": {"source": "hf_hub", "hf_hub_id": "org/remote", "revision": None,
                                           "format": "safetensors"}}
    path = tmp_path / "encoders.yaml"
    path.write_text(yaml.safe_dump(registry))
    return path


def test_unknown_top_level_key_is_named(demo_config):
    demo_config["encoderz"] = ["x"]
    with pytest.raises(FmauditInputError, match="encoderz"):
        fill_config(demo_config)


def test_wrong_type_names_the_key(demo_config):
    demo_config["probe"]["fractions"] = "all"
    with pytest.raises(FmauditInputError, match="probe.fractions"):
        fill_config(demo_config)


def test_fraction_out_of_range(demo_config):
    demo_config["probe"]["fractions"] = [0.0, 1.5]
    with pytest.raises(FmauditInputError, match="probe.fractions"):
        fill_config(demo_config)


def test_dataset_param_override_and_typo(demo_config, registries):
    cfg = fill_config(demo_config)
    params = dataset_params(cfg, registries[1], "demo-tiles")
    assert params["seed"] == 0 and "image_size" in params
    cfg["dataset_params"]["demo-tiles"] = {"sede": 3}
    with pytest.raises(FmauditInputError, match="sede"):
        dataset_params(cfg, registries[1], "demo-tiles")


def test_load_config_reports_bad_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("encoders: [a\n")
    with pytest.raises(FmauditInputError, match=str(p)):
        load_config(p)


def test_defaults_are_filled_inside_tasks_and_study_sections(demo_config):
    config = {
        "data_root": "x", "encoders": ["a"], "datasets": ["d"],
        "tasks": {"t": {"datasets": ["d"]}, "u": {"datasets": ["d"], "transfer": False}},
        "studies": {"s": {"encoders": ["a"], "tasks": ["t", "u"], "calibration": {"ece_bins": 10}}},
    }
    cfg = fill_config(config)
    assert cfg is config  # filled in place, as the Snakefile's config is
    assert cfg["tasks"]["t"]["transfer"] is True and cfg["tasks"]["u"]["transfer"] is False
    study = cfg["studies"]["s"]["calibration"]
    assert study == {"ece_bins": 10, "kshot_k": [4, 8, 16, 32, 64], "kshot_draws": 25, "validation_labels": "full",
                     "budget_validation_share": 0.2, "include_bound_temperatures": False, "prism_ece": False}
    assert "probe" not in cfg["studies"]["s"]  # a study without its own section uses the top-level one
    assert cfg["bootstrap"] == {"n_boot": 1000, "seed": 0, "paired_n_boot": 2000}
    # defaults are copies: filling twice, or mutating one config, leaves the schema's values alone
    cfg["probe"]["fractions"].append(0.5)
    assert fill_config(copy.deepcopy(demo_config))["probe"]["fractions"] == [0.1, 1.0]
    assert schema_default("probe", "fractions") == [1.0]


def test_fill_section_and_schema_default_read_the_schema():
    assert fill_section("bootstrap", {"n_boot": 50}) == {"n_boot": 50, "seed": 0, "paired_n_boot": 2000}
    assert schema_default("calibration", "ece_bins") == 15
    assert schema_default("dataset_registry") == "resources/datasets.yaml"
    with pytest.raises(FmauditInputError, match=r"n_boot: 5 is less than the minimum of 10"):
        fill_section("bootstrap", {"n_boot": 5}, source="options")
    with pytest.raises(KeyError, match="data_root"):
        schema_default("data_root")


def test_declared_sections_get_their_defaults_when_present(demo_config):
    demo_config["prior_shift"] = {"task": "demo-tissue", "priors": {"flat": {"a": 0.5, "b": 0.5}}, "sample_size": 10}
    demo_config.pop("cells")  # the demo's cell branch, left out here
    cfg = fill_config(demo_config)
    assert cfg["prior_shift"]["draws"] == 25 and cfg["prior_shift"]["seeds"] == [0]
    assert "cells" not in cfg  # an analysis the config does not ask for stays absent
    assert cfg["ood"]["gate"]["n_splits"] == 2 and cfg["ood"]["gate"]["scorer"] == "maha"  # the demo's, filled
    assert cfg["ood"]["knn_k"] == 50 and cfg["ood"]["probe"]["Cs"][0] == 1e-6 and "sensitivity" not in cfg["ood"]


def test_each_study_writes_under_its_own_results_folder(demo_config):
    cfg = fill_config(copy.deepcopy(demo_config))
    assert cfg["study"] == "demo" and results_dir(cfg) == "results/demo"
    assert manifest_file(cfg, "demo-tiles") == "results/demo/manifests/demo-tiles.parquet"
    del demo_config["study"]
    assert fill_config(demo_config)["study"] == schema_default("study") == "demo"
    for name in ("prism", "audit", "hema", "cellpath", "all"):
        assert results_dir(load_config(REPO_ROOT / "resources" / "presets" / f"{name}.yaml")) == f"results/{name}"
    demo_config["study"] = "../elsewhere"
    with pytest.raises(FmauditInputError, match="study"):
        fill_config(demo_config)


def test_prior_shift_settings_have_schema_defaults(demo_config):
    from fmaudit.adapt.evaluate import SHOT_IM_DEFAULTS
    from fmaudit.adapt.scratch import ScratchResNet18

    ps = fill_config(copy.deepcopy(demo_config))["prior_shift"]
    assert ps["C"] == 1.0 and ps["val_fraction"] == 0.2 and ps["target_pool"] == "all"
    assert ps["model_selection"][0] == "max_marginal_entropy"
    # the library's defaults are the schema's (one home of the numbers)
    assert ps["shot_im"] == SHOT_IM_DEFAULTS
    scratch = ScratchResNet18()
    assert {k: getattr(scratch, k) for k in ("epochs", "lr", "batch_size", "weight_decay")} == {
        k: ps["scratch_reference"][k] for k in ("epochs", "lr", "batch_size", "weight_decay")}
    assert ps["scratch_reference"]["enabled"] is False
    bad = copy.deepcopy(demo_config)
    bad["prior_shift"]["model_selection"] = ["max_marginal_entropy", "coin_flip"]
    with pytest.raises(FmauditInputError, match="prior_shift.model_selection.1"):
        fill_config(bad)

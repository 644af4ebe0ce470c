"""Config validation and name checks: a typo stops the run with a message that names the key."""

import copy

import pytest
import yaml

from fmaudit.config import REPO_ROOT, check_names, dataset_params, load_config, load_yaml, validate_config
from fmaudit.io import FmauditInputError


@pytest.fixture()
def demo_config():
    return yaml.safe_load((REPO_ROOT / "config.yaml").read_text())


@pytest.fixture()
def registries():
    return load_yaml("resources/encoders.yaml"), load_yaml("resources/datasets.yaml")


def test_demo_config_is_valid_and_gets_defaults(demo_config, registries):
    cfg = validate_config(copy.deepcopy(demo_config))
    check_names(cfg, *registries)
    assert cfg["encoder_registry"] == "resources/encoders.yaml"
    assert cfg["calibration"]["ece_bins"] == 15


def test_unknown_top_level_key_is_named(demo_config):
    demo_config["encoderz"] = ["x"]
    with pytest.raises(FmauditInputError, match="encoderz"):
        validate_config(demo_config)


def test_wrong_type_names_the_key(demo_config):
    demo_config["probe"]["fractions"] = "all"
    with pytest.raises(FmauditInputError, match="probe.fractions"):
        validate_config(demo_config)


def test_fraction_out_of_range(demo_config):
    demo_config["probe"]["fractions"] = [0.0, 1.5]
    with pytest.raises(FmauditInputError, match="probe.fractions"):
        validate_config(demo_config)


def test_unknown_encoder_suggests_close_name(demo_config, registries):
    demo_config["encoders"] = ["demo-vit-tiniy"]
    with pytest.raises(FmauditInputError, match=r"unknown encoder 'demo-vit-tiniy'.*did you mean 'demo-vit-tiny'"):
        check_names(validate_config(demo_config), *registries)


def test_unknown_dataset(demo_config, registries):
    demo_config["datasets"].append("no-such-data")
    with pytest.raises(FmauditInputError, match="unknown dataset 'no-such-data'"):
        check_names(validate_config(demo_config), *registries)


def test_task_on_dataset_not_in_config(demo_config, registries):
    demo_config["tasks"]["demo-tissue"]["datasets"] = ["cmu-small-regio"]
    with pytest.raises(FmauditInputError, match="tasks.demo-tissue.datasets"):
        check_names(validate_config(demo_config), *registries)


def test_dataset_param_override_and_typo(demo_config, registries):
    cfg = validate_config(demo_config)
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

"""``fmaudit init`` writes a config that passes every check, from a sheet alone; ``fmaudit list`` names what a
config can use."""

from __future__ import annotations

import re

import pytest
import yaml

from fmaudit.cli import main
from fmaudit.config import load_config
from fmaudit.preflight import check_config
from fmaudit.registry import load_registry
from own_data_utils import write_tile_study


@pytest.fixture()
def tiles(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_tile_study(tmp_path / "my-study", n_patients=5, size=16)
    return tmp_path


def test_init_writes_a_checked_config_with_its_own_study_and_prints_its_plan(tiles, capsys):
    assert main(["init", "--images", "my-study/labels.csv", "--encoders", "demo-vit-tiny,demo-convnet",
                 "--out", "my-study", "--n-boot", "200"]) == 0
    out = capsys.readouterr().out
    text = (tiles / "my-study" / "config.yaml").read_text()
    assert text.startswith("# fmaudit study 'my-study'") and "# label order" in text  # commented
    cfg = yaml.safe_load(text)
    assert cfg["study"] == "my-study" and cfg["encoders"] == ["demo-vit-tiny", "demo-convnet"]
    entry = cfg["dataset_entries"]["my-study-tiles"]
    assert entry["kind"] == "image_table" and entry["params"]["classes"] == ["tumour", "stroma", "lymphocytes"]
    assert cfg["tasks"]["my-study"]["domains"] == ["scanner1", "scanner2"]
    assert cfg["ood"]["near"] == {"my-study": ["lymphocytes"]} and cfg["ood"]["gate"]["near"] is True
    ps = cfg["prior_shift"]
    assert ps["source_domains"] == ["scanner1"] and ps["target_domains"] == ["scanner2"]
    assert ps["sample_size"] == 15 and sum(ps["priors"]["balanced"].values()) == pytest.approx(1.0, abs=1e-9)
    check_config(load_config(tiles / "my-study" / "config.yaml"))  # as written
    assert "checked: 30 image file header(s) read" in out and "every check passed" in out
    assert "what `snakemake -n` plans" in out and "encoder x dataset" in out
    assert "next: snakemake --cores 4 --configfile my-study/config.yaml" in out
    # it never writes over a config without --force
    assert main(["init", "--images", "my-study/labels.csv", "--encoders", "demo-vit-tiny", "--out", "my-study"]) == 2
    assert "--force" in capsys.readouterr().err


def test_init_takes_a_checkpoint_of_a_registry_encoder_and_refuses_what_it_cannot_build(tiles, capsys):
    (tiles / "weights.safetensors").write_bytes(b"0")  # not a checkpoint: the encoders' pre-flight says so
    assert main(["init", "--images", "my-study/labels.csv", "--encoders", "demo-vit-tiny=weights.safetensors",
                 "--out", "a", "--n-boot", "50"]) == 2
    assert yaml.safe_load((tiles / "a" / "config.yaml").read_text())["encoder_weights"] == {
        "demo-vit-tiny": "weights.safetensors"}
    assert "config 'encoder_weights.demo-vit-tiny'" in capsys.readouterr().err
    assert main(["init", "--images", "my-study/labels.csv", "--encoders", "weights.safetensors", "--out", "b"]) == 2
    assert "a checkpoint alone does not say its architecture; give it as <slug>=<file>" in capsys.readouterr().err
    assert main(["init", "--images", "my-study/labels.csv", "--encoders", "demo-vit-tinny", "--out", "c"]) == 2
    assert "unknown encoder 'demo-vit-tinny'; did you mean 'demo-vit-tiny'" in capsys.readouterr().err
    assert not (tiles / "b").exists() and not (tiles / "c").exists()


def test_list_names_kinds_encoders_data_sets_and_analyses(tiles, capsys):
    assert main(["list", "kinds"]) == 0
    kinds = capsys.readouterr().out
    for kind in ("image_table", "slide_table", "cell_table", "features"):
        assert kind in kinds
    assert "YAML only (dataset_entries)" in kinds
    assert main(["list", "analyses"]) == 0
    assert "prior_shift" in capsys.readouterr().out
    config = tiles / "c.yaml"
    config.write_text(yaml.safe_dump({
        "data_root": ".", "encoders": ["mine"], "datasets": ["my-tiles"],
        "encoder_entries": {"mine": _own_entry()},
        "dataset_entries": {"my-tiles": {"kind": "image_table", "params": {
            "sheet": "my-study/labels.csv", "classes": ["tumour", "stroma", "lymphocytes"]}}},
        "tasks": {"t": {"datasets": ["my-tiles"]}}}))
    assert main(["list", "encoders", "--configfile", str(config)]) == 0
    encoders = capsys.readouterr().out
    assert "\nmine " in encoders and "\nuni " in encoders
    assert main(["list", "datasets", "--configfile", str(config)]) == 0
    assert re.search(r"\nmy-tiles +image_table +image_table +patient +your own data", capsys.readouterr().out)


def _own_entry() -> dict:
    entry = dict(load_registry()["demo-vit-tiny"])
    entry["description"] = "my own encoder"
    return entry


def test_init_writes_timm_and_hf_names_as_given(tiles, capsys):
    """The workflow resolves them (from the local Hugging Face cache); the config names them as the user did."""
    main(["init", "--images", "my-study/labels.csv", "--encoders", "timm:timm/vit_small_patch16_224.augreg_in21k,"
          "hf:owkin/phikon,demo-vit-tiny", "--out", "named", "--quick"])
    cfg = yaml.safe_load((tiles / "named" / "config.yaml").read_text())
    assert cfg["encoders"] == ["timm:timm/vit_small_patch16_224.augreg_in21k", "hf:owkin/phikon", "demo-vit-tiny"]

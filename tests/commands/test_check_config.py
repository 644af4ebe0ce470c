"""`fmaudit check-config`: exactly the checks the workflow runs before planning a job, errors naming the key."""

import yaml

from fmaudit.cli import main
from fmaudit.schema import REPO_ROOT


def _demo(tmp_path, **changes):
    config = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    config.update(changes)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_demo_config_passes(capsys):
    assert main(["check-config", "--configfile", str(REPO_ROOT / "config.yaml")]) == 0
    assert capsys.readouterr().out.strip().endswith(": ok")


def test_unknown_config_key_exit_code(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("data_root: x\nencoders: [demo-vit-tiny]\ndatasets: [demo-tiles]\n"
                                     "tasks: {t: {datasets: [demo-tiles]}}\nprobes: {}\n")
    assert main(["check-config", "--configfile", str(tmp_path / "c.yaml")]) == 2
    assert "probes" in capsys.readouterr().err


def test_bad_slide_sheet_is_caught_like_the_workflow_does(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    sheet = tmp_path / "bad_slides.tsv"
    sheet.write_text("slide_id\tpath\tdomain\nx\tresources/data/CMU-1-Small-Region.svs\taperio\n")  # no group
    config = _demo(tmp_path, dataset_params={"cmu-small-region": {"slides": str(sheet)}})
    assert main(["check-config", "--configfile", config]) == 2
    err = capsys.readouterr().err
    assert "bad_slides.tsv" in err and "group" in err


def test_bad_grid_section_is_caught(tmp_path, capsys):
    config = _demo(tmp_path, prior_shift={"task": "no-such-task", "priors": {"flat": {"a": 0.5, "b": 0.5}},
                                          "sample_size": 10})
    assert main(["check-config", "--configfile", config]) == 2
    assert "no-such-task" in capsys.readouterr().err


def test_dataset_registry_is_checked_against_its_schema(tmp_path, capsys):
    registry = yaml.safe_load((REPO_ROOT / "resources" / "datasets.yaml").read_text())
    registry["demo-tiles"]["kind"] = "movies"
    (tmp_path / "datasets.yaml").write_text(yaml.safe_dump(registry))
    config = _demo(tmp_path, dataset_registry=str(tmp_path / "datasets.yaml"))
    assert main(["check-config", "--configfile", config]) == 2
    err = capsys.readouterr().err
    assert "datasets.yaml" in err and "demo-tiles/kind" in err and "movies" in err

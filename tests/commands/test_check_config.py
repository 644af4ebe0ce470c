"""`fmaudit check-config`: exactly the checks the workflow runs before planning a job, errors naming the key."""

import yaml

from fmaudit.cli import main
from fmaudit.schema import REPO_ROOT


def _demo(tmp_path, **changes):
    config = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}  # a change to None removes the key
    if "cmu-small-region" not in config["datasets"]:
        config.pop("ood", None)  # the demo's far-OOD donor is that data set
    if "demo-xenium" not in config["datasets"]:  # the demo's cell branch and its taxonomy tasks
        config.pop("cells", None)
        config["tasks"] = {t: spec for t, spec in config["tasks"].items() if "demo-xenium" not in spec["datasets"]}
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


def _tiny_manifest(leak: bool):
    import pandas as pd

    rows = []
    for domain in ("scanner-a", "scanner-b", "scanner-c"):  # the demo task's domains
        for p, split in enumerate(("train", "train", "test")):
            for label in range(2):
                rows.append({"item_id": f"{domain}-p{p}-{label}", "source": f"/img/{domain}-p{p}-{label}.png",
                             "label": label, "label_name": f"c{label}", "group": f"{domain}-p{p}", "domain": domain,
                             "split": split})
    if leak:
        rows[-1]["group"] = "scanner-c-p0"  # a train patient's item on the test split
    return pd.DataFrame(rows)


def test_prepared_manifests_get_the_validate_stages_split_checks(tmp_path, capsys, monkeypatch):
    from fmaudit.io import write_table

    monkeypatch.chdir(tmp_path)
    # the tiny manifest's classes are c0, c1: no prior names the demo's tissue classes; its files are made up, so
    # the file checks are off (preflight.read_files)
    config = _demo(tmp_path, datasets=["demo-tiles"], dataset_params={}, study="mine", prior_shift=None,
                   preflight={"read_files": False})
    assert main(["check-config", "--configfile", config]) == 0
    out = capsys.readouterr().out
    assert "task 'demo-tissue': data not checked, manifests not prepared yet (results/mine/manifests/demo-tiles" in out
    manifest = tmp_path / "results" / "mine" / "manifests" / "demo-tiles.parquet"
    write_table(manifest, _tiny_manifest(leak=False))
    assert main(["check-config", "--configfile", config]) == 0
    assert "task 'demo-tissue': data valid" in capsys.readouterr().out
    write_table(manifest, _tiny_manifest(leak=True))
    assert main(["check-config", "--configfile", config]) == 2
    err = capsys.readouterr().err
    assert "results/mine/manifests/demo-tiles.parquet" in err
    assert "'scanner-c-p0' on test (1 items) and train (2 items)" in err


def test_encoders_a_run_could_not_embed_fail_the_check_naming_the_key(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    builtin = yaml.safe_load((REPO_ROOT / "resources" / "encoders.yaml").read_text())
    registry = {"remote-demo": {**builtin["demo-dinov2-tiny"], "trust_remote_code": True,
                                "weights": {"source": "hf_hub", "hf_hub_id": "org/remote", "revision": None,
                                            "format": "safetensors"}}}
    (tmp_path / "encoders.yaml").write_text(yaml.safe_dump(registry))  # added to the built-in registry
    config = _demo(tmp_path, encoder_registry=str(tmp_path / "encoders.yaml"), encoders=["remote-demo"])
    assert main(["check-config", "--configfile", config]) == 2
    assert "set `encoder_revisions.remote-demo: <commit>` in your config" in capsys.readouterr().err


def test_a_class_name_the_prepared_manifests_lack_stops_the_check_naming_the_key(tmp_path, capsys, monkeypatch):
    from fmaudit.io import write_table

    monkeypatch.chdir(tmp_path)
    config = _demo(tmp_path, datasets=["demo-tiles"], dataset_params={}, study="mine", prior_shift=None,
                   preflight={"read_files": False},  # the tiny manifest's files are made up
                   tasks={"demo-tissue": {"datasets": ["demo-tiles"],
                                          "domains": ["scanner-a", "scanner-b", "scanner-c"],
                                          "allow_missing_classes": ["c3"]}})
    write_table(tmp_path / "results" / "mine" / "manifests" / "demo-tiles.parquet", _tiny_manifest(leak=False))
    assert main(["check-config", "--configfile", config]) == 2
    err = capsys.readouterr().err
    assert "config 'tasks.demo-tissue.allow_missing_classes': unknown class 'c3'" in err
    assert "results/mine/manifests/demo-tiles.parquet" in err

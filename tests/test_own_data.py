"""A user's own data end to end through real Snakemake, from YAML only, on generated data.

- docs/own-data.md followed literally: its sheets' excerpts are lines of the generated sheets, its config blocks
  are written as they stand, its commands are run as they stand. Section 1: 60 tiles from two scanners, a
  labels sheet and `fmaudit init`; section 2: 18 labelled slides (2 sites x 3 classes x 3 patients) with
  QuPath-style GeoJSON annotations. Each runs the probe suite, OOD with the abstention gate and prior shift.
- a `cell_table` study runs the cell branch and a `features` study the probe suite from an HDF5 file (one run,
  two studies of one config).
- every bad input stops `fmaudit check-config` and the workflow before any embedding job, naming the file and
  line, or the key.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from own_data_utils import write_cell_study, write_feature_study, write_slide_study, write_tile_study
from workflow_utils import REPO, SNAKEMAKE, copy_repo, planned_jobs, snakemake

pytestmark = pytest.mark.slow

DOC = REPO / "docs" / "own-data.md"
_FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def doc_sections() -> dict[str, list[tuple[str, str, str]]]:
    """``{heading: [(language, info, body)]}`` of the doc's fenced blocks under each ``## `` heading."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for part in re.split(r"^## ", DOC.read_text(), flags=re.M)[1:]:
        heading = part.splitlines()[0].strip()
        out[heading] = [(m.group(1), m.group(2).strip(), m.group(3)) for m in _FENCE.finditer(part)]
    return out


def _section(prefix: str) -> list[tuple[str, str, str]]:
    return next(blocks for heading, blocks in doc_sections().items() if heading.startswith(prefix))


def run_command(work: Path, line: str) -> subprocess.CompletedProcess:
    """One ``$ ...`` line of the doc, as a user runs it from the repository root."""
    argv = shlex.split(line)
    env = {**os.environ, "PYTHONPATH": str(work / "src"), "PYTHONUNBUFFERED": "1"}
    if argv[0] == "fmaudit":
        argv = [sys.executable, "-m", "fmaudit.cli", *argv[1:]]
    elif argv[0] == "snakemake":
        argv = [SNAKEMAKE, *argv[1:]]
    proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=1200, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"{line} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def follow(work: Path, blocks: list[tuple[str, str, str]]) -> dict[str, str]:
    """Do what a section of the doc says: check its sheet excerpts against the files, write its files, run its
    commands in order; returns each command's output."""
    outputs = {}
    for language, info, body in blocks:
        target = re.match(r"file=(\S+)", info)
        if language == "csv" and target:
            sheet = (work / target.group(1)).read_text().splitlines()
            shown = body.strip().splitlines()
            assert shown[0] == sheet[0], f"{target.group(1)}: the doc's header {shown[0]!r} is not the sheet's"
            missing = [row for row in shown[1:] if row not in sheet]
            assert not missing, f"{target.group(1)}: the doc shows lines the sheet does not have: {missing}"
        elif language == "yaml" and target:
            (work / target.group(1)).write_text(body)
        elif language == "console":
            for line in body.splitlines():
                if line.startswith("$ "):
                    proc = run_command(work, line[2:])
                    outputs[line[2:]] = proc.stdout + proc.stderr
    return outputs


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A fresh copy of the repository with the user's data beside it: tiles (section 1), slides (section 2)."""
    work = copy_repo(tmp_path_factory.mktemp("own"))
    write_tile_study(work / "my-study")
    write_slide_study(work / "my-slides")
    return work


@pytest.fixture(scope="module")
def tiles_walkthrough(work):
    return work, follow(work, _section("1. A folder of tiles"))


@pytest.fixture(scope="module")
def slides_walkthrough(work):
    return work, follow(work, _section("2. Labelled slides"))


def _tables(work: Path, study: str):
    return lambda name: pd.read_csv(work / "results" / study / "report" / "tables" / f"{name}.csv")


def test_the_doc_needs_at_most_three_files_of_the_user(work):
    for prefix in ("1. A folder of tiles", "2. Labelled slides"):
        written = [info for language, info, _ in _section(prefix) if info.startswith("file=")]
        # the sheet, the config where the user writes it; the annotations are QuPath's export
        assert 1 <= len(written) <= 3, (prefix, written)


def test_tiles_from_a_sheet_run_the_probe_suite_ood_gate_and_prior_shift(tiles_walkthrough):
    work, outputs = tiles_walkthrough
    init = next(out for cmd, out in outputs.items() if cmd.startswith("fmaudit init"))
    assert "checked: 60 image file header(s) read" in init and "60 of 60 image file(s) fully decoded" in init
    assert "what `snakemake -n` plans" in init
    table = _tables(work, "my-study")
    board = table("leaderboard")
    assert set(board["encoder"]) == {"demo-vit-tiny", "demo-convnet"}
    assert set(zip(board["source_domain"], board["target_domain"])) == {
        (s, t) for s in ("scanner1", "scanner2") for t in ("scanner1", "scanner2")}
    # 10 patients a scanner: 2 test patients, intervals over them, flagged as few
    assert (board["ci_resampling"] == "unit=patient, n=2").all() and board["macro_f1_ci_lo"].notna().all()
    assert board["ci_note"].str.startswith("only 2 patients").all()
    detection = table("ood_detection")
    assert set(detection["tier"]) == {"near"} and set(detection["encoder"]) == set(board["encoder"])
    assert detection["auroc"].between(0, 1).all()
    gate = table("ood_gate_summary")
    assert set(gate["encoder"]) == set(board["encoder"]) and gate["coverage"].between(0, 1).all()
    for encoder in board["encoder"].unique():
        card = json.loads((work / "results" / "my-study" / "ood" / "gates" / "my-study" / encoder /
                           "gate.json").read_text())
        assert card["class_names"] == ["tumour", "stroma", "lymphocytes"]
    summary = table("prior_shift_summary")
    assert {"none", "class_balanced_restandardization"} <= set(summary["method"])
    assert {"balanced", "tumour-rich"} <= set(table("prior_shift_gains")["prior"])
    checks = pd.read_csv(work / "results" / "my-study" / "validation" / "preflight.tsv", sep="\t")
    assert set(checks.loc[checks["status"] == "ok", "check"]) >= {"image_headers", "image_decode", "group_disjoint"}
    assert (checks.loc[checks["check"] == "test_groups", "status"] == "warning").all()
    log = (work / "results" / "my-study" / "logs" / "validate.log").read_text()
    assert "60 image file header(s) read" in log and "60 of 60 image file(s) fully decoded (seeded sample" in log
    assert "WARNING" in log and "2 test patients" in log
    index = (work / "results" / "my-study" / "report" / "index.md").read_text()
    assert "## Warning: small test sets" in index


def test_labelled_slides_with_qupath_regions_run_end_to_end(slides_walkthrough):
    work, outputs = slides_walkthrough
    check = next(out for cmd, out in outputs.items() if cmd.startswith("fmaudit check-config"))
    assert "18 slide(s) opened with openslide" in check and check.rstrip().endswith("my-slides/config.yaml: ok")
    man = pd.read_parquet(work / "results" / "my-slides" / "manifests" / "my-slides.parquet")
    per_slide = man.groupby("slide")["item_id"].size()
    assert per_slide["siteA-tumour-0"] == 9 and per_slide["siteA-tumour-1"] == 6  # slide label; regions
    assert (man.groupby("slide")["label_name"].nunique() == 1).all() and man["label"].notna().all()
    assert (man.groupby(["domain", "split"])["group"].nunique() == 3).all()
    table = _tables(work, "my-slides")
    board = table("leaderboard")
    assert (board["ci_resampling"] == "unit=patient, n=3").all() and board["macro_f1_ci_lo"].notna().all()
    assert set(table("ood_detection")["tier"]) == {"near"} and len(table("ood_gate_summary"))
    assert {"balanced", "tumour-rich"} <= set(table("prior_shift_gains")["prior"])


# ------------------------------------------------------------------------- cells and features, one run


@pytest.fixture(scope="module")
def cells_and_features(work):
    root = work / "my-other"
    root.mkdir()
    write_cell_study(root, per_organ=1)
    write_feature_study(root)
    config = {
        "study": "my-other", "data_root": "my-other", "encoders": ["trident-uni", "demo-vit-tiny"],
        "datasets": ["my-features", "my-cells"],
        "dataset_entries": {
            "my-features": {"kind": "features", "params": {
                "sheet": "my-other/feature_labels.csv", "files": {"trident-uni": "features.h5"},
                "classes": ["tumour", "stroma", "lymphocytes"]}},
            "my-cells": {"kind": "cell_table", "params": {
                "slides": "my-other/cell_slides.csv", "cells": "my-other/cells.csv", "units": "um",
                "classes": ["tumour cell", "lymphocyte", "fibroblast"],
                "coarse": {"tumour cell": "epithelial", "lymphocyte": "immune", "fibroblast": "stromal"},
                "min_cells_per_class": 5}}},
        "tasks": {"feature-tissue": {"datasets": ["my-features"], "domains": ["hospital1", "hospital2"]},
                  "cells-fine": {"datasets": ["my-cells"]}, "cells-coarse": {"datasets": ["my-cells"]}},
        "bootstrap": {"n_boot": 100},
        "studies": {
            "features": {"encoders": ["trident-uni"], "tasks": ["feature-tissue"]},
            "cells": {"encoders": ["demo-vit-tiny"], "tasks": ["cells-fine", "cells-coarse"], "cells": {
                "taxonomies": {"fine": "cells-fine", "coarse": "cells-coarse"},
                "sections": {"lung": ["lung-0"], "colon": ["colon-0"]},
                "magnifications": [20], "readouts": ["nuc", "mean"],
                "probe": {"C": [1.0], "max_train_cells": None, "max_val_cells": None},
                "protocols": {"IS": {"seeds": [0]}, "LOOO": {"seeds": [0]}}}}}}
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    planned = planned_jobs(snakemake(work, "-n", "--configfile", "my-other/config.yaml").stdout)
    snakemake(work, "--cores", "2", "--configfile", "my-other/config.yaml")
    return work, planned


def test_features_computed_elsewhere_run_the_probe_suite_without_an_embedding_job(cells_and_features):
    work, planned = cells_and_features
    assert planned.get("import_features") == 1 and "embed" not in planned
    results = work / "results" / "my-other"
    assert not (results / "logs" / "embed").exists()
    inventory = pd.read_csv(results / "report" / "tables" / "embeddings.csv")
    assert inventory.set_index("dataset").loc["my-features", "device"] == "none (imported)"
    board = pd.read_csv(results / "report" / "tables" / "leaderboard.csv")
    assert set(board["encoder"]) == {"trident-uni"} and len(board) == 4
    # 8 patients a hospital, split 0.6 / 0.2 / 0.2: one test patient, so no interval, and the table says why
    assert (board["n_test_groups"] == 1).all() and board["macro_f1_ci_lo"].isna().all()
    assert (board["ci_note"] == "no interval: 1 patient (a cluster bootstrap needs at least 2)").all()
    assert "without an interval (a single test patient)" in (results / "report" / "index.md").read_text()
    assert "1 test patient: no interval" in (results / "logs" / "validate.log").read_text()


def test_cells_on_ones_own_slides_run_the_cell_branch(cells_and_features):
    work, planned = cells_and_features
    assert planned.get("prepare_cell_section") == 2 and planned.get("cell_shard") == 2
    runs = pd.read_parquet(work / "results" / "my-other" / "aggregate" / "cell_runs.parquet")
    assert set(runs["protocol"]) == {"IS", "LOOO"} and (runs["status"] == "ok").all()
    assert runs["macro_f1"].between(0, 1).all() and set(runs["taxonomy"]) == {"fine", "coarse"}
    section = pd.read_parquet(work / "results" / "my-other" / "cells" / "sections" / "colon-0.parquet")
    assert (section["centre_source"] == "cell_table").all() and section["label_fine"].notna().all()


# ------------------------------------------------------------------------- bad inputs stop before embedding


def _set(column: str, row: int, value: str):
    """An edit of a sheet: ``value`` in ``column`` of row ``row`` (its file line ``row + 2``)."""
    return lambda df: df.__setitem__(column, df[column].where(df.index != row, value))


def _image_sheet(work: Path, name: str, edit=None) -> str:
    df = pd.read_csv(work / "my-study" / "labels.csv", dtype=str, keep_default_na=False)
    if edit is not None:
        edit(df)
    path = work / "my-study" / name
    df.to_csv(path, index=False)
    return f"my-study/{name}"


def _image_config(sheet: str, classes=("tumour", "stroma", "lymphocytes"), **extra) -> dict:
    entry = {"kind": "image_table", "params": {"sheet": sheet, "classes": list(classes)}}
    return {"data_root": "my-study", "encoders": ["demo-vit-tiny"], "datasets": ["bad"],
            "dataset_entries": {"bad": entry}, "tasks": {"t": {"datasets": ["bad"]}}, **extra}


def _corrupt(work: Path, name: str, truncate: bool) -> str:
    src = work / "my-study" / "tiles" / "scanner1" / "s1-p03_stroma.png"
    path = work / "my-study" / "tiles" / name
    if truncate:  # a valid header, pixel data cut off
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (128, 128, 3), dtype=np.uint8)).save(path)
        path.write_bytes(path.read_bytes()[:600])
    else:
        path.write_bytes(b"\x89PNG but not really" + src.read_bytes()[40:80])
    return f"tiles/{name}"


def _case(work: Path, case: str) -> tuple[dict, str, str]:
    """(config, stage, message) of one bad input: ``plan`` errors stop every dry run, ``data`` errors the
    validate rule (or the preparation before it)."""
    line = lambda i: f"line {i + 2}"  # noqa: E731 - the sheet's row i is its file line i + 2
    if case == "unknown kind":
        cfg = _image_config(_image_sheet(work, "ok.csv"))
        cfg["dataset_entries"]["bad"]["kind"] = "image_tabel"
        return cfg, "plan", "bad/kind: 'image_tabel' is not one of"
    if case == "unknown preparer":
        cfg = _image_config(_image_sheet(work, "ok.csv"))
        cfg["dataset_entries"]["bad"].update(kind="tiles", preparer="my_tiles", description="mine", licence="mine",
                                             group_unit="patient")
        return cfg, "plan", "data set 'bad' (its registry entry's 'preparer'): unknown preparer 'my_tiles'"
    if case == "empty label":
        sheet = _image_sheet(work, "empty.csv", _set("label", 7, ""))
        return _image_config(sheet), "plan", f"my-study/empty.csv: 1 problem(s) in this image sheet:\n  - {line(7)}: " \
                                             "empty 'label'"
    if case == "class outside the entry":
        sheet = _image_sheet(work, "typo.csv", _set("label", 5, "Tumour"))
        return _image_config(sheet), "plan", f"{line(5)}: unknown class 'Tumour'; did you mean 'tumour'?"
    if case == "missing image":
        sheet = _image_sheet(work, "gone.csv", _set("path", 3, "tiles/gone.png"))
        return _image_config(sheet), "plan", f"{line(3)}: path my-study/tiles/gone.png does not exist"
    if case == "split value":
        sheet = _image_sheet(work, "split.csv", lambda df: df.insert(4, "split", ["train"] * 59 + ["testing"]))
        return _image_config(sheet), "plan", f"{line(59)}: split 'testing' is not one of train, val, test"
    if case == "corrupt image":
        bad = _corrupt(work, "corrupt.png", truncate=False)
        sheet = _image_sheet(work, "corrupt.csv", _set("path", 4, bad))
        return _image_config(sheet), "data", "my-study/tiles/corrupt.png: not a readable image (UnidentifiedImageError"
    if case == "truncated image":
        bad = _corrupt(work, "truncated.png", truncate=True)
        sheet = _image_sheet(work, "truncated.csv", _set("path", 9, bad))
        return _image_config(sheet), "data", "my-study/tiles/truncated.png: its pixels cannot be decoded"
    if case == "near class typo":
        cfg = _image_config(_image_sheet(work, "ok.csv"), ood={"near": {"t": ["lymphocyte"]}})
        return cfg, "data", "config 'ood.near.t': unknown class 'lymphocyte'; did you mean 'lymphocytes'?"
    if case == "region of an unknown class":
        sheet = pd.read_csv(work / "my-slides" / "slides.csv", dtype=str, keep_default_na=False)
        geo = json.loads((work / "my-slides" / "slides" / "siteA-tumour-1.geojson").read_text())
        geo["features"][1]["properties"]["classification"]["name"] = "Necrosis"
        (work / "my-slides" / "slides" / "bad.geojson").write_text(json.dumps(geo))
        sheet.loc[1, "annotations"] = "slides/bad.geojson"
        sheet.to_csv(work / "my-slides" / "bad.csv", index=False)
        entry = {"kind": "slide_table", "params": {"sheet": "my-slides/bad.csv", "classes": ["tumour", "stroma",
                                                                                             "necrosis"],
                                                   "tile_size": 64, "target_mpp": 1.0}}
        cfg = {"data_root": "my-slides", "encoders": ["demo-vit-tiny"], "datasets": ["bad"],
               "dataset_entries": {"bad": entry}, "tasks": {"t": {"datasets": ["bad"]}}}
        return cfg, "plan", "line 3: my-slides/slides/bad.geojson: 1 region(s) of a class outside"
    if case == "unreadable slide":
        sheet = pd.read_csv(work / "my-slides" / "slides.csv", dtype=str, keep_default_na=False)
        (work / "my-slides" / "slides" / "broken.tiff").write_bytes(b"II*\x00" + b"\x00" * 64)
        sheet.loc[0, "path"] = "slides/broken.tiff"
        sheet.to_csv(work / "my-slides" / "broken.csv", index=False)
        entry = {"kind": "slide_table", "params": {"sheet": "my-slides/broken.csv", "classes": ["tumour", "stroma",
                                                                                                "necrosis"],
                                                   "tile_size": 64, "target_mpp": 1.0}}
        cfg = {"data_root": "my-slides", "encoders": ["demo-vit-tiny"], "datasets": ["bad"],
               "dataset_entries": {"bad": entry}, "tasks": {"t": {"datasets": ["bad"]}}}
        return cfg, "data", "my-slides/broken.csv: line 2 (slide 'siteA-tumour-0'): my-slides/slides/broken.tiff"
    if case == "encoder defined twice":
        registry = yaml.safe_load((work / "resources" / "encoders.yaml").read_text())
        (work / "my-study" / "mine.yaml").write_text(yaml.safe_dump({"uni": registry["demo-vit-tiny"]}))
        cfg = _image_config(_image_sheet(work, "ok.csv"), encoder_registry="my-study/mine.yaml")
        return cfg, "plan", "encoder 'uni' is defined twice: in "
    if case == "item missing from a feature file":
        import h5py

        root = work / "my-study" / "feats"
        root.mkdir(exist_ok=True)
        path, sheet = write_feature_study(root)
        with h5py.File(path, "a") as f:
            ids, feats = f["item_id"][()], f["features"][()]
            del f["item_id"], f["features"]
            f["item_id"], f["features"] = ids[1:], feats[1:]
        entry = {"kind": "features", "params": {"sheet": "my-study/feats/feature_labels.csv",
                                                "files": {"their-uni": "features.h5"},
                                                "classes": ["tumour", "stroma", "lymphocytes"]}}
        cfg = {"data_root": "my-study", "encoders": ["their-uni"], "datasets": ["bad"],
               "dataset_entries": {"bad": entry}, "tasks": {"t": {"datasets": ["bad"]}}}
        return cfg, "plan", f"(features of encoder 'their-uni'): 1 item(s) of my-study/feats/feature_labels.csv are " \
                            f"not in the file, e.g. {ids[0].decode()!r}"
    raise KeyError(case)


BAD_INPUTS = ["unknown kind", "unknown preparer", "empty label", "class outside the entry", "missing image",
              "split value", "corrupt image", "truncated image", "near class typo", "region of an unknown class",
              "unreadable slide", "encoder defined twice", "item missing from a feature file"]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_a_bad_input_stops_check_config_and_the_workflow_before_any_embedding(work, case, monkeypatch, capsys):
    from fmaudit.cli import main

    slug = re.sub(r"[^a-z0-9]+", "-", case)
    cfg, stage, message = _case(work, case)
    cfg["study"] = f"bad-{slug}"
    config = work / f"bad-{slug}.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    monkeypatch.chdir(work)
    assert main(["check-config", "--configfile", str(config.name)]) == 2
    assert message in capsys.readouterr().err
    # the workflow: a dry run already stops on a plan-stage input; a data-stage one stops in `validate` (or the
    # preparation before it), which every embedding job waits for
    proc = snakemake(work, *(["-n"] if stage == "plan" else ["--cores", "1", "validate"]), "--configfile",
                     config.name, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and message in out, out[-3000:]
    assert "rule embed:" not in out and not (work / "results" / cfg["study"] / "embeddings").exists()

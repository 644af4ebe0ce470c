"""The cell branch's job functions without Snakemake: a section prepared from a demo bundle, the panel checks,
the feature set merge, a shard and the aggregate, on simulated panels in the real on-disk format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cells.conftest import SECTIONS, cell_config, make_panel
from fmaudit.config import fill_section
from fmaudit.grid import cell_runs, jobs
from fmaudit.io import FmauditInputError, dataframe_hash, read_json, read_provenance, read_table, write_table
from fmaudit.jobs.cells import (
    aggregate_cells_job,
    cell_feature_set_job,
    cell_features_job,
    cell_shard_job,
    excluded_sections,
    prepare_section_job,
    shard_runs,
    validate_cells_job,
)
from fmaudit.split_checks import SplitValidationError

TAXONOMIES = {"fine": {"task": "cf", "allow_missing_classes": []},
              "coarse": {"task": "cc", "allow_missing_classes": []}}


def filled_cells(protocols=None, sections=SECTIONS):
    cfg = cell_config(sections, protocols=protocols)
    cells = fill_section("cells", cfg["cells"])
    return cfg, cells


def write_manifests(root: Path, manifests, excluded=()) -> dict[str, str]:
    paths = {}
    for section, frame in manifests.items():
        path = root / "sections" / f"{section}.parquet"
        reason = "fewer than two valid classes: test" if section in excluded else None
        write_table(path, frame, provenance={"eligible": section not in excluded, "exclusion_reason": reason})
        paths[section] = str(path)
    return paths


@pytest.fixture
def panel_files(tmp_path):
    manifests, folders = make_panel(tmp_path / "features")
    return manifests, folders, write_manifests(tmp_path, manifests)


def feature_set(tmp_path, manifests, folders, paths) -> str:
    """Stamp each simulated folder with its manifest's hash (as extract_cell_features does) and merge them."""
    for section, folder in folders.items():
        meta_path = Path(folder) / "meta.json"
        meta = read_json(meta_path)
        meta["manifest_hash"] = dataframe_hash(read_table(paths[section]))
        meta_path.write_text(json.dumps(meta))
    out = tmp_path / "sim" / "20x.json"
    cell_feature_set_job({s: str(f) for s, f in folders.items()}, paths, str(out))
    return str(out)


def test_shard_runs_are_exactly_the_grids_job_slice():
    cfg, cells = filled_cells()
    cfg["cells"] = cells
    cfg["cells"]["magnifications"] = [20, 10]
    everything = cell_runs(cfg)
    for _, key in jobs(everything, "cells").iterrows():
        expected = everything[(everything["encoder"] == key.encoder) & (everything["protocol"] == key.protocol)
                              & np.isclose(everything["magnification"].astype(float), float(key.magnification))]
        got = shard_runs(key.encoder, float(key.magnification), key.protocol, cells, ["cf", "cc"])
        cols = ["protocol", "encoder", "taxonomy", "readout", "seed", "unit"]
        pd.testing.assert_frame_equal(got[cols].astype(str).reset_index(drop=True),
                                      expected[cols].astype(str).reset_index(drop=True))


def test_validation_passes_and_reports_every_partition(panel_files, tmp_path):
    manifests, _, paths = panel_files
    _, cells = filled_cells()
    out = tmp_path / "cells.tsv"
    validate_cells_job(paths, cells, TAXONOMIES, str(out), log=str(tmp_path / "v.log"))
    table = read_table(out)
    assert set(table["status"]) <= {"ok", "allowed"}
    leakage = table[table["check"] == "partition_leakage"]
    # IS 6 sections x 2 seeds + IOCD 5 sections + MOCV 3 folds + LOOO 3 organs
    assert len(leakage) == 12 + 5 + 3 + 3
    assert (table["check"] == "section_classes").sum() == 6


def test_a_class_only_in_a_held_out_organ_stops_validation_unless_allowed(tmp_path):
    manifests, _ = make_panel(tmp_path / "features")
    for section, frame in manifests.items():  # class 4 ("type4") exists only in skin-1
        fine = frame["label_fine"]
        if section == "skin-1":
            frame.loc[fine.notna() & (np.arange(len(frame)) % 3 == 0), ["label_fine", "label_fine_name"]] = [4, "type4"]
        else:
            frame.loc[fine == 4, ["label_fine", "label_fine_name"]] = [0, "type0"]
    paths = write_manifests(tmp_path, manifests)
    _, cells = filled_cells({"LOOO": {"seeds": [0]}})
    with pytest.raises(SplitValidationError, match=r"LOOO skin seed 0 fine.*'type4'.*absent from the training"):
        validate_cells_job(paths, cells, TAXONOMIES, str(tmp_path / "v.tsv"), log=str(tmp_path / "v.log"))
    assert "absent from the training" in (tmp_path / "v.log").read_text()  # every check is in the job's log
    assert not (tmp_path / "v.tsv").exists()
    allowed = {**TAXONOMIES, "fine": {"task": "cf", "allow_missing_classes": ["type4"]}}
    validate_cells_job(paths, cells, allowed, str(tmp_path / "v.tsv"))
    table = read_table(tmp_path / "v.tsv")
    assert (table["status"] == "allowed").sum() == 1


def test_every_section_excluded_is_an_error_and_one_excluded_section_is_reported(panel_files, tmp_path):
    manifests, _, _ = panel_files
    _, cells = filled_cells({"IS": {"seeds": [0]}})
    paths = write_manifests(tmp_path / "one", manifests, excluded=["skin-1"])
    assert excluded_sections(paths) == {"skin-1": "fewer than two valid classes: test"}
    validate_cells_job(paths, cells, TAXONOMIES, str(tmp_path / "v.tsv"))
    table = read_table(tmp_path / "v.tsv")
    assert table.loc[table["scope"] == "section skin-1", "status"].tolist() == ["excluded"]
    assert set(table.loc[table["scope"].str.startswith("IS skin-1"), "status"]) == {"excluded", "ok"}
    paths = write_manifests(tmp_path / "all", manifests, excluded=list(manifests))
    with pytest.raises(SplitValidationError, match="every section is excluded"):
        validate_cells_job(paths, cells, TAXONOMIES, str(tmp_path / "v2.tsv"))


def test_the_feature_set_rejects_a_folder_of_another_manifest(panel_files, tmp_path):
    manifests, folders, paths = panel_files
    set_path = feature_set(tmp_path, manifests, folders, paths)
    listed = json.loads(Path(set_path).read_text())
    assert listed["encoder"] == "sim" and listed["magnification"] == 20.0 and set(listed["sections"]) == set(manifests)
    changed = manifests["lung-1"].copy()
    changed.loc[0, "he_x"] += 1.0
    write_table(paths["lung-1"], changed)
    with pytest.raises(FmauditInputError, match="lung-1.*another manifest"):
        cell_feature_set_job({s: str(f) for s, f in folders.items()}, paths, str(tmp_path / "again.json"))


def test_a_shard_has_one_row_per_grid_run_and_marks_excluded_sections(tmp_path):
    manifests, folders = make_panel(tmp_path / "features")
    paths = write_manifests(tmp_path, manifests, excluded=["skin-1"])
    set_path = feature_set(tmp_path, manifests, folders, paths)
    _, cells = filled_cells({"IS": {"seeds": [0]}})
    cells["probe"]["C"] = [1.0]
    out = tmp_path / "shard.parquet"
    cell_shard_job("sim", 20.0, "IS", cells, ["cf", "cc"], set_path, str(out), device="cpu",
                   log=str(tmp_path / "s.log"))
    rows = read_table(out)
    assert len(rows) == len(shard_runs("sim", 20.0, "IS", cells, ["cf", "cc"]))
    skin = rows[rows["unit"] == "skin-1"]
    assert len(skin) and skin["status"].str.startswith("excluded: skin-1").all() and skin["macro_f1"].isna().all()
    others = rows[rows["unit"] != "skin-1"]
    assert (others["status"] == "ok").all()
    nuc = others[(others["readout"] == "nuc") & (others["taxonomy"] == "fine")]["macro_f1"].mean()
    mean = others[(others["readout"] == "mean") & (others["taxonomy"] == "fine")]["macro_f1"].mean()
    assert nuc > mean  # planted at the nucleus, diluted in the patch mean
    assert read_provenance(out)["excluded"] == {"skin-1": "fewer than two valid classes: test"}
    aggregate_cells_job([str(out), str(out)], str(tmp_path / "all.parquet"))
    assert len(read_table(tmp_path / "all.parquet")) == 2 * len(rows)


def test_a_section_missing_from_the_data_set_names_the_key(tmp_path):
    with pytest.raises(FmauditInputError, match=r"not listed under dataset_params.xen.sections"):
        prepare_section_job("s-1", "breast", "xen", {"sections": {}}, str(tmp_path), str(tmp_path / "s.parquet"),
                            str(tmp_path / "s.png"), log=str(tmp_path / "p.log"))


def test_a_demo_section_is_generated_registered_and_checked(tmp_path):
    demo = {"n_sections": 1, "organs": ["organ-a"], "seed": 0, "window_px": 512, "max_cells": 80}
    out, qc = tmp_path / "organ-a-1.parquet", tmp_path / "organ-a-1.png"
    prepare_section_job("organ-a-1", "organ-a", "demo-x", {"sections": {}, "demo": demo, "min_cells_per_class": 2},
                        str(tmp_path / "data"), str(out), str(qc), log=str(tmp_path / "p.log"))
    manifest = read_table(out)
    assert len(manifest) > 20 and (manifest["section"] == "organ-a-1").all()
    assert (manifest["centre_source"] == "nucleus_boundaries").all()
    assert qc.stat().st_size > 1000
    prov = read_provenance(out)
    assert prov["eligible"] is True and prov["counts"]["cells_registered"] == len(manifest)
    with pytest.raises(FmauditInputError, match="demo sections"):
        prepare_section_job("organ-b-1", "organ-b", "demo-x", {"demo": demo}, str(tmp_path / "data"),
                            str(tmp_path / "b.parquet"), str(tmp_path / "b.png"))


def test_a_feature_job_embeds_every_magnification_with_one_load_and_a_log_each(tmp_path):
    """The (encoder, section) job: a folder and a log per magnification, the encoder loaded once for both (one
    `loaded encoder` line, in the log of the first magnification), every log ending with the process's count."""
    from fmaudit.cells.features import open_cell_features
    from fmaudit.registry import embedding_spec, get_encoder_spec

    demo = {"n_sections": 1, "organs": ["organ-a"], "seed": 0, "window_px": 512, "max_cells": 60}
    manifest = tmp_path / "organ-a-1.parquet"
    prepare_section_job("organ-a-1", "organ-a", "demo-x", {"sections": {}, "demo": demo, "min_cells_per_class": 2},
                        str(tmp_path / "data"), str(manifest), str(tmp_path / "qc.png"))
    outs = [str(tmp_path / "10x" / "organ-a-1"), str(tmp_path / "20x" / "organ-a-1")]
    logs = [str(tmp_path / "logs" / "10x.log"), str(tmp_path / "logs" / "20x.log")]
    spec = embedding_spec(get_encoder_spec("demo-vit-tiny"))
    cell_features_job("demo-vit-tiny", spec, str(manifest), [10, 20], outs, None, batch_size=8, chunk_size=16,
                      threads=1, logs=logs)
    texts = [Path(p).read_text() for p in logs]
    assert [t.count("loaded encoder demo-vit-tiny") for t in texts] == [1, 0]
    for text, m in zip(texts, (10, 20)):
        assert f"at {m}x" in text and f"at {30 - m}x" not in text, "each log holds its own magnification's records"
        assert ": demo-vit-tiny 1 time(s) for the 2 magnification(s) of this section (10x, 20x)" in text
    assert [open_cell_features(o).meta["magnification"] for o in outs] == [10.0, 20.0]
    with pytest.raises(FmauditInputError, match="2 magnifications, 1 output folders"):
        cell_features_job("demo-vit-tiny", spec, str(manifest), [10, 20], outs[:1], None, 8, 16, 1, logs=logs)

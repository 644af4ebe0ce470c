"""Interval units end to end on NCT-CRC-HE (no patient ids): a small copy of the release's layout through the
manifest, probe-shard, aggregate and report jobs with the real registry entry. Every interval says it resamples
items (``unit=item, n=...``); no table, index line or caption calls it patient-level."""

from __future__ import annotations

import types
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fmaudit.config import fill_section
from fmaudit.grid import task_group_units
from fmaudit.io import read_table, write_npz
from fmaudit.registry import load_dataset_registry

REPO = Path(__file__).resolve().parents[2]
NCT = ("ADI", "BACK", "DEB", "LYM", "MUC", "MUS", "NORM", "STR", "TUM")
TASK = {"datasets": ["nct-crc-he-100k"], "domains": ["all"], "transfer": False, "split": "manifest"}
PROBE = fill_section("probe", {"fractions": [1.0], "seeds": [0, 1], "readout": "cls"})
CALIBRATION = fill_section("calibration", {"kshot_k": [], "kshot_draws": 1})
BOOTSTRAP = fill_section("bootstrap", {"n_boot": 20, "seed": 0, "paired_n_boot": 20})


def make_nct(root: Path, n_train: int = 6, n_test: int = 2) -> None:
    """NCT-CRC-HE-100K-NONORM/<class>/*.tif and CRC-VAL-HE-7K/<class>/*.tif, as the release ships them."""
    rng = np.random.default_rng(0)
    for cls in NCT:
        for folder, n, tag in (("NCT-CRC-HE-100K-NONORM", n_train, "TRAIN"), ("CRC-VAL-HE-7K", n_test, "VAL")):
            for i in range(n):
                path = root / folder / cls / f"{cls}-{tag}{i:04d}.tif"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path, format="TIFF")


def embed(manifest: Path, out: Path, noise: float, seed: int) -> Path:
    man = read_table(manifest)
    rng = np.random.default_rng(seed)
    labels = man["label"].to_numpy().astype(int)
    feats = (rng.normal(scale=3.0, size=(len(NCT), 8))[labels] + rng.normal(scale=noise, size=(len(man), 8)))
    write_npz(out, {"item_id": np.asarray(man["item_id"].astype(str), dtype=str),
                    "feat__cls": feats.astype(np.float32)},
              {"encoder": out.parent.name, "encoder_config_hash": f"h{seed}", "n_items": len(man),
               "readouts": ["cls"], "embed_dim": {"cls": 8}})
    return out


@pytest.fixture(scope="module")
def nct_report(tmp_path_factory):
    from fmaudit.jobs.data import prepare_manifest_job
    from fmaudit.jobs.probe import aggregate_job, probe_shard_job
    from fmaudit.jobs.report import report_job

    root = tmp_path_factory.mktemp("nct")
    make_nct(root / "data")
    entry = load_dataset_registry()["nct-crc-he-100k"]
    manifest = root / "manifests" / "nct-crc-he-100k.parquet"
    prepare_manifest_job("nct-crc-he-100k", entry, str(root / "data"), str(manifest))
    runs, preds, embeddings = [], [], []
    for i, (encoder, noise) in enumerate((("enc-a", 0.5), ("enc-b", 2.0))):
        emb = embed(manifest, root / "embeddings" / encoder / "nct-crc-he-100k.npz", noise, seed=i)
        runs.append(root / "shards" / f"{encoder}.runs.parquet")
        preds.append(root / "shards" / f"{encoder}.predictions.parquet")
        embeddings.append(emb)
        probe_shard_job(encoder, "nct", TASK, [str(manifest)], [str(emb)], PROBE, CALIBRATION, BOOTSTRAP,
                        str(runs[-1]), str(preds[-1]))
    aggregate_job([str(p) for p in runs], str(root / "aggregate.parquet"))
    inputs = {"probe_runs": [str(root / "aggregate.parquet")], "probe_predictions": [str(p) for p in preds],
              "embeddings": [str(p) for p in embeddings]}
    report_job(inputs, {"calibration": {"nct": CALIBRATION}, "bootstrap": {"nct": BOOTSTRAP}}, str(root / "report"))
    return {"manifest": manifest, "report": root / "report", "runs": root / "aggregate.parquet"}


def test_the_manifest_says_its_groups_are_items(nct_report):
    man = read_table(nct_report["manifest"])
    assert (man["group_unit"] == "item").all() and (man["group"] == man["item_id"]).all()


def test_every_interval_is_marked_item_level(nct_report):
    runs = read_table(nct_report["runs"])
    assert (runs["ci_unit"] == "item").all()
    assert (runs["ci_resampling"] == f"unit=item, n={len(NCT) * 2}").all()  # the 18 items of CRC-VAL-HE-7K
    tables = nct_report["report"] / "tables"
    board = pd.read_csv(tables / "leaderboard.csv")
    assert (board["ci_resampling"] == "unit=item, n=18").all() and "patient" not in board["ci_convention"].iloc[0]
    paired = pd.read_csv(tables / "paired_differences.csv")
    assert len(paired) and (paired["ci_unit"] == "item").all()
    for path in tables.glob("*.md"):  # no table calls an interval patient-level
        assert "patient" not in path.read_text().lower(), path.name


def test_the_index_names_the_unit_and_count(nct_report):
    index = (nct_report["report"] / "index.md").read_text()
    assert "task nct: unit=item, n=18 per test set (no patient ids: item-level)" in index
    assert "all (in-domain; unit=item, n=18)" in index  # the leaderboard's column header
    assert "patient" not in index.lower().replace("no patient ids", "")


def render(caption: Path, units: dict, calibration: dict, bootstrap: dict) -> str:
    params = types.SimpleNamespace(units=units, calibration=calibration, bootstrap=bootstrap, ood={}, prior_shift={},
                                   variants={}, exposure={}, cost={"gpu_plan": {}}, cards={},
                                   cells={"magnifications": [], "protocols": {}, "taxonomies": {}, "readouts": [],
                                          "pretraining_wsis": {}})
    return jinja2.Template(caption.read_text()).render(snakemake=types.SimpleNamespace(params=params, config={}))


def test_captions_state_the_item_unit_and_never_patients_for_nct():
    registry = load_dataset_registry()
    config = fill_section_config({"data_root": "x", "encoders": ["demo-vit-tiny"], "datasets": ["nct-crc-he-100k"],
                                  "tasks": {"nct": dict(TASK)}})
    units = task_group_units(config, registry)
    assert units == {"nct": "item"}
    captions = REPO / "resources" / "report" / "tables"
    for name in ("leaderboard", "paired_differences"):
        text = render(captions / f"{name}.rst", units, {"nct": CALIBRATION}, {"nct": BOOTSTRAP})
        assert "nct: unit=item (no patient ids)" in text, name
        assert "patient/slide" not in text and "patients/slides" not in text and "over patients" not in text
    for caption in captions.glob("*.rst"):
        text = render(caption, units, {"nct": CALIBRATION}, {"nct": BOOTSTRAP})
        assert "patients/slides" not in text and "unit=patient" not in text, caption.name


def test_a_patient_level_data_set_says_patient(tmp_path):
    """The same captions for a task over the demo's patients name the patient unit (the contrast)."""
    registry = load_dataset_registry()
    config = fill_section_config({"data_root": "x", "encoders": ["demo-vit-tiny"], "datasets": ["demo-tiles"],
                                  "tasks": {"demo": {"datasets": ["demo-tiles"]}}})
    assert task_group_units(config, registry) == {"demo": "patient"}


def fill_section_config(config: dict) -> dict:
    from fmaudit.config import fill_config

    return fill_config(config)

"""``fmaudit embed``: a random-init demo encoder over a few generated images, from a sheet or a folder, into the
HDF5 file ``fmaudit probe`` reads; a resumed run reuses its finished chunks; checkpoint files and hub names."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

import fmaudit.embed as engine
from fmaudit.cli import main
from fmaudit.embed import image_manifest
from fmaudit.encoders import build_encoder, save_weights
from fmaudit.io import FmauditInputError, load_feature_array
from fmaudit.registry import get_encoder_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hub_cache  # noqa: E402


@pytest.fixture
def images(tmp_path) -> Path:
    """Seven generated tiles of two sizes in two scanner folders, and a sheet listing them relative to itself."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(7):
        rel = Path(f"scanner_{'ab'[i % 2]}") / f"tile_{i}.png"
        (tmp_path / "tiles" / rel).parent.mkdir(parents=True, exist_ok=True)
        size = 64 if i % 3 else 80
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(tmp_path / "tiles" / rel)
        rows.append({"path": rel.as_posix(), "label": "tumour" if i % 2 else "stroma"})
    pd.DataFrame(rows).to_csv(tmp_path / "tiles" / "sheet.csv", index=False)
    return tmp_path / "tiles"


def h5(path: Path) -> tuple[list[str], np.ndarray, dict, dict]:
    with h5py.File(path, "r") as f:
        readouts = {r: f["readouts"][r][()] for r in f["readouts"]}
        return f["item_id"].asstr()[()].tolist(), f["features"][()], readouts, json.loads(f.attrs["provenance"])


def expected(encoder, folder: Path, items: list[str], readout: str) -> np.ndarray:
    with torch.inference_mode():
        batch = torch.stack([encoder.transform(Image.open(folder / i).convert("RGB")) for i in items])
        return encoder(batch)[readout].numpy()


def test_a_sheet_is_embedded_into_the_file_fmaudit_probe_reads(images, tmp_path, capsys):
    out = tmp_path / "demo.h5"
    assert main(["embed", "--encoder", "demo-vit-tiny", "--images", str(images / "sheet.csv"), "--out", str(out),
                 "--batch-size", "2", "--chunk-size", "3"]) == 0
    assert "7 items embedded by demo-vit-tiny" in capsys.readouterr().out
    ids, features, readouts, prov = h5(out)
    sheet = pd.read_csv(images / "sheet.csv")
    assert ids == sheet["path"].tolist()  # item ids are the paths as the sheet writes them
    assert prov["features_readout"] == "cls" and sorted(readouts) == ["cls", "cls_mean", "mean", "pooled"]
    np.testing.assert_array_equal(features, readouts["cls"])
    reference = expected(build_encoder("demo-vit-tiny"), images, ids, "cls")
    np.testing.assert_allclose(features, reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(load_feature_array(out), features)
    assert prov["encoder"] == "demo-vit-tiny" and prov["n_items"] == 7 and prov["chunk_size"] == 3


def test_a_folder_is_embedded_and_an_interrupted_run_resumes(images, tmp_path, monkeypatch):
    out = tmp_path / "folder.h5"
    args = ["embed", "--encoder", "demo-convnet", "--images", str(images), "--out", str(out), "--batch-size", "2",
            "--chunk-size", "2", "--log", str(tmp_path / "run.log")]
    original = engine._write_chunk

    def stop_after_two(path, ids, feats, key, index):
        original(path, ids, feats, key, index)
        if index == 1:
            raise KeyboardInterrupt  # a run stopped by hand after its second chunk

    monkeypatch.setattr(engine, "_write_chunk", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        main(args)
    assert not out.exists()
    monkeypatch.setattr(engine, "_write_chunk", original)
    assert main(args) == 0
    log = (tmp_path / "run.log").read_text()
    assert "7 items in 4 chunk(s) of 2; 2 to compute, 2 reused" in log
    assert "chunk 00000: reused" in log and "chunk 00001: reused" in log and "chunk 00003: computed" in log
    ids, features, _, prov = h5(out)
    assert ids == sorted(ids) and ids[0] == "scanner_a/tile_0.png" and prov["features_readout"] == "pooled"
    uninterrupted = tmp_path / "uninterrupted.h5"
    assert main(["embed", "--encoder", "demo-convnet", "--images", str(images), "--out", str(uninterrupted),
                 "--batch-size", "2", "--chunk-size", "2"]) == 0
    np.testing.assert_allclose(features, h5(uninterrupted)[1], rtol=0, atol=1e-6)


def test_a_checkpoint_file_embeds_with_the_architecture_it_names(images, tmp_path, capsys):
    spec = get_encoder_spec("demo-vit-tiny")
    spec["weights"] = {**spec["weights"], "seed": 3}
    tuned = build_encoder(spec)
    checkpoint = save_weights(tuned, tmp_path / "tuned.safetensors")
    out = tmp_path / "tuned.h5"
    assert main(["embed", "--encoder", str(checkpoint), "--architecture", "demo-vit-tiny", "--images",
                 str(images / "sheet.csv"), "--out", str(out)]) == 0
    ids, features, _, prov = h5(out)
    np.testing.assert_allclose(features, expected(tuned, images, ids, "cls"), rtol=1e-5, atol=1e-5)
    assert prov["weights"]["source"] == "override"
    assert main(["embed", "--encoder", str(checkpoint), "--images", str(images), "--out", str(out)]) == 2
    assert "name its architecture with --architecture" in capsys.readouterr().err
    # a checkpoint that does not fit stops before anything is embedded, naming the file and the keys
    convnet = save_weights(build_encoder("demo-convnet"), tmp_path / "convnet.safetensors")
    assert main(["embed", "--encoder", "demo-vit-tiny", "--weights", str(convnet), "--images", str(images),
                 "--out", str(tmp_path / "bad.h5")]) == 2
    err = capsys.readouterr().err
    assert f"the weights in {convnet} (config '--weights') do not fit the architecture" in err
    assert "missing keys: blocks.0." in err and not (tmp_path / "bad.h5").exists()


def test_an_encoder_named_by_its_hub_repo(images, tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    hub_cache.add_to_cache(cache, "fmaudit-test/tiny-vit", hub_cache.timm_export(tmp_path / "export"))
    hub_cache.use_cache(monkeypatch, cache)
    out = tmp_path / "hub.h5"
    assert main(["embed", "--encoder", "timm:fmaudit-test/tiny-vit", "--images", str(images), "--out", str(out),
                 "--readouts", "cls,mean", "--features-readout", "mean"]) == 0
    _, _, readouts, prov = h5(out)
    assert prov["encoder"] == "timm--fmaudit-test--tiny-vit" and sorted(readouts) == ["cls", "mean"]
    assert prov["weights"]["resolved_commit"] == hub_cache.COMMIT and prov["features_readout"] == "mean"
    assert prov["hub_config"] and prov["hub_config"][0].endswith("config.json")


def test_bad_images_and_existing_outputs_are_named(images, tmp_path, capsys):
    sheet = images / "sheet.csv"
    rows = pd.read_csv(sheet)
    rows.loc[3, "path"] = "scanner_b/missing.png"
    bad = images / "bad.csv"
    rows.to_csv(bad, index=False)
    with pytest.raises(FmauditInputError, match=r"bad.csv: row 4: image file .*scanner_b/missing.png does not exist"):
        image_manifest(bad)
    rows.drop(columns="path").to_csv(bad, index=False)
    with pytest.raises(FmauditInputError, match="bad.csv: an image sheet needs a 'path' column"):
        image_manifest(bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FmauditInputError, match="no image files"):
        image_manifest(tmp_path / "empty")
    out = tmp_path / "x.h5"
    assert main(["embed", "--encoder", "demo-convnet", "--images", str(sheet), "--out", str(out)]) == 0
    assert main(["embed", "--encoder", "demo-vit-tiny", "--images", str(sheet), "--out", str(out)]) == 2
    assert "exists with other provenance" in capsys.readouterr().err
    assert main(["embed", "--encoder", "demo-vit-tiny", "--images", str(sheet), "--out", str(out),
                 "--overwrite"]) == 0
    assert main(["embed", "--encoder", "demo-vit", "--images", str(sheet), "--out", str(out)]) == 2
    assert "unknown encoder 'demo-vit'" in capsys.readouterr().err

"""The embedding engine: images and slide tiles in, one atomic npz out, resumable after a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from fmaudit.datasets.manifest import make_manifest
from fmaudit.embed import ItemDataset, align_to_manifest, embed_manifest, read_embeddings
from fmaudit.encoders import build_encoder
from fmaudit.io import FmauditInputError, dataframe_hash, read_npz, write_npz, write_table
from fmaudit.registry import encoder_config_hash, get_encoder_spec
from fmaudit.slides import read_tile

ENCODER = "demo-vit-tiny"


def image_manifest(folder: Path, n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` random RGB PNGs of 48×40 px (not the encoder's 64 px, so the transform resizes)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        path = folder / f"img_{i:03d}.png"
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path)
        rows.append({"dataset": "toy", "item_id": f"toy_{i:03d}", "source": str(path), "label": i % 3,
                     "label_name": f"c{i % 3}", "group": f"p{i % 4}", "domain": "a"})
    return make_manifest(rows)


def direct_features(spec, manifest: pd.DataFrame, readout: str) -> np.ndarray:
    """Reference: the encoder applied to each item read independently of the engine."""
    encoder = build_encoder(spec)
    dataset = ItemDataset(manifest, encoder.transform)
    batch = torch.stack([encoder.transform(dataset.load_image(i)) for i in range(len(dataset))])
    dataset.close()
    with torch.inference_mode():
        return encoder(batch, [readout])[readout].numpy()


def assert_only_the_finished_copy_is_kept(out: Path) -> None:
    """After a finished run the chunk folder holds a second name of the output (a hard link) and nothing else."""
    chunks = Path(f"{out}.chunks")
    assert [p.name for p in chunks.iterdir()] == [f"finished{out.suffix}"]
    assert os.path.samefile(chunks / f"finished{out.suffix}", out)


@pytest.fixture
def manifest(tmp_path) -> pd.DataFrame:
    return image_manifest(tmp_path / "images", 10)


def test_embeds_images_in_manifest_order_with_provenance(manifest, tmp_path):
    spec = get_encoder_spec(ENCODER)
    out = tmp_path / "emb" / "toy.npz"
    shuffled = manifest.sample(frac=1.0, random_state=1).reset_index(drop=True)
    prov = embed_manifest(shuffled, spec, out, batch_size=4, chunk_size=6)
    arrays, stored = read_npz(out)
    assert stored == prov
    assert arrays["item_id"].tolist() == shuffled["item_id"].tolist()
    for readout in spec["readouts"]:
        feats = arrays[f"feat__{readout}"]
        assert feats.dtype == np.float32 and feats.shape == (10, prov["embed_dim"][readout])
        np.testing.assert_allclose(feats, direct_features(spec, shuffled, readout), rtol=1e-5, atol=1e-5)
    assert prov["encoder"] == ENCODER
    assert prov["encoder_config_hash"] == encoder_config_hash(spec)
    assert prov["manifest_hash"] == dataframe_hash(shuffled)
    assert prov["n_items"] == 10 and prov["device"] == "cpu" and prov["images_per_s"] > 0
    assert prov["embed_dim"] == {"cls": 64, "mean": 64, "cls_mean": 128, "pooled": 64}
    assert "fmaudit_version" in prov
    assert_only_the_finished_copy_is_kept(out)


def test_workers_give_the_same_features(manifest, tmp_path):
    a = embed_manifest(manifest, ENCODER, tmp_path / "a.npz", batch_size=4, num_workers=0)
    b = embed_manifest(manifest, ENCODER, tmp_path / "b.npz", batch_size=4, num_workers=2)
    assert a["manifest_hash"] == b["manifest_hash"]
    fa, fb = read_npz(tmp_path / "a.npz")[0], read_npz(tmp_path / "b.npz")[0]
    np.testing.assert_array_equal(fa["feat__cls"], fb["feat__cls"])


def test_embeds_tiles_of_the_real_slide(real_slide_path, tmp_path):
    coords = [(600, 800), (1000, 1200), (1400, 1600), (800, 2200), (1200, 400)]
    rows = [{"dataset": "cmu", "item_id": f"tile_{x}_{y}", "source": str(real_slide_path), "x": x, "y": y,
             "level": 0, "size": 96, "group": "CMU-1", "domain": "aperio"} for x, y in coords]
    manifest = make_manifest(rows)
    spec = get_encoder_spec("demo-dinov2-tiny")
    embed_manifest(manifest, spec, tmp_path / "tiles.npz", batch_size=2, num_workers=1)
    ids, feats = read_embeddings(tmp_path / "tiles.npz", "cls")
    assert ids.tolist() == manifest["item_id"].tolist()
    encoder = build_encoder(spec)
    batch = torch.stack([encoder.transform(read_tile(real_slide_path, x, y, 0, 96)) for x, y in coords])
    with torch.inference_mode():
        expected = encoder(batch, ["cls"])["cls"].numpy()
    np.testing.assert_allclose(feats, expected, rtol=1e-5, atol=1e-5)
    assert len({tuple(np.round(f, 4)) for f in feats}) == len(coords)  # different tissue, different features


def test_corrupt_and_missing_images_name_the_item_and_file(manifest, tmp_path):
    bad = Path(manifest.loc[3, "source"])
    bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    with pytest.raises(FmauditInputError, match=rf"item 'toy_003': cannot read image {bad}"):
        embed_manifest(manifest, ENCODER, tmp_path / "out.npz", batch_size=4)
    assert not (tmp_path / "out.npz").exists()
    missing = manifest.copy()
    missing.loc[3, "source"] = str(tmp_path / "gone.png")
    with pytest.raises(FmauditInputError, match=r"item 'toy_003': image file .*gone.png does not exist"):
        embed_manifest(missing, ENCODER, tmp_path / "out2.npz", batch_size=4)


def test_corrupt_image_error_survives_a_worker_process(manifest, tmp_path):
    Path(manifest.loc[7, "source"]).write_bytes(b"garbage")
    with pytest.raises(FmauditInputError, match=r"item 'toy_007': cannot read image"):
        embed_manifest(manifest, ENCODER, tmp_path / "out.npz", batch_size=4, num_workers=1)


def test_missing_slide_is_an_input_error(tmp_path):
    rows = [{"dataset": "s", "item_id": "t0", "source": str(tmp_path / "none.svs"), "x": 0, "y": 0, "level": 0,
             "size": 64, "group": "g", "domain": "d"}]
    with pytest.raises(FmauditInputError, match=r"item 't0': .*none.svs: slide not found"):
        embed_manifest(make_manifest(rows), ENCODER, tmp_path / "out.npz")


def test_existing_output_is_kept_or_refused_never_silently_replaced(manifest, tmp_path, caplog):
    out = tmp_path / "toy.npz"
    first = embed_manifest(manifest, ENCODER, out, batch_size=4)
    mtime = out.stat().st_mtime_ns
    with caplog.at_level("INFO", logger="fmaudit.embed"):
        assert embed_manifest(manifest, ENCODER, out, batch_size=4) == first
    assert out.stat().st_mtime_ns == mtime and "up to date" in caplog.text
    fewer = manifest.iloc[:6]
    with pytest.raises(FmauditInputError, match=r"toy.npz: exists with other provenance \(manifest_hash differ\)"):
        embed_manifest(fewer, ENCODER, out)
    assert embed_manifest(fewer, ENCODER, out, overwrite=True)["n_items"] == 6


def test_resume_reuses_matching_chunks_and_recomputes_others(manifest, tmp_path):
    out = tmp_path / "toy.npz"
    log = tmp_path / "embed.log"
    reference = tmp_path / "reference.npz"
    embed_manifest(manifest, ENCODER, reference, batch_size=2, chunk_size=4)
    chunks = Path(f"{out}.chunks")
    # a chunk from another encoder config (stale key) and one with the right key: only the latter is reused
    arrays, _ = read_npz(reference)
    good_key = _chunk_key_of(manifest, tmp_path)
    write_npz(chunks / "chunk_00000.npz", {"item_id": arrays["item_id"][:4],
              **{k: v[:4] for k, v in arrays.items() if k.startswith("feat__")}}, {"chunk_key": good_key})
    write_npz(chunks / "chunk_00001.npz", {"item_id": arrays["item_id"][4:8],
              **{k: v[4:8] * 0 for k, v in arrays.items() if k.startswith("feat__")}}, {"chunk_key": "stale"})
    embed_manifest(manifest, ENCODER, out, batch_size=2, chunk_size=4, log=log)
    text = log.read_text()
    assert "chunk 00000: reused" in text and "chunk 00001: computed" in text and "chunk 00002: computed" in text
    np.testing.assert_array_equal(read_npz(out)[0]["feat__cls"], arrays["feat__cls"])


def _chunk_key_of(manifest: pd.DataFrame, tmp_path: Path) -> str:
    """The key the engine gives chunk 0, read from a run killed right after writing it (in-process)."""
    import fmaudit.embed as engine

    class Stop(Exception):
        pass

    original = engine._write_chunk

    def write_then_stop(path, ids, feats, key, index):
        original(path, ids, feats, key, index)
        raise Stop(key)

    engine._write_chunk = write_then_stop
    try:
        embed_manifest(manifest, ENCODER, tmp_path / "probe.npz", batch_size=2, chunk_size=4)
    except Stop as stop:
        return str(stop)
    finally:
        engine._write_chunk = original
    raise AssertionError("the engine wrote no chunk")


KILLED_RUN = textwrap.dedent("""
    import sys, time
    import fmaudit.embed as engine
    from fmaudit.io import read_table

    original = engine._write_chunk

    def write_then_hang(path, ids, feats, key, index):
        original(path, ids, feats, key, index)
        if index == 0:
            time.sleep(600)  # the test kills the process here, after the first chunk is on disk

    engine._write_chunk = write_then_hang
    engine.embed_manifest(read_table(sys.argv[1]), "demo-vit-tiny", sys.argv[2], batch_size=2, chunk_size=4,
                          num_threads=1)
""")


def test_sigkill_leaves_no_output_and_the_rerun_resumes(manifest, tmp_path):
    manifest_path = tmp_path / "manifest.parquet"
    write_table(manifest_path, manifest)
    script = tmp_path / "killed_run.py"
    script.write_text(KILLED_RUN)
    out = tmp_path / "killed.npz"
    chunks = Path(f"{out}.chunks")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script), str(manifest_path), str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (chunks / "chunk_00000.npz").exists():
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the first chunk never appeared"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    assert sorted(p.name for p in chunks.glob("chunk_*.npz")) == ["chunk_00000.npz"]

    log = tmp_path / "resume.log"
    embed_manifest(manifest_path, ENCODER, out, batch_size=2, chunk_size=4, num_threads=1, log=log)
    text = log.read_text()
    assert "chunk 00000: reused" in text
    assert "chunk 00001: computed" in text and "chunk 00002: computed" in text
    assert_only_the_finished_copy_is_kept(out)
    reference = tmp_path / "uninterrupted.npz"
    embed_manifest(manifest, ENCODER, reference, batch_size=2, chunk_size=4, num_threads=1)
    done, ref = read_npz(out)[0], read_npz(reference)[0]
    assert done["item_id"].tolist() == ref["item_id"].tolist()
    for key in ref:
        if key.startswith("feat__"):
            np.testing.assert_allclose(done[key], ref[key], rtol=0, atol=1e-6)


def test_bad_arguments(manifest, tmp_path):
    with pytest.raises(FmauditInputError, match="unknown readout"):
        embed_manifest(manifest, ENCODER, tmp_path / "o.npz", readouts=["nuc"])
    with pytest.raises(FmauditInputError, match="chunk_size must be >= 1"):
        embed_manifest(manifest, ENCODER, tmp_path / "o.npz", chunk_size=0)
    with pytest.raises(FmauditInputError, match="unknown encoder 'demo-vit'"):
        embed_manifest(manifest, "demo-vit", tmp_path / "o.npz")
    dup = pd.concat([manifest, manifest.iloc[:1]], ignore_index=True)
    with pytest.raises(FmauditInputError, match="item_id 'toy_000' occurs more than once"):
        embed_manifest(dup, ENCODER, tmp_path / "o.npz")


def test_patch_grid_readout_is_written_as_a_grid(manifest, tmp_path):
    prov = embed_manifest(manifest.iloc[:3], ENCODER, tmp_path / "grid.npz", readouts=["patch_grid", "cls"])
    ids, grid = read_embeddings(tmp_path / "grid.npz", "patch_grid")
    assert grid.shape == (3, 64, 8, 8) and prov["embed_dim"]["patch_grid"] == 64


def test_read_embeddings_rejects_non_finite_features_naming_the_item(tmp_path):
    feats = np.ones((4, 3), dtype=np.float32)
    feats[2, 1] = np.nan
    feats[3, 0] = np.inf
    path = tmp_path / "bad.npz"
    write_npz(path, {"item_id": np.array(["a", "b", "c", "d"]), "feat__cls": feats})
    expected = r"bad.npz: readout 'cls' has NaN/inf features for 2 item\(s\), first 'c' \(row 2\)"
    with pytest.raises(FmauditInputError, match=expected):
        read_embeddings(path, "cls")
    with pytest.raises(FmauditInputError, match=r"no readout 'mean' \(it has \['cls'\]\)"):
        read_embeddings(path, "mean")


def test_align_to_manifest(manifest):
    ids = manifest["item_id"].tolist()[::-1] + ["extra"]
    feats = np.arange(len(ids), dtype=np.float32)[:, None] * np.ones((1, 2), dtype=np.float32)
    aligned = align_to_manifest(feats, ids, manifest)
    expected = np.array([ids.index(i) for i in manifest["item_id"]], dtype=np.float32)
    np.testing.assert_array_equal(aligned[:, 0], expected)
    with pytest.raises(FmauditInputError, match=r"2 manifest item\(s\) have no embedding, e.g. 'toy_009', 'toy_008'"):
        align_to_manifest(feats[2:], ids[2:], manifest.iloc[::-1])
    with pytest.raises(FmauditInputError, match="item id 'toy_009' occurs more than once"):
        align_to_manifest(np.zeros((2, 2)), ["toy_009", "toy_009"], manifest)
    with pytest.raises(FmauditInputError, match="3 feature rows for 2 item ids"):
        align_to_manifest(np.zeros((3, 2)), ["a", "b"], manifest)


def test_cuda_request_falls_back_to_cpu_without_cuda(manifest, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    threads = torch.get_num_threads()
    with caplog.at_level("WARNING", logger="fmaudit.embed"):
        prov = embed_manifest(manifest.iloc[:2], ENCODER, tmp_path / "cpu.npz", device="cuda", num_threads=1)
    assert prov["device"] == "cpu" and prov["precision"] == "float32"
    assert "CUDA requested but not available" in caplog.text
    assert torch.get_num_threads() == threads


# ---------------------------------------------------------------- no lost work: keys, chunks, temp files


def _interrupted_after_first_chunk(manifest, out, spec, weights_path=None):
    """Run the engine until its first chunk is on disk, then stop it (a killed job, in-process)."""
    import fmaudit.embed as engine

    class Stop(Exception):
        pass

    original = engine._write_chunk

    def write_then_stop(path, ids, feats, key, index):
        original(path, ids, feats, key, index)
        raise Stop()

    engine._write_chunk = write_then_stop
    try:
        embed_manifest(manifest, spec, out, batch_size=2, chunk_size=4, weights_path=weights_path)
    except Stop:
        return
    finally:
        engine._write_chunk = original
    raise AssertionError("the engine wrote no chunk")


def test_chunks_are_reused_only_when_what_decides_their_numbers_matches(manifest, tmp_path):
    import copy

    from fmaudit.encoders import save_weights

    spec = get_encoder_spec(ENCODER)
    out = tmp_path / "toy.npz"
    _interrupted_after_first_chunk(manifest, out, spec)
    # an edit that changes no number (description, licence, exposure) keeps the key: the chunk is reused
    described = copy.deepcopy(spec)
    described.update(description="edited", licence="MIT", exposure={"x": {"status": "no", "evidence": "e"}})
    log = tmp_path / "described.log"
    embed_manifest(manifest, described, out, batch_size=2, chunk_size=4, log=log)
    assert "chunk 00000: reused" in log.read_text() and "chunk 00001: computed" in log.read_text()

    # other weights under the same override path: their sha256 differs, so the chunk is recomputed
    weights = tmp_path / "w.safetensors"
    save_weights(build_encoder(spec), weights)
    out2 = tmp_path / "override.npz"
    _interrupted_after_first_chunk(manifest, out2, spec, weights_path=weights)
    reseeded = copy.deepcopy(spec)
    reseeded["weights"]["seed"] = 3
    save_weights(build_encoder(reseeded), weights)
    log = tmp_path / "override.log"
    prov = embed_manifest(manifest, spec, out2, batch_size=2, chunk_size=4, weights_path=weights, log=log)
    assert "chunk 00000: computed" in log.read_text() and "chunk 00000: reused" not in log.read_text()
    np.testing.assert_allclose(read_npz(out2)[0]["feat__cls"], direct_features(reseeded, manifest, "cls"),
                               atol=1e-5, rtol=0)
    assert prov["weights"] == {"source": "override", "sha256": [sha256_of(weights)]}


def sha256_of(path):
    from fmaudit.io import sha256_file

    return sha256_file(path)


def test_temporary_files_of_a_killed_run_are_removed_by_the_next_run(manifest, tmp_path):
    from fmaudit.io import _HOST

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "emb" / "toy.npz"
    chunks = Path(f"{out}.chunks")
    chunks.mkdir(parents=True)
    leftovers = [out.parent / f".toy.npz.{_HOST}-{dead.pid}.abcd1234.tmp.npz",
                 chunks / f".chunk_00000.npz.{_HOST}-{dead.pid}.efgh5678.tmp.npz"]
    for path in leftovers:
        path.write_bytes(b"half a file")
    embed_manifest(manifest, ENCODER, out, batch_size=4, chunk_size=4)
    assert not any(p.exists() for p in leftovers) and out.exists()
    assert_only_the_finished_copy_is_kept(out)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]


def test_provenance_and_inventory_say_what_the_weights_were(manifest, tmp_path):
    from fmaudit.embed import embedding_inventory
    from fmaudit.encoders import save_weights
    from fmaudit.registry import embedding_key

    spec = get_encoder_spec(ENCODER)
    out = tmp_path / ENCODER / embedding_key(spec) / "toy.npz"
    prov = embed_manifest(manifest, spec, out, batch_size=4)
    assert prov["weights"] == {"source": "random", "seed": 0} and prov["weight_files"] == []
    assert prov["embedding_key"] == embedding_key(spec) and prov["encoder_config_hash"] == encoder_config_hash(spec)
    weights = save_weights(build_encoder(spec), tmp_path / "w.safetensors")
    out2 = tmp_path / ENCODER / embedding_key(spec, str(weights)) / "toy.npz"
    prov2 = embed_manifest(manifest, spec, out2, batch_size=4, weights_path=weights)
    assert prov2["embedding_key"] == embedding_key(spec, str(weights)) != prov["embedding_key"]
    assert prov2["weight_files"] == [{"path": str(weights.resolve()), "sha256": sha256_of(weights)}]
    table = embedding_inventory([out, out2])
    assert table["encoder"].tolist() == [ENCODER] * 2 and table["dataset"].tolist() == ["toy"] * 2
    assert table["weights"].tolist() == ["random init (seed 0)", "local file (encoder_weights)"]
    assert table["weights_sha256"].isna().tolist() == [True, False]
    assert table["weights_sha256"].iloc[1] == sha256_of(weights)
    assert table["embedding_key"].tolist() == [prov["embedding_key"], prov2["embedding_key"]]


# ---------------------------------------------------------------- the finished copy, the HDF5 layout


def test_a_deleted_output_is_rebuilt_from_the_finished_copy_without_computing(manifest, tmp_path):
    """What Snakemake's --rerun-incomplete does after its own process was killed: the output of a job that had
    finished is deleted and the job runs again. Every chunk comes from the finished copy; a changed item is
    the only chunk computed again."""
    out = tmp_path / "emb" / "toy.npz"
    reference = embed_manifest(manifest, ENCODER, out, batch_size=2, chunk_size=4)
    first = read_npz(out)[0]
    out.unlink()  # Snakemake's cleanup of an incomplete output
    log = tmp_path / "rerun.log"
    prov = embed_manifest(manifest, ENCODER, out, batch_size=2, chunk_size=4, log=log)
    text = log.read_text()
    assert "3 chunk(s) of 4; 0 to compute, 3 reused" in text
    assert all(f"chunk {c:05d}: reused from finished.npz" in text for c in range(3)) and "computed" not in text
    assert prov["images_per_s"] is None and prov["chunk_keys"] == reference["chunk_keys"]
    again = read_npz(out)[0]
    for key, value in first.items():
        np.testing.assert_array_equal(again[key], value)
    assert_only_the_finished_copy_is_kept(out)

    changed = manifest.copy()
    changed.loc[5, "source"] = manifest.loc[0, "source"]  # one item of chunk 1 now shows other pixels
    log2 = tmp_path / "changed.log"
    embed_manifest(changed, ENCODER, out, batch_size=2, chunk_size=4, log=log2, overwrite=True)
    text = log2.read_text()
    assert "chunk 00000: reused from finished.npz" in text and "chunk 00002: reused from finished.npz" in text
    assert "chunk 00001: computed" in text
    np.testing.assert_allclose(read_npz(out)[0]["feat__cls"][5], first["feat__cls"][0], rtol=1e-5, atol=1e-6)


def test_chunks_are_kept_where_there_are_no_hard_links(manifest, tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    out = tmp_path / "toy.npz"
    embed_manifest(manifest, ENCODER, out, batch_size=2, chunk_size=4)
    kept = sorted(p.name for p in Path(f"{out}.chunks").iterdir())
    assert kept == ["chunk_00000.npz", "chunk_00001.npz", "chunk_00002.npz"]
    out.unlink()
    log = tmp_path / "rerun.log"
    embed_manifest(manifest, ENCODER, out, batch_size=2, chunk_size=4, log=log)
    assert "0 to compute, 3 reused" in log.read_text()


def test_hdf5_output_holds_features_ids_every_readout_and_provenance(manifest, tmp_path):
    import h5py

    from fmaudit.io import load_feature_array

    npz = tmp_path / "toy.npz"
    embed_manifest(manifest, ENCODER, npz, batch_size=4, chunk_size=4)
    out = tmp_path / "toy.h5"
    prov = embed_manifest(manifest, ENCODER, out, batch_size=4, chunk_size=4, features_readout="mean")
    reference = read_npz(npz)[0]
    with h5py.File(out, "r") as f:
        assert f["item_id"].asstr()[()].tolist() == manifest["item_id"].tolist()
        assert sorted(f["readouts"]) == sorted(get_encoder_spec(ENCODER)["readouts"])
        for readout in f["readouts"]:
            np.testing.assert_array_equal(f["readouts"][readout][()], reference[f"feat__{readout}"])
        stored = __import__("json").loads(f.attrs["provenance"])
    assert stored["features_readout"] == "mean" and stored["encoder_config_hash"] == prov["encoder_config_hash"]
    np.testing.assert_array_equal(load_feature_array(out), reference["feat__mean"])  # what `fmaudit probe` reads
    # the existing file is recognised as up to date, and its finished copy too
    assert embed_manifest(manifest, ENCODER, out, batch_size=4, chunk_size=4)["manifest_hash"] == prov["manifest_hash"]
    assert_only_the_finished_copy_is_kept(out)
    with pytest.raises(FmauditInputError, match="features_readout 'nuc' is not among the readouts"):
        embed_manifest(manifest, ENCODER, tmp_path / "x.h5", features_readout="nuc")

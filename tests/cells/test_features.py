"""Nucleus-anchored features: sampling convention, patch assignment, readouts, storage, resuming."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from fmaudit.cells.features import (
    CellFeatures,
    assign_cells_to_patches,
    available_readouts,
    extract_cell_features,
    fuse_readout,
    open_cell_features,
    plan_geometry,
    sample_token_grid,
    write_cell_features,
)
from fmaudit.cells.features import extraction as cf
from fmaudit.encoders import ENCODER_CACHE
from fmaudit.io import FmauditInputError
from slide_utils import TISSUE_RGB


def bilinear_reference(grid: np.ndarray, u: float, v: float) -> np.ndarray:
    """Independent bilinear interpolation: token (i, j) centred at ((j+0.5)/w, (i+0.5)/h), border clamped."""
    d, h, w = grid.shape
    x = min(max(u * w - 0.5, 0.0), w - 1.0)
    y = min(max(v * h - 0.5, 0.0), h - 1.0)
    j0, i0 = int(np.floor(x)), int(np.floor(y))
    j1, i1 = min(j0 + 1, w - 1), min(i0 + 1, h - 1)
    fx, fy = x - j0, y - i0
    return ((1 - fx) * (1 - fy) * grid[:, i0, j0] + fx * (1 - fy) * grid[:, i0, j1]
            + (1 - fx) * fy * grid[:, i1, j0] + fx * fy * grid[:, i1, j1])


# --------------------------------------------------------------------------------------------------------
# the Nuc sampling convention
# --------------------------------------------------------------------------------------------------------

def test_nuc_is_bilinear_mix_of_the_four_surrounding_tokens():
    rng = np.random.default_rng(0)
    grid = rng.normal(size=(2, 5, 4, 6))  # 2 patches, D=5, 4 rows x 6 columns
    # patch 0: a point between token centres (col 1.3 -> between cols 1 and 2; row 2.2 -> rows 2 and 3)
    u0, v0 = (1.3 + 0.5) / 6, (2.2 + 0.5) / 4
    cells = [(0, u0, v0), (1, 0.61, 0.37), (0, 0.2, 0.9), (1, 0.5, 0.5)]
    out = sample_token_grid(torch.tensor(grid), torch.tensor([c[0] for c in cells]),
                            torch.tensor([[c[1], c[2]] for c in cells], dtype=torch.float64)).numpy()
    expected_first = (0.7 * 0.8 * grid[0, :, 2, 1] + 0.3 * 0.8 * grid[0, :, 2, 2]
                      + 0.7 * 0.2 * grid[0, :, 3, 1] + 0.3 * 0.2 * grid[0, :, 3, 2])
    np.testing.assert_allclose(out[0], expected_first, atol=1e-10)
    for row, (p, u, v) in zip(out, cells):
        np.testing.assert_allclose(row, bilinear_reference(grid[p], u, v), atol=1e-10)


def test_cell_at_patch_centre():
    rng = np.random.default_rng(1)
    even = rng.normal(size=(1, 3, 4, 4))
    odd = rng.normal(size=(1, 3, 3, 3))
    centre = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    at_even = sample_token_grid(torch.tensor(even), torch.tensor([0]), centre).numpy()[0]
    at_odd = sample_token_grid(torch.tensor(odd), torch.tensor([0]), centre).numpy()[0]
    np.testing.assert_allclose(at_even, even[0, :, 1:3, 1:3].mean(axis=(1, 2)), atol=1e-12)  # the 4 central tokens
    np.testing.assert_allclose(at_odd, odd[0, :, 1, 1], atol=1e-12)  # exactly the central token


def test_token_centre_and_border_are_not_mixed_with_zeros():
    grid = np.arange(16, dtype=float).reshape(1, 1, 4, 4) + 1.0
    pts = torch.tensor([[0.125, 0.125], [0.0, 0.0], [0.999, 0.5]], dtype=torch.float64)
    out = sample_token_grid(torch.tensor(grid), torch.tensor([0, 0, 0]), pts).numpy()[:, 0]
    assert out[0] == grid[0, 0, 0, 0]  # token (0, 0) is centred at (0.125, 0.125)
    assert out[1] == grid[0, 0, 0, 0]  # the patch corner takes the border token, not a mix with padding zeros
    np.testing.assert_allclose(out[2], bilinear_reference(grid[0], 0.999, 0.5)[0])


# --------------------------------------------------------------------------------------------------------
# geometry and assignment
# --------------------------------------------------------------------------------------------------------

def test_level_and_read_size_for_each_magnification():
    downsamples = [1.0, 2.0, 4.0]
    for mag, level in ((40, 0), (20, 1), (10, 2)):
        g = plan_geometry(0.25, downsamples, cf.magnification_mpp(mag), 224)
        assert (g.level, g.read_size, g.resampling) == (level, 224, "none")
    g = plan_geometry(0.499, [1.0], cf.magnification_mpp(10), 64)  # one-level 20x scan read at 10x
    assert (g.level, g.read_size, g.resampling) == (0, 128, "downsample")
    assert g.effective_mpp == pytest.approx(0.998)
    with pytest.warns(UserWarning, match="upsampled"):
        g = plan_geometry(0.499, [1.0], cf.magnification_mpp(40), 64)
    assert g.read_size == 32 and g.resampling == "upsample"
    g = plan_geometry(0.2125, [1.0, 4.0], 0.5, 224)  # Xenium-like 0.2125 µm/px: level 0, shrunk
    assert g.level == 0 and g.read_size == round(224 * 0.5 / 0.2125)


def test_cells_on_patch_borders_go_to_the_patch_right_and_below():
    g = plan_geometry(0.25, [1.0, 2.0], 0.5, 64)  # level 1, 64 px of level 1 = 128 level-0 px
    assert g.level == 1 and g.read_size * g.level_downsample == 128
    x = np.array([0.0, 127.999, 128.0, 128.0 + 1e-9, 255.999, 256.0])
    col, row, u, v = assign_cells_to_patches(x, x, g)
    assert col.tolist() == [0, 0, 1, 1, 1, 2] and row.tolist() == col.tolist()
    assert u[2] == 0.0 and u[1] == pytest.approx(1.0, abs=1e-4) and ((u >= 0) & (u < 1)).all()


# --------------------------------------------------------------------------------------------------------
# end to end on synthetic and real slides
# --------------------------------------------------------------------------------------------------------

def cell_manifest(slide, xs, ys, mpp, section="s1", organ="breast"):
    n = len(xs)
    return pd.DataFrame({
        "item_id": [f"{section}/c{i}" for i in range(n)], "cell_id": [f"c{i}" for i in range(n)],
        "section": section, "organ": organ, "slide": str(slide), "mpp": float(mpp),
        "he_x": np.asarray(xs, dtype=np.float64), "he_y": np.asarray(ys, dtype=np.float64),
        "centre_source": "nucleus_polygon", "label_fine": pd.array([i % 4 for i in range(n)], dtype="Int64"),
        "label_coarse": pd.array([i % 2 for i in range(n)], dtype="Int64"),
        "label_fine_name": [f"t{i % 4}" for i in range(n)], "label_coarse_name": [f"g{i % 2}" for i in range(n)]})


@pytest.fixture
def textured_slide(make_pyramid):
    rng = np.random.default_rng(5)
    img = np.clip(np.array(TISSUE_RGB)[None, None, :] + rng.normal(0, 40, (512, 512, 3)), 0, 255).astype(np.uint8)
    return make_pyramid("textured.tif", img, n_levels=3, mpp=0.25)


def test_stored_nuc_mean_cls_equal_an_independent_recomputation(textured_slide, tmp_path):
    from fmaudit.encoders import build_encoder
    from fmaudit.slides import read_tile

    rng = np.random.default_rng(2)
    # two cells exactly on patch borders (level-0 x = 128 at 20x: level 1 px 64) and random ones
    xs = np.r_[128.0, 127.5, rng.uniform(0, 512, 30)]
    ys = np.r_[200.0, 200.0, rng.uniform(0, 512, 30)]
    manifest = cell_manifest(textured_slide, xs, ys, 0.25)
    meta = extract_cell_features(manifest, "demo-vit-tiny", 20, tmp_path / "f", chunk_size=3, batch_size=2,
                                 device="cpu")
    assert (meta["level"], meta["read_size"], meta["input_size"]) == (1, 64, 64)
    feats = open_cell_features(tmp_path / "f")
    patches = pd.read_parquet(tmp_path / "f" / "patches.parquet")
    assert isinstance(feats.nuc, np.memmap) and feats.nuc.dtype == np.float16
    # the border cells sit in neighbouring patches
    p0, p1 = feats.cell_patch[0], feats.cell_patch[1]
    assert patches.loc[p0, "col"] == 1 and patches.loc[p1, "col"] == 0
    assert feats.uv[0, 0] == 0.0 and feats.uv[1, 0] == pytest.approx(63.75 / 64)

    encoder = build_encoder("demo-vit-tiny")
    for i in (0, 1, 5, 17):
        p = patches.loc[feats.cell_patch[i]]
        tile = read_tile(textured_slide, int(p.x0), int(p.y0), 1, 64)
        x = torch.from_numpy(np.asarray(tile, dtype=np.uint8).copy()).permute(2, 0, 1)[None]
        with torch.inference_mode():
            out = encoder(encoder.normalize(x), ["patch_grid", "mean", "cls"])
        u = xs[i] / 2 / 64 - p.col
        v = ys[i] / 2 / 64 - p.row
        expected = bilinear_reference(out["patch_grid"][0].double().numpy(), u, v)
        np.testing.assert_allclose(feats.nuc[i].astype(np.float64), expected, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(feats.readout("mean", [i])[0], out["mean"][0].numpy(), rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(feats.readout("cls", [i])[0], out["cls"][0].numpy(), rtol=2e-3, atol=2e-3)


def test_real_slide_at_three_magnifications(real_slide_path, tmp_path):
    xs = [100.5, 1000.25, 2219.0]
    ys = [50.0, 1500.0, 2966.9]
    manifest = cell_manifest(real_slide_path, xs, ys, 0.499)
    sizes = {}
    for mag in (20, 10):
        meta = extract_cell_features(manifest, "demo-vit-tiny", mag, tmp_path / f"m{mag}", device="cpu")
        sizes[mag] = meta["read_size"]
        feats = open_cell_features(tmp_path / f"m{mag}")
        assert feats.nuc.shape == (3, 64) and np.isfinite(feats.readout("nuc")).all()
        assert meta["manifest_hash"] and meta["encoder_config_hash"] and meta["patch_field_um"] > 0
    assert sizes == {20: 64, 10: 128}


def test_cls_skipped_without_class_token_and_fusion_widths(textured_slide, tmp_path):
    manifest = cell_manifest(textured_slide, [10.0, 300.0, 301.0], [10.0, 300.0, 302.0], 0.25)
    extract_cell_features(manifest, "demo-convnet", 20, tmp_path / "cnn", device="cpu")
    feats = open_cell_features(tmp_path / "cnn")
    assert not feats.has_cls and not (tmp_path / "cnn" / "patch_cls.npy").exists()
    assert feats.readouts == ["nuc", "mean", "nuc_add_mean", "nuc_cat_mean"]
    with pytest.raises(FmauditInputError, match="not available"):
        feats.readout("nuc_cat_cls")
    nuc, mean = feats.readout("nuc"), feats.readout("mean")
    assert nuc.shape == (3, 128) and feats.readout("nuc_cat_mean").shape == (3, 256)
    np.testing.assert_array_equal(feats.readout("nuc_add_mean"), nuc + mean)
    np.testing.assert_array_equal(feats.readout("nuc_cat_mean"), np.concatenate([nuc, mean], axis=1))
    # cells 1 and 2 share a patch: the same Mean, different Nuc
    np.testing.assert_array_equal(mean[1], mean[2])
    assert not np.array_equal(nuc[1], nuc[2])
    assert available_readouts(False) == ["nuc", "mean", "nuc_add_mean", "nuc_cat_mean"]
    assert len(available_readouts(True)) == 7


def test_fusions_from_arrays():
    nuc, mean, cls = (np.full((2, 3), v, dtype=np.float16) for v in (1.0, 2.0, 4.0))
    assert fuse_readout("nuc_add_cls", nuc, mean, cls).tolist() == [[5.0] * 3] * 2
    cat = fuse_readout("nuc_cat_cls", nuc, mean, cls)
    assert cat.shape == (2, 6) and cat.dtype == np.float32 and cat[0].tolist() == [1.0] * 3 + [4.0] * 3
    with pytest.raises(FmauditInputError, match="unknown cell readout"):
        fuse_readout("nuc_mul_mean", nuc, mean, cls)


# --------------------------------------------------------------------------------------------------------
# storage
# --------------------------------------------------------------------------------------------------------

def test_float16_memmap_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    nuc = rng.normal(size=(7, 4)) * 100
    mean = rng.normal(size=(3, 4))
    cls = rng.normal(size=(3, 4))
    patch = np.array([0, 0, 1, 2, 2, 2, 1])
    write_cell_features(tmp_path / "f", [f"c{i}" for i in range(7)], patch, rng.uniform(size=(7, 2)), nuc, mean, cls)
    feats = CellFeatures(tmp_path / "f")
    assert isinstance(feats.nuc, np.memmap) and feats.nuc.dtype == np.float16 and not feats.nuc.flags.writeable
    np.testing.assert_array_equal(feats.nuc, nuc.astype(np.float16))
    np.testing.assert_array_equal(feats.readout("mean"), mean.astype(np.float16).astype(np.float32)[patch])
    np.testing.assert_array_equal(feats.readout("nuc_add_cls", np.array([3, 5])),
                                  (nuc.astype(np.float16).astype(np.float32)
                                   + cls.astype(np.float16).astype(np.float32)[patch])[[3, 5]])
    # seven readouts, but one per-cell array (Nuc) and two per-patch arrays on disk
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == [
        "cells.parquet", "meta.json", "nuc.npy", "patch_cls.npy", "patch_mean.npy", "patches.parquet"]
    with pytest.raises(FmauditInputError, match="float16"):
        write_cell_features(tmp_path / "g", ["a"], np.array([0]), np.zeros((1, 2)), np.array([[1e6]]),
                            np.zeros((1, 1)), None)
    assert not (tmp_path / "g").exists()


def test_bad_manifests_are_named(textured_slide, tmp_path):
    good = cell_manifest(textured_slide, [10.0, 20.0], [10.0, 20.0], 0.25)
    with pytest.raises(FmauditInputError, match="missing column"):
        extract_cell_features(good.drop(columns=["he_y"]), "demo-vit-tiny", 20, tmp_path / "a")
    outside = cell_manifest(textured_slide, [10.0, 600.0], [10.0, 20.0], 0.25)
    with pytest.raises(FmauditInputError, match="1 cell.*outside the slide.*'s1/c1'"):
        extract_cell_features(outside, "demo-vit-tiny", 20, tmp_path / "b")
    nan = cell_manifest(textured_slide, [10.0, np.nan], [10.0, 20.0], 0.25)
    with pytest.raises(FmauditInputError, match="he_x of cell 's1/c1'"):
        extract_cell_features(nan, "demo-vit-tiny", 20, tmp_path / "c")
    dup = pd.concat([good, good.iloc[[0]]], ignore_index=True)
    with pytest.raises(FmauditInputError, match="occurs more than once"):
        extract_cell_features(dup, "demo-vit-tiny", 20, tmp_path / "d")
    two = good.copy()
    two.loc[1, "section"] = "s2"
    with pytest.raises(FmauditInputError, match="'section' must hold one value"):
        extract_cell_features(two, "demo-vit-tiny", 20, tmp_path / "e")
    with pytest.raises(FmauditInputError, match="readout 'cls'"):
        CellFeatures(_written_without_cls(tmp_path / "f")).readout("cls")
    assert not any((tmp_path / n).exists() for n in "abcde")


def _written_without_cls(path):
    return write_cell_features(path, ["a"], np.array([0]), np.zeros((1, 2)), np.ones((1, 2)), np.ones((1, 2)), None)


# --------------------------------------------------------------------------------------------------------
# resuming
# --------------------------------------------------------------------------------------------------------

class Killed(RuntimeError):
    pass


def test_killed_run_leaves_no_output_and_resumes_from_its_chunks(textured_slide, tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    manifest = cell_manifest(textured_slide, rng.uniform(0, 512, 60), rng.uniform(0, 512, 60), 0.25)
    kwargs = dict(chunk_size=4, batch_size=2, device="cpu")
    reference = extract_cell_features(manifest, "demo-vit-tiny", 40, tmp_path / "ref", **kwargs)
    n_chunks = -(-reference["n_patches"] // 4)
    assert n_chunks >= 5

    real_write = cf.write_npz
    calls = []

    def dying_write(path, *args, **kw):
        if len(calls) == 2:
            raise Killed("killed")
        calls.append(path)
        return real_write(path, *args, **kw)

    monkeypatch.setattr(cf, "write_npz", dying_write)
    out = tmp_path / "run"
    with pytest.raises(Killed):
        extract_cell_features(manifest, "demo-vit-tiny", 40, out, **kwargs)
    assert not out.exists(), "a killed run must not leave a complete-looking folder"
    assert len(list((tmp_path / "run.chunks").glob("chunk_*.npz"))) == 2

    # a changed cell position invalidates only its chunk
    moved = manifest.copy()
    away_from_borders = (moved["he_x"].to_numpy() % 64) < 60
    first_chunk_cell = int(np.flatnonzero((_chunk_of_cells(moved, 4) == 0) & away_from_borders)[0])
    moved.loc[first_chunk_cell, "he_x"] += 0.25
    counted = []
    monkeypatch.setattr(cf, "write_npz", lambda path, *a, **k: (counted.append(path), real_write(path, *a, **k))[1])
    meta = extract_cell_features(moved, "demo-vit-tiny", 40, out, **kwargs)
    assert len(counted) == n_chunks - 1, "the one valid chunk is reused, the changed one recomputed"
    assert not (tmp_path / "run.chunks").exists()

    fresh = extract_cell_features(moved, "demo-vit-tiny", 40, tmp_path / "fresh", **kwargs)
    a, b = open_cell_features(out), open_cell_features(tmp_path / "fresh")
    np.testing.assert_array_equal(a.nuc, b.nuc)
    np.testing.assert_array_equal(a.patch_cls, b.patch_cls)
    assert meta["manifest_hash"] == fresh["manifest_hash"]

    # a rerun keeps the complete folder; other provenance raises unless overwrite
    counted.clear()
    extract_cell_features(moved, "demo-vit-tiny", 40, out, **kwargs)
    assert counted == []
    with pytest.raises(FmauditInputError, match="other provenance.*magnification"):
        extract_cell_features(moved, "demo-vit-tiny", 20, out, **kwargs)
    extract_cell_features(moved, "demo-vit-tiny", 20, out, overwrite=True, **kwargs)
    assert open_cell_features(out).meta["magnification"] == 20


def _chunk_of_cells(manifest, chunk_size):
    g = plan_geometry(0.25, [1.0, 2.0, 4.0], 0.25, 64)
    col, row, _, _ = assign_cells_to_patches(manifest["he_x"].to_numpy(), manifest["he_y"].to_numpy(), g)
    _, patch = np.unique(np.stack([row, col], axis=1), axis=0, return_inverse=True)
    return patch.reshape(-1) // chunk_size


def test_section_job_writes_every_magnification_with_one_encoder(textured_slide, tmp_path):
    before = ENCODER_CACHE.loads["demo-vit-tiny"]
    manifest = cell_manifest(textured_slide, [10.0, 300.0], [10.0, 300.0], 0.25)
    out = cf.extract_section_features(manifest, "demo-vit-tiny", {40: tmp_path / "m40", 20: tmp_path / "m20",
                                                                  10: tmp_path / "m10"}, device="cpu")
    assert ENCODER_CACHE.loads["demo-vit-tiny"] - before == 1
    assert {m: meta["level"] for m, meta in out.items()} == {40: 0, 20: 1, 10: 2}
    assert all(open_cell_features(tmp_path / f"m{m}").nuc.shape == (2, 64) for m in (40, 20, 10))


def test_a_killed_section_job_rebuilds_its_written_magnifications_from_their_chunks(textured_slide, tmp_path,
                                                                                    monkeypatch):
    """Snakemake removes every output of a job it reruns: the magnifications a killed section job had written are
    rebuilt from their kept chunks, without computing them again; the encoder is loaded for the rest only."""
    rng = np.random.default_rng(6)
    manifest = cell_manifest(textured_slide, rng.uniform(0, 512, 40), rng.uniform(0, 512, 40), 0.25)
    kwargs = dict(chunk_size=4, batch_size=2, device="cpu")
    reference = cf.extract_section_features(manifest, "demo-vit-tiny", {40: tmp_path / "r40", 20: tmp_path / "r20"},
                                            **kwargs)
    assert not list(tmp_path.glob("*.chunks")), "a finished job leaves no chunks"
    real_compute = cf._compute_chunks
    computed = []
    kill = [True]

    def compute(*args, **kw):
        computed.append(kw["section"])
        if kill[0] and len(computed) == 2:
            raise Killed("killed while embedding 20x")
        return real_compute(*args, **kw)

    monkeypatch.setattr(cf, "_compute_chunks", compute)
    outs = {40: tmp_path / "m40", 20: tmp_path / "m20"}
    with pytest.raises(Killed):
        cf.extract_section_features(manifest, "demo-vit-tiny", outs, **kwargs)
    assert (tmp_path / "m40" / "meta.json").is_file() and not (tmp_path / "m20").exists()
    assert (tmp_path / "m40.chunks").is_dir(), "the written magnification's chunks are kept until the job is done"
    shutil.rmtree(tmp_path / "m40")  # what Snakemake does to the outputs of a job it reruns

    computed.clear()
    kill[0] = False
    ENCODER_CACHE.clear()  # a new process
    before = ENCODER_CACHE.loads["demo-vit-tiny"]
    cf.extract_section_features(manifest, "demo-vit-tiny", outs, **kwargs)
    assert len(computed) == 1, "only the interrupted magnification computes"
    assert ENCODER_CACHE.loads["demo-vit-tiny"] - before == 1
    for m in (40, 20):
        np.testing.assert_array_equal(open_cell_features(outs[m]).nuc, open_cell_features(tmp_path / f"r{m}").nuc)
    assert reference[40]["n_cells"] == 40 and not list(tmp_path.glob("*.chunks"))

    # nothing left to compute: the encoder is not loaded at all
    for folder in outs.values():
        shutil.rmtree(folder)
    monkeypatch.setattr(cf, "shutil", _KeepChunks())
    cf.extract_section_features(manifest, "demo-vit-tiny", {40: tmp_path / "k40"}, **kwargs)
    shutil.rmtree(tmp_path / "k40")
    ENCODER_CACHE.clear()
    computed.clear()
    before = ENCODER_CACHE.loads["demo-vit-tiny"]
    cf.extract_section_features(manifest, "demo-vit-tiny", {40: tmp_path / "k40"}, **kwargs)
    assert computed == [] and ENCODER_CACHE.loads["demo-vit-tiny"] == before


class _KeepChunks:
    """shutil for the features module, with rmtree a no-op (a job killed after writing, before removing chunks)."""

    def __getattr__(self, name):
        return getattr(shutil, name)

    @staticmethod
    def rmtree(*args, **kwargs):
        return None

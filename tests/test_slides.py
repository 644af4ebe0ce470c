"""Slides: µm/px, level choice, tissue detection, tile coordinates, and errors on bad slides."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fmaudit.io import FmauditInputError
from fmaudit.slides import (
    choose_level,
    level_mpps,
    open_slide,
    read_tile,
    slide_mpp,
    tile_coordinates,
    tissue_mask,
    tissue_mask_from_rgb,
)


def _saturation(img) -> float:
    a = np.asarray(img, dtype=np.float64)
    vmax = a.max(axis=2)
    return float(np.mean((vmax - a.min(axis=2)) / np.maximum(vmax, 1)))


def test_real_slide_mpp_and_level(real_slide_path):
    with open_slide(real_slide_path) as slide:
        assert slide_mpp(slide) == pytest.approx(0.499)
        level, downsample = choose_level(slide, 1.0)
    assert level == 0
    assert downsample == pytest.approx(1.0 / 0.499)
    # a path works as well as an open slide
    assert slide_mpp(real_slide_path) == pytest.approx(0.499)


def test_real_slide_tiles_at_1mpp(real_slide_path):
    tiles = tile_coordinates(real_slide_path, target_mpp=1.0, tile_size=64)
    assert list(tiles.columns) == ["x", "y", "level", "size", "tissue_fraction", "mpp"]
    # 64 px at 1.0 µm/px is round(64 / 0.499) = 128 px at the slide's 0.499 µm/px
    assert (tiles["size"] == 128).all() and (tiles["level"] == 0).all()
    assert (tiles["x"] % 128 == 0).all() and (tiles["y"] % 128 == 0).all()
    assert (tiles["x"] + 128 <= 2220).all() and (tiles["y"] + 128 <= 2967).all()
    assert (tiles["tissue_fraction"] >= 0.5).all()
    grid = (2220 // 128) * (2967 // 128)
    assert 20 < len(tiles) < grid  # the slide is partly glass
    # row-major order
    assert list(zip(tiles["y"], tiles["x"])) == sorted(zip(tiles["y"], tiles["x"]))

    every = tile_coordinates(real_slide_path, target_mpp=1.0, tile_size=64, min_tissue_fraction=0.0)
    assert len(every) == grid
    glass_only = every[every["tissue_fraction"] == 0.0]
    assert len(glass_only) > 10
    with open_slide(real_slide_path) as slide:
        kept_sat = [_saturation(read_tile(real_slide_path, x, y, 0, 128, slide=slide))
                    for x, y in tiles[["x", "y"]].head(8).itertuples(index=False)]
        glass_sat = [_saturation(read_tile(real_slide_path, x, y, 0, 128, slide=slide))
                     for x, y in glass_only[["x", "y"]].head(8).itertuples(index=False)]
    assert min(kept_sat) > 2 * max(glass_sat)


def test_real_slide_sampling_is_deterministic(real_slide_path):
    full = tile_coordinates(real_slide_path, 1.0, 64)
    a = tile_coordinates(real_slide_path, 1.0, 64, max_tiles=12, seed=5)
    b = tile_coordinates(real_slide_path, 1.0, 64, max_tiles=12, seed=5)
    c = tile_coordinates(real_slide_path, 1.0, 64, max_tiles=12, seed=6)
    assert len(a) == 12
    assert a.equals(b)
    assert not a.equals(c)
    keys = set(zip(full["x"], full["y"]))
    assert set(zip(a["x"], a["y"])) <= keys
    assert list(zip(a["y"], a["x"])) == sorted(zip(a["y"], a["x"]))
    # more tiles asked than there are: all of them
    assert tile_coordinates(real_slide_path, 1.0, 64, max_tiles=10_000).equals(full)


def test_pyramid_levels_and_mpps(blob_slide):
    with open_slide(blob_slide) as slide:
        assert slide_mpp(slide) == pytest.approx(0.25)
        assert level_mpps(slide) == pytest.approx([0.25, 0.5, 1.0])
        assert choose_level(slide, 0.25) == (0, pytest.approx(1.0))
        assert choose_level(slide, 0.5) == (1, pytest.approx(1.0))
        assert choose_level(slide, 0.7) == (1, pytest.approx(1.4))
        assert choose_level(slide, 1.0) == (2, pytest.approx(1.0))
        assert choose_level(slide, 4.0) == (2, pytest.approx(4.0))
        # within 5 % above a level counts as at it; further above falls to the finer level
        assert choose_level(slide, 0.49) == (1, pytest.approx(0.98))
        assert choose_level(slide, 0.49, rel_tol=0.0) == (0, pytest.approx(1.96))
        assert choose_level(slide, 0.46)[0] == 0
        assert choose_level(slide, 0.26) == (0, pytest.approx(1.04))
        # finer than level 0: level 0, upsampled, with a warning
        with pytest.warns(UserWarning, match="upsampled"):
            assert choose_level(slide, 0.1) == (0, pytest.approx(0.4))


def test_read_tile_matches_level_pixels(tmp_path):
    from slide_utils import write_pyramid_tiff

    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(256, 384, 3), dtype=np.uint8)
    path = tmp_path / "random.tif"
    levels = write_pyramid_tiff(path, img, n_levels=2, mpp=0.5)
    tile = np.asarray(read_tile(path, x=128, y=64, level=1, size=32))
    # (x, y) are level-0 pixels: level-1 top-left is (64, 32)
    np.testing.assert_array_equal(tile, levels[1][32:64, 64:96])
    tile0 = np.asarray(read_tile(path, x=10, y=20, level=0, size=16))
    np.testing.assert_array_equal(tile0, img[20:36, 10:26])


def test_tiles_at_a_finer_level_are_read_larger(blob_slide):
    tiles = tile_coordinates(blob_slide, target_mpp=0.7, tile_size=32, min_tissue_fraction=0.0)
    # level 1 (0.5 µm/px) is the coarsest at or below 0.7: read round(32 * 0.7 / 0.5) = 45 px
    assert (tiles["level"] == 1).all() and (tiles["size"] == 45).all()
    assert tiles["mpp"].iloc[0] == pytest.approx(0.5)
    assert sorted(set(tiles["x"])) == [90 * i for i in range(512 // 45)]
    assert len(tiles) == (512 // 45) ** 2


def test_tissue_blob_tiles_kept_and_glass_dropped(blob_slide, blob_box):
    x0, y0, x1, y1 = blob_box
    # 16 px at 1.0 µm/px: level 2, 16 px, a 64-px level-0 footprint aligned with the blob edges
    tiles = tile_coordinates(blob_slide, target_mpp=1.0, tile_size=16, min_tissue_fraction=0.5)
    assert (tiles["level"] == 2).all() and (tiles["size"] == 16).all()
    inside = {(x, y) for x in range(x0, x1, 64) for y in range(y0, y1, 64)}
    assert set(zip(tiles["x"], tiles["y"])) == inside
    assert tiles["tissue_fraction"].min() > 0.9

    every = tile_coordinates(blob_slide, 1.0, 16, min_tissue_fraction=0.0)
    far = every[(every["x"] + 64 <= x0 - 64) | (every["y"] + 64 <= y0 - 64)]
    assert len(far) > 0 and (far["tissue_fraction"] == 0.0).all()


def test_tissue_mask_covers_the_blob(blob_slide, blob_box):
    mask = tissue_mask(blob_slide, thumb_max=256)
    assert mask.shape == (256, 256)  # 1024 px slide, 4× smaller
    x0, y0, x1, y1 = (v // 4 for v in blob_box)
    inner = mask[y0 + 2 : y1 - 2, x0 + 2 : x1 - 2]
    outer = mask.copy()
    outer[y0 - 2 : y1 + 2, x0 - 2 : x1 + 2] = False
    assert inner.all()
    assert not outer.any()


def test_tissue_mask_from_rgb_edge_cases():
    black = np.zeros((64, 64, 3), dtype=np.uint8)
    assert not tissue_mask_from_rgb(black).any()
    white = np.full((64, 64, 3), 240, dtype=np.uint8)
    assert not tissue_mask_from_rgb(white).any()
    # a single saturated speck on glass is cleaned away; a large region stays
    img = white.copy()
    img[10, 10] = (200, 60, 160)
    img[30:60, 30:60] = (200, 60, 160)
    mask = tissue_mask_from_rgb(img)
    assert not mask[10, 10]
    assert mask[35:55, 35:55].all()
    with pytest.raises(FmauditInputError, match="RGB"):
        tissue_mask_from_rgb(np.zeros((8, 8)))


def test_empty_slide_raises_naming_it(empty_slide):
    with pytest.raises(FmauditInputError, match=r"empty\.tif.*no tissue"):
        tile_coordinates(empty_slide, 1.0, 16)


def test_slide_smaller_than_a_tile(blob_slide):
    with pytest.raises(FmauditInputError, match=r"blob\.tif.*smaller than one"):
        tile_coordinates(blob_slide, 1.0, 512)


def test_truncated_real_slide_raises_naming_it(real_slide_path, tmp_path):
    data = real_slide_path.read_bytes()
    truncated = tmp_path / "truncated.svs"
    truncated.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(FmauditInputError, match=r"truncated\.svs"):
        tile_coordinates(truncated, 1.0, 64)
    with pytest.raises(FmauditInputError, match=r"truncated\.svs"):
        open_slide(truncated)


def test_corrupt_tile_data_raises_naming_it(real_slide_path, tmp_path):
    import tifffile

    data = bytearray(real_slide_path.read_bytes())
    with tifffile.TiffFile(real_slide_path) as tif:
        page = tif.pages[0]
        start = int(page.dataoffsets[0])
        end = int(page.dataoffsets[-1] + page.databytecounts[-1])
    data[start:end] = bytes(end - start)  # headers intact, level-0 JPEG tiles zeroed
    corrupt = tmp_path / "corrupt.svs"
    corrupt.write_bytes(bytes(data))
    with pytest.raises(FmauditInputError, match=r"corrupt\.svs"):
        tile_coordinates(corrupt, 1.0, 64)
    with pytest.raises(FmauditInputError, match=r"corrupt\.svs"):
        read_tile(corrupt, 0, 0, 0, 64)


def test_garbage_file_raises_naming_it(tmp_path):
    garbage = tmp_path / "garbage.svs"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(FmauditInputError, match=r"garbage\.svs"):
        tile_coordinates(garbage, 1.0, 64)


def test_missing_slide(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.svs"):
        tile_coordinates(tmp_path / "nowhere.svs", 1.0, 64)


def test_slide_without_resolution_needs_override(make_pyramid):
    from slide_utils import TISSUE_RGB

    img = np.empty((256, 256, 3), dtype=np.uint8)
    img[:] = TISSUE_RGB
    path = make_pyramid("nores.tif", img, n_levels=2, mpp=None)
    with pytest.raises(FmauditInputError, match=r"nores\.tif.*resolution"):
        slide_mpp(path)
    with pytest.raises(FmauditInputError, match=r"nores\.tif"):
        tile_coordinates(path, 1.0, 32)
    assert slide_mpp(path, mpp_override=0.5) == 0.5
    tiles = tile_coordinates(path, 1.0, 32, mpp_override=0.5)
    assert (tiles["level"] == 1).all() and (tiles["size"] == 32).all() and len(tiles) == 16
    with pytest.raises(FmauditInputError, match="positive"):
        slide_mpp(path, mpp_override=-1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"target_mpp": 0.0}, "target_mpp"),
        ({"tile_size": 0}, "tile_size"),
        ({"min_tissue_fraction": 1.5}, "min_tissue_fraction"),
        ({"max_tiles": 0}, "max_tiles"),
    ],
)
def test_bad_tiling_parameters(blob_slide, kwargs, match):
    args = {"target_mpp": 1.0, "tile_size": 16, **kwargs}
    with pytest.raises(FmauditInputError, match=match):
        tile_coordinates(blob_slide, **args)


def test_no_file_handles_leak(blob_slide):
    # tiling opens and closes the slide itself: repeated calls must not accumulate open files
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc")
    tile_coordinates(blob_slide, 1.0, 16)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        tile_coordinates(blob_slide, 1.0, 16)
    assert len(os.listdir("/proc/self/fd")) <= before

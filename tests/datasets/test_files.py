"""The file checks of the pre-flight: every image header, a decoded sample, every slide; each problem names the
file, the item and the sheet line."""

from __future__ import annotations

import numpy as np
import pandas as pd
from PIL import Image

from fmaudit.datasets.files import check_image_decode, check_image_headers, check_slides
from slide_utils import write_pyramid_tiff


def _images(tmp_path, n=6):
    rows = []
    for i in range(n):
        path = tmp_path / f"t{i}.png"
        Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(path)
        rows.append({"item_id": f"t{i}", "source": str(path), "x": pd.NA, "sheet": "labels.csv", "sheet_line": i + 2})
    return pd.DataFrame(rows)


def test_a_file_that_is_no_image_fails_the_header_check_naming_its_line(tmp_path):
    man = _images(tmp_path)
    problems, detail = check_image_headers(man)
    assert problems == [] and detail == "6 image file header(s) read"
    (tmp_path / "t2.png").write_bytes(b"not an image at all")
    (tmp_path / "t4.png").unlink()
    problems, _ = check_image_headers(man)
    assert len(problems) == 2
    assert problems[0].startswith(f"{tmp_path / 't2.png'}: not a readable image (UnidentifiedImageError")
    assert problems[0].endswith("(item 't2', line 4 of labels.csv)")
    assert problems[1] == f"{tmp_path / 't4.png'}: no such file (item 't4', line 6 of labels.csv)"


def test_truncated_pixels_pass_the_header_and_fail_the_decoded_sample(tmp_path):
    man = _images(tmp_path, n=3)
    big = tmp_path / "t1.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)).save(big)
    big.write_bytes(big.read_bytes()[: big.stat().st_size // 2])  # a copy cut off half way
    assert check_image_headers(man)[0] == []
    problems, detail = check_image_decode(man, sample=10, seed=0)
    assert detail == "3 of 3 image file(s) fully decoded (seeded sample, seed 0)"
    assert len(problems) == 1 and "t1.png: its pixels cannot be decoded" in problems[0] and "line 3" in problems[0]
    # the sample is seeded: the same files each time, a subset when it is smaller than the data set
    _, one = check_image_decode(man, sample=1, seed=0)
    assert one == "1 of 3 image file(s) fully decoded (seeded sample, seed 0)"


def test_every_slide_is_opened_and_one_tile_read(tmp_path):
    good = tmp_path / "good.tiff"
    write_pyramid_tiff(good, np.full((128, 128, 3), 180, np.uint8), n_levels=2, mpp=0.5, tile=64)
    broken = tmp_path / "broken.tiff"
    broken.write_bytes(b"II*\x00" + b"\x00" * 32)
    man = pd.DataFrame({"item_id": ["a_x0_y0", "a_x64_y0", "b_x0_y0"], "source": [str(good), str(good), str(broken)],
                        "x": [0, 64, 0], "y": [0, 0, 0], "level": [0, 0, 0], "size": [64, 64, 64]})
    problems, detail = check_slides(man)
    assert detail == "2 slide(s) opened with openslide, one tile of each read"
    assert len(problems) == 1 and problems[0].startswith(f"{broken}: openslide cannot read it")

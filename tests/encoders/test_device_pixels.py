"""The two halves of preprocessing when the device resizes: decode-only workers, batched device preprocessing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fmaudit.encoders import resolve_data_config
from fmaudit.encoders.transforms import (
    DecodeOnly,
    DevicePreprocess,
    NormalizeUint8,
    PixelTransform,
    collate_pixels,
)


def config(crop="center", input_size=32, resize_size=36, interpolation="bicubic"):
    return resolve_data_config({"preprocessing": {"input_size": input_size, "resize_size": resize_size, "crop": crop,
                                                  "interpolation": interpolation, "mean": [0.485, 0.456, 0.406],
                                                  "std": [0.229, 0.224, 0.225]}})


def smooth_image(height, width, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (max(2, height // 6), max(2, width // 6), 3), dtype=np.uint8)
    return Image.fromarray(base).resize((width, height), Image.BILINEAR)


@pytest.mark.parametrize("crop", ["center", "none"])
@pytest.mark.parametrize("shape", [(36, 40), (32, 32), (36, 36), (50, 45)])
def test_pixel_transform_of_a_tensor_is_the_pil_path_exactly(crop, shape):
    img = smooth_image(*shape)
    transform = PixelTransform(config(crop))
    as_tensor = torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous()
    torch.testing.assert_close(transform(as_tensor), transform(img), rtol=0, atol=0)


@pytest.mark.parametrize("crop", ["center", "none"])
def test_device_preprocessing_matches_the_worker_path(crop):
    cfg = config(crop)
    workers = NormalizeUint8(cfg["mean"], cfg["std"])
    pixels = PixelTransform(cfg)
    device = DevicePreprocess(cfg)
    at_size = [smooth_image(36, 36, s) if crop == "center" else smooth_image(32, 32, s) for s in range(3)]
    decoded = torch.stack([DecodeOnly()(im) for im in at_size])
    # images that need no resize: the same numbers as the workers' path, exactly
    torch.testing.assert_close(device(decoded), workers(torch.stack([pixels(im) for im in at_size])), rtol=0, atol=0)
    # resized images: torch's antialiased resize against PIL's, within a few grey levels (1/255 ~ 0.017 here)
    other = [smooth_image(48, 56, s) for s in range(3)]
    got = device(torch.stack([DecodeOnly()(im) for im in other]))
    expected = workers(torch.stack([pixels(im) for im in other]))
    assert got.shape == expected.shape == (3, 3, 32, 32)
    assert (got - expected).abs().mean() < 0.02 and (got - expected).abs().max() < 0.2


def test_mixed_sizes_are_collated_as_a_list_and_cast_to_the_model_dtype():
    cfg = config()
    images = [DecodeOnly()(smooth_image(36, 36)), DecodeOnly()(smooth_image(48, 40, 1)),
              DecodeOnly()(smooth_image(36, 36, 2))]
    index, batch = collate_pixels(list(enumerate(images)))
    assert index.tolist() == [0, 1, 2] and isinstance(batch, list)
    out = DevicePreprocess(cfg, torch.bfloat16)(batch)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 3, 32, 32)
    one = DevicePreprocess(cfg)(images[1].unsqueeze(0))
    torch.testing.assert_close(out[1].float(), one[0], atol=0.02, rtol=0.02)  # bfloat16's 8-bit mantissa
    same = collate_pixels([(0, images[0]), (1, images[2])])[1]
    assert isinstance(same, torch.Tensor) and same.shape == (2, 3, 36, 36)

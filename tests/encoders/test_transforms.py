"""Preprocessing carried by the entry, against timm and torchvision."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from fmaudit.encoders import (
    create_transform,
    resolve_data_config,
)


def test_transform_matches_timm_for_resize_and_centre_crop():
    from timm.data import create_transform as timm_create_transform

    spec = {"preprocessing": {"input_size": 224, "resize_size": 256, "crop": "center", "interpolation": "bicubic",
                              "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (300, 280, 3), dtype=np.uint8))
    ours = create_transform(resolve_data_config(spec))(img)
    theirs = timm_create_transform(input_size=(3, 224, 224), interpolation="bicubic", crop_pct=224 / 256,
                                   mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))(img)
    assert ours.shape == (3, 224, 224)
    torch.testing.assert_close(ours, theirs)


def test_transform_normalises_converts_to_rgb_and_squashes_without_crop():
    spec = {"preprocessing": {"input_size": 32, "crop": "none", "interpolation": "bilinear",
                              "mean": [0.5, 0.25, 0.0], "std": [0.5, 0.25, 1.0]}}
    img = Image.new("RGBA", (80, 40), (255, 0, 51, 7))
    out = create_transform(resolve_data_config(spec))(img)
    assert out.shape == (3, 32, 32)
    torch.testing.assert_close(out[:, 10, 10], torch.tensor([1.0, -1.0, 0.2]))


def test_split_transform_equals_torchvision_to_tensor_and_normalize_exactly(vit):
    from torchvision import transforms as T

    rng = np.random.default_rng(1)
    imgs = [Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)) for _ in range(3)]
    reference = T.Compose([T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    batch = vit.normalize(torch.stack([vit.pixel_transform(im) for im in imgs]))
    for i, im in enumerate(imgs):
        torch.testing.assert_close(vit.transform(im), reference(im), rtol=0, atol=0)
        torch.testing.assert_close(batch[i], reference(im), rtol=0, atol=0)

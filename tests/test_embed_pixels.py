"""The embedding path's pixels: JPEGs decoded by torchvision give the PIL path's numbers; pixels prepared on
the device (as on a GPU) give features close to the workers' path and key their own chunks."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from fmaudit.datasets.manifest import make_manifest
from fmaudit.embed import ItemDataset, embed_manifest, read_embeddings
from fmaudit.encoders import build_encoder
from fmaudit.registry import get_encoder_spec

ENCODER = "demo-vit-tiny"


def tiles(folder, n, size, suffix, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        path = folder / f"t{i:03d}.{suffix}"
        base = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        image = Image.fromarray(base).resize((size, size), Image.BILINEAR)
        if i == 1 and suffix == "jpg":
            image = image.convert("L")  # a greyscale JPEG too
        image.save(path)
        rows.append({"dataset": "toy", "item_id": f"toy_{i:03d}", "source": str(path), "label": i % 2,
                     "label_name": f"c{i % 2}", "group": f"p{i % 3}", "domain": "a"})
    return make_manifest(rows)


def test_jpeg_files_decoded_by_torchvision_give_the_pil_paths_pixels(tmp_path):
    encoder = build_encoder(get_encoder_spec(ENCODER))
    for size in (64, 80):  # the encoder's input size, and one it resizes from
        manifest = tiles(tmp_path / f"j{size}", 4, size, "jpg")
        dataset = ItemDataset(manifest, encoder.pixel_transform)
        for i in range(len(dataset)):
            assert isinstance(dataset.load_pixels(i), torch.Tensor)
            torch.testing.assert_close(dataset[i][1], encoder.pixel_transform(dataset.load_image(i)), rtol=0, atol=0)


def test_pixels_on_the_device_give_close_features_and_their_own_chunks(tmp_path):
    manifest = tiles(tmp_path / "png", 6, 80, "png")
    spec = get_encoder_spec(ENCODER)
    workers = embed_manifest(manifest, spec, tmp_path / "w.npz", device="cpu", batch_size=4)
    device = embed_manifest(manifest, spec, tmp_path / "d.npz", device="cpu", batch_size=4, pixels_on_device=True)
    assert workers["pixels_on_device"] is False and device["pixels_on_device"] is True
    _, a = read_embeddings(tmp_path / "w.npz", "cls")
    _, b = read_embeddings(tmp_path / "d.npz", "cls")
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() > 0.99 and not np.array_equal(a, b)

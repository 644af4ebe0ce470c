"""Readout conventions (cls, mean, cls_mean, pooled, patch_grid) on every loader, against the networks' own outputs."""

from __future__ import annotations

import pytest
import torch

from fmaudit.encoders import (
    build_encoder,
)
from fmaudit.io import FmauditInputError
from fmaudit.registry import get_encoder_spec


def features(encoder, x):
    with torch.inference_mode():
        return encoder(x)


def test_timm_readouts_follow_the_conventions(vit, images):
    model = vit.backbone.model
    out = features(vit, images)
    with torch.inference_mode():
        tokens = model.forward_features(images)
        pooled = model(images)  # num_classes=0: timm's forward returns the pre-logits pooled features
    torch.testing.assert_close(out["cls"], tokens[:, 0])
    torch.testing.assert_close(out["mean"], tokens[:, 1:].mean(dim=1))
    torch.testing.assert_close(out["cls_mean"], torch.cat([tokens[:, 0], tokens[:, 1:].mean(dim=1)], dim=1))
    torch.testing.assert_close(out["pooled"], pooled)
    with torch.inference_mode():
        grid = vit(images[:1], readouts=["patch_grid"])["patch_grid"]
    assert grid.shape == (1, 64, 8, 8)
    # row-major patch order: token 1 + (row * 8 + col) sits at grid[:, :, row, col]
    torch.testing.assert_close(grid[0, :, 2, 5], tokens[0, 1 + 2 * 8 + 5])


def test_convnet_mean_is_the_feature_map_mean_and_has_no_class_token(registry, images):
    enc = build_encoder(get_encoder_spec("demo-convnet", registry))
    with torch.inference_mode():
        fmap = enc.backbone.model.forward_features(images)
        out = enc(images, ["mean", "pooled", "patch_grid"])
    torch.testing.assert_close(out["mean"], fmap.mean(dim=(2, 3)))
    torch.testing.assert_close(out["pooled"], out["mean"])  # ResNet's head is global average pooling
    assert out["patch_grid"].shape == fmap.shape
    with pytest.raises(FmauditInputError, match="'cls' needs a class token"):
        enc(images, ["cls"])


def test_transformers_readouts_follow_the_conventions(registry, images):
    enc = build_encoder(get_encoder_spec("demo-dinov2-tiny", registry))
    out = features(enc, images)
    with torch.inference_mode():
        ref = enc.backbone.model(pixel_values=images)
    torch.testing.assert_close(out["cls"], ref.last_hidden_state[:, 0])
    torch.testing.assert_close(out["mean"], ref.last_hidden_state[:, 1:].mean(dim=1))
    torch.testing.assert_close(out["pooled"], ref.pooler_output)


def test_open_clip_pooled_is_the_image_embedding(registry, images):
    enc = build_encoder(get_encoder_spec("demo-clip-tiny", registry))
    out = features(enc, images)
    with torch.inference_mode():
        image_features = enc.backbone.model.encode_image(images)
        pooled_only = enc(images, ["pooled"])["pooled"]
    torch.testing.assert_close(out["pooled"], image_features)
    torch.testing.assert_close(pooled_only, image_features)
    # the class token after ln_post, projected, is the image embedding
    torch.testing.assert_close(out["cls"] @ enc.backbone.visual.proj, image_features)


def test_unknown_readout_is_an_error(vit, images):
    with pytest.raises(FmauditInputError, match="unknown readout"):
        vit(images, ["nuc"])

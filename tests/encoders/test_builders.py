"""Building encoders from registry entries: declared sizes, determinism, frozen weights, clear errors."""

from __future__ import annotations

import copy

import pytest
import torch

from fmaudit.encoders import (
    build_encoder,
    build_network,
    check_network,
)
from fmaudit.io import FmauditInputError
from fmaudit.registry import get_encoder_spec, readout_dims

DEMOS = ["demo-vit-tiny", "demo-convnet", "demo-clip-tiny", "demo-dinov2-tiny"]


def features(encoder, x):
    with torch.inference_mode():
        return encoder(x)


@pytest.mark.parametrize("name", DEMOS)
def test_demo_encoders_give_declared_widths_and_are_deterministic(name, registry, images):
    spec = get_encoder_spec(name, registry)
    a = features(build_encoder(spec), images)
    b = features(build_encoder(spec), images)
    assert set(a) == set(spec["readouts"])
    assert {r: v.shape[1] for r, v in a.items()} == readout_dims(spec)
    assert all(v.shape[0] == 3 and v.dtype == torch.float32 for v in a.values())
    for r in a:
        torch.testing.assert_close(a[r], b[r], rtol=0, atol=0)
        assert torch.isfinite(a[r]).all()
        assert not torch.allclose(a[r][0], a[r][1])  # different images, different features
    reseeded = copy.deepcopy(spec)
    reseeded["weights"]["seed"] = 1
    c = features(build_encoder(reseeded), images)
    assert not torch.allclose(a[spec["readouts"][0]], c[spec["readouts"][0]])


def test_building_does_not_touch_the_global_rng(registry):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_encoder(get_encoder_spec("demo-vit-tiny", registry))
    torch.testing.assert_close(torch.rand(3), expected)


def test_encoder_is_frozen(vit):
    assert not vit.training
    assert not any(p.requires_grad for p in vit.parameters())


def test_trust_remote_code_is_passed_only_when_the_entry_says_so(registry, monkeypatch):
    import transformers

    seen = []
    original = transformers.AutoModel.from_config

    def spy(config, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return original(config, **kwargs)

    monkeypatch.setattr(transformers.AutoModel, "from_config", spy)
    spec = get_encoder_spec("demo-dinov2-tiny", registry)
    spec["architecture"]["model_class"] = "AutoModel"
    build_encoder(spec)
    spec["trust_remote_code"] = True
    build_encoder(spec)
    assert seen == [False, True]


def test_declared_widths_must_match_the_network(registry):
    spec = get_encoder_spec("demo-vit-tiny", registry)
    spec["embed_dim"] = 65
    with pytest.raises(FmauditInputError, match="embed_dim is 65 in the registry but the network's token width is 64"):
        build_encoder(spec)
    spec = get_encoder_spec("demo-clip-tiny", registry)
    del spec["pooled_dim"]
    with pytest.raises(FmauditInputError, match="pooled width of 64 but the network's is 32"):
        build_encoder(spec)
    spec = get_encoder_spec("demo-vit-tiny", registry)
    spec["num_prefix_tokens"] = 5
    with pytest.raises(FmauditInputError, match="num_prefix_tokens is 5 in the registry but the network has 1"):
        build_encoder(spec)


def test_unknown_architecture_is_a_clear_error(registry):
    spec = get_encoder_spec("demo-vit-tiny", registry)
    spec["architecture"]["model_name"] = "vit_nonexistent"
    with pytest.raises(FmauditInputError, match="timm cannot build 'vit_nonexistent'"):
        build_encoder(spec)
    spec = get_encoder_spec("demo-dinov2-tiny", registry)
    spec["architecture"]["model_class"] = "NoSuchModel"
    with pytest.raises(FmauditInputError, match="transformers has no model class 'NoSuchModel'"):
        build_encoder(spec)


def test_real_timm_and_open_clip_entries_build_with_their_declared_sizes(registry):
    """Every real entry whose architecture needs no download is built on the meta device (no memory, no
    weights) and checked against its declared embed_dim, pooled_dim and num_prefix_tokens."""
    checked = []
    for name in registry:
        spec = get_encoder_spec(name, registry)
        if spec["loader"] == "transformers" or name in ("conch", "biomedclip", "musk") or spec["family"] == "demo":
            continue
        with torch.device("meta"):
            check_network(spec, build_network(spec))
        checked.append(name)
    assert {"uni", "uni2-h", "virchow2", "prov-gigapath", "h-optimus-0", "ctranspath", "clip-vit-b16"} <= set(checked)


def test_params_m_is_the_image_towers_parameter_count(registry):
    """The cluster requests are sized from params_m (fmaudit.cluster): every entry built on the meta device has
    the parameters it declares, within 10 % (the image tower of a vision-language model; a CNN without its
    classifier head)."""
    checked = []
    for name in registry:
        spec = get_encoder_spec(name, registry)
        if spec["loader"] == "transformers" or name in ("conch", "biomedclip", "musk"):
            continue
        with torch.device("meta"):
            model = build_network(spec)
        tower = getattr(model, "visual", model)
        built = sum(p.numel() for p in tower.parameters()) / 1e6
        assert built == pytest.approx(spec["params_m"], rel=0.1), (name, built)
        checked.append(name)
    assert {"uni", "h-optimus-0", "clip-vit-l14", "omiclip", "resnet50-in1k", "demo-vit-tiny"} <= set(checked)


def test_conch_without_its_config_fails_clearly(registry):
    with pytest.raises(FmauditInputError, match="open_clip has no model config 'conch_ViT-B-16'"):
        build_network(get_encoder_spec("conch", registry))


def test_ctranspath_conv_stem_swin_embeds(registry):
    spec = get_encoder_spec("ctranspath", registry)
    spec["weights"] = {"source": "random", "seed": 0}
    enc = build_encoder(spec)
    assert type(enc.backbone.model.patch_embed).__name__ == "CTransPathConvStem"
    out = features(enc, torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0)))
    assert out["pooled"].shape == (1, 768) and torch.isfinite(out["pooled"]).all()

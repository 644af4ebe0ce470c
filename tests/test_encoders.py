"""Encoder building: demo encoders through each loader, readout conventions, every weight source and its errors."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fmaudit.encoders import (
    build_encoder,
    build_network,
    check_network,
    create_transform,
    resolve_data_config,
    save_weights,
)
from fmaudit.io import FmauditInputError, sha256_file
from fmaudit.registry import get_encoder_spec, load_registry, readout_dims

DEMOS = ["demo-vit-tiny", "demo-convnet", "demo-clip-tiny", "demo-dinov2-tiny"]
REVISION = "0123456789abcdef0123456789abcdef01234567"


class OpaqueMetadata:
    """A non-tensor object inside a checkpoint: what weights_only unpickling must refuse."""

    def __init__(self, note: str = "training args"):
        self.note = note


@pytest.fixture(scope="module")
def registry():
    return load_registry()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def vit(registry):
    return build_encoder(get_encoder_spec("demo-vit-tiny", registry))


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


def save_demo_weights(vit, folder: Path) -> Path:
    return save_weights(vit, folder / "demo-vit-tiny.safetensors")


def file_spec(registry, path: Path, **weights) -> dict:
    spec = get_encoder_spec("demo-vit-tiny", registry)
    spec["weights"] = {"source": "file", "path": str(path), "format": "safetensors", **weights}
    return spec


def test_file_weights_round_trip_with_sha256(vit, registry, images, tmp_path):
    path = save_demo_weights(vit, tmp_path)
    reseeded = get_encoder_spec("demo-vit-tiny", registry)
    reseeded["weights"]["seed"] = 7  # a different init, so only the loaded weights can make features agree
    loaded = build_encoder(file_spec(registry, path, sha256=sha256_file(path), seed=7))
    assert not torch.allclose(features(build_encoder(reseeded), images)["cls"], features(vit, images)["cls"])
    for r, v in features(vit, images).items():
        torch.testing.assert_close(features(loaded, images)[r], v)


def test_sha256_mismatch_is_an_error(vit, registry, tmp_path):
    path = save_demo_weights(vit, tmp_path)
    expected = r"sha256 of .*demo-vit-tiny.safetensors is [0-9a-f]{64}, the registry expects 0{64}"
    with pytest.raises(FmauditInputError, match=expected):
        build_encoder(file_spec(registry, path, sha256="0" * 64))


def test_missing_weight_file_names_the_path(registry, tmp_path):
    with pytest.raises(FmauditInputError, match=r"weight file .*nowhere/w.safetensors .*does not exist"):
        build_encoder(file_spec(registry, tmp_path / "nowhere" / "w.safetensors"))
    with pytest.raises(FmauditInputError, match=r"nope.pth \(weights_path\) does not exist"):
        build_encoder("demo-vit-tiny", weights_path=tmp_path / "nope.pth")


def test_weights_path_overrides_the_source(vit, registry, images, tmp_path):
    path = save_demo_weights(vit, tmp_path)
    spec = get_encoder_spec("demo-vit-tiny", registry)
    spec["weights"]["seed"] = 5
    torch.testing.assert_close(features(build_encoder(spec, weights_path=path), images)["cls"],
                               features(vit, images)["cls"])


def test_weights_that_do_not_fit_name_the_keys(vit, registry, tmp_path):
    path = save_demo_weights(vit, tmp_path)
    deeper = file_spec(registry, path)
    deeper["architecture"]["kwargs"]["depth"] = 3
    with pytest.raises(FmauditInputError, match=r"do not fit the architecture; missing keys: blocks\.2\."):
        build_encoder(deeper)
    narrower = file_spec(registry, path)
    narrower["architecture"]["kwargs"]["embed_dim"] = 32
    narrower["embed_dim"] = 32
    with pytest.raises(FmauditInputError, match=r"shape mismatches: .*\(checkpoint \(.*64.*\), model \(.*32.*\)\)"):
        build_encoder(narrower)
    shallower = file_spec(registry, path)
    shallower["architecture"]["kwargs"]["depth"] = 1
    with pytest.raises(FmauditInputError, match=r"unexpected keys: blocks\.1\."):
        build_encoder(shallower)


def test_torch_checkpoints_load_with_weights_only(vit, registry, images, tmp_path):
    state = vit.backbone.model.state_dict()
    path = tmp_path / "plain.bin"
    torch.save({f"module.{k}": v for k, v in state.items()}, path)
    spec = file_spec(registry, path, format="torch", strip_prefix="module.", seed=3)
    torch.testing.assert_close(features(build_encoder(spec), images)["mean"], features(vit, images)["mean"])
    nested = tmp_path / "nested.pth"
    torch.save({"model": state, "epoch": torch.tensor(10)}, nested)
    with pytest.raises(FmauditInputError, match="not a flat state dict.*state_dict_key"):
        build_encoder(file_spec(registry, nested, format="torch"))
    with pytest.raises(FmauditInputError, match=r"has no key 'teacher' \(state_dict_key\)"):
        build_encoder(file_spec(registry, nested, format="torch", state_dict_key="teacher"))
    build_encoder(file_spec(registry, nested, format="torch", state_dict_key="model"))


def test_pickled_objects_are_refused_unless_the_entry_allows_pickle(vit, registry, images, tmp_path):
    path = tmp_path / "with_args.pth"
    torch.save({"model": vit.backbone.model.state_dict(), "args": OpaqueMetadata()}, path)
    with pytest.raises(FmauditInputError, match=r"refused to unpickle .*with_args.pth.*allow_pickle: true"):
        build_encoder(file_spec(registry, path, format="torch", state_dict_key="model"))
    trusted = build_encoder(file_spec(registry, path, format="torch", state_dict_key="model", allow_pickle=True))
    torch.testing.assert_close(features(trusted, images)["cls"], features(vit, images)["cls"])


def test_drop_keys_with_prefix_removes_unused_heads(vit, registry, tmp_path):
    state = dict(vit.backbone.model.state_dict())
    state["extra_head.weight"] = torch.zeros(3, 64)
    path = tmp_path / "with_head.safetensors"
    from safetensors.torch import save_file

    save_file(state, str(path))
    with pytest.raises(FmauditInputError, match="unexpected keys: extra_head.weight"):
        build_encoder(file_spec(registry, path))
    build_encoder(file_spec(registry, path, drop_keys_with_prefix=["extra_head."]))


def make_hub_cache(root: Path, repo_id: str, files: dict[str, Path]) -> Path:
    """The Hugging Face cache layout by hand: models--org--name/{refs/main, snapshots/<rev>/<file>}."""
    org, name = repo_id.split("/")
    repo = root / "hub" / f"models--{org}--{name}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for filename, src in files.items():
        (snapshot / filename).write_bytes(src.read_bytes())
    return repo


def hub_spec(registry, repo_id: str, **weights) -> dict:
    spec = get_encoder_spec("demo-vit-tiny", registry)
    spec["weights"] = {"source": "hf_hub", "hf_hub_id": repo_id, "format": "safetensors", "seed": 9, **weights}
    return spec


def test_hub_weights_from_a_prepopulated_cache_offline(vit, registry, images, tmp_path, monkeypatch):
    weights = save_demo_weights(vit, tmp_path)
    make_hub_cache(tmp_path / "hf", "fmaudit-test/demo-vit", {"model.safetensors": weights})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    for spec in (hub_spec(registry, "fmaudit-test/demo-vit"),
                 hub_spec(registry, "fmaudit-test/demo-vit", revision=REVISION, sha256=sha256_file(weights))):
        torch.testing.assert_close(features(build_encoder(spec), images)["cls"], features(vit, images)["cls"])


def test_missing_cache_entry_offline_says_how_to_fix_it(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(FmauditInputError) as err:
        build_encoder(hub_spec(registry, "fmaudit-test/not-cached"))
    message = str(err.value)
    assert "fmaudit-test/not-cached" in message and str(tmp_path / "empty-cache") in message
    assert "HF_HUB_OFFLINE=1" in message and "Pre-populate the cache" in message and "local file" in message


def test_sharded_hub_checkpoint_via_index(vit, registry, images, tmp_path, monkeypatch):
    import json

    from safetensors.torch import save_file

    state = vit.backbone.model.state_dict()
    keys = sorted(state)
    halves = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    files = {}
    for fname, part in halves.items():
        save_file({k: state[k].contiguous() for k in part}, str(tmp_path / fname))
        files[fname] = tmp_path / fname
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {k: f for f, part in halves.items() for k in part}}))
    files["model.safetensors.index.json"] = index
    make_hub_cache(tmp_path / "hf", "fmaudit-test/sharded", files)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    spec = hub_spec(registry, "fmaudit-test/sharded", filename="model.safetensors.index.json")
    torch.testing.assert_close(features(build_encoder(spec), images)["cls"], features(vit, images)["cls"])


@pytest.mark.parametrize("name", ["demo-clip-tiny", "demo-dinov2-tiny", "demo-convnet"])
def test_open_clip_transformers_and_convnet_weights_load_through_the_same_path(name, registry, images, tmp_path):
    spec = get_encoder_spec(name, registry)
    original = build_encoder(spec)
    path = save_weights(original, tmp_path / f"{name}.safetensors")
    loaded_spec = copy.deepcopy(spec)
    loaded_spec["weights"] = {"source": "file", "path": str(path), "format": "safetensors", "seed": 11}
    loaded = build_encoder(loaded_spec)
    for r, v in features(original, images).items():
        torch.testing.assert_close(features(loaded, images)[r], v)


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

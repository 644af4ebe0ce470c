"""Encoders named by their hub repo, and registry entries against their hub config, on a local Hugging Face
cache holding each library's own export of a random-initialised network (tests/hub_cache.py). The reference
numbers come from each library loading the same files itself (timm's and open_clip's ``local-dir:``,
transformers' ``from_pretrained``), so fmaudit's resolution of architecture, weights and preprocessing is
checked against the libraries, not against itself."""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import open_clip
import pytest
import timm
import torch
import transformers
from PIL import Image
from safetensors import safe_open

from fmaudit.embed import embed_manifest
from fmaudit.encoders import build_encoder, check_against_hub_config, read_hub_config, resolve_hub_encoder
from fmaudit.encoders import hub as hub_module
from fmaudit.io import FmauditInputError
from fmaudit.registry import get_encoder_spec, hub_name_of_slug, hub_name_slug, load_registry, parse_hub_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hub_cache  # noqa: E402

TIMM_REPO, DINO_REPO, VIT_REPO, CLIP_REPO = ("fmaudit-test/tiny-vit", "fmaudit-test/tiny-dinov2",
                                             "fmaudit-test/tiny-vit-nopool", "fmaudit-test/tiny-clip")


def card(folder: Path, licence: str) -> Path:
    """A model card with its licence in the YAML front matter, as the hub's README.md files carry it."""
    (folder / "README.md").write_text(f"---\nlicense: {licence}\ntags:\n- image-feature-extraction\n---\n# a card\n")
    return folder


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("exports")
    return {
        TIMM_REPO: hub_cache.timm_export(root / "timm", pretrained_cfg={"crop_pct": 0.875,
                                                                         "mean": [0.6, 0.5, 0.4],
                                                                         "std": [0.2, 0.25, 0.3]}),
        DINO_REPO: card(hub_cache.transformers_export(root / "dinov2"), "cc-by-nc-4.0"),
        CLIP_REPO: hub_cache.open_clip_export(root / "clip", preprocess_cfg={"interpolation": "bilinear"}),
    }


@pytest.fixture(scope="module")
def cache_root(exports, tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("hf") / "hub"
    for repo, folder in exports.items():
        hub_cache.add_to_cache(cache, repo, folder)
    vit = tmp_path_factory.mktemp("exports") / "vit"
    cfg = transformers.AutoConfig.for_model("vit", hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                            intermediate_size=128, image_size=64, patch_size=8)
    torch.manual_seed(0)
    transformers.ViTModel(cfg, add_pooling_layer=False).save_pretrained(str(vit))  # as Phikon's repo holds it
    transformers.ViTImageProcessor(size={"height": 64, "width": 64}, resample=2).save_pretrained(str(vit))
    hub_cache.add_to_cache(cache, VIT_REPO, vit)
    return cache


@pytest.fixture
def cache(cache_root, monkeypatch) -> Path:
    hub_cache.use_cache(monkeypatch, cache_root)
    return cache_root


def snapshot(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--")) / "snapshots" / hub_cache.COMMIT


def tile(seed: int = 0, size: tuple[int, int] = (90, 77)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(*size[::-1], 3), dtype=np.uint8))


def features(encoder, image: Image.Image) -> dict[str, torch.Tensor]:
    with torch.inference_mode():
        return encoder(encoder.transform(image)[None])


# ---------------------------------------------------------------- names and slugs


def test_hub_names_have_reversible_filename_safe_slugs():
    assert hub_name_slug("timm:MahmoodLab/UNI") == "timm--MahmoodLab--UNI"
    assert hub_name_of_slug("hf--owkin--phikon-v2") == "hf:owkin/phikon-v2"
    assert hub_name_of_slug("uni") is None and hub_name_of_slug("dinov2-vitl14.res518") is None
    repo = "1aurent/vit_small_patch8_224.lunit_dino"
    assert parse_hub_name(f"hf:{repo}") == ("hf", repo)
    for bad in ("timm:uni", "timm:a/b/c", "hf:a--b/c", "hf:a/../b"):
        with pytest.raises(FmauditInputError, match="a hub name is timm:<org>/<repo> or hf:<org>/<repo>"):
            parse_hub_name(bad)


def test_a_registry_slug_may_not_look_like_a_hub_slug(tmp_path):
    registry = {"timm--org--x": get_encoder_spec("demo-vit-tiny")}
    registry["timm--org--x"].pop("name")
    path = tmp_path / "encoders.yaml"
    path.write_text(json.dumps(registry))
    with pytest.raises(FmauditInputError, match="'timm--org--x': slugs starting with timm-- or hf-- stand for"):
        load_registry(path)


# ---------------------------------------------------------------- timm


def test_a_timm_repo_resolves_as_timm_itself_loads_it(cache):
    entry = resolve_hub_encoder(f"timm:{TIMM_REPO}")
    assert entry["name"] == "timm--fmaudit-test--tiny-vit" and entry["hub_name"] == f"timm:{TIMM_REPO}"
    assert entry["loader"] == "timm" and entry["architecture"]["model_name"] == "vit_tiny_patch16_224"
    assert entry["weights"] == {"source": "hf_hub", "hf_hub_id": TIMM_REPO, "revision": hub_cache.COMMIT,
                                "filename": "model.safetensors", "format": "safetensors",
                                "timm_checkpoint_filter": True}
    # crop_pct 0.875 of a 64 px input: shorter side to floor(64 / 0.875) = 73, then the centre crop
    assert entry["preprocessing"] == {"input_size": 64, "resize_size": 73, "crop": "center",
                                      "interpolation": "bicubic", "mean": [0.6, 0.5, 0.4], "std": [0.2, 0.25, 0.3]}
    assert (entry["embed_dim"], entry["patch_size"], entry["num_prefix_tokens"]) == (64, 8, 1)
    assert entry["readouts"] == ["cls", "mean", "cls_mean"] and entry["default_readout"] == "cls"
    assert entry["licence"] == "apache-2.0" and entry["gpu"] is False

    ours = build_encoder(entry)
    theirs = timm.create_model(f"local-dir:{snapshot(cache, TIMM_REPO)}", pretrained=True).eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config(model=theirs))
    image = tile()
    torch.testing.assert_close(ours.transform(image), transform(image), rtol=0, atol=1e-6)
    with torch.inference_mode():
        tokens = theirs.forward_features(transform(image)[None])
    torch.testing.assert_close(features(ours, image)["cls"], tokens[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(features(ours, image)["mean"], tokens[:, 1:].mean(1), rtol=1e-5, atol=1e-5)


def test_timm_needs_timms_config(cache):
    with pytest.raises(FmauditInputError, match=r"config.json \(timm's\) of Hugging Face repo fmaudit-test/tiny-dino"):
        resolve_hub_encoder(f"timm:{DINO_REPO}")


# ---------------------------------------------------------------- transformers


def test_a_transformers_repo_resolves_as_from_pretrained_loads_it(cache):
    entry = resolve_hub_encoder(f"hf:{DINO_REPO}")
    assert entry["loader"] == "transformers" and entry["architecture"] == {"model_class": "AutoModel"}
    assert entry["licence"] == "cc-by-nc-4.0"  # the model card's front matter
    assert entry["preprocessing"] == {"input_size": 64, "resize_size": 72, "crop": "center",
                                      "interpolation": "bicubic", "mean": [0.485, 0.456, 0.406],
                                      "std": [0.229, 0.224, 0.225]}
    ours = build_encoder(entry)
    folder = snapshot(cache, DINO_REPO)
    theirs = transformers.AutoModel.from_pretrained(str(folder)).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(str(folder))
    image = tile(1)
    pixels = processor(images=image, return_tensors="pt")["pixel_values"]
    # transformers resizes with its own (antialiased) kernels: the same transform within a few grey levels
    assert float((ours.transform(image)[None] - pixels).abs().mean()) < 0.02
    with torch.inference_mode():
        hidden = theirs(pixel_values=ours.transform(image)[None]).last_hidden_state
    torch.testing.assert_close(features(ours, image)["cls"], hidden[:, 0], rtol=1e-5, atol=1e-5)


def test_a_base_model_saved_without_its_pooler_is_built_without_it(cache):
    entry = resolve_hub_encoder(f"hf:{VIT_REPO}")
    assert entry["architecture"]["kwargs"] == {"add_pooling_layer": False}
    assert entry["preprocessing"]["crop"] == "none" and entry["preprocessing"]["interpolation"] == "bilinear"
    theirs = transformers.AutoModel.from_pretrained(str(snapshot(cache, VIT_REPO)), add_pooling_layer=False).eval()
    ours, image = build_encoder(entry), tile(2)
    with torch.inference_mode():
        hidden = theirs(pixel_values=ours.transform(image)[None]).last_hidden_state
    torch.testing.assert_close(features(ours, image)["mean"], hidden[:, 1:].mean(1), rtol=1e-5, atol=1e-5)


def test_a_registry_entry_loads_checkpoints_saved_by_other_transformers_releases(cache, registry):
    """save_pretrained writes DINOv2's attention as attention.attention.query/key/value, the layout of the hub
    checkpoints; transformers 5 names them q_proj/k_proj/v_proj and renames on load. fmaudit's strict loader
    applies the same renaming, so a registry entry of the dinov2 kind loads the hub file."""
    spec = get_encoder_spec("demo-dinov2-tiny", registry)
    spec["architecture"] = {"model_class": "Dinov2Model"}
    spec["weights"] = {"source": "hf_hub", "hf_hub_id": DINO_REPO, "format": "safetensors"}
    spec["preprocessing"] = {**spec["preprocessing"], "resize_size": 72}
    with safe_open(str(snapshot(cache, DINO_REPO) / "model.safetensors"), framework="pt") as f:
        assert "encoder.layer.0.attention.attention.query.weight" in set(f.keys())
    theirs = transformers.AutoModel.from_pretrained(str(snapshot(cache, DINO_REPO))).eval()
    ours, image = build_encoder(spec), tile(3)
    with torch.inference_mode():
        hidden = theirs(pixel_values=ours.transform(image)[None]).last_hidden_state
    torch.testing.assert_close(features(ours, image)["cls"], hidden[:, 0], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- open_clip


def test_an_open_clip_repo_resolves_as_open_clip_loads_it(cache):
    entry = resolve_hub_encoder(f"hf:{CLIP_REPO}")
    assert entry["loader"] == "open_clip" and entry["weights"]["filename"] == "open_clip_model.safetensors"
    assert entry["preprocessing"]["interpolation"] == "bilinear" and entry["preprocessing"]["crop"] == "center"
    assert entry["readouts"] == ["cls", "mean", "pooled"] and entry["default_readout"] == "pooled"
    assert (entry["embed_dim"], entry["pooled_dim"]) == (64, 32)
    theirs, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{snapshot(cache, CLIP_REPO)}")
    ours, image = build_encoder(entry), tile(4)
    torch.testing.assert_close(ours.transform(image), preprocess(image), rtol=0, atol=1e-6)
    with torch.inference_mode():
        pooled = theirs.eval().encode_image(preprocess(image)[None])
    torch.testing.assert_close(features(ours, image)["pooled"], pooled, rtol=1e-5, atol=1e-5)
    assert hub_module.OPEN_CLIP_CONFIG == open_clip.constants.HF_CONFIG_NAME
    assert hub_module.WEIGHT_FILES["open_clip"] == (open_clip.constants.HF_SAFE_WEIGHTS_NAME,
                                                    open_clip.constants.HF_WEIGHTS_NAME)


# ---------------------------------------------------------------- what cannot be resolved


def test_an_uncached_repo_names_the_repo_and_how_to_fill_the_cache(cache):
    with pytest.raises(FmauditInputError) as err:
        resolve_hub_encoder("hf:nobody/nothing")
    message = str(err.value)
    assert "nobody/nothing" in message and "not in the local cache" in message
    assert "hf download nobody/nothing" in message and "write a registry entry" in message


def test_configs_fmaudit_cannot_follow_are_named(cache, exports, tmp_path, monkeypatch):
    repo_cache = tmp_path / "hub"
    shutil.copytree(cache, repo_cache, symlinks=True)
    hub_cache.use_cache(monkeypatch, repo_cache)

    def edited(repo: str, filename: str, edit) -> None:
        folder = tmp_path / repo.replace("/", "_")
        shutil.copytree(exports.get(repo) or snapshot(cache, repo), folder, dirs_exist_ok=True)
        data = json.loads((folder / filename).read_text())
        edit(data)
        (folder / filename).write_text(json.dumps(data))
        hub_cache.add_to_cache(repo_cache, repo, folder, commit="f" * 40)

    edited(TIMM_REPO, "config.json", lambda c: (c["pretrained_cfg"].update(input_size=[3, 64, 48]),
                                                c["model_args"].update(img_size=[64, 48])))
    with pytest.raises(FmauditInputError, match=r"tiny-vit: config.json pretrained_cfg.input_size: \[64, 48\] is not"):
        resolve_hub_encoder(f"timm:{TIMM_REPO}")
    edited(TIMM_REPO, "config.json", lambda c: c["pretrained_cfg"].update(input_size=[3, 64, 64],
                                                                           crop_mode="border"))
    with pytest.raises(FmauditInputError, match="pretrained_cfg.crop_mode: 'border'"):
        resolve_hub_encoder(f"timm:{TIMM_REPO}")
    edited(DINO_REPO, "config.json", lambda c: c.update(auto_map={"AutoModel": "modeling.Custom"}))
    with pytest.raises(FmauditInputError, match="auto_map.*trust_remote_code: true"):
        resolve_hub_encoder(f"hf:{DINO_REPO}")
    edited(CLIP_REPO, "open_clip_config.json", lambda c: c["preprocess_cfg"].update(resize_mode="longest"))
    with pytest.raises(FmauditInputError, match="preprocess_cfg.resize_mode: 'longest'"):
        resolve_hub_encoder(f"hf:{CLIP_REPO}")


# ---------------------------------------------------------------- registry entries against their hub config


def hub_entry(registry, repo: str = TIMM_REPO, **changes) -> dict:
    """demo-vit-tiny's entry pointed at the timm export (the same architecture), with ``changes``."""
    spec = get_encoder_spec("demo-vit-tiny", registry)
    spec["weights"] = {"source": "hf_hub", "hf_hub_id": repo, "revision": hub_cache.COMMIT,
                       "format": "safetensors", "timm_checkpoint_filter": True}
    spec["preprocessing"] = {"input_size": 64, "resize_size": 73, "crop": "center", "interpolation": "bicubic",
                             "mean": [0.6, 0.5, 0.4], "std": [0.2, 0.25, 0.3]}
    for key, value in changes.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) and key in spec else value
    return spec


def test_an_entry_that_matches_its_hub_config_passes(cache, registry):
    hub = check_against_hub_config(hub_entry(registry))
    assert hub.repo_id == TIMM_REPO and hub.commit == hub_cache.COMMIT
    assert [p.name for p in hub.files] == ["config.json"]


def test_a_field_that_differs_from_the_hub_config_stops_the_job_naming_it(cache, registry, tmp_path):
    spec = hub_entry(registry, preprocessing={"mean": [0.485, 0.456, 0.406], "interpolation": "bilinear"})
    with pytest.raises(FmauditInputError) as err:
        check_against_hub_config(spec, source="my.yaml")
    message = str(err.value)
    assert message.startswith("my.yaml: encoder 'demo-vit-tiny' differs from the config of its hub repo")
    assert "preprocessing.interpolation is 'bilinear' in the entry but 'bicubic'" in message
    assert "preprocessing.mean is [0.485, 0.456, 0.406] in the entry but [0.6, 0.5, 0.4]" in message
    assert f"{TIMM_REPO}'s config.json pretrained_cfg (snapshot {hub_cache.COMMIT})" in message
    assert "departs_from_hub_config" in message
    images = tmp_path / "img"
    images.mkdir()
    tile().save(images / "a.png")
    manifest = hub_cache_manifest(images)
    with pytest.raises(FmauditInputError, match="preprocessing.interpolation is 'bilinear'"):
        embed_manifest(manifest, spec, tmp_path / "out.npz")
    assert not (tmp_path / "out.npz").exists() and not (tmp_path / "out.npz.chunks").exists()
    # a departure the entry declares, with its reason, is no mismatch
    spec["departs_from_hub_config"] = {"preprocessing.interpolation": "the authors' README resizes bilinearly",
                                       "preprocessing.mean": "the authors' README normalises with ImageNet's"}
    assert check_against_hub_config(spec) is not None
    embed_manifest(manifest, spec, tmp_path / "out.npz")


def test_sizes_are_compared_too_and_nothing_without_a_cached_config(cache, registry):
    with pytest.raises(FmauditInputError, match="embed_dim is 96 in the entry but 64 in .*num_features"):
        check_against_hub_config(hub_entry(registry, embed_dim=96))
    with pytest.raises(FmauditInputError, match="architecture.model_name is 'vit_small_patch16_224'"):
        check_against_hub_config(hub_entry(registry, architecture={"model_name": "vit_small_patch16_224"}))
    assert check_against_hub_config(hub_entry(registry, weights={"source": "hf_hub", "hf_hub_id": "not/cached",
                                                                "format": "safetensors"})) is None
    assert read_hub_config("not/cached") is None


def test_declared_variants_depart_from_the_hub_config_where_they_change_it(registry):
    variant = registry["dinov2-vitl14.res518"]
    assert variant["departs_from_hub_config"] == {
        "preprocessing.input_size": "declared variant 'res518' of dinov2-vitl14",
        "preprocessing.resize_size": "declared variant 'res518' of dinov2-vitl14"}
    assert "departs_from_hub_config" not in registry["dinov2-vitl14"]


def hub_cache_manifest(folder: Path):
    from fmaudit.datasets.manifest import make_manifest

    return make_manifest([{"dataset": "t", "item_id": p.stem, "source": str(p), "group": "g", "domain": "d"}
                          for p in sorted(folder.glob("*.png"))])


def test_a_transformers_entry_is_compared_with_its_image_processor(cache, registry):
    spec = get_encoder_spec("demo-dinov2-tiny", registry)
    spec["architecture"] = {"model_class": "Dinov2Model"}
    spec["weights"] = {"source": "hf_hub", "hf_hub_id": DINO_REPO, "format": "safetensors"}
    with pytest.raises(FmauditInputError, match=r"preprocessing.resize_size is 64 in the entry but 72 in "
                                                r"fmaudit-test/tiny-dinov2's preprocessor_config.json"):
        check_against_hub_config(spec)
    spec["preprocessing"] = {**spec["preprocessing"], "resize_size": 72}
    spec["num_prefix_tokens"] = 5
    with pytest.raises(FmauditInputError, match=r"num_prefix_tokens is 5 in the entry but 1 in .*num_register_tokens"):
        check_against_hub_config(spec)
    spec["num_prefix_tokens"] = 1
    assert copy.deepcopy(check_against_hub_config(spec)).library == "transformers"


def test_a_hub_config_fmaudit_cannot_follow_stops_an_entry_unless_it_departs_from_it(cache, exports, registry,
                                                                                    tmp_path, monkeypatch):
    repo_cache = tmp_path / "hub"
    shutil.copytree(cache, repo_cache, symlinks=True)
    hub_cache.use_cache(monkeypatch, repo_cache)
    folder = tmp_path / "squashed"
    shutil.copytree(exports[TIMM_REPO], folder)
    config = json.loads((folder / "config.json").read_text())
    config["pretrained_cfg"].update(crop_mode="squash", crop_pct=0.875)
    (folder / "config.json").write_text(json.dumps(config))
    hub_cache.add_to_cache(repo_cache, TIMM_REPO, folder)
    spec = hub_entry(registry)
    with pytest.raises(FmauditInputError, match=r"cannot follow: .*crop_mode: 'squash' with crop_pct 0.875.*"
                                                r"departs_from_hub_config: \{preprocessing.crop: <reason>\}"):
        check_against_hub_config(spec)
    spec["departs_from_hub_config"] = {"preprocessing.crop": "the authors' README centre-crops"}
    assert check_against_hub_config(spec) is None


def test_an_image_processor_with_code_in_the_repo_is_not_run(cache, exports, tmp_path, monkeypatch):
    repo_cache = tmp_path / "hub"
    shutil.copytree(cache, repo_cache, symlinks=True)
    hub_cache.use_cache(monkeypatch, repo_cache)
    folder = tmp_path / "remote"
    shutil.copytree(exports[DINO_REPO], folder)
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    processor["auto_map"] = {"AutoImageProcessor": "processing.CustomProcessor"}
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    hub_cache.add_to_cache(repo_cache, DINO_REPO, folder)
    hub = read_hub_config(DINO_REPO, library="transformers")
    assert "preprocessing.mean" not in hub.values and hub.values["embed_dim"] == 64
    with pytest.raises(FmauditInputError, match="preprocessor_config.json"):
        resolve_hub_encoder(f"hf:{DINO_REPO}")

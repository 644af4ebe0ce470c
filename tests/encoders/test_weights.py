"""Weights: local files with sha256, overrides, strict loading, torch and pickle checkpoints, a pre-populated hub
cache."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from fmaudit.encoders import (
    build_encoder,
    save_weights,
)
from fmaudit.io import FmauditInputError, sha256_file
from fmaudit.registry import get_encoder_spec

REVISION = "0123456789abcdef0123456789abcdef01234567"


class OpaqueMetadata:
    """A non-tensor object inside a checkpoint: what weights_only unpickling must refuse."""

    def __init__(self, note: str = "training args"):
        self.note = note


def features(encoder, x):
    with torch.inference_mode():
        return encoder(x)


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


# ---------------------------------------------------------------- what the weights are: sha256 and hub commit


def test_an_override_is_checked_against_the_registrys_sha256_and_recorded_without_one(vit, registry, tmp_path):
    from fmaudit.encoders import resolve_weights

    path = save_demo_weights(vit, tmp_path)
    sha = sha256_file(path)
    plain = get_encoder_spec("demo-vit-tiny", registry)  # no sha256 in the entry: recorded
    resolved = resolve_weights(plain, path)
    assert resolved.identity == {"source": "override", "sha256": [sha]} and not resolved.sha256_checked
    assert resolved.files == [{"path": str(path.resolve()), "sha256": sha}]
    pinned = file_spec(registry, tmp_path / "elsewhere.safetensors", sha256=sha)  # the same weights, stored here
    assert resolve_weights(pinned, path).sha256_checked
    other = file_spec(registry, tmp_path / "elsewhere.safetensors", sha256="1" * 64)
    with pytest.raises(FmauditInputError, match=r"sha256 of .*demo-vit-tiny.safetensors is [0-9a-f]{64}, the "
                                                r"registry expects 1{64} \(the encoder_weights override\)"):
        build_encoder(other, weights_path=path)


def test_hub_weights_record_the_commit_they_resolved_to_and_every_files_sha256(vit, registry, tmp_path,
                                                                               monkeypatch):
    from fmaudit.encoders import hub_commit_of, resolve_weights

    weights = save_demo_weights(vit, tmp_path)
    make_hub_cache(tmp_path / "hf", "fmaudit-test/demo-vit", {"model.safetensors": weights})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    resolved = resolve_weights(hub_spec(registry, "fmaudit-test/demo-vit"))  # no revision asked: the default branch
    assert resolved.identity == {"source": "hf_hub", "hf_hub_id": "fmaudit-test/demo-vit", "revision": None,
                                 "resolved_commit": REVISION, "sha256": [sha256_file(weights)]}
    assert hub_commit_of(resolved.paths[0]) == REVISION and hub_commit_of(weights) is None
    assert resolve_weights(hub_spec(registry, "fmaudit-test/demo-vit", revision=REVISION)).identity[
        "resolved_commit"] == REVISION


def test_remote_code_is_never_built_from_an_unpinned_revision(registry, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the check comes first; nothing is fetched either way
    spec = get_encoder_spec("demo-dinov2-tiny", registry)
    spec["trust_remote_code"] = True
    spec["architecture"] = {"model_class": "AutoModel"}  # its config would come from the hub, with its code
    spec["weights"] = {"source": "hf_hub", "hf_hub_id": "org/remote", "revision": None, "format": "safetensors"}
    with pytest.raises(FmauditInputError, match=r"encoder 'demo-dinov2-tiny': weights.revision is not set, and "
                                                r"trust_remote_code: true runs Python code from org/remote"):
        build_encoder(spec)

"""Pre-flight of the encoders a config embeds (fmaudit.preflight.check_config, as the workflow and `fmaudit
check-config` run it): encoders named by their hub repo, weight files' sha256, their keys and shapes against
the architecture on the meta device, and the record that spares an unchanged encoder a second check."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fmaudit import preflight as preflight_module
from fmaudit.config import fill_config
from fmaudit.encoders import build_encoder, check_encoder_before_embedding, checks, save_weights
from fmaudit.io import FmauditInputError, read_json, sha256_file
from fmaudit.preflight import check_config
from fmaudit.registry import embedding_key, get_encoder_spec
from fmaudit.schema import REPO_ROOT, load_yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hub_cache  # noqa: E402

REPO = "fmaudit-test/tiny-vit"
NAME = f"timm:{REPO}"
SLUG = "timm--fmaudit-test--tiny-vit"


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("hf") / "hub"
    hub_cache.add_to_cache(cache, REPO, hub_cache.timm_export(tmp_path_factory.mktemp("timm") / "x"))
    return cache


@pytest.fixture
def workdir(tmp_path, monkeypatch, cache_root) -> Path:
    """A working directory of its own (the pre-flight records go under its results/), the local cache in use."""
    monkeypatch.chdir(tmp_path)
    hub_cache.use_cache(monkeypatch, cache_root)
    return tmp_path


def demo_config(**changes) -> dict:
    cfg = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    cfg["dataset_params"]["cmu-small-region"] = {"slides": str(REPO_ROOT / "resources/data/slides.tsv")}
    cfg.update(changes)
    return cfg


def registry_with(tmp_path: Path, **entries) -> str:
    registry = load_yaml(REPO_ROOT / "resources" / "encoders.yaml")
    registry.update(entries)
    path = tmp_path / "encoders.yaml"
    path.write_text(yaml.safe_dump(registry, sort_keys=False))
    return str(path)


def file_entry(path: Path, **weights) -> dict:
    entry = {k: v for k, v in get_encoder_spec("demo-vit-tiny").items() if k != "name"}
    entry["weights"] = {"source": "file", "path": str(path), "format": "safetensors", **weights}
    return entry


# ---------------------------------------------------------------- encoders named by their hub repo


def test_a_config_names_an_encoder_by_its_hub_repo(workdir):
    cfg = fill_config(demo_config(encoders=["demo-vit-tiny", NAME], encoder_revisions={NAME: hub_cache.COMMIT}))
    assert cfg["encoders"] == ["demo-vit-tiny", SLUG] and cfg["encoder_revisions"] == {SLUG: hub_cache.COMMIT}
    encoders, _ = check_config(cfg)
    entry = encoders[SLUG]
    assert entry["hub_name"] == NAME and entry["weights"]["revision"] == hub_cache.COMMIT
    assert len(embedding_key(entry)) == 12 and embedding_key(entry) != embedding_key(encoders["demo-vit-tiny"])
    # the pre-flight read its cached weights and config, and recorded what it checked
    record = read_json(workdir / "results" / "demo" / "validation" / "encoders" / f"{SLUG}.json")
    assert record["checks"]["hub_config"] == "matches" and "fit the architecture" in record["checks"]["state_dict"]


def test_a_hub_name_that_is_not_cached_stops_the_config_naming_the_key(workdir):
    cfg = fill_config(demo_config(encoders=["demo-vit-tiny", "hf:nobody/nothing"]))
    with pytest.raises(FmauditInputError, match=r"^config 'encoders': hf:nobody/nothing: .*nobody/nothing not in "
                                                r"the local cache"):
        check_config(cfg)
    with pytest.raises(FmauditInputError, match="'encoders' names encoder 'timm--fmaudit-test--tiny-vit' twice"):
        fill_config(demo_config(encoders=[NAME, SLUG]))
    with pytest.raises(FmauditInputError, match=r"encoders.1"):
        fill_config(demo_config(encoders=["demo-vit-tiny", "timm:no-org"]))


# ---------------------------------------------------------------- weights before any embedding job


def test_a_sha256_mismatch_stops_before_any_job_naming_the_file_and_key(workdir):
    weights = save_weights(build_encoder("demo-vit-tiny"), workdir / "w.safetensors")
    registry = registry_with(workdir, mine=file_entry(weights, sha256="0" * 64))
    cfg = fill_config(demo_config(encoder_registry=registry, encoders=["mine"]))
    with pytest.raises(FmauditInputError) as err:
        check_config(cfg)
    message = str(err.value)
    assert "pre-flight of the encoders failed, before any embedding job" in message
    assert f"encoder 'mine': sha256 of {weights} (weights.path) is {sha256_file(weights)}, but weights.sha256 is " \
           f"{'0' * 64}" in message
    good = registry_with(workdir, mine=file_entry(weights, sha256=sha256_file(weights)))
    check_config(fill_config(demo_config(encoder_registry=good, encoders=["mine"])))


def test_weights_that_do_not_fit_the_architecture_stop_before_any_job_naming_the_keys(workdir):
    convnet = save_weights(build_encoder("demo-convnet"), workdir / "convnet.safetensors")
    cfg = fill_config(demo_config(encoder_weights={"demo-vit-tiny": str(convnet)}))
    with pytest.raises(FmauditInputError) as err:
        check_config(cfg)
    message = str(err.value)
    assert f"encoder 'demo-vit-tiny': the weights in {convnet} (config 'encoder_weights.demo-vit-tiny') do not " \
           f"fit the architecture built from the entry; missing keys: blocks.0." in message
    assert "unexpected keys: conv1.weight" in message or "unexpected keys: bn1." in message


def test_a_registry_entry_whose_cached_config_differs_stops_before_any_job(workdir):
    entry = {k: v for k, v in get_encoder_spec("demo-vit-tiny").items() if k != "name"}
    entry["weights"] = {"source": "hf_hub", "hf_hub_id": REPO, "revision": hub_cache.COMMIT, "format": "safetensors",
                        "timm_checkpoint_filter": True}
    entry["architecture"] = {"model_name": "vit_tiny_patch16_224",
                             "kwargs": {"img_size": 64, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 2,
                                        "num_classes": 0}}
    registry = registry_with(workdir, mine=entry)  # the demo's ImageNet statistics, the export's are 0.5
    with pytest.raises(FmauditInputError, match="'mine' differs from the config of its hub repo: preprocessing.mean"):
        check_config(fill_config(demo_config(encoder_registry=registry, encoders=["mine"])))
    entry["preprocessing"] = {**entry["preprocessing"], "mean": [0.5] * 3, "std": [0.5] * 3}
    check_config(fill_config(demo_config(encoder_registry=registry_with(workdir, mine=entry), encoders=["mine"])))


def test_an_unchanged_encoder_is_checked_once(workdir, monkeypatch):
    weights = save_weights(build_encoder("demo-vit-tiny"), workdir / "w.safetensors")
    cfg = demo_config(encoder_weights={"demo-vit-tiny": str(weights)})
    assert set(preflight_module.check_encoders_before_embedding(fill_config(copy.deepcopy(cfg)),
                                                             check_config(fill_config(copy.deepcopy(cfg)))[0])) == set()
    calls = []
    original = checks.check_encoder_before_embedding

    def counted(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(checks, "check_encoder_before_embedding", counted)
    check_config(fill_config(copy.deepcopy(cfg)))
    assert calls == []  # the record of the first check still describes the same file
    os.utime(weights, ns=(1, 1))
    check_config(fill_config(copy.deepcopy(cfg)))
    assert calls == ["demo-vit-tiny"]


def test_the_checks_of_a_config_without_local_weights_import_no_deep_learning_library():
    """A dry run of the demo (random-init encoders) pays for none of them: nothing to check, nothing imported."""
    code = ("import sys; from fmaudit.config import load_config; from fmaudit.preflight import check_config; "
            "check_config(load_config('config.yaml')); "
            "print(sorted(m for m in ('torch', 'timm', 'transformers', 'open_clip') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")})
    assert out.stdout.strip() == "[]"


def test_what_cannot_be_checked_before_the_job_says_why(tmp_path):
    spec = get_encoder_spec("demo-vit-tiny")
    record = check_encoder_before_embedding("demo-vit-tiny", spec)
    assert record.files == [] and "random init" in record.skipped["state_dict"]
    weights = save_weights(build_encoder("demo-vit-tiny"), tmp_path / "w.pth")
    import torch

    torch.save(build_encoder("demo-vit-tiny").backbone.model.state_dict(), weights)
    pickled = {**spec, "weights": {"source": "file", "path": str(weights), "format": "torch", "allow_pickle": True}}
    assert "allow_pickle" in check_encoder_before_embedding("x", pickled).skipped["state_dict"]
    plain = {**spec, "weights": {"source": "file", "path": str(weights), "format": "torch"}}
    assert "fit the architecture" in check_encoder_before_embedding("x", plain).checks["state_dict"]

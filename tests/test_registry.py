"""Encoder registry: schema validation, lookup with suggestions, config hash, path override."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from fmaudit.io import FmauditInputError
from fmaudit.registry import (
    DESCRIPTIVE_KEYS,
    EMBEDDING_KEYS,
    ENCODER_REGISTRY_ENV,
    ENCODER_SCHEMA,
    check_encoder_entry,
    check_encoder_usable,
    embedding_key,
    embedding_spec,
    encoder_config_hash,
    get_encoder_spec,
    load_registry,
    load_yaml_registry,
    readout_dims,
)
from fmaudit.schema import load_yaml

DEMO_ENTRY = {
    "description": "tiny test encoder",
    "loader": "timm",
    "architecture": {"model_name": "vit_tiny_patch16_224", "kwargs": {"img_size": 64}},
    "weights": {"source": "random", "seed": 0},
    "preprocessing": {"input_size": 64, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    "readouts": ["cls", "mean"],
    "embed_dim": 192,
    "licence": "MIT",
}


def write_registry(tmp_path: Path, entries: dict, name: str = "encoders.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(entries, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def registry():
    return load_registry()


def test_shipped_registry_is_valid_and_has_demo_encoders_for_each_loader(registry):
    demos = {name: e for name, e in registry.items() if e.get("family") == "demo"}
    assert {e["loader"] for e in demos.values()} == {"timm", "transformers", "open_clip"}
    assert all(e["weights"]["source"] == "random" and e["gpu"] is False for e in demos.values())
    for name, entry in registry.items():
        assert re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name)
        if entry.get("default_readout"):
            assert entry["default_readout"] in entry["readouts"]
        if entry.get("family") != "demo":
            assert entry["gpu"] is True, name


def test_shipped_registry_names_the_seed_encoders_with_their_hub_ids(registry):
    hub = {name: e["weights"].get("hf_hub_id") for name, e in registry.items()}
    assert hub["uni"] == "MahmoodLab/UNI"
    assert hub["virchow2"] == "paige-ai/Virchow2"
    assert hub["h-optimus-0"] == "bioptimus/H-optimus-0"
    assert hub["lunit-dino-vits8"] == "1aurent/vit_small_patch8_224.lunit_dino"
    assert hub["dinov2-vitl14"] == "facebook/dinov2-large"
    # preprocessing travels with the weights: H-optimus-0's own statistics, Virchow2's cls+mean embedding
    assert registry["h-optimus-0"]["preprocessing"]["mean"] == [0.707223, 0.578729, 0.703617]
    assert registry["virchow2"]["default_readout"] == "cls_mean"
    assert registry["hibou-b"]["trust_remote_code"] is True
    assert not any(e.get("trust_remote_code") for n, e in registry.items() if not n.startswith("hibou"))


def test_unknown_key_is_named(tmp_path):
    entry = copy.deepcopy(DEMO_ENTRY)
    entry["colour"] = "blue"
    path = write_registry(tmp_path, {"tiny": entry})
    with pytest.raises(FmauditInputError, match=r"tiny.*'colour' was unexpected"):
        load_registry(path)


def test_unknown_nested_key_is_named(tmp_path):
    entry = copy.deepcopy(DEMO_ENTRY)
    entry["preprocessing"]["resize"] = 72
    path = write_registry(tmp_path, {"tiny": entry})
    with pytest.raises(FmauditInputError, match=r"tiny/preprocessing.*'resize' was unexpected"):
        load_registry(path)


def test_wrong_type_is_named(tmp_path):
    entry = copy.deepcopy(DEMO_ENTRY)
    entry["embed_dim"] = "big"
    path = write_registry(tmp_path, {"tiny": entry})
    with pytest.raises(FmauditInputError, match=r"tiny/embed_dim: 'big' is not of type 'integer'"):
        load_registry(path)


def test_hub_source_requires_repo_id(tmp_path):
    entry = copy.deepcopy(DEMO_ENTRY)
    entry["weights"] = {"source": "hf_hub", "format": "safetensors"}
    path = write_registry(tmp_path, {"tiny": entry})
    with pytest.raises(FmauditInputError, match=r"tiny/weights.*'hf_hub_id' is a required property"):
        load_registry(path)


def test_loader_specific_architecture_is_required(tmp_path):
    entry = copy.deepcopy(DEMO_ENTRY)
    entry["loader"] = "transformers"
    path = write_registry(tmp_path, {"tiny": entry})
    with pytest.raises(FmauditInputError, match=r"'model_class' is a required property"):
        load_registry(path)


def test_non_slug_key_is_rejected(tmp_path):
    path = write_registry(tmp_path, {"Tiny ViT": copy.deepcopy(DEMO_ENTRY)})
    with pytest.raises(FmauditInputError, match=r"'Tiny ViT' does not match"):
        load_registry(path)


def test_duplicate_yaml_key_is_rejected(tmp_path):
    text = yaml.safe_dump({"tiny": DEMO_ENTRY}, sort_keys=False)
    path = tmp_path / "dup.yaml"
    path.write_text(text + "  embed_dim: 7\n")
    with pytest.raises(FmauditInputError, match=r"duplicate key 'embed_dim'"):
        load_yaml(path)


def test_yaml_merge_keys_expand(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("base: &b {a: 1, b: 2}\nderived:\n  <<: *b\n  b: 3\n")
    assert load_yaml(path)["derived"] == {"a": 1, "b": 3}


def test_unknown_encoder_suggests_close_matches(registry):
    expected = r"unknown encoder 'demo-vit-tiyn'; did you mean 'demo-vit-tiny'.*known: "
    with pytest.raises(FmauditInputError, match=expected):
        get_encoder_spec("demo-vit-tiyn", registry)


def test_get_encoder_spec_returns_a_named_copy(registry):
    spec = get_encoder_spec("demo-vit-tiny", registry)
    assert spec["name"] == "demo-vit-tiny"
    spec["preprocessing"]["mean"][0] = 0.0
    assert registry["demo-vit-tiny"]["preprocessing"]["mean"][0] == 0.485
    assert "name" not in registry["demo-vit-tiny"]


def test_config_hash_is_stable_ignores_name_and_tracks_changes(registry):
    spec = get_encoder_spec("demo-vit-tiny", registry)
    assert encoder_config_hash(spec) == encoder_config_hash(registry["demo-vit-tiny"])
    changed = copy.deepcopy(spec)
    changed["preprocessing"]["std"] = [0.5, 0.5, 0.5]
    assert encoder_config_hash(changed) != encoder_config_hash(spec)
    assert encoder_config_hash(get_encoder_spec("demo-convnet", registry)) != encoder_config_hash(spec)


def test_registry_path_from_env_and_argument(tmp_path, monkeypatch):
    env_path = write_registry(tmp_path, {"from-env": DEMO_ENTRY}, "env.yaml")
    arg_path = write_registry(tmp_path, {"from-arg": DEMO_ENTRY}, "arg.yaml")
    monkeypatch.setenv(ENCODER_REGISTRY_ENV, str(env_path))
    assert list(load_registry()) == ["from-env"]
    assert list(load_registry(arg_path)) == ["from-arg"]
    assert get_encoder_spec("from-env")["embed_dim"] == 192


def test_missing_registry_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_registry(tmp_path / "nope.yaml")


def test_consistency_rules_beyond_the_schema():
    entry = copy.deepcopy(DEMO_ENTRY)
    entry["default_readout"] = "pooled"
    with pytest.raises(FmauditInputError, match=r"'tiny'.*default_readout 'pooled' is not among readouts"):
        check_encoder_entry("tiny", entry)
    entry = copy.deepcopy(DEMO_ENTRY)
    entry["num_prefix_tokens"] = 0
    with pytest.raises(FmauditInputError, match="need a class token"):
        check_encoder_entry("tiny", entry)
    entry = copy.deepcopy(DEMO_ENTRY)
    entry["trust_remote_code"] = True
    with pytest.raises(FmauditInputError, match="trust_remote_code only applies"):
        check_encoder_entry("tiny", entry)


def test_generic_registry_loader_takes_any_schema(tmp_path):
    schema = tmp_path / "s.yaml"
    schema.write_text(yaml.safe_dump({"type": "object", "additionalProperties": {
        "type": "object", "required": ["preparer"], "properties": {"preparer": {"type": "string"}}}}))
    good = tmp_path / "good.yaml"
    good.write_text("demo: {preparer: demo_tiles}\n")
    assert load_yaml_registry(good, schema) == {"demo": {"preparer": "demo_tiles"}}
    bad = tmp_path / "bad.yaml"
    bad.write_text("demo: {preparer: 3}\n")
    with pytest.raises(FmauditInputError, match=r"(?s)bad.yaml.*demo/preparer: 3 is not of type 'string'"):
        load_yaml_registry(bad, schema)


def test_readout_dims(registry):
    assert readout_dims(registry["virchow2"]) == {"cls": 1280, "mean": 1280, "cls_mean": 2560}
    assert readout_dims(registry["clip-vit-b16"]) == {"cls": 768, "mean": 768, "pooled": 512}
    assert readout_dims(registry["demo-vit-tiny"], ["patch_grid"]) == {"patch_grid": 64}


REMOTE_CODE_ENTRY = {
    **DEMO_ENTRY,
    "loader": "transformers",
    "architecture": {"model_class": "AutoModel"},
    "weights": {"source": "hf_hub", "hf_hub_id": "org/remote", "format": "safetensors"},
    "trust_remote_code": True,
}


def test_schema_requires_a_pinned_revision_with_trust_remote_code(tmp_path):
    path = write_registry(tmp_path, {"remote": REMOTE_CODE_ENTRY})
    with pytest.raises(FmauditInputError, match=r"remote/weights: 'revision' is a required property"):
        load_registry(path)
    branch = copy.deepcopy(REMOTE_CODE_ENTRY)
    branch["weights"]["revision"] = "main"  # a branch moves: not a pin of the code that runs
    with pytest.raises(FmauditInputError, match=r"remote/weights/revision: 'main' does not match"):
        load_registry(write_registry(tmp_path, {"remote": branch}))
    pinned = copy.deepcopy(REMOTE_CODE_ENTRY)
    pinned["weights"]["revision"] = "0123456789abcdef0123456789abcdef01234567"
    registry = load_registry(write_registry(tmp_path, {"remote": pinned}))
    assert get_encoder_spec("remote", registry)["weights"]["revision"] == pinned["weights"]["revision"]
    # without trust_remote_code a revision stays optional, and a tag or branch is allowed
    plain = copy.deepcopy(REMOTE_CODE_ENTRY)
    del plain["trust_remote_code"]
    plain["weights"]["revision"] = "v1.0"
    assert load_registry(write_registry(tmp_path, {"plain": plain, "tiny": DEMO_ENTRY}))


def test_remote_code_entry_with_unknown_revision_loads_but_cannot_be_used(tmp_path):
    unknown = copy.deepcopy(REMOTE_CODE_ENTRY)
    unknown["weights"]["revision"] = None  # no published commit known: the registry says so explicitly
    registry = load_registry(write_registry(tmp_path, {"remote": unknown, "tiny": DEMO_ENTRY}))
    check_encoder_usable("tiny", registry["tiny"])  # the rest of the registry is usable
    with pytest.raises(FmauditInputError, match=r"encoder 'remote': weights.revision is not set, and "
                                                r"trust_remote_code: true runs Python code from org/remote"):
        check_encoder_usable("remote", registry["remote"])
    with pytest.raises(FmauditInputError, match=r"^my.yaml: encoder 'remote': weights.revision"):
        check_encoder_usable("remote", unknown, source="my.yaml")


def test_shipped_registry_pins_what_it_can_and_marks_the_rest(registry):
    hub = {n: e for n, e in registry.items() if e["weights"]["source"] == "hf_hub"}
    pinned = {n for n, e in hub.items() if e["weights"].get("revision")}
    assert {"uni", "conch", "dinov2-vits14", "dinov2-vitg14"} <= pinned
    assert registry["dinov2-vitb14"]["weights"]["revision"] == "f9e44c814b77203eaa57a6bdbbd535f21ede1415"
    for name, entry in hub.items():
        if name not in pinned:
            assert entry.get("verify") is True or entry.get("checked_against"), \
                f"{name}: unpinned hub entries must say verify: true or what they were checked against"
    for name in ("hibou-b", "hibou-l"):  # remote code, no published commit found: explicit and unusable
        assert registry[name]["weights"]["revision"] is None
        with pytest.raises(FmauditInputError, match=f"encoder '{name}': weights.revision is not set"):
            check_encoder_usable(name, registry[name])


def test_every_real_entry_says_what_it_was_checked_against_or_why_not(registry):
    for name, entry in registry.items():
        if entry.get("family") == "demo" or entry.get("variant_of"):
            continue
        if entry.get("verify"):
            assert entry.get("verify_reason"), f"{name}: verify: true needs a verify_reason"
        else:
            assert entry.get("checked_against"), f"{name}: neither checked_against nor verify: true"
    # what the check corrected (the sources: the notes and checked_against of each entry)
    assert registry["uni2-h"]["preprocessing"]["interpolation"] == "bilinear"
    assert registry["eva02-b14"]["preprocessing"]["resize_size"] == 248
    assert registry["vit-b16-in21k"]["weights"]["drop_keys_with_prefix"] == ["head."]
    assert registry["reddino-s"]["preprocessing"]["crop"] == "none"
    assert "preprocessing.resize_size" in registry["prov-gigapath"]["departs_from_hub_config"]


def test_checked_against_names_a_source_and_a_date(tmp_path):
    entry = copy.deepcopy(DEMO_ENTRY)
    entry["checked_against"] = ["https://example.org/card, 2026-12-01"]
    load_yaml_registry(write_registry(tmp_path, {"mine": entry}), ENCODER_SCHEMA)
    entry["checked_against"] = "the model card"
    with pytest.raises(FmauditInputError, match="checked_against"):
        load_yaml_registry(write_registry(tmp_path, {"mine": entry}), ENCODER_SCHEMA)
    entry.pop("checked_against")
    entry["departs_from_hub_config"] = {"preprocessing.colour": "no such field"}
    with pytest.raises(FmauditInputError, match="departs_from_hub_config"):
        load_registry(write_registry(tmp_path, {"mine": entry}))


# ---------------------------------------------------------------- what decides an embedding's numbers


def test_every_entry_key_is_either_number_deciding_or_descriptive():
    schema = load_yaml(ENCODER_SCHEMA)
    keys = set(schema["$defs"]["encoder"]["properties"])
    assert not set(EMBEDDING_KEYS) & set(DESCRIPTIVE_KEYS)
    assert set(EMBEDDING_KEYS) | set(DESCRIPTIVE_KEYS) == keys  # a new key must be placed in one of the two lists


def test_descriptive_edits_change_neither_the_hash_nor_the_key(registry):
    spec = get_encoder_spec("demo-vit-tiny", registry)
    edited = copy.deepcopy(spec)
    edited.update(description="another sentence", licence="MIT", pretraining_corpora=["x"], paper="y", gpu=True,
                  exposure={"demo-tiles": {"status": "no", "evidence": "z"}}, notes="n", default_readout="mean")
    assert embedding_spec(edited) == embedding_spec(spec)
    assert "description" not in embedding_spec(spec) and embedding_spec(spec)["name"] == "demo-vit-tiny"
    assert encoder_config_hash(edited) == encoder_config_hash(spec)
    assert embedding_key(edited) == embedding_key(spec)


@pytest.mark.parametrize("change", [
    lambda e: e["weights"].update(seed=1),
    lambda e: e["preprocessing"].update(std=[0.5, 0.5, 0.5]),
    lambda e: e.update(readouts=["cls"]),
    lambda e: e.update(precision="float16"),
    lambda e: e["weights"].update(source="hf_hub", hf_hub_id="org/x", revision="a" * 40, format="safetensors"),
])
def test_number_deciding_edits_change_the_hash_and_the_key(registry, change):
    spec = get_encoder_spec("demo-vit-tiny", registry)
    edited = copy.deepcopy(spec)
    change(edited)
    assert encoder_config_hash(edited) != encoder_config_hash(spec)
    assert embedding_key(edited) != embedding_key(spec)


def test_embedding_key_tracks_the_weights_override(registry):
    spec = get_encoder_spec("demo-vit-tiny", registry)
    assert re.fullmatch(r"[0-9a-f]{12}", embedding_key(spec))
    assert embedding_key(spec, "w/a.safetensors") != embedding_key(spec) != embedding_key(spec, "w/b.safetensors")
    assert embedding_key(spec, "") == embedding_key(spec, None) == embedding_key(spec)


def test_usability_message_names_the_config_key(tmp_path):
    unknown = copy.deepcopy(REMOTE_CODE_ENTRY)
    unknown["weights"]["revision"] = None
    with pytest.raises(FmauditInputError, match=r"set `encoder_revisions.remote: <commit>` in your config \(or "
                                                r"weights.revision in my.yaml\)"):
        check_encoder_usable("remote", unknown, source="my.yaml", config_key="encoder_revisions.remote")


# ---- declared variants (the hema paper's 224-vs-518 input-resolution check) -------------------------------------


def test_declared_variants_become_entries_of_their_own(registry):
    base, variant = registry["dinov2-vitl14"], registry["dinov2-vitl14.res518"]
    assert variant["variant_of"] == "dinov2-vitl14" and variant["variant"] == "res518"
    assert variant["preprocessing"] == {**base["preprocessing"], "input_size": 518, "resize_size": 518}
    assert variant["weights"] == base["weights"] and variant["embed_dim"] == base["embed_dim"]
    assert "variants" not in base and "variants" not in variant
    assert encoder_config_hash(variant) != encoder_config_hash(base)
    # nested mappings merge key by key: the timm variant keeps its model name and kwargs, adds one
    bloom = registry["dinobloom-l.res518"]
    assert bloom["architecture"] == {"model_name": "vit_large_patch14_dinov2",
                                     "kwargs": {"img_size": 224, "num_classes": 0, "dynamic_img_size": True}}
    assert get_encoder_spec("dinobloom-l.res518", registry)["name"] == "dinobloom-l.res518"


def test_declaring_a_variant_leaves_the_base_hash_alone(tmp_path):
    plain = load_registry(write_registry(tmp_path, {"tiny": DEMO_ENTRY}, "a.yaml"))
    entry = {**DEMO_ENTRY, "variants": {"res96": {"preprocessing": {"input_size": 96}}}}
    declared = load_registry(write_registry(tmp_path, {"tiny": entry}, "b.yaml"))
    assert set(declared) == {"tiny", "tiny.res96"}
    assert encoder_config_hash(declared["tiny"]) == encoder_config_hash(plain["tiny"])
    assert declared["tiny.res96"]["preprocessing"] == {**DEMO_ENTRY["preprocessing"], "input_size": 96}


def test_a_bad_variant_is_named(tmp_path):
    bad = {**DEMO_ENTRY, "variants": {"big": {"preprocessing": {"input_size": 2}}}}
    with pytest.raises(FmauditInputError, match=r"(?s)declared variants.*tiny\.big.*input_size"):
        load_registry(write_registry(tmp_path, {"tiny": bad}))
    dotted = {**DEMO_ENTRY, "variants": {"res.96": {"preprocessing": {"input_size": 96}}}}
    with pytest.raises(FmauditInputError, match="res.96"):
        load_registry(write_registry(tmp_path, {"tiny": dotted}, "dotted.yaml"))
    clash = {"tiny": {**DEMO_ENTRY, "variants": {"v": {"preprocessing": {"input_size": 96}}}}, "tiny.v": DEMO_ENTRY}
    with pytest.raises(FmauditInputError, match="variant slug 'tiny.v' is also an entry"):
        load_registry(write_registry(tmp_path, clash, "clash.yaml"))
    by_hand = {"tiny": {**DEMO_ENTRY, "variant_of": "other"}}
    with pytest.raises(FmauditInputError, match="variant_of is set by the registry loader"):
        load_registry(write_registry(tmp_path, by_hand, "hand.yaml"))


def test_a_variant_embeds_the_same_weights_at_its_own_resolution(registry):
    import numpy as np
    import torch
    from PIL import Image

    from fmaudit.encoders import build_encoder, create_transform, resolve_data_config

    base, variant = registry["demo-dinov2-tiny"], registry["demo-dinov2-tiny.res96"]
    enc_b, enc_v = build_encoder({**base, "name": "b"}), build_encoder({**variant, "name": "v"})
    for (k, a), (_, b) in zip(enc_b.state_dict().items(), enc_v.state_dict().items()):
        assert torch.equal(a, b), k  # the same weights: only the preprocessing differs
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (80, 80, 3), dtype=np.uint8))
    xb, xv = (create_transform(resolve_data_config(spec))(image) for spec in (base, variant))
    assert xb.shape[-1] == 64 and xv.shape[-1] == 96
    with torch.no_grad():
        fb, fv = enc_b(xb[None]), enc_v(xv[None])
    assert fb["cls"].shape == fv["cls"].shape and not torch.allclose(fb["cls"], fv["cls"])


# ---- a config's own registries extend the built-in ones


def test_registries_of_ones_own_add_to_the_built_in_ones(tmp_path):
    from fmaudit.registry import load_dataset_registries, load_encoder_registries

    mine = write_registry(tmp_path, {"my-resnet18": DEMO_ENTRY}, "mine.yaml")
    both = load_encoder_registries(str(mine))
    assert "my-resnet18" in both and "uni" in both and "demo-vit-tiny" in both
    inline = load_encoder_registries([str(mine)], entries={"my-vit": DEMO_ENTRY})
    assert {"my-resnet18", "my-vit", "uni"} <= set(inline)
    # the config's default (the built-in file itself) and a byte-identical copy of it add nothing twice
    builtin = Path(__file__).resolve().parents[1] / "resources" / "encoders.yaml"
    copy_path = tmp_path / "copy.yaml"
    copy_path.write_bytes(builtin.read_bytes())
    assert set(load_encoder_registries(["resources/encoders.yaml", str(copy_path)])) == set(load_registry())
    datasets = load_dataset_registries(entries={"my-tiles": {"kind": "image_table",
                                                             "params": {"sheet": "s.csv", "classes": ["a", "b"]}}})
    assert datasets["my-tiles"]["preparer"] == "image_table" and "demo-tiles" in datasets
    assert datasets["my-tiles"]["params"]["fractions"] == [0.6, 0.2, 0.2]  # the kind's defaults, from its schema


def test_a_slug_defined_twice_names_both_places(tmp_path):
    from fmaudit.registry import load_dataset_registries, load_encoder_registries

    other = {**DEMO_ENTRY, "weights": {"source": "random", "seed": 1}}
    a = write_registry(tmp_path, {"my-enc": DEMO_ENTRY}, "a.yaml")
    b = write_registry(tmp_path, {"my-enc": other}, "b.yaml")
    with pytest.raises(FmauditInputError, match=rf"encoder 'my-enc' is defined twice: in {a} and in {b}"):
        load_encoder_registries([str(a), str(b)])
    # the same entry twice (a copy of a registry with entries added) adds nothing and replaces nothing
    same = write_registry(tmp_path, {"my-enc": DEMO_ENTRY}, "same.yaml")
    assert load_encoder_registries([str(a), str(same)])["my-enc"] == load_encoder_registries(str(a))["my-enc"]
    uni = write_registry(tmp_path, {"uni": DEMO_ENTRY}, "uni.yaml")
    with pytest.raises(FmauditInputError, match=rf"encoder 'uni' is defined twice: in .*resources/encoders.yaml and "
                                                rf"in {uni}"):
        load_encoder_registries(str(uni))
    with pytest.raises(FmauditInputError, match=r"encoder 'my-enc' is defined twice: in .*a.yaml and in config "
                                                r"'encoder_entries'"):
        load_encoder_registries(str(a), entries={"my-enc": other})
    entry = {"kind": "image_table", "params": {"sheet": "s.csv", "classes": ["a", "b"]}}
    with pytest.raises(FmauditInputError, match=r"data set 'demo-tiles' is defined twice: in .*resources/datasets.yaml "
                                                r"and in config 'dataset_entries'"):
        load_dataset_registries(entries={"demo-tiles": entry})
    with pytest.raises(FileNotFoundError, match="nowhere.yaml: registry file not found"):
        load_encoder_registries(str(tmp_path / "nowhere.yaml"))

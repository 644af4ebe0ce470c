"""The pre-flight's plan stage (:mod:`fmaudit.preflight`): a typo or a missing file stops the run with a message that
names the key; encoders that could not be embedded are named with the key to set."""

import copy

import pytest
import yaml

from fmaudit.config import fill_config
from fmaudit.encoders import build_encoder, save_weights
from fmaudit.io import FmauditInputError
from fmaudit.preflight import check_config, check_names, unusable_encoders
from fmaudit.schema import REPO_ROOT, load_yaml


@pytest.fixture()
def demo_config():
    return yaml.safe_load((REPO_ROOT / "config.yaml").read_text())


@pytest.fixture()
def registries():
    return load_yaml(REPO_ROOT / "resources" / "encoders.yaml"), load_yaml(REPO_ROOT / "resources" / "datasets.yaml")


def _remote_registry(tmp_path):
    """A registry of one's own (added to the built-in one): a remote-code entry without a pinned commit."""
    builtin = load_yaml(REPO_ROOT / "resources" / "encoders.yaml")
    registry = {"remote-demo": {**builtin["demo-dinov2-tiny"], "trust_remote_code": True,
                                "weights": {"source": "hf_hub", "hf_hub_id": "org/remote", "revision": None,
                                            "format": "safetensors"}}}
    path = tmp_path / "encoders.yaml"
    path.write_text(yaml.safe_dump(registry))
    return path


def test_demo_config_is_valid_and_gets_defaults(demo_config, registries):
    cfg = fill_config(copy.deepcopy(demo_config))
    check_names(cfg, *registries)
    assert cfg["encoder_registry"] == "resources/encoders.yaml"
    assert cfg["calibration"]["ece_bins"] == 15


def test_unknown_encoder_suggests_close_name(demo_config, registries):
    demo_config["encoders"] = ["demo-vit-tiniy"]
    with pytest.raises(FmauditInputError, match=r"unknown encoder 'demo-vit-tiniy'.*did you mean 'demo-vit-tiny'"):
        check_names(fill_config(demo_config), *registries)


def test_unknown_dataset(demo_config, registries):
    demo_config["datasets"].append("no-such-data")
    with pytest.raises(FmauditInputError, match="unknown dataset 'no-such-data'"):
        check_names(fill_config(demo_config), *registries)


def test_task_on_dataset_not_in_config(demo_config, registries):
    demo_config["tasks"]["demo-tissue"]["datasets"] = ["cmu-small-regio"]
    with pytest.raises(FmauditInputError, match="tasks.demo-tissue.datasets"):
        check_names(fill_config(demo_config), *registries)


def test_check_config_is_the_workflows_checks(demo_config, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    encoders, datasets = check_config(fill_config(demo_config))
    assert "demo-vit-tiny" in encoders and "cmu-small-region" in datasets
    bad = fill_config(yaml.safe_load((REPO_ROOT / "config.yaml").read_text()))
    bad["cells"] = {"taxonomies": {"fine": "demo-tissue"}, "sections": {"o": ["s1"]},
                    "protocols": {"IOCD": {"seeds": [0], "min_sections_per_organ": 2}}}
    with pytest.raises(FmauditInputError, match="no evaluation unit"):
        check_config(bad)



# ---------------------------------------------------------------- study folder, weights and revisions


def test_a_missing_weights_override_stops_at_config_time_naming_the_key(demo_config, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    demo_config["encoder_weights"] = {"demo-convnet": str(tmp_path / "nowhere.safetensors")}
    with pytest.raises(FmauditInputError, match=r"config 'encoder_weights.demo-convnet': weight file .*nowhere"
                                                r".safetensors does not exist"):
        check_config(fill_config(demo_config))
    demo_config["encoder_weights"] = {"demo-convnet": str(tmp_path)}
    with pytest.raises(FmauditInputError, match="encoder_weights.demo-convnet': .* is not a file"):
        check_config(fill_config(copy.deepcopy(demo_config)))
    # an override that exists but is no checkpoint stops the pre-flight, naming the file and the key
    (tmp_path / "w.safetensors").write_bytes(b"x")
    demo_config["encoder_weights"] = {"demo-convnet": str(tmp_path / "w.safetensors")}
    with pytest.raises(FmauditInputError, match=r"w.safetensors is not a readable safetensors file .*"
                                                r"encoder_weights.demo-convnet"):
        check_config(fill_config(copy.deepcopy(demo_config)))
    monkeypatch.chdir(tmp_path)  # the pre-flight records what it checked under results/<study>/ of the cwd
    demo_config["dataset_params"]["cmu-small-region"] = {"slides": str(REPO_ROOT / "resources/data/slides.tsv")}
    save_weights(build_encoder("demo-convnet"), tmp_path / "w.safetensors")
    check_config(fill_config(demo_config))
    assert (tmp_path / "results" / "demo" / "validation" / "encoders" / "demo-convnet.json").is_file()


def test_encoders_that_cannot_be_embedded_name_the_key_to_set(demo_config, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    demo_config.update(encoder_registry=str(_remote_registry(tmp_path)), encoders=["demo-vit-tiny", "remote-demo"])
    cfg = fill_config(copy.deepcopy(demo_config))
    encoders, _ = check_config(cfg)  # the config itself is fine: dry runs and `fmaudit grid` work
    problems = unusable_encoders(cfg, encoders)
    assert list(problems) == ["remote-demo"]
    assert "set `encoder_revisions.remote-demo: <commit>` in your config" in problems["remote-demo"]
    # the key it names makes it usable, and changes what the registry entry says for this config only
    demo_config["encoder_revisions"] = {"remote-demo": "b" * 40}
    cfg = fill_config(demo_config)
    encoders, _ = check_config(cfg)
    assert unusable_encoders(cfg, encoders) == {}
    assert encoders["remote-demo"]["weights"]["revision"] == "b" * 40
    assert load_yaml(tmp_path / "encoders.yaml")["remote-demo"]["weights"]["revision"] is None


def test_encoder_revisions_are_checked(demo_config, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    demo_config["encoder_revisions"] = {"demo-vit-tiny": "c" * 40}  # a random-init entry has no hub revision
    with pytest.raises(FmauditInputError, match=r"config 'encoder_revisions.demo-vit-tiny': encoder 'demo-vit-tiny' "
                                                r"does not load its weights from the Hugging Face hub"):
        check_config(fill_config(copy.deepcopy(demo_config)))
    demo_config["encoder_revisions"] = {"uni": "c" * 40}
    with pytest.raises(FmauditInputError, match=r"config 'encoder_revisions': unknown encoder 'uni'"):
        check_config(fill_config(copy.deepcopy(demo_config)))
    demo_config["encoder_revisions"] = {"demo-vit-tiny": "main"}
    with pytest.raises(FmauditInputError, match="encoder_revisions"):
        fill_config(demo_config)


def test_a_missing_registry_weight_file_makes_the_encoder_unusable_not_the_config(demo_config, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    cfg = fill_config(load_yaml(REPO_ROOT / "resources" / "presets" / "audit.yaml"))
    encoders, _ = check_config(cfg)
    problems = unusable_encoders(cfg, encoders)
    assert set(problems) == {"ctranspath", "hibou-b", "hibou-l"}
    assert "encoder_weights.ctranspath" in problems["ctranspath"] and "ctranspath.pth" in problems["ctranspath"]
    (tmp_path / "ctranspath.pth").write_bytes(b"x")
    cfg["encoder_weights"] = {"ctranspath": str(tmp_path / "ctranspath.pth")}
    assert "ctranspath" not in unusable_encoders(cfg, encoders)


def test_variants_must_be_declared_and_beside_their_base(demo_config):
    from fmaudit.registry import load_dataset_registry, load_registry

    encoders, datasets = load_registry(), load_dataset_registry()
    cfg = fill_config(copy.deepcopy(demo_config))
    assert cfg["variants"] == []
    cfg["variants"] = ["demo-dinov2-tiny.res96"]
    check_names(cfg, encoders, datasets)
    cfg["variants"] = ["demo-dinov2-tiny.res69"]
    with pytest.raises(FmauditInputError, match=r"config 'variants': unknown declared encoder variant "
                                                r"'demo-dinov2-tiny.res69'; did you mean 'demo-dinov2-tiny.res96'"):
        check_names(cfg, encoders, datasets)
    cfg["variants"] = ["demo-dinov2-tiny.res96"]
    cfg["encoders"] = ["demo-vit-tiny"]
    with pytest.raises(FmauditInputError, match="variant of 'demo-dinov2-tiny', which is not in the config's encoders"):
        check_names(cfg, encoders, datasets)




# ---- data stage: what the validate rule and `fmaudit check-config` run on prepared manifests


def _demo_manifest(tmp_path):
    from fmaudit.datasets import prepare_dataset
    from fmaudit.io import write_table

    params = {"seed": 0, "image_size": 32, "n_patients_per_domain": 4, "tiles_per_patient_per_class": 1,
              "n_domains": 2}
    man = prepare_dataset("demo-tiles", "demo_tiles", tmp_path / "data", params, group_unit="patient")
    path = tmp_path / "demo-tiles.parquet"
    write_table(path, man)
    return path


def test_every_class_name_the_config_mentions_is_listed(demo_config):
    from fmaudit.preflight import class_references

    cfg = fill_config(demo_config)
    cfg["tasks"]["demo-tissue"]["allow_missing_classes"] = ["adipose"]
    refs = {r.key: (r.task, r.names) for r in class_references(cfg)}
    assert refs["ood.near.demo-tissue"] == ("demo-tissue", ("mucus",))
    assert refs["ood.artefact.demo-tissue"] == ("demo-tissue", ("adipose",))
    assert refs["prior_shift.priors.balanced"][0] == "demo-tissue"
    assert set(refs["prior_shift.priors.balanced"][1]) == {"tumour", "stroma", "lymphocytes", "adipose", "mucus"}
    assert refs["tasks.demo-tissue.allow_missing_classes"] == ("demo-tissue", ("adipose",))


def test_a_class_name_typo_stops_the_data_stage_naming_the_key_and_a_close_class(tmp_path):
    from fmaudit.preflight import ClassReference, DataChecks, check_data
    from fmaudit.split_checks import SplitValidationError

    manifest = _demo_manifest(tmp_path)
    task = {"datasets": ["demo-tiles"], "domains": ["scanner-a", "scanner-b"], "transfer": True, "split": "manifest"}
    good = DataChecks({"demo-tiles": str(manifest)}, {"demo": task},
                      (ClassReference("ood.near.demo", "demo", ("mucus",)),))
    report = check_data(good)
    rows = report.to_frame()
    assert rows.loc[rows["check"] == "class_names", "status"].tolist() == ["ok"]
    bad = DataChecks({"demo-tiles": str(manifest)}, {"demo": task},
                     (ClassReference("ood.near.demo", "demo", ("mucos",)),
                      ClassReference("prior_shift.priors.skewed", "demo", ("tumour", "strom"))))
    with pytest.raises(SplitValidationError) as err:
        check_data(bad)
    message = str(err.value)
    assert "config 'ood.near.demo': unknown class 'mucos'; did you mean 'mucus'?" in message
    assert "config 'prior_shift.priors.skewed': unknown class 'strom'; did you mean 'stroma'?" in message
    assert str(manifest) in message
    # the split checks ran too and are in the report that travels with the error
    assert "group_disjoint" in set(err.value.report.to_frame()["check"])


def test_data_checks_round_trip_through_rule_params_and_restrict_to_prepared_tasks(demo_config):
    from fmaudit.preflight import DataChecks, data_checks

    cfg = fill_config(demo_config)
    encoders, datasets = check_config(cfg)
    checks = data_checks(cfg, datasets)
    assert set(checks.tasks) == {"demo-tissue"}  # cell taxonomies are checked by the cell branch
    assert checks.manifests == {"demo-tiles": "results/demo/manifests/demo-tiles.parquet"}
    again = DataChecks.from_params(checks.as_params())
    assert again.as_params() == checks.as_params()
    assert checks.restricted_to([]).manifests == {}


# ---- a user's own data sets


def _own_config(tmp_path, **entry_params):
    from own_data_utils import write_tile_study

    sheet = write_tile_study(tmp_path / "mine", n_patients=5, size=16)
    params = {"sheet": str(sheet), "classes": ["tumour", "stroma", "lymphocytes"], **entry_params}
    return fill_config({"data_root": str(tmp_path), "encoders": ["demo-vit-tiny"], "datasets": ["mine"],
                        "dataset_entries": {"mine": {"kind": "image_table", "params": params}},
                        "tasks": {"t": {"datasets": ["mine"]}}})


def test_a_task_over_ones_own_data_transfers_between_the_domains_of_its_sheet(tmp_path):
    from fmaudit.preflight import data_checks

    cfg = _own_config(tmp_path)
    _, datasets = check_config(cfg)
    assert datasets["mine"]["domains"] == ["scanner1", "scanner2"]
    assert data_checks(cfg, datasets).tasks["t"]["domains"] == ["scanner1", "scanner2"]


def test_a_kind_or_preparer_that_does_not_exist_is_an_error_of_the_plan(tmp_path):
    cfg = _own_config(tmp_path)
    cfg["dataset_entries"]["mine"]["kind"] = "image_tables"
    with pytest.raises(FmauditInputError, match=r"config 'dataset_entries': does not match its schema:\n  "
                                                r"mine/kind: 'image_tables' is not one of"):
        check_config(cfg)
    cfg["dataset_entries"]["mine"]["kind"] = "image_table"
    cfg["dataset_entries"]["mine"]["preparer"] = "image_tabel"
    with pytest.raises(FmauditInputError, match=r"data set 'mine' \(its registry entry's 'preparer'\): unknown "
                                                r"preparer 'image_tabel'; did you mean 'image_table'"):
        check_config(cfg)


def test_features_of_one_encoder_cannot_be_embedded_by_another(tmp_path):
    from own_data_utils import write_feature_study

    path, sheet = write_feature_study(tmp_path)
    entry = {"kind": "features", "params": {"sheet": str(sheet), "files": {"their-uni": path.name},
                                            "classes": ["tumour", "stroma", "lymphocytes"]}}
    base = {"data_root": str(tmp_path), "datasets": ["feats"], "dataset_entries": {"feats": entry},
            "tasks": {"t": {"datasets": ["feats"]}}}
    encoders, _ = check_config(fill_config({**copy.deepcopy(base), "encoders": ["their-uni"]}))
    assert encoders["their-uni"]["loader"] == "precomputed" and encoders["their-uni"]["embed_dim"] == 24
    with pytest.raises(FmauditInputError, match=r"data set 'feats' holds embeddings computed elsewhere \(kind: "
                                                r"features, files of their-uni\), but the config also asks encoder "
                                                r"'demo-vit-tiny' to embed it"):
        check_config(fill_config({**copy.deepcopy(base), "encoders": ["their-uni", "demo-vit-tiny"]}))
    blur = {**copy.deepcopy(base), "encoders": ["their-uni"], "ood": {"blur": {"sigmas": [2.0], "tasks": ["t"]}}}
    with pytest.raises(FmauditInputError, match=r"re-embeds perturbed images of data set 'feats'"):
        check_config(fill_config(blur))

"""Exposure audit: encoder pretraining corpora against evaluation data sets (hema paper)."""

import pytest

from fmaudit.exposure import exposure_audit, exposure_matrix, exposure_status
from fmaudit.io import FmauditInputError
from fmaudit.registry import load_registry, load_yaml
from fmaudit.schema import REPO_ROOT

HEMA = ["bloodmnist-wbc5", "matek19-wbc5", "mll23-wbc5", "raabin-wbc"]


@pytest.fixture(scope="module")
def registries():
    return load_registry(), load_yaml(REPO_ROOT / "resources" / "datasets.yaml")


def test_dinobloom_reproduces_the_seeds_exposure_audit(registries):
    enc, ds = registries
    audit = exposure_audit(["dinobloom-s", "dinobloom-l"], HEMA, enc, ds)
    status = audit.set_index(["encoder", "dataset"])["exposure"]
    for model in ("dinobloom-s", "dinobloom-l"):
        # three of the four WBC domains are in DinoBloom's corpus; Acevedo (the source) is held out
        assert status[(model, "mll23-wbc5")] == "yes"
        assert status[(model, "matek19-wbc5")] == "yes"
        assert status[(model, "raabin-wbc")] == "yes"
        assert status[(model, "bloodmnist-wbc5")] == "no"
    evidence = audit.set_index(["encoder", "dataset"])["evidence"]
    assert "MLL23" in evidence[("dinobloom-l", "mll23-wbc5")]
    assert "declared" in evidence[("dinobloom-l", "bloodmnist-wbc5")]
    assert list(audit.columns) == ["encoder", "dataset", "exposure", "evidence"]
    assert exposure_matrix(audit).loc["dinobloom-s", "bloodmnist-wbc5"] == "no"


def test_silence_is_unknown_and_random_weights_are_no(registries):
    enc, ds = registries
    audit = exposure_audit(["dinov2-vitl14", "demo-vit-tiny", "phikon"], ["mll23-wbc5", "nct-crc-he-100k"], enc, ds)
    status = audit.set_index(["encoder", "dataset"])["exposure"]
    assert status[("dinov2-vitl14", "mll23-wbc5")] == "unknown"  # LVD-142M does not say; web-scale
    assert status[("demo-vit-tiny", "mll23-wbc5")] == "no"  # random initialisation
    assert status[("phikon", "nct-crc-he-100k")] == "unknown"  # TCGA tiles: NCT-CRC is not named


def test_aliases_match_whole_words_only():
    entry = {"pretraining_corpora": ["PBCX cells and the MLL23 cohort"], "weights": {"source": "hf_hub"}}
    assert exposure_status("e", entry, "acevedo-pbc", {"aliases": ["PBC"]})[0] == "unknown"
    assert exposure_status("e", entry, "mll23-wbc5", {"aliases": ["mll23"]})[0] == "yes"  # case-insensitive
    assert exposure_status("e", entry, "x", None)[0] == "unknown"


def test_bad_registry_entries_and_names_are_errors(registries):
    enc, ds = registries
    with pytest.raises(FmauditInputError, match="unknown encoder"):
        exposure_audit(["dinobloom-xxl"], HEMA, enc, ds)
    with pytest.raises(FmauditInputError, match="unknown dataset"):
        exposure_audit(["dinobloom-s"], ["mll24"], enc, ds)
    entry = {"exposure": {"MLL23": {"status": False, "evidence": "yaml read no as false"}}}
    with pytest.raises(FmauditInputError, match="exposure.MLL23.status"):
        exposure_status("e", entry, "mll23", {"aliases": ["MLL23"]})

"""What every public preparer shares: the missing-data message, and the registry entries they read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fmaudit.datasets import PREPARERS, prepare_dataset
from fmaudit.io import FmauditInputError

REPO = Path(__file__).resolve().parents[3]


SAFE_ID = re.compile(r"^[A-Za-z0-9._-]+$")


MISSING = [
    ("lunghist700", {}, "LungHist700/images", "https://figshare.com/articles/dataset/LungHist700/25459174"),
    ("spider_breast", {}, "SPIDER-breast/metadata.json", "https://huggingface.co/datasets/histai/SPIDER-breast"),
    ("nct_crc_he", {}, "NCT-CRC-HE-100K-NONORM", "https://zenodo.org/records/1214456"),
    ("lc25000", {"subset": "colon"}, "lung_colon_image_set/colon_image_sets", "https://github.com/tampapath/lung_colon_image_set"),
    ("breakhis", {}, "BreaKHis_v1/histology_slides/breast", "https://web.inf.ufpr.br/vri/databases/"),
    ("pcam", {}, "pcam/camelyonpatch_level_2_split_test_x.h5", "https://zenodo.org/records/2546921"),
    ("sicapv2", {}, "SICAPv2", "https://data.mendeley.com/datasets/9xxm58dvs3/1"),
    ("panda", {}, "panda/train.csv", "https://www.kaggle.com/competitions/prostate-cancer-grade-assessment"),
    ("mhist", {}, "MHIST", "https://bmirds.github.io/MHIST/"),
    ("bracs", {}, "BRACS_RoI/latest_version", "https://www.bracs.icar.cnr.it/"),
    ("camelyon17_wilds", {}, "camelyon17_v1.0/metadata.csv", "https://worksheets.codalab.org/"),
    ("bloodmnist", {}, "medmnist/bloodmnist_224.npz", "https://zenodo.org/records/10519652"),
    ("acevedo_pbc", {}, "PBC_dataset_normal_DIB", "https://data.mendeley.com/datasets/snkd93bnjr/1"),
    ("matek19", {}, "AML-Cytomorphology_LMU", "https://doi.org/10.7937/tcia.2019.36f5o9ld"),
    ("raabin_wbc", {}, "Raabin-WBC", "https://raabindata.com/free-data/"),
    ("mll23", {}, "MLL23", "https://zenodo.org/records/14277609"),
    ("xenium_cells", {"sections": {"s1": {"organ": "breast", "bundle": "xen/s1/outs"}}},
     "xen/s1/outs/experiment.xenium",
     "https://www.10xgenomics.com/datasets"),
]


@pytest.mark.parametrize("preparer,params,expected,url", MISSING)
def test_missing_data_set_says_where_and_how(tmp_path, preparer, params, expected, url):
    with pytest.raises(FmauditInputError) as e:
        prepare_dataset("x", preparer, tmp_path, params)
    msg = str(e.value)
    assert f"expected {expected} under data_root {tmp_path}; get it from {url}" in msg
    assert msg.endswith("and unpack it there")


def test_every_public_preparer_has_a_missing_data_test():
    import fmaudit.datasets.public  # noqa: F401

    # the demo, the slide sheet and the kinds of a user's own data read no public layout under data_root
    demo = {"demo_tiles", "slide_tiles", "image_table", "slide_table", "features", "cell_table"}
    assert {m[0] for m in MISSING} == set(PREPARERS) - demo


def registry():
    return yaml.safe_load((REPO / "resources" / "datasets.yaml").read_text())


def test_registry_demo_entries_first_and_real_entries_complete(tmp_path):
    reg = registry()
    demo = ["demo-tiles", "cmu-small-region", "demo-xenium"]
    assert list(reg)[:3] == demo
    real = {k: v for k, v in reg.items() if k not in demo}
    assert len(real) >= 14
    for slug, entry in real.items():
        assert SAFE_ID.match(slug)
        for key in ("description", "preparer", "kind", "licence", "params", "citation", "expected_under",
                    "how_to_get", "url"):
            assert entry.get(key) not in (None, ""), f"{slug}: {key} missing"
        for f in entry.get("files") or []:
            assert f["url"].startswith("https://")
            assert f.get("sha256") is None or re.fullmatch(r"[0-9a-f]{64}", f["sha256"]), slug
            assert f.get("md5") is None or re.fullmatch(r"[0-9a-f]{32}", f["md5"]), slug
        if entry.get("status") == "pending":  # preparer arrives with a later issue
            continue
        # the registry's params are exactly what the preparer accepts: an empty data_root then fails on
        # the missing data, never on a parameter
        with pytest.raises(FmauditInputError, match="under data_root"):
            prepare_dataset(slug, entry["preparer"], tmp_path, entry["params"])

"""What a data set's groups are: the registry's group_unit, a preparer's group_by, the manifest column."""

import pandas as pd
import pytest

from fmaudit.datasets import GROUP_UNITS, dataset_group_unit, prepare_dataset
from fmaudit.datasets.manifest import make_manifest, validate_manifest
from fmaudit.io import FmauditInputError
from fmaudit.registry import load_dataset_registry

# preparers whose releases identify no patient, slide or biopsy: their intervals are item-level
ITEM_LEVEL = {"nct_crc_he", "mhist", "lc25000", "bloodmnist", "acevedo_pbc", "matek19", "raabin_wbc", "mll23"}


def test_every_registry_entry_says_what_its_groups_are():
    registry = load_dataset_registry()
    for name, entry in registry.items():
        unit = dataset_group_unit(entry)
        assert unit in GROUP_UNITS, name
        assert (unit == "item") == (entry["preparer"] in ITEM_LEVEL), (name, unit)
    assert dataset_group_unit(registry["camelyon17-wilds"]) == "patient"
    assert dataset_group_unit(registry["demo-tiles"]) == "patient"


@pytest.mark.parametrize("dataset, params, unit", [
    ("breakhis", {"group_by": "patient"}, "patient"),
    ("breakhis", {}, "biopsy"),
    ("lunghist700", {"group_by": "image"}, "item"),
    ("camelyon17-wilds", {"group_by": "slide"}, "slide"),
])
def test_a_preparers_group_by_names_the_unit(dataset, params, unit):
    assert dataset_group_unit(load_dataset_registry()[dataset], params) == unit


def test_unknown_and_undeclared_units_are_errors(tmp_path):
    with pytest.raises(FmauditInputError, match="group_by 'ward'"):
        dataset_group_unit({"params": {"group_by": "ward"}})
    with pytest.raises(FmauditInputError, match="without group_unit"):
        dataset_group_unit({"params": {}})
    with pytest.raises(FmauditInputError, match="group_unit 'ward'"):
        prepare_dataset("demo", "demo_tiles", tmp_path, {"n_patients_per_domain": 3, "tiles_per_patient_per_class": 1,
                                                         "n_domains": 1, "image_size": 16}, group_unit="ward")


def test_prepare_dataset_fills_the_unit_and_the_manifest_checks_it(tmp_path):
    params = {"n_patients_per_domain": 3, "tiles_per_patient_per_class": 1, "n_domains": 1, "image_size": 16}
    df = prepare_dataset("demo", "demo_tiles", tmp_path, params, group_unit="patient")
    assert (df["group_unit"] == "patient").all()
    assert "group_unit" not in prepare_dataset("demo", "demo_tiles", tmp_path, params).columns
    bad = make_manifest(pd.DataFrame(df).assign(group_unit="patients"))
    with pytest.raises(FmauditInputError, match="row 0 has group_unit 'patients'"):
        validate_manifest(bad)

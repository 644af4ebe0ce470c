"""The data jobs: a manifest with its provenance and log; a download of an entry without files says how to get it."""

import pytest

from fmaudit.io import FmauditInputError, read_provenance, read_table

from .conftest import DEMO_ENTRY


def test_manifest_job_writes_the_manifest_with_provenance_and_a_log(job_chain):
    man = read_table(job_chain["manifest"])
    assert len(man) == 5 * 2 * 4 * 2  # classes x domains x patients x tiles
    assert set(man["domain"]) == {"scanner-a", "scanner-b"}
    prov = read_provenance(job_chain["manifest"])
    assert prov["dataset"] == "demo-tiles" and prov["params"] == DEMO_ENTRY["params"]
    assert "manifest of demo-tiles: 80 items" in (job_chain["logs"] / "manifest.log").read_text()
    assert (man["group_unit"] == "patient").all()  # from the registry entry: the demo's groups are patients


def test_download_job_of_an_entry_without_files_fails_with_its_how_to_get(tmp_path):
    from fmaudit.jobs.data import download_job

    entry = {"preparer": "x", "params": {}, "how_to_get": "Register on the portal, then unzip in data_root."}
    with pytest.raises(FmauditInputError, match="Register on the portal"):
        download_job("portal-only", entry, str(tmp_path / "data"), str(tmp_path / "done.json"))
    assert not (tmp_path / "done.json").exists()

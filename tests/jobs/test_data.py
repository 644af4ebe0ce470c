"""The data jobs: a manifest with its provenance and log; a download of an entry without files says how to get it."""

import pytest

from fmaudit.io import FmauditInputError, read_provenance, read_table
from fmaudit.preflight import DataChecks

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


def _leaky_copy(job_chain, tmp_path, move_group=None, drop_class=None):
    """A copy of the job chain's manifest with one item of a group moved to another split, or a class removed
    from one domain's training split."""
    from fmaudit.io import write_table

    man = read_table(job_chain["manifest"])
    if move_group is not None:
        rows = man.index[man["group"] == move_group]
        man.loc[rows[0], "split"] = "test" if man.loc[rows[1], "split"] != "test" else "train"
    if drop_class is not None:
        domain, name = drop_class
        man = man[~((man["domain"] == domain) & (man["split"] == "train") & (man["label_name"] == name))]
    out = tmp_path / "manifests" / "demo-tiles.parquet"
    write_table(out, man)
    return out


def test_validate_job_writes_every_check_when_the_splits_are_sound(job_chain, tmp_path):
    from fmaudit.jobs.data import validate_job

    from .conftest import TASK

    out = tmp_path / "validation" / "preflight.tsv"
    checks = DataChecks({"demo-tiles": str(job_chain["manifest"])}, {"demo": TASK})
    validate_job(checks.as_params(), str(out), log=str(tmp_path / "v.log"))
    report = read_table(out)
    assert list(report.columns) == ["task", "check", "scope", "status", "detail"]
    # 4 patients per domain leave 1 or 2 for testing: warnings of the test_groups check, nothing else
    assert set(report["status"]) <= {"ok", "warning"} and len(report) >= 8
    assert set(report.loc[report["status"] == "warning", "check"]) <= {"test_groups"}
    assert {"group_disjoint", "evaluated_classes", "label_range", "duplicate_files"} <= set(report["check"])
    assert "checks passed" in (tmp_path / "v.log").read_text()


def test_validate_job_names_the_leaking_group_and_both_splits(job_chain, tmp_path):
    from fmaudit.jobs.data import validate_job
    from fmaudit.split_checks import SplitValidationError

    from .conftest import TASK

    man = read_table(job_chain["manifest"])
    group = man["group"].iloc[0]
    manifest = _leaky_copy(job_chain, tmp_path, move_group=group)
    out = tmp_path / "splits.tsv"
    with pytest.raises(SplitValidationError, match=rf"{manifest}.*leakage\): '{group}' on test \(1 items\) and "
                                                   rf"train \(\d+ items\)"):
        validate_job(DataChecks({"demo-tiles": str(manifest)}, {"demo": TASK}).as_params(), str(out),
                     log=str(tmp_path / "v.log"))
    assert not out.exists()
    assert "group_disjoint" in (tmp_path / "v.log").read_text()  # every check, in the log


def test_validate_job_stops_on_a_class_missing_from_training_unless_allowed(job_chain, tmp_path):
    from fmaudit.jobs.data import validate_job
    from fmaudit.split_checks import SplitValidationError

    from .conftest import TASK

    manifest = _leaky_copy(job_chain, tmp_path, drop_class=("scanner-a", "mucus"))
    out = tmp_path / "splits.tsv"
    with pytest.raises(SplitValidationError, match=r"class 'mucus' \(label 4\) is evaluated on the test split of "
                                                   r"domain 'scanner-a' but absent from the train split of domain "
                                                   r"'scanner-a'"):
        validate_job(DataChecks({"demo-tiles": str(manifest)}, {"demo": TASK}).as_params(), str(out))
    allowed = {"demo": {**TASK, "allow_missing_classes": ["mucus"]}}
    validate_job(DataChecks({"demo-tiles": str(manifest)}, allowed).as_params(), str(out))
    report = read_table(out)
    assert set(report.loc[report["status"] == "allowed", "check"]) == {"evaluated_classes"}


def test_download_job_records_every_files_sha256_in_its_done_marker(tmp_path):
    import hashlib

    from fmaudit.io import read_json
    from fmaudit.jobs.data import download_job

    src = tmp_path / "mirror" / "annotations.csv"
    src.parent.mkdir()
    src.write_bytes(b"a,b\n1,2\n")
    entry = {"preparer": "x", "params": {}, "files": [{"url": src.as_uri(), "sha256": None, "md5": None}]}
    done = tmp_path / "downloads" / "set.done"
    download_job("set", entry, str(tmp_path / "data"), str(done), log=str(tmp_path / "d.log"))
    marker = read_json(done)
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    assert marker["checksums"] == [{"url": src.as_uri(), "path": str(tmp_path / "data" / "annotations.csv"),
                                    "sha256": sha, "sha256_source": "recorded"}]
    assert sha in (tmp_path / "d.log").read_text()

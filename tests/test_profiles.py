"""The Slurm profile installer: where Snakemake finds it, what it writes, and the site checks (fake sinfo and
sacctmgr on PATH here; tests/cluster/test_slurm.py runs it against a real Slurm)."""

from __future__ import annotations

import getpass
import stat
from pathlib import Path

import pytest
import yaml

from fmaudit.grid import ANALYSES, Analysis, retried_rules
from fmaudit.io import FmauditInputError
from fmaudit.profiles import (
    PARTITIONS_FILE,
    UNKNOWN_GPUS_PER_NODE,
    check_slurm_names,
    default_template,
    install_slurm_profile,
    render_slurm_profile,
    snakemake_profile_dir,
    template_retried_rules,
)


def fake_commands(tmp_path: Path, monkeypatch, **scripts: str) -> Path:
    """Put shell scripts named after Slurm commands first (and alone) on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


SINFO = "printf 'cpu*|(null)\\ncpu*|(null)\\ngpu|gpu:a100:4(S:0-1)\\ngpu|gpu:a100:8(S:0-3),mps:100\\nbig|(null)\\n'"
SACCTMGR = "printf 'lab_a\\nLab_B\\n'"


@pytest.fixture
def config_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.chdir(tmp_path)  # Snakemake searches the working directory first
    return home


def test_the_template_retries_the_rules_the_table_of_analyses_says():
    # a new analysis whose jobs can fail for resources is retried once its rule is in the template's list
    assert template_retried_rules(default_template().read_text()) == retried_rules()
    assert set(retried_rules()) == {a.rule for a in ANALYSES.values() if a.rule and a.retried}


def test_retried_rules_follow_the_table():
    table = {**ANALYSES, "toy": Analysis("toy", ANALYSES["probe"].enumerate, ("encoder",), rule="toy_shard"),
             "cheap": Analysis("cheap", ANALYSES["probe"].enumerate, ("encoder",), rule="cheap", retried=False),
             "later": Analysis("later", ANALYSES["probe"].enumerate, ("encoder",))}
    assert retried_rules(table) == [*retried_rules(), "toy_shard"]


def test_the_installed_profile_retries_the_tables_rules_whatever_the_template_lists():
    template = default_template().read_text().replace("  - scratch_reference\n", "")
    assert "scratch_reference" not in template_retried_rules(template)
    files = render_slurm_profile(template, "cpu", "gpu", "lab_a", 4)
    installed = yaml.safe_load(files["config.yaml"])
    assert installed["preemptible-rules"] == retried_rules()
    assert installed["preemptible-retries"] == 2 and installed["retries"] == 0  # the lines around it kept


def test_default_destination_is_where_snakemake_looks_for_named_profiles(config_home, tmp_path, monkeypatch):
    from snakemake.cli import get_profile_dir

    fake_commands(tmp_path, monkeypatch, sinfo=SINFO, sacctmgr=SACCTMGR)
    assert snakemake_profile_dir("slurm") == config_home / "snakemake" / "slurm"
    result = install_slurm_profile(None, "cpu", "gpu", "lab_a")
    assert result.dest == config_home / "snakemake" / "slurm"
    assert result.profile_argument == "slurm"
    found_dir, found_file = get_profile_dir("slurm")  # Snakemake's own lookup of `--profile slurm`
    assert Path(found_dir) == result.dest and Path(found_file) == result.dest / "config.yaml"


def test_installed_profile_reads_back_through_snakemakes_profile_parser(config_home, tmp_path, monkeypatch):
    from snakemake.profiles import ProfileConfigFileParser

    fake_commands(tmp_path, monkeypatch, sinfo=SINFO, sacctmgr=SACCTMGR)
    result = install_slurm_profile(None, "cpu", "gpu", "lab_a")
    with open(result.dest / "config.yaml") as fh:
        parsed = ProfileConfigFileParser().parse(fh)
    assert "slurm_account=lab_a" in parsed["default-resources"]
    assert parsed["slurm-partition-config"] == str(result.dest / PARTITIONS_FILE)  # resolved in the profile dir
    assert parsed["preemptible-rules"] == retried_rules()  # the table of analyses' retried rules
    assert parsed["retries"] == "0" and parsed["preemptible-retries"] == "2"
    partitions = yaml.safe_load((result.dest / PARTITIONS_FILE).read_text())["partitions"]
    assert partitions == {"cpu": {"max_gpu": 0}, "gpu": {"max_gpu": 8}}
    # the site names live in one place each, and the template has none
    config = yaml.safe_load((result.dest / "config.yaml").read_text())
    assert "slurm_partition" not in config["default-resources"]
    assert not any("slurm_partition" in r or "slurm_account" in r for r in config["set-resources"].values())
    template = yaml.safe_load(default_template().read_text())
    assert "slurm_account" not in template["default-resources"] and "slurm-partition-config" not in template


def test_plugin_routes_gpu_jobs_to_the_gpu_partition(config_home, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file

    fake_commands(tmp_path, monkeypatch, sinfo=SINFO, sacctmgr=SACCTMGR)
    result = install_slurm_profile(None, "cpu", "gpu", "lab_a")
    partitions = read_partition_file(result.dest / PARTITIONS_FILE)

    class Logger:
        def info(self, *a):
            pass

        debug = warning = info

    def job(**resources):
        return SimpleNamespace(name="j", threads=1,
                               resources=SimpleNamespace(get=lambda k, d=None: resources.get(k, d)))

    assert get_best_partition(partitions, job(gpu=1, mem_mb=16000, runtime=240), Logger()) == "gpu"
    assert get_best_partition(partitions, job(mem_mb=4000, runtime=60), Logger()) == "cpu"
    assert get_best_partition(partitions, job(gpu=0, cpus_per_task=2), Logger()) == "cpu"


def test_unknown_names_are_errors_listing_what_the_cluster_has(config_home, tmp_path, monkeypatch):
    fake_commands(tmp_path, monkeypatch, sinfo=SINFO, sacctmgr=SACCTMGR)
    with pytest.raises(FmauditInputError) as e:
        install_slurm_profile(None, "cpus", "gpu", "lab_c")
    text = str(e.value)
    assert "partition 'cpus': unknown (sinfo lists the partitions big, cpu, gpu)" in text
    assert "account 'lab_c': unknown (sacctmgr lists lab_a, lab_b)" in text
    assert "GPU partition" not in text
    assert not (config_home / "snakemake" / "slurm").exists()
    # case as sacctmgr stores it does not matter (the plugin compares in lower case too)
    assert install_slurm_profile(None, "cpu", "gpu", "LAB_B").dest.exists()


def test_gpu_partition_without_gpus_is_a_warning(tmp_path, monkeypatch):
    fake_commands(tmp_path, monkeypatch, sinfo=SINFO, sacctmgr=SACCTMGR)
    checks, gpus = check_slurm_names("cpu", "big", "lab_a")
    assert [c.status for c in checks] == ["ok", "ok", "warning", "ok"]
    assert "no gpu GRES" in checks[2].detail
    assert gpus == UNKNOWN_GPUS_PER_NODE


def test_names_are_not_checked_where_the_commands_cannot_answer(tmp_path, monkeypatch):
    fake_commands(tmp_path, monkeypatch,
                  sinfo="echo 'slurm_load_partitions: Unable to contact slurm controller' >&2; exit 1",
                  sacctmgr="echo 'You are not running a supported accounting_storage plugin' >&2; exit 1",
                  sshare="exit 0")
    checks, gpus = check_slurm_names("cpu", "gpu", "lab")
    assert [c.status for c in checks] == ["not checked"] * 3
    assert "sinfo failed: slurm_load_partitions: Unable to contact slurm controller" in checks[0].detail
    assert checks[2].detail == ("sacctmgr failed: You are not running a supported accounting_storage plugin; "
                                f"sshare listed no accounts for {getpass.getuser()}")
    fake_commands(tmp_path / "none", monkeypatch)  # no Slurm commands at all
    checks, _ = check_slurm_names("cpu", "gpu", "lab")
    assert "sinfo not found" in checks[0].detail and "sacctmgr not found; sshare not found" in checks[2].detail


def test_refuses_to_overwrite_without_force(config_home, tmp_path, monkeypatch):
    fake_commands(tmp_path, monkeypatch, sinfo=SINFO, sacctmgr=SACCTMGR)
    first = install_slurm_profile(None, "cpu", "gpu", "lab_a")
    with pytest.raises(FmauditInputError, match="a profile is already installed there .*pass --force"):
        install_slurm_profile(None, "cpu", "cpu", "lab_b")
    assert "lab_a" in (first.dest / "config.yaml").read_text()
    install_slurm_profile(None, "cpu", "cpu", "lab_b", force=True)
    assert "slurm_account: lab_b" in (first.dest / "config.yaml").read_text()
    # one partition for both kinds of job: one entry, with its GPUs
    # one partition for both kinds of job: one entry (cpu shows no GPUs in the fake sinfo: the generous bound)
    assert yaml.safe_load((first.dest / PARTITIONS_FILE).read_text())["partitions"] == {
        "cpu": {"max_gpu": UNKNOWN_GPUS_PER_NODE}}


def test_dest_and_no_check(tmp_path, monkeypatch):
    fake_commands(tmp_path, monkeypatch, sinfo="exit 99", sacctmgr="exit 99")
    result = install_slurm_profile(tmp_path / "profiles" / "site", "cpu", "gpu", "123", check=False)
    assert result.profile_argument == str(tmp_path / "profiles" / "site")
    assert [c.status for c in result.checks] == ["not checked"] * 3
    parsed = yaml.safe_load((result.dest / "config.yaml").read_text())
    assert parsed["default-resources"]["slurm_account"] == "123"  # a numeric account stays a string


def test_bad_names_and_bad_templates(tmp_path, monkeypatch):
    fake_commands(tmp_path, monkeypatch)
    with pytest.raises(FmauditInputError, match="--account 'lab a': not a Slurm name"):
        install_slurm_profile(tmp_path / "p", "cpu", "gpu", "lab a", check=False)
    template = default_template().read_text()
    sited = template.replace("default-resources:\n", "default-resources:\n  slurm_account: x\n")
    with pytest.raises(FmauditInputError, match="already names an account or partition"):
        render_slurm_profile(sited, "cpu", "gpu", "lab", 1)
    with pytest.raises(FmauditInputError, match="exactly one top-level 'default-resources:'"):
        render_slurm_profile("executor: slurm\n", "cpu", "gpu", "lab", 1)
    with pytest.raises(FileNotFoundError, match="profile template not found"):
        install_slurm_profile(tmp_path / "p", "cpu", "gpu", "lab", check=False, template=tmp_path / "nope.yaml")


def test_the_sites_gpu_classes_are_written_under_default_resources_and_read_back(tmp_path, monkeypatch):
    from fmaudit.cluster import GpuClass
    from fmaudit.profiles import read_profile

    fake_commands(tmp_path, monkeypatch, sinfo="exit 99", sacctmgr="exit 99")
    result = install_slurm_profile(tmp_path / "site", "cpu", "gpu", "lab", check=False,
                                   gpu_classes="16:,80:a100_80g|h100")
    parsed = yaml.safe_load((result.dest / "config.yaml").read_text())
    assert parsed["default-resources"]["gpu_classes"] == "16:,80:a100_80g|h100"
    assert parsed["default-resources"]["slurm_account"] == "lab"
    settings = read_profile([result.dest])
    assert settings.gpu_classes == (GpuClass(16, ""), GpuClass(80, "a100_80g|h100"))
    assert settings.group_components["cell_features_{encoder}"] >= 1
    with pytest.raises(FmauditInputError, match="gpu_classes '80': '80' is not"):
        install_slurm_profile(tmp_path / "other", "cpu", "gpu", "lab", check=False, gpu_classes="80")
    assert not (tmp_path / "other").exists()

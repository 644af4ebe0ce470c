"""`fmaudit profile install slurm` on the command line (fake sinfo/sacctmgr on PATH)."""

from __future__ import annotations

import stat

from fmaudit.cli import main


def test_install_prints_checks_files_and_the_command_to_use(tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sinfo", "printf 'batch*|(null)\\ngpu|gpu:2\\n'"), ("sacctmgr", "echo mylab")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755 | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.chdir(tmp_path)
    args = ["profile", "install", "slurm", "--partition", "batch", "--gpu-partition", "gpu", "--account", "mylab"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "partition 'batch': ok (sinfo)" in out
    assert "GPU partition 'gpu': ok (sinfo; up to 2 GPU(s) per node)" in out
    assert "account 'mylab': ok (sacctmgr)" in out
    assert f"wrote {tmp_path / 'cfg' / 'snakemake' / 'slurm' / 'config.yaml'}" in out
    assert "use it with: snakemake --profile slurm" in out
    assert main(args) == 2
    assert "pass --force to replace it" in capsys.readouterr().err
    assert main(args[:-1] + ["otherlab", "--force"]) == 2
    assert "account 'otherlab': unknown (sacctmgr lists mylab)" in capsys.readouterr().err

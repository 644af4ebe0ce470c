"""Snakemake's own process killed mid-embedding (a dropped login session), then ``--unlock`` and
``--rerun-incomplete``: the embedding job had gone on and finished, Snakemake deletes its output as incomplete,
and the rerun takes every chunk from the finished copy instead of computing it again. Real Snakemake, a reduced
demo config (one encoder, the demo tiles) in a fresh copy of the repository. And an encoder named by its hub
repo plans like any other, and a checkpoint that does not fit stops the plan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from workflow_utils import SNAKEMAKE, copy_repo, demo_tile_branches, planned_jobs, snakemake

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hub_cache  # noqa: E402

pytestmark = pytest.mark.slow

ENCODER = "demo-vit-tiny"


def reduced_config(work: Path, study: str, encoders: list[str] = (ENCODER,)) -> str:
    cfg = demo_tile_branches(yaml.safe_load((work / "config.yaml").read_text()), list(encoders),
                             drop=("ood", "prior_shift"))
    cfg["datasets"], cfg["study"] = ["demo-tiles"], study
    name = f"{study}.yaml"
    (work / name).write_text(yaml.safe_dump(cfg))
    return name


def embedding_target(work: Path, configfile: str, encoder: str = ENCODER) -> str:
    """The embedding file of the demo tiles, as the workflow names it (its key from the config)."""
    code = ("import sys; from fmaudit.config import load_config; from fmaudit.preflight import check_config; "
            "from fmaudit.registry import "
            "embedding_key; c = load_config(sys.argv[1]); e, _ = check_config(c); "
            "print(f\"results/{c['study']}/embeddings/{sys.argv[2]}/{embedding_key(e[sys.argv[2]])}/demo-tiles.npz\")")
    out = subprocess.run([sys.executable, "-c", code, configfile, encoder], cwd=work, capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(work / "src")})
    return out.stdout.strip()


def descendants(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            out += [child, *descendants(child)]
    return out


def running(pid: int) -> bool:
    try:  # an orphan nobody reaps stays a zombie: it has finished all the same
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def job_log(target: str) -> Path:
    parts = Path(target).parts  # results/<study>/embeddings/<encoder>/<key>/<dataset>.npz
    return Path(*parts[:2], "logs", "embed", *parts[3:5], Path(parts[5]).with_suffix(".log"))


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    work = copy_repo(tmp_path_factory.mktemp("killed"))
    configfile = reduced_config(work, "killed")
    target = embedding_target(work, configfile)
    log = work / job_log(target)
    proc = subprocess.Popen([SNAKEMAKE, target, "--cores", "1", "--configfile", configfile], cwd=work,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not (log.exists() and "embedding 750 items" in log.read_text()):
            assert proc.poll() is None, "snakemake ended before its embedding job started"
            assert time.monotonic() < deadline, "the embedding job never started"
            time.sleep(0.05)
        jobs = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # Snakemake itself, not its job: as a lost login session leaves it
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 300
    while any(running(pid) for pid in jobs):  # the orphaned job goes on and finishes its embedding
        assert time.monotonic() < deadline, "the orphaned embedding job did not finish"
        time.sleep(0.1)
    first_log = log.read_text()
    stuck = snakemake(work, target, "--cores", "1", "--configfile", configfile, check=False)
    snakemake(work, "--unlock", "--configfile", configfile)
    rerun = snakemake(work, target, "--cores", "1", "--configfile", configfile, "--rerun-incomplete")
    return work, target, first_log, stuck, rerun, log.read_text()


def test_the_rerun_reuses_every_chunk_the_killed_run_finished(killed_run):
    work, target, first_log, stuck, rerun, rerun_log = killed_run
    assert "chunk 00002: computed" in first_log and "wrote" in first_log  # the orphaned job did finish
    # Snakemake saw its own run cut off: the output is incomplete (or the directory still locked)
    assert stuck.returncode != 0 and ("Incomplete" in stuck.stdout + stuck.stderr
                                      or "cannot be locked" in stuck.stdout + stuck.stderr)
    assert "Finished jobid" in rerun.stdout + rerun.stderr  # the embedding job ran again ...
    assert "750 items in 3 chunk(s) of 256; 0 to compute, 3 reused" in rerun_log  # ... and computed nothing
    assert all(f"chunk {c:05d}: reused from finished.npz" in rerun_log for c in range(3))
    assert "computed" not in rerun_log and (work / target).is_file()


def test_the_result_equals_an_uninterrupted_run(killed_run):
    work, target, *_ = killed_run
    configfile = reduced_config(work, "uninterrupted")
    reference = embedding_target(work, configfile)
    snakemake(work, reference, "--cores", "1", "--configfile", configfile)
    done, ref = np.load(work / target), np.load(work / reference)
    assert done["item_id"].tolist() == ref["item_id"].tolist()
    for key in ref.files:
        if key.startswith("feat__"):
            np.testing.assert_array_equal(done[key], ref[key])


def test_an_encoder_named_by_its_hub_repo_plans_like_any_other(killed_run, tmp_path, monkeypatch):
    work = killed_run[0]
    cache = tmp_path / "hf" / "hub"
    hub_cache.add_to_cache(cache, "fmaudit-test/tiny-vit", hub_cache.timm_export(tmp_path / "export"))
    hub_cache.use_cache(monkeypatch, cache)  # Snakemake's environment: the cache, no downloads
    configfile = reduced_config(work, "hubname", encoders=[ENCODER, "timm:fmaudit-test/tiny-vit"])
    dry = snakemake(work, "-n", "--configfile", configfile)
    jobs = planned_jobs(dry.stdout)
    assert jobs["embed"] == 2
    assert "results/hubname/embeddings/timm--fmaudit-test--tiny-vit/" in dry.stdout


def test_weights_that_do_not_fit_stop_snakemake_before_any_job(killed_run, tmp_path):
    """The pre-flight runs where the workflow plans its jobs: a local checkpoint of another architecture stops
    even a dry run, naming the file and the config key, before the validate stage or any embedding."""
    work = killed_run[0]
    code = ("import sys; from fmaudit.encoders import build_encoder, save_weights; "
            "save_weights(build_encoder('demo-convnet'), sys.argv[1])")
    weights = tmp_path / "convnet.safetensors"
    subprocess.run([sys.executable, "-c", code, str(weights)], check=True,
                   env={**os.environ, "PYTHONPATH": str(work / "src")})
    configfile = reduced_config(work, "badweights")
    cfg = yaml.safe_load((work / configfile).read_text())
    cfg["encoder_weights"] = {ENCODER: str(weights)}
    (work / configfile).write_text(yaml.safe_dump(cfg))
    proc = snakemake(work, "-n", "--configfile", configfile, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "pre-flight of the encoders failed, before any embedding job" in out
    assert f"the weights in {weights} (config 'encoder_weights.{ENCODER}') do not fit the architecture" in out

"""What the cluster is asked for (fmaudit.cluster): the cost model's requests from the registry and a job's items,
measurements of an earlier run taking over, GPU classes, the estimate of a whole plan and the group names the rules
and the Slurm profile share."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fmaudit.cluster import (
    DEFAULT_SECTION,
    DEFAULT_TILES,
    GROUP_PATTERNS,
    MEASURED_MARGIN,
    MIN_RUNTIME_MIN,
    GpuClass,
    JobRequest,
    RequestPlanner,
    SectionExtent,
    encoder_cost,
    estimate,
    estimate_table,
    gpu_class,
    parse_gpu_classes,
    planned_requests,
    read_benchmarks,
    section_extent,
    section_patches,
    submissions,
)
from fmaudit.config import load_config
from fmaudit.io import FmauditInputError, write_table
from fmaudit.preflight import check_config
from fmaudit.profiles import read_profile
from fmaudit.registry import get_encoder_spec, load_registry

REPO = Path(__file__).resolve().parents[1]
REGISTRY = load_registry()


def spec(name: str) -> dict:
    return get_encoder_spec(name, REGISTRY)


def cell_manifest(path: Path, n: int, width_px: float, height_px: float, mpp: float = 0.5) -> Path:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"item_id": [f"c{i}" for i in range(n)], "he_x": rng.uniform(0, width_px, n),
                          "he_y": rng.uniform(0, height_px, n), "mpp": mpp})
    frame.loc[0, ["he_x", "he_y"]] = 0.0
    frame.loc[1, ["he_x", "he_y"]] = (width_px, height_px)
    write_table(path, frame)
    return path


# ---- the cost model ---------------------------------------------------------------------------------------

def test_a_larger_encoder_asks_for_more_time_and_memory():
    small, large = encoder_cost("kaiko-vits16", spec("kaiko-vits16")), encoder_cost("h-optimus-0", spec("h-optimus-0"))
    assert small.tokens == (224 // 16) ** 2 + 1
    assert large.tokens == (224 // 14) ** 2 + spec("h-optimus-0")["num_prefix_tokens"]  # class and register tokens
    assert large.flops_per_image > 30 * small.flops_per_image
    assert large.gpu_memory_mb(64) > 2 * small.gpu_memory_mb(64) and large.load_s > small.load_s
    planner = RequestPlanner({n: spec(n) for n in ("kaiko-vits16", "h-optimus-0")})
    a, b = (planner.cell_features(n, "missing.parquet", [40, 20, 10], threads=8)
            for n in ("kaiko-vits16", "h-optimus-0"))
    assert b.mem_mb > a.mem_mb and b.runtime_min > a.runtime_min and a.gpus == b.gpus == 1
    assert a.basis == b.basis == "default"  # no manifest: the stated default section
    assert a.items == sum(section_patches(DEFAULT_SECTION, m, 224) for m in (40, 20, 10))


def test_a_cpu_only_entry_asks_for_no_gpu_and_the_floor_of_time():
    planner = RequestPlanner({"demo-vit-tiny": spec("demo-vit-tiny")})
    request = planner.embed("demo-vit-tiny", "missing.parquet", threads=1)
    assert request.gpus == 0 and request.gpu_mem_mb == 0 and request.items == DEFAULT_TILES
    assert request.runtime_min >= MIN_RUNTIME_MIN and request.at(3) == (3 * request.mem_mb, 3 * request.runtime_min)
    assert planner.gpu_constraint("demo-vit-tiny") is None


def test_an_entry_without_params_m_is_an_error_naming_it():
    entry = {k: v for k, v in spec("uni").items() if k != "params_m"}
    with pytest.raises(FmauditInputError, match="encoder 'mine': the registry entry has no params_m"):
        encoder_cost("mine", entry)


def test_every_registry_entry_has_a_cost():
    for name in REGISTRY:
        cost = encoder_cost(name, spec(name))
        assert cost.params > 0 and cost.tokens > 1 and cost.flops_per_image > 0, name


# ---- items -------------------------------------------------------------------------------------------------

def test_a_section_extent_comes_from_the_manifest_metadata(tmp_path):
    path = cell_manifest(tmp_path / "s.parquet", 500, 4000.0, 2000.0, mpp=0.5)
    extent = section_extent(path)
    assert extent.cells == 500 and extent.source == str(path)
    assert extent.width_um == pytest.approx(2000.0) and extent.height_um == pytest.approx(1000.0)
    assert section_extent(tmp_path / "none.parquet") is None
    # patches: the grid of the bounding box at each magnification, never more than the cells
    side40 = 224 * 10 / 40
    assert section_patches(extent, 40, 224) == min(500, math.ceil(2000 / side40) * math.ceil(1000 / side40))
    assert section_patches(extent, 10, 224) < section_patches(extent, 40, 224) <= 500
    one = SectionExtent(3, 0.0, 0.0, "x")
    assert section_patches(one, 40, 224) == 1


def test_requests_follow_the_section_size(tmp_path):
    planner = RequestPlanner({"uni": spec("uni")})
    small = planner.cell_features("uni", cell_manifest(tmp_path / "a.parquet", 2000, 2000.0, 2000.0), [40], 8)
    large = planner.cell_features("uni", cell_manifest(tmp_path / "b.parquet", 200_000, 60000.0, 60000.0), [40], 8)
    assert small.basis == large.basis == "model" and large.items > 10 * small.items
    assert large.runtime_min > small.runtime_min


# ---- measurements of an earlier run ------------------------------------------------------------------------

def benchmark(path: Path, seconds: float, max_rss: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
                    f"{seconds}\t0:00:01\t{max_rss}\t1\t1\t1\t0\t0\t0\t1\n")


def test_benchmarks_of_an_earlier_run_size_the_next(tmp_path):
    sections = tmp_path / "cells" / "sections"
    manifest = cell_manifest(sections / "s1.parquet", 200_000, 80000.0, 80000.0)
    cell_manifest(sections / "s0.parquet", 200_000, 80000.0, 80000.0)
    bench = tmp_path / "benchmarks"
    planner = RequestPlanner({"uni": spec("uni")}, benchmarks=bench)
    modelled = planner.cell_features("uni", manifest, [20], 8)
    predicted_s = planner._cell_seconds("uni", planner.extent(manifest), [20], 8)[0]
    # the measured section ran 3x slower than the model and peaked at 9,000 MB
    benchmark(bench / "cell_features" / "uni" / "abc" / "s0.tsv", 3 * predicted_s, 9000.0)
    benchmark(bench / "cell_features" / "uni" / "abc" / "s2.tsv", float("nan"), float("nan"))  # NA: ignored
    measured = RequestPlanner({"uni": spec("uni")}, benchmarks=bench).cell_features("uni", manifest, [20], 8)
    assert measured.basis == "measured" and modelled.basis == "model"
    assert measured.runtime_min == math.ceil(3 * predicted_s * MEASURED_MARGIN / 60) > modelled.runtime_min
    assert measured.mem_mb == math.ceil(9000 * MEASURED_MARGIN / 1000) * 1000
    # shards: their measured peak and time plus the margin, else the rule's default
    benchmark(bench / "cell_shard" / "uni" / "IS" / "40x.tsv", 1200.0, 2500.0)
    shard = RequestPlanner({"uni": spec("uni")}, benchmarks=bench).shard("cell_shard", "uni")
    assert (shard.mem_mb, shard.runtime_min, shard.basis) == (4000, 26, "measured")
    assert RequestPlanner({"uni": spec("uni")}).shard("cell_shard", "uni") == JobRequest(4000, 60, 0, 0, "default")
    rows = read_benchmarks(bench / "cell_features" / "uni")
    assert [job for job, _, _ in rows.jobs] == ["abc/s0", "abc/s2"] and rows.peak_mb == 9000.0


# ---- GPU classes -------------------------------------------------------------------------------------------

def test_gpu_classes_pick_the_smallest_card_that_holds_the_encoder():
    classes = parse_gpu_classes("80:a100_80g|h100, 16:,40:a100")
    assert classes == (GpuClass(16, ""), GpuClass(40, "a100"), GpuClass(80, "a100_80g|h100"))
    assert gpu_class(10_000, classes).constraint == "" and gpu_class(30_000, classes).constraint == "a100"
    assert gpu_class(500_000, classes).memory_gb == 80  # none holds it: the largest
    assert gpu_class(0, classes) is None and gpu_class(10_000, ()) is None and parse_gpu_classes("") == ()
    for bad in ("80", "x:a100", "40:a100;80:h100", "-4:a"):
        with pytest.raises(FmauditInputError, match="gpu_classes"):
            parse_gpu_classes(bad)
    planner = RequestPlanner({n: spec(n) for n in ("kaiko-vits16", "h-optimus-0")},
                             gpu_classes=parse_gpu_classes("2:small,80:big"))
    assert planner.gpu_constraint("kaiko-vits16") == "small" and planner.gpu_constraint("h-optimus-0") == "big"


# ---- the estimate ----------------------------------------------------------------------------------------------

def test_a_group_submission_asks_for_its_jobs_in_sequence():
    jobs = [{"rule": "cell_features", "encoder": "e", "job": f"s{i}", "group": "cell_features_e",
             "pattern": "cell_features_{encoder}", "threads": 8, "request": JobRequest(5000 + i, 10 * (i + 1), 1)}
            for i in range(5)]
    table = estimate_table(jobs, {"cell_features_{encoder}": 2})
    row = table.iloc[0]
    assert (row["jobs"], row["submissions"], row["gpus"], row["cpus"]) == (5, 3, 1, 8)
    assert row["runtime_min_submission_max"] == 50 + 40 and row["mem_mb_max"] == 5004
    assert row["gpu_hours"] == pytest.approx(150 / 60) and row["cpu_hours"] == pytest.approx(8 * 150 / 60)
    assert submissions(5, 1) == 5 and submissions(0, 4) == 0 and submissions(9, 9) == 1
    assert table.iloc[-1]["rule"] == "all" and table.iloc[-1]["submissions"] == 3


def test_the_cellpath_plan_asks_for_at_most_100_gpu_submissions_sized_by_encoder(tmp_path):
    config = load_config(REPO / "resources" / "presets" / "cellpath.yaml")
    encoders, datasets = check_config(config)
    settings = read_profile([REPO / "profiles" / "slurm"])
    table = estimate(config, encoders, datasets, settings, tmp_path / "results")
    features = table[(table["rule"] == "cell_features") & (table["encoder"] != "all encoders")]
    assert len(features) == 30 and features["jobs"].eq(25).all()
    total = table[(table["rule"] == "cell_features") & (table["encoder"] == "all encoders")].iloc[0]
    assert total["jobs"] == 750 and total["submissions"] <= 100
    by = features.set_index("encoder")
    assert by.loc["h-optimus-1", "mem_mb_max"] > by.loc["kaiko-vits16", "mem_mb_max"]
    assert by.loc["h-optimus-1", "runtime_min_job_max"] > by.loc["kaiko-vits16", "runtime_min_job_max"]
    assert by.loc["h-optimus-1", "gpu_mem_mb"] > 3 * by.loc["kaiko-vits16", "gpu_mem_mb"]
    # the uniform request it replaces: 2,250 jobs of 240 min each
    assert total["gpu_hours"] < 2250 * 4 / 20


def test_planned_requests_read_the_profile_overrides(tmp_path):
    config = load_config(REPO / "config.yaml")
    encoders, datasets = check_config(config)
    profile = read_profile([REPO / "profiles" / "slurm", REPO / "profiles" / "slurm-test"])
    assert profile.threads == {"embed": 1, "cell_features": 1}
    assert profile.overrides["cell_features"] == {"gpu": 1, "mem_mb": 1000, "runtime": 10}
    jobs = planned_requests(config, encoders, datasets, profile, tmp_path / "results")
    features = jobs[jobs["rule"] == "cell_features"]
    assert len(features) == len(config["encoders"]) * 4  # the demo's four sections, one job each
    assert all(r.mem_mb == 1000 and r.runtime_min == 10 and r.gpus == 1 for r in features["request"])
    assert set(jobs.loc[jobs["rule"] == "embed", "group"]) == {f"embed_{e}" for e in config["encoders"]}
    assert not {"validate", "aggregate_probe", "report"} & set(jobs["rule"])  # localrules never go to the cluster


def test_read_profile_layers_names_and_lists(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.yaml").write_text(yaml.safe_dump({
        "group-components": ["embed_{encoder}=3"], "set-threads": {"embed": 4},
        "default-resources": ["mem_mb=attempt * 4000", "gpu_classes=40:a100"],
        "set-resources": {"embed": {"runtime": "attempt * 30", "slurm_extra": "'--qos=x'"}}}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.yaml").write_text(yaml.safe_dump({"set-threads": {"embed": 2}}))
    settings = read_profile([tmp_path / "a", tmp_path / "b"])
    assert settings.group_components == {"embed_{encoder}": 3} and settings.threads == {"embed": 2}
    assert settings.overrides == {"embed": {"runtime": 30.0}} and settings.gpu_classes == (GpuClass(40, "a100"),)
    with pytest.raises(FmauditInputError, match="profile 'nowhere-xyz'"):
        read_profile(["nowhere-xyz"])


# ---- one name for each group: the rules, the profile and the estimate --------------------------------------------

def test_the_rules_and_the_profile_name_the_groups_of_the_table():
    groups = {}
    for path in sorted((REPO / "rules").glob("*.smk")):
        text = path.read_text()
        for rule, body in re.findall(r"^rule (\w+):\n((?:    .*\n|\n)+)", text, re.MULTILINE):
            match = re.search(r"^    group:\n        \"([^\"]+)\"", body, re.MULTILINE)
            if match:
                groups[rule] = match.group(1)
    assert groups == GROUP_PATTERNS
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert set(profile["group-components"]) == set(GROUP_PATTERNS.values())
    assert profile["resources"] == {"group_slot": 1} and profile["set-resource-scopes"] == {"group_slot": "local"}
    assert profile["default-resources"]["group_slot"] == 1
    assert profile["cores"] >= max(profile["set-threads"].values())


def test_cli_estimate(capsys):
    from fmaudit.cli import main

    assert main(["grid", "--configfile", str(REPO / "resources" / "presets" / "cellpath.yaml"), "--estimate"]) == 0
    out = capsys.readouterr().out
    assert "submissions for" in out and "GPU-hours" in out and "cell_features" in out

"""What a study cost, from Snakemake benchmark files: parsing, GPU counts from the plan, sums per rule and encoder,
the command line, and the estimate of a config before it runs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fmaudit import costs
from fmaudit.cli import main
from fmaudit.config import fill_config, load_config
from fmaudit.io import FmauditInputError
from fmaudit.preflight import check_config

REPO = Path(__file__).resolve().parents[1]
HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def bench(root: Path, rel: str, s: float, cpu: float, rss: float | str = 500.0, repeats: int = 1) -> Path:
    path = root / "benchmarks" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        HEADER + "".join(f"{s}\t0:00:{int(s):02d}\t{rss}\t900\t400\t450\t0\t1\t50\t{cpu}\n" for _ in range(repeats))
    )
    return path


@pytest.fixture
def study(tmp_path):
    root = tmp_path / "results" / "s"
    bench(root, "embed/enc-gpu/abc123abc123/d.tsv", 3600.0, 1800.0, 2000.0)
    bench(root, "embed/enc-cpu/def456def456/d.tsv", 720.0, 700.0)
    bench(root, "probe_shard/t/enc-gpu.tsv", 36.0, 30.0, repeats=2)
    bench(root, "probe_shard/t/enc-cpu.tsv", 72.0, 60.0)
    bench(root, "prepare_manifest/d.tsv", 10.0, 9.0, rss="NA")
    bench(root, "scratch_reference/t/a/seed0.tsv", 1800.0, 1000.0)
    bench(root, "some_new_rule/x/y.tsv", 5.0, 4.0)  # a rule another branch adds: still counted
    return root


PLAN = {
    "embed": {"enc-gpu": 1, "enc-cpu": 0},
    "cell_features": {"enc-gpu": 1, "enc-cpu": 0},
    "scratch_reference": {"t": 1},
}


def test_job_costs_charge_gpu_hours_by_the_plan(study):
    jobs = costs.job_costs(costs.find_benchmarks(study), PLAN)
    by = jobs.set_index("job")
    assert by.loc["enc-gpu/abc123abc123/d", "gpus"] == 1 and by.loc["enc-gpu/abc123abc123/d", "gpu_hours"] == 1.0
    assert by.loc["enc-cpu/def456def456/d", "gpu_hours"] == 0.0
    assert by.loc["t/a/seed0", "gpu_hours"] == 0.5 and by.loc["t/a/seed0", "encoder"] == ""
    assert by.loc["t/enc-gpu", "wall_s"] == 72.0 and by.loc["t/enc-gpu", "repeats"] == 2  # repeats are summed
    assert np.isnan(by.loc["d", "max_rss_mb"])  # NA stays unknown
    assert by.loc["x/y", "rule"] == "some_new_rule" and by.loc["x/y", "encoder"] == ""
    assert (
        by.loc["enc-gpu/abc123abc123/d", "dataset"] == "d" and by.loc["enc-gpu/abc123abc123/d", "key"] == "abc123abc123"
    )


def test_without_a_plan_gpu_hours_are_unknown_not_zero(study):
    jobs = costs.job_costs(costs.find_benchmarks(study))
    assert jobs["gpus"].isna().all()
    assert np.isnan(costs.cost_by(jobs, "rule").set_index("rule").loc["total", "gpu_hours"])


def test_sums_per_rule_and_per_encoder_add_up_to_the_files(study):
    files = costs.find_benchmarks(study)
    jobs = costs.job_costs(files, PLAN)
    total_cpu = sum(pd.read_csv(f, sep="\t")["cpu_time"].sum() for f in files) / 3600
    for key in ("rule", "encoder"):
        table = costs.cost_by(jobs, key).set_index(key)
        assert table.loc["total", "cpu_hours"] == pytest.approx(total_cpu)
        assert table.drop(index="total")["cpu_hours"].sum() == pytest.approx(total_cpu)
        assert table.loc["total", "gpu_hours"] == pytest.approx(1.0 + 0.5)
        assert table.loc["total", "jobs"] == len(files)
    by_encoder = costs.cost_by(jobs, "encoder").set_index("encoder")
    assert by_encoder.loc["(no encoder)", "jobs"] == 3 and by_encoder.loc["enc-gpu", "peak_rss_mb"] == 2000.0


def test_bad_benchmark_files_name_the_file(tmp_path):
    bad = tmp_path / "benchmarks" / "embed" / "e" / "k" / "d.tsv"
    bad.parent.mkdir(parents=True)
    bad.write_text("wall\tcpu\n1\t2\n")
    with pytest.raises(FmauditInputError, match=r"d\.tsv: a Snakemake benchmark file needs the columns s, max_rss"):
        costs.job_costs([bad])
    with pytest.raises(FmauditInputError, match="no benchmark folder"):
        costs.find_benchmarks(tmp_path / "nothing")


def test_the_cost_command_prints_per_rule_cpu_hours_that_sum_to_the_files(study, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no config.yaml here: GPU-hours unknown
    assert main(["cost", "--results", str(study)]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours: n/a" in out
    block = out.split("Per rule:")[1].split("Per encoder:")[0]
    rows = [line.split() for line in block.strip().splitlines()[1:]]
    printed = {r[0]: float(r[2]) for r in rows}
    files = costs.find_benchmarks(study)
    total = sum(pd.read_csv(f, sep="\t")["cpu_time"].sum() for f in files) / 3600
    assert printed["total"] == pytest.approx(total, abs=5e-7)
    parts = [v for k, v in printed.items() if k != "total"]
    assert sum(parts) == pytest.approx(total, abs=5e-7 * len(parts))
    assert set(printed) == {"embed", "probe_shard", "prepare_manifest", "scratch_reference", "some_new_rule", "total"}


def test_benchmark_paths_match_the_rules():
    """Every rule with a benchmark: directive is in BENCHMARK_PATHS with the same wildcards, in the same order."""
    found = {}
    for smk in (REPO / "rules").glob("*.smk"):
        text = smk.read_text()
        for rule, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", text, flags=re.S | re.M):
            m = re.search(r"benchmark:\s*\n\s*f\"\{RESULTS\}/benchmarks/(\w+)/(.*?)\.tsv\"", body)
            if m:
                assert m.group(1) == rule, f"{smk.name}: rule {rule} writes its benchmark under {m.group(1)}/"
                found[rule] = m.group(2).replace("{{", "{").replace("}}", "}")
    assert found == costs.BENCHMARK_PATHS


def test_gpu_plan_follows_the_registry_and_the_rules_request_it():
    config = fill_config(load_config(REPO / "config.yaml"))
    encoders, _ = check_config(config)
    encoders = {**encoders, "demo-convnet": {**encoders["demo-convnet"], "gpu": True}}
    plan = costs.gpu_plan(config, encoders, {"demo-tissue": {"scratch_reference": {"gpu": True}}})
    assert plan["embed"]["demo-convnet"] == 1 and plan["embed"]["demo-vit-tiny"] == 0
    assert costs.job_gpus(plan, "cell_features", {"encoder": "demo-convnet"}) == 1
    assert costs.job_gpus(plan, "scratch_reference", {"task": "demo-tissue"}) == 1
    assert costs.job_gpus(plan, "probe_shard", {"encoder": "demo-convnet"}) == 0
    common = "\n".join(p.read_text() for p in sorted((REPO / "rules").glob("*.smk")))
    assert 'job_gpus(GPU_PLAN, "embed", wildcards)' in common and 'job_gpus(GPU_PLAN, "scratch_reference"' in common


def test_planned_units_count_the_demo_grid():
    from fmaudit import grid

    config = load_config(REPO / "config.yaml")
    _, datasets = check_config(config)
    planned = costs.planned_units(config, datasets, {"demo-tiles": 750})
    counts = planned.groupby("rule").size()
    summary = grid.summarize(config, datasets)
    jobs = summary.groupby("analysis")["jobs"].sum()
    assert counts["probe_shard"] == jobs["probe"] and counts["prior_shift_shard"] == jobs["prior_shift"]
    assert counts["cell_shard"] + counts["cell_features"] == jobs["cells"]  # the summary counts feature jobs there
    probe = planned[planned["rule"] == "probe_shard"]
    assert (probe["units"] == len(grid.probe_runs(config)) / len(probe)).all() and (probe["unit"] == "run").all()
    embed = planned[planned["rule"] == "embed"]
    assert (embed.loc[embed["dataset"] == "demo-tiles", "units"] == 750).all()
    assert embed.loc[embed["dataset"] != "demo-tiles", "units"].isna().all()  # not counted yet
    # a cell-feature job embeds its section at every magnification: two magnifications, twice the work, same jobs
    features = planned[planned["rule"] == "cell_features"]
    assert (features["units"] == 1).all() and (features["unit"] == "magnification").all()
    config["cells"]["magnifications"] = [10, 20]
    twice = costs.planned_units(config, datasets, {"demo-tiles": 750})
    assert len(twice[twice["rule"] == "cell_features"]) == len(features)
    assert (twice.loc[twice["rule"] == "cell_features", "units"] == 2).all()


def test_estimate_scales_measured_rates_and_says_where_they_come_from():
    planned = pd.DataFrame(
        [
            {"rule": "probe_shard", "encoder": "e1", "task": "t", "units": 100.0, "unit": "run"},
            {"rule": "probe_shard", "encoder": "e2", "task": "t", "units": 50.0, "unit": "run"},
            {"rule": "embed", "encoder": "e1", "dataset": "d", "units": 1000.0, "unit": "image"},
            {"rule": "embed", "encoder": "e2", "dataset": "d", "units": np.nan, "unit": "image"},
        ]
    )
    rates = pd.DataFrame(
        [
            {"rule": "probe_shard", "encoder": "*", "wall_s_per_unit": 36.0, "cpu_s_per_unit": 18.0, "source": "pilot"},
            {"rule": "embed", "encoder": "e1", "wall_s_per_unit": 3.6, "cpu_s_per_unit": 1.8, "source": "pilot"},
            {"rule": "embed", "encoder": "*", "wall_s_per_unit": 3.6, "cpu_s_per_unit": 1.8, "source": "pilot"},
        ]
    )
    plan = {"embed": {"e1": 1, "e2": 1}}
    table = costs.estimate_cost(planned, rates, plan).set_index(["rule", "encoder"])
    assert table.loc[("probe_shard", "e1"), "wall_hours"] == pytest.approx(1.0)
    assert table.loc[("probe_shard", "e2"), "cpu_hours"] == pytest.approx(0.25)
    assert "mean over the measured encoders" in table.loc[("probe_shard", "e1"), "rate_from"]
    assert table.loc[("embed", "e1"), "gpu_hours"] == pytest.approx(1.0)
    assert "measured on this encoder" in table.loc[("embed", "e1"), "rate_from"]
    assert np.isnan(table.loc[("embed", "e2"), "wall_hours"]) and "unknown size" in table.loc[("embed", "e2"), "note"]
    assert list(costs.estimate_cost(planned, rates, plan).columns) == list(costs.ESTIMATE_COLUMNS)


def test_unit_costs_from_measured_jobs(study):
    jobs = costs.job_costs(costs.find_benchmarks(study), PLAN)
    units = {("probe_shard", "t/enc-gpu"): 10.0, ("probe_shard", "t/enc-cpu"): 30.0}
    rates = costs.unit_costs(jobs, units, source="test").set_index(["rule", "encoder"])
    assert rates.loc[("probe_shard", "enc-gpu"), "wall_s_per_unit"] == pytest.approx(7.2)
    assert rates.loc[("probe_shard", "*"), "wall_s_per_unit"] == pytest.approx((72 + 72) / 40)


def test_grid_estimate_prints_the_predicted_cost_of_a_config(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # the config's relative paths (registries, slide sheet)
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["study"] = "estimate-test-no-manifests"  # nothing prepared: embedding sizes unknown
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    rates = tmp_path / "rates.csv"
    pd.DataFrame(
        [{"rule": "probe_shard", "encoder": "*", "wall_s_per_unit": 36.0, "cpu_s_per_unit": 36.0, "source": "planted"}]
    ).to_csv(rates, index=False)
    assert (
        main(["grid", "--estimate", "--configfile", str(tmp_path / "config.yaml"), "--measured-costs", str(rates)]) == 0
    )
    out = capsys.readouterr().out
    assert "asks of the cluster" in out  # the requests first (tests/test_cluster.py), then the predicted cost
    predicted = out[out.index("Predicted cost of"):]
    probe = [line.split() for line in predicted.splitlines() if line.strip().startswith("probe_shard")]
    assert len(probe) == 4 and all(r[3] == "12" and r[5] == "0.12" for r in probe)  # 12 runs x 36 s
    assert "[1] the rule's mean over the measured encoders (planted)" in out
    assert "no measured job of this rule" in out  # embed: no rate planted


def test_the_committed_measured_costs_are_readable_and_say_where_they_come_from():
    table = costs.read_unit_costs(REPO / "benchmarks" / "measured_costs.csv")
    assert set(table["encoder"]) == {"*"} and table["source"].str.contains("demo").all()
    assert {"embed", "probe_shard", "ood_shard", "prior_shift_shard"} <= set(table["rule"])

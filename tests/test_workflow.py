"""The demo config end to end through real Snakemake, in a fresh copy of the repository."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
import yaml

from workflow_utils import copy_repo, planned_jobs, snakemake

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    work = copy_repo(tmp_path_factory.mktemp("demo"))
    proc = snakemake(work, "--cores", "2")
    return work, proc


def test_demo_produces_report_showing_acquisition_shift(demo_run):
    work, _ = demo_run
    report = work / "results" / "report"
    for rel in ("index.md", "tables/leaderboard.csv", "tables/leaderboard.md", "tables/leaderboard.tex",
                "tables/calibration.csv", "tables/embeddings.csv", "figures/reliability.png"):
        assert (report / rel).stat().st_size > 0, rel
    summary = pd.read_csv(report / "tables" / "shift_summary.csv")
    assert len(summary) == len(yaml.safe_load((work / "config.yaml").read_text())["encoders"])
    assert (summary["macro_f1_in_domain"] > summary["macro_f1_off_domain"]).all(), summary
    assert (summary["ece_in_domain"] < summary["ece_off_domain"]).all(), summary
    board = pd.read_csv(report / "tables" / "leaderboard.csv")
    assert (board["macro_f1_ci_lo"] <= board["macro_f1"] + 1e-12).all()
    assert (board["macro_f1"] <= board["macro_f1_ci_hi"] + 1e-12).all()
    inventory = pd.read_csv(report / "tables" / "embeddings.csv")
    assert set(inventory["dataset"]) == {"demo-tiles", "cmu-small-region"}
    assert inventory["encoder_config_hash"].notna().all()


def test_demo_runs_a_skewed_prior_through_every_prior_shift_table(demo_run):
    from fmaudit import grid
    from fmaudit.config import load_config

    work, _ = demo_run
    cfg = load_config(work / "config.yaml")
    ps = cfg["prior_shift"]
    runs = grid.prior_shift_runs(cfg)
    shards = sorted((work / "results" / "shards" / "prior_shift").rglob("*.runs.parquet"))
    assert len(shards) == len(grid.jobs(runs, "prior_shift")) == len(cfg["encoders"]) * len(ps["target_domains"])
    rows = pd.read_parquet(work / "results" / "aggregate" / "prior_shift_runs.parquet")
    assert len(rows) == len(runs) * len(ps["methods"])
    tables = work / "results" / "report" / "tables"
    summary = pd.read_csv(tables / "prior_shift_summary.csv")
    assert set(summary["method"]) == set(ps["methods"])
    n_cells = len(cfg["encoders"]) * len(ps["target_domains"]) * len(ps["priors"])
    assert summary["negative_cells"].str.fullmatch(rf"\d+/{n_cells}").all()
    assert summary["unit"].str.startswith("encoder > seed > draw").all()
    assert (summary["ci_lo"] <= summary["mean"] + 1e-12).all() and (summary["mean"] <= summary["ci_hi"] + 1e-12).all()
    gains = pd.read_csv(tables / "prior_shift_gains.csv")
    skewed = [name for name, shares in ps["priors"].items() if max(shares.values()) >= 0.5]
    assert skewed and set(skewed) <= set(gains["prior"]) and (gains["n_targets"] == len(ps["target_domains"])).all()
    regret = pd.read_csv(tables / "prior_shift_regret.csv")
    assert set(regret["rule"]) == set(ps["model_selection"]) and (regret["n_encoders"] == len(cfg["encoders"])).all()
    calibration = pd.read_csv(tables / "prior_shift_calibration.csv")
    assert calibration["ece_convention"].str.contains("15 equal-width bins").all()
    reference = pd.read_csv(tables / "transfer_reference.csv")
    assert set(reference["model"]) == set(cfg["encoders"]) and reference["relative_gap"].notna().all()
    for name in ("prior_shift_negative_cells", "transfer_reference", "leaderboard", "cross_domain_leaderboard"):
        table = pd.read_csv(tables / f"{name}.csv")
        assert table["exposure"].str.startswith("no: demo-tiles").all(), name  # random-init encoders
    assert (work / "results" / "report" / "figures" / "prior_shift_gains.png").stat().st_size > 5000
    index = (work / "results" / "report" / "index.md").read_text()
    assert "## Class-prior shift and label-free adaptation" in index and "![gain per prior]" in index
    log = next((work / "results" / "logs" / "prior_shift_shard").rglob("*.log")).read_text()
    assert "runs/s" in log


def test_second_run_has_nothing_to_do(demo_run):
    work, _ = demo_run
    proc = snakemake(work, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_html_report(demo_run):
    work, _ = demo_run
    snakemake(work, "--report", "results/report/report.html")
    html = (work / "results" / "report" / "report.html").read_text(errors="replace")
    assert "in-domain" in html and len(html) > 10_000


def test_adding_an_encoder_plans_only_its_jobs(demo_run):
    work, _ = demo_run
    registry = yaml.safe_load((work / "resources" / "encoders.yaml").read_text())
    registry["demo-vit-tiny-seed1"] = {**registry["demo-vit-tiny"], "weights": {"source": "random", "seed": 1}}
    (work / "encoders-plus.yaml").write_text(yaml.safe_dump(registry))
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["encoders"].append("demo-vit-tiny-seed1")
    cfg["encoder_registry"] = "encoders-plus.yaml"
    (work / "more.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(work, "-n", "--configfile", "more.yaml")
    jobs = planned_jobs(proc.stdout)
    assert jobs.get("embed") == len(cfg["datasets"]), jobs
    assert jobs.get("probe_shard") == len(cfg["tasks"]), jobs
    # its prior-shift shards (one per target of the single source), nothing of the other encoders
    assert jobs.get("prior_shift_shard") == len(cfg["prior_shift"]["target_domains"]), jobs
    assert "prepare_manifest" not in jobs
    assert jobs.get("aggregate_probe") == 1 and jobs.get("aggregate_prior_shift") == 1 and jobs.get("report") == 1
    assert set(jobs) == {"embed", "probe_shard", "prior_shift_shard", "aggregate_probe", "aggregate_prior_shift",
                         "report", "all"}, jobs


def test_removing_an_encoder_reaggregates_only(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["encoders"] = cfg["encoders"][:1]
    (work / "fewer.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", "fewer.yaml").stdout)
    assert set(jobs) == {"aggregate_probe", "aggregate_prior_shift", "report", "all"}, jobs


def test_changing_a_probe_setting_reruns_probes_not_embeddings(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["probe"]["C"] = 0.5
    (work / "probe.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", "probe.yaml").stdout)
    assert "embed" not in jobs and "prepare_manifest" not in jobs
    assert jobs.get("probe_shard") == len(cfg["encoders"]) * len(cfg["tasks"]), jobs
    assert "prior_shift_shard" not in jobs  # its probe has its own settings (prior_shift.C, val_fraction)


def test_changing_a_report_only_prior_shift_setting_reruns_only_the_report(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["prior_shift"]["model_selection"] = ["min_mean_entropy"]
    (work / "selection.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", "selection.yaml").stdout)
    assert set(jobs) == {"report", "all"}, jobs


def test_cli_probe_reproduces_workflow_numbers(demo_run, tmp_path):
    import numpy as np

    from fmaudit.cli import main
    from fmaudit.io import read_npz, read_table

    work, _ = demo_run
    man = read_table(work / "results/manifests/demo-tiles.parquet")
    arrays, _ = read_npz(work / "results/embeddings/demo-vit-tiny/demo-tiles.npz")
    pos = {i: n for n, i in enumerate(arrays["item_id"])}
    source = "scanner-a"
    files = {}
    for split in ("train", "val", "test"):
        part = man[(man["domain"] == source) & (man["split"] == split)]
        x = arrays["feat__cls"][[pos[i] for i in part["item_id"]]]
        np.save(tmp_path / f"x_{split}.npy", x)
        np.save(tmp_path / f"y_{split}.npy", part["label"].to_numpy().astype(int))
        np.save(tmp_path / f"g_{split}.npy", part["group"].to_numpy().astype(str))
        files[split] = part
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    out = tmp_path / "runs.csv"
    args = ["probe", "--out", str(out), "--long",
            "--train-features", str(tmp_path / "x_train.npy"), "--train-labels", str(tmp_path / "y_train.npy"),
            "--val-features", str(tmp_path / "x_val.npy"), "--val-labels", str(tmp_path / "y_val.npy"),
            "--test-features", str(tmp_path / "x_test.npy"), "--test-labels", str(tmp_path / "y_test.npy"),
            "--train-groups", str(tmp_path / "g_train.npy"), "--test-groups", str(tmp_path / "g_test.npy"),
            "--fractions", ",".join(map(str, cfg["probe"]["fractions"])),
            "--seeds", ",".join(map(str, cfg["probe"]["seeds"])), "--C", str(cfg["probe"]["C"]),
            "--kshot-k", ",".join(map(str, cfg["calibration"]["kshot_k"])),
            "--kshot-draws", str(cfg["calibration"]["kshot_draws"]), "--n-boot", str(cfg["bootstrap"]["n_boot"])]
    assert main(args) == 0
    cli = pd.read_csv(out)
    wf = read_table(work / "results/shards/probe/demo-tissue/demo-vit-tiny.runs.parquet")
    wf = wf[(wf["source_domain"] == source) & wf["in_domain"]]
    keys = ["fraction", "seed", "stage", "k"]
    merged = cli.merge(wf, on=keys, suffixes=("_cli", "_wf"))
    assert len(merged) == len(wf) > 0
    for metric in ("macro_f1", "ece_top_15_lohi", "nll", "brier_sum", "temperature"):
        np.testing.assert_allclose(merged[f"{metric}_cli"], merged[f"{metric}_wf"], rtol=1e-6, atol=1e-9)


def test_unknown_encoder_stops_before_any_job(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["encoders"] = ["demo-vit-tinny"]
    (work / "typo.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(work, "-n", "--configfile", "typo.yaml", check=False)
    assert proc.returncode != 0
    assert "unknown encoder 'demo-vit-tinny'" in proc.stdout + proc.stderr


def test_schema_error_names_the_key(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["probe"]["seeds"] = "zero"
    (work / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(work, "-n", "--configfile", "bad.yaml", check=False)
    assert proc.returncode != 0
    assert "seeds" in proc.stdout + proc.stderr


def test_lint_is_clean(demo_run):
    work, _ = demo_run
    proc = snakemake(work, "--lint", check=False)
    out = proc.stdout + proc.stderr
    assert "Congratulations" in out or proc.returncode == 0 and "Lints for" not in out, out[-3000:]


def test_bad_slide_sheet_stops_before_any_job(demo_run):
    work, _ = demo_run
    sheet = work / "bad_slides.tsv"
    sheet.write_text("slide_id\tpath\tdomain\nx\tresources/data/CMU-1-Small-Region.svs\taperio\n")  # no group
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["dataset_params"]["cmu-small-region"] = {"slides": "bad_slides.tsv"}
    (work / "sheet.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(work, "-n", "--configfile", "sheet.yaml", check=False)
    assert proc.returncode != 0
    assert "bad_slides.tsv" in proc.stdout + proc.stderr and "group" in proc.stdout + proc.stderr


def test_report_declares_exactly_what_it_writes(demo_run):
    from fmaudit.report import SECTIONS

    work, _ = demo_run
    report = work / "results" / "report"
    written = {str(p.relative_to(report)) for p in report.rglob("*") if p.is_file() and p.name != "report.html"}
    assert written == {p for s in SECTIONS for p in s.outputs()} | {"index.md"}


def test_the_paired_count_reruns_only_the_report(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["bootstrap"]["paired_n_boot"] = 500
    (work / "paired.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", "paired.yaml").stdout)
    assert set(jobs) == {"report", "all"}, jobs


@pytest.fixture(scope="module")
def settings_run(demo_run, tmp_path_factory):
    """The demo rerun, in a copy of its results, with other calibration and bootstrap settings."""
    work = tmp_path_factory.mktemp("settings") / "demo"
    shutil.copytree(demo_run[0], work, symlinks=True)  # copy2 keeps the times, .snakemake keeps the params
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["calibration"]["ece_bins"] = 10
    cfg["bootstrap"].update(n_boot=50, paired_n_boot=60)
    (work / "settings.yaml").write_text(yaml.safe_dump(cfg))
    planned = planned_jobs(snakemake(work, "-n", "--configfile", "settings.yaml").stdout)
    snakemake(work, "--cores", "2", "--configfile", "settings.yaml")
    snakemake(work, "--configfile", "settings.yaml", "--report", "results/report/report.html")
    return work, planned


def test_a_settings_change_reruns_only_what_it_feeds(settings_run):
    _, planned = settings_run
    # ECE bins name the prior-shift shards' calibration columns too; the bootstrap counts feed only the report
    assert set(planned) == {"probe_shard", "aggregate_probe", "prior_shift_shard", "aggregate_prior_shift", "report",
                            "all"}, planned


def test_settings_show_in_every_table_and_caption_that_depends_on_them(settings_run):
    work, _ = settings_run
    tables = work / "results" / "report" / "tables"

    def table(name):
        return pd.read_csv(tables / f"{name}.csv")

    board = table("leaderboard")
    assert "ece_top_10_lohi" in board and not any("_15" in c for c in board.columns)
    assert board["ci_convention"].str.contains("B=50,").all()
    calibration = table("calibration")
    assert {"ece_top_10_lohi", "adaptive_ece_10_equalmass", "classwise_ece_10"} <= set(calibration.columns)
    assert not any("_15" in c for c in calibration.columns)
    for name in ("calibration", "shift_summary", "decoupling_units", "decoupling", "ece_slopes",
                 "ece_slope_by_auroc_bin"):
        assert table(name)["ece_convention"].str.contains("10 equal-width bins").all(), name
    assert table("cri")["cri_convention"].str.contains("ECE_10 ").all()
    assert (table("paired_differences")["n_boot"] == 60).all()
    runs = pd.read_parquet(work / "results" / "aggregate" / "probe_runs.parquet")
    assert "ece_top_10_lohi" in runs and (runs["n_boot"] == 50).all()
    index = (work / "results" / "report" / "index.md").read_text()
    assert "10 equal-width bins" in index and "B=50" in index and "B=60" in index
    assert "15 bins" not in index and "B=1000" not in index and "B=2000" not in index
    html = (work / "results" / "report" / "report.html").read_text(errors="replace")
    for text in ("demo-tissue: 10 equal-width bins", "demo-tissue: B=50 resamples", "demo-tissue: B=60 resamples"):
        assert text in html, text
    assert "15 equal-width bins" not in html and "B=200 resamples" not in html



@pytest.fixture(scope="module")
def variant_run(demo_run, tmp_path_factory):
    """The demo, in a copy of its results, with a declared resolution variant and the scratch reference at tiny
    size: what it plans, then its real run."""
    work = tmp_path_factory.mktemp("variant") / "demo"
    shutil.copytree(demo_run[0], work, symlinks=True)
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["variants"] = ["demo-dinov2-tiny.res96"]
    cfg["prior_shift"]["scratch_reference"] = {"enabled": True, "input_size": 16, "epochs": 1, "batch_size": 32,
                                               "gpu": False}
    (work / "variant.yaml").write_text(yaml.safe_dump(cfg))
    planned = planned_jobs(snakemake(work, "-n", "--configfile", "variant.yaml").stdout)
    snakemake(work, "--cores", "2", "--configfile", "variant.yaml")
    return work, cfg, planned


def test_a_variant_plans_its_embeddings_and_probe_shard_and_the_reference_its_jobs(variant_run):
    _, cfg, planned = variant_run
    assert planned == {"embed": len(cfg["datasets"]), "probe_shard": len(cfg["tasks"]),
                       "scratch_reference": len(cfg["prior_shift"]["seeds"]), "aggregate_probe": 1,
                       "aggregate_prior_shift": 1, "report": 1, "all": 1}, planned


def test_the_variant_is_paired_with_its_base_and_kept_out_of_the_rankings(variant_run):
    work, cfg, _ = variant_run
    tables = work / "results" / "report" / "tables"
    pairs = pd.read_csv(tables / "encoder_variants.csv")
    assert set(pairs["base"]) == {"demo-dinov2-tiny"} and set(pairs["variant"]) == {"demo-dinov2-tiny.res96"}
    assert len(pairs) == len(cfg["tasks"]["demo-tissue"]["domains"]) ** 2  # every source x target
    assert (pairs["difference_ci_lo"] <= pairs["difference_ci_hi"]).all() and (pairs["n_boot"] > 0).all()
    for name in ("leaderboard", "cross_domain_leaderboard", "shift_summary", "paired_differences"):
        assert "demo-dinov2-tiny.res96" not in set(pd.read_csv(tables / f"{name}.csv")["encoder"]), name
    inventory = pd.read_csv(tables / "embeddings.csv")
    hashes = inventory.groupby("encoder")["encoder_config_hash"].first()
    assert hashes["demo-dinov2-tiny.res96"] != hashes["demo-dinov2-tiny"]
    assert "## Encoder variants" in (work / "results" / "report" / "index.md").read_text()


def test_the_scratch_reference_is_a_row_of_the_transfer_table(variant_run):
    work, cfg, _ = variant_run
    reference = pd.read_csv(work / "results" / "report" / "tables" / "transfer_reference.csv")
    scratch = reference[reference["model"] == "resnet18-scratch"]
    assert len(scratch) == len(cfg["prior_shift"]["target_domains"]) and not scratch["frozen"].any()
    assert scratch["rank_on_target"].isna().all() and (scratch["n_seeds"] == len(cfg["prior_shift"]["seeds"])).all()
    assert reference.loc[reference["frozen"], "rank_on_target"].notna().all()


def test_the_hema_preset_plans_what_the_grid_counts(tmp_path):
    from fmaudit import grid
    from fmaudit.config import load_config
    from fmaudit.registry import load_dataset_registry

    work = copy_repo(tmp_path)
    preset = "resources/presets/hema.yaml"
    planned = planned_jobs(snakemake(work, "-n", "--configfile", preset).stdout)
    summary = grid.summarize(load_config(work / preset), load_dataset_registry())
    counted = summary[summary["planned"]].groupby("analysis")["jobs"].sum().to_dict()
    assert planned["prior_shift_shard"] == counted["prior_shift"] == 45
    assert planned["scratch_reference"] == counted["scratch_reference"] == 5
    assert planned["embed"] == counted["embed"] == (15 + 1) * 4 and planned["probe_shard"] == counted["probe"] == 16
    assert planned["aggregate_prior_shift"] == 1 and planned["report"] == 1

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


def _interval_pairs(columns) -> list[tuple[str, str]]:
    """(lower, upper) column pairs of a table: ``ci_lo``/``ci_hi`` and ``<x>_ci_lo``/``<x>_ci_hi``."""
    return [(c, c[:-2] + "hi") for c in columns if c.endswith("ci_lo") and c[:-2] + "hi" in columns]


def test_demo_report_is_graded_not_saturated(demo_run):
    """The demo's data are graded (config.yaml dataset_params): every interval of the report is defined and wider
    than zero, every rank-transfer cell and decoupling unit has a ranking, at both label fractions; in-domain
    macro-F1 sits below the ceiling and off-domain above chance without collapsing onto one class."""
    work, _ = demo_run
    tables = work / "results" / "report" / "tables"
    checked = 0
    for path in sorted(tables.glob("*.csv")):
        table = pd.read_csv(path)
        for lo, hi in _interval_pairs(table.columns):
            assert table[[lo, hi]].notna().all().all(), f"{path.name}: undefined interval {lo}/{hi}"
            assert (table[hi] - table[lo] > 0).all(), f"{path.name}: zero-width interval {lo}/{hi}:\n{table}"
            checked += 1
    assert checked >= 5  # leaderboard (2), paired differences, rank transfer, pooled decoupling

    fractions = set(yaml.safe_load((work / "config.yaml").read_text())["probe"]["fractions"])
    rank = pd.read_csv(tables / "rank_transfer.csv")
    assert set(rank["fraction"]) == fractions
    assert rank["ranking_defined"].all() and rank["spearman_rho"].notna().all(), rank  # no "ties" cell
    assert (rank["rho_n_valid"] > 0).all()
    units = pd.read_csv(tables / "decoupling_units.csv")
    assert set(units["fraction"]) == fractions and units["spearman_auroc_vs_neg_ece"].notna().all(), units
    pooled = pd.read_csv(tables / "decoupling.csv")
    assert set(pooled["fraction"]) == fractions and pooled["pooled_rho"].notna().all(), pooled

    summary = pd.read_csv(tables / "shift_summary.csv")
    assert summary["macro_f1_in_domain"].between(0.7, 0.97).all(), summary
    chance = 1 / 5
    assert (summary["macro_f1_off_domain"] > chance + 0.1).all(), summary
    assert summary["macro_f1_in_domain"].nunique() == len(summary)  # the encoders differ
    runs = pd.read_parquet(work / "results" / "aggregate" / "probe_runs.parquet")
    raw = runs[runs["stage"] == "raw"]
    per_fraction = raw[raw["in_domain"]].groupby(["fraction", "encoder"])["macro_f1"].mean()
    assert per_fraction.between(0.6, 0.97).all(), per_fraction
    off = raw[~raw["in_domain"]]
    assert (off["degeneracy_share"] < 0.9).all(), off.nlargest(3, "degeneracy_share")
    assert (off.groupby(["fraction", "encoder"])["macro_f1"].mean() > chance).all()
    # enough test patients per domain for cluster intervals
    assert (raw["n_test_groups"] >= 5).all()


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
    assert "prepare_manifest" not in jobs
    assert jobs.get("aggregate_probe") == 1 and jobs.get("report") == 1


def test_removing_an_encoder_reaggregates_only(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["encoders"] = cfg["encoders"][:1]
    (work / "fewer.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", "fewer.yaml").stdout)
    assert set(jobs) == {"aggregate_probe", "report", "all"}, jobs


def test_changing_a_probe_setting_reruns_probes_not_embeddings(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["probe"]["C"] = 0.5
    (work / "probe.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", "probe.yaml").stdout)
    assert "embed" not in jobs and "prepare_manifest" not in jobs
    assert jobs.get("probe_shard") == len(cfg["encoders"]) * len(cfg["tasks"]), jobs


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
    assert set(planned) == {"probe_shard", "aggregate_probe", "report", "all"}, planned


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


"""The demo config end to end through real Snakemake, in a fresh copy of the repository."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest
import yaml

from toy_analysis import add_toy_analysis
from workflow_utils import copy_repo, demo_tile_branches, planned_jobs, snakemake

pytestmark = pytest.mark.slow

DEMO = Path("results") / "demo"  # the demo's study folder (config `study: demo`)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    work = copy_repo(tmp_path_factory.mktemp("demo"))
    proc = snakemake(work, "--cores", "2")
    return work, proc


def test_demo_produces_report_showing_acquisition_shift(demo_run):
    work, _ = demo_run
    report = work / DEMO / "report"
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
    assert (inventory["weights"] == "random init (seed 0)").all() and inventory["embedding_key"].notna().all()
    # the demo's groups are patients (registry group_unit): every interval says so, with its count
    assert (board["ci_unit"] == "patient").all() and board["ci_resampling"].str.fullmatch(r"unit=patient, n=\d+").all()
    index = (report / "index.md").read_text()
    # (the OOD gate resamples the far donor's tiles, one slide, by item, and says so: that section is apart)
    assert "task demo-tissue: unit=patient, n=" in index and "unit=item" not in index.split("## OOD detection")[0]


def _interval_pairs(columns) -> list[tuple[str, str]]:
    """(lower, upper) column pairs of a table: ``ci_lo``/``ci_hi`` and ``<x>_ci_lo``/``<x>_ci_hi``."""
    return [(c, c[:-2] + "hi") for c in columns if c.endswith("ci_lo") and c[:-2] + "hi" in columns]


def test_demo_report_is_graded_not_saturated(demo_run):
    """The demo's data are graded (config.yaml dataset_params): every interval of the report is defined and wider
    than zero, every rank-transfer cell and decoupling unit has a ranking, at both label fractions; in-domain
    macro-F1 sits below the ceiling and off-domain above chance without collapsing onto one class."""
    work, _ = demo_run
    tables = work / DEMO / "report" / "tables"
    checked = 0
    for path in sorted(tables.glob("*.csv")):
        table = pd.read_csv(path)
        for lo, hi in _interval_pairs(table.columns):
            # a reference against itself (blur sigma 0, adaptation method none) is 0 by definition: no interval
            ref = ((table["sigma"] == 0) if "sigma" in table else (table["method"] == "none") if "method" in table
                   else (table["set"] == "validation") if "set" in table  # the gate's thresholds, no interval
                   # the front page: an axis whose result table has no interval (the calibration ladder)
                   else table["interval"].astype(str).str.startswith("none") if "interval" in table
                   else pd.Series(False, index=table.index))
            defined = table[[lo, hi]].notna().all(axis=1)
            name = lo[: -len("_ci_lo")] if lo != "ci_lo" else next((c for c in ("point", "mean") if c in table), None)
            point = table[name] if name in table else pd.Series(np.nan, index=table.index)
            # no quantity, no interval: accuracy on an OOD set without labels (far donor, held-out classes)
            absent = point.isna() if name in table else pd.Series(False, index=table.index)
            assert (defined | ref | absent).all(), f"{path.name}: undefined interval {lo}/{hi}"
            # a rate observed at 0 or 1 (no near item rejected as novel, say) has a percentile interval [0, 0]
            bound = point.isin([0.0, 1.0]) & (table[lo] == point) & (table[hi] == point)
            wide = table[hi] - table[lo] > 0
            assert (wide | bound | ~defined).all(), f"{path.name}: zero-width interval {lo}/{hi}:\n{table[~wide]}"
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
    runs = pd.read_parquet(work / DEMO / "aggregate" / "probe_runs.parquet")
    raw = runs[runs["stage"] == "raw"]
    per_fraction = raw[raw["in_domain"]].groupby(["fraction", "encoder"])["macro_f1"].mean()
    assert per_fraction.between(0.6, 0.97).all(), per_fraction
    off = raw[~raw["in_domain"]]
    assert (off["degeneracy_share"] < 0.9).all(), off.nlargest(3, "degeneracy_share")
    assert (off.groupby(["fraction", "encoder"])["macro_f1"].mean() > chance).all()
    # enough test patients per domain for cluster intervals
    assert (raw["n_test_groups"] >= 5).all()


def test_demo_runs_every_ood_tier_with_a_gate_per_encoder(demo_run):
    from fmaudit import grid
    from fmaudit.config import load_config

    work, _ = demo_run
    config = load_config(work / "config.yaml")
    report = work / DEMO / "report"
    detection = pd.read_csv(report / "tables" / "ood_detection.csv")
    planned = grid.ood_runs(config)
    assert set(zip(detection["encoder"], detection["condition"], detection["scorer"])) == set(
        zip(planned["encoder"], planned["condition"], planned["scorer"]))
    assert set(detection["tier"]) == {"far", "blur", "near", "artefact", "image_artefact"}
    assert detection["ci_unit"].str.startswith("patient").all() and (detection["n_boot"] == 200).all()
    far = detection[(detection["tier"] == "far") & (detection["scorer"] == "maha")]
    assert (far["auroc"] > 0.9).all(), far  # real H&E slide tiles against the synthetic tiles
    for name in ("ood_detection_by_tier", "ood_gate", "ood_gate_summary", "ood_selective", "ood_blur"):
        assert "note" not in pd.read_csv(report / "tables" / f"{name}.csv").columns, name
    blur = pd.read_csv(report / "tables" / "ood_blur.csv")
    assert sorted(blur["sigma"].unique()) == [0.0, 4.0] and blur["accuracy_change_ci_lo"].notna().any()
    for enc in config["encoders"]:
        card = json.loads((work / DEMO / "ood" / "gates" / "demo-tissue" / enc / "gate.json").read_text())
        assert card["encoder"] == enc and card["class_names"] == ["tumour", "stroma", "lymphocytes", "adipose", "mucus"]
    index = (report / "index.md").read_text()
    assert "## OOD detection and abstention" in index and "unit=patient, n=" in index
    # the audit paper's further splits of the probe metrics beside the stored split, pooled over the demo's two seeds
    selective = pd.read_csv(report / "tables" / "ood_selective.csv")
    assert set(selective["splits"]) == {"stored", "further"}
    further = selective[selective["splits"] == "further"]
    assert len(further) == len(config["encoders"]) and (further["n_splits"] == 2).all()
    assert (further["n_boot_pooled"] == 2 * 200).all() and further["accuracy_ci_lo"].notna().all()
    gate = pd.read_csv(report / "tables" / "ood_gate_summary.csv")
    assert {"coverage", "coverage_mean_over_divisions", "division_strata"} <= set(gate.columns)


def test_demo_runs_a_skewed_prior_through_every_prior_shift_table(demo_run):
    from fmaudit import grid
    from fmaudit.config import load_config

    work, _ = demo_run
    cfg = load_config(work / "config.yaml")
    ps = cfg["prior_shift"]
    runs = grid.prior_shift_runs(cfg)
    shards = sorted((work / DEMO / "shards" / "prior_shift").rglob("*.runs.parquet"))
    assert len(shards) == len(grid.jobs(runs, "prior_shift")) == len(cfg["encoders"]) * len(ps["target_domains"])
    rows = pd.read_parquet(work / DEMO / "aggregate" / "prior_shift_runs.parquet")
    assert len(rows) == len(runs) * len(ps["methods"])
    tables = work / DEMO / "report" / "tables"
    summary = pd.read_csv(tables / "prior_shift_summary.csv")
    assert set(summary["method"]) == set(ps["methods"])
    n_cells = len(cfg["encoders"]) * len(ps["target_domains"]) * len(ps["priors"])
    assert summary["negative_cells"].str.fullmatch(rf"\d+/{n_cells}").all()
    assert summary["unit"].str.startswith("encoder > seed > draw").all()
    ranged = summary[summary["method"] != "none"]  # the reference against itself has no interval
    assert summary.loc[summary["method"] == "none", "ci_lo"].isna().all()
    assert (ranged["ci_lo"] <= ranged["mean"] + 1e-12).all() and (ranged["mean"] <= ranged["ci_hi"] + 1e-12).all()
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
    assert (work / DEMO / "report" / "figures" / "prior_shift_gains.png").stat().st_size > 5000
    index = (work / DEMO / "report" / "index.md").read_text()
    assert "## Class-prior shift and label-free adaptation" in index and "![gain per prior]" in index
    log = next((work / DEMO / "logs" / "prior_shift_shard").rglob("*.log")).read_text()
    assert "runs/s" in log


def test_second_run_has_nothing_to_do(demo_run):
    work, _ = demo_run
    proc = snakemake(work, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_html_report(demo_run):
    work, _ = demo_run
    snakemake(work, "--report", str(DEMO / "report" / "report.html"))
    html = (work / DEMO / "report" / "report.html").read_text(errors="replace")
    assert "in-domain" in html and len(html) > 10_000


def test_adding_an_encoder_plans_only_its_jobs(demo_run):
    work, _ = demo_run
    builtin = yaml.safe_load((work / "resources" / "encoders.yaml").read_text())
    # a registry of one's own, added to the built-in one
    registry = {"demo-vit-tiny-seed1": {**builtin["demo-vit-tiny"], "weights": {"source": "random", "seed": 1}}}
    (work / "encoders-plus.yaml").write_text(yaml.safe_dump(registry))
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["encoders"].append("demo-vit-tiny-seed1")
    cfg["encoder_registry"] = "encoders-plus.yaml"
    (work / "more.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(work, "-n", "--configfile", "more.yaml")
    jobs = planned_jobs(proc.stdout)
    cells = cfg["cells"]
    tile_datasets = [d for d in cfg["datasets"] if d != "demo-xenium"]  # demo-xenium is cell-level only
    tile_tasks = [t for t in cfg["tasks"] if t not in cells["taxonomies"].values()]
    copies = 2  # the blurred and the pen-marked copies of the demo's test split (OOD tiers)
    assert jobs.get("embed") == len(tile_datasets) + copies, jobs
    assert jobs.get("probe_shard") == len(tile_tasks) == jobs.get("ood_shard") == jobs.get("ood_split_shard"), jobs
    # its prior-shift shards (one per target of the single source), nothing of the other encoders
    assert jobs.get("prior_shift_shard") == len(cfg["prior_shift"]["target_domains"]), jobs
    # the cell branch: this encoder's feature jobs, its feature sets and shards, the merges; no section again
    n_sections = sum(len(v) for v in cells["sections"].values())
    n_mags = len(cells["magnifications"])
    assert jobs.get("cell_features") == n_sections, jobs  # one job per section, every magnification in it
    assert jobs.get("cell_feature_set") == n_mags, jobs
    assert jobs.get("cell_shard") == len(cells["protocols"]) * n_mags, jobs
    assert set(jobs) == {"embed", "probe_shard", "ood_shard", "ood_split_shard", "prior_shift_shard", "cell_features",
                         "cell_feature_set", "cell_shard", "aggregate_probe", "aggregate_ood", "aggregate_prior_shift",
                         "aggregate_cells", "report", "all"}, jobs


def test_removing_an_encoder_reaggregates_only(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["encoders"] = cfg["encoders"][:1]
    (work / "fewer.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", "fewer.yaml").stdout)
    assert set(jobs) == {"aggregate_probe", "aggregate_ood", "aggregate_prior_shift", "aggregate_cells", "report",
                         "all"}, jobs


def test_changing_a_probe_setting_reruns_probes_not_embeddings(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["probe"]["C"] = 0.5
    (work / "probe.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", "probe.yaml").stdout)
    assert "embed" not in jobs and "prepare_manifest" not in jobs
    tile_tasks = [t for t in cfg["tasks"] if t not in cfg["cells"]["taxonomies"].values()]
    assert jobs.get("probe_shard") == len(cfg["encoders"]) * len(tile_tasks), jobs
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
    man = read_table(work / DEMO / "manifests" / "demo-tiles.parquet")
    [embeddings] = (work / DEMO / "embeddings" / "demo-vit-tiny").glob("*/demo-tiles.npz")
    arrays, _ = read_npz(embeddings)
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
    wf = read_table(work / DEMO / "shards" / "probe" / "demo-tissue" / "demo-vit-tiny.runs.parquet")
    wf = wf[(wf["source_domain"] == source) & wf["in_domain"]]
    keys = ["fraction", "seed", "stage", "k"]
    merged = cli.merge(wf, on=keys, suffixes=("_cli", "_wf"))
    assert len(merged) == len(wf) > 0
    # The workflow's shard fits this source's problems in one batch with other sources', the CLI alone: the batched
    # engine's float32 products sum in a batch-dependent order, so the fits agree to the optimiser's tolerance
    # (relative differences ~1e-4 at most seen), not bit for bit.
    for metric in ("macro_f1", "ece_top_15_lohi", "nll", "brier_sum", "temperature"):
        np.testing.assert_allclose(merged[f"{metric}_cli"], merged[f"{metric}_wf"], rtol=1e-3, atol=1e-5)


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
    from fmaudit.report import report_files

    work, _ = demo_run
    report = work / DEMO / "report"
    written = {str(p.relative_to(report)) for p in report.rglob("*") if p.is_file() and p.name != "report.html"}
    assert written == report_files(yaml.safe_load((work / "config.yaml").read_text())["encoders"])


# ------------------------------------------------------- issue 19: from tables to a decision (cards, cost)
CARD_SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "resources" / "schemas" / "card.schema.json")
                         .read_text())


def test_demo_writes_a_valid_card_per_encoder_and_opens_with_the_front_page(demo_run):
    work, _ = demo_run
    report = work / DEMO / "report"
    encoders = yaml.safe_load((work / "config.yaml").read_text())["encoders"]
    for enc in encoders:
        card = json.loads((report / "cards" / f"{enc}.json").read_text())
        jsonschema.validate(card, CARD_SCHEMA)
        assert card["encoder"] == enc and card["study"] == "demo"
        # the demo has every analysis: every section has numbers, each with its rows
        for name, section in card["sections"].items():
            assert section["available"] and section["rows"], (enc, name, section.get("reason"))
        accuracy = card["sections"]["accuracy"]["rows"]
        assert all(r["values"]["target"]["resampling_unit"] == "patient" and r["values"]["target"]["n_units"] >= 5
                   for r in accuracy)
        assert all(r["values"]["rank_target"]["kind"] == "integer" for r in accuracy)
        # 4 encoders: the study's rank transfer is marked as saying nothing
        assert any("only 4 encoders" in x for x in card["sections"]["accuracy"]["limits"])
        assert card["sections"]["calibration"]["recommended_fix"]["name"]
        cells = card["sections"]["cells"]
        assert any("undecided, not false" in x for x in cells["limits"])  # 4 sections: no Wilcoxon decision
        # the gate's numbers are the mean over its divisions with their interval (the table's headline has none)
        gate_test = [r for r in card["sections"]["abstention"]["rows"] if r["context"]["set"] == "test"]
        assert gate_test and all(r["values"]["coverage"]["ci_lo"] is not None for r in gate_test)
        crt = [r for r in cells["rows"] if "crt" in r["values"]]
        assert crt and all(r["values"]["crt"]["point"] is not None for r in crt)  # the CRT table's own columns
        md = (report / "cards" / f"{enc}.md").read_text()
        assert md.startswith(f"# Reliability card: {enc}") and "## Cost" in md and "images/s" in md
    index = (report / "index.md").read_text()
    head = index.split("## In-domain vs off-domain")[0]
    assert "## At a glance" in head and all(f"[card](cards/{enc}.md)" in head for enc in encoders)
    assert index.index("## At a glance") < index.index("## Leaderboards")
    front = pd.read_csv(report / "tables" / "front_page.csv")
    assert set(front["encoder"]) == set(encoders) and set(front["axis"]) >= {"in_domain", "gate_coverage", "cost"}
    advice = pd.read_csv(report / "tables" / "card_advice.csv")
    assert {"accuracy.off_domain_drop", "calibration.temperature_does_not_transfer",
            "abstention.scorer_below_chance"} <= set(advice["rule"])


def test_the_report_lint_reports_the_demo_and_fixes_hold(demo_run):
    work, _ = demo_run
    report = work / DEMO / "report"
    lint = pd.read_csv(report / "tables" / "report_lint.csv")
    # the demo's real findings: energy/MSP far AUROCs below 0.5, prior-shift intervals over 4 encoders
    assert "detection AUROC below 0.5" in set(lint["check"])
    # what issue 19 fixed stays fixed: no blank cell, no empty table, no caption naming a missing row
    assert not {"blank cell", "empty table", "caption names what the table lacks"} & set(lint["check"]), lint
    index = (report / "index.md").read_text()
    assert "**Report lint:" in index.split("## At a glance")[0] and "## Report lint" in index
    assert "|  |" not in index and "Below chance (AUROC < 0.5)" in index
    assert "1.000 |" not in index.split("## Cross-domain leaderboard")[1].split("## CRI")[0]  # ranks are integers
    assert "uninformative: 4 encoders" in index and "n/a (4 runs: p >= 0.125)" in index  # 4 (section, seed) runs
    assert "ResNet-18" not in index.split("### Transfer with the non-frozen reference")[1].split("##")[0]
    assert "report lint:" in (work / DEMO / "logs" / "report.log").read_text()


def test_the_cost_chapter_reads_every_benchmark_file_the_demo_wrote(demo_run):
    work, _ = demo_run
    written = {str(p.relative_to(work / DEMO / "benchmarks")) for p in (work / DEMO / "benchmarks").rglob("*.tsv")}
    jobs = pd.read_csv(work / DEMO / "report" / "tables" / "cost_jobs.csv")
    assert {f"{r}/{j}.tsv" for r, j in zip(jobs["rule"], jobs["job"])} == written  # planned_benchmarks() is exact
    assert (jobs["gpus"] == 0).all()  # the demo's encoders are CPU entries
    by_rule = pd.read_csv(work / DEMO / "report" / "tables" / "cost_by_rule.csv").set_index("rule")
    assert by_rule.loc["total", "jobs"] == len(written)


def test_fmaudit_cost_prints_per_rule_cpu_hours_that_sum_to_the_benchmark_files(demo_run):
    work, _ = demo_run
    proc = subprocess.run([sys.executable, "-m", "fmaudit.cli", "cost", "--results", str(DEMO)], cwd=work,
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(work / "src")})
    out = proc.stdout
    assert "GPU-hours: wall time x GPUs requested per job" in out  # config.yaml there is the demo's
    rows = [line.split() for line in out.split("Per rule:")[1].split("Per encoder:")[0].strip().splitlines()[1:]]
    printed = {r[0]: float(r[2]) for r in rows}
    files = sorted((work / DEMO / "benchmarks").rglob("*.tsv"))
    total = sum(pd.read_csv(f, sep="\t")["cpu_time"].sum() for f in files) / 3600
    assert printed["total"] == pytest.approx(total, abs=5e-7)
    assert sum(v for k, v in printed.items() if k != "total") == pytest.approx(total, abs=5e-7 * len(printed))
    assert {"embed", "probe_shard", "ood_shard", "prior_shift_shard", "cell_features", "cell_shard"} <= set(printed)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _dump_dom(browser: str, page: Path, profile: Path) -> str:
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={profile}", "--dump-dom", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_card_and_the_home_page_render_in_headless_chromium(demo_run, tmp_path):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing (.ci/run installs Debian's chromium)")
        pytest.skip("no chromium here (apt-get install -y chromium)")
    work, _ = demo_run
    report = work / DEMO / "report"
    encoders = yaml.safe_load((work / "config.yaml").read_text())["encoders"]
    home = _dump_dom(browser, report / "index.html", tmp_path / "profile-home")
    card = _dump_dom(browser, report / "cards" / f"{encoders[0]}.html", tmp_path / "profile-card")
    for dom in (home, card):
        assert "<table>" in dom and not re.search(r"\{\{|\}\}|\{%|%\}|\bundefined\b|\bNone\b|\bnan\b", dom)
    assert all(f'href="cards/{enc}.html"' in home for enc in encoders)
    assert "At a glance" in home and all(enc in home for enc in encoders)
    assert f"Reliability card: {encoders[0]}" in card and "Advice" in card and "rule <code>" in card


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
    # two of the demo's encoders (paired differences need two) and its tile branches: the same rule kinds rerun,
    # at half the jobs (CI time)
    cfg = demo_tile_branches(yaml.safe_load((work / "config.yaml").read_text()), ["demo-vit-tiny", "demo-convnet"])
    cfg["calibration"]["ece_bins"] = 10
    cfg["bootstrap"].update(n_boot=50, paired_n_boot=60)
    (work / "settings.yaml").write_text(yaml.safe_dump(cfg))
    planned = planned_jobs(snakemake(work, "-n", "--configfile", "settings.yaml").stdout)
    snakemake(work, "--cores", "2", "--configfile", "settings.yaml")
    snakemake(work, "--configfile", "settings.yaml", "--report", str(DEMO / "report" / "report.html"))
    return work, planned


def test_a_settings_change_reruns_only_what_it_feeds(settings_run):
    _, planned = settings_run
    # ECE bins name the prior-shift and OOD shards' calibration columns too; the bootstrap counts feed only the report
    assert set(planned) == {"probe_shard", "aggregate_probe", "ood_shard", "ood_split_shard", "aggregate_ood",
                            "prior_shift_shard", "aggregate_prior_shift", "report", "all"}, planned


def test_settings_show_in_every_table_and_caption_that_depends_on_them(settings_run):
    work, _ = settings_run
    tables = work / DEMO / "report" / "tables"

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
    ood = table("ood_selective")
    assert "ece_top_10_lohi" in ood and not any("_15" in c for c in ood.columns) and (ood["n_boot"] == 50).all()
    assert (table("ood_detection")["n_boot"] == 50).all()
    assert (table("paired_differences")["n_boot"] == 60).all()
    runs = pd.read_parquet(work / DEMO / "aggregate" / "probe_runs.parquet")
    assert "ece_top_10_lohi" in runs and (runs["n_boot"] == 50).all()
    index = (work / DEMO / "report" / "index.md").read_text()
    assert "10 equal-width bins" in index and "B=50" in index and "B=60" in index
    assert "15 bins" not in index and "B=1000" not in index and "B=2000" not in index
    html = (work / DEMO / "report" / "report.html").read_text(errors="replace")
    for text in ("demo-tissue: 10 equal-width bins", "demo-tissue: B=50 resamples", "demo-tissue: B=60 resamples",
                 "demo-tissue: unit=patient"):
        assert text in html, text
    assert "15 equal-width bins" not in html and "B=200 resamples" not in html



# ---------------------------------------------------------------- issue 7: runs a cluster user can trust


def _write_config(work, name, **changes):
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg.update(changes)
    (work / name).write_text(yaml.safe_dump(cfg))
    return cfg


def _digests(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``folder``: its sha256 and modification time."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _copy(demo_run, tmp_path_factory, name):
    work = tmp_path_factory.mktemp(name) / "demo"
    shutil.copytree(demo_run[0], work, symlinks=True)  # copy2 keeps the times, .snakemake keeps the params
    return work


def test_splits_are_validated_before_the_first_embedding(demo_run):
    work, _ = demo_run
    report = pd.read_csv(work / DEMO / "validation" / "preflight.tsv", sep="\t")
    assert (report["status"] == "ok").all()
    assert {"group_disjoint", "evaluated_classes", "training_classes", "label_range"} <= set(report["check"])
    first_embedding = min(p.stat().st_mtime_ns for p in (work / DEMO / "embeddings").rglob("*.npz"))
    assert (work / DEMO / "validation" / "preflight.tsv").stat().st_mtime_ns <= first_embedding


@pytest.fixture(scope="module")
def bad_splits(demo_run, tmp_path_factory):
    """The demo's prepared manifests without any embedding, then the run, once with a patient on two splits and
    once with a class missing from one domain's training split: (workdir, leak run, missing-class run)."""
    from fmaudit.io import read_provenance, read_table, write_table

    work = _copy(demo_run, tmp_path_factory, "splits")
    shutil.rmtree(work / DEMO / "embeddings")
    path = work / DEMO / "manifests" / "demo-tiles.parquet"
    good, prov = read_table(path), read_provenance(path)
    leaky = good.copy()
    rows = leaky.index[(leaky["domain"] == "scanner-b") & (leaky["split"] == "train")]
    patient = leaky.loc[rows[0], "group"]  # a training patient of scanner-b, one of whose items moves to test
    leaky.loc[rows[0], "split"] = "test"
    n_train = int(((leaky["group"] == patient) & (leaky["split"] == "train")).sum())
    write_table(path, leaky, provenance=prov)
    leak = snakemake(work, "--cores", "2", check=False)
    leak_log = (work / DEMO / "logs" / "validate.log").read_text()  # the next run writes that log again
    missing = good[~((good["domain"] == "scanner-a") & (good["split"] == "train") & (good["label_name"] == "mucus"))]
    write_table(path, missing, provenance=prov)
    missing_class = snakemake(work, "--cores", "2", check=False)
    return work, (leak, patient, n_train, leak_log), missing_class


def test_a_patient_on_two_splits_stops_the_run_before_any_embedding(bad_splits):
    work, (leak, patient, n_train, leak_log), _ = bad_splits
    out = leak.stdout + leak.stderr
    assert leak.returncode != 0
    assert ("task 'demo-tissue', manifest results/demo/manifests/demo-tiles.parquet (dataset 'demo-tiles'): "
            f"1 group(s) of domain 'scanner-b' are on more than one split (leakage): '{patient}' on test (1 items) "
            f"and train ({n_train} items)") in out
    assert "rule embed:" not in out and "rule validate:" in out  # the validate job ran, no embedding job did
    assert not (work / DEMO / "embeddings").exists()
    assert "leakage" in leak_log


def test_a_class_missing_from_training_stops_the_run_before_any_embedding_unless_allowed(bad_splits):
    work, _, missing = bad_splits
    out = missing.stdout + missing.stderr
    assert missing.returncode != 0 and "rule embed:" not in out
    assert ("class 'mucus' (label 4) is evaluated on the test split of domain 'scanner-a' but absent from the train "
            "split of domain 'scanner-a' (label 4 is outside the training labels 0..3); list it in the task's "
            "allow_missing_classes to accept this") in out
    assert not (work / DEMO / "embeddings").exists()
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["tasks"]["demo-tissue"]["allow_missing_classes"] = ["mucus"]
    (work / "allow.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(work, "--cores", "1", "validate", "--configfile", "allow.yaml")  # the target checks, embeds nothing
    report = pd.read_csv(work / DEMO / "validation" / "preflight.tsv", sep="\t")
    assert set(report.loc[report["status"] == "allowed", "check"]) == {"evaluated_classes"}
    assert not (work / DEMO / "embeddings").exists()


def test_a_task_edit_reruns_the_checks_only(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["tasks"]["demo-tissue"].update(description="Another sentence.", allow_missing_classes=["mucus"])
    (work / "task-edit.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", "task-edit.yaml").stdout)
    assert set(jobs) == {"validate"}, jobs  # embeddings and shards depend on the checks, not on their date


def test_a_descriptive_encoder_or_data_set_edit_reruns_nothing(demo_run):
    work, _ = demo_run
    # the built-in registries edited in place (a registry of one's own adds entries, it replaces none)
    encoders_file, datasets_file = work / "resources" / "encoders.yaml", work / "resources" / "datasets.yaml"
    encoders_text, datasets_text = encoders_file.read_text(), datasets_file.read_text()
    try:
        registry = yaml.safe_load(encoders_text)
        registry["demo-vit-tiny"].update(description="edited", licence="MIT")
        encoders_file.write_text(yaml.safe_dump(registry))
        datasets = yaml.safe_load(datasets_text)
        datasets["demo-tiles"].update(description="edited", licence="CC-BY-4.0")
        datasets_file.write_text(yaml.safe_dump(datasets))
        proc = snakemake(work, "-n")
        assert "Nothing to be done" in proc.stdout + proc.stderr
        # what the report's exposure audit shows (pretraining corpora, exposure) reruns the report, and only it
        registry["demo-vit-tiny"].update(pretraining_corpora=["nothing"],
                                         exposure={"demo-tiles": {"status": "no", "evidence": "generated"}})
        encoders_file.write_text(yaml.safe_dump(registry))
        jobs = planned_jobs(snakemake(work, "-n").stdout)
        assert set(jobs) <= {"report", "all"} and jobs.get("report") == 1, jobs
    finally:
        encoders_file.write_text(encoders_text)
        datasets_file.write_text(datasets_text)


@pytest.fixture(scope="module")
def failed_rerun(demo_run, tmp_path_factory):
    """The demo with demo-vit-tiny's weights replaced by a checkpoint of the right keys and shapes whose values
    are NaN: it passes the pre-flight (a checkpoint that does not fit stops before any job,
    tests/test_workflow_killed.py), and the embedding jobs fail on the features it gives."""
    import torch
    from safetensors.torch import save_file

    from fmaudit.encoders import build_encoder

    work = _copy(demo_run, tmp_path_factory, "failed")
    before = _digests(work / DEMO / "embeddings" / "demo-vit-tiny")
    (work / "weights").mkdir()
    state = build_encoder("demo-vit-tiny").backbone.model.state_dict()
    save_file({k: torch.full_like(v, float("nan")) for k, v in state.items()},
              str(work / "weights" / "wrong.safetensors"))
    _write_config(work, "wrong-weights.yaml", encoder_weights={"demo-vit-tiny": "weights/wrong.safetensors"})
    # until the embeddings (the cell features of demo-vit-tiny would fail the same way); --keep-going: every one
    proc = snakemake(work, "--cores", "2", "--keep-going", "--until", "embed", "--configfile", "wrong-weights.yaml",
                     check=False)
    return work, before, proc


def test_a_failing_rerun_keeps_the_earlier_embeddings(failed_rerun):
    work, before, proc = failed_rerun
    assert proc.returncode != 0
    folder = work / DEMO / "embeddings" / "demo-vit-tiny"
    assert _digests(folder) == before  # same bytes, same times, in the earlier key's folder
    assert not list(folder.rglob("*.tmp*"))
    assert len(list(folder.rglob("*.npz"))) == sum(name.endswith(".npz") for name in before)
    proc = snakemake(work, "-n")  # back to the earlier weights: nothing to redo
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_a_failing_jobs_log_holds_its_full_exception(failed_rerun):
    work, _, proc = failed_rerun
    logs = [p for p in (work / DEMO / "logs" / "embed" / "demo-vit-tiny").rglob("*.log")
            if "Traceback" in p.read_text()]
    assert logs  # every failed embedding of the new key (the data sets and the OOD copies), each with its traceback
    text = logs[0].read_text()
    assert "CRITICAL fmaudit: the job failed: FmauditInputError: encoder 'demo-vit-tiny' produced non-finite" in text
    assert "Traceback (most recent call last)" in text and "_check_finite" in text
    assert text.rstrip().splitlines()[-1].startswith("fmaudit.io.FmauditInputError: encoder 'demo-vit-tiny'")
    assert "produced non-finite" in proc.stderr + proc.stdout  # and on stderr


def test_an_input_function_error_names_the_config_key(demo_run):
    work, _ = demo_run
    proc = snakemake(work, "-n", str(DEMO / "shards" / "probe" / "no-such-task" / "demo-vit-tiny.runs.parquet"),
                     check=False)
    assert proc.returncode != 0
    assert ("config 'tasks': unknown task 'no-such-task' (known: demo-cells-coarse, demo-cells-fine, demo-tissue)"
            in proc.stdout + proc.stderr)


def test_a_missing_weights_override_stops_before_planning_naming_the_key(demo_run):
    work, _ = demo_run
    _write_config(work, "no-weights.yaml", encoder_weights={"demo-convnet": "weights/nowhere.safetensors"})
    proc = snakemake(work, "-n", "--configfile", "no-weights.yaml", check=False)
    assert proc.returncode != 0
    assert "config 'encoder_weights.demo-convnet': weight file weights/nowhere.safetensors does not exist" in (
        proc.stdout + proc.stderr)


def test_remote_code_without_a_pinned_commit_is_planned_but_never_run(demo_run):
    work, _ = demo_run
    builtin = yaml.safe_load((work / "resources" / "encoders.yaml").read_text())
    registry = {"remote-demo": {**builtin["demo-dinov2-tiny"], "trust_remote_code": True,
                                "weights": {"source": "hf_hub", "hf_hub_id": "org/remote-demo", "revision": None,
                                            "format": "safetensors"}}}
    (work / "encoders-remote.yaml").write_text(yaml.safe_dump(registry))  # added to the built-in registry
    cfg = _write_config(work, "remote.yaml", encoder_registry="encoders-remote.yaml")
    cfg["encoders"].append("remote-demo")
    (work / "remote.yaml").write_text(yaml.safe_dump(cfg))
    hint = "set `encoder_revisions.remote-demo: <commit>` in your config"
    dry = snakemake(work, "-n", "--configfile", "remote.yaml")  # the plan shows, with the warning
    copies = 2  # its embeddings of the demo's two data sets and of the two OOD copies of the test split
    assert planned_jobs(dry.stdout).get("embed") == 2 + copies and hint in dry.stderr
    proc = snakemake(work, "--cores", "1", "--configfile", "remote.yaml", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "stopped before the first job" in out and hint in out
    assert "rule embed:" not in out and not (work / DEMO / "embeddings" / "remote-demo").exists()


@pytest.fixture(scope="module")
def second_study(demo_run, tmp_path_factory):
    """A second study (one encoder, one data set) run for real in the demo's checkout, and a preset's dry-run."""
    work, _ = demo_run
    report_before = _digests(work / DEMO / "report")
    demo_cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg = _write_config(work, "solo.yaml", study="solo", encoders=["demo-convnet"], datasets=["demo-tiles"],
                        dataset_params={"demo-tiles": demo_cfg["dataset_params"]["demo-tiles"]},
                        tasks={"demo-tissue": demo_cfg["tasks"]["demo-tissue"]})
    for branch in ("cells", "ood", "prior_shift"):  # a probe-only study (the far OOD donor is not in it)
        cfg.pop(branch, None)
    (work / "solo.yaml").write_text(yaml.safe_dump(cfg))
    solo = snakemake(work, "--cores", "2", "--configfile", "solo.yaml")
    prism = snakemake(work, "-n", "--configfile", "resources/presets/prism.yaml")
    return work, report_before, cfg, solo, prism


def test_studies_live_side_by_side_and_a_report_shows_only_its_own(second_study):
    work, report_before, _, _, prism = second_study
    assert _digests(work / DEMO / "report") == report_before  # the demo's report untouched
    solo = work / "results" / "solo"
    assert {p.name for p in solo.iterdir()} >= {"manifests", "validation", "embeddings", "shards", "aggregate",
                                                "report", "logs", "benchmarks"}
    inventory = pd.read_csv(solo / "report" / "tables" / "embeddings.csv")
    assert inventory[["encoder", "dataset"]].values.tolist() == [["demo-convnet", "demo-tiles"]]
    board = pd.read_csv(solo / "report" / "tables" / "leaderboard.csv")
    assert set(board["encoder"]) == {"demo-convnet"}
    assert set(pd.read_parquet(solo / "aggregate" / "probe_runs.parquet")["encoder"]) == {"demo-convnet"}
    # a preset's plan lies entirely in its own folder
    outputs = [line.split(":", 1)[1] for line in prism.stdout.splitlines() if line.strip().startswith("output:")]
    files = [f.strip() for line in outputs for f in line.split(",")]
    assert files and all(f.startswith("results/prism/") for f in files), [f for f in files if "prism" not in f]
    assert planned_jobs(prism.stdout).get("validate") == 1


def test_the_demo_is_still_done_after_another_study_ran(second_study):
    proc = snakemake(second_study[0], "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr
# ---- OOD: the exported gate, a near set, one more tier, the audit preset's plan ---------------------------


def _quantities(decisions: pd.DataFrame, labels) -> dict[str, float]:
    """The gate table's quantities of one set, from `fmaudit gate apply`'s decisions (an independent count)."""
    d = decisions["decision"].to_numpy()
    accept, novel = d == "accept", d == "reject_novel"
    out = {"coverage": accept.mean(), "coverage_novelty_gate": 1 - novel.mean(), "reject_novel": novel.mean(),
           "reject_unconfident": (d == "reject_unconfident").mean(), "reject_any": 1 - accept.mean()}
    if labels is not None:
        correct = decisions["prediction"].to_numpy() == np.asarray(labels)
        out.update(accuracy_ungated=correct.mean(), accuracy_novelty_gate=correct[~novel].mean(),
                   accuracy_accepted=correct[accept].mean() if accept.any() else np.nan)
    return out


def _apply(gate_dir, features, readout, tmp_path, name):
    from fmaudit.cli import main

    np.save(tmp_path / f"{name}.npy", features)
    out = tmp_path / f"{name}.csv"
    assert main(["gate", "apply", "--gate", str(gate_dir), "--features", str(tmp_path / f"{name}.npy"),
                 "--readout", readout, "--out", str(out)]) == 0
    return pd.read_csv(out)


def _check(table, setting, set_name, decisions, labels):
    rows = table[(table["setting"] == setting) & (table["set"] == set_name)].set_index("quantity")["value"]
    mine = _quantities(decisions, labels)
    assert set(mine) <= set(rows.index), (set(mine), rows)
    for q, v in mine.items():
        np.testing.assert_allclose(v, rows[q], rtol=0, atol=1e-9, err_msg=f"{setting} {set_name} {q}")
    return mine


def test_exported_gate_applied_with_the_cli_reproduces_the_operating_points(demo_run, tmp_path):
    """Each encoder's gate, as the workflow exported it, applied with `fmaudit gate apply` to the demo's test split
    and every OOD set, gives the workflow's operating-point table (the exported gate's `value`) to 1e-9; a gate
    exported with `fmaudit gate export` without the near class rejects the near set more often than the ID set."""
    from fmaudit.cli import main
    from fmaudit.embed import read_embeddings
    from fmaudit.io import read_table
    from fmaudit.ood.conditions import align_perturbed

    work, _ = demo_run
    res = work / DEMO
    table = read_table(res / "aggregate" / "ood_gate.parquet")
    man = read_table(res / "manifests" / "demo-tiles.parquet")
    names = man.drop_duplicates("label").sort_values("label")["label_name"].tolist()
    near = "mucus"
    rates = []
    for enc in yaml.safe_load((work / "config.yaml").read_text())["encoders"]:
        gate_dir = res / "ood" / "gates" / "demo-tissue" / enc
        readout = json.loads((gate_dir / "gate.json").read_text())["readout"]
        ids, X = read_embeddings(next((res / "embeddings" / enc).glob("*/demo-tiles.npz")), readout)
        pos = {i: n for n, i in enumerate(ids)}
        test = man[man["split"] == "test"]
        x_test = X[[pos[i] for i in test["item_id"]]]
        y_test = test["label"].to_numpy().astype(int)
        table_enc = table[table["encoder"] == enc]
        _check(table_enc, "demo-tissue", "test", _apply(gate_dir, x_test, readout, tmp_path, f"{enc}_test"), y_test)
        _, far = read_embeddings(next((res / "embeddings" / enc).glob("*/cmu-small-region.npz")), readout)
        _check(table_enc, "demo-tissue", "far_cmu-small-region", _apply(gate_dir, far, readout, tmp_path, f"{enc}_far"),
               None)
        for tag in ("blur_s4", "pen_seed0"):
            d_ids, d_X = read_embeddings(next((res / "embeddings" / enc).glob(f"*/demo-tiles__{tag}.npz")), readout)
            x = align_perturbed(test["item_id"].tolist(), d_ids, d_X, tag)
            _check(table_enc, "demo-tissue", tag, _apply(gate_dir, x, readout, tmp_path, f"{enc}_{tag}"), y_test)

        # the near setting: a gate exported by the CLI from the training split without the near class
        train = man[man["split"].isin(["train", "val"]) & (man["label_name"] != near)]
        keep = [n for n in names if n != near]
        np.save(tmp_path / "x.npy", X[[pos[i] for i in train["item_id"]]])
        np.save(tmp_path / "y.npy", np.array([keep.index(n) for n in train["label_name"]]))
        np.save(tmp_path / "g.npy", train["group"].to_numpy().astype(str))
        cli_gate = tmp_path / f"{enc}_near_gate"
        assert main(["gate", "export", "--features", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"),
                     "--groups", str(tmp_path / "g.npy"), "--encoder", enc, "--readout", readout, "--C", "1.0",
                     "--out", str(cli_gate)]) == 0
        id_test = test[test["label_name"] != near]
        y_id = np.array([keep.index(n) for n in id_test["label_name"]])
        setting = f"demo-tissue:holdout_{near}"
        id_rates = _check(table_enc, setting, "test", _apply(cli_gate, X[[pos[i] for i in id_test["item_id"]]], readout,
                                                              tmp_path, f"{enc}_id"), y_id)
        near_items = test[test["label_name"] == near]["item_id"]
        near_rates = _check(table_enc, setting, f"holdout_{near}",
                            _apply(cli_gate, X[[pos[i] for i in near_items]], readout, tmp_path, f"{enc}_near"), None)
        rates.append((near_rates["reject_any"], id_rates["reject_any"]))
    near_mean, id_mean = np.mean(rates, axis=0)
    assert near_mean > id_mean, rates


def test_adding_an_ood_tier_embeds_only_its_copies(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    n_enc = len(cfg["encoders"])
    for name, change in (("sigma", lambda c: c["ood"]["blur"]["sigmas"].append(8.0)),
                         ("jpeg",
                          lambda c: c["ood"]["image_artefact"]["specs"].append({"kind": "jpeg", "quality": 20}))):
        more = yaml.safe_load((work / "config.yaml").read_text())
        change(more)
        (work / f"ood-{name}.yaml").write_text(yaml.safe_dump(more))
        proc = snakemake(work, "-n", "--configfile", f"ood-{name}.yaml")
        jobs = planned_jobs(proc.stdout)
        assert jobs == {"derive_manifest": 1, "embed": n_enc, "ood_shard": n_enc, "aggregate_ood": 1, "report": 1,
                        "all": 1}, (name, jobs)
        tag = "blur_s8" if name == "sigma" else "jpeg_q20"
        assert f"demo-tiles__{tag}.npz" in proc.stdout


def test_audit_preset_plans_the_grids_ood_jobs(tmp_path):
    from fmaudit import grid
    from fmaudit.config import load_config
    from fmaudit.registry import load_dataset_registry

    work = copy_repo(tmp_path / "audit")
    preset = work / "resources" / "presets" / "audit.yaml"
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", str(preset)).stdout)
    config = load_config(preset)
    tables = grid.enumerate_runs(config, load_dataset_registry(work / "resources" / "datasets.yaml"))
    n = {name: len(grid.jobs(tables[name], name))
         for name in ("embed", "probe", "ood", "ood_blur", "ood_image_artefact", "ood_splits")}
    assert jobs["embed"] == n["embed"] + n["ood_blur"] + n["ood_image_artefact"] == 91 + 195
    assert jobs["ood_shard"] == n["ood"] == 91 and jobs["probe_shard"] == n["probe"] == 91
    assert jobs["ood_split_shard"] == n["ood_splits"] == 91  # the audit paper's further splits, one job per OOD shard
    assert jobs["derive_manifest"] == len(grid.derived_datasets(config)) == 5 * 3
    assert jobs["aggregate_ood"] == 1 and jobs["report"] == 1


@pytest.fixture(scope="module")
def variant_run(demo_run, tmp_path_factory):
    """The demo, in a copy of its results, with a declared resolution variant and the scratch reference at tiny
    size: what it plans, then its real run."""
    work = tmp_path_factory.mktemp("variant") / "demo"
    shutil.copytree(demo_run[0], work, symlinks=True)
    # the variant's base and one other encoder, without the OOD and cell branches (the variant is probed only)
    cfg = demo_tile_branches(yaml.safe_load((work / "config.yaml").read_text()), ["demo-dinov2-tiny", "demo-vit-tiny"],
                             drop=("cells", "ood"))
    cfg["variants"] = ["demo-dinov2-tiny.res96"]
    cfg["prior_shift"]["scratch_reference"] = {"enabled": True, "input_size": 16, "epochs": 1, "batch_size": 32,
                                               "gpu": False}
    (work / "variant.yaml").write_text(yaml.safe_dump(cfg))
    planned = planned_jobs(snakemake(work, "-n", "--configfile", "variant.yaml").stdout)
    snakemake(work, "--cores", "2", "--configfile", "variant.yaml")
    return work, cfg, planned


def test_a_variant_plans_its_embeddings_and_probe_shard_and_the_reference_its_jobs(variant_run):
    _, cfg, planned = variant_run
    # the config has the tile data sets and tasks only (demo_tile_branches): the variant is probed, not OOD/cells;
    # the data checks run again (the config names other data sets and classes: no ood block), and only they
    assert planned == {"validate": 1, "embed": len(cfg["datasets"]), "probe_shard": len(cfg["tasks"]),
                       "scratch_reference": len(cfg["prior_shift"]["seeds"]), "aggregate_probe": 1,
                       "aggregate_prior_shift": 1, "report": 1, "all": 1}, planned


def test_the_variant_is_paired_with_its_base_and_kept_out_of_the_rankings(variant_run):
    work, cfg, _ = variant_run
    tables = work / DEMO / "report" / "tables"
    pairs = pd.read_csv(tables / "encoder_variants.csv")
    assert set(pairs["base"]) == {"demo-dinov2-tiny"} and set(pairs["variant"]) == {"demo-dinov2-tiny.res96"}
    assert len(pairs) == len(cfg["tasks"]["demo-tissue"]["domains"]) ** 2  # every source x target
    assert (pairs["difference_ci_lo"] <= pairs["difference_ci_hi"]).all() and (pairs["n_boot"] > 0).all()
    for name in ("leaderboard", "cross_domain_leaderboard", "shift_summary", "paired_differences"):
        assert "demo-dinov2-tiny.res96" not in set(pd.read_csv(tables / f"{name}.csv")["encoder"]), name
    inventory = pd.read_csv(tables / "embeddings.csv")
    hashes = inventory.groupby("encoder")["encoder_config_hash"].first()
    assert hashes["demo-dinov2-tiny.res96"] != hashes["demo-dinov2-tiny"]
    assert "## Encoder variants" in (work / DEMO / "report" / "index.md").read_text()


def test_the_scratch_reference_is_a_row_of_the_transfer_table(variant_run):
    work, cfg, _ = variant_run
    reference = pd.read_csv(work / DEMO / "report" / "tables" / "transfer_reference.csv")
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


# ---- the cell branch (rules/cells.smk) -----------------------------------------------------------------


def test_the_demo_cell_branch_runs_end_to_end_and_nuc_beats_mean(demo_run):
    """Demo Xenium bundles generated from the real slide, registered, checked, embedded at the nuclei, probed
    under every protocol, aggregated and reported; labels planted at the nucleus are read better by Nuc than by
    the patch Mean."""
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cells = cfg["cells"]
    sections = [s for v in cells["sections"].values() for s in v]
    for s in sections:
        assert (work / DEMO / "cells" / "qc" / f"{s}.png").stat().st_size > 1000
        assert "registered" in (work / DEMO / "logs" / "prepare_cell_section" / f"{s}.log").read_text()
    checks = pd.read_csv(work / DEMO / "validation" / "cells.tsv", sep="\t")
    assert set(checks["status"]) <= {"ok", "allowed", "excluded"} and (checks["check"] == "partition_leakage").any()
    runs = pd.read_parquet(work / DEMO / "aggregate" / "cell_runs.parquet")
    assert set(runs["protocol"]) == set(cells["protocols"]) and set(runs["encoder"]) == set(cfg["encoders"])
    units = {"IS": len(sections), "IOCD": len(sections), "LOOO": len(cells["sections"])}  # two sections per organ
    n_expected = sum(units[p] * len(spec["seeds"]) for p, spec in cells["protocols"].items())
    n_expected *= (len(cfg["encoders"]) * len(cells["magnifications"]) * len(cells["taxonomies"])
                   * len(cells["readouts"]))
    assert len(runs) == n_expected
    convnet = runs[runs["encoder"] == "demo-convnet"]  # no class token: Cls and its fusions are skipped
    assert convnet.loc[convnet["readout"].str.contains("cls"), "status"].str.startswith("skipped").all()
    report = work / DEMO / "report"
    cra = pd.read_csv(report / "tables" / "cell_cra.csv")
    fine = cra[cra["taxonomy"] == "fine"]
    assert len(fine) == len(cfg["encoders"]) and fine["n_sections"].eq(len(sections)).all()
    # the planted signal: Nuc above Mean, on average over the encoders and for most of them
    assert fine["cra_mean_pp"].mean() > 0, fine[["encoder", "f1_nuc_mean_pct", "f1_mean_mean_pct", "cra_mean_pp"]]
    assert (fine["f1_nuc_mean_pct"] > fine["f1_mean_mean_pct"]).sum() >= len(fine) - 1
    for name in ("cell_crt", "cell_win_matrix", "cell_readouts", "cell_magnification_retention"):
        assert (report / "tables" / f"{name}.csv").stat().st_size > 0
    assert (report / "figures" / "cell_qc_overlays.png").stat().st_size > 10_000
    assert "## Cells (CellPath-Bench)" in (report / "index.md").read_text()


def test_the_demo_report_checks_its_own_claims(demo_run):
    """The demo's claims file (direction checks only) through the report's Paper check: one row per claim, each
    quantity computable from the demo's tables, and the shift the demo builds in reproduced."""
    from fmaudit.claims import STATUSES, claims_path, load_claims

    work, _ = demo_run
    report = work / DEMO / "report"
    table = pd.read_csv(report / "tables" / "paper_check.csv")
    claims = load_claims(claims_path("demo"))
    assert table["claim"].tolist() == [c.id for c in claims.claims] and set(table["status"]) <= set(STATUSES)
    assert (table["status"] != "not computable").all(), table[["claim", "why"]]
    verdict = table.set_index("claim")["status"]
    for claim in ("in-domain-above-off-domain", "ece-rises-off-domain", "far-tiles-detected", "nuc-above-mean"):
        assert verdict[claim] == "reproduced", table[["claim", "value", "why"]]
    assert "## Paper check" in (report / "index.md").read_text()
    for name in ("cell_decodability", "cell_cra_sections", "cell_subsets"):
        assert "note" not in pd.read_csv(report / "tables" / f"{name}.csv").columns, name
    rho = pd.read_csv(report / "tables" / "cell_taxonomy_consistency.csv")
    assert set(rho["protocol"]) == {"IS", "LOOO"} and rho["spearman_rho"].notna().all()  # fine vs coarse, 4 encoders


def test_the_cellpath_preset_plans_every_feature_and_shard_job(demo_run):
    """The CellPath plan through the Slurm profile: every feature and shard job, the feature jobs of each encoder
    a few to a cluster submission (at most 100 GPU submissions for the 30 encoders), each job asking for what
    `fmaudit grid --estimate` says (the same planner), sized by its encoder."""
    from fmaudit.cluster import planned_requests
    from fmaudit.config import load_config
    from fmaudit.grid import enumerate_runs, jobs
    from fmaudit.preflight import check_config
    from fmaudit.profiles import read_profile

    work, _ = demo_run
    proc = snakemake(work, "-n", "--profile", "profiles/slurm", "--configfile", "resources/presets/cellpath.yaml")
    planned = planned_jobs(proc.stdout)
    config = load_config(work / "resources" / "presets" / "cellpath.yaml")
    runs = enumerate_runs(config, None, "cells")
    assert len(runs) == 304_920
    assert planned["cell_shard"] == len(jobs(runs, "cells")) == 360
    assert planned["cell_features"] == len(jobs(enumerate_runs(config, None, "cell_features"), "cell_features")) == 750
    assert planned["prepare_cell_section"] == 25 and planned["cell_feature_set"] == 90
    assert proc.stdout.count("rule cell_features:") == 750
    # the cluster submissions of the feature jobs: one group per encoder, split into components (the profile's)
    groups = re.findall(r"Group job cell_features_(\S+) \(", proc.stdout)
    assert len(groups) <= 100 and set(groups) == set(config["encoders"])
    # each job's request, as the dry run prints it, is the estimate's
    encoders, datasets = check_config(config)
    expected = planned_requests(config, encoders, datasets, read_profile([work / "profiles" / "slurm"]),
                                work / "results" / "cellpath")
    expected = expected[expected["rule"] == "cell_features"]
    want = {(r.encoder, r.job.split("/")[1]): (r.request.mem_mb, r.request.runtime_min) for r in expected.itertuples()}
    seen = {}
    for block in proc.stdout.split("rule cell_features:")[1:]:
        wildcards = dict(re.findall(r"(\w+)=([^,\s]+)", re.search(r"wildcards: (.*)", block).group(1)))
        resources = dict(re.findall(r"(\w+)=([^,\s]+)", re.search(r"resources: (.*)", block).group(1)))
        seen[(wildcards["encoder"], wildcards["section"])] = (int(resources["mem_mb"]), int(resources["runtime"]))
    assert seen == want
    sizes = {enc: seen[(enc, "breast-1")] for enc in ("kaiko-vits16", "h-optimus-1")}
    assert sizes["h-optimus-1"][0] > sizes["kaiko-vits16"][0] and sizes["h-optimus-1"][1] > sizes["kaiko-vits16"][1]


# ---- a new analysis is a short declared path (docs/contributing.md; the toy: tests/toy_analysis.py) ------------


def test_a_new_analysis_through_its_declared_path_runs_and_is_reported(demo_run, tmp_path_factory):
    # tests/test_contributing.py checks the toy's files against the guide and its count in `fmaudit grid`
    work = _copy(demo_run, tmp_path_factory, "toy")
    add_toy_analysis(work)
    planned = planned_jobs(snakemake(work, "-n").stdout)
    assert set(planned) == {"toy_shard", "report", "all"}, planned  # nothing of the finished demo reruns
    snakemake(work, "--cores", "2")
    report = work / DEMO / "report"
    norms = pd.read_csv(report / "tables" / "toy_norms.csv")
    assert len(norms) == planned["toy_shard"] and (norms["mean_norm"] > 0).all()
    assert "## Toy" in (report / "index.md").read_text()
    # its setting reruns its jobs and the report, nothing else, and shows in its numbers and its caption
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["toy"] = {"scale": 2.0}
    (work / "toy.yaml").write_text(yaml.safe_dump(cfg))
    assert set(planned_jobs(snakemake(work, "-n", "--configfile", "toy.yaml").stdout)) == {"toy_shard", "report", "all"}
    snakemake(work, "--cores", "2", "--configfile", "toy.yaml")
    doubled = pd.read_csv(report / "tables" / "toy_norms.csv")
    np.testing.assert_allclose(doubled["mean_norm"], 2 * norms["mean_norm"], rtol=1e-6)
    snakemake(work, "--configfile", "toy.yaml", "--report", str(DEMO / "report" / "report.html"))
    assert "times 2.0" in (report / "report.html").read_text(errors="replace")


# ---- every setting of the demo reruns what docs/settings.md says (fmaudit.settings_reference, the schema's x-reruns)

#: One other valid value for each setting the demo's config.yaml sets (and a few of the defaults it keeps).
DEMO_EDITS = {
    "study": "demo-b",
    "data_root": "results/demo_data_b",
    "dataset_params.demo-tiles.seed": 1,
    "dataset_params.demo-tiles.n_patients_per_domain": 24,
    "dataset_params.demo-tiles.tiles_per_patient_per_class": 3,
    "dataset_params.demo-tiles.tissue_mixing": 0.4,
    "dataset_params.demo-tiles.patient_variability": 1.4,
    "dataset_params.demo-tiles.shift_strength": 0.6,
    "tasks.demo-tissue.description": "Another sentence.",
    "tasks.demo-tissue.domains": ["scanner-c", "scanner-b", "scanner-a"],
    "tasks.demo-tissue.transfer": False,
    "tasks.demo-tissue.ordinal": True,
    "tasks.demo-tissue.allow_missing_classes": ["mucus"],
    "tasks.demo-cells-fine.description": "Another sentence.",
    "tasks.demo-cells-fine.allow_missing_classes": ["T cell"],
    "probe.heads": ["logistic", "nearest_centroid"],
    "probe.C": 0.5,
    "probe.fractions": [0.2, 1.0],
    "probe.seeds": [0, 2],
    "probe.val_fraction": 0.3,
    "probe.readout": "mean",
    "probe.standardize": False,
    "calibration.ece_bins": 10,
    "calibration.kshot_k": [4, 8],
    "calibration.kshot_draws": 4,
    "calibration.validation_labels": "proportional",
    "calibration.include_bound_temperatures": True,
    "bootstrap.n_boot": 150,
    "bootstrap.seed": 1,
    "bootstrap.paired_n_boot": 500,
    "ood.scorers": ["maha", "knn"],
    "ood.far": {},
    "ood.blur.sigmas": [2.0],
    "ood.blur.tasks": [],
    "ood.near.demo-tissue": ["stroma"],
    "ood.artefact.demo-tissue": ["stroma"],
    "ood.image_artefact.specs": [{"kind": "bubble"}],
    "ood.probe.C": 0.5,
    "ood.gate.n_splits": 3,
    "ood.gate.near": False,
    "ood.gate.retain": 0.7,
    "ood.knn_k": 20,
    "prior_shift.source_domains": ["scanner-b"],
    "prior_shift.target_domains": ["scanner-c"],
    "prior_shift.seeds": [0],
    "prior_shift.draws": 2,
    "prior_shift.sample_size": 50,
    "prior_shift.priors": {"balanced": {"tumour": 0.2, "stroma": 0.2, "lymphocytes": 0.2, "adipose": 0.2, "mucus": 0.2},
                           "stroma-rich": {"tumour": 0.15, "stroma": 0.4, "lymphocytes": 0.2, "adipose": 0.15,
                                           "mucus": 0.1}},
    "prior_shift.methods": ["none", "bbse"],
    "prior_shift.model_selection": ["max_marginal_entropy"],
    "prior_shift.C": 0.5,
    "cells.taxonomies": {"fine-types": "demo-cells-fine", "coarse": "demo-cells-coarse"},
    "cells.sections": {"organ-a": ["organ-a-1", "organ-a-2"], "organ-b": ["organ-b-1"]},
    "cells.magnifications": [10, 20],
    "cells.readouts": ["nuc", "mean"],
    "cells.probe.C": [1.0],
    "cells.probe.max_train_cells": 100,
    "cells.probe.max_val_cells": 50,
    "cells.protocols.IS.seeds": [0, 1],
    "cells.protocols.LOOO.seeds": [1],
    "cells.subsets.lists": {"S2": ["organ-a-1", "organ-b-1"], "S3": ["organ-a-1", "organ-b-1", "organ-a-2"]},
    "ood.extra_splits.seeds": [0],
    "claims": [],
}
#: Lists of what the study holds; adding or removing one plans its own jobs (test_adding_an_encoder_plans_only_its_jobs,
#: test_removing_an_encoder_reaggregates_only, test_adding_an_ood_tier_embeds_only_its_copies ...).
NOT_EDITED = {"encoders", "datasets", "tasks.<task>.datasets",
              "prior_shift.task"}  # the demo has one tile task
#: Where the demo's edit reruns a part of what the setting can rerun: settings declared for tiles and cells at once
#: (an edit of one data set or task reruns its own kind), and edits that remove something (no new job to make).
PARTLY = {"dataset_params": "a tile data set's parameters", "tasks.<task>.allow_missing_classes": "a tile task's",
          "ood.far": "the far tier removed: nothing to embed", "ood.blur.tasks": "the blur tier removed",
          "cells.sections": "a section removed: nothing to prepare"}


def _demo_settings(node, prefix=""):
    """Dotted paths of every value config.yaml sets (a mapping of names, such as ood.near, down to its names)."""
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _demo_settings(value, path + ".")
        else:
            yield path


def _edited(cfg, path, value):
    cfg = copy.deepcopy(cfg)
    node = cfg
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return cfg


def test_every_setting_of_the_demo_reruns_what_the_settings_page_says(demo_run):
    from fmaudit.settings_reference import EVERYTHING, reruns_of, settings

    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    declared_at = {s.path: s.declared_at for s in settings()}

    def setting_of(path):  # the schema's key of a config path (tasks.demo-tissue.ordinal -> tasks.<task>.ordinal)
        parts = path.split(".")
        if parts[0] in ("tasks", "dataset_params"):
            parts[1] = "<task>" if parts[0] == "tasks" else "<dataset>"
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in declared_at:
                return ".".join(parts[:n])
        raise KeyError(path)

    covered = {setting_of(p) for p in DEMO_EDITS}
    missing = {setting_of(p) for p in _demo_settings(cfg)} - covered - NOT_EDITED
    assert not missing, f"add an edit of these demo settings to DEMO_EDITS: {sorted(missing)}"

    def plan(item):
        n, (path, value) = item
        (work / f"setting-{n}.yaml").write_text(yaml.safe_dump(_edited(cfg, path, value)))
        return path, set(planned_jobs(snakemake(work, "-n", "--configfile", f"setting-{n}.yaml").stdout)) - {"all"}

    with ThreadPoolExecutor(max_workers=2) as pool:
        planned = dict(pool.map(plan, enumerate(DEMO_EDITS.items())))
    every_rule = planned["study"]  # a new results folder: every rule the demo has
    wrong = {}
    for path, rules in planned.items():
        declared = reruns_of(path)
        expected = every_rule if declared == (EVERYTHING,) else set(declared) & every_rule
        partly = setting_of(path) in PARTLY
        if (partly and not (rules <= expected and bool(rules) == bool(expected))) or (not partly and rules != expected):
            wrong[path] = {"planned": sorted(rules), "docs/settings.md": sorted(expected)}
    assert not wrong, wrong


def test_an_edit_made_with_a_task_edit_reruns_its_own_jobs_too(demo_run):
    # the data checks rerun (allow_missing_classes): the probe shards behind them are still checked on their params
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["tasks"]["demo-tissue"]["allow_missing_classes"] = ["mucus"]
    cfg["probe"]["C"] = 0.5
    (work / "two-edits.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", "two-edits.yaml").stdout)
    assert set(jobs) == {"validate", "probe_shard", "aggregate_probe", "report", "all"}, jobs
    assert jobs["probe_shard"] == len(cfg["encoders"])

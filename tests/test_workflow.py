"""The demo config end to end through real Snakemake, in a fresh copy of the repository."""

from __future__ import annotations

import json
import shutil

import numpy as np
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


def test_demo_runs_every_ood_tier_with_a_gate_per_encoder(demo_run):
    from fmaudit import grid
    from fmaudit.config import load_config

    work, _ = demo_run
    config = load_config(work / "config.yaml")
    report = work / "results" / "report"
    detection = pd.read_csv(report / "tables" / "ood_detection.csv")
    planned = grid.ood_runs(config)
    assert set(zip(detection["encoder"], detection["condition"], detection["scorer"])) == set(
        zip(planned["encoder"], planned["condition"], planned["scorer"]))
    assert set(detection["tier"]) == {"far", "blur", "near", "artefact", "image_artefact"}
    assert (detection["ci_unit"] == "group (patient/slide)").all() and (detection["n_boot"] == 200).all()
    far = detection[(detection["tier"] == "far") & (detection["scorer"] == "maha")]
    assert (far["auroc"] > 0.9).all(), far  # real H&E slide tiles against the synthetic tiles
    for name in ("ood_detection_by_tier", "ood_gate", "ood_gate_summary", "ood_selective", "ood_blur"):
        assert "note" not in pd.read_csv(report / "tables" / f"{name}.csv").columns, name
    blur = pd.read_csv(report / "tables" / "ood_blur.csv")
    assert sorted(blur["sigma"].unique()) == [0.0, 4.0] and blur["accuracy_change_ci_lo"].notna().any()
    for enc in config["encoders"]:
        card = json.loads((work / "results" / "ood" / "gates" / "demo-tissue" / enc / "gate.json").read_text())
        assert card["encoder"] == enc and card["class_names"] == ["tumour", "stroma", "lymphocytes", "adipose", "mucus"]
    index = (report / "index.md").read_text()
    assert "## OOD detection and abstention" in index and "unit=group (patient/slide), n=" in index


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
    copies = 2  # the blurred and the pen-marked copies of the demo's test split (OOD tiers)
    assert jobs.get("embed") == len(cfg["datasets"]) + copies, jobs
    assert jobs.get("probe_shard") == len(cfg["tasks"]) == jobs.get("ood_shard"), jobs
    assert "prepare_manifest" not in jobs and "derive_manifest" not in jobs
    assert jobs.get("aggregate_probe") == 1 and jobs.get("aggregate_ood") == 1 and jobs.get("report") == 1


def test_removing_an_encoder_reaggregates_only(demo_run):
    work, _ = demo_run
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["encoders"] = cfg["encoders"][:1]
    (work / "fewer.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(snakemake(work, "-n", "--configfile", "fewer.yaml").stdout)
    assert set(jobs) == {"aggregate_probe", "aggregate_ood", "report", "all"}, jobs


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
    assert set(planned) == {"probe_shard", "aggregate_probe", "ood_shard", "aggregate_ood", "report", "all"}, planned


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
    ood = table("ood_selective")
    assert "ece_top_10_lohi" in ood and not any("_15" in c for c in ood.columns) and (ood["n_boot"] == 50).all()
    assert (table("ood_detection")["n_boot"] == 50).all()
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
    res = work / "results"
    table = read_table(res / "aggregate" / "ood_gate.parquet")
    man = read_table(res / "manifests" / "demo-tiles.parquet")
    names = man.drop_duplicates("label").sort_values("label")["label_name"].tolist()
    near = "mucus"
    rates = []
    for enc in yaml.safe_load((work / "config.yaml").read_text())["encoders"]:
        gate_dir = res / "ood" / "gates" / "demo-tissue" / enc
        readout = json.loads((gate_dir / "gate.json").read_text())["readout"]
        ids, X = read_embeddings(res / "embeddings" / enc / "demo-tiles.npz", readout)
        pos = {i: n for n, i in enumerate(ids)}
        test = man[man["split"] == "test"]
        x_test = X[[pos[i] for i in test["item_id"]]]
        y_test = test["label"].to_numpy().astype(int)
        table_enc = table[table["encoder"] == enc]
        _check(table_enc, "demo-tissue", "test", _apply(gate_dir, x_test, readout, tmp_path, f"{enc}_test"), y_test)
        _, far = read_embeddings(res / "embeddings" / enc / "cmu-small-region.npz", readout)
        _check(table_enc, "demo-tissue", "far_cmu-small-region", _apply(gate_dir, far, readout, tmp_path, f"{enc}_far"),
               None)
        for tag in ("blur_s4", "pen_seed0"):
            d_ids, d_X = read_embeddings(res / "embeddings" / enc / f"demo-tiles__{tag}.npz", readout)
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
                         ("jpeg", lambda c: c["ood"]["image_artefact"]["specs"].append({"kind": "jpeg", "quality": 20}))):
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
    n = {name: len(grid.jobs(tables[name], name)) for name in ("embed", "probe", "ood", "ood_blur", "ood_image_artefact")}
    assert jobs["embed"] == n["embed"] + n["ood_blur"] + n["ood_image_artefact"] == 91 + 195
    assert jobs["ood_shard"] == n["ood"] == 91 and jobs["probe_shard"] == n["probe"] == 91
    assert jobs["derive_manifest"] == len(grid.derived_datasets(config)) == 5 * 3
    assert jobs["aggregate_ood"] == 1 and jobs["report"] == 1

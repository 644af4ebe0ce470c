"""The prior-shift jobs on the tiny task of the job chain: shards equal the grid's runs, the aggregate stacks
them, the scratch reference trains at tiny size, and the report shows every prior-shift table with the exposure
column; bad pools and pairs are named."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fmaudit import grid
from fmaudit.config import fill_section
from fmaudit.io import FmauditInputError, read_table
from fmaudit.report import report_files

from .conftest import BOOTSTRAP, CALIBRATION, TASK

CLASSES = ["tumour", "stroma", "lymphocytes", "adipose", "mucus"]
PRIOR_SHIFT = fill_section("prior_shift", {
    "task": "demo", "source_domains": ["scanner-a"], "target_domains": ["scanner-b"], "seeds": [0, 1], "draws": 2,
    "sample_size": 20,
    "priors": {"balanced": dict.fromkeys(CLASSES, 0.2),
               "tumour-rich": {"tumour": 0.6, "stroma": 0.1, "lymphocytes": 0.1, "adipose": 0.1, "mucus": 0.1}},
    "methods": ["none", "global_standardization", "class_balanced_restandardization", "shot_im", "bbse",
                "oracle_restandardization"],
    "shot_im": {"epochs": 2}, "scratch_reference": {"enabled": True, "input_size": 16, "epochs": 1, "batch_size": 16}})
ENCODERS = ("enc-a", "enc-b")


def _shard_settings() -> dict:
    return {k: v for k, v in PRIOR_SHIFT.items() if k not in ("model_selection", "scratch_reference")}


@pytest.fixture(scope="module")
def prior_chain(job_chain, tmp_path_factory):
    from fmaudit.jobs.prior_shift import aggregate_prior_shift_job, prior_shift_shard_job, scratch_reference_job
    from fmaudit.jobs.report import report_job

    root = tmp_path_factory.mktemp("prior")
    manifest = str(job_chain["manifest"])
    out = {"runs": [], "pools": []}
    for enc in ENCODERS:
        runs, pool = root / f"{enc}.runs.parquet", root / f"{enc}.pool.parquet"
        prior_shift_shard_job(enc, "demo", TASK, "scanner-a", "scanner-b", [manifest],
                              [str(job_chain[f"embeddings_{enc}"])], _shard_settings(), CALIBRATION, "cls",
                              str(runs), str(pool), log=str(root / f"{enc}.log"))
        out["runs"].append(runs)
        out["pools"].append(pool)
    out["scratch"] = root / "scratch-seed0.parquet"
    settings = {k: v for k, v in PRIOR_SHIFT["scratch_reference"].items() if k not in ("enabled", "gpu")}
    scratch_reference_job("demo", TASK, "scanner-a", ["scanner-b"], 0, [manifest], "all", 0.2, settings,
                          CALIBRATION["ece_bins"], str(out["scratch"]), threads=1, log=str(root / "scratch.log"))
    agg = {k: root / "aggregate" / f"{k}.parquet" for k in ("runs", "pool", "scratch")}
    aggregate_prior_shift_job([str(p) for p in out["runs"]], [str(p) for p in out["pools"]], [str(out["scratch"])],
                              str(agg["runs"]), str(agg["pool"]), str(agg["scratch"]), log=str(root / "agg.log"))
    exposure = {"encoders": {e: {"pretraining_corpora": ["a corpus naming demo-tiles"] if e == "enc-a" else [],
                                 "exposure": {}, "weights": {"source": "random"}} for e in ENCODERS},
                "datasets": {"demo-tiles": {"aliases": []}}, "pairs": [[e, "demo-tiles"] for e in ENCODERS]}
    report = root / "report"
    inputs = {"probe_runs": [str(job_chain["aggregate"])],
              "probe_predictions": [str(job_chain[f"predictions_{e}"]) for e in ENCODERS],
              "embeddings": [str(job_chain[f"embeddings_{e}"]) for e in ENCODERS],
              "prior_shift_runs": [str(agg["runs"])], "prior_shift_pool": [str(agg["pool"])],
              "scratch_reference": [str(agg["scratch"])]}
    settings = {"calibration": {"demo": CALIBRATION}, "bootstrap": {"demo": BOOTSTRAP}, "exposure": exposure,
                "prior_shift": {"demo": {"model_selection": PRIOR_SHIFT["model_selection"]}}}
    report_job(inputs, settings, str(report), log=str(root / "report.log"))
    return {**out, "aggregate": agg, "report": report, "root": root}


def test_shard_rows_are_exactly_the_grids_runs_times_methods(prior_chain):
    config = {"encoders": ["enc-a"], "tasks": {"demo": TASK}, "prior_shift": PRIOR_SHIFT}
    expected = grid.prior_shift_runs(config)
    rows = read_table(prior_chain["runs"][0])
    methods = set(PRIOR_SHIFT["methods"])
    assert set(rows["method"]) == methods
    keys = ["seed", "prior", "draw"]
    got = rows[rows["method"] == "none"][keys].astype({"prior": str}).sort_values(keys).reset_index(drop=True)
    want = expected[keys].astype({"prior": str, "seed": int, "draw": int}).sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert len(rows) == len(expected) * len(methods)
    assert (rows.loc[rows["method"] == "none", "gain_macro_f1"] == 0).all()
    assert (rows["n_items"] == PRIOR_SHIFT["sample_size"]).all()
    # the target pool holds 8 items per class: the tumour-rich draws need 12 tumour items, with replacement
    rich = rows[rows["prior"] == "tumour-rich"]
    assert (rich["classes_with_replacement"] == "tumour").all()
    assert "runs/s" in (prior_chain["root"] / "enc-a.log").read_text()


def test_pool_rows_are_the_unadapted_probe_on_the_whole_target(prior_chain, job_chain):
    pool = read_table(prior_chain["pools"][0])
    man = read_table(job_chain["manifest"])
    assert len(pool) == 2 and set(pool["seed"]) == {0, 1}
    assert (pool["n_items"] == int((man["domain"] == "scanner-b").sum())).all()
    assert (pool["method"] == "none").all() and pool["in_domain_macro_f1"].between(0, 1).all()


def test_aggregate_stacks_every_shard(prior_chain):
    agg = read_table(prior_chain["aggregate"]["runs"])
    assert set(agg["encoder"]) == set(ENCODERS)
    assert len(agg) == sum(len(read_table(p)) for p in prior_chain["runs"])
    assert len(read_table(prior_chain["aggregate"]["scratch"])) == 2  # in-domain + one target


def test_scratch_reference_trains_and_scores_on_the_same_pools(prior_chain):
    rows = read_table(prior_chain["scratch"])
    assert list(rows["target_domain"]) == ["scanner-a", "scanner-b"]
    assert rows["in_domain"].tolist() == [True, False] and not rows["frozen"].any()
    assert (rows["input_size"] == 16).all() and rows["macro_f1"].between(0, 1).all()
    pool = read_table(prior_chain["pools"][0])
    assert int(rows.loc[~rows["in_domain"], "n_items"].iloc[0]) == int(pool["n_items"].iloc[0])


def test_report_shows_prior_shift_tables_with_exposure(prior_chain):
    report = prior_chain["report"]
    declared = report_files(["enc-a", "enc-b"])
    assert {str(p.relative_to(report)) for p in report.rglob("*") if p.is_file()} == declared
    tables = report / "tables"
    summary = pd.read_csv(tables / "prior_shift_summary.csv")
    assert set(summary["method"]) == set(PRIOR_SHIFT["methods"])
    assert (summary["unit"].str.contains("encoder > seed > draw").all()
            and (summary["n_boot"] == BOOTSTRAP["n_boot"]).all())
    assert summary["negative_cells"].str.fullmatch(r"\d+/4").all()  # 2 encoders x 1 target x 2 priors
    cells = pd.read_csv(tables / "prior_shift_negative_cells.csv")
    assert cells.set_index("encoder")["exposure"].to_dict() == {"enc-a": "yes: demo-tiles", "enc-b": "no: demo-tiles"}
    board = pd.read_csv(tables / "leaderboard.csv")
    assert "exposure" in board.columns and board["exposure"].notna().all()
    ref = pd.read_csv(tables / "transfer_reference.csv")
    assert set(ref["model"]) == {"enc-a", "enc-b", "resnet18-scratch"}
    scratch = ref[ref["model"] == "resnet18-scratch"]
    assert (scratch["rank_on_target"].isna().all()
            and (scratch["exposure"] == "no pretraining (trained on the source)").all())
    regret = pd.read_csv(tables / "prior_shift_regret.csv")
    assert set(regret["rule"]) == set(PRIOR_SHIFT["model_selection"]) and (regret["n_encoders"] == 2).all()
    audit = pd.read_csv(tables / "exposure_audit.csv")
    assert set(zip(audit["encoder"], audit["exposure"])) == {("enc-a", "yes"), ("enc-b", "no")}
    index = (report / "index.md").read_text()
    assert "## Class-prior shift and label-free adaptation" in index and "## Pretraining exposure" in index
    assert (report / "figures" / "prior_shift_gains.png").stat().st_size > 1000


def test_pools_name_what_is_missing():
    from fmaudit.jobs.prior_shift import pool_index

    domains, splits = np.array(["a", "a", "b"]), np.array(["test", "train", "train"])
    assert pool_index(domains, splits, "a", "source").tolist() == [1]
    assert pool_index(domains, splits, "a", "target", "test").tolist() == [0]
    assert pool_index(domains, splits, "b", "target", "all").tolist() == [2]
    with pytest.raises(FmauditInputError, match="target domain 'b'.*target pool 'test'"):
        pool_index(domains, splits, "b", "target", "test")
    with pytest.raises(FmauditInputError, match="source domain 'c'"):
        pool_index(domains, splits, "c", "source")


def test_a_pair_outside_the_grid_is_named(job_chain, tmp_path):
    from fmaudit.jobs.prior_shift import prior_shift_shard_job

    with pytest.raises(FmauditInputError, match=r"\(scanner-b -> scanner-a\) is not a \(source, target\) pair"):
        prior_shift_shard_job("enc-a", "demo", TASK, "scanner-b", "scanner-a", [str(job_chain["manifest"])],
                              [str(job_chain["embeddings_enc-a"])], _shard_settings(), CALIBRATION, "cls",
                              str(tmp_path / "r.parquet"), str(tmp_path / "p.parquet"))
    assert not (tmp_path / "r.parquet").exists()

"""The probe jobs: a shard runs its grid on the task's data with the given settings; the aggregate stacks shards."""

import numpy as np
import pandas as pd
import pytest

from fmaudit import grid
from fmaudit.io import FmauditInputError, read_provenance, read_table

from .conftest import BOOTSTRAP, CALIBRATION, PROBE, TASK


def test_shard_runs_every_run_of_its_grid_with_the_settings_given(job_chain):
    rows = read_table(job_chain["runs_enc-a"])
    expected = grid.probe_runs({"encoders": ["enc-a"], "tasks": {"demo": TASK}, "probe": PROBE})
    assert set(rows["run_id"]) == set(expected["run_id"])
    # in-domain and the other domain, four ladder stages (raw, source, oracle, K=4)
    assert len(rows) == len(expected) * 2 * 4
    assert "ece_top_10_lohi" in rows and not any("_15" in c for c in rows.columns)
    assert (rows["n_boot"] == BOOTSTRAP["n_boot"]).all()
    assert set(rows.loc[rows["stage"] == "kshot_ts", "k"]) == {4.0}
    assert rows["ece_convention"].str.contains(f"{CALIBRATION['ece_bins']} equal-width bins").all()
    prov = read_provenance(job_chain["runs_enc-a"])
    assert prov["encoder"] == "enc-a" and prov["task"] == "demo"
    assert list(prov["embeddings"].values()) == ["hash-0"]


def test_shard_predictions_keep_logits_of_every_test_item(job_chain):
    preds = read_table(job_chain["predictions_enc-a"])
    man = read_table(job_chain["manifest"])
    n_test = int((man["split"] == "test").sum())
    runs = preds.groupby("run_id").size()
    assert len(runs) == 2 * 2 * 2  # sources x fractions x seeds
    # each run is evaluated on its own domain's test split and on the other domain's test split
    assert (runs == n_test).all()
    assert np.stack(preds["logits"].to_numpy()).shape[1] == 5


def test_the_noisier_encoder_scores_lower(job_chain):
    rows = pd.concat([read_table(job_chain[f"runs_{e}"]) for e in ("enc-a", "enc-b")])
    raw = rows[(rows["stage"] == "raw") & (rows["fraction"] == 1.0)]
    f1 = raw.groupby("encoder")["macro_f1"].mean()
    assert f1["enc-a"] > f1["enc-b"]


def test_aggregate_stacks_every_shard(job_chain):
    agg = read_table(job_chain["aggregate"])
    parts = [read_table(job_chain[f"runs_{e}"]) for e in ("enc-a", "enc-b")]
    assert len(agg) == sum(len(p) for p in parts)
    assert read_provenance(job_chain["aggregate"])["shards"] == [str(job_chain[f"runs_{e}"])
                                                                 for e in ("enc-a", "enc-b")]


def test_shard_with_embeddings_of_another_manifest_names_the_file(job_chain, tmp_path):
    from fmaudit.io import write_npz
    from fmaudit.jobs.probe import probe_shard_job

    bad = tmp_path / "enc-x" / "demo-tiles.npz"
    write_npz(bad, {"item_id": np.array(["nope"]), "feat__cls": np.zeros((1, 8), np.float32)}, {})
    with pytest.raises(FmauditInputError, match="demo-tiles.npz"):
        probe_shard_job("enc-x", "demo", TASK, [str(job_chain["manifest"])], [str(bad)], PROBE, CALIBRATION,
                        BOOTSTRAP, str(tmp_path / "r.parquet"), str(tmp_path / "p.parquet"))
    assert not (tmp_path / "r.parquet").exists()

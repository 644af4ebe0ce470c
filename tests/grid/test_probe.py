"""The probe grid is a pure function of the config; the shard jobs and the summary share it."""

import pandas as pd

from fmaudit import grid
from fmaudit.config import fill_config


def _config(**probe):
    return fill_config({
        "data_root": "data",
        "encoders": ["a", "b"],
        "datasets": ["d1"],
        "tasks": {"t": {"datasets": ["d1"], "domains": ["x", "y", "z"]}, "u": {"datasets": ["d1"], "transfer": False}},
        "probe": {"fractions": [0.1, 1.0], "seeds": [0, 1, 2], "heads": ["logistic", "1nn"], **probe},
    })


def test_probe_runs_counts_and_uniqueness():
    runs = grid.probe_runs(_config(), dataset_registry={"d1": {"domains": ["p", "q"]}})
    # t: 2 enc × 3 domains × 2 heads × 2 fractions × 3 seeds; u: 2 × 2 × 2 × 2 × 3
    assert len(runs) == 72 + 48
    assert not runs.duplicated(["encoder", "task", "run_id"]).any()
    t = runs[runs["task"] == "t"]
    assert set(t["n_targets"]) == {3}
    assert set(runs[runs["task"] == "u"]["n_targets"]) == {1}
    assert runs.loc[runs["head"] == "1nn", "C"].isna().all()


def test_grid_is_deterministic_and_config_only():
    a = grid.probe_runs(_config())
    b = grid.probe_runs(_config())
    pd.testing.assert_frame_equal(a, b)


def test_adding_an_encoder_does_not_change_other_shards():
    cfg = _config()
    before = grid.probe_runs(cfg)
    cfg["encoders"].append("c")
    after = grid.probe_runs(cfg)
    pd.testing.assert_frame_equal(before, after[after["encoder"] != "c"].reset_index(drop=True))
    assert len(grid.shards(cfg)) == 3 * 2


def test_c_grid_gives_one_labelled_probe_per_value():
    cfg = _config(C=[0.01, 1.0, 100.0], heads=["logistic", "1nn"])
    runs = grid.probe_runs(cfg)
    t = runs[(runs["task"] == "t") & (runs["encoder"] == "a")]
    assert sorted(t["probe"].unique()) == ["1nn", "logistic_C0.01", "logistic_C1", "logistic_C100"]
    assert set(t.loc[t["head"] == "logistic", "C"]) == {0.01, 1.0, 100.0}
    assert not runs.duplicated(["encoder", "task", "run_id"]).any()
    single = grid.probe_runs(_config())
    assert set(single["probe"]) == {"logistic", "1nn"}

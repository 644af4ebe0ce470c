"""`fmaudit probe` on arrays made elsewhere: the workflow's functions and settings, clear errors."""


import numpy as np
import pandas as pd
import pytest

from fmaudit.cli import main


@pytest.fixture()
def arrays(tmp_path):
    rng = np.random.default_rng(0)
    means = rng.normal(scale=2, size=(3, 6))
    def draw(n):
        y = np.repeat(np.arange(3), n)
        return means[y] + rng.normal(size=(len(y), 6)), y
    for split, n in (("train", 20), ("test", 10)):
        x, y = draw(n)
        np.save(tmp_path / f"x_{split}.npy", x)
        np.save(tmp_path / f"y_{split}.npy", y)
    return tmp_path


def probe_args(d, *extra):
    return ["probe", "--train-features", str(d / "x_train.npy"), "--train-labels", str(d / "y_train.npy"),
            "--test-features", str(d / "x_test.npy"), "--test-labels", str(d / "y_test.npy"),
            "--kshot-k", "4,8", "--kshot-draws", "3", "--n-boot", "50", *extra]


def test_probe_writes_one_row_per_fraction_and_seed(arrays):
    out = arrays / "runs.csv"
    assert main(probe_args(arrays, "--fractions", "0.25,1", "--seeds", "0,1", "--out", str(out))) == 0
    df = pd.read_csv(out)
    assert len(df) == 4
    for col in ("macro_f1", "ece_top_15_lohi", "nll", "brier_sum", "auroc_ovr_macro", "adaptive_ece_15_equalmass",
                "ece_top_15_lohi__source_ts", "ece_top_15_lohi__oracle_ts", "ece_top_15_lohi__kshot4_ts",
                "temperature__source_ts", "label_budget", "macro_f1_ci_lo"):
        assert col in df.columns, col
    assert (df["macro_f1"] > 0.8).all()


def test_probe_reads_hdf5_features(arrays):
    import h5py

    with h5py.File(arrays / "train.h5", "w") as f:
        f["features"] = np.load(arrays / "x_train.npy")[None]
    out = arrays / "h5.csv"
    args = probe_args(arrays, "--out", str(out))
    args[args.index("--train-features") + 1] = str(arrays / "train.h5")
    assert main(args) == 0
    ref = arrays / "npy.csv"
    assert main(probe_args(arrays, "--out", str(ref))) == 0
    pd.testing.assert_frame_equal(pd.read_csv(out), pd.read_csv(ref))


def test_mismatched_dimensions_and_lengths_are_errors(arrays, capsys):
    np.save(arrays / "x_bad.npy", np.zeros((30, 5)))
    args = probe_args(arrays, "--out", str(arrays / "o.csv"))
    args[args.index("--test-features") + 1] = str(arrays / "x_bad.npy")
    assert main(args) == 2
    assert "differ in dimension" in capsys.readouterr().err
    np.save(arrays / "y_short.npy", np.zeros(3, int))
    args = probe_args(arrays, "--out", str(arrays / "o.csv"))
    args[args.index("--train-labels") + 1] = str(arrays / "y_short.npy")
    assert main(args) == 2
    assert "y_short.npy" in capsys.readouterr().err


def test_nan_features_are_named(arrays, capsys):
    x = np.load(arrays / "x_train.npy")
    x[7, 2] = np.nan
    np.save(arrays / "x_nan.npy", x)
    args = probe_args(arrays, "--out", str(arrays / "o.csv"))
    args[args.index("--train-features") + 1] = str(arrays / "x_nan.npy")
    assert main(args) == 2
    assert "row 7" in capsys.readouterr().err


def test_probe_c_grid(arrays):
    out = arrays / "grid.csv"
    assert main(probe_args(arrays, "--C", "0.001,10", "--out", str(out))) == 0
    df = pd.read_csv(out)
    assert sorted(df["head"]) == ["logistic_C0.001", "logistic_C10"]
    assert df.set_index("head").loc["logistic_C0.001", "nll"] != df.set_index("head").loc["logistic_C10", "nll"]


def test_option_defaults_are_the_config_schema_defaults():
    from fmaudit.cli import build_parser
    from fmaudit.config import fill_section

    args = build_parser().parse_args(["probe", "--train-features", "a", "--train-labels", "b", "--test-features", "c",
                                      "--test-labels", "d", "--out", "e"])
    probe, calibration, bootstrap = (fill_section("probe", {}), fill_section("calibration", {}),
                                     fill_section("bootstrap", {}))
    assert args.fractions == probe["fractions"] and args.seeds == probe["seeds"] and args.heads == probe["heads"]
    assert args.standardize == probe["standardize"] and args.subsample == probe["subsample"]
    assert args.validation_labels == calibration["validation_labels"]
    assert args.budget_validation_share == calibration["budget_validation_share"]
    assert args.include_bound_temperatures == calibration["include_bound_temperatures"]
    assert args.prism_ece == calibration["prism_ece"]
    assert args.C == [probe["C"]] and args.val_fraction == probe["val_fraction"]
    assert args.kshot_k == calibration["kshot_k"] and args.kshot_draws == calibration["kshot_draws"]
    assert args.ece_bins == calibration["ece_bins"]
    assert args.n_boot == bootstrap["n_boot"] and args.bootstrap_seed == bootstrap["seed"]


def test_ece_bins_name_the_columns_and_bad_settings_name_the_option(arrays, capsys):
    out = arrays / "bins.csv"
    assert main(probe_args(arrays, "--ece-bins", "10", "--out", str(out))) == 0
    df = pd.read_csv(out)
    assert {"ece_top_10_lohi", "ece_top_10_lohi__source_ts", "adaptive_ece_10_equalmass"} <= set(df.columns)
    assert not any("_15" in c for c in df.columns)
    assert df["ece_convention"].str.contains("10 equal-width bins").all()
    assert main(probe_args(arrays, "--fractions", "0,1", "--out", str(out))) == 2
    assert "fractions" in capsys.readouterr().err


def test_probe_stops_on_groups_on_both_sides_unless_allowed(arrays, capsys, caplog):
    np.save(arrays / "g_train.npy", np.array([f"p{i % 10}" for i in range(60)]))
    np.save(arrays / "g_test.npy", np.array([f"p{9 + i % 3}" for i in range(30)]))  # p9 is on both sides
    out = arrays / "o.csv"
    args = probe_args(arrays, "--train-groups", str(arrays / "g_train.npy"), "--test-groups",
                      str(arrays / "g_test.npy"), "--out", str(out))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert ("1 group(s) of the pooled domains are on more than one split (leakage): 'p9' on test (10 items) "
            "and train (6 items)") in err
    assert not out.exists()
    assert main(args + ["--allow-group-overlap"]) == 0
    assert "'p9' on test (10 items) and train (6 items) (allowed by allow_group_overlap)" in caplog.text
    assert out.exists()


def test_probe_stops_on_a_test_class_absent_from_training(arrays, capsys):
    y = np.load(arrays / "y_test.npy")
    y[0] = 3
    np.save(arrays / "y_test3.npy", y)
    args = probe_args(arrays, "--out", str(arrays / "o.csv"))
    args[args.index("--test-labels") + 1] = str(arrays / "y_test3.npy")
    assert main(args) == 2
    assert "class 'class_3' (label 3) is evaluated on the test split" in capsys.readouterr().err


def test_intervals_say_item_without_test_groups_and_the_unit_given_with_them(arrays, capsys):
    out = arrays / "units.csv"
    assert main(probe_args(arrays, "--out", str(out))) == 0
    df = pd.read_csv(out)
    assert (df["ci_unit"] == "item").all() and (df["ci_resampling"] == "unit=item, n=30").all()
    np.save(arrays / "g_test.npy", np.array([f"t{i % 6}" for i in range(30)]))
    grouped = ["--test-groups", str(arrays / "g_test.npy"), "--out", str(out)]
    assert main(probe_args(arrays, *grouped, "--group-unit", "patient")) == 0
    assert (pd.read_csv(out)["ci_resampling"] == "unit=patient, n=6").all()
    assert main(probe_args(arrays, *grouped)) == 0  # groups whose unit nobody named are called groups
    assert (pd.read_csv(out)["ci_resampling"] == "unit=group, n=6").all()
    assert main(probe_args(arrays, *grouped, "--group-unit", "ward")) == 2
    assert "--group-unit 'ward'" in capsys.readouterr().err


def test_budget_calibration_and_unscaled_prism_draw_from_the_command_line(arrays):
    out = arrays / "budget.csv"
    assert main(probe_args(arrays, "--fractions", "0.5", "--validation-labels", "budget", "--no-standardize",
                           "--subsample", "prism", "--seeds", "42", "--out", str(out))) == 0
    row = pd.read_csv(out).iloc[0]
    # no validation arrays: the fraction's budget is drawn from the training items, and 20% of it per class
    # fits the temperature (the held-out validation part of the training arrays goes unused in this mode)
    assert row["calibration_mode"] == "budget: 0.2 of the fraction's labels"
    assert row["label_budget"] == row["n_train"] + row["n_val"] and row["n_val"] > 0
    assert row["subsample"] == "prism" and not row["standardize"]
    assert "temperature_at_bound__source_ts" in row.index and "n_draws_at_bound__kshot4_ts" in row.index

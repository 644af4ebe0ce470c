"""``fmaudit adapt`` on arrays made elsewhere: one row per method with its gain over none."""

import numpy as np
import pandas as pd
import pytest

from fmaudit.cli import main


@pytest.fixture()
def arrays(tmp_path):
    """Five Gaussian classes; the target scanner scales and shifts every feature."""
    rng = np.random.default_rng(0)
    means = rng.normal(scale=0.8, size=(5, 10))
    ys = np.repeat(np.arange(5), 40)
    yt = np.repeat(np.arange(5), 60)
    xs = means[ys] + rng.normal(size=(ys.size, 10))
    xt = (means[yt] + rng.normal(size=(yt.size, 10))) * rng.uniform(0.7, 1.4, size=10) + rng.normal(size=10)
    for name, arr in (("xs", xs), ("ys", ys), ("xt", xt), ("yt", yt)):
        np.save(tmp_path / f"{name}.npy", arr)
    return tmp_path


def args(d, *extra):
    return ["adapt", "--source-features", str(d / "xs.npy"), "--source-labels", str(d / "ys.npy"),
            "--target-features", str(d / "xt.npy"), "--target-labels", str(d / "yt.npy"), *extra]


def test_adapt_writes_one_row_per_method_with_gains(arrays, capsys):
    out = arrays / "gains.csv"
    assert main(args(arrays, "--methods", "global_standardization,class_balanced_restandardization,bbse",
                     "--out", str(out))) == 0
    df = pd.read_csv(out)
    assert df["method"].tolist() == ["none", "global_standardization", "class_balanced_restandardization", "bbse"]
    np.testing.assert_allclose(df["gain_macro_f1"], df["macro_f1"] - df.loc[0, "macro_f1"])
    for col in ("ece_raw", "ece_source_t", "delta_ece_raw", "delta_ece_source_t", "recall_class_0",
                "marginal_entropy", "deployable", "n_draws", "ece_convention"):
        assert col in df.columns
    assert df.loc[0, "prior"] == "as given" and (df["n_draws"] == 1).all()
    assert "wrote 4 methods" in capsys.readouterr().out


def test_adapt_resamples_to_a_named_wbc_prior_and_keeps_the_draws(arrays, capsys):
    out, draws = arrays / "gains.parquet", arrays / "draws.csv"
    assert main(args(arrays, "--methods", "none,class_balanced_restandardization", "--prior", "clinical",
                     "--sample-size", "100", "--draws", "4", "--draws-out", str(draws), "--out", str(out))) == 0
    df, per_draw = pd.read_parquet(out), pd.read_csv(draws)
    assert (df["prior"] == "peripheral-blood").all() and (df["n_draws"] == 4).all()
    assert len(per_draw) == 8 and per_draw["draw_seed"].nunique() == 4
    assert "recall_neutrophil" in df.columns  # a WBC prior names the five WBC classes
    mean_gain = per_draw[per_draw["method"] == "class_balanced_restandardization"]["gain_macro_f1"].mean()
    assert df.loc[1, "gain_macro_f1"] == pytest.approx(mean_gain)
    assert "assumed" in capsys.readouterr().out  # the prior's shares are an assumption, said so
    # explicit shares and the balanced prior work for any number of classes
    assert main(args(arrays, "--methods", "none", "--prior-shares", "0.6,0.1,0.1,0.1,0.1", "--sample-size", "50",
                     "--draws", "2", "--out", str(arrays / "s.csv"))) == 0
    assert main(args(arrays, "--methods", "none", "--prior", "balanced", "--sample-size", "50", "--draws", "2",
                     "--out", str(arrays / "b.csv"))) == 0
    assert pd.read_csv(arrays / "b.csv").loc[0, "prior"] == "balanced"


def test_adapt_says_when_the_sample_size_exceeds_the_target_and_draws_with_replacement(arrays, capsys):
    """300 target items, 60 a class: --sample-size 500 at balanced shares asks 100 of each, so every class repeats
    items; 200 asks 40 of each and none does."""
    out = arrays / "big.csv"
    assert main(args(arrays, "--methods", "none", "--prior", "balanced", "--sample-size", "500", "--draws", "2",
                     "--out", str(out))) == 0
    err = capsys.readouterr().err
    assert "--sample-size 500" in err and "drawn WITH replacement" in err and "target's 300 items" in err
    assert pd.read_csv(out).loc[0, "classes_with_replacement"] == "class_0,class_1,class_2,class_3,class_4"
    assert main(args(arrays, "--methods", "none", "--prior", "balanced", "--sample-size", "200", "--draws", "2",
                     "--out", str(out))) == 0
    assert "replacement" not in capsys.readouterr().err
    assert pd.isna(pd.read_csv(out).loc[0, "classes_with_replacement"])


@pytest.mark.parametrize("case, message", [
    ("dims", "dimensions"),
    ("prior", "unknown prior"),
    ("shares", "sum to 1"),
    ("method", "unknown adaptation method"),
    ("labels", "labels but"),
])
def test_adapt_errors_exit_2_with_a_message(arrays, capsys, case, message):
    extra = ["--out", str(arrays / "x.csv")]
    a = args(arrays, *extra)
    if case == "dims":
        np.save(arrays / "bad.npy", np.zeros((300, 4)))
        a[a.index("--target-features") + 1] = str(arrays / "bad.npy")
    elif case == "prior":
        a += ["--prior", "blast-crisis"]
    elif case == "shares":
        a += ["--prior-shares", "0.5,0.5,0.5,0,0"]
    elif case == "method":
        a += ["--methods", "tent"]
    else:
        np.save(arrays / "short.npy", np.zeros(10, int))
        a[a.index("--target-labels") + 1] = str(arrays / "short.npy")
    assert main(a) == 2
    assert message in capsys.readouterr().err
    assert not (arrays / "x.csv").exists()

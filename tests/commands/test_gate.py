"""``fmaudit gate export`` / ``apply``: an exported gate reproduces the in-process operating point."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fmaudit.cli import main
from fmaudit.ood.gate import GateSet, gate_operating_points

CLASS_NAMES = np.array(["adipose", "stroma", "tumour"])


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    """Three ID classes and one held-out class (near OOD), grouped by patient, written as files."""
    rng = np.random.default_rng(5)
    d = 12
    means = rng.normal(scale=1.6, size=(4, d))
    folder = tmp_path_factory.mktemp("gate_cli")

    def draw(n, classes, prefix):
        y = np.asarray(classes)[np.arange(n) % len(classes)]
        g = np.array([f"{prefix}{i // 5}" for i in range(n)])
        return means[y] + rng.normal(size=(n, d)), y, g

    X, y, g = draw(300, [0, 1, 2], "p")
    Xt, yt, gt = draw(150, [0, 1, 2], "q")
    Xn, _, gn = draw(60, [3], "r")
    np.save(folder / "train.npy", X)
    (folder / "labels.txt").write_text("\n".join(CLASS_NAMES[y]) + "\n")
    np.save(folder / "groups.npy", g)
    np.savez(folder / "test.npz", feat__cls=Xt, item_id=np.arange(len(Xt)).astype(str))
    np.save(folder / "near.npy", Xn)
    return folder, (X, y, g), (Xt, yt, gt), (Xn, gn)


def quantities(decisions: pd.DataFrame, labels=None) -> dict[str, float]:
    d = decisions["decision"]
    out = {"coverage": (d == "accept").mean(), "reject_novel": (d == "reject_novel").mean(),
           "reject_unconfident": (d == "reject_unconfident").mean(), "reject_any": (d != "accept").mean(),
           "coverage_novelty_gate": (d != "reject_novel").mean()}
    if labels is not None:
        correct = decisions["prediction"].to_numpy() == labels
        out["accuracy_ungated"] = correct.mean()
        out["accuracy_accepted"] = correct[(d == "accept").to_numpy()].mean()
        out["accuracy_novelty_gate"] = correct[(d != "reject_novel").to_numpy()].mean()
    return out


def test_cli_gate_reproduces_the_in_process_operating_point(arrays, tmp_path, capsys):
    folder, (X, y, g), (Xt, yt, gt), (Xn, gn) = arrays
    sets = [GateSet("test", Xt, yt, gt, "id"), GateSet("holdout", Xn, None, gn, "near")]
    table, _ = gate_operating_points(X, y, g, sets, gate_params={"random_state": 0}, n_splits=2, n_boot=20,
                                     encoder="enc", readout="cls")
    value = table.set_index(["set", "quantity"])["value"]

    gate_dir = tmp_path / "GATE"
    assert main(["gate", "export", "--features", str(folder / "train.npy"), "--labels", str(folder / "labels.txt"),
                 "--groups", str(folder / "groups.npy"), "--encoder", "enc", "--readout", "cls",
                 "--out", str(gate_dir)]) == 0
    card = json.loads((gate_dir / "gate.json").read_text())
    assert card["class_names"] == CLASS_NAMES.tolist() and card["readout"] == "cls"
    assert card["thresholds"]["novelty"] == pytest.approx(value[("validation", "tau_novelty")], abs=1e-9)
    assert card["thresholds"]["confidence"] == pytest.approx(value[("validation", "tau_confidence")], abs=1e-9)

    out_test, out_near = tmp_path / "test.csv", tmp_path / "near.csv"
    assert main(["gate", "apply", "--gate", str(gate_dir), "--features", str(folder / "test.npz"),
                 "--readout", "cls", "--out", str(out_test)]) == 0
    assert main(["gate", "apply", "--gate", str(gate_dir), "--features", str(folder / "near.npy"),
                 "--out", str(out_near)]) == 0
    test_dec, near_dec = pd.read_csv(out_test), pd.read_csv(out_near)
    # the item ids the file holds, in its order (a plain array has none: its rows are numbered)
    assert list(test_dec.columns) == ["item_id", "decision", "novelty", "confidence", "prediction", "prediction_name"]
    assert test_dec["item_id"].astype(str).tolist() == [str(i) for i in range(len(Xt))]
    assert near_dec["row"].tolist() == list(range(len(near_dec)))
    assert len(test_dec) == len(Xt) and set(test_dec["decision"]) <= {"accept", "reject_novel", "reject_unconfident"}
    np.testing.assert_array_equal(test_dec["prediction_name"], CLASS_NAMES[test_dec["prediction"]])

    for name, dec, labels in (("test", test_dec, yt), ("holdout", near_dec, None)):
        for q, v in quantities(dec, labels).items():
            assert v == pytest.approx(value[(name, q)], abs=1e-9), (name, q)
    # the held-out class is rejected far more often than the in-distribution test split
    assert value[("holdout", "reject_any")] > value[("test", "reject_any")] + 0.2
    assert "wrote 150 decisions" in capsys.readouterr().out


def test_cli_gate_refuses_bad_input(arrays, tmp_path, capsys):
    folder, (X, _, _), _, _ = arrays
    gate_dir = tmp_path / "G"
    assert main(["gate", "export", "--features", str(folder / "train.npy"), "--labels", str(folder / "labels.txt"),
                 "--readout", "cls", "--C", "1.0", "--out", str(gate_dir)]) == 0
    capsys.readouterr()
    assert main(["gate", "apply", "--gate", str(gate_dir), "--features", str(folder / "test.npz"),
                 "--readout", "mean", "--features-key", "feat__cls", "--out", str(tmp_path / "x.csv")]) == 2
    assert "fitted on readout 'cls'" in capsys.readouterr().err
    np.save(tmp_path / "narrow.npy", X[:, :5])
    assert main(["gate", "apply", "--gate", str(gate_dir), "--features", str(tmp_path / "narrow.npy"),
                 "--out", str(tmp_path / "x.csv")]) == 2
    assert "5 features" in capsys.readouterr().err
    assert main(["gate", "apply", "--gate", str(tmp_path / "nowhere"), "--features", str(tmp_path / "narrow.npy"),
                 "--out", str(tmp_path / "x.csv")]) == 2
    assert "no gate.json" in capsys.readouterr().err
    (tmp_path / "short.txt").write_text("adipose\nstroma\n")
    assert main(["gate", "export", "--features", str(folder / "train.npy"), "--labels", str(tmp_path / "short.txt"),
                 "--out", str(tmp_path / "H")]) == 2
    assert "2 labels but 300 feature rows" in capsys.readouterr().err
    bad = np.load(folder / "train.npy")
    bad[7, 0] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    assert main(["gate", "export", "--features", str(tmp_path / "nan.npy"), "--labels", str(folder / "labels.txt"),
                 "--out", str(tmp_path / "H")]) == 2
    assert "NaN" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_cli_gate_apply_needs_the_readout_of_a_file_with_several(arrays, tmp_path, capsys):
    folder, (X, y, g), (Xt, _, _), _ = arrays
    gate_dir = tmp_path / "G"
    assert main(["gate", "export", "--features", str(folder / "train.npy"), "--labels", str(folder / "labels.txt"),
                 "--readout", "cls", "--C", "1.0", "--out", str(gate_dir)]) == 0
    several = tmp_path / "several.npz"
    ids = np.array([f"tile-{i:03d}" for i in range(len(Xt))])
    np.savez(several, feat__cls=Xt, feat__mean=Xt[:, ::-1], item_id=ids)
    capsys.readouterr()
    out = tmp_path / "d.csv"
    assert main(["gate", "apply", "--gate", str(gate_dir), "--features", str(several), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "several readouts (cls, mean)" in err and "--readout" in err and not out.exists()
    assert main(["gate", "apply", "--gate", str(gate_dir), "--features", str(several), "--readout", "cls",
                 "--out", str(out)]) == 0
    decisions = pd.read_csv(out)
    assert decisions["item_id"].tolist() == ids.tolist()

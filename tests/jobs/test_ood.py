"""The OOD jobs without Snakemake: a derived manifest, one shard with every tier and its exported gate, the
aggregate. Features are hand-made (class means plus noise) so each tier has a known direction; the workflow
test embeds real perturbed images."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fmaudit import grid
from fmaudit.config import fill_config
from fmaudit.io import FmauditInputError, read_provenance, read_table, write_npz, write_table
from fmaudit.jobs.ood import NO_GATE_CARD, SHARD_TABLES, aggregate_ood_job, derive_manifest_job, ood_shard_job

from .conftest import TASK

CONFIG = {
    "data_root": "data", "encoders": ["enc-a"], "datasets": ["demo-tiles", "slides"],
    "tasks": {"demo": dict(TASK)}, "bootstrap": {"n_boot": 20, "seed": 0},
    "ood": {"far": {"demo": "slides"}, "blur": {"sigmas": [2.0], "tasks": ["demo"]},
            "near": {"demo": ["mucus"]}, "artefact": {"demo": ["adipose"]},
            "image_artefact": {"specs": [{"kind": "pen"}]}, "probe": {"C": 1.0}, "knn_k": 5,
            "gate": {"n_splits": 2, "near": True, "validation_fraction": 0.25},
            "sensitivity": {"Cs": [0.1, 1.0], "knn_ks": [1, 5], "protocols": ["ungrouped_log_loss"]}},
}


def _write_features(path, ids, X, encoder="enc-a"):
    write_npz(path, {"item_id": np.asarray(ids, dtype=str), "feat__cls": np.asarray(X, np.float32)},
              {"encoder": encoder, "encoder_config_hash": "hash-ood", "n_items": len(ids), "readouts": ["cls"],
               "embed_dim": {"cls": X.shape[1]}})
    return path


@pytest.fixture(scope="module")
def ood_chain(job_chain, tmp_path_factory):
    root = tmp_path_factory.mktemp("ood")
    config = fill_config(json.loads(json.dumps(CONFIG)))
    plan = grid.ood_shard_plan(config, "demo")
    settings = dict(plan["settings"], readout="cls")
    man = read_table(job_chain["manifest"])
    rng = np.random.default_rng(0)
    means = rng.normal(scale=3.0, size=(5, 8))
    y = man["label"].to_numpy().astype(int)
    X = means[y] + rng.normal(size=(len(man), 8))
    emb = _write_features(root / "emb" / "demo-tiles.npz", man["item_id"], X)
    # far donor: a data set of unlabelled tiles of two slides, far from every class
    donor = man.head(24).copy()
    donor["item_id"] = [f"tile{i}" for i in range(24)]
    donor["dataset"], donor["split"], donor["group"] = "slides", "unassigned", [f"s{i % 2}" for i in range(24)]
    donor["label"], donor["label_name"] = pd.NA, pd.NA
    donor_man = root / "manifests" / "slides.parquet"
    write_table(donor_man, donor)
    donor_emb = _write_features(root / "emb" / "slides.npz", donor["item_id"], rng.normal(loc=8.0, size=(24, 8)))
    derived = {}
    for cond in plan["conditions"]:
        if "derived" not in cond:
            continue
        (name,) = cond["derived"]
        out = root / "manifests" / f"{name}.parquet"
        derive_manifest_job("demo-tiles", cond["tag"], cond["spec"], str(job_chain["manifest"]), str(out))
        dman = read_table(out)
        test = man.set_index("item_id").loc[dman["source_item_id"]]
        shift = 1.5 if cond["tier"] == "blur" else 4.0
        Xd = means[test["label"].astype(int).to_numpy()] + rng.normal(size=(len(dman), 8)) + shift
        derived[name] = str(_write_features(root / "emb" / f"{name}.npz", dman["item_id"], Xd))
    task_spec = dict(config["tasks"]["demo"])
    out = {name: str(root / "shard" / f"{name}.parquet") for name in SHARD_TABLES}
    bootstrap = {"n_boot": 20, "seed": 0}
    kwargs = dict(encoder="enc-a", task="demo", task_spec=task_spec, settings=settings, bootstrap=bootstrap, ece_bins=10,
                  manifests=[str(job_chain["manifest"])], embeddings=[str(emb)], far_manifests=[str(donor_man)],
                  far_embeddings=[str(donor_emb)], derived_embeddings=derived)
    ood_shard_job(plan={"conditions": plan["conditions"], "gate": plan["gate"]}, out=out,
                  gate_dir=str(root / "gate"), log=str(root / "logs" / "shard.log"), **kwargs)
    return {"root": root, "out": out, "plan": plan, "kwargs": kwargs, "X": X, "man": man}


def test_derived_manifest_is_the_test_split_with_its_perturbation(job_chain, tmp_path):
    man = read_table(job_chain["manifest"])
    out = tmp_path / "demo-tiles__jpeg_q20.parquet"
    derive_manifest_job("demo-tiles", "jpeg_q20", '{"kind":"jpeg","quality":20}', str(job_chain["manifest"]), str(out))
    derived = read_table(out)
    test = man[man["split"] == "test"]
    assert derived["source_item_id"].tolist() == test["item_id"].tolist()
    assert (derived["item_id"] == derived["source_item_id"] + "__jpeg_q20").all()
    assert set(derived["perturbation"]) == {'{"kind":"jpeg","quality":20}'}
    assert read_provenance(out)["tag"] == "jpeg_q20"
    with pytest.raises(FmauditInputError, match="makes 'jpeg_q30'"):
        derive_manifest_job("demo-tiles", "jpeg_q20", '{"kind":"jpeg","quality":30}', str(job_chain["manifest"]),
                            str(tmp_path / "x.parquet"))


def test_shard_runs_every_planned_condition_and_gate_setting(ood_chain):
    det = read_table(ood_chain["out"]["detection"])
    config = fill_config(json.loads(json.dumps(CONFIG)))
    planned = grid.ood_runs(config)
    assert set(zip(det["tier"], det["condition"], det["scorer"])) == set(
        zip(planned["tier"], planned["condition"], planned["scorer"]))
    gate = read_table(ood_chain["out"]["gate"])
    assert set(gate["setting"]) == set(grid.ood_gate_runs(config)["setting"])
    auroc = det[det["scorer"] == "maha"].set_index("condition")["auroc"]
    assert auroc["far_slides"] > 0.95 and auroc["pen_seed0"] > auroc["blur_s2"] > 0.5
    # the far donor's two slides are its resampling units, beside the task's test patients
    far = det[(det["condition"] == "far_slides") & (det["scorer"] == "maha")].iloc[0]
    man = ood_chain["man"]
    assert far["ci_n_units"] == man.loc[man["split"] == "test", "group"].nunique() + 2 and far["n_ood"] == 24
    sens = read_table(ood_chain["out"]["scorer_sensitivity"])
    assert set(sens["condition"]) == {"far_slides", "blur_s2", "pen_seed0"} and "k=5" in set(sens["setting"])
    probe_sens = read_table(ood_chain["out"]["probe_sensitivity"])
    assert set(probe_sens["analysis"]) == {"fixed_C", "selection"}
    assert len(read_table(ood_chain["out"]["slides"])) == 0  # not declared for this task
    assert "ece_top_10_lohi" in read_table(ood_chain["out"]["selective"]).columns  # calibration.ece_bins
    assert "ece_top_10_lohi" in probe_sens.columns
    blur = read_table(ood_chain["out"]["blur"])
    assert blur["sigma"].tolist() == [0.0, 2.0] and (blur["ci_unit"] == "patient").all()


def test_exported_gate_reproduces_the_operating_points(ood_chain):
    from fmaudit.ood.gate import load_gate

    gate = load_gate(ood_chain["root"] / "gate")
    card = json.loads((ood_chain["root"] / "gate" / "gate.json").read_text())
    assert card["encoder"] == "enc-a" and card["readout"] == "cls" and card["extra"]["task"] == "demo"
    man, X = ood_chain["man"], ood_chain["X"]
    test = (man["split"] == "test").to_numpy()
    decided = gate.decide(X[test], readout="cls")
    table = read_table(ood_chain["out"]["gate"])
    own = table[(table["setting"] == "demo") & (table["set"] == "test")].set_index("quantity")["value"]
    assert own["coverage"] == pytest.approx((decided["decision"] == "accept").mean(), abs=1e-12)
    assert own["reject_novel"] == pytest.approx((decided["decision"] == "reject_novel").mean(), abs=1e-12)
    correct = decided["prediction"].to_numpy() == man.loc[test, "label"].to_numpy().astype(int)
    accepted = (decided["decision"] == "accept").to_numpy()
    assert own["accuracy_accepted"] == pytest.approx(correct[accepted].mean(), abs=1e-12)
    with pytest.raises(FmauditInputError, match="readout"):
        gate.decide(X[test], readout="mean")


def test_ungated_task_says_so_and_missing_copies_are_named(ood_chain, tmp_path):
    plan = {"conditions": ood_chain["plan"]["conditions"], "gate": None}
    out = {name: str(tmp_path / f"{name}.parquet") for name in SHARD_TABLES}
    kwargs = dict(ood_chain["kwargs"])
    ood_shard_job(plan=plan, out=out, gate_dir=str(tmp_path / "gate"), **kwargs)
    assert json.loads((tmp_path / "gate" / NO_GATE_CARD).read_text())["gated"] is False
    assert len(read_table(out["gate"])) == 0 and len(read_table(out["detection"])) > 0
    kwargs["derived_embeddings"] = {}
    with pytest.raises(FmauditInputError, match="demo-tiles__blur_s2"):
        ood_shard_job(plan=plan, out=out, gate_dir=str(tmp_path / "gate2"), **kwargs)


def test_aggregate_stacks_each_table(ood_chain, tmp_path):
    shards = {name: [ood_chain["out"][name], ood_chain["out"][name]] for name in SHARD_TABLES}
    out = {name: str(tmp_path / f"ood_{name}.parquet") for name in SHARD_TABLES}
    aggregate_ood_job(shards, out)
    for name in ("detection", "gate", "curves"):
        assert len(read_table(out[name])) == 2 * len(read_table(ood_chain["out"][name]))
    assert len(read_table(out["slides"])) == 0

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
    kwargs = dict(encoder="enc-a", task="demo", task_spec=task_spec, settings=settings, bootstrap=bootstrap,
                  ece_bins=10,
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
    from fmaudit.jobs.ood import AGGREGATE_TABLES

    shards = {name: [ood_chain["out"][name], ood_chain["out"][name]] for name in SHARD_TABLES}
    out = {name: str(tmp_path / f"ood_{name}.parquet") for name in AGGREGATE_TABLES}
    aggregate_ood_job(shards, out)
    for name in ("detection", "gate", "curves"):
        assert len(read_table(out[name])) == 2 * len(read_table(ood_chain["out"][name]))
    assert len(read_table(out["slides"])) == 0


def _panda_like(root):
    """A PANDA-like manifest: one ISUP grade per slide, tiles carrying it, the data provider as the domain, and
    providers whose grade mix differs (one mostly low grades, one mostly high), so a division stratified by grade
    alone differs from one stratified by grade and provider jointly; embeddings carry grade and provider."""
    from fmaudit.datasets.manifest import make_manifest

    rng = np.random.default_rng(3)
    rows, slide = [], 0
    for provider, grade_counts in (("karolinska", (10, 6, 2)), ("radboud", (2, 6, 10))):
        for grade, n_slides in enumerate(grade_counts):
            for _ in range(n_slides):
                for t in range(4):
                    rows.append({"dataset": "panda-like", "item_id": f"s{slide}_{t}", "source": f"s{slide}.tiff",
                                 "label": grade, "label_name": f"isup{grade}", "group": f"s{slide}",
                                 "domain": provider, "group_unit": "slide"})
                slide += 1
    man = make_manifest(rows)
    slides = man["group"].unique()
    test_slides = set(rng.choice(slides, size=8, replace=False))
    man["split"] = np.where(man["group"].isin(test_slides), "test", "train")
    path = root / "panda-like.parquet"
    write_table(path, man)
    provider = (man["domain"] == "radboud").to_numpy().astype(float)
    means = rng.normal(scale=2.0, size=(3, 6))
    X = means[man["label"].to_numpy().astype(int)] + provider[:, None] * 1.5 + rng.normal(size=(len(man), 6))
    emb = _write_features(root / "panda-like.npz", man["item_id"], X)
    return man, X.astype(np.float32).astype(np.float64), path, emb


def test_gate_divisions_of_a_panda_like_task_are_stratified_by_grade_and_provider_jointly(tmp_path):
    """The audit paper divides PANDA's training split into fit and validation parts "stratified in the same way as the
    test split", i.e. by grade and data provider jointly (the PANDA preparer's split strata): the exported gate
    is the one fitted on that division, not on a grade-only one."""
    from fmaudit.datasets import preparer_split_strata
    from fmaudit.ood.gate import AbstentionGate

    man, X, man_path, emb = _panda_like(tmp_path)
    assert preparer_split_strata("panda") == ("label", "domain")
    config = fill_config({"data_root": "data", "encoders": ["enc-a"], "datasets": ["panda-like"],
                          "tasks": {"panda-like": {"datasets": ["panda-like"], "domains": ["all"], "ordinal": True}},
                          "ood": {"probe": {"C": 1.0}, "gate": {"tasks": ["panda-like"], "n_splits": 1}}})
    plan = grid.ood_shard_plan(config, "panda-like")
    task_spec = dict(config["tasks"]["panda-like"], split="manifest", transfer=False,
                     split_strata={"panda-like": list(preparer_split_strata("panda"))})
    out = {name: str(tmp_path / "shard" / f"{name}.parquet") for name in SHARD_TABLES}
    ood_shard_job(encoder="enc-a", task="panda-like", task_spec=task_spec,
                  plan={"conditions": plan["conditions"], "gate": plan["gate"]},
                  settings=dict(plan["settings"], readout="cls"), bootstrap={"n_boot": 10, "seed": 0}, ece_bins=15,
                  manifests=[str(man_path)], embeddings=[str(emb)], far_manifests=[], far_embeddings=[],
                  derived_embeddings={}, out=out, gate_dir=str(tmp_path / "gate"))
    table = read_table(out["gate"])
    assert set(table["division_strata"]) == {"label x domain"}
    validation = table[table["set"] == "validation"].set_index("quantity")["value"]
    train = (man["split"] == "train").to_numpy()
    y, groups = man["label"].to_numpy().astype(int)[train], man["group"].to_numpy()[train]
    joint = (man["label"].astype(str) + "|" + man["domain"].astype(str)).to_numpy()[train]
    params = dict(C=1.0, random_state=0, validation_fraction=0.2, n_classes=3)
    by_both = AbstentionGate(**params).fit(X[train], y, groups, strata=joint)
    by_grade = AbstentionGate(**params).fit(X[train], y, groups)
    assert not np.array_equal(by_both.validation_index_, by_grade.validation_index_)
    assert validation["tau_novelty"] == pytest.approx(by_both.novelty_threshold_, rel=1e-9)
    assert validation["n_validation"] == by_both.validation_index_.size
    card = json.loads((tmp_path / "gate" / "gate.json").read_text())
    assert card["validation_operating_point"]["n_validation"] == by_both.validation_index_.size


def test_further_splits_of_a_panda_like_task_pool_five_splits_of_every_aggregator(tmp_path):
    """The audit paper's further splits (ood.extra_splits, default seeds 0-4) of the probe metrics and of slide
    aggregation, each split stratified by grade and provider as the stored one; rows say which splits they pool."""
    from fmaudit.datasets import preparer_split_strata
    from fmaudit.jobs.ood import SPLIT_TABLES, ood_split_shard_job

    man, X, man_path, emb = _panda_like(tmp_path)
    config = fill_config({"data_root": "data", "encoders": ["enc-a"], "datasets": ["panda-like"],
                          "tasks": {"panda-like": {"datasets": ["panda-like"], "domains": ["all"], "ordinal": True}},
                          "ood": {"probe": {"C": 1.0}, "gate": {"tasks": ["panda-like"]},
                                  "slides": {"tasks": ["panda-like"],
                                             "aggregators": ["majority_vote", "max_embedding", "transformer_mil"],
                                             "transformer": {"embed_dim": 8, "n_heads": 2, "feedforward_dim": 16,
                                                             "epochs": 2}}}})
    plan = grid.ood_split_plan(config, "panda-like")
    assert plan == {"seeds": [0, 1, 2, 3, 4], "test_fraction": 0.2, "parts": ["probe_metrics", "slide_aggregation"]}
    runs = grid.ood_split_runs(config)
    assert len(runs) == 2 * 5 and set(runs["part"]) == {"probe_metrics", "slide_aggregation"}
    settings = dict(grid.ood_shard_plan(config, "panda-like")["settings"], readout="cls")
    task_spec = dict(config["tasks"]["panda-like"], split="manifest", transfer=False,
                     split_strata={"panda-like": list(preparer_split_strata("panda"))})
    out = {name: str(tmp_path / "splits" / f"{name}.parquet") for name in SPLIT_TABLES}
    ood_split_shard_job(encoder="enc-a", task="panda-like", task_spec=task_spec, plan=plan, settings=settings,
                        bootstrap={"n_boot": 10, "seed": 0}, ece_bins=15, manifests=[str(man_path)],
                        embeddings=[str(emb)], out=out)
    selective = read_table(out["split_selective"])
    assert len(selective) == 1 and selective["n_splits"].iloc[0] == 5
    assert selective["split_seeds"].iloc[0] == "0,1,2,3,4"
    assert selective["split_strata"].iloc[0] == "label x domain" and np.isfinite(selective["qwk_ci_lo"]).all()
    slides = read_table(out["split_slides"])
    assert slides["aggregator"].tolist() == ["tile_level", "majority_vote", "max_embedding", "transformer_mil"]
    assert (slides["splits"] == "further").all() and (slides["n_boot_pooled"] == 50).all()
    assert (slides.loc[slides["level"] == "slide", "ci_unit"] == "item").all()  # the slides are the resampled items
    assert len(read_table(out["split_coarsening"])) == 0

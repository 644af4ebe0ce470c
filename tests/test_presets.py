"""The papers' presets: they validate, and the grid counts them exactly as the papers did, from config alone."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fmaudit import grid
from fmaudit.cli import main as cli_main
from fmaudit.config import fill_config
from fmaudit.schema import load_yaml

REPO = Path(__file__).resolve().parents[1]


PRESETS = REPO / "resources" / "presets"


PAPERS = ["prism", "audit", "hema", "cellpath"]


SLUG = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


# cell features are one job per (encoder, section), every magnification in the job: 750 of them in CellPath
FEW_THOUSAND = 4000


# Names the presets use that the registries do not have yet (reported to the lead; remove them as they land).
PENDING_ENCODERS: set[str] = set()


PENDING_DATASETS: set[str] = set()


def raw(name: str) -> dict:
    return yaml.safe_load((PRESETS / f"{name}.yaml").read_text())


def loaded(name: str) -> dict:
    return fill_config(raw(name), source=f"{name}.yaml")


@pytest.fixture(scope="module")
def summaries() -> dict[str, pd.DataFrame]:
    registry = load_yaml(REPO / "resources" / "datasets.yaml")
    return {name: grid.summarize(loaded(name), registry) for name in [*PAPERS, "all"]}


def count(summary: pd.DataFrame, analysis: str, protocol: str, column: str = "runs") -> int:
    row = summary[(summary["analysis"] == analysis) & (summary["protocol"] == protocol)]
    assert len(row) == 1, (analysis, protocol, summary)
    return int(row[column].iloc[0])


@pytest.mark.parametrize("name", [*PAPERS, "all"])
def test_preset_validates_and_names_exist(name):
    config = loaded(name)
    grid.check_grid(config)
    encoders = load_yaml(REPO / "resources" / "encoders.yaml")
    datasets = load_yaml(REPO / "resources" / "datasets.yaml")
    assert set(config["encoders"]) - set(encoders) <= PENDING_ENCODERS
    assert set(config["datasets"]) - set(datasets) <= PENDING_DATASETS
    assert all(pd.Series(config["encoders"] + config["datasets"] + list(config["tasks"])).str.match(SLUG))


def test_prism_counts(summaries):
    s = summaries["prism"]
    assert count(s, "probe", "evaluations: single-domain tasks") == 8 * 6 * 6 * 3 == 864
    # the Camelyon17 grid twice: PRISM's leaky patch split as published, and the patient-disjoint split
    assert count(s, "probe", "evaluations: transfer tasks (source x target)") == 2 * 8 * 5 * 6 * 3 * 5 == 2 * 3600
    assert count(s, "probe", "fits (in-domain)") == 864 + 2 * 720
    assert count(s, "probe", "fits (in-domain)", "jobs") == 8 * 8
    assert count(s, "cross_dataset", "evaluations (source task -> target task)") == 8 * 4 * 6 * 3


def test_prism_preset_reproduces_prisms_draw_and_flags_its_leaky_split():
    config = loaded("prism")
    assert config["probe"]["seeds"] == [42, 123, 456] and config["probe"]["subsample"] == "prism"
    assert config["probe"]["standardize"] is False and config["calibration"]["prism_ece"] is True
    splits = {t: spec["split"] for t, spec in config["tasks"].items() if "camelyon17" in t}
    assert splits == {"prism-camelyon17": "manifest", "prism-camelyon17-patch": "patch (leaky, as published)"}
    assert config["dataset_params"]["camelyon17-wilds"]["group_by"] == "patient"


def test_cellpath_counts(summaries):
    s = summaries["cellpath"]
    published = {"IS": 157_500, "IOCD": 86_940, "MOCV": 18_900, "LOOO": 41_580}
    assert {p: count(s, "cells", p) for p in published} == published
    assert sum(published.values()) == 304_920
    assert count(s, "cells", "IS", "jobs") == 30 * 3  # one job per (encoder, magnification, protocol)
    features = "features (section x magnification; a job per section)"
    assert count(s, "cells", features) == 30 * 25 * 3
    assert count(s, "cells", features, "jobs") == 30 * 25  # a section's magnifications in one job
    # the cell-level taxonomies are not tile tasks: nothing is probed or embedded tile-wise
    assert count(s, "probe", "fits (in-domain)") == 0 and count(s, "embed", "encoder x dataset") == 0


def test_audit_counts(summaries):
    s = summaries["audit"]
    assert count(s, "probe", "fits (in-domain)") == count(s, "probe", "fits (in-domain)", "jobs") == 13 * 7
    assert count(s, "ood", "detection (condition x scorer)") == 13 * (7 + 15 + 22 + 1) * 4
    assert count(s, "ood", "abstention gate (task setting)") == 13 * 8
    assert count(s, "ood", "blurred test embeddings (task x sigma)") == 13 * 5 * 3
    # the audit paper's five further splits (seeds 0-4): the probe metrics of every task, PANDA's slide aggregation and
    # SICAPv2's two controls, one job per (encoder, task)
    assert count(s, "ood", "further splits: probe metrics (task x split seed)") == 13 * 7 * 5
    assert count(s, "ood", "further splits: probe metrics (task x split seed)", "jobs") == 13 * 7
    for part in ("slide aggregation", "label coarsening", "without classes"):
        assert count(s, "ood", f"further splits: {part} (task x split seed)") == 13 * 5


def test_hema_counts(summaries):
    s = summaries["hema"]
    assert count(s, "prior_shift", "source seed x target x prior x draw") == 15 * 5 * 3 * 6 * 25 == 33_750
    assert count(s, "prior_shift", "source seed x target x prior x draw", "jobs") == 15 * 3
    assert count(s, "scratch_reference", "ResNet-18 from scratch (source x seed)", "jobs") == 5
    # 15 encoders and the 224-vs-518 variant of DinoBloom-L, probed beside its base
    assert count(s, "probe", "fits (in-domain)") == (15 + 1) * 4 * 2 * 5
    assert count(s, "probe", "evaluations: transfer tasks (source x target)") == (15 + 1) * 4 * 2 * 5 * 4
    assert count(s, "embed", "encoder x dataset") == (15 + 1) * 4
    assert count(s, "head_sweep", "fits (in-domain)") == 15 * 8 * 5


@pytest.mark.parametrize("name", [*PAPERS, "all"])
def test_dag_stays_at_a_few_thousand_jobs(summaries, name):
    assert summaries[name]["jobs"].sum() < FEW_THOUSAND


def test_all_is_the_sum_of_the_papers(summaries):
    total = summaries["all"].set_index(["analysis", "protocol"])[["runs", "jobs"]]
    parts = pd.concat([summaries[n] for n in PAPERS]).groupby(["analysis", "protocol"])[["runs", "jobs"]].sum()
    pd.testing.assert_frame_equal(total.sort_index().drop(index="embed"), parts.sort_index().drop(index="embed"),
                                  check_dtype=False)
    # embeddings two studies share are computed once
    pairs = {(e, d) for n in PAPERS for e, d in grid.embed_pairs(loaded(n))}
    shared_once = count(summaries["all"], "embed", "encoder x dataset")
    assert shared_once == len(pairs) < parts.loc[("embed", "encoder x dataset"), "runs"]


@pytest.mark.parametrize("name", PAPERS)
def test_each_study_of_all_is_its_preset(name):
    combined, preset = raw("all"), raw(name)
    study = combined["studies"][name]
    assert study["encoders"] == preset["encoders"] and study["datasets"] == preset["datasets"]
    assert {t: combined["tasks"][t] for t in study["tasks"]} == preset["tasks"]
    sections = ("probe", "calibration", "bootstrap", "head_sweep", "cross_dataset", "ood", "prior_shift", "cells")
    assert {k: study[k] for k in sections if k in study} == {k: preset[k] for k in sections if k in preset}


def test_cli_grid_json(capsys):
    assert cli_main(["grid", "--configfile", str(PRESETS / "cellpath.yaml"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    runs = {r["protocol"]: r["runs"] for r in rows if r["analysis"] == "cells"}
    assert runs["IS"] + runs["IOCD"] + runs["MOCV"] + runs["LOOO"] == 304_920
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli_main(["grid", "--configfile", str(PRESETS / "prism.yaml"), "--json"]) == 0
    prism = {(r["analysis"], r["protocol"]): r for r in json.loads(buf.getvalue())}
    assert prism[("probe", "evaluations: single-domain tasks")]["runs"] == 864
    assert prism[("probe", "evaluations: transfer tasks (source x target)")]["runs"] == 2 * 3600


def test_run_tables_match_the_summary_and_are_unique():
    config = loaded("cellpath")
    cells = grid.enumerate_runs(config, analysis="cells")
    assert len(cells) == 304_920
    assert not cells.duplicated().any()
    assert cells.groupby("protocol", observed=True).size().to_dict() == {
        "IS": 157_500, "IOCD": 86_940, "MOCV": 18_900, "LOOO": 41_580}
    iocd = cells[cells["protocol"] == "IOCD"]
    assert set(iocd["organ"]) == {o for o, secs in config["cells"]["sections"].items() if len(secs) >= 2}
    jobs = grid.jobs(cells, "cells")
    assert len(jobs) == 30 * 3 * 4 and list(jobs.columns) == ["encoder", "magnification", "protocol"]
    hema = grid.enumerate_runs(loaded("hema"))
    assert set(hema) == set(grid.ANALYSES)
    assert not hema["prior_shift"].duplicated().any()
    assert set(hema["prior_shift"]["target_domain"]) == {"matek19-wbc5", "mll23-wbc5", "raabin-wbc"}
    assert sorted(hema["head_sweep"]["C"].dropna().unique()) == [1e-4, 1e-2, 1.0, 1e2]

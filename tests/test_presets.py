"""The papers' presets: they validate, and the grid counts them exactly as the papers did, from config alone."""

from __future__ import annotations

import copy
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fmaudit import grid
from fmaudit.cli import main as cli_main
from fmaudit.config import load_yaml, validate_config
from fmaudit.io import FmauditInputError

REPO = Path(__file__).resolve().parents[1]
PRESETS = REPO / "resources" / "presets"
PAPERS = ["prism", "audit", "hema", "cellpath"]
SLUG = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
FEW_THOUSAND = 3000

# Names the presets use that the registries do not have yet (reported to the lead; remove them as they land).
PENDING_ENCODERS: set[str] = set()
PENDING_DATASETS: set[str] = set()


def raw(name: str) -> dict:
    return yaml.safe_load((PRESETS / f"{name}.yaml").read_text())


def loaded(name: str) -> dict:
    return validate_config(raw(name), source=f"{name}.yaml")


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
    assert count(s, "probe", "evaluations: transfer tasks (source x target)") == 8 * 5 * 6 * 3 * 5 == 3600
    assert count(s, "probe", "fits (in-domain)") == 864 + 720
    assert count(s, "probe", "fits (in-domain)", "jobs") == 8 * 7
    assert count(s, "cross_dataset", "evaluations (source task -> target task)") == 8 * 4 * 6 * 3


def test_cellpath_counts(summaries):
    s = summaries["cellpath"]
    published = {"IS": 157_500, "IOCD": 86_940, "MOCV": 18_900, "LOOO": 41_580}
    assert {p: count(s, "cells", p) for p in published} == published
    assert sum(published.values()) == 304_920
    assert count(s, "cells", "IS", "jobs") == 30 * 3  # one job per (encoder, magnification, protocol)
    assert count(s, "cells", "features (section x magnification)") == 30 * 25 * 3
    # the cell-level taxonomies are not tile tasks: nothing is probed or embedded tile-wise
    assert count(s, "probe", "fits (in-domain)") == 0 and count(s, "embed", "encoder x dataset") == 0


def test_audit_counts(summaries):
    s = summaries["audit"]
    assert count(s, "probe", "fits (in-domain)") == count(s, "probe", "fits (in-domain)", "jobs") == 13 * 7
    assert count(s, "ood", "detection (condition x scorer)") == 13 * (7 + 15 + 22 + 1) * 4
    assert count(s, "ood", "abstention gate (task setting)") == 13 * 8
    assert count(s, "ood", "blurred test embeddings (task x sigma)") == 13 * 5 * 3


def test_hema_counts(summaries):
    s = summaries["hema"]
    assert count(s, "prior_shift", "source seed x target x prior x draw") == 15 * 5 * 3 * 6 * 25 == 33_750
    assert count(s, "probe", "fits (in-domain)") == 15 * 4 * 2 * 5
    assert count(s, "probe", "evaluations: transfer tasks (source x target)") == 15 * 4 * 2 * 5 * 4
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
    assert prism[("probe", "evaluations: transfer tasks (source x target)")]["runs"] == 3600


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


# ---- studies and declared sections on small configs -------------------------------------------------


def _two_studies() -> dict:
    return {
        "data_root": "x",
        "encoders": ["a", "b", "c"],
        "datasets": ["d1", "d2"],
        "tasks": {"t1": {"datasets": ["d1"], "domains": ["p", "q"]}, "t2": {"datasets": ["d2"]}},
        "studies": {
            "s1": {"encoders": ["a", "b"], "tasks": ["t1"], "probe": {"fractions": [0.5, 1.0], "seeds": [0, 1]}},
            "s2": {"encoders": ["b", "c"], "tasks": ["t2"], "probe": {"heads": ["1nn"]}},
        },
    }


def test_studies_scope_encoders_tasks_and_probe_settings():
    config = validate_config(_two_studies())
    runs = grid.probe_runs(config)
    t1, t2 = runs[runs["task"] == "t1"], runs[runs["task"] == "t2"]
    assert set(t1["encoder"]) == {"a", "b"} and set(t2["encoder"]) == {"b", "c"}
    assert len(t1) == 2 * 2 * 2 * 2 and set(t2["head"]) == {"1nn"} and len(t2) == 2
    assert grid.section(config, "probe", task="t2")["heads"] == ["1nn"]
    assert grid.section(config, "probe")["heads"] == ["logistic"]  # the top-level section, defaults filled
    assert [(s.encoder, s.task) for s in grid.shards(config)] == [("a", "t1"), ("b", "t1"), ("b", "t2"), ("c", "t2")]
    assert grid.embed_pairs(config) == [("a", "d1"), ("b", "d1"), ("b", "d2"), ("c", "d2")]


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["studies"]["s2"]["tasks"].append("t1"), "already in study"),
    (lambda c: c["studies"]["s1"].update(encoders=["a", "zz"]), "'zz' is not in the config's encoders"),
    (lambda c: c["studies"]["s1"].update(datasets=["d2"]), "task 't1' uses 'd1', which the study lacks"),
    (lambda c: c["encoders"].append("orphan"), "'orphan' in no study"),
    (lambda c: c.update(ood={"far": {"t1": "t2"}}), "put this section inside the study"),
])
def test_bad_studies_name_the_key(mutate, message):
    config = _two_studies()
    mutate(config)
    with pytest.raises(FmauditInputError, match=message):
        grid.check_grid(validate_config(config))


def _cells_config(**cells) -> dict:
    spec = {"taxonomies": {"fine": "cf"}, "sections": {"o1": ["s1", "s2"], "o2": ["s3"]},
            "protocols": {"IOCD": {"seeds": [0]}, "LOOO": {"seeds": [0, 1]}}, **cells}
    return validate_config({"data_root": "x", "encoders": ["a"], "datasets": ["xen", "tiles"],
                            "tasks": {"cf": {"datasets": ["xen"]}, "tile": {"datasets": ["tiles"]}}, "cells": spec})


def test_cell_tasks_leave_the_tile_grid():
    config = _cells_config()
    assert set(grid.probe_runs(config)["task"]) == {"tile"}
    assert grid.embed_pairs(config) == [("a", "tiles")]
    cells = grid.enumerate_runs(config, analysis="cells")
    # IOCD: the two sections of o1 (o2 has one); LOOO: both organs; defaults: magnification 20, nuc and mean
    assert cells.groupby("protocol", observed=True).size().to_dict() == {"IOCD": 2 * 2, "LOOO": 2 * 2 * 2}
    assert set(cells["magnification"]) == {20} and set(cells["readout"]) == {"nuc", "mean"}


@pytest.mark.parametrize("cells, message", [
    ({"taxonomies": {"fine": "nope"}}, "unknown task 'nope'"),
    ({"sections": {"o1": ["s1"], "o2": ["s1"]}}, "also under 'o1'"),
    ({"sections": {"o1": ["s1"], "o2": ["s2"]}, "protocols": {"IOCD": {"seeds": [0]}}}, "no evaluation unit"),
])
def test_bad_cells_name_the_key(cells, message):
    with pytest.raises(FmauditInputError, match=message):
        grid.check_grid(_cells_config(**cells))


def test_prior_shift_checks_priors_and_domains():
    config = loaded("hema")
    bad = copy.deepcopy(config)
    bad["prior_shift"]["priors"]["balanced"]["basophil"] = 0.5
    with pytest.raises(FmauditInputError, match="prior_shift.priors.balanced"):
        grid.prior_shift_runs(bad)
    bad = copy.deepcopy(config)
    bad["prior_shift"]["target_domains"] = ["mars"]
    with pytest.raises(FmauditInputError, match="'mars' is not a domain of task 'hema-wbc5'"):
        grid.prior_shift_runs(bad)


def test_ood_rejects_unknown_donor_and_self_donor():
    config = loaded("audit")
    bad = copy.deepcopy(config)
    bad["ood"]["far"]["audit-nct"] = "audit-unknown"
    with pytest.raises(FmauditInputError, match="ood.far"):
        grid.ood_runs(bad)
    bad["ood"]["far"]["audit-nct"] = "audit-nct"
    with pytest.raises(FmauditInputError, match="another task"):
        grid.ood_runs(bad)

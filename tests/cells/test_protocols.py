"""CellPath protocols and the shard engine: partitions, leakage, run counts, probe selection, bounded memory."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fmaudit import grid
from fmaudit.analyses.cell_suite import POOL_MIN_WORK, run_cell_shard
from fmaudit.cells.features import open_cell_features
from fmaudit.cells.protocols import (
    check_partition,
    make_fold_manifest,
    make_partition,
    panel_from_manifests,
    read_fold_manifest,
    roi_mask,
)
from fmaudit.io import FmauditInputError
from fmaudit.probes import pool as pool_module

from .conftest import SECTIONS, cell_config, make_panel

SHARD = dict(Cs=[0.01, 0.1, 1.0], roi_fraction=0.5, val_fraction=0.25, max_train_cells=400, max_val_cells=100,
             device="cpu")
FOLDS = 3


@pytest.fixture(scope="module")
def panel_files(tmp_path_factory):
    return make_panel(tmp_path_factory.mktemp("panel"), n_cells=160)


def shard(runs, panel_files, **over):
    manifests, folders = panel_files
    params = {**SHARD, **over}
    return run_cell_shard(runs, folders, manifests, SECTIONS, fold_manifest=make_fold_manifest(SECTIONS, FOLDS),
                          n_folds=FOLDS, **params)


# --------------------------------------------------------------------------------------------------------
# partitions
# --------------------------------------------------------------------------------------------------------

def partition_kwargs():
    return dict(sections_by_organ=SECTIONS,
                folds=read_fold_manifest(make_fold_manifest(SECTIONS, FOLDS), SECTIONS, FOLDS),
                taxonomies=["fine", "coarse"], roi_fraction=0.5, val_fraction=0.25, max_train_cells=None,
                max_val_cells=None)


def test_held_out_units_never_train_or_validate(panel_files):
    manifests, _ = panel_files
    panel = panel_from_manifests(manifests, ["fine", "coarse"])
    cfg = cell_config()
    runs = grid.cell_runs(cfg)
    organ_of = {s: o for o, secs in SECTIONS.items() for s in secs}
    fold_of = dict(zip(make_fold_manifest(SECTIONS, FOLDS)["section"], make_fold_manifest(SECTIONS, FOLDS)["fold"]))
    section_of_row = np.array(panel.sections)[panel.section_code]
    n_checked = 0
    for (protocol, unit, seed), _ in runs.groupby(["protocol", "unit", "seed"], observed=True):
        part = make_partition(panel, str(protocol), str(unit), int(seed), **partition_kwargs())
        fitting = np.concatenate([part.train, part.val])
        fit_sections = set(section_of_row[fitting])
        test_sections = set(section_of_row[part.test])
        # the held-out unit, computed here from the config and the fold table, not from the partition
        if protocol == "IS":
            held = {unit}
            assert fit_sections == test_sections == held
            assert not np.intersect1d(fitting, part.test).size
        elif protocol == "IOCD":
            held = {unit}
            assert fit_sections == set(SECTIONS[organ_of[unit]]) - held
        elif protocol == "MOCV":
            held = {s for s, f in fold_of.items() if f"fold{f}" == unit}
            assert fit_sections == set(organ_of) - held
        else:
            held = set(SECTIONS[unit])
            assert not {organ_of[s] for s in fit_sections} & {unit}
        assert test_sections == held
        if protocol != "IS":
            assert not fit_sections & held, f"{protocol} {unit}: a held-out section is in training"
            labelled = panel.labelled()
            assert part.test.size == sum(int(labelled[panel.rows_of(s)].sum()) for s in held)
        n_checked += 1
    assert n_checked == runs.groupby(["protocol", "unit", "seed"], observed=True).ngroups


def test_is_roi_is_a_square_block_and_seeds_redraw_it(panel_files):
    manifests, _ = panel_files
    panel = panel_from_manifests(manifests, ["fine", "coarse"])
    rows = panel.rows_of("lung-1")
    x, y = panel.x[rows], panel.y[rows]
    parts = [make_partition(panel, "IS", "lung-1", s, **partition_kwargs()) for s in (0, 1, 0)]
    assert np.array_equal(parts[0].train, parts[2].train) and np.array_equal(parts[0].test, parts[2].test)
    assert not np.array_equal(parts[0].test, parts[1].test)
    for part in parts[:2]:
        inside = np.setdiff1d(rows, part.held_out)
        assert inside.size == round(0.5 * rows.size)
        assert set(part.train) | set(part.val) <= set(inside)
        # square block: every ROI cell is nearer (L-inf) to the block's centre than every outside cell
        rng_free = []
        for c in inside:
            d = np.maximum(np.abs(x - panel.x[c]), np.abs(y - panel.y[c]))
            local = d[inside - rows[0]]
            outside = d[part.held_out - rows[0]]
            if local.max() <= outside.min():
                rng_free.append(c)
        assert rng_free, "no centre makes the ROI an L-infinity ball"
    mask = roi_mask(x, y, 0.3, np.random.default_rng(0))
    assert mask.sum() == round(0.3 * rows.size)


def test_check_partition_catches_a_leak(panel_files):
    manifests, _ = panel_files
    panel = panel_from_manifests(manifests, ["fine", "coarse"])
    part = make_partition(panel, "LOOO", "lung", 0, **partition_kwargs())
    leaky = type(part)(**{**part.__dict__, "train": np.sort(np.r_[part.train, part.test[:1]])})
    with pytest.raises(FmauditInputError, match="held-out cell"):
        check_partition(leaky, panel)


def test_training_caps_and_validation_share(panel_files):
    manifests, _ = panel_files
    panel = panel_from_manifests(manifests, ["fine", "coarse"])
    kw = {**partition_kwargs(), "max_train_cells": 50, "max_val_cells": 20}
    part = make_partition(panel, "LOOO", "breast", 1, **kw)
    assert part.train.size == 50 and part.val.size == 20
    full = make_partition(panel, "LOOO", "breast", 1, **partition_kwargs())
    n_pool = full.train.size + full.val.size
    assert full.val.size == round(0.25 * n_pool)


def test_fold_manifest_is_organ_aware_and_validated(tmp_path):
    sections = {"a": ["a1", "a2", "a3"], "b": ["b1", "b2"], "c": ["c1"], "d": ["d1", "d2"]}
    folds = make_fold_manifest(sections, 3)
    for organ, group in folds.groupby("organ"):
        assert group["fold"].nunique() == len(group), f"organ {organ} has two sections in one fold"
    sizes = folds["fold"].value_counts()
    assert sizes.max() - sizes.min() <= 1 and set(sizes.index) == {0, 1, 2}
    path = tmp_path / "folds.tsv"
    folds.to_csv(path, sep="\t", index=False)
    units = read_fold_manifest(path, sections, 3)
    assert sorted(s for v in units.values() for s in v) == sorted(s for v in sections.values() for s in v)
    bad = folds.copy()
    bad.loc[0, "fold"] = 7
    with pytest.raises(FmauditInputError, match="row 1: fold 7 outside"):
        read_fold_manifest(bad, sections, 3)
    bad = folds.copy()
    bad.loc[1, "organ"] = "b"
    with pytest.raises(FmauditInputError, match="row 2: section 'a2' is under organ 'a'"):
        read_fold_manifest(bad, sections, 3)
    with pytest.raises(FmauditInputError, match=r"section\(s\) \['d2'\].*no fold"):
        read_fold_manifest(folds[folds["section"] != "d2"], sections, 3)
    with pytest.raises(FmauditInputError, match="not in the config"):
        read_fold_manifest(pd.concat([folds, pd.DataFrame([{"section": "z", "organ": "a", "fold": 0}])]), sections, 3)
    with pytest.raises(FmauditInputError, match="hold no section"):
        read_fold_manifest(folds.assign(fold=0), sections, 3)


def test_preset_fold_manifest_and_settings_from_the_config():
    from fmaudit.analyses.cell_suite import shard_settings
    from fmaudit.config import load_config
    from slide_utils import REPO_ROOT

    preset = load_config(REPO_ROOT / "resources" / "presets" / "cellpath.yaml")
    cells = preset["cells"]
    mocv = shard_settings(cells, "MOCV")
    assert mocv["fold_manifest"] == "resources/cells/cellpath_folds.tsv" and mocv["n_folds"] == 5
    units = read_fold_manifest(REPO_ROOT / mocv["fold_manifest"], cells["sections"], mocv["n_folds"])
    assert len(units) == 5
    assert units == read_fold_manifest(make_fold_manifest(cells["sections"], 5), cells["sections"], 5)
    is_ = shard_settings(cells, "IS")
    assert is_["roi_fraction"] == 0.5 and is_["Cs"] == [0.001, 0.01, 0.1, 1.0] and is_["max_train_cells"] == 10000


# --------------------------------------------------------------------------------------------------------
# the shard engine
# --------------------------------------------------------------------------------------------------------

def test_shards_produce_exactly_the_grids_runs(tmp_path):
    small = make_panel(tmp_path, n_cells=60, dim=4)
    cfg = cell_config()
    runs = grid.cell_runs(cfg)
    jobs = grid.jobs(runs, "cells")
    assert len(jobs) == 4
    outs = []
    for job in jobs.itertuples(index=False):
        sub = runs[(runs["protocol"] == job.protocol) & (runs["encoder"] == job.encoder)
                   & (runs["magnification"] == job.magnification)]
        out = shard(sub, small, Cs=[1.0], max_iter=50)
        assert len(out) == len(sub)
        pd.testing.assert_frame_equal(out[list(sub.columns)].astype(str), sub.reset_index(drop=True).astype(str))
        outs.append(out)
    out = pd.concat(outs, ignore_index=True)
    assert len(out) == len(runs) == 2 * 7 * (2 * 6 + 1 * 5 + 1 * 3 + 1 * 3)
    assert (out["status"] == "ok").all()
    assert out["run_id"].is_unique
    ok = out["macro_f1"].between(0, 1) & out["macro_auroc"].between(0, 1)
    assert ok.all()
    assert set(out["C"]) == {1.0}


def test_cls_runs_are_rows_with_a_reason_when_there_is_no_class_token(tmp_path):
    manifests, folders = make_panel(tmp_path, n_cells=80, has_cls=False)
    runs = grid.cell_runs(cell_config(protocols={"LOOO": {"seeds": [0]}}))
    out = run_cell_shard(runs, folders, manifests, SECTIONS, **SHARD)
    assert len(out) == len(runs)
    cls_rows = out["readout"].astype(str).str.contains("cls")
    assert cls_rows.sum() == 3 * 2 * 3  # cls, nuc_add_cls, nuc_cat_cls x 2 taxonomies x 3 organs
    assert out.loc[cls_rows, "status"].str.contains("class token").all()
    assert out.loc[cls_rows, "macro_f1"].isna().all()
    assert (out.loc[~cls_rows, "status"] == "ok").all()


def test_engine_never_fits_on_held_out_cells(panel_files, monkeypatch):
    """Spy on every probe fit: identify its training rows by their Nuc features and compare with the held-out
    unit computed from the config."""
    manifests, folders = panel_files
    item_of_row = {}
    for folder in folders.values():
        feats = open_cell_features(folder)
        for item, row in zip(feats.item_ids, feats.readout("nuc")):
            item_of_row[row.tobytes()] = item
    calls = []
    real_fit = pool_module.fit_logistic_batch

    def spy(X, y, subsets, *args, **kwargs):
        rows = np.unique(np.concatenate(subsets))
        calls.append([item_of_row[X[r].tobytes()] for r in rows])
        return real_fit(X, y, subsets, *args, **kwargs)

    monkeypatch.setattr(pool_module, "fit_logistic_batch", spy)
    runs = grid.cell_runs(cell_config(readouts=("nuc",)))
    fold_of = dict(zip(make_fold_manifest(SECTIONS, FOLDS)["section"], make_fold_manifest(SECTIONS, FOLDS)["fold"]))
    organ_of = {s: o for o, secs in SECTIONS.items() for s in secs}
    for (protocol, unit), sub in runs.groupby(["protocol", "unit"], observed=True):
        if protocol == "IS":
            continue
        calls.clear()
        shard(sub, panel_files)
        held = ({unit} if protocol == "IOCD" else set(SECTIONS[unit]) if protocol == "LOOO"
                else {s for s, f in fold_of.items() if f"fold{f}" == unit})
        assert len(calls) == len(sub)
        for items in calls:
            leaked = [i for i in items if i.split("/")[0] in held]
            assert not leaked, f"{protocol} {unit}: held-out cells in training, e.g. {leaked[:3]}"
            if protocol == "IOCD":
                assert {i.split("/")[0] for i in items} <= set(SECTIONS[organ_of[unit]])


def test_one_run_equals_scikit_learn_selected_on_validation(panel_files):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score, roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    manifests, folders = panel_files
    runs = grid.cell_runs(cell_config(readouts=("nuc_cat_mean",),
                                      protocols={"IOCD": {"seeds": [3], "min_sections_per_organ": 2}}))
    sub = runs[(runs["unit"] == "breast-2") & (runs["taxonomy"] == "fine")]
    out = shard(sub, panel_files, tol=1e-8, max_iter=5000, dtype="float64").iloc[0]

    panel = panel_from_manifests(manifests, ["fine"])
    part = make_partition(panel, "IOCD", "breast-2", 3, **{**partition_kwargs(), "taxonomies": ["fine"],
                                                            "max_train_cells": 400, "max_val_cells": 100})

    def data(rows):
        rows = rows[panel.labels["fine"][rows] >= 0]
        parts = []
        for s in np.array(panel.sections)[np.unique(panel.section_code[rows])]:
            local = rows[np.array(panel.sections)[panel.section_code[rows]] == s] - panel.rows_of(s)[0]
            parts.append(open_cell_features(folders[s]).readout("nuc_cat_mean", local))
        return np.concatenate(parts), panel.labels["fine"][rows]

    (Xtr, ytr), (Xva, yva), (Xte, yte) = data(part.train), data(part.val), data(part.test)
    best = None
    for C in SHARD["Cs"]:
        model = make_pipeline(StandardScaler(), LogisticRegression(C=C, tol=1e-10, max_iter=10000)).fit(Xtr, ytr)
        f1 = f1_score(yva, model.predict(Xva), labels=np.unique(yva), average="macro", zero_division=0)
        if best is None or f1 > best[0] + 1e-12:
            best = (f1, C, model)
    f1_val, C, model = best
    assert out["C"] == C and out["val_macro_f1"] == pytest.approx(f1_val)
    assert out["macro_f1"] == pytest.approx(f1_score(yte, model.predict(Xte), labels=np.unique(yte),
                                                     average="macro", zero_division=0), abs=1e-6)
    proba = np.zeros((len(yte), 5))
    proba[:, model.classes_] = model.predict_proba(Xte)
    assert out["macro_auroc"] == pytest.approx(roc_auc_score(yte, proba, multi_class="ovr"), abs=1e-4)


def test_memory_bounds_change_the_batching_not_the_numbers(panel_files):
    runs = grid.cell_runs(cell_config(readouts=("nuc", "nuc_cat_mean"), protocols={"LOOO": {"seeds": [0, 1]}}))
    exact = dict(dtype="float64", tol=1e-10, max_iter=5000)
    big = shard(runs, panel_files, **exact)
    small = shard(runs, panel_files, chunk_bytes=1, score_budget_bytes=1, **exact)
    pd.testing.assert_frame_equal(big, small)
    # one unit per engine call instead of all together: the same optimum up to summation order
    alone = shard(runs, panel_files, fit_budget_bytes=1, **exact)
    pd.testing.assert_frame_equal(big.drop(columns=["n_iter", "macro_auroc"]),
                                  alone.drop(columns=["n_iter", "macro_auroc"]))
    np.testing.assert_allclose(big["macro_auroc"], alone["macro_auroc"], atol=1e-6)


def test_worker_processes_change_where_calls_run_not_the_numbers(panel_files, caplog):
    """The engine calls side by side in a worker process and this one (what a large CPU shard does) give the runs of
    the calls fitted here, one after another: the same optimum, up to the summation order of threads."""
    runs = grid.cell_runs(cell_config(readouts=("nuc", "nuc_cat_mean"), protocols={"LOOO": {"seeds": [0, 1]}}))
    exact = dict(dtype="float64", tol=1e-10, max_iter=5000)
    here = shard(runs, panel_files, call_workers=1, n_threads=2, **exact)
    with caplog.at_level("INFO", logger="fmaudit.analyses.cell_suite"):
        workers = shard(runs, panel_files, call_workers=2, **exact)
    assert "side by side on 2 cores (1 worker processes and this one)" in caplog.text
    pd.testing.assert_frame_equal(here.drop(columns=["n_iter", "macro_auroc"]),
                                  workers.drop(columns=["n_iter", "macro_auroc"]))
    np.testing.assert_allclose(here["macro_auroc"], workers["macro_auroc"], atol=1e-6)
    # left to its cost model, this panel's shard is far below the work that pays for starting workers
    caplog.clear()
    with caplog.at_level("INFO", logger="fmaudit.analyses.cell_suite"):
        shard(runs, panel_files, n_threads=2, **exact)
    assert "side by side" not in caplog.text and POOL_MIN_WORK > 1e8


def test_bad_jobs_and_single_class_training(panel_files, tmp_path):
    runs = grid.cell_runs(cell_config())
    with pytest.raises(FmauditInputError, match="one job is one"):
        shard(runs, panel_files)
    manifests, folders = panel_files
    looo = runs[runs["protocol"] == "LOOO"]
    with pytest.raises(FmauditInputError, match="no features or manifest.*skin-1"):
        run_cell_shard(looo, {k: v for k, v in folders.items() if k != "skin-1"}, manifests, SECTIONS, **SHARD)
    with pytest.raises(FmauditInputError, match="MOCV runs need n_folds"):
        run_cell_shard(runs[runs["protocol"] == "MOCV"], folders, manifests, SECTIONS, **SHARD)
    for cap in ("max_train_cells", "max_val_cells"):
        with pytest.raises(FmauditInputError, match=f"{cap}=0: need a whole number >= 1"):
            run_cell_shard(looo, folders, manifests, SECTIONS, **{**SHARD, cap: 0})
    with pytest.raises(FmauditInputError, match="IS runs need roi_fraction"):
        run_cell_shard(runs[runs["protocol"] == "IS"], folders, manifests, SECTIONS,
                       **{k: v for k, v in SHARD.items() if k != "roi_fraction"})
    one_class = {s: m.assign(label_fine=pd.array([1] * len(m), dtype="Int64")) if s == "lung-1" else m
                 for s, m in manifests.items()}
    is_runs = runs[(runs["protocol"] == "IS") & (runs["unit"] == "lung-1") & (runs["readout"] == "nuc")]
    out = run_cell_shard(is_runs, folders, one_class, SECTIONS, **SHARD)
    fine = out["taxonomy"].astype(str) == "fine"
    assert out.loc[fine, "status"].str.contains("fewer than 2 classes").all()
    assert (out.loc[~fine, "status"] == "ok").all()
    shuffled = {s: (m.iloc[::-1].reset_index(drop=True) if s == "lung-1" else m) for s, m in manifests.items()}
    with pytest.raises(FmauditInputError, match="not the cells of section 'lung-1'"):
        run_cell_shard(is_runs, folders, shuffled, SECTIONS, **SHARD)

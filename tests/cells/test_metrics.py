"""CellPath metrics and summaries against independent references (scikit-learn, scipy, hand computation)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from fmaudit.cells.metrics import (
    CRT_DEFINITION,
    check_nested,
    cra_per_section,
    cra_table,
    crt_table,
    macro_auroc_present,
    macro_f1_present,
    magnification_retention,
    nested_section_subsets,
    pretraining_scale,
    protocol_table,
    readout_table,
    subset_table,
    taxonomy_rank_consistency,
    win_matrix,
)
from fmaudit.io import FmauditInputError
from fmaudit.report.cells import cra_crt_landscape
from slide_utils import TISSUE_RGB

# --------------------------------------------------------------------------------------------------------
# per run
# --------------------------------------------------------------------------------------------------------

def test_per_run_metrics_match_scikit_learn():
    from sklearn.metrics import f1_score, roc_auc_score

    rng = np.random.default_rng(0)
    for k, present in ((4, [0, 1, 2, 3]), (5, [0, 2, 3])):
        y = rng.choice(present, 300)
        logits = rng.normal(size=(300, k)) + 1.5 * np.eye(k)[y]
        p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        pred = p.argmax(1)
        assert macro_f1_present(y, pred, k) == pytest.approx(
            f1_score(y, pred, labels=present, average="macro", zero_division=0))
        expected_auc = np.mean([roc_auc_score(y == c, p[:, c]) for c in present])
        assert macro_auroc_present(y, p) == pytest.approx(expected_auc)
        if len(present) == k:
            assert macro_auroc_present(y, p) == pytest.approx(roc_auc_score(y, p, multi_class="ovr"))
    assert np.isnan(macro_auroc_present(np.zeros(5, int), np.full((5, 3), 1 / 3)))
    # a predicted class absent from the test labels costs recall, it is not averaged in
    assert macro_f1_present(np.array([0, 0, 1, 1]), np.array([0, 2, 1, 1]), 3) == pytest.approx((2 / 3 + 1) / 2)


# --------------------------------------------------------------------------------------------------------
# fixed run tables
# --------------------------------------------------------------------------------------------------------

ENCODERS = ["enc-a", "enc-b", "enc-c"]
SECTIONS = [f"s{i}" for i in range(8)]
# four organs of unequal size, so organ balancing differs from a mean over sections
ORGAN_OF = {"s0": "o1", "s1": "o1", "s2": "o1", "s3": "o1", "s4": "o1", "s5": "o2", "s6": "o3", "s7": "o4"}


def fixed_runs(seed: int = 0) -> pd.DataFrame:
    """IS runs of 3 encoders x 8 sections x 2 seeds x (nuc, mean) x 2 taxonomies at 40x/20x/10x with fixed,
    known macro-F1 values; plus IOCD/MOCV/LOOO nuc runs."""
    rng = np.random.default_rng(seed)
    rows = []
    quality = {"enc-a": 0.60, "enc-b": 0.50, "enc-c": 0.45}
    cra = {"enc-a": 0.12, "enc-b": 0.06, "enc-c": 0.061}
    mag_factor = {40: 1.0, 20: 0.98, 10: 0.9}
    for enc, mag, tax, sec, s in itertools.product(ENCODERS, (40, 20, 10), ("fine", "coarse"), SECTIONS, (0, 1)):
        base = quality[enc] * mag_factor[mag] + (0.2 if tax == "coarse" else 0) + rng.normal(scale=0.02)
        for readout, value in (("nuc", base + cra[enc] + rng.normal(scale=0.03)), ("mean", base)):
            rows.append(dict(protocol="IS", encoder=enc, magnification=mag, taxonomy=tax, readout=readout, seed=s,
                             unit=sec, organ=ORGAN_OF[sec], status="ok", macro_f1=value,
                             macro_auroc=min(1.0, value + 0.2)))
    for enc, (protocol, units), tax, s in itertools.product(
            ENCODERS,
            (("IOCD", SECTIONS[:6]), ("MOCV", ["fold0", "fold1", "fold2"]), ("LOOO", ["o1", "o2", "o3", "o4"])),
            ("fine", "coarse"), (0, 1, 2)):
        for u in units:
            value = (quality[enc] - 0.1 + (0.2 if tax == "coarse" else 0) + 0.01 * hash(u) % 3 / 100
                     + rng.normal(scale=0.02))
            rows.append(dict(protocol=protocol, encoder=enc, magnification=20, taxonomy=tax, readout="nuc", seed=s,
                             unit=u, organ="", status="ok", macro_f1=value, macro_auroc=value + 0.2))
    return pd.DataFrame(rows)


def test_cra_is_organ_balanced_and_its_wins_run_over_section_seed_units():
    """The seed's CRA table: sections first averaged over seeds, then over their organ, mean ± SD across organs;
    the per-section form beside it. Wins and Nuc-vs-Mean: paired Wilcoxon over every (section, seed) run."""
    runs = fixed_runs()
    # a skipped run and a NaN do not enter the seed means
    runs = pd.concat([runs, runs.iloc[[0]].assign(seed=9, status="skipped: x", macro_f1=np.nan)], ignore_index=True)
    table = cra_table(runs, magnification=20)
    sections = cra_table(runs, magnification=20, balance="unit")
    is20 = runs[(runs["protocol"] == "IS") & (runs["magnification"] == 20) & (runs["status"] == "ok")]
    seed_mean = is20.groupby(["encoder", "taxonomy", "readout", "unit"])["macro_f1"].mean()
    per_run = is20.set_index(["encoder", "taxonomy", "readout", "unit", "seed"])["macro_f1"].sort_index()
    organs = pd.Series(ORGAN_OF)
    for tax in ("fine", "coarse"):
        cra = {e: 100 * (seed_mean[e, tax, "nuc"] - seed_mean[e, tax, "mean"]).reindex(SECTIONS) for e in ENCODERS}
        cra_run = {e: 100 * (per_run[e, tax, "nuc"] - per_run[e, tax, "mean"]).sort_index() for e in ENCODERS}
        for e in ENCODERS:
            row = table[(table["encoder"] == e) & (table["taxonomy"] == tax)].iloc[0]
            by_organ = cra[e].groupby(organs[cra[e].index].to_numpy()).mean()
            assert row["cra_mean_pp"] == pytest.approx(by_organ.mean())
            assert row["cra_sd_pp"] == pytest.approx(by_organ.std(ddof=1))
            assert row["n_balanced"] == 4 and row["n_sections"] == 8 and row["balance"] == "organ"
            flat = sections[(sections["encoder"] == e) & (sections["taxonomy"] == tax)].iloc[0]
            assert flat["cra_mean_pp"] == pytest.approx(cra[e].mean())
            assert flat["cra_sd_pp"] == pytest.approx(np.std(cra[e], ddof=1)) and flat["balance"] == "section"
            wins = 0
            for other in ENCODERS:
                if other == e:
                    continue
                a, b = cra_run[e], cra_run[other].reindex(cra_run[e].index)
                p = sps.wilcoxon(a, b).pvalue
                wins += int(p < 0.05 and np.median(a - b) > 0)
            assert row["significant_wins"] == wins and row["n_win_units"] == 16  # 8 sections x 2 seeds
            nuc = per_run[e, tax, "nuc"].sort_index()
            mean = per_run[e, tax, "mean"].reindex(nuc.index)
            assert row["nuc_vs_mean_p"] == pytest.approx(sps.wilcoxon(nuc, mean).pvalue)
    fine = table[table["taxonomy"] == "fine"].set_index("encoder")
    assert fine.loc["enc-a", "significant_wins"] == 2 and fine.loc["enc-a", "rank"] == 1
    assert fine["nuc_beats_mean"].all()
    per = cra_per_section(runs, 20)
    assert len(per) == 3 * 2 * 8 and {"f1_nuc_pct", "f1_mean_pct", "cra_pp"} <= set(per.columns)


def test_mocv_wins_are_counted_over_fold_seed_units():
    """5 folds x 3 seeds: a Wilcoxon test over the 5 seed-averaged folds can never reach p < 0.05 (its smallest
    two-sided p is 0.0625), so no encoder could win MOCV; over the 15 (fold, seed) runs a clearly better encoder
    wins (the seed reports up to 27 MOCV wins)."""
    rows = []
    rng = np.random.default_rng(1)
    for enc, level in (("good", 0.6), ("fair", 0.5), ("weak", 0.4)):
        for fold, seed in itertools.product(range(5), range(3)):
            rows.append(dict(protocol="MOCV", encoder=enc, magnification=20, taxonomy="fine", readout="nuc", seed=seed,
                             unit=f"fold{fold}", organ="", status="ok", macro_f1=level + rng.normal(scale=0.02),
                             macro_auroc=0.8))
    table = protocol_table(pd.DataFrame(rows), "MOCV", 20).set_index("encoder")
    assert table.loc["good", "significant_wins"] == 2 and table.loc["weak", "significant_wins"] == 0
    assert table.loc["good", "n_win_units"] == 15 and table.loc["good", "balance"] == "fold"
    five = pd.DataFrame(rows).groupby(["encoder", "unit"])["macro_f1"].mean().unstack()
    assert sps.wilcoxon(five.loc["good"], five.loc["fair"]).pvalue > 0.05  # what seed means allowed


def test_win_matrix_uses_common_valid_units_only():
    values = pd.DataFrame({"a": np.arange(10.0) + 5, "b": np.arange(10.0), "c": np.r_[np.arange(9.0), np.nan]})
    m = win_matrix(values).set_index(["encoder", "opponent"])
    assert m.loc[("a", "b"), "win"] and not m.loc[("b", "a"), "win"]
    assert m.loc[("a", "c"), "n_pairs"] == 9
    assert m.loc[("a", "c"), "p"] == pytest.approx(sps.wilcoxon(values["a"][:9], values["c"][:9]).pvalue)
    assert not m.loc[("b", "c"), "win"]  # all differences zero: no test, no win


def test_protocol_table_and_crt_by_hand():
    runs = fixed_runs()
    table = protocol_table(runs, "LOOO", 20)
    looo = runs[(runs["protocol"] == "LOOO") & (runs["taxonomy"] == "fine")]
    unit = looo.groupby(["encoder", "unit"])["macro_f1"].mean().unstack()
    row = table[(table["encoder"] == "enc-b") & (table["taxonomy"] == "fine")].iloc[0]
    assert row["macro_f1_mean_pct"] == pytest.approx(100 * unit.loc["enc-b"].mean())
    assert row["macro_f1_sd_pct"] == pytest.approx(100 * unit.loc["enc-b"].std(ddof=1))
    assert row["n_units"] == 4 and row["unit"] == "organ"

    crt = crt_table(runs, 20)
    relative, wins = {}, {}
    for p in ("IOCD", "MOCV", "LOOO"):
        sub = runs[(runs["protocol"] == p) & (runs["taxonomy"] == "fine")]
        t = 100 * sub.groupby(["unit", "encoder"])["macro_f1"].mean().unstack()
        relative[p] = t.sub(t.median(axis=1), axis=0).mean()
        per_run = sub.pivot_table(index=["unit", "seed"], columns="encoder", values="macro_f1")
        wins[p] = {e: sum(int(sps.wilcoxon(per_run[e], per_run[o]).pvalue < 0.05
                              and np.median(per_run[e] - per_run[o]) > 0) for o in ENCODERS if o != e)
                   for e in ENCODERS}
    fine = crt[crt["taxonomy"] == "fine"].set_index("encoder")
    for e in ENCODERS:
        assert fine.loc[e, "crt"] == pytest.approx(np.mean([wins[p][e] for p in wins]))
        assert fine.loc[e, "wins_MOCV"] == wins["MOCV"][e]
        assert fine.loc[e, "crt_relative_pp"] == pytest.approx(np.mean([relative[p][e] for p in relative]))
        assert fine.loc[e, "relative_LOOO_pp"] == pytest.approx(relative["LOOO"][e])
    assert (fine["definition"] == CRT_DEFINITION).all() and fine["protocols"].iloc[0] == "IOCD,MOCV,LOOO"
    assert fine.loc["enc-b", "crt_relative_pp"] == pytest.approx(0, abs=1.5)  # the median encoder
    assert fine.loc["enc-a", "rank"] == 1 and fine.loc["enc-a", "crt"] == 2  # beats both, in every protocol


def test_taxonomy_rank_consistency_against_scipy():
    runs = fixed_runs()
    out = taxonomy_rank_consistency(runs, 20).set_index("protocol")
    for p in ("IS", "IOCD", "MOCV", "LOOO"):
        sub = runs[(runs["protocol"] == p) & (runs["magnification"] == 20) & (runs["readout"] == "nuc")]
        unit = sub.groupby(["taxonomy", "encoder", "unit"])["macro_f1"].mean()
        f = unit["fine"].groupby("encoder").mean()
        c = unit["coarse"].groupby("encoder").mean()
        assert out.loc[p, "spearman_rho"] == pytest.approx(sps.spearmanr(f[ENCODERS], c[ENCODERS]).statistic)
    two = taxonomy_rank_consistency(runs[runs["encoder"] != "enc-c"], 20)
    assert two["spearman_rho"].isna().all() and two["note"].str.contains("need 3").all()
    n = len(ENCODERS)  # defined, but over fewer than 5 encoders: the note says so, and it is never blank
    assert (out["note"] == f"over {n} encoders: uninformative (rho takes few values; at least 5 are needed)").all()


def test_nested_subsets_and_their_summary():
    scores = {f"s{i}": float(v) for i, v in enumerate([0.9, 0.1, 0.5, 0.7, 0.3, 0.8, 0.2, 0.6])}
    subsets = nested_section_subsets(scores, sizes=(3, 5, 8))
    assert subsets["S3"] == ["s0", "s5", "s3"] and subsets["S5"][:3] == subsets["S3"]
    assert set(subsets["S3"]) < set(subsets["S5"]) < set(subsets["S8"])
    with pytest.raises(FmauditInputError, match="S9 needs 9"):
        nested_section_subsets(scores, sizes=(9,))
    with pytest.raises(FmauditInputError, match="S2 is not inside S3"):
        check_nested({"S2": ["s1", "s9"], "S3": ["s0", "s1", "s2"]})
    table, ranks = subset_table(fixed_runs(), subsets, 20)
    assert set(table["subset"]) == {"S3", "S5", "S8"}
    assert (table.loc[table["subset"] == "S3", "n_sections"] == 3).all()
    full = cra_table(fixed_runs(), 20).set_index(["encoder", "taxonomy"])["cra_mean_pp"]
    s8 = table[table["subset"] == "S8"].set_index(["encoder", "taxonomy"])["cra_mean_pp"]
    pd.testing.assert_series_equal(s8.sort_index(), full.sort_index(), check_names=False)
    assert ranks.loc[ranks["subset"] == "S8", "spearman_rho_cra"].eq(1.0).all()


def test_magnification_retention_and_readouts():
    runs = fixed_runs()
    out = magnification_retention(runs, "IS", "nuc", reference=40)
    sub = runs[(runs["protocol"] == "IS") & (runs["readout"] == "nuc") & (runs["taxonomy"] == "fine")
               & (runs["encoder"] == "enc-a")]
    m = sub.groupby(["magnification", "unit"])["macro_f1"].mean().groupby("magnification").mean()
    row = out[(out["encoder"] == "enc-a") & (out["taxonomy"] == "fine")].iloc[0]
    assert row["retention_20x_over_40x_pct"] == pytest.approx(100 * m[20] / m[40])
    assert row["retention_10x_over_40x_pct"] == pytest.approx(100 * m[10] / m[40])
    panel = out[(out["encoder"] == "panel mean") & (out["taxonomy"] == "fine")].iloc[0]
    enc_rows = out[(out["encoder"] != "panel mean") & (out["taxonomy"] == "fine")]
    assert panel["retention_10x_over_40x_pct"] == pytest.approx(enc_rows["retention_10x_over_40x_pct"].mean())
    assert 85 < panel["retention_10x_over_40x_pct"] < 95 < panel["retention_20x_over_40x_pct"]
    with pytest.raises(FmauditInputError, match="reference 5x"):
        magnification_retention(runs, reference=5)
    readouts = readout_table(runs, "IS", 20)
    mean_rows = readouts[readouts["readout"] == "mean"]
    assert (mean_rows["minus_nuc_pp"] < 0).all()


def test_landscape_omits_encoders_without_pretraining_scale(tmp_path):
    runs = fixed_runs()
    registry = {"enc-a": {"pretraining_wsis": 100000}, "enc-b": {"pretraining_wsis": 1170}, "enc-c": {}}
    scale = pretraining_scale(registry, ENCODERS)
    assert np.isnan(scale["enc-c"]) and scale["enc-a"] == 1e5
    result = cra_crt_landscape(cra_table(runs, 20), crt_table(runs, 20), scale, tmp_path / "landscape.png")
    assert result["plotted"] == ["enc-a", "enc-b"] and result["omitted_no_scale"] == ["enc-c"]
    assert (tmp_path / "landscape.png").stat().st_size > 10_000
    drawn = cra_crt_landscape(cra_table(runs, 20), crt_table(runs, 20), scale, tmp_path / "hollow.png",
                              draw_unscaled=True)
    assert drawn["unscaled_hollow"] == ["enc-c"] and drawn["omitted_no_scale"] == []


def test_registry_pretraining_scales_are_positive_where_given():
    from fmaudit.registry import load_registry

    registry = load_registry()
    given = {k: v["pretraining_wsis"] for k, v in registry.items() if "pretraining_wsis" in v}
    assert given and all(v > 0 for v in given.values())
    assert not any(k.startswith("demo-") for k in given)


# --------------------------------------------------------------------------------------------------------
# planted labels, end to end: class painted at the nucleus only
# --------------------------------------------------------------------------------------------------------

NUCLEUS_RGB = np.array([(70, 20, 130), (150, 30, 50), (30, 110, 70), (20, 20, 20)], dtype=np.int16)


def painted_section(make_pyramid, name: str, seed: int, n_per_patch: int = 4, side: int = 512):
    """0.5 µm/px slide: noisy tissue with nuclei (discs of radius 4 px) whose colour is their class; every
    64-px patch mixes several classes, so the patch mean dilutes what the nucleus carries."""
    rng = np.random.default_rng(seed)
    img = np.clip(np.array(TISSUE_RGB)[None, None] + rng.normal(0, 12, (side, side, 3)), 0, 255).astype(np.int16)
    yy, xx = np.mgrid[-4:5, -4:5]
    disc = yy**2 + xx**2 <= 16
    xs, ys, labels = [], [], []
    for py, px in itertools.product(range(side // 64), range(side // 64)):
        for q in range(n_per_patch):  # one nucleus per quadrant, jittered
            cx = px * 64 + 16 + 32 * (q % 2) + rng.integers(-8, 9)
            cy = py * 64 + 16 + 32 * (q // 2) + rng.integers(-8, 9)
            c = int(rng.integers(4))
            patch = img[cy - 4:cy + 5, cx - 4:cx + 5]
            patch[disc] = NUCLEUS_RGB[c]
            xs.append(cx + 0.5)
            ys.append(cy + 0.5)
            labels.append(c)
    path = make_pyramid(f"{name}.tif", np.clip(img, 0, 255).astype(np.uint8), n_levels=1, mpp=0.5)
    labels = np.array(labels)
    n = len(labels)
    manifest = pd.DataFrame({
        "item_id": [f"{name}/c{i}" for i in range(n)], "cell_id": [f"c{i}" for i in range(n)], "section": name,
        "organ": "breast", "slide": str(path), "mpp": 0.5, "he_x": xs, "he_y": ys, "centre_source": "nucleus_polygon",
        "label_fine": pd.array(labels, dtype="Int64"), "label_coarse": pd.array(labels // 2, dtype="Int64"),
        "label_fine_name": [f"t{c}" for c in labels], "label_coarse_name": [f"g{c // 2}" for c in labels]})
    return manifest


def test_planted_nucleus_labels_nuc_beats_mean(make_pyramid, tmp_path):
    from fmaudit import grid
    from fmaudit.analyses.cell_suite import run_cell_shard
    from fmaudit.cells.features import extract_cell_features

    sections = {"breast": ["sec-a", "sec-b"]}
    manifests, folders = {}, {}
    for i, name in enumerate(sections["breast"]):
        manifests[name] = painted_section(make_pyramid, name, seed=i)
        folders[name] = tmp_path / "f" / name
        extract_cell_features(manifests[name], "demo-vit-tiny", 20, folders[name], device="cpu", batch_size=64)
    cfg = {"encoders": ["demo-vit-tiny"], "datasets": ["x"],
           "tasks": {"cf": {"datasets": ["x"]}, "cc": {"datasets": ["x"]}},
           "cells": {"taxonomies": {"fine": "cf", "coarse": "cc"}, "sections": sections, "magnifications": [20],
                     "readouts": ["nuc", "mean"], "protocols": {"IS": {"seeds": [0, 1, 2]}}}}
    runs = grid.cell_runs(cfg)
    out = run_cell_shard(runs, folders, manifests, sections, Cs=[0.1, 1.0], roi_fraction=0.5,
                         val_fraction=0.25, max_train_cells=None, max_val_cells=None, device="cpu")
    assert (out["status"] == "ok").all()
    f1 = out.pivot_table(index=["taxonomy", "unit", "seed"], columns="readout", values="macro_f1")
    assert (f1["nuc"] > f1["mean"] + 0.15).all(), f1
    assert (f1.loc["fine", "nuc"] > 0.6).all()
    table = cra_table(out, magnification=20)
    assert (table["cra_mean_pp"] > 15).all()

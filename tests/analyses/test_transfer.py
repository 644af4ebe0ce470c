import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import f1_score

from fmaudit.analyses import transfer


def test_ood_stability_is_capped_mean_of_auroc_ratios(suite_results):
    rows, _ = suite_results
    st = transfer.ood_stability(rows, 15)
    assert len(st) == 4 and (st["n_pairs"] == 6).all()
    assert ((st["ood_stability"] > 0) & (st["ood_stability"] <= 1)).all()
    # by hand for one encoder
    m = transfer.seed_means(rows, 15)
    m = m[(m["encoder"] == "enc2") & (m["fraction"] == 1.0)]
    ind = m[m["in_domain"]].set_index("source_domain")["auroc_ovr_macro"]
    ratios = [min(r.auroc_ovr_macro / ind[r.source_domain], 1) for r in m[~m["in_domain"]].itertuples()]
    assert st.set_index("encoder").loc["enc2", "ood_stability"] == pytest.approx(np.mean(ratios))


def test_cri_is_the_product_of_its_axes(suite_results):
    rows, _ = suite_results
    cri = transfer.cri_table(rows, 15, include_bound_temperatures=True)
    expect = cri["auroc_id"] * (1 - cri["ece_after_source_ts"].clip(0, 1)) * cri["ood_stability"]
    np.testing.assert_allclose(cri["cri"], expect)
    assert set(cri["fraction"]) == {0.5, 1.0}
    assert (cri["cri_worst_axis"] <= cri["cri_geometric"] + 1e-12).all()
    # by default a cell whose every source temperature sits at a bound has no post-temperature ECE, so no CRI
    default = transfer.cri_table(rows, 15)
    undefined = default["n_source_ts_at_bound"] == default["n_source_ts_runs"]
    assert default.loc[undefined, "cri"].isna().all() and default.loc[~undefined, "cri"].notna().all()


def test_ece_slopes_and_bins(suite_results):
    rows, _ = suite_results
    slopes = transfer.ece_slopes(rows, 15)
    assert len(slopes) == 4 * 6
    assert slopes["transfer_auroc_bin"].notna().all()
    binned = transfer.ece_slope_by_auroc_bin(slopes)
    assert binned["n_combinations"].sum() == len(slopes)


def test_rank_transfer_per_pair(suite_results):
    rows, _ = suite_results
    rt = transfer.rank_transfer_table(rows, 15)
    assert len(rt) == 2 * 6  # fractions × directed pairs
    finite = rt["spearman_rho"].dropna()
    assert len(finite) >= 6 and finite.between(-1, 1).all()
    # ρ is undefined (NaN), not 0 or 1, where every encoder ties in-domain
    means = transfer.seed_means(rows, 15)
    ind = means[means["in_domain"]].groupby(["fraction", "source_domain"])["macro_f1"].nunique()
    tied = {k for k, v in ind.items() if v == 1}
    assert set(map(tuple, rt.loc[rt["spearman_rho"].isna(), ["fraction", "source_domain"]].to_numpy())) <= tied


def test_decoupling_pools_units_per_fraction(suite_results):
    rows, _ = suite_results
    per_unit, pooled = transfer.decoupling_table(rows, 15, include_bound_temperatures=True)
    assert len(per_unit) == 2 * 3
    assert set(pooled["fraction"]) == {0.5, 1.0}
    assert (pooled["n_units"] <= 3).all()
    assert pooled["I2"].dropna().between(0, 1).all()
    # by default encoders whose every source temperature sits at a bound have no post-temperature ECE to rank:
    # here three of the four (separable synthetic classes), which leaves no unit with two encoders
    per_unit, pooled = transfer.decoupling_table(rows, 15)
    assert len(per_unit) == 0 and len(pooled) == 0
    assert "ece_convention" in per_unit and "pooled_rho" in pooled  # empty tables keep their columns


def test_cross_dataset_leaderboard_sorted_by_most_shifted_target(suite_results):
    from fmaudit.analyses.leaderboard import leaderboard

    rows, preds = suite_results
    board = leaderboard(rows, preds, n_boot=20, seed=0, ece_bins=15)
    table = transfer.cross_dataset_leaderboard(board)
    one = table[(table["source_domain"] == "a")].dropna(axis=1, how="all")
    rank_col = [c for c in one.columns if c.startswith("rank_on_")][0]
    target = rank_col.removeprefix("rank_on_")
    assert list(one[target]) == sorted(one[target], reverse=True)
    assert list(one[rank_col]) == sorted(one[rank_col])


def test_rank_transfer_interval_resamples_test_patients_of_both_domains(suite_results):
    import warnings

    from scipy.stats import ConstantInputWarning, spearmanr

    from fmaudit.stats import bootstrap_counts

    _, preds = suite_results
    out = transfer.rank_transfer_intervals(preds, n_boot=30, seed=2)
    assert len(out) == 2 * 6
    undefined = out["spearman_rho_ci_lo"].isna()
    assert (out.loc[undefined, "rho_n_valid"] == 0).all()  # every draw tied (a saturated toy encoder): no interval
    ok = out[~undefined]
    assert len(ok) >= 6 and (ok["spearman_rho_ci_lo"] <= ok["spearman_rho_ci_hi"]).all()
    assert ok[["spearman_rho_ci_lo", "spearman_rho_ci_hi"]].stack().between(-1, 1).all()
    assert (out["rho_n_valid"] <= 30).all() and out["rho_ci_convention"].str.contains("test groups").all()
    # one cell by hand: sklearn macro-F1 on patient resamples of each side (independent draws), scipy's ρ
    r = out.iloc[3]

    def side_draws(target, random_state):
        cell = preds[(preds["fraction"] == r["fraction"]) & (preds["source_domain"] == r["source_domain"])
                     & (preds["target_domain"] == target)]
        items = cell.drop_duplicates("item_id").set_index("item_id")
        counts = bootstrap_counts(len(items), groups=items["group"].to_numpy(), n_boot=30, random_state=random_state)
        scores = {}
        for enc, e in cell.groupby("encoder"):
            per_seed = []
            for _, one in e.groupby("seed"):
                pred = np.stack(one.set_index("item_id").loc[items.index, "logits"].to_numpy()).argmax(1)
                per_seed.append([f1_score(items["label"], pred, average="macro", labels=range(3), sample_weight=w,
                                          zero_division=0) for w in counts])
            scores[enc] = np.mean(per_seed, axis=0)
        return scores

    src, tgt = side_draws(r["source_domain"], 2), side_draws(r["target_domain"], [2, 1])
    encs = sorted(src)
    with warnings.catch_warnings():  # a resample in which every encoder ties has no ρ (NaN), as in the analysis
        warnings.simplefilter("ignore", ConstantInputWarning)
        rho = [spearmanr([src[e][b] for e in encs], [tgt[e][b] for e in encs]).statistic for b in range(30)]
    rho = np.array(rho)[np.isfinite(rho)]
    lo, hi = np.percentile(rho, [2.5, 97.5])
    assert r["rho_n_valid"] == len(rho)
    assert (r["spearman_rho_ci_lo"] == pytest.approx(lo, abs=1e-9)
            and r["spearman_rho_ci_hi"] == pytest.approx(hi, abs=1e-9))


def test_cri_leaves_bound_source_temperatures_out_of_the_ece_and_counts_them(suite_results):
    rows, _ = suite_results
    rows = rows.assign(temperature_at_bound=False)  # start from no bound at all, then put one seed at a bound
    ts_rows = rows[(rows["stage"] == "source_ts") & rows["in_domain"]]
    enc = "enc3"
    rigged = rows.copy()
    first_seed = rigged["seed"] == rigged["seed"].min()
    at = (rigged["encoder"] == enc) & (rigged["stage"] == "source_ts") & first_seed
    rigged.loc[at, "temperature_at_bound"] = True
    rigged.loc[at, "ece_top_15_lohi"] = 0.9
    cri = transfer.cri_table(rigged, 15).set_index(["encoder", "fraction"])
    # the ECE mean is that of the other seed alone; the bound seed is counted
    ts = ts_rows[(ts_rows["encoder"] == enc) & (ts_rows["seed"] != rows["seed"].min())]
    expect = ts.groupby(["source_domain", "fraction"])["ece_top_15_lohi"].mean().groupby("fraction").mean()
    np.testing.assert_allclose(cri.loc[enc, "ece_after_source_ts"], expect.to_numpy())
    assert (cri.loc[enc, "n_source_ts_at_bound"] == 3).all() and (cri.loc[enc, "n_source_ts_runs"] == 6).all()
    with_bound = transfer.cri_table(rigged, 15, include_bound_temperatures=True).set_index(["encoder", "fraction"])
    assert (with_bound.loc[enc, "ece_after_source_ts"] > cri.loc[enc, "ece_after_source_ts"]).all()
    assert (with_bound.loc[enc, "cri"] < cri.loc[enc, "cri"]).all()


def test_cri_by_split_puts_the_leaky_split_beside_the_grouped_one(suite_results):
    rows, _ = suite_results
    leaky = rows.assign(task="t-patch", task_split="patch (leaky, as published)")
    both = pd.concat([rows.assign(task_split="manifest"), leaky], ignore_index=True)
    table = transfer.cri_by_split(transfer.cri_table(both, 15))
    assert set(table["task_split"]) == {"manifest", "patch (leaky, as published)"}
    assert len(table) == 2 * 4 * 2  # two tasks x four encoders x two fractions
    pair = table[(table["encoder"] == "enc0") & (table["fraction"] == 1.0)].set_index("task_split")
    assert pair.loc["manifest", "ood_stability"] == pytest.approx(
        pair.loc["patch (leaky, as published)", "ood_stability"])
    assert len(transfer.cri_by_split(transfer.cri_table(rows, 15))) == 0  # one split only: nothing to compare

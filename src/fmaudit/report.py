"""Report tables (CSV, Markdown, LaTeX) and figures from the aggregated runs and the shard predictions.

Every number comes with its convention; intervals are cluster-bootstrap percentile intervals over the
manifest's groups (patients or slides), computed over the seed-averaged metric so that they describe the
test-set sampling of the reported mean.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fmaudit.analyses import transfer  # noqa: E402
from fmaudit.io import atomic_path, dataframe_to_markdown, read_npz_provenance, read_table, write_table, write_text  # noqa: E402
from fmaudit.metrics import reliability_bins, softmax  # noqa: E402
from fmaudit.stats import bootstrap_counts, bootstrap_metric  # noqa: E402

ECE_COL = "ece_top_15_lohi"
RUN_KEYS = ["task", "head", "fraction", "encoder", "source_domain", "target_domain"]


def _fmt_ci(point: float, lo: float, hi: float) -> str:
    if not np.isfinite(point):
        return "n/a"
    return f"{point:.3f} [{lo:.3f}, {hi:.3f}]"


def load_predictions(paths: Sequence[Path]) -> pd.DataFrame:
    frames = [read_table(p) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _cell_resampling(preds: pd.DataFrame, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item order, labels, (B, N) group-cluster resample counts) of one cell's test items."""
    items = preds.drop_duplicates("item_id").set_index("item_id")
    counts = bootstrap_counts(len(items), groups=items["group"].to_numpy(), n_boot=n_boot, random_state=seed)
    return items.index.to_numpy(), items["label"].to_numpy().astype(int), counts


def _percentiles(boot: np.ndarray, alpha: float) -> tuple[float, float]:
    lo, hi = np.nanpercentile(boot, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


def seed_mean_bootstrap(preds: pd.DataFrame, metric: str, counts: np.ndarray, order: np.ndarray,
                        labels: np.ndarray, temperature_col: str | None = None) -> tuple[float, np.ndarray]:
    """(mean over seeds of ``metric``, its (B,) resampled values) for one cell, items in ``order``.

    All seeds of a cell are evaluated on the same items, so one resample matrix serves every seed (and,
    for paired comparisons, every encoder)."""
    points, boots = [], []
    full = np.ones((1, len(order)), dtype=np.int32)
    for _, one in preds.groupby("seed"):
        one = one.set_index("item_id").loc[order]
        temp = float(one[temperature_col].iloc[0]) if temperature_col else 1.0
        probs = softmax(np.stack(one["logits"].to_numpy()).astype(np.float64), temperature=temp)
        points.append(float(bootstrap_metric(metric, probs, labels, full)[0]))
        boots.append(bootstrap_metric(metric, probs, labels, counts))
    return float(np.mean(points)), np.nanmean(np.stack(boots), axis=0)


def paired_differences(board: pd.DataFrame, preds: pd.DataFrame, metric: str = "macro_f1", n_boot: int = 2000,
                       seed: int = 0, alpha: float = 0.05) -> pd.DataFrame:
    """Paired cluster bootstrap of each encoder's ``metric`` minus the in-domain best encoder's, per target.

    One resample of groups is shared by every encoder and seed of a (task, head, fraction, s→t) cell."""
    rows = []
    keys = ["task", "head", "fraction", "source_domain"]
    cells = dict(tuple(preds.groupby(keys + ["target_domain"])))
    for key, cell in board.groupby(keys):
        ind = cell[cell["in_domain"]]
        if ind["encoder"].nunique() < 2:
            continue
        reference = ind.sort_values(["macro_f1", "encoder"], ascending=[False, True])["encoder"].iloc[0]
        for target in cell["target_domain"].unique():
            sel = cells[(*key, target)]
            order, labels, counts = _cell_resampling(sel, n_boot, seed)
            res = {enc: seed_mean_bootstrap(p, metric, counts, order, labels) for enc, p in sel.groupby("encoder")}
            ref_point, ref_boot = res[reference]
            for enc, (point, boot) in res.items():
                if enc == reference:
                    continue
                lo, hi = _percentiles(boot - ref_boot, alpha)
                rows.append({**dict(zip(keys, key)), "target_domain": target, "in_domain": target == key[3],
                             "encoder": enc, "reference": reference, "metric": metric,
                             "difference": point - ref_point, "ci_lo": lo, "ci_hi": hi,
                             "ci_excludes_zero": bool(lo > 0 or hi < 0), "n_boot": n_boot,
                             "resampling": "paired, patient/slide clusters, shared across encoders and seeds"})
    return pd.DataFrame(rows)


def leaderboard(runs: pd.DataFrame, preds: pd.DataFrame, n_boot: int = 1000, seed: int = 0,
                alpha: float = 0.05) -> pd.DataFrame:
    """In-domain and per-target macro-F1 (and ECE) at the largest label fraction, mean over seeds, with CIs."""
    raw = runs[runs["stage"] == "raw"]
    top = raw.groupby("task")["fraction"].transform("max")
    raw = raw[raw["fraction"] == top]
    cells = dict(tuple(preds.groupby(RUN_KEYS)))
    rows = []
    for key, cell in raw.groupby(RUN_KEYS, sort=True):
        sel = cells[key]
        order, labels, counts = _cell_resampling(sel, n_boot, seed)  # one resample for both metrics
        f1, f1_boot = seed_mean_bootstrap(sel, "macro_f1", counts, order, labels)
        ece, ece_boot = seed_mean_bootstrap(sel, "ece", counts, order, labels)
        f1_lo, f1_hi = _percentiles(f1_boot, alpha)
        ece_lo, ece_hi = _percentiles(ece_boot, alpha)
        rows.append({
            **dict(zip(RUN_KEYS, key)), "in_domain": bool(cell["in_domain"].iloc[0]), "n_seeds": cell["seed"].nunique(),
            "n_test": int(cell["n_test"].iloc[0]), "n_test_groups": int(cell["n_test_groups"].iloc[0]),
            "macro_f1": f1, "macro_f1_ci_lo": f1_lo, "macro_f1_ci_hi": f1_hi,
            "balanced_accuracy": cell["balanced_accuracy"].mean(), "auroc_ovr_macro": cell["auroc_ovr_macro"].mean(),
            ECE_COL: ece, "ece_ci_lo": ece_lo, "ece_ci_hi": ece_hi,
        })
    df = pd.DataFrame(rows)
    if len(df):
        df["rank_macro_f1"] = df.groupby(["task", "head", "fraction", "source_domain", "target_domain"])[
            "macro_f1"].rank(ascending=False, method="min").astype(int)
        df["ci_convention"] = f"95% percentile, patient/slide cluster bootstrap, B={n_boot}, over the seed mean"
    return df


def leaderboard_markdown(board: pd.DataFrame) -> str:
    """One table per (task, head, source): encoders × (in-domain, each target) macro-F1 [95% CI]."""
    parts = []
    for (task, head, frac, source), cell in board.groupby(["task", "head", "fraction", "source_domain"], sort=True):
        targets = [source] + sorted(t for t in cell["target_domain"].unique() if t != source)
        wide = []
        for enc, er in cell.groupby("encoder"):
            row = {"encoder": enc}
            for t in targets:
                r = er[er["target_domain"] == t]
                label = f"{t} (in-domain)" if t == source else t
                row[label] = _fmt_ci(*r[["macro_f1", "macro_f1_ci_lo", "macro_f1_ci_hi"]].iloc[0]) if len(r) else "n/a"
                if t == source and len(r):
                    row["_sort"] = float(r["macro_f1"].iloc[0])
            wide.append(row)
        table = pd.DataFrame(wide).sort_values("_sort", ascending=False).drop(columns="_sort")
        parts.append(f"### {task}: source {source}, {head} probe, label fraction {frac:g}\n\n"
                     f"Macro-F1, mean over seeds [95% CI].\n\n{dataframe_to_markdown(table)}\n")
    return "\n".join(parts)


def calibration_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The calibration ladder at the largest label fraction, mean over seeds."""
    top = runs.groupby("task")["fraction"].transform("max")
    cal = runs[runs["fraction"] == top].copy()
    cal["k"] = cal["k"].fillna(-1)
    metrics = [ECE_COL, "adaptive_ece_15_equalmass", "classwise_ece_15", "nll", "brier_sum", "temperature"]
    metrics = [m for m in metrics if m in cal.columns]
    out = (cal.groupby(RUN_KEYS + ["in_domain", "stage", "k", "deployable"], sort=True)[metrics].mean()
           .reset_index())
    out["k"] = out["k"].where(out["k"] >= 0)
    out["ece_convention"] = "top-label, 15 equal-width bins, (lo,hi]; Brier summed over classes"
    return out


def calibration_markdown(cal: pd.DataFrame) -> str:
    def stage_name(r) -> str:
        return f"kshot_ts (K={int(r.k)})" if r.stage == "kshot_ts" else r.stage

    parts = []
    for (task, head, frac), cell in cal.groupby(["task", "head", "fraction"]):
        cell = cell.assign(stage_label=[stage_name(r) for r in cell.itertuples()])
        wide = cell.pivot_table(index=["encoder", "source_domain", "target_domain"], columns="stage_label",
                                values=ECE_COL, sort=False).reset_index()
        order = ["encoder", "source_domain", "target_domain"] + [c for c in ["raw", "source_ts", "oracle_ts"] if c in wide]
        order += sorted((c for c in wide.columns if str(c).startswith("kshot")),
                        key=lambda c: int(str(c).split("K=")[1].rstrip(")")))
        parts.append(f"### {task}: {head} probe, label fraction {frac:g}\n\nTop-label ECE (15 bins, (lo,hi]) "
                     "by temperature stage; oracle_ts is fitted on the evaluated target (not deployable).\n\n"
                     f"{dataframe_to_markdown(wide[order])}\n")
    return "\n".join(parts)


def reliability_figure(preds: pd.DataFrame, path: Path, n_bins: int = 15) -> None:
    """Per encoder: reliability diagrams in-domain and off-domain, raw and after source temperature."""
    top = preds["fraction"].max()
    sel = preds[(preds["fraction"] == top) & (preds["seed"] == preds["seed"].min())]
    sel = sel[sel["head"] == sel["head"].iloc[0]]
    encoders = sorted(sel["encoder"].unique())
    fig, axes = plt.subplots(len(encoders), 2, figsize=(8, 3.6 * len(encoders)), squeeze=False)
    for i, enc in enumerate(encoders):
        e = sel[sel["encoder"] == enc]
        for j, (title, part) in enumerate((("in-domain", e[e["source_domain"] == e["target_domain"]]),
                                           ("off-domain", e[e["source_domain"] != e["target_domain"]]))):
            ax = axes[i, j]
            ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--")
            if len(part) == 0:
                ax.set_title(f"{enc}: {title} (none)")
                continue
            logits = np.stack(part["logits"].to_numpy())
            labels = part["label"].to_numpy().astype(int)
            for name, temp, color in (("raw", np.ones(len(part)), "tab:red"),
                                      ("source TS", part["temperature_source"].to_numpy(), "tab:blue")):
                probs = softmax(logits / temp[:, None])
                bins = reliability_bins(probs, labels, n_bins=n_bins)
                ok = bins["count"] > 0
                ax.plot(bins.loc[ok, "confidence"], bins.loc[ok, "accuracy"], marker="o", color=color, label=name)
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_xlabel("confidence")
            ax.set_ylabel("accuracy")
            ax.set_title(f"{enc}: {title} (n={len(part)})", fontsize=9)
            ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def embedding_inventory(paths: Sequence[Path]) -> pd.DataFrame:
    """One row per embedding file, from its provenance alone (the feature arrays are not read)."""
    rows = []
    for p in paths:
        prov = read_npz_provenance(p)
        dims = prov.get("embed_dim") or {}
        rows.append({
            "encoder": p.parent.name, "dataset": p.stem, "n_items": prov.get("n_items"),
            "readouts": ", ".join(f"{r} ({dims[r]})" for r in prov.get("readouts") or dims),
            "images_per_s": prov.get("images_per_s"), "device": prov.get("device"),
            "encoder_config_hash": prov.get("encoder_config_hash"), "manifest_hash": prov.get("manifest_hash"),
            "fmaudit_version": prov.get("fmaudit_version"),
        })
    return pd.DataFrame(rows)


def rank_transfer_heatmap(rank: pd.DataFrame, path: Path) -> None:
    """Spearman ρ of encoder rankings, source (rows) × target (columns), per head at the largest fraction."""
    if len(rank) == 0:
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.text(0.5, 0.5, "rank transfer needs at least two encoders", ha="center")
        ax.axis("off")
    else:
        top = rank[rank["fraction"] == rank["fraction"].max()]
        panels = list(top.groupby(["task", "head"]))
        fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
        for ax, ((task, head), cell) in zip(axes[0], panels):
            doms = sorted(set(cell["source_domain"]) | set(cell["target_domain"]))
            mat = np.full((len(doms), len(doms)), np.nan)
            for r in cell.itertuples():
                mat[doms.index(r.source_domain), doms.index(r.target_domain)] = r.spearman_rho
            im = ax.imshow(mat, vmin=-1, vmax=1, cmap="RdBu")
            ax.set_xticks(range(len(doms)), doms, rotation=45, ha="right")
            ax.set_yticks(range(len(doms)), doms)
            for i in range(len(doms)):
                for j in range(len(doms)):
                    # NaN off the diagonal: every encoder ties in-domain, so the ranking is undefined
                    label = "—" if i == j else (f"{mat[i, j]:.2f}" if np.isfinite(mat[i, j]) else "ties")
                    ax.text(j, i, label, ha="center", va="center", fontsize=8)
            ax.set_xlabel("target")
            ax.set_ylabel("source (in-domain ranking)")
            ax.set_title(f"{task}, {head}: Spearman ρ", fontsize=9)
        fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight")
    plt.close(fig)


def ece_vs_fraction_figure(runs: pd.DataFrame, path: Path) -> None:
    """Target ECE (raw) against label fraction, one line per encoder, one panel per transfer pair."""
    from fmaudit.analyses.transfer import seed_means

    means = seed_means(runs)
    off = means[~means["in_domain"]]
    pairs = list(off.groupby(["task", "head", "source_domain", "target_domain"]))
    if not pairs:
        pairs = list(means.groupby(["task", "head", "source_domain", "target_domain"]))
    ncol = min(3, len(pairs))
    nrow = int(np.ceil(len(pairs) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3.2 * nrow), squeeze=False)
    for ax, ((task, head, s, t), cell) in zip(axes.flat, pairs):
        for enc, er in cell.groupby("encoder"):
            er = er.sort_values("fraction")
            ax.plot(er["fraction"], er[ECE_COL], marker="o", label=enc)
        ax.set_xscale("log")
        ax.set_xlabel("label fraction")
        ax.set_ylabel("target ECE (15 bins)")
        ax.set_title(f"{task}, {head}: {s} → {t}", fontsize=9)
    for ax in list(axes.flat)[len(pairs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def _write_all_formats(df: pd.DataFrame, stem: Path) -> None:
    write_table(stem.with_suffix(".csv"), df)
    write_table(stem.with_suffix(".md"), df)
    write_text(stem.with_suffix(".tex"), df.to_latex(index=False, float_format="%.3f", escape=True))


def shift_summary(board: pd.DataFrame) -> pd.DataFrame:
    """Per task, head and encoder: in-domain vs mean off-domain macro-F1 and ECE."""
    rows = []
    for (task, head, enc), cell in board.groupby(["task", "head", "encoder"]):
        ind, off = cell[cell["in_domain"]], cell[~cell["in_domain"]]
        rows.append({"task": task, "head": head, "encoder": enc,
                     "macro_f1_in_domain": ind["macro_f1"].mean(), "macro_f1_off_domain": off["macro_f1"].mean(),
                     "ece_in_domain": ind[ECE_COL].mean(), "ece_off_domain": off[ECE_COL].mean()})
    return pd.DataFrame(rows)


def write_report(runs: pd.DataFrame, prediction_files: Sequence[Path], embedding_files: Sequence[Path],
                 out_dir: Path, n_boot: int = 1000, seed: int = 0) -> None:
    """Write tables/, figures/ and index.md under ``out_dir``; index.md is written last."""
    out_dir = Path(out_dir)
    tables, figures = out_dir / "tables", out_dir / "figures"
    if len(runs) == 0:  # a config whose analyses have no rules yet (e.g. cell-level only)
        _write_empty_report(out_dir, embedding_files)
        return
    preds = load_predictions(prediction_files)
    board = leaderboard(runs, preds, n_boot=n_boot, seed=seed)
    _write_all_formats(board, tables / "leaderboard")
    cal = calibration_table(runs)
    _write_all_formats(cal, tables / "calibration")
    summary = shift_summary(board)
    _write_all_formats(summary, tables / "shift_summary")
    inventory = embedding_inventory(embedding_files)
    _write_all_formats(inventory, tables / "embeddings")
    cross = transfer.cross_dataset_leaderboard(board)
    _write_all_formats(cross, tables / "cross_domain_leaderboard")
    paired = paired_differences(board, preds, n_boot=max(n_boot, 2000), seed=seed)
    _write_all_formats(paired, tables / "paired_differences")
    cri = transfer.cri_table(runs)
    _write_all_formats(cri, tables / "cri")
    rank = transfer.rank_transfer_table(runs)
    _write_all_formats(rank, tables / "rank_transfer")
    per_unit, pooled = transfer.decoupling_table(runs)
    _write_all_formats(per_unit, tables / "decoupling_units")
    _write_all_formats(pooled, tables / "decoupling")
    slopes = transfer.ece_slopes(runs)
    _write_all_formats(slopes, tables / "ece_slopes")
    by_bin = transfer.ece_slope_by_auroc_bin(slopes)
    _write_all_formats(by_bin, tables / "ece_slope_by_auroc_bin")
    reliability_figure(preds, figures / "reliability.png")
    rank_transfer_heatmap(rank, figures / "rank_transfer.png")
    ece_vs_fraction_figure(runs, figures / "ece_vs_fraction.png")
    index = [
        "# fmaudit report", "",
        "Conventions: macro-F1 with `labels=range(K)`; top-label ECE with 15 equal-width bins closed as (lo, hi]; "
        "Brier summed over classes (range [0, 2]); intervals are 95% percentile cluster-bootstrap intervals over "
        f"patients/slides (B={n_boot}) of the mean over seeds.", "",
        "## In-domain vs off-domain", "", dataframe_to_markdown(summary), "",
        "## Leaderboards", "", leaderboard_markdown(board), "",
        "## Calibration ladder", "", calibration_markdown(cal), "",
        "## Paired differences to the in-domain best encoder", "",
        "Macro-F1 difference (encoder − reference), paired cluster bootstrap over patients/slides.", "",
        dataframe_to_markdown(paired.drop(columns=["resampling"], errors="ignore")), "",
        "## Cross-domain leaderboard (sorted by the most shifted target)", "", dataframe_to_markdown(cross), "",
        "## CRI per label fraction", "",
        "CRI = AUROC_id × (1 − clip(ECE after source TS)) × OOD_Stability (PRISM, as corrected).", "",
        dataframe_to_markdown(cri.drop(columns=["cri_convention"], errors="ignore")), "",
        "## Rank transfer", "", dataframe_to_markdown(rank), "",
        "## AUROC-rank vs ECE-rank decoupling (Fisher-z pooled per fraction)", "", dataframe_to_markdown(pooled), "",
        "## Target ECE against label fraction, by transfer AUROC", "", dataframe_to_markdown(by_bin), "",
        "## Figures", "", "![reliability](figures/reliability.png)", "",
        "![rank transfer](figures/rank_transfer.png)", "", "![ECE vs fraction](figures/ece_vs_fraction.png)", "",
        "## Embeddings", "", dataframe_to_markdown(inventory), "",
        "Tables are also in `tables/` as CSV, Markdown and LaTeX.", "",
    ]
    write_text(out_dir / "index.md", "\n".join(index))


EMPTY_OUTPUTS = ("leaderboard", "calibration", "cross_domain_leaderboard", "paired_differences", "cri",
                 "rank_transfer", "decoupling", "ece_slope_by_auroc_bin")
EMPTY_FIGURES = ("reliability", "rank_transfer", "ece_vs_fraction")


def _write_empty_report(out_dir: Path, embedding_files: Sequence[Path]) -> None:
    """Every declared output, saying that no probe run was planned, so the report rule stays complete."""
    for name in EMPTY_OUTPUTS:
        _write_all_formats(pd.DataFrame({"note": ["no probe runs were planned by this config"]}), out_dir / "tables" / name)
    _write_all_formats(embedding_inventory(embedding_files), out_dir / "tables" / "embeddings")
    for name in EMPTY_FIGURES:
        fig, ax = plt.subplots(figsize=(4, 1.5))
        ax.text(0.5, 0.5, "no probe runs were planned", ha="center", va="center")
        ax.axis("off")
        with atomic_path(out_dir / "figures" / f"{name}.png", suffix=".png") as tmp:
            fig.savefig(tmp, format="png")
        plt.close(fig)
    write_text(out_dir / "index.md", "# fmaudit report\n\nNo probe runs were planned by this config.\n")

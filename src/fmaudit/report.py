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

from fmaudit.io import atomic_path, dataframe_to_markdown, read_npz, read_table, write_table, write_text  # noqa: E402
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


def seed_averaged_ci(preds: pd.DataFrame, metric: str, n_boot: int, seed: int, temperature_col: str | None = None,
                     alpha: float = 0.05) -> tuple[float, float, float]:
    """Mean over seeds of ``metric`` with a group-cluster bootstrap CI of that mean.

    All seeds of a cell are evaluated on the same items, so one resample of groups is applied to every seed.
    """
    items = preds.drop_duplicates("item_id").set_index("item_id")
    order = items.index.to_numpy()
    labels = items["label"].to_numpy().astype(int)
    counts = bootstrap_counts(len(order), groups=items["group"].to_numpy(), n_boot=n_boot, random_state=seed)
    points, boots = [], []
    for _, one in preds.groupby("seed"):
        one = one.set_index("item_id").loc[order]
        logits = np.stack(one["logits"].to_numpy())
        temp = float(one[temperature_col].iloc[0]) if temperature_col else 1.0
        probs = softmax(logits, temperature=temp)
        full = np.ones((1, len(order)), dtype=np.int32)
        points.append(float(bootstrap_metric(metric, probs, labels, full)[0]))
        boots.append(bootstrap_metric(metric, probs, labels, counts))
    mean_boot = np.nanmean(np.stack(boots), axis=0)
    lo, hi = np.nanpercentile(mean_boot, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(np.mean(points)), float(lo), float(hi)


def leaderboard(runs: pd.DataFrame, preds: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """In-domain and per-target macro-F1 (and ECE) at the largest label fraction, mean over seeds, with CIs."""
    raw = runs[runs["stage"] == "raw"]
    top = raw.groupby("task")["fraction"].transform("max")
    raw = raw[raw["fraction"] == top]
    rows = []
    for key, cell in raw.groupby(RUN_KEYS, sort=True):
        sel = preds
        for k, v in zip(RUN_KEYS, key):
            sel = sel[sel[k] == v]
        f1, f1_lo, f1_hi = seed_averaged_ci(sel, "macro_f1", n_boot, seed)
        ece, ece_lo, ece_hi = seed_averaged_ci(sel, "ece", n_boot, seed)
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
        order += sorted(c for c in wide.columns if str(c).startswith("kshot"))
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
    rows = []
    for p in paths:
        arrays, prov = read_npz(p)
        dims = {k.removeprefix("feat__"): v.shape[1] for k, v in arrays.items() if k.startswith("feat__")}
        rows.append({
            "encoder": p.parent.name, "dataset": p.stem, "n_items": len(arrays.get("item_id", [])),
            "readouts": ", ".join(f"{k} ({d})" for k, d in dims.items()),
            "images_per_s": prov.get("images_per_s"), "device": prov.get("device"),
            "encoder_config_hash": prov.get("encoder_config_hash"), "manifest_hash": prov.get("manifest_hash"),
            "fmaudit_version": prov.get("fmaudit_version"),
        })
    return pd.DataFrame(rows)


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
    preds = load_predictions(prediction_files)
    board = leaderboard(runs, preds, n_boot=n_boot, seed=seed)
    _write_all_formats(board, tables / "leaderboard")
    cal = calibration_table(runs)
    _write_all_formats(cal, tables / "calibration")
    summary = shift_summary(board)
    _write_all_formats(summary, tables / "shift_summary")
    inventory = embedding_inventory(embedding_files)
    _write_all_formats(inventory, tables / "embeddings")
    reliability_figure(preds, figures / "reliability.png")
    index = [
        "# fmaudit report", "",
        "Conventions: macro-F1 with `labels=range(K)`; top-label ECE with 15 equal-width bins closed as (lo, hi]; "
        "Brier summed over classes (range [0, 2]); intervals are 95% percentile cluster-bootstrap intervals over "
        f"patients/slides (B={n_boot}) of the mean over seeds.", "",
        "## In-domain vs off-domain", "", dataframe_to_markdown(summary), "",
        "## Leaderboards", "", leaderboard_markdown(board), "",
        "## Calibration ladder", "", calibration_markdown(cal), "",
        "## Figures", "", "![reliability](figures/reliability.png)", "",
        "## Embeddings", "", dataframe_to_markdown(inventory), "",
        "Tables are also in `tables/` as CSV, Markdown and LaTeX.", "",
    ]
    write_text(out_dir / "index.md", "\n".join(index))

"""The figures people read first on the front page: the rank-transfer bump chart, ECE against K labelled target
images with the oracle band, and risk-coverage curves with the gate's operating point."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fmaudit.report import figures

__all__ = ["FIGURE_CAPTIONS", "ece_vs_k_figure", "rank_bump_figure", "risk_coverage_gate_figure"]


def rank_bump_figure(board: pd.DataFrame, rank: pd.DataFrame, path: Path) -> None:
    """Bump chart: each encoder's rank in-domain (left) and on each target, one panel per (task, head, source) at
    the largest label fraction; target ticks carry the study's ρ with its interval.

    Parameters
    ----------
    board : DataFrame
        The probe leaderboard: ``task``, ``head``, ``fraction``, ``source_domain``, ``target_domain`` (the source
        itself for the in-domain row), ``encoder`` and ``rank_macro_f1`` (1 = best); one panel per (task, head,
        fraction, source).
    rank : DataFrame
        The rank-transfer table: the same keys with ``spearman_rho`` and optionally ``spearman_rho_ci_lo`` and
        ``spearman_rho_ci_hi``; may be empty (no ρ on the ticks).
    path : Path
        Where the PNG is saved (atomically).
    """
    plt, sns = figures.pyplot(), figures.seaborn()
    keys = ["task", "head", "fraction", "source_domain"]
    panels = list(board.groupby(keys, sort=True))
    encoders = sorted(board["encoder"].unique())
    palette = dict(zip(encoders, sns.color_palette("colorblind", len(encoders))))
    with sns.axes_style("whitegrid"):
        fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 1.6, 3.4), squeeze=False)
        for ax, ((task, head, frac, source), cell) in zip(axes[0], panels):
            domains = [source] + sorted(t for t in cell["target_domain"].unique() if t != source)
            labels = [f"{source}\n(in-domain)"]
            for t in domains[1:]:
                r = (
                    rank[
                        (rank["task"] == task)
                        & (rank["head"] == head)
                        & (rank["fraction"] == frac)
                        & (rank["source_domain"] == source)
                        & (rank["target_domain"] == t)
                    ]
                    if len(rank)
                    else rank
                )
                rho = ""
                if len(r) and np.isfinite(r["spearman_rho"].iloc[0]):
                    lo, hi = (
                        r.get("spearman_rho_ci_lo", pd.Series([np.nan])).iloc[0],
                        r.get("spearman_rho_ci_hi", pd.Series([np.nan])).iloc[0],
                    )
                    rho = f"\nρ={r['spearman_rho'].iloc[0]:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if np.isfinite(lo) else "")
                labels.append(f"{t}{rho}")
            for enc, er in cell.groupby("encoder", sort=True):
                ranks = [er.loc[er["target_domain"] == d, "rank_macro_f1"] for d in domains]
                y = [float(v.iloc[0]) if len(v) else np.nan for v in ranks]
                ax.plot(range(len(domains)), y, marker="o", lw=2, color=palette[enc], label=enc)
            n = cell["encoder"].nunique()
            ax.set_ylim(n + 0.5, 0.5)
            ax.set_yticks(range(1, n + 1))
            ax.set_xticks(range(len(domains)), labels, fontsize=7)
            ax.set_ylabel("rank by macro-F1 (1 = best)", fontsize=8)
            ax.set_title(f"{task}, {head}, fraction {frac:g}", fontsize=8)
        axes[0][-1].legend(
            fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, title="encoder", title_fontsize=7
        )
        figures.save_figure(fig, path, tight_layout=True, bbox_inches="tight")


def ece_vs_k_figure(cal: pd.DataFrame, margin: float, path: Path) -> None:
    """Off-domain top-label ECE after a temperature fitted on K labelled target images, against K, one line per
    encoder, one panel per transfer pair; each encoder's band runs from its oracle-temperature ECE to the
    oracle plus the card's margin, and a dashed line marks its source-temperature ECE.

    Parameters
    ----------
    cal : DataFrame
        The probe's calibration ladder: ``task``, ``source_domain``, ``target_domain``, ``in_domain``, ``encoder``,
        ``stage`` (``kshot_ts``, ``oracle_ts``, ``source_ts`` ...), ``k`` (labelled target images of a K-shot row)
        and at least one non-empty ``ece_top_<bins>_lohi`` column (the first such is drawn).
    margin : float
        The cards' ECE margin above the oracle (the band's height).
    path : Path
        Where the PNG is saved (atomically).
    """
    plt, sns = figures.pyplot(), figures.seaborn()
    ece_col = next(c for c in cal.columns if str(c).startswith("ece_top_") and cal[c].notna().any())
    off = cal[~cal["in_domain"].astype(bool)]
    pairs = list(off.groupby(["task", "source_domain", "target_domain"], sort=True))
    encoders = sorted(off["encoder"].unique())
    palette = dict(zip(encoders, sns.color_palette("colorblind", len(encoders))))
    ncol = min(3, len(pairs))
    nrow = int(np.ceil(len(pairs) / ncol))
    with sns.axes_style("whitegrid"):
        fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol + 1.6, 3.0 * nrow), squeeze=False, sharey=True)
        for ax, ((task, source, target), cell) in zip(axes.flat, pairs):
            ks = sorted(int(k) for k in cell["k"].dropna().unique())
            for enc, e in cell.groupby("encoder", sort=True):
                shot = e[e["stage"] == "kshot_ts"].groupby("k")[ece_col].mean()
                ax.plot(shot.index, shot.to_numpy(), marker="o", ms=4, color=palette[enc], label=enc)
                oracle = e.loc[e["stage"] == "oracle_ts", ece_col].mean()
                if np.isfinite(oracle) and ks:
                    ax.fill_between([min(ks), max(ks)], oracle, oracle + margin, color=palette[enc], alpha=0.15, lw=0)
                src = e.loc[e["stage"] == "source_ts", ece_col].mean()
                if np.isfinite(src) and ks:
                    ax.hlines(src, min(ks), max(ks), colors=[palette[enc]], linestyles="dashed", lw=1)
            if ks:
                ax.set_xscale("log", base=2)
                ax.set_xticks(ks, [str(k) for k in ks])
                ax.minorticks_off()
            ax.set_title(f"{task}: {source} → {target}", fontsize=8)
            ax.set_xlabel("K labelled target images", fontsize=8)
            ax.set_ylabel("top-label ECE" if ax in axes[:, 0] else "", fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in list(axes.flat)[len(pairs) :]:
            ax.axis("off")
        handles = [plt.Line2D([0], [0], color=palette[e], marker="o", label=e) for e in encoders]
        handles += [
            plt.Rectangle((0, 0), 1, 1, color="0.5", alpha=0.2, label=f"oracle ECE to oracle + {margin:g}"),
            plt.Line2D([0], [0], color="0.3", ls="dashed", label="source temperature"),
        ]
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
        figures.save_figure(fig, path, tight_layout=True, bbox_inches="tight")


def risk_coverage_gate_figure(curves: pd.DataFrame, gate: pd.DataFrame, path: Path) -> None:
    """Risk against coverage on the in-distribution test split, one line per encoder, one panel per task, with
    the gate's operating point (coverage, 1 - accuracy of the accepted items, with their intervals) marked.

    Parameters
    ----------
    curves : DataFrame
        Risk-coverage curves: ``task``, ``encoder``, ``coverage`` (0-1) and ``risk`` (error rate of the kept
        items), one row per point.
    gate : DataFrame
        The gate summary: ``task``, ``encoder``, ``set``, ``setting``, ``coverage`` and ``accuracy_accepted``, with
        their ``_ci_lo``/``_ci_hi`` columns where present; the row of ``set == "test"`` and ``setting == task`` is
        the operating point. May be empty (no marks).
    path : Path
        Where the PNG is saved (atomically).
    """
    plt, sns = figures.pyplot(), figures.seaborn()
    tasks = list(dict.fromkeys(curves["task"]))
    encoders = sorted(curves["encoder"].unique())
    palette = dict(zip(encoders, sns.color_palette("colorblind", len(encoders))))
    with sns.axes_style("whitegrid"):
        fig, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks) + 1.6, 3.6), squeeze=False)
        for ax, task in zip(axes[0], tasks):
            for enc, part in curves[curves["task"] == task].groupby("encoder", sort=True):
                part = part.sort_values("coverage")
                ax.plot(part["coverage"], part["risk"], color=palette[enc], lw=1.5, label=enc)
                op = (
                    gate[
                        (gate["task"] == task)
                        & (gate["encoder"] == enc)
                        & (gate["set"] == "test")
                        & (gate["setting"] == task)
                    ]
                    if len(gate)
                    else gate
                )
                if len(op) and np.isfinite(op["coverage"].iloc[0]):
                    r = op.iloc[0]
                    risk = 1 - r["accuracy_accepted"]
                    xerr = [
                        [r["coverage"] - r.get("coverage_ci_lo", r["coverage"])],
                        [r.get("coverage_ci_hi", r["coverage"]) - r["coverage"]],
                    ]
                    yerr = [
                        [risk - (1 - r.get("accuracy_accepted_ci_hi", r["accuracy_accepted"]))],
                        [(1 - r.get("accuracy_accepted_ci_lo", r["accuracy_accepted"])) - risk],
                    ]
                    ax.errorbar(
                        [r["coverage"]],
                        [risk],
                        xerr=np.abs(xerr),
                        yerr=np.abs(yerr),
                        fmt="D",
                        ms=7,
                        color=palette[enc],
                        mec="black",
                        capsize=3,
                        zorder=4,
                    )
            ax.set_xlim(0, 1)
            ax.set_ylim(0, None)
            ax.set_xlabel("coverage (most confident first)", fontsize=8)
            ax.set_ylabel("risk (error rate of kept items)", fontsize=8)
            ax.set_title(f"{task}: in-distribution test split", fontsize=8)
            ax.tick_params(labelsize=7)
        handles = [plt.Line2D([0], [0], color=palette[e], label=e) for e in encoders]
        handles.append(
            plt.Line2D([0], [0], marker="D", color="0.4", mec="black", ls="", label="gate's operating point")
        )
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
        figures.save_figure(fig, path, tight_layout=True, bbox_inches="tight")


FIGURE_CAPTIONS = {
    "card_rank_bump": (
        "Each encoder's rank by macro-F1 in-domain (left) and on every target domain, at the largest "
        "label fraction, one panel per task, head and source; a line that crosses others is a rank "
        "that did not transfer. Target labels carry the study's Spearman ρ with its 95% bootstrap "
        "interval."
    ),
    "card_ece_vs_k": (
        "Off-domain top-label ECE after a temperature fitted on K labelled target images (mean over "
        "draws and seeds), one line per encoder and panel per transfer pair; shaded: from the encoder's "
        "oracle-temperature ECE up to the cards' margin above it; dashed: its source-temperature ECE. "
        "The smallest K inside the band is the card's answer to 'how many labelled target images'."
    ),
    "card_risk_coverage": (
        "Risk (error rate of the kept items) against coverage on the in-distribution test split, "
        "one line per encoder; diamonds: the abstention gate's operating point (coverage and the "
        "error rate of the accepted items, with their 95% intervals)."
    ),
}

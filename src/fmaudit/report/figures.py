"""The report's figures, drawn from data the analyses computed (matplotlib, Agg backend, saved atomically).

matplotlib is imported when a figure is drawn, not when the report package is imported: the workflow reads
the report's declared outputs at every dry-run and must not pay for a plotting library there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fmaudit.io import atomic_path

__all__ = ["ece_vs_fraction_figure", "note_figure", "rank_transfer_heatmap", "reliability_figure"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, **kwargs) -> None:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png", **kwargs)
    _pyplot().close(fig)


def _rows(data: pd.DataFrame, key: str) -> list[tuple[str, pd.DataFrame]]:
    """Panels by ``key``, prefixed by the tasks of their settings group when the report has several."""
    if "tasks" in data.columns:
        return [(f"{tasks} | {k}", part) for (tasks, k), part in data.groupby(["tasks", key], sort=False)]
    return [(str(k), part) for k, part in data.groupby(key, sort=True)]


def reliability_figure(curves: pd.DataFrame, path: Path) -> None:
    """Per encoder: reliability diagrams in-domain and off-domain, raw and after source temperature, from
    :func:`fmaudit.analyses.leaderboard.reliability_curves`."""
    plt = _pyplot()
    rows = _rows(curves, "encoder")
    fig, axes = plt.subplots(len(rows), 2, figsize=(8, 3.6 * len(rows)), squeeze=False)
    for i, (enc, e) in enumerate(rows):
        for j, title in enumerate(("in-domain", "off-domain")):
            ax = axes[i, j]
            ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--")
            part = e[e["part"] == title]
            if len(part) == 0 or int(part["n_items"].iloc[0]) == 0:
                ax.set_title(f"{enc}: {title} (none)")
                continue
            for name, color in (("raw", "tab:red"), ("source TS", "tab:blue")):
                bins = part[part["calibration"] == name]
                ok = bins["count"] > 0
                ax.plot(bins.loc[ok, "confidence"], bins.loc[ok, "accuracy"], marker="o", color=color, label=name)
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_xlabel("confidence")
            ax.set_ylabel("accuracy")
            ax.set_title(f"{enc}: {title} (n={int(part['n_items'].iloc[0])})", fontsize=9)
            ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    _save(fig, path)


def rank_transfer_heatmap(rank: pd.DataFrame, path: Path) -> None:
    """Spearman ρ of encoder rankings, source (rows) × target (columns), per head at the largest fraction."""
    plt = _pyplot()
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
    _save(fig, path, bbox_inches="tight")


def ece_vs_fraction_figure(data: pd.DataFrame, ece_col: str, ylabel: str, path: Path) -> None:
    """Target ECE (``ece_col``) against label fraction, one line per encoder, one panel per transfer pair,
    from :func:`fmaudit.analyses.leaderboard.ece_by_fraction`."""
    plt = _pyplot()
    keys = ["task", "head", "source_domain", "target_domain"]
    pairs = list(data.dropna(subset=[ece_col]).groupby(keys))
    ncol = min(3, len(pairs))
    nrow = int(np.ceil(len(pairs) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3.2 * nrow), squeeze=False)
    for ax, ((task, head, s, t), cell) in zip(axes.flat, pairs):
        for enc, er in cell.groupby("encoder"):
            er = er.sort_values("fraction")
            ax.plot(er["fraction"], er[ece_col], marker="o", label=enc)
        ax.set_xscale("log")
        ax.set_xlabel("label fraction")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{task}, {head}: {s} → {t}", fontsize=9)
    for ax in list(axes.flat)[len(pairs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)


def note_figure(text: str, path: Path) -> None:
    """A small figure that only says ``text`` (a declared figure with nothing to draw)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4, 1.5))
    ax.text(0.5, 0.5, text, ha="center", va="center")
    ax.axis("off")
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)

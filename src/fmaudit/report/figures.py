"""The report's figures, drawn from data the analyses computed (matplotlib with seaborn, Agg backend, saved
atomically). Nothing here computes a statistic: intervals, ECEs and ρ arrive in the data.

matplotlib and seaborn are imported when a figure is drawn, not when the report package is imported: the
workflow reads the report's declared outputs at every dry-run and must not pay for a plotting library there.
Styling is applied per figure (``seaborn.axes_style``), never globally, so a caller's matplotlib state is left
as it was.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fmaudit.io import atomic_path

__all__ = ["ece_vs_fraction_figure", "note_figure", "pyplot", "rank_transfer_heatmap", "reliability_figure",
           "save_figure", "seaborn"]

_DPI = 110
_GAP_COLOUR = "tab:red"
_BAR_COLOUR = "#4c72b0"


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported now (see the module doc).

    Returns
    -------
    module
        ``matplotlib.pyplot``, with the Agg backend selected.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _seaborn():
    pyplot()
    import seaborn as sns

    return sns


#: seaborn, imported now (see the module doc); for the other report modules' figures.
seaborn = _seaborn


def save_figure(fig, path: Path, tight_layout: bool = False, **kwargs) -> None:
    """Write ``fig`` as a PNG at the report's resolution, atomically, and close it; ``kwargs`` go to savefig.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure; closed once saved.
    path : Path
        Where the PNG goes (written to a temporary file first, then moved).
    tight_layout : bool, default False
        Call ``fig.tight_layout()`` before saving.
    **kwargs
        Further ``Figure.savefig`` arguments (e.g. ``bbox_inches="tight"``); not ``dpi`` or ``format``.
    """
    if tight_layout:
        fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=_DPI, format="png", **kwargs)
    pyplot().close(fig)


def _rows(data: pd.DataFrame, key: str) -> list[tuple[str, pd.DataFrame]]:
    """Panels by ``key``, prefixed by the tasks of their settings group when the report has several."""
    if "tasks" in data.columns:
        return [(f"{tasks} | {k}", part) for (tasks, k), part in data.groupby(["tasks", key], sort=False)]
    return [(str(k), part) for k, part in data.groupby(key, sort=True)]


# ---------------------------------------------------------------------------------------------- reliability
_RELIABILITY_COLUMNS = (("in-domain", "raw"), ("in-domain", "source TS"), ("off-domain", "raw"),
                        ("off-domain", "source TS"))


def _reliability_panel(ax, hist_ax, bins: pd.DataFrame) -> None:
    """Accuracy bars per confidence bin with the gap to the diagonal shaded, the bin counts underneath."""
    width = (bins["hi"] - bins["lo"]).to_numpy()
    centre = ((bins["lo"] + bins["hi"]) / 2).to_numpy()
    filled = (bins["count"] > 0).to_numpy()
    acc, conf = bins["accuracy"].to_numpy(), bins["confidence"].to_numpy()
    ax.plot([0, 1], [0, 1], color="0.35", lw=1, ls="--", zorder=3)
    ax.bar(centre[filled], acc[filled], width=width[filled], color=_BAR_COLOUR, edgecolor="white", lw=0.5,
           alpha=0.9, zorder=1)
    # the gap: from each bin's accuracy to its mean confidence (above the bar: overconfident)
    low, high = np.minimum(acc, conf)[filled], np.maximum(acc, conf)[filled]
    ax.bar(centre[filled], high - low, bottom=low, width=width[filled], color=_GAP_COLOUR, alpha=0.3,
           edgecolor=_GAP_COLOUR, lw=0.6, hatch="///", zorder=2)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("auto")
    hist_ax.bar(centre, bins["count"].to_numpy(), width=width, color="0.55", edgecolor="white", lw=0.5)
    hist_ax.set_xlim(0, 1)
    hist_ax.set_ylim(0, max(1, int(bins["count"].max())) * 1.15)


def reliability_figure(curves: pd.DataFrame, path: Path) -> None:
    """Reliability diagrams: one row per encoder, columns in-domain/off-domain × raw/after source temperature;
    accuracy per confidence bin with the gap to perfect calibration shaded, the item count per bin underneath,
    the bins' ECE in the corner. Data: :func:`fmaudit.analyses.leaderboard.reliability_curves`.

    Parameters
    ----------
    curves : DataFrame
        One row per (encoder, part, calibration, bin): ``encoder``, ``part`` (``in-domain``/``off-domain``),
        ``calibration`` (``raw``/``source TS``), the bin's ``lo``, ``hi``, ``count``, ``accuracy`` and
        ``confidence``, the panel's ``n_items`` and ``ece``, and ``tasks`` when the report has several settings
        groups.
    path : Path
        Where the PNG is saved (atomically).
    """
    plt, sns = pyplot(), _seaborn()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = _rows(curves, "encoder")
    ncol = len(_RELIABILITY_COLUMNS)
    with sns.axes_style("whitegrid"):
        fig = plt.figure(figsize=(3.0 * ncol, 3.3 * len(rows) + 1.0))
        outer = fig.add_gridspec(len(rows), ncol, hspace=0.4, wspace=0.28, top=1 - 1.0 / fig.get_figheight(),
                                 bottom=0.45 / fig.get_figheight(), left=0.07, right=0.98)
        for i, (enc, e) in enumerate(rows):
            for j, (part_name, calibration) in enumerate(_RELIABILITY_COLUMNS):
                inner = outer[i, j].subgridspec(2, 1, height_ratios=(3, 1), hspace=0.08)
                ax, hist_ax = fig.add_subplot(inner[0]), fig.add_subplot(inner[1])
                part = e[e["part"] == part_name]
                bins = part[part["calibration"] == calibration] if "calibration" in part else part.iloc[0:0]
                if len(bins) == 0 or int(part["n_items"].iloc[0]) == 0:
                    ax.set_title(f"{enc}\n{part_name}, {calibration}: no items", fontsize=8)
                    ax.set_axis_off()
                    hist_ax.set_axis_off()
                    continue
                _reliability_panel(ax, hist_ax, bins)
                n_items = int(bins["n_items"].iloc[0])
                ax.set_title(f"{enc}\n{part_name}, {calibration} (n={n_items} items)", fontsize=8)
                if "ece" in bins:
                    ax.text(0.04, 0.95, f"ECE {float(bins['ece'].iloc[0]):.3f}", transform=ax.transAxes,
                            fontsize=8, va="top", bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.7"})
                ax.tick_params(labelbottom=False, labelsize=7)
                hist_ax.tick_params(labelsize=7)
                ax.set_ylabel("accuracy" if j == 0 else "", fontsize=8)
                hist_ax.set_ylabel("items" if j == 0 else "", fontsize=8)
                hist_ax.set_xlabel("top-label confidence" if i == len(rows) - 1 else "", fontsize=8)
        handles = [Patch(color=_BAR_COLOUR, alpha=0.9, label="accuracy in the bin"),
                   Patch(facecolor=_GAP_COLOUR, alpha=0.3, edgecolor=_GAP_COLOUR, hatch="///",
                         label="gap to the bin's mean confidence (above a bar: overconfident; inside: under)"),
                   Line2D([0], [0], color="0.35", ls="--", label="perfect calibration"),
                   Patch(color="0.55", label="items per bin (lower panels)")]
        fig.legend(handles=handles, loc="upper center", ncol=2, fontsize=8, frameon=False,
                   bbox_to_anchor=(0.5, 1 - 0.1 / fig.get_figheight()))
        save_figure(fig, path)


# -------------------------------------------------------------------------------------------- rank transfer
def _rho_label(r: Any) -> str:
    if not np.isfinite(r.spearman_rho):
        return "no ranking\n(ties)"
    lo, hi = getattr(r, "spearman_rho_ci_lo", np.nan), getattr(r, "spearman_rho_ci_hi", np.nan)
    interval = f"\n[{lo:.2f}, {hi:.2f}]" if np.isfinite(lo) and np.isfinite(hi) else ""
    return f"ρ = {r.spearman_rho:.2f}{interval}"


def rank_transfer_heatmap(rank: pd.DataFrame, path: Path) -> None:
    """Spearman ρ of encoder rankings, source (rows) × target (columns), one panel per (task, head, label
    fraction), each cell annotated with ρ and its bootstrap interval (from the table's ``spearman_rho_ci_*``).

    Parameters
    ----------
    rank : DataFrame
        The rank-transfer table: ``task``, ``head``, ``fraction``, ``source_domain``, ``target_domain``,
        ``spearman_rho``, optionally ``spearman_rho_ci_lo``/``spearman_rho_ci_hi`` and ``rho_ci_convention`` (the
        interval's resampling, printed under the figure). Empty: a figure saying at least two encoders are needed.
    path : Path
        Where the PNG is saved (atomically).
    """
    plt, sns = pyplot(), _seaborn()
    if len(rank) == 0:
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.text(0.5, 0.5, "rank transfer needs at least two encoders", ha="center")
        ax.axis("off")
        save_figure(fig, path)
        return
    panels = list(rank.groupby(["task", "head", "fraction"], sort=True))
    ncol = min(len(panels), 3)
    nrow = int(np.ceil(len(panels) / ncol))
    with sns.axes_style("white"):
        fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol + 1.2, 4.2 * nrow + 0.8), squeeze=False,
                                 gridspec_kw={"wspace": 0.35})
        for index, (ax, ((task, head, frac), cell)) in enumerate(zip(axes.flat, panels)):
            doms = sorted(set(cell["source_domain"]) | set(cell["target_domain"]))
            mat = pd.DataFrame(np.nan, index=doms, columns=doms)
            text = pd.DataFrame("", index=doms, columns=doms)
            for r in cell.itertuples(index=False):
                mat.loc[r.source_domain, r.target_domain] = r.spearman_rho
                text.loc[r.source_domain, r.target_domain] = _rho_label(r)
            with warnings.catch_warnings():  # seaborn 0.13.2 calls Colormap.set_bad, deprecated by matplotlib 3.11
                warnings.simplefilter("ignore", PendingDeprecationWarning)
                sns.heatmap(mat, ax=ax, vmin=-1, vmax=1, center=0, cmap="RdBu", annot=text.to_numpy(), fmt="",
                            annot_kws={"fontsize": 8}, linewidths=1, linecolor="white", cbar=False, square=True)
            ax.set_facecolor("0.93")  # the diagonal (no transfer) and undefined cells
            for k in range(len(doms)):  # seaborn leaves masked (NaN) cells unannotated
                ax.text(k + 0.5, k + 0.5, "same domain", ha="center", va="center", fontsize=7, color="0.45")
            ax.set_xlabel("target domain", fontsize=9)
            ax.set_ylabel("source domain (in-domain ranking)" if index % ncol == 0 else "", fontsize=9)
            ax.tick_params(labelsize=8)
            ax.set_xticklabels(ax.get_xticklabels(), rotation=30, ha="right")
            ax.set_yticklabels(ax.get_yticklabels(), rotation=0)
            ax.set_title(f"{task}, {head} probe\nlabel fraction {frac:g}", fontsize=9)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        mappable = plt.cm.ScalarMappable(cmap="RdBu", norm=plt.Normalize(-1, 1))
        bar = fig.colorbar(mappable, ax=axes.ravel().tolist(), shrink=0.7, pad=0.02)
        bar.set_label("Spearman ρ, in-domain vs target ranking of encoders", fontsize=8)
        note = rank["rho_ci_convention"].dropna().iloc[0] if "rho_ci_convention" in rank and \
            rank["rho_ci_convention"].notna().any() else "no interval"
        fig.text(0.01, 0.005, f"macro-F1 rankings, mean over seeds. Interval: {note}.", fontsize=7, va="bottom",
                 wrap=True)
        save_figure(fig, path, bbox_inches="tight")


# -------------------------------------------------------------------------------------- ECE against labels
def ece_vs_fraction_figure(data: pd.DataFrame, ece_col: str, ylabel: str, path: Path) -> None:
    """Target ECE (``ece_col``) against label fraction, one line per encoder with its interval band
    (``ece_ci_lo``, ``ece_ci_hi``), one panel per transfer pair (seaborn facets). Data:
    :func:`fmaudit.analyses.leaderboard.ece_by_fraction`.

    Parameters
    ----------
    data : DataFrame
        One row per (task, head, source, target, encoder, label fraction): ``task``, ``head``, ``source_domain``,
        ``target_domain``, ``encoder``, ``fraction``, ``ece_col`` and optionally ``ece_ci_lo``, ``ece_ci_hi`` and
        ``tasks``; rows without an ECE are dropped.
    ece_col : str
        The ECE column to draw, e.g. ``ece_top_15_lohi``.
    ylabel : str
        The y axis label (the ECE's name and bins).
    path : Path
        Where the PNG is saved (atomically).
    """
    plt, sns = pyplot(), _seaborn()
    data = data.dropna(subset=[ece_col]).copy()
    prefix = data["tasks"] + " | " if "tasks" in data.columns else ""
    data["pair"] = (prefix + data["task"] + ", " + data["head"] + "\n" + data["source_domain"] + " → "
                    + data["target_domain"])
    encoders = sorted(data["encoder"].unique())
    palette = dict(zip(encoders, sns.color_palette("colorblind", len(encoders))))
    fractions = sorted(data["fraction"].unique())

    def draw(data: pd.DataFrame, color=None, label=None, **_):
        ax = plt.gca()
        for enc, er in data.groupby("encoder", sort=True):
            er = er.sort_values("fraction")
            ax.plot(er["fraction"], er[ece_col], marker="o", ms=4, lw=1.5, color=palette[enc], label=enc)
            if {"ece_ci_lo", "ece_ci_hi"} <= set(er.columns):
                ax.fill_between(er["fraction"], er["ece_ci_lo"], er["ece_ci_hi"], color=palette[enc], alpha=0.15,
                                lw=0)

    with sns.axes_style("whitegrid"):
        grid = sns.FacetGrid(data, col="pair", col_wrap=min(3, data["pair"].nunique()), height=3.0, aspect=1.25,
                             sharey=True)
        grid.map_dataframe(draw)
        grid.set(xscale="log")
        for ax in grid.axes.flat:
            ax.set_xticks(fractions, [f"{f:g}" for f in fractions])
            ax.minorticks_off()
            ax.tick_params(labelsize=8)
        grid.set_titles("{col_name}", size=8)
        grid.set_axis_labels("label fraction of the source training split (log scale)", ylabel, fontsize=8)
        grid.set(ylim=(0, None))
        handles = [plt.Line2D([0], [0], color=palette[e], marker="o", label=e) for e in encoders]
        handles.append(plt.Rectangle((0, 0), 1, 1, color="0.5", alpha=0.25, label="95% interval"))
        grid.figure.legend(handles=handles, title="encoder", loc="center left", bbox_to_anchor=(1.0, 0.5),
                           fontsize=8, title_fontsize=8, frameon=False)
        grid.figure.tight_layout()
        save_figure(grid.figure, path, bbox_inches="tight")


def note_figure(text: str, path: Path) -> None:
    """A small figure that only says ``text`` (a declared figure with nothing to draw).

    Parameters
    ----------
    text : str
        The sentence shown, e.g. why there is nothing to draw.
    path : Path
        Where the PNG is saved (atomically).
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 1.5))
    ax.text(0.5, 0.5, text, ha="center", va="center")
    ax.axis("off")
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)

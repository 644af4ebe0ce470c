"""The reliability cards and the front page of the report: formatted from the cards
:func:`fmaudit.analyses.cards.build_cards` made (this module computes nothing).

Each encoder's card is written as ``cards/<encoder>.json`` (the published schema
``resources/schemas/card.schema.json``), ``cards/<encoder>.md`` and ``cards/<encoder>.html``; the chapter's lines
of ``index.md`` are the front page: one table of encoders x axes per task, a link to each card, and the
figures people read first (rank-transfer bump chart, ECE against K labelled target images with the oracle
band, risk-coverage curves with the gate's operating point, and the cell chapter's CRA-CRT landscape where the
study has cells).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import dataframe_to_markdown, write_text
from fmaudit.report import figures
from fmaudit.report.chapter import Chapter, ReportWriter
from fmaudit.report.html import markdown_to_html, page, table_html

DECISION = "Decision: cards and front page"
TABLES = {"front_page": DECISION, "card_advice": DECISION}
FIGURES = {"card_rank_bump": DECISION, "card_ece_vs_k": DECISION, "card_risk_coverage": DECISION}
CARD_FORMATS = (".json", ".md", ".html")
#: Where the card schema lies, relative to the repository.
SCHEMA = Path(__file__).resolve().parents[3] / "resources" / "schemas" / "card.schema.json"
SEPARATED = "▼"
BEST = "★"
#: Axes of the front page: key -> (label, whether higher is better; None: no ordering, no mark).
FRONT_AXES = {
    "in_domain": ("in-domain macro-F1", True),
    "worst_off_domain": ("worst off-domain macro-F1", True),
    "calibration": ("off-domain ECE after the recommended fix", False),
    "gate_coverage": ("gate coverage (in-distribution test)", True),
    "prior_shift_risk": ("prior-shift risk (worst gain of a deployable method)", True),
    "cells": ("cell readout (CRA; CRT rank)", None),
    "exposure": ("exposure", None),
    "cost": ("cost", None),
}

__all__ = [
    "CARD_FORMATS",
    "CHAPTER",
    "FRONT_AXES",
    "FRONT_PAGE",
    "FIGURES",
    "SCHEMA",
    "TABLES",
    "card_files",
    "card_html",
    "card_markdown",
    "front_page_markdown",
    "quantity_text",
]


#: The front page as a page of its own (the HTML report links it from its first screen).
FRONT_PAGE = "front_page.html"


def card_files(encoders: Sequence[str]) -> list[str]:
    """Paths of the cards of ``encoders`` and of the front page, relative to the report folder."""
    return [f"cards/{enc}{ext}" for enc in encoders for ext in CARD_FORMATS] + [FRONT_PAGE]


# ------------------------------------------------------------------------------------------------ formatting
def quantity_text(q: Mapping[str, Any] | None, with_units: bool = False) -> str:
    """A card quantity as text: ``0.812 [0.790, 0.833]``, ``+0.021 [-0.004, 0.046]``, ``2``, ``yes``; a missing
    value as ``n/a (why)``; ``with_units`` appends the interval's unit and count."""
    if not q:
        return "n/a"
    point, kind = q.get("point"), q.get("kind", "value")
    if kind == "text":
        return str(q.get("note") or "n/a")
    if point is None:
        return f"n/a ({q['note']})" if q.get("note") else "n/a"
    if kind == "integer":
        return f"{int(round(point))}"
    if kind == "flag":
        text = "yes" if point else "no"
        return f"{text} ({q['note']})" if q.get("note") else text
    if kind == "amount":
        return f"{point:.4g}"
    sign = "+" if kind == "signed" else ""
    text = f"{point:{sign}.3f}"
    if q.get("ci_lo") is not None and q.get("ci_hi") is not None:
        text += f" [{q['ci_lo']:{sign}.3f}, {q['ci_hi']:{sign}.3f}]"
        if with_units and q.get("resampling_unit"):
            text += (
                f" ({q['resampling_unit']}, n={q['n_units']})"
                if q.get("n_units") is not None
                else f" ({q['resampling_unit']})"
            )
    if q.get("note"):
        text += f" ({q['note']})"
    return text


def _units_line(section: Mapping[str, Any]) -> str:
    """The intervals' units of a section's table, once: ``Intervals: macro-F1: patient, n=5; ...``."""
    seen: dict[str, set[str]] = {}
    for r in section["rows"]:
        for q in r["values"].values():
            if q.get("ci_lo") is not None and q.get("resampling_unit"):
                n = f", n={q['n_units']}" if q.get("n_units") is not None else ""
                seen.setdefault(q["measure"], set()).add(f"{q['resampling_unit']}{n}")
    if not seen:
        return ""
    return "Intervals (95%) resample: " + "; ".join(f"{m}: {', '.join(sorted(u))}" for m, u in seen.items()) + "."


def _section_table(section: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    keys = [c["key"] for c in section["columns"] if any(c["key"] in r["values"] for r in section["rows"])]
    labels = {c["key"]: c["label"] for c in section["columns"]}
    header = [""] + [labels[k] for k in keys]
    rows = [
        [r["label"]]
        + [quantity_text(r["values"].get(k)) if k in r["values"] else "— (not measured here)" for k in keys]
        for r in section["rows"]
    ]
    return header, rows


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return dataframe_to_markdown(pd.DataFrame(rows, columns=[h or "row" for h in header]))


def card_markdown(card: Mapping[str, Any]) -> str:
    """The card as Markdown."""
    t = card["thresholds"]
    lines = [
        f"# Reliability card: {card['encoder']}",
        "",
        f"Study `{card['study']}`. Every number comes from the study's result tables (nothing is refitted), with "
        "its 95% interval `[lo, hi]` where the table gives one and the unit the interval resamples; advice "
        f"sentences are chosen by the rules named after them (thresholds: ECE margin {t['ece_margin']:g}, an OOD "
        f"tier is let through when the gate rejects less than {t['gate_min_rejection']:g} of it, no advice from "
        f"intervals over fewer than {t['min_resampling_units']} units, rank transfer read from at least "
        f"{t['min_rank_encoders']} encoders).",
        "",
    ]
    for name, s in card["sections"].items():
        lines += [f"## {s['title']}", ""]
        if not s["available"]:
            lines += [f"Not available: {s['reason']}.", ""]
            continue
        lines += [s["caption"], ""]
        header, rows = _section_table(s)
        if rows:
            lines += [_md_table(header, rows), ""]
        units = _units_line(s)
        if units:
            lines += [units, ""]
        if name == "cost" and s.get("embedding_speed"):
            lines += [
                "Embedding speed: "
                + "; ".join(
                    f"{e['dataset']}: {e['images_per_s']:.1f} images/s "
                    f"({e['n_items']} images on {e['device'] or 'n/a'})"
                    for e in s["embedding_speed"]
                )
                + ".",
                "",
            ]
        lines += ["**Advice**", ""]
        lines += [f"- {a['text']} *(rule `{a['rule']}`)*" for a in s["advice"]] or ["- No rule fires on these numbers."]
        lines.append("")
        if s["limits"]:
            lines += ["**What these numbers cannot support**", ""] + [f"- {x}" for x in s["limits"]] + [""]
    lines += ["## Rules", "", "Each advice sentence above comes from one of these rules, when its condition holds:", ""]
    lines += [f"- `{r['id']}`: {r['when']}." for r in card["rules"]]
    return "\n".join(lines) + "\n"


def card_html(card: Mapping[str, Any]) -> str:
    """The card as a self-contained HTML page (every text escaped)."""
    parts = [
        f"<h1>Reliability card: {html.escape(card['encoder'])}</h1>",
        f'<p><a href="../index.html">Report home</a> · <a href="{html.escape(card["encoder"])}.json">JSON</a>'
        f' · <a href="{html.escape(card["encoder"])}.md">Markdown</a></p>',
    ]
    body = card_markdown(card).split("\n", 2)[2]  # without the title line
    parts.append(markdown_to_html(body))
    return page(f"Reliability card: {card['encoder']}", "\n".join(parts))


# ------------------------------------------------------------------------------------------------ front page
def _front_cell(v: Mapping[str, Any] | None, axis: str) -> tuple[str, str]:
    """(text, css class) of one front-page cell."""
    if not v:
        return "n/a", ""
    if "text" in v:
        return v["text"] or "n/a", ""
    text = quantity_text(v)
    if v.get("where"):
        text += f" ({v['where']})"
    if v.get("best"):
        return f"{text} {BEST}", "best"
    if v.get("separated"):
        return f"{text} {SEPARATED}", "sep"
    return text, ""


def _front_rows(table: Mapping[str, Any], link: str) -> tuple[list[str], list[list[tuple[str, str]]]]:
    """Header and cells of a front-page table; a ``where`` every encoder shares moves into the column header."""
    shared = {}
    for axis in FRONT_AXES:
        wheres = {str((r["values"].get(axis) or {}).get("where", "")) for r in table["rows"] if axis in r["values"]}
        if len(wheres) == 1 and len(table["rows"]) > 1:
            shared[axis] = wheres.pop()
    header = (
        ["encoder"]
        + [label + (f" ({shared[axis]})" if shared.get(axis) else "") for axis, (label, _) in FRONT_AXES.items()]
        + ["card"]
    )
    rows = []
    for r in table["rows"]:
        cells = [(r["encoder"], "")]
        for axis in FRONT_AXES:
            v = r["values"].get(axis)
            cells.append(_front_cell({**v, "where": ""} if v and axis in shared else v, axis))
        cells.append((link.format(enc=r["encoder"]), ""))
        rows.append(cells)
    return header, rows


LEGEND = (
    f"{BEST}: the best encoder on that axis; {SEPARATED}: its 95% interval lies wholly on the worse side of the "
    "best encoder's interval, both from at least five resampling units (read side by side, not paired). "
    "Accuracy: macro-F1 at the largest label fraction, in-domain on the task's first source domain and on its "
    "worst target; calibration: the worst off-domain top-label ECE after the fix the card recommends (source T: "
    'the source temperature; K=k: a temperature fitted on k labelled target images; "> oracle + 0.02": no '
    "fix reached the oracle's margin; the ladder has no intervals, so no mark); gate: coverage of the "
    "in-distribution test split at the gate's operating point; prior-shift risk: the lowest gain of any "
    "deployable label-free method under any prior (method @ prior); cost: GPU-hours (wall time x GPUs "
    "requested) and CPU-hours of the encoder's benchmarked jobs. Intervals: each card names their units."
)


def front_page_markdown(front: Sequence[Mapping[str, Any]], encoders: Sequence[str]) -> list[str]:
    lines = []
    for table in front:
        header, rows = _front_rows(table, "[card](cards/{enc}.md)")
        if len(front) > 1 or table["task"]:
            lines += [f"### Task {table['task']}" if table["task"] else "### Study", ""]
        lines += [dataframe_to_markdown(pd.DataFrame([[t for t, _ in r] for r in rows], columns=header)), ""]
    lines += [
        LEGEND,
        "",
        "Cards: "
        + " · ".join(f"[{e}](cards/{e}.md) ([HTML](cards/{e}.html), [JSON](cards/{e}.json))" for e in encoders)
        + ".",
        "",
    ]
    return lines


def front_page_table(front: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The front page as one tidy table (the CSV beside it): a row per (task, encoder, axis)."""
    rows = []
    for table in front:
        for r in table["rows"]:
            for axis, (label, _) in FRONT_AXES.items():
                v = r["values"].get(axis) or {}
                has = v.get("ci_lo") is not None and v.get("ci_hi") is not None
                rows.append(
                    {
                        "task": table["task"] or "",
                        "encoder": r["encoder"],
                        "axis": axis,
                        "label": label,
                        "point": v.get("point"),
                        "ci_lo": v.get("ci_lo"),
                        "ci_hi": v.get("ci_hi"),
                        "interval": "95%" if has else "none: its result table gives no interval",
                        "resampling_unit": v.get("resampling_unit"),
                        "n_units": v.get("n_units"),
                        "where": v.get("where", ""),
                        "text": v.get("text", _front_cell(v, axis)[0]),
                        "best": bool(v.get("best", False)),
                        "separated": bool(v.get("separated", False)),
                    }
                )
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------- figures
def rank_bump_figure(board: pd.DataFrame, rank: pd.DataFrame, path: Path) -> None:
    """Bump chart: each encoder's rank in-domain (left) and on each target, one panel per (task, head, source) at
    the largest label fraction; target ticks carry the study's ρ with its interval."""
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
    oracle plus the card's margin, and a dashed line marks its source-temperature ECE."""
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
    the gate's operating point (coverage, 1 - accuracy of the accepted items, with their intervals) marked."""
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


# ------------------------------------------------------------------------------------------------- the chapter
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


def _write_figures(results: Mapping[str, Any], writer: ReportWriter) -> list[str]:
    data = results.get("figures") or {}
    board, rank, cal = data.get("leaderboard"), data.get("rank_transfer"), data.get("calibration")
    curves, gate = data.get("curves"), data.get("gate_summary")
    drawn = []
    if isinstance(board, pd.DataFrame) and len(board) and "rank_macro_f1" in board.columns:
        writer.figure(
            "card_rank_bump", lambda p: rank_bump_figure(board, rank if rank is not None else pd.DataFrame(), p)
        )
        drawn.append("card_rank_bump")
    else:
        writer.figure("card_rank_bump", lambda p: figures.note_figure("no probe runs: no ranks", p))
    has_k = (
        isinstance(cal, pd.DataFrame)
        and len(cal)
        and (cal["stage"] == "kshot_ts").any()
        and (~cal["in_domain"].astype(bool)).any()
    )
    if has_k:
        writer.figure("card_ece_vs_k", lambda p: ece_vs_k_figure(cal, results.get("margin", 0.02), p))
        drawn.append("card_ece_vs_k")
    else:
        writer.figure("card_ece_vs_k", lambda p: figures.note_figure("no off-domain K-shot calibration", p))
    if isinstance(curves, pd.DataFrame) and len(curves):
        writer.figure(
            "card_risk_coverage",
            lambda p: risk_coverage_gate_figure(curves, gate if isinstance(gate, pd.DataFrame) else pd.DataFrame(), p),
        )
        drawn.append("card_risk_coverage")
    else:
        writer.figure("card_risk_coverage", lambda p: figures.note_figure("no OOD shard: no risk-coverage curves", p))
    lines = []
    for name in drawn:
        lines += [f"![{name.replace('_', ' ')}](figures/{name}.png)", "", f"*{FIGURE_CAPTIONS[name]}*", ""]
    if results.get("has_cells"):
        lines += [
            "![CRA-CRT landscape](figures/cell_cra_crt_landscape.png)",
            "",
            "*CRA (Nuc minus Mean, within sections) against CRT (transfer relative to the median encoder), one "
            "point per encoder; the cell chapter's figure (captioned there).*",
            "",
        ]
    return lines


def _advice_table(cards: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    rows = [
        {"encoder": c["encoder"], "section": name, "rule": a["rule"], "text": a["text"]}
        for c in cards
        for name, s in c["sections"].items()
        for a in s["advice"]
    ]
    if not rows:
        return pd.DataFrame({"note": ["no advice rule fired on this study's numbers"]})
    return pd.DataFrame(rows)


def write_cards_chapter(results: Mapping[str, Any] | None, writer: ReportWriter) -> list[str]:
    """Write every card, the front page's table and the figures; return the front page (index.md lines)."""
    results = results or {"cards": [], "front": [], "encoders": []}
    cards = results["cards"]
    for card in cards:
        writer.file(
            f"cards/{card['encoder']}.json",
            lambda p, c=card: write_text(p, json.dumps(c, indent=2, ensure_ascii=False, allow_nan=False) + "\n"),
        )
        writer.file(f"cards/{card['encoder']}.md", lambda p, c=card: write_text(p, card_markdown(c)))
        writer.file(f"cards/{card['encoder']}.html", lambda p, c=card: write_text(p, card_html(c)))
    front = results["front"]
    encoders = [c["encoder"] for c in cards]
    writer.file(
        FRONT_PAGE,
        lambda p: write_text(
            p,
            page(
                "fmaudit: at a glance",
                "<h1>At a glance</h1>\n"
                + (
                    front_page_html(front, encoders)
                    if cards
                    else "<p>No encoder has results in this study: no cards.</p>"
                ),
            ),
        ),
    )
    table = front_page_table(front) if front else pd.DataFrame()
    writer.table("front_page", table if len(table) else pd.DataFrame({"note": ["no encoder has results: no cards"]}))
    writer.table("card_advice", _advice_table(cards))
    figure_lines = _write_figures(results, writer)
    if not cards:
        return ["No encoder has results in this study: no reliability cards.", ""]
    return (
        ["## At a glance", ""]
        + front_page_markdown(front, [c["encoder"] for c in cards])
        + ["### Figures to read first", ""]
        + figure_lines
    )


def front_page_html(front: Sequence[Mapping[str, Any]], encoders: Sequence[str]) -> str:
    """The front page's tables as HTML (marks as cell classes), with the card links."""
    parts = []
    for table in front:
        header, rows = _front_rows(table, "{enc}")
        if len(front) > 1 or table["task"]:
            parts.append(f"<h3>Task {html.escape(str(table['task']))}</h3>" if table["task"] else "<h3>Study</h3>")
        body = table_html(header, rows)
        for enc in encoders:  # the last column links the card
            body = body.replace(
                f"<td>{html.escape(enc)}</td></tr>",
                f'<td><a href="cards/{html.escape(enc)}.html">{html.escape(enc)}</a></td></tr>',
            )
        parts.append(body)
    parts.append(f'<p class="caption">{html.escape(LEGEND)}</p>')
    return "\n".join(parts)


def _card_files(results: Mapping[str, Any] | None) -> list[str]:
    return card_files([c["encoder"] for c in (results or {}).get("cards", [])])


CHAPTER = Chapter(
    "cards",
    TABLES,
    FIGURES,
    write_cards_chapter,
    reads=("prior_shift_runs",),
    settings=("bootstrap", "prior_shift", "cards"),
    files=_card_files,
)

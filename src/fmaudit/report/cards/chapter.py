"""The cards chapter: writes every card (``cards/<encoder>.json|md|html``), the front page (its own HTML page, its
table and the lines of ``index.md``), the advice table and the figures to read first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.io import write_text
from fmaudit.report import figures
from fmaudit.report.cards.figures import FIGURE_CAPTIONS, ece_vs_k_figure, rank_bump_figure, risk_coverage_gate_figure
from fmaudit.report.cards.front_page import front_page_html, front_page_markdown, front_page_table
from fmaudit.report.cards.text import card_html, card_markdown
from fmaudit.report.chapter import Chapter, ReportWriter
from fmaudit.report.html import page

__all__ = [
    "CARD_FORMATS",
    "CHAPTER",
    "DECISION",
    "FIGURES",
    "FRONT_PAGE",
    "SCHEMA",
    "TABLES",
    "card_files",
    "write_cards_chapter",
]

DECISION = "Decision: cards and front page"
TABLES = {"front_page": DECISION, "card_advice": DECISION}
FIGURES = {"card_rank_bump": DECISION, "card_ece_vs_k": DECISION, "card_risk_coverage": DECISION}
CARD_FORMATS = (".json", ".md", ".html")
#: Where the card schema lies, relative to the repository.
SCHEMA = Path(__file__).resolve().parents[4] / "resources" / "schemas" / "card.schema.json"

#: The front page as a page of its own (the HTML report links it from its first screen).
FRONT_PAGE = "front_page.html"


def card_files(encoders: Sequence[str]) -> list[str]:
    """Paths of the cards of ``encoders`` and of the front page, relative to the report folder.

    Parameters
    ----------
    encoders : sequence of str
        The encoders that get a card (the ``cards`` setting's ``encoders``, or every encoder with results).

    Returns
    -------
    list of str
        ``cards/<encoder><ext>`` for each encoder and each of :data:`CARD_FORMATS`, then :data:`FRONT_PAGE`.
    """
    return [f"cards/{enc}{ext}" for enc in encoders for ext in CARD_FORMATS] + [FRONT_PAGE]


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
    """Write every card, the front page's table and the figures; return the front page (index.md lines).

    Parameters
    ----------
    results : mapping or None
        The chapter's results (``fmaudit.jobs.report``): ``cards`` (the cards of
        :func:`fmaudit.analyses.cards.build_cards`), ``front`` (:func:`fmaudit.analyses.cards.front_page`),
        ``encoders``, ``margin`` (the ECE margin of the K-shot band), ``has_cells`` (whether the study has CRA
        rows: the front page then shows the cell chapter's landscape) and ``figures`` (the probe's
        ``leaderboard``, ``rank_transfer``, ``calibration`` and the OOD shard's ``curves`` and ``gate_summary``
        tables, each possibly ``None``). ``None``: no card; every output is still written, saying so.
    writer : ReportWriter
        Where the cards, the front page, the tables ``front_page`` and ``card_advice`` and the figures go.

    Returns
    -------
    list of str
        The ``index.md`` lines: the front page's tables, its legend and card links, and the figures to read first;
        one sentence when no encoder has results.
    """
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

"""The reliability cards and the front page of the report: formatted from the cards
:func:`fmaudit.analyses.cards.build_cards` made (this module computes nothing).

Each encoder's card is written as ``cards/<encoder>.json`` (the published schema
``resources/schemas/card.schema.json``), ``cards/<encoder>.md`` and ``cards/<encoder>.html``; the chapter's lines
of ``index.md`` are the front page: one table of encoders x axes per task, a link to each card, and the
figures people read first (rank-transfer bump chart, ECE against K labelled target images with the oracle
band, risk-coverage curves with the gate's operating point, and the cell chapter's CRA-CRT landscape where the
study has cells).

Modules: :mod:`~fmaudit.report.cards.text` (one card as Markdown and HTML), :mod:`~fmaudit.report.cards.front_page`
(the encoders x axes tables), :mod:`~fmaudit.report.cards.figures` (the figures to read first) and
:mod:`~fmaudit.report.cards.chapter` (the chapter that writes them all); their public names are re-exported here.
"""

from __future__ import annotations

from fmaudit.report.cards.chapter import (
    CARD_FORMATS,
    CHAPTER,
    DECISION,
    FIGURES,
    FRONT_PAGE,
    SCHEMA,
    TABLES,
    card_files,
    write_cards_chapter,
)
from fmaudit.report.cards.figures import FIGURE_CAPTIONS, ece_vs_k_figure, rank_bump_figure, risk_coverage_gate_figure
from fmaudit.report.cards.front_page import (
    BEST,
    FRONT_AXES,
    LEGEND,
    SEPARATED,
    front_page_html,
    front_page_markdown,
    front_page_table,
)
from fmaudit.report.cards.text import card_html, card_markdown, quantity_text

__all__ = [
    "BEST",
    "CARD_FORMATS",
    "CHAPTER",
    "DECISION",
    "FIGURES",
    "FIGURE_CAPTIONS",
    "FRONT_AXES",
    "FRONT_PAGE",
    "LEGEND",
    "SCHEMA",
    "SEPARATED",
    "TABLES",
    "card_files",
    "card_html",
    "card_markdown",
    "ece_vs_k_figure",
    "front_page_html",
    "front_page_markdown",
    "front_page_table",
    "quantity_text",
    "rank_bump_figure",
    "risk_coverage_gate_figure",
    "write_cards_chapter",
]

"""Reliability cards: per encoder, what holds, what to fix and what it cost, read off the study's result tables.

A card is computed from the tables the report chapters already hold (leaderboard, paired differences, rank
transfer, calibration ladder, gate operating points, detection, prior-shift rows, CRA and CRT, the exposure
audit, the cost tables): nothing is refitted. Columns are found by name, so tables with more columns or rows
than these functions read (other analyses add their own) are fine. Each number keeps the interval, resampling
unit and count its table gives it; a number its table gives without an interval says so.

Each section ends with the sentences its advice rules (:mod:`fmaudit.analyses.advice`) choose from its numbers,
and with ``limits``: what its numbers cannot support (intervals from fewer than five units, one target, a
rank-transfer ρ over too few encoders, a ladder without intervals). A section the study has no numbers for is
marked unavailable, with the reason.

The card is a plain dict that the published schema ``resources/schemas/card.schema.json`` describes;
:mod:`fmaudit.report.cards` writes it as JSON, Markdown and HTML, and the front page (:func:`front_page`) reads
one value per axis from every card.

Modules: :mod:`~fmaudit.analyses.cards.model` (the quantity and the shared helpers), one per section
(:mod:`~fmaudit.analyses.cards.accuracy`, ``calibration``, ``abstention``, ``prior_shift``, ``cells``, ``exposure``,
``cost``), :mod:`~fmaudit.analyses.cards.build` (a card per encoder) and :mod:`~fmaudit.analyses.cards.front` (the
front page).
"""

from __future__ import annotations

from fmaudit.analyses.cards.abstention import abstention_section
from fmaudit.analyses.cards.accuracy import accuracy_section
from fmaudit.analyses.cards.build import build_cards, card_encoders
from fmaudit.analyses.cards.calibration import board_rule, calibration_section, recommended_fix
from fmaudit.analyses.cards.cells import cells_section
from fmaudit.analyses.cards.cost import cost_section
from fmaudit.analyses.cards.exposure import exposure_section
from fmaudit.analyses.cards.front import front_page
from fmaudit.analyses.cards.model import CARD_SECTIONS, KINDS, SCHEMA_VERSION, quantity
from fmaudit.analyses.cards.prior_shift import prior_shift_section

__all__ = [
    "CARD_SECTIONS",
    "KINDS",
    "SCHEMA_VERSION",
    "abstention_section",
    "accuracy_section",
    "build_cards",
    "calibration_section",
    "card_encoders",
    "cells_section",
    "cost_section",
    "exposure_section",
    "front_page",
    "prior_shift_section",
    "quantity",
    "recommended_fix",
]

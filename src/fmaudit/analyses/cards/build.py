"""A card per encoder: which encoders get one (:func:`card_encoders`) and the card itself, every section built
from the study's result tables (:func:`build_cards`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.analyses import advice
from fmaudit.analyses.advice import THRESHOLDS
from fmaudit.analyses.cards.abstention import abstention_section
from fmaudit.analyses.cards.accuracy import accuracy_section
from fmaudit.analyses.cards.calibration import calibration_section
from fmaudit.analyses.cards.cells import cells_section
from fmaudit.analyses.cards.cost import cost_section
from fmaudit.analyses.cards.exposure import exposure_section
from fmaudit.analyses.cards.model import CARD_SECTIONS, SCHEMA_VERSION, _table
from fmaudit.analyses.cards.prior_shift import prior_shift_section

__all__ = ["build_cards", "card_encoders"]


def card_encoders(results: Mapping[str, Any]) -> list[str]:
    """The encoders that get a card: every encoder of the analysis tables (probe, OOD, prior shift, cells), in the
    order they first appear; variants (kept out of every ranking) do not.

    Parameters
    ----------
    results : mapping
        The study's results as :func:`build_cards` takes them; an encoder found in none of the analysis tables
        falls back to the exposure audit's encoders.

    Returns
    -------
    list of str
        Encoder names, each once.
    """
    seen: list[str] = []
    sources = [
        (_table(results.get("probe"), "leaderboard")),
        (_table(results.get("ood"), "gate_summary")),
        (_table(results.get("ood"), "detection")),
        results.get("prior_shift_gains"),
        (_table(results.get("cells"), "cra")),
        (_table(results.get("cells"), "crt")),
    ]
    for t in sources:
        if isinstance(t, pd.DataFrame) and "encoder" in t.columns:
            seen += [str(e) for e in t["encoder"].unique() if str(e) not in seen]
    if not seen and isinstance(results.get("exposure"), pd.DataFrame) and "encoder" in results["exposure"].columns:
        seen = [str(e) for e in dict.fromkeys(results["exposure"]["encoder"])]
    return seen


def build_cards(
    results: Mapping[str, Any], study: str = "", encoders: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """A card per encoder of ``encoders`` (default :func:`card_encoders`; an encoder without numbers gets a card
    whose sections say so). ``results``: ``probe``, ``ood``, ``cells`` (the chapters' results), ``exposure``
    (the audit), ``prior_shift_gains`` (per-encoder gains), ``priors`` (task -> prior -> shares), ``cost``
    (``jobs``: :func:`fmaudit.costs.job_costs`), ``embeddings`` (the inventory).

    Parameters
    ----------
    results : mapping
        The study's results: ``probe``, ``ood``, ``cells`` (mappings of table name -> DataFrame, as the report
        chapters hold them), ``exposure`` and ``prior_shift_gains`` (DataFrames), ``priors`` (task -> prior ->
        class shares), ``cost`` (mapping with ``jobs``) and ``embeddings`` (DataFrame). Missing keys make the
        sections that read them unavailable.
    study : str
        The study's name, printed on every card.
    encoders : sequence of str or None
        The encoders to card, in order; None for :func:`card_encoders`.

    Returns
    -------
    list of dict
        A card per encoder: ``schema_version``, ``study``, ``encoder``, ``thresholds``
        (:data:`~fmaudit.analyses.advice.THRESHOLDS`), ``rules`` (``id`` and ``when`` of every advice rule) and
        ``sections`` (section name -> section dict with its ``title``, in the order of :data:`CARD_SECTIONS`).
    """
    cards = []
    for enc in list(encoders) if encoders is not None else card_encoders(results):
        sections = {
            "accuracy": accuracy_section(enc, results.get("probe")),
            "calibration": calibration_section(enc, results.get("probe")),
            "abstention": abstention_section(enc, results.get("ood")),
            "prior_shift": prior_shift_section(enc, results.get("prior_shift_gains"), results.get("priors")),
            "cells": cells_section(enc, results.get("cells")),
            "exposure": exposure_section(enc, results.get("exposure")),
            "cost": cost_section(enc, results.get("cost"), results.get("embeddings")),
        }
        for name, section in sections.items():
            section["title"] = CARD_SECTIONS[name]
        cards.append(
            {
                "schema_version": SCHEMA_VERSION,
                "study": study,
                "encoder": enc,
                "thresholds": dict(THRESHOLDS),
                "rules": [{"id": r.id, "when": r.when} for r in advice.RULES],
                "sections": sections,
            }
        )
    return cards

"""The card's exposure section: whether the encoder's pretraining corpora contain each evaluated data set."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fmaudit.analyses.cards.model import _has, _section, _unavailable, quantity

__all__ = ["exposure_section"]


def exposure_section(encoder: str, audit: pd.DataFrame | None) -> dict[str, Any]:
    """The exposure section of ``encoder``'s card: whether its pretraining corpora contain each evaluated data set.

    Parameters
    ----------
    encoder : str
        The encoder the card is for, as the audit's ``encoder`` column names it.
    audit : DataFrame or None
        The exposure audit, a row per encoder and ``dataset``: ``exposure`` (``yes``, ``no`` or ``unknown``) and
        optionally the first of ``evidence``, ``source``, ``reason``, quoted beside it.

    Returns
    -------
    dict
        A card section (``available``, ``reason``, ``caption``, ``columns``, ``rows``, ``advice``, ``limits``):
        a row per data set with the text quantity ``exposure``; and ``statuses`` (data set -> status).
        Unavailable, with its ``reason``, without an audit or without rows of this encoder.
    """
    if audit is None or not _has(audit, "encoder", "dataset", "exposure"):
        return _unavailable("no exposure audit (no encoder x data set pair evaluated)")
    mine = audit[audit["encoder"] == encoder]
    if not len(mine):
        return _unavailable("this encoder was not audited")
    statuses = {str(r["dataset"]): str(r["exposure"]) for r in mine.to_dict("records")}
    evidence_col = next((c for c in ("evidence", "source", "reason") if c in mine.columns), None)
    rows = [
        {
            "label": str(r["dataset"]),
            "context": {"dataset": str(r["dataset"])},
            "values": {
                "exposure": quantity(
                    None,
                    measure="in the pretraining data",
                    kind="text",
                    note=str(r["exposure"])
                    + (f" ({r[evidence_col]})" if evidence_col and str(r.get(evidence_col) or "") else ""),
                )
            },
        }
        for r in mine.to_dict("records")
    ]
    caption = (
        "Whether the encoder's pretraining corpora contain each evaluated data set (yes / no / unknown: a "
        "corpus that does not name a data set is unknown, never no)."
    )
    out = _section(caption, [("exposure", "exposure")], rows, {"datasets": statuses}, "exposure", [])
    out["statuses"] = statuses
    return out

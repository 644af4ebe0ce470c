"""The front page: one table of encoders x axes per task (the best encoder starred, those separated from it marked),
as Markdown, as HTML and as one tidy table (the CSV beside it)."""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report.cards.text import quantity_text
from fmaudit.report.html import table_html

__all__ = ["BEST", "FRONT_AXES", "LEGEND", "SEPARATED", "front_page_html", "front_page_markdown", "front_page_table"]

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
    """The front page's lines of ``index.md``: one Markdown table per task (marks as text), the legend and a link to
    each card in its three formats.

    Parameters
    ----------
    front : sequence of mapping
        The front page's tables (:func:`fmaudit.analyses.cards.front_page`): each ``{"task": ..., "rows": [...]}``,
        a row being ``{"encoder": ..., "values": {axis: quantity}}`` over :data:`FRONT_AXES`.
    encoders : sequence of str
        The encoders whose cards are linked, in order.

    Returns
    -------
    list of str
        Markdown lines, ending with a blank line.
    """
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
    """The front page as one tidy table (the CSV beside it): a row per (task, encoder, axis).

    Parameters
    ----------
    front : sequence of mapping
        The front page's tables (:func:`fmaudit.analyses.cards.front_page`).

    Returns
    -------
    DataFrame
        Columns ``task`` (empty for a study without probe tasks), ``encoder``, ``axis``, ``label``, ``point``,
        ``ci_lo``, ``ci_hi``, ``interval`` (``95%`` or why there is none), ``resampling_unit``, ``n_units``,
        ``where``, ``text`` (the cell as printed), ``best`` and ``separated`` (bool).
    """
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


def front_page_html(front: Sequence[Mapping[str, Any]], encoders: Sequence[str]) -> str:
    """The front page's tables as HTML (marks as cell classes), with the card links.

    Parameters
    ----------
    front : sequence of mapping
        The front page's tables (:func:`fmaudit.analyses.cards.front_page`).
    encoders : sequence of str
        The encoders whose last-column cell becomes a link to ``cards/<encoder>.html``.

    Returns
    -------
    str
        HTML fragment: a heading and table per task, then the legend (every text escaped).
    """
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

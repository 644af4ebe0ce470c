"""One reliability card as text: its quantities (``0.812 [0.790, 0.833]``), its sections' tables, and the card as
Markdown and as a self-contained HTML page (the cards :func:`fmaudit.analyses.cards.build_cards` made; nothing is
computed here)."""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report.html import markdown_to_html, page

__all__ = ["card_html", "card_markdown", "quantity_text"]


def quantity_text(q: Mapping[str, Any] | None, with_units: bool = False) -> str:
    """A card quantity as text: ``0.812 [0.790, 0.833]``, ``+0.021 [-0.004, 0.046]``, ``2``, ``yes``; a missing
    value as ``n/a (why)``; ``with_units`` appends the interval's unit and count.

    Parameters
    ----------
    q : mapping or None
        A card quantity (:func:`fmaudit.analyses.cards.quantity`): ``point``, ``kind`` (``value``, ``signed``,
        ``integer``, ``flag``, ``amount``, ``text``), ``ci_lo``/``ci_hi``, ``resampling_unit``, ``n_units`` and
        ``note``; ``None`` or empty: ``n/a``.
    with_units : bool, default False
        Append ``(unit, n=count)`` after an interval.

    Returns
    -------
    str
        The quantity as printed; values three decimals, amounts four significant digits.
    """
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
    """The card as Markdown.

    Parameters
    ----------
    card : mapping
        One encoder's card (:func:`fmaudit.analyses.cards.build_cards`): ``encoder``, ``study``, ``thresholds``,
        ``sections`` (name -> title, availability, caption, columns, rows, advice, limits) and ``rules``.

    Returns
    -------
    str
        The card's Markdown: title, a paragraph on where the numbers come from, one chapter per section (its table,
        interval units, advice with the rule behind each sentence, limits) and the rules; ends with a newline.
    """
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
    """The card as a self-contained HTML page (every text escaped).

    Parameters
    ----------
    card : mapping
        One encoder's card, as :func:`card_markdown` takes it.

    Returns
    -------
    str
        A whole HTML page (:func:`fmaudit.report.html.page`) with links to the report home and the card's JSON and
        Markdown beside it.
    """
    parts = [
        f"<h1>Reliability card: {html.escape(card['encoder'])}</h1>",
        f'<p><a href="../index.html">Report home</a> · <a href="{html.escape(card["encoder"])}.json">JSON</a>'
        f' · <a href="{html.escape(card["encoder"])}.md">Markdown</a></p>',
    ]
    body = card_markdown(card).split("\n", 2)[2]  # without the title line
    parts.append(markdown_to_html(body))
    return page(f"Reliability card: {card['encoder']}", "\n".join(parts))

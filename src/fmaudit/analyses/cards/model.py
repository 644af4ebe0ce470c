"""The card's model: its schema version, sections and quantity kinds, :func:`quantity` (one number of a card with
its interval and resampling unit), and the helpers every section builder shares: reading a result table by
name, an unavailable section, a section with its advice and limits."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.analyses.advice import MIN_UNITS, fire_rules

__all__ = ["CARD_SECTIONS", "KINDS", "SCHEMA_VERSION", "quantity"]

SCHEMA_VERSION = 1
#: Sections of a card, in order, with their titles.
CARD_SECTIONS = {
    "accuracy": "Accuracy in-domain and off-domain",
    "calibration": "Calibration off-domain",
    "abstention": "Abstention gate",
    "prior_shift": "Class-prior shift",
    "cells": "Cells",
    "exposure": "Pretraining exposure",
    "cost": "Cost",
}


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _int(x: Any) -> int | None:
    v = _num(x)
    return int(v) if v is not None else None


#: How a quantity prints: a value with its interval, a signed one (gains, differences), a whole number (ranks,
#: counts, K), a yes/no flag, a text (exposure status), or an amount (hours, MB: four significant digits).
KINDS = ("value", "signed", "integer", "flag", "text", "amount")


def quantity(
    point: Any,
    lo: Any = None,
    hi: Any = None,
    *,
    measure: str,
    unit: Any = None,
    n_units: Any = None,
    interval: str | None = None,
    note: str | None = None,
    kind: str = "value",
) -> dict[str, Any]:
    """One number of a card: ``point`` with its interval (``ci_lo``, ``ci_hi``), what it measures, the unit its
    interval resamples and how many (``resampling_unit``, ``n_units``), how the interval was made, a ``note``
    saying why a value or interval is missing, and how it prints (``kind``, :data:`KINDS`).

    Parameters
    ----------
    point : float, int or None
        The value; anything that is not a finite number (None, NaN, a text) becomes None.
    lo, hi : float or None
        The interval's bounds, in the value's unit; kept only when both are finite numbers.
    measure : str
        What the number measures, in words (``"macro-F1"``, ``"top-label ECE (15 equal-width bins)"``).
    unit : str or None
        The unit the interval resamples (``"slide"``, ``"patient"``, ``"section"``); None, empty or NaN for none.
    n_units : int or None
        How many of those units the interval resamples.
    interval : str or None
        How the interval was made (``"paired cluster bootstrap"``, a table's ``ci_convention``).
    note : str or None
        Why the value or its interval is missing, or what qualifies it (``"no interval"``).
    kind : str
        How the quantity prints, one of :data:`KINDS`; default ``"value"``.

    Returns
    -------
    dict
        Keys ``point``, ``ci_lo``, ``ci_hi`` (float or None), ``measure``, ``resampling_unit`` (str or None),
        ``n_units`` (int or None), ``interval``, ``note`` and ``kind``: a quantity of the card schema.

    Raises
    ------
    ValueError
        ``kind`` is not one of :data:`KINDS`.
    """
    if kind not in KINDS:
        raise ValueError(f"quantity kind {kind!r} is not one of {KINDS}")
    lo, hi = _num(lo), _num(hi)
    return {
        "point": _num(point),
        "ci_lo": lo if hi is not None else None,
        "ci_hi": hi if lo is not None else None,
        "measure": measure,
        "resampling_unit": str(unit) if unit not in (None, "") and not _isnan(unit) else None,
        "n_units": _int(n_units),
        "interval": interval,
        "note": note,
        "kind": kind,
    }


def _isnan(x: Any) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def _col(row: Mapping[str, Any], name: str, default: Any = None) -> Any:
    v = row.get(name, default)
    return default if v is None or _isnan(v) else v


def _table(results: Mapping[str, Any] | None, name: str) -> pd.DataFrame:
    t = (results or {}).get(name)
    return t if isinstance(t, pd.DataFrame) and "note" not in t.columns else pd.DataFrame()


def _has(df: pd.DataFrame, *cols: str) -> bool:
    return len(df) > 0 and all(c in df.columns for c in cols)


def _unavailable(reason: str) -> dict[str, Any]:
    return {"available": False, "reason": reason, "caption": "", "columns": [], "rows": [], "advice": [], "limits": []}


def _section(
    caption: str,
    columns: Sequence[tuple[str, str]],
    rows: list[dict],
    facts: Mapping[str, Any],
    name: str,
    limits: list[str],
) -> dict[str, Any]:
    return {
        "available": True,
        "reason": None,
        "caption": caption,
        "columns": [{"key": k, "label": label} for k, label in columns],
        "rows": rows,
        "advice": fire_rules(name, facts),
        "limits": list(dict.fromkeys(limits)),
    }


def _few_units(qs: Sequence[Mapping[str, Any]], what: str) -> list[str]:
    small = sorted({q["n_units"] for q in qs if q.get("n_units") is not None and q["n_units"] < MIN_UNITS})
    if not small:
        return []
    units = sorted({q["resampling_unit"] for q in qs if q.get("resampling_unit")})
    return [
        f"Some {what} intervals rest on {', '.join(map(str, small))} {'/'.join(units) or 'unit'}(s), fewer than "
        f"{MIN_UNITS}: no advice is drawn from them."
    ]


def _ctx(task: str, head: str, frac: float, source: str, target: str) -> dict[str, Any]:
    return {
        "task": str(task),
        "head": str(head),
        "fraction": float(frac),
        "source_domain": str(source),
        "target_domain": str(target),
    }

"""The card's class-prior-shift section: the macro-F1 gain of each label-free adaptation over the unadapted probe,
per class prior of the target draws, and the methods that harm under some prior."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fmaudit.analyses import advice
from fmaudit.analyses.advice import MIN_UNITS
from fmaudit.analyses.cards.model import _few_units, _has, _section, _unavailable, quantity

__all__ = ["prior_shift_section"]


def prior_shift_section(
    encoder: str, gains: pd.DataFrame | None, priors: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None
) -> dict[str, Any]:
    """The class-prior-shift section of ``encoder``'s card: the macro-F1 gain of each label-free adaptation over
    the unadapted source probe (docs/methods.md#adaptation-methods), per class prior of the target draws, and the
    deployable methods whose gain interval lies below zero under some prior.

    Parameters
    ----------
    encoder : str
        The encoder the card is for, as the table's ``encoder`` column names it.
    gains : DataFrame or None
        Per-encoder gains, a row per ``encoder, task, source_domain, method, prior``: ``mean``, ``ci_lo``,
        ``ci_hi`` (hierarchical bootstrap), ``unit``, ``n_units`` and optionally ``unit_text``. Rows of method
        ``none`` (no adaptation, the reference) are skipped.
    priors : mapping or None
        Task -> prior name -> class -> share of the target draws; the largest share is quoted in the advice.

    Returns
    -------
    dict
        A card section (``available``, ``reason``, ``caption``, ``columns``, ``rows``, ``advice``, ``limits``):
        a row per task, source domain and method, ``values`` the signed quantity ``prior:<name>`` for each prior;
        and ``harmful_methods`` (sorted method names, from intervals of at least
        :data:`~fmaudit.analyses.advice.MIN_UNITS` units). Unavailable, with its ``reason``, without gains or
        without rows of this encoder.
    """
    if gains is None or not _has(gains, "encoder", "method", "prior", "mean"):
        return _unavailable("no class-prior-shift runs in this study (config block prior_shift)")
    mine = gains[(gains["encoder"] == encoder) & (gains["method"] != "none")]
    if not len(mine):
        return _unavailable("this encoder has no prior-shift runs")
    rows, facts, qs = [], [], []
    prior_names = list(dict.fromkeys(mine["prior"]))
    for (task, source, method), part in mine.groupby(["task", "source_domain", "method"], sort=False):
        deployable = method != "oracle_restandardization"
        values = {}
        for r in part.to_dict("records"):
            q = quantity(
                r["mean"],
                r.get("ci_lo"),
                r.get("ci_hi"),
                measure="macro-F1 gain over no adaptation",
                unit=r.get("unit"),
                n_units=r.get("n_units"),
                interval="hierarchical bootstrap",
                kind="signed",
            )
            values[f"prior:{r['prior']}"] = q
            qs.append(q)
            shares = ((priors or {}).get(str(task)) or {}).get(str(r["prior"])) or {}
            facts.append(
                {
                    "task": task,
                    "source_domain": source,
                    "method": method,
                    "prior": r["prior"],
                    "gain": q,
                    "deployable": deployable,
                    "unit": r.get("unit_text") or r.get("unit"),
                    "largest_share": max(shares.values()) if shares else None,
                }
            )
        rows.append(
            {
                "label": method + ("" if deployable else " (not deployable: reads target labels)"),
                "context": {"task": str(task), "source_domain": str(source), "method": str(method)},
                "values": values,
            }
        )
    below = {
        f["method"] for f in facts if f["deployable"] and f["gain"]["ci_hi"] is not None and f["gain"]["ci_hi"] < 0
    }
    harmful = sorted(
        m
        for m in below
        if any(
            f["method"] == m
            and f["gain"]["ci_hi"] is not None
            and f["gain"]["ci_hi"] < 0
            and advice.supports_advice(f["gain"])
            for f in facts
        )
    )
    weak = sorted(below - set(harmful))
    limits = _few_units(qs, "gain")
    if not any(f["gain"]["ci_lo"] is not None and (f["gain"]["ci_lo"] > 0 or f["gain"]["ci_hi"] < 0) for f in facts):
        limits.append(
            "No method's gain interval excludes zero under any prior: whether adaptation helps or harms "
            "this encoder cannot be told from these draws."
        )
    caption = (
        "Mean macro-F1 gain of each label-free adaptation over the unadapted source probe, per class prior of "
        "the target draws, this encoder only; 95% hierarchical-bootstrap interval over its source seeds and "
        "draws. Harmful under some prior (interval below zero, from at least "
        f"{MIN_UNITS} resampling units): "
        + (", ".join(harmful) or "none")
        + "."
        + (f" Below zero somewhere but from fewer units (not evidence): {', '.join(weak)}." if weak else "")
    )
    columns = [(f"prior:{p}", p) for p in prior_names]
    out = _section(caption, columns, rows, {"gains": facts}, "prior_shift", limits)
    out["harmful_methods"] = harmful
    return out

"""The card's cells section: CRA (Nuc minus Mean macro-F1 within sections) with whether Nuc beats Mean, and CRT
(significant wins across the transfer protocols), with the encoder's ranks."""

from __future__ import annotations

from typing import Any, Mapping

from fmaudit.analyses import advice
from fmaudit.analyses.cards.model import _has, _int, _num, _section, _table, _unavailable, quantity
from fmaudit.stats import wilcoxon_smallest_p

__all__ = ["cells_section"]


def cells_section(encoder: str, cells: Mapping[str, Any] | None, alpha: float = 0.05) -> dict[str, Any]:
    """The cells section of ``encoder``'s card: CRA and CRT (docs/methods.md#composite-indices-cri-cra-and-crt)
    per taxonomy and magnification, whether Nuc beats Mean, and the encoder's ranks.

    Parameters
    ----------
    encoder : str
        The encoder the card is for, as the tables' ``encoder`` column names it.
    cells : mapping of str to DataFrame, or None
        The cells chapter's result tables by name. Reads ``cra`` (a row per encoder, ``taxonomy`` and
        ``magnification``: ``cra_mean_pp``, ``cra_sd_pp``, ``n_sections``, optionally ``n_win_units`` (the
        Wilcoxon test's (section, seed) runs), ``n_balanced`` and ``balance``, ``nuc_vs_mean_p``,
        ``nuc_beats_mean``, ``rank``) and ``crt`` (``crt``, ``crt_relative_pp``, ``n_units``, ``n_opponents``,
        ``rank``). Tables with a ``note`` column count as absent.
    alpha : float
        Significance level of the paired Wilcoxon test of Nuc against Mean; with too few runs to reach it the
        flag is left undecided and ``limits`` says so.

    Returns
    -------
    dict
        A card section (``available``, ``reason``, ``caption``, ``columns``, ``rows``, ``advice``, ``limits``):
        a row per CRA row (quantities ``cra``, ``nuc_beats_mean``, ``cra_rank``) and per CRT row (``crt``,
        ``crt_relative_pp``, ``crt_rank``). Unavailable, with its ``reason``, without either table or without
        rows of this encoder.
    """
    cra, crt = _table(cells, "cra"), _table(cells, "crt")
    if not _has(cra, "encoder", "cra_mean_pp") and not _has(crt, "encoder", "crt"):
        return _unavailable("no cell-level runs in this study (config block cells)")
    rows, facts, limits = [], [], []
    for r in cra[cra["encoder"] == encoder].to_dict("records") if len(cra) else []:
        n = int(r.get("n_sections") or 0)
        # the Wilcoxon test runs over the encoder's valid (section, seed) runs where the table counts them
        n_test = int(r["n_win_units"]) if _num(r.get("n_win_units")) is not None else n
        possible = wilcoxon_smallest_p(n_test) < alpha
        p = _num(r.get("nuc_vs_mean_p"))
        over = f"{int(r['n_balanced'])} {r['balance']}s" if _num(r.get("n_balanced")) is not None else f"{n} sections"
        values = {
            "cra": quantity(
                r["cra_mean_pp"],
                measure="CRA: Nuc − Mean macro-F1 (pp), mean over sections",
                unit="section",
                n_units=n,
                kind="signed",
                note=f"SD {advice.fmt(_num(r.get('cra_sd_pp')), 1)} pp over {over}; no interval",
            ),
            "nuc_beats_mean": quantity(
                None if not possible else float(bool(r.get("nuc_beats_mean"))),
                measure="Nuc beats Mean (paired Wilcoxon, p < 0.05)",
                kind="flag",
                note=(
                    f"cannot be decided: with {n_test} (section, seed) runs the smallest possible "
                    f"two-sided p is {wilcoxon_smallest_p(n_test):.3g}"
                )
                if not possible
                else f"p = {advice.fmt(p)}",
            ),
            "cra_rank": quantity(r.get("rank"), measure="CRA rank (1 = largest Nuc gain)", kind="integer"),
        }
        if not possible:
            limits.append(
                f"{n_test} (section, seed) runs: a two-sided Wilcoxon test cannot reach p < {alpha:g} "
                "(smallest possible "
                f"p = {wilcoxon_smallest_p(n_test):.3g}), so whether Nuc beats Mean is undecided, not false."
            )
        facts.append(
            {
                "taxonomy": str(r["taxonomy"]),
                "magnification": float(r["magnification"]),
                "cra_mean_pp": float(r["cra_mean_pp"]),
                "cra_sd_pp": _num(r.get("cra_sd_pp")),
                "n_sections": n_test,
                "p": p,
                "nuc_beats_mean": bool(r.get("nuc_beats_mean")),
                "wilcoxon_possible": possible,
            }
        )
        rows.append(
            {
                "label": f"CRA, {r['taxonomy']} taxonomy, {float(r['magnification']):g}x",
                "context": {"taxonomy": str(r["taxonomy"]), "magnification": float(r["magnification"])},
                "values": values,
            }
        )
    for r in crt[crt["encoder"] == encoder].to_dict("records") if len(crt) else []:
        rows.append(
            {
                "label": f"CRT, {r['taxonomy']} taxonomy, {float(r['magnification']):g}x",
                "context": {"taxonomy": str(r["taxonomy"]), "magnification": _num(r.get("magnification"))},
                "values": {
                    "crt": quantity(
                        r["crt"],
                        measure="CRT: significant wins against the other encoders (paired Wilcoxon over "
                        "(unit, seed) runs), mean over the transfer protocols",
                        unit="protocol unit",
                        n_units=r.get("n_units"),
                        note=f"of {_int(r.get('n_opponents'))} other encoders; a count, no interval",
                    ),
                    "crt_relative_pp": quantity(
                        r.get("crt_relative_pp"),
                        measure="macro-F1 relative to the median encoder (pp), mean over the transfer protocols' "
                        "units",
                        kind="signed",
                        unit="protocol unit",
                        n_units=r.get("n_units"),
                        note="no interval",
                    ),
                    "crt_rank": quantity(r.get("rank"), measure="CRT rank (1 = best)", kind="integer"),
                },
            }
        )
    if not rows:
        return _unavailable("this encoder has no cell runs")
    caption = (
        "CellPath readouts: CRA is the Nuc minus Mean macro-F1 (percentage points) within sections (IS), "
        "mean over sections; CRT the mean over the transfer protocols of the encoder's significant wins against "
        "the others, beside its macro-F1 relative to the median encoder, with ranks among the study's encoders."
    )
    columns = [
        ("cra", "CRA (pp)"),
        ("nuc_beats_mean", "Nuc beats Mean"),
        ("cra_rank", "CRA rank"),
        ("crt", "CRT (wins)"),
        ("crt_relative_pp", "CRT relative (pp)"),
        ("crt_rank", "CRT rank"),
    ]
    return _section(caption, columns, rows, {"cra": facts}, "cells", limits)

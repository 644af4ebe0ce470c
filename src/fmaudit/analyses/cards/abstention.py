"""The card's abstention section: the two-threshold gate's coverage, accuracy of the accepted items and the share
of each OOD set it rejects, with the detection AUROCs of its scores."""

from __future__ import annotations

from typing import Any, Mapping

from fmaudit.analyses import advice
from fmaudit.analyses.cards.model import _col, _few_units, _has, _int, _num, _section, _table, _unavailable, quantity

__all__ = ["abstention_section"]


def _gate_q(r: Mapping[str, Any], name: str, measure: str) -> dict[str, Any]:
    """A gate quantity as the card reads it: the mean over the fit/validation divisions with its pooled bootstrap
    interval (``<name>_mean_over_divisions``; the gate table's headline ``<name>`` is division 0 alone, the
    paper's single division, and has no interval)."""
    mean = f"{name}_mean_over_divisions"
    key = mean if mean in r else name
    return quantity(
        r.get(key),
        r.get(f"{key}_ci_lo"),
        r.get(f"{key}_ci_hi"),
        measure=measure,
        unit=r.get("ci_unit"),
        n_units=r.get("ci_n_units"),
        interval=f"pooled bootstrap over {_int(r.get('n_splits'))} fit/validation divisions",
        note=None if _num(r.get(name)) is not None else "no labels on this set",
    )


def abstention_section(encoder: str, ood: Mapping[str, Any] | None) -> dict[str, Any]:
    """The abstention section of ``encoder``'s card: the two-threshold gate (docs/methods.md#the-abstention-gate) at
    its operating point on the in-distribution test split and on each OOD set, and the detection AUROC of each
    novelty score (stated under ``limits`` when below 0.5).

    Parameters
    ----------
    encoder : str
        The encoder the card is for, as the tables' ``encoder`` column names it.
    ood : mapping of str to DataFrame, or None
        The OOD chapter's result tables by name. Reads ``gate_summary`` (a row per encoder, ``task``,
        ``setting`` and ``set``, ``test`` being the in-distribution split; ``tier``; ``coverage``,
        ``accuracy_accepted`` and ``reject_any`` with their ``<name>_mean_over_divisions`` and its
        ``_ci_lo``/``_ci_hi``; ``ci_unit``, ``ci_n_units``, ``n_splits``) and ``detection`` (``condition``,
        ``tier``, ``scorer``, ``auroc`` with ``auroc_ci_lo``, ``auroc_ci_hi``). Tables with a ``note`` column
        count as absent.

    Returns
    -------
    dict
        A card section (``available``, ``reason``, ``caption``, ``columns``, ``rows``, ``advice``, ``limits``):
        a row per gate setting and set, ``context`` with ``task``, ``setting``, ``set`` and ``tier``
        (``"in-distribution"`` for the test split), ``values`` the quantities ``coverage``,
        ``accuracy_accepted`` and ``rejected``. Unavailable, with its ``reason``, without a gate table or
        without rows of this encoder.
    """
    gate = _table(ood, "gate_summary")
    if not _has(gate, "encoder", "set", "setting"):
        return _unavailable("no abstention gate in this study (config ood.gate)")
    mine = gate[gate["encoder"] == encoder]
    if not len(mine):
        return _unavailable("this encoder has no gate")
    rows, sets, qs = [], [], []
    for r in mine.to_dict("records"):
        is_id = str(r["set"]) == "test"
        tier = "in-distribution" if is_id else str(_col(r, "tier", r["set"]))
        values = {
            "coverage": _gate_q(r, "coverage", "share of the set accepted"),
            "accuracy_accepted": _gate_q(r, "accuracy_accepted", "accuracy of the accepted items"),
            "rejected": _gate_q(r, "reject_any", "share of the set rejected"),
        }
        qs += [v for v in values.values() if v["point"] is not None]
        rows.append(
            {
                "label": f"{r['setting']}: {r['set']} ({tier})",
                "context": {
                    "task": str(r.get("task")),
                    "setting": str(r["setting"]),
                    "set": str(r["set"]),
                    "tier": tier,
                },
                "values": values,
            }
        )
        sets.append(
            {
                "task": str(r.get("task")),
                "setting": str(r["setting"]),
                "set": str(r["set"]),
                "tier": tier,
                "rejected": values["rejected"],
                "coverage": values["coverage"],
            }
        )
    det = _table(ood, "detection")
    detection = []
    if _has(det, "encoder", "auroc", "scorer", "condition"):
        for r in det[det["encoder"] == encoder].to_dict("records"):
            detection.append(
                {
                    "task": str(r.get("task")),
                    "condition": str(r["condition"]),
                    "tier": str(r.get("tier")),
                    "scorer": str(r["scorer"]),
                    "auroc": quantity(
                        r["auroc"],
                        r.get("auroc_ci_lo"),
                        r.get("auroc_ci_hi"),
                        measure="detection AUROC (OOD positive)",
                        unit=r.get("ci_unit"),
                        n_units=r.get("ci_n_units"),
                    ),
                }
            )
    limits = _few_units(qs, "gate")
    below = [d for d in detection if d["auroc"]["point"] is not None and d["auroc"]["point"] < 0.5]
    for d in below:
        if not (advice.supports_advice(d["auroc"]) and d["auroc"]["ci_hi"] < 0.5):
            limits.append(
                f"The {d['scorer']} score's AUROC on {d['condition']} is {advice.fmt_q(d['auroc'])}, below "
                "0.5 but not with its whole interval."
            )
    caption = (
        "The two-threshold gate at its operating point, mean over its fit/validation divisions with the pooled "
        "bootstrap interval (the gate table's headline is division 0 alone, as the audit paper reports it): "
        "coverage and accuracy of the accepted items on the in-distribution test split, and the share of each "
        "OOD set it rejects (as novel or unconfident)."
    )
    columns = [("coverage", "coverage"), ("accuracy_accepted", "accuracy of accepted"), ("rejected", "rejected")]
    return _section(caption, columns, rows, {"sets": sets, "detection": detection}, "abstention", limits)

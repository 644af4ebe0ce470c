"""The cards' front page: one table per probe task, a row per encoder, one value per axis of
:data:`fmaudit.report.cards.FRONT_AXES`, the best encoder marked and those whose interval lies wholly on the
worse side of it."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from fmaudit.analyses import advice
from fmaudit.analyses.advice import ECE_MARGIN
from fmaudit.analyses.cards.model import quantity
from fmaudit.report.cards import FRONT_AXES

__all__ = ["front_page"]


def _headline_rows(section: Mapping[str, Any]) -> dict[str, list[dict]]:
    """Task -> the accuracy rows of the task's headline source (the first source domain, sorted)."""
    by_task: dict[str, list[dict]] = {}
    for r in section.get("rows", []):
        by_task.setdefault(r["context"]["task"], []).append(r)
    out = {}
    for task, rows in by_task.items():
        source = sorted(r["context"]["source_domain"] for r in rows)[0]
        out[task] = [r for r in rows if r["context"]["source_domain"] == source]
    return out


def _front_values(card: Mapping[str, Any], task: str | None) -> dict[str, Any]:
    s = card["sections"]
    out: dict[str, Any] = {}
    acc = _headline_rows(s["accuracy"]).get(task, []) if s["accuracy"]["available"] else []
    if acc:
        out["in_domain"] = {**acc[0]["values"]["in_domain"], "where": f"on {acc[0]['context']['source_domain']}"}
        off = [r for r in acc if "target" in r["values"] and r["values"]["target"]["point"] is not None]
        if off:
            worst = min(off, key=lambda r: r["values"]["target"]["point"])
            out["worst_off_domain"] = {**worst["values"]["target"], "where": f"→ {worst['context']['target_domain']}"}
    cal = s["calibration"]
    if cal["available"] and cal.get("recommended_fix", {}).get("worst_ece") is not None:
        fix = cal["recommended_fix"]
        short = {"source_ts": "source T", "raw": "no fix", "kshot_ts": f"K={fix['k']}"}.get(
            fix["stage"], str(fix["stage"])
        )
        within = "none within" not in fix["name"]
        out["calibration"] = {
            **quantity(fix["worst_ece"], measure="worst off-domain ECE after the fix"),
            "where": short + ("" if within else f", > oracle + {ECE_MARGIN:g}"),
        }
    gate = s["abstention"]
    if gate["available"]:
        ids = [
            r
            for r in gate["rows"]
            if r["context"]["tier"] == "in-distribution" and (task is None or r["context"]["task"] == task)
        ]
        main = [r for r in ids if r["context"]["setting"] == r["context"]["task"]] or ids
        if main:
            setting = main[0]["context"]["setting"]
            out["gate_coverage"] = {
                **main[0]["values"]["coverage"],
                "where": "" if setting == main[0]["context"]["task"] else setting,
            }
    ps = s["prior_shift"]
    if ps["available"]:
        worst = None
        for r in ps["rows"]:
            if "not deployable" in r["label"] or (task is not None and r["context"]["task"] != task):
                continue
            for key, q in r["values"].items():
                if q["point"] is not None and (worst is None or q["point"] < worst[0]["point"]):
                    worst = (q, f"{r['context']['method']} @ {key.removeprefix('prior:')}")
        if worst:
            out["prior_shift_risk"] = {**worst[0], "where": worst[1]}
    cells = s["cells"]
    if cells["available"]:
        cra = next((r for r in cells["rows"] if "cra" in r["values"]), None)
        crt = next((r for r in cells["rows"] if "crt_rank" in r["values"]), None)
        parts = []
        if cra:
            q = cra["values"]["cra"]
            parts.append(f"CRA {q['point']:+.1f} pp (n={q['n_units']} sections)")
        if crt and crt["values"]["crt_rank"]["point"] is not None:
            parts.append(f"CRT rank {int(crt['values']['crt_rank']['point'])}")
        out["cells"] = {"text": "; ".join(parts)}
    exp = s["exposure"]
    if exp["available"]:
        groups: dict[str, list[str]] = {}
        for ds, status in exp["statuses"].items():
            groups.setdefault(status, []).append(ds)
        out["exposure"] = {"text": "; ".join(f"{st}: {', '.join(ds)}" for st, ds in groups.items())}
    cost = s["cost"]
    if cost["available"]:
        t = cost["totals"]
        out["cost"] = {"text": f"{advice.fmt(t['gpu_hours'], 3)} GPU-h, {advice.fmt(t['cpu_hours'], 3)} CPU-h"}
    return out


def front_page(cards: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One table per probe task (or one for the study without probe runs): a row per encoder, each axis of
    :data:`FRONT_AXES` with its value and, where the axis has an order and intervals, ``separated``: the
    interval lies wholly on the worse side of the best encoder's interval.

    Parameters
    ----------
    cards : sequence of mapping
        Cards as :func:`~fmaudit.analyses.cards.build.build_cards` returns them.

    Returns
    -------
    list of dict
        A table per task: ``task`` (None without probe runs) and ``rows``, a row per card with ``encoder`` and
        ``values`` (axis -> quantity with ``where``, ``best`` and ``separated`` for the ordered axes, or
        ``{"text": ...}`` for ``cells``, ``exposure`` and ``cost``); an axis the card has no number for is left
        out.
    """
    tasks = sorted({r["context"]["task"] for c in cards for r in c["sections"]["accuracy"].get("rows", [])}) or [None]
    tables = []
    for task in tasks:
        rows = [{"encoder": c["encoder"], "values": _front_values(c, task)} for c in cards]
        for axis, (_, higher) in FRONT_AXES.items():
            if higher is None:
                continue
            vals = [
                (r, r["values"][axis]) for r in rows if axis in r["values"] and r["values"][axis]["point"] is not None
            ]
            if not vals:
                continue
            best_row, best = (max if higher else min)(vals, key=lambda rv: rv[1]["point"])
            best["best"] = True
            for _, q in vals:
                q.setdefault("best", False)
                q["separated"] = bool(
                    q is not best
                    and best.get("ci_lo") is not None
                    and q.get("ci_hi") is not None
                    and advice.supports_advice(q)
                    and advice.supports_advice(best)
                    and ((q["ci_hi"] < best["ci_lo"]) if higher else (q["ci_lo"] > best["ci_hi"]))
                )
        tables.append({"task": task, "rows": rows})
    return tables

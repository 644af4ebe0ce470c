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
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.analyses import advice
from fmaudit.analyses.advice import ECE_MARGIN, MIN_RANK_ENCODERS, MIN_UNITS, THRESHOLDS, WIDE_INTERVAL, fire_rules
from fmaudit.report.cards import FRONT_AXES
from fmaudit.stats import wilcoxon_smallest_p

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
    saying why a value or interval is missing, and how it prints (``kind``, :data:`KINDS`)."""
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


# ---------------------------------------------------------------------------------------------------- accuracy
def _macro_f1(r: Mapping[str, Any]) -> dict[str, Any]:
    return quantity(
        r.get("macro_f1"),
        r.get("macro_f1_ci_lo"),
        r.get("macro_f1_ci_hi"),
        measure="macro-F1",
        unit=r.get("ci_unit"),
        n_units=r.get("ci_n_units"),
        interval=_col(r, "ci_convention"),
    )


def _rank(rank: Any, n: int) -> dict[str, Any]:
    return quantity(rank, measure=f"rank among {n} encoders (1 = best)", kind="integer")


def _paired(pd_table: pd.DataFrame, encoder: str) -> dict[tuple, dict[str, dict]]:
    """(task, head, fraction, source, target) -> other encoder -> quantity of (other - encoder), from the paired
    differences against the reference encoder (both directions)."""
    out: dict[tuple, dict[str, dict]] = {}
    if not _has(pd_table, "encoder", "reference", "difference", "ci_lo", "ci_hi"):
        return out
    rows = pd_table[pd_table["metric"] == "macro_f1"] if "metric" in pd_table.columns else pd_table
    for r in rows.to_dict("records"):
        key = (r["task"], r["head"], r["fraction"], r["source_domain"], r["target_domain"])
        sign, other = (1.0, r["encoder"]) if r["reference"] == encoder else (-1.0, r["reference"])
        if encoder not in (r["encoder"], r["reference"]) or other == encoder:
            continue
        lo, hi = sorted((sign * r["ci_lo"], sign * r["ci_hi"]))
        out.setdefault(key, {})[other] = quantity(
            sign * r["difference"],
            lo,
            hi,
            measure="macro-F1 difference",
            kind="signed",
            unit=r.get("ci_unit"),
            n_units=r.get("ci_n_units"),
            interval="paired cluster bootstrap",
        )
    return out


def accuracy_section(encoder: str, probe: Mapping[str, Any] | None) -> dict[str, Any]:
    board = _table(probe, "leaderboard")
    if not _has(board, "encoder", "macro_f1", "source_domain", "target_domain"):
        return _unavailable("no probe runs in this study")
    keys = ["task", "head", "fraction", "source_domain", "target_domain"]
    board = board.copy()
    if "rank_macro_f1" not in board.columns:
        board["rank_macro_f1"] = board.groupby(keys)["macro_f1"].rank(ascending=False, method="min")
    mine = board[board["encoder"] == encoder]
    if not len(mine):
        return _unavailable("this encoder has no probe runs")
    n_enc = board.groupby(keys)["encoder"].nunique()
    rank = board.set_index([*keys, "encoder"])["rank_macro_f1"]
    rho = _table(probe, "rank_transfer")
    rho = rho.set_index(keys) if _has(rho, *keys, "spearman_rho") else None
    paired = _paired(_table(probe, "paired_differences"), encoder)
    rows, pairs, transfers, qs, limits = [], [], [], [], []
    uninformative: list[tuple[str, str]] = []
    noisy: list[str] = []
    for (task, head, frac, source), cell in mine.groupby(["task", "head", "fraction", "source_domain"], sort=True):
        ind = cell[cell["target_domain"] == source]
        if not len(ind):
            continue
        ind_row = ind.iloc[0].to_dict()
        ind_q = _macro_f1(ind_row)
        qs.append(ind_q)
        targets = [t for t in sorted(cell["target_domain"]) if t != source]
        if not targets:
            limits.append(f"Task {task} has one domain: off-domain accuracy and rank transfer cannot be judged.")
            rows.append(
                {
                    "label": f"{task}: {source} (in-domain only)",
                    "context": _ctx(task, head, frac, source, source),
                    "values": {
                        "in_domain": ind_q,
                        "rank_in_domain": _rank(
                            ind_row["rank_macro_f1"], int(n_enc[(task, head, frac, source, source)])
                        ),
                    },
                }
            )
            continue
        if len(targets) == 1:
            limits.append(
                f"Task {task}, source {source}: one target domain; whether the ranking transfers rests on it alone."
            )
        for target in targets:
            t_row = cell[cell["target_domain"] == target].iloc[0].to_dict()
            t_q = _macro_f1(t_row)
            qs.append(t_q)
            key = (task, head, frac, source, target)
            n = int(n_enc[key])
            r_in = int(rank[(task, head, frac, source, source, encoder)])
            r_t = int(rank[key + (encoder,)])
            values = {"in_domain": ind_q, "target": t_q, "rank_in_domain": _rank(r_in, n), "rank_target": _rank(r_t, n)}
            if rho is not None and key in rho.index:
                rr = rho.loc[key]
                rr = (rr.iloc[0] if isinstance(rr, pd.DataFrame) else rr).to_dict()
                n_rho = int(n_enc[(task, head, frac, source, source)])
                informative = (
                    n_rho >= MIN_RANK_ENCODERS
                    and _num(rr.get("spearman_rho_ci_lo")) is not None
                    and not (rr["spearman_rho_ci_lo"] <= 0 <= rr["spearman_rho_ci_hi"])
                )
                values["rho"] = quantity(
                    rr["spearman_rho"],
                    rr.get("spearman_rho_ci_lo"),
                    rr.get("spearman_rho_ci_hi"),
                    measure=f"Spearman ρ of the study's {n_rho} encoders (in-domain vs target ranking)",
                    interval=_col(rr, "rho_ci_convention"),
                    note=None if informative else "not informative",
                )
                transfers.append(
                    {
                        "task": task,
                        "source_domain": source,
                        "target_domain": target,
                        "n_encoders": n_rho,
                        "rho": values["rho"],
                    }
                )
                if not informative:
                    why = (
                        f"only {n_rho} encoders"
                        if n_rho < MIN_RANK_ENCODERS
                        else "its interval includes 0"
                        if values["rho"]["ci_lo"] is not None
                        else "no interval"
                    )
                    uninformative.append((f"{source} → {target}", why))
            overtaken = []
            for other, d in paired.get(key, {}).items():
                r_o_in = _int(rank.get((task, head, frac, source, source, other)))
                r_o_t = _int(rank.get(key + (other,)))
                if r_o_in is not None and r_o_t is not None and r_o_in > r_in and r_o_t < r_t:
                    overtaken.append({"encoder": other, "difference": d})
            if r_t > r_in and not any(
                advice.supports_advice(o["difference"]) and o["difference"]["ci_lo"] > 0 for o in overtaken
            ):
                noisy.append(f"{source} → {target} (rank {r_in} → {r_t})")
            pairs.append(
                {
                    "task": task,
                    "source_domain": source,
                    "target_domain": target,
                    "in_domain": ind_q,
                    "target": t_q,
                    "rank_in_domain": r_in,
                    "rank_target": r_t,
                    "n_encoders": n,
                    "overtaken_by": overtaken,
                }
            )
            rows.append(
                {"label": f"{source} → {target}", "context": _ctx(task, head, frac, source, target), "values": values}
            )
    if uninformative:
        whys = sorted({w for _, w in uninformative})
        limits.append(
            f"The study's rank-transfer ρ ({len(uninformative)} pairs: {', '.join(p for p, _ in uninformative)}) "
            f"cannot tell whether in-domain rankings carry over ({'; '.join(whys)}; at least "
            f"{MIN_RANK_ENCODERS} encoders and an interval that excludes 0 are needed)."
        )
    if noisy:
        limits.append(
            f"It ranks lower on the target than in-domain on {', '.join(noisy)}, but no paired interval shows an "
            "encoder it led in-domain to be better there: the change may be noise."
        )
    limits += _few_units(qs, "macro-F1")
    wide = [
        (r["label"], r["values"][k])
        for r in rows
        for k in ("in_domain", "target")
        if k in r["values"]
        and r["values"][k]["ci_lo"] is not None
        and r["values"][k]["ci_hi"] - r["values"][k]["ci_lo"] > WIDE_INTERVAL
    ]
    if wide:
        label, q = max(wide, key=lambda w: w[1]["ci_hi"] - w[1]["ci_lo"])
        limits.append(
            f"{len(wide)} macro-F1 intervals are wider than {WIDE_INTERVAL:g} (widest: {label}, "
            f"{advice.fmt_q(q)}): differences between encoders smaller than that cannot be told apart here."
        )
    fracs = sorted(set(mine["fraction"]))
    caption = (
        f"Macro-F1 (mean over seeds) of the {', '.join(sorted(set(mine['head'])))} probe at label fraction "
        f"{', '.join(f'{f:g}' for f in fracs)}, in-domain on each source and on each target, with the "
        "encoder's rank among the study's encoders there, and the study's rank-transfer ρ for the pair; "
        "intervals: 95% cluster bootstrap of the unit named with each value."
    )
    columns = [
        ("in_domain", "in-domain"),
        ("target", "target"),
        ("rank_in_domain", "rank in-domain"),
        ("rank_target", "rank on target"),
        ("rho", "rank transfer ρ (study)"),
    ]
    return _section(caption, columns, rows, {"pairs": pairs, "rank_transfer": transfers}, "accuracy", limits)


def _ctx(task: str, head: str, frac: float, source: str, target: str) -> dict[str, Any]:
    return {
        "task": str(task),
        "head": str(head),
        "fraction": float(frac),
        "source_domain": str(source),
        "target_domain": str(target),
    }


# ------------------------------------------------------------------------------------------------- calibration
def _ece_col(df: pd.DataFrame) -> str | None:
    cols = [c for c in df.columns if str(c).startswith("ece_top_") and df[c].notna().any()]
    return cols[0] if cols else None


def calibration_section(encoder: str, probe: Mapping[str, Any] | None) -> dict[str, Any]:
    cal = _table(probe, "calibration")
    if not _has(cal, "encoder", "stage", "in_domain"):
        return _unavailable("no calibration ladder in this study")
    ece_col = _ece_col(cal)
    off = cal[(cal["encoder"] == encoder) & ~cal["in_domain"].astype(bool)]
    if ece_col is None or not len(off):
        return _unavailable("no off-domain calibration rows for this encoder (a single-domain task)")
    board = _table(probe, "leaderboard")
    raw_ci = {}
    if _has(board, "ece_ci_lo", "ece_ci_hi", ece_col):
        for r in board[board["encoder"] == encoder].to_dict("records"):
            raw_ci[(r["task"], r["head"], r["fraction"], r["source_domain"], r["target_domain"])] = r
    bins = ece_col.split("_")[2]
    measure = f"top-label ECE ({bins} equal-width bins)"
    rows, targets, limits, bounds = [], [], [], []
    ks: set[int] = set()
    for (task, head, frac, source, target), cell in off.groupby(
        ["task", "head", "fraction", "source_domain", "target_domain"], sort=True
    ):
        by_stage = {}
        kshot = {}
        at_bound = 0
        n_temps = 0
        for r in cell.to_dict("records"):
            v = _num(r.get(ece_col))
            at_bound += int(_num(r.get("n_at_bound")) or 0)
            n_temps += int(_num(r.get("n_temperatures")) or 0)
            if r["stage"] == "kshot_ts" and _num(r.get("k")) is not None:
                kshot[int(r["k"])] = v
                ks.add(int(r["k"]))
            else:
                by_stage[r["stage"]] = v
        raw_row = raw_ci.get((task, head, frac, source, target))
        raw = by_stage.get("raw")
        # the leaderboard's raw ECE is the same seed mean, with its cluster-bootstrap interval
        same = bool(
            raw_row
            and raw is not None
            and _num(raw_row.get(ece_col)) is not None
            and np.isclose(raw_row[ece_col], raw, rtol=1e-6, atol=1e-9)
        )
        bound_note = "temperature at a search bound: left out of the mean" if at_bound else "no value"
        values = {
            "raw": quantity(
                raw,
                raw_row["ece_ci_lo"] if same else None,
                raw_row["ece_ci_hi"] if same else None,
                measure=measure,
                unit=raw_row.get("ci_unit") if same else None,
                n_units=raw_row.get("ci_n_units") if same else None,
            )
        }
        for stage in ("source_ts", "oracle_ts"):
            v = by_stage.get(stage)
            values[stage] = quantity(v, measure=measure, note=None if v is not None else bound_note)
        for k, v in sorted(kshot.items()):
            values[f"kshot_{k}"] = quantity(v, measure=measure, note=None if v is not None else bound_note)
        oracle = by_stage.get("oracle_ts")
        smallest = next(
            (k for k, v in sorted(kshot.items()) if v is not None and oracle is not None and v - oracle <= ECE_MARGIN),
            None,
        )
        values["smallest_k"] = quantity(
            smallest,
            measure=f"smallest K with K-shot ECE within {ECE_MARGIN:g} of the oracle",
            kind="integer",
            note=None if smallest is not None else "no K within the margin",
        )
        if at_bound:
            bounds.append(f"{source} → {target}: {at_bound} of {n_temps}")
        targets.append(
            {
                "task": task,
                "source_domain": source,
                "target_domain": target,
                "raw": by_stage.get("raw"),
                "source_ts": by_stage.get("source_ts"),
                "oracle_ts": oracle,
                "kshot": kshot,
                "smallest_k": smallest,
            }
        )
        rows.append(
            {"label": f"{source} → {target}", "context": _ctx(task, head, frac, source, target), "values": values}
        )
    if bounds:
        limits.append(
            f"Fitted temperatures at a search bound ({'; '.join(bounds)}): {board_rule(cal)}; a cell with none "
            "left says so."
        )
    limits.append(
        "The ladder's ECEs (but raw's) are means over seeds and draws without intervals: the margin rules "
        "compare point estimates."
    )
    fix = recommended_fix(targets)
    caption = (
        f"Off-domain {measure} of the probe at the largest label fraction: raw, after the source-validation "
        "temperature (source_ts), after a temperature fitted on the evaluated target itself (oracle_ts, not "
        "deployable: the bound) and after a temperature fitted on K labelled target images (kshot_K, mean "
        f"over draws); smallest_k: the fewest labelled target images within {ECE_MARGIN:g} of the oracle. "
        f"Recommended fix: {fix['name']}."
    )
    columns = (
        [("raw", "raw"), ("source_ts", "source TS"), ("oracle_ts", "oracle TS")]
        + [(f"kshot_{k}", f"K={k}") for k in sorted(ks)]
        + [("smallest_k", "smallest K")]
    )
    out = _section(caption, columns, rows, {"targets": targets}, "calibration", limits)
    out["recommended_fix"] = fix
    return out


def board_rule(cal: pd.DataFrame) -> str:
    """How the ladder treats temperatures at a bound, as its table says (``bound_temperatures``)."""
    return (
        str(cal["bound_temperatures"].iloc[0])
        if "bound_temperatures" in cal.columns and len(cal)
        else "as the calibration table says"
    )


def recommended_fix(targets: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The calibration a user should apply on a new scanner, from the off-domain ladder: the source temperature
    when it is within the margin of the oracle on every target; else the smallest K whose K-shot temperature
    is within the margin on every target; else the deployable stage with the lowest worst-target ECE. With
    the worst target's ECE after it."""
    if not targets:
        return {"name": "none (no off-domain rows)", "stage": None, "k": None, "worst_ece": None}

    def worst(values: list) -> float | None:
        vals = [v for v in values if v is not None]
        return max(vals) if len(vals) == len(values) and vals else None

    oracle = [t.get("oracle_ts") for t in targets]
    src = [t.get("source_ts") for t in targets]
    if all(s is not None and o is not None and s - o <= ECE_MARGIN for s, o in zip(src, oracle)):
        return {
            "name": "source temperature (no target labels)",
            "stage": "source_ts",
            "k": None,
            "worst_ece": worst(src),
        }
    ks = sorted(set.intersection(*[set(t.get("kshot") or {}) for t in targets])) if targets else []
    for k in ks:
        vals = [t["kshot"][k] for t in targets]
        if all(v is not None and o is not None and v - o <= ECE_MARGIN for v, o in zip(vals, oracle)):
            return {
                "name": f"K-shot temperature on {k} labelled target images",
                "stage": "kshot_ts",
                "k": k,
                "worst_ece": worst(vals),
            }
    options = [("raw", None, [t.get("raw") for t in targets]), ("source_ts", None, src)]
    options += [("kshot_ts", k, [t["kshot"][k] for t in targets]) for k in ks]
    scored = [(worst(v), stage, k) for stage, k, v in options if worst(v) is not None]
    if not scored:
        return {"name": "none (no complete stage)", "stage": None, "k": None, "worst_ece": None}
    best, stage, k = min(scored, key=lambda s: s[0])
    name = {"raw": "none (raw is best)", "source_ts": "source temperature"}.get(stage, f"K-shot temperature, K={k}")
    return {"name": f"{name}; none within {ECE_MARGIN:g} of the oracle", "stage": stage, "k": k, "worst_ece": best}


# -------------------------------------------------------------------------------------------------- abstention
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


# ------------------------------------------------------------------------------------------------- prior shift
def prior_shift_section(
    encoder: str, gains: pd.DataFrame | None, priors: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None
) -> dict[str, Any]:
    """``gains``: per-encoder gains (rows ``encoder, task, source_domain, method, prior, mean, ci_lo, ci_hi,
    unit, n_units``), ``priors``: task -> prior -> class shares (the largest share is quoted)."""
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


# ------------------------------------------------------------------------------------------------------- cells
def cells_section(encoder: str, cells: Mapping[str, Any] | None, alpha: float = 0.05) -> dict[str, Any]:
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


# ---------------------------------------------------------------------------------------------------- exposure
def exposure_section(encoder: str, audit: pd.DataFrame | None) -> dict[str, Any]:
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


# -------------------------------------------------------------------------------------------------------- cost
def cost_section(encoder: str, cost: Mapping[str, Any] | None, inventory: pd.DataFrame | None) -> dict[str, Any]:
    jobs = (cost or {}).get("jobs")
    if not isinstance(jobs, pd.DataFrame) or not len(jobs):
        return _unavailable("no benchmark files were read (the workflow writes them for every heavy job)")
    mine = jobs[jobs["encoder"] == encoder]
    if not len(mine):
        return _unavailable("no benchmarked job of this encoder")
    rows = []
    for rule, part in mine.groupby("rule", sort=True):
        rows.append(
            {
                "label": str(rule),
                "context": {"rule": str(rule)},
                "values": {
                    "jobs": quantity(len(part), measure="jobs", kind="integer"),
                    "cpu_hours": quantity(part["cpu_hours"].sum(min_count=1), measure="CPU-hours", kind="amount"),
                    "gpu_hours": quantity(
                        part["gpu_hours"].sum(), measure="GPU-hours (wall time x GPUs requested)", kind="amount"
                    ),
                    "peak_rss_mb": quantity(part["max_rss_mb"].max(), measure="peak memory (MB)", kind="amount"),
                },
            }
        )
    rows.append(
        {
            "label": "total",
            "context": {"rule": "total"},
            "values": {
                "jobs": quantity(len(mine), measure="jobs", kind="integer"),
                "cpu_hours": quantity(mine["cpu_hours"].sum(min_count=1), measure="CPU-hours", kind="amount"),
                "gpu_hours": quantity(mine["gpu_hours"].sum(), measure="GPU-hours", kind="amount"),
                "peak_rss_mb": quantity(mine["max_rss_mb"].max(), measure="peak memory (MB)", kind="amount"),
            },
        }
    )
    speed = []
    if inventory is not None and _has(inventory, "encoder", "images_per_s"):
        for r in inventory[inventory["encoder"] == encoder].to_dict("records"):
            if _num(r.get("images_per_s")) is not None:
                speed.append(
                    {
                        "dataset": str(r["dataset"]),
                        "images_per_s": float(r["images_per_s"]),
                        "n_items": _int(r.get("n_items")),
                        "device": str(r.get("device") or ""),
                    }
                )
    job_facts = [
        {
            "job": j["job"],
            "device": j.get("device"),
            "device_mismatch": isinstance(j.get("device_mismatch"), (bool, np.bool_)) and bool(j["device_mismatch"]),
        }
        for j in mine.to_dict("records")
    ]
    caption = (
        "Snakemake benchmark files of this encoder's jobs: CPU-hours (the jobs' CPU time), GPU-hours (wall "
        "time x the GPUs each job requested) and peak resident memory, per rule. Embedding speed: images per "
        "second of the forward passes, as each embedding file records it."
    )
    columns = [("jobs", "jobs"), ("cpu_hours", "CPU-hours"), ("gpu_hours", "GPU-hours"), ("peak_rss_mb", "peak MB")]
    out = _section(caption, columns, rows, {"jobs": job_facts}, "cost", [])
    out["embedding_speed"] = speed
    out["totals"] = {"cpu_hours": _num(mine["cpu_hours"].sum(min_count=1)), "gpu_hours": _num(mine["gpu_hours"].sum())}
    return out


# ------------------------------------------------------------------------------------------------------- cards
def card_encoders(results: Mapping[str, Any]) -> list[str]:
    """The encoders that get a card: every encoder of the analysis tables (probe, OOD, prior shift, cells), in the
    order they first appear; variants (kept out of every ranking) do not."""
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
    (``jobs``: :func:`fmaudit.costs.job_costs`), ``embeddings`` (the inventory)."""
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


# -------------------------------------------------------------------------------------------------- front page
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
    interval lies wholly on the worse side of the best encoder's interval."""
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

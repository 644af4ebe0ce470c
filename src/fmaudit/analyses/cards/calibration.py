"""The card's calibration section: the off-domain ECE ladder (raw, source, oracle and K-shot temperatures) and the
calibration it recommends on a new scanner (:func:`recommended_fix`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.analyses.advice import ECE_MARGIN
from fmaudit.analyses.cards.model import _ctx, _has, _num, _section, _table, _unavailable, quantity

__all__ = ["board_rule", "calibration_section", "recommended_fix"]


def _ece_col(df: pd.DataFrame) -> str | None:
    cols = [c for c in df.columns if str(c).startswith("ece_top_") and df[c].notna().any()]
    return cols[0] if cols else None


def calibration_section(encoder: str, probe: Mapping[str, Any] | None) -> dict[str, Any]:
    """The calibration section of ``encoder``'s card: the off-domain rungs of the calibration ladder
    (docs/methods.md#the-calibration-ladder) per source → target pair, the smallest K whose K-shot temperature
    comes within :data:`~fmaudit.analyses.advice.ECE_MARGIN` of the oracle, and the fix it recommends.

    Parameters
    ----------
    encoder : str
        The encoder the card is for, as the tables' ``encoder`` column names it.
    probe : mapping of str to DataFrame, or None
        The probe chapter's result tables by name. Reads ``calibration`` (a row per encoder, task, head,
        fraction, source and target domain and ``stage``: ``raw``, ``source_ts``, ``oracle_ts`` or ``kshot_ts``
        with its ``k``; ``in_domain``; the first ``ece_top_<bins>_lohi`` column with values; ``n_at_bound`` and
        ``n_temperatures``) and the ``leaderboard``'s ``ece_ci_lo``, ``ece_ci_hi``, whose interval the raw ECE
        takes where the two tables' raw ECE agree. Tables with a ``note`` column count as absent.

    Returns
    -------
    dict
        A card section (``available``, ``reason``, ``caption``, ``columns``, ``rows``, ``advice``, ``limits``):
        a row per off-domain pair with the quantities ``raw``, ``source_ts``, ``oracle_ts``, ``kshot_<K>`` for
        every K and ``smallest_k``; and ``recommended_fix`` (:func:`recommended_fix` over the pairs).
        Unavailable, with its ``reason``, without a ladder or without off-domain rows of this encoder.
    """
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
    """How the ladder treats temperatures at a bound, as its table says (``bound_temperatures``).

    Parameters
    ----------
    cal : DataFrame
        The probe chapter's ``calibration`` table.

    Returns
    -------
    str
        The first row's ``bound_temperatures`` text, or ``"as the calibration table says"`` when the table has
        no such column or no rows.
    """
    return (
        str(cal["bound_temperatures"].iloc[0])
        if "bound_temperatures" in cal.columns and len(cal)
        else "as the calibration table says"
    )


def recommended_fix(targets: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The calibration a user should apply on a new scanner, from the off-domain ladder: the source temperature
    when it is within the margin of the oracle on every target; else the smallest K whose K-shot temperature
    is within the margin on every target; else the deployable stage with the lowest worst-target ECE. With
    the worst target's ECE after it.

    Parameters
    ----------
    targets : sequence of mapping
        One per off-domain pair, as :func:`calibration_section` gathers them: ``raw``, ``source_ts`` and
        ``oracle_ts`` (top-label ECE, None where missing) and ``kshot`` (K -> mean K-shot ECE or None).

    Returns
    -------
    dict
        ``name`` (the fix in words, as the card prints it), ``stage`` (``"source_ts"``, ``"kshot_ts"``,
        ``"raw"``, or None without a complete stage), ``k`` (the K of a K-shot fix, else None) and
        ``worst_ece`` (the largest ECE over the targets after the fix; None where a target lacks it).
    """
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

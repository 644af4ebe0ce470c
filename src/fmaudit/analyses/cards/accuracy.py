"""The card's accuracy section: macro-F1 in-domain and on each target, the encoder's rank there, the study's
rank-transfer ρ, and the encoders that overtake it off-domain (paired differences)."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fmaudit.analyses import advice
from fmaudit.analyses.advice import MIN_RANK_ENCODERS, WIDE_INTERVAL
from fmaudit.analyses.cards.model import (
    _col,
    _ctx,
    _few_units,
    _has,
    _int,
    _num,
    _section,
    _table,
    _unavailable,
    quantity,
)

__all__ = ["accuracy_section"]


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
    """The accuracy section of ``encoder``'s card: per task, head, label fraction and source domain, its macro-F1
    in-domain and on each target domain, its rank among the study's encoders on both, the study's rank-transfer ρ
    of the pair (docs/methods.md#rank-transfer-and-meta-analysis), and the encoders it led in-domain that overtake
    it on the target, with their paired difference.

    Parameters
    ----------
    encoder : str
        The encoder the card is for, as the tables' ``encoder`` column names it.
    probe : mapping of str to DataFrame, or None
        The probe chapter's result tables by name. Reads ``leaderboard`` (a row per encoder, task, head,
        fraction, source and target domain: ``macro_f1`` with ``macro_f1_ci_lo``, ``macro_f1_ci_hi``,
        ``ci_unit``, ``ci_n_units``, ``ci_convention``; ``rank_macro_f1`` is computed when absent),
        ``rank_transfer`` (``spearman_rho`` with its interval, per pair) and ``paired_differences`` (macro-F1
        ``difference``, ``ci_lo``, ``ci_hi`` of each encoder against the ``reference`` encoder). A table that is
        missing or has a ``note`` column (the analysis did not run) counts as absent.

    Returns
    -------
    dict
        A card section: ``available``, ``reason``, ``caption``, ``columns`` (``key``, ``label``), ``rows`` (one
        per source → target pair, or per source of a one-domain task: ``label``, ``context`` with ``task``,
        ``head``, ``fraction``, ``source_domain``, ``target_domain``, and ``values``: the quantities
        ``in_domain``, ``target``, ``rank_in_domain``, ``rank_target`` and ``rho``), ``advice`` (the accuracy
        rules' sentences) and ``limits``. Unavailable, with its ``reason``, without a leaderboard or without
        rows of this encoder.
    """
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

"""The advice rules of the reliability cards: each turns numbers of a card's section into sentences, by an explicit
condition on those numbers, never free text.

A rule is a :class:`Rule`: an id (``<section>.<name>``), the condition it tests in words (printed in every card's
JSON and in the docs), and ``fire(facts) -> [Advice]``, where ``facts`` are the section's numbers as
:mod:`fmaudit.analyses.cards` gathers them from the result tables. A sentence quotes the numbers it rests on,
with their intervals. A rule whose numbers cannot carry it (fewer than :data:`MIN_UNITS` resampling units, an
interval that is missing) stays silent and the section says why in its ``limits`` instead
(:mod:`fmaudit.analyses.cards`), so a card never states what its numbers do not support.

Thresholds are constants here, stated in each card (``thresholds`` of its JSON): the ECE margin within which a
calibration counts as "as good as the oracle", the share of an OOD tier a gate must reject, the fewest
resampling units an interval may rest on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "Advice",
    "ECE_MARGIN",
    "GATE_MIN_REJECTION",
    "MIN_RANK_ENCODERS",
    "MIN_UNITS",
    "RULES",
    "Rule",
    "THRESHOLDS",
    "WIDE_INTERVAL",
    "fire_rules",
    "fmt",
    "fmt_q",
    "rules_of",
    "supports_advice",
]

#: A calibration whose top-label ECE is at most this far above the oracle temperature's counts as recalibrated.
ECE_MARGIN = 0.02
#: An OOD tier of which the gate rejects less than this share (upper interval bound below it) is "let through".
GATE_MIN_REJECTION = 0.5
#: An OOD tier rejected at least this share (lower interval bound) is "caught".
GATE_CAUGHT = 0.9
#: Intervals from fewer resampling units than this carry no advice (the report lint flags them too).
MIN_UNITS = 5
#: A rank-transfer ρ over fewer encoders than this is not read as evidence either way.
MIN_RANK_ENCODERS = 5
#: A macro-F1 interval wider than this says the card's comparisons are coarse (stated under its limits).
WIDE_INTERVAL = 0.25
#: Every threshold, as the card states them.
THRESHOLDS = {
    "ece_margin": ECE_MARGIN,
    "gate_min_rejection": GATE_MIN_REJECTION,
    "gate_caught": GATE_CAUGHT,
    "min_resampling_units": MIN_UNITS,
    "min_rank_encoders": MIN_RANK_ENCODERS,
    "wide_interval": WIDE_INTERVAL,
    "alpha": 0.05,
}


@dataclass(frozen=True)
class Advice:
    """One sentence of a card, the rule that chose it, and the numbers it rests on.

    Attributes
    ----------
    rule : str
        The id of the rule that chose it (``<section>.<name>``).
    text : str
        The sentence, quoting its numbers with their intervals.
    evidence : mapping
        The numbers it rests on (quantities, pair names, thresholds), as the card's JSON records them.
    """

    rule: str
    text: str
    evidence: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The advice as the card's JSON holds it.

        Returns
        -------
        dict
            ``rule``, ``text`` and ``evidence`` (a plain dict).
        """
        return {"rule": self.rule, "text": self.text, "evidence": dict(self.evidence)}


@dataclass(frozen=True)
class Rule:
    """An advice rule of the cards: an explicit condition on a section's numbers and the sentences it then says.

    Attributes
    ----------
    id : str
        ``<section>.<name>``, the section being a key of :data:`fmaudit.analyses.cards.CARD_SECTIONS`.
    when : str
        The condition in words, printed in every card's JSON (``rules``) and in the docs.
    fire : callable
        ``fire(facts) -> list of Advice``: the sentences for a section's facts (the mapping its builder in
        :mod:`fmaudit.analyses.cards` gathers), an empty list when the condition does not hold or its numbers
        cannot carry it.
    """

    id: str
    when: str
    fire: Callable[[Mapping[str, Any]], list[Advice]]

    @property
    def section(self) -> str:
        """The card section the rule belongs to: its id up to the first dot."""
        return self.id.split(".")[0]


def fmt(x: Any, digits: int = 3) -> str:
    """A number as the cards print it (``n/a`` for a missing one; integers without decimals).

    Parameters
    ----------
    x : float, int or None
        The number; None, NaN and infinities print as ``n/a``.
    digits : int
        Decimals of a non-integer number; default 3.

    Returns
    -------
    str
        ``"0.812"``, ``"12"`` or ``"n/a"``.
    """
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "n/a"
    if isinstance(x, (int, np.integer)):
        return f"{int(x)}"
    return f"{float(x):.{digits}f}"


def fmt_q(q: Mapping[str, Any] | None, digits: int = 3, signed: bool = False) -> str:
    """A quantity (:func:`fmaudit.analyses.cards.quantity`) as ``0.812 [0.790, 0.833]``, without brackets when
    it has no interval.

    Parameters
    ----------
    q : mapping or None
        A quantity (``point``, ``ci_lo``, ``ci_hi``); None or a missing ``point`` prints as ``n/a``.
    digits : int
        Decimals of the point and the bounds; default 3.
    signed : bool
        Print a ``+`` before positive numbers (gains, differences).

    Returns
    -------
    str
        ``"0.812 [0.790, 0.833]"``, the point alone when either bound is missing, or ``"n/a"``.
    """
    if not q or q.get("point") is None:
        return "n/a"
    sign = "+" if signed else ""
    point = f"{q['point']:{sign}.{digits}f}"
    if q.get("ci_lo") is None or q.get("ci_hi") is None:
        return point
    return f"{point} [{q['ci_lo']:{sign}.{digits}f}, {q['ci_hi']:{sign}.{digits}f}]"


def _units(q: Mapping[str, Any]) -> str:
    unit, n = q.get("resampling_unit"), q.get("n_units")
    return f"{unit}, n={n}" if unit and n is not None else (str(unit) if unit else "no interval")


def supports_advice(q: Mapping[str, Any] | None) -> bool:
    """An interval that can carry advice: defined, from at least :data:`MIN_UNITS` resampling units.

    Parameters
    ----------
    q : mapping or None
        A quantity (``ci_lo``, ``ci_hi``, ``n_units``); an interval whose ``n_units`` is None (not counted)
        is taken as it is.

    Returns
    -------
    bool
        True when both bounds are set and ``n_units`` is None or at least :data:`MIN_UNITS`.
    """
    return bool(
        q
        and q.get("ci_lo") is not None
        and q.get("ci_hi") is not None
        and (q.get("n_units") is None or int(q["n_units"]) >= MIN_UNITS)
    )


def _pair(r: Mapping[str, Any]) -> str:
    return f"{r['source_domain']} → {r['target_domain']}"


def _listing(items: Sequence[str], limit: int = 6) -> str:
    """``a; b; c`` (at most ``limit``, then ``and N more``)."""
    shown = list(items[:limit])
    return "; ".join(shown) + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def _pairs_of(f: Mapping[str, Any], key: str = "pairs") -> list[Mapping[str, Any]]:
    return [r for r in f.get(key, []) if r["target_domain"] != r["source_domain"]]


# ---------------------------------------------------------------------------------------------------- accuracy
def _off_domain_drop(f: Mapping[str, Any]) -> list[Advice]:
    pairs = _pairs_of(f)
    hits = [
        r
        for r in pairs
        if supports_advice(r["in_domain"])
        and supports_advice(r["target"])
        and r["target"]["ci_hi"] < r["in_domain"]["ci_lo"]
    ]
    if not hits:
        return []
    items = [f"{_pair(r)}: {fmt_q(r['in_domain'])} → {fmt_q(r['target'])}" for r in hits]
    return [
        Advice(
            "accuracy.off_domain_drop",
            f"Macro-F1 falls off-domain, with intervals that do not overlap, on {len(hits)} of {len(pairs)} "
            f"transfer pairs (in-domain → target; {_units(hits[0]['target'])}): {_listing(items)}. Measure "
            "it on images of your own scanner before deploying.",
            {"pairs": [_pair(r) for r in hits]},
        )
    ]


def _rank_drop(f: Mapping[str, Any]) -> list[Advice]:
    out = []
    for r in _pairs_of(f):
        for o in r.get("overtaken_by", []):
            d = o["difference"]
            if supports_advice(d) and d["ci_lo"] > 0:
                out.append(
                    Advice(
                        "accuracy.rank_drop",
                        f"Ranks {r['rank_in_domain']} of {r['n_encoders']} in-domain ({r['source_domain']}) "
                        f"but {r['rank_target']} on {r['target_domain']}, where {o['encoder']} beats it by "
                        f"{fmt_q(d, signed=True)} macro-F1 (paired, {_units(d)}): do not choose it on "
                        "in-domain accuracy alone.",
                        {
                            "task": r["task"],
                            "source_domain": r["source_domain"],
                            "target_domain": r["target_domain"],
                            "overtaken_by": o["encoder"],
                            "difference": fmt_q(d, signed=True),
                        },
                    )
                )
                break
    return out


def _rank_transfer_poor(f: Mapping[str, Any]) -> list[Advice]:
    hits = [
        r
        for r in f.get("rank_transfer", [])
        if r["n_encoders"] >= MIN_RANK_ENCODERS and r["rho"].get("ci_hi") is not None and r["rho"]["ci_hi"] < 0.5
    ]
    if not hits:
        return []
    items = [f"{_pair(r)}: ρ {fmt_q(r['rho'])}" for r in hits]
    return [
        Advice(
            "accuracy.rank_transfer_poor",
            f"Across the study's {hits[0]['n_encoders']} encoders, the in-domain ranking does not predict the "
            f"ranking on the target ({_listing(items)}): pick the encoder on labelled images of the target "
            "scanner, not of the source.",
            {"pairs": [_pair(r) for r in hits]},
        )
    ]


# ------------------------------------------------------------------------------------------------- calibration
def _ladder(f: Mapping[str, Any], test) -> list[Mapping[str, Any]]:
    return [r for r in f.get("targets", []) if test(r)]


def _does_transfer(r: Mapping[str, Any]) -> bool | None:
    src, oracle = r.get("source_ts"), r.get("oracle_ts")
    return None if src is None or oracle is None else src - oracle <= ECE_MARGIN


def _worsens(f: Mapping[str, Any]) -> list[Advice]:
    hits = _ladder(
        f,
        lambda r: (
            r.get("raw") is not None and r.get("source_ts") is not None and r["source_ts"] - r["raw"] > ECE_MARGIN
        ),
    )
    if not hits:
        return []
    items = [f"{_pair(r)}: {fmt(r['raw'])} raw, {fmt(r['source_ts'])} after it" for r in hits]
    return [
        Advice(
            "calibration.source_temperature_worsens",
            f"The source temperature makes off-domain calibration worse, by more than {ECE_MARGIN:g} top-label ECE, on "
            f"{len(hits)} of "
            f"{len(f.get('targets', []))} transfer pairs (top-label ECE: {_listing(items)}): do not carry "
            "a source temperature to these scanners.",
            {"pairs": [_pair(r) for r in hits]},
        )
    ]


def _does_not_transfer(f: Mapping[str, Any]) -> list[Advice]:
    hits = _ladder(f, lambda r: _does_transfer(r) is False)
    if not hits:
        return []
    items = [f"{_pair(r)}: {fmt(r['source_ts'])} vs {fmt(r['oracle_ts'])}" for r in hits]
    return [
        Advice(
            "calibration.temperature_does_not_transfer",
            f"A temperature fitted on the source leaves top-label ECE more than {ECE_MARGIN:g} above the oracle "
            f"temperature's on {len(hits)} of {len(f.get('targets', []))} transfer pairs (source temperature vs "
            f"oracle: {_listing(items)}): recalibrate on each target scanner.",
            {"pairs": [_pair(r) for r in hits]},
        )
    ]


def _source_suffices(f: Mapping[str, Any]) -> list[Advice]:
    hits = _ladder(f, lambda r: _does_transfer(r) is True)
    if not hits:
        return []
    items = [f"{_pair(r)}: {fmt(r['source_ts'])} vs {fmt(r['oracle_ts'])}" for r in hits]
    return [
        Advice(
            "calibration.source_temperature_suffices",
            f"The source temperature transfers, within {ECE_MARGIN:g} of the oracle's top-label ECE, on "
            f"{len(hits)} of {len(f.get('targets', []))} transfer pairs ({_listing(items)}): no target labels "
            "are needed for calibration there.",
            {"pairs": [_pair(r) for r in hits]},
        )
    ]


def _kshot_enough(f: Mapping[str, Any]) -> list[Advice]:
    hits = _ladder(
        f,
        lambda r: _does_transfer(r) is not True and r.get("oracle_ts") is not None and r.get("smallest_k") is not None,
    )
    if not hits:
        return []
    items = [
        f"{_pair(r)}: K={r['smallest_k']}, ECE {fmt(r['kshot'][r['smallest_k']])} vs oracle {fmt(r['oracle_ts'])}"
        for r in hits
    ]
    return [
        Advice(
            "calibration.kshot_enough",
            f"Label a few target images and fit the temperature on them: the smallest K within {ECE_MARGIN:g} of "
            f"the oracle's ECE is {_listing(items)}.",
            {"pairs": [_pair(r) for r in hits], "k": [r["smallest_k"] for r in hits]},
        )
    ]


def _kshot_insufficient(f: Mapping[str, Any]) -> list[Advice]:
    hits = _ladder(
        f,
        lambda r: (
            _does_transfer(r) is not True
            and r.get("oracle_ts") is not None
            and bool(r.get("kshot"))
            and r.get("smallest_k") is None
        ),
    )
    if not hits:
        return []
    k = max(max(r["kshot"]) for r in hits)
    items = [f"{_pair(r)}: {fmt(r['kshot'][max(r['kshot'])])} vs oracle {fmt(r['oracle_ts'])}" for r in hits]
    return [
        Advice(
            "calibration.kshot_insufficient",
            f"Even {k} labelled target images leave top-label ECE more than {ECE_MARGIN:g} above the oracle's on "
            f"{len(hits)} transfer pairs ({_listing(items)}): label more target images before trusting the "
            "confidences there.",
            {"pairs": [_pair(r) for r in hits], "k": k},
        )
    ]


# -------------------------------------------------------------------------------------------------- abstention
def _ood_sets(f: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        r for r in f.get("sets", []) if r["tier"] not in ("id", "in-distribution") and supports_advice(r["rejected"])
    ]


def _let_through(f: Mapping[str, Any]) -> list[Advice]:
    hits = [r for r in _ood_sets(f) if r["rejected"]["ci_hi"] < GATE_MIN_REJECTION]
    if not hits:
        return []
    items = [f"{r['tier']} ({r['set']}): rejects {fmt_q(r['rejected'])}" for r in hits]
    return [
        Advice(
            "abstention.tier_let_through",
            f"The gate lets most images of {len(hits)} OOD set(s) through ({_listing(items)}; "
            f"{_units(hits[0]['rejected'])}): screen for {', '.join(dict.fromkeys(r['tier'] for r in hits))} "
            "inputs before the model, or do not rely on the gate for them.",
            {"sets": [r["set"] for r in hits]},
        )
    ]


def _caught(f: Mapping[str, Any]) -> list[Advice]:
    hits = [r for r in _ood_sets(f) if r["rejected"]["ci_lo"] >= GATE_CAUGHT]
    if not hits:
        return []
    items = [f"{r['tier']} ({r['set']}): {fmt_q(r['rejected'])}" for r in hits]
    return [
        Advice(
            "abstention.tier_caught",
            f"The gate rejects these OOD sets reliably: {_listing(items)}.",
            {"sets": [r["set"] for r in hits]},
        )
    ]


def _below_chance(f: Mapping[str, Any]) -> list[Advice]:
    out = []
    hits = [r for r in f.get("detection", []) if supports_advice(r["auroc"]) and r["auroc"]["ci_hi"] < 0.5]
    for scorer in dict.fromkeys(r["scorer"] for r in hits):
        mine = [r for r in hits if r["scorer"] == scorer]
        items = [f"{r['condition']} ({r['tier']}): {fmt_q(r['auroc'])}" for r in mine]
        out.append(
            Advice(
                "abstention.scorer_below_chance",
                f"The {scorer} score ranks these OOD sets as more familiar than the in-distribution test "
                f"set (detection AUROC below 0.5 with its interval: {_listing(items)}): do not use {scorer} "
                "to detect those shifts.",
                {"scorer": scorer, "conditions": [r["condition"] for r in mine]},
            )
        )
    return out


# ------------------------------------------------------------------------------------------------- prior shift
def _harmful(f: Mapping[str, Any]) -> list[Advice]:
    out = []
    hits = [r for r in f.get("gains", []) if r["deployable"] and supports_advice(r["gain"]) and r["gain"]["ci_hi"] < 0]
    for method in dict.fromkeys(r["method"] for r in hits):
        mine = [r for r in hits if r["method"] == method]
        items = [
            f"{r['prior']}"
            + (f" (largest class {r['largest_share']:.0%})" if r.get("largest_share") else "")
            + f": {fmt_q(r['gain'], signed=True)}"
            for r in mine
        ]
        out.append(
            Advice(
                "prior_shift.harmful_under_prior",
                f"{method} lowers macro-F1 under {len(mine)} prior(s) ({_listing(items)}; {mine[0]['unit']}): "
                "do not use it where the class mix may look like that.",
                {"method": method, "priors": [r["prior"] for r in mine]},
            )
        )
    return out


def _helps_everywhere(f: Mapping[str, Any]) -> list[Advice]:
    out = []
    frame = pd.DataFrame(f.get("gains", []))
    if not len(frame):
        return out
    for (task, source, method), part in frame.groupby(["task", "source_domain", "method"], sort=False):
        if not part["deployable"].iloc[0] or part["prior"].nunique() < 2:
            continue
        if all(supports_advice(g) and g["ci_lo"] > 0 for g in part["gain"]):
            lows = [g["ci_lo"] for g in part["gain"]]
            worst = part.iloc[int(np.argmin(lows))]
            out.append(
                Advice(
                    "prior_shift.helps_under_every_prior",
                    f"{method} raises macro-F1 under every prior tested ({part['prior'].nunique()} priors; "
                    f"smallest gain {fmt_q(worst['gain'], signed=True)} under {worst['prior']}): a safe "
                    "label-free adaptation here.",
                    {"task": task, "source_domain": source, "method": method, "n_priors": int(part["prior"].nunique())},
                )
            )
    return out


# ------------------------------------------------------------------------------------------------------- cells
def _nuc_beats_mean(f: Mapping[str, Any]) -> list[Advice]:
    out = []
    for r in f.get("cra", []):
        if r.get("wilcoxon_possible") and r.get("nuc_beats_mean"):
            out.append(
                Advice(
                    "cells.nuc_beats_mean",
                    f"Read cells at the nucleus ({r['taxonomy']} taxonomy, {r['magnification']:g}x): Nuc "
                    f"beats Mean by {r['cra_mean_pp']:+.1f} pp macro-F1 (SD {fmt(r['cra_sd_pp'], 1)}, paired "
                    f"Wilcoxon p = {fmt(r['p'])} over {r['n_sections']} (section, seed) runs).",
                    {
                        "taxonomy": r["taxonomy"],
                        "magnification": r["magnification"],
                        "cra_mean_pp": r["cra_mean_pp"],
                        "p": r["p"],
                        "n_sections": r["n_sections"],
                    },
                )
            )
    return out


def _mean_not_beaten(f: Mapping[str, Any]) -> list[Advice]:
    out = []
    for r in f.get("cra", []):
        if r.get("wilcoxon_possible") and not r.get("nuc_beats_mean") and r.get("p") is not None and r["p"] >= 0.05:
            out.append(
                Advice(
                    "cells.nuc_not_better",
                    f"Nuc does not beat Mean ({r['taxonomy']} taxonomy, {r['magnification']:g}x): "
                    f"{r['cra_mean_pp']:+.1f} pp, Wilcoxon p = {fmt(r['p'])} over {r['n_sections']} runs; "
                    "a patch-mean readout is as good here.",
                    {"taxonomy": r["taxonomy"], "magnification": r["magnification"], "p": r["p"]},
                )
            )
    return out


# ---------------------------------------------------------------------------------------------------- exposure
def _exposed(f: Mapping[str, Any]) -> list[Advice]:
    seen = [d for d, status in f.get("datasets", {}).items() if status == "yes"]
    if not seen:
        return []
    return [
        Advice(
            "exposure.pretrained_on_evaluated",
            f"Its pretraining data include {', '.join(seen)}: its numbers there may be optimistic; judge it on "
            "data it has not seen.",
            {"datasets": seen},
        )
    ]


def _unknown(f: Mapping[str, Any]) -> list[Advice]:
    unknown = [d for d, status in f.get("datasets", {}).items() if status == "unknown"]
    if not unknown:
        return []
    return [
        Advice(
            "exposure.unknown",
            f"Whether its pretraining saw {', '.join(unknown)} is unknown (its corpora do not say): state that "
            "when you report its numbers.",
            {"datasets": unknown},
        )
    ]


# -------------------------------------------------------------------------------------------------------- cost
def _device_mismatch(f: Mapping[str, Any]) -> list[Advice]:
    jobs = [j for j in f.get("jobs", []) if j.get("device_mismatch") is True]
    if not jobs:
        return []
    return [
        Advice(
            "cost.device_mismatch",
            f"{len(jobs)} of its jobs requested a GPU but ran on the CPU (device in the embedding provenance: "
            f"{', '.join(sorted({str(j['device']) for j in jobs}))}): its GPU-hours were charged, not used; check "
            "the cluster's GPU setup.",
            {"jobs": [j["job"] for j in jobs]},
        )
    ]


#: Every rule, by section in card order.
RULES: tuple[Rule, ...] = (
    Rule(
        "accuracy.off_domain_drop",
        "a target's macro-F1 interval lies wholly below the in-domain interval "
        f"(both from at least {MIN_UNITS} resampling units)",
        _off_domain_drop,
    ),
    Rule(
        "accuracy.rank_drop",
        "the encoder ranks lower on a target than in-domain, and an encoder it led in-domain "
        "beats it there with a paired-difference interval above zero",
        _rank_drop,
    ),
    Rule(
        "accuracy.rank_transfer_poor",
        f"over at least {MIN_RANK_ENCODERS} encoders, the upper bound of the "
        "rank-transfer Spearman ρ interval is below 0.5",
        _rank_transfer_poor,
    ),
    Rule(
        "calibration.source_temperature_worsens",
        f"off-domain top-label ECE after the source temperature is more than {ECE_MARGIN:g} above the raw ECE",
        _worsens,
    ),
    Rule(
        "calibration.temperature_does_not_transfer",
        f"off-domain ECE after the source temperature is more than {ECE_MARGIN:g} above the oracle temperature's",
        _does_not_transfer,
    ),
    Rule(
        "calibration.source_temperature_suffices",
        f"off-domain ECE after the source temperature is within {ECE_MARGIN:g} of the oracle temperature's",
        _source_suffices,
    ),
    Rule(
        "calibration.kshot_enough",
        "the source temperature does not transfer, and some K-shot target temperature "
        f"brings ECE within {ECE_MARGIN:g} of the oracle's (the smallest such K is named)",
        _kshot_enough,
    ),
    Rule(
        "calibration.kshot_insufficient",
        "the source temperature does not transfer, and no K-shot temperature "
        f"brings ECE within {ECE_MARGIN:g} of the oracle's",
        _kshot_insufficient,
    ),
    Rule(
        "abstention.tier_let_through",
        f"the upper bound of the share of an OOD set the gate rejects is below {GATE_MIN_REJECTION:g}",
        _let_through,
    ),
    Rule(
        "abstention.tier_caught",
        f"the lower bound of the share of an OOD set the gate rejects is at least {GATE_CAUGHT:g}",
        _caught,
    ),
    Rule(
        "abstention.scorer_below_chance",
        "a novelty scorer's detection AUROC interval lies wholly below 0.5",
        _below_chance,
    ),
    Rule(
        "prior_shift.harmful_under_prior",
        "a deployable label-free method's gain interval under some prior lies wholly below zero",
        _harmful,
    ),
    Rule(
        "prior_shift.helps_under_every_prior",
        "a deployable method's gain interval lies wholly above zero under every prior of at least two",
        _helps_everywhere,
    ),
    Rule(
        "cells.nuc_beats_mean",
        "the paired Wilcoxon test of Nuc over Mean is significant (p < 0.05, positive "
        "median), with enough sections for the test to reach it",
        _nuc_beats_mean,
    ),
    Rule(
        "cells.nuc_not_better",
        "enough sections for a significant Wilcoxon test, and it is not significant",
        _mean_not_beaten,
    ),
    Rule("exposure.pretrained_on_evaluated", "the exposure audit says `yes` for an evaluated data set", _exposed),
    Rule("exposure.unknown", "the exposure audit says `unknown` for an evaluated data set", _unknown),
    Rule(
        "cost.device_mismatch",
        "a job requested a GPU but its embedding provenance records a CPU device",
        _device_mismatch,
    ),
)


def rules_of(section: str) -> list[Rule]:
    """The rules of one card section, in the order of :data:`RULES`.

    Parameters
    ----------
    section : str
        A card section's name (``"accuracy"``, ``"calibration"``, ...: the keys of
        :data:`fmaudit.analyses.cards.CARD_SECTIONS`).

    Returns
    -------
    list of Rule
        Empty for a section without rules.
    """
    return [r for r in RULES if r.section == section]


def fire_rules(section: str, facts: Mapping[str, Any], rules: Sequence[Rule] | None = None) -> list[dict[str, Any]]:
    """Every sentence the section's rules choose from ``facts``, as dicts (``rule``, ``text``, ``evidence``).

    Parameters
    ----------
    section : str
        The card section's name; its rules are :func:`rules_of` unless ``rules`` is given.
    facts : mapping
        The section's numbers as its builder in :mod:`fmaudit.analyses.cards` gathers them (e.g. ``pairs`` and
        ``rank_transfer`` for accuracy, ``targets`` for calibration).
    rules : sequence of Rule or None
        The rules to fire instead of the section's own; None (the default) for the section's.

    Returns
    -------
    list of dict
        One per sentence, rule by rule: ``rule``, ``text``, ``evidence``.
    """
    return [a.as_dict() for rule in (rules if rules is not None else rules_of(section)) for a in rule.fire(facts)]

"""Reliability cards from planted result tables: every advice rule fires on a table made to trigger it and stays
silent on one that does not; a card's sections say what their numbers cannot support."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest
from tests.cells.test_metrics import fixed_runs

from fmaudit.analyses import advice
from fmaudit.analyses.cards import (
    abstention_section,
    accuracy_section,
    build_cards,
    calibration_section,
    cells_section,
    cost_section,
    exposure_section,
    front_page,
    prior_shift_section,
    recommended_fix,
)
from fmaudit.cells.metrics import crt_table
from fmaudit.stats import wilcoxon_smallest_p

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "resources" / "schemas" / "card.schema.json").read_text())
ENCODERS = ["enc-a", "enc-b", "enc-c", "enc-d", "enc-e"]


def _rules(section) -> set[str]:
    return {a["rule"] for a in section["advice"]}


# ------------------------------------------------------------------------------------------ planted tables
def board(scores: dict[str, dict[str, tuple[float, float, float]]], n_units: int = 6) -> pd.DataFrame:
    """A leaderboard: encoder -> target -> (macro-F1, lo, hi), source domain ``a``."""
    rows = []
    for enc, targets in scores.items():
        for target, (f1, lo, hi) in targets.items():
            rows.append(
                {
                    "task": "t",
                    "head": "logistic",
                    "fraction": 1.0,
                    "source_domain": "a",
                    "target_domain": target,
                    "encoder": enc,
                    "in_domain": target == "a",
                    "macro_f1": f1,
                    "macro_f1_ci_lo": lo,
                    "macro_f1_ci_hi": hi,
                    "ci_unit": "patient",
                    "ci_n_units": n_units,
                    "ece_top_15_lohi": 0.1,
                    "ece_ci_lo": 0.05,
                    "ece_ci_hi": 0.15,
                    "extra_column": "tolerated",
                }
            )
    out = pd.DataFrame(rows)
    out["rank_macro_f1"] = (
        out.groupby(["task", "head", "fraction", "source_domain", "target_domain"])["macro_f1"]
        .rank(ascending=False, method="min")
        .astype(int)
    )
    return out


def paired(rows: list[tuple[str, str, str, float, float, float]], n_units: int = 6) -> pd.DataFrame:
    """Paired differences: (target, encoder, reference, difference, lo, hi)."""
    return pd.DataFrame(
        [
            {
                "task": "t",
                "head": "logistic",
                "fraction": 1.0,
                "source_domain": "a",
                "target_domain": t,
                "encoder": e,
                "reference": r,
                "metric": "macro_f1",
                "difference": d,
                "ci_lo": lo,
                "ci_hi": hi,
                "ci_unit": "patient",
                "ci_n_units": n_units,
            }
            for t, e, r, d, lo, hi in rows
        ]
    )


def rank_table(target: str, rho: float, lo: float, hi: float) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "task": "t",
                "head": "logistic",
                "fraction": 1.0,
                "source_domain": "a",
                "target_domain": target,
                "spearman_rho": rho,
                "spearman_rho_ci_lo": lo,
                "spearman_rho_ci_hi": hi,
            }
        ]
    )


def ladder(
    encoder: str, raw: float, source: float | None, oracle: float, kshot: dict[int, float | None], at_bound: int = 0
) -> pd.DataFrame:
    rows = [
        {"stage": "raw", "k": np.nan, "ece_top_15_lohi": raw, "n_at_bound": 0, "n_temperatures": 0},
        {
            "stage": "source_ts",
            "k": np.nan,
            "ece_top_15_lohi": np.nan if source is None else source,
            "n_at_bound": at_bound,
            "n_temperatures": 2,
        },
        {"stage": "oracle_ts", "k": np.nan, "ece_top_15_lohi": oracle, "n_at_bound": 0, "n_temperatures": 2},
    ]
    rows += [
        {
            "stage": "kshot_ts",
            "k": float(k),
            "ece_top_15_lohi": np.nan if v is None else v,
            "n_at_bound": 0,
            "n_temperatures": 10,
        }
        for k, v in kshot.items()
    ]
    return pd.DataFrame(
        [
            {
                "task": "t",
                "head": "logistic",
                "fraction": 1.0,
                "source_domain": "a",
                "target_domain": "b",
                "encoder": encoder,
                "in_domain": False,
                "deployable": r["stage"] != "oracle_ts",
                **r,
            }
            for r in rows
        ]
    )


def gate(rejected: tuple[float, float, float], tier: str = "far", n_units: int = 6) -> pd.DataFrame:
    base = {
        "encoder": "enc-a",
        "task": "t",
        "task_kind": "categorical",
        "setting": "t",
        "n_splits": 2,
        "n_boot": 50,
        "ci_unit": "patient",
        "ci_n_units": n_units,
    }
    test = {
        **base,
        "set": "test",
        "tier": "id",
        "coverage": 0.8,
        "coverage_ci_lo": 0.7,
        "coverage_ci_hi": 0.9,
        "accuracy_accepted": 0.9,
        "accuracy_accepted_ci_lo": 0.85,
        "accuracy_accepted_ci_hi": 0.95,
        "reject_any": 0.2,
        "reject_any_ci_lo": 0.1,
        "reject_any_ci_hi": 0.3,
    }
    ood = {
        **base,
        "set": f"{tier}-set",
        "tier": tier,
        "coverage": 1 - rejected[0],
        "coverage_ci_lo": 1 - rejected[2],
        "coverage_ci_hi": 1 - rejected[1],
        "accuracy_accepted": np.nan,
        "reject_any": rejected[0],
        "reject_any_ci_lo": rejected[1],
        "reject_any_ci_hi": rejected[2],
    }
    # the gate table's layout: the headline is division 0 (no interval), the mean over divisions has the interval
    rows = []
    for row in (test, ood):
        out = {k: v for k, v in row.items() if not k.endswith(("_ci_lo", "_ci_hi"))}
        for metric in ("coverage", "accuracy_accepted", "reject_any"):
            if metric in row:
                out[f"{metric}_mean_over_divisions"] = row[metric]
                for end in ("_ci_lo", "_ci_hi"):
                    if metric + end in row:
                        out[f"{metric}_mean_over_divisions{end}"] = row[metric + end]
        rows.append(out)
    return pd.DataFrame(rows)


def detection(auroc: tuple[float, float, float], n_units: int = 6) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "encoder": "enc-a",
                "task": "t",
                "tier": "far",
                "condition": "far:slide",
                "scorer": "energy",
                "auroc": auroc[0],
                "auroc_ci_lo": auroc[1],
                "auroc_ci_hi": auroc[2],
                "ci_unit": "patient",
                "ci_n_units": n_units,
            }
        ]
    )


def gains(rows: list[tuple[str, str, float, float, float]], n_units: int = 6) -> pd.DataFrame:
    """Per-encoder gains: (method, prior, mean, lo, hi) of enc-a."""
    return pd.DataFrame(
        [
            {
                "encoder": "enc-a",
                "task": "t",
                "source_domain": "a",
                "method": m,
                "prior": p,
                "mean": g,
                "ci_lo": lo,
                "ci_hi": hi,
                "unit": "seed",
                "n_units": n_units,
            }
            for m, p, g, lo, hi in rows
        ]
    )


def cra(n_sections: int, p: float, beats: bool, cra_pp: float = 3.0) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "encoder": "enc-a",
                "taxonomy": "fine",
                "magnification": 20.0,
                "cra_mean_pp": cra_pp,
                "cra_sd_pp": 1.0,
                "n_sections": n_sections,
                "nuc_vs_mean_p": p,
                "nuc_beats_mean": beats,
                "significant_wins": 0,
                "rank": 1,
            }
        ]
    )


# -------------------------------------------------------------------------------------------------- accuracy
def test_off_domain_drop_fires_when_the_intervals_separate_and_not_when_they_overlap():
    drop = accuracy_section(
        "enc-a",
        {
            "leaderboard": board(
                {
                    "enc-a": {"a": (0.9, 0.86, 0.94), "b": (0.6, 0.5, 0.7)},
                    "enc-b": {"a": (0.8, 0.7, 0.9), "b": (0.5, 0.4, 0.6)},
                }
            )
        },
    )
    assert "accuracy.off_domain_drop" in _rules(drop)
    text = next(a["text"] for a in drop["advice"] if a["rule"] == "accuracy.off_domain_drop")
    assert "a → b: 0.900 [0.860, 0.940] → 0.600 [0.500, 0.700]" in text and "patient, n=6" in text
    overlap = accuracy_section(
        "enc-a",
        {
            "leaderboard": board(
                {
                    "enc-a": {"a": (0.9, 0.7, 0.95), "b": (0.8, 0.6, 0.9)},
                    "enc-b": {"a": (0.8, 0.7, 0.9), "b": (0.5, 0.4, 0.6)},
                }
            )
        },
    )
    assert "accuracy.off_domain_drop" not in _rules(overlap)


def test_few_units_silence_advice_and_say_so():
    few = accuracy_section(
        "enc-a",
        {
            "leaderboard": board(
                {
                    "enc-a": {"a": (0.9, 0.86, 0.94), "b": (0.6, 0.5, 0.7)},
                    "enc-b": {"a": (0.8, 0.7, 0.9), "b": (0.5, 0.4, 0.6)},
                },
                n_units=1,
            )
        },
    )
    assert not few["advice"]
    assert any("fewer than 5" in x for x in few["limits"])


def _rank_drop_probe(lo: float) -> dict:
    b = board(
        {
            "enc-a": {"a": (0.9, 0.85, 0.95), "b": (0.6, 0.55, 0.65)},
            "enc-b": {"a": (0.8, 0.75, 0.84), "b": (0.7, 0.65, 0.75)},
        }
    )
    return {"leaderboard": b, "paired_differences": paired([("b", "enc-b", "enc-a", 0.1, lo, 0.15)])}


def test_rank_drop_needs_a_paired_interval_above_zero():
    fired = accuracy_section("enc-a", _rank_drop_probe(lo=0.04))
    assert "accuracy.rank_drop" in _rules(fired)
    assert "enc-b beats it by +0.100 [+0.040, +0.150]" in fired["advice"][-1]["text"]
    silent = accuracy_section("enc-a", _rank_drop_probe(lo=-0.02))
    assert "accuracy.rank_drop" not in _rules(silent)
    assert any("may be noise" in x for x in silent["limits"])
    # the overtaking encoder gets no rank-drop advice (its rank improved)
    assert "accuracy.rank_drop" not in _rules(accuracy_section("enc-b", _rank_drop_probe(lo=0.04)))


def _five(rho: tuple[float, float, float]) -> dict:
    scores = {
        e: {"a": (0.9 - 0.05 * i, 0.85 - 0.05 * i, 0.95 - 0.05 * i), "b": (0.5 + 0.05 * i, 0.45, 0.75)}
        for i, e in enumerate(ENCODERS)
    }
    return {"leaderboard": board(scores), "rank_transfer": rank_table("b", *rho)}


def test_rank_transfer_poor_fires_only_over_enough_encoders_with_a_low_interval():
    assert "accuracy.rank_transfer_poor" in _rules(accuracy_section("enc-a", _five((-0.9, -1.0, 0.2))))
    assert "accuracy.rank_transfer_poor" not in _rules(accuracy_section("enc-a", _five((0.9, 0.6, 1.0))))
    four = _five((-0.9, -1.0, 0.2))
    four["leaderboard"] = four["leaderboard"][four["leaderboard"]["encoder"] != "enc-e"]
    section = accuracy_section("enc-a", four)
    assert "accuracy.rank_transfer_poor" not in _rules(section)
    assert any("only 4 encoders" in x for x in section["limits"])
    rho = next(r for r in section["rows"] if "rho" in r["values"])["values"]["rho"]
    assert rho["note"] == "not informative"


def test_single_target_is_stated():
    section = accuracy_section(
        "enc-a",
        {
            "leaderboard": board(
                {
                    "enc-a": {"a": (0.9, 0.85, 0.95), "b": (0.8, 0.7, 0.9)},
                    "enc-b": {"a": (0.8, 0.7, 0.9), "b": (0.7, 0.6, 0.8)},
                }
            )
        },
    )
    assert any("one target domain" in x for x in section["limits"])


def test_ranks_are_integers_and_extra_columns_and_rows_are_tolerated():
    b = board(
        {"enc-a": {"a": (0.9, 0.85, 0.95), "b": (0.8, 0.7, 0.9)}, "enc-b": {"a": (0.8, 0.7, 0.9), "b": (0.7, 0.6, 0.8)}}
    )
    other_task = b.assign(task="other-task", head="knn")  # another analysis's rows
    section = accuracy_section("enc-a", {"leaderboard": pd.concat([b, other_task], ignore_index=True)})
    ranks = [r["values"]["rank_target"] for r in section["rows"]]
    assert all(q["kind"] == "integer" and q["point"] == int(q["point"]) for q in ranks)
    assert {r["context"]["task"] for r in section["rows"]} == {"t", "other-task"}


# ----------------------------------------------------------------------------------------------- calibration
def test_source_temperature_worsens_and_does_not_transfer():
    bad = calibration_section(
        "enc-a",
        {"calibration": ladder("enc-a", raw=0.10, source=0.14, oracle=0.03, kshot={4: 0.09, 8: 0.045, 16: 0.04})},
    )
    assert {
        "calibration.source_temperature_worsens",
        "calibration.temperature_does_not_transfer",
        "calibration.kshot_enough",
    } <= _rules(bad)
    assert "a → b: K=8, ECE 0.045" in next(a["text"] for a in bad["advice"] if a["rule"] == "calibration.kshot_enough")
    assert bad["recommended_fix"]["k"] == 8 and bad["recommended_fix"]["worst_ece"] == pytest.approx(0.045)
    good = calibration_section(
        "enc-a", {"calibration": ladder("enc-a", raw=0.10, source=0.04, oracle=0.03, kshot={4: 0.09, 8: 0.05})}
    )
    assert "calibration.source_temperature_worsens" not in _rules(good)
    assert "calibration.temperature_does_not_transfer" not in _rules(good)
    assert "calibration.kshot_enough" not in _rules(good)
    assert "calibration.source_temperature_suffices" in _rules(good)
    assert good["recommended_fix"]["stage"] == "source_ts"


def test_source_temperature_suffices_is_silent_when_it_does_not_transfer():
    bad = calibration_section("enc-a", {"calibration": ladder("enc-a", 0.1, 0.08, 0.03, {4: 0.04})})
    assert "calibration.source_temperature_suffices" not in _rules(bad)


def test_kshot_insufficient_when_no_k_reaches_the_margin():
    none = calibration_section("enc-a", {"calibration": ladder("enc-a", 0.10, 0.09, 0.02, {4: 0.09, 8: 0.07})})
    assert "calibration.kshot_insufficient" in _rules(none) and "calibration.kshot_enough" not in _rules(none)
    assert (
        "n/a (no K within the margin)" in str(none["rows"][0]["values"]["smallest_k"]["note"])
        or none["rows"][0]["values"]["smallest_k"]["point"] is None
    )
    some = calibration_section("enc-a", {"calibration": ladder("enc-a", 0.10, 0.09, 0.02, {4: 0.09, 8: 0.03})})
    assert "calibration.kshot_insufficient" not in _rules(some)


def test_a_temperature_at_a_bound_is_marked_not_blank():
    section = calibration_section("enc-a", {"calibration": ladder("enc-a", 0.1, None, 0.03, {4: 0.05}, at_bound=2)})
    q = section["rows"][0]["values"]["source_ts"]
    assert q["point"] is None and "search bound" in q["note"]
    assert any("at a search bound (a → b: 2 of" in x for x in section["limits"])


def test_recommended_fix_without_any_stage_within_the_margin():
    fix = recommended_fix([{"raw": 0.2, "source_ts": 0.15, "oracle_ts": 0.01, "kshot": {4: 0.12}}])
    assert fix["stage"] == "kshot_ts" and "none within" in fix["name"]


# ------------------------------------------------------------------------------------------------ abstention
def test_tier_let_through_and_caught():
    through = abstention_section(
        "enc-a", {"gate_summary": gate((0.2, 0.1, 0.35)), "detection": detection((0.8, 0.7, 0.9))}
    )
    assert "abstention.tier_let_through" in _rules(through) and "abstention.tier_caught" not in _rules(through)
    caught = abstention_section(
        "enc-a", {"gate_summary": gate((0.97, 0.93, 1.0)), "detection": detection((0.8, 0.7, 0.9))}
    )
    assert "abstention.tier_caught" in _rules(caught) and "abstention.tier_let_through" not in _rules(caught)
    unsure = abstention_section("enc-a", {"gate_summary": gate((0.4, 0.2, 0.6))})
    assert not {"abstention.tier_caught", "abstention.tier_let_through"} & _rules(unsure)


def test_scorer_below_chance():
    below = abstention_section(
        "enc-a", {"gate_summary": gate((0.5, 0.4, 0.6)), "detection": detection((0.2, 0.1, 0.3))}
    )
    assert "abstention.scorer_below_chance" in _rules(below)
    near = abstention_section(
        "enc-a", {"gate_summary": gate((0.5, 0.4, 0.6)), "detection": detection((0.45, 0.3, 0.6))}
    )
    assert "abstention.scorer_below_chance" not in _rules(near)
    assert any("below 0.5 but not with its whole interval" in x for x in near["limits"])


# ----------------------------------------------------------------------------------------------- prior shift
def test_harmful_under_prior_names_the_method_and_the_skew():
    harmful = prior_shift_section(
        "enc-a",
        gains([("bbse", "balanced", 0.01, -0.01, 0.03), ("bbse", "skewed", -0.05, -0.08, -0.02)]),
        {"t": {"skewed": {"x": 0.6, "y": 0.4}}},
    )
    assert "prior_shift.harmful_under_prior" in _rules(harmful) and harmful["harmful_methods"] == ["bbse"]
    assert "(largest class 60%)" in harmful["advice"][0]["text"]
    fine = prior_shift_section(
        "enc-a", gains([("bbse", "balanced", 0.01, -0.01, 0.03), ("bbse", "skewed", -0.01, -0.04, 0.02)])
    )
    assert "prior_shift.harmful_under_prior" not in _rules(fine) and fine["harmful_methods"] == []
    assert any("cannot be told" in x for x in fine["limits"])
    # the oracle reads target labels: never advice
    oracle = prior_shift_section("enc-a", gains([("oracle_restandardization", "skewed", -0.05, -0.08, -0.02)]))
    assert "prior_shift.harmful_under_prior" not in _rules(oracle)


def test_helps_under_every_prior():
    helps = prior_shift_section(
        "enc-a", gains([("cbr", "balanced", 0.03, 0.01, 0.05), ("cbr", "skewed", 0.02, 0.005, 0.04)])
    )
    assert "prior_shift.helps_under_every_prior" in _rules(helps)
    once = prior_shift_section(
        "enc-a", gains([("cbr", "balanced", 0.03, 0.01, 0.05), ("cbr", "skewed", 0.02, -0.01, 0.04)])
    )
    assert "prior_shift.helps_under_every_prior" not in _rules(once)


# ----------------------------------------------------------------------------------------------------- cells
def test_wilcoxon_needs_six_sections_and_four_say_undecided_not_false():
    assert wilcoxon_smallest_p(4) == pytest.approx(0.125) and wilcoxon_smallest_p(6) < 0.05 <= wilcoxon_smallest_p(5)
    four = cells_section("enc-a", {"cra": cra(4, 0.125, False)})
    assert not {"cells.nuc_beats_mean", "cells.nuc_not_better"} & _rules(four)
    flag = four["rows"][0]["values"]["nuc_beats_mean"]
    assert flag["point"] is None and "smallest possible two-sided p is 0.125" in flag["note"]
    assert any("undecided, not false" in x for x in four["limits"])


def test_nuc_beats_mean_and_not_better():
    assert "cells.nuc_beats_mean" in _rules(cells_section("enc-a", {"cra": cra(8, 0.01, True)}))
    assert "cells.nuc_beats_mean" not in _rules(cells_section("enc-a", {"cra": cra(8, 0.3, False)}))
    assert "cells.nuc_not_better" in _rules(cells_section("enc-a", {"cra": cra(8, 0.3, False)}))
    assert "cells.nuc_not_better" not in _rules(cells_section("enc-a", {"cra": cra(8, 0.01, True)}))


# ----------------------------------------------------------------------------------------- exposure and cost
def test_exposure_rules():
    audit = pd.DataFrame(
        {"encoder": ["enc-a"] * 3, "dataset": ["d1", "d2", "d3"], "exposure": ["yes", "unknown", "no"]}
    )
    section = exposure_section("enc-a", audit)
    assert {"exposure.pretrained_on_evaluated", "exposure.unknown"} <= _rules(section)
    clean = exposure_section("enc-a", audit.assign(exposure="no"))
    assert not _rules(clean)


def _jobs(device: str) -> dict:
    jobs = pd.DataFrame(
        [
            {
                "rule": "embed",
                "job": "enc-a/k/d",
                "encoder": "enc-a",
                "wall_s": 3600.0,
                "cpu_s": 1800.0,
                "max_rss_mb": 900.0,
                "gpus": 1,
                "cpu_hours": 0.5,
                "gpu_hours": 1.0,
                "device": device,
                "device_mismatch": not device.startswith("cuda"),
            }
        ]
    )
    return {"jobs": jobs}


def test_cost_device_mismatch():
    section = cost_section("enc-a", _jobs("cpu"), None)
    assert "cost.device_mismatch" in _rules(section) and section["totals"] == {"cpu_hours": 0.5, "gpu_hours": 1.0}
    assert "cost.device_mismatch" not in _rules(cost_section("enc-a", _jobs("cuda:0"), None))


def test_every_rule_has_a_test_here():
    text = Path(__file__).read_text()
    untested = [r.id for r in advice.RULES if f'"{r.id}"' not in text]
    assert not untested, untested


# ----------------------------------------------------------------------------------------- cards and schema
def test_cards_validate_against_the_schema_and_an_unknown_encoder_gets_an_empty_card():
    probe = _rank_drop_probe(lo=0.04)
    probe["calibration"] = pd.concat(
        [ladder("enc-a", 0.1, 0.14, 0.03, {4: 0.05}), ladder("enc-b", 0.1, 0.04, 0.03, {4: 0.05})]
    )
    cards = build_cards(
        {
            "probe": probe,
            "ood": {"gate_summary": gate((0.2, 0.1, 0.35)), "detection": detection((0.2, 0.1, 0.3))},
            "prior_shift_gains": gains([("bbse", "skewed", -0.05, -0.08, -0.02)]),
            "cells": {"cra": cra(4, 0.125, False)},
        },
        study="s",
        encoders=["enc-a", "enc-b", "enc-z"],
    )
    for card in cards:
        jsonschema.validate(json.loads(json.dumps(card, allow_nan=False)), SCHEMA)
    assert [c["encoder"] for c in cards] == ["enc-a", "enc-b", "enc-z"]
    assert not any(s["available"] for s in cards[2]["sections"].values())
    tables = front_page(cards)
    row = {r["encoder"]: r["values"] for r in tables[0]["rows"]}
    assert row["enc-a"]["in_domain"]["best"] and row["enc-b"]["in_domain"]["separated"]  # 0.75-0.84 vs 0.85-0.95
    assert row["enc-b"]["calibration"]["point"] == pytest.approx(0.04)  # the source temperature suffices for enc-b
    assert row["enc-a"]["prior_shift_risk"]["point"] == pytest.approx(-0.05)


def test_wide_intervals_are_named_under_the_limits():
    wide = accuracy_section(
        "enc-a",
        {
            "leaderboard": board(
                {
                    "enc-a": {"a": (0.9, 0.6, 0.95), "b": (0.8, 0.7, 0.9)},
                    "enc-b": {"a": (0.8, 0.7, 0.9), "b": (0.7, 0.6, 0.8)},
                }
            )
        },
    )
    assert any(
        "1 macro-F1 intervals are wider than 0.25 (widest: a → b, 0.900 [0.600, 0.950])" in x for x in wide["limits"]
    )
    narrow = accuracy_section(
        "enc-a",
        {
            "leaderboard": board(
                {
                    "enc-a": {"a": (0.9, 0.85, 0.95), "b": (0.8, 0.7, 0.9)},
                    "enc-b": {"a": (0.8, 0.7, 0.9), "b": (0.7, 0.6, 0.8)},
                }
            )
        },
    )
    assert not any("wider than" in x for x in narrow["limits"])


def test_a_harmful_interval_from_too_few_units_is_not_named_harmful():
    weak = prior_shift_section("enc-a", gains([("bbse", "skewed", -0.05, -0.08, -0.02)], n_units=2))
    assert weak["harmful_methods"] == [] and "prior_shift.harmful_under_prior" not in _rules(weak)
    assert "Below zero somewhere but from fewer units (not evidence): bbse." in weak["caption"]


def test_a_source_temperature_worse_by_less_than_the_margin_is_not_advice():
    close = calibration_section(
        "enc-a", {"calibration": ladder("enc-a", raw=0.10, source=0.11, oracle=0.03, kshot={4: 0.04})}
    )
    assert "calibration.source_temperature_worsens" not in _rules(close)


def test_the_crt_row_reads_the_crt_table_as_the_cell_chapter_writes_it():
    crt = crt_table(fixed_runs(), 20)
    section = cells_section("enc-b", {"crt": crt})
    assert section["available"]
    row = next(r for r in section["rows"] if "crt" in r["values"])
    mine = crt[(crt["encoder"] == "enc-b") & (crt["taxonomy"] == row["context"]["taxonomy"])].iloc[0]
    assert row["values"]["crt"]["point"] == pytest.approx(mine["crt"])  # mean significant wins over protocols
    assert row["values"]["crt_relative_pp"]["point"] == pytest.approx(mine["crt_relative_pp"])
    assert row["values"]["crt_rank"]["point"] == mine["rank"]

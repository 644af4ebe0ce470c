"""The cards chapter writes each card as JSON (valid against the published schema), Markdown and HTML, and the
front page; the HTML pages escape every text; the cost chapter formats the benchmark sums."""

from __future__ import annotations

import json
import re

import jsonschema
import pandas as pd
import pytest

from analyses.test_cards import SCHEMA, _rank_drop_probe, cra, detection, gains, gate, ladder
from fmaudit.analyses.cards import build_cards, front_page, quantity
from fmaudit.costs import cost_by, job_costs
from fmaudit.report import cards as chapter
from fmaudit.report import cost
from fmaudit.report.chapter import ReportWriter
from fmaudit.report.html import markdown_to_html


@pytest.fixture
def results():
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
        encoders=["enc-a", "enc-b"],
    )
    return {
        "cards": cards,
        "front": front_page(cards),
        "encoders": ["enc-a", "enc-b"],
        "figures": {"leaderboard": probe["leaderboard"], "calibration": probe["calibration"]},
    }


def test_the_chapter_writes_every_card_in_three_formats(results, tmp_path):
    writer = ReportWriter(tmp_path)
    lines = chapter.write_cards_chapter(results, writer)
    assert writer.written == set(chapter.CHAPTER.outputs(results))
    for enc in ("enc-a", "enc-b"):
        card = json.loads((tmp_path / "cards" / f"{enc}.json").read_text())
        jsonschema.validate(card, SCHEMA)
        md = (tmp_path / "cards" / f"{enc}.md").read_text()
        html = (tmp_path / "cards" / f"{enc}.html").read_text()
        assert f"# Reliability card: {enc}" in md and f"<h1>Reliability card: {enc}</h1>" in html
        assert "{{" not in html and "{%" not in html and not re.search(r"\bnan\b|\bNone\b", md + html)
    md = (tmp_path / "cards" / "enc-a.md").read_text()
    assert (
        "*(rule `accuracy.rank_drop`)*" in md
        and "rule <code>accuracy.rank_drop</code>" in (tmp_path / "cards" / "enc-a.html").read_text()
    )
    text = "\n".join(lines)
    assert "## At a glance" in text and "[card](cards/enc-a.md)" in text and "★" in text
    assert "figures/card_ece_vs_k.png" in text
    assert (tmp_path / "figures" / "card_rank_bump.png").stat().st_size > 5000
    advice = pd.read_csv(tmp_path / "tables" / "card_advice.csv")
    assert "accuracy.rank_drop" in set(advice["rule"])
    front = pd.read_csv(tmp_path / "tables" / "front_page.csv")
    assert set(front["encoder"]) == {"enc-a", "enc-b"} and front["best"].any()
    assert "<table>" in (tmp_path / "front_page.html").read_text()


def test_no_results_still_writes_every_declared_output(tmp_path):
    writer = ReportWriter(tmp_path)
    lines = chapter.write_cards_chapter(None, writer)
    assert writer.written == set(chapter.CHAPTER.outputs(None))
    assert "no reliability cards" in "\n".join(lines)


@pytest.mark.parametrize(
    "q, text",
    [
        (quantity(0.81234, 0.7, 0.9, measure="m"), "0.812 [0.700, 0.900]"),
        (quantity(0.05, -0.01, 0.1, measure="m", kind="signed"), "+0.050 [-0.010, +0.100]"),
        (quantity(2.0, measure="rank", kind="integer"), "2"),
        (quantity(None, measure="m", note="at a bound"), "n/a (at a bound)"),
        (quantity(1.0, measure="flag", kind="flag"), "yes"),
        (quantity(0.000123456, measure="h", kind="amount"), "0.0001235"),
        (quantity(None, measure="status", kind="text", note="no (random init)"), "no (random init)"),
    ],
)
def test_quantities_print_with_their_interval_and_kind(q, text):
    assert chapter.quantity_text(q) == text


def test_markdown_to_html_renders_the_report_subset_and_escapes_the_rest():
    html = markdown_to_html(
        "## Title\n\nA *caption* with `code` and [a link](cards/x.html).\n\n"
        "| a | b |\n| --- | --- |\n| <script>x</script> | 1 \\| 2 |\n\n- item one\n- item two\n\n"
        "![fig](figures/f.png)\n\n[bad](javascript:alert(1))"
    )
    assert '<h2 id="title">Title</h2>' in html and "<em>caption</em>" in html and "<code>code</code>" in html
    assert '<a href="cards/x.html">a link</a>' in html and '<img src="figures/f.png" alt="fig">' in html
    assert "<td>&lt;script&gt;x&lt;/script&gt;</td>" in html and "<td>1 | 2</td>" in html
    assert "<ul><li>item one</li><li>item two</li></ul>" in html
    assert "javascript:" not in html


def test_cost_chapter_formats_sums_and_says_when_nothing_ran(tmp_path):
    bench = tmp_path / "results" / "s" / "benchmarks" / "embed" / "enc" / "abcabcabcabc" / "d.tsv"
    bench.parent.mkdir(parents=True)
    bench.write_text("s\tmax_rss\tcpu_time\n3600\t1000\t1800\n")
    jobs = job_costs([bench], {"embed": {"enc": 1}})
    results = {"jobs": jobs, "by_rule": cost_by(jobs, "rule"), "by_encoder": cost_by(jobs, "encoder")}
    writer = ReportWriter(tmp_path / "r")
    text = "\n".join(cost.write_cost_chapter(results, writer))
    assert writer.written == set(cost.CHAPTER.outputs())
    assert "0.5 CPU-hours, 1 GPU-hours" in text and "| embed | 1 | 0.5 | 1 | 1 |" in text
    empty = ReportWriter(tmp_path / "e")
    assert "No benchmark files" in "\n".join(cost.write_cost_chapter(None, empty))
    assert empty.written == set(cost.CHAPTER.outputs())

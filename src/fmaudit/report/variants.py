"""Declared encoder variants beside their base (the hema paper's 224-vs-518 input-resolution check), formatted from
:func:`fmaudit.analyses.variants.variant_pairs`."""

from __future__ import annotations

import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report.chapter import Chapter, ReportWriter
from fmaudit.report.formatting import fmt_ci

__all__ = ["CHAPTER"]

NOTE = "no encoder variant was declared in this config (config key `variants`)"


def _markdown(pairs: pd.DataFrame) -> str:
    rows = []
    for r in pairs.itertuples(index=False):
        rows.append({"task": r.task, "head": r.head, "source": r.source_domain,
                     "target": f"{r.target_domain} (in-domain)" if r.in_domain else r.target_domain,
                     "base": r.base, "base macro-F1": fmt_ci(r.base_macro_f1, r.base_ci_lo, r.base_ci_hi),
                     "variant": r.variant,
                     "variant macro-F1": fmt_ci(r.variant_macro_f1, r.variant_ci_lo, r.variant_ci_hi),
                     "variant − base": fmt_ci(r.difference, r.difference_ci_lo, r.difference_ci_hi),
                     "groups": r.n_test_groups})
    return dataframe_to_markdown(pd.DataFrame(rows))


def write_variants_chapter(pairs: pd.DataFrame | None, writer: ReportWriter) -> list[str]:
    """Write the ``encoder_variants`` table; return the chapter's lines of ``index.md`` (none without variants).

    Parameters
    ----------
    pairs : DataFrame or None
        :func:`fmaudit.analyses.variants.variant_pairs`: one row per (task, head, source, target, variant) with the
        base's and the variant's macro-F1 (mean over seeds, 95% interval), their paired ``difference`` with its
        interval, ``n_test_groups`` and ``n_boot``. ``None`` or empty: no variant was declared.
    writer : ReportWriter
        Where the table goes.

    Returns
    -------
    list of str
        The chapter's heading, its convention (interval unit and B) and the table; empty without variants.
    """
    if pairs is None or len(pairs) == 0:
        writer.table("encoder_variants", pd.DataFrame({"note": [NOTE]}))
        return []
    writer.table("encoder_variants", pairs)
    n_boot = ", ".join(str(b) for b in dict.fromkeys(pairs["n_boot"]))
    return ["## Encoder variants (input-resolution check)", "",
            "Each declared variant (the same weights with another preprocessing, embedded once) against its base on "
            "the same test items, at the largest label fraction: macro-F1, mean over seeds [95% percentile interval; "
            f"unit = the task's group unit, B={n_boot}, n = the groups column], and the paired difference (one "
            "resample of the groups for both). Variants stay out of every ranking table.", "",
            _markdown(pairs), ""]


CHAPTER = Chapter("variants", {"encoder_variants": "Accuracy under shift"}, {}, write_variants_chapter,
                  reads=("probe_runs", "probe_predictions"), settings=("variants", "bootstrap"))

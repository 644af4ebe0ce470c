"""The report: tables (CSV, Markdown, LaTeX), figures and ``index.md``, formatted from results the analyses
computed. The report computes nothing (statistics live in :mod:`fmaudit.stats`, analyses in
:mod:`fmaudit.analyses`); it writes what it is given, every number with its convention and the settings it
was made with.

Sections: each analysis contributes one module with a :class:`~fmaudit.report.section.Section` (its tables and
figures, each with a category, and a ``write`` function). A new analysis adds its section as a new module and
one line in :data:`SECTIONS`; the workflow's ``report`` rule then declares its outputs (``rules/common.smk``
reads :func:`report_outputs`) with the captions ``resources/report/tables|figures/<name>.rst``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from fmaudit.io import write_text
from fmaudit.report import cells, embeddings, exposure, ood, paper_check, prior_shift, probe, variants
from fmaudit.report.section import ReportWriter, Section

#: The report's sections, in the order index.md shows them: one line per analysis.
SECTIONS: tuple[Section, ...] = (
    probe.SECTION,
    ood.SECTION,
    variants.SECTION,
    prior_shift.SECTION,
    exposure.SECTION,
    cells.SECTION,
    embeddings.SECTION,
    paper_check.SECTION,  # last: it checks the claims against the tables the sections above wrote
)

__all__ = ["SECTIONS", "Section", "report_outputs", "write_report"]


def report_outputs(sections: Sequence[Section] = SECTIONS) -> dict[str, dict[str, str]]:
    """``{"tables": {name: category}, "figures": {name: category}}`` of every section: what the report writes
    (each table in every format of :data:`fmaudit.report.formatting.TABLE_FORMATS`), besides ``index.md``."""
    out: dict[str, dict[str, str]] = {"tables": {}, "figures": {}}
    for s in sections:
        for kind, names in (("tables", s.tables), ("figures", s.figures)):
            clash = set(names) & set(out[kind])
            if clash:
                raise ValueError(f"report section {s.name!r}: {kind} {sorted(clash)} already belong to another section")
            out[kind].update(names)
    return out


def write_report(out_dir: str | Path, results: Mapping[str, Any], sections: Sequence[Section] = SECTIONS) -> None:
    """Write every section's tables and figures under ``out_dir``, then ``index.md`` (last, so that a complete
    index means a complete report). ``results[section.name]`` is what the section formats; a missing entry
    means the config planned nothing of it."""
    out_dir = Path(out_dir)
    writer = ReportWriter(out_dir)
    lines = ["# fmaudit report", ""]
    for section in sections:
        lines += section.write(results.get(section.name), writer)
    declared = {p for s in sections for p in s.outputs()}
    if writer.written != declared:  # a section wrote something it does not declare, or skipped an output
        raise RuntimeError(f"report sections wrote {sorted(writer.written ^ declared)} against their declaration")
    lines += ["Tables are also in `tables/` as CSV, Markdown and LaTeX.", ""]
    write_text(out_dir / "index.md", "\n".join(lines))

"""A report chapter: the tables and figures one analysis contributes, and the writer they go through.

A chapter declares what it reads and what it writes, so that the workflow's ``report`` rule is built from the
chapters alone:

- ``reads``: names of the report's inputs, the files the workflow's branches produce for it (``probe_runs``,
  ``ood_tables``, ``cell_runs`` ...; :data:`fmaudit.report.REPORT_INPUTS` lists them with what each holds). The
  rule's ``input`` is every name some chapter reads, each a list of files (empty when the config plans none).
- ``settings``: names of the report's settings that its numbers or captions depend on (``calibration``,
  ``bootstrap``, ``ood`` ...; :data:`fmaudit.report.REPORT_SETTINGS`); they become the rule's ``params``, which
  its captions (``resources/report/tables|figures/<name>.rst``) read.
- ``tables`` and ``figures``: what it writes (so the rule declares exactly the report's outputs), each with its
  category in Snakemake's HTML report.
- ``files``: for a chapter that writes more than tables and figures (the reliability cards, one set per
  encoder), ``files(results) -> paths`` relative to the report folder; the workflow declares the same paths.
- ``write``: formats the results an analysis computed (``fmaudit.jobs.report.SUMMARIES`` turns the chapter's
  inputs into them), writes them through the :class:`ReportWriter` and returns its lines of ``index.md``.
  ``write`` receives ``None`` when the config planned no run of the analysis; it must still write every
  declared output (saying so), so the rule's outputs are complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from fmaudit.report.formatting import TABLE_FORMATS, guard_intervals, write_all_formats

__all__ = ["ReportWriter", "Chapter"]


@dataclass(frozen=True)
class Chapter:
    """``name``: key of the chapter's results in :func:`fmaudit.report.write_report`; ``tables`` and
    ``figures``: output name -> category in Snakemake's HTML report; ``write(results or None, writer) ->
    index.md lines``; ``reads`` and ``settings``: names of the report inputs and settings it uses (module
    doc).

    Attributes
    ----------
    name : str
        The chapter's key: its results are ``results[name]`` in :func:`fmaudit.report.write_report`.
    tables : mapping of str to str
        Table name (written as ``tables/<name>.csv|md|tex``) -> its category in Snakemake's HTML report.
    figures : mapping of str to str
        Figure name (written as ``figures/<name>.png``) -> its category.
    write : callable
        ``write(results or None, writer) -> list of str``: writes every declared output through the
        :class:`ReportWriter` and returns the chapter's lines of ``index.md``.
    reads : tuple of str, default ()
        Names of the report inputs the chapter's results are made from (:data:`fmaudit.report.REPORT_INPUTS`).
    settings : tuple of str, default ()
        Names of the report settings its numbers or captions depend on (:data:`fmaudit.report.REPORT_SETTINGS`).
    files : callable, optional
        ``files(results) -> list of str``: further paths it writes, relative to the report folder; ``None``: none.
    """

    name: str
    tables: Mapping[str, str]
    figures: Mapping[str, str]
    write: Callable[[Any, "ReportWriter"], list[str]]
    reads: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    files: Callable[[Any], list[str]] | None = None

    def outputs(self, results: Any = None) -> list[str]:
        """Paths of the chapter's outputs, relative to the report folder (its ``files`` of ``results`` too).

        Parameters
        ----------
        results : optional
            The chapter's results (as ``write`` receives them), passed to ``files``; ``None`` when nothing was planned.

        Returns
        -------
        list of str
            ``tables/<t><ext>`` for every table and format of :data:`~fmaudit.report.formatting.TABLE_FORMATS`,
            ``figures/<f>.png`` for every figure, then the ``files`` paths.
        """
        extra = list(self.files(results)) if self.files is not None else []
        return ([f"tables/{t}{ext}" for t in self.tables for ext in TABLE_FORMATS]
                + [f"figures/{f}.png" for f in self.figures] + extra)


class ReportWriter:
    """Writes tables and figures under one report folder, atomically, and remembers what it wrote. Every table
    goes through :func:`~fmaudit.report.formatting.guard_intervals` (no interval over a single test patient, a
    note where there are fewer than 5); ``warnings`` collects what it flagged, for the index.

    Parameters
    ----------
    out_dir : path-like
        The report folder; tables go to ``tables/``, figures to ``figures/`` under it.

    Attributes
    ----------
    written : set of str
        Paths written so far, relative to ``out_dir``.
    warnings : dict of str to list of str
        Table name -> the lines :func:`~fmaudit.report.formatting.guard_intervals` flagged for it.
    """

    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.written: set[str] = set()
        self.warnings: dict[str, list[str]] = {}

    def table(self, name: str, df: pd.DataFrame) -> None:
        """Write ``df`` as ``tables/<name>.csv|md|tex`` after guarding its intervals; its flags go to ``warnings``.

        Parameters
        ----------
        name : str
            The table's name, one the chapter declares in ``tables``.
        df : DataFrame
            The table as the chapter formatted it (intervals of a single cluster are removed, see
            :func:`~fmaudit.report.formatting.guard_intervals`).
        """
        df, flagged = guard_intervals(df)
        if flagged:
            self.warnings[name] = flagged
        for path in write_all_formats(df, self.out_dir / "tables" / name):
            self.written.add(str(path.relative_to(self.out_dir)))

    def file(self, relative: str, write: Callable[[Path], None]) -> None:
        """``write(path)`` writes the file ``relative`` (to the report folder), atomically.

        Parameters
        ----------
        relative : str
            The file's path relative to the report folder, e.g. ``cards/<encoder>.json``.
        write : callable
            ``write(path)`` writes the file at the absolute ``path``; it should write atomically
            (:func:`fmaudit.io.write_text`).
        """
        path = self.out_dir / relative
        write(path)
        self.written.add(str(path.relative_to(self.out_dir)))

    def figure(self, name: str, draw: Callable[[Path], None]) -> None:
        """``draw(path)`` saves the figure at ``path`` (atomically).

        Parameters
        ----------
        name : str
            The figure's name, one the chapter declares in ``figures``; saved as ``figures/<name>.png``.
        draw : callable
            ``draw(path)`` draws the figure and saves it at ``path`` (:func:`~fmaudit.report.figures.save_figure`).
        """
        path = self.out_dir / "figures" / f"{name}.png"
        draw(path)
        self.written.add(str(path.relative_to(self.out_dir)))

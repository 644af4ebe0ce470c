"""What a split check found: one row per check and scope, the report that collects them, and the error that
lists every problem (:func:`fmaudit.split_checks.validate_task_splits`,
:func:`fmaudit.split_checks.validate_cell_panel`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd

from fmaudit.io import FmauditInputError


@dataclass
class SplitCheck:
    """One check on one scope: ``status`` is ``ok``, ``error``, ``allowed`` (an error the config accepts) or
    ``warning`` (the run goes on; the validation log and report say why its numbers are weaker).

    Parameters
    ----------
    task : str
        The task checked; ``""`` for a manifest-level check, ``"cells"`` for a cell section or partition.
    check : str
        One of :data:`CHECKS` or :data:`CELL_CHECKS`.
    scope : str
        What was checked, e.g. ``"manifest <file> (dataset 'x'), domain 'a'"`` or ``"IS s1 seed 0 fine"``.
    status : str
        ``ok``, ``error``, ``allowed``, ``warning`` or (cells) ``excluded``.
    detail : str
        The finding in words (the problem, or what passed).
    """

    task: str
    check: str
    scope: str
    status: str
    detail: str


@dataclass
class SplitValidationReport:
    """What :func:`validate_task_splits` checked: one :class:`SplitCheck` per check and scope.

    Parameters
    ----------
    checks : list of SplitCheck
        Every check run so far, in order.
    """

    checks: list[SplitCheck] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """The errors, one line each (``task 't', <scope>: <detail>``).
        """
        return [_problem_line(c) for c in self.checks if c.status == "error"]

    @property
    def ok(self) -> bool:
        """True when no check is an error (allowed and warning rows do not count).
        """
        return not self.problems

    @property
    def warnings(self) -> list[str]:
        """The warnings, one line each.
        """
        return [_problem_line(c) for c in self.checks if c.status == "warning"]

    def to_frame(self) -> pd.DataFrame:
        """The checks as a table, for the validation report.

        Returns
        -------
        DataFrame
            One row per check, columns ``task``, ``check``, ``scope``, ``status``, ``detail``.
        """
        return pd.DataFrame([vars(c) for c in self.checks], columns=["task", "check", "scope", "status", "detail"])

    def add(self, task: str, check: str, scope: str, problems: Sequence[str], ok_detail: str,
            allowed: Sequence[str] = (), warnings: Sequence[str] = ()) -> None:
        """Record one check on one scope: an ``error`` row per problem, ``allowed`` and ``warning`` rows, or one
        ``ok`` row when there is none of them.

        Parameters
        ----------
        task : str
            The task (``""`` for a manifest-level check).
        check : str
            The check's name.
        scope : str
            What was checked.
        problems : sequence of str
            The errors found.
        ok_detail : str
            The detail of the ``ok`` row (what passed).
        allowed : sequence of str, default ()
            Findings the config accepts.
        warnings : sequence of str, default ()
            Findings that weaken the numbers without stopping the run.
        """
        for p in problems:
            self.checks.append(SplitCheck(task, check, scope, "error", p))
        for a in allowed:
            self.checks.append(SplitCheck(task, check, scope, "allowed", a))
        for w in warnings:
            self.checks.append(SplitCheck(task, check, scope, "warning", w))
        if not problems and not allowed and not warnings:
            self.checks.append(SplitCheck(task, check, scope, "ok", ok_detail))


class SplitValidationError(FmauditInputError):
    """Every problem :func:`validate_task_splits` found; ``report`` holds all checks, passed ones included.

    Parameters
    ----------
    message : str
        Every problem, one line each.
    report : SplitValidationReport
        The full report.
    """

    def __init__(self, message: str, report: SplitValidationReport):
        super().__init__(message)
        self.report = report


def _problem_line(c: SplitCheck) -> str:
    where = f"task {c.task!r}, " if c.task else ""
    return f"{where}{c.scope}: {c.detail}"


def name_examples(values: Sequence[Any], max_examples: int) -> str:
    """The first ``max_examples`` values, quoted and comma-joined, with how many more there are.

    Parameters
    ----------
    values : sequence
        What a problem names (item ids, groups, class names ...).
    max_examples : int
        Largest number of values shown.

    Returns
    -------
    str
        E.g. ``"'a', 'b' and 3 more"``.
    """
    shown = ", ".join(repr(v) for v in list(values)[:max_examples])
    more = len(values) - max_examples
    return shown + (f" and {more} more" if more > 0 else "")

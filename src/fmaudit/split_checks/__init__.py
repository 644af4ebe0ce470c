"""Checks of a task's splits (and of the cell branch's partitions) that can fail on data or config, run before any
embedding is spent.

:mod:`~fmaudit.split_checks.tasks` checks the manifests of a config's tasks (the workflow's ``validate`` stage
and ``fmaudit probe``), :mod:`~fmaudit.split_checks.cells` the cell panel; both collect every finding in a
:class:`SplitValidationReport` (:mod:`~fmaudit.split_checks.report`) and raise one :class:`SplitValidationError`
listing every problem.
"""

from fmaudit.split_checks.cells import CELL_CHECKS, validate_cell_panel
from fmaudit.split_checks.report import SplitCheck, SplitValidationError, SplitValidationReport, name_examples
from fmaudit.split_checks.tasks import (
    CHECKS,
    EVALUATED_SPLITS,
    POOLED_DOMAIN,
    REQUIRED_COLUMNS,
    SPLIT_COLUMNS,
    SPLIT_VALUES,
    TILE_KEY,
    validate_task_splits,
)

__all__ = [
    "CELL_CHECKS",
    "CHECKS",
    "EVALUATED_SPLITS",
    "POOLED_DOMAIN",
    "REQUIRED_COLUMNS",
    "SPLIT_COLUMNS",
    "SPLIT_VALUES",
    "SplitCheck",
    "SplitValidationError",
    "SplitValidationReport",
    "TILE_KEY",
    "name_examples",
    "validate_cell_panel",
    "validate_task_splits",
]

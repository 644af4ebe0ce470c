"""The paper check: a paper's headline statements as checks over a run's result tables.

A *claims file* (``resources/presets/claims/<preset>.yaml``, schema ``resources/schemas/claims.schema.yaml``) lists
a paper's claims, each with the sentence it checks (``quote``), a *quantity* (a function of :data:`QUANTITIES`
over the run's result tables, with its ``args``), the value the paper publishes and what counts as reproduced:
``|value - published| <= tolerance``, or ``value <direction> threshold`` (``global standardisation harmful in at
least one scenario``: a count ``>= 1``). The result tables are the report's (``<results>/report/tables/*.csv``,
one per report table, by name), so the report's "Paper check" chapter and ``fmaudit check-claims`` read the
same numbers.

Each claim comes out ``reproduced``, ``not reproduced`` or ``not computable``, the last with why: a table the
run did not write, a table whose rows are a note (the config planned nothing of it), no rows matching the
claim's selection, a value that is not finite. A quantity over a single row carries that row's interval where the
table has one (``<column>_ci_lo`` / ``_ci_hi``, or ``ci_lo`` / ``ci_hi``).
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError, PathLike
from fmaudit.schema import RESOURCES, load_schema, load_yaml, repo_path, validate_against_schema

REPRODUCED, NOT_REPRODUCED, NOT_COMPUTABLE = "reproduced", "not reproduced", "not computable"
STATUSES = (REPRODUCED, NOT_REPRODUCED, NOT_COMPUTABLE)
PRESETS = RESOURCES / "presets"
#: Columns of the paper-check table, in order.
CHECK_COLUMNS = ("paper", "claim", "quote", "source", "quantity", "published", "value", "value_interval_lo",
                 "value_interval_hi", "criterion", "status", "why", "note")
DIRECTIONS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge, "<": operator.lt,
                                                         "<=": operator.le, "==": operator.eq}

__all__ = [
    "CHECK_COLUMNS",
    "Claim",
    "ClaimsFile",
    "Measured",
    "NotComputable",
    "QUANTITIES",
    "ResultTables",
    "STATUSES",
    "check_claims",
    "claims_path",
    "load_claims",
]


class NotComputable(Exception):
    """A quantity cannot be computed from the run's tables; the message says why."""


@dataclass(frozen=True)
class Measured:
    """A quantity's value on the run, its interval where the table has one, and what it was computed from.

    Parameters
    ----------
    value : float
        The quantity's value on the run, in the unit of the column it comes from (a share in [0, 1], a count, a
        rank).
    ci_lo, ci_hi : float
        The interval of a single-row value, as its table gives it (that table names the resampling unit and count);
        NaN otherwise.
    detail : str
        What the value was computed from (table, column, rows), shown as the check's ``why``.
    """

    value: float
    ci_lo: float = float("nan")
    ci_hi: float = float("nan")
    detail: str = ""


# --------------------------------------------------------------------------------------------------
# the result tables
# --------------------------------------------------------------------------------------------------
class ResultTables:
    """A run's result tables by name, read lazily from a folder of ``<name>.csv`` (the report's ``tables/``).

    Parameters
    ----------
    folder : path-like
        The folder of ``<name>.csv`` tables (``<results>/report/tables``).
    """

    def __init__(self, folder: PathLike):
        self.folder = Path(folder)
        self._cache: dict[str, pd.DataFrame] = {}

    def get(self, name: str) -> pd.DataFrame:
        """The table ``name``; :class:`NotComputable` when the run did not write it or wrote a note instead.

        Parameters
        ----------
        name : str
            The table's name (its file name without ``.csv``).

        Returns
        -------
        DataFrame
            The table as written (read once, then cached).

        Raises
        ------
        NotComputable
            When the file is missing or empty, or its only column is ``note``.
        """
        if name not in self._cache:
            path = self.folder / f"{name}.csv"
            if not path.exists():
                raise NotComputable(f"table {name} was not written ({path})")
            try:
                table = pd.read_csv(path)
            except pd.errors.EmptyDataError:
                raise NotComputable(f"table {name} is empty") from None
            self._cache[name] = table
        table = self._cache[name]
        if list(table.columns) == ["note"]:
            note = str(table["note"].iloc[0]) if len(table) else ""
            raise NotComputable(f"table {name}: {note}")
        return table


def _matches(series: pd.Series, wanted: Any) -> np.ndarray:
    values = wanted if isinstance(wanted, (list, tuple)) else [wanted]
    out = np.zeros(len(series), dtype=bool)
    for v in values:
        if isinstance(v, bool):
            out |= series.astype(str).str.lower().to_numpy() == str(v).lower()
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            numeric = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)
            out |= np.isclose(numeric, float(v), rtol=0, atol=1e-9)
        else:
            out |= series.astype(str).to_numpy() == str(v)
    return out


def _rows(tables: ResultTables, table: str, where: Mapping[str, Any] | None) -> pd.DataFrame:
    df = tables.get(table)
    mask = np.ones(len(df), dtype=bool)
    for column, wanted in (where or {}).items():
        if column not in df.columns:
            raise NotComputable(f"table {table} has no column {column!r}")
        mask &= _matches(df[column], wanted)
    if not mask.any():
        raise NotComputable(f"no row of table {table} has {_describe(where)}")
    return df.loc[mask]


def _describe(where: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (where or {}).items()) or "any row"


def _column(rows: pd.DataFrame, table: str, column: str) -> pd.Series:
    if column not in rows.columns:
        raise NotComputable(f"table {table} has no column {column!r}")
    return rows[column]


def _finite(values: pd.Series, table: str, column: str) -> np.ndarray:
    v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        raise NotComputable(f"table {table}: no finite {column} in the selected rows")
    return v


def _interval(rows: pd.DataFrame, column: str) -> tuple[float, float]:
    for lo, hi in ((f"{column}_ci_lo", f"{column}_ci_hi"), ("ci_lo", "ci_hi")):
        if lo in rows.columns and hi in rows.columns:
            return float(rows[lo].iloc[0]), float(rows[hi].iloc[0])
    return float("nan"), float("nan")


# --------------------------------------------------------------------------------------------------
# quantities
# --------------------------------------------------------------------------------------------------
STATISTICS = ("value", "mean", "median", "min", "max", "sum", "count", "count_true", "share_true", "count_below",
              "count_above", "share_below", "share_above", "share_equal")


def table_statistic(tables: ResultTables, table: str, column: str, statistic: str = "mean",
                    where: Mapping[str, Any] | None = None, threshold: float = 0.0, equals: Any = None) -> Measured:
    """One statistic of ``column`` over the rows of ``table`` matching ``where`` (column -> value or list of
    values): ``value`` (exactly one row; with its interval), ``mean``, ``median``, ``min``, ``max``, ``sum``,
    ``count`` (rows), ``count_true`` / ``share_true`` (a boolean column), ``count_below`` / ``count_above`` /
    ``share_below`` / ``share_above`` (strictly beyond ``threshold``), ``share_equal`` (rows equal to
    ``equals``). Non-finite values are left out (and said so).

    Parameters
    ----------
    tables : ResultTables
        The run's tables.
    table : str
        The table's name.
    column : str
        The column the statistic is of.
    statistic : str
        One of :data:`STATISTICS`.
    where : Mapping, optional
        Column -> wanted value or list of values; numbers match within 1e-9, booleans case-insensitively, anything
        else as text. None: every row.
    threshold : float
        The bound of the ``*_below`` / ``*_above`` statistics.
    equals : Any
        The value ``share_equal`` counts.

    Returns
    -------
    Measured
        With an interval only for ``value``.

    Raises
    ------
    FmauditInputError
        For an unknown statistic.
    NotComputable
        When the table, a column or a matching row is missing, or no selected value is finite.
    """
    if statistic not in STATISTICS:
        raise FmauditInputError(f"statistic {statistic!r}: expected one of {STATISTICS}")
    rows = _rows(tables, table, where)
    series = _column(rows, table, column)
    detail = f"{statistic} of {table}.{column} over {len(rows)} row(s) with {_describe(where)}"
    if statistic == "count":
        return Measured(float(len(rows)), detail=detail)
    if statistic == "share_equal":
        return Measured(float(_matches(series, equals).mean()), detail=detail + f" (equal to {equals!r})")
    if statistic in ("count_true", "share_true"):
        truth = series.astype(str).str.lower().isin(["true", "1", "1.0"]).to_numpy()
        known = series.notna().to_numpy()
        if not known.any():
            raise NotComputable(f"table {table}: no {column} in the selected rows")
        hits = float(truth[known].sum())
        return Measured(hits if statistic == "count_true" else hits / known.sum(), detail=detail)
    if statistic == "value":
        if len(rows) != 1:
            raise NotComputable(f"table {table}: {len(rows)} rows have {_describe(where)}; the claim names one")
        v = float(pd.to_numeric(series, errors="coerce").iloc[0])
        if not np.isfinite(v):
            raise NotComputable(f"table {table}: {column} is not finite in the row with {_describe(where)}")
        lo, hi = _interval(rows, column)
        return Measured(v, lo, hi, detail)
    v = _finite(series, table, column)
    dropped = len(rows) - v.size
    if dropped:
        detail += f" ({dropped} non-finite left out)"
    beyond = {"count_below": v < threshold, "count_above": v > threshold, "share_below": v < threshold,
              "share_above": v > threshold}
    if statistic in beyond:
        hits = beyond[statistic]
        return Measured(float(hits.sum()) if statistic.startswith("count") else float(hits.mean()),
                        detail=detail + f" (threshold {threshold:g})")
    fn = {"mean": np.mean, "median": np.median, "min": np.min, "max": np.max, "sum": np.sum}[statistic]
    return Measured(float(fn(v)), detail=detail)


def statistic_difference(tables: ResultTables, minuend: Mapping[str, Any], subtrahend: Mapping[str, Any]) -> Measured:
    """``table_statistic(**minuend) - table_statistic(**subtrahend)`` (e.g. Nuc minus Mean, a method minus
    another).

    Parameters
    ----------
    tables : ResultTables
        The run's tables.
    minuend, subtrahend : Mapping
        Keyword arguments of :func:`table_statistic` (``table``, ``column``, ``statistic``, ``where``...).

    Returns
    -------
    Measured
        The difference, without an interval.
    """
    a = table_statistic(tables, **dict(minuend))
    b = table_statistic(tables, **dict(subtrahend))
    return Measured(a.value - b.value, detail=f"({a.detail}) minus ({b.detail})")


def spearman_correlation(tables: ResultTables, table: str, x: str, y: str,
                         where: Mapping[str, Any] | None = None) -> Measured:
    """Spearman rho between two columns over the matching rows with both finite (average ranks for ties).

    Parameters
    ----------
    tables : ResultTables
        The run's tables.
    table : str
        The table's name.
    x, y : str
        The two columns.
    where : Mapping, optional
        The rows to use, as in :func:`table_statistic`.

    Returns
    -------
    Measured
        Rho in [-1, 1], without an interval.

    Raises
    ------
    NotComputable
        With fewer than 3 rows where both are finite, or a column that does not vary.
    """
    rows = _rows(tables, table, where)
    a = pd.to_numeric(_column(rows, table, x), errors="coerce").to_numpy(dtype=float)
    b = pd.to_numeric(_column(rows, table, y), errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or np.unique(a[ok]).size < 2 or np.unique(b[ok]).size < 2:
        raise NotComputable(f"table {table}: {int(ok.sum())} rows with finite {x} and {y} (need 3 that vary)")
    # scipy.stats here, not with the module: the workflow's planning imports the claims (the pre-flight), and
    # scipy.stats took half a second of every `snakemake` call's start-up
    from scipy.stats import spearmanr

    rho = float(spearmanr(a[ok], b[ok]).statistic)
    return Measured(rho, detail=f"Spearman rho of {table}.{x} and .{y} over {int(ok.sum())} rows with "
                                f"{_describe(where)}")


def encoder_rank(tables: ResultTables, table: str, column: str, encoder: str, where: Mapping[str, Any] | None = None,
                 higher_is_better: bool = True) -> Measured:
    """Rank (1 = best) of ``encoder`` among the encoders of the matching rows, by its mean ``column``.

    Parameters
    ----------
    tables : ResultTables
        The run's tables.
    table : str
        A table with an ``encoder`` column.
    column : str
        The metric ranked by (its mean per encoder over the matching rows).
    encoder : str
        The encoder's slug.
    where : Mapping, optional
        The rows to use, as in :func:`table_statistic`.
    higher_is_better : bool
        Whether the largest mean ranks 1 (False: the smallest, e.g. an ECE).

    Returns
    -------
    Measured
        The rank (ties share the best rank), without an interval.
    """
    rows = _rows(tables, table, where)
    if "encoder" not in rows.columns:
        raise NotComputable(f"table {table} has no encoder column")
    means = pd.to_numeric(_column(rows, table, column), errors="coerce").groupby(rows["encoder"].astype(str)).mean()
    means = means[np.isfinite(means)]
    if encoder not in means.index:
        raise NotComputable(f"table {table}: no finite {column} of encoder {encoder} with {_describe(where)}")
    rank = means.rank(ascending=not higher_is_better, method="min")[encoder]
    return Measured(float(rank), detail=f"rank of {encoder} by mean {table}.{column} among {len(means)} encoders")


def target_rank_of_in_domain_best(tables: ResultTables, target_domain: str, where: Mapping[str, Any] | None = None
                                  ) -> Measured:
    """Where the in-domain best encoder (``rank_in_domain`` 1 of the cross-domain leaderboard) lands on
    ``target_domain`` (its ``rank_on_<target>``); 1 = it stays the best.

    Parameters
    ----------
    tables : ResultTables
        The run's tables (``cross_domain_leaderboard``).
    target_domain : str
        The domain whose ``rank_on_<target_domain>`` column is read.
    where : Mapping, optional
        The rows to use (a task, a source domain), as in :func:`table_statistic`.

    Returns
    -------
    Measured
        The worst target rank among the encoders ranked first in-domain.
    """
    rows = _rows(tables, "cross_domain_leaderboard", where)
    column = f"rank_on_{target_domain}"
    best = rows[pd.to_numeric(_column(rows, "cross_domain_leaderboard", "rank_in_domain"), errors="coerce") == 1]
    if best.empty:
        raise NotComputable("cross_domain_leaderboard: no encoder ranks first in-domain in the selected rows")
    ranks = _finite(_column(best, "cross_domain_leaderboard", column), "cross_domain_leaderboard", column)
    names = ", ".join(best["encoder"].astype(str).unique())
    return Measured(float(ranks.max()), detail=f"{column} of the in-domain best ({names}) with {_describe(where)}")


def prior_shift_negative_cell_share(tables: ResultTables, method: str, where: Mapping[str, Any] | None = None
                                    ) -> Measured:
    """Share of encoder x scenario cells whose mean gain over no adaptation is negative (``29/270``), summed over
    the matching (task, source) rows of the prior-shift summary.

    Parameters
    ----------
    tables : ResultTables
        The run's tables (``prior_shift_summary``).
    method : str
        The adaptation method (``method`` column).
    where : Mapping, optional
        Further rows to select, as in :func:`table_statistic`.

    Returns
    -------
    Measured
        ``sum(n_negative) / sum(n_cells)``, a share in [0, 1].
    """
    rows = _rows(tables, "prior_shift_summary", {**dict(where or {}), "method": method})
    negative = _finite(_column(rows, "prior_shift_summary", "n_negative"), "prior_shift_summary", "n_negative").sum()
    cells = _finite(_column(rows, "prior_shift_summary", "n_cells"), "prior_shift_summary", "n_cells").sum()
    if cells <= 0:
        raise NotComputable(f"prior_shift_summary: no cell of method {method}")
    return Measured(float(negative / cells), detail=f"{int(negative)}/{int(cells)} negative cells of {method}")


def temperature_scaling_fails_share(tables: ResultTables, where: Mapping[str, Any] | None = None,
                                    stage: str = "source_ts", column: str = "ece_top_15_lohi") -> Measured:
    """Share of calibration cells (task, head, fraction, encoder, source, target) whose ECE after the ``stage``
    temperature is not below the raw ECE (temperature scaling failed to reduce it).

    Parameters
    ----------
    tables : ResultTables
        The run's tables (``calibration``).
    where : Mapping, optional
        The rows to use, as in :func:`table_statistic`.
    stage : str
        The calibrated stage compared with ``raw`` (``source_ts``, ``oracle_ts``...).
    column : str
        The ECE column compared.

    Returns
    -------
    Measured
        The share of cells in [0, 1].
    """
    rows = _rows(tables, "calibration", where)
    keys = [c for c in ("task", "head", "fraction", "encoder", "source_domain", "target_domain") if c in rows.columns]
    values = rows.pivot_table(index=keys, columns="stage", values=_column(rows, "calibration", column).name,
                              aggfunc="mean")
    if "raw" not in values.columns or stage not in values.columns:
        raise NotComputable(f"calibration: the selected rows lack the raw or {stage} stage")
    both = values[["raw", stage]].dropna()
    if both.empty:
        raise NotComputable(f"calibration: no cell with both a raw and a {stage} {column}")
    fails = (both[stage] >= both["raw"]).to_numpy()
    return Measured(float(fails.mean()), detail=f"{int(fails.sum())}/{fails.size} cells where {stage} does not lower "
                                                f"{column}")


#: Every quantity a claim can name: a function ``(tables, **args) -> Measured``.
QUANTITIES: dict[str, Callable[..., Measured]] = {
    "table_statistic": table_statistic,
    "statistic_difference": statistic_difference,
    "spearman_correlation": spearman_correlation,
    "encoder_rank": encoder_rank,
    "target_rank_of_in_domain_best": target_rank_of_in_domain_best,
    "prior_shift_negative_cell_share": prior_shift_negative_cell_share,
    "temperature_scaling_fails_share": temperature_scaling_fails_share,
}


# --------------------------------------------------------------------------------------------------
# claims files
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    """One claim of a claims file (see the schema).

    Parameters
    ----------
    id : str
        The claim's id, unique in its file.
    quote : str
        The sentence of the paper it checks.
    quantity : str
        A key of :data:`QUANTITIES`.
    args : Mapping
        The quantity's keyword arguments.
    published : float or None
        The paper's value (needed for a ``tolerance`` criterion).
    reproduced : Mapping
        The criterion: ``{"tolerance": t}`` or ``{"direction": ">=", "threshold": x}``.
    source : str
        Where in the paper (a table, a figure); '' takes the file's.
    note : str
        A remark shown beside the check.
    """

    id: str
    quote: str
    quantity: str
    args: Mapping[str, Any]
    published: float | None
    reproduced: Mapping[str, Any]
    source: str = ""
    note: str = ""

    def criterion(self) -> str:
        """The criterion as text, for the check's table.

        Returns
        -------
        str
            ``|value - published| <= t`` or ``value <direction> <threshold>``.
        """
        if "tolerance" in self.reproduced:
            return f"|value - published| <= {self.reproduced['tolerance']:g}"
        return f"value {self.reproduced['direction']} {self.reproduced['threshold']:g}"

    def judge(self, value: float) -> bool:
        """Whether ``value`` meets the criterion (a tolerance allows 1e-12 of rounding).

        Parameters
        ----------
        value : float
            The quantity measured on the run (finite).

        Returns
        -------
        bool
        """
        if "tolerance" in self.reproduced:
            return abs(value - float(self.published)) <= float(self.reproduced["tolerance"]) + 1e-12
        return DIRECTIONS[self.reproduced["direction"]](value, float(self.reproduced["threshold"]))


@dataclass(frozen=True)
class ClaimsFile:
    """A paper's claims file, as :func:`load_claims` read it.

    Parameters
    ----------
    paper : str
        The paper's preset name (``hema``, ``prism``, ``cellpath``, ``audit``).
    title : str
        The paper's title.
    source : str
        Where the paper is published (the default ``source`` of its claims).
    claims : tuple of Claim
        The claims, in the file's order.
    path : str
        The file read.
    """
    paper: str
    title: str
    source: str
    claims: tuple[Claim, ...] = field(default_factory=tuple)
    path: str = ""


def claims_path(preset: str) -> Path:
    """``resources/presets/claims/<preset>.yaml``.

    Parameters
    ----------
    preset : str
        A preset name.

    Returns
    -------
    Path
    """
    return PRESETS / "claims" / f"{preset}.yaml"


def load_claims(path: PathLike) -> ClaimsFile:
    """A claims file, checked against its schema and against :data:`QUANTITIES` (a quantity it names and the
    arguments it gives; errors name the file and the claim).

    Parameters
    ----------
    path : path-like
        The claims file; a relative path that does not exist is looked up in the repository.

    Returns
    -------
    ClaimsFile

    Raises
    ------
    FmauditInputError
        When the file does not match its schema, repeats an id, names an unknown quantity or arguments it does
        not take, or gives a tolerance without a published value.
    """
    path = repo_path(path)  # resources/presets/... also from another working directory
    data = validate_against_schema(load_yaml(path), load_schema("claims.schema.yaml"), str(path), fill_defaults=True)
    claims, seen = [], set()
    for i, raw in enumerate(data["claims"]):
        where = f"{path}: claim {raw['id']!r} (claims[{i}])"
        if raw["id"] in seen:
            raise FmauditInputError(f"{where}: the id is used twice")
        seen.add(raw["id"])
        if raw["quantity"] not in QUANTITIES:
            raise FmauditInputError(f"{where}: unknown quantity {raw['quantity']!r}; known: {', '.join(QUANTITIES)}")
        try:
            inspect.signature(QUANTITIES[raw["quantity"]]).bind(None, **raw["args"])
        except TypeError as err:
            raise FmauditInputError(f"{where}: arguments of {raw['quantity']}: {err}") from err
        if "tolerance" in raw["reproduced"] and raw["published"] is None:
            raise FmauditInputError(f"{where}: a tolerance check needs the published value")
        claims.append(Claim(raw["id"], raw["quote"].strip(), raw["quantity"], dict(raw["args"]), raw["published"],
                            dict(raw["reproduced"]), raw.get("source", ""), raw.get("note", "")))
    return ClaimsFile(data["paper"], data.get("title", ""), data.get("source", ""), tuple(claims), str(path))


def check_claims(claims: ClaimsFile | Sequence[ClaimsFile], tables: ResultTables | PathLike) -> pd.DataFrame:
    """One row per claim (columns :data:`CHECK_COLUMNS`): the published value, this run's value with its interval
    where the table gives one (``value_interval_lo`` / ``_hi``: the source row's own, whose unit and count that
    table names), the criterion, and ``reproduced`` / ``not reproduced`` / ``not computable`` with why.

    Parameters
    ----------
    claims : ClaimsFile or sequence of ClaimsFile
        The claims to check.
    tables : ResultTables or path-like
        The run's tables, or their folder.

    Returns
    -------
    DataFrame
        Columns :data:`CHECK_COLUMNS`, one row per claim in file order; ``value`` and the interval NaN where not
        computable.
    """
    files = [claims] if isinstance(claims, ClaimsFile) else list(claims)
    tables = tables if isinstance(tables, ResultTables) else ResultTables(tables)
    rows = []
    for file in files:
        for c in file.claims:
            row = {"paper": file.paper, "claim": c.id, "quote": c.quote, "source": c.source or file.source,
                   "quantity": c.quantity, "published": np.nan if c.published is None else float(c.published),
                   "value": np.nan, "value_interval_lo": np.nan, "value_interval_hi": np.nan,
                   "criterion": c.criterion(), "note": c.note}
            try:
                measured = QUANTITIES[c.quantity](tables, **c.args)
            except NotComputable as why:
                row.update(status=NOT_COMPUTABLE, why=str(why))
            else:
                if not np.isfinite(measured.value):
                    row.update(status=NOT_COMPUTABLE, why=f"not finite: {measured.detail}")
                else:
                    ok = c.judge(measured.value)
                    row.update(value=measured.value, value_interval_lo=measured.ci_lo,
                               value_interval_hi=measured.ci_hi, status=REPRODUCED if ok else NOT_REPRODUCED,
                               why=measured.detail)
            rows.append(row)
    return pd.DataFrame(rows, columns=list(CHECK_COLUMNS))

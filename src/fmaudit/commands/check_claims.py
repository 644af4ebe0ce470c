"""``fmaudit check-claims``: a paper's claims file checked against a finished run's result tables, outside the
workflow; the same check as the report's Paper check chapter (:mod:`fmaudit.claims`).

    fmaudit check-claims --preset hema --results results/hema [--out check.csv] [--strict]
    fmaudit check-claims --claims my.claims.yaml --tables results/my-study/report/tables

``--results`` is a study's results folder (its report's ``tables/`` are read); ``--tables`` a folder of result
tables (``<name>.csv``) given directly."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from fmaudit.claims import NOT_REPRODUCED, STATUSES, check_claims, claims_path, load_claims
from fmaudit.io import FmauditInputError, write_table

__all__ = ["register", "run"]


def run(args: argparse.Namespace) -> int:
    """Run ``fmaudit check-claims``: print each claim's status and, with ``--strict``, fail on one not reproduced.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options: ``preset`` or ``claims`` (exactly one), ``results`` or ``tables`` (exactly one), ``out``
        and ``strict``.

    Returns
    -------
    int
        1 with ``--strict`` when a claim is not reproduced, else 0.

    Raises
    ------
    FmauditInputError
        When both or neither of ``--preset``/``--claims`` or of ``--results``/``--tables`` are given, the preset has
        no claims file, or the folder of result tables does not exist.
    """
    if (args.preset is None) == (args.claims is None):
        raise FmauditInputError("check-claims: give --preset NAME or --claims FILE")
    if (args.results is None) == (args.tables is None):
        raise FmauditInputError("check-claims: give --results FOLDER (a study's results) or --tables FOLDER")
    path = claims_path(args.preset) if args.preset else Path(args.claims)
    if args.preset and not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise FmauditInputError(f"--preset {args.preset}: no claims file {path} (presets with one: {', '.join(known)})")
    tables = Path(args.tables) if args.tables else Path(args.results) / "report" / "tables"
    if not tables.is_dir():
        raise FmauditInputError(f"{tables}: no such folder of result tables (run the workflow's report first)")
    table = check_claims(load_claims(path), tables)
    with pd.option_context("display.max_colwidth", 60, "display.width", 200):
        print(table[["claim", "published", "value", "value_interval_lo", "value_interval_hi", "criterion",
                     "status"]].to_string(index=False))
    for r in table[table["status"] != "reproduced"].itertuples(index=False):
        print(f"{r.claim}: {r.status}: {r.why}")
    counts = table["status"].value_counts()
    print(f"{path}: " + ", ".join(f"{int(counts.get(s, 0))} {s}" for s in STATUSES))
    if args.out:
        write_table(args.out, table)
    return 1 if args.strict and (table["status"] == NOT_REPRODUCED).any() else 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``check-claims`` to the ``fmaudit`` command line.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.

    Returns
    -------
    argparse.ArgumentParser
        The ``check-claims`` parser, its ``func`` set to :func:`run`.
    """
    p = subparsers.add_parser("check-claims", help="check a paper's claims file against a run's result tables (the "
                              "report's Paper check, outside the workflow)")
    p.add_argument("--preset", help="a preset with a claims file (resources/presets/claims/<preset>.yaml)")
    p.add_argument("--claims", help="a claims file (instead of --preset)")
    p.add_argument("--results", help="a study's results folder (results/<study>; its report/tables are read)")
    p.add_argument("--tables", help="a folder of result tables <name>.csv (instead of --results)")
    p.add_argument("--out", help="write the check table here (.csv, .tsv, .parquet, .md)")
    p.add_argument("--strict", action="store_true", help="exit with status 1 when a claim is not reproduced")
    p.set_defaults(func=run)
    return p

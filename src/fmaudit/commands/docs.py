"""``fmaudit docs settings``: write ``docs/settings.md`` from the config schema (:mod:`fmaudit.settings_reference`);
``--check`` fails, writing nothing, when the page on disk differs from the schema."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fmaudit.io import write_text
from fmaudit.schema import REPO_ROOT
from fmaudit.settings_reference import settings_reference

__all__ = ["register", "run"]

SETTINGS_PAGE = Path("docs") / "settings.md"


def run(args: argparse.Namespace) -> int:
    """Run ``fmaudit docs settings``: write the settings page, or with ``--check`` compare it with the one on disk.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options (``page``: only ``settings``; ``out``: default ``docs/settings.md`` of this source tree;
        ``check``).

    Returns
    -------
    int
        1 with ``--check`` when the page is missing or stale (nothing written), else 0.
    """
    out = Path(args.out) if args.out else REPO_ROOT / SETTINGS_PAGE
    text = settings_reference()
    if args.check:
        if not out.is_file() or out.read_text() != text:
            print(f"{out} is stale: run `fmaudit docs settings` to regenerate it from the config schema",
                  file=sys.stderr)
            return 1
        return 0
    write_text(out, text)
    print(f"wrote {out}")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``docs`` to the ``fmaudit`` command line.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.

    Returns
    -------
    argparse.ArgumentParser
        The ``docs`` parser, its ``func`` set to :func:`run`.
    """
    docs = subparsers.add_parser("docs", help="write the pages of docs/ generated from the repository (settings)")
    docs.add_argument("page", choices=["settings"], help="settings: docs/settings.md from the config schema")
    docs.add_argument("--out", help="where to write it (default: docs/settings.md of this source tree)")
    docs.add_argument("--check", action="store_true", help="only check that the page is up to date")
    docs.set_defaults(func=run)
    return docs

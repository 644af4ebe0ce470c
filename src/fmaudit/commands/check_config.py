"""``fmaudit check-config``: exactly the checks the workflow runs before planning a job
(:func:`fmaudit.config.check_config`, which ``rules/common.smk`` calls too)."""

from __future__ import annotations

import argparse

__all__ = ["register", "run"]


def run(args: argparse.Namespace) -> int:
    from fmaudit.config import check_config, load_config

    check_config(load_config(args.configfile))
    print(f"{args.configfile}: ok")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    cc = subparsers.add_parser("check-config", help="validate a config, its registries, names, grids and slide sheets "
                               "(the workflow's checks)")
    cc.add_argument("--configfile", required=True)
    cc.set_defaults(func=run)
    return cc

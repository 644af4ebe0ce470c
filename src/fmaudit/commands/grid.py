"""``fmaudit grid``: runs and jobs of a config per analysis and protocol, without running anything."""

from __future__ import annotations

import argparse
import json

__all__ = ["register", "run"]


def run(args: argparse.Namespace) -> int:
    from fmaudit import grid
    from fmaudit.config import load_config
    from fmaudit.registry import load_dataset_registry

    config = load_config(args.configfile)
    # a total line per analysis and one for the config (``summarize(totals=True)``)
    summary = grid.summarize(config, load_dataset_registry(config["dataset_registry"]), totals=True)
    if args.json:
        print(json.dumps(summary.to_dict(orient="records"), indent=2))
    else:
        print(summary.to_string(index=False))
        print(grid.JOBS_NOTE)
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    gr = subparsers.add_parser("grid", help="count runs and jobs of a config without running anything")
    gr.add_argument("--configfile", required=True)
    gr.add_argument("--json", action="store_true")
    gr.set_defaults(func=run)
    return gr

"""The command line: the same analysis functions as the workflow, on files the user brings.

    fmaudit init --images my-study/labels.csv --encoders uni,virchow2 --out my-study
    fmaudit list encoders|datasets|kinds|analyses
    fmaudit probe --train-features X.npy --train-labels y.npy --test-features ... --test-labels ... --out runs.csv
    fmaudit grid --configfile resources/presets/prism.yaml [--json]
    fmaudit check-config --configfile config.yaml
    fmaudit check-claims --preset hema --results results/hema
    fmaudit download SLUG --data-root DIR
    fmaudit embed --encoder SLUG|timm:<org>/<repo>|hf:<org>/<repo>|FILE --images SHEET.csv|FOLDER --out OUT.h5
    fmaudit cost --results results/demo

Each subcommand lives in :mod:`fmaudit.commands` (``commands/<name>.py`` with ``register(subparsers)``); this
module only dispatches. A new command is a module there and one entry in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from fmaudit.commands import (
    adapt,
    cells,
    check_claims,
    check_config,
    cost,
    download,
    embed,
    gate,
    grid,
    init,
    listing,
    probe,
    profile,
)
from fmaudit.io import FmauditInputError

#: Subcommand modules, in the order ``fmaudit --help`` lists them.
COMMANDS = (init, check_config, listing, probe, embed, grid, download, check_claims, profile, cells, gate, adapt, cost)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fmaudit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FmauditInputError, FileNotFoundError) as e:
        print(f"fmaudit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

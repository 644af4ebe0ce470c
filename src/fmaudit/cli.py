"""The command line: the same analysis functions as the workflow, on files the user brings.

    fmaudit init --images my-study/labels.csv --encoders uni,virchow2 --out my-study
    fmaudit list encoders|datasets|kinds|analyses
    fmaudit probe --train-features X.npy --train-labels y.npy --test-features ... --test-labels ... --out runs.csv
    fmaudit grid --configfile resources/presets/prism.yaml [--json]
    fmaudit check-config --configfile config.yaml
    fmaudit check-claims --preset hema --results results/hema
    fmaudit download SLUG --data-root DIR
    fmaudit embed --encoder SLUG|timm:<org>/<repo>|hf:<org>/<repo>|FILE --images SHEET.csv|FOLDER --out OUT.h5
    fmaudit docs settings                      # docs/settings.md from the config schema
    fmaudit cost --results results/demo

Each subcommand lives in :mod:`fmaudit.commands` (``commands/<name>.py`` with ``register(subparsers)``); this
module only dispatches. A new command is a module there and one entry in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import Any, Sequence

from fmaudit.io import FmauditInputError

#: Subcommands, in the order ``fmaudit --help`` lists them: name -> (module, one-line help, the same as the
#: module's own: tests/test_cli.py). A command's module is imported only when that command runs (or by
#: ``build_parser()``, which registers them all), so ``fmaudit grid`` starts without importing torch for the
#: commands that need it.
COMMANDS: dict[str, tuple[Any, str]] = {
    "init": ("fmaudit.commands.init", "write a config for your own tiles or slides (a sheet is enough), check it "
             "and show its plan"),
    "check-config": ("fmaudit.commands.check_config", "the pre-flight of a config: its registries, names, grids, "
                     "the sheets of your own data, weight files (the workflow's checks), and the data checks "
                     "(splits, class names, every image and slide) of manifests at hand"),
    "list": ("fmaudit.commands.listing", "list encoders, data sets, data-set kinds or analyses a config can name"),
    "probe": ("fmaudit.commands.probe", "label-fraction probe grid with the calibration ladder on your own arrays"),
    "embed": ("fmaudit.commands.embed", "embed a sheet or folder of images with one encoder into an HDF5 file "
              "(outside the workflow, resumable)"),
    "grid": ("fmaudit.commands.grid", "count runs and jobs of a config without running anything"),
    "download": ("fmaudit.commands.download", "fetch and unpack one registered data set (resumable, checksummed)"),
    "check-claims": ("fmaudit.commands.check_claims", "check a paper's claims file against a run's result tables "
                     "(the report's Paper check, outside the workflow)"),
    "profile": ("fmaudit.commands.profile", "install a Snakemake profile where `snakemake --profile NAME` finds it"),
    "cells": ("fmaudit.commands.cells", "Xenium sections: register cells on the H&E image, write demo sections"),
    "gate": ("fmaudit.commands.gate", "fit/export the two-threshold abstention gate, or apply an exported one"),
    "adapt": ("fmaudit.commands.adapt", "label-free adaptation (CBR, global standardisation, SHOT-IM, BBSE, EM) "
              "of a source probe on your arrays"),
    "cost": ("fmaudit.commands.cost", "CPU-hours, GPU-hours and memory of a study's jobs (Snakemake benchmarks)"),
    "docs": ("fmaudit.commands.docs", "write the pages of docs/ generated from the repository (settings)"),
}


def command_module(name: str) -> ModuleType:
    """The module (or any object with ``register(subparsers)``) of subcommand ``name``.

    Parameters
    ----------
    name : str
        A key of :data:`COMMANDS` (``grid``, ``check-config``, ``cost``...).

    Returns
    -------
    ModuleType
        The imported module (imported on this call when :data:`COMMANDS` gives its dotted name).
    """
    module = COMMANDS[name][0]
    return importlib.import_module(module) if isinstance(module, str) else module


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only`` every other subcommand is listed by its help without importing its module.

    Parameters
    ----------
    only : str, optional
        The one subcommand whose module is imported and whose options are registered; None registers every
        subcommand, ``""`` none (``fmaudit --help`` stays fast).

    Returns
    -------
    argparse.ArgumentParser
    """
    p = argparse.ArgumentParser(prog="fmaudit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        if only is None or name == only:
            command_module(name).register(sub)
        else:
            sub.add_parser(name, help=help_text)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fmaudit`` command line.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after the program name; None: ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit status: the subcommand's (0 when it returns None), or 2 after printing an
        :class:`~fmaudit.io.FmauditInputError` or a missing file as ``fmaudit: error: ...`` on stderr.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    named = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(only=named if named in COMMANDS else "").parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FmauditInputError, FileNotFoundError) as e:
        print(f"fmaudit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

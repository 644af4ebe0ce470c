"""``fmaudit check-config``: the pre-flight of a config, exactly as the workflow runs it (:mod:`fmaudit.preflight`).

The plan stage (:func:`fmaudit.preflight.check_config`, which ``rules/common.smk`` calls too: registries, names,
kinds and preparers, grids, and every line of the sheets of the user's own data sets) and the encoders a run
could not embed (:func:`fmaudit.preflight.unusable_encoders`, where the workflow stops before its first job);
then the data stage of the ``validate`` rule (:func:`fmaudit.preflight.check_data`: splits, class names, every
image header, a decoded sample, every slide, small test splits) for every task whose manifests are at hand:
prepared by the workflow already (``results/<study>/manifests/``, from the working directory), or, for the
user's own data sets (kinds ``image_table``, ``slide_table``, ``features``), prepared here in memory from their
sheets (nothing is written). Tasks without all their manifests are listed as not checked: ``snakemake
validate`` prepares and checks them without embedding anything."""

from __future__ import annotations

import argparse
from pathlib import Path

from fmaudit.config import dataset_params, load_config
from fmaudit.datasets import dataset_group_unit, prepare_dataset
from fmaudit.datasets.own import OWN_KINDS
from fmaudit.io import FmauditInputError
from fmaudit.preflight import FILE_CHECKS, check_config, check_data, data_checks, unusable_encoders

__all__ = ["prepare_own_data", "register", "run"]


def prepare_own_data(config, datasets, paths) -> dict:
    """Data set -> its manifest, prepared in memory, for every own-data set among ``paths`` (data set -> manifest
    file) whose manifest the workflow has not written yet; a bad input raises naming the file and line.

    Parameters
    ----------
    config : dict
        The filled config (:func:`fmaudit.config.load_config`); its ``data_root`` and data-set params are read.
    datasets : dict
        The data-set registry as the pre-flight resolved it (slug -> entry with ``kind`` and ``preparer``).
    paths : dict of str to str or Path
        Data set -> the manifest (or file) the workflow writes for it; a set whose file exists is skipped.

    Returns
    -------
    dict of str to DataFrame
        Data set -> its manifest (one row per item, the preparer's columns), for the own-data kinds other than
        ``cell_table`` only.

    Raises
    ------
    FmauditInputError
        When a sheet has a bad line (raised by the preparer, naming the file and line).
    """
    frames = {}
    for ds, path in paths.items():
        entry = datasets[ds]
        if Path(path).is_file() or entry["kind"] not in OWN_KINDS or entry["kind"] == "cell_table":
            continue
        params = dataset_params(config, datasets, ds)
        frames[ds] = prepare_dataset(ds, entry["preparer"], config["data_root"], params,
                                     group_unit=dataset_group_unit(entry, params))
        print(f"data set {ds!r}: prepared in memory from {params.get('sheet')} ({len(frames[ds])} items) to check it")
    return frames


def run(args: argparse.Namespace) -> int:
    """Run ``fmaudit check-config``: the plan checks of ``--configfile``, then the data checks of every task at hand.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options (``configfile``).

    Returns
    -------
    int
        Exit status 0 when every check passed (a failed check raises instead).

    Raises
    ------
    FmauditInputError
        When the config, a registry, an own-data sheet or a manifest fails a check, or an encoder could not be
        embedded (every problem listed).
    """
    config = load_config(args.configfile)
    encoders, datasets = check_config(config)
    unusable = unusable_encoders(config, encoders)
    if unusable:
        raise FmauditInputError(f"{args.configfile}: a run would stop before its first job:\n"
                                + "\n".join(f"  - {why}" for why in unusable.values()))
    checks = data_checks(config, datasets)
    frames = prepare_own_data(config, datasets, {**checks.files, **checks.manifests})

    def at_hand(ds: str) -> bool:
        return ds in frames or Path(checks.manifests[ds]).is_file()

    ready = [t for t, spec in checks.tasks.items() if all(at_hand(ds) for ds in spec["datasets"])]
    for task, spec in checks.tasks.items():
        if task not in ready:
            missing = [checks.manifests[ds] for ds in spec["datasets"] if not at_hand(ds)]
            print(f"task {task!r}: data not checked, manifests not prepared yet ({', '.join(missing)}); "
                  "`snakemake validate` prepares and checks them")
    if ready:
        prepared = checks.restricted_to(ready)
        report = check_data(prepared, frames)  # raises, listing every problem
        for check in report.checks:
            if check.status == "ok" and check.check in FILE_CHECKS:
                print(f"{check.scope}: {check.detail}")
        for warning in report.warnings:
            print(f"warning: {warning}")
        for task in ready:
            print(f"task {task!r}: data valid ({sum(c.task == task for c in report.checks)} checks on "
                  f"{', '.join(prepared.manifests[ds] for ds in prepared.tasks[task]['datasets'])})")
    print(f"{args.configfile}: ok")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``check-config`` to the ``fmaudit`` command line.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.

    Returns
    -------
    argparse.ArgumentParser
        The ``check-config`` parser, its ``func`` set to :func:`run`.
    """
    cc = subparsers.add_parser("check-config", help="the pre-flight of a config: its registries, names, grids, the "
                               "sheets of your own data, weight files (the workflow's checks), and the data checks "
                               "(splits, class names, every image and slide) of manifests at hand")
    cc.add_argument("--configfile", required=True)
    cc.set_defaults(func=run)
    return cc

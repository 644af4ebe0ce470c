"""``fmaudit check-config``: the pre-flight of a config, exactly as the workflow runs it (:mod:`fmaudit.preflight`).

The plan stage (:func:`fmaudit.preflight.check_config`, which ``rules/common.smk`` calls too) and the encoders a
run could not embed (:func:`fmaudit.preflight.unusable_encoders`, where the workflow stops before its first job);
then, for every task whose manifests the workflow has already prepared (``results/<study>/manifests/``, from the
working directory), the data stage of its ``validate`` rule (:func:`fmaudit.preflight.check_data`). Tasks
without all their manifests are listed as not checked: ``snakemake validate`` prepares and checks them without
embedding anything."""

from __future__ import annotations

import argparse
from pathlib import Path

from fmaudit.config import load_config
from fmaudit.io import FmauditInputError
from fmaudit.preflight import check_config, check_data, data_checks, unusable_encoders

__all__ = ["register", "run"]


def run(args: argparse.Namespace) -> int:
    config = load_config(args.configfile)
    encoders, datasets = check_config(config)
    unusable = unusable_encoders(config, encoders)
    if unusable:
        raise FmauditInputError(f"{args.configfile}: a run would stop before its first job:\n"
                                + "\n".join(f"  - {why}" for why in unusable.values()))
    checks = data_checks(config, datasets)
    ready = [t for t, spec in checks.tasks.items()
             if all(Path(checks.manifests[ds]).is_file() for ds in spec["datasets"])]
    for task, spec in checks.tasks.items():
        if task not in ready:
            missing = [checks.manifests[ds] for ds in spec["datasets"] if not Path(checks.manifests[ds]).is_file()]
            print(f"task {task!r}: data not checked, manifests not prepared yet ({', '.join(missing)}); "
                  "`snakemake validate` prepares and checks them")
    if ready:
        prepared = checks.restricted_to(ready)
        report = check_data(prepared)  # raises, listing every problem
        for task in ready:
            print(f"task {task!r}: data valid ({sum(c.task == task for c in report.checks)} checks on "
                  f"{', '.join(prepared.manifests[ds] for ds in prepared.tasks[task]['datasets'])})")
    print(f"{args.configfile}: ok")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    cc = subparsers.add_parser("check-config", help="the pre-flight of a config: its registries, names, grids, slide "
                               "sheets and weight files (the workflow's checks), and the data checks of manifests "
                               "already prepared")
    cc.add_argument("--configfile", required=True)
    cc.set_defaults(func=run)
    return cc

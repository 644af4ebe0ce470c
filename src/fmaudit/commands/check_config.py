"""``fmaudit check-config``: exactly the checks the workflow runs before planning a job
(:func:`fmaudit.config.check_config`, which ``rules/common.smk`` calls too), the encoders a run could not embed
(:func:`fmaudit.config.unusable_encoders`, where the workflow stops before its first job), and, for every task
whose manifests the workflow has already prepared (``results/<study>/manifests/``, from the working directory),
the split checks of its ``validate`` stage on them. Tasks without all their manifests are listed as not checked:
``snakemake validate`` prepares and checks them without embedding anything."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register", "run"]


def run(args: argparse.Namespace) -> int:
    from fmaudit.config import check_config, load_config, manifest_file, unusable_encoders
    from fmaudit.grid import resolved_tile_tasks
    from fmaudit.io import FmauditInputError
    from fmaudit.jobs.data import validate_manifests

    config = load_config(args.configfile)
    encoders, datasets = check_config(config)
    unusable = unusable_encoders(config, encoders)
    if unusable:
        raise FmauditInputError(f"{args.configfile}: a run would stop before its first job:\n"
                                + "\n".join(f"  - {why}" for why in unusable.values()))
    tasks = resolved_tile_tasks(config, datasets)
    ready = {t: spec for t, spec in tasks.items()
             if all(Path(manifest_file(config, ds)).is_file() for ds in spec["datasets"])}
    for task in tasks:
        if task not in ready:
            missing = [manifest_file(config, ds) for ds in tasks[task]["datasets"]
                       if not Path(manifest_file(config, ds)).is_file()]
            print(f"task {task!r}: splits not checked, manifests not prepared yet ({', '.join(missing)}); "
                  "`snakemake validate` prepares and checks them")
    if ready:
        manifests = {ds: manifest_file(config, ds) for spec in ready.values() for ds in spec["datasets"]}
        report = validate_manifests(manifests, ready)  # raises, listing every problem
        for task in ready:
            print(f"task {task!r}: splits valid ({sum(c.task == task for c in report.checks)} checks on "
                  f"{', '.join(manifests[ds] for ds in ready[task]['datasets'])})")
    print(f"{args.configfile}: ok")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    cc = subparsers.add_parser("check-config", help="validate a config, its registries, names, grids, slide sheets and "
                               "weight files (the workflow's checks), and the splits of manifests already prepared")
    cc.add_argument("--configfile", required=True)
    cc.set_defaults(func=run)
    return cc

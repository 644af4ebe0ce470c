"""``fmaudit grid``: runs and jobs of a config per analysis and protocol, without running anything; with
``--estimate``, what its plan asks of a cluster through a profile.

    fmaudit grid --configfile resources/presets/cellpath.yaml [--json]
    fmaudit grid --configfile resources/presets/cellpath.yaml --estimate [--profile profiles/slurm ...]

The estimate (:func:`fmaudit.cluster.estimate`) lists, per rule and encoder, the cluster submissions the plan makes
(the profile's ``group-components``), the largest memory and wall time a job and a submission ask for, and the
requested GPU- and CPU-hours, from the same request planner the workflow's rules use: a cost model of each encoder
and the items of each job, or the study's benchmark files of an earlier run. ``--profile`` is read as Snakemake
reads it (a folder, or a name where Snakemake looks for named profiles; several are layered in order); default:
``profiles/slurm`` of this repository.
"""

from __future__ import annotations

import argparse
import json

from fmaudit import grid
from fmaudit.cluster import estimate
from fmaudit.config import load_config, results_dir
from fmaudit.preflight import check_config
from fmaudit.profiles import default_template, read_profile
from fmaudit.registry import load_dataset_registry

__all__ = ["register", "run"]


def _estimate(args: argparse.Namespace, config: dict) -> int:
    encoders, datasets = check_config(config)
    settings = read_profile(args.profile or [default_template().parent])
    table = estimate(config, encoders, datasets, settings, results_dir(config))
    if args.json:
        print(json.dumps(table.to_dict(orient="records"), indent=2, default=float))
        return 0
    shown = table.copy()
    for col in ("gpu_hours", "cpu_hours"):
        shown[col] = [f"{v:.1f}" for v in shown[col]]
    print(f"What {args.configfile} asks of the cluster through {settings.source}:")
    print(shown.to_string(index=False))
    total = table[table["rule"] == "all"].iloc[0]
    print(f"{int(total['submissions'])} submissions for {int(total['jobs'])} jobs; requested "
          f"{total['gpu_hours']:.1f} GPU-hours and {total['cpu_hours']:.1f} CPU-hours (wall time x GPUs, x CPUs).")
    print("basis: model = the cost model from the registry and the prepared manifests; default = before the "
          "manifest is prepared (stated item counts); measured = this study's benchmark files of an earlier run.")
    return 0


def run(args: argparse.Namespace) -> int:
    config = load_config(args.configfile)
    if args.estimate:
        return _estimate(args, config)
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
    gr.add_argument("--estimate", action="store_true",
                    help="what the plan asks of a cluster: submissions, memory, wall time, GPU- and CPU-hours")
    gr.add_argument("--profile", action="append",
                    help="Snakemake profile(s) the estimate reads, in order (default: profiles/slurm)")
    gr.set_defaults(func=run)
    return gr

"""``fmaudit grid``: runs and jobs of a config per analysis and protocol, without running anything; with
``--estimate``, what its plan asks of a cluster and what it is predicted to cost, before anything runs.

    fmaudit grid --configfile resources/presets/cellpath.yaml [--json]
    fmaudit grid --configfile resources/presets/cellpath.yaml --estimate [--profile profiles/slurm ...]
                 [--measured-costs costs.csv]

The estimate has two parts. *What it asks of the cluster* (:func:`fmaudit.cluster.estimate`): per rule and
encoder, the cluster submissions the plan makes (the profile's ``group-components``), the largest memory and wall
time a job and a submission ask for, and the requested GPU- and CPU-hours, from the same request planner the
workflow's rules use (a cost model of each encoder and the items of each job, or the study's benchmark files of
an earlier run). ``--profile`` is read as Snakemake reads it (a folder, or a name where Snakemake looks for named
profiles; several are layered in order); default: ``profiles/slurm`` of this repository. *What it is predicted to
cost* (:func:`fmaudit.costs.estimate_cost`): each planned job's work (its runs from the grid; for an embedding,
the images of its data set, counted from the study's manifests where they are prepared) times a measured cost
per unit: ``--measured-costs`` (written by ``fmaudit cost --per-unit`` from the benchmark files of an earlier
run, ideally a pilot on the same cluster with the same encoders), by default the committed table
``benchmarks/measured_costs.csv`` (the demo measured on the development machine, CPU only: it knows nothing of
GPU speed, and says so in its ``source`` column). Requests are what a job may use (with margins); the predicted
cost is what the measured jobs did use.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from fmaudit import costs, grid
from fmaudit.cluster import estimate as cluster_estimate
from fmaudit.config import load_config, results_dir
from fmaudit.grid import parts_with
from fmaudit.io import read_table
from fmaudit.preflight import check_config
from fmaudit.profiles import default_template, read_profile
from fmaudit.registry import load_dataset_registry

__all__ = ["MEASURED_COSTS", "estimate", "register", "run"]

#: The committed measured per-unit costs (``fmaudit cost --per-unit`` on the demo).
MEASURED_COSTS = Path(__file__).resolve().parents[3] / "benchmarks" / "measured_costs.csv"


def _manifest_items(config: dict) -> dict[str, int]:
    """Data set -> items, from the study's prepared manifests (``results/<study>/manifests/*.parquet``)."""
    folder = Path(results_dir(config)) / "manifests"
    return {p.stem: len(read_table(p)) for p in sorted(folder.glob("*.parquet"))} if folder.is_dir() else {}


def estimate(config: dict, measured: str | Path, checked: tuple[dict, dict] | None = None) -> pd.DataFrame:
    """The predicted cost of ``config``'s jobs (:func:`fmaudit.costs.estimate_cost`) from the per-unit costs in
    ``measured``; ``checked``: :func:`~fmaudit.preflight.check_config`'s result, when the caller has it.

    Parameters
    ----------
    config : dict
        The filled config.
    measured : str or Path
        A per-unit cost table (``fmaudit cost --per-unit``; :data:`MEASURED_COSTS` by default in the command).
    checked : tuple of (dict, dict), optional
        ``(encoders, datasets)`` registries from the pre-flight; run here when None.

    Returns
    -------
    DataFrame
        One row per (rule, encoder) and a closing ``total`` row, the columns of
        :data:`fmaudit.costs.ESTIMATE_COLUMNS` (``jobs``, ``units``, the predicted ``wall_hours``, ``cpu_hours``,
        ``gpu_hours``, ``rate_from``, ``note`` ...); NaN hours where the units or rate are unknown.
    """
    encoders, datasets = checked or check_config(config)
    prior_shift = {ps["task"]: ps for _, _, ps in parts_with(config, "prior_shift")}
    planned = costs.planned_units(config, datasets, _manifest_items(config))
    return costs.estimate_cost(planned, costs.read_unit_costs(measured), costs.gpu_plan(config, encoders, prior_shift))


def _print_requests(args: argparse.Namespace, table: pd.DataFrame, source: str) -> None:
    shown = table.copy()
    for col in ("gpu_hours", "cpu_hours"):
        shown[col] = [f"{v:.1f}" for v in shown[col]]
    print(f"What {args.configfile} asks of the cluster through {source}:")
    print(shown.to_string(index=False))
    total = table[table["rule"] == "all"].iloc[0]
    print(f"{int(total['submissions'])} submissions for {int(total['jobs'])} jobs; requested "
          f"{total['gpu_hours']:.1f} GPU-hours and {total['cpu_hours']:.1f} CPU-hours (wall time x GPUs, x CPUs).")
    print("basis: model = the cost model from the registry and the prepared manifests; default = before the "
          "manifest is prepared (stated item counts); measured = this study's benchmark files of an earlier run.")


def _print_predicted(args: argparse.Namespace, table: pd.DataFrame, measured: str | Path) -> None:
    shown = table.copy()
    for col in ("wall_hours", "cpu_hours", "gpu_hours"):
        shown[col] = [f"{v:.4g}" if pd.notna(v) else "n/a" for v in shown[col]]
    shown["units"] = [f"{v:.0f}" if pd.notna(v) else "n/a" for v in shown["units"]]
    sources = list(dict.fromkeys(r for r in shown["rate_from"] if r))
    shown["rate_from"] = [f"[{sources.index(r) + 1}]" if r else "" for r in shown["rate_from"]]
    print(f"Predicted cost of {args.configfile} from the measured per-unit costs in {measured}:")
    print(shown.to_string(index=False))
    for i, source in enumerate(sources, 1):
        print(f"[{i}] {source}")
    print("A measured rate spreads each measured job's start-up over its units: a grid with many more units per "
          "job than the measurement is predicted high.")


def _estimate(args: argparse.Namespace, config: dict) -> int:
    encoders, datasets = check_config(config)
    settings = read_profile(args.profile or [default_template().parent])
    requests = cluster_estimate(config, encoders, datasets, settings, results_dir(config))
    measured = args.measured_costs or MEASURED_COSTS
    predicted = estimate(config, measured, (encoders, datasets))
    if args.json:
        print(json.dumps({"requests": requests.to_dict(orient="records"),
                          "predicted_cost": predicted.to_dict(orient="records")}, indent=2, default=float))
        return 0
    _print_requests(args, requests, settings.source)
    print()
    _print_predicted(args, predicted, measured)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``fmaudit grid``: runs and jobs per analysis and protocol, or with ``--estimate`` the cluster requests
    and predicted cost.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options (``configfile``, ``json``, ``estimate``, ``profile``, ``measured_costs``).

    Returns
    -------
    int
        Exit status 0.

    Raises
    ------
    FmauditInputError
        When the config fails its checks.
    """
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
    """Add ``grid`` to the ``fmaudit`` command line.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.

    Returns
    -------
    argparse.ArgumentParser
        The ``grid`` parser, its ``func`` set to :func:`run`.
    """
    gr = subparsers.add_parser("grid", help="count runs and jobs of a config without running anything")
    gr.add_argument("--configfile", required=True)
    gr.add_argument("--json", action="store_true")
    gr.add_argument("--estimate", action="store_true",
                    help="before anything runs: what the plan asks of a cluster (submissions, memory, wall time, "
                         "requested GPU- and CPU-hours) and its cost predicted from measured per-unit costs")
    gr.add_argument("--profile", action="append",
                    help="Snakemake profile(s) the estimate's requests read, in order (default: profiles/slurm)")
    gr.add_argument("--measured-costs", help="per-unit costs of the predicted cost (fmaudit cost --per-unit); "
                                             "default: benchmarks/measured_costs.csv")
    gr.set_defaults(func=run)
    return gr

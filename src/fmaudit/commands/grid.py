"""``fmaudit grid``: runs and jobs of a config per analysis and protocol, without running anything; with
``--estimate``, what those jobs would cost.

    fmaudit grid --configfile resources/presets/prism.yaml [--json]
    fmaudit grid --configfile resources/presets/prism.yaml --estimate [--measured-costs costs.csv]

The estimate (:func:`fmaudit.costs.estimate_cost`) multiplies each planned job's work (its runs from the grid;
for an embedding, the images of its data set, counted from the study's manifests where they are prepared) by a
measured cost per unit: ``--measured-costs`` (written by ``fmaudit cost --per-unit`` from the benchmark files of
an earlier run, ideally a pilot on the same cluster with the same encoders), by default the committed table
``benchmarks/measured_costs.csv`` (the demo measured on the development machine, CPU only: it knows nothing of
GPU speed, and says so in its ``source`` column).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from fmaudit import costs, grid
from fmaudit.config import load_config, results_dir
from fmaudit.grid import parts_with
from fmaudit.io import read_table
from fmaudit.preflight import check_config
from fmaudit.registry import load_dataset_registry

__all__ = ["MEASURED_COSTS", "estimate", "register", "run"]

#: The committed measured per-unit costs (``fmaudit cost --per-unit`` on the demo).
MEASURED_COSTS = Path(__file__).resolve().parents[3] / "benchmarks" / "measured_costs.csv"


def _manifest_items(config: dict) -> dict[str, int]:
    """Data set -> items, from the study's prepared manifests (``results/<study>/manifests/*.parquet``)."""
    folder = Path(results_dir(config)) / "manifests"
    return {p.stem: len(read_table(p)) for p in sorted(folder.glob("*.parquet"))} if folder.is_dir() else {}


def estimate(config: dict, measured: str | Path) -> pd.DataFrame:
    """The predicted cost of ``config``'s jobs (:func:`fmaudit.costs.estimate_cost`) from the per-unit costs in
    ``measured``."""
    encoders, datasets = check_config(config)
    prior_shift = {ps["task"]: ps for _, _, ps in parts_with(config, "prior_shift")}
    planned = costs.planned_units(config, datasets, _manifest_items(config))
    return costs.estimate_cost(planned, costs.read_unit_costs(measured), costs.gpu_plan(config, encoders, prior_shift))


def run(args: argparse.Namespace) -> int:
    config = load_config(args.configfile)
    if args.estimate:
        measured = args.measured_costs or MEASURED_COSTS
        table = estimate(config, measured)
        if args.json:
            print(json.dumps(table.to_dict(orient="records"), indent=2, default=float))
            return 0
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
        return 0
    # a total line per analysis and one for the config (``summarize(totals=True)``)
    summary = grid.summarize(config, load_dataset_registry(config["dataset_registry"]), totals=True)
    if args.json:
        print(json.dumps(summary.to_dict(orient="records"), indent=2))
    else:
        print(summary.to_string(index=False))
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    gr = subparsers.add_parser("grid", help="count runs and jobs of a config without running anything")
    gr.add_argument("--configfile", required=True)
    gr.add_argument("--json", action="store_true")
    gr.add_argument("--estimate", action="store_true",
                    help="predict CPU-, GPU- and wall hours per rule and encoder from measured per-unit costs")
    gr.add_argument("--measured-costs", help="per-unit costs (fmaudit cost --per-unit); default: "
                                             "benchmarks/measured_costs.csv")
    gr.set_defaults(func=run)
    return gr

"""``fmaudit cost``: what a study's jobs cost, from the Snakemake benchmark files of its results folder.

    fmaudit cost --results results/demo [--configfile config.yaml] [--json] [--per-unit costs.csv]

CPU-hours (the jobs' CPU time), GPU-hours (wall time x the GPUs each job requests: the config's plan,
:func:`fmaudit.costs.gpu_plan`), summed wall hours, the longest job and the peak memory, per rule and per
encoder, each table with its total. The GPU count comes from the config the study ran with: ``--configfile``,
or ``config.yaml`` of the current folder when its study writes to ``--results``; without either, GPU-hours
are unknown (n/a) rather than guessed. ``--per-unit`` writes the measured cost per run (per image for
embeddings) for ``fmaudit grid --estimate``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from fmaudit import costs
from fmaudit.config import load_config, results_dir
from fmaudit.embed import embedding_inventory
from fmaudit.grid import parts_with
from fmaudit.io import FmauditInputError, write_table
from fmaudit.preflight import check_config

__all__ = ["register", "run", "study_config"]

_HOURS = ("cpu_hours", "gpu_hours", "wall_hours")


def study_config(results: Path, configfile: str | None) -> dict | None:
    """The config the study in ``results`` ran with: ``configfile``, else ``config.yaml`` here when its study
    writes to ``results``, else None.

    Parameters
    ----------
    results : Path
        The study's results folder (``results/<study>``).
    configfile : str or None
        The config given with ``--configfile``; a note goes to stderr when it writes elsewhere than ``results``.

    Returns
    -------
    dict or None
        The filled config, or None when neither is at hand (GPU-hours are then reported as unknown).
    """
    if configfile:
        config = load_config(configfile)
        if Path(results_dir(config)).resolve() != results.resolve():
            print(
                f"fmaudit cost: note: {configfile} writes to {results_dir(config)}, not {results}; its plan gives "
                "the GPU counts",
                file=sys.stderr,
            )
        return config
    here = Path("config.yaml")
    if here.exists():
        config = load_config(here)
        if Path(results_dir(config)).resolve() == results.resolve():
            return config
    return None


def _plan(config: dict | None) -> tuple[dict | None, dict]:
    """(GPU plan, data-set registry) of a config, as the workflow makes them (its pre-flight's registries)."""
    if config is None:
        return None, {}
    encoders, datasets = check_config(config)
    prior_shift = {ps["task"]: ps for _, _, ps in parts_with(config, "prior_shift")}
    return costs.gpu_plan(config, encoders, prior_shift), datasets


def _text(table: pd.DataFrame) -> str:
    shown = table.copy()
    for col in _HOURS:
        shown[col] = [f"{v:.6f}" if pd.notna(v) else "n/a" for v in shown[col]]
    shown["longest_job_s"] = [f"{v:.2f}" for v in shown["longest_job_s"]]
    shown["peak_rss_mb"] = [f"{v:.1f}" if pd.notna(v) else "n/a" for v in shown["peak_rss_mb"]]
    return shown.to_string(index=False)


def run(args: argparse.Namespace) -> int:
    """Run ``fmaudit cost``: the per-rule and per-encoder cost tables of a study's benchmark files.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options (``results``, ``configfile``, ``json``, ``per_unit``, ``source``).

    Returns
    -------
    int
        Exit status 0.

    Raises
    ------
    FmauditInputError
        When ``results/benchmarks`` holds no benchmark file, or ``--per-unit`` is asked without the study's config.
    """
    results = Path(args.results)
    files = costs.find_benchmarks(results)
    if not files:
        raise FmauditInputError(f"{results}/benchmarks: no benchmark files (no heavy job of this study has run)")
    config = study_config(results, args.configfile)
    plan, datasets = _plan(config)
    inventory = (
        embedding_inventory(sorted((results / "embeddings").rglob("*.npz")))
        if (results / "embeddings").is_dir()
        else None
    )
    jobs = costs.job_costs(files, plan, costs.embedding_devices(inventory))
    by_rule, by_encoder = costs.cost_by(jobs, "rule"), costs.cost_by(jobs, "encoder")
    if args.per_unit:
        if config is None:
            raise FmauditInputError("--per-unit needs the study's config (--configfile): it counts each job's runs")
        planned = costs.planned_units(
            config,
            datasets,
            {
                r.dataset: int(r.n_items)
                for r in (
                    inventory if inventory is not None else pd.DataFrame(columns=["dataset", "n_items"])
                ).itertuples(index=False)
                if pd.notna(r.n_items)
            },
        )
        rates = costs.unit_costs(
            jobs, costs.measured_units(jobs, planned), source=args.source or f"benchmark files of {results}"
        )
        write_table(args.per_unit, rates)
    if args.json:
        print(
            json.dumps(
                {
                    "by_rule": by_rule.to_dict(orient="records"),
                    "by_encoder": by_encoder.to_dict(orient="records"),
                    "gpu_counts": "requested per job (config plan)" if plan is not None else "unknown",
                },
                indent=2,
                default=float,
            )
        )
        return 0
    print(f"{len(jobs)} benchmark files under {results / 'benchmarks'}")
    print(
        "GPU-hours: wall time x GPUs requested per job (the config's plan)"
        if plan is not None
        else "GPU-hours: n/a (no config for this study: give --configfile)"
    )
    print("\nPer rule:")
    print(_text(by_rule))
    print("\nPer encoder:")
    print(_text(by_encoder))
    if args.per_unit:
        print(f"\nMeasured per-unit costs written to {args.per_unit}")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``cost`` to the ``fmaudit`` command line.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.

    Returns
    -------
    argparse.ArgumentParser
        The ``cost`` parser, its ``func`` set to :func:`run`.
    """
    p = subparsers.add_parser("cost", help="CPU-hours, GPU-hours and memory of a study's jobs (Snakemake benchmarks)")
    p.add_argument("--results", required=True, help="the study's results folder (results/<study>)")
    p.add_argument("--configfile", help="the config the study ran with (default: ./config.yaml if it writes there)")
    p.add_argument("--json", action="store_true", help="print the tables as JSON")
    p.add_argument(
        "--per-unit",
        help="also write the measured cost per run (per image for embed) to this CSV, "
        "for fmaudit grid --estimate --measured-costs",
    )
    p.add_argument("--source", help="where the measurement was made, written into --per-unit's source column")
    p.set_defaults(func=run)
    return p

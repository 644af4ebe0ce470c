"""The card's cost section: CPU-hours, GPU-hours and peak memory of the encoder's benchmarked jobs, per rule, and
its embedding speed."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from fmaudit.analyses.cards.model import _has, _int, _num, _section, _unavailable, quantity

__all__ = ["cost_section"]


def cost_section(encoder: str, cost: Mapping[str, Any] | None, inventory: pd.DataFrame | None) -> dict[str, Any]:
    """The cost section of ``encoder``'s card: what its benchmarked jobs cost, per rule and in total, and how fast
    it embedded each data set.

    Parameters
    ----------
    encoder : str
        The encoder the card is for, as the tables' ``encoder`` column names it.
    cost : mapping or None
        ``jobs``: :func:`fmaudit.costs.job_costs`, a row per benchmark file with ``encoder``, ``rule``, ``job``,
        ``cpu_hours``, ``gpu_hours``, ``max_rss_mb`` and optionally ``device``, ``device_mismatch``.
    inventory : DataFrame or None
        The embeddings inventory, a row per encoder and ``dataset``: ``images_per_s``, ``n_items``, ``device``.

    Returns
    -------
    dict
        A card section (``available``, ``reason``, ``caption``, ``columns``, ``rows``, ``advice``, ``limits``):
        a row per rule and a ``total`` row with the quantities ``jobs``, ``cpu_hours``, ``gpu_hours``,
        ``peak_rss_mb``; ``embedding_speed`` (a dict per data set: ``dataset``, ``images_per_s``, ``n_items``,
        ``device``) and ``totals`` (``cpu_hours``, ``gpu_hours``). Unavailable, with its ``reason``, without
        benchmarked jobs of this encoder.
    """
    jobs = (cost or {}).get("jobs")
    if not isinstance(jobs, pd.DataFrame) or not len(jobs):
        return _unavailable("no benchmark files were read (the workflow writes them for every heavy job)")
    mine = jobs[jobs["encoder"] == encoder]
    if not len(mine):
        return _unavailable("no benchmarked job of this encoder")
    rows = []
    for rule, part in mine.groupby("rule", sort=True):
        rows.append(
            {
                "label": str(rule),
                "context": {"rule": str(rule)},
                "values": {
                    "jobs": quantity(len(part), measure="jobs", kind="integer"),
                    "cpu_hours": quantity(part["cpu_hours"].sum(min_count=1), measure="CPU-hours", kind="amount"),
                    "gpu_hours": quantity(
                        part["gpu_hours"].sum(), measure="GPU-hours (wall time x GPUs requested)", kind="amount"
                    ),
                    "peak_rss_mb": quantity(part["max_rss_mb"].max(), measure="peak memory (MB)", kind="amount"),
                },
            }
        )
    rows.append(
        {
            "label": "total",
            "context": {"rule": "total"},
            "values": {
                "jobs": quantity(len(mine), measure="jobs", kind="integer"),
                "cpu_hours": quantity(mine["cpu_hours"].sum(min_count=1), measure="CPU-hours", kind="amount"),
                "gpu_hours": quantity(mine["gpu_hours"].sum(), measure="GPU-hours", kind="amount"),
                "peak_rss_mb": quantity(mine["max_rss_mb"].max(), measure="peak memory (MB)", kind="amount"),
            },
        }
    )
    speed = []
    if inventory is not None and _has(inventory, "encoder", "images_per_s"):
        for r in inventory[inventory["encoder"] == encoder].to_dict("records"):
            if _num(r.get("images_per_s")) is not None:
                speed.append(
                    {
                        "dataset": str(r["dataset"]),
                        "images_per_s": float(r["images_per_s"]),
                        "n_items": _int(r.get("n_items")),
                        "device": str(r.get("device") or ""),
                    }
                )
    job_facts = [
        {
            "job": j["job"],
            "device": j.get("device"),
            "device_mismatch": isinstance(j.get("device_mismatch"), (bool, np.bool_)) and bool(j["device_mismatch"]),
        }
        for j in mine.to_dict("records")
    ]
    caption = (
        "Snakemake benchmark files of this encoder's jobs: CPU-hours (the jobs' CPU time), GPU-hours (wall "
        "time x the GPUs each job requested) and peak resident memory, per rule. Embedding speed: images per "
        "second of the forward passes, as each embedding file records it."
    )
    columns = [("jobs", "jobs"), ("cpu_hours", "CPU-hours"), ("gpu_hours", "GPU-hours"), ("peak_rss_mb", "peak MB")]
    out = _section(caption, columns, rows, {"jobs": job_facts}, "cost", [])
    out["embedding_speed"] = speed
    out["totals"] = {"cpu_hours": _num(mine["cpu_hours"].sum(min_count=1)), "gpu_hours": _num(mine["gpu_hours"].sum())}
    return out

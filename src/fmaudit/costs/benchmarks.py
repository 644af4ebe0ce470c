"""What a study's jobs cost, measured: the benchmark files Snakemake writes for every heavy job
(``results/<study>/benchmarks/<rule>/<wildcards>.tsv``) read into one row per job, summed per rule or encoder, and
the GPUs each job requested (:func:`gpu_plan`), by which its GPU-hours are charged.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.io import FmauditInputError, PathLike

__all__ = [
    "BENCHMARK_PATHS",
    "COST_COLUMNS",
    "GPU_RULES",
    "benchmark_path",
    "benchmark_root",
    "cost_by",
    "embedding_devices",
    "find_benchmarks",
    "gpu_plan",
    "job_costs",
    "job_gpus",
    "parse_benchmark_path",
    "read_benchmark",
]

#: Rule -> the wildcards of its benchmark file under ``benchmarks/<rule>/`` (the rules' ``benchmark:``
#: directives; tests/test_costs.py checks every rule file against this table). A rule missing here is still
#: counted (rule and study totals), without wildcards and so without an encoder.
BENCHMARK_PATHS: dict[str, str] = {
    "prepare_manifest": "{dataset}",
    "embed": "{encoder}/{key}/{dataset}",
    "probe_shard": "{task}/{encoder}",
    "ood_shard": "{task}/{encoder}",
    "ood_split_shard": "{task}/{encoder}",
    "prior_shift_shard": "{task}/{encoder}/{source_domain}/{target_domain}",
    "scratch_reference": "{task}/{source_domain}/seed{seed}",
    "prepare_cell_section": "{section}",
    "cell_features": "{encoder}/{key}/{section}",
    "cell_shard": "{protocol}/{encoder}/{magnification}x",
}
#: Rules whose ``gpu`` resource :func:`gpu_plan` decides, and the wildcard it is decided by.
GPU_RULES = {"embed": "encoder", "cell_features": "encoder", "scratch_reference": "task"}
#: Columns of :func:`job_costs`, one row per benchmark file (wildcard columns follow them).
COST_COLUMNS = (
    "rule",
    "job",
    "encoder",
    "wall_s",
    "cpu_s",
    "max_rss_mb",
    "gpus",
    "cpu_hours",
    "gpu_hours",
    "repeats",
    "file",
)
_REQUIRED = ("s", "max_rss", "cpu_time")


def _template_regex(template: str) -> re.Pattern:
    parts = re.split(r"(\{[a-z_]+\})", template)
    out = "".join(f"(?P<{p[1:-1]}>[^/]+?)" if p.startswith("{") else re.escape(p) for p in parts if p)
    return re.compile(f"^{out}$")


_PATTERNS = {rule: _template_regex(t) for rule, t in BENCHMARK_PATHS.items()}


def parse_benchmark_path(path: PathLike, root: PathLike) -> tuple[str, str, dict[str, str]]:
    """(rule, job, wildcards) of a benchmark file below ``root`` (the study's ``benchmarks/`` folder): the rule
    is the first folder, the job the rest of the path without ``.tsv``; wildcards as :data:`BENCHMARK_PATHS`
    names them (empty for a rule it does not list, or a path that does not match its template).

    Parameters
    ----------
    path : path-like
        A benchmark file, ``<root>/<rule>/<wildcards>.tsv``.
    root : path-like
        The study's ``benchmarks/`` folder (:func:`benchmark_root`); ``path`` must lie below it.

    Returns
    -------
    tuple of (str, str, dict of str to str)
        The rule (first folder), the job (the rest of the path without ``.tsv``, e.g. ``uni/default/bach``) and
        the wildcards, wildcard name -> value.

    Raises
    ------
    FmauditInputError
        When the file lies directly in ``root`` rather than in a rule's folder.
    """
    rel = Path(path).resolve().relative_to(Path(root).resolve())
    if len(rel.parts) < 2:
        raise FmauditInputError(f"{path}: a benchmark file lies in benchmarks/<rule>/, not directly in {root}")
    rule = rel.parts[0]
    job = str(Path(*rel.parts[1:]).with_suffix(""))
    match = _PATTERNS[rule].match(job) if rule in _PATTERNS else None
    return rule, job, (match.groupdict() if match else {})


def read_benchmark(path: PathLike) -> dict[str, float]:
    """One benchmark file as a job's totals: ``wall_s`` and ``cpu_s`` summed over its rows (repeats),
    ``max_rss_mb`` their maximum, ``repeats``; NaN where Snakemake wrote ``NA``.

    Parameters
    ----------
    path : path-like
        A tab-separated Snakemake benchmark file (columns ``s``, ``max_rss``, ``cpu_time`` at least; one row per
        repeat).

    Returns
    -------
    dict of str to float
        ``wall_s`` and ``cpu_s`` (seconds, summed over repeats; NaN when any repeat is ``NA``), ``max_rss_mb``
        (MB, the maximum over the known repeats; NaN when none is known) and ``repeats`` (an int).

    Raises
    ------
    FmauditInputError
        When the file is empty, not a table, or lacks a required column or any row.
    """
    path = Path(path)
    try:
        table = pd.read_csv(path, sep="\t", na_values=["NA", "-"])
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as err:
        raise FmauditInputError(f"{path}: not a Snakemake benchmark file ({err})") from err
    missing = [c for c in _REQUIRED if c not in table.columns]
    if missing or len(table) == 0:
        raise FmauditInputError(
            f"{path}: a Snakemake benchmark file needs the columns {', '.join(_REQUIRED)} and "
            f"a row; it has columns {', '.join(map(str, table.columns)) or 'none'} and "
            f"{len(table)} rows"
        )
    values = table[list(_REQUIRED)].apply(pd.to_numeric, errors="coerce")

    def total(col: str) -> float:
        return float(values[col].sum()) if values[col].notna().all() else math.nan

    return {
        "wall_s": total("s"),
        "cpu_s": total("cpu_time"),
        "max_rss_mb": float(values["max_rss"].max()) if values["max_rss"].notna().any() else math.nan,
        "repeats": int(len(table)),
    }


def gpu_plan(
    config: Mapping[str, Any],
    encoders: Mapping[str, Mapping[str, Any]],
    prior_shift: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, dict[str, int]]:
    """GPUs each GPU-capable job requests: ``{"embed": {encoder: n}, "cell_features": {encoder: n},
    "scratch_reference": {task: n}}``. ``encoders``: the registry as the config sees it (an entry's ``gpu``);
    ``prior_shift``: task -> its ``prior_shift`` block (``scratch_reference.gpu``). The workflow's ``gpu``
    resources read this, and :func:`job_costs` charges GPU-hours by it.

    Parameters
    ----------
    config : Mapping
        A filled config; its ``encoders`` and ``variants`` are the encoders planned.
    encoders : Mapping of str to Mapping
        Encoder slug -> registry entry; an entry whose ``gpu`` is true requests one GPU, otherwise none.
    prior_shift : Mapping of str to Mapping, optional
        Task -> its ``prior_shift`` block; a task whose ``scratch_reference.gpu`` is true requests one GPU for its
        ``scratch_reference`` jobs. None: no scratch reference.

    Returns
    -------
    dict of str to dict of str to int
        Rule (``embed``, ``cell_features``, ``scratch_reference``) -> wildcard value (encoder slug or task) ->
        GPUs requested (0 or 1).
    """
    names = list(dict.fromkeys([*config.get("encoders", []), *config.get("variants", {})]))
    per_encoder = {enc: int(bool((encoders.get(enc) or {}).get("gpu", False))) for enc in names}
    scratch = {
        task: int(bool((block.get("scratch_reference") or {}).get("gpu", False)))
        for task, block in (prior_shift or {}).items()
    }
    return {"embed": dict(per_encoder), "cell_features": dict(per_encoder), "scratch_reference": scratch}


def job_gpus(plan: Mapping[str, Mapping[str, int]], rule: str, wildcards: Mapping[str, Any]) -> int:
    """GPUs the job of ``rule`` with ``wildcards`` requests under ``plan`` (:func:`gpu_plan`); 0 for a rule that
    requests none, or a wildcard value the plan does not know.

    Parameters
    ----------
    plan : Mapping of str to Mapping of str to int
        The GPU plan (:func:`gpu_plan`).
    rule : str
        The job's rule.
    wildcards : Mapping or object
        The job's wildcards, a mapping or an object with attributes (Snakemake's ``wildcards``).

    Returns
    -------
    int
        GPUs requested by the job.
    """
    if rule not in GPU_RULES or rule not in plan:
        return 0
    value = wildcards.get(GPU_RULES[rule]) if hasattr(wildcards, "get") else getattr(wildcards, GPU_RULES[rule], None)
    return int(plan[rule].get(str(value), 0))


def find_benchmarks(results: PathLike) -> list[Path]:
    """Every benchmark file of a study folder (``<results>/benchmarks/**/*.tsv``), sorted.

    Parameters
    ----------
    results : path-like
        A study's results folder (``results/<study>``).

    Returns
    -------
    list of Path
        Every ``.tsv`` below ``<results>/benchmarks``, sorted.

    Raises
    ------
    FmauditInputError
        When ``<results>/benchmarks`` is not a folder.
    """
    root = Path(results) / "benchmarks"
    if not root.is_dir():
        raise FmauditInputError(
            f"{root}: no benchmark folder (is {results} a study's results folder, and has the workflow run there?)"
        )
    return sorted(root.rglob("*.tsv"))


def job_costs(
    files: Sequence[PathLike],
    plan: Mapping[str, Mapping[str, int]] | None = None,
    devices: Mapping[tuple[str, str], str] | None = None,
) -> pd.DataFrame:
    """One row per benchmark file (:data:`COST_COLUMNS`, then the wildcards; each file lies under a
    ``benchmarks/<rule>/`` folder): wall and CPU seconds, peak memory,
    GPUs (:func:`job_gpus` under ``plan``; unknown, NaN, without one), CPU-hours (``cpu_s / 3600``) and GPU-hours
    (``wall_s * gpus / 3600``). ``devices``: (rule, job) -> the device its provenance records (embedding
    files): a job that requested a GPU but ran on the CPU gets ``device_mismatch``.

    Parameters
    ----------
    files : sequence of path-like
        Benchmark files (:func:`find_benchmarks`), each below a ``benchmarks/`` folder.
    plan : Mapping, optional
        The GPU plan (:func:`gpu_plan`) the jobs ran under; None leaves ``gpus`` and ``gpu_hours`` NaN.
    devices : Mapping of (str, str) to str, optional
        (rule, job) -> the device its outputs' provenance records (:func:`embedding_devices`); when given, the rows
        it knows get ``device`` and ``device_mismatch`` columns.

    Returns
    -------
    DataFrame
        One row per file: :data:`COST_COLUMNS` (``wall_s``, ``cpu_s`` in seconds, ``max_rss_mb`` in MB,
        ``cpu_hours``, ``gpu_hours``; ``encoder`` '' for a job without one), then the other wildcards of its rule
        and, with ``devices``, ``device`` and ``device_mismatch``. Empty with :data:`COST_COLUMNS` when there are no
        files.
    """
    rows = []
    for f in files:
        rule, job, wildcards = parse_benchmark_path(f, benchmark_root(f))
        cost = read_benchmark(f)
        gpus = job_gpus(plan, rule, wildcards) if plan is not None else math.nan
        row = {
            "rule": rule,
            "job": job,
            "encoder": wildcards.get("encoder", ""),
            **cost,
            "gpus": gpus,
            "cpu_hours": cost["cpu_s"] / 3600.0,
            "gpu_hours": cost["wall_s"] * gpus / 3600.0,
            "file": str(f),
            **{k: v for k, v in wildcards.items() if k != "encoder"},
        }
        if devices is not None and (rule, job) in devices:
            row["device"] = devices[(rule, job)]
            row["device_mismatch"] = bool(gpus > 0) and not str(devices[(rule, job)]).startswith("cuda")
        rows.append(row)
    out = pd.DataFrame(rows)
    if len(out) == 0:
        return pd.DataFrame(columns=list(COST_COLUMNS))
    first = list(COST_COLUMNS)
    return out[first + [c for c in out.columns if c not in first]]


def cost_by(costs: pd.DataFrame, key: str) -> pd.DataFrame:
    """Costs summed per ``key`` (``rule`` or ``encoder``; jobs without an encoder under ``(no encoder)``), with a
    ``total`` row: jobs, CPU-hours, GPU-hours, wall hours (summed: the compute, not the elapsed time), the
    longest job's wall time and the largest peak memory. A sum with an unknown (NA) part is NaN.

    Parameters
    ----------
    costs : DataFrame
        Job costs, as :func:`job_costs` returns them.
    key : str
        The column to group by: ``rule`` or ``encoder``.

    Returns
    -------
    DataFrame
        One row per value of ``key`` (sorted) and a last row ``total``; columns ``key``, ``jobs``, ``cpu_hours``,
        ``gpu_hours``, ``wall_hours``, ``longest_job_s`` and ``peak_rss_mb``.
    """
    columns = [key, "jobs", "cpu_hours", "gpu_hours", "wall_hours", "longest_job_s", "peak_rss_mb"]
    if len(costs) == 0:
        return pd.DataFrame(columns=columns)
    frame = costs.assign(
        **{
            key: costs[key].replace("", "(no encoder)") if key == "encoder" else costs[key],
            "wall_hours": costs["wall_s"] / 3600.0,
        }
    )

    def summarise(part: pd.DataFrame, name: str) -> dict[str, Any]:
        return {
            key: name,
            "jobs": int(len(part)),
            "cpu_hours": part["cpu_hours"].sum(min_count=1) if part["cpu_hours"].notna().all() else math.nan,
            "gpu_hours": part["gpu_hours"].sum(min_count=1) if part["gpu_hours"].notna().all() else math.nan,
            "wall_hours": part["wall_hours"].sum(min_count=1) if part["wall_hours"].notna().all() else math.nan,
            "longest_job_s": float(part["wall_s"].max()),
            "peak_rss_mb": float(part["max_rss_mb"].max()),
        }

    rows = [summarise(part, str(name)) for name, part in frame.groupby(key, sort=True)]
    rows.append(summarise(frame, "total"))
    return pd.DataFrame(rows, columns=columns)


def benchmark_root(path: PathLike) -> Path:
    """The ``benchmarks`` folder a benchmark file lies under (its nearest ancestor of that name).

    Parameters
    ----------
    path : path-like
        A benchmark file.

    Returns
    -------
    Path
        The nearest ancestor folder named ``benchmarks``.

    Raises
    ------
    FmauditInputError
        When no ancestor is named ``benchmarks``.
    """
    path = Path(path)
    for parent in path.parents:
        if parent.name == "benchmarks":
            return parent
    raise FmauditInputError(f"{path}: not under a benchmarks/ folder (results/<study>/benchmarks/<rule>/...)")


def embedding_devices(inventory: pd.DataFrame | None) -> dict[tuple[str, str], str]:
    """(``embed``, job) -> the device an embedding file's provenance records (:func:`fmaudit.embed.embedding_inventory`
    rows: ``encoder``, ``embedding_key``, ``dataset``, ``device``).

    Parameters
    ----------
    inventory : DataFrame or None
        The embedding inventory (:func:`fmaudit.embed.embedding_inventory`); None, an empty table or one
        without the four columns gives an empty mapping.

    Returns
    -------
    dict of (str, str) to str
        ``("embed", "<encoder>/<embedding_key>/<dataset>")`` -> device string (``cuda:0``, ``cpu``...), for the
        rows that record a device.
    """
    if (
        inventory is None
        or not len(inventory)
        or not {"encoder", "embedding_key", "dataset", "device"} <= set(inventory)
    ):
        return {}
    return {
        ("embed", f"{r.encoder}/{r.embedding_key}/{r.dataset}"): str(r.device)
        for r in inventory.itertuples(index=False)
        if isinstance(r.device, str) and r.device
    }



def benchmark_path(rule: str, wildcards: Mapping[str, Any]) -> str:
    """The path of a job's benchmark file below ``benchmarks/`` (:data:`BENCHMARK_PATHS`; a magnification is
    written as the rules write it, ``10`` for 10.0).

    Parameters
    ----------
    rule : str
        A rule of :data:`BENCHMARK_PATHS` (KeyError otherwise).
    wildcards : Mapping
        Wildcard name -> value; every wildcard of the rule's template must be present.

    Returns
    -------
    str
        ``<rule>/<wildcards>.tsv``, relative to a study's ``benchmarks/`` folder.
    """
    values = {k: (f"{float(v):g}" if k == "magnification" else str(v)) for k, v in wildcards.items()}
    return f"{rule}/{BENCHMARK_PATHS[rule].format(**values)}.tsv"

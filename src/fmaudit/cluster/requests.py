"""What one job asks for: its memory, wall time, GPUs and GPU class, from the cost model or an earlier run's
measurements (:class:`RequestPlanner`, which the workflow's resource functions and the estimate both call)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from fmaudit.cluster.cost_model import (
    CELL_ROW_BYTES,
    DEFAULT_SECTION,
    DEFAULT_TILES,
    HOST_BASE_MB,
    MEASURED_MARGIN,
    MEMORY_MARGIN,
    MIN_MEM_MB,
    MIN_RUNTIME_MIN,
    PATCH_READ_S,
    TILE_READ_S,
    TIME_MARGIN,
    WORKER_MB,
    EncoderCost,
    SectionExtent,
    encoder_cost,
    manifest_rows,
    section_extent,
    section_patches,
)
from fmaudit.cluster.gpu_classes import GpuClass, gpu_class
from fmaudit.cluster.measured import Measured, read_benchmarks
from fmaudit.io import PathLike


@dataclass(frozen=True)
class JobRequest:
    """What one job asks for at attempt 1 (memory and wall time grow with the attempt: :meth:`at`).

    Parameters
    ----------
    mem_mb : int
        Host memory in MB.
    runtime_min : int
        Wall time in minutes.
    gpus : int
        GPUs (0 or 1).
    gpu_mem_mb : int, default 0
        Estimated GPU memory in MB (picks the GPU class).
    basis : str, default "model"
        Where the numbers come from: ``"model"`` (the cost model), ``"measured"`` (an earlier run's benchmarks)
        or ``"default"`` (stated defaults: no manifest or no measurements yet).
    items : int, default 0
        Images the job embeds (tiles or patches); 0 for a shard job.
    """

    mem_mb: int
    runtime_min: int
    gpus: int
    gpu_mem_mb: int = 0
    basis: str = "model"  # "model", "measured" or "default"
    items: int = 0

    def at(self, attempt: int) -> tuple[int, int]:
        """(mem_mb, runtime_min) at ``attempt``.

        Parameters
        ----------
        attempt : int
            Snakemake's attempt number, from 1.

        Returns
        -------
        tuple of (int, int)
            Memory in MB and wall minutes, both multiplied by ``attempt``.
        """
        return self.mem_mb * int(attempt), self.runtime_min * int(attempt)


def _minutes(seconds: float) -> int:
    return max(MIN_RUNTIME_MIN, int(math.ceil(seconds / 60.0)))


def _mb(value: float) -> int:
    """Memory rounded up to a whole GB, at least :data:`MIN_MEM_MB`."""
    return max(MIN_MEM_MB, int(math.ceil(value / 1000.0)) * 1000)


def submissions(jobs: int, per_submission: int) -> int:
    """Cluster submissions of ``jobs`` jobs of one group, ``per_submission`` to a submission
    (``--group-components``; Snakemake chunks a group's connected components in that size).

    Parameters
    ----------
    jobs : int
        Jobs of the group.
    per_submission : int
        Jobs per submission (values below 1 count as 1).

    Returns
    -------
    int
    """
    return int(math.ceil(jobs / max(1, int(per_submission)))) if jobs else 0


#: Requests of the CPU shard rules without measurements (memory MB, wall minutes, per attempt).
SHARD_DEFAULTS = {"probe_shard": (4000, 60), "ood_shard": (4000, 60), "ood_split_shard": (4000, 60),
                  "cell_shard": (4000, 60), "prior_shift_shard": (8000, 60)}
#: Requests of the data-preparation rules that run on the cluster (memory MB, wall minutes, per attempt).
FIXED_REQUESTS = {"prepare_manifest": (4000, 60), "derive_manifest": (2000, 30), "prepare_cell_section": (8000, 60)}
def scratch_request(gpu: bool) -> JobRequest:
    """The scratch reference's request (a ResNet-18 trained from scratch; on a GPU where the config says so).

    Parameters
    ----------
    gpu : bool
        Whether the prior-shift part's ``scratch_reference.gpu`` puts the training on a GPU.

    Returns
    -------
    JobRequest
        32 GB, 4 h and one GPU on a GPU; 4 GB and 1 h on the CPU (basis ``"default"``).
    """
    return JobRequest(32000, 240, 1, 0, "default") if gpu else JobRequest(4000, 60, 0, 0, "default")


#: The group of each grouped rule's jobs: one group per encoder, a few of its jobs to a cluster submission (the
#: profile's group-components, by these names; the rules' ``group:`` directives, tests/test_cluster.py keeps
#: them equal).
GROUP_PATTERNS = {rule: f"{rule}_{{encoder}}" for rule in ("embed", "cell_features", "probe_shard", "ood_shard",
                                                            "ood_split_shard", "prior_shift_shard", "cell_shard")}


@dataclass
class RequestPlanner:
    """Requests of a study's jobs, cached per encoder and item source (the dry run evaluates thousands).

    Parameters
    ----------
    encoders : Mapping of str to Mapping
        Registry entries by encoder name, as the config sees them.
    benchmarks : str or Path, optional
        The study's benchmark folder (``results/<study>/benchmarks``), whose earlier measurements calibrate the
        requests; None uses the cost model alone.
    batch_size : int, default 64
        The GPU rules' batch size (sets the GPU memory estimate).
    gpu_classes : tuple of GpuClass, default ()
        The site's GPU classes (:func:`parse_gpu_classes`).
    """

    encoders: Mapping[str, Mapping[str, Any]]
    benchmarks: PathLike | None = None
    batch_size: int = 64
    gpu_classes: tuple[GpuClass, ...] = ()
    _costs: dict = field(default_factory=dict, repr=False)
    _measured: dict = field(default_factory=dict, repr=False)
    _extents: dict = field(default_factory=dict, repr=False)
    _rows: dict = field(default_factory=dict, repr=False)
    _requests: dict = field(default_factory=dict, repr=False)

    # -- inputs, cached

    def cost(self, encoder: str) -> EncoderCost:
        """The cost model of ``encoder`` (:func:`encoder_cost`), cached.

        Parameters
        ----------
        encoder : str
            A name in ``encoders``.

        Returns
        -------
        EncoderCost
        """
        if encoder not in self._costs:
            self._costs[encoder] = encoder_cost(encoder, self.encoders[encoder])
        return self._costs[encoder]

    def measured(self, rule: str, encoder: str) -> Measured | None:
        """Benchmarks of an earlier run of ``rule`` for ``encoder`` (:func:`read_benchmarks`), cached.

        Parameters
        ----------
        rule : str
            The Snakemake rule, e.g. ``"embed"``.
        encoder : str
            The encoder's name.

        Returns
        -------
        Measured or None
        """
        key = (rule, encoder)
        if key not in self._measured:
            self._measured[key] = (read_benchmarks(Path(self.benchmarks) / rule / encoder)
                                   if self.benchmarks is not None else None)
        return self._measured[key]

    def extent(self, manifest: PathLike) -> SectionExtent:
        """A cell section's extent (:func:`section_extent`), :data:`DEFAULT_SECTION` before it is prepared.

        Parameters
        ----------
        manifest : str or Path
            The section's cell manifest.

        Returns
        -------
        SectionExtent
        """
        key = str(manifest)
        if key not in self._extents:
            self._extents[key] = section_extent(manifest) or DEFAULT_SECTION
        return self._extents[key]

    def rows(self, manifest: PathLike, fallback: PathLike | None = None) -> tuple[int, str]:
        """(items, where from) of a tile manifest: its rows; else ``fallback``'s (a derived copy's source
        data set, an upper bound); else :data:`DEFAULT_TILES`.

        Parameters
        ----------
        manifest : str or Path
            The data set's prepared manifest.
        fallback : str or Path, optional
            The source data set's manifest of a derived copy.

        Returns
        -------
        tuple of (int, str)
            The item count and ``"manifest"`` or ``"default"``.
        """
        key = (str(manifest), str(fallback))
        if key not in self._rows:
            n = manifest_rows(manifest)
            if n is None and fallback is not None:
                n = manifest_rows(fallback)
            self._rows[key] = (n, "manifest") if n is not None else (DEFAULT_TILES, "default")
        return self._rows[key]

    # -- the model's seconds and memory of one job

    def _cell_seconds(self, encoder: str, extent: SectionExtent, magnifications: Sequence[float],
                      threads: int) -> tuple[float, int]:
        cost = self.cost(encoder)
        patches = sum(section_patches(extent, m, cost.input_size) for m in magnifications)
        return cost.load_s + patches * cost.seconds_per_image(threads, PATCH_READ_S), patches

    def _tile_seconds(self, encoder: str, items: int, threads: int) -> float:
        cost = self.cost(encoder)
        return cost.load_s + items * cost.seconds_per_image(threads, TILE_READ_S)

    def _calibrated(self, rule: str, encoder: str, predicted_s: float, host_mb: float,
                    predict_measured) -> tuple[float, float, str]:
        """(wall seconds, host MB, basis): the model's, or scaled by an earlier run's measurements."""
        measured = self.measured(rule, encoder)
        if measured is None:
            return predicted_s * TIME_MARGIN, host_mb, "model"
        ratios = []
        for job, seconds, _ in measured.jobs:
            expected = predict_measured(job)
            if expected and np.isfinite(seconds) and expected > 0:
                ratios.append(seconds / expected)
        seconds = predicted_s * max(ratios) * MEASURED_MARGIN if ratios else predicted_s * TIME_MARGIN
        peak = measured.peak_mb
        memory = peak * MEASURED_MARGIN if peak is not None else host_mb
        return seconds, memory, "measured"

    # -- the requests

    def cell_features(self, encoder: str, manifest: PathLike, magnifications: Sequence[float],
                      threads: int) -> JobRequest:
        """One (encoder, section) feature job over ``magnifications``; ``manifest``: the section's cell manifest.
        Measured jobs of the rule are ``<key>/<section>`` benchmark files; their sections' manifests lie beside
        ``manifest``.

        Parameters
        ----------
        encoder : str
            The encoder's name.
        manifest : str or Path
            The section's cell manifest (``cells/sections/<section>.parquet``).
        magnifications : sequence of float
            The magnifications the job embeds; the patches of each add up.
        threads : int
            The job's threads.

        Returns
        -------
        JobRequest
            Memory, wall time, GPUs and GPU memory at attempt 1, with its ``basis`` (``"model"``, ``"measured"``, or
            ``"default"`` when the manifest is not prepared yet) and ``items``.
        """
        key = ("cell_features", encoder, str(manifest), tuple(magnifications), int(threads))
        if key not in self._requests:
            cost = self.cost(encoder)
            extent = self.extent(manifest)
            predicted, patches = self._cell_seconds(encoder, extent, magnifications, threads)
            # the manifest and the per-cell tables of one magnification (features go chunk by chunk to memory maps)
            tables_mb = extent.cells * CELL_ROW_BYTES / 1e6
            host = (HOST_BASE_MB + 2 * cost.weight_mb + WORKER_MB * max(0, threads - 1) + tables_mb) * MEMORY_MARGIN
            folder = Path(manifest).parent

            def predict(job: str) -> float | None:
                section = Path(job).name
                other = self.extent(folder / f"{section}.parquet")
                return self._cell_seconds(encoder, other, magnifications, threads)[0]

            seconds, memory, basis = self._calibrated("cell_features", encoder, predicted, host, predict)
            if basis == "model" and extent.source == "default":
                basis = "default"
            self._requests[key] = JobRequest(_mb(memory), _minutes(seconds), 1 if cost.on_gpu else 0,
                                             int(math.ceil(cost.gpu_memory_mb(self.batch_size))), basis, patches)
        return self._requests[key]

    def embed(self, encoder: str, manifest: PathLike, threads: int, fallback: PathLike | None = None,
              readout_width: int | None = None) -> JobRequest:
        """One (encoder, data set) embedding job; ``manifest``: the data set's manifest (``fallback``: the
        source data set's, for a derived copy not prepared yet). Measured jobs are ``<key>/<dataset>`` files;
        their manifests lie beside ``manifest``.

        Parameters
        ----------
        encoder : str
            The encoder's name.
        manifest : str or Path
            The data set's manifest (``manifests/<dataset>.parquet``).
        threads : int
            The job's threads.
        fallback : str or Path, optional
            The source data set's manifest, for a derived copy not prepared yet.
        readout_width : int, optional
            Total width of the readouts written per item; default three times ``embed_dim`` (cls, mean, a fusion).

        Returns
        -------
        JobRequest
            Memory, wall time, GPUs and GPU memory at attempt 1, with its ``basis`` (``"model"``, ``"measured"``, or
            ``"default"`` when the manifest is not prepared yet) and ``items``.
        """
        key = ("embed", encoder, str(manifest), str(fallback), int(threads))
        if key not in self._requests:
            cost = self.cost(encoder)
            items, source = self.rows(manifest, fallback)
            predicted = self._tile_seconds(encoder, items, threads)
            width = readout_width or 3 * cost.width  # cls, mean and a fusion: the usual readouts
            out_mb = items * width * 4 * 2 / 1e6  # the chunks read back and the stacked arrays
            host = (HOST_BASE_MB + 2 * cost.weight_mb + WORKER_MB * max(0, threads - 1) + out_mb) * MEMORY_MARGIN
            folder = Path(manifest).parent

            def predict(job: str) -> float | None:
                n, _ = self.rows(folder / f"{Path(job).name}.parquet")
                return self._tile_seconds(encoder, n, threads)

            seconds, memory, basis = self._calibrated("embed", encoder, predicted, host, predict)
            if basis == "model" and source == "default":
                basis = "default"
            self._requests[key] = JobRequest(_mb(memory), _minutes(seconds), 1 if cost.on_gpu else 0,
                                             int(math.ceil(cost.gpu_memory_mb(self.batch_size))), basis, items)
        return self._requests[key]

    def shard(self, rule: str, encoder: str, default: tuple[int, int] | None = None) -> JobRequest:
        """A CPU shard job of ``rule`` for ``encoder``: the rule's default (memory MB, wall minutes), or the
        largest measured peak and wall time of the rule's earlier jobs for this encoder plus the margin.

        Parameters
        ----------
        rule : str
            The shard rule, e.g. ``"probe_shard"``.
        encoder : str
            The encoder's name; ``""`` for no encoder (then nothing is measured).
        default : tuple of (int, int), optional
            (memory MB, wall minutes) without measurements; default :data:`SHARD_DEFAULTS`, else (4000, 60).

        Returns
        -------
        JobRequest
            No GPU; basis ``"measured"`` or ``"default"``.
        """
        key = (rule, encoder)
        if key not in self._requests:
            mem, minutes = default or SHARD_DEFAULTS.get(rule, (4000, 60))
            measured = self.measured(rule, encoder) if encoder else None
            if measured is not None and measured.max_s is not None:
                peak = measured.peak_mb
                self._requests[key] = JobRequest(_mb(peak * MEASURED_MARGIN) if peak is not None else mem,
                                                 _minutes(measured.max_s * MEASURED_MARGIN), 0, 0, "measured")
            else:
                self._requests[key] = JobRequest(mem, minutes, 0, 0, "default")
        return self._requests[key]

    def gpu_constraint(self, encoder: str) -> str | None:
        """The Slurm constraint of the encoder's GPU class (None: no classes, a CPU-only entry, or a class that
        takes any GPU).

        Parameters
        ----------
        encoder : str
            The encoder's name.

        Returns
        -------
        str or None
        """
        cost = self.cost(encoder)
        chosen = gpu_class(cost.gpu_memory_mb(self.batch_size), self.gpu_classes) if cost.on_gpu else None
        return chosen.constraint or None if chosen is not None else None

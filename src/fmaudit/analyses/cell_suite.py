"""The CellPath-Bench probe shard: one job = (encoder, magnification, protocol), thousands of runs in-process.

A run (:func:`fmaudit.grid.cell_runs`) is (taxonomy, readout, seed, unit): a fresh multinomial L2 logistic
probe fitted on the run's training cells at every C of the grid (one batched engine call,
:func:`fmaudit.probes.fit_logistic_batch`, on the GPU when there is one), the C with the best validation
macro-F1 kept (ties: the smaller C, i.e. the stronger penalty), then evaluated once on the test cells
(:mod:`fmaudit.cells.metrics`). Partitions: :mod:`fmaudit.cells.protocols`.

Memory stays bounded whatever the section sizes:
- only the training and validation rows (capped per run by ``max_train_cells`` and ``max_val_cells``) are
  read from the memory-mapped feature folders, their base arrays (Nuc, Mean, Cls) once; each readout is
  built from them in turn and dropped after its fits. Consecutive units are fitted together (one engine call
  per readout and taxonomy holds every unit x seed x C problem of the group, which amortises the engine's
  per-iteration cost, on the GPU above all) while their rows fit ``fit_budget_bytes``;
- the test cells are streamed in chunks of about ``chunk_bytes`` per readout array; the fitted probes of a
  unit are applied chunk by chunk, and the softmax scores kept for the AUROC are limited to
  ``score_budget_bytes`` per pass (more runs -> more passes over the test cells, never more memory).

Every run of the job gets a row, with ``status`` ``ok`` or the reason it has no metrics (``skipped: ...``):
a readout needing a class token the encoder lacks, fewer than two classes among the training cells, no
labelled validation or test cells. So a shard's table has exactly the grid's runs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.cells.features import (
    BASE_READOUTS,
    CellFeatures,
    base_readouts_of,
    fuse_readout,
    needs_cls,
    open_cell_features,
    readout_width,
)
from fmaudit.cells.metrics import AUROC_CONVENTION, F1_CONVENTION, macro_auroc_present, macro_f1_present
from fmaudit.cells.protocols import (
    PanelCells,
    Partition,
    ids_digest,
    make_fold_manifest,
    make_partition,
    panel_from_manifests,
    read_fold_manifest,
    unit_sections,
)
from fmaudit.devices import resolve_device
from fmaudit.io import FmauditInputError, PathLike
from fmaudit.metrics import softmax_last_axis
from fmaudit.probes import ENGINE_BYTES_PER_VALUE
from fmaudit.probes.pool import FitPool

log = logging.getLogger(__name__)

# Modelled work (training rows x Cs x readouts x taxonomies x width x classes, summed over units) from which a
# shard fits its engine calls side by side (fmaudit.probes.pool): about 6 s of single-threaded fits (a CellPath IS unit,
# 4,770 training rows x 4 Cs x 7 readouts x 2 taxonomies x 384 x 9 = 9.2e8, took 13.6 s on one thread of this
# project's 2-core machine), three times what starting two workers costs.
POOL_MIN_WORK = 4e8

RESULT_COLUMNS = ["run_id", "status", "C", "val_macro_f1", "macro_f1", "macro_auroc", "accuracy", "n_train", "n_val",
                  "n_test", "n_test_sections", "n_classes_train", "n_classes_test", "converged", "n_iter"]


@dataclass
class _Probe:
    """The chosen probe of one run, folded for float32 scoring: logits = x @ W + b over ``present`` classes."""

    W: np.ndarray  # (D, K) float32, standardisation folded in
    b: np.ndarray  # (K,) float32
    present: np.ndarray  # (K,) bool


def _fold(model, r: int) -> _Probe:
    W = model.W_[r] / model.scale_[r][:, None]
    b = model.b_[r] - model.mean_[r] @ W
    return _Probe(W=W.astype(np.float32), b=b.astype(np.float32), present=model.present_[r].copy())


def _softmax_present(z: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Softmax over the present classes; absent classes get probability 0 (the engine's convention)."""
    return softmax_last_axis(np.where(present[None, :], z, -np.inf))


class _Reader:
    """Base arrays of panel rows, read from the per-section memory maps (one section at a time)."""

    def __init__(self, panel: PanelCells, features: Mapping[str, CellFeatures]):
        self.panel = panel
        self.features = features

    def base(self, rows: np.ndarray, names: Sequence[str]) -> dict[str, np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        out: dict[str, list[np.ndarray]] = {n: [] for n in names}
        codes = self.panel.section_code[rows]
        # rows are sorted, so each section's rows are one contiguous run of ``rows``
        bounds = np.flatnonzero(np.diff(codes)) + 1
        for part in np.split(np.arange(rows.size), bounds):
            if part.size == 0:
                continue
            section = self.panel.sections[int(codes[part[0]])]
            local = rows[part] - self.panel.offsets[int(codes[part[0]])]
            arrays = self.features[section].base(local, names)
            for n in names:
                out[n].append(arrays[n])
        return {n: (np.concatenate(v) if v else np.zeros((0, 0), np.float32)) for n, v in out.items()}


def _check_job(runs: pd.DataFrame) -> tuple[str, float, str]:
    needed = ["protocol", "encoder", "magnification", "taxonomy", "readout", "seed", "unit"]
    missing = [c for c in needed if c not in runs.columns]
    if missing:
        raise FmauditInputError(f"cell runs: missing column(s) {missing} (rows of fmaudit.grid.cell_runs)")
    if len(runs) == 0:
        raise FmauditInputError("cell runs: no runs given")
    keys = runs[["encoder", "magnification", "protocol"]].astype(str).drop_duplicates()
    if len(keys) != 1:
        raise FmauditInputError(f"cell runs: one job is one (encoder, magnification, protocol); got {len(keys)}: "
                                f"{keys.head(3).to_dict('records')}")
    return str(runs["encoder"].iloc[0]), float(runs["magnification"].iloc[0]), str(runs["protocol"].iloc[0])


def run_cell_shard(
    runs: pd.DataFrame,
    features: Mapping[str, PathLike | CellFeatures],
    manifests: Mapping[str, pd.DataFrame | PathLike],
    sections_by_organ: Mapping[str, Sequence[str]],
    *,
    Cs: Sequence[float],
    val_fraction: float,
    max_train_cells: int | None,
    max_val_cells: int | None,
    roi_fraction: float | None = None,
    fold_manifest: pd.DataFrame | PathLike | None = None,
    n_folds: int | None = None,
    n_classes: Mapping[str, int] | None = None,
    standardize: bool = True,
    tol: float = 1e-4,
    max_iter: int = 1000,
    device: str = "auto",
    dtype: str = "mixed",
    chunk_bytes: int = 64 << 20,
    score_budget_bytes: int = 256 << 20,
    fit_budget_bytes: int = 1 << 30,
    n_threads: int | None = None,
    call_workers: int | None = None,
    fit_pool: FitPool | None = None,
    logger: logging.Logger | None = None,
) -> pd.DataFrame:
    """Run every cell run of one job and return one row per run (``runs``' columns + :data:`RESULT_COLUMNS`).

    ``runs``: rows of :func:`fmaudit.grid.cell_runs` for one (encoder, magnification, protocol).
    ``features``: section -> feature folder (or opened :class:`CellFeatures`) of this encoder and magnification,
    for every section the runs test or train on. ``manifests``: section -> cell manifest (same sections, same
    cell order as the features). ``sections_by_organ``: the config's ``cells.sections``. ``roi_fraction``: IS's
    ROI share (needed for IS). ``fold_manifest`` and ``n_folds``: MOCV's fold manifest (None: the organ-aware
    :func:`~fmaudit.cells.protocols.make_fold_manifest`) and fold count. ``Cs``: the probe's C grid.
    ``n_classes``: K per taxonomy (default: from the labels). ``dtype``: the engine's precision: "mixed"
    (float32 products, float64 sums and state, tol confirmed in float64: :func:`fmaudit.probes.fit_logistic_batch`
    with ``dtype=None``), "float32" (products only in float32: a probe stops where float32 stalls, short of a
    tight tol) or "float64".
    ``chunk_bytes``, ``score_budget_bytes``, ``fit_budget_bytes``: memory bounds (module doc); they change
    how the work is batched, never the numbers. ``n_threads``: the engine's CPU threads (default: torch's).

    Parameters
    ----------
    runs : DataFrame
        The job's rows of :func:`fmaudit.grid.cell_runs`: ``encoder``, ``magnification``, ``protocol`` (one
        value each), ``taxonomy``, ``readout``, ``seed``, ``unit``.
    features : mapping of str to path or CellFeatures
        Section -> its feature folder (:func:`fmaudit.cells.features.write_cell_features`) or the opened
        folder, for every section a run trains or tests on.
    manifests : mapping of str to DataFrame or path
        Section -> its cell manifest, the cells in the features' order.
    sections_by_organ : mapping of str to sequence of str
        Organ -> its sections (the config's ``cells.sections``).
    Cs : sequence of float
        The probe's C grid, positive (``cells.probe.C``).
    val_fraction : float
        Share of the training-side cells drawn for validation, in (0, 1) (``cells.probe.val_fraction``).
    max_train_cells, max_val_cells : int or None
        Training and validation cells per run, drawn by the seed; None: all.
    roi_fraction : float or None
        IS's ROI share of a section (needed for IS).
    fold_manifest : DataFrame, path or None
        MOCV's fold manifest; None: :func:`~fmaudit.cells.protocols.make_fold_manifest`.
    n_folds : int or None
        MOCV's fold count (needed for MOCV).
    n_classes : mapping of str to int, or None
        Taxonomy -> K; None: from the labels.
    standardize : bool
        Standardise each run's training cells (``cells.probe.standardize``).
    tol : float
        Stopping tolerance of the fits (max-abs gradient of the scaled objective, ``cells.probe.tol``).
    max_iter : int
        Iteration cap of the fits (``cells.probe.max_iter``).
    device : str
        Where the engine runs: ``auto`` (a GPU when there is one), ``cpu``, ``cuda`` ...
    dtype : str
        The engine's precision: ``mixed``, ``float32`` or ``float64`` (above).
    chunk_bytes, score_budget_bytes, fit_budget_bytes : int
        Memory bounds in bytes: test chunk per readout array, kept softmax scores per pass, training rows of a
        group of units.
    n_threads : int or None
        The engine's CPU threads; None: torch's.
    call_workers : int or None
        Cores the engine calls are fitted on side by side, each call single-threaded, in one fewer worker
        processes and this one (:class:`fmaudit.probes.pool.FitPool`); None: ``n_threads`` on CPU where the
        shard's modelled work is at least :data:`POOL_MIN_WORK`, else 1 (each call in this process on
        ``n_threads`` threads).
    fit_pool : FitPool or None
        An open pool to fit in instead (``call_workers`` is then its size), left open: a caller running many
        shards in one process starts its workers once (``benchmarks/bench_cell_shard.py`` times the shard on
        equal terms with a baseline whose processes it starts before timing); None: the shard opens its own.
    logger : logging.Logger or None
        Where progress goes; None: this module's logger.

    Returns
    -------
    DataFrame
        ``runs``' columns, then :data:`RESULT_COLUMNS` (``status`` ``ok`` or ``skipped: <reason>``; metrics NaN
        for a skipped run), ``f1_convention`` and ``auroc_convention``; one row per run, in ``runs``' order.

    Raises
    ------
    FmauditInputError
        Runs of several jobs or missing columns, a C grid or a cap that is not valid, an unknown ``dtype``,
        MOCV without ``n_folds`` or IS without ``roi_fraction``, a section without features or manifest,
        features of other cells, another encoder or magnification, or feature widths that differ.
    RuntimeError
        A run was left without a result (a bug, not an input error).
    """
    import torch

    logger = logger or log
    encoder, magnification, protocol = _check_job(runs)
    Cs = np.sort(np.asarray(list(Cs), dtype=float))
    if Cs.size == 0 or not (np.isfinite(Cs).all() and (Cs > 0).all()):
        raise FmauditInputError(f"cells probe C grid: need positive numbers, got {list(Cs)}")
    for name, cap in (("max_train_cells", max_train_cells), ("max_val_cells", max_val_cells)):
        if cap is not None and (isinstance(cap, bool) or int(cap) != cap or cap < 1):
            raise FmauditInputError(f"cells probe {name}={cap!r}: need a whole number >= 1, or None for no cap")
    dtypes = {"mixed": None, "float32": torch.float32, "float64": torch.float64}
    if dtype not in dtypes:
        raise FmauditInputError(f"engine dtype {dtype!r}: use mixed, float32 or float64")
    torch_dtype = dtypes[dtype]
    taxonomies = list(dict.fromkeys(runs["taxonomy"].astype(str)))
    folds = None
    if protocol == "MOCV":
        if n_folds is None:
            raise FmauditInputError("MOCV runs need n_folds (cells.protocols.MOCV.folds)")
        if fold_manifest is None:
            fold_manifest = make_fold_manifest(sections_by_organ, int(n_folds))
        folds = read_fold_manifest(fold_manifest, sections_by_organ, int(n_folds))
    if protocol == "IS" and roi_fraction is None:
        raise FmauditInputError("IS runs need roi_fraction (cells.protocols.IS.roi_fraction)")
    units = list(dict.fromkeys(runs["unit"].astype(str)))
    needed = sorted({s for u in units for part in unit_sections(protocol, u, sections_by_organ, folds) for s in part})
    missing = [s for s in needed if s not in features or s not in manifests]
    if missing:
        raise FmauditInputError(f"{encoder} {magnification:g}x {protocol}: no features or manifest for section(s) "
                                f"{missing}")
    panel = panel_from_manifests({s: manifests[s] for s in needed}, taxonomies, n_classes)
    opened = {s: features[s] if isinstance(features[s], CellFeatures) else open_cell_features(features[s])
              for s in needed}
    for s in needed:
        if len(opened[s]) != panel.rows_of(s).size or ids_digest(opened[s].item_ids) != panel.id_digest[s]:
            raise FmauditInputError(f"{opened[s].path}: its cells are not the cells of section {s!r}'s manifest "
                                    f"(in order); re-extract the features with this manifest")
        if opened[s].meta.get("encoder") not in (None, encoder):
            raise FmauditInputError(f"{opened[s].path}: features of encoder {opened[s].meta.get('encoder')!r}, "
                                    f"not {encoder!r}")
        mag = opened[s].meta.get("magnification")
        if mag is not None and not np.isclose(float(mag), magnification):
            raise FmauditInputError(f"{opened[s].path}: features at {mag}x, the job is at {magnification:g}x")
    has_cls = all(opened[s].has_cls for s in needed)
    widths = {opened[s].embed_dim for s in needed}
    if len(widths) != 1:
        raise FmauditInputError(f"{encoder}: feature widths differ between sections ({sorted(widths)})")
    reader = _Reader(panel, opened)
    settings = dict(sections_by_organ=sections_by_organ, folds=folds, taxonomies=taxonomies,
                    roi_fraction=roi_fraction, val_fraction=val_fraction, max_train_cells=max_train_cells,
                    max_val_cells=max_val_cells)
    engine = dict(standardize=standardize, tol=tol, max_iter=max_iter, device=device, dtype=torch_dtype,
                  n_threads=n_threads)

    t0 = time.perf_counter()
    results: dict[int, dict[str, Any]] = {}
    run_index = runs.reset_index(drop=True)
    unit_of_run = run_index["unit"].astype(str).to_numpy()
    readouts = [r for r in dict.fromkeys(run_index["readout"].astype(str)) if has_cls or not needs_cls(r)]
    n_bases = len(base_readouts_of(readouts) or ["nuc"])
    width = widths.pop()
    max_width = 2 * width
    partitions = []
    for unit in units:
        seeds = sorted(set(int(x) for x in run_index.loc[unit_of_run == unit, "seed"]))
        partitions.append((unit, {seed: make_partition(panel, protocol, unit, seed, **settings) for seed in seeds}))
    workers = call_workers if fit_pool is None else fit_pool.workers
    if workers is None:
        fit_rows = sum(p.train.size for _, parts in partitions for p in parts.values())
        work = fit_rows * Cs.size * len(readouts) * len(taxonomies) * width * max(panel.n_classes.values())
        threads = torch.get_num_threads() if n_threads is None else int(n_threads)
        on_cpu = resolve_device(device).type == "cpu"
        workers = min(threads, len(readouts) * len(taxonomies)) if on_cpu and work >= POOL_MIN_WORK else 1
    done = 0
    group: list[tuple[str, dict[int, Partition]]] = []
    group_rows = 0
    with contextlib.nullcontext(fit_pool) if fit_pool is not None else FitPool(workers) as pool:
        if pool.parallel:
            logger.info("%s %gx %s: engine calls side by side on %d cores (%d worker processes and this one), "
                        "each single-threaded", encoder, magnification, protocol, pool.workers, pool.workers - 1)
        for unit, parts in partitions:
            rows = sum(p.train.size + p.val.size for p in parts.values())
            # units are fitted together (one engine call per readout and taxonomy) while their training rows fit
            # the budget: base arrays and one readout (float32), and per call in flight (one per core) the
            # engine's forms of the readout (ENGINE_BYTES_PER_VALUE per value: the whitened form's bound) and,
            # in each of the workers - 1 worker processes, its own copy of the readout
            engine_bytes = pool.workers * ENGINE_BYTES_PER_VALUE + 4 * (pool.workers - 1)
            per_row = 4 * (n_bases * max_width // 2 + max_width) + engine_bytes * max_width
            if group and (group_rows + rows) * per_row > fit_budget_bytes:
                results.update(_run_group(run_index, group, protocol, panel, reader, has_cls, Cs, engine,
                                          chunk_bytes, score_budget_bytes, pool))
                done += len(group)
                logger.info("%s %gx %s: %d/%d units done, %.1f s so far", encoder, magnification, protocol, done,
                            len(units), time.perf_counter() - t0)
                group, group_rows = [], 0
            group.append((unit, parts))
            group_rows += rows
        if group:
            results.update(_run_group(run_index, group, protocol, panel, reader, has_cls, Cs, engine, chunk_bytes,
                                      score_budget_bytes, pool))
    pending = [results[i]["run_id"] for i in results if results[i]["status"] == "pending"]
    if pending or len(results) != len(run_index):
        raise RuntimeError(f"cell shard: {len(pending)} run(s) left without a result, e.g. {pending[:3]}")
    out = run_index.copy()
    res = pd.DataFrame([results[i] for i in range(len(run_index))], columns=RESULT_COLUMNS)
    out = pd.concat([out, res], axis=1)
    out["f1_convention"] = F1_CONVENTION
    out["auroc_convention"] = AUROC_CONVENTION
    out.attrs["engine_workers"] = workers  # how the calls ran (benchmarks/bench_cell_shard.py reports it)
    elapsed = time.perf_counter() - t0
    n_ok = int((out["status"] == "ok").sum())
    logger.info("%s %gx %s: %d runs (%d ok) in %.1f s (%.2f runs/s)", encoder, magnification, protocol, len(out),
                n_ok, elapsed, len(out) / max(elapsed, 1e-9))
    return out


def shard_settings(cells: Mapping[str, Any], protocol: str) -> dict[str, Any]:
    """:func:`run_cell_shard`'s keyword arguments from a validated config's ``cells`` block (defaults filled
    by the config schema, their one home) for one protocol.

    Parameters
    ----------
    cells : mapping
        The validated config's ``cells`` block: ``probe`` (``C``, ``val_fraction``, ``max_train_cells``,
        ``max_val_cells``, ``standardize``, ``tol``, ``max_iter``) and ``protocols``.
    protocol : str
        A protocol of :data:`fmaudit.cells.protocols.CELL_PROTOCOLS` (``IS``, ``IOCD``, ``MOCV``, ``LOOO``).

    Returns
    -------
    dict
        ``Cs``, ``val_fraction``, ``max_train_cells``, ``max_val_cells``, ``standardize``, ``tol``,
        ``max_iter``, ``roi_fraction``, ``fold_manifest`` and ``n_folds`` (None where the protocol has none).
    """
    probe = cells["probe"]
    spec = cells["protocols"][protocol]
    return {"Cs": list(probe["C"]), "val_fraction": probe["val_fraction"], "max_train_cells": probe["max_train_cells"],
            "max_val_cells": probe["max_val_cells"], "standardize": probe["standardize"], "tol": probe["tol"],
            "max_iter": probe["max_iter"], "roi_fraction": spec.get("roi_fraction"),
            "fold_manifest": spec.get("fold_manifest"), "n_folds": spec.get("folds")}


def _empty_result(run_id: str, status: str, **extra: Any) -> dict[str, Any]:
    row = {c: np.nan for c in RESULT_COLUMNS}
    row.update(run_id=run_id, status=status, converged=False, **extra)
    return row


def _run_group(run_index: pd.DataFrame, group: Sequence[tuple[str, Mapping[int, Partition]]], protocol: str,
               panel: PanelCells, reader: _Reader, has_cls: bool, Cs: np.ndarray, engine: Mapping[str, Any],
               chunk_bytes: int, score_budget_bytes: int, pool: FitPool) -> dict[int, dict[str, Any]]:
    """Fit every run of a group of units (one engine call per readout and taxonomy, all units, seeds and Cs
    together), choose each run's C on its validation cells, then score each unit on its test cells."""
    results: dict[int, dict[str, Any]] = {}
    probes: dict[int, _Probe] = {}
    tests: dict[int, np.ndarray] = {}
    units = [u for u, _ in group]
    runs = run_index[run_index["unit"].astype(str).isin(units)]
    partitions = {(unit, seed): part for unit, parts in group for seed, part in parts.items()}
    fit_rows = np.unique(np.concatenate([np.r_[p.train, p.val] for p in partitions.values()]))
    readouts = [r for r in dict.fromkeys(runs["readout"].astype(str)) if has_cls or not needs_cls(r)]
    # the widest readouts' calls first: with worker processes, the last calls to finish are the short ones
    readouts.sort(key=lambda r: -readout_width(r, 1))
    for i, run in runs.iterrows():
        results[i] = _empty_result(_run_id(protocol, run), "pending")
        if not has_cls and needs_cls(str(run.readout)):
            results[i]["status"] = "skipped: readout needs a class token (the encoder has none)"
    base = reader.base(fit_rows, base_readouts_of(readouts)) if readouts else {}
    position = {key: (np.searchsorted(fit_rows, p.train), np.searchsorted(fit_rows, p.val))
                for key, p in partitions.items()}
    test_rows: dict[tuple[str, int, str], np.ndarray] = {}
    in_flight: deque = deque()

    def choose_C(limit: int) -> None:
        """Each finished call's runs: the C with the best validation macro-F1, until ``limit`` calls are left."""
        while len(in_flight) > limit:
            future, X, y_all, todo, k = in_flight.popleft()
            model = future.result()
            for j, (i, _, va) in enumerate(todo):
                candidates = [_fold(model, j * Cs.size + c) for c in range(Cs.size)]
                W = np.concatenate([p.W for p in candidates], axis=1)
                b = np.concatenate([p.b for p in candidates])
                z = (X[va] @ W + b).reshape(va.size, Cs.size, k)
                val_f1 = np.array([macro_f1_present(y_all[va], _argmax_present(z[:, c], candidates[c].present), k)
                                   for c in range(Cs.size)])
                best = int(np.argmax(val_f1))  # first maximum: the smallest C among ties
                probes[i] = candidates[best]
                r = j * Cs.size + best
                results[i].update(status="ok", C=float(Cs[best]), val_macro_f1=float(val_f1[best]),
                                  converged=bool(model.converged_[r]), n_iter=int(model.n_iter_[r]))

    for readout in readouts:
        X = fuse_readout(readout, **{k: base.get(k) for k in BASE_READOUTS})
        calls, waiting = [], []  # the readout's taxonomies, fitted together (the same rows and subsets)
        for tax in dict.fromkeys(runs["taxonomy"].astype(str)):
            y_all = panel.labels[tax][fit_rows].astype(np.int64)
            k = panel.n_classes[tax]
            todo: list[tuple[int, np.ndarray, np.ndarray]] = []
            for i, run in runs[(runs["readout"].astype(str) == readout)
                               & (runs["taxonomy"].astype(str) == tax)].iterrows():
                part = partitions[(str(run.unit), int(run.seed))]
                tr, va = position[(str(run.unit), int(run.seed))]
                tr, va = tr[y_all[tr] >= 0], va[y_all[va] >= 0]
                key = (str(run.unit), int(run.seed), tax)
                if key not in test_rows:  # shared by the readouts of a (unit, seed, taxonomy)
                    test_rows[key] = part.test[panel.labels[tax][part.test] >= 0]
                test = test_rows[key]
                results[i].update(n_train=tr.size, n_val=va.size, n_test=test.size,
                                  n_test_sections=len(part.test_sections),
                                  n_classes_train=int(np.unique(y_all[tr]).size))
                if np.unique(y_all[tr]).size < 2:
                    results[i]["status"] = "skipped: fewer than 2 classes among the training cells"
                elif va.size == 0:
                    results[i]["status"] = "skipped: no labelled validation cells"
                elif test.size == 0:
                    results[i]["status"] = "skipped: no labelled test cells"
                else:
                    todo.append((i, tr, va))
                    tests[i] = test
            if not todo:
                continue
            # unlabelled rows are in no subset, so their placeholder label never enters a fit
            y_fit = np.where(y_all >= 0, y_all, 0)
            calls.append(((X, y_fit, [tr for _, tr, _ in todo for _ in Cs], np.tile(Cs, len(todo)), k), engine))
            waiting.append((X, y_all, todo, k))
        if calls:
            # one process fits a readout's calls one after another: the second reuses the first's whitened rows
            for future, rest in zip(pool.submit_together(calls), waiting):
                in_flight.append((future, *rest))
            # with workers, one readout waits in the queue while each worker fits one (none idles between them)
            choose_C(len(calls) * pool.workers if pool.parallel else 0)
        del X
    choose_C(0)
    del base
    for unit in units:
        unit_runs = runs[(runs["unit"].astype(str) == unit) & runs.index.isin(list(probes))]
        if len(unit_runs):
            _score_unit(unit_runs, probes, tests, results, panel, reader, chunk_bytes, score_budget_bytes)
    return results


def _run_id(protocol: str, run: Any) -> str:
    return f"{protocol}__{run.taxonomy}__{run.readout}__s{int(run.seed)}__{run.unit}"


def _argmax_present(z: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Argmax over the classes present in training (ties to the lowest index, as numpy)."""
    return np.where(present[None, :], z, -np.inf).argmax(axis=1)


def _score_unit(unit_runs: pd.DataFrame, probes: Mapping[int, _Probe], tests: Mapping[int, np.ndarray],
                results: dict[int, dict[str, Any]], panel: PanelCells, reader: _Reader, chunk_bytes: int,
                score_budget_bytes: int) -> None:
    """Apply the unit's probes to its test cells in streamed chunks; fill macro-F1 and AUROC."""
    ids = list(unit_runs.index)
    all_test = np.unique(np.concatenate([tests[i] for i in ids]))
    # passes: groups of runs whose score arrays fit the budget together
    passes: list[list[int]] = [[]]
    used = 0
    for i in ids:
        need = tests[i].size * probes[i].W.shape[1] * 4
        if passes[-1] and used + need > score_budget_bytes:
            passes.append([])
            used = 0
        passes[-1].append(i)
        used += need
    readout_of = unit_runs["readout"].astype(str)
    for group in passes:
        scores = {i: np.empty((tests[i].size, probes[i].W.shape[1]), dtype=np.float32) for i in group}
        filled = {i: 0 for i in group}
        readouts = list(dict.fromkeys(readout_of[i] for i in group))
        width = max(probes[i].W.shape[0] for i in group)
        step = max(1024, int(chunk_bytes // (4 * width)))
        for start in range(0, all_test.size, step):
            rows = all_test[start:start + step]
            base = reader.base(rows, base_readouts_of(readouts))
            for readout in readouts:
                X = fuse_readout(readout, **{k: base.get(k) for k in BASE_READOUTS})
                for i in group:
                    if readout_of[i] != readout:
                        continue
                    # test rows are sorted, so this chunk's share of run i is its next contiguous block
                    lo = filled[i]
                    hi = lo + int(np.searchsorted(tests[i][lo:], rows[-1], side="right"))
                    if hi == lo:
                        continue
                    local = np.searchsorted(rows, tests[i][lo:hi])
                    # a run's test cells are often all of the chunk's rows, or one run of them: a view, not a copy
                    rows_of_run = (slice(int(local[0]), int(local[-1]) + 1) if local[-1] - local[0] + 1 == local.size
                                   else local)
                    probe = probes[i]
                    scores[i][lo:hi] = _softmax_present(X[rows_of_run] @ probe.W + probe.b, probe.present)
                    filled[i] = hi
                del X
            del base
        for i in group:
            if filled[i] != tests[i].size:
                raise RuntimeError(f"run {results[i]['run_id']}: scored {filled[i]} of {tests[i].size} test cells")
            tax = str(unit_runs.loc[i, "taxonomy"])
            y = panel.labels[tax][tests[i]].astype(np.int64)
            pred = scores[i].argmax(axis=1)
            results[i].update(
                macro_f1=macro_f1_present(y, pred, scores[i].shape[1]),
                macro_auroc=macro_auroc_present(y, scores[i]),
                accuracy=float((pred == y).mean()),
                n_classes_test=int(np.unique(y).size))
        del scores

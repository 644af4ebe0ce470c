"""Benchmark: one CellPath protocol shard at the paper's panel shape, and the on-disk cost of cell features.

Part 1, the shard (``fmaudit.analyses.cell_suite.run_cell_shard``). The panel has the paper's shape: the
CellPath preset's 25 sections in 11 organs (resources/presets/cellpath.yaml), 9 fine and 3 coarse classes,
7 readouts, the preset's seeds and the MOCV fold manifest of resources/cells/. Cells are simulated, written in
the real feature format (float16 folders, ``write_cell_features``): ``--cells-per-section`` cells per section
(default 20,000; the paper averages ~283,000, 7,079,283 / 25, which would need ~4 GB of features per
encoder and magnification at width 384 and hours of CPU here), ``--cells-per-patch`` per patch, width
``--dim``. Nuc carries the class (planted), the patch Mean dilutes it, sections and organs shift every
readout. The job's run count is the grid's (``fmaudit.grid.cell_runs`` on the preset, one encoder and
magnification). It is run in a fresh process, so its peak RSS (``resource.getrusage``) is the shard's alone;
a second fresh process that only imports, reads the manifests and opens the memory maps gives the floor.
Printed: runs, wall seconds, runs/s, peak RSS, floor RSS, the peak of allocated (RssAnon) and of mapped
feature-file (RssFile) memory, and what materialising all seven readouts of every section at once would take
(the bound the streaming avoids). Nothing is extrapolated to 283k cells: ``--cells-per-section 283000`` writes
the paper's 7.1 M cells (5.8 GB at D = 384; ``simulate --root DIR`` once, then ``--root DIR``), and
``--units n`` runs a shard's first n units only (every run of them), which bounds the time on 2 CPU cores.

Baseline (``baseline`` mode, or after the shard with ``--baseline-units n``): the engine against scikit-learn
at equal accuracy and equal work on the first n units' runs (every (run, C) probe, C chosen on the same
validation cells, scored on the same test cells; benchmarks/cell_baseline.py): each side at the largest tol
whose probes reach max |delta P| <= ``--target`` from a converged reference (found per side), the engine as
the whole shard with ``--threads`` threads, scikit-learn ``make_pipeline(StandardScaler(),
LogisticRegression)`` per (run, C) sequential on one thread and in 2 processes (the faster is the baseline);
``--repeats`` interleaved repeats, medians of wall and CPU seconds. Printed: runs/s of each, the ratio, the
largest |macro-F1| gap and same-C share, and the CPU-hours this rate projects for the CellPath preset's runs
of one encoder. ``--ceiling``: the products of the engine's own L-BFGS iterations alone, at this machine's
single-threaded float32 product speed (one problem wide and a subset's C values wide), and the ratio to
the strongest baseline that bound allows; and the floor of this engine's design (``cell_baseline.loop_floor``):
a lean lock-step L-BFGS run at exactly the engine's own iteration counts with one evaluation each and the
engine's layout, forms and float64 state, timed in its products, with the forms' one-off work (scaling,
eigendecompositions, whitened rows) and with the rest of the loop, and the ratios those allow. Products
measured in a loop run slower than the ceiling's hot repeats, so the floor's first figure is the lower.

Part 2, bytes per cell on disk. From the format: per cell, Nuc (D float16) + a row of cells.parquet (item id,
patch, u, v); per patch Mean and Cls (D float16 each) shared by the patch's cells. Fusions are computed on
read. For ViT-S/16 (384), ViT-L (1024) and ViT-H (1536) at the cells-per-patch this benchmark's panel uses,
and measured on a folder the demo encoder writes on the real slide resources/data/CMU-1-Small-Region.svs
(cells on a jittered grid at ``--demo-density`` cells/mm²), against "seven stored float32 copies".

Run: ``OMP_NUM_THREADS=2 nice -n 10 .venv/bin/python benchmarks/bench_cell_shard.py [--protocol LOOO]
[--cells-per-section 20000] [--dim 384] [--quick]``; the ratio alone on a simulated panel:
``bench_cell_shard.py simulate --root DIR --cells-per-section 2000 --dim 384`` then
``bench_cell_shard.py baseline --root DIR --protocol IS --dim 384 --max-train-cells 2000 --max-val-cells 500``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

REPO = Path(__file__).resolve().parents[1]
PRESET = REPO / "resources" / "presets" / "cellpath.yaml"
FOLDS = REPO / "resources" / "cells" / "cellpath_folds.tsv"
K_FINE, COARSE_OF = 9, np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
CS = (0.001, 0.01, 0.1, 1.0)


def preset_cells() -> dict:
    from fmaudit.registry import load_yaml

    return load_yaml(PRESET)


def simulate_panel(root: Path, cells_per_section: int, cells_per_patch: int, dim: int, seed: int = 0) -> None:
    """Write manifests and float16 feature folders of the preset's 25 sections (see the module doc)."""
    from fmaudit.cells.features import write_cell_features
    from fmaudit.io import write_table

    sections = preset_cells()["cells"]["sections"]
    rng = np.random.default_rng(seed)
    class_means = rng.normal(scale=2.5 / np.sqrt(2 * dim), size=(K_FINE, dim))  # means ~2.5 noise SDs apart
    organ_shift = {o: rng.normal(scale=0.4, size=dim) for o in sections}
    for organ, secs in sections.items():
        for section in secs:
            n = cells_per_section
            labels = rng.choice(K_FINE, n, p=rng.dirichlet(np.full(K_FINE, 2.0)))
            n_patches = n // cells_per_patch
            side = int(np.ceil(np.sqrt(n_patches)))
            cell_patch = np.sort(rng.integers(0, n_patches, n))
            uv = rng.uniform(size=(n, 2)).astype(np.float32)
            shift = organ_shift[organ] + rng.normal(scale=0.2, size=dim)
            nuc = (class_means[labels] + rng.normal(size=(n, dim)) + shift).astype(np.float32)
            sums = np.zeros((n_patches, dim))
            np.add.at(sums, cell_patch, class_means[labels])
            counts = np.maximum(np.bincount(cell_patch, minlength=n_patches), 1)[:, None]
            mean = (sums / counts + 0.5 * rng.normal(size=(n_patches, dim)) + shift).astype(np.float32)
            cls = (mean + 0.5 * rng.normal(size=(n_patches, dim))).astype(np.float32)
            write_cell_features(root / "features" / section, [f"{section}/c{i}" for i in range(n)], cell_patch, uv,
                                nuc, mean, cls, meta={"encoder": "sim-vit", "magnification": 20.0})
            unlabelled = rng.uniform(size=n) < 0.05
            fine = pd.array(np.where(unlabelled, -1, labels), dtype="Int64")
            fine[unlabelled] = pd.NA
            coarse = pd.array(np.where(unlabelled, -1, COARSE_OF[labels]), dtype="Int64")
            coarse[unlabelled] = pd.NA
            x = (cell_patch % side + uv[:, 0]) * 448.0
            y = (cell_patch // side + uv[:, 1]) * 448.0
            write_table(root / "manifests" / f"{section}.parquet", pd.DataFrame({
                "item_id": [f"{section}/c{i}" for i in range(n)], "cell_id": [f"c{i}" for i in range(n)],
                "section": section, "organ": organ, "slide": f"/simulated/{section}.ome.tif", "mpp": 0.25,
                "he_x": x, "he_y": y, "centre_source": "simulated", "label_fine": fine, "label_coarse": coarse,
                "label_fine_name": None, "label_coarse_name": None}))


def job_runs(protocol: str, units: int = 0):
    """The grid's runs of one job (one encoder, 20x, ``protocol``); with ``units`` > 0 only those of its first
    ``units`` units (every seed, taxonomy and readout of each)."""
    from fmaudit import grid

    cfg = preset_cells()
    cfg["encoders"] = ["sim-vit"]
    cfg["cells"]["magnifications"] = [20]
    runs = grid.cell_runs(cfg)
    runs = runs[runs["protocol"] == protocol]
    if units:
        runs = runs[runs["unit"].astype(str).isin(list(dict.fromkeys(runs["unit"].astype(str)))[:units])]
    return runs.reset_index(drop=True)


def shard_kwargs(args) -> dict:
    cfg = preset_cells()["cells"]
    return dict(Cs=CS, roi_fraction=0.5, val_fraction=0.2, max_train_cells=args.max_train_cells or None,
                max_val_cells=args.max_val_cells or None, fold_manifest=FOLDS,
                n_folds=cfg["protocols"]["MOCV"]["folds"],
                n_classes={"fine": K_FINE, "coarse": 3}, tol=args.tol, device=args.device)


def inputs(root: Path):
    sections = [s for secs in preset_cells()["cells"]["sections"].values() for s in secs]
    return ({s: root / "features" / s for s in sections}, {s: root / "manifests" / f"{s}.parquet" for s in sections})


class _MemorySampler:
    """Peak of the process's anonymous and file-backed resident memory (/proc/self/status RssAnon, RssFile),
    sampled every 0.1 s in a thread. ru_maxrss counts both: pages of the memory-mapped feature files that the
    shard has read are resident (and reclaimable page cache), not memory the shard allocated."""

    def __init__(self):
        import threading

        self.peak = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        try:
            lines = Path("/proc/self/status").read_text().splitlines()
        except OSError:
            return
        for line in lines:
            key = line.split(":", 1)[0]
            if key in self.peak:
                self.peak[key] = max(self.peak[key], int(line.split()[1]))

    def _run(self):
        while not self._stop.wait(0.1):
            self._sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()


def child_shard(args) -> None:
    """Run one shard (or only open its inputs, with --floor) and print JSON with the peak RSS."""
    import logging

    from fmaudit.analyses.cell_suite import run_cell_shard
    from fmaudit.cells.features import open_cell_features
    from fmaudit.cells.protocols import panel_from_manifests

    logging.basicConfig(level=logging.WARNING)
    root = Path(args.root)
    runs = job_runs(args.protocol, args.units)
    features, manifests = inputs(root)
    cells = preset_cells()["cells"]
    t0 = time.perf_counter()
    with _MemorySampler() as memory:
        if args.floor:
            panel_from_manifests(manifests, ["fine", "coarse"])
            [open_cell_features(p) for p in features.values()]
            out = None
        else:
            out = run_cell_shard(runs, features, manifests, cells["sections"], **shard_kwargs(args))
    wall = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"runs": len(runs), "wall_s": wall, "peak_rss_mib": peak_mib,
              "peak_anon_mib": memory.peak["RssAnon"] / 1024, "peak_file_mib": memory.peak["RssFile"] / 1024}
    if out is not None:
        result["n_ok"] = int((out["status"] == "ok").sum())
        result["macro_f1_nuc_fine"] = float(
            out.loc[(out["readout"] == "nuc") & (out["taxonomy"] == "fine"), "macro_f1"].mean())
        result["macro_f1_mean_fine"] = float(
            out.loc[(out["readout"] == "mean") & (out["taxonomy"] == "fine"), "macro_f1"].mean())
    print("RESULT " + json.dumps(result))


def baseline(args) -> dict:
    """The engine against scikit-learn at equal accuracy and equal work on the first --baseline-units units'
    runs (benchmarks/cell_baseline.py); prints as it goes and returns the summary."""
    import cell_baseline as cb
    from fmaudit.analyses.cell_suite import run_cell_shard
    from fmaudit.probes.pool import FitPool

    root = Path(args.root)
    runs = job_runs(args.protocol)
    units = list(dict.fromkeys(runs["unit"].astype(str)))[: args.baseline_units]
    sub = runs[runs["unit"].astype(str).isin(units)]
    if args.baseline_seeds:
        sub = sub[sub["seed"].isin(sorted(set(sub["seed"]))[: args.baseline_seeds])]
    sub = sub.reset_index(drop=True)
    features, manifests = inputs(root)
    sections = preset_cells()["cells"]["sections"]
    kw = shard_kwargs(args)
    threads = args.threads
    print(f"\nequal accuracy: {args.protocol} units {units} ({len(sub)} runs x {len(CS)} C = {len(sub) * len(CS)} "
          f"probes), target max |dP| <= {args.target:g}; {threads} thread(s); load average {os.getloadavg()}")
    calls = cb.record_calls(sub, features, manifests, sections, dict(kw, n_threads=threads))
    shapes = sorted({(c.X.shape[1], c.n_classes, len(c.subsets), int(np.median([s.size for s in c.subsets])))
                     for c in calls})
    print(f"engine calls: {len(calls)} (width, classes, problems, median training cells): {shapes}")
    start = time.perf_counter()
    cb.add_references(calls)
    print(f"reference (engine, float64, tol 1e-10) in {time.perf_counter() - start:.0f} s; against scikit-learn lbfgs "
          f"tol 1e-10 on the first call's largest-C problems: max |dP| {cb.check_reference(calls):.1e}")
    engine_tol, engine_err = (args.engine_tol, cb.engine_error(calls, args.engine_tol, threads)) if args.engine_tol \
        else cb.pick_tol("engine", lambda t: cb.engine_error(calls, t, threads), args.target)
    sk_tol, sk_err = (args.sklearn_tol, cb.sklearn_error(calls, args.sklearn_tol)) if args.sklearn_tol \
        else cb.pick_tol("sklearn", lambda t: cb.sklearn_error(calls, t), args.target, start=engine_tol)
    print(f"tol: engine {engine_tol:g} (max |dP| {engine_err:.2e}), scikit-learn {sk_tol:g} (max |dP| {sk_err:.2e})")
    shard = cb.SklearnShard(root, args.protocol, sections, kw, features, manifests, FOLDS)
    shard_kw = dict(kw, tol=engine_tol, n_threads=threads, call_workers=args.call_workers)
    # scikit-learn's worker processes are started before anything is timed, and so are the engine's: a shard
    # starts its pool once per job (a full shard is many units), so neither side's start belongs to a unit
    workers = args.call_workers if args.call_workers is not None else threads
    with FitPool(workers) as fit_pool:
        fit_pool.wait_ready()
        if workers > 1:
            shard_kw["fit_pool"] = fit_pool
        timed = cb.time_sides(args.repeats, lambda: run_cell_shard(sub, features, manifests, sections, **shard_kw),
                              shard, cb.run_groups(sub), sk_tol, processes=args.processes,
                              engine_pids=fit_pool.worker_pids if workers > 1 else ())
    summary = cb.summarise(timed["times"], len(sub))
    engine_out, sk_out = timed["results"]["engine"], timed["results"]["sklearn"]
    workers = int(engine_out.attrs.get("engine_workers", 1))
    summary.update(engine_workers=workers)
    if workers > 1:  # its calls ran single-threaded: their accuracy at that tol, as they ran
        summary.update(engine_err_workers=cb.engine_error(calls, engine_tol, 1))
        print(f"engine calls side by side on {workers} cores ({workers - 1} worker process(es) and the shard's), each "
              f"single-threaded; at tol {engine_tol:g} on one thread: "
              f"max |dP| {summary['engine_err_workers']:.2e}")
    f1_sk = np.array([sk_out[i][0] for i in range(len(sub))])
    C_sk = np.array([sk_out[i][1] for i in range(len(sub))])
    gaps = np.abs(f1_sk - engine_out["macro_f1"].to_numpy())
    summary.update(units=units, runs=len(sub), engine_tol=engine_tol, sklearn_tol=sk_tol, engine_err=engine_err,
                   sklearn_err=sk_err, max_f1_gap=float(gaps.max()), same_C=float((C_sk == engine_out["C"]).mean()))
    if args.ceiling:
        best = summary["medians"][summary["strongest"]]["wall"]
        summary["ceiling"] = cb.ceiling(calls, engine_tol, threads, best)
        summary["floor"] = cb.loop_floor(calls, engine_tol, threads, best)
    return summary


def print_baseline(b: dict, args) -> None:
    from bench_probe_engine import equal_accuracy  # a sibling script (benchmarks/ is this script's path)

    for name, m in b["medians"].items():
        print(f"{name:>22}: {b['runs_per_s'][name]:7.2f} runs/s (median {m['wall']:.1f} s wall, {m['cpu']:.1f} s CPU "
              f"of {args.repeats})")
    print(f"strongest baseline: {b['strongest']}; |macro-F1 gap| max {b['max_f1_gap']:.4f}, same C chosen in "
          f"{100 * b['same_C']:.0f}% of runs")
    print(f"RATIO engine vs strongest baseline: {b['ratio_wall']:.2f}x wall ({b['ratio_cpu']:.2f}x CPU seconds), "
          f"{args.protocol} shard, D={args.dim}, {equal_accuracy(b['engine_err'], b['sklearn_err'], args.target)} "
          f"(engine tol {b['engine_tol']:g}: "
          f"{b['engine_err']:.1e}; scikit-learn tol {b['sklearn_tol']:g}: {b['sklearn_err']:.1e}); load average "
          f"{os.getloadavg()}")
    if "ceiling" in b:
        c = b["ceiling"]
        print(f"ceiling: the engine's own iterations at tol {b['engine_tol']:g} are {c['gflop']:.1f} GFLOP of "
              "products; "
              f"at this machine's float32 product speed on {args.threads} thread(s) they take >= "
              f"{c['seconds']['narrow']:.2f} s one problem wide, >= {c['seconds']['wide']:.2f} s a subset's C values "
              f"wide: a ratio of at most {c['ratio']['narrow']:.1f}x / {c['ratio']['wide']:.1f}x against the strongest "
              f"baseline's whole run (products alone, nothing else of the shard)")
    if "floor" in b:
        f = b["floor"]
        cpu, ratio = f["cpu"], f["ratio"]
        print(f"floor of this design: a lean lock-step L-BFGS at the engine's own {f['iterations']:,} "
              "problem-iterations (one evaluation each, the engine's layout, forms and float64 state) takes "
              f"{cpu['products']:.2f} s CPU in its products, {cpu['products + one-off']:.2f} s with the forms' "
              f"one-off work, {cpu['lean loop + one-off']:.2f} s with the rest of the loop: on {args.threads} "
              f"thread(s) a ratio of at most {ratio['products']:.1f}x / {ratio['products + one-off']:.1f}x / "
              f"{ratio['lean loop + one-off']:.1f}x against the strongest baseline")
    if torch.cuda.is_available() and str(args.device).startswith("cuda"):
        print(f"peak GPU memory (this process): {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    runs = preset_runs_per_encoder()
    rate = b["runs_per_s"]["engine"]
    total = sum(runs.values())
    own = runs[args.protocol]
    print(f"projection (CellPath preset, one encoder of width {args.dim}, 3 magnifications, {args.threads} cores): "
          f"{args.protocol} {own:,} runs -> {own / rate * args.threads / 3600:.2f} CPU-hours at the engine's "
          f"{rate:.2f} runs/s ({own / b['runs_per_s'][b['strongest']] * args.threads / 3600:.2f} with "
          f"{b['strongest']}); all {total:,} runs of the four protocols at this rate -> "
          f"{total / rate * args.threads / 3600:.2f} CPU-hours")


def preset_runs_per_encoder() -> dict:
    """Runs per protocol of one encoder (all magnifications) in the CellPath preset's grid."""
    from fmaudit import grid

    cfg = preset_cells()
    cfg["encoders"] = cfg["encoders"][:1]
    runs = grid.cell_runs(cfg)
    return runs["protocol"].value_counts().to_dict()


def bytes_per_cell(args) -> pd.DataFrame:
    """Per-cell bytes on disk (format) for three widths, and measured on a demo-encoder folder."""
    from fmaudit.cells.features import extract_cell_features, open_cell_features

    rows = []
    index_bytes = None
    tmp = Path(tempfile.mkdtemp(prefix="cellbytes."))
    try:
        slide = REPO / "resources" / "data" / "CMU-1-Small-Region.svs"
        mpp, w, h = 0.499, 2220, 2967
        spacing = 1000.0 / np.sqrt(args.demo_density) / mpp  # px between neighbouring cells
        rng = np.random.default_rng(0)
        gx, gy = np.meshgrid(np.arange(spacing / 2, w - 1, spacing), np.arange(spacing / 2, h - 1, spacing))
        xs = np.clip(gx.ravel() + rng.uniform(-spacing / 3, spacing / 3, gx.size), 0, w - 1)
        ys = np.clip(gy.ravel() + rng.uniform(-spacing / 3, spacing / 3, gy.size), 0, h - 1)
        n = xs.size
        manifest = pd.DataFrame({
            "item_id": [f"cmu-1/aaabbbcc-{i}" for i in range(n)], "cell_id": [f"aaabbbcc-{i}" for i in range(n)],
            "section": "cmu-1", "organ": "skin", "slide": str(slide), "mpp": mpp, "he_x": xs, "he_y": ys,
            "centre_source": "simulated", "label_fine": pd.array(rng.integers(0, 9, n), dtype="Int64"),
            "label_coarse": pd.array(rng.integers(0, 3, n), dtype="Int64"), "label_fine_name": "t",
            "label_coarse_name": "g"})
        out = tmp / "demo"
        meta = extract_cell_features(manifest, "demo-vit-tiny", 20, out, device="cpu", batch_size=64)
        files = {p.name: p.stat().st_size for p in out.iterdir()}
        feats = open_cell_features(out)
        cpp_demo = n / meta["n_patches"]
        index_bytes = (files["cells.parquet"] + files["patches.parquet"] + files["meta.json"]) / n
        measured_total = sum(files.values()) / n
        d = feats.embed_dim
        rows.append({"encoder": f"demo-vit-tiny (D={d}), measured", "D": d, "cells_per_patch": round(cpp_demo, 2),
                     "nuc_B": files["nuc.npy"] / n, "mean_B": files["patch_mean.npy"] / n,
                     "cls_B": files["patch_cls.npy"] / n, "index_B": index_bytes, "total_B": measured_total,
                     "seven_float32_copies_B": 4 * 9 * d})
        for name, d in (("ViT-S/16", 384), ("ViT-L", 1024), ("ViT-H", 1536)):
            for mag in (40, 20, 10):
                # cells per occupied patch of 224 px at this magnification and the assumed density
                cpp = max(1.0, args.demo_density * (224 * 10.0 / mag / 1000.0) ** 2)
                nuc, mean, cls = 2 * d, 2 * d / cpp, 2 * d / cpp
                rows.append({"encoder": f"{name} (D={d}) {mag}x, format", "D": d, "cells_per_patch": round(cpp, 2),
                             "nuc_B": nuc, "mean_B": mean, "cls_B": cls, "index_B": index_bytes,
                             "total_B": nuc + mean + cls + index_bytes, "seven_float32_copies_B": 4 * 9 * d})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    table = pd.DataFrame(rows)
    table["readouts_stored_per_cell"] = "nuc per cell; mean, cls per patch; 4 fusions on read"
    return table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="all", choices=["all", "shard", "bytes", "baseline", "simulate"])
    parser.add_argument("--protocol", default="LOOO", choices=["IS", "IOCD", "MOCV", "LOOO"])
    parser.add_argument("--cells-per-section", type=int, default=20000)
    parser.add_argument("--cells-per-patch", type=int, default=25)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--max-train-cells", type=int, default=10000, help="cap per run (0 = no cap)")
    parser.add_argument("--max-val-cells", type=int, default=2500, help="cap per run (0 = no cap)")
    parser.add_argument("--units", type=int, default=0,
                        help="run only the shard's first n units (all their runs); 0 = the whole shard")
    parser.add_argument("--baseline-units", type=int, default=1)
    parser.add_argument("--baseline-seeds", type=int, default=0, help="only the first n seeds (0 = all)")
    parser.add_argument("--target", type=float, default=1e-3, help="max |delta P| both sides must reach")
    parser.add_argument("--engine-tol", type=float, help="skip the engine's tol search")
    parser.add_argument("--sklearn-tol", type=float, help="skip scikit-learn's tol search")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timing repeats (medians)")
    parser.add_argument("--threads", type=int, default=2, help="engine threads")
    parser.add_argument("--processes", type=int, default=2, help="scikit-learn's parallel baseline: worker processes")
    parser.add_argument("--call-workers", type=int, default=None,
                        help="cores the shard fits its engine calls on side by side, its worker processes "
                             "started before timing (default: --threads; 1: in-process)")
    parser.add_argument("--ceiling", action="store_true",
                        help="also print the bound any L-BFGS engine's ratio has here")
    parser.add_argument("--demo-density", type=float, default=2000.0, help="cells per mm² on the demo slide")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tol", type=float, default=1e-4, help="the shard's engine tol (the preset's default 1e-4)")
    parser.add_argument("--root", default=None, help="reuse a simulated panel folder")
    parser.add_argument("--keep", action="store_true", help="keep the simulated panel folder")
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="2,000 cells per section, caps 2,000/500")
    args = parser.parse_args(argv)
    # the allocator the pipeline's jobs run with (fmaudit.devices.job_threads), for this process and every
    # process started from it: the engine's workers and scikit-learn's alike
    from fmaudit.devices import hold_freed_memory

    hold_freed_memory(children=True)
    if args.quick:
        args.cells_per_section, args.max_train_cells, args.max_val_cells = 2000, 2000, 500
    if args.mode in ("shard", "simulate", "baseline") and args.root is None:
        parser.error(f"{args.mode} works on a panel folder: give --root DIR (`simulate --root DIR` writes one)")
    if args.mode == "shard":
        child_shard(args)
        return
    if args.mode == "bytes":
        print(bytes_per_cell(args).to_string(index=False))
        return
    if args.mode == "simulate":  # write a panel into --root for later runs (--root DIR without --keep)
        t0 = time.perf_counter()
        simulate_panel(Path(args.root), args.cells_per_section, args.cells_per_patch, args.dim)
        print(f"simulated 25 sections x {args.cells_per_section} cells in {time.perf_counter() - t0:.0f} s")
        return
    if args.mode == "baseline":  # on an existing --root
        print_baseline(baseline(args), args)
        return

    print(f"load average at start: {os.getloadavg()}")
    own_root = args.root is None
    root = Path(args.root or tempfile.mkdtemp(prefix="cellshard."))
    try:
        if own_root or not (root / "features").exists():
            t0 = time.perf_counter()
            simulate_panel(root, args.cells_per_section, args.cells_per_patch, args.dim)
            print(f"simulated 25 sections x {args.cells_per_section} cells (D={args.dim}, {args.cells_per_patch} "
                  f"cells/patch) in {time.perf_counter() - t0:.0f} s under {root}")
        disk = sum(p.stat().st_size for p in (root / "features").rglob("*") if p.is_file())
        n_cells = 25 * args.cells_per_section
        print(f"feature folders on disk: {disk / 2**20:.1f} MiB ({disk / n_cells:.0f} B/cell)")
        all_readouts = n_cells * args.dim * 4 * 9
        print(f"materialising all 7 readouts of all sections in float32 would take {all_readouts / 2**20:.0f} MiB")
        common = [sys.executable, __file__, "shard", "--root", str(root), "--protocol", args.protocol,
                  "--dim", str(args.dim), "--tol", str(args.tol), "--max-train-cells", str(args.max_train_cells),
                  "--max-val-cells", str(args.max_val_cells), "--device", args.device, "--units", str(args.units)]
        results = {}
        for label, extra in (("floor", ["--floor"]), ("shard", [])):
            proc = subprocess.run(common + extra, capture_output=True, text=True, check=False)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode or not line:
                print(proc.stdout[-2000:], proc.stderr[-4000:])
                raise SystemExit(f"{label} process failed")
            results[label] = json.loads(line[0][len("RESULT "):])
        s, f = results["shard"], results["floor"]
        scope = f"first {args.units} unit(s) of the " if args.units else ""
        if s["n_ok"] == 0:
            raise SystemExit(f"{args.protocol} shard: none of its {s['runs']} runs succeeded; no speed to report")
        print(f"\n{scope}{args.protocol} shard (1 encoder x 20x): {s['runs']} runs ({s['n_ok']} ok) "
              f"in {s['wall_s']:.0f} s "
              f"-> {s['runs'] / s['wall_s']:.2f} runs/s" + ("" if s["n_ok"] == s["runs"] else
                                                             " (runs that did not succeed count here too)"))
        print(f"peak RSS: shard process {s['peak_rss_mib']:.0f} MiB; floor (imports + manifests + memory maps) "
              f"{f['peak_rss_mib']:.0f} MiB; engine increment {s['peak_rss_mib'] - f['peak_rss_mib']:.0f} MiB")
        print(f"of which allocated (peak RssAnon): shard {s['peak_anon_mib']:.0f} MiB, floor {f['peak_anon_mib']:.0f} "
              f"MiB; mapped feature-file pages (peak RssFile, reclaimable page cache): shard "
              f"{s['peak_file_mib']:.0f} MiB")
        print(f"mean macro-F1 (fine): Nuc {s['macro_f1_nuc_fine']:.3f}, Mean {s['macro_f1_mean_fine']:.3f}")
        if args.baseline_units:
            args.root = str(root)
            print_baseline(baseline(args), args)
        print("\nbytes per cell on disk (float16):")
        print(bytes_per_cell(args).to_string(index=False))
        print(f"load average at end: {os.getloadavg()}")
    finally:
        if own_root and not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

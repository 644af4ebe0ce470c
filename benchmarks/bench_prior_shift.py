"""Benchmark: the batched prior-shift shard against a per-draw loop doing the same work, in the same process.

Workload (one job of the hema preset, ``prior_shift`` in resources/presets/hema.yaml): 5 classes, 1,024
features (a ViT-L embedding), a source pool of 3,000 and a target pool of 4,000 items (Gaussian classes, the
target shifted and rescaled per feature), the preset's six priors, 5 source seeds x 25 draws of 500 items =
750 runs, each evaluated with the preset's methods (none, global standardisation, CBR, SHOT-IM, BBSE, the
oracle) plus Saerens EM.

- engine: ``fmaudit.analyses.prior_shift.run_prior_shift_shard`` (one batched probe fit for all seeds, the
  target pool standardised once per seed, every method vectorised over the 25 draws of a prior).
- baseline: the straightforward loop over seeds, priors and draws: one probe fit per seed (same engine), then
  per draw the public functions of ``fmaudit.adapt.methods`` on that draw's raw features (global_standardize,
  cbr_standardize, oracle_standardize, bbse_weights / bbse_adjust, saerens_em, a ShotIMHead per draw) and the
  metrics of ``fmaudit.metrics`` (macro_f1, balanced_accuracy, ece without and with the source temperature,
  per-class recall) and the selection scores. Same draws, same dtypes (float64 features, SHOT-IM in float32),
  same threads.

It prints runs/s of each (median of --repeats), their ratio, and the largest difference between the two
tables' macro-F1 and ECE (SHOT-IM's float32 products are summed in another order when batched, so its
numbers may differ in the last float32 digits; every other method agrees to ~1e-12).

Measured on the shared 2-core AMD EPYC machine (load average 4-6 from other jobs), OMP_NUM_THREADS=1,
--repeats 3: engine 13.3 runs/s (56 s per job; repeats 38-77 s), baseline 4.0 runs/s (186 s); 3.3x, with
identical macro-F1 and ECE to 1e-12. SHOT-IM is about 60% of the engine's time (15 epochs of mini-batch SGD
over 25 x 500 x 1,024 features per prior). The hema preset's 45 jobs take about 45 CPU-minutes.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_prior_shift.py [--quick] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import pandas as pd

from fmaudit import grid, metrics
from fmaudit.adapt import methods as m
from fmaudit.adapt.evaluate import SHOT_IM_DEFAULTS
from fmaudit.adapt.priors import WBC5_CLASS_ORDER, WBC5_SCENARIOS, draw_seed, prior_vector, resample_target
from fmaudit.adapt.source_probe import fit_source_probes
from fmaudit.analyses.prior_shift import run_prior_shift_shard

METHODS = ["none", "global_standardization", "class_balanced_restandardization", "shot_im", "bbse", "saerens_em",
           "oracle_restandardization"]


def workload(n_source: int, n_target: int, dim: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    k = len(WBC5_CLASS_ORDER)
    means = rng.normal(scale=0.12, size=(k, dim))
    ys = rng.choice(k, size=n_source, p=[0.12, 0.3, 0.12, 0.14, 0.32])  # Acevedo-like source shares
    yt = rng.choice(k, size=n_target, p=[0.05, 0.1, 0.35, 0.1, 0.4])
    xs = (means[ys] + rng.normal(size=(n_source, dim))).astype(np.float32)
    scale, offset = np.exp(rng.normal(scale=0.2, size=dim)), rng.normal(scale=0.3, size=dim)
    xt = ((means[yt] + rng.normal(size=(n_target, dim))) * scale + offset).astype(np.float32)
    return xs, ys, xt, yt


def job_runs(seeds, priors, draws):
    cfg = {"encoders": ["enc"], "datasets": ["d"], "tasks": {"t": {"datasets": ["d"], "domains": ["src", "tgt"]}},
           "prior_shift": {"task": "t", "source_domains": ["src"], "target_domains": ["tgt"], "seeds": seeds,
                           "draws": draws, "sample_size": 500, "priors": priors}}
    return grid.prior_shift_runs(cfg)


def baseline(runs, xs, ys, xt, yt, priors, sample_size, methods):
    """The per-draw loop (module doc)."""
    names, k = list(WBC5_CLASS_ORDER), len(WBC5_CLASS_ORDER)
    rows = []
    for seed in dict.fromkeys(int(s) for s in runs["seed"]):
        probe = fit_source_probes(xs, ys, k, [seed])[0]
        val = probe.val_index_
        pred_val = probe.decision_logits(xs[val]).argmax(1)
        T = probe.temperature_
        seed_runs = runs[runs["seed"] == seed]
        for prior in dict.fromkeys(seed_runs["prior"].astype(str)):
            draws = sorted(int(d) for d in seed_runs.loc[seed_runs["prior"].astype(str) == prior, "draw"])
            shares = prior_vector(priors[prior], names)
            for d in draws:
                ds = draw_seed(seed, "tgt", prior, d)
                index = resample_target(yt, shares, sample_size, [ds]).index[0]
                x, y = xt[index].astype(np.float64), yt[index]
                L0 = probe.decision_logits(x)
                pseudo = L0.argmax(1)
                probs = {}
                for name in methods:
                    if name == "none":
                        L = L0
                    elif name == "global_standardization":
                        L = m.global_standardize(x) @ probe.W_ + probe.b_
                    elif name == "class_balanced_restandardization":
                        L = m.cbr_standardize(x, pseudo, probe.scale_, k)[0] @ probe.W_ + probe.b_
                    elif name == "oracle_restandardization":
                        L = m.oracle_standardize(x, y, probe.scale_, k)[0] @ probe.W_ + probe.b_
                    elif name == "shot_im":
                        z = probe.standardize(x).astype(np.float32)
                        head = m.ShotIMHead(**SHOT_IM_DEFAULTS).fit(z, probe.W_, probe.b_)
                        L = (z @ head.W_.astype(np.float32)).astype(np.float64) + head.b_
                    if name in ("bbse", "saerens_em"):
                        P, P_t = metrics.softmax(L0), metrics.softmax(L0, T)
                        if name == "bbse":
                            w = m.bbse_weights(ys[val], pred_val, pseudo, k)
                            probs[name] = (m.bbse_adjust(P, w), m.bbse_adjust(P_t, w))
                        else:
                            probs[name] = (m.saerens_em(P, probe.source_prior_)[1],
                                           m.saerens_em(P_t, probe.source_prior_)[1])
                    else:
                        probs[name] = (metrics.softmax(L), metrics.softmax(L, T))
                for name, (P, P_t) in probs.items():
                    cm = metrics.confusion_counts(y, P.argmax(1), k)
                    row = {"seed": seed, "prior": prior, "draw": d, "method": name,
                           "macro_f1": metrics.macro_f1(P, y), "balanced_accuracy": metrics.balanced_accuracy(P, y),
                           "ece_raw": metrics.ece(P, y), "ece_source_t": metrics.ece(P_t, y),
                           "marginal_entropy": m.marginal_entropy(P), "mean_entropy": m.mean_entropy(P),
                           "mean_max_prob": m.mean_max_probability(P)}
                    for c, cname in enumerate(names):
                        row[f"recall_{cname}"] = cm[c, c] / cm[c].sum() if cm[c].sum() else np.nan
                    rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 seed x 2 priors x 25 draws instead of 5 x 6 x 25")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--source", type=int, default=3000)
    ap.add_argument("--target", type=int, default=4000)
    ap.add_argument("--sample-size", type=int, default=500)
    ap.add_argument("--methods", type=lambda v: [x for x in v.split(",") if x], default=METHODS,
                    help="comma-separated methods (default all); e.g. without shot_im to see its share of the time")
    ap.add_argument("--engine-only", action="store_true", help="time the engine alone (no baseline, no comparison)")
    args = ap.parse_args()
    methods = list(args.methods)
    priors = {name: dict(s.shares) for name, s in WBC5_SCENARIOS.items()}
    seeds = [0] if args.quick else [0, 1, 2, 3, 4]
    if args.quick:
        priors = {p: priors[p] for p in ("balanced", "peripheral-blood")}
    runs = job_runs(seeds, priors, 25)
    xs, ys, xt, yt = workload(args.source, args.target, args.dim)
    print(f"workload: {len(runs)} runs x {len(methods)} methods; D={args.dim}, K=5, source {args.source}, "
          f"target pool {args.target}, {args.sample_size} items per draw; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}")
    times = {"engine": [], "baseline": []}
    engine_out = base_out = None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        engine_out = run_prior_shift_shard(runs, xs, ys, xt, yt, priors, WBC5_CLASS_ORDER, args.sample_size, methods)
        times["engine"].append(time.perf_counter() - t0)
        if args.engine_only:
            continue
        t0 = time.perf_counter()
        base_out = baseline(runs, xs, ys, xt, yt, priors, args.sample_size, methods)
        times["baseline"].append(time.perf_counter() - t0)
    if args.engine_only:
        med = statistics.median(times["engine"])
        print(f"engine    median {med:7.2f} s  ({len(runs) / med:7.1f} runs/s; repeats: "
              f"{', '.join(f'{t:.2f}' for t in times['engine'])})")
        return
    keys = ["seed", "prior", "draw", "method"]
    merged = engine_out.astype({"prior": str}).merge(base_out, on=keys, suffixes=("", "_base"))
    assert len(merged) == len(engine_out) == len(base_out), "the two tables cover different runs"
    for name in ("engine", "baseline"):
        med = statistics.median(times[name])
        print(f"{name:9s} median {med:7.2f} s  ({len(runs) / med:7.1f} runs/s; repeats: "
              f"{', '.join(f'{t:.2f}' for t in times[name])})")
    ratio = statistics.median(times["baseline"]) / statistics.median(times["engine"])
    print(f"speedup (baseline / engine, medians): {ratio:.2f}x")
    for col in ("macro_f1", "ece_raw", "ece_source_t", "marginal_entropy"):
        diff = (merged[col] - merged[f"{col}_base"]).abs()
        by = diff.groupby(merged["method"]).max()
        print(f"max |engine - baseline| {col}: " + ", ".join(f"{k}={v:.1e}" for k, v in by.items()))


if __name__ == "__main__":
    main()

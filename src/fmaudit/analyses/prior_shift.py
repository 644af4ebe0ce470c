"""The class-prior-shift shard: one job = (encoder, source domain, target domain) of the prior-shift grid.

``fmaudit.grid.prior_shift_runs`` enumerates the runs: encoder x source domain x source seed x target domain x
prior x draw (:data:`fmaudit.grid.JOB_KEYS` ``prior_shift``). A shard receives one job's runs and arrays:

- the source pool: every labelled item of the source domain the probe may learn from (its train and validation
  splits; the test split stays out). Each source seed draws its own group-disjoint train / hold-out split of
  it (``split_train_val(random_state=seed)``, the seed's "five source splits"), so seeds differ even where the
  data set has an official validation split.
- the target pool: the labelled items of the target domain that draws are resampled from (every split: the
  target is never trained on).

It fits one source probe per seed (all seeds in one batched logistic call), standardises the target pool once
per probe, and evaluates every method on the R draws of each prior at once (``fmaudit.adapt.evaluate``).
Result: one row per run x method, exactly the grid's runs, with the run's keys, the draw's recorded seed and
every metric of :func:`fmaudit.adapt.evaluate.scores_frame`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit import grid, metrics
from fmaudit.adapt.evaluate import check_methods, fit_source_probes, score_draws, scores_frame, standardize_pool
from fmaudit.adapt.priors import draw_seed, prior_vector, resample_target
from fmaudit.io import FmauditInputError
from fmaudit.probes.logistic_batch import check_features, check_labels

RUN_COLUMNS = ("task", "encoder", "source_domain", "target_domain", "seed", "prior", "draw")


def _check_runs(runs: pd.DataFrame) -> dict[str, Any]:
    missing = [c for c in RUN_COLUMNS if c not in runs.columns]
    if missing:
        raise FmauditInputError(f"prior-shift runs: column(s) {missing} missing (rows of fmaudit.grid.prior_shift_runs)")
    if runs.empty:
        raise FmauditInputError("prior-shift runs: no runs for this shard")
    keys = ["task", *grid.JOB_KEYS["prior_shift"]]
    job = runs[keys].astype(str).drop_duplicates()
    if len(job) != 1:
        raise FmauditInputError(f"prior-shift runs: one shard runs one ({', '.join(keys)}) job, got {len(job)}: "
                                f"{job.head(3).to_dict(orient='records')}")
    if runs.duplicated(["seed", "prior", "draw"]).any():
        raise FmauditInputError("prior-shift runs: a (seed, prior, draw) run is listed twice")
    return {k: str(job.iloc[0][k]) for k in keys}


def run_prior_shift_shard(runs: pd.DataFrame, source_features: Any, source_labels: Any, target_features: Any,
                          target_labels: Any, priors: Mapping[str, Mapping[str, float]], class_names: Sequence[str],
                          sample_size: int, methods: Sequence[str], source_groups: Any = None, C: float = 1.0,
                          val_fraction: float = 0.2, n_bins: int = metrics.DEFAULT_N_BINS,
                          shot_im: Mapping[str, Any] | None = None, device: Any = None) -> pd.DataFrame:
    """Every run of one prior-shift job (module doc), one row per run x method.

    ``runs``: the job's rows of :func:`fmaudit.grid.prior_shift_runs`; ``priors``: the config's
    ``prior_shift.priors`` (name -> class -> share); ``class_names``: the task's classes in label order;
    ``methods``: ``prior_shift.methods`` (``none`` is always evaluated: gains are against it).
    """
    job = _check_runs(runs)
    names = [str(c) for c in class_names]
    k = len(names)
    Xs = check_features(source_features, f"source {job['source_domain']} features")
    Xt = check_features(target_features, f"target {job['target_domain']} features")
    if Xs.shape[1] != Xt.shape[1]:
        raise FmauditInputError(f"source {job['source_domain']} features have {Xs.shape[1]} dimensions, "
                                f"target {job['target_domain']} features {Xt.shape[1]}")
    ys = check_labels(source_labels, Xs.shape[0], k, f"source {job['source_domain']} labels")
    yt = check_labels(target_labels, Xt.shape[0], k, f"target {job['target_domain']} labels")
    methods = check_methods(methods)
    unknown = sorted(set(runs["prior"].astype(str)) - set(priors))
    if unknown:
        raise FmauditInputError(f"prior-shift runs: prior(s) {unknown} are not in prior_shift.priors ({sorted(priors)})")
    shares = {p: prior_vector(priors[p], names, name=f"prior_shift.priors.{p}") for p in priors}

    seeds = list(dict.fromkeys(int(s) for s in runs["seed"]))
    probes = fit_source_probes(Xs, ys, k, seeds, groups=source_groups, C=C, val_fraction=val_fraction, device=device)
    frames = []
    for seed, probe in zip(seeds, probes):
        pool = standardize_pool(probe, Xt, yt)
        seed_runs = runs[runs["seed"].astype(int) == seed]
        for prior, prior_runs in seed_runs.groupby(seed_runs["prior"].astype(str), sort=False):
            draws = sorted(int(d) for d in prior_runs["draw"])
            draw_seeds = [draw_seed(seed, job["target_domain"], prior, d) for d in draws]
            sample = resample_target(yt, shares[prior], sample_size, draw_seeds, names,
                                     where=f"target {job['target_domain']} (prior {prior!r})")
            scores = score_draws(pool, sample.index, methods, n_bins, shot_im, device)
            replaced = ",".join(n for n, r in zip(names, sample.with_replacement) if r)
            frames.append(scores_frame(scores, names, n_bins, {
                **job, "seed": seed, "prior": prior, "draw": np.asarray(draws), "draw_seed": sample.seeds,
                "n_items": sample.sample_size, "classes_with_replacement": replaced,
                "n_source_train": probe.train_index_.size, "n_source_val": probe.val_index_.size,
                "n_target_pool": Xt.shape[0], "temperature_source": probe.temperature_,
                "temperature_source_at_bound": probe.temperature_at_bound_,
                "in_domain_macro_f1": probe.val_macro_f1_}))
    out = pd.concat(frames, ignore_index=True)
    return out

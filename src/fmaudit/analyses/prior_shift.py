"""The class-prior-shift shard: one job = (encoder, source domain, target domain) of the prior-shift grid.

``fmaudit.grid.prior_shift_runs`` enumerates the runs: encoder x source domain x source seed x target domain x
prior x draw (:data:`fmaudit.grid.JOB_KEYS` ``prior_shift``). A shard receives one job's runs and arrays:

- the source pool: every labelled item of the source domain the probe may learn from (its train and validation
  splits; the test split stays out). Each source seed draws its own group-disjoint train / hold-out split of
  it (``split_train_val(random_state=seed)``, the hema paper's "five source splits"), so seeds differ even where the
  data set has an official validation split.
- the target pool: the labelled items of the target domain that draws are resampled from (every split: the
  target is never trained on).

It fits one source probe per seed (all seeds in one batched logistic call), standardises the target pool once
per probe, and evaluates every method on the R draws of each prior at once (``fmaudit.adapt.evaluate``).
Result: one row per run x method, exactly the grid's runs, with the run's keys, the draw's recorded seed and
every metric of :func:`fmaudit.adapt.evaluate.scores_frame`. :func:`run_prior_shift_job` also returns the
*pool rows*: per source seed, the unadapted probe on the whole target pool (no resampling) beside its in-domain
(source hold-out) macro-F1, the frozen encoders' side of the hema paper's transfer table, which the ResNet-18
trained from scratch (:mod:`fmaudit.adapt.scratch`) joins as a reference row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit import grid, metrics
from fmaudit.adapt.evaluate import check_methods, score_draws, scores_frame, standardize_pool
from fmaudit.adapt.priors import draw_seed, prior_vector, resample_target
from fmaudit.adapt.source_probe import fit_source_probes
from fmaudit.io import FmauditInputError
from fmaudit.probes.logistic_batch import check_features, check_labels

RUN_COLUMNS = ("task", "encoder", "source_domain", "target_domain", "seed", "prior", "draw")


def _check_runs(runs: pd.DataFrame) -> dict[str, Any]:
    missing = [c for c in RUN_COLUMNS if c not in runs.columns]
    if missing:
        raise FmauditInputError(f"prior-shift runs: column(s) {missing} missing "
                                "(rows of fmaudit.grid.prior_shift_runs)")
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


@dataclass
class PriorShiftShard:
    """What one prior-shift job computes: ``rows`` (one per run x method) and ``pool`` (one per source seed:
    the unadapted probe on the whole target pool and on the source hold-out).

    Attributes
    ----------
    rows : DataFrame
        One row per run x method: :data:`RUN_COLUMNS`, ``draw_seed``, ``n_items``, ``classes_with_replacement``,
        ``n_source_train``, ``n_source_val``, ``n_target_pool``, ``temperature_source``,
        ``temperature_source_at_bound``, ``in_domain_macro_f1`` and the metrics of
        :func:`fmaudit.adapt.evaluate.scores_frame`.
    pool : DataFrame
        One row per source seed: the job's keys, ``prior`` (``target pool (as given)``), ``n_items``,
        ``n_source_train``, ``n_source_val``, ``temperature_source``, ``in_domain_macro_f1`` and the unadapted
        probe's metrics on the whole target pool (no gain or delta columns).
    """

    rows: pd.DataFrame
    pool: pd.DataFrame


def run_prior_shift_shard(runs: pd.DataFrame, source_features: Any, source_labels: Any, target_features: Any,
                          target_labels: Any, priors: Mapping[str, Mapping[str, float]], class_names: Sequence[str],
                          sample_size: int, methods: Sequence[str], source_groups: Any = None, C: float = 1.0,
                          val_fraction: float = 0.2, n_bins: int = metrics.DEFAULT_N_BINS,
                          shot_im: Mapping[str, Any] | None = None, device: Any = None) -> pd.DataFrame:
    """Every run of one prior-shift job (module doc), one row per run x method.

    ``runs``: the job's rows of :func:`fmaudit.grid.prior_shift_runs`; ``priors``: the config's
    ``prior_shift.priors`` (name -> class -> share); ``class_names``: the task's classes in label order;
    ``methods``: ``prior_shift.methods`` (``none`` is always evaluated: gains are against it).

    Parameters
    ----------
    runs, source_features, source_labels, target_features, target_labels, priors, class_names, sample_size
        As :func:`run_prior_shift_job` takes them.
    methods, source_groups, C, val_fraction, n_bins, shot_im, device
        As :func:`run_prior_shift_job` takes them.

    Returns
    -------
    DataFrame
        :attr:`PriorShiftShard.rows`.

    Raises
    ------
    FmauditInputError
        As :func:`run_prior_shift_job`.
    """
    return run_prior_shift_job(runs, source_features, source_labels, target_features, target_labels, priors,
                               class_names, sample_size, methods, source_groups=source_groups, C=C,
                               val_fraction=val_fraction, n_bins=n_bins, shot_im=shot_im, device=device).rows


def run_prior_shift_job(runs: pd.DataFrame, source_features: Any, source_labels: Any, target_features: Any,
                        target_labels: Any, priors: Mapping[str, Mapping[str, float]], class_names: Sequence[str],
                        sample_size: int, methods: Sequence[str], source_groups: Any = None, C: float = 1.0,
                        val_fraction: float = 0.2, n_bins: int = metrics.DEFAULT_N_BINS,
                        shot_im: Mapping[str, Any] | None = None, device: Any = None) -> PriorShiftShard:
    """:func:`run_prior_shift_shard`'s rows and the job's pool rows (:class:`PriorShiftShard`), from one fit of
    the source probes.

    Parameters
    ----------
    runs : DataFrame
        The job's rows of :func:`fmaudit.grid.prior_shift_runs` (:data:`RUN_COLUMNS`): one task, encoder, source
        and target domain; each (seed, prior, draw) once.
    source_features : array-like of shape (n_source, n_features)
        The source pool: every labelled item of the source domain's train and validation splits.
    source_labels : array-like of shape (n_source,)
        Their class indices 0..K-1.
    target_features : array-like of shape (n_target, n_features)
        The target pool the draws are resampled from (every split of the target domain).
    target_labels : array-like of shape (n_target,)
        Their class indices 0..K-1.
    priors : mapping of str to mapping
        The config's ``prior_shift.priors``: prior name -> class name -> share; every prior of ``runs`` must be
        in it.
    class_names : sequence of str
        The task's classes in label order (K of them).
    sample_size : int
        Items per target draw (``prior_shift.sample_size``).
    methods : sequence of str
        The adaptation methods to evaluate (``prior_shift.methods``); ``none`` is added.
    source_groups : array-like of shape (n_source,) or None
        Patients/slides of the source items, kept on one side of each seed's train / hold-out split; None: the
        items are their own groups.
    C : float
        Inverse L2 strength of the source probes (``prior_shift.C``); default 1.0.
    val_fraction : float
        Share of the source pool's groups each seed holds out (``prior_shift.val_fraction``); default 0.2.
    n_bins : int
        Equal-width bins of the top-label ECE (``calibration.ece_bins``).
    shot_im : mapping or None
        SHOT-IM's settings (``prior_shift.shot_im``); None: its defaults.
    device : str, torch.device or None
        Where the batched fits run (``auto``: a GPU when there is one); None: the CPU.

    Returns
    -------
    PriorShiftShard
        The run x method rows and the pool rows.

    Raises
    ------
    FmauditInputError
        Runs missing columns, empty, of several jobs or listing a run twice; features that are not finite 2-D
        arrays or whose dimensions differ; labels out of range or of the wrong length; an unknown method or a
        prior not in ``priors``.
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
        raise FmauditInputError(f"prior-shift runs: prior(s) {unknown} are not in prior_shift.priors "
                                f"({sorted(priors)})")
    shares = {p: prior_vector(priors[p], names, name=f"prior_shift.priors.{p}") for p in priors}

    seeds = list(dict.fromkeys(int(s) for s in runs["seed"]))
    probes = fit_source_probes(Xs, ys, k, seeds, groups=source_groups, C=C, val_fraction=val_fraction, device=device)
    frames, pools = [], []
    whole = np.arange(Xt.shape[0])[None]
    for seed, probe in zip(seeds, probes):
        pool = standardize_pool(probe, Xt, yt)
        pools.append(scores_frame(score_draws(pool, whole, ["none"], n_bins), names, n_bins, {
            **job, "seed": seed, "prior": "target pool (as given)", "n_items": Xt.shape[0],
            "n_source_train": probe.train_index_.size, "n_source_val": probe.val_index_.size,
            "temperature_source": probe.temperature_, "in_domain_macro_f1": probe.val_macro_f1_}))
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
    pool_rows = pd.concat(pools, ignore_index=True)
    pool_rows = pool_rows.drop(columns=[c for c in pool_rows.columns if c.startswith(("gain_", "delta_"))])
    return PriorShiftShard(pd.concat(frames, ignore_index=True), pool_rows)

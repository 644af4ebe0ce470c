"""The tile-level probe suite: one shard = one (encoder, task); it loops over every run of the grid.

For each source domain, head, label fraction and seed, a probe is fitted on the source training split and
evaluated in-domain (source test split) and on every other domain of the task (its test split, or all of
its items when it has none), through the calibration ladder (raw, source-validation temperature, oracle
target temperature, K-shot target temperature). Logistic heads of one source domain are fitted together by
the batched engine. Rows carry cluster-bootstrap CIs for the headline metrics; predictions keep the raw
logits so that later rules can bootstrap anything.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np
import pandas as pd

from fmaudit.analyses.task_data import TaskData
from fmaudit.calibration import calibration_ladder
from fmaudit.io import FmauditInputError
from fmaudit.metrics import ece_convention, softmax
from fmaudit.probes import fit_logistic_batch, make_head, split_train_val, label_fraction_subsample
from fmaudit.stats import cluster_bootstrap_ci

log = logging.getLogger(__name__)

CI_METRICS = ("macro_f1", "ece")  # bootstrapped per row; names of fmaudit.stats kernels
CI_STAGES = ("raw", "source_ts")


def _source_splits(data: TaskData, source: str, seed: int, val_fraction: float, task: str) -> tuple[np.ndarray, np.ndarray]:
    train = data.domain_split(source, "train")
    val = data.domain_split(source, "val")
    if len(train) == 0:
        raise FmauditInputError(f"task {task}: source domain {source!r} has no training items (split 'train')")
    if len(val) == 0:  # no official validation split: hold out groups of the training split
        tr, va = split_train_val(data.labels[train], groups=data.groups[train], val_fraction=val_fraction,
                                 random_state=seed)
        train, val = train[tr], train[va]
    classes = np.unique(data.labels[train])
    if len(classes) < 2:
        raise FmauditInputError(
            f"task {task}: the training split of source domain {source!r} holds a single class "
            f"({data.class_names[classes[0]]!r}); a probe needs at least two"
        )
    return train, val


def _target_items(data: TaskData, source: str, target: str, task: str) -> np.ndarray:
    test = data.domain_split(target, "test")
    if len(test) == 0 and target != source:
        test = np.flatnonzero(data.domains == target)
    if len(test) == 0:
        raise FmauditInputError(f"task {task}: domain {target!r} has no test items to evaluate on")
    return test


def run_probe_suite(data: TaskData, runs: pd.DataFrame, probe_cfg: Mapping[str, Any],
                    calibration_cfg: Mapping[str, Any], bootstrap_cfg: Mapping[str, Any],
                    transfer: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every probe run of ``runs`` (rows of :func:`fmaudit.grid.probe_runs` for one encoder and task).

    Returns (metrics rows, predictions). Metric rows: one per run × target domain × ladder stage.
    Predictions: one per run × target item, with the raw logits and the source temperature.
    """
    if len(runs) == 0:
        return pd.DataFrame(), pd.DataFrame()
    task = str(runs["task"].iloc[0])
    encoder = str(runs["encoder"].iloc[0])
    n_bins = int(calibration_cfg["ece_bins"])
    domains = sorted(set(data.domains))
    metric_rows: list[dict] = []
    pred_parts: list[pd.DataFrame] = []
    for (source, head), head_runs in runs.groupby(["source_domain", "head"], sort=False):
        targets = [source] + ([d for d in domains if d != source] if transfer else [])
        target_idx = {t: _target_items(data, source, t, task) for t in targets}
        fitted = _fit_runs(data, head_runs, source, head, probe_cfg, task)
        for run, (train, val, model, r) in zip(head_runs.itertuples(index=False), fitted):
            val_logits = model(data.features[val], r)
            for target in targets:
                idx = target_idx[target]
                logits = model(data.features[idx], r)
                ladder = calibration_ladder(
                    val_logits, data.labels[val], logits, data.labels[idx],
                    ks=tuple(calibration_cfg["kshot_k"]), draws=int(calibration_cfg["kshot_draws"]),
                    random_state=int(run.seed), n_bins=n_bins,
                )
                t_source = float(ladder.loc[ladder["stage"] == "source_ts", "temperature"].iloc[0])
                ladder["confidence"] = confidence_flags(ladder)
                ladder = _add_cis(ladder, logits, data.labels[idx], data.groups[idx], t_source, bootstrap_cfg,
                                  seed=int(run.seed), n_bins=n_bins)
                ladder.insert(0, "run_id", run.run_id)
                meta = {
                    "encoder": encoder, "task": task, "source_domain": source, "target_domain": target,
                    "in_domain": target == source, "head": run.probe, "C": run.C, "fraction": run.fraction,
                    "seed": run.seed, "n_train": len(train), "n_val": len(val),
                    "label_budget": len(train) + len(val), "n_test": len(idx),
                    "n_test_groups": len(np.unique(data.groups[idx])),
                }
                for key, value in reversed(list(meta.items())):
                    ladder.insert(0, key, value)
                metric_rows.append(ladder)
                pred_parts.append(pd.DataFrame({
                    "encoder": encoder, "task": task, "run_id": run.run_id, "source_domain": source,
                    "target_domain": target, "head": run.probe, "fraction": run.fraction, "seed": run.seed,
                    "item_id": data.item_ids[idx], "group": data.groups[idx], "label": data.labels[idx],
                    "temperature_source": t_source,
                    "logits": list(np.asarray(logits, dtype=np.float32)),
                }))
    rows = pd.concat(metric_rows, ignore_index=True)
    rows["ece_convention"] = ece_convention(n_bins)
    rows["brier_convention"] = "sum over classes, range [0,2]"
    return rows, pd.concat(pred_parts, ignore_index=True)


def confidence_flags(ladder: pd.DataFrame, tolerance: float = 1e-3) -> np.ndarray:
    """What a fitted temperature says about the raw probe: T > 1 softens an overconfident probe, T < 1
    sharpens an underconfident one; the raw stage has no fitted temperature."""
    t = ladder["temperature"].to_numpy(dtype=float)
    flag = np.where(t > 1 + tolerance, "overconfident", np.where(t < 1 - tolerance, "underconfident", "calibrated"))
    return np.where(ladder["stage"].to_numpy() == "raw", "n/a", flag)


def _fit_runs(data: TaskData, head_runs: pd.DataFrame, source: str, head: str, probe_cfg: Mapping[str, Any],
              task: str) -> list[tuple[np.ndarray, np.ndarray, Any, int]]:
    """Fit the runs of one (source, head); returns (train idx, val idx, logits function, batch index) per run.

    Logistic runs are fitted together by the batched engine; the other heads one by one.
    """
    k = data.n_classes
    splits, subsets = [], []
    for run in head_runs.itertuples(index=False):
        train, val = _source_splits(data, source, int(run.seed), float(probe_cfg["val_fraction"]), task)
        sub = train[label_fraction_subsample(data.labels[train], float(run.fraction), random_state=int(run.seed))]
        splits.append((sub, val))
        subsets.append(sub)
    if head == "logistic":
        batch = fit_logistic_batch(data.features, data.labels, subsets, np.asarray(head_runs["C"], dtype=float),
                                   n_classes=k, standardize=bool(probe_cfg["standardize"]),
                                   device="auto")
        return [(sub, val, batch.decision_logits, r) for r, (sub, val) in enumerate(splits)]
    out = []
    for run, (sub, val) in zip(head_runs.itertuples(index=False), splits):
        params = {"C": run.C} if head == "linear_svm" and not pd.isna(run.C) else {}
        model = make_head(head, standardize=bool(probe_cfg["standardize"]), **params)
        if head == "logistic_cv":
            model.fit(data.features[sub], data.labels[sub], groups=data.groups[sub], n_classes=k)
        else:
            model.fit(data.features[sub], data.labels[sub], n_classes=k)
        out.append((sub, val, _ignore_batch_index(model.decision_logits), 0))
    return out


def _ignore_batch_index(decision_logits):
    """A single head's ``decision_logits(X)`` with the batched engine's ``(X, r)`` signature."""
    return lambda x, r: decision_logits(x)


def _add_cis(ladder: pd.DataFrame, logits: np.ndarray, labels: np.ndarray, groups: np.ndarray, t_source: float,
             bootstrap_cfg: Mapping[str, Any], seed: int, n_bins: int) -> pd.DataFrame:
    """Cluster-bootstrap CIs (resampling groups) of the headline metrics for the raw and source-TS stages."""
    ladder = ladder.copy()
    n_boot = int(bootstrap_cfg["n_boot"])
    boot_seed = int(bootstrap_cfg["seed"]) + seed
    for metric in CI_METRICS:
        ladder[f"{metric}_ci_lo"] = np.nan
        ladder[f"{metric}_ci_hi"] = np.nan
    for stage, temp in (("raw", 1.0), ("source_ts", t_source)):
        probs = softmax(logits, temperature=temp)
        at = ladder["stage"] == stage
        for metric in CI_METRICS:
            options = {"n_bins": n_bins} if metric == "ece" else {}  # the ECE of the row, at the row's bins
            ci = cluster_bootstrap_ci(metric, probs, labels, groups=groups, n_boot=n_boot, random_state=boot_seed,
                                      **options)
            ladder.loc[at, f"{metric}_ci_lo"] = ci["ci_lo"]
            ladder.loc[at, f"{metric}_ci_hi"] = ci["ci_hi"]
    ladder["ci_unit"] = "group (patient/slide) cluster bootstrap, 95% percentile"
    ladder["n_boot"] = n_boot
    return ladder

"""The tile-level probe suite: one shard = one (encoder, task); it loops over every run of the grid.

For each source domain, head, label fraction and seed, a probe is fitted on the source training split and
evaluated in-domain (source test split) and on every other domain of the task (its test split, or all of
its items when it has none), through the calibration ladder (raw, source-validation temperature, oracle
target temperature, K-shot target temperature). Logistic heads of one source domain are fitted together by
the batched engine. Rows carry cluster-bootstrap CIs for the headline metrics, each naming its resampling
unit and count (``ci_resampling``: ``unit=patient, n=43``; ``unit=item`` where the data identify no patient);
predictions keep the raw logits so that later rules can bootstrap anything.

Settings that change what a number means travel with every row: ``subsample`` (how the label fraction was
drawn: ``label_fraction`` or PRISM's ``prism`` draw), ``standardize``, ``calibration_mode`` (where the
source temperature's labels came from: the full validation split, as published; the validation split
subsampled by the fraction; or a share of the run's own label budget), ``task_split`` (the task's split;
``patch (leaky, as published)`` is flagged) and ``n_test_groups_in_source_train`` (evaluated groups that
the source's training or validation items share: nonzero means leakage).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch

from fmaudit.analyses.task_data import TaskData
from fmaudit.calibration import calibration_ladder
from fmaudit.io import FmauditInputError
from fmaudit.metrics import ece_convention, macro_f1, softmax
from fmaudit.probes import fit_logistic_batch, label_fraction_subsample, make_head, split_train_val
from fmaudit.probes.pool import shared_pool
from fmaudit.probes.subsample import prism_subsample
from fmaudit.stats import cluster_bootstrap_ci

log = logging.getLogger(__name__)

CI_METRICS = ("macro_f1", "ece")  # bootstrapped per row; names of fmaudit.stats kernels
CI_STAGES = ("raw", "source_ts")
#: ``calibration.validation_labels`` -> what the report says about the numbers of a run
CALIBRATION_MODES = {
    "full": "full validation split (published)",
    "proportional": "validation split x label fraction (proportional)",
    "budget": "budget: {share:g} of the fraction's labels",
}


def calibration_mode(calibration_cfg: Mapping[str, Any]) -> str:
    """Where the source temperature's labels come from, in words (the ``calibration_mode`` column).

    Parameters
    ----------
    calibration_cfg : mapping
        The task's filled ``calibration`` block: ``validation_labels`` (a key of :data:`CALIBRATION_MODES`)
        and ``budget_validation_share``.

    Returns
    -------
    str
        A value of :data:`CALIBRATION_MODES`, the budget's share filled in.

    Raises
    ------
    FmauditInputError
        ``validation_labels`` is not one of :data:`CALIBRATION_MODES`.
    """
    mode = str(calibration_cfg["validation_labels"])
    if mode not in CALIBRATION_MODES:
        raise FmauditInputError(f"calibration.validation_labels: {mode!r} is not one of {list(CALIBRATION_MODES)}")
    return CALIBRATION_MODES[mode].format(share=float(calibration_cfg["budget_validation_share"]))


def interval_resampling(unit: str, n_units: int) -> str:
    """``unit=patient, n=43``: how every interval of a row was resampled.

    Parameters
    ----------
    unit : str
        The resampling unit (:meth:`fmaudit.analyses.task_data.TaskData.group_unit`).
    n_units : int
        How many distinct units the interval resamples.

    Returns
    -------
    str
        ``"unit=<unit>, n=<n_units>"``.
    """
    return f"unit={unit}, n={int(n_units)}"


def draw_label_fraction(labels: np.ndarray, fraction: float, seed: int, method: str) -> np.ndarray:
    """Row indices of a label-fraction subset of ``labels``: ``label_fraction`` (nested, default_rng) or
    ``prism`` (PRISM's own draw; :func:`fmaudit.probes.subsample.prism_subsample`).

    Parameters
    ----------
    labels : ndarray of shape (n_items,)
        Class indices of the items to draw from.
    fraction : float
        Share of the labels to keep, in (0, 1] (docs/methods.md#label-fractions).
    seed : int
        The run's seed (``probe.seeds``).
    method : str
        ``label_fraction`` or ``prism`` (the schema's ``probe.subsample``).

    Returns
    -------
    ndarray of int
        Row indices into ``labels``.

    Raises
    ------
    FmauditInputError
        ``method`` is neither.
    """
    if method == "label_fraction":
        return label_fraction_subsample(labels, fraction, random_state=seed)
    if method == "prism":
        return prism_subsample(labels, fraction, seed)
    raise FmauditInputError(f"probe.subsample: {method!r} is not one of ['label_fraction', 'prism']")


def _source_splits(data: TaskData, source: str, seed: int, val_fraction: float,
                   task: str) -> tuple[np.ndarray, np.ndarray]:
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

    ``probe_cfg``, ``calibration_cfg`` and ``bootstrap_cfg`` are the task's filled config blocks. Returns
    (metrics rows, predictions). Metric rows: one per run × target domain × ladder stage. Predictions: one per
    run × target item, with the raw logits and the source temperature.

    Parameters
    ----------
    data : TaskData
        The task's items and features (:func:`fmaudit.analyses.task_data.assemble_task_data`).
    runs : DataFrame
        The encoder's and task's probe runs (:func:`fmaudit.grid.probe_runs`): ``run_id``, ``task``,
        ``encoder``, ``source_domain``, ``head`` (its kind: ``logistic``, ``linear_svm`` ...), ``probe`` (its
        label, ``<head>_C<C>`` where a head runs at several C; the output's ``head`` column), ``C``,
        ``fraction``, ``seed``. Empty: two empty frames.
    probe_cfg : mapping
        The filled ``probe`` block: ``subsample``, ``standardize``, ``val_fraction`` (share of source training
        groups held out when the source has no validation split).
    calibration_cfg : mapping
        The filled ``calibration`` block: ``ece_bins``, ``kshot_k``, ``kshot_draws``,
        ``include_bound_temperatures``, ``prism_ece``, ``validation_labels``, ``budget_validation_share``.
    bootstrap_cfg : mapping
        The filled ``bootstrap`` block: ``n_boot`` and ``seed`` (the row intervals' seed is ``seed`` plus the
        run's seed).
    transfer : bool
        Evaluate on every other domain of the task too; False: in-domain only.

    Returns
    -------
    rows : DataFrame
        One row per run, target domain and ladder stage (:func:`fmaudit.calibration.calibration_ladder`'s
        columns), led by ``encoder``, ``task``, ``source_domain``, ``target_domain``, ``in_domain``, ``head``,
        ``C``, ``fraction``, ``seed``, the item and group counts, the run's settings (``subsample``,
        ``standardize``, ``calibration_mode``, ``task_split``, ``datasets``), ``n_test_groups_in_source_train``,
        ``source_train_macro_f1``, ``source_val_macro_f1`` and ``run_id``; then ``confidence``, the intervals
        ``macro_f1_ci_lo``/``_ci_hi`` and ``ece_ci_lo``/``_ci_hi`` (raw and source_ts stages), ``ci_unit``,
        ``ci_n_units``, ``ci_resampling``, ``ci_convention``, ``n_boot``, ``ece_convention`` and
        ``brier_convention``.
    preds : DataFrame
        One row per run and target item: ``encoder``, ``task``, ``run_id``, ``source_domain``,
        ``target_domain``, ``head``, ``fraction``, ``seed``, ``item_id``, ``group``, ``label``, ``group_unit``,
        ``temperature_source`` and ``logits`` (float32 array of K).

    Raises
    ------
    FmauditInputError
        A source domain without training items or with one class, a domain without items to evaluate, or a
        setting that is not one of its choices.
    """
    if len(runs) == 0:
        return pd.DataFrame(), pd.DataFrame()
    task = str(runs["task"].iloc[0])
    encoder = str(runs["encoder"].iloc[0])
    n_bins = int(calibration_cfg["ece_bins"])
    mode = calibration_mode(calibration_cfg)
    domains = sorted(set(data.domains))
    metric_rows: list[dict] = []
    pred_parts: list[pd.DataFrame] = []
    for (source, head), head_runs in runs.groupby(["source_domain", "head"], sort=False):
        targets = [source] + ([d for d in domains if d != source] if transfer else [])
        target_idx = {t: _target_items(data, source, t, task) for t in targets}
        seen_groups = set(data.groups[(data.domains == source) & np.isin(data.splits, ("train", "val"))])
        leaked = {t: len(set(data.groups[idx]) & seen_groups) for t, idx in target_idx.items()}
        fitted = _fit_runs(data, head_runs, source, head, probe_cfg, calibration_cfg, task)
        for run, (train, val, model, r) in zip(head_runs.itertuples(index=False), fitted):
            # a label budget can leave no validation item: no logits to fit a temperature on
            val_logits = model(data.features[val], r) if len(val) else np.empty((0, data.n_classes))
            train_f1 = macro_f1(softmax(model(data.features[train], r)), data.labels[train])
            val_f1 = macro_f1(softmax(val_logits), data.labels[val]) if len(val) else np.nan
            for target in targets:
                idx = target_idx[target]
                logits = model(data.features[idx], r)
                ladder = calibration_ladder(
                    val_logits, data.labels[val], logits, data.labels[idx],
                    ks=tuple(calibration_cfg["kshot_k"]), draws=int(calibration_cfg["kshot_draws"]),
                    random_state=int(run.seed), n_bins=n_bins,
                    include_bound_temperatures=bool(calibration_cfg["include_bound_temperatures"]),
                    prism_ece=bool(calibration_cfg["prism_ece"]),
                )
                t_source = float(ladder.loc[ladder["stage"] == "source_ts", "temperature"].iloc[0])
                ladder["confidence"] = confidence_flags(ladder)
                unit = data.group_unit(idx)
                ladder = _add_cis(ladder, logits, data.labels[idx], data.groups[idx], t_source, bootstrap_cfg,
                                  seed=int(run.seed), n_bins=n_bins, unit=unit)
                ladder.insert(0, "run_id", run.run_id)
                meta = {
                    "encoder": encoder, "task": task, "source_domain": source, "target_domain": target,
                    "in_domain": target == source, "head": run.probe, "C": run.C, "fraction": run.fraction,
                    "seed": run.seed, "n_train": len(train), "n_val": len(val),
                    "label_budget": len(train) + len(val), "n_test": len(idx),
                    "n_test_groups": len(np.unique(data.groups[idx])), "group_unit": unit,
                    "subsample": str(probe_cfg["subsample"]), "standardize": bool(probe_cfg["standardize"]),
                    "calibration_mode": mode, "task_split": data.split_name, "datasets": data.dataset_names(),
                    "n_test_groups_in_source_train": leaked[target],
                    "source_train_macro_f1": train_f1, "source_val_macro_f1": val_f1,
                }
                for key, value in reversed(list(meta.items())):
                    ladder.insert(0, key, value)
                metric_rows.append(ladder)
                pred_parts.append(pd.DataFrame({
                    "encoder": encoder, "task": task, "run_id": run.run_id, "source_domain": source,
                    "target_domain": target, "head": run.probe, "fraction": run.fraction, "seed": run.seed,
                    "item_id": data.item_ids[idx], "group": data.groups[idx], "label": data.labels[idx],
                    "group_unit": unit, "temperature_source": t_source,
                    "logits": list(np.asarray(logits, dtype=np.float32)),
                }))
    rows = pd.concat(metric_rows, ignore_index=True)
    rows["ece_convention"] = ece_convention(n_bins)
    rows["brier_convention"] = "sum over classes, range [0,2]"
    return rows, pd.concat(pred_parts, ignore_index=True)


def confidence_flags(ladder: pd.DataFrame, tolerance: float = 1e-3) -> np.ndarray:
    """What a fitted temperature says about the raw probe: T > 1 softens an overconfident probe, T < 1
    sharpens an underconfident one; the raw stage (and a temperature that could not be fitted) says n/a.

    Parameters
    ----------
    ladder : DataFrame
        A calibration ladder: ``stage`` and ``temperature``.
    tolerance : float
        How far from 1 a temperature must be to count as over- or underconfident; default 1e-3.

    Returns
    -------
    ndarray of str, shape (n_rows,)
        ``overconfident``, ``underconfident``, ``calibrated`` or ``n/a`` per row.
    """
    t = ladder["temperature"].to_numpy(dtype=float)
    flag = np.where(t > 1 + tolerance, "overconfident", np.where(t < 1 - tolerance, "underconfident", "calibrated"))
    return np.where((ladder["stage"].to_numpy() == "raw") | ~np.isfinite(t), "n/a", flag)


def _validation_items(data: TaskData, sub: np.ndarray, val: np.ndarray, fraction: float, seed: int,
                      probe_cfg: Mapping[str, Any],
                      calibration_cfg: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(items the probe fits on, items its source temperature is fitted on) under ``validation_labels``.

    full: the label-fraction subset and the whole validation split. proportional: the validation split
    subsampled by the fraction, drawn like the training subset. budget: the subset split per class into
    probe and validation items, ``budget_validation_share`` to validation (group-disjoint when the items'
    groups are not the items themselves and that still leaves the probe every class; else per class, at least
    one item of each staying with the probe), so that both come out of the fraction's labels.
    """
    mode = str(calibration_cfg["validation_labels"])
    if mode == "full":
        return sub, val
    if mode == "proportional":
        if len(val) == 0:
            return sub, val
        return sub, val[draw_label_fraction(data.labels[val], fraction, seed, str(probe_cfg["subsample"]))]
    if mode == "budget":
        share = float(calibration_cfg["budget_validation_share"])
        labels, groups = data.labels[sub], data.groups[sub]
        n_groups = len(np.unique(groups))
        if 2 <= n_groups < len(sub):  # real groups (item-level groups make the stratified split the grouped one)
            tr, va = split_train_val(labels, groups=groups, val_fraction=share, random_state=seed)
            if np.setdiff1d(labels, labels[tr]).size == 0:
                return sub[tr], sub[va]
            # no group-disjoint carve leaves the probe every class of its budget (a few items per class):
            # carve items per class instead, keeping at least one of each with the probe
        tr, va = split_train_val(labels, groups=None, val_fraction=share, random_state=seed)
        return sub[tr], sub[va]
    calibration_mode(calibration_cfg)  # raises, naming the setting
    raise AssertionError("unreachable")


def _fit_runs(data: TaskData, head_runs: pd.DataFrame, source: str, head: str, probe_cfg: Mapping[str, Any],
              calibration_cfg: Mapping[str, Any], task: str) -> list[tuple[np.ndarray, np.ndarray, Any, int]]:
    """Fit the runs of one (source, head); returns (train idx, val idx, logits function, batch index) per run.

    Logistic runs are fitted together by the batched engine; the other heads one by one.
    """
    k = data.n_classes
    method = str(probe_cfg["subsample"])
    splits, subsets = [], []
    for run in head_runs.itertuples(index=False):
        train, val = _source_splits(data, source, int(run.seed), float(probe_cfg["val_fraction"]), task)
        sub = train[draw_label_fraction(data.labels[train], float(run.fraction), int(run.seed), method)]
        sub, val = _validation_items(data, sub, val, float(run.fraction), int(run.seed), probe_cfg, calibration_cfg)
        splits.append((sub, val))
        subsets.append(sub)
    if head == "logistic":
        # on CPU with several threads (the job's), a large grid's problems are split over that many processes
        batch = fit_logistic_batch(data.features, data.labels, subsets, np.asarray(head_runs["C"], dtype=float),
                                   n_classes=k, standardize=bool(probe_cfg["standardize"]),
                                   device="auto", pool=shared_pool(torch.get_num_threads()))
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
             bootstrap_cfg: Mapping[str, Any], seed: int, n_bins: int, unit: str) -> pd.DataFrame:
    """Cluster-bootstrap CIs (resampling ``groups``, whose unit is ``unit``) of the headline metrics for the raw
    and source-TS stages."""
    ladder = ladder.copy()
    n_boot = int(bootstrap_cfg["n_boot"])
    boot_seed = int(bootstrap_cfg["seed"]) + seed
    for metric in CI_METRICS:
        ladder[f"{metric}_ci_lo"] = np.nan
        ladder[f"{metric}_ci_hi"] = np.nan
    for stage, temp in (("raw", 1.0), ("source_ts", t_source)):
        if not np.isfinite(temp):  # no source temperature (no validation labels in the budget): no interval
            continue
        probs = softmax(logits, temperature=temp)
        at = ladder["stage"] == stage
        for metric in CI_METRICS:
            options = {"n_bins": n_bins} if metric == "ece" else {}  # the ECE of the row, at the row's bins
            ci = cluster_bootstrap_ci(metric, probs, labels, groups=groups, n_boot=n_boot, random_state=boot_seed,
                                      **options)
            ladder.loc[at, f"{metric}_ci_lo"] = ci["ci_lo"]
            ladder.loc[at, f"{metric}_ci_hi"] = ci["ci_hi"]
    n_units = len(np.unique(groups))
    ladder["ci_unit"] = unit
    ladder["ci_n_units"] = n_units
    ladder["ci_resampling"] = interval_resampling(unit, n_units)
    ladder["ci_convention"] = f"95% percentile cluster bootstrap, {interval_resampling(unit, n_units)}, B={n_boot}"
    ladder["n_boot"] = n_boot
    return ladder

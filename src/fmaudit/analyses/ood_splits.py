"""The audit paper's further train/test splits of one (encoder, task): the probe metrics, slide aggregation, label
coarsening and the task without some classes, each over several fresh splits of the task's pooled items.

The audit paper stores one split (used by detection, the blur curve, scorer sensitivity and the gate) and draws five
further splits (seeds 0-4) "in the same way" for the other analyses: one test fraction held out, by patient or
slide where the task has them (every item of a group on one side), stratified like the stored split (PANDA: by
grade and data provider jointly; :func:`fmaudit.analyses.task_data.item_strata`), the first fold of a stratified
(group) k-fold with ``k = 1 / test_fraction`` shuffled by the split seed (:func:`draw_split`). Within each split
the test side is resampled ``n_boot`` times (patients or slides where the task has them, seeded ``bootstrap_seed +
split seed``); each metric is the mean over the splits and its 95% interval the percentiles of the draws pooled
over the splits (:func:`fmaudit.slide_aggregation.summarize_splits`). Probes, aggregators and CV folds of a split
are seeded by its seed.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.analyses.ood_suite import ProbeSettings
from fmaudit.analyses.task_data import TaskData
from fmaudit.grid.ood import SPLIT_TABLES
from fmaudit.io import FmauditInputError
from fmaudit.metrics import DEFAULT_N_BINS
from fmaudit.ood.gate import fit_validation_split
from fmaudit.ood.selective import DEFAULT_COVERAGES
from fmaudit.slide_aggregation import (
    ArmPredictions,
    label_coarsening_predictions,
    slide_aggregation_predictions,
    summarize_splits,
    without_classes_predictions,
)

log = logging.getLogger(__name__)


__all__ = ["SPLIT_TABLES", "draw_split", "run_extra_splits"]


def draw_split(labels: Any, groups: Any, strata: Any, test_fraction: float, seed: int) -> np.ndarray:
    """Boolean ``is_test`` of one further split of the pooled items: ``test_fraction`` of the items (of the
    groups, when ``groups`` are given; each group stratified by its most frequent stratum) held out, stratified
    by ``strata`` (the audit paper's ``split_indices``).

    Parameters
    ----------
    labels : array-like of shape (n_items,)
        The items' class indices.
    groups : array-like of shape (n_items,) or None
        Patients or slides kept on one side; None splits the items themselves.
    strata : array-like of shape (n_items,)
        Each item's stratum (str).
    test_fraction : float
        Share held out as test, in (0, 1); the split is the first fold of ``1 / test_fraction`` folds.
    seed : int
        The split's seed (shuffles the folds).

    Returns
    -------
    ndarray of bool, shape (n_items,)
        True for the test items.
    """
    y = np.asarray(labels)
    _, test = fit_validation_split(y, groups, float(test_fraction), int(seed), strata)
    is_test = np.zeros(y.size, dtype=bool)
    is_test[test] = True
    return is_test


def _grouped(data: TaskData) -> np.ndarray | None:
    """The task's groups where they identify patients or slides; None where every item is its own group."""
    groups = np.asarray(data.groups).astype(str)
    if data.group_unit(np.arange(groups.size)) == "item" or np.unique(groups).size == groups.size:
        return None
    return groups


def run_extra_splits(data: TaskData, *, seeds: Sequence[int], test_fraction: float = 0.2,
                     parts: Sequence[str] = ("probe_metrics",), strata: Any = None, probe: ProbeSettings | None = None,
                     ordinal: bool = False, coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int = 300,
                     bootstrap_seed: int = 0, n_bins: int = DEFAULT_N_BINS, slides: Mapping[str, Any] | None = None,
                     slide_ids: Any = None, coarsening: Mapping[str, Any] | None = None,
                     coarse_slide_ids: Any = None) -> dict[str, pd.DataFrame]:
    """Every part of ``parts`` (``probe_metrics``, ``slide_aggregation``, ``label_coarsening``,
    ``without_classes``) on each further split of ``seeds``, pooled (module doc).

    ``data``: the task's items (every split of the stored one is pooled); ``strata`` one per item (default the
    labels); ``probe``: the OOD shard's probe (the audit paper's by default). ``slides``: the ``ood.slides`` settings
    (``aggregators``, ``mil``, ``transformer``, ``slide_column``) with ``slide_ids`` per item; ``coarsening``:
    the ``ood.coarsening`` settings (``mil``, ``without``) with ``coarse_slide_ids`` per item. Returns the
    :data:`SPLIT_TABLES` (empty frames for parts not asked for): split_selective (``set`` test), split_slides (one
    row per aggregator and the tile level), split_coarsening (``control`` label_coarsening / without_classes),
    each row with ``n_splits``, ``split_seeds``, the metrics with ``_ci_lo`` / ``_ci_hi`` and ``_sd_over_splits``.

    Parameters
    ----------
    data : TaskData
        The task's items, every split of the stored one pooled.
    seeds : sequence of int
        The further splits' seeds (the audit paper's 0-4); at least one.
    test_fraction : float
        Share of the items (of the groups) held out per split; default 0.2.
    parts : sequence of str
        The analyses to run: ``probe_metrics``, ``slide_aggregation``, ``label_coarsening``,
        ``without_classes``.
    strata : array-like of shape (n_items,) or None
        Stratum of each item; None: the labels.
    probe : ProbeSettings or None
        The OOD shard's probe; None: the audit paper's (:class:`~fmaudit.analyses.ood_suite.ProbeSettings`).
    ordinal : bool
        The task's classes are ordered grades (QWK is added).
    coverages : sequence of float
        Coverages of the selective metrics.
    n_boot : int
        Bootstrap resamples of each split's test side; the OOD job passes the schema's ``bootstrap.n_boot``
        (the default here, 300, is not the schema's 1000).
    bootstrap_seed : int
        Seed of the resampling; split ``s`` uses ``bootstrap_seed + s``.
    n_bins : int
        Equal-width bins of the top-label ECE.
    slides : mapping or None
        The ``ood.slides`` settings (``aggregators``, ``mil``, ``transformer``, ``slide_column``); needed for
        ``slide_aggregation``.
    slide_ids : array-like of shape (n_items,) or None
        Each item's slide, for ``slide_aggregation``.
    coarsening : mapping or None
        The ``ood.coarsening`` settings (``mil``, ``without``: the classes removed); needed for
        ``label_coarsening`` and ``without_classes``.
    coarse_slide_ids : array-like of shape (n_items,) or None
        Each item's slide for the coarsening controls.

    Returns
    -------
    dict of str to DataFrame
        ``split_selective``, ``split_slides`` and ``split_coarsening`` (:data:`SPLIT_TABLES`), each non-empty
        table led by ``splits`` (``further``) and ending with ``test_fraction``.

    Raises
    ------
    FmauditInputError
        No seeds, an unknown part, a split whose training side holds one class, or a part without the
        settings or slide ids it needs.
    """
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise FmauditInputError("further splits: no seeds")
    unknown = sorted(set(parts) - {"probe_metrics", "slide_aggregation", "label_coarsening", "without_classes"})
    if unknown:
        raise FmauditInputError(f"further splits: unknown part(s) {unknown}")
    probe = probe or ProbeSettings()
    X = np.asarray(data.features, dtype=np.float64)
    y = np.asarray(data.labels)
    k = data.n_classes
    strata = y.astype(str) if strata is None else np.asarray(strata).astype(str)
    groups = _grouped(data)
    all_groups = np.asarray(data.groups).astype(str)
    unit = data.group_unit(np.arange(y.size))
    arms: dict[str, dict[int, list[ArmPredictions]]] = {name: {} for name in parts}
    for seed in seeds:
        test = draw_split(y, groups, strata, test_fraction, seed)
        train = ~test
        if np.unique(y[train]).size < 2:
            raise FmauditInputError(f"further split seed {seed}: the training side holds a single class")
        log.info("further split %d: %d train, %d test items", seed, int(train.sum()), int(test.sum()))
        if "probe_metrics" in parts:
            fitted = probe.fit(X[train], y[train], all_groups[train], k, seed)
            probs = fitted.predict_proba(X[test])
            C = float(getattr(fitted, "C_", probe.C if probe.C is not None else np.nan))
            arms["probe_metrics"][seed] = [ArmPredictions(
                {"set": "test"}, y[test], probs.argmax(axis=1), probs.max(axis=1), all_groups[test], unit, k,
                {"probe_C": C, "n_train": int(train.sum())})]
        if "slide_aggregation" in parts:
            if slides is None or slide_ids is None:
                raise FmauditInputError("further splits: slide aggregation needs the slides settings and slide ids")
            sid = np.asarray(slide_ids).astype(str)
            nested = slides.get("slide_column", "group") != "group"
            neural = {key: dict(slides[key]) for key in ("mil", "transformer") if key in slides}
            arms["slide_aggregation"][seed] = slide_aggregation_predictions(
                X[train], y[train], sid[train], X[test], y[test], sid[test], n_classes=k,
                groups_train=all_groups[train], slide_groups_test=all_groups[test] if nested else None,
                probe_C=probe.C, aggregators=slides["aggregators"], neural_params=neural, random_state=seed)
        if "label_coarsening" in parts or "without_classes" in parts:
            if coarsening is None or coarse_slide_ids is None:
                raise FmauditInputError("further splits: label coarsening needs the coarsening settings and slide ids")
        if "label_coarsening" in parts:
            neural = {key: dict(coarsening[key]) for key in ("mil",) if key in coarsening}
            arms["label_coarsening"][seed] = label_coarsening_predictions(
                X, y, np.asarray(coarse_slide_ids).astype(str), all_groups, test, n_classes=k, probe_C=probe.C,
                neural_params=neural, random_state=seed)
        if "without_classes" in parts:
            arms["without_classes"][seed] = [without_classes_predictions(
                X[train], y[train], all_groups[train], X[test], y[test], all_groups[test],
                class_names=data.class_names, removed=coarsening["without"], probe_C=probe.C, random_state=seed)]
    common = dict(ordinal=ordinal, coverages=coverages, n_boot=int(n_boot), bootstrap_seed=int(bootstrap_seed),
                  n_bins=int(n_bins))
    out = {name: pd.DataFrame() for name in SPLIT_TABLES}
    if "probe_metrics" in arms:
        out["split_selective"] = summarize_splits(arms["probe_metrics"], **common)
    if "slide_aggregation" in arms:
        out["split_slides"] = summarize_splits(arms["slide_aggregation"], **common)
    coarse = []
    if "label_coarsening" in arms:
        coarse.append(summarize_splits(arms["label_coarsening"], **common).assign(control="label_coarsening"))
    if "without_classes" in arms:
        coarse.append(summarize_splits(arms["without_classes"], **common).assign(control="without_classes"))
    if coarse:
        table = pd.concat(coarse, ignore_index=True)
        out["split_coarsening"] = table[["control"] + [c for c in table.columns if c != "control"]]
    for table in out.values():
        if len(table):
            table.insert(0, "splits", "further")
            table["test_fraction"] = float(test_fraction)
    return out

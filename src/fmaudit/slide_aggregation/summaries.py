"""The slide-label analyses' tables: each arm's selective-prediction summary on one split, several splits pooled
as the audit paper does, and the three table functions (see :mod:`fmaudit.slide_aggregation`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError
from fmaudit.metrics import DEFAULT_N_BINS
from fmaudit.ood.selective import DEFAULT_COVERAGES, pooled_summary, prediction_draws, prediction_summary
from fmaudit.slide_aggregation.predictions import (
    AGGREGATORS,
    ArmPredictions,
    label_coarsening_predictions,
    slide_aggregation_predictions,
    without_classes_predictions,
)


# --------------------------------------------------------------------------------------------------
# summaries: one split, or several pooled
# --------------------------------------------------------------------------------------------------
def summarize_predictions(arms: Sequence[ArmPredictions], *, ordinal: bool = True,
                          coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int, bootstrap_seed: int = 0,
                          n_bins: int = DEFAULT_N_BINS) -> pd.DataFrame:
    """One row per arm of one split: its key, the :func:`prediction_summary` metrics (intervals with
    ``n_boot > 0``) and its constant columns.

    Parameters
    ----------
    arms : sequence of ArmPredictions
        The arms of one split.
    ordinal : bool, default True
        Whether the classes are ordered grades (adds QWK).
    coverages : sequence of float, default DEFAULT_COVERAGES
        Coverages of the ``selective_accuracy_c<c>`` columns, in (0, 1].
    n_boot : int
        Bootstrap resamples per split for the intervals; 0 gives none (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    bootstrap_seed : int, default 0
        Seed of the bootstrap.
    n_bins : int, default 15
        Equal-width bins of the ECE.

    Returns
    -------
    DataFrame
        One row per arm, in order: the key columns, the summary (``n``, ``accuracy``, ... and with intervals
        ``<metric>_ci_lo``/``_ci_hi``, ``ci_unit``, ``ci_n_units``, ``n_boot``), then ``extra``.
    """
    rows = []
    for a in arms:
        summary = prediction_summary(a.labels, a.predictions, a.confidence, a.n_classes, ordinal=ordinal,
                                     coverages=coverages, n_bins=n_bins, groups=a.groups, n_boot=n_boot,
                                     random_state=bootstrap_seed, unit=a.unit)
        rows.append({**a.key, **summary, **a.extra})
    return pd.DataFrame(rows)


def summarize_splits(splits: Mapping[int, Sequence[ArmPredictions]], *, ordinal: bool = True,
                     coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int, bootstrap_seed: int = 0,
                     n_bins: int = DEFAULT_N_BINS, alpha: float = 0.05,
                     median_columns: Sequence[str] = ("probe_C", "slide_probe_C")) -> pd.DataFrame:
    """The audit paper's summary of the same arms over several train/test splits (``splits``: split seed -> the arms
    on that split): per arm, each metric's mean over the splits and its spread (``_sd_over_splits``), and with
    ``n_boot > 0`` the percentile interval of the bootstrap draws pooled over the splits (``n_boot`` resamples
    within each split, seeded ``bootstrap_seed + split seed``). Constant columns are averaged over the splits
    where numeric, the selected C's (``median_columns``) take their median, as the audit paper reports C;
    ``split_seeds`` lists the splits.

    Parameters
    ----------
    splits : Mapping of int to sequence of ArmPredictions
        Split seed to the arms on that split (the same arms, by key, on every split).
    ordinal : bool, default True
        Whether the classes are ordered grades (adds QWK).
    coverages : sequence of float, default DEFAULT_COVERAGES
        Coverages of the ``selective_accuracy_c<c>`` columns, in (0, 1].
    n_boot : int
        Bootstrap resamples per split for the intervals; 0 gives none (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    bootstrap_seed : int, default 0
        Seed of the bootstrap.
    n_bins : int, default 15
        Equal-width bins of the ECE.
    alpha : float, default 0.05
        1 - the intervals' coverage.
    median_columns : sequence of str, default ("probe_C", "slide_probe_C")
        Constant columns summarised by their median over the splits instead of the mean.

    Returns
    -------
    DataFrame
        One row per arm, in first-seen order: key columns, :func:`fmaudit.ood.selective.pooled_summary` (``n``,
        ``n_splits``, each metric's mean, ``<metric>_sd_over_splits``, the pooled intervals), the constant columns,
        ``split_seeds``.

    Raises
    ------
    FmauditInputError
        When ``splits`` is empty.
    """
    if not splits:
        raise FmauditInputError("summarize_splits: no splits")
    by_arm: dict[tuple, list[tuple[int, ArmPredictions]]] = {}
    for seed, arms in splits.items():
        for a in arms:
            by_arm.setdefault(tuple(sorted(a.key.items())), []).append((int(seed), a))
    rows = []
    for parts in by_arm.values():
        draws = [prediction_draws(a.labels, a.predictions, a.confidence, a.n_classes, ordinal=ordinal,
                                  coverages=coverages, n_bins=n_bins, groups=a.groups, n_boot=n_boot,
                                  random_state=int(bootstrap_seed) + seed, unit=a.unit) for seed, a in parts]
        row: dict[str, Any] = {**dict(parts[0][1].key), **pooled_summary(draws, alpha)}
        for name, value in parts[0][1].extra.items():
            values = [a.extra.get(name) for _, a in parts]
            numeric = all(isinstance(v, (int, float, np.integer, np.floating)) for v in values)
            if numeric:
                arr = np.asarray(values, dtype=np.float64)
                middle = np.nanmedian if name in median_columns else np.nanmean
                row[name] = float(middle(arr)) if np.isfinite(arr).any() else float("nan")
            else:
                row[name] = value
        row["split_seeds"] = ",".join(str(seed) for seed, _ in parts)
        rows.append(row)
    order = list(dict.fromkeys(k for arms in splits.values() for k in (tuple(sorted(a.key.items())) for a in arms)))
    return pd.DataFrame(rows).assign(_o=[order.index(k) for k in by_arm]).sort_values("_o").drop(columns="_o") \
        .reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# the tables of one split
# --------------------------------------------------------------------------------------------------
def slide_aggregation(X_train: Any, y_train: Any, slides_train: Any, X_test: Any, y_test: Any, slides_test: Any, *,
                      n_classes: int, ordinal: bool = True, groups_train: Any = None, slide_groups_test: Any = None,
                      probe_C: float | None = None, aggregators: Sequence[str] = AGGREGATORS,
                      neural_params: Mapping[str, Mapping[str, Any]] | None = None,
                      coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int, bootstrap_seed: int = 0,
                      random_state: int = 0, n_bins: int = DEFAULT_N_BINS) -> pd.DataFrame:
    """Slide-level grading from tile embeddings (the audit paper's ``slide_aggregation``) on one train/test split.

    Every tile of a slide carries the slide's label. ``groups_train`` (default: the training slides) keep the
    probe's CV folds group-disjoint; ``slide_groups_test`` (per test tile: its patient) makes the slide-level
    bootstrap resample patients instead of slides. ``neural_params``: ``{"mil": {...}, "transformer": {...}}``,
    the settings of the two neural aggregators. Returns one row per aggregator plus a ``tile_level`` row (the
    tile probe on the test tiles, unit tile, resampled by slide): aggregator, paper_name, level, the
    :func:`prediction_summary` metrics (with intervals when ``n_boot > 0``), n_train_slides, n_test_slides,
    probe_C (the tile probe's) and slide_probe_C (the pooled-embedding probes').

    Parameters
    ----------
    X_train : array-like of shape (n_train_tiles, D)
        Frozen tile embeddings of the training slides.
    y_train : array-like of shape (n_train_tiles,)
        Class index of each training tile (its slide's label: every tile of a slide carries it).
    slides_train : array-like of shape (n_train_tiles,)
        Slide id of each training tile.
    X_test : array-like of shape (n_test_tiles, D)
        Tile embeddings of the test slides.
    y_test : array-like of shape (n_test_tiles,)
        Class index of each test tile (its slide's label).
    slides_test : array-like of shape (n_test_tiles,)
        Slide id of each test tile; no slide may be on both sides.
    n_classes : int
        K, the number of classes (keyword-only).
    ordinal : bool, default True
        Whether the classes are ordered grades (adds QWK).
    groups_train : array-like of shape (n_train_tiles,), optional
        Group (patient) of each training tile for the probe's group-disjoint CV folds; default the slides.
    slide_groups_test : array-like of shape (n_test_tiles,), optional
        Patient of each test tile; the slide-level bootstrap then resamples patients instead of slides.
    probe_C : float, optional
        Inverse L2 strength of every logistic probe; None selects C by group-disjoint cross-validation
        (:class:`fmaudit.probes.LogisticCVProbe`).
    aggregators : sequence of str, default AGGREGATORS
        Which of :data:`AGGREGATORS` to run.
    neural_params : Mapping, optional
        ``{"mil": {...}, "transformer": {...}}``: constructor keywords of :class:`AttentionMILClassifier` and
        :class:`TransformerMILClassifier` (the config's settings).
    random_state : int, default 0
        Seed of the probes' CV folds and of the neural aggregators (unless their settings give one).
    coverages : sequence of float, default DEFAULT_COVERAGES
        Coverages of the ``selective_accuracy_c<c>`` columns, in (0, 1].
    n_boot : int
        Bootstrap resamples per split for the intervals; 0 gives none (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    bootstrap_seed : int, default 0
        Seed of the bootstrap.
    n_bins : int, default 15
        Equal-width bins of the ECE.

    Returns
    -------
    DataFrame

    Raises
    ------
    FmauditInputError
        As :func:`slide_aggregation_predictions`.
    """
    arms = slide_aggregation_predictions(X_train, y_train, slides_train, X_test, y_test, slides_test,
                                         n_classes=n_classes, groups_train=groups_train,
                                         slide_groups_test=slide_groups_test, probe_C=probe_C,
                                         aggregators=aggregators, neural_params=neural_params,
                                         random_state=random_state)
    return summarize_predictions(arms, ordinal=ordinal, coverages=coverages, n_boot=n_boot,
                                 bootstrap_seed=bootstrap_seed, n_bins=n_bins)


def label_coarsening(X: Any, labels: Any, slides: Any, groups: Any, is_test: Any, *, n_classes: int,
                     ordinal: bool = True, probe_C: float | None = None,
                     neural_params: Mapping[str, Mapping[str, Any]] | None = None,
                     coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int, bootstrap_seed: int = 0,
                     random_state: int = 0, n_bins: int = DEFAULT_N_BINS) -> pd.DataFrame:
    """The audit paper's SICAPv2 control: the probe under region-level tile labels and under labels coarsened to
    the slide (the most severe grade among all the slide's tiles, train and test together).

    Arms (rows): ``patch`` / patch_labels, ``slide`` / slide_labels, ``slide`` / patch_labels (the
    coarse-label probe scored against region labels), ``slide_mil`` / slide_labels (attention MIL on slide
    bags, ``neural_params["mil"]``). Columns: arm, evaluation, level, the metrics, relabelled_share (tiles
    whose label changed), probe_C. ``groups`` (patients) keep the CV folds and the bootstrap clustered.

    Parameters
    ----------
    X : array-like of shape (n_tiles, D)
        Tile embeddings, training and test tiles together.
    labels : array-like of shape (n_tiles,)
        Region-level class index (grade) of each tile; larger is more severe.
    slides : array-like of shape (n_tiles,)
        Slide id of each tile; no slide may be on both sides.
    groups : array-like of shape (n_tiles,)
        Patient of each tile (CV folds and bootstrap clusters).
    is_test : array-like of bool, shape (n_tiles,)
        True for the test tiles; both sides must be non-empty.
    n_classes : int
        K, the number of grades (keyword-only).
    probe_C : float, optional
        Inverse L2 strength of the probes; None selects it by group-disjoint cross-validation.
    neural_params : Mapping, optional
        ``{"mil": {...}}``: constructor keywords of the :class:`AttentionMILClassifier` arm.
    random_state : int, default 0
        Seed of the probes' CV folds and of the MIL model.
    ordinal : bool, default True
        Whether the classes are ordered grades (adds QWK).
    coverages : sequence of float, default DEFAULT_COVERAGES
        Coverages of the ``selective_accuracy_c<c>`` columns, in (0, 1].
    n_boot : int
        Bootstrap resamples per split for the intervals; 0 gives none (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    bootstrap_seed : int, default 0
        Seed of the bootstrap.
    n_bins : int, default 15
        Equal-width bins of the ECE.

    Returns
    -------
    DataFrame
        Four rows, the arms above.

    Raises
    ------
    FmauditInputError
        As :func:`label_coarsening_predictions`.
    """
    arms = label_coarsening_predictions(X, labels, slides, groups, is_test, n_classes=n_classes, probe_C=probe_C,
                                        neural_params=neural_params, random_state=random_state)
    return summarize_predictions(arms, ordinal=ordinal, coverages=coverages, n_boot=n_boot,
                                 bootstrap_seed=bootstrap_seed, n_bins=n_bins)


def without_classes(X_train: Any, y_train: Any, groups_train: Any, X_test: Any, y_test: Any, groups_test: Any, *,
                    class_names: Sequence[str], removed: Sequence[str] = ("NC",), ordinal: bool = True,
                    probe_C: float | None = None, coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int,
                    bootstrap_seed: int = 0, random_state: int = 0, n_bins: int = DEFAULT_N_BINS) -> dict[str, Any]:
    """The task with ``removed`` classes dropped from both splits (audit paper: SICAPv2 without its benign class
    NC); the probe is refitted on the remaining classes (renumbered in order). Returns the
    :func:`prediction_summary` of the remaining test tiles plus n_train, n_test, removed, and the number of
    patients contributing removed-class tiles in all and in the test split.

    Parameters
    ----------
    X_train : array-like of shape (n_train, D)
        Training tile embeddings.
    y_train : array-like of shape (n_train,)
        Training class indices, into ``class_names``.
    groups_train : array-like of shape (n_train,)
        Patient of each training tile (group-disjoint CV folds).
    X_test : array-like of shape (n_test, D)
        Test tile embeddings.
    y_test : array-like of shape (n_test,)
        Test class indices, into ``class_names``.
    groups_test : array-like of shape (n_test,)
        Patient of each test tile (the bootstrap's unit).
    class_names : sequence of str
        Name of each class index (keyword-only).
    removed : sequence of str, default ("NC",)
        Names of the classes dropped from both splits.
    probe_C : float, optional
        Inverse L2 strength of the probe; None selects it by group-disjoint cross-validation.
    random_state : int, default 0
        Seed of the probe's CV folds.
    ordinal : bool, default True
        Whether the classes are ordered grades (adds QWK).
    coverages : sequence of float, default DEFAULT_COVERAGES
        Coverages of the ``selective_accuracy_c<c>`` columns, in (0, 1].
    n_boot : int
        Bootstrap resamples per split for the intervals; 0 gives none (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    bootstrap_seed : int, default 0
        Seed of the bootstrap.
    n_bins : int, default 15
        Equal-width bins of the ECE.

    Returns
    -------
    dict
        The summary's keys (as :func:`summarize_predictions`' row) with ``arm``, ``evaluation``, ``level``,
        ``removed``, ``n_train``, ``n_test``, ``removed_patients``, ``removed_test_patients`` and ``probe_C``.
    """
    arm = without_classes_predictions(X_train, y_train, groups_train, X_test, y_test, groups_test,
                                      class_names=class_names, removed=removed, probe_C=probe_C,
                                      random_state=random_state)
    return summarize_predictions([arm], ordinal=ordinal, coverages=coverages, n_boot=n_boot,
                                 bootstrap_seed=bootstrap_seed, n_bins=n_bins).iloc[0].to_dict()

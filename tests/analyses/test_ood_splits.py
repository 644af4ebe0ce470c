"""The audit paper's further train/test splits: the split itself (its split_indices, re-derived), the pooled summary of
the probe metrics (mean over splits, percentile interval of the pooled draws, re-derived), and the parts."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold

from fmaudit.analyses.ood_splits import draw_split, run_extra_splits
from fmaudit.analyses.ood_suite import ProbeSettings
from fmaudit.analyses.task_data import TaskData
from fmaudit.io import FmauditInputError
from fmaudit.probes import LogisticProbe
from fmaudit.stats import bootstrap_counts


def _audit_paper_split_indices(y, groups, strata, seed):
    """The audit paper's split_indices, written out: 5 shuffled stratified folds over the groups (each by its most
    frequent stratum), or over the items without groups; the first fold is the test side."""
    folds = StratifiedKFold(5, shuffle=True, random_state=seed)
    if groups is None:
        return np.sort(next(folds.split(np.zeros(len(y)), strata))[1])
    ids, gi = np.unique(groups, return_inverse=True)
    values, si = np.unique(strata, return_inverse=True)
    counts = np.zeros((ids.size, values.size), dtype=int)
    np.add.at(counts, (gi, si), 1)
    _, test_groups = next(folds.split(np.zeros(ids.size), counts.argmax(1)))
    return np.flatnonzero(np.isin(gi, test_groups))


def _data(seed=0, n_groups=40, per_group=5, d=6, grouped=True):
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=2.0, size=(3, d))
    y = np.repeat(np.arange(n_groups) % 3, per_group)
    groups = np.repeat([f"p{i}" for i in range(n_groups)], per_group) if grouped else \
        np.array([f"i{i}" for i in range(y.size)])
    X = means[y] + rng.normal(size=(y.size, d))
    splits = np.where(np.arange(y.size) % 5 == 0, "test", "train")
    return TaskData(features=X, labels=y, item_ids=np.array([f"t{i}" for i in range(y.size)]), groups=groups,
                    domains=np.full(y.size, "all"), splits=splits, class_names=["a", "b", "c"],
                    group_units=np.full(y.size, "patient" if grouped else "item"))


@pytest.mark.parametrize("grouped", [True, False])
def test_draw_split_is_the_audit_papers_split_indices(grouped):
    data = _data(grouped=grouped)
    provider = np.where(np.arange(data.labels.size) % 7 < 3, "a", "b")
    strata = np.char.add(data.labels.astype(str), provider)
    groups = data.groups if grouped else None
    for seed in range(3):
        is_test = draw_split(data.labels, groups, strata, 0.2, seed)
        np.testing.assert_array_equal(np.flatnonzero(is_test), _audit_paper_split_indices(data.labels, groups, strata,
                                                                                      seed))
        if grouped:
            assert not set(data.groups[is_test]) & set(data.groups[~is_test])


def test_probe_metrics_pool_the_splits_as_the_audit_paper():
    """The point is the mean over the further splits of the metric on each split's test side; the interval the
    2.5/97.5 percentiles of every split's bootstrap draws (clusters = patients, seeded bootstrap seed + split seed)
    pooled; the stored split takes no part."""
    data = _data()
    seeds, n_boot = (0, 1, 2), 50
    out = run_extra_splits(data, seeds=seeds, probe=ProbeSettings(C=1.0), n_boot=n_boot, bootstrap_seed=3)
    row = out["split_selective"].iloc[0]
    accs, draws = [], []
    for seed in seeds:
        test = draw_split(data.labels, data.groups, data.labels.astype(str), 0.2, seed)
        probe = LogisticProbe(C=1.0, max_iter=10000, tol=1e-6, n_classes=3).fit(data.features[~test],
                                                                               data.labels[~test])
        correct = (probe.predict(data.features[test]) == data.labels[test]).astype(float)
        accs.append(correct.mean())
        counts = bootstrap_counts(correct.size, data.groups[test], n_boot=n_boot, random_state=3 + seed).astype(float)
        draws.append(counts @ correct / counts.sum(axis=1))
    pooled = np.concatenate(draws)
    assert row["splits"] == "further" and row["split_seeds"] == "0,1,2" and row["n_splits"] == 3
    assert row["accuracy"] == pytest.approx(np.mean(accs), abs=1e-9)
    assert row["accuracy_ci_lo"] == pytest.approx(np.percentile(pooled, 2.5), abs=1e-9)
    assert row["accuracy_ci_hi"] == pytest.approx(np.percentile(pooled, 97.5), abs=1e-9)
    assert row["n_boot"] == n_boot and row["n_boot_pooled"] == 3 * n_boot and row["ci_unit"] == "patient"
    assert out["split_slides"].empty and out["split_coarsening"].empty


def test_parts_need_their_settings_and_known_names():
    data = _data()
    with pytest.raises(FmauditInputError, match="unknown part"):
        run_extra_splits(data, seeds=[0], parts=["probe_sensitivity"])
    with pytest.raises(FmauditInputError, match="slide aggregation needs"):
        run_extra_splits(data, seeds=[0], parts=["slide_aggregation"], probe=ProbeSettings(C=1.0))
    with pytest.raises(FmauditInputError, match="no seeds"):
        run_extra_splits(data, seeds=[])

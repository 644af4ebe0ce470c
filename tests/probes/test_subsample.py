"""Label-fraction subsampling (nested, per class) and train/validation splits (stratified, group-disjoint)."""

from __future__ import annotations

import numpy as np
import pytest

from fmaudit.io import FmauditInputError
from fmaudit.probes import (
    label_fraction_subsample,
    split_train_val,
)


def test_label_fraction_subsample_counts_sorting_determinism_and_nesting():
    y = np.repeat([0, 1, 2, 3], [500, 120, 7, 1])
    np.random.default_rng(0).shuffle(y)
    for fraction in (0.01, 0.05, 0.1, 0.25, 0.5):
        idx = label_fraction_subsample(y, fraction, random_state=3)
        counts = np.bincount(y[idx], minlength=4)
        np.testing.assert_array_equal(counts, [max(1, int(n * fraction)) for n in (500, 120, 7, 1)])
        assert (np.diff(idx) > 0).all()
        np.testing.assert_array_equal(idx, label_fraction_subsample(y, fraction, random_state=3))
    assert not np.array_equal(label_fraction_subsample(y, 0.1, 0), label_fraction_subsample(y, 0.1, 1))
    small, large = label_fraction_subsample(y, 0.1, 5), label_fraction_subsample(y, 0.5, 5)
    assert set(small) <= set(large)
    np.testing.assert_array_equal(label_fraction_subsample(y, 1.0, 0), np.arange(y.size))


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_label_fraction_subsample_rejects_bad_fractions(fraction):
    with pytest.raises(FmauditInputError, match="fraction"):
        label_fraction_subsample(np.array([0, 1, 1]), fraction)


def test_label_fraction_subsample_rejects_missing_labels():
    with pytest.raises(FmauditInputError, match="NaN label at row 1"):
        label_fraction_subsample(np.array([0.0, np.nan, 1.0]), 0.5)


def test_split_train_val_without_groups_is_stratified_and_complete():
    y = np.repeat([0, 1, 2], [100, 40, 1])
    train, val = split_train_val(y, val_fraction=0.25, random_state=0)
    assert not set(train) & set(val)
    np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), np.arange(y.size))
    np.testing.assert_array_equal(np.bincount(y[val], minlength=3), [25, 10, 0])  # a singleton stays in train
    again = split_train_val(y, val_fraction=0.25, random_state=0)
    np.testing.assert_array_equal(val, again[1])


def test_split_train_val_with_groups_is_group_disjoint_and_keeps_every_class_in_train():
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(30), 8)
    y = rng.integers(0, 4, groups.size)
    y[groups == 7] = 3  # class 3 lives mostly in a few groups
    train, val = split_train_val(y, groups=groups, val_fraction=0.2, random_state=2)
    assert not set(groups[train]) & set(groups[val])
    assert set(y[train]) == set(y)
    assert 0.1 < val.size / y.size < 0.35
    np.testing.assert_array_equal(val, split_train_val(y, groups=groups, val_fraction=0.2, random_state=2)[1])
    with pytest.raises(FmauditInputError, match="at least 2 groups"):
        split_train_val(y, groups=np.zeros_like(groups))
    with pytest.raises(FmauditInputError, match="groups"):
        split_train_val(y, groups=groups[:-1])

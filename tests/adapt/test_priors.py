"""Prior scenarios and largest-remainder resampling of a target, vectorised over draws (METHODS 6)."""

from fractions import Fraction

import numpy as np
import pytest

from fmaudit.adapt.priors import (
    WBC5_CLASS_ORDER,
    WBC5_SCENARIOS,
    balanced_prior,
    draw_seed,
    largest_remainder_counts,
    named_scenario,
    prior_vector,
    resample_target,
)
from fmaudit.datasets.public import WBC5_CLASSES
from fmaudit.io import FmauditInputError
from fmaudit.schema import REPO_ROOT, load_yaml


def hamilton(shares, n):
    """Largest remainder in exact rational arithmetic, ties to the lowest index."""
    exact = [Fraction(s).limit_denominator(10**9) * n for s in shares]
    counts = [int(e) for e in exact]
    order = sorted(range(len(shares)), key=lambda k: (-(exact[k] - counts[k]), k))
    for k in order[: n - sum(counts)]:
        counts[k] += 1
    return counts


@pytest.mark.parametrize("name", list(WBC5_SCENARIOS))
@pytest.mark.parametrize("n", [7, 100, 333, 500])
def test_largest_remainder_matches_exact_reference(name, n):
    shares = list(WBC5_SCENARIOS[name].shares.values())
    counts = largest_remainder_counts(shares, n)
    assert counts.tolist() == hamilton(shares, n)
    assert counts.sum() == n
    assert np.all(np.abs(counts - np.array(shares) * n) < 1)


def test_largest_remainder_ties_go_to_the_lowest_class():
    # 500 x (0.005, 0.015, ...) = 2.5, 7.5, 45, 20, 425: one leftover item, the tied 0.5 remainders -> class 0
    assert largest_remainder_counts([0.005, 0.015, 0.09, 0.04, 0.85], 500).tolist() == [3, 7, 45, 20, 425]
    # floating-point products just below an integer do not lose an item
    assert largest_remainder_counts([0.29, 0.71], 100).tolist() == [29, 71]


def test_wbc_scenarios_are_the_hema_preset_priors():
    preset = load_yaml(REPO_ROOT / "resources" / "presets" / "hema.yaml")["prior_shift"]["priors"]
    assert list(WBC5_CLASS_ORDER) == list(WBC5_CLASSES)
    assert set(preset) == set(WBC5_SCENARIOS)
    for name, shares in preset.items():
        assert shares == pytest.approx(WBC5_SCENARIOS[name].shares), name
    assert {"balanced", "mild", "peripheral-blood", "neutrophil-heavy"} <= {
        n for n, s in WBC5_SCENARIOS.items() if s.named_in_seed}
    assert named_scenario("clinical").name == "peripheral-blood"
    assert WBC5_SCENARIOS["peripheral-blood"].shares["neutrophil"] > 0.5  # neutrophil-dominated


def test_prior_vector_orders_by_class_and_rejects_bad_priors():
    names = ["a", "b", "c"]
    np.testing.assert_allclose(prior_vector({"c": 0.5, "a": 0.2, "b": 0.3}, names), [0.2, 0.3, 0.5])
    np.testing.assert_allclose(prior_vector([0.2, 0.3, 0.5], names), [0.2, 0.3, 0.5])
    assert balanced_prior(names) == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    with pytest.raises(FmauditInputError, match="missing"):
        prior_vector({"a": 0.5, "b": 0.5}, names)
    with pytest.raises(FmauditInputError, match="sum to 1"):
        prior_vector([0.2, 0.3, 0.4], names)
    with pytest.raises(FmauditInputError, match=">= 0"):
        prior_vector([1.2, -0.2, 0.0], names)
    with pytest.raises(FmauditInputError, match="unknown prior"):
        named_scenario("mostly-blasts")


def _pool():
    # class 0: 40 items, class 1: 6 items, class 2: 30 items, shuffled
    labels = np.repeat([0, 1, 2], [40, 6, 30])
    return np.random.default_rng(0).permutation(labels)


def test_resample_gives_exact_counts_and_samples_without_replacement_when_it_can():
    labels = _pool()
    seeds = [draw_seed(0, "t", "p", d) for d in range(25)]
    draws = resample_target(labels, [0.5, 0.1, 0.4], 50, seeds)
    assert draws.index.shape == (25, 50)
    assert draws.counts.tolist() == [25, 5, 20]
    assert not draws.with_replacement.any()
    for row in draws.index:
        np.testing.assert_array_equal(np.bincount(labels[row], minlength=3), [25, 5, 20])
        assert len(np.unique(row)) == 50  # no item twice
    assert len({tuple(r) for r in draws.index}) == 25  # the draws differ


def test_resample_uses_replacement_only_for_a_pool_that_is_too_small():
    labels = _pool()
    draws = resample_target(labels, [0.2, 0.6, 0.2], 50, [1, 2, 3])  # class 1 needs 30 of its 6 items
    assert draws.with_replacement.tolist() == [False, True, False]
    for row in draws.index:
        cls1 = row[labels[row] == 1]
        assert cls1.size == 30 and set(cls1) <= set(np.flatnonzero(labels == 1))
        other = row[labels[row] != 1]
        assert len(np.unique(other)) == other.size


def test_each_draw_is_reproducible_from_its_recorded_seed_alone():
    labels = _pool()
    seeds = [draw_seed(3, "raabin", "peripheral-blood", d) for d in range(5)]
    assert len(set(seeds)) == 5 and seeds == [draw_seed(3, "raabin", "peripheral-blood", d) for d in range(5)]
    assert (draw_seed(3, "raabin", "balanced", 0) != seeds[0]
            and draw_seed(4, "raabin", "peripheral-blood", 0) != seeds[0])
    all_draws = resample_target(labels, [0.5, 0.1, 0.4], 40, seeds)
    one = resample_target(labels, [0.5, 0.1, 0.4], 40, seeds[3:4])
    np.testing.assert_array_equal(one.index[0], all_draws.index[3])


def test_within_class_sampling_is_uniform():
    labels = np.zeros(8, dtype=int)
    draws = resample_target(labels, [1.0], 4, np.arange(4000))
    freq = np.bincount(draws.index.ravel(), minlength=8) / 4000
    np.testing.assert_allclose(freq, 0.5, atol=0.04)  # each item is in half of the draws


def test_resample_errors_name_the_class_and_the_target():
    labels = np.array([0, 0, 2, 2])
    with pytest.raises(FmauditInputError, match="mll23: class 'eosinophil' has no items"):
        resample_target(labels, [0.4, 0.2, 0.4], 10, [0], class_names=["basophil", "eosinophil", "x"], where="mll23")
    with pytest.raises(FmauditInputError, match="outside"):
        resample_target(np.array([0, 3]), [0.5, 0.5], 4, [0])
    with pytest.raises(FmauditInputError, match="integer"):
        resample_target(np.array([0.0, 1.0]), [0.5, 0.5], 4, [0])
    with pytest.raises(FmauditInputError, match="no draws"):
        resample_target(labels, [0.5, 0.0, 0.5], 4, [])
    # a class with share 0 and no items is fine
    assert resample_target(labels, [0.5, 0.0, 0.5], 4, [0]).counts.tolist() == [2, 0, 2]

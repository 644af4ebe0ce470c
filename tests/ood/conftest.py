"""Synthetic embeddings of a grouped four-class task for the OOD tests."""

from __future__ import annotations

import numpy as np
import pytest


def make_task(seed: int = 0, n_train: int = 240, n_test: int = 120, d: int = 10, k: int = 4, spread: float = 2.5):
    """k Gaussian classes with patient effects; patients of 6 items each, disjoint between the splits."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=spread, size=(k, d))
    out = {}
    for split, n, offset in (("train", n_train, 0), ("test", n_test, 10_000)):
        y = np.arange(n) % k
        groups = np.array([f"p{offset + i // 6}" for i in range(n)])
        patient_shift = rng.normal(scale=0.3, size=(n // 6 + 1, d))[np.arange(n) // 6]
        out[split] = (means[y] + patient_shift + rng.normal(size=(n, d)), y, groups)
    return out


@pytest.fixture(scope="package")
def task():
    return make_task()

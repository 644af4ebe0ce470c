"""Synthetic multi-domain embeddings of several 'encoders' for the analysis tests."""

import numpy as np
import pandas as pd
import pytest

from fmaudit import grid
from fmaudit.analyses.task_data import TaskData
from fmaudit.config import fill_section

DOMAINS = ["a", "b", "c"]


def make_task_data(noise: float, shift: float, seed: int = 0, n_per=(12, 4, 8), k: int = 3, d: int = 8) -> TaskData:
    """k Gaussian classes; each domain shifts all features by a domain offset of size ``shift``.

    Per domain and class: n_per = (train, val, test) items, in groups of 4 items (patients)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=2.0, size=(k, d))
    offsets = {dom: rng.normal(scale=shift, size=d) * (i > 0) for i, dom in enumerate(DOMAINS)}
    rows, xs = [], []
    for dom in DOMAINS:
        for split, n in zip(("train", "val", "test"), n_per):
            for c in range(k):
                for i in range(n):
                    xs.append(means[c] + offsets[dom] + rng.normal(scale=noise, size=d))
                    rows.append((f"{dom}_{split}_{c}_{i}", c, f"{dom}_{split}_p{i // 4}", dom, split))
    ids, labels, groups, doms, splits = map(np.array, zip(*rows))
    return TaskData(features=np.array(xs), labels=labels.astype(int), item_ids=ids, groups=groups, domains=doms,
                    splits=splits, class_names=[f"c{i}" for i in range(k)])


def probe_config(**over):
    return fill_section("probe", {"fractions": [0.5, 1.0], "seeds": [0, 1], **over})


CALIB = fill_section("calibration", {"ece_bins": 15, "kshot_k": [4, 8], "kshot_draws": 3})
BOOT = fill_section("bootstrap", {"n_boot": 50, "seed": 0})


def runs_for(encoder: str, probe: dict) -> pd.DataFrame:
    cfg = {"encoders": [encoder], "tasks": {"t": {"datasets": ["d"], "domains": DOMAINS, "transfer": True}},
           "probe": probe}
    return grid.probe_runs(cfg)


@pytest.fixture(scope="package")
def suite_results():
    """Metric rows and predictions of four encoders of decreasing quality on one task."""
    from fmaudit.analyses.probe_suite import run_probe_suite

    all_rows, all_preds = [], []
    for i, (noise, shift) in enumerate([(0.5, 1.0), (0.8, 1.5), (1.0, 2.0), (1.5, 3.0)]):
        data = make_task_data(noise, shift, seed=0)
        probe = probe_config()
        rows, preds = run_probe_suite(data, runs_for(f"enc{i}", probe), probe, CALIB, BOOT)
        all_rows.append(rows)
        all_preds.append(preds)
    return pd.concat(all_rows, ignore_index=True), pd.concat(all_preds, ignore_index=True)

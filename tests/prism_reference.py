"""PRISM's evaluator, re-implemented line for line from its code (draw, fixed-width ECE, per-run metrics): the
reference both PRISM reproduction tests compare against (tests/probes/test_subsample_prism.py,
tests/commands/test_probe_prism.py)."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import f1_score, roc_auc_score


def prism_stratified_sample(labels, fraction, seed):
    """PRISM's draw, line for line: global seed, per sorted class, choice without replacement, sorted."""
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        idx_all = np.arange(len(labels))
        picked = []
        for c in np.unique(labels):
            c_idx = idx_all[labels == c]
            n = max(1, int(len(c_idx) * fraction))
            picked.extend(np.random.choice(c_idx, size=n, replace=False))
        return np.array(sorted(picked))
    finally:
        np.random.set_state(state)


def prism_notebook_sample(n_items, fraction, seed):
    """The class-agnostic draw of PRISM's per-dataset notebooks (submitted version)."""
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        return np.random.choice(n_items, int(n_items * fraction), replace=False)
    finally:
        np.random.set_state(state)


def prism_ece(proba, labels, n_bins=15):
    """PRISM's fixed-width ECE: [lo, hi) bins; binary: p(class 1) against label == 1; else top-label."""
    if proba.shape[1] == 2:
        conf, correct = proba[:, 1], (labels == 1).astype(float)
    else:
        conf, correct = proba.max(axis=1), (proba.argmax(axis=1) == labels).astype(float)
    edges = np.linspace(0, 1, n_bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (conf >= lo) & (conf < hi)
        if m.sum() > 0:
            ece += m.sum() * abs(correct[m].mean() - conf[m].mean())
    return float(ece / len(conf))


def prism_metrics(proba, labels):
    auroc = (roc_auc_score(labels, proba[:, 1]) if proba.shape[1] == 2
             else roc_auc_score(labels, proba, multi_class="ovr", average="macro"))
    f1 = f1_score(labels, proba.argmax(axis=1), average="macro", zero_division=0)
    return {"auroc": float(auroc), "f1_macro": float(f1), "ece_fixed": prism_ece(proba, labels)}

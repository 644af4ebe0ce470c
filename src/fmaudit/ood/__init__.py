"""Out-of-distribution detection, selective prediction and the abstention gate (audit paper;
docs/methods.md#selective-prediction, docs/methods.md#novelty-scorers).

- ``scorers``: novelty scorers (Mahalanobis, relative Mahalanobis, kNN distance, energy, MSP).
- ``selective``: risk-coverage curves, selective accuracy, accuracy against blur strength.
- ``gate``: the two-threshold abstention gate, its evaluation with cluster-bootstrap intervals, export/load.
- ``perturb``: image-space perturbations (blur, artefacts) and derived manifests, embedded as real inputs.
- ``conditions``: near (held-out classes), far (another data set) and perturbed OOD sets of a task.
- ``sensitivity``: probe regularisation / selection and scorer-setting sensitivity tables.

Slide-level aggregation, which is not OOD, is :mod:`fmaudit.slide_aggregation`.

Names are imported lazily, so that the embedding workers (which only need ``perturb``: numpy and PIL) do not
import scikit-learn or the probe engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "scorers": ("Mahalanobis", "RelativeMahalanobis", "KNNDistance", "energy_score", "msp_score", "max_softmax",
                "make_feature_scorer", "SCORERS", "FEATURE_SCORERS", "LOGIT_SCORERS"),
    "selective": ("risk_coverage_curve", "selective_summary", "blur_accuracy_curve"),
    "gate": ("AbstentionGate", "evaluate_gate", "gate_operating_points", "save_gate", "load_gate", "GateSet"),
    "perturb": ("apply_perturbation", "parse_perturbation", "perturbation_tag", "derive_manifest"),
    "conditions": ("hold_out_classes", "far_ood_items", "align_perturbed"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'fmaudit.ood' has no attribute {name!r}")
    return getattr(importlib.import_module(f"fmaudit.ood.{module}"), name)

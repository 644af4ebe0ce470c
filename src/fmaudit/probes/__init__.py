"""Probe heads, label-fraction subsampling and the batched logistic engine.

- ``heads``: probe heads, scikit-learn classifiers with one output convention (``decision_logits`` -> (N, K);
  ``decision_function`` as scikit-learn gives it) and ``make_head(name, **params)``.
- ``subsample``: ``label_fraction_subsample`` (PRISM label fractions) and ``split_train_val``.
- ``logistic_batch``: ``fit_logistic_batch``, many L2 logistic probes fitted at once in torch (its objective,
  row layouts, path and solver in ``_logistic_loss``, ``_row_store``, ``_logistic_path`` and ``_lbfgs``).
"""

from importlib import import_module

from fmaudit.metrics import softmax_last_axis  # the probes' predict_proba, exported here too
from fmaudit.probes._row_store import ENGINE_BYTES_PER_VALUE, subset_scaler
from fmaudit.probes.logistic_batch import (
    ABSENT_CLASS_LOGIT_GAP,
    BatchLogistic,
    fit_logistic_batch,
)
from fmaudit.probes.subsample import label_fraction_subsample, split_train_val

# The heads (scikit-learn classifiers) load when first asked for: the engine's worker processes
# (fmaudit.probes.pool) import this package and need no scikit-learn, which would add about a second to
# each worker's start.
_HEAD_NAMES = ("HEADS", "CosineCentroidProbe", "KNNProbe", "LinearSVMProbe", "LogisticCVProbe", "LogisticProbe",
               "NearestCentroidProbe", "ProbeHead", "fill_absent_classes", "make_head")


def __getattr__(name: str):
    if name in _HEAD_NAMES:
        return getattr(import_module("fmaudit.probes.heads"), name)
    raise AttributeError(f"module 'fmaudit.probes' has no attribute {name!r}")


__all__ = [
    "ABSENT_CLASS_LOGIT_GAP",
    "BatchLogistic",
    "CosineCentroidProbe",
    "ENGINE_BYTES_PER_VALUE",
    "HEADS",
    "KNNProbe",
    "LinearSVMProbe",
    "LogisticCVProbe",
    "LogisticProbe",
    "NearestCentroidProbe",
    "ProbeHead",
    "fill_absent_classes",
    "fit_logistic_batch",
    "label_fraction_subsample",
    "make_head",
    "softmax_last_axis",
    "split_train_val",
    "subset_scaler",
]

"""Probe heads, label-fraction subsampling and the batched logistic engine.

- ``heads``: estimator-style probe heads with one output convention (``decision_logits`` -> (N, K)) and
  ``make_head(name, **params)``.
- ``subsample``: ``stratified_subsample`` (PRISM label fractions) and ``split_train_val``.
- ``logistic_batch``: ``fit_logistic_batch``, many L2 logistic probes fitted at once in torch.
"""

from fmaudit.probes.heads import (
    HEADS,
    CosineCentroidProbe,
    KNNProbe,
    LinearSVMProbe,
    LogisticCVProbe,
    LogisticProbe,
    NearestCentroidProbe,
    ProbeHead,
    fill_absent_classes,
    make_head,
    softmax,
)
from fmaudit.probes.logistic_batch import (
    ABSENT_CLASS_LOGIT_GAP,
    BatchLogistic,
    fit_logistic_batch,
    resolve_device,
    subset_scaler,
)
from fmaudit.probes.subsample import split_train_val, stratified_subsample

__all__ = [
    "ABSENT_CLASS_LOGIT_GAP",
    "BatchLogistic",
    "CosineCentroidProbe",
    "HEADS",
    "KNNProbe",
    "LinearSVMProbe",
    "LogisticCVProbe",
    "LogisticProbe",
    "NearestCentroidProbe",
    "ProbeHead",
    "fill_absent_classes",
    "fit_logistic_batch",
    "make_head",
    "resolve_device",
    "softmax",
    "split_train_val",
    "stratified_subsample",
    "subset_scaler",
]

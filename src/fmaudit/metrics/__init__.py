"""Classification, calibration and selective-prediction metrics on predicted probabilities.

Every public metric takes ``probs`` of shape (N, K) (rows are probability vectors) and integer ``labels``
of shape (N,) with values in 0..K-1, validates them and returns a float. The conventions follow
docs/methods.md (docs/methods.md#calibration, docs/methods.md#discrimination-metrics,
docs/methods.md#selective-prediction, docs/methods.md#composite-indices-cri-cra-and-crt); :data:`CONVENTIONS`
states them in words for report captions.

Notation: ``conf = probs.max(1)``; ``pred = probs.argmax(1)`` (ties go to the lowest class index, as numpy);
``correct = pred == labels``.

Project defaults, and where other implementations differ:

- ECE uses equal-width bins on [0, 1] closed on the right, ``(lo, hi]`` (Guo 2017, gpleiss
  ``_ECELoss``, the audit paper); torchmetrics, netcal and PRISM use ``[lo, hi)``. The two agree unless a
  confidence falls exactly on a bin edge. With ``(lo, hi]`` a value of exactly 0 goes to the first bin,
  with ``[lo, hi)`` a value of exactly 1 goes to the last bin, so no item is ever left out. The
  denominator is always N and empty bins contribute 0.
- ECE is top-label for binary tasks too (confidence ``max(p, 1-p)``), unlike torchmetrics
  ``BinaryCalibrationError`` and netcal, which use p(class 1).
- Adaptive ECE is equal-mass: the confidences are sorted (stable) and split into ``n_bins`` near-equal
  parts with ``np.array_split`` (docs/methods.md#adaptive-ece).
- NLL is not clipped: a zero probability on the true class gives ``inf``. sklearn ``log_loss`` clips.
- Brier is the multiclass sum form, range [0, 2]; for binary tasks it is twice sklearn's binary Brier.
- AUROC is the macro mean of one-vs-rest AUCs with ties counted 1/2; binary tasks use ``probs[:, 1]``.
  It is NaN (with a logged warning) when a class is absent from ``labels``.
- AURC averages the correctness of tied confidences (expected value over a random order within a tie);
  E-AURC subtracts the discrete optimum (every correct prediction ranked first).
- Novelty detection (``detection_auroc``, ``fpr_at_tpr``) takes two 1-D score arrays, ID and OOD; OOD is the
  positive class and a higher score means more out-of-distribution (docs/methods.md#novelty-scorers).
"""

from fmaudit.metrics.calibration_metrics import (
    CLOSURE_LEFT,
    CLOSURE_RIGHT,
    CLOSURES,
    DEFAULT_N_BINS,
    adaptive_ece,
    bin_indices,
    brier,
    classwise_ece,
    ece,
    mce,
    nll,
    prism_ece,
    reliability_bins,
)
from fmaudit.metrics.discrimination import (
    COLLAPSE_THRESHOLD,
    accuracy,
    auroc,
    balanced_accuracy,
    confusion_counts,
    degeneracy_share,
    is_collapsed,
    macro_f1,
    qwk,
)
from fmaudit.metrics.logits import (
    binary_logits_from_decision,
    log_softmax,
    nll_from_logits,
    softmax,
    softmax_last_axis,
)
from fmaudit.metrics.novelty import (
    detection_auroc,
    fpr_at_tpr,
)
from fmaudit.metrics.risk_coverage import (
    aurc,
    eaurc,
    selective_accuracy,
)
from fmaudit.metrics.summary import (
    CONVENTIONS,
    binned_metric_columns,
    ece_column,
    ece_convention,
    metric_conventions,
    prism_ece_column,
    summary_metric_keys,
    summary_metrics,
)
from fmaudit.metrics.validation import (
    PROB_SUM_TOLERANCE,
    float_array,
    reject_missing_labels,
    validate_labels,
    validate_logits,
    validate_probs,
    validate_probs_labels,
)

__all__ = [
    "CLOSURES",
    "CLOSURE_LEFT",
    "CLOSURE_RIGHT",
    "COLLAPSE_THRESHOLD",
    "CONVENTIONS",
    "DEFAULT_N_BINS",
    "PROB_SUM_TOLERANCE",
    "accuracy",
    "adaptive_ece",
    "aurc",
    "auroc",
    "balanced_accuracy",
    "bin_indices",
    "binary_logits_from_decision",
    "binned_metric_columns",
    "brier",
    "classwise_ece",
    "confusion_counts",
    "degeneracy_share",
    "detection_auroc",
    "eaurc",
    "ece",
    "ece_column",
    "ece_convention",
    "float_array",
    "fpr_at_tpr",
    "is_collapsed",
    "log_softmax",
    "macro_f1",
    "mce",
    "metric_conventions",
    "nll",
    "nll_from_logits",
    "prism_ece",
    "prism_ece_column",
    "qwk",
    "reject_missing_labels",
    "reliability_bins",
    "selective_accuracy",
    "softmax",
    "softmax_last_axis",
    "summary_metric_keys",
    "summary_metrics",
    "validate_labels",
    "validate_logits",
    "validate_probs",
    "validate_probs_labels",
]

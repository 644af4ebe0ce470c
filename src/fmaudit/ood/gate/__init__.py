"""The audit paper's two-threshold abstention gate (docs/methods.md#the-abstention-gate), its evaluation and export.

- ``estimator``: the fit/validation division and :class:`AbstentionGate`.
- ``evaluation``: the gate on the test split and the OOD sets, over several divisions, with intervals.
- ``export``: the gate folder (safetensors arrays and a JSON card) written and read back, nothing pickled.

Fitting (:class:`AbstentionGate`):

1. The training split is divided into a fit part and a validation part (:func:`fit_validation_split`): with
   ``validation_fraction = 1/k`` for an integer k (0.2 -> 5) the validation part is the first fold of
   ``StratifiedKFold(k, shuffle=True, random_state)`` over the items, or over the groups (patients / slides,
   each stratified by its most frequent class) when groups are given: the audit paper's ``split_indices``; where every
   class's items sit in fewer groups than folds (small data) the groups are dealt by ``KFold`` instead. Other
   fractions use :func:`fmaudit.probes.split_train_val` (group-disjoint when groups are given).
2. The probe (standardised features, multinomial logistic; C chosen by grouped 3-fold CV on log-loss over
   ``logspace(-6, 0, 7)``, the audit paper's, docs/methods.md#heads, or a given C) and the novelty scorer
   (Mahalanobis with a Ledoit-Wolf pooled covariance by default) are fitted on the fit part.
3. Novelty threshold: the ``1 - id_reject`` quantile (numpy linear interpolation) of the validation novelty
   scores; an item is rejected as novel when its score *exceeds* it.
4. Confidence threshold: the ``1 - retain`` quantile of the probe confidence (max softmax) of the validation
   items that pass the novelty threshold; an item is kept when its confidence is *at least* it.
5. Both thresholds are applied unchanged to any later set: ``decide(X)`` gives per item ``decision``
   (accept / reject_novel / reject_unconfident; novelty is checked first), ``novelty``, ``confidence`` and
   ``prediction`` (class index).

Evaluation (:func:`gate_operating_points`): the gate is fitted on ``n_splits`` fit/validation divisions
(seeds ``random_state + i``), each stratified like the test split (``strata``: PANDA's grade and data provider
jointly), and applied to the test split and every OOD set. Per set: coverage, rejection rates and, where labels
exist, the accuracy (and QWK for ordinal tasks) of all / novelty-passing / accepted items. ``value`` is the
paper's number: the gate of division 0 (the audit paper evaluates one division, seed 0), the exported gate, which
applying it reproduces exactly. Beside it, ``mean_over_divisions`` with the percentile interval of the
bootstrap draws pooled over the divisions (per division ``n_boot`` cluster-bootstrap resamples of the
evaluated set: groups = patients or slides, else items; ``fmaudit.stats.bootstrap_counts`` with seed
``bootstrap_seed + i``) says how much the operating point moves with the division.

Export (:func:`save_gate` / :func:`load_gate`): ``gate.safetensors`` holds the scaler, probe and scorer
arrays; ``gate.json`` (the card) holds the encoder, readout, training-data hash, feature dimension, classes,
thresholds, settings, the validation operating point, the fmaudit version and the sha256 of the arrays.
Nothing is pickled. The card is written last, so a gate folder without a matching card is refused.
"""

from fmaudit.ood.gate.estimator import DECISIONS, DEFAULT_CS, AbstentionGate, fit_validation_split
from fmaudit.ood.gate.evaluation import DIVISION_MEAN, GateSet, evaluate_gate, gate_operating_points
from fmaudit.ood.gate.export import ARRAYS_FILE, CARD_FILE, GATE_FORMAT, GATE_FORMAT_VERSION, load_gate, save_gate

__all__ = [
    "ARRAYS_FILE",
    "CARD_FILE",
    "DECISIONS",
    "DEFAULT_CS",
    "DIVISION_MEAN",
    "GATE_FORMAT",
    "GATE_FORMAT_VERSION",
    "AbstentionGate",
    "GateSet",
    "evaluate_gate",
    "fit_validation_split",
    "gate_operating_points",
    "load_gate",
    "save_gate",
]

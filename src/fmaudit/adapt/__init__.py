"""Class-prior shift and label-free adaptation on frozen features (hema paper;
docs/methods.md#prior-shift-and-label-free-adaptation).

- ``priors``: prior scenarios and largest-remainder resampling of a target to them, vectorised over draws.
- ``methods``: the adaptation methods as pure functions (global standardisation, CBR, the oracle, BBSE,
  Saerens EM, SHOT-IM) and the label-free selection scores.
- ``source_probe``: the default source probe and what the label-free methods may know about the source.
- ``evaluate``: the batched evaluation of every method on target draws.
- ``selection``: label-free encoder selection and its regret against the oracle choice.
- ``summary``: the hema paper's summaries (scenario means with hierarchical-bootstrap intervals, negative cells,
  effective robustness, relative gap, per-class recall, calibration under adaptation).
- ``scratch``: the ResNet-18 trained from scratch on the source, the non-frozen reference row.

``fmaudit.adapt.evaluate`` is the function (``evaluate(Xs, ys, Xt, yt, methods=...)``); the module of the same
name is reached with ``from fmaudit.adapt.evaluate import ...``.
"""

from fmaudit.adapt.evaluate import METHODS, NOT_DEPLOYABLE, evaluate, evaluate_draws
from fmaudit.adapt.methods import (
    ShotIMHead,
    bbse_adjust,
    bbse_weights,
    cbr_standardize,
    global_standardize,
    im_loss,
    marginal_entropy,
    mean_entropy,
    mean_max_probability,
    oracle_standardize,
    saerens_em,
)
from fmaudit.adapt.priors import WBC5_SCENARIOS, largest_remainder_counts, resample_target
from fmaudit.adapt.source_probe import SourceProbe, fit_source_probes

__all__ = [
    "METHODS",
    "NOT_DEPLOYABLE",
    "ShotIMHead",
    "SourceProbe",
    "WBC5_SCENARIOS",
    "bbse_adjust",
    "bbse_weights",
    "cbr_standardize",
    "evaluate",
    "evaluate_draws",
    "fit_source_probes",
    "global_standardize",
    "im_loss",
    "largest_remainder_counts",
    "marginal_entropy",
    "mean_entropy",
    "mean_max_probability",
    "oracle_standardize",
    "resample_target",
    "saerens_em",
]

"""Slide-level aggregation of frozen tile embeddings and the slide-label controls (the audit paper's PANDA and SICAPv2
parts): aggregators, label coarsening to the slide, and the task without some of its classes.

Aggregators (one slide = one bag of its tiles; the audit paper's names in :data:`PAPER_NAMES`):

- ``majority_vote``: the tile probe's predictions voted per slide (ties to the lowest class); confidence =
  share of the slide's tiles voting for the winner (the audit paper's ``patch_vote``).
- ``mean_probability``: the mean of the tile probe's probability vectors; prediction = argmax, confidence =
  max (not in the audit paper).
- ``mean_embedding`` / ``max_embedding``: the probe refitted on per-slide mean / element-wise maximum
  embeddings (the audit paper's ``mean_pool`` / ``max_pool``).
- ``attention_mil``: :class:`AttentionMILClassifier`, gated attention pooling (Ilse et al. 2018; the audit paper
  ``abmil``).
- ``transformer_mil``: :class:`TransformerMILClassifier`, one transformer encoder layer over the slide's tiles
  and a class token (the audit paper's ``transformer``).

The two neural aggregators follow the audit paper's one fixed configuration for every encoder: tiles standardised with
the training tiles' mean and std, Adam (lr 1e-4, weight decay 1e-4), 30 epochs of one bag per step in a fresh
seeded order, cross-entropy, no validation set, the final epoch's weights; trained on the CPU by default, as
the audit paper (a GPU gives other last digits), seeded by ``random_state`` (weights and dropout through a forked
torch RNG, so the caller's torch RNG is left as it was; the bag order through ``numpy.random.default_rng``).

Every analysis has two forms: ``*_predictions`` returns the predictions of each arm on one train/test split
(:class:`ArmPredictions`), and the table functions (:func:`slide_aggregation`, :func:`label_coarsening`,
:func:`without_classes`) summarise them with :func:`fmaudit.ood.selective.prediction_summary` (accuracy, QWK for
ordinal grades, AURC, E-AURC, ECE, with a bootstrap whose unit is the slide, or the patient when slides are
nested in patients). :func:`summarize_splits` pools several splits as the audit paper does (mean over the splits,
percentile interval of the bootstrap draws pooled over them).
"""

from fmaudit.slide_aggregation.bags import coarsen_to_slide, majority_vote, make_bags, mean_probability, pool_bags
from fmaudit.slide_aggregation.mil import (
    NEURAL_AGGREGATORS,
    AttentionMILClassifier,
    ClassTokenTransformer,
    GatedAttentionPooling,
    TransformerMILClassifier,
    neural_aggregator,
)
from fmaudit.slide_aggregation.predictions import (
    AGGREGATORS,
    PAPER_NAMES,
    ArmPredictions,
    label_coarsening_predictions,
    slide_aggregation_predictions,
    without_classes_predictions,
)
from fmaudit.slide_aggregation.summaries import (
    label_coarsening,
    slide_aggregation,
    summarize_predictions,
    summarize_splits,
    without_classes,
)

__all__ = [
    "AGGREGATORS",
    "ArmPredictions",
    "AttentionMILClassifier",
    "ClassTokenTransformer",
    "GatedAttentionPooling",
    "NEURAL_AGGREGATORS",
    "PAPER_NAMES",
    "TransformerMILClassifier",
    "coarsen_to_slide",
    "label_coarsening",
    "label_coarsening_predictions",
    "majority_vote",
    "make_bags",
    "mean_probability",
    "neural_aggregator",
    "pool_bags",
    "slide_aggregation",
    "slide_aggregation_predictions",
    "summarize_predictions",
    "summarize_splits",
    "without_classes",
    "without_classes_predictions",
]

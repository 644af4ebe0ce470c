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

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from fmaudit.devices import resolve_device
from fmaudit.io import FmauditInputError
from fmaudit.metrics import DEFAULT_N_BINS
from fmaudit.ood.conditions import hold_out_classes
from fmaudit.ood.selective import DEFAULT_COVERAGES, pooled_summary, prediction_draws, prediction_summary
from fmaudit.probes import LogisticCVProbe, LogisticProbe, subset_scaler
from fmaudit.probes.logistic_batch import check_features

AGGREGATORS = ("majority_vote", "mean_probability", "mean_embedding", "max_embedding", "attention_mil",
               "transformer_mil")
#: The aggregators trained on bags (one module each), and the config key of their settings.
NEURAL_AGGREGATORS = {"attention_mil": "mil", "transformer_mil": "transformer"}
#: The audit paper's name of each aggregator (``slide_aggregation.py``); ``mean_probability`` is fmaudit's own.
PAPER_NAMES = {"majority_vote": "patch_vote", "mean_probability": "", "mean_embedding": "mean_pool",
               "max_embedding": "max_pool", "attention_mil": "abmil", "transformer_mil": "transformer",
               "tile_level": "patch-level probe"}

__all__ = [
    "AGGREGATORS",
    "ArmPredictions",
    "AttentionMILClassifier",
    "NEURAL_AGGREGATORS",
    "PAPER_NAMES",
    "TransformerMILClassifier",
    "coarsen_to_slide",
    "label_coarsening",
    "label_coarsening_predictions",
    "majority_vote",
    "make_bags",
    "mean_probability",
    "slide_aggregation",
    "slide_aggregation_predictions",
    "summarize_predictions",
    "summarize_splits",
    "without_classes",
    "without_classes_predictions",
]


# --------------------------------------------------------------------------------------------------
# bags
# --------------------------------------------------------------------------------------------------
def make_bags(slides: Any, labels: Any = None) -> tuple[np.ndarray, list[np.ndarray], np.ndarray | None]:
    """(sorted slide ids, tile indices of each slide, label of each slide or None).

    With ``labels``, every tile of a slide must carry the slide's label (raises naming the slide).

    Parameters
    ----------
    slides : array-like of shape (n_tiles,)
        Slide id of each tile (no missing ids).
    labels : array-like of shape (n_tiles,), optional
        Label of each tile.

    Returns
    -------
    ids : ndarray of shape (n_slides,)
        The distinct slide ids, sorted.
    index : list of ndarray of int
        For each slide, the positions of its tiles, in input order.
    bag_labels : ndarray of shape (n_slides,) or None
        Each slide's label; None without ``labels``.

    Raises
    ------
    FmauditInputError
        On an empty or missing slide id, labels of another shape, or a slide whose tiles disagree.
    """
    s = np.asarray(slides)
    if s.ndim != 1 or s.size == 0:
        raise FmauditInputError(f"slides: expected a non-empty 1-D array of slide ids, got shape {s.shape}")
    if s.dtype.kind == "O" and pd.isna(s).any():
        raise FmauditInputError(f"slides: missing slide id at row {int(np.flatnonzero(pd.isna(s))[0])}")
    ids, inverse = np.unique(s, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    index = np.split(order, np.cumsum(np.bincount(inverse))[:-1])
    if labels is None:
        return ids, index, None
    y = np.asarray(labels)
    if y.shape != s.shape:
        raise FmauditInputError(f"labels: {y.shape} for {s.size} tiles")
    bag_labels = np.array([y[i[0]] for i in index])
    for slide, i, label in zip(ids, index, bag_labels):
        if not (y[i] == label).all():
            raise FmauditInputError(f"slide {str(slide)!r}: its tiles carry different labels "
                                    f"{sorted(set(y[i].tolist()))}; "
                                    "coarsen them to one slide label first (coarsen_to_slide)")
    return ids, index, bag_labels


def majority_vote(predictions: Any, index: Sequence[np.ndarray], n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per slide: the most frequent tile prediction (ties to the lowest class) and its share of the tiles.

    Parameters
    ----------
    predictions : array-like of int, shape (n_tiles,)
        Predicted class of each tile.
    index : sequence of ndarray of int
        Tile positions of each slide (:func:`make_bags`).
    n_classes : int
        K.

    Returns
    -------
    prediction : ndarray of int64, shape (n_slides,)
    confidence : ndarray of float64, shape (n_slides,)
        Share of the slide's tiles voting for the winner, in (0, 1].
    """
    pred = np.asarray(predictions, dtype=np.int64)
    counts = np.stack([np.bincount(pred[i], minlength=n_classes) for i in index])
    return counts.argmax(axis=1), counts.max(axis=1) / counts.sum(axis=1)


def mean_probability(probs: Any, index: Sequence[np.ndarray]) -> np.ndarray:
    """(n_slides, K) mean of the tile probability vectors of each slide.

    Parameters
    ----------
    probs : array-like of shape (n_tiles, K)
        Tile probability vectors.
    index : sequence of ndarray of int
        Tile positions of each slide.

    Returns
    -------
    ndarray of float64, shape (n_slides, K)
    """
    p = np.asarray(probs, dtype=np.float64)
    return np.stack([p[i].mean(axis=0) for i in index])


def pool_bags(X: np.ndarray, index: Sequence[np.ndarray], how: str) -> np.ndarray:
    """One vector per slide: the mean or the element-wise maximum of its tile embeddings.

    Parameters
    ----------
    X : ndarray of shape (n_tiles, D)
        Tile embeddings.
    index : sequence of ndarray of int
        Tile positions of each slide.
    how : {"mean", "max"}
        The pooling.

    Returns
    -------
    ndarray of shape (n_slides, D)

    Raises
    ------
    FmauditInputError
        For another ``how``.
    """
    if how == "mean":
        return np.stack([X[i].mean(axis=0) for i in index])
    if how == "max":
        return np.stack([X[i].max(axis=0) for i in index])
    raise FmauditInputError(f"pooling {how!r}: expected 'mean' or 'max'")


def coarsen_to_slide(labels: Any, slides: Any) -> np.ndarray:
    """Each tile relabelled with the most severe (largest) label among the tiles of its slide (the audit paper's
    SICAPv2 slide labels; pass every tile of the slide, training and test together).

    Parameters
    ----------
    labels : array-like of int, shape (n_tiles,)
        Region-level grade of each tile.
    slides : array-like of shape (n_tiles,)
        Slide id of each tile.

    Returns
    -------
    ndarray of int64, shape (n_tiles,)

    Raises
    ------
    FmauditInputError
        When the two are not 1-D of the same length.
    """
    y = np.asarray(labels)
    s = np.asarray(slides)
    if y.shape != s.shape or y.ndim != 1:
        raise FmauditInputError(f"labels {y.shape} and slides {s.shape}: need one slide id per tile")
    _, inverse = np.unique(s, return_inverse=True)
    inverse = inverse.reshape(-1)
    top = np.full(inverse.max() + 1, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(top, inverse, y.astype(np.int64))
    return top[inverse]


# --------------------------------------------------------------------------------------------------
# neural aggregators
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _one_torch_thread_on_cpu(device: str) -> Iterator[None]:
    # one bag per step is a chain of tiny ops: torch's thread pool only adds overhead on CPU (a test fit took
    # 49 s with 2 threads and 9 s with 1 on a shared 2-core machine)
    if str(device).startswith("cuda"):
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class GatedAttentionPooling(nn.Module):
    """Gated attention pooling over the tiles of one bag (Ilse et al. 2018), then a linear head.

    Parameters
    ----------
    dim : int
        Width D of the tile embeddings.
    n_classes : int
        K, outputs of the head.
    embed_dim : int
        Width of the tile projection (Linear + ReLU).
    attention_dim : int
        Width of the gated attention's hidden layer.
    """

    def __init__(self, dim: int, n_classes: int, embed_dim: int, attention_dim: int):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(dim, embed_dim), nn.ReLU())
        self.attention_v = nn.Linear(embed_dim, attention_dim)
        self.attention_u = nn.Linear(embed_dim, attention_dim)
        self.attention_w = nn.Linear(attention_dim, 1)
        self.head = nn.Linear(embed_dim, n_classes)

    def forward(self, bag: torch.Tensor) -> torch.Tensor:  # bag: (n_tiles, dim) -> (1, n_classes)
        """Logits of one bag.

        Parameters
        ----------
        bag : Tensor of shape (n_tiles, dim)
            The bag's standardised tile embeddings.

        Returns
        -------
        Tensor of shape (1, n_classes)
        """
        h = self.embed(bag)
        gate = torch.tanh(self.attention_v(h)) * torch.sigmoid(self.attention_u(h))
        weights = torch.softmax(self.attention_w(gate), dim=0)
        return self.head((weights * h).sum(0, keepdim=True))


class ClassTokenTransformer(nn.Module):
    """A linear tile projection, a learned class token (zero-initialised), one transformer encoder layer over
    the class token and the tiles, and a linear head on the class token (the audit paper's ``TransformerMIL``).

    Parameters
    ----------
    dim : int
        Width D of the tile embeddings.
    n_classes : int
        K, outputs of the head.
    embed_dim : int
        Model width (a multiple of ``n_heads``).
    n_heads : int
        Attention heads of the encoder layer.
    feedforward_dim : int
        Hidden width of the layer's feed-forward block.
    dropout : float
        Dropout inside the encoder layer.
    """

    def __init__(self, dim: int, n_classes: int, embed_dim: int, n_heads: int, feedforward_dim: int, dropout: float):
        super().__init__()
        self.embed = nn.Linear(dim, embed_dim)
        self.class_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.encoder = nn.TransformerEncoderLayer(embed_dim, n_heads, feedforward_dim, dropout=dropout,
                                                  batch_first=True)
        self.head = nn.Linear(embed_dim, n_classes)

    def forward(self, bag: torch.Tensor) -> torch.Tensor:  # bag: (n_tiles, dim) -> (1, n_classes)
        """Logits of one bag, read from the class token.

        Parameters
        ----------
        bag : Tensor of shape (n_tiles, dim)
            The bag's standardised tile embeddings.

        Returns
        -------
        Tensor of shape (1, n_classes)
        """
        tokens = torch.cat([self.class_token, self.embed(bag).unsqueeze(0)], dim=1)
        return self.head(self.encoder(tokens)[:, 0])


class _BagClassifier:
    """A module trained on bags of standardised tile embeddings (see the module doc for the recipe).

    Fitted: ``model_`` (torch module, eval mode), ``mean_``, ``scale_`` (training tiles, ddof 0, constant
    features scale 1), ``n_classes_``, ``losses_`` (mean training loss per epoch), ``device_``,
    ``n_features_in_``."""

    epochs: int
    lr: float
    weight_decay: float
    random_state: int
    device: str

    def _module(self, dim: int, n_classes: int) -> nn.Module:
        raise NotImplementedError

    def fit(self, X: Any, bag_index: Sequence[np.ndarray], bag_labels: Any, n_classes: int | None = None):
        X = check_features(X, "tile features")
        y = np.asarray(bag_labels, dtype=np.int64)
        if len(bag_index) != y.size or y.size == 0:
            raise FmauditInputError(f"{len(bag_index)} bags but {y.size} bag labels")
        k = int(n_classes) if n_classes is not None else int(y.max()) + 1
        if y.min() < 0 or y.max() >= k:
            raise FmauditInputError(f"bag labels outside 0..{k - 1}")
        if np.unique(y).size < 2:
            raise FmauditInputError(f"{type(self).__name__}: the training bags hold a single class; need at least two")
        self.mean_, self.scale_ = subset_scaler(X)
        Xs = ((X - self.mean_) / self.scale_).astype(np.float32)
        device = resolve_device(self.device)
        rng = np.random.default_rng(self.random_state)
        losses = []
        with torch.random.fork_rng(devices=[]), _one_torch_thread_on_cpu(str(device)):
            torch.manual_seed(int(self.random_state))
            model = self._module(X.shape[1], k).to(device)
            optimiser = torch.optim.Adam(model.parameters(), lr=float(self.lr), weight_decay=float(self.weight_decay))
            loss_fn = nn.CrossEntropyLoss()
            tiles = torch.from_numpy(Xs).to(device)
            bags = [torch.as_tensor(np.asarray(i), dtype=torch.long, device=device) for i in bag_index]
            targets = torch.as_tensor(y, dtype=torch.long, device=device)
            model.train()
            for _ in range(int(self.epochs)):
                total = 0.0
                for j in rng.permutation(len(bags)):
                    loss = loss_fn(model(tiles[bags[j]]), targets[j:j + 1])
                    optimiser.zero_grad()
                    loss.backward()
                    optimiser.step()
                    total += float(loss.detach())
                losses.append(total / len(bags))
        model.eval()
        self.model_, self.n_classes_, self.losses_, self.device_ = model, k, losses, str(device)
        self.n_features_in_ = X.shape[1]
        return self

    def predict_proba(self, X: Any, bag_index: Sequence[np.ndarray]) -> np.ndarray:
        """(n_bags, K) softmax of the bag logits."""
        if not hasattr(self, "model_"):
            raise FmauditInputError(f"{type(self).__name__} is not fitted yet: call fit first")
        X = check_features(X, "tile features")
        if X.shape[1] != self.n_features_in_:
            raise FmauditInputError(f"tile features have {X.shape[1]} dimensions; the model was fitted on "
                                    f"{self.n_features_in_}")
        tiles = torch.from_numpy(((X - self.mean_) / self.scale_).astype(np.float32)).to(self.device_)
        with torch.inference_mode(), _one_torch_thread_on_cpu(self.device_):
            out = [torch.softmax(self.model_(tiles[torch.as_tensor(np.asarray(i), dtype=torch.long,
                                                                    device=self.device_)]), dim=1)[0]
                   for i in bag_index]
        return torch.stack(out).double().cpu().numpy()


class AttentionMILClassifier(_BagClassifier):
    """Gated attention MIL (Ilse et al. 2018) on bags of frozen tile embeddings (the audit paper's ``abmil``).

    ``fit(X, bag_index, bag_labels, n_classes)`` and ``predict_proba(X, bag_index)`` take the tiles of all bags
    and the tile positions of each bag (:func:`make_bags`). Fitted attributes: see :class:`_BagClassifier`.

    Parameters
    ----------
    embed_dim : int, default 256
        Width of the tile projection (Linear + ReLU).
    attention_dim : int, default 128
        Width of the gated attention's hidden layer.
    epochs : int, default 30
        Passes over the training bags, one bag per optimiser step.
    lr : float, default 1e-4
        Adam's learning rate.
    weight_decay : float, default 1e-4
        Adam's weight decay.
    random_state : int, default 0
        Seed of the weights and of the bag order.
    device : str, default "cpu"
        ``"cpu"`` as the audit paper, ``"cuda"``, or ``"auto"`` (CUDA when available).
    """

    def __init__(self, embed_dim: int = 256, attention_dim: int = 128, epochs: int = 30, lr: float = 1e-4,
                 weight_decay: float = 1e-4, random_state: int = 0, device: str = "cpu"):
        self.embed_dim = embed_dim
        self.attention_dim = attention_dim
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.random_state = random_state
        self.device = device

    def _module(self, dim: int, n_classes: int) -> nn.Module:
        return GatedAttentionPooling(dim, n_classes, int(self.embed_dim), int(self.attention_dim))


class TransformerMILClassifier(_BagClassifier):
    """One transformer encoder layer over a slide's tiles and a class token (the audit paper's ``transformer``).

    Used as :class:`AttentionMILClassifier`. Fitted attributes: see :class:`_BagClassifier`.

    Parameters
    ----------
    embed_dim : int, default 256
        Model width; a multiple of ``n_heads``.
    n_heads : int, default 4
        Attention heads.
    feedforward_dim : int, default 512
        Hidden width of the feed-forward block.
    dropout : float, default 0.1
        Dropout inside the layer (off at prediction).
    epochs : int, default 30
        Passes over the training bags, one bag per optimiser step.
    lr : float, default 1e-4
        Adam's learning rate.
    weight_decay : float, default 1e-4
        Adam's weight decay.
    random_state : int, default 0
        Seed of the weights, dropout and bag order.
    device : str, default "cpu"
        ``"cpu"`` as the audit paper, ``"cuda"``, or ``"auto"``.
    """

    def __init__(self, embed_dim: int = 256, n_heads: int = 4, feedforward_dim: int = 512, dropout: float = 0.1,
                 epochs: int = 30, lr: float = 1e-4, weight_decay: float = 1e-4, random_state: int = 0,
                 device: str = "cpu"):
        self.embed_dim = embed_dim
        self.n_heads = n_heads
        self.feedforward_dim = feedforward_dim
        self.dropout = dropout
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.random_state = random_state
        self.device = device

    def _module(self, dim: int, n_classes: int) -> nn.Module:
        if int(self.embed_dim) % int(self.n_heads):
            raise FmauditInputError(f"transformer: embed_dim {self.embed_dim} is not a multiple of n_heads "
                                    f"{self.n_heads}")
        return ClassTokenTransformer(dim, n_classes, int(self.embed_dim), int(self.n_heads),
                                     int(self.feedforward_dim), float(self.dropout))


_NEURAL_CLASSES = {"attention_mil": AttentionMILClassifier, "transformer_mil": TransformerMILClassifier}


# --------------------------------------------------------------------------------------------------
# predictions of each arm on one split
# --------------------------------------------------------------------------------------------------
@dataclass
class ArmPredictions:
    """One arm's predictions on the test side of one split: ``key`` names the arm (aggregator, or arm and
    evaluation, and level), ``groups`` / ``unit`` what its bootstrap resamples, ``extra`` constant columns
    (slide counts, the probe's C ...).

    Parameters
    ----------
    key : dict
        The arm's identifying columns, e.g. ``{"aggregator": ..., "paper_name": ..., "level": ...}`` or
        ``{"arm": ..., "evaluation": ..., "level": ...}``.
    labels : ndarray of int, shape (n,)
        True class of each evaluated unit (tile or slide).
    predictions : ndarray of int, shape (n,)
        Predicted class of each unit.
    confidence : ndarray of float, shape (n,)
        Confidence of each prediction, in [0, 1].
    groups : ndarray of shape (n,) or None
        Bootstrap cluster of each unit (slide or patient); None resamples the units themselves.
    unit : str
        What the bootstrap resamples, for the ``ci_unit`` column (``"slide"``, ``"patient"``).
    n_classes : int
        K.
    extra : dict
        Constant columns added to the arm's row.
    """

    key: dict[str, Any]
    labels: np.ndarray
    predictions: np.ndarray
    confidence: np.ndarray
    groups: np.ndarray | None
    unit: str
    n_classes: int
    extra: dict[str, Any] = field(default_factory=dict)


def _fit_probe(X, y, groups, n_classes, C=None, random_state=0):
    if C is not None:
        return LogisticProbe(C=float(C), max_iter=10000, tol=1e-6, n_classes=n_classes).fit(X, y)
    probe = LogisticCVProbe(max_iter=10000, tol=1e-6, random_state=random_state, n_classes=n_classes)
    return probe.fit(X, y, groups=groups)


def _probe_C(probe, probe_C) -> float:
    return float(getattr(probe, "C_", probe_C if probe_C is not None else np.nan))


def _neural(name: str, params: Mapping[str, Mapping[str, Any]] | None, random_state: int) -> _BagClassifier:
    settings = dict((params or {}).get(NEURAL_AGGREGATORS[name]) or {})
    settings.setdefault("random_state", random_state)
    return _NEURAL_CLASSES[name](**settings)


def slide_aggregation_predictions(X_train: Any, y_train: Any, slides_train: Any, X_test: Any, y_test: Any,
                                  slides_test: Any, *, n_classes: int, groups_train: Any = None,
                                  slide_groups_test: Any = None, probe_C: float | None = None,
                                  aggregators: Sequence[str] = AGGREGATORS,
                                  neural_params: Mapping[str, Mapping[str, Any]] | None = None,
                                  random_state: int = 0) -> list[ArmPredictions]:
    """The ``tile_level`` row (the tile probe on the test tiles, resampled by slide) and one entry per
    aggregator, on one split; see :func:`slide_aggregation`.

    Parameters
    ----------
    X_train : array-like of shape (n_train_tiles, D)
        Frozen tile embeddings of the training slides.
    y_train : array-like of shape (n_train_tiles,)
        Class index of each training tile (its slide's label: every tile of a slide carries it).
    slides_train : array-like of shape (n_train_tiles,)
        Slide id of each training tile.
    X_test : array-like of shape (n_test_tiles, D)
        Tile embeddings of the test slides.
    y_test : array-like of shape (n_test_tiles,)
        Class index of each test tile (its slide's label).
    slides_test : array-like of shape (n_test_tiles,)
        Slide id of each test tile; no slide may be on both sides.
    n_classes : int
        K, the number of classes (keyword-only).
    groups_train : array-like of shape (n_train_tiles,), optional
        Group (patient) of each training tile for the probe's group-disjoint CV folds; default the slides.
    slide_groups_test : array-like of shape (n_test_tiles,), optional
        Patient of each test tile; the slide-level bootstrap then resamples patients instead of slides.
    probe_C : float, optional
        Inverse L2 strength of every logistic probe; None selects C by group-disjoint cross-validation
        (:class:`fmaudit.probes.LogisticCVProbe`).
    aggregators : sequence of str, default AGGREGATORS
        Which of :data:`AGGREGATORS` to run.
    neural_params : Mapping, optional
        ``{"mil": {...}, "transformer": {...}}``: constructor keywords of :class:`AttentionMILClassifier` and
        :class:`TransformerMILClassifier` (the config's settings).
    random_state : int, default 0
        Seed of the probes' CV folds and of the neural aggregators (unless their settings give one).

    Returns
    -------
    list of ArmPredictions
        ``tile_level`` first, then the aggregators in the order given.

    Raises
    ------
    FmauditInputError
        On an unknown aggregator, a slide on both sides of the split, or tiles of a slide with different labels.
    """
    unknown = [a for a in aggregators if a not in AGGREGATORS]
    if unknown:
        raise FmauditInputError(f"unknown aggregator(s) {unknown}; known: {list(AGGREGATORS)}")
    X_train, X_test = np.asarray(X_train, np.float64), np.asarray(X_test, np.float64)
    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    ids_tr, idx_tr, lab_tr = make_bags(slides_train, y_train)
    ids_te, idx_te, lab_te = make_bags(slides_test, y_test)
    both = set(ids_tr.tolist()) & set(ids_te.tolist())
    if both:
        raise FmauditInputError(f"slide {sorted(both)[0]!r} has tiles on both sides of the split")
    k = int(n_classes)
    groups_train = np.asarray(slides_train) if groups_train is None else np.asarray(groups_train)
    probe = _fit_probe(X_train, y_train, groups_train, k, probe_C, random_state)
    probs = probe.predict_proba(X_test)
    tile_pred, tile_conf = probs.argmax(axis=1), probs.max(axis=1)
    bag_groups = None
    if slide_groups_test is not None:
        sg = np.asarray(slide_groups_test)
        bag_groups = np.array([sg[i[0]] for i in idx_te])
    unit = "patient" if bag_groups is not None else "slide"
    extra = {"n_train_slides": len(ids_tr), "n_test_slides": len(ids_te), "probe_C": _probe_C(probe, probe_C)}
    out = [ArmPredictions({"aggregator": "tile_level", "paper_name": PAPER_NAMES["tile_level"], "level": "tile"},
                          y_test, tile_pred, tile_conf, np.asarray(slides_test), "slide", k, extra)]
    for name in aggregators:
        slide_C = np.nan
        if name == "majority_vote":
            pred, conf = majority_vote(tile_pred, idx_te, k)
        elif name == "mean_probability":
            p = mean_probability(probs, idx_te)
            pred, conf = p.argmax(axis=1), p.max(axis=1)
        elif name in ("mean_embedding", "max_embedding"):
            how = "mean" if name == "mean_embedding" else "max"
            slide_probe = _fit_probe(pool_bags(X_train, idx_tr, how), lab_tr, None, k, probe_C, random_state)
            p = slide_probe.predict_proba(pool_bags(X_test, idx_te, how))
            pred, conf = p.argmax(axis=1), p.max(axis=1)
            slide_C = _probe_C(slide_probe, probe_C)
        else:
            model = _neural(name, neural_params, random_state)
            p = model.fit(X_train, idx_tr, lab_tr, k).predict_proba(X_test, idx_te)
            pred, conf = p.argmax(axis=1), p.max(axis=1)
        out.append(ArmPredictions({"aggregator": name, "paper_name": PAPER_NAMES[name], "level": "slide"},
                                  lab_te, pred, conf, bag_groups, unit, k, {**extra, "slide_probe_C": slide_C}))
    return out


def label_coarsening_predictions(X: Any, labels: Any, slides: Any, groups: Any, is_test: Any, *, n_classes: int,
                                 probe_C: float | None = None,
                                 neural_params: Mapping[str, Mapping[str, Any]] | None = None,
                                 random_state: int = 0) -> list[ArmPredictions]:
    """The four arms of :func:`label_coarsening` on one split.

    Parameters
    ----------
    X : array-like of shape (n_tiles, D)
        Tile embeddings, training and test tiles together.
    labels : array-like of shape (n_tiles,)
        Region-level class index (grade) of each tile; larger is more severe.
    slides : array-like of shape (n_tiles,)
        Slide id of each tile; no slide may be on both sides.
    groups : array-like of shape (n_tiles,)
        Patient of each tile (CV folds and bootstrap clusters).
    is_test : array-like of bool, shape (n_tiles,)
        True for the test tiles; both sides must be non-empty.
    n_classes : int
        K, the number of grades (keyword-only).
    probe_C : float, optional
        Inverse L2 strength of the probes; None selects it by group-disjoint cross-validation.
    neural_params : Mapping, optional
        ``{"mil": {...}}``: constructor keywords of the :class:`AttentionMILClassifier` arm.
    random_state : int, default 0
        Seed of the probes' CV folds and of the MIL model.

    Returns
    -------
    list of ArmPredictions
        ``patch``/patch_labels, ``slide``/slide_labels, ``slide``/patch_labels, ``slide_mil``/slide_labels.

    Raises
    ------
    FmauditInputError
        On inputs of different lengths, an empty side, or a slide on both sides.
    """
    X = np.asarray(X, np.float64)
    y = np.asarray(labels).astype(np.int64)
    s = np.asarray(slides)
    g = np.asarray(groups)
    test = np.asarray(is_test, dtype=bool)
    if not (X.shape[0] == y.size == s.size == g.size == test.size):
        raise FmauditInputError("label_coarsening: features, labels, slides, groups and is_test differ in length")
    if not test.any() or test.all():
        raise FmauditInputError("label_coarsening: need tiles on both sides of the split (is_test)")
    leaky = set(s[test].tolist()) & set(s[~test].tolist())
    if leaky:
        raise FmauditInputError(f"slide {sorted(leaky)[0]!r} has tiles on both sides of the split")
    coarse = coarsen_to_slide(y, s)
    k = int(n_classes)
    tr, te = ~test, test
    extra = {"relabelled_share": float((coarse != y).mean())}
    out = []
    probe = _fit_probe(X[tr], y[tr], g[tr], k, probe_C, random_state)
    p = probe.predict_proba(X[te])
    out.append(ArmPredictions({"arm": "patch", "evaluation": "patch_labels", "level": "tile"}, y[te], p.argmax(1),
                              p.max(1), g[te], "patient", k, {**extra, "probe_C": _probe_C(probe, probe_C)}))
    probe = _fit_probe(X[tr], coarse[tr], g[tr], k, probe_C, random_state)
    p = probe.predict_proba(X[te])
    for evaluation, target in (("slide_labels", coarse[te]), ("patch_labels", y[te])):
        out.append(ArmPredictions({"arm": "slide", "evaluation": evaluation, "level": "tile"}, target, p.argmax(1),
                                  p.max(1), g[te], "patient", k, {**extra, "probe_C": _probe_C(probe, probe_C)}))
    _, idx_tr, bag_tr = make_bags(s[tr], coarse[tr])
    _, idx_te, bag_te = make_bags(s[te], coarse[te])
    model = _neural("attention_mil", neural_params, random_state)
    p = model.fit(X[tr], idx_tr, bag_tr, k).predict_proba(X[te], idx_te)
    bag_groups = np.array([g[te][i[0]] for i in idx_te])
    out.append(ArmPredictions({"arm": "slide_mil", "evaluation": "slide_labels", "level": "slide"}, bag_te,
                              p.argmax(1), p.max(1), bag_groups, "patient", k, {**extra, "probe_C": np.nan}))
    return out


def without_classes_predictions(X_train: Any, y_train: Any, groups_train: Any, X_test: Any, y_test: Any,
                                groups_test: Any, *, class_names: Sequence[str], removed: Sequence[str] = ("NC",),
                                probe_C: float | None = None, random_state: int = 0) -> ArmPredictions:
    """The one arm of :func:`without_classes` on one split.

    Parameters
    ----------
    X_train : array-like of shape (n_train, D)
        Training tile embeddings.
    y_train : array-like of shape (n_train,)
        Training class indices, into ``class_names``.
    groups_train : array-like of shape (n_train,)
        Patient of each training tile (group-disjoint CV folds).
    X_test : array-like of shape (n_test, D)
        Test tile embeddings.
    y_test : array-like of shape (n_test,)
        Test class indices, into ``class_names``.
    groups_test : array-like of shape (n_test,)
        Patient of each test tile (the bootstrap's unit).
    class_names : sequence of str
        Name of each class index (keyword-only).
    removed : sequence of str, default ("NC",)
        Names of the classes dropped from both splits.
    probe_C : float, optional
        Inverse L2 strength of the probe; None selects it by group-disjoint cross-validation.
    random_state : int, default 0
        Seed of the probe's CV folds.

    Returns
    -------
    ArmPredictions
        Key ``arm="without <removed>"``; the remaining classes renumbered in order.
    """
    tr = hold_out_classes(y_train, class_names, removed, condition="without " + "+".join(removed))
    te = hold_out_classes(y_test, class_names, removed)
    Xtr, Xte = np.asarray(X_train, np.float64)[tr.keep], np.asarray(X_test, np.float64)[te.keep]
    gtr, gte = np.asarray(groups_train)[tr.keep], np.asarray(groups_test)
    k = len(tr.class_names)
    probe = _fit_probe(Xtr, tr.labels[tr.keep], gtr, k, probe_C, random_state)
    p = probe.predict_proba(Xte)
    removed_groups = np.r_[np.asarray(groups_train)[tr.held_out], gte[te.held_out]]
    extra = {"removed": "+".join(removed), "n_train": int(tr.keep.sum()), "n_test": int(te.keep.sum()),
             "removed_patients": int(np.unique(removed_groups).size),
             "removed_test_patients": int(np.unique(gte[te.held_out]).size), "probe_C": _probe_C(probe, probe_C)}
    return ArmPredictions({"arm": f"without {extra['removed']}", "evaluation": "patch_labels", "level": "tile"},
                          te.labels[te.keep], p.argmax(1), p.max(1), gte[te.keep], "patient", k, extra)


# --------------------------------------------------------------------------------------------------
# summaries: one split, or several pooled
# --------------------------------------------------------------------------------------------------
def summarize_predictions(arms: Sequence[ArmPredictions], *, ordinal: bool = True,
                          coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int, bootstrap_seed: int = 0,
                          n_bins: int = DEFAULT_N_BINS) -> pd.DataFrame:
    """One row per arm of one split: its key, the :func:`prediction_summary` metrics (intervals with
    ``n_boot > 0``) and its constant columns.

    Parameters
    ----------
    arms : sequence of ArmPredictions
        The arms of one split.
    ordinal : bool, default True
        Whether the classes are ordered grades (adds QWK).
    coverages : sequence of float, default DEFAULT_COVERAGES
        Coverages of the ``selective_accuracy_c<c>`` columns, in (0, 1].
    n_boot : int
        Bootstrap resamples per split for the intervals; 0 gives none (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    bootstrap_seed : int, default 0
        Seed of the bootstrap.
    n_bins : int, default 15
        Equal-width bins of the ECE.

    Returns
    -------
    DataFrame
        One row per arm, in order: the key columns, the summary (``n``, ``accuracy``, ... and with intervals
        ``<metric>_ci_lo``/``_ci_hi``, ``ci_unit``, ``ci_n_units``, ``n_boot``), then ``extra``.
    """
    rows = []
    for a in arms:
        summary = prediction_summary(a.labels, a.predictions, a.confidence, a.n_classes, ordinal=ordinal,
                                     coverages=coverages, n_bins=n_bins, groups=a.groups, n_boot=n_boot,
                                     random_state=bootstrap_seed, unit=a.unit)
        rows.append({**a.key, **summary, **a.extra})
    return pd.DataFrame(rows)


def summarize_splits(splits: Mapping[int, Sequence[ArmPredictions]], *, ordinal: bool = True,
                     coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int, bootstrap_seed: int = 0,
                     n_bins: int = DEFAULT_N_BINS, alpha: float = 0.05,
                     median_columns: Sequence[str] = ("probe_C", "slide_probe_C")) -> pd.DataFrame:
    """The audit paper's summary of the same arms over several train/test splits (``splits``: split seed -> the arms
    on that split): per arm, each metric's mean over the splits and its spread (``_sd_over_splits``), and with
    ``n_boot > 0`` the percentile interval of the bootstrap draws pooled over the splits (``n_boot`` resamples
    within each split, seeded ``bootstrap_seed + split seed``). Constant columns are averaged over the splits
    where numeric, the selected C's (``median_columns``) take their median, as the audit paper reports C;
    ``split_seeds`` lists the splits.

    Parameters
    ----------
    splits : Mapping of int to sequence of ArmPredictions
        Split seed to the arms on that split (the same arms, by key, on every split).
    ordinal : bool, default True
        Whether the classes are ordered grades (adds QWK).
    coverages : sequence of float, default DEFAULT_COVERAGES
        Coverages of the ``selective_accuracy_c<c>`` columns, in (0, 1].
    n_boot : int
        Bootstrap resamples per split for the intervals; 0 gives none (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    bootstrap_seed : int, default 0
        Seed of the bootstrap.
    n_bins : int, default 15
        Equal-width bins of the ECE.
    alpha : float, default 0.05
        1 - the intervals' coverage.
    median_columns : sequence of str, default ("probe_C", "slide_probe_C")
        Constant columns summarised by their median over the splits instead of the mean.

    Returns
    -------
    DataFrame
        One row per arm, in first-seen order: key columns, :func:`fmaudit.ood.selective.pooled_summary` (``n``,
        ``n_splits``, each metric's mean, ``<metric>_sd_over_splits``, the pooled intervals), the constant columns,
        ``split_seeds``.

    Raises
    ------
    FmauditInputError
        When ``splits`` is empty.
    """
    if not splits:
        raise FmauditInputError("summarize_splits: no splits")
    by_arm: dict[tuple, list[tuple[int, ArmPredictions]]] = {}
    for seed, arms in splits.items():
        for a in arms:
            by_arm.setdefault(tuple(sorted(a.key.items())), []).append((int(seed), a))
    rows = []
    for parts in by_arm.values():
        draws = [prediction_draws(a.labels, a.predictions, a.confidence, a.n_classes, ordinal=ordinal,
                                  coverages=coverages, n_bins=n_bins, groups=a.groups, n_boot=n_boot,
                                  random_state=int(bootstrap_seed) + seed, unit=a.unit) for seed, a in parts]
        row: dict[str, Any] = {**dict(parts[0][1].key), **pooled_summary(draws, alpha)}
        for name, value in parts[0][1].extra.items():
            values = [a.extra.get(name) for _, a in parts]
            numeric = all(isinstance(v, (int, float, np.integer, np.floating)) for v in values)
            if numeric:
                arr = np.asarray(values, dtype=np.float64)
                middle = np.nanmedian if name in median_columns else np.nanmean
                row[name] = float(middle(arr)) if np.isfinite(arr).any() else float("nan")
            else:
                row[name] = value
        row["split_seeds"] = ",".join(str(seed) for seed, _ in parts)
        rows.append(row)
    order = list(dict.fromkeys(k for arms in splits.values() for k in (tuple(sorted(a.key.items())) for a in arms)))
    return pd.DataFrame(rows).assign(_o=[order.index(k) for k in by_arm]).sort_values("_o").drop(columns="_o") \
        .reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# the tables of one split
# --------------------------------------------------------------------------------------------------
def slide_aggregation(X_train: Any, y_train: Any, slides_train: Any, X_test: Any, y_test: Any, slides_test: Any, *,
                      n_classes: int, ordinal: bool = True, groups_train: Any = None, slide_groups_test: Any = None,
                      probe_C: float | None = None, aggregators: Sequence[str] = AGGREGATORS,
                      neural_params: Mapping[str, Mapping[str, Any]] | None = None,
                      coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int, bootstrap_seed: int = 0,
                      random_state: int = 0, n_bins: int = DEFAULT_N_BINS) -> pd.DataFrame:
    """Slide-level grading from tile embeddings (the audit paper's ``slide_aggregation``) on one train/test split.

    Every tile of a slide carries the slide's label. ``groups_train`` (default: the training slides) keep the
    probe's CV folds group-disjoint; ``slide_groups_test`` (per test tile: its patient) makes the slide-level
    bootstrap resample patients instead of slides. ``neural_params``: ``{"mil": {...}, "transformer": {...}}``,
    the settings of the two neural aggregators. Returns one row per aggregator plus a ``tile_level`` row (the
    tile probe on the test tiles, unit tile, resampled by slide): aggregator, paper_name, level, the
    :func:`prediction_summary` metrics (with intervals when ``n_boot > 0``), n_train_slides, n_test_slides,
    probe_C (the tile probe's) and slide_probe_C (the pooled-embedding probes').

    Parameters
    ----------
    X_train : array-like of shape (n_train_tiles, D)
        Frozen tile embeddings of the training slides.
    y_train : array-like of shape (n_train_tiles,)
        Class index of each training tile (its slide's label: every tile of a slide carries it).
    slides_train : array-like of shape (n_train_tiles,)
        Slide id of each training tile.
    X_test : array-like of shape (n_test_tiles, D)
        Tile embeddings of the test slides.
    y_test : array-like of shape (n_test_tiles,)
        Class index of each test tile (its slide's label).
    slides_test : array-like of shape (n_test_tiles,)
        Slide id of each test tile; no slide may be on both sides.
    n_classes : int
        K, the number of classes (keyword-only).
    ordinal : bool, default True
        Whether the classes are ordered grades (adds QWK).
    groups_train : array-like of shape (n_train_tiles,), optional
        Group (patient) of each training tile for the probe's group-disjoint CV folds; default the slides.
    slide_groups_test : array-like of shape (n_test_tiles,), optional
        Patient of each test tile; the slide-level bootstrap then resamples patients instead of slides.
    probe_C : float, optional
        Inverse L2 strength of every logistic probe; None selects C by group-disjoint cross-validation
        (:class:`fmaudit.probes.LogisticCVProbe`).
    aggregators : sequence of str, default AGGREGATORS
        Which of :data:`AGGREGATORS` to run.
    neural_params : Mapping, optional
        ``{"mil": {...}, "transformer": {...}}``: constructor keywords of :class:`AttentionMILClassifier` and
        :class:`TransformerMILClassifier` (the config's settings).
    random_state : int, default 0
        Seed of the probes' CV folds and of the neural aggregators (unless their settings give one).
    coverages : sequence of float, default DEFAULT_COVERAGES
        Coverages of the ``selective_accuracy_c<c>`` columns, in (0, 1].
    n_boot : int
        Bootstrap resamples per split for the intervals; 0 gives none (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    bootstrap_seed : int, default 0
        Seed of the bootstrap.
    n_bins : int, default 15
        Equal-width bins of the ECE.

    Returns
    -------
    DataFrame

    Raises
    ------
    FmauditInputError
        As :func:`slide_aggregation_predictions`.
    """
    arms = slide_aggregation_predictions(X_train, y_train, slides_train, X_test, y_test, slides_test,
                                         n_classes=n_classes, groups_train=groups_train,
                                         slide_groups_test=slide_groups_test, probe_C=probe_C,
                                         aggregators=aggregators, neural_params=neural_params,
                                         random_state=random_state)
    return summarize_predictions(arms, ordinal=ordinal, coverages=coverages, n_boot=n_boot,
                                 bootstrap_seed=bootstrap_seed, n_bins=n_bins)


def label_coarsening(X: Any, labels: Any, slides: Any, groups: Any, is_test: Any, *, n_classes: int,
                     ordinal: bool = True, probe_C: float | None = None,
                     neural_params: Mapping[str, Mapping[str, Any]] | None = None,
                     coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int, bootstrap_seed: int = 0,
                     random_state: int = 0, n_bins: int = DEFAULT_N_BINS) -> pd.DataFrame:
    """The audit paper's SICAPv2 control: the probe under region-level tile labels and under labels coarsened to
    the slide (the most severe grade among all the slide's tiles, train and test together).

    Arms (rows): ``patch`` / patch_labels, ``slide`` / slide_labels, ``slide`` / patch_labels (the
    coarse-label probe scored against region labels), ``slide_mil`` / slide_labels (attention MIL on slide
    bags, ``neural_params["mil"]``). Columns: arm, evaluation, level, the metrics, relabelled_share (tiles
    whose label changed), probe_C. ``groups`` (patients) keep the CV folds and the bootstrap clustered.

    Parameters
    ----------
    X : array-like of shape (n_tiles, D)
        Tile embeddings, training and test tiles together.
    labels : array-like of shape (n_tiles,)
        Region-level class index (grade) of each tile; larger is more severe.
    slides : array-like of shape (n_tiles,)
        Slide id of each tile; no slide may be on both sides.
    groups : array-like of shape (n_tiles,)
        Patient of each tile (CV folds and bootstrap clusters).
    is_test : array-like of bool, shape (n_tiles,)
        True for the test tiles; both sides must be non-empty.
    n_classes : int
        K, the number of grades (keyword-only).
    probe_C : float, optional
        Inverse L2 strength of the probes; None selects it by group-disjoint cross-validation.
    neural_params : Mapping, optional
        ``{"mil": {...}}``: constructor keywords of the :class:`AttentionMILClassifier` arm.
    random_state : int, default 0
        Seed of the probes' CV folds and of the MIL model.
    ordinal : bool, default True
        Whether the classes are ordered grades (adds QWK).
    coverages : sequence of float, default DEFAULT_COVERAGES
        Coverages of the ``selective_accuracy_c<c>`` columns, in (0, 1].
    n_boot : int
        Bootstrap resamples per split for the intervals; 0 gives none (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    bootstrap_seed : int, default 0
        Seed of the bootstrap.
    n_bins : int, default 15
        Equal-width bins of the ECE.

    Returns
    -------
    DataFrame
        Four rows, the arms above.

    Raises
    ------
    FmauditInputError
        As :func:`label_coarsening_predictions`.
    """
    arms = label_coarsening_predictions(X, labels, slides, groups, is_test, n_classes=n_classes, probe_C=probe_C,
                                        neural_params=neural_params, random_state=random_state)
    return summarize_predictions(arms, ordinal=ordinal, coverages=coverages, n_boot=n_boot,
                                 bootstrap_seed=bootstrap_seed, n_bins=n_bins)


def without_classes(X_train: Any, y_train: Any, groups_train: Any, X_test: Any, y_test: Any, groups_test: Any, *,
                    class_names: Sequence[str], removed: Sequence[str] = ("NC",), ordinal: bool = True,
                    probe_C: float | None = None, coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int,
                    bootstrap_seed: int = 0, random_state: int = 0, n_bins: int = DEFAULT_N_BINS) -> dict[str, Any]:
    """The task with ``removed`` classes dropped from both splits (audit paper: SICAPv2 without its benign class
    NC); the probe is refitted on the remaining classes (renumbered in order). Returns the
    :func:`prediction_summary` of the remaining test tiles plus n_train, n_test, removed, and the number of
    patients contributing removed-class tiles in all and in the test split.

    Parameters
    ----------
    X_train : array-like of shape (n_train, D)
        Training tile embeddings.
    y_train : array-like of shape (n_train,)
        Training class indices, into ``class_names``.
    groups_train : array-like of shape (n_train,)
        Patient of each training tile (group-disjoint CV folds).
    X_test : array-like of shape (n_test, D)
        Test tile embeddings.
    y_test : array-like of shape (n_test,)
        Test class indices, into ``class_names``.
    groups_test : array-like of shape (n_test,)
        Patient of each test tile (the bootstrap's unit).
    class_names : sequence of str
        Name of each class index (keyword-only).
    removed : sequence of str, default ("NC",)
        Names of the classes dropped from both splits.
    probe_C : float, optional
        Inverse L2 strength of the probe; None selects it by group-disjoint cross-validation.
    random_state : int, default 0
        Seed of the probe's CV folds.
    ordinal : bool, default True
        Whether the classes are ordered grades (adds QWK).
    coverages : sequence of float, default DEFAULT_COVERAGES
        Coverages of the ``selective_accuracy_c<c>`` columns, in (0, 1].
    n_boot : int
        Bootstrap resamples per split for the intervals; 0 gives none (keyword-only, no default: the schema's
        ``bootstrap.n_boot``).
    bootstrap_seed : int, default 0
        Seed of the bootstrap.
    n_bins : int, default 15
        Equal-width bins of the ECE.

    Returns
    -------
    dict
        The summary's keys (as :func:`summarize_predictions`' row) with ``arm``, ``evaluation``, ``level``,
        ``removed``, ``n_train``, ``n_test``, ``removed_patients``, ``removed_test_patients`` and ``probe_C``.
    """
    arm = without_classes_predictions(X_train, y_train, groups_train, X_test, y_test, groups_test,
                                      class_names=class_names, removed=removed, probe_C=probe_C,
                                      random_state=random_state)
    return summarize_predictions([arm], ordinal=ordinal, coverages=coverages, n_boot=n_boot,
                                 bootstrap_seed=bootstrap_seed, n_bins=n_bins).iloc[0].to_dict()

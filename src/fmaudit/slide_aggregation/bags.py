"""Bags of tiles: one slide's tile positions, the per-slide vote and means, and labels coarsened to the slide
(see :mod:`fmaudit.slide_aggregation`)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError


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

"""Readouts: how a backbone's outputs become the feature vectors an audit compares.

Conventions (``Encoder.forward`` returns ``{readout: tensor}``):

- ``cls``: the class token of the last layer after the final norm.
- ``mean``: the mean of the patch tokens after the final norm, class and register tokens excluded
  (``num_prefix_tokens``); for convnets the mean of the last feature map.
- ``cls_mean``: ``concat([cls, mean], dim=1)`` (Virchow2's and Midnight's tile embedding).
- ``pooled``: the model's own pooled output (timm ``forward_head(pre_logits=True)``, transformers
  ``pooler_output``, and for CLIP models the projected image embedding).
- ``patch_grid``: patch tokens as a ``(B, D, H/p, W/p)`` grid (the last feature map for convnets).

For CLIP-type models (open_clip and transformers ``CLIPModel``) tokens are taken after the vision tower's
post-layernorm, so ``cls`` is the pre-projection image embedding.

A backbone adapter (:mod:`fmaudit.encoders.builders`) returns ``{"tokens": (B, N, D) | None, "feature_map":
(B, C, H, W) | None, "pooled": (B, P) | None}``; :func:`compute_readouts` turns that into readouts.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from fmaudit.io import FmauditInputError

READOUTS = ("cls", "mean", "cls_mean", "pooled", "patch_grid")
#: Readouts computed from tokens or a feature map (not from the model's pooled output).
TOKEN_READOUTS = frozenset({"cls", "mean", "cls_mean", "patch_grid"})

__all__ = ["READOUTS", "TOKEN_READOUTS", "check_readouts", "compute_readouts", "patch_grid"]


def check_readouts(readouts: Sequence[str], encoder: str) -> list[str]:
    """``readouts`` as a list; raise naming the encoder and the unknown ones.

    Parameters
    ----------
    readouts : sequence of str
        Readout names, each one of :data:`READOUTS`.
    encoder : str
        The encoder's slug, for the message.

    Returns
    -------
    list of str

    Raises
    ------
    FmauditInputError
        Naming the unknown readouts and the known ones.
    """
    bad = [r for r in readouts if r not in READOUTS]
    if bad:
        raise FmauditInputError(f"encoder {encoder!r}: unknown readout(s) {bad}; known {list(READOUTS)}")
    return list(readouts)


def patch_grid(tokens: torch.Tensor, num_prefix_tokens: int, patch_size: int | None, image_hw: tuple[int, int],
               encoder: str) -> torch.Tensor:
    """Patch tokens (prefix tokens dropped) as a ``(B, D, H/p, W/p)`` grid of an image of ``image_hw`` pixels.

    Parameters
    ----------
    tokens : Tensor of shape (B, N, D)
        Tokens of the last layer, prefix (class, register) tokens first.
    num_prefix_tokens : int
        How many leading tokens are not patch tokens.
    patch_size : int or None
        Patch side p in pixels (None: 1).
    image_hw : tuple of (int, int)
        Height and width of the input images in pixels.
    encoder : str
        The encoder's slug, for the message.

    Returns
    -------
    Tensor of shape (B, D, H/p, W/p)

    Raises
    ------
    FmauditInputError
        When the patch tokens do not form that grid.
    """
    patch = tokens[:, num_prefix_tokens:]
    b, n, d = patch.shape
    p = patch_size or 1
    h, w = image_hw[0] // p, image_hw[1] // p
    if h * w != n:
        raise FmauditInputError(
            f"encoder {encoder!r}: {n} patch tokens do not form a {h}x{w} grid (patch_size {patch_size})")
    return patch.transpose(1, 2).reshape(b, d, h, w)


def compute_readouts(feats: Mapping[str, torch.Tensor | None], readouts: Sequence[str], num_prefix_tokens: int,
                     patch_size: int | None, image_hw: tuple[int, int], encoder: str) -> dict[str, torch.Tensor]:
    """``{readout: tensor}`` from a backbone's outputs (see the module doc for each convention).

    Parameters
    ----------
    feats : Mapping of str to Tensor or None
        A backbone adapter's outputs: ``tokens`` (B, N, D), ``feature_map`` (B, C, H, W), ``pooled`` (B, P), any
        of them None.
    readouts : sequence of str
        Readouts to compute (checked by :func:`check_readouts`).
    num_prefix_tokens : int
        Leading non-patch tokens of ``tokens`` (class token first).
    patch_size : int or None
        Patch side in pixels, for ``patch_grid``.
    image_hw : tuple of (int, int)
        Input image height and width in pixels, for ``patch_grid``.
    encoder : str
        The encoder's slug, for messages.

    Returns
    -------
    dict of str to Tensor
        Readout -> ``(B, D)`` tensor (``patch_grid``: ``(B, D, H/p, W/p)``).

    Raises
    ------
    FmauditInputError
        When a readout needs an output the backbone does not give (a class token, tokens, a pooled output).
    """
    tokens, fmap = feats["tokens"], feats["feature_map"]
    prefix = num_prefix_tokens
    out: dict[str, torch.Tensor] = {}
    for r in readouts:
        if r in ("cls", "cls_mean") and (tokens is None or prefix < 1):
            raise FmauditInputError(f"encoder {encoder!r}: readout {r!r} needs a class token (none here)")
        if r in ("mean", "cls_mean", "patch_grid") and tokens is None and fmap is None:
            raise FmauditInputError(f"encoder {encoder!r}: readout {r!r} needs token features it does not expose")
        if r == "cls":
            out[r] = tokens[:, 0]
        elif r == "mean":
            out[r] = tokens[:, prefix:].mean(dim=1) if tokens is not None else fmap.mean(dim=(2, 3))
        elif r == "cls_mean":
            out[r] = torch.cat([tokens[:, 0], tokens[:, prefix:].mean(dim=1)], dim=1)
        elif r == "pooled":
            if feats["pooled"] is None:
                raise FmauditInputError(f"encoder {encoder!r}: the model has no pooled output")
            out[r] = feats["pooled"]
        elif r == "patch_grid":
            out[r] = patch_grid(tokens, prefix, patch_size, image_hw, encoder) if tokens is not None else fmap
    return out

"""Preprocessing of an encoder entry, timm style: :func:`resolve_data_config` fills the entry's preprocessing
with its defaults, :func:`create_transform` turns it into a PIL -> tensor transform.

The transform is split in two halves so that data-loader workers only decode, resize and crop to uint8
(:func:`create_pixel_transform`) while scaling and normalisation run batched on the model's device
(:class:`NormalizeUint8`); composed they equal torchvision's ``ToTensor`` + ``Normalize`` exactly.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

__all__ = ["ConvertRGB", "NormalizeUint8", "PILToUint8Tensor", "create_pixel_transform", "create_transform",
           "resolve_data_config"]


class ConvertRGB:
    """PIL image to RGB (a class rather than a lambda so DataLoader workers can pickle the transform)."""

    def __call__(self, img):
        return img if img.mode == "RGB" else img.convert("RGB")

    def __repr__(self) -> str:
        return "ConvertRGB()"


def resolve_data_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The entry's preprocessing with defaults filled in (timm's ``resolve_data_config`` counterpart)."""
    pre = spec["preprocessing"]
    size = int(pre["input_size"])
    return {
        "input_size": size,
        "resize_size": int(pre.get("resize_size", size)),
        "crop": pre.get("crop", "center"),
        "interpolation": pre.get("interpolation", "bicubic"),
        "mean": tuple(float(m) for m in pre["mean"]),
        "std": tuple(float(s) for s in pre["std"]),
    }


class PILToUint8Tensor:
    """PIL RGB image -> uint8 tensor (3, H, W), unscaled."""

    def __call__(self, img) -> torch.Tensor:
        import numpy as np

        return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).contiguous()

    def __repr__(self) -> str:
        return "PILToUint8Tensor()"


class NormalizeUint8:
    """uint8 image tensor(s) (..., 3, H, W) -> float32 ``(x / 255 - mean) / std``.

    The same float32 operations, in the same order, as torchvision's ``ToTensor`` then ``Normalize``; applied
    to a whole batch on the model's device it gives the per-image transform's numbers exactly.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32).div(255)
        return x.sub_(self.mean.to(x.device)).div_(self.std.to(x.device))

    def __repr__(self) -> str:
        return f"NormalizeUint8(mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()})"


def create_pixel_transform(data_config: Mapping[str, Any]) -> Callable:
    """PIL image -> resized and cropped uint8 tensor (3, input_size, input_size), not yet normalised.

    ``crop: center`` resizes the shorter side to ``resize_size`` then centre-crops ``input_size``;
    ``crop: none`` resizes straight to ``input_size`` × ``input_size`` (aspect ratio not kept).
    """
    from torchvision import transforms as T

    interp = {"bicubic": T.InterpolationMode.BICUBIC, "bilinear": T.InterpolationMode.BILINEAR}[
        data_config["interpolation"]]
    size = data_config["input_size"]
    steps: list[Any] = [ConvertRGB()]
    if data_config["crop"] == "center":
        steps += [T.Resize(data_config["resize_size"], interpolation=interp), T.CenterCrop(size)]
    else:
        steps += [T.Resize((size, size), interpolation=interp)]
    steps.append(PILToUint8Tensor())
    return T.Compose(steps)


def create_transform(data_config: Mapping[str, Any]) -> Callable:
    """PIL image -> normalised float tensor (3, input_size, input_size): the pixel transform, then
    :class:`NormalizeUint8` (equal to torchvision's ``ToTensor`` + ``Normalize``)."""
    from torchvision import transforms as T

    return T.Compose([create_pixel_transform(data_config), NormalizeUint8(data_config["mean"], data_config["std"])])

"""Preprocessing of an encoder entry, timm style: :func:`resolve_data_config` fills the entry's preprocessing
with its defaults, :func:`create_transform` turns it into a PIL -> tensor transform.

The transform is split in two halves so that data-loader workers only decode, resize and crop to uint8
(:func:`create_pixel_transform`) while scaling and normalisation run batched on the model's device
(:class:`NormalizeUint8`); composed they equal torchvision's ``ToTensor`` + ``Normalize`` exactly. The pixel
half also takes a uint8 tensor (a JPEG decoded by torchvision, pixel for pixel PIL's decode): one already
at its size is only cropped, any other goes through the same PIL resize, so the numbers never depend on the
decoder.

On a GPU the workers can do less: :class:`DecodeOnly` keeps each image at its own size, and
:class:`DevicePreprocess` resizes, crops and normalises whole uint8 batches on the device, straight to the
model's dtype (bfloat16 under autocast). Its resize is torch's (antialiased, the entry's interpolation),
within a few grey levels of PIL's, not equal to it; images already at the input size are not resized and
then match the worker path exactly.

torchvision is imported where a transform is built, not with this module: the jobs that only read
embeddings back (probe, OOD, prior-shift and cell shards, the report) import :mod:`fmaudit.encoders` through
:mod:`fmaudit.embed`, and torchvision's import (1.1-1.4 s of CPU, most of it ``torch._dynamo``) was about a
quarter of each such job's start-up.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

__all__ = ["ConvertRGB", "DecodeOnly", "DevicePreprocess", "NormalizeUint8", "PILToUint8Tensor", "PixelTransform",
           "collate_pixels", "create_pixel_transform", "create_transform", "resolve_data_config"]


class ConvertRGB:
    """PIL image to RGB (a class rather than a lambda so DataLoader workers can pickle the transform)."""

    def __call__(self, img):
        return img if img.mode == "RGB" else img.convert("RGB")

    def __repr__(self) -> str:
        return "ConvertRGB()"


def resolve_data_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The entry's preprocessing with defaults filled in (timm's ``resolve_data_config`` counterpart).

    Parameters
    ----------
    spec : Mapping
        A registry entry; its ``preprocessing`` block (``input_size``, ``mean``, ``std`` required; ``resize_size``,
        ``crop``, ``interpolation`` optional).

    Returns
    -------
    dict of str to Any
        ``input_size`` and ``resize_size`` (pixels; ``resize_size`` defaults to ``input_size``), ``crop``
        (``center`` by default, or ``none``), ``interpolation`` (``bicubic`` by default, or ``bilinear``), ``mean``
        and ``std`` (tuples of three floats, for pixels scaled to [0, 1]).
    """
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
        return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).contiguous()

    def __repr__(self) -> str:
        return "PILToUint8Tensor()"


class NormalizeUint8:
    """uint8 image tensor(s) (..., 3, H, W) -> float32 ``(x / 255 - mean) / std``.

    The same float32 operations, in the same order, as torchvision's ``ToTensor`` then ``Normalize``; applied
    to a whole batch on the model's device it gives the per-image transform's numbers exactly.

    Parameters
    ----------
    mean : sequence of float
        Per-channel mean of pixels scaled to [0, 1].
    std : sequence of float
        Per-channel standard deviation of pixels scaled to [0, 1].
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
    """PIL image or uint8 tensor (3, H, W) -> resized and cropped uint8 tensor (3, input_size, input_size), not
    yet normalised (:class:`PixelTransform`).

    ``crop: center`` resizes the shorter side to ``resize_size`` then centre-crops ``input_size``;
    ``crop: none`` resizes straight to ``input_size`` × ``input_size`` (aspect ratio not kept).

    Parameters
    ----------
    data_config : Mapping
        Preprocessing as :func:`resolve_data_config` gives it.

    Returns
    -------
    PixelTransform
    """
    return PixelTransform(data_config)


_INTERPOLATIONS = ("bicubic", "bilinear")


class PixelTransform:
    """The workers' half of the transform (:func:`create_pixel_transform`): PIL's resize and crop.

    A uint8 tensor input (3, H, W) that needs no resize is centre-cropped as a tensor (the same offsets as
    torchvision's PIL crop, so the same pixels); one that does is resized as a PIL image, so the numbers are
    those of the PIL path whatever decoded the image.

    Parameters
    ----------
    data_config : Mapping
        Preprocessing as :func:`resolve_data_config` gives it.

    Raises
    ------
    ValueError
        For an interpolation other than ``bicubic`` or ``bilinear``.
    """

    def __init__(self, data_config: Mapping[str, Any]):
        from torchvision import transforms as T  # (module doc)

        if data_config["interpolation"] not in _INTERPOLATIONS:
            raise ValueError(f"interpolation {data_config['interpolation']!r}: expected one of {_INTERPOLATIONS}")
        interp = {"bicubic": T.InterpolationMode.BICUBIC, "bilinear": T.InterpolationMode.BILINEAR}[
            data_config["interpolation"]]
        self.size = int(data_config["input_size"])
        self.center = data_config["crop"] == "center"
        self.resize_size = int(data_config["resize_size"])
        # (..., H, W) -> (..., size, size), PIL images and tensors alike; used with crop: center only
        self.center_crop = T.CenterCrop(self.size)
        steps: list[Any] = [ConvertRGB()]
        if self.center:
            steps += [T.Resize(self.resize_size, interpolation=interp), self.center_crop]
        else:
            steps += [T.Resize((self.size, self.size), interpolation=interp)]
        steps.append(PILToUint8Tensor())
        self.pil_steps = T.Compose(steps)

    def needs_resize(self, height: int, width: int) -> bool:
        """Whether an image of this size must be resized (rather than only cropped) to reach the input size.

        Parameters
        ----------
        height, width : int
            The image's size in pixels.

        Returns
        -------
        bool
            With ``crop: center``, whether the shorter side differs from ``resize_size``; with ``crop: none``, whether
            the image is not already ``input_size`` square.
        """
        if self.center:
            return min(height, width) != self.resize_size
        return (height, width) != (self.size, self.size)

    def __call__(self, img) -> torch.Tensor:
        if not isinstance(img, torch.Tensor):
            return self.pil_steps(img)
        if self.needs_resize(*img.shape[-2:]):
            return self.pil_steps(Image.fromarray(img.permute(1, 2, 0).numpy()))
        return (self.center_crop(img) if self.center else img).contiguous()

    def __repr__(self) -> str:
        return f"PixelTransform({self.pil_steps})"


class DecodeOnly:
    """The workers' half when the device resizes: PIL RGB image -> uint8 tensor (3, H, W) at its own size; a
    uint8 tensor passes through."""

    def __call__(self, img) -> torch.Tensor:
        if isinstance(img, torch.Tensor):
            return img.contiguous()
        return PILToUint8Tensor()(ConvertRGB()(img))

    def __repr__(self) -> str:
        return "DecodeOnly()"


def collate_pixels(batch):
    """(indices (B,), uint8 images): one (B, 3, H, W) tensor when every image has the same size, else the
    list of (3, H, W) tensors (:class:`DevicePreprocess` takes either).

    Parameters
    ----------
    batch : sequence of (int, Tensor)
        ``(index, image)`` pairs from the dataset, images uint8 (3, H, W).

    Returns
    -------
    tuple of (Tensor, Tensor or list of Tensor)
        The indices (B,) and the images, stacked when they share a size.
    """
    images = [img for _, img in batch]
    if all(img.shape == images[0].shape for img in images):
        # torch's collate: in a worker it stacks straight into shared memory (no second copy to send it)
        indices, stacked = default_collate(batch)
        return indices, stacked
    return torch.as_tensor([i for i, _ in batch]), images


class DevicePreprocess:
    """uint8 images (B, 3, H, W), or a list of (3, H, W) of mixed sizes, on the model's device -> resized,
    centre-cropped (``crop: center``) and normalised (B, 3, input_size, input_size) in ``dtype``.

    Resizing runs in float32 with torch's antialiased ``interpolate`` in the entry's interpolation (skipped
    for images already at their size: then the result equals :class:`NormalizeUint8` of the worker path's);
    scaling and normalisation are :class:`NormalizeUint8`'s operations; the cast to ``dtype`` comes last.

    Parameters
    ----------
    data_config : Mapping
        Preprocessing as :func:`resolve_data_config` gives it.
    dtype : torch.dtype
        The dtype of the output (the model's: float32, or bfloat16 under autocast).
    """

    def __init__(self, data_config: Mapping[str, Any], dtype: torch.dtype = torch.float32):
        self.pixels = PixelTransform(data_config)
        self.mode = data_config["interpolation"]
        self.normalize = NormalizeUint8(data_config["mean"], data_config["std"])
        self.dtype = dtype

    def _one_size(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) uint8 of one size -> (B, 3, S, S) float32 in [0, 255], resized and cropped."""
        height, width = x.shape[-2:]
        size = self.pixels.size
        if not self.pixels.needs_resize(height, width):
            return (self.pixels.center_crop(x) if self.pixels.center else x).to(torch.float32)
        if self.pixels.center:
            short = self.pixels.resize_size
            # torchvision's rule for the longer side: int(short * long / shorter)
            target = (short, int(short * width / height)) if height <= width else (int(short * height / width), short)
        else:
            target = (size, size)
        x = torch.nn.functional.interpolate(x.to(torch.float32), size=target, mode=self.mode, antialias=True,
                                            align_corners=False)
        x = x.clamp_(0, 255).round_()  # as the uint8 image PIL would return
        return self.pixels.center_crop(x) if self.pixels.center else x

    def __call__(self, images) -> torch.Tensor:
        if isinstance(images, torch.Tensor):
            pixels = self._one_size(images)
        else:
            pixels = torch.cat([self._one_size(img.unsqueeze(0)) for img in images])
        # NormalizeUint8's float32 operations, on pixels already float
        x = pixels.div_(255)
        x = x.sub_(self.normalize.mean.to(x.device)).div_(self.normalize.std.to(x.device))
        return x.to(self.dtype)

    def __repr__(self) -> str:
        return f"DevicePreprocess({self.pixels!r}, {self.normalize!r}, dtype={self.dtype})"


def create_transform(data_config: Mapping[str, Any]) -> Callable:
    """PIL image -> normalised float tensor (3, input_size, input_size): the pixel transform, then
    :class:`NormalizeUint8` (equal to torchvision's ``ToTensor`` + ``Normalize``).

    Parameters
    ----------
    data_config : Mapping
        Preprocessing as :func:`resolve_data_config` gives it.

    Returns
    -------
    callable
        A torchvision ``Compose`` of :class:`PixelTransform` and :class:`NormalizeUint8`.
    """
    from torchvision import transforms as T  # (module doc)

    return T.Compose([create_pixel_transform(data_config), NormalizeUint8(data_config["mean"], data_config["std"])])

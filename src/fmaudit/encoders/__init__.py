"""Frozen encoders from registry entries, split like timm: :mod:`~fmaudit.encoders.transforms` (preprocessing
carried by the entry), :mod:`~fmaudit.encoders.weights` (weight files, the hub, checkpoints, strict state
dicts), :mod:`~fmaudit.encoders.builders` (timm / transformers / open_clip architectures, backbone adapters,
:class:`Encoder`, :func:`build_encoder`) and :mod:`~fmaudit.encoders.readouts` (cls, mean, cls_mean, pooled,
patch_grid). Every public name is re-exported here: ``from fmaudit.encoders import build_encoder``.
"""

from fmaudit.encoders.builders import CTransPathConvStem, Encoder, build_encoder, build_network, check_network, save_weights
from fmaudit.encoders.cache import ENCODER_CACHE, LOADED_MESSAGE, EncoderCache
from fmaudit.encoders.readouts import READOUTS, TOKEN_READOUTS, compute_readouts
from fmaudit.encoders.transforms import (
    ConvertRGB,
    NormalizeUint8,
    PILToUint8Tensor,
    create_pixel_transform,
    create_transform,
    resolve_data_config,
)
from fmaudit.encoders.weights import (
    ResolvedWeights,
    extract_state_dict,
    hub_commit_of,
    hub_download,
    load_state_dict_strict,
    read_checkpoint,
    resolve_weight_files,
    resolve_weights,
)

__all__ = [
    "CTransPathConvStem",
    "ConvertRGB",
    "ENCODER_CACHE",
    "Encoder",
    "EncoderCache",
    "LOADED_MESSAGE",
    "NormalizeUint8",
    "PILToUint8Tensor",
    "READOUTS",
    "ResolvedWeights",
    "TOKEN_READOUTS",
    "build_encoder",
    "build_network",
    "check_network",
    "compute_readouts",
    "create_pixel_transform",
    "create_transform",
    "extract_state_dict",
    "hub_commit_of",
    "hub_download",
    "load_state_dict_strict",
    "read_checkpoint",
    "resolve_data_config",
    "resolve_weight_files",
    "resolve_weights",
    "save_weights",
]

"""Frozen encoders from registry entries, split like timm: :mod:`~fmaudit.encoders.transforms` (preprocessing
carried by the entry), :mod:`~fmaudit.encoders.weights` (weight files, the hub, checkpoints, strict state
dicts), :mod:`~fmaudit.encoders.builders` (timm / transformers / open_clip architectures, backbone adapters,
:class:`Encoder`, :func:`build_encoder`), :mod:`~fmaudit.encoders.readouts` (cls, mean, cls_mean, pooled,
patch_grid), :mod:`~fmaudit.encoders.hub` (encoders named by their hub repo; entries compared with their hub
config) and :mod:`~fmaudit.encoders.checks` (pre-flight checks before any embedding job). Every public name is
re-exported here: ``from fmaudit.encoders import build_encoder``.
"""

from fmaudit.encoders.builders import (
    CTransPathConvStem,
    Encoder,
    build_encoder,
    build_network,
    check_network,
    describe_network,
    network_state,
    save_weights,
)
from fmaudit.encoders.checks import PreflightRecord, check_encoder_before_embedding, local_weight_files
from fmaudit.encoders.hub import (
    HubConfig,
    check_against_hub_config,
    hub_config_mismatches,
    hub_config_of_entry,
    read_hub_config,
    resolve_hub_encoder,
)
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
    cached_hub_file,
    cached_weight_files,
    extract_state_dict,
    hub_commit_of,
    hub_download,
    load_state_dict_strict,
    read_checkpoint,
    read_checkpoint_meta,
    resolve_weight_files,
    resolve_weights,
    state_dict_mismatch,
)

__all__ = [
    "CTransPathConvStem",
    "ConvertRGB",
    "Encoder",
    "HubConfig",
    "NormalizeUint8",
    "PILToUint8Tensor",
    "PreflightRecord",
    "READOUTS",
    "ResolvedWeights",
    "TOKEN_READOUTS",
    "build_encoder",
    "build_network",
    "cached_hub_file",
    "cached_weight_files",
    "check_against_hub_config",
    "check_encoder_before_embedding",
    "check_network",
    "compute_readouts",
    "create_pixel_transform",
    "create_transform",
    "describe_network",
    "extract_state_dict",
    "hub_commit_of",
    "hub_config_mismatches",
    "hub_config_of_entry",
    "hub_download",
    "load_state_dict_strict",
    "local_weight_files",
    "network_state",
    "read_checkpoint",
    "read_checkpoint_meta",
    "read_hub_config",
    "resolve_data_config",
    "resolve_hub_encoder",
    "resolve_weight_files",
    "resolve_weights",
    "save_weights",
    "state_dict_mismatch",
]

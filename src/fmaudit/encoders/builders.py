"""Build a frozen encoder from its registry entry: the architecture by its library (timm, transformers,
open_clip), a backbone adapter that exposes tokens / feature maps / pooled outputs the same way for all three,
weights loaded by :mod:`fmaudit.encoders.weights`, preprocessing by :mod:`fmaudit.encoders.transforms` and
readouts by :mod:`fmaudit.encoders.readouts`. ``trust_remote_code`` is passed to transformers only where the
entry sets it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from fmaudit.encoders.readouts import TOKEN_READOUTS, check_readouts, compute_readouts
from fmaudit.encoders.transforms import NormalizeUint8, create_pixel_transform, create_transform, resolve_data_config
from fmaudit.encoders.weights import (
    ResolvedWeights,
    cached_hub_file,
    checkpoint_format,
    extract_state_dict,
    hub_snapshot,
    load_state_dict_strict,
    read_checkpoint,
    read_checkpoint_meta,
    resolve_weights,
)
from fmaudit.io import FmauditInputError, atomic_path
from fmaudit.registry import check_encoder_usable, get_encoder_spec, readout_dims

__all__ = ["CTransPathConvStem", "Encoder", "build_encoder", "build_network", "check_network", "describe_network",
           "network_state", "save_weights"]


# --------------------------------------------------------------------------------------------------------
# architectures
# --------------------------------------------------------------------------------------------------------

class CTransPathConvStem(nn.Module):
    """CTransPath's convolutional patch embedding (two stride-2 3×3 convs, then 1×1), NHWC out for timm Swin.

    Parameters
    ----------
    img_size : int or tuple of int
        Input image size, square when an int (pixels).
    patch_size : int
        Stride of the whole stem; must be 4 (two stride-2 convolutions).
    in_chans : int
        Input channels (3 for RGB).
    embed_dim : int
        Output width; must be divisible by 8 (the first conv has ``embed_dim / 8`` channels).
    norm_layer : callable, optional
        Normalisation layer class applied to the output (timm passes Swin's); None: identity.
    output_fmt : str
        ``"NHWC"`` (what timm's Swin expects) or ``"NCHW"``.
    **_ignored
        Further keyword arguments timm passes to an embedding layer, ignored.

    Raises
    ------
    ValueError
        When ``patch_size`` is not 4 or ``embed_dim`` is not divisible by 8.
    """

    def __init__(self, img_size=224, patch_size=4, in_chans=3, embed_dim=96, norm_layer=None,
                 output_fmt="NHWC", **_ignored):
        super().__init__()
        if patch_size != 4 or embed_dim % 8:
            raise ValueError("CTransPath's conv stem needs patch_size 4 and embed_dim divisible by 8")
        img = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.img_size = img
        self.patch_size = (patch_size, patch_size)
        self.grid_size = (img[0] // patch_size, img[1] // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.output_fmt = output_fmt
        layers: list[nn.Module] = []
        c_in, c_out = in_chans, embed_dim // 8
        for _ in range(2):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU(inplace=True)]
            c_in, c_out = c_out, c_out * 2
        layers.append(nn.Conv2d(c_in, embed_dim, kernel_size=1))
        self.proj = nn.Sequential(*layers)
        self.norm = norm_layer(embed_dim) if norm_layer else nn.Identity()

    def forward(self, x):
        """Embed a batch of images into a patch grid.

        Parameters
        ----------
        x : Tensor of shape (B, in_chans, H, W)
            Images, normalised.

        Returns
        -------
        Tensor
            ``(B, H/4, W/4, embed_dim)`` in ``NHWC`` (or ``(B, embed_dim, H/4, W/4)`` in ``NCHW``), normalised.
        """
        x = self.proj(x)
        if self.output_fmt == "NHWC":
            x = x.permute(0, 2, 3, 1)
        return self.norm(x)


_EMBED_LAYERS = {"ctranspath_conv_stem": CTransPathConvStem}


def _timm_layer_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Registry YAML names layers by string; map the few timm needs as classes (a closed list, no imports)."""
    import timm.layers

    layers = {"SwiGLUPacked": timm.layers.SwiGLUPacked, "SwiGLU": timm.layers.SwiGLU, "Mlp": timm.layers.Mlp,
              "GluMlp": timm.layers.GluMlp, "SiLU": nn.SiLU, "GELU": nn.GELU, "LayerNorm": nn.LayerNorm}
    out = dict(kwargs)
    for key in ("mlp_layer", "act_layer", "norm_layer"):
        if isinstance(out.get(key), str) and out[key] in layers:
            out[key] = layers[out[key]]
    return out


# Backbones adapt each library's outputs to {tokens (B, N, D) | feature_map (B, C, H, W), pooled (B, P)};
# ``model`` is the whole network the checkpoint is loaded into, ``width`` the token/feature-map width.

class _TimmBackbone(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.num_prefix_tokens = int(getattr(model, "num_prefix_tokens", 0))
        self.width = int(model.num_features)
        self.pooled_width = int(getattr(model, "head_hidden_size", None) or model.num_features)

    def forward(self, x: torch.Tensor, need: set[str]) -> dict[str, torch.Tensor | None]:
        feats = self.model.forward_features(x)
        out: dict[str, torch.Tensor | None] = {"tokens": None, "feature_map": None, "pooled": None}
        if feats.ndim == 3:
            out["tokens"] = feats
        elif feats.ndim == 4:
            nhwc = getattr(self.model, "output_fmt", "NCHW") == "NHWC"
            out["feature_map"] = feats.permute(0, 3, 1, 2) if nhwc else feats
        if "pooled" in need:
            out["pooled"] = self.model.forward_head(feats, pre_logits=True)
        return out


class _TransformersBackbone(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        config = model.config
        self.is_clip = hasattr(model, "vision_model") and hasattr(model, "visual_projection")
        vision = getattr(config, "vision_config", config) if self.is_clip else config
        self.width = int(vision.hidden_size)
        self.num_prefix_tokens = 1 + int(getattr(vision, "num_register_tokens", 0) or 0)
        self.pooled_width = int(config.projection_dim) if self.is_clip else self.width

    def forward(self, x: torch.Tensor, need: set[str]) -> dict[str, torch.Tensor | None]:
        if self.is_clip:
            vision_out = self.model.vision_model(pixel_values=x)
            tokens = self.model.vision_model.post_layernorm(vision_out.last_hidden_state)
            pooled = self.model.visual_projection(tokens[:, 0]) if "pooled" in need else None
            return {"tokens": tokens, "feature_map": None, "pooled": pooled}
        out = self.model(pixel_values=x)
        pooled = getattr(out, "pooler_output", None)
        return {"tokens": out.last_hidden_state, "feature_map": None, "pooled": pooled}


class _OpenClipBackbone(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        from open_clip.transformer import VisionTransformer

        self.model = model
        visual = model.visual
        self.visual = visual
        self.is_vit = isinstance(visual, VisionTransformer)
        self.width = int(visual.transformer.width) if self.is_vit else int(visual.output_dim)
        self.num_prefix_tokens = 1 if self.is_vit else 0
        self.pooled_width = int(visual.output_dim)

    def forward(self, x: torch.Tensor, need: set[str]) -> dict[str, torch.Tensor | None]:
        if not self.is_vit or not (need & TOKEN_READOUTS):
            return {"tokens": None, "feature_map": None, "pooled": self.visual(x)}
        out = self.visual.forward_intermediates(x, indices=1, normalize_intermediates=True,
                                                output_fmt="NLC", output_extra_tokens=True)
        tokens = torch.cat([out["image_intermediates_prefix"][-1], out["image_intermediates"][-1]], dim=1)
        return {"tokens": tokens, "feature_map": None, "pooled": out["image_features"]}


@contextlib.contextmanager
def _seeded(seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _build_timm(spec: Mapping[str, Any]) -> nn.Module:
    import timm

    arch = spec["architecture"]
    kwargs = _timm_layer_kwargs(dict(arch.get("kwargs") or {}))
    if arch.get("embed_layer"):
        kwargs["embed_layer"] = _EMBED_LAYERS[arch["embed_layer"]]
    try:
        return timm.create_model(arch["model_name"], pretrained=False, **kwargs)
    except (RuntimeError, TypeError, ValueError) as e:
        raise FmauditInputError(
            f"encoder {spec.get('name', '?')!r}: timm cannot build {arch['model_name']!r} "
            f"with {arch.get('kwargs')}: {e}"
        ) from e


def _transformers_config(spec: Mapping[str, Any]):
    import transformers

    arch = spec["architecture"]
    name = spec.get("name", "?")
    trust = bool(spec.get("trust_remote_code", False))
    if arch.get("config"):
        cfg = dict(arch["config"])
        return transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    weights = spec["weights"]
    if weights["source"] != "hf_hub":
        raise FmauditInputError(
            f"encoder {name!r}: a transformers encoder with weights.source {weights['source']!r} needs its config "
            f"inline (architecture.config)")
    if trust:  # remote code runs only from a pinned commit, whoever calls the builder
        check_encoder_usable(name, spec)
    else:  # a cached config.json is read where it lies: no request to the hub, online or not
        cached = cached_hub_file(weights["hf_hub_id"], "config.json", weights.get("revision"))
        if cached is not None:
            return transformers.AutoConfig.from_pretrained(str(cached.parent))
    patterns = ["*.json", "*.py"] if trust else ["config.json"]
    folder = hub_snapshot(weights["hf_hub_id"], weights.get("revision"), patterns, name)
    return transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=trust)


def _build_transformers(spec: Mapping[str, Any]) -> nn.Module:
    import transformers

    arch = spec["architecture"]
    name = spec.get("name", "?")
    trust = bool(spec.get("trust_remote_code", False))
    config = _transformers_config(spec)
    kwargs = dict(arch.get("kwargs") or {})
    cls_name = arch["model_class"]
    if cls_name == "AutoModel":
        return transformers.AutoModel.from_config(config, trust_remote_code=trust, **kwargs)
    model_cls = getattr(transformers, cls_name, None)
    if model_cls is None or not isinstance(model_cls, type) or not issubclass(model_cls, nn.Module):
        raise FmauditInputError(f"encoder {name!r}: transformers has no model class {cls_name!r}")
    return model_cls(config, **kwargs)


def _build_open_clip(spec: Mapping[str, Any]) -> nn.Module:
    import copy

    import open_clip
    from open_clip.model import CLIP, CustomTextCLIP

    arch = spec["architecture"]
    name = spec.get("name", "?")
    cfg = copy.deepcopy(arch.get("model_config")) or open_clip.get_model_config(arch["model_name"])
    if cfg is None:
        raise FmauditInputError(
            f"encoder {name!r}: open_clip has no model config {arch['model_name']!r}; give it inline "
            f"(architecture.model_config) or install the package that registers it")
    cfg = dict(cfg)
    # towers are built without their own pretrained weights: the full checkpoint is loaded afterwards
    if "timm_model_name" in cfg.get("vision_cfg", {}):
        cfg["vision_cfg"] = {**cfg["vision_cfg"], "timm_model_pretrained": False}
    custom_text = cfg.pop("custom_text", False) or "hf_model_name" in cfg.get("text_cfg", {})
    if "hf_model_name" in cfg.get("text_cfg", {}):
        cfg["text_cfg"] = {**cfg["text_cfg"], "hf_model_pretrained": False}
    if "multimodal_cfg" in cfg:
        raise FmauditInputError(f"encoder {name!r}: CoCa-style open_clip configs are not supported")
    return (CustomTextCLIP if custom_text else CLIP)(**cfg)


_BUILDERS = {"timm": _build_timm, "transformers": _build_transformers, "open_clip": _build_open_clip}
_BACKBONES: dict[str, Callable[[nn.Module], nn.Module]] = {
    "timm": _TimmBackbone, "transformers": _TransformersBackbone, "open_clip": _OpenClipBackbone}


# --------------------------------------------------------------------------------------------------------
# the encoder
# --------------------------------------------------------------------------------------------------------

class Encoder(nn.Module):
    """A frozen encoder: ``forward(images) -> {readout: (B, D) tensor}`` plus its ``transform``.

    Attributes: ``name``, ``spec`` (the registry entry), ``readouts`` (written by default), ``readout_dims``,
    ``num_prefix_tokens``, ``patch_size``, ``transform`` (PIL RGB -> normalised tensor). The transform is also
    available in two halves, ``pixel_transform`` (PIL -> uint8 tensor, for data-loader workers) and
    ``normalize`` (uint8 batch -> normalised float, on the model's device); composed they are ``transform``.

    Parameters
    ----------
    spec : Mapping
        The encoder's registry entry (``name``, ``readouts``, ``patch_size``, the preprocessing keys of
        :func:`~fmaudit.encoders.transforms.resolve_data_config`).
    backbone : nn.Module
        The loader's backbone adapter around the network (:func:`check_network`), weights already loaded.
    """

    def __init__(self, spec: Mapping[str, Any], backbone: nn.Module):
        super().__init__()
        self.name = spec.get("name", "?")
        self.spec = dict(spec)
        self.backbone = backbone
        data_config = resolve_data_config(spec)
        self.pixel_transform = create_pixel_transform(data_config)
        self.normalize = NormalizeUint8(data_config["mean"], data_config["std"])
        self.transform = create_transform(data_config)
        self.readouts = list(spec["readouts"])
        self.num_prefix_tokens = int(backbone.num_prefix_tokens)
        self.patch_size = spec.get("patch_size")
        self.readout_dims = readout_dims(spec)

    def forward(self, images: torch.Tensor, readouts: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """Readouts of a batch of preprocessed images (B, 3, H, W); conventions in :mod:`fmaudit.encoders.readouts`.

        Parameters
        ----------
        images : Tensor of shape (B, 3, H, W)
            Preprocessed images (:attr:`transform`, or :attr:`normalize` of uint8 pixels), on the encoder's device.
        readouts : sequence of str, optional
            Readouts to compute (of :data:`~fmaudit.encoders.readouts.READOUTS`); None: the entry's ``readouts``.

        Returns
        -------
        dict of str to Tensor
            Readout -> ``(B, D)`` tensor, D the readout's width (:attr:`readout_dims`); ``patch_grid`` is
            ``(B, D, H/p, W/p)``.

        Raises
        ------
        FmauditInputError
            For an unknown readout, or one the backbone's outputs cannot give.
        """
        readouts = check_readouts(readouts or self.readouts, self.name)
        feats = self.backbone(images, set(readouts))
        return compute_readouts(feats, readouts, self.num_prefix_tokens, self.patch_size,
                                (images.shape[-2], images.shape[-1]), self.name)


def build_network(spec: Mapping[str, Any]) -> nn.Module:
    """The entry's network with freshly initialised weights (seeded by ``weights.seed``), no checkpoint loaded.

    Works under ``torch.device("meta")`` for the timm and open_clip loaders, which lets the registry's
    architectures be checked without allocating or downloading anything.

    Parameters
    ----------
    spec : Mapping
        A registry entry with ``loader`` (``timm``, ``transformers``, ``open_clip``), ``architecture`` and
        ``weights``.

    Returns
    -------
    nn.Module
        The library's model, randomly initialised.

    Raises
    ------
    FmauditInputError
        When the library cannot build the architecture as the entry gives it.
    """
    with _seeded(int(spec["weights"].get("seed", 0))):
        return _BUILDERS[spec["loader"]](spec)


def check_network(spec: Mapping[str, Any], model: nn.Module) -> nn.Module:
    """Wrap ``model`` in its loader's backbone adapter after checking the entry's declared sizes against it.

    Parameters
    ----------
    spec : Mapping
        The registry entry (``loader``, ``readouts``, ``embed_dim``, ``pooled_dim``, ``num_prefix_tokens``).
    model : nn.Module
        The network :func:`build_network` built for it.

    Returns
    -------
    nn.Module
        The backbone adapter (outputs ``tokens``, ``feature_map`` and ``pooled`` alike for every library).

    Raises
    ------
    FmauditInputError
        When a declared width or prefix-token count differs from the network's.
    """
    backbone = _BACKBONES[spec["loader"]](model)
    _check_widths(spec, backbone)
    return backbone


def describe_network(spec: Mapping[str, Any], model: nn.Module) -> dict[str, Any]:
    """What a built network (on the meta device is enough) says of itself, in the entry's terms: ``embed_dim``
    (token or feature-map width), ``pooled_dim``, ``num_prefix_tokens``, ``patch_size`` (None without patches),
    ``tokens`` (patch tokens rather than a feature map), ``class_token``, ``global_pool`` (timm's, or None) and
    ``params_m``. Encoders named by their hub repo take their sizes from here.

    Parameters
    ----------
    spec : Mapping
        The registry entry (its ``loader``).
    model : nn.Module
        The network :func:`build_network` built for it.

    Returns
    -------
    dict of str to Any
        The keys above; ``params_m`` is millions of parameters, rounded to 0.1.
    """
    backbone = _BACKBONES[spec["loader"]](model)
    facts: dict[str, Any] = {"embed_dim": backbone.width, "pooled_dim": backbone.pooled_width,
                             "num_prefix_tokens": backbone.num_prefix_tokens, "global_pool": None,
                             "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1)}
    if spec["loader"] == "timm":
        tokens = hasattr(model, "num_prefix_tokens")
        patch = getattr(getattr(model, "patch_embed", None), "patch_size", None) if tokens else None
        facts.update(tokens=tokens, class_token=getattr(model, "cls_token", None) is not None,
                     patch_size=int(patch[0]) if patch else None, global_pool=getattr(model, "global_pool", None))
    elif spec["loader"] == "transformers":
        vision = getattr(model.config, "vision_config", model.config) if backbone.is_clip else model.config
        facts.update(tokens=True, class_token=True, patch_size=int(vision.patch_size))
    else:
        patch = getattr(backbone.visual, "patch_size", None) if backbone.is_vit else None
        facts.update(tokens=backbone.is_vit, class_token=backbone.is_vit,
                     patch_size=int(patch[0] if isinstance(patch, (tuple, list)) else patch) if patch else None)
    return facts


def _check_widths(spec: Mapping[str, Any], backbone: nn.Module) -> None:
    """The entry's declared sizes must match the built network (catches registry typos before embedding)."""
    name = spec.get("name", "?")
    readouts = set(spec["readouts"])
    if readouts & TOKEN_READOUTS and int(spec["embed_dim"]) != backbone.width:
        raise FmauditInputError(
            f"encoder {name!r}: embed_dim is {spec['embed_dim']} in the registry but the network's token width is "
            f"{backbone.width}")
    if "pooled" in readouts:
        declared = int(spec.get("pooled_dim", spec["embed_dim"]))
        if declared != backbone.pooled_width:
            raise FmauditInputError(
                f"encoder {name!r}: the registry declares a pooled width of {declared} but the network's is "
                f"{backbone.pooled_width} (set pooled_dim)")
    declared_prefix = spec.get("num_prefix_tokens")
    if (declared_prefix is not None and readouts & TOKEN_READOUTS
            and backbone.num_prefix_tokens != int(declared_prefix)):
        raise FmauditInputError(
            f"encoder {name!r}: num_prefix_tokens is {declared_prefix} in the registry but the network has "
            f"{backbone.num_prefix_tokens}")


def build_encoder(spec: Mapping[str, Any] | str, weights_path: str | os.PathLike | None = None,
                  device: str | torch.device = "cpu", resolved: ResolvedWeights | None = None) -> Encoder:
    """Build, load and freeze an encoder (eval mode, no gradients) on ``device``.

    ``spec`` is a registry entry (with ``name``) or an encoder slug. ``weights_path`` overrides the entry's
    weight source with a local file. ``resolved``: the weights as :func:`~fmaudit.encoders.weights.resolve_weights`
    already found and checked them for this ``spec`` and ``weights_path`` (the embedding engine resolves them
    first, to key its chunks), so they are not hashed twice.

    Parameters
    ----------
    spec : Mapping or str
        A registry entry (with ``name``) or an encoder slug of the built-in registry.
    weights_path : path-like, optional
        A local weight file to load instead of the entry's weight source (format from its suffix).
    device : str or torch.device
        Where the encoder is moved (``"cpu"``, ``"cuda:0"``...).
    resolved : ResolvedWeights, optional
        The weights already resolved for this ``spec`` and ``weights_path``; None resolves them here.

    Returns
    -------
    Encoder
        In eval mode, with gradients off, on ``device``.

    Raises
    ------
    FmauditInputError
        When remote code has no pinned commit, the weights cannot be found or read, or the checkpoint does not
        match the architecture (missing or unexpected keys, shapes).
    """
    if isinstance(spec, str):
        spec = get_encoder_spec(spec)
    spec = dict(spec)
    name = spec.get("name", "?")
    if spec.get("trust_remote_code"):  # before anything is fetched: remote code runs from a pinned commit only
        check_encoder_usable(name, spec)
    files = (resolved if resolved is not None else resolve_weights(spec, weights_path)).paths
    model = build_network(spec)
    if files:
        state = network_state(spec, model, files, overridden=weights_path is not None)
        load_state_dict_strict(model, state, ", ".join(map(str, files)), encoder=name)
    backbone = check_network(spec, model)
    encoder = Encoder(spec, backbone)
    encoder.eval().requires_grad_(False)
    return encoder.to(device)


def network_state(spec: Mapping[str, Any], model: nn.Module, files: Sequence[Path], overridden: bool = False,
                  meta: bool = False) -> dict[str, torch.Tensor]:
    """The state dict the entry's weight ``files`` give ``model``, as its strict load sees it: each file read
    (``meta``: keys, shapes and dtypes only, :func:`~fmaudit.encoders.weights.read_checkpoint_meta`), then the
    entry's state_dict_key, strip_prefix and drop_keys_with_prefix, timm's checkpoint filter where the entry asks
    for it, and for transformers models transformers' own renaming of checkpoint keys (checkpoints saved by other
    releases, or under the base model's prefix, as ``from_pretrained`` renames them). ``overridden``: the files
    are a weights_path override, whose format comes from its suffix.

    Parameters
    ----------
    spec : Mapping
        The registry entry (``loader``, ``weights`` with ``format``, ``allow_pickle``, the key-mapping keys).
    model : nn.Module
        The network the state is for (:func:`build_network`; on the meta device is enough).
    files : sequence of Path
        The weight files (:func:`~fmaudit.encoders.weights.resolve_weights`), merged in order.
    overridden : bool
        Whether the files are a ``weights_path`` override.
    meta : bool
        Read only keys, shapes and dtypes (tensors on the meta device), for the pre-flight.

    Returns
    -------
    dict of str to Tensor
        Parameter name -> tensor, ready for a strict ``load_state_dict`` into ``model``.

    Raises
    ------
    FmauditInputError
        When a file cannot be read, lacks the ``state_dict_key``, or needs a transformers tensor conversion.
    """
    name = spec.get("name", "?")
    weights = spec["weights"]
    allow_pickle = bool(weights.get("allow_pickle", False))
    state: dict[str, torch.Tensor] = {}
    for path in files:
        fmt = checkpoint_format(Path(path)) if overridden else weights["format"]
        raw = (read_checkpoint_meta(Path(path), fmt, allow_pickle=allow_pickle, encoder=name) if meta
               else read_checkpoint(Path(path), fmt, allow_pickle=allow_pickle, encoder=name))
        state.update(extract_state_dict(raw, weights, str(path), encoder=name))
    if weights.get("timm_checkpoint_filter"):
        state = _timm_filter(model, state)
    if spec["loader"] == "transformers":
        state = _transformers_renamed(model, state, name, ", ".join(map(str, files)))
    return state


def _transformers_renamed(model: nn.Module, state: dict[str, torch.Tensor], encoder: str,
                          source: str) -> dict[str, torch.Tensor]:
    """Checkpoint keys renamed as transformers' ``from_pretrained`` renames them for ``model`` (its conversion
    mapping's renamings, and the base model's prefix added or removed); a key that would need one of its
    converting operations (tensors merged or split) is an error naming it."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    own = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None) or None
    out = {}
    for key, tensor in state.items():
        renamed, converted = rename_source_key(key, renamings, converters, prefix, own)
        if converted is not None:
            raise FmauditInputError(
                f"encoder {encoder!r}: checkpoint key {key} of {source} needs transformers' tensor conversion "
                f"{converted!r}, which fmaudit's strict loader does not apply; convert the checkpoint with "
                f"transformers (from_pretrained, then save_pretrained) first")
        out[renamed] = tensor
    return out


def _timm_filter(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    import importlib

    module = importlib.import_module(type(model).__module__)
    filter_fn = getattr(module, "checkpoint_filter_fn", None)
    return dict(filter_fn(state, model)) if filter_fn else state


def save_weights(encoder_or_module: nn.Module, path: str | os.PathLike) -> Path:
    """Write a module's state dict as safetensors (atomically); for an :class:`Encoder`, the wrapped network's.

    Used to produce local weight files for ``source: file`` (and by the tests).

    Parameters
    ----------
    encoder_or_module : nn.Module
        An :class:`Encoder` or any module.
    path : path-like
        The ``.safetensors`` file to write (its folder is created when missing).

    Returns
    -------
    Path
        ``path``.
    """
    from safetensors.torch import save_file

    module = encoder_or_module.backbone.model if isinstance(encoder_or_module, Encoder) else encoder_or_module
    path = Path(path)
    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    with atomic_path(path, suffix=".safetensors") as tmp:
        save_file(state, str(tmp))
    return path

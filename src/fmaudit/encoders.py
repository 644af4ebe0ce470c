"""Build a frozen encoder from its registry entry: architecture, weights, preprocessing and readouts.

Whatever library builds the architecture (timm, transformers, open_clip), fmaudit loads the weights itself,
so every encoder goes through one audited path:

- ``source: random``: seeded initialisation (``weights.seed``, default 0) under a forked torch RNG, so building
  an encoder neither depends on nor disturbs the global random state. The demo encoders use it.
- ``source: file``: a local file; ``sha256`` is checked when given.
- ``source: hf_hub``: ``huggingface_hub.hf_hub_download`` into the Hugging Face cache. ``HF_HUB_OFFLINE=1``,
  ``HF_HUB_CACHE`` and ``HF_HOME`` are read when the encoder is built (not when the library was imported), so
  an air-gapped job reads a pre-populated cache and never touches the network. Tokens are left to
  huggingface_hub (``HF_TOKEN`` or a login); fmaudit never reads, passes or logs them.
- A ``weights_path`` argument overrides the entry's source with a local file (format from its suffix).

Formats: safetensors, or torch checkpoints read with ``torch.load(weights_only=True)``; full unpickling only
where the entry says ``allow_pickle: true``. Loading is strict: missing, unexpected or mis-shaped keys raise
:class:`~fmaudit.io.FmauditInputError` naming them. ``trust_remote_code`` is passed to transformers only where
the entry sets it.

Readout conventions (``Encoder.forward`` returns ``{readout: tensor}``):

- ``cls``: the class token of the last layer after the final norm.
- ``mean``: the mean of the patch tokens after the final norm, class and register tokens excluded
  (``num_prefix_tokens``); for convnets the mean of the last feature map.
- ``cls_mean``: ``concat([cls, mean], dim=1)`` (Virchow2's and Midnight's tile embedding).
- ``pooled``: the model's own pooled output (timm ``forward_head(pre_logits=True)``, transformers
  ``pooler_output``, and for CLIP models the projected image embedding).
- ``patch_grid``: patch tokens as a ``(B, D, H/p, W/p)`` grid (the last feature map for convnets).

For CLIP-type models (open_clip and transformers ``CLIPModel``) tokens are taken after the vision tower's
post-layernorm, so ``cls`` is the pre-projection image embedding.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from fmaudit.io import FmauditInputError, sha256_file
from fmaudit.registry import get_encoder_spec, readout_dims

READOUTS = ("cls", "mean", "cls_mean", "pooled", "patch_grid")
_TOKEN_READOUTS = {"cls", "mean", "cls_mean", "patch_grid"}
_DEFAULT_FILENAMES = {"safetensors": "model.safetensors", "torch": "pytorch_model.bin"}


# --------------------------------------------------------------------------------------------------------
# preprocessing
# --------------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------------
# weights: locate, read, check, load
# --------------------------------------------------------------------------------------------------------

def _hub_offline() -> bool:
    import huggingface_hub

    env = os.environ.get("HF_HUB_OFFLINE")
    if env is not None:
        return env.strip().upper() in {"1", "ON", "YES", "TRUE"}
    return bool(huggingface_hub.constants.HF_HUB_OFFLINE)


def _hub_cache_dir() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None  # huggingface_hub's default


def _hub_where() -> str:
    return _hub_cache_dir() or "the default Hugging Face cache (~/.cache/huggingface/hub)"


def hub_download(repo_id: str, filename: str, revision: str | None, encoder: str) -> Path:
    """One file of a hub repo through the HF cache; offline mode reads the cache only."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = _hub_offline()
    rev = f" at revision {revision}" if revision else ""
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=_hub_cache_dir(),
                                    local_files_only=offline))
    except LocalEntryNotFoundError as e:
        why = "HF_HUB_OFFLINE=1 forbids downloads" if offline else "the hub could not be reached"
        raise FmauditInputError(
            f"encoder {encoder!r}: {filename} of Hugging Face repo {repo_id}{rev} is not in the cache "
            f"({_hub_where()}) and {why}. Pre-populate the cache on a machine with network "
            f"(`hf download {repo_id} {filename}` with HF_HOME pointing at the shared cache), or use a local "
            f"file (weights.source: file, or the encoder_weights config / weights_path)") from e
    except GatedRepoError as e:
        raise FmauditInputError(
            f"encoder {encoder!r}: Hugging Face repo {repo_id} is gated: accept its conditions on huggingface.co "
            f"and log in (`hf auth login` or the HF_TOKEN variable), or use a pre-populated cache or a local file"
        ) from e
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        raise FmauditInputError(
            f"encoder {encoder!r}: {filename} not found in Hugging Face repo {repo_id}{rev} "
            f"({type(e).__name__}); check weights.hf_hub_id / revision / filename in the registry") from e


def _hub_snapshot(repo_id: str, revision: str | None, patterns: list[str], encoder: str) -> Path:
    """Config and code files of a hub repo (for transformers configs and remote code)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = _hub_offline()
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=_hub_cache_dir(),
                                      allow_patterns=patterns, local_files_only=offline))
    except LocalEntryNotFoundError as e:
        raise FmauditInputError(
            f"encoder {encoder!r}: the config files ({', '.join(patterns)}) of Hugging Face repo {repo_id} are not "
            f"in the cache ({_hub_where()}) and downloads are off or impossible; pre-populate the cache "
            f"(`hf download {repo_id}`) or give the config inline (architecture.config)") from e


def resolve_weight_files(spec: Mapping[str, Any], weights_path: str | os.PathLike | None = None) -> list[Path]:
    """The weight file(s) of an entry, checked to exist (and against sha256); [] for random init."""
    name = spec.get("name", "?")
    weights = spec["weights"]
    if weights_path:
        path = Path(weights_path)
        if not path.is_file():
            raise FmauditInputError(f"encoder {name!r}: weight file {path} (weights_path) does not exist")
        return [path]
    source = weights["source"]
    if source == "random":
        return []
    if source == "file":
        path = Path(weights["path"])
        if not path.is_file():
            raise FmauditInputError(
                f"encoder {name!r}: weight file {path} (weights.path in the registry) does not exist"
                + ("" if path.is_absolute() else f" (relative to {Path.cwd()})"))
        paths = [path]
    elif source == "hf_hub":
        filename = weights.get("filename") or _DEFAULT_FILENAMES[weights["format"]]
        first = hub_download(weights["hf_hub_id"], filename, weights.get("revision"), name)
        if filename.endswith(".index.json"):
            shard_names = sorted(set(json.loads(first.read_text())["weight_map"].values()))
            paths = [hub_download(weights["hf_hub_id"], s, weights.get("revision"), name) for s in shard_names]
        else:
            paths = [first]
    else:  # the schema stops other values; keep the error explicit anyway
        raise FmauditInputError(f"encoder {name!r}: unknown weights.source {source!r}")
    expected = weights.get("sha256")
    if expected and len(paths) == 1:
        actual = sha256_file(paths[0])
        if actual != expected:
            raise FmauditInputError(
                f"encoder {name!r}: sha256 of {paths[0]} is {actual}, the registry expects {expected}; "
                f"the file is corrupt or not the weights the entry describes")
    return paths


def _format_of(path: Path) -> str:
    """Format of a weights_path override, from its suffix."""
    return "safetensors" if path.suffix == ".safetensors" else "torch"


def read_checkpoint(path: Path, fmt: str, allow_pickle: bool = False, encoder: str = "?") -> Any:
    """Read a checkpoint file: safetensors, or torch.load(weights_only=True) unless ``allow_pickle``."""
    if fmt == "safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError) as e:
            raise FmauditInputError(f"encoder {encoder!r}: {path} is not a readable safetensors file ({e})") from e
    try:
        return torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FmauditInputError(
            f"encoder {encoder!r}: refused to unpickle {path}: it holds objects other than tensors and plain "
            f"containers ({first}). Convert it to safetensors, or, only if you trust the file, set "
            f"weights.allow_pickle: true in the registry entry") from e
    except (RuntimeError, OSError, EOFError) as e:
        raise FmauditInputError(f"encoder {encoder!r}: cannot read torch checkpoint {path} ({e})") from e


def extract_state_dict(obj: Any, weights: Mapping[str, Any], source: str,
                       encoder: str = "?") -> dict[str, torch.Tensor]:
    """The tensor dict inside a checkpoint: ``state_dict_key``, then ``strip_prefix``, ``drop_keys_with_prefix``."""
    key = weights.get("state_dict_key")
    if key is not None:
        if not isinstance(obj, Mapping) or key not in obj:
            have = sorted(obj)[:20] if isinstance(obj, Mapping) else type(obj).__name__
            raise FmauditInputError(f"encoder {encoder!r}: {source} has no key {key!r} (state_dict_key); it has {have}")
        obj = obj[key]
    if not isinstance(obj, Mapping):
        raise FmauditInputError(f"encoder {encoder!r}: {source} holds a {type(obj).__name__}, not a state dict")
    non_tensor = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if non_tensor:
        raise FmauditInputError(
            f"encoder {encoder!r}: {source} is not a flat state dict (non-tensor entries {non_tensor[:5]}); "
            f"set weights.state_dict_key to the entry that holds the weights")
    sd = dict(obj)
    prefix = weights.get("strip_prefix")
    if prefix:
        sd = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in sd.items()}
    drops = tuple(weights.get("drop_keys_with_prefix") or ())
    if drops:
        sd = {k: v for k, v in sd.items() if not k.startswith(drops)}
    return sd


def _sample(keys: Sequence[str], n: int = 6) -> str:
    keys = list(keys)
    shown = ", ".join(keys[:n])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > n else "")


def load_state_dict_strict(module: nn.Module, state_dict: Mapping[str, torch.Tensor], source: str,
                           encoder: str = "?") -> None:
    """Strict load; missing, unexpected and mis-shaped keys are reported together in one clear error.

    Checkpoint entries for the module's non-persistent buffers (e.g. ``position_ids`` saved by older
    transformers releases) are ignored: they are recomputed, not learnt.
    """
    own = module.state_dict()
    non_persistent = {n for n, _ in module.named_buffers()} - set(own)
    sd = {k: v for k, v in state_dict.items() if k not in non_persistent}
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    mis_shaped = [f"{k} (checkpoint {tuple(sd[k].shape)}, model {tuple(own[k].shape)})"
                  for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or mis_shaped:
        parts = []
        if missing:
            parts.append(f"missing keys: {_sample(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {_sample(unexpected)}")
        if mis_shaped:
            parts.append(f"shape mismatches: {_sample(mis_shaped, 3)}")
        raise FmauditInputError(
            f"encoder {encoder!r}: the weights in {source} do not fit the architecture; " + "; ".join(parts))
    module.load_state_dict(sd, strict=True)


# --------------------------------------------------------------------------------------------------------
# architectures
# --------------------------------------------------------------------------------------------------------

class CTransPathConvStem(nn.Module):
    """CTransPath's convolutional patch embedding (two stride-2 3×3 convs, then 1×1), NHWC out for timm Swin."""

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
        self.width = int(visual.transformer.width) if self.is_vit else int(getattr(visual, "output_dim"))
        self.num_prefix_tokens = 1 if self.is_vit else 0
        self.pooled_width = int(visual.output_dim)

    def forward(self, x: torch.Tensor, need: set[str]) -> dict[str, torch.Tensor | None]:
        if not self.is_vit or not (need & _TOKEN_READOUTS):
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
    patterns = ["*.json", "*.py"] if trust else ["config.json"]
    folder = _hub_snapshot(weights["hf_hub_id"], weights.get("revision"), patterns, name)
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
        """Readouts of a batch of preprocessed images (B, 3, H, W); see the module doc for conventions."""
        readouts = list(readouts or self.readouts)
        bad = [r for r in readouts if r not in READOUTS]
        if bad:
            raise FmauditInputError(f"encoder {self.name!r}: unknown readout(s) {bad}; known {list(READOUTS)}")
        feats = self.backbone(images, set(readouts))
        tokens, fmap = feats["tokens"], feats["feature_map"]
        prefix = self.num_prefix_tokens
        out: dict[str, torch.Tensor] = {}

        def need_tokens(r: str) -> None:
            if tokens is None and fmap is None:
                raise FmauditInputError(f"encoder {self.name!r}: readout {r!r} needs token features it does not expose")

        for r in readouts:
            if r in ("cls", "cls_mean") and (tokens is None or prefix < 1):
                raise FmauditInputError(f"encoder {self.name!r}: readout {r!r} needs a class token (none here)")
            if r in ("mean", "cls_mean", "patch_grid"):
                need_tokens(r)
            if r == "cls":
                out[r] = tokens[:, 0]
            elif r == "mean":
                out[r] = tokens[:, prefix:].mean(dim=1) if tokens is not None else fmap.mean(dim=(2, 3))
            elif r == "cls_mean":
                out[r] = torch.cat([tokens[:, 0], tokens[:, prefix:].mean(dim=1)], dim=1)
            elif r == "pooled":
                if feats["pooled"] is None:
                    raise FmauditInputError(f"encoder {self.name!r}: the model has no pooled output")
                out[r] = feats["pooled"]
            elif r == "patch_grid":
                out[r] = self._grid(tokens, images) if tokens is not None else fmap
        return out

    def _grid(self, tokens: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        patch = tokens[:, self.num_prefix_tokens:]
        b, n, d = patch.shape
        p = self.patch_size or 1
        h, w = images.shape[-2] // p, images.shape[-1] // p
        if h * w != n:
            raise FmauditInputError(
                f"encoder {self.name!r}: {n} patch tokens do not form a {h}x{w} grid (patch_size {self.patch_size})")
        return patch.transpose(1, 2).reshape(b, d, h, w)


def build_network(spec: Mapping[str, Any]) -> nn.Module:
    """The entry's network with freshly initialised weights (seeded by ``weights.seed``), no checkpoint loaded.

    Works under ``torch.device("meta")`` for the timm and open_clip loaders, which lets the registry's
    architectures be checked without allocating or downloading anything.
    """
    with _seeded(int(spec["weights"].get("seed", 0))):
        return _BUILDERS[spec["loader"]](spec)


def check_network(spec: Mapping[str, Any], model: nn.Module) -> nn.Module:
    """Wrap ``model`` in its loader's backbone adapter after checking the entry's declared sizes against it."""
    backbone = _BACKBONES[spec["loader"]](model)
    _check_widths(spec, backbone)
    return backbone


def _check_widths(spec: Mapping[str, Any], backbone: nn.Module) -> None:
    """The entry's declared sizes must match the built network (catches registry typos before embedding)."""
    name = spec.get("name", "?")
    readouts = set(spec["readouts"])
    if readouts & _TOKEN_READOUTS and int(spec["embed_dim"]) != backbone.width:
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
    if (declared_prefix is not None and readouts & _TOKEN_READOUTS
            and backbone.num_prefix_tokens != int(declared_prefix)):
        raise FmauditInputError(
            f"encoder {name!r}: num_prefix_tokens is {declared_prefix} in the registry but the network has "
            f"{backbone.num_prefix_tokens}")


def build_encoder(spec: Mapping[str, Any] | str, weights_path: str | os.PathLike | None = None,
                  device: str | torch.device = "cpu") -> Encoder:
    """Build, load and freeze an encoder (eval mode, no gradients) on ``device``.

    ``spec`` is a registry entry (with ``name``) or an encoder slug. ``weights_path`` overrides the entry's
    weight source with a local file.
    """
    if isinstance(spec, str):
        spec = get_encoder_spec(spec)
    spec = dict(spec)
    name = spec.get("name", "?")
    weights = spec["weights"]
    files = resolve_weight_files(spec, weights_path)
    model = build_network(spec)
    if files:
        state: dict[str, torch.Tensor] = {}
        for path in files:
            fmt = _format_of(path) if weights_path else weights["format"]
            raw = read_checkpoint(path, fmt, allow_pickle=bool(weights.get("allow_pickle", False)), encoder=name)
            state.update(extract_state_dict(raw, weights, str(path), encoder=name))
        if weights.get("timm_checkpoint_filter"):
            state = _timm_filter(model, state)
        load_state_dict_strict(model, state, ", ".join(map(str, files)), encoder=name)
    backbone = check_network(spec, model)
    encoder = Encoder(spec, backbone)
    encoder.eval().requires_grad_(False)
    return encoder.to(device)


def _timm_filter(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    import importlib

    module = importlib.import_module(type(model).__module__)
    filter_fn = getattr(module, "checkpoint_filter_fn", None)
    return dict(filter_fn(state, model)) if filter_fn else state


def save_weights(encoder_or_module: nn.Module, path: str | os.PathLike) -> Path:
    """Write a module's state dict as safetensors (atomically); for an :class:`Encoder`, the wrapped network's.

    Used to produce local weight files for ``source: file`` (and by the tests).
    """
    from safetensors.torch import save_file

    from fmaudit.io import atomic_path

    module = encoder_or_module.backbone.model if isinstance(encoder_or_module, Encoder) else encoder_or_module
    path = Path(path)
    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    with atomic_path(path, suffix=".safetensors") as tmp:
        save_file(state, str(tmp))
    return path

"""Encoders named by their Hugging Face repo, and the hub configs registry entries are compared with.

A model's own config files say how it was built and how its inputs are prepared. This module reads them from
the local Hugging Face cache only (``HF_HUB_CACHE`` / ``HF_HOME``, read when called; nothing is downloaded, so
it behaves the same with ``HF_HUB_OFFLINE=1`` on an air-gapped node), each through its library's own parser:

Each library is imported when its files are read, as :mod:`fmaudit.encoders.builders` imports it to build.

- timm: ``config.json`` (``architecture``, ``model_args``, ``pretrained_cfg``), parsed by timm's
  ``load_model_config_from_path`` and resolved by ``timm.data.resolve_data_config``; the eval transform is
  timm's: shorter side to ``floor(input_size / crop_pct)``, centre crop (``crop_mode: center``), or a resize to
  the input size (``squash`` with ``crop_pct`` 1).
- transformers: ``config.json`` (``AutoConfig``) and ``preprocessor_config.json`` (``AutoImageProcessor``):
  ``size.shortest_edge`` + ``crop_size`` is a resize and centre crop, ``size.height/width`` without crop a
  resize to the input size.
- open_clip: ``open_clip_config.json`` (``model_cfg``, and ``preprocess_cfg`` merged over open_clip's defaults
  with ``merge_preprocess_dict``): ``resize_mode: shortest`` is resize and centre crop, ``squash`` a resize.

A transform that fmaudit's preprocessing cannot state exactly (non-square inputs, ``border`` crops, a squash
with a crop, other interpolations) is an error naming the file and the field, never an approximation.

Two uses of one reader:

- :func:`resolve_hub_encoder` turns ``timm:<org>/<repo>`` or ``hf:<org>/<repo>`` into a registry-style entry
  (loader, architecture, weights pinned to the cached snapshot's commit, preprocessing; sizes, readouts and
  default readout from the network built on the meta device). ``hf:`` takes open_clip when the repo has
  ``open_clip_config.json``, transformers when its ``config.json`` has a ``model_type``, timm when it is timm's.
  Repos whose model code lives in the repo (``auto_map``) are refused: remote code needs a registry entry with
  ``trust_remote_code`` and a pinned revision.
- :func:`check_against_hub_config` compares a registry entry with the cached config of its hub repo, field by
  field (:data:`fmaudit.registry.HUB_CONFIG_FIELDS`), and raises naming the first field that differs, unless the
  entry lists it under ``departs_from_hub_config`` with its reason (e.g. the authors' README uses another
  interpolation than the config file). Nothing is compared when the config is not cached.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
import yaml

from fmaudit.encoders.builders import build_network, describe_network, network_state
from fmaudit.encoders.weights import cached_hub_file, cached_weight_files, checkpoint_format, hub_commit_of
from fmaudit.io import FmauditInputError
from fmaudit.registry import HUB_CONFIG_FIELDS, hub_name_slug, parse_hub_name, validate_encoder_entry

__all__ = ["HubConfig", "UnsupportedHubConfig", "check_against_hub_config", "hub_config_mismatches",
           "hub_config_of_entry", "read_hub_config", "resolve_hub_encoder"]

#: open_clip's hub file names (open_clip.constants HF_CONFIG_NAME, HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME).
OPEN_CLIP_CONFIG = "open_clip_config.json"
#: Weight files each library looks for in a hub repo, preferred first.
WEIGHT_FILES = {
    "timm": ("model.safetensors", "pytorch_model.bin"),
    "transformers": ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"),
    "open_clip": ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"),
}
#: transformers model types whose outputs the transformers backbone adapter reads (class token first, then
#: register tokens, then patch tokens).
TRANSFORMERS_MODEL_TYPES = ("vit", "dinov2", "dinov2_with_registers", "clip")
_INTERPOLATIONS = ("bicubic", "bilinear")
_PIL_RESAMPLING = {2: "bilinear", 3: "bicubic"}
# a network smaller than this embeds a few thousand images in minutes on a CPU; anything larger asks for a GPU
_CPU_PARAMS_M = 5.0


@dataclass
class HubConfig:
    """What a hub repo's config files say, read from the cache.

    ``library``: timm, transformers or open_clip. ``values``: field (:data:`fmaudit.registry.HUB_CONFIG_FIELDS`)
    -> value as the files state it; ``where``: field -> the file and key it came from, for messages.
    ``entry``: the registry-entry keys the files determine (loader, architecture, preprocessing). ``folder``:
    the snapshot folder; ``commit``: its commit; ``files``: the config files read.

    Parameters
    ----------
    repo_id : str
        The hub repo (``owner/name``).
    library : str
        ``timm``, ``transformers`` or ``open_clip``.
    folder : Path
        The cached snapshot folder the files lie in.
    commit : str or None
        The snapshot's commit (None when the path names none).
    values : dict of str to Any
        Compared field -> the value the files state.
    where : dict of str to str
        Compared field -> ``<file> <key>`` it came from.
    entry : dict of str to Any
        Registry-entry keys the files determine (``architecture``, ``preprocessing``, ``model_type``,
        ``auto_map``, ``licence``...).
    files : list of Path
        The config files read.
    """

    repo_id: str
    library: str
    folder: Path
    commit: str | None
    values: dict[str, Any] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    entry: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)


class UnsupportedHubConfig(FmauditInputError):
    """A hub config that states a transform fmaudit's preprocessing cannot state exactly; ``field`` is the entry
    field it concerns (None when none could express it).

    Parameters
    ----------
    message : str
        What the config states, naming the file and key.
    field_name : str or None
        The registry-entry field concerned (``preprocessing.crop``...), stored as :attr:`field`.
    """

    def __init__(self, message: str, field_name: str | None):
        super().__init__(message)
        self.field = field_name


# the entry field a config key of each library decides (for an unsupported value of it)
_CONFIG_KEY_FIELDS = {"pretrained_cfg.input_size": "preprocessing.input_size", "crop_size": "preprocessing.crop",
                      "pretrained_cfg.interpolation": "preprocessing.interpolation", "size": "preprocessing.crop",
                      "pretrained_cfg.crop_mode": "preprocessing.crop", "resample": "preprocessing.interpolation",
                      "preprocess_cfg.size": "preprocessing.input_size",
                      "preprocess_cfg.interpolation": "preprocessing.interpolation",
                      "preprocess_cfg.resize_mode": "preprocessing.crop"}


def _fail(repo_id: str, file: str, key: str, why: str) -> UnsupportedHubConfig:
    return UnsupportedHubConfig(f"{repo_id}: {file} {key}: {why}", _CONFIG_KEY_FIELDS.get(key))


# --------------------------------------------------------------------------------------------------------
# the three libraries' config files
# --------------------------------------------------------------------------------------------------------

def _timm_config(repo_id: str, config_path: Path) -> HubConfig | None:
    raw = json.loads(config_path.read_text())
    if "architecture" not in raw and "architecture" not in (raw.get("pretrained_cfg") or {}):
        return None
    import timm.data
    from timm.models._hub import load_model_config_from_path  # timm's own parser of a folder's config.json

    pretrained_cfg, model_name, model_args = load_model_config_from_path(config_path.parent)
    file = config_path.name
    data = timm.data.resolve_data_config(pretrained_cfg=pretrained_cfg)
    size = tuple(data["input_size"][1:])
    if size[0] != size[1]:
        raise _fail(repo_id, file, "pretrained_cfg.input_size", f"{list(size)} is not square; fmaudit's "
                    "preprocessing takes square inputs (write a registry entry if you need a crop of it)")
    interpolation = data["interpolation"]
    if interpolation not in _INTERPOLATIONS:
        raise _fail(repo_id, file, "pretrained_cfg.interpolation", f"{interpolation!r} is not one of {_INTERPOLATIONS}")
    crop_pct, crop_mode = float(data["crop_pct"]), data.get("crop_mode", "center")
    input_size = int(size[0])
    if crop_mode == "center":
        crop, resize = "center", math.floor(input_size / crop_pct)
    elif crop_mode == "squash" and crop_pct == 1.0:
        crop, resize = "none", input_size
    else:
        raise _fail(repo_id, file, "pretrained_cfg.crop_mode", f"{crop_mode!r} with crop_pct {crop_pct} has no "
                    "equivalent in fmaudit's preprocessing (crop: center or none)")
    kwargs = dict(model_args)
    # what timm's factory sets from the pretrained config when it builds the model for these weights
    if pretrained_cfg.get("num_classes") is not None and pretrained_cfg["num_classes"] >= 0:
        kwargs.setdefault("num_classes", int(pretrained_cfg["num_classes"]))
    if pretrained_cfg.get("fixed_input_size"):
        kwargs.setdefault("img_size", input_size)
    preprocessing = {"input_size": input_size, "resize_size": resize, "crop": crop, "interpolation": interpolation,
                     "mean": [float(v) for v in data["mean"]], "std": [float(v) for v in data["std"]]}
    cfg = HubConfig(repo_id, "timm", config_path.parent, hub_commit_of(config_path), files=[config_path])
    cfg.entry = {"loader": "timm", "architecture": {"model_name": model_name, "kwargs": kwargs},
                 "preprocessing": preprocessing, "licence": pretrained_cfg.get("license")}
    cfg.values = {"architecture.model_name": model_name,
                  **{f"preprocessing.{k}": v for k, v in preprocessing.items()}}
    cfg.where = {"architecture.model_name": f"{file} architecture",
                 **{f"preprocessing.{k}": f"{file} pretrained_cfg" for k in preprocessing}}
    if raw.get("num_features"):
        cfg.values["embed_dim"], cfg.where["embed_dim"] = int(raw["num_features"]), f"{file} num_features"
    if model_args.get("patch_size"):
        cfg.values["patch_size"] = int(model_args["patch_size"])
        cfg.where["patch_size"] = f"{file} model_args.patch_size"
    return cfg


def _transformers_preprocessing(repo_id: str, folder: Path) -> dict[str, Any]:
    import transformers

    file = "preprocessor_config.json"
    try:
        processor = transformers.AutoImageProcessor.from_pretrained(str(folder))
    except (ValueError, OSError, KeyError) as e:  # an unknown processor type, a malformed file
        raise FmauditInputError(f"{repo_id}: {file} cannot be read by transformers' AutoImageProcessor ({e})") from e
    if not getattr(processor, "do_resize", True):
        raise _fail(repo_id, file, "do_resize", "false: images of any size would reach the network")
    rescale = float(getattr(processor, "rescale_factor", 1 / 255)) if getattr(processor, "do_rescale", True) else 1.0
    if not math.isclose(rescale, 1 / 255, rel_tol=1e-6):
        raise _fail(repo_id, file, "rescale_factor", f"{rescale} (fmaudit scales pixels by 1/255)")
    size, crop_size = processor.size, getattr(processor, "crop_size", None)
    center = bool(getattr(processor, "do_center_crop", False))
    if getattr(size, "shortest_edge", None) and center and crop_size is not None:
        if crop_size.height != crop_size.width:
            raise _fail(repo_id, file, "crop_size", f"{crop_size.height}x{crop_size.width} is not square")
        preprocessing = {"input_size": int(crop_size.height), "resize_size": int(size.shortest_edge), "crop": "center"}
    elif getattr(size, "height", None) and size.height == size.width and (
            not center or crop_size is None or (crop_size.height, crop_size.width) == (size.height, size.width)):
        preprocessing = {"input_size": int(size.height), "resize_size": int(size.height), "crop": "none"}
    else:
        raise _fail(repo_id, file, "size", f"size {dict(size.__dict__) if hasattr(size, '__dict__') else size} with "
                    f"do_center_crop {center} and crop_size {crop_size} has no equivalent in fmaudit's preprocessing")
    resample = int(getattr(processor.resample, "value", processor.resample))
    if resample not in _PIL_RESAMPLING:
        raise _fail(repo_id, file, "resample", f"{resample} is neither bilinear (2) nor bicubic (3)")
    normalize = getattr(processor, "do_normalize", True)
    mean = [float(v) for v in processor.image_mean] if normalize else [0.0, 0.0, 0.0]
    std = [float(v) for v in processor.image_std] if normalize else [1.0, 1.0, 1.0]
    return {**preprocessing, "interpolation": _PIL_RESAMPLING[resample], "mean": mean, "std": std}


def _transformers_config(repo_id: str, config_path: Path, processor_path: Path | None) -> HubConfig | None:
    raw = json.loads(config_path.read_text())
    if "model_type" not in raw:
        return None
    cfg = HubConfig(repo_id, "transformers", config_path.parent, hub_commit_of(config_path), files=[config_path])
    model_type = raw["model_type"]
    cfg.entry = {"loader": "transformers", "model_type": model_type, "auto_map": bool(raw.get("auto_map")),
                 "architecture": {"model_class": "CLIPModel" if model_type == "clip" else "AutoModel"}}
    vision = raw.get("vision_config") or {} if model_type == "clip" else raw
    file = config_path.name
    prefix = "vision_config." if model_type == "clip" else ""
    if vision.get("hidden_size"):
        cfg.values["embed_dim"], cfg.where["embed_dim"] = int(vision["hidden_size"]), f"{file} {prefix}hidden_size"
    if vision.get("patch_size"):
        cfg.values["patch_size"], cfg.where["patch_size"] = int(vision["patch_size"]), f"{file} {prefix}patch_size"
    if model_type in TRANSFORMERS_MODEL_TYPES:
        cfg.values["num_prefix_tokens"] = 1 + int(raw.get("num_register_tokens") or 0)
        cfg.where["num_prefix_tokens"] = f"{file} model_type {model_type} (class token + num_register_tokens)"
    if model_type == "clip" and raw.get("projection_dim"):
        cfg.values["pooled_dim"], cfg.where["pooled_dim"] = int(raw["projection_dim"]), f"{file} projection_dim"
    # an image processor whose code lives in the repo is not run to read its settings
    if processor_path is not None and "auto_map" not in json.loads(processor_path.read_text()):
        preprocessing = _transformers_preprocessing(repo_id, processor_path.parent)
        cfg.entry["preprocessing"] = preprocessing
        cfg.files.append(processor_path)
        for k, v in preprocessing.items():
            cfg.values[f"preprocessing.{k}"], cfg.where[f"preprocessing.{k}"] = v, processor_path.name
    return cfg


def _open_clip_config(repo_id: str, config_path: Path) -> HubConfig:
    from open_clip.transform import PreprocessCfg, merge_preprocess_dict

    raw = json.loads(config_path.read_text())
    file = config_path.name
    model_cfg = raw.get("model_cfg")
    if not isinstance(model_cfg, Mapping) or "vision_cfg" not in model_cfg:
        raise _fail(repo_id, file, "model_cfg", "missing, or without vision_cfg")
    vision = model_cfg["vision_cfg"]
    image_size = vision.get("image_size", 224)
    pre = merge_preprocess_dict(PreprocessCfg(size=image_size), raw.get("preprocess_cfg") or {})
    size = pre["size"]
    size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
    if size[0] != size[1]:
        raise _fail(repo_id, file, "preprocess_cfg.size", f"{list(size)} is not square")
    if pre["interpolation"] not in _INTERPOLATIONS:
        raise _fail(repo_id, file, "preprocess_cfg.interpolation", f"{pre['interpolation']!r} is not one of "
                    f"{_INTERPOLATIONS}")
    crops = {"shortest": "center", "squash": "none"}
    if pre["resize_mode"] not in crops:
        raise _fail(repo_id, file, "preprocess_cfg.resize_mode", f"{pre['resize_mode']!r} (letterboxing) has no "
                    "equivalent in fmaudit's preprocessing")
    preprocessing = {"input_size": int(size[0]), "resize_size": int(size[0]), "crop": crops[pre["resize_mode"]],
                     "interpolation": pre["interpolation"], "mean": [float(v) for v in pre["mean"]],
                     "std": [float(v) for v in pre["std"]]}
    cfg = HubConfig(repo_id, "open_clip", config_path.parent, hub_commit_of(config_path), files=[config_path])
    cfg.entry = {"loader": "open_clip", "architecture": {"model_name": repo_id, "model_config": dict(model_cfg)},
                 "preprocessing": preprocessing}
    cfg.values = {f"preprocessing.{k}": v for k, v in preprocessing.items()}
    cfg.where = {f"preprocessing.{k}": f"{file} preprocess_cfg (over open_clip's defaults)" for k in preprocessing}
    if model_cfg.get("embed_dim"):
        cfg.values["pooled_dim"], cfg.where["pooled_dim"] = int(model_cfg["embed_dim"]), f"{file} model_cfg.embed_dim"
    if vision.get("width") and not vision.get("timm_model_name"):
        cfg.values["embed_dim"], cfg.where["embed_dim"] = int(vision["width"]), f"{file} model_cfg.vision_cfg.width"
    if vision.get("patch_size"):
        cfg.values["patch_size"] = int(vision["patch_size"])
        cfg.where["patch_size"] = f"{file} model_cfg.vision_cfg.patch_size"
    return cfg


def read_hub_config(repo_id: str, revision: str | None = None, library: str | None = None) -> HubConfig | None:
    """The cached config of ``repo_id`` at ``revision`` (default: the cache's ``main``) as ``library`` reads it
    (timm, transformers, open_clip; None: whichever the repo's files are for), or None when the cache holds no
    config file of it. Raises naming the file and key when a config states a transform fmaudit cannot.

    Parameters
    ----------
    repo_id : str
        The hub repo (``owner/name``).
    revision : str, optional
        Branch, tag or commit.
    library : str, optional
        ``timm``, ``transformers`` or ``open_clip``; None tries open_clip, then transformers, then timm.

    Returns
    -------
    HubConfig or None

    Raises
    ------
    UnsupportedHubConfig
        When the config states a transform fmaudit's preprocessing cannot state exactly.
    """
    libraries = [library] if library else ["open_clip", "transformers", "timm"]
    config = cached_hub_file(repo_id, "config.json", revision)
    for lib in libraries:
        if lib == "open_clip":
            path = cached_hub_file(repo_id, OPEN_CLIP_CONFIG, revision)
            if path is not None:
                return _open_clip_config(repo_id, path)
        elif lib == "transformers" and config is not None:
            processor = cached_hub_file(repo_id, "preprocessor_config.json", revision)
            found = _transformers_config(repo_id, config, processor)
            if found is not None:
                return found
        elif lib == "timm" and config is not None:
            found = _timm_config(repo_id, config)
            if found is not None:
                return found
    return None


# --------------------------------------------------------------------------------------------------------
# registry entries against their hub config
# --------------------------------------------------------------------------------------------------------

def _entry_value(spec: Mapping[str, Any], field_name: str) -> Any:
    pre = spec["preprocessing"]
    defaults = {"resize_size": pre["input_size"], "crop": "center", "interpolation": "bicubic"}
    if field_name.startswith("preprocessing."):
        key = field_name.split(".", 1)[1]
        return pre.get(key, defaults.get(key))
    if field_name == "architecture.model_name":
        return spec["architecture"].get("model_name")
    if field_name == "pooled_dim":
        return spec.get("pooled_dim", spec["embed_dim"]) if "pooled" in spec["readouts"] else None
    if field_name in ("embed_dim",):
        token_readouts = {"cls", "mean", "cls_mean", "patch_grid"} & set(spec["readouts"])
        return spec["embed_dim"] if token_readouts else None
    return spec.get(field_name)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6,
                                                                                            abs_tol=1e-7)
    return a == b


def hub_config_of_entry(spec: Mapping[str, Any]) -> HubConfig | None:
    """The cached config of a registry entry's hub repo, read as the entry's loader reads it; None for entries
    whose weights are not on the hub or whose config is not cached.

    Parameters
    ----------
    spec : Mapping
        A registry entry (``loader``, ``weights``, ``departs_from_hub_config``).

    Returns
    -------
    HubConfig or None
        Also None when the config states a transform the entry declares it departs from.

    Raises
    ------
    FmauditInputError
        When the config states a transform fmaudit cannot follow and the entry does not declare the departure.
    """
    weights = spec["weights"]
    if weights.get("source") != "hf_hub":
        return None
    try:
        return read_hub_config(weights["hf_hub_id"], weights.get("revision"), library=spec["loader"])
    except UnsupportedHubConfig as e:
        if e.field and e.field in (spec.get("departs_from_hub_config") or {}):
            return None  # the entry departs from this config on purpose: nothing of it to compare
        hint = f"; if the entry departs from it on purpose, declare departs_from_hub_config: {{{e.field}: <reason>}}" \
            if e.field else ""
        raise FmauditInputError(f"encoder {spec.get('name', '?')!r}: the hub config states a transform fmaudit "
                                f"cannot follow: {e}{hint}") from e


def hub_config_mismatches(spec: Mapping[str, Any], hub: HubConfig) -> list[str]:
    """Every compared field where the entry differs from ``hub`` and does not declare the departure
    (``departs_from_hub_config``), one line each naming the field, both values and the file.

    Parameters
    ----------
    spec : Mapping
        A registry entry.
    hub : HubConfig
        Its hub repo's config (:func:`hub_config_of_entry`).

    Returns
    -------
    list of str
        One line per differing field; empty when the entry agrees.
    """
    departs = spec.get("departs_from_hub_config") or {}
    out = []
    for name in HUB_CONFIG_FIELDS:
        if name not in hub.values or name in departs:
            continue
        mine = _entry_value(spec, name)
        if mine is None or _same(mine, hub.values[name]):
            continue
        out.append(f"{name} is {mine!r} in the entry but {hub.values[name]!r} in {hub.repo_id}'s {hub.where[name]}"
                   f" (snapshot {hub.commit or '?'})")
    return out


def check_against_hub_config(spec: Mapping[str, Any], source: str = "encoder registry") -> HubConfig | None:
    """Compare a registry entry with its hub repo's cached config (module doc); raise naming every field that
    differs without a declared departure. Returns the config compared, or None when there was none to read.

    Parameters
    ----------
    spec : Mapping
        A registry entry.
    source : str
        The registry file, for the message.

    Returns
    -------
    HubConfig or None

    Raises
    ------
    FmauditInputError
        Listing every field that differs without a declared departure.
    """
    hub = hub_config_of_entry(spec)
    if hub is None:
        return None
    mismatches = hub_config_mismatches(spec, hub)
    if mismatches:
        name = spec.get("name", "?")
        raise FmauditInputError(
            f"{source}: encoder {name!r} differs from the config of its hub repo: " + "; ".join(mismatches)
            + ". Correct the entry, or, where the authors' own instructions depart from their config file, say so "
            "under departs_from_hub_config: {<field>: <reason>}")
    return hub


# --------------------------------------------------------------------------------------------------------
# encoders named by their hub repo
# --------------------------------------------------------------------------------------------------------

def _not_cached(name: str, repo_id: str, files: str) -> FmauditInputError:
    return FmauditInputError(
        f"encoder {name!r}: {files} of Hugging Face repo {repo_id} not in the local cache; encoders named by their "
        f"hub repo are resolved from the cache only (HF_HUB_CACHE, or HF_HOME/hub). Pre-populate it on a machine "
        f"with network (`hf download {repo_id}` with HF_HOME pointing at the shared cache), or write a registry "
        f"entry for it")


def _readouts(facts: Mapping[str, Any], loader: str) -> tuple[list[str], str]:
    """Readouts and default readout of a named encoder: the class token where there is one (timm's own pooling
    decides between cls and mean), the model's projection for CLIP models, the pooled feature map for convnets."""
    if not facts["tokens"]:
        return ["mean", "pooled"], "pooled"
    if loader == "open_clip" or facts.get("is_clip"):
        return ["cls", "mean", "pooled"], "pooled"
    if not facts["class_token"] or facts["num_prefix_tokens"] == 0:
        return ["mean"], "mean"
    default = "mean" if facts.get("global_pool") == "avg" else "cls"
    return ["cls", "mean", "cls_mean"], default


def _fit_transformers_head(entry: dict[str, Any], name: str) -> None:
    """A transformers base model saved without its pooling layer is built as its checkpoint was saved
    (``add_pooling_layer: false``), as ``from_pretrained`` would leave that layer unloaded otherwise."""
    files = cached_weight_files(entry)
    if not files:
        raise _not_cached(name, entry["weights"]["hf_hub_id"], f"every shard of {entry['weights']['filename']}")
    with torch.device("meta"):
        model = build_network(entry)
    keys = network_state({**entry, "name": name}, model, files, meta=True)
    if any(k.startswith("pooler.") for k in model.state_dict()) and not any(k.startswith("pooler.") for k in keys):
        entry["architecture"]["kwargs"] = {"add_pooling_layer": False}


def resolve_hub_encoder(name: str, revision: str | None = None) -> dict[str, Any]:
    """The registry-style entry of an encoder named ``timm:<org>/<repo>`` or ``hf:<org>/<repo>`` (module doc),
    with ``name`` set to its slug (:func:`fmaudit.registry.hub_name_slug`) and ``hub_name`` to ``name``. The
    weights are pinned to the commit of the cached snapshot (or ``revision``), so the embedding key changes
    when the cache moves to another commit. Raises naming the repo and what is missing when anything needed is
    not cached, or the file and key of a config fmaudit cannot follow.

    Parameters
    ----------
    name : str
        ``timm:<org>/<repo>`` or ``hf:<org>/<repo>``.
    revision : str, optional
        The commit to pin (the config's ``encoder_revisions``); None: the cache's ``main``.

    Returns
    -------
    dict of str to Any
        A registry entry (loader, architecture, weights, preprocessing, readouts, ``embed_dim``, ``gpu``...)
        that passes :func:`fmaudit.registry.validate_encoder_entry`.

    Raises
    ------
    FmauditInputError
        When a config or weight file is not cached, the repo needs remote code, or its model type is not covered.
    """
    library, repo_id = parse_hub_name(name)
    hub = read_hub_config(repo_id, revision, library="timm" if library == "timm" else None)
    if hub is None:
        what = "config.json (timm's)" if library == "timm" else "open_clip_config.json or config.json"
        raise _not_cached(name, repo_id, what)
    if hub.entry.get("auto_map"):
        raise FmauditInputError(
            f"encoder {name!r}: {repo_id}'s config.json maps its model to code in the repo (auto_map); running it "
            f"needs a registry entry with trust_remote_code: true and weights.revision pinned to the commit you "
            f"reviewed")
    if hub.library == "transformers":
        if hub.entry["model_type"] not in TRANSFORMERS_MODEL_TYPES:
            raise FmauditInputError(
                f"encoder {name!r}: {repo_id} is a transformers {hub.entry['model_type']!r} model; encoders named by "
                f"their hub repo cover {', '.join(TRANSFORMERS_MODEL_TYPES)} (write a registry entry for others)")
        if "preprocessing" not in hub.entry:
            raise _not_cached(name, repo_id, "preprocessor_config.json (the image processor: resize, crop, mean, std)")
    candidates = WEIGHT_FILES[hub.library]
    found = next(((f, p) for f in candidates if (p := cached_hub_file(repo_id, f, hub.commit)) is not None), None)
    if found is None:
        raise _not_cached(name, repo_id, f"the weights ({' or '.join(candidates)})")
    filename, weight_path = found
    fmt = "safetensors" if ".safetensors" in filename else checkpoint_format(weight_path)
    slug = hub_name_slug(name)
    entry: dict[str, Any] = {
        "description": f"{repo_id} ({hub.library}), named {name} in the config: architecture and preprocessing from "
                       f"its {' and '.join(p.name for p in hub.files)} in the Hugging Face cache",
        "hub_name": name,
        "loader": hub.library,
        "architecture": copy.deepcopy(hub.entry["architecture"]),
        "weights": {"source": "hf_hub", "hf_hub_id": repo_id, "revision": hub.commit, "filename": filename,
                    "format": fmt},
        "preprocessing": copy.deepcopy(hub.entry["preprocessing"]),
        "licence": hub.entry.get("licence") or _card_licence(hub) or f"unknown (see the model card of {repo_id})",
        "pretraining_corpora": [],
        "paper": f"see the model card of {repo_id}",
        "magnification": None,
        "precision": "float32",
    }
    if hub.library == "timm":
        entry["weights"]["timm_checkpoint_filter"] = True  # timm applies it to every pretrained checkpoint it loads
    if hub.library == "transformers":
        _fit_transformers_head(entry, name)
    with torch.device("meta"):
        model = build_network({**entry, "name": slug})
    facts = describe_network(entry, model)
    facts["is_clip"] = hub.library == "transformers" and hub.entry["model_type"] == "clip"
    readouts, default = _readouts(facts, hub.library)
    entry.update(readouts=readouts, default_readout=default, embed_dim=int(facts["embed_dim"]),
                 num_prefix_tokens=int(facts["num_prefix_tokens"]), params_m=facts["params_m"],
                 gpu=facts["params_m"] >= _CPU_PARAMS_M)
    if "pooled" in readouts and facts["pooled_dim"] != facts["embed_dim"]:
        entry["pooled_dim"] = int(facts["pooled_dim"])
    if facts.get("patch_size"):
        entry["patch_size"] = int(facts["patch_size"])
    validate_encoder_entry(entry, f"encoder {name!r}")
    mismatches = hub_config_mismatches(entry, hub)
    if mismatches:  # the network built from the config contradicts the config itself
        raise FmauditInputError(f"encoder {name!r}: " + "; ".join(mismatches))
    return {**entry, "name": slug}


def _card_licence(hub: HubConfig) -> str | None:
    """The ``license`` of the model card's YAML front matter (the block between the first two ``---`` lines),
    when the cache holds the card."""
    readme = cached_hub_file(hub.repo_id, "README.md", hub.commit)
    if readme is None:
        return None
    parts = readme.read_text(errors="replace").split("---", 2)
    if len(parts) < 3 or parts[0].strip():
        return None
    try:
        meta = yaml.safe_load(parts[1]) or {}
    except yaml.YAMLError:
        return None
    licence = meta.get("license") if isinstance(meta, dict) else None
    return str(licence) if licence else None

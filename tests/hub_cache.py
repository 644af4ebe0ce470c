"""A local Hugging Face cache in a temporary folder, laid out as huggingface_hub lays it out, holding the files
each library's own export writes for a random-initialised network: timm's ``save_for_hf`` (config.json with
pretrained_cfg, model.safetensors), transformers' ``save_pretrained`` of a model and its image processor, and
open_clip's ``open_clip_config.json`` beside ``open_clip_model.safetensors``. Encoders named ``timm:<repo>`` /
``hf:<repo>`` and the registry's hub checks then run their real loading code on it, offline."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import open_clip
import timm
import torch
import transformers
from safetensors.torch import save_file
from timm.models._hub import save_for_hf

COMMIT = "0123456789abcdef0123456789abcdef01234567"

TINY_VIT = {"img_size": 64, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 2}
TINY_CLIP = {"embed_dim": 32,
             "vision_cfg": {"image_size": 64, "patch_size": 8, "width": 64, "layers": 2, "head_width": 32,
                            "mlp_ratio": 2.0},
             "text_cfg": {"context_length": 16, "vocab_size": 256, "width": 32, "heads": 2, "layers": 1}}


def add_to_cache(cache: Path, repo_id: str, folder: Path, commit: str = COMMIT, ref: str = "main") -> Path:
    """Put every file of ``folder`` into ``cache`` (the ``hub`` folder) as snapshot ``commit`` of ``repo_id``:
    content-addressed blobs, snapshot entries as relative symlinks to them, ``refs/<ref>`` naming the commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for src in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = src.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / src.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs" / ref).write_text(commit)
    return snapshot


def timm_export(folder: Path, model_name: str = "vit_tiny_patch16_224", model_args: dict | None = None,
                pretrained_cfg: dict | None = None, seed: int = 0) -> Path:
    """timm's own hub export of a random-initialised model (config.json + model.safetensors)."""
    model_args = dict(TINY_VIT if model_args is None else model_args)
    torch.manual_seed(seed)
    model = timm.create_model(model_name, pretrained=False, num_classes=0, **model_args)
    size = model_args.get("img_size", 224)
    cfg = {"input_size": [3, size, size],
           "interpolation": "bicubic", "crop_pct": 1.0, "crop_mode": "center", "mean": [0.5, 0.5, 0.5],
           "std": [0.5, 0.5, 0.5], "num_classes": 0, "license": "apache-2.0", "fixed_input_size": False}
    cfg.update(pretrained_cfg or {})
    model.pretrained_cfg = {**model.pretrained_cfg, **cfg}
    folder.mkdir(parents=True, exist_ok=True)
    save_for_hf(model, str(folder), model_args={**model_args, "num_classes": 0}, safe_serialization=True)
    return folder


def transformers_export(folder: Path, model_type: str = "dinov2", processor: str = "BitImageProcessor",
                        processor_kwargs: dict | None = None, seed: int = 0, **config) -> Path:
    """transformers' ``save_pretrained`` of a random-initialised model and its image processor."""
    defaults = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
                "image_size": 64, "patch_size": 8}
    cfg = transformers.AutoConfig.for_model(model_type, **{**defaults, **config})
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    kwargs = {"size": {"shortest_edge": 72}, "crop_size": {"height": 64, "width": 64}, "do_center_crop": True,
              "resample": 3, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
    kwargs.update(processor_kwargs or {})
    getattr(transformers, processor)(**kwargs).save_pretrained(str(folder))
    return folder


def open_clip_export(folder: Path, model_cfg: dict | None = None, preprocess_cfg: dict | None = None,
                     seed: int = 0) -> Path:
    """open_clip's hub layout: open_clip_config.json (model_cfg, preprocess_cfg) and open_clip_model.safetensors."""
    model_cfg = dict(TINY_CLIP if model_cfg is None else model_cfg)
    torch.manual_seed(seed)
    model = open_clip.model.CLIP(**model_cfg)
    folder.mkdir(parents=True, exist_ok=True)
    pre = {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711],
           "interpolation": "bicubic", "resize_mode": "shortest"}
    pre.update(preprocess_cfg or {})
    (folder / open_clip.constants.HF_CONFIG_NAME).write_text(
        json.dumps({"model_cfg": model_cfg, "preprocess_cfg": pre}, indent=2))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / open_clip.constants.HF_SAFE_WEIGHTS_NAME))
    return folder


def use_cache(monkeypatch, cache: Path) -> None:
    """Point huggingface_hub at ``cache`` (read when fmaudit looks something up) and forbid downloads."""
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HOME", raising=False)

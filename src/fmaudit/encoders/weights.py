"""Weights of an encoder entry: locate them (local file, Hugging Face hub or cache), check them (sha256), read
them (safetensors, or ``torch.load(weights_only=True)``) and load them strictly.

Whatever library builds the architecture (timm, transformers, open_clip), fmaudit loads the weights itself,
so every encoder goes through one audited path:

- ``source: random``: seeded initialisation (``weights.seed``, default 0) under a forked torch RNG, so building
  an encoder neither depends on nor disturbs the global random state (:mod:`fmaudit.encoders.builders`).
- ``source: file``: a local file; ``sha256`` is checked when given, computed and recorded otherwise.
- ``source: hf_hub``: ``huggingface_hub.hf_hub_download`` into the Hugging Face cache. ``HF_HUB_OFFLINE=1``,
  ``HF_HUB_CACHE`` and ``HF_HOME`` are read when the encoder is built (not when the library was imported), so
  an air-gapped job reads a pre-populated cache and never touches the network. Tokens are left to
  huggingface_hub (``HF_TOKEN`` or a login); fmaudit never reads, passes or logs them.
- A ``weights_path`` argument overrides the entry's source with a local file (format from its suffix); the
  entry's ``sha256``, when it has one, is checked against it too.

:func:`resolve_weights` also says what the weights are (:class:`ResolvedWeights`): every file's sha256 and, for
hub weights, the snapshot commit the requested revision resolved to, for each embedding's provenance.

Formats: safetensors, or torch checkpoints read with ``torch.load(weights_only=True)``; full unpickling only
where the entry says ``allow_pickle: true``. Loading is strict: missing, unexpected or mis-shaped keys raise
:class:`~fmaudit.io.FmauditInputError` naming them.

Pre-flight (before any embedding job): :func:`read_checkpoint_meta` reads a checkpoint's keys and shapes only
(the safetensors header; a torch file mapped to the meta device), :func:`state_dict_mismatch` says how a state
dict does not fit a network, and :func:`cached_weight_files` finds an entry's hub files in the local cache
without downloading anything.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from huggingface_hub import try_to_load_from_cache
from safetensors import SafetensorError, safe_open
from torch import nn

from fmaudit.io import FmauditInputError, sha256_file

_DEFAULT_FILENAMES = {"safetensors": "model.safetensors", "torch": "pytorch_model.bin"}
_COMMIT = re.compile(r"^[0-9a-f]{40}$")

__all__ = ["ResolvedWeights", "cached_hub_file", "cached_weight_files", "checkpoint_format", "extract_state_dict",
           "hub_commit_of", "hub_download", "hub_snapshot", "load_state_dict_strict", "read_checkpoint",
           "read_checkpoint_meta", "resolve_weight_files", "resolve_weights", "state_dict_mismatch",
           "weight_filename"]


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
    """One file of a hub repo through the HF cache; offline mode reads the cache only.

    Parameters
    ----------
    repo_id : str
        The hub repo (``owner/name``).
    filename : str
        The file's path in the repo.
    revision : str or None
        Branch, tag or commit; None: ``main``.
    encoder : str
        The encoder's slug, for messages.

    Returns
    -------
    Path
        The file in the local Hugging Face cache (``.../snapshots/<commit>/<filename>``).

    Raises
    ------
    FmauditInputError
        When the file is not cached and cannot be downloaded (offline, no network), the repo is gated, or the repo,
        revision or file does not exist; each says what to do.
    """
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


def cached_hub_file(repo_id: str, filename: str, revision: str | None = None) -> Path | None:
    """A file of a hub repo at ``revision`` (default: the cache's ``main``) if the local cache holds it, else None;
    never touches the network (huggingface_hub's ``try_to_load_from_cache``).

    Parameters
    ----------
    repo_id : str
        The hub repo (``owner/name``).
    filename : str
        The file's path in the repo.
    revision : str, optional
        Branch, tag or commit.

    Returns
    -------
    Path or None
    """
    hit = try_to_load_from_cache(repo_id, filename, cache_dir=_hub_cache_dir(), revision=revision)
    return Path(hit) if isinstance(hit, str) else None


def hub_snapshot(repo_id: str, revision: str | None, patterns: list[str], encoder: str) -> Path:
    """Config and code files of a hub repo (for transformers configs and remote code).

    Parameters
    ----------
    repo_id : str
        The hub repo (``owner/name``).
    revision : str or None
        Branch, tag or commit; None: ``main``.
    patterns : list of str
        Glob patterns of the files to fetch (``config.json``; ``*.json`` and ``*.py`` for remote code).
    encoder : str
        The encoder's slug, for messages.

    Returns
    -------
    Path
        The snapshot folder in the local cache.

    Raises
    ------
    FmauditInputError
        When the files are not cached and downloads are off or impossible.
    """
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


@dataclass
class ResolvedWeights:
    """The weight files of an encoder entry, checked, and what identifies them.

    ``identity`` is path-free, so the same weights give the same identity on every machine (it keys the
    embedding chunks and is the ``weights`` field of an embedding's provenance): ``source`` (random, file,
    hf_hub or override), the random ``seed``, or the files' ``sha256`` (in order) with, for hub weights, the
    repo, the requested ``revision`` and the ``resolved_commit`` of the cached snapshot. ``files`` lists each
    file's path and sha256, for provenance; ``sha256_checked`` says whether the registry's sha256 was checked
    (it is recorded in any case).

    Parameters
    ----------
    paths : list of Path
        The weight files to read, in order (shards of an index in name order); empty for random init.
    identity : dict of str to Any
        What the weights are, without paths (keys as described above).
    files : list of dict of str to str
        ``{"path", "sha256"}`` of every file.
    sha256_checked : bool
        Whether a registry ``weights.sha256`` was compared (rather than only computed).
    """

    paths: list[Path]
    identity: dict[str, Any]
    files: list[dict[str, str]] = field(default_factory=list)
    sha256_checked: bool = False


def hub_commit_of(path: Path) -> str | None:
    """The commit of the Hugging Face cache snapshot a downloaded file lies in (``.../snapshots/<commit>/...``).

    Parameters
    ----------
    path : Path
        A file in the Hugging Face cache.

    Returns
    -------
    str or None
        The 40-hex commit, or None when the path is not inside a snapshot folder.
    """
    parts = Path(path).parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i - 1] == "snapshots" and _COMMIT.match(parts[i]):
            return parts[i]
    return None


def _check_sha256(name: str, path: Path, expected: str | None, what: str) -> str:
    actual = sha256_file(path)
    if expected and actual != expected.lower():
        raise FmauditInputError(
            f"encoder {name!r}: sha256 of {path} is {actual}, the registry expects {expected} ({what}); the file is "
            f"corrupt or not the weights the entry describes")
    return actual


def resolve_weights(spec: Mapping[str, Any], weights_path: str | os.PathLike | None = None) -> ResolvedWeights:
    """Locate the entry's weight file(s), check them and say what they are (see :class:`ResolvedWeights`).

    A ``weights_path`` override is checked against the registry's ``weights.sha256`` when the entry has one (the
    override is meant to be the same weights, stored locally); otherwise its sha256 is recorded. A local file
    of ``source: file`` likewise. Hub files are hashed and recorded with the snapshot commit they resolved to.

    Parameters
    ----------
    spec : Mapping
        A registry entry (``name``, ``weights`` with ``source``, ``path`` / ``hf_hub_id``, ``revision``,
        ``filename``, ``format``, ``sha256``, ``seed``).
    weights_path : path-like, optional
        A local file that replaces the entry's source.

    Returns
    -------
    ResolvedWeights

    Raises
    ------
    FmauditInputError
        When a file does not exist, a sha256 differs from the registry's, or a hub file cannot be had.
    """
    name = spec.get("name", "?")
    weights = spec["weights"]
    expected = weights.get("sha256")
    if weights_path:
        path = Path(weights_path)
        if not path.is_file():
            raise FmauditInputError(f"encoder {name!r}: weight file {path} (weights_path) does not exist")
        sha = _check_sha256(name, path, expected, "the encoder_weights override")
        return ResolvedWeights([path], {"source": "override", "sha256": [sha]},
                               [{"path": str(path.resolve()), "sha256": sha}], sha256_checked=bool(expected))
    source = weights["source"]
    if source == "random":
        return ResolvedWeights([], {"source": "random", "seed": int(weights.get("seed", 0))})
    if source == "file":
        path = Path(weights["path"])
        if not path.is_file():
            raise FmauditInputError(
                f"encoder {name!r}: weight file {path} (weights.path in the registry) does not exist"
                + ("" if path.is_absolute() else f" (relative to {Path.cwd()})"))
        sha = _check_sha256(name, path, expected, "weights.path")
        return ResolvedWeights([path], {"source": "file", "sha256": [sha]},
                               [{"path": str(path.resolve()), "sha256": sha}], sha256_checked=bool(expected))
    if source != "hf_hub":  # the schema stops other values; keep the error explicit anyway
        raise FmauditInputError(f"encoder {name!r}: unknown weights.source {source!r}")
    repo, revision = weights["hf_hub_id"], weights.get("revision")
    filename = weight_filename(weights)
    first = hub_download(repo, filename, revision, name)
    if filename.endswith(".index.json"):
        shard_names = sorted(set(json.loads(first.read_text())["weight_map"].values()))
        paths = [hub_download(repo, s, revision, name) for s in shard_names]
    else:
        paths = [first]
    shas = [_check_sha256(name, p, expected if len(paths) == 1 else None, f"{repo} {p.name}") for p in paths]
    identity = {"source": "hf_hub", "hf_hub_id": repo, "revision": revision,
                "resolved_commit": hub_commit_of(paths[0]), "sha256": shas}
    files = [{"path": str(p), "sha256": sha} for p, sha in zip(paths, shas)]
    return ResolvedWeights(paths, identity, files, sha256_checked=bool(expected) and len(paths) == 1)


def weight_filename(weights: Mapping[str, Any]) -> str:
    """The weight file of a hub entry: ``weights.filename``, else the format's default name.

    Parameters
    ----------
    weights : Mapping
        The entry's ``weights`` block (``filename``, ``format``).

    Returns
    -------
    str
        ``model.safetensors`` or ``pytorch_model.bin`` by default; an ``*.index.json`` names a sharded checkpoint.
    """
    return weights.get("filename") or _DEFAULT_FILENAMES[weights["format"]]


def cached_weight_files(spec: Mapping[str, Any]) -> list[Path] | None:
    """The hub weight file(s) of an entry as the local cache holds them (every shard of an ``*.index.json``),
    or None when any is not cached; nothing is downloaded. Pre-flight checks read these.

    Parameters
    ----------
    spec : Mapping
        A registry entry with ``weights.source: hf_hub``.

    Returns
    -------
    list of Path or None
    """
    weights = spec["weights"]
    repo, revision = weights["hf_hub_id"], weights.get("revision")
    first = cached_hub_file(repo, weight_filename(weights), revision)
    if first is None:
        return None
    if not first.name.endswith(".index.json"):
        return [first]
    names = sorted(set(json.loads(first.read_text())["weight_map"].values()))
    shards = [cached_hub_file(repo, s, revision) for s in names]
    return None if any(p is None for p in shards) else shards


def resolve_weight_files(spec: Mapping[str, Any], weights_path: str | os.PathLike | None = None) -> list[Path]:
    """The weight file(s) of an entry, checked to exist (and against sha256); [] for random init.

    Parameters
    ----------
    spec : Mapping
        A registry entry.
    weights_path : path-like, optional
        A local file that replaces the entry's source.

    Returns
    -------
    list of Path
        :attr:`ResolvedWeights.paths` of :func:`resolve_weights`.
    """
    return resolve_weights(spec, weights_path).paths


def checkpoint_format(path: Path) -> str:
    """Format of a weights_path override, from its suffix.

    Parameters
    ----------
    path : Path
        The weight file.

    Returns
    -------
    str
        ``safetensors`` for a ``.safetensors`` suffix, ``torch`` for any other.
    """
    return "safetensors" if path.suffix == ".safetensors" else "torch"


def read_checkpoint(path: Path, fmt: str, allow_pickle: bool = False, encoder: str = "?") -> Any:
    """Read a checkpoint file: safetensors, or torch.load(weights_only=True) unless ``allow_pickle``.

    Parameters
    ----------
    path : Path
        The checkpoint file.
    fmt : str
        ``safetensors`` or ``torch``.
    allow_pickle : bool
        Whether a torch file may be fully unpickled (only where the registry entry says ``allow_pickle: true``).
    encoder : str
        The encoder's slug, for messages.

    Returns
    -------
    Any
        A dict of CPU tensors (safetensors), or whatever the torch file holds (often a nested dict).

    Raises
    ------
    FmauditInputError
        When the file cannot be read, or holds objects that ``weights_only`` refuses.
    """
    if fmt == "safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError) as e:
            raise FmauditInputError(f"encoder {encoder!r}: {path} is not a readable safetensors file ({e})") from e
    return _torch_load(path, "cpu", allow_pickle, encoder)


def _torch_load(path: Path, map_location: str, allow_pickle: bool, encoder: str) -> Any:
    """``torch.load`` onto ``map_location`` (``weights_only`` unless ``allow_pickle``), its refusals and read errors
    as FmauditInputError naming the encoder and file."""
    try:
        return torch.load(path, map_location=map_location, weights_only=not allow_pickle)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FmauditInputError(
            f"encoder {encoder!r}: refused to unpickle {path}: it holds objects other than tensors and plain "
            f"containers ({first}). Convert it to safetensors, or, only if you trust the file, set "
            f"weights.allow_pickle: true in the registry entry") from e
    except (RuntimeError, OSError, EOFError) as e:
        raise FmauditInputError(f"encoder {encoder!r}: cannot read torch checkpoint {path} ({e})") from e


def read_checkpoint_meta(path: Path, fmt: str, allow_pickle: bool = False, encoder: str = "?") -> dict[str, Any]:
    """A checkpoint's tensors as meta tensors (keys, shapes and dtypes; no weights in memory): the safetensors
    header, or a torch file loaded onto the meta device (``weights_only`` unless ``allow_pickle``). Nested
    containers are kept as they are, so :func:`extract_state_dict` applies to the result as to a real load.

    Parameters
    ----------
    path : Path
        The checkpoint file.
    fmt : str
        ``safetensors`` or ``torch``.
    allow_pickle : bool
        Whether a torch file may be fully unpickled.
    encoder : str
        The encoder's slug, for messages.

    Returns
    -------
    dict of str to Any
        Key -> meta tensor (safetensors), or the torch file's contents with meta tensors.

    Raises
    ------
    FmauditInputError
        When the file cannot be read, or holds objects that ``weights_only`` refuses.
    """
    if fmt == "safetensors":
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                tensors = {}
                for key in f.keys():
                    view = f.get_slice(key)
                    dtype = _SAFETENSORS_DTYPES.get(view.get_dtype(), torch.float32)
                    tensors[key] = torch.empty(view.get_shape(), dtype=dtype, device="meta")
                return tensors
        except (SafetensorError, OSError) as e:
            raise FmauditInputError(f"encoder {encoder!r}: {path} is not a readable safetensors file ({e})") from e
    return _torch_load(path, "meta", allow_pickle, encoder)


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                       "BOOL": torch.bool}


def extract_state_dict(obj: Any, weights: Mapping[str, Any], source: str,
                       encoder: str = "?") -> dict[str, torch.Tensor]:
    """The tensor dict inside a checkpoint: ``state_dict_key``, then ``strip_prefix``, ``drop_keys_with_prefix``.

    Parameters
    ----------
    obj : Any
        What the checkpoint file held (:func:`read_checkpoint`).
    weights : Mapping
        The entry's ``weights`` block (``state_dict_key``, ``strip_prefix``, ``drop_keys_with_prefix``).
    source : str
        The file, for messages.
    encoder : str
        The encoder's slug, for messages.

    Returns
    -------
    dict of str to Tensor
        A flat state dict.

    Raises
    ------
    FmauditInputError
        When ``state_dict_key`` is absent, or what remains is not a flat mapping of tensors.
    """
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


def _without_non_persistent(module: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # checkpoint entries for non-persistent buffers (e.g. ``position_ids`` saved by older transformers releases)
    # are recomputed, not learnt
    own = module.state_dict()
    non_persistent = {n for n, _ in module.named_buffers()} - set(own)
    return {k: v for k, v in state_dict.items() if k not in non_persistent}


def state_dict_mismatch(module: nn.Module, state_dict: Mapping[str, Any]) -> str | None:
    """How ``state_dict`` (real or meta tensors) does not fit ``module``'s keys and shapes: missing, unexpected and
    mis-shaped keys in one line, or None when it fits. ``module`` may live on the meta device.

    Parameters
    ----------
    module : nn.Module
        The network the state dict is for.
    state_dict : Mapping
        Key -> tensor (real or meta).

    Returns
    -------
    str or None
    """
    own = module.state_dict()
    sd = _without_non_persistent(module, state_dict)
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    mis_shaped = [f"{k} (checkpoint {tuple(sd[k].shape)}, model {tuple(own[k].shape)})"
                  for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    parts = []
    if missing:
        parts.append(f"missing keys: {_sample(missing)}")
    if unexpected:
        parts.append(f"unexpected keys: {_sample(unexpected)}")
    if mis_shaped:
        parts.append(f"shape mismatches: {_sample(mis_shaped, 3)}")
    return "; ".join(parts) or None


def load_state_dict_strict(module: nn.Module, state_dict: Mapping[str, torch.Tensor], source: str,
                           encoder: str = "?") -> None:
    """Strict load; missing, unexpected and mis-shaped keys are reported together in one clear error
    (:func:`state_dict_mismatch`). Entries of the module's non-persistent buffers are ignored.

    Parameters
    ----------
    module : nn.Module
        The network, loaded in place.
    state_dict : Mapping of str to Tensor
        The checkpoint's state dict (:func:`extract_state_dict`).
    source : str
        The weight file(s), for messages.
    encoder : str
        The encoder's slug, for messages.

    Raises
    ------
    FmauditInputError
        When the keys or shapes do not fit (:func:`state_dict_mismatch`).
    """
    problem = state_dict_mismatch(module, state_dict)
    if problem:
        raise FmauditInputError(f"encoder {encoder!r}: the weights in {source} do not fit the architecture; {problem}")
    module.load_state_dict(_without_non_persistent(module, state_dict), strict=True)

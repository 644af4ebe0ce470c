"""Pre-flight checks of an encoder before any embedding job: what would otherwise fail inside a GPU job.

:func:`check_encoder_before_embedding` runs, for one encoder as a config uses it, every check that needs no
weights in memory and no download:

- ``hub_config``: the entry against its hub repo's cached config
  (:func:`fmaudit.encoders.hub.check_against_hub_config`);
- ``sha256``: every local weight file with an expected checksum (the registry's ``weights.sha256``; for a
  config's ``encoder_weights`` override too, which is meant to be the same weights) is hashed and compared;
- ``state_dict``: each local weight file's keys and shapes (the safetensors header, or a torch file mapped onto
  the meta device) against the architecture built on the meta device, after the entry's state_dict_key,
  strip_prefix, drop_keys_with_prefix and checkpoint filters, exactly as the embedding job's strict load sees
  them (:func:`fmaudit.encoders.builders.network_state`).

Local weight files are the override, a ``source: file`` path that exists, or hub files already in the local
cache; hub weights not cached yet are downloaded by the job and checked there. A torch file whose entry sets
``allow_pickle`` is not read before the job (unpickling it runs code). Every failure names the encoder, the file
and the key; all are reported together. :class:`PreflightRecord` says what was checked, for the validation log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from fmaudit.encoders.builders import build_network, network_state
from fmaudit.encoders.hub import check_against_hub_config
from fmaudit.encoders.weights import cached_hub_file, cached_weight_files, checkpoint_format, state_dict_mismatch
from fmaudit.io import FmauditInputError, PathLike, sha256_file

__all__ = ["PreflightRecord", "check_encoder_before_embedding", "local_weight_files"]


@dataclass
class PreflightRecord:
    """What :func:`check_encoder_before_embedding` checked for one encoder: ``files`` (path and sha256 where it
    was computed), ``hub_config`` (the config files compared, or None), ``checks`` (check -> what it found) and
    ``skipped`` (check -> why it could not run before the job).

    Parameters
    ----------
    encoder : str
        The encoder's slug.
    files : list of dict
        One ``{"path": ..., "sha256": ...}`` per local weight file (``sha256`` only where it was computed).
    hub_config : list of str or None
        The cached hub config files the entry was compared with; None when none was cached.
    checks : dict of str to str
        Check (``hub_config``, ``sha256``, ``state_dict``) -> what it found.
    skipped : dict of str to str
        Check -> why it could not run before the embedding job.
    """

    encoder: str
    files: list[dict[str, Any]] = field(default_factory=list)
    hub_config: list[str] | None = None
    checks: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The record as plain data, for the JSON file of the validation folder.

        Returns
        -------
        dict of str to Any
            Keys ``encoder``, ``files``, ``hub_config``, ``checks``, ``skipped``.
        """
        return {"encoder": self.encoder, "files": self.files, "hub_config": self.hub_config, "checks": self.checks,
                "skipped": self.skipped}


def local_weight_files(spec: Mapping[str, Any], override: PathLike | None = None) -> list[Path]:
    """The weight files of an entry that are on this machine now: the override, an existing ``source: file``
    path, or the hub files in the local cache (all shards, or none); [] for random init or nothing local.

    Parameters
    ----------
    spec : Mapping
        The registry entry (its ``weights``: ``source``, ``path``, hub id and revision).
    override : path-like, optional
        The config's ``encoder_weights.<slug>`` file; when given it is the only candidate.

    Returns
    -------
    list of Path
    """
    weights = spec["weights"]
    if override:
        return [Path(override)] if Path(override).is_file() else []
    if weights["source"] == "file":
        return [Path(weights["path"])] if Path(weights["path"]).is_file() else []
    if weights["source"] == "hf_hub":
        return cached_weight_files(spec) or []
    return []


def _file_format(spec: Mapping[str, Any], override: PathLike | None) -> str:
    return checkpoint_format(Path(override)) if override else spec["weights"]["format"]


def _config_readable(spec: Mapping[str, Any]) -> bool:
    """Whether the architecture can be built without a download: always, except a transformers entry without an
    inline config whose config.json is not cached (or whose code lives in the repo)."""
    if spec["loader"] != "transformers" or spec["architecture"].get("config"):
        return True
    weights = spec["weights"]
    if spec.get("trust_remote_code") or weights["source"] != "hf_hub":
        return False
    return cached_hub_file(weights["hf_hub_id"], "config.json", weights.get("revision")) is not None


def check_encoder_before_embedding(name: str, spec: Mapping[str, Any], override: PathLike | None = None,
                                   override_key: str | None = None,
                                   source: str = "encoder registry") -> PreflightRecord:
    """Every pre-flight check of one encoder (module doc); raise one :class:`FmauditInputError` listing every
    failure, each naming the encoder, file and key. ``override``: the config's local weight file for it, named in
    messages as ``override_key`` (``encoder_weights.<slug>``); ``source``: the registry file, for messages.

    Parameters
    ----------
    name : str
        The encoder's slug.
    spec : Mapping
        Its registry entry as the config sees it (``encoder_revisions`` applied).
    override : path-like, optional
        The config's local weight file for it.
    override_key : str, optional
        The config key of ``override``, for messages.
    source : str
        The registry file the entry comes from, for messages.

    Returns
    -------
    PreflightRecord
        What was checked and what was skipped.

    Raises
    ------
    FmauditInputError
        One error listing every failed check.
    """
    spec = {**spec, "name": name}
    record = PreflightRecord(name)
    problems: list[str] = []
    try:
        hub = check_against_hub_config(spec, source=source)
        record.hub_config = [str(p) for p in hub.files] if hub is not None else None
        record.checks["hub_config"] = "matches" if hub is not None else "no cached config to compare"
    except FmauditInputError as e:
        problems.append(str(e))
    weights = spec["weights"]
    files = local_weight_files(spec, override)
    where = f"config '{override_key}'" if override and override_key else (
        "weights.path" if weights["source"] == "file" else f"Hugging Face cache of {weights.get('hf_hub_id')}")
    expected = weights.get("sha256")
    for path in files:
        entry: dict[str, Any] = {"path": str(path)}
        if expected and len(files) == 1:
            actual = sha256_file(path)
            entry["sha256"] = actual
            if actual != expected.lower():
                problems.append(f"{source}: encoder {name!r}: sha256 of {path} ({where}) is {actual}, but "
                                f"weights.sha256 is {expected}; the file is corrupt or not the weights the entry "
                                f"describes")
        record.files.append(entry)
    if expected and len(files) == 1:
        record.checks["sha256"] = "checked against weights.sha256"
    elif files:
        record.skipped["sha256"] = "no weights.sha256 to compare with (recorded by the embedding job)"
    if not files:
        record.skipped["state_dict"] = "no local weight file yet (random init, or downloaded by the job)"
    elif weights.get("allow_pickle") and _file_format(spec, override) == "torch":
        record.skipped["state_dict"] = "allow_pickle: the torch file is unpickled by the job only"
    elif not _config_readable(spec):
        record.skipped["state_dict"] = "the architecture's config.json is not cached (fetched by the job)"
    else:
        try:
            with torch.device("meta"):
                model = build_network(spec)
            state = network_state(spec, model, files, overridden=override is not None, meta=True)
            problem = state_dict_mismatch(model, state)
        except FmauditInputError as e:  # an unreadable file, a state_dict_key it lacks ...
            problems.append(f"{source}: {e} ({where})")
        else:
            if problem:
                shown = ", ".join(map(str, files))
                problems.append(f"{source}: encoder {name!r}: the weights in {shown} ({where}) do not fit the "
                                f"architecture built from the entry; {problem}")
            else:
                record.checks["state_dict"] = f"{len(state)} tensors fit the architecture (keys and shapes)"
    if problems:
        raise FmauditInputError("\n".join(problems))
    return record

"""Encoders built once per process.

A job that embeds several outputs (a cell section at every magnification; the command line on several data sets)
asks :data:`ENCODER_CACHE` for its encoder instead of building it: the first request builds it (the checkpoint
read and checked, the network moved to the device) and logs one ``loaded encoder`` line with the process's count,
every later request of the same encoder, weights and device gets the same object. It holds the last encoder only
(a job embeds with one encoder; a long process, such as a test session, does not keep every encoder it built).
On a cluster, where loading the
largest encoders takes about a minute, that is what a job over several outputs saves; the line is what the tests
count (one load per encoder per process).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from typing import Any, Mapping

import torch

from fmaudit.encoders.builders import Encoder, build_encoder
from fmaudit.encoders.weights import ResolvedWeights
from fmaudit.io import stable_hash
from fmaudit.registry import encoder_config_hash

__all__ = ["ENCODER_CACHE", "EncoderCache", "LOADED_MESSAGE"]

#: The log line of a build (its first words are what a test or a user greps for).
LOADED_MESSAGE = "loaded encoder %s on %s in %.1f s (load %d of %s in process %d)"

log = logging.getLogger(__name__)


def _weights_identity(weights_path: str | os.PathLike | None, resolved: ResolvedWeights | None) -> str:
    """What identifies the weights: the resolved files' identity (sha256), else the override's path, size and
    modification time (a file rewritten in place is another checkpoint)."""
    if resolved is not None:
        return stable_hash(resolved.identity)
    if not weights_path:
        return ""
    stat = os.stat(weights_path)
    return f"{os.path.abspath(weights_path)}:{stat.st_size}:{stat.st_mtime_ns}"


class EncoderCache:
    """The last encoder built, by (entry's config hash, weights, device); ``loads`` counts builds per name."""

    def __init__(self) -> None:
        self._key: tuple[str, str, str] | None = None
        self._encoder: Encoder | None = None
        self.loads: Counter[str] = Counter()

    def get(self, spec: Mapping[str, Any], weights_path: str | os.PathLike | None = None,
            device: str | torch.device = "cpu", resolved: ResolvedWeights | None = None,
            logger: logging.Logger | None = None) -> Encoder:
        """The encoder of ``spec`` on ``device``, built on the first request (see :func:`build_encoder`).

        Parameters
        ----------
        spec : Mapping
            The encoder's registry entry (with ``name``); its config hash is part of the cache key.
        weights_path : path-like, optional
            A local weight file overriding the entry's weights.
        device : str or torch.device
            Where the encoder runs.
        resolved : ResolvedWeights, optional
            The weights already resolved (:func:`~fmaudit.encoders.weights.resolve_weights`); their sha256 identity
            keys the cache.
        logger : logging.Logger, optional
            Where the ``loaded encoder`` line goes; None: this module's logger.

        Returns
        -------
        Encoder
            The cached encoder when entry, weights and device are those of the last request, else a newly built one
            (which replaces it).
        """
        name = spec.get("name", "?")
        key = (encoder_config_hash(spec), _weights_identity(weights_path, resolved), str(torch.device(device)))
        if key != self._key or self._encoder is None:
            self.clear()
            start = time.perf_counter()
            encoder = build_encoder(spec, weights_path=weights_path, device=device, resolved=resolved)
            self.loads[name] += 1
            (logger or log).info(LOADED_MESSAGE, name, device, time.perf_counter() - start, self.loads[name], name,
                                 os.getpid())
            self._key, self._encoder = key, encoder
        return self._encoder

    def clear(self) -> None:
        """Drop the encoder (its memory is freed once nothing else holds it); the counts stay."""
        self._key, self._encoder = None, None


#: The process's cache (a Snakemake script job is one process).
ENCODER_CACHE = EncoderCache()

"""The embedding job: one data set's manifest embedded by one encoder (resumable in chunks, see
:mod:`fmaudit.embed`)."""

from __future__ import annotations

from typing import Any, Mapping

from fmaudit.io import FmauditInputError, read_table
from fmaudit.logs import setup_logging

__all__ = ["embed_job"]


def embed_job(encoder: str, spec: Mapping[str, Any], manifest: str, out: str, weights: str | None,
              batch_size: int, threads: int, log: str | None = None, key: str | None = None) -> None:
    """Embed ``manifest`` with ``spec`` (the number-deciding part of ``encoder``'s registry entry,
    :func:`fmaudit.registry.embedding_spec`) into ``out``; ``weights`` is a local checkpoint that overrides the
    entry's weight source (None for the entry's own). ``key``: the embedding key the workflow put in ``out``'s
    path, checked against ``spec`` and ``weights`` so that a file never lies under another key's folder."""
    from fmaudit.devices import resolve_device
    from fmaudit.embed import embed_manifest
    from fmaudit.registry import embedding_key

    logger = setup_logging(log)
    spec = dict(spec)
    spec.setdefault("name", encoder)
    if key is not None and embedding_key(spec, weights) != key:
        raise FmauditInputError(
            f"{out}: the embedding key in its path is {key}, but encoder {encoder!r} with these settings has key "
            f"{embedding_key(spec, weights)}; the workflow's parameters and paths disagree")
    man = read_table(manifest)
    device = resolve_device("auto", logger)
    logger.info("embedding %d items of %s with %s on %s", len(man), manifest, encoder, device)
    # on a GPU, worker processes decode images while the GPU computes; on the CPU the workers would only
    # compete with the model for the same cores
    workers = max(0, int(threads) - 1) if device.type == "cuda" else 0
    # overwrite: the workflow reruns this job only when what decides the numbers changed (its parameters, its
    # manifest); a kept file of another provenance is the previous result, replaced atomically at the end
    embed_manifest(man, spec, out, batch_size=batch_size, num_workers=workers, num_threads=int(threads),
                   weights_path=weights, log=logger, device=device, overwrite=True)

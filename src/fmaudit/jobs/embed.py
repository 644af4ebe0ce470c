"""The embedding job: one data set's manifest embedded by one encoder (resumable in chunks, see
:mod:`fmaudit.embed`)."""

from __future__ import annotations

from typing import Any, Mapping

from fmaudit.io import read_table
from fmaudit.logs import setup_logging

__all__ = ["embed_job"]


def embed_job(encoder: str, spec: Mapping[str, Any], manifest: str, out: str, weights: str | None,
              batch_size: int, threads: int, log: str | None = None) -> None:
    """Embed ``manifest`` with the registry entry ``spec`` of ``encoder`` into ``out``; ``weights`` is a local
    checkpoint that overrides the entry's weight source (None for the entry's own)."""
    from fmaudit.embed import embed_manifest

    logger = setup_logging(log)
    man = read_table(manifest)
    spec = dict(spec)
    spec.setdefault("name", encoder)
    logger.info("embedding %d items of %s with %s", len(man), manifest, encoder)
    # GPU jobs decode images in worker processes while the GPU computes; on CPU the workers would only
    # compete with the model for the same cores
    workers = max(0, int(threads) - 1) if spec.get("gpu", False) else 0
    embed_manifest(man, spec, out, batch_size=batch_size, num_workers=workers, num_threads=int(threads),
                   weights_path=weights, log=logger)

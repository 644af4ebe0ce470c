"""The embedding job: one data set's manifest embedded by one encoder (resumable in chunks, see
:mod:`fmaudit.embed`). The workflow's embed rule and ``fmaudit embed`` both run :func:`embed_job`."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.io import FmauditInputError, read_table
from fmaudit.logs import setup_logging
from fmaudit.registry import embedding_key

__all__ = ["embed_job"]


def embed_job(encoder: str, spec: Mapping[str, Any], manifest: str | pd.DataFrame, out: str, weights: str | None,
              batch_size: int, threads: int, log: str | None = None, key: str | None = None, chunk_size: int = 256,
              readouts: Sequence[str] | None = None, features_readout: str | None = None,
              overwrite: bool = True, device: str = "auto") -> dict[str, Any]:
    """Embed ``manifest`` (a manifest file, or the table itself) with ``spec`` (the part of ``encoder``'s entry
    the job takes, :func:`fmaudit.registry.embedding_spec`) into ``out``; ``weights`` is a local checkpoint that
    overrides the entry's weight source (None for the entry's own). ``key``: the embedding key the workflow put
    in ``out``'s path, checked against ``spec`` and ``weights`` so that a file never lies under another key's
    folder. ``overwrite``: replace an output of other provenance (the workflow reruns a job only when what
    decides its numbers changed; ``fmaudit embed`` refuses unless asked). Returns the output's provenance.

    Parameters
    ----------
    encoder : str
        The encoder's name (registry slug or hub name), logged and recorded in the provenance.
    spec : Mapping
        The embedding part of the encoder's registry entry (:func:`fmaudit.registry.embedding_spec`: loader,
        architecture, preprocessing, readouts ...).
    manifest : str or DataFrame
        A manifest file, or the manifest table (one row per item with ``item_id`` and ``path``).
    out : str
        The embeddings file to write (``.npz`` in the workflow's layout, or ``.h5``).
    weights : str or None
        A local checkpoint replacing the entry's weight source; None uses the entry's own weights.
    batch_size : int
        Images per forward pass.
    threads : int
        Torch threads; on a GPU, ``threads - 1`` data-loader workers decode images besides.
    log : str, optional
        Log file; None logs to stderr.
    key : str, optional
        The embedding key in ``out``'s path (workflow only), checked against ``spec`` and ``weights``.
    chunk_size : int
        Items per resumable chunk: an interrupted job reuses the chunks it finished.
    readouts : sequence of str, optional
        Readouts to write (``cls``, ``mean`` ...); None: the entry's.
    features_readout : str, optional
        The readout also stored as ``features`` in an ``.h5`` output; None: the entry's default readout.
    overwrite : bool
        Replace an existing output of other provenance (True in the workflow; ``fmaudit embed`` refuses without
        ``--overwrite``).
    device : str
        ``auto`` (a GPU when one is visible), ``cpu``, ``cuda`` or ``cuda:N``.

    Returns
    -------
    dict
        The output's provenance: ``n_items``, ``embed_dim`` (readout -> width), ``features_readout``, the weights'
        sha256, ``device``, ``images_per_s`` and the encoder's config hash, among others.

    Raises
    ------
    FmauditInputError
        When ``key`` is not the key of ``spec`` and ``weights`` (the workflow's params and paths disagree).
    """
    # imported here: torch and PIL load only when this runs
    from fmaudit.devices import resolve_device
    from fmaudit.embed import embed_manifest

    logger = setup_logging(log)
    spec = dict(spec)
    spec.setdefault("name", encoder)
    if key is not None and embedding_key(spec, weights) != key:
        raise FmauditInputError(
            f"{out}: the embedding key in its path is {key}, but encoder {encoder!r} with these settings has key "
            f"{embedding_key(spec, weights)}; the workflow's parameters and paths disagree")
    man = read_table(manifest) if isinstance(manifest, str) else manifest
    dev = resolve_device(device, logger)
    logger.info("embedding %d items of %s with %s on %s", len(man), manifest if isinstance(manifest, str)
                else "the given images", encoder, dev)
    # on a GPU, worker processes decode images while the GPU computes; on the CPU the workers would only
    # compete with the model for the same cores
    workers = max(0, int(threads) - 1) if dev.type == "cuda" else 0
    return embed_manifest(man, spec, out, batch_size=batch_size, num_workers=workers, num_threads=int(threads),
                          weights_path=weights, log=logger, device=dev, overwrite=overwrite, chunk_size=chunk_size,
                          readouts=readouts, features_readout=features_readout)

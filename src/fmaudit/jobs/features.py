"""The import job of embeddings computed elsewhere (a ``features`` data set): one encoder's feature file written as
the embeddings file an embedding job would write (:mod:`fmaudit.embed`), so the probe suite, OOD and prior shift
read it exactly as they read computed embeddings. No encoder is built and no image read."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from fmaudit.datasets.own import read_feature_file
from fmaudit.io import FmauditInputError, dataframe_hash, provenance, read_table, sha256_file, write_npz
from fmaudit.logs import setup_logging
from fmaudit.registry import embedding_key, encoder_config_hash, readout_dims

__all__ = ["EMBEDDING_FEATURE_PREFIX", "import_features_job"]

#: The array name prefix of a readout in an embeddings file (``fmaudit.embed.FEATURE_PREFIX``; this job runs in the
#: slides environment, without torch, so it does not import the embedding engine).
EMBEDDING_FEATURE_PREFIX = "feat__"


def _aligned(feats: np.ndarray, ids: np.ndarray, items: pd.Series, where: str) -> np.ndarray:
    """Rows of ``feats`` (labelled ``ids``) in the order of ``items``; duplicates and missing items are errors."""
    index = pd.Index(np.asarray(ids, dtype=str))
    if index.has_duplicates:
        raise FmauditInputError(f"{where}: item id {index[index.duplicated()][0]!r} occurs more than once")
    pos = index.get_indexer(items.astype(str))
    if (pos < 0).any():
        missing = items[pos < 0].astype(str).tolist()
        raise FmauditInputError(f"{where}: {len(missing)} item(s) of the manifest are not in the file, e.g. "
                                + ", ".join(repr(m) for m in missing[:5]))
    return np.asarray(feats)[pos]


def import_features_job(encoder: str, spec: Mapping[str, Any], manifest: str, features: str, out: str,
                        source: Mapping[str, Any], log: str | None = None, key: str | None = None) -> None:
    """Write ``features`` (``source``: its ``features_key``, ``ids_key`` and ``readout``, see
    :func:`fmaudit.datasets.own.feature_encoders`) as ``encoder``'s embeddings of ``manifest`` in ``out``: the
    manifest's items in its order, the readout ``source["readout"]`` or the encoder's default; provenance as an
    embedding's, with the file's sha256 as the weights' identity. Non-finite features, items missing from the
    file and a width other than the encoder entry's are errors naming the file.

    Parameters
    ----------
    encoder : str
        The encoder the features are declared as (registry slug).
    spec : Mapping
        The embedding part of its registry entry (``readouts``, ``default_readout``, ``loader``, dims).
    manifest : str
        The data set's manifest file; its ``item_id`` order is the output's row order.
    features : str
        The feature file (``.npz`` or ``.h5``) holding a feature array and an id array.
    out : str
        The embeddings file to write (``item_id`` and ``feat__<readout>``, float32, with provenance).
    source : Mapping
        Where the arrays are in ``features``: ``features_key`` (default ``features``), ``ids_key`` and ``readout``
        (default: the entry's default readout).
    log : str, optional
        Log file; None logs to stderr.
    key : str, optional
        The embedding key in ``out``'s path (workflow only), checked against ``spec``.

    Raises
    ------
    FmauditInputError
        When ``key`` disagrees with ``spec``, an id is duplicated or a manifest item is missing from the file, a
        feature is not finite, or the width differs from the registry entry's for that readout.
    """
    logger = setup_logging(log)
    spec = dict(spec)
    spec.setdefault("name", encoder)
    if key is not None and embedding_key(spec) != key:
        raise FmauditInputError(f"{out}: the embedding key in its path is {key}, but encoder {encoder!r} has key "
                                f"{embedding_key(spec)}; the workflow's parameters and paths disagree")
    man = read_table(manifest)
    readout = source.get("readout") or spec.get("default_readout") or spec["readouts"][0]
    ids, feats = read_feature_file(features, source.get("ids_key"), source.get("features_key") or "features")
    logger.info("importing %s: %d items x %d dims as encoder %s, readout %s", features, feats.shape[0],
                feats.shape[1], encoder, readout)
    x = _aligned(feats, ids, man["item_id"], f"{features} (features of encoder {encoder!r})")
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        first = str(man["item_id"].iloc[int(np.flatnonzero(bad)[0])])
        raise FmauditInputError(f"{features}: non-finite features for {int(bad.sum())} item(s), first {first!r}")
    if readout in spec.get("readouts", []) and spec.get("loader") != "precomputed":
        declared = readout_dims(spec, [readout])[readout]
        if declared != x.shape[1]:
            raise FmauditInputError(f"{features}: {x.shape[1]}-dim features, but encoder {encoder!r}'s registry "
                                    f"entry gives readout {readout!r} {declared} dims: features of another encoder?")
    digest = sha256_file(features)
    weights = {"source": "precomputed", "file": str(features), "sha256": [digest]}
    prov = provenance(encoder=encoder, encoder_config_hash=encoder_config_hash(spec),
                      manifest_hash=dataframe_hash(man), readouts=[readout], weights=weights,
                      embedding_key=embedding_key(spec), weight_files=[{"path": str(features), "sha256": digest}],
                      weights_sha256_checked=False, n_items=int(len(man)), embed_dim={readout: int(x.shape[1])},
                      images_per_s=None, device="none (imported)", precision="float32", imported_from=str(features),
                      imported_keys={k: source.get(k) for k in ("features_key", "ids_key")})
    write_npz(out, {"item_id": np.asarray(man["item_id"].astype(str), dtype=str), EMBEDDING_FEATURE_PREFIX + readout:
                    np.ascontiguousarray(x, dtype=np.float32)}, prov)
    logger.info("wrote %s (%d items; readout %s, %d dims; file sha256 %s)", out, len(man), readout, x.shape[1], digest)

"""Exposure audit: which evaluation data sets an encoder may have seen in pretraining (hema paper).

An encoder that was pretrained on a data set it is then evaluated on measures transfer to a seen domain, not
held-out generalisation; the hema paper found three of its four hematology data sets in DinoBloom's corpus. This
module reports that status for every (encoder, data set) pair, to sit beside every table that ranks encoders.

Sources, in order of precedence:

1. The encoder entry's ``exposure:`` mapping (resources/encoders.yaml): data-set slug or alias ->
   ``{status: yes|no|unknown, evidence: text}``, for facts the corpus text cannot carry (e.g. a data set the
   authors held out).
2. The entry's ``pretraining_corpora`` text, searched for each data set's slug and ``aliases:``
   (resources/datasets.yaml) as whole words, case-insensitively: a match is ``yes``, with the matching
   corpus line as evidence.
3. Otherwise: ``no`` for an encoder with no pretraining (random initialisation: an empty corpus list and
   ``weights.source: random``), else ``unknown``: a corpus that does not name a data set may still contain it
   (web-scale and proprietary corpora), so silence is never read as ``no``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import pandas as pd

from fmaudit.io import FmauditInputError

EXPOSURE_STATUSES = ("yes", "no", "unknown")
EXPOSURE_COLUMNS = ["encoder", "dataset", "exposure", "evidence"]


def dataset_names(slug: str, entry: Mapping[str, Any] | None) -> list[str]:
    """The slug and the registry aliases of a data set (what a corpus description may call it).

    Parameters
    ----------
    slug : str
        The data set's registry slug.
    entry : mapping or None
        Its registry entry (``aliases`` is read); None: no aliases.

    Returns
    -------
    list of str
        The slug first, then the aliases in registry order.

    Raises
    ------
    FmauditInputError
        When an alias is not a non-empty string.
    """
    aliases = list((entry or {}).get("aliases") or [])
    if any(not isinstance(a, str) or not a.strip() for a in aliases):
        raise FmauditInputError(f"dataset registry {slug!r}: aliases must be non-empty strings, got {aliases!r}")
    return [slug, *aliases]


def _mentions(text: str, name: str) -> bool:
    # whole words: "PBC" must not match inside another word, and "-" or "_" inside a name stay literal
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", text, flags=re.IGNORECASE) is not None


def exposure_status(encoder: str, encoder_entry: Mapping[str, Any], dataset: str,
                    dataset_entry: Mapping[str, Any] | None) -> tuple[str, str]:
    """(status, evidence) of one pair; see the module doc for the rules.

    Parameters
    ----------
    encoder : str
        The encoder's slug, named in errors.
    encoder_entry : mapping
        Its registry entry: ``exposure``, ``pretraining_corpora`` and ``weights.source`` are read.
    dataset : str
        The data set's slug.
    dataset_entry : mapping or None
        Its registry entry (for ``aliases``).

    Returns
    -------
    tuple of (str, str)
        The status (``yes``, ``no`` or ``unknown``) and the evidence, a sentence naming its source.

    Raises
    ------
    FmauditInputError
        When a declared ``exposure`` status is not one of ``EXPOSURE_STATUSES``, or an alias is invalid.
    """
    names = dataset_names(dataset, dataset_entry)
    declared = encoder_entry.get("exposure") or {}
    for name in names:
        if name in declared:
            fact = declared[name]
            status = str(fact.get("status", "")) if isinstance(fact, Mapping) else ""
            if status not in EXPOSURE_STATUSES:
                raise FmauditInputError(f"encoder registry {encoder!r}: exposure.{name}.status must be one of "
                                        f"{', '.join(EXPOSURE_STATUSES)}, got {status!r}")
            return status, f"declared in the encoder registry: {fact.get('evidence', '')}".rstrip(": ")
    corpora = [str(c) for c in encoder_entry.get("pretraining_corpora") or []]
    for corpus in corpora:
        hits = [n for n in names if _mentions(corpus, n)]
        if hits:
            return "yes", f"pretraining corpus names {hits[0]!r}: {corpus}"
    if not corpora and (encoder_entry.get("weights") or {}).get("source") == "random":
        return "no", "random initialisation: no pretraining"
    if not corpora:
        return "unknown", "no pretraining corpus listed in the encoder registry"
    return "unknown", "not named in the listed pretraining corpora: " + "; ".join(corpora)


def exposure_audit(encoders: Sequence[str], datasets: Sequence[str], encoder_registry: Mapping[str, Any],
                   dataset_registry: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (encoder, data set): ``exposure`` yes / no / unknown and the ``evidence`` for it.

    Unknown encoder or data-set names are errors that list the registry's names.

    Parameters
    ----------
    encoders : sequence of str
        Encoder slugs, in the order the rows take.
    datasets : sequence of str
        Data-set slugs, in the order the rows take within an encoder.
    encoder_registry : mapping
        Encoder slug -> registry entry.
    dataset_registry : mapping
        Data-set slug -> registry entry.

    Returns
    -------
    DataFrame
        Columns ``encoder``, ``dataset``, ``exposure``, ``evidence`` (:data:`EXPOSURE_COLUMNS`), one row per pair,
        encoders outermost.

    Raises
    ------
    FmauditInputError
        On an unknown encoder or data set, and as :func:`exposure_status` does.
    """
    for kind, names, registry in (("encoder", encoders, encoder_registry), ("dataset", datasets, dataset_registry)):
        unknown = [n for n in names if n not in registry]
        if unknown:
            raise FmauditInputError(f"exposure audit: unknown {kind}(s) {unknown}; "
                                    f"known: {', '.join(sorted(registry))}")
    rows = []
    for enc in encoders:
        for ds in datasets:
            status, evidence = exposure_status(enc, encoder_registry[enc], ds, dataset_registry[ds])
            rows.append({"encoder": enc, "dataset": ds, "exposure": status, "evidence": evidence})
    return pd.DataFrame(rows, columns=EXPOSURE_COLUMNS)


def exposure_matrix(audit: pd.DataFrame) -> pd.DataFrame:
    """The audit as an encoder x data-set grid of statuses (for a column beside a ranking table).

    Parameters
    ----------
    audit : DataFrame
        What :func:`exposure_audit` returns.

    Returns
    -------
    DataFrame
        Index the encoders, columns the data sets (both in the audit's first-seen order), values the statuses.
    """
    return audit.pivot(index="encoder", columns="dataset", values="exposure").reindex(
        index=list(dict.fromkeys(audit["encoder"])), columns=list(dict.fromkeys(audit["dataset"])))

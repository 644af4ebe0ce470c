"""The embeddings chapter of the report: one row per embedding file, from its provenance
(:func:`fmaudit.embed.embedding_inventory`)."""

from __future__ import annotations

import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report.chapter import Chapter, ReportWriter
from fmaudit.report.formatting import fill_missing

__all__ = ["CHAPTER"]


def write_embeddings_chapter(inventory: pd.DataFrame | None, writer: ReportWriter) -> list[str]:
    """Write the ``embeddings`` table (the provenance of every embedding file); return the chapter's lines.

    Parameters
    ----------
    inventory : DataFrame or None
        One row per embedding file (:func:`fmaudit.embed.embedding_inventory`: encoder, data set, weights hash,
        images per second ...); ``None``: no embedding was planned.
    writer : ReportWriter
        Where the table goes.

    Returns
    -------
    list of str
        The chapter's heading and the table as Markdown, each missing cell saying why.
    """
    inventory = inventory if inventory is not None else pd.DataFrame({"note": ["no embeddings were planned"]})
    writer.table("embeddings", inventory)
    shown = fill_missing(inventory, {"weights_sha256": "n/a (no weights file)", "images_per_s": "n/a (not recorded)"})
    return ["## Embeddings", "", dataframe_to_markdown(shown), ""]


CHAPTER = Chapter("embeddings", {"embeddings": "Provenance"}, {}, write_embeddings_chapter,
                  reads=("embeddings",), settings=())

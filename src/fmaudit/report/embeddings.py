"""The embeddings section of the report: one row per embedding file, from its provenance
(:func:`fmaudit.embed.embedding_inventory`)."""

from __future__ import annotations

import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report.section import ReportWriter, Section

__all__ = ["SECTION"]


def write_embeddings_section(inventory: pd.DataFrame | None, writer: ReportWriter) -> list[str]:
    inventory = inventory if inventory is not None else pd.DataFrame({"note": ["no embeddings were planned"]})
    writer.table("embeddings", inventory)
    return ["## Embeddings", "", dataframe_to_markdown(inventory), ""]


SECTION = Section("embeddings", {"embeddings": "Provenance"}, {}, write_embeddings_section,
                  reads=("embeddings",), settings=())

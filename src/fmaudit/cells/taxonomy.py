"""Cell-type taxonomies: annotation labels -> fine classes -> coarse classes, as data tables.

Two tab-separated tables (``#`` lines are comments) define a taxonomy:

- the **fine table** (``resources/cells/taxonomy_fine.tsv``), columns ``label``, ``fine``: every annotation
  label (the molecular cell types of the annotation tables, with their synonyms) and its fine class. An
  empty ``fine`` (or ``-``) excludes the label on purpose (``Unassigned``, doublet/hybrid clusters).
- the **coarse table** (``resources/cells/taxonomy_coarse.tsv``), columns ``fine``, ``coarse``: the fine
  classes, one row each, **in class-code order**, and their coarse class. Coarse codes follow the order in
  which coarse classes first appear in it.

Labels are matched after normalisation (case-folded, runs of spaces, underscores, hyphens and other
punctuation except ``+`` collapsed to one space), so ``CD4+_T_Cells`` matches ``CD4+ T cells``. Users bring
their own tables through the config (paths instead of the defaults).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError

# resources/ sits beside src/ in the repository (the package is installed editable from it)
TAXONOMY_DIR = Path(__file__).resolve().parents[3] / "resources" / "cells"
DEFAULT_FINE_TABLE = TAXONOMY_DIR / "taxonomy_fine.tsv"
DEFAULT_COARSE_TABLE = TAXONOMY_DIR / "taxonomy_coarse.tsv"
_EXCLUDED = {"", "-"}


def normalise_label(label: object) -> str:
    """Case-folded label with every run of characters other than letters, digits and ``+`` as one space.

    Parameters
    ----------
    label : object
        A raw annotation label (converted with ``str``).

    Returns
    -------
    str
        The normalised label, stripped (``"CD8+ T-cell"`` -> ``"cd8+ t cell"``).
    """
    return re.sub(r"[^0-9a-z+]+", " ", str(label).casefold()).strip()


def _read_tsv(path: Path, columns: tuple[str, str]) -> pd.DataFrame:
    if not path.exists():
        raise FileNotFoundError(f"{path}: taxonomy table not found")
    df = pd.read_csv(path, sep="\t", comment="#", dtype=str, keep_default_na=False)
    df.columns = [c.strip() for c in df.columns]
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise FmauditInputError(f"{path}: missing column(s) {missing}; has {list(df.columns)}")
    return df[list(columns)].apply(lambda s: s.str.strip())


@dataclass
class Taxonomy:
    """A fine and a coarse taxonomy over annotation labels; codes are positions in the class lists.

    Parameters
    ----------
    fine_classes : list of str
        The fine classes in code order (the coarse table's ``fine`` column).
    coarse_classes : list of str
        The coarse classes in code order (first appearance in the coarse table).
    label_to_fine : dict of str to str or None
        Normalised annotation label (:func:`normalise_label`) -> fine class; None: excluded on purpose.
    fine_to_coarse : dict of str to str
        Fine class -> its coarse class.
    sources : dict of str to str, default {}
        Where the tables came from (``fine_table``, ``coarse_table``), for provenance.
    """

    fine_classes: list[str]
    coarse_classes: list[str]
    label_to_fine: dict[str, str | None]  # normalised label -> fine class (None: excluded on purpose)
    fine_to_coarse: dict[str, str]
    sources: dict[str, str] = field(default_factory=dict)

    def map_labels(self, labels: pd.Series) -> pd.DataFrame:
        """``label_fine``, ``label_coarse`` (Int64 codes) and their names for raw annotation labels.

        Missing labels, labels excluded by the table and labels the table does not know all give NA;
        :meth:`unknown_labels` lists the last kind.

        Parameters
        ----------
        labels : Series
            Raw annotation labels (NA: unannotated).

        Returns
        -------
        DataFrame
            ``labels``'s index, columns ``label_fine``, ``label_coarse`` (Int64 codes) and ``label_fine_name``,
            ``label_coarse_name`` (string), NA where a cell has no class.
        """
        norm = labels.map(lambda v: None if pd.isna(v) else normalise_label(v))
        fine_name = norm.map(lambda v: self.label_to_fine.get(v) if v is not None else None)
        coarse_name = fine_name.map(lambda v: self.fine_to_coarse.get(v) if v is not None else None)
        fine_code = {c: i for i, c in enumerate(self.fine_classes)}
        coarse_code = {c: i for i, c in enumerate(self.coarse_classes)}
        return pd.DataFrame({
            "label_fine": pd.array([fine_code.get(v) if v is not None else None for v in fine_name], dtype="Int64"),
            "label_coarse": pd.array([coarse_code.get(v) if v is not None else None for v in coarse_name],
                                     dtype="Int64"),
            "label_fine_name": pd.array([v for v in fine_name], dtype="string"),
            "label_coarse_name": pd.array([v for v in coarse_name], dtype="string"),
        }, index=labels.index)

    def unknown_labels(self, labels: pd.Series) -> dict[str, int]:
        """Raw labels the fine table does not list, with their counts (excluded-on-purpose labels are known).

        Parameters
        ----------
        labels : Series
            Raw annotation labels (NA ignored).

        Returns
        -------
        dict of str to int
            Unknown raw label -> number of cells, most frequent first.
        """
        present = labels.dropna()
        known = present.map(lambda v: normalise_label(v) in self.label_to_fine)
        return {str(k): int(v) for k, v in present[~known].value_counts().items()}


def load_taxonomy(fine_table: str | Path | None = None, coarse_table: str | Path | None = None) -> Taxonomy:
    """Read the two tables (defaults: ``resources/cells/taxonomy_{fine,coarse}.tsv``) and check them.

    Parameters
    ----------
    fine_table : str or Path, optional
        TSV with columns ``label`` and ``fine``: annotation label -> fine class (``-`` or empty: excluded on
        purpose); the project's table by default.
    coarse_table : str or Path, optional
        TSV with columns ``fine`` and ``coarse``: each fine class once, in code order; the project's by default.

    Returns
    -------
    Taxonomy
        The checked taxonomy, its ``sources`` the two paths.

    Raises
    ------
    FileNotFoundError
        When a table does not exist.
    FmauditInputError
        Naming the table and row: a missing column, an empty coarse table, an empty entry, a fine class listed twice,
        a label mapped to a class the coarse table lacks, or one label (after normalisation) mapped to two classes.
    """
    fine_path = Path(fine_table) if fine_table is not None else DEFAULT_FINE_TABLE
    coarse_path = Path(coarse_table) if coarse_table is not None else DEFAULT_COARSE_TABLE
    coarse = _read_tsv(coarse_path, ("fine", "coarse"))
    if len(coarse) == 0:
        raise FmauditInputError(f"{coarse_path}: the coarse table lists no fine classes")
    for col in ("fine", "coarse"):
        empty = coarse[col] == ""
        if empty.any():
            raise FmauditInputError(f"{coarse_path}: row {int(np.flatnonzero(empty.to_numpy())[0])} "
                                    f"has an empty {col!r}")
    dup = coarse["fine"].duplicated()
    if dup.any():
        raise FmauditInputError(f"{coarse_path}: fine class {coarse['fine'][dup].iloc[0]!r} is listed twice")
    fine_classes = coarse["fine"].tolist()
    coarse_classes = list(dict.fromkeys(coarse["coarse"]))
    fine_to_coarse = dict(zip(coarse["fine"], coarse["coarse"]))

    fine = _read_tsv(fine_path, ("label", "fine"))
    label_to_fine: dict[str, str | None] = {}
    first_row: dict[str, int] = {}
    for i, (label, cls) in enumerate(zip(fine["label"], fine["fine"])):
        key = normalise_label(label)
        if key == "":
            raise FmauditInputError(f"{fine_path}: row {i} has an empty label")
        target = None if cls in _EXCLUDED else cls
        if target is not None and target not in fine_to_coarse:
            raise FmauditInputError(f"{fine_path}: row {i} (label {label!r}) maps to {cls!r}, "
                                    "which is not a fine class "
                                    f"of {coarse_path.name} ({', '.join(fine_classes)})")
        if key in label_to_fine and label_to_fine[key] != target:
            raise FmauditInputError(f"{fine_path}: label {label!r} (row {i}) maps to {cls!r} but row {first_row[key]} "
                                    f"maps the same label to {label_to_fine[key]!r}")
        label_to_fine[key] = target
        first_row.setdefault(key, i)
    return Taxonomy(fine_classes=fine_classes, coarse_classes=coarse_classes, label_to_fine=label_to_fine,
                    fine_to_coarse=fine_to_coarse,
                    sources={"fine_table": str(fine_path), "coarse_table": str(coarse_path)})


def read_cell_types(path: str | Path, id_column: str = "cell_id", label_column: str = "label") -> pd.DataFrame:
    """An annotation table (``cell_id,label``; CSV, or TSV by extension) as string ``cell_id``, ``label``.

    Ids are read as text (``"17"`` and ``"aaabbbcc-1"`` alike). An empty label is a missing label.

    Parameters
    ----------
    path : str or Path
        The table; tab-separated for ``.tsv``, ``.txt`` and ``.tsv.gz``, comma-separated otherwise.
    id_column : str, default "cell_id"
        The column holding the Xenium cell ids.
    label_column : str, default "label"
        The column holding the annotation labels.

    Returns
    -------
    DataFrame
        Columns ``cell_id`` and ``label`` (str, stripped; NA for an empty label), one row per annotated cell.

    Raises
    ------
    FileNotFoundError
        When the table does not exist.
    FmauditInputError
        Naming the file, for an unreadable table, missing columns, empty ids and an id listed twice.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: cell-type annotation table not found")
    sep = "\t" if path.suffix.lower() in (".tsv", ".txt") or path.name.endswith(".tsv.gz") else ","
    try:
        df = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False)
    except Exception as e:
        raise FmauditInputError(f"{path}: unreadable annotation table ({type(e).__name__}: {e})") from e
    df.columns = [c.strip() for c in df.columns]
    missing = [c for c in (id_column, label_column) if c not in df.columns]
    if missing:
        raise FmauditInputError(f"{path}: missing column(s) {missing}; has {list(df.columns)} "
                                f"(expected {id_column},{label_column})")
    out = pd.DataFrame({"cell_id": df[id_column].str.strip(), "label": df[label_column].str.strip()})
    empty = out["cell_id"] == ""
    if empty.any():
        raise FmauditInputError(f"{path}: row {int(np.flatnonzero(empty.to_numpy())[0])} has no {id_column}")
    dup = out["cell_id"].duplicated()
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise FmauditInputError(f"{path}: {id_column} {out['cell_id'].iloc[i]!r} is annotated twice (row {i})")
    out["label"] = out["label"].mask(out["label"] == "")
    return out


def attach_labels(cell_ids: pd.Series, annotations: pd.DataFrame, where: str = "annotations") -> pd.Series:
    """The raw label of every cell (NA where unannotated); annotation ids matching no cell raise.

    An annotation table from another section or another id kind (integer ids of old bundles vs string ids)
    matches few or no cells; a single unmatched id already means the table does not belong to these cells.

    Parameters
    ----------
    cell_ids : Series
        The bundle's cell ids, in cell order.
    annotations : DataFrame
        ``cell_id`` and ``label`` (:func:`read_cell_types`).
    where : str, default "annotations"
        What the error calls the table.

    Returns
    -------
    Series
        One raw label per cell of ``cell_ids`` (positional index 0..n-1, object dtype), NA where unannotated.

    Raises
    ------
    FmauditInputError
        When an annotated id matches no cell.
    """
    index = pd.Index(cell_ids.astype(str))
    pos = index.get_indexer(annotations["cell_id"])
    unmatched = annotations["cell_id"][pos < 0]
    if len(unmatched):
        sample = ", ".join(repr(v) for v in unmatched.head(5))
        raise FmauditInputError(
            f"{where}: {len(unmatched)} of {len(annotations)} annotated cell id(s) match no cell of the bundle "
            f"(e.g. {sample}; bundle ids look like {index[0]!r}): wrong section, or an annotation of another "
            "segmentation or id format"
        )
    labels = pd.Series(pd.NA, index=range(len(index)), dtype=object)
    labels.iloc[pos] = annotations["label"].to_numpy()
    return labels

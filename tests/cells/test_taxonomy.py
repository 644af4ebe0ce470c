"""Taxonomy tables: labels -> 9 fine -> 3 coarse classes, unmapped labels, annotation tables and their errors."""

from __future__ import annotations

import pandas as pd
import pytest

from fmaudit.cells.taxonomy import (
    DEFAULT_FINE_TABLE,
    attach_labels,
    load_taxonomy,
    normalise_label,
    read_cell_types,
)
from fmaudit.io import FmauditInputError


def test_default_tables_nine_fine_three_coarse_and_sixty_eight_types():
    tax = load_taxonomy()
    assert len(tax.fine_classes) == 9 and tax.coarse_classes == ["epithelial", "stromal", "immune"]
    assert tax.fine_classes[:2] == ["tumour", "normal_epithelial"]
    assert {tax.fine_to_coarse[c] for c in ("t_nk_cell", "b_plasma_cell", "myeloid")} == {"immune"}
    # the first 68 rows are 68 distinct molecular types, and every fine class has at least one of them
    table = pd.read_csv(DEFAULT_FINE_TABLE, sep="\t", comment="#", dtype=str, keep_default_na=False)
    first = table.iloc[:68]
    assert first["label"].map(normalise_label).nunique() == 68
    assert set(first["fine"]) == set(tax.fine_classes)
    header = DEFAULT_FINE_TABLE.read_text().splitlines()[0]
    assert header.startswith("#") and "ASSUMPTION" in DEFAULT_FINE_TABLE.read_text()


def test_map_labels_with_synonyms_excluded_unknown_and_missing():
    tax = load_taxonomy()
    labels = pd.Series(["CD4+_T_Cells", "cd4+ t cell", "Invasive_Tumor", "Fibroblast", "Unassigned", "Mystery cell",
                        None, "Macrophages_2", "T_Cell_&_Tumor_Hybrid"])
    got = tax.map_labels(labels)
    fine = tax.fine_classes.index
    assert got["label_fine"].tolist()[:4] == [fine("t_nk_cell"), fine("t_nk_cell"), fine("tumour"), fine("fibroblast")]
    assert got["label_coarse"].tolist()[:4] == [2, 2, 0, 1]
    assert got["label_fine"].isna().tolist() == [False] * 4 + [True, True, True, False, True]
    assert got["label_coarse_name"].iloc[7] == "immune" and pd.isna(got["label_coarse_name"].iloc[4])
    assert str(got["label_fine"].dtype) == "Int64" and str(got["label_fine_name"].dtype) == "string"
    # only labels the table does not list are unknown; excluded-on-purpose ones are known
    assert tax.unknown_labels(labels) == {"Mystery cell": 1}


def _tables(tmp_path, fine_rows, coarse_rows):
    f, c = tmp_path / "fine.tsv", tmp_path / "coarse.tsv"
    f.write_text("# mine\nlabel\tfine\n" + "".join(f"{a}\t{b}\n" for a, b in fine_rows))
    c.write_text("fine\tcoarse\n" + "".join(f"{a}\t{b}\n" for a, b in coarse_rows))
    return f, c


def test_users_bring_their_own_tables(tmp_path):
    f, c = _tables(tmp_path, [("Alpha", "a"), ("beta-1", "b"), ("Gamma", "g"), ("junk", "-")],
                   [("g", "x"), ("a", "y"), ("b", "x")])
    tax = load_taxonomy(f, c)
    assert tax.fine_classes == ["g", "a", "b"] and tax.coarse_classes == ["x", "y"]
    got = tax.map_labels(pd.Series(["alpha", "BETA_1", "gamma", "junk"]))
    assert got["label_fine"].tolist()[:3] == [1, 2, 0] and got["label_coarse"].tolist()[:3] == [1, 0, 0]
    assert pd.isna(got["label_fine"].iloc[3])


@pytest.mark.parametrize("fine_rows, coarse_rows, message", [
    ([("A", "zz")], [("a", "x")], "not a fine class"),
    ([("A", "a"), ("a", "b")], [("a", "x"), ("b", "x")], "maps the same label"),
    ([("A", "a")], [("a", "x"), ("a", "y")], "listed twice"),
    ([("A", "a")], [("a", "")], "empty 'coarse'"),
])
def test_bad_taxonomy_tables(tmp_path, fine_rows, coarse_rows, message):
    f, c = _tables(tmp_path, fine_rows, coarse_rows)
    with pytest.raises(FmauditInputError, match=message):
        load_taxonomy(f, c)


def test_missing_columns_and_files(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("name\tclass\nA\ta\n")
    with pytest.raises(FmauditInputError, match=r"missing column\(s\)"):
        load_taxonomy(bad, None)
    with pytest.raises(FileNotFoundError):
        load_taxonomy(tmp_path / "none.tsv")


def test_read_cell_types_and_attach(tmp_path):
    p = tmp_path / "types.csv"
    p.write_text("cell_id,label\naaaaaaab-1,Fibroblast\n 17 ,B cell\naaaaaaac-1,\n")
    ann = read_cell_types(p)
    assert ann["cell_id"].tolist() == ["aaaaaaab-1", "17", "aaaaaaac-1"] and pd.isna(ann["label"].iloc[2])
    labels = attach_labels(pd.Series(["17", "aaaaaaab-1", "aaaaaaac-1", "x"]), ann)
    assert labels.tolist()[:2] == ["B cell", "Fibroblast"] and labels.isna().tolist()[2:] == [True, True]
    # ids of another section or of the other id kind match no cell
    with pytest.raises(FmauditInputError, match=r"1 of 3 annotated cell id\(s\) match no cell .*'aaaaaaab-1'"):
        attach_labels(pd.Series(["17", "aaaaaaac-1"]), ann)


@pytest.mark.parametrize("text, message", [
    ("cell_id,label\na,x\na,y\n", "annotated twice"),
    ("id,type\na,x\n", r"missing column\(s\)"),
    ("cell_id,label\n,x\n", "has no cell_id"),
])
def test_bad_annotation_tables(tmp_path, text, message):
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(FmauditInputError, match=message):
        read_cell_types(p)

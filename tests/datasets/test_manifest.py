"""The manifest contract: columns, dtypes and errors that name the row."""

import pandas as pd
import pytest

from fmaudit.datasets.manifest import check_group_disjoint, label_names, make_manifest, validate_manifest
from fmaudit.io import FmauditInputError


def rows(n=4):
    return [{"dataset": "d", "item_id": f"i{i}", "source": f"/x/{i}.png", "label": i % 2,
             "label_name": ["neg", "pos"][i % 2], "group": f"p{i // 2}", "domain": "a",
             "split": ["train", "test"][i // 2]} for i in range(n)]


def test_make_manifest_orders_columns_and_fills_optional():
    df = make_manifest(rows())
    assert list(df.columns[:12]) == ["dataset", "item_id", "source", "x", "y", "level", "size", "label",
                                     "label_name", "group", "domain", "split"]
    assert df["x"].isna().all() and str(df["label"].dtype) == "Int64"
    validate_manifest(df)
    assert label_names(df) == ["neg", "pos"]


def test_missing_required_column():
    r = rows()
    for x in r:
        del x["group"]
    with pytest.raises(FmauditInputError, match="group"):
        make_manifest(r)


def test_duplicate_item_is_named():
    r = rows()
    r[2]["item_id"] = "i0"
    with pytest.raises(FmauditInputError, match="'i0'.*row 2"):
        validate_manifest(make_manifest(r))


def test_bad_split_and_missing_domain():
    r = rows()
    r[1]["split"] = "training"
    with pytest.raises(FmauditInputError, match="row 1.*'training'"):
        validate_manifest(make_manifest(r))
    r = rows()
    r[3]["domain"] = None
    with pytest.raises(FmauditInputError, match="row 3.*'domain'"):
        validate_manifest(make_manifest(r))


def test_slide_tile_needs_level_and_size():
    r = rows()
    r[0].update(x=0, y=0, level=0)
    with pytest.raises(FmauditInputError, match="row 0 is a slide tile.*'size'"):
        validate_manifest(make_manifest(r))


def test_label_with_two_names():
    r = rows()
    r[2]["label_name"] = "other"
    with pytest.raises(FmauditInputError, match="label 0 has several"):
        validate_manifest(make_manifest(r))


def test_group_leak_across_splits():
    r = rows()
    r[1]["split"] = "test"  # p0 now on train and test
    with pytest.raises(FmauditInputError, match="'p0'"):
        check_group_disjoint(make_manifest(r))
    check_group_disjoint(make_manifest(rows()))


def test_empty_manifest():
    with pytest.raises(FmauditInputError, match="no rows"):
        validate_manifest(make_manifest(pd.DataFrame(columns=["dataset", "item_id", "source", "group", "domain"])))

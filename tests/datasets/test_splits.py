"""Grouped stratified splits, validation carving, subsamples and exact-duplicate removal."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from sklearn.model_selection import train_test_split

from fmaudit.datasets.manifest import check_group_disjoint
from fmaudit.datasets.splits import (
    balanced_subsample,
    carve_validation,
    file_digests,
    grouped_split,
    paper_stratified_sample,
    remove_exact_duplicates,
    stratified_row_sample,
)
from fmaudit.io import FmauditInputError


def grouped_table(n_groups=120, per_group=(1, 12), n_classes=3, seed=0, domain="d"):
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(n_groups):
        k = int(rng.integers(*per_group))
        major = int(rng.integers(n_classes))  # patients are mostly one class, as in real data
        for i in range(k):
            lab = major if rng.random() < 0.8 else int(rng.integers(n_classes))
            rows.append({"item_id": f"g{g}_{i}", "group": f"g{g}", "label": lab, "domain": domain})
    return pd.DataFrame(rows)


def test_grouped_split_is_group_disjoint_and_close_to_fractions():
    df = grouped_table()
    out = grouped_split(df, (0.6, 0.2, 0.2), seed=0)
    assert (out.groupby("group")["split"].nunique() == 1).all()
    check_group_disjoint(out)
    share = out["split"].value_counts(normalize=True)
    for name, f in zip(("train", "val", "test"), (0.6, 0.2, 0.2)):
        assert abs(share[name] - f) < 0.05
    per_class = pd.crosstab(out["label"], out["split"], normalize="index")
    assert (per_class["test"] - 0.2).abs().max() < 0.08  # stratified as far as groups allow
    assert out.drop(columns="split").equals(df)  # nothing else changed


def test_grouped_split_item_level_is_exactly_stratified():
    df = pd.DataFrame({"group": [f"i{i}" for i in range(25)], "label": [0] * 10 + [1] * 15})
    out = grouped_split(df, (0.6, 0.2, 0.2), seed=3)
    counts = pd.crosstab(out["label"], out["split"])
    assert counts.loc[0].to_dict() == {"test": 2, "train": 6, "val": 2}
    assert counts.loc[1].to_dict() == {"test": 3, "train": 9, "val": 3}


def test_grouped_split_is_seeded():
    df = grouped_table(seed=1)
    a = grouped_split(df, seed=5)["split"]
    assert a.equals(grouped_split(df, seed=5)["split"])
    assert not a.equals(grouped_split(df, seed=6)["split"])


def test_grouped_split_zero_fraction_and_joint_strata():
    df = pd.concat([grouped_table(60, seed=2, domain="a"), grouped_table(60, seed=3, domain="b")], ignore_index=True)
    df["group"] = df["domain"] + df["group"]
    out = grouped_split(df, (0.8, 0.0, 0.2), seed=0, stratify_by=("label", "domain"))
    assert set(out["split"]) == {"train", "test"}
    share = pd.crosstab(out["domain"], out["split"], normalize="index")["test"]
    assert (share - 0.2).abs().max() < 0.08


def test_grouped_split_few_groups_still_fill_every_split():
    df = pd.DataFrame({"group": list("aabbbcd"), "label": [0, 0, 1, 1, 1, 0, 1]})
    out = grouped_split(df, (0.6, 0.2, 0.2), seed=0)
    assert set(out["split"]) == {"train", "val", "test"}
    assert (out.groupby("group")["split"].nunique() == 1).all()


@pytest.mark.parametrize("fractions,match", [
    ((0.5, 0.2, 0.2), "sum to 1"),
    ((1.2, -0.2, 0.0), "non-negative"),
    ((0.5, 0.5), "one fraction per split"),
])
def test_grouped_split_rejects_bad_fractions(fractions, match):
    with pytest.raises(FmauditInputError, match=match):
        grouped_split(grouped_table(10), fractions)


def test_grouped_split_rejects_missing_groups():
    df = grouped_table(5)
    with pytest.raises(FmauditInputError, match="group column 'patient'"):
        grouped_split(df, group_col="patient")
    df.loc[2, "group"] = None
    with pytest.raises(FmauditInputError, match="row 2 has no 'group'"):
        grouped_split(df)
    with pytest.raises(FmauditInputError, match="stratification column"):
        grouped_split(grouped_table(5), stratify_by=("tissue",))


def test_carve_validation_moves_whole_train_groups_only():
    df = grouped_table(80)
    df["split"] = np.where(df["group"].str[1:].astype(int) < 60, "train", "test")
    out = carve_validation(df, 0.25, seed=0)
    assert out.loc[df["split"] == "test", "split"].eq("test").all()
    val = out[out["split"] == "val"]
    assert 0.15 < len(val) / (df["split"] == "train").sum() < 0.35
    assert (out.groupby("group")["split"].nunique() == 1).all()
    assert carve_validation(df, 0.0)["split"].equals(df["split"])
    with pytest.raises(FmauditInputError, match="val_fraction"):
        carve_validation(df, 1.0)
    with pytest.raises(FmauditInputError, match="no rows on split 'train'"):
        carve_validation(df.assign(split="test"), 0.2)


def test_stratified_row_sample_keeps_class_shares():
    df = pd.DataFrame({"label": [0] * 300 + [1] * 100 + [2] * 600, "x": range(1000)})
    sub = stratified_row_sample(df, 100, seed=0)
    assert sub["label"].value_counts().to_dict() == {2: 60, 0: 30, 1: 10}
    assert sub["x"].is_monotonic_increasing  # original order kept
    assert sub.equals(stratified_row_sample(df, 100, seed=0))
    assert len(stratified_row_sample(df, 5000)) == 1000
    with pytest.raises(FmauditInputError, match="positive"):
        stratified_row_sample(df, 0)


def test_balanced_subsample_is_fifty_fifty_where_possible():
    df = pd.DataFrame({"label": [0] * 30 + [1] * 500})
    assert balanced_subsample(df, 40, seed=1)["label"].value_counts().to_dict() == {0: 20, 1: 20}
    assert balanced_subsample(df, 100, seed=1)["label"].value_counts().to_dict() == {0: 30, 1: 70}


def _png(path, arr, compress_level=6):
    Image.fromarray(arr).save(path, compress_level=compress_level)


def test_remove_exact_duplicates_keeps_first_in_sorted_order(tmp_path):
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 255, (8, 8, 3), dtype=np.uint8) for _ in range(2))
    _png(tmp_path / "b_copy.png", a)
    _png(tmp_path / "a_orig.png", a)
    _png(tmp_path / "c_other.png", b)
    _png(tmp_path / "d_same_pixels.png", a, compress_level=0)  # other bytes, same picture
    df = pd.DataFrame({"source": [str(tmp_path / n)
                                  for n in ("d_same_pixels.png", "c_other.png", "b_copy.png", "a_orig.png")]})
    kept, n = remove_exact_duplicates(df)
    assert n == 1
    assert [p.split("/")[-1] for p in kept["source"]] == ["a_orig.png", "c_other.png", "d_same_pixels.png"]
    assert kept["sha256"].str.len().eq(64).all()
    kept_px, n_px = remove_exact_duplicates(df, mode="pixels")
    assert n_px == 2 and [p.split("/")[-1] for p in kept_px["source"]] == ["a_orig.png", "c_other.png"]


def test_remove_exact_duplicates_with_given_digests_and_errors(tmp_path):
    df = pd.DataFrame({"source": ["z", "y", "x"]})
    kept, n = remove_exact_duplicates(df, digests=["h1", "h2", "h1"])
    assert n == 1 and list(kept["source"]) == ["x", "y"]
    with pytest.raises(FmauditInputError, match="2 digests for 3 rows"):
        remove_exact_duplicates(df, digests=["a", "b"])
    with pytest.raises(FmauditInputError, match="'bytes' or 'pixels'"):
        file_digests([], mode="md5")


def test_paper_stratified_sample_reproduces_the_audit_paper():
    rng = np.random.default_rng(0)
    classes = ["ADI", "BACK", "TUM"]
    rows = []
    for label, name in enumerate(classes):
        for i in range(rng.integers(300, 500)):
            rows.append({"item_id": f"{name}_{i}", "source": f"/data/nct/{name}/{name}-{i:05d}.tif", "label": label})
    manifest = pd.DataFrame(rows).sample(frac=1.0, random_state=1).reset_index(drop=True)  # any manifest order
    sample = paper_stratified_sample(manifest, n=900, seed=42)
    # the audit paper: files listed class by class, sorted within a class, then train_test_split(train_size=n, stratify)
    listing = sorted(manifest["source"], key=lambda p: (classes.index(p.split("/")[3]), p))
    labels = [classes.index(p.split("/")[3]) for p in listing]
    kept, _ = train_test_split(np.array(listing), np.array(labels), train_size=900, random_state=42,
                               stratify=labels)[::2]
    assert set(sample["source"]) == set(kept) and len(sample) == 900
    assert sample.index.is_monotonic_increasing  # manifest order kept
    shares = sample["label"].value_counts(normalize=True).sort_index()
    np.testing.assert_allclose(shares, manifest["label"].value_counts(normalize=True).sort_index(), atol=0.01)
    assert len(paper_stratified_sample(manifest.head(10), n=900)) == 10
    with pytest.raises(FmauditInputError, match="unlabelled"):
        paper_stratified_sample(manifest.assign(label=np.nan))

"""The demo generator: determinism, idempotence, counts, group-disjoint splits, class looks, domain shift."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fmaudit.datasets import prepare_dataset
from fmaudit.datasets.demo import CLASS_NAMES, DOMAINS, jpeg_like, patient_splits
from fmaudit.datasets.manifest import check_group_disjoint, validate_manifest
from fmaudit.io import FmauditInputError

SMALL = {"seed": 3, "image_size": 32, "n_patients_per_domain": 3, "tiles_per_patient_per_class": 2}


def _demo(root, **params):
    return prepare_dataset("demo-tiles", "demo_tiles", root, params)


@pytest.fixture(scope="module")
def default_demo(tmp_path_factory):
    """The demo at its registry defaults (360 tiles of 64 px), generated once for the module."""
    root = tmp_path_factory.mktemp("demo")
    manifest = _demo(root)
    images = np.stack([np.asarray(Image.open(p)) for p in manifest["source"]])
    return manifest, images


def test_default_counts_and_manifest(default_demo):
    manifest, images = default_demo
    validate_manifest(manifest)
    assert len(manifest) == 5 * 3 * 6 * 4 == 360
    assert images.shape == (360, 64, 64, 3) and images.dtype == np.uint8
    assert sorted(manifest["domain"].unique()) == ["scanner-a", "scanner-b", "scanner-c"]
    per_class = manifest.groupby("label_name").size()
    assert set(per_class.index) == set(CLASS_NAMES) and (per_class == 72).all()
    assert (manifest.groupby(["domain", "label"]).size() == 24).all()
    # label indices follow CLASS_NAMES
    for label, name in manifest.groupby("label")["label_name"].first().items():
        assert CLASS_NAMES[int(label)] == name
    # patients nested in domains, 6 per domain, 20 tiles each
    assert (manifest.groupby("group")["domain"].nunique() == 1).all()
    assert (manifest.groupby("domain")["group"].nunique() == 6).all()
    assert (manifest.groupby("group").size() == 20).all()
    assert manifest["x"].isna().all() and manifest["level"].isna().all()
    assert manifest["item_id"].is_unique


def test_splits_are_group_disjoint_60_20_20(default_demo):
    manifest, _ = default_demo
    check_group_disjoint(manifest)
    patients = manifest.drop_duplicates("group")
    counts = patients.groupby(["domain", "split"]).size().unstack()
    assert (counts["train"] == 4).all() and (counts["val"] == 1).all() and (counts["test"] == 1).all()
    # a patient moved onto a second split is caught
    leaky = manifest.copy()
    train_group = leaky.loc[leaky["split"] == "train", "group"].iloc[0]
    leaky.loc[leaky.index[leaky["group"] == train_group][0], "split"] = "test"
    with pytest.raises(FmauditInputError, match="group-disjoint"):
        check_group_disjoint(leaky)


def test_patient_splits_proportions():
    rng = np.random.default_rng(0)
    assert sorted(pd.Series(patient_splits(10, rng)).value_counts().items()) == [("test", 2), ("train", 6), ("val", 2)]
    assert sorted(patient_splits(3, rng)) == ["test", "train", "val"]
    with pytest.raises(FmauditInputError, match="at least 3"):
        patient_splits(2, rng)


def test_same_seed_same_bytes_other_seed_other_pixels(tmp_path):
    a = _demo(tmp_path / "a", **SMALL)
    b = _demo(tmp_path / "b", **SMALL)
    assert len(a) == 5 * 3 * 3 * 2
    assert a.drop(columns="source").equals(b.drop(columns="source"))
    for pa, pb in zip(a["source"], b["source"]):
        assert open(pa, "rb").read() == open(pb, "rb").read()
    c = _demo(tmp_path / "c", **{**SMALL, "seed": 4})
    assert (a["pixel_sha256"] != c["pixel_sha256"]).all()
    # splits are drawn from the seed too, but always group-disjoint
    check_group_disjoint(c)


def test_pixel_hash_matches_files(tmp_path):
    from fmaudit.datasets.demo import pixel_sha256

    manifest = _demo(tmp_path, **SMALL)
    for path, digest in zip(manifest["source"].head(5), manifest["pixel_sha256"].head(5)):
        assert pixel_sha256(np.asarray(Image.open(path).convert("RGB"))) == digest
    assert all(p.startswith(str(tmp_path / "demo-tiles")) for p in manifest["source"])


def test_rerun_does_not_rewrite_and_repairs_a_changed_file(tmp_path):
    first = _demo(tmp_path, **SMALL)
    paths = list(first["source"])
    old = 1_000_000_000
    for p in paths:
        os.utime(p, ns=(old, old))
    damaged = paths[7]
    Image.new("RGB", (32, 32), (0, 0, 0)).save(damaged)
    os.utime(damaged, ns=(old, old))

    second = _demo(tmp_path, **SMALL)
    assert second.equals(first)
    rewritten = [p for p in paths if os.stat(p).st_mtime_ns != old]
    assert rewritten == [damaged]
    assert np.asarray(Image.open(damaged)).any()
    leftovers = [f for f in os.listdir(os.path.dirname(damaged)) if f.startswith(".")]
    assert leftovers == []


def test_image_size_and_domain_count(tmp_path):
    manifest = _demo(tmp_path, **{**SMALL, "image_size": 48, "n_domains": 4})
    assert sorted(manifest["domain"].unique()) == [d.name for d in DOMAINS]
    assert Image.open(manifest["source"].iloc[0]).size == (48, 48)


def test_classes_look_as_described(default_demo):
    manifest, images = default_demo
    brightness = pd.Series(images.reshape(len(images), -1).mean(axis=1), index=manifest.index)
    white = pd.Series((images.min(axis=3) > 225).mean(axis=(1, 2)), index=manifest.index)
    for domain in manifest["domain"].unique():
        in_domain = manifest["domain"] == domain
        mean = brightness[in_domain].groupby(manifest.loc[in_domain, "label_name"]).mean()
        # fat is the brightest, then pale mucus, then fibrous stroma, then the two nucleus-dense classes
        assert mean["adipose"] > mean["mucus"] > mean["stroma"] > max(mean["tumour"], mean["lymphocytes"])
    on_a = manifest["domain"] == "scanner-a"
    white_share = white[on_a].groupby(manifest.loc[on_a, "label_name"]).mean()
    assert white_share["adipose"] > 0.5 > white_share["tumour"]


def _colour_features(images: np.ndarray) -> np.ndarray:
    a = images.astype(np.float32) / 255
    hist = [np.stack([np.histogram(img[..., c], bins=8, range=(0, 1))[0] for c in range(3)]).ravel() for img in a]
    small = a.reshape(len(a), 8, 8, 8, 8, 3).mean(axis=(2, 4)).reshape(len(a), -1)
    return np.concatenate([np.asarray(hist, np.float32) / (a.shape[1] * a.shape[2]), small], axis=1)


def test_domain_shift_hurts_a_probe_but_classes_separate_in_domain(default_demo):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    manifest, images = default_demo
    features = _colour_features(images)
    labels = manifest["label"].astype(int).to_numpy()
    train = ((manifest["domain"] == "scanner-a") & (manifest["split"] == "train")).to_numpy()
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000)).fit(features[train], labels[train])
    f1 = {}
    for domain in ("scanner-a", "scanner-b", "scanner-c"):
        test = ((manifest["domain"] == domain) & (manifest["split"] == "test")).to_numpy()
        f1[domain] = f1_score(labels[test], probe.predict(features[test]), average="macro")
    assert f1["scanner-a"] >= 0.9
    assert f1["scanner-b"] < f1["scanner-a"] - 0.2
    assert f1["scanner-c"] < f1["scanner-a"] - 0.2


def test_jpeg_like_quantisation():
    rng = np.random.default_rng(0)
    flat = np.full((16, 16, 3), 128.0)
    np.testing.assert_allclose(jpeg_like(flat, 10), flat, atol=1e-6)
    img = rng.uniform(0, 255, size=(20, 28, 3))  # not a multiple of 8: padded then cropped
    fine, coarse = jpeg_like(img, 95), jpeg_like(img, 10)
    assert fine.shape == img.shape
    assert np.abs(fine - img).mean() < np.abs(coarse - img).mean()
    assert np.abs(fine - img).mean() < 5


@pytest.mark.parametrize(
    "params, match",
    [
        ({"n_patients_per_domain": 2}, "at least 3"),
        ({"n_domains": 5}, "n_domains"),
        ({"image_size": 8}, "image_size"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "integer"),
        ({"tiles_per_patient_per_class": 0}, "tiles_per_patient_per_class"),
        ({"n_patient_per_domain": 3}, "unknown"),
    ],
)
def test_bad_parameters(tmp_path, params, match):
    with pytest.raises(FmauditInputError, match=match):
        _demo(tmp_path, **{**SMALL, **params})

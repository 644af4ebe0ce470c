"""Image-space perturbations, derived manifests, and their embedding as real encoder inputs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from scipy.ndimage import gaussian_filter

import fmaudit.embed as engine
from fmaudit.datasets.manifest import make_manifest
from fmaudit.embed import ItemDataset, embed_manifest, read_embeddings
from fmaudit.encoders import build_encoder
from fmaudit.io import FmauditInputError
from fmaudit.ood.conditions import align_perturbed
from fmaudit.ood.perturb import (
    apply_perturbation,
    derive_manifest,
    gaussian_blur,
    parse_perturbation,
    perturbation_string,
    perturbation_tag,
)
from fmaudit.registry import get_encoder_spec

ENCODER = "demo-vit-tiny"


def tissue(h=90, w=120, seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = np.array([200, 120, 180], float) + rng.normal(scale=25, size=(h, w, 3))
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))


def test_specs_are_canonical_and_checked():
    assert parse_perturbation('{"kind": "pen"}') == {"kind": "pen", "seed": 0, "color": "green", "strokes": 2,
                                                     "width": 0.04, "opacity": 0.75}
    assert perturbation_string({"sigma": 2, "kind": "blur"}) == '{"kind":"blur","sigma":2.0}'
    assert perturbation_tag({"kind": "blur", "sigma": 1.0}) == "blur_s1"
    assert perturbation_tag({"kind": "jpeg", "quality": 20}) == "jpeg_q20"
    assert perturbation_tag({"kind": "exposure", "factor": 0.6}) == "exposure_f0.6"
    assert perturbation_tag({"kind": "fold", "seed": 3}) == "fold_seed3"
    assert perturbation_tag({"kind": "pen", "color": "blue"}).startswith("pen_seed0_")
    for bad, match in (({"kind": "blur"}, "sigma.*required"), ({"kind": "blur", "sigma": 0}, "sigma must be > 0"),
                       ({"kind": "smudge"}, "unknown kind"), ({"kind": "jpeg", "quality": 120}, "1..95"),
                       ({"kind": "pen", "colour": "red"}, "unknown parameter"), ({"kind": "exposure", "factor": 1},
                                                                                "not 1"),
                       ({"kind": "bubble", "seed": -1}, "seed"), ("{not json", "not a JSON")):
        with pytest.raises(FmauditInputError, match=match):
            parse_perturbation(bad)


def test_gaussian_blur_matches_scipy_and_scales_with_the_shorter_side():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (30, 41, 3)).astype(float)
    for sigma in (0.3, 1.7, 12.0):  # 12: a kernel wider than the image, reflected repeatedly
        np.testing.assert_allclose(gaussian_blur(a, sigma), gaussian_filter(a, (sigma, sigma, 0), mode="reflect",
                                                                              truncate=4.0), atol=1e-9)
    img = tissue(h=448, w=500)
    out = np.asarray(apply_perturbation(img, {"kind": "blur", "sigma": 1.5}))
    ref = np.clip(np.rint(gaussian_filter(np.asarray(img, float), (3.0, 3.0, 0), mode="reflect", truncate=4.0)), 0, 255)
    np.testing.assert_array_equal(out, ref.astype(np.uint8))  # sigma 1.5 at 224 px = 3 px on a 448 px side


def test_artefacts_are_deterministic_per_item_and_change_the_pixels():
    img = tissue()
    original = np.asarray(img)
    for spec in ({"kind": "pen"}, {"kind": "bubble"}, {"kind": "fold"}, {"kind": "exposure", "factor": 1.6},
                 {"kind": "exposure", "factor": 0.5}, {"kind": "jpeg", "quality": 10}):
        a = apply_perturbation(img, spec, item_key="x1")
        b = apply_perturbation(img, spec, item_key="x1")
        assert a.size == img.size and a.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert np.abs(np.asarray(a, float) - original).mean() > 1.0, spec
    assert np.asarray(img).tobytes() == original.tobytes()  # the input is not modified
    pen_other_item = apply_perturbation(img, {"kind": "pen"}, item_key="x2")
    assert not np.array_equal(np.asarray(pen_other_item), np.asarray(apply_perturbation(img, {"kind": "pen"}, "x1")))
    pen_other_seed = apply_perturbation(img, {"kind": "pen", "seed": 1}, item_key="x1")
    assert not np.array_equal(np.asarray(pen_other_seed), np.asarray(apply_perturbation(img, {"kind": "pen"}, "x1")))
    # a green pen mark: more green than red where the image changed most
    diff = np.asarray(apply_perturbation(img, {"kind": "pen"}, "x1"), float) - original
    changed = np.abs(diff).sum(2) > 60
    assert changed.any() and diff[changed][:, 1].mean() > diff[changed][:, 0].mean()
    bright = np.asarray(apply_perturbation(img, {"kind": "exposure", "factor": 1.6}), float)
    np.testing.assert_array_equal(bright, np.clip(np.rint(original * 1.6), 0, 255))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=10, subsampling=2)
    np.testing.assert_array_equal(np.asarray(apply_perturbation(img, {"kind": "jpeg", "quality": 10})),
                                  np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB")))


@pytest.fixture
def manifest(tmp_path) -> pd.DataFrame:
    rows = []
    for i in range(8):
        path = tmp_path / "img" / f"t{i}.png"
        path.parent.mkdir(exist_ok=True)
        tissue(40, 48, seed=i).save(path)
        rows.append({"dataset": "toy", "item_id": f"t{i}", "source": str(path), "label": i % 2,
                     "label_name": f"c{i % 2}", "group": f"p{i // 2}", "domain": "a",
                     "split": "test" if i >= 4 else "train"})
    return make_manifest(rows)


def test_derive_manifest(manifest):
    derived = derive_manifest(manifest, {"kind": "blur", "sigma": 2})
    assert derived["item_id"].tolist() == [f"t{i}__blur_s2" for i in range(4, 8)]
    assert derived["source_item_id"].tolist() == [f"t{i}" for i in range(4, 8)]
    assert set(derived["perturbation"]) == {'{"kind":"blur","sigma":2.0}'}
    assert set(derived["condition"]) == {"blur_s2"} and set(derived["split"]) == {"test"}
    assert derived["label"].tolist() == manifest["label"].iloc[4:].tolist()
    with pytest.raises(FmauditInputError, match="already perturbed"):
        derive_manifest(derived, {"kind": "jpeg", "quality": 30})
    with pytest.raises(FmauditInputError, match="no rows in split"):
        derive_manifest(manifest, {"kind": "fold"}, splits=("val",))


def test_derived_manifest_is_embedded_as_perturbed_encoder_input(manifest, tmp_path):
    spec = get_encoder_spec(ENCODER)
    derived = derive_manifest(manifest, {"kind": "blur", "sigma": 3})
    out = tmp_path / "blur.npz"
    prov = embed_manifest(derived, spec, out, batch_size=3, chunk_size=2)
    ids, feats = read_embeddings(out, "cls")
    assert prov["n_items"] == 4 and ids.tolist() == derived["item_id"].tolist()
    encoder = build_encoder(spec)
    plain = ItemDataset(manifest.iloc[4:].reset_index(drop=True), encoder.transform)
    images = [apply_perturbation(plain.load_image(i), {"kind": "blur", "sigma": 3}) for i in range(4)]
    with torch.inference_mode():
        ref = encoder(torch.stack([encoder.transform(im) for im in images]), ["cls"])["cls"].numpy()
        unblurred = encoder(torch.stack([encoder.transform(plain.load_image(i)) for i in range(4)]), ["cls"])["cls"]
    np.testing.assert_allclose(feats, ref, rtol=1e-5, atol=1e-5)
    assert np.abs(feats - unblurred.numpy()).max() > 1e-3
    # rows without a perturbation are read untouched
    mixed = pd.concat([manifest.iloc[4:6], derived.iloc[:2]], ignore_index=True)
    ds = ItemDataset(mixed, encoder.transform)
    np.testing.assert_array_equal(np.asarray(ds.load_image(0)), np.asarray(plain.load_image(0)))
    np.testing.assert_array_equal(np.asarray(ds.load_image(2)), np.asarray(images[0]))
    # the aligned OOD set pairs each test item with its copy
    aligned = align_perturbed(manifest["item_id"].iloc[4:][::-1], ids, feats, "blur_s3")
    np.testing.assert_array_equal(aligned, feats[::-1])
    with pytest.raises(FmauditInputError, match="no perturbed copy"):
        align_perturbed(["t0"], ids, feats, "blur_s3")


def test_a_changed_perturbation_is_not_served_from_an_old_chunk(manifest, tmp_path, monkeypatch):
    derived = derive_manifest(manifest, {"kind": "blur", "sigma": 1})
    out, log = tmp_path / "d.npz", tmp_path / "embed.log"

    class Stop(Exception):
        pass

    original = engine._write_chunk

    def write_then_stop(path, ids, feats, key, index):
        original(path, ids, feats, key, index)
        raise Stop

    monkeypatch.setattr(engine, "_write_chunk", write_then_stop)
    with pytest.raises(Stop):
        embed_manifest(derived, ENCODER, out, batch_size=2, chunk_size=2)
    monkeypatch.setattr(engine, "_write_chunk", original)
    assert Path(f"{out}.chunks/chunk_00000.npz").exists()
    # same item ids, another sigma (edited in place): chunk 0 must be recomputed
    edited = derived.assign(perturbation='{"kind":"blur","sigma":4.0}')
    embed_manifest(edited, ENCODER, out, batch_size=2, chunk_size=2, log=log)
    assert "chunk 00000: computed" in log.read_text()
    _, feats = read_embeddings(out, "cls")
    ref = tmp_path / "ref.npz"
    embed_manifest(edited, ENCODER, ref, batch_size=2, chunk_size=2)
    np.testing.assert_array_equal(feats, read_embeddings(ref, "cls")[1])


def test_a_bad_spec_in_a_manifest_names_the_item(manifest):
    bad = derive_manifest(manifest, {"kind": "fold"})
    bad.loc[1, "perturbation"] = json.dumps({"kind": "fold", "darkness": 3})
    with pytest.raises(FmauditInputError, match=r"item 't5__fold_seed0'.*darkness"):
        ItemDataset(bad, lambda im: im)

"""Image-space perturbations for the blur and artefact OOD tiers, applied to real encoder inputs.

A perturbation is a small JSON-able spec (``{"kind": "blur", "sigma": 2.0}``); :func:`parse_perturbation`
fills in every default, so its canonical string (sorted keys, no spaces) fully determines the pixels. A
*derived manifest* (:func:`derive_manifest`) is a manifest of the test split whose rows carry that string in
a ``perturbation`` column and derived item ids ``<item_id>__<tag>``; it is embedded through the normal
embedding path (:class:`fmaudit.embed.ItemDataset` applies the row's perturbation after reading the image and
before the encoder's transform), so a perturbed copy is a real encoder input, never feature noise, and
adding a sigma embeds only that copy.

Kinds (all deterministic; the random ones draw from ``default_rng([seed, hash(item id)])``, so an item gets
the same artefact whatever the order, batch or worker):

- ``blur`` (``sigma`` > 0): Gaussian blur, exact separable kernel truncated at 4 sigma, reflect padding
  (``scipy.ndimage.gaussian_filter(mode="reflect", truncate=4)``), rounded back to uint8. **sigma is in
  pixels of the image rescaled so that its shorter side is 224 px**, i.e. ``sigma * min(W, H) / 224``
  source pixels. For an encoder that resizes the shorter side to its input size and centre-crops (every
  registry entry with ``resize_size == input_size``) that is ``sigma * input_size / 224`` pixels of the
  encoder input: the audit paper's convention (sigma in pixels of a 224 px input, scaled for larger inputs), applied
  before the resize instead of after it (blur and downscaling commute up to the resampling filter).
- ``jpeg`` (``quality`` 1..95): JPEG re-encoding at that quality (PIL, 4:2:0 subsampling).
- ``exposure`` (``factor`` > 0, not 1): pixel values scaled by ``factor`` and clipped (> 1 over-exposed,
  < 1 under-exposed).
- ``pen`` (``seed``, ``color`` green | blue | black | red, ``strokes``, ``width`` as a share of the shorter
  side, ``opacity``): marker strokes, smooth random polylines across the tile.
- ``bubble`` (``seed``, ``count``, ``radius`` as a share of the shorter side): air bubbles under the
  coverslip, a brightened disc with a dark refraction rim.
- ``fold`` (``seed``, ``width`` share, ``darkness``): a tissue fold, a band of doubled tissue along a random
  line, darker and more saturated, with soft edges.

The artefact kinds are synthetic, parametric approximations of the real artefacts (as in synthetic-artefact
OOD benchmarks); they are not sampled from real artefact images.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.datasets.manifest import validate_manifest
from fmaudit.io import FmauditInputError

PERTURBATION_COLUMN = "perturbation"
SOURCE_ITEM_COLUMN = "source_item_id"
CONDITION_COLUMN = "condition"
ID_SEPARATOR = "__"
BLUR_REFERENCE_SIDE = 224
BLUR_TRUNCATE = 4.0
PEN_COLORS = {"green": (20, 120, 60), "blue": (30, 60, 160), "black": (25, 25, 30), "red": (170, 30, 40)}

# kind -> default parameters (None = required)
KINDS: dict[str, dict[str, Any]] = {
    "blur": {"sigma": None},
    "jpeg": {"quality": None},
    "exposure": {"factor": None},
    "pen": {"seed": 0, "color": "green", "strokes": 2, "width": 0.04, "opacity": 0.75},
    "bubble": {"seed": 0, "count": 2, "radius": 0.18},
    "fold": {"seed": 0, "width": 0.14, "darkness": 0.45},
}
ARTEFACT_KINDS = ("pen", "bubble", "fold", "exposure", "jpeg")

__all__ = [
    "ARTEFACT_KINDS",
    "KINDS",
    "PERTURBATION_COLUMN",
    "apply_perturbation",
    "derive_manifest",
    "gaussian_blur",
    "parse_perturbation",
    "perturbation_string",
    "perturbation_tag",
]


# --------------------------------------------------------------------------------------------------
# specs
# --------------------------------------------------------------------------------------------------
def _number(spec: Mapping[str, Any], key: str, kind: str) -> float:
    value = spec[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise FmauditInputError(f"perturbation {kind!r}: {key} must be a finite number, got {value!r}")
    return float(value)


def parse_perturbation(spec: Mapping[str, Any] | str) -> dict[str, Any]:
    """The canonical spec: a dict with ``kind`` and every parameter of that kind (defaults filled in),
    checked. Accepts a dict or its JSON string; raises FmauditInputError naming the bad key.

    Parameters
    ----------
    spec : mapping or str
        A perturbation spec (``{"kind": "blur", "sigma": 2.0}``) or its JSON string.

    Returns
    -------
    dict
        ``kind`` and every parameter of that kind (``KINDS``), numbers as int or float.

    Raises
    ------
    FmauditInputError
        Not JSON or not a mapping, an unknown kind or parameter, a required parameter missing, or a value
        outside its range.
    """
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as err:
            raise FmauditInputError(f"perturbation {spec!r}: not a JSON object ({err})") from err
    if not isinstance(spec, Mapping):
        raise FmauditInputError(f"perturbation: expected a mapping with 'kind', got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise FmauditInputError(f"perturbation: unknown kind {kind!r}; known kinds: {', '.join(KINDS)}")
    unknown = sorted(set(spec) - set(KINDS[kind]) - {"kind"})
    if unknown:
        raise FmauditInputError(f"perturbation {kind!r}: unknown parameter(s) {unknown}; "
                                f"known: {sorted(KINDS[kind])}")
    out: dict[str, Any] = {"kind": kind}
    for key, default in KINDS[kind].items():
        if key not in spec and default is None:
            raise FmauditInputError(f"perturbation {kind!r}: parameter {key!r} is required")
        out[key] = spec.get(key, default)
    if kind == "blur":
        out["sigma"] = _number(out, "sigma", kind)
        if out["sigma"] <= 0:
            raise FmauditInputError(f"perturbation 'blur': sigma must be > 0, got {out['sigma']}")
    elif kind == "jpeg":
        q = _number(out, "quality", kind)
        if q != int(q) or not 1 <= q <= 95:
            raise FmauditInputError(f"perturbation 'jpeg': quality must be an integer in 1..95, got {out['quality']!r}")
        out["quality"] = int(q)
    elif kind == "exposure":
        f = _number(out, "factor", kind)
        if f <= 0 or f == 1.0:
            raise FmauditInputError(f"perturbation 'exposure': factor must be > 0 and not 1, got {f}")
        out["factor"] = f
    else:
        seed = out["seed"]
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise FmauditInputError(f"perturbation {kind!r}: seed must be a non-negative integer, got {seed!r}")
        out["seed"] = int(seed)
        if kind == "pen":
            if out["color"] not in PEN_COLORS:
                raise FmauditInputError(f"perturbation 'pen': color {out['color']!r} not in {sorted(PEN_COLORS)}")
            if int(out["strokes"]) != out["strokes"] or int(out["strokes"]) < 1:
                raise FmauditInputError(f"perturbation 'pen': strokes must be a positive integer, "
                                        f"got {out['strokes']!r}")
            out["strokes"] = int(out["strokes"])
            for key in ("width", "opacity"):
                if not 0 < _number(out, key, kind) <= 1:
                    raise FmauditInputError(f"perturbation 'pen': {key} must lie in (0, 1], got {out[key]!r}")
                out[key] = float(out[key])
        elif kind == "bubble":
            if int(out["count"]) != out["count"] or int(out["count"]) < 1:
                raise FmauditInputError(f"perturbation 'bubble': count must be a positive integer, "
                                        f"got {out['count']!r}")
            out["count"] = int(out["count"])
            if not 0 < _number(out, "radius", kind) <= 1:
                raise FmauditInputError(f"perturbation 'bubble': radius must lie in (0, 1], got {out['radius']!r}")
            out["radius"] = float(out["radius"])
        elif kind == "fold":
            for key in ("width", "darkness"):
                if not 0 < _number(out, key, kind) < 1:
                    raise FmauditInputError(f"perturbation 'fold': {key} must lie in (0, 1), got {out[key]!r}")
                out[key] = float(out[key])
    return out


def perturbation_string(spec: Mapping[str, Any] | str) -> str:
    """Canonical JSON of a spec (sorted keys, no spaces): the ``perturbation`` column's value.

    Parameters
    ----------
    spec : mapping or str
        A perturbation spec (``{"kind": "blur", "sigma": 2.0}``) or its JSON string.

    Returns
    -------
    str
        The JSON of :func:`parse_perturbation`'s spec; equal strings mean equal pixels.
    """
    return json.dumps(parse_perturbation(spec), sort_keys=True, separators=(",", ":"))


def perturbation_tag(spec: Mapping[str, Any] | str) -> str:
    """Short filename-safe name of a spec: ``blur_s2``, ``jpeg_q20``, ``exposure_f1.5``, ``pen_seed0`` ...
    (the OOD condition name; artefact specs with non-default parameters get a short hash appended).

    Parameters
    ----------
    spec : mapping or str
        A perturbation spec (``{"kind": "blur", "sigma": 2.0}``) or its JSON string.

    Returns
    -------
    str
        The tag, also the suffix of derived item ids.
    """
    s = parse_perturbation(spec)
    kind = s["kind"]
    if kind == "blur":
        return f"blur_s{s['sigma']:g}"
    if kind == "jpeg":
        return f"jpeg_q{s['quality']}"
    if kind == "exposure":
        return f"exposure_f{s['factor']:g}"
    tag = f"{kind}_seed{s['seed']}"
    defaults = {k: v for k, v in KINDS[kind].items() if k != "seed"}
    if any(s[k] != v for k, v in defaults.items()):
        tag += "_" + hashlib.sha256(perturbation_string(s).encode()).hexdigest()[:6]
    return tag


# --------------------------------------------------------------------------------------------------
# pixels
# --------------------------------------------------------------------------------------------------
def _gaussian_kernel(sigma: float) -> np.ndarray:
    radius = int(BLUR_TRUNCATE * sigma + 0.5)  # scipy.ndimage's radius for truncate = 4
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def _convolve_axis(a: np.ndarray, kernel: np.ndarray, axis: int) -> np.ndarray:
    r = kernel.size // 2
    pad = [(0, 0)] * a.ndim
    pad[axis] = (r, r)
    # numpy 'symmetric' repeats the edge sample: scipy.ndimage's 'reflect' mode
    padded = np.pad(a, pad, mode="symmetric")
    out = np.zeros_like(a, dtype=np.float64)
    n = a.shape[axis]
    for j, w in enumerate(kernel):
        out += w * np.take(padded, np.arange(j, j + n), axis=axis)
    return out


def gaussian_blur(pixels: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of an (H, W[, C]) array, in float64, sigma in pixels of this array (the
    spatial axes only): ``scipy.ndimage.gaussian_filter(a, (sigma, sigma, 0), mode="reflect", truncate=4)``.

    Parameters
    ----------
    pixels : ndarray of shape (height, width) or (height, width, channels)
        Image values (any numeric dtype).
    sigma : float
        Standard deviation of the kernel in pixels of ``pixels``, > 0.

    Returns
    -------
    ndarray of the same shape, float64
        The blurred values, not rounded.
    """
    a = np.asarray(pixels, dtype=np.float64)
    kernel = _gaussian_kernel(float(sigma))
    return _convolve_axis(_convolve_axis(a, kernel, 0), kernel, 1)


def _to_uint8(a: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)


def _item_rng(seed: int, item_key: str) -> np.random.Generator:
    digest = int(hashlib.sha256(str(item_key).encode()).hexdigest()[:16], 16)
    return np.random.default_rng([int(seed), digest])


def _pen(img, s: Mapping[str, Any], rng: np.random.Generator):
    from PIL import Image, ImageDraw

    w, h = img.size
    side = min(w, h)
    layer = Image.new("RGBA", img.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    color = PEN_COLORS[s["color"]] + (int(round(255 * s["opacity"])),)
    width = max(1, int(round(s["width"] * side)))
    for _ in range(s["strokes"]):
        # a stroke enters on one edge and leaves on the opposite one, with a gentle random walk in between
        start = rng.uniform(0.1, 0.9, size=2)
        end = rng.uniform(0.1, 0.9, size=2)
        if rng.random() < 0.5:
            start[0], end[0] = 0.0, 1.0
        else:
            start[1], end[1] = 0.0, 1.0
        t = np.linspace(0, 1, 9)[:, None]
        path = start + t * (end - start) + np.cumsum(rng.normal(scale=0.03, size=(9, 2)), axis=0) * (t * (1 - t) * 4)
        draw.line([(float(x * (w - 1)), float(y * (h - 1))) for x, y in path], fill=color, width=width, joint="curve")
    return Image.alpha_composite(img.convert("RGBA"), layer).convert("RGB")


def _bubble(img, s: Mapping[str, Any], rng: np.random.Generator):
    from PIL import Image

    a = np.asarray(img, dtype=np.float64)
    h, w = a.shape[:2]
    side = min(w, h)
    yy, xx = np.mgrid[0:h, 0:w]
    for _ in range(s["count"]):
        r = s["radius"] * side * rng.uniform(0.6, 1.2)
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        d = np.hypot(xx - cx, yy - cy)
        inside = np.clip((r - d) / max(1.0, 0.05 * r), 0, 1)[..., None]          # soft disc
        rim = np.exp(-0.5 * ((d - r) / max(1.0, 0.06 * r)) ** 2)[..., None]      # refraction edge
        a = a * (1 - 0.35 * inside) + 255.0 * 0.35 * inside                      # washed-out interior
        a = a * (1 - 0.7 * rim)
    return Image.fromarray(_to_uint8(a))


def _fold(img, s: Mapping[str, Any], rng: np.random.Generator):
    from PIL import Image

    a = np.asarray(img, dtype=np.float64)
    h, w = a.shape[:2]
    side = min(w, h)
    angle = rng.uniform(0, np.pi)
    cx, cy = rng.uniform(0.3, 0.7) * w, rng.uniform(0.3, 0.7) * h
    yy, xx = np.mgrid[0:h, 0:w]
    dist = (xx - cx) * np.sin(angle) - (yy - cy) * np.cos(angle)
    half = 0.5 * s["width"] * side
    band = np.clip(1 - np.abs(dist) / half, 0, 1) ** 0.5                         # 1 on the crease, 0 outside
    band = band[..., None]
    grey = a.mean(axis=2, keepdims=True)
    saturated = grey + 1.5 * (a - grey)                                          # doubled tissue: more stain
    a = (1 - band) * a + band * saturated * (1 - s["darkness"])
    return Image.fromarray(_to_uint8(a))


def apply_perturbation(image, spec: Mapping[str, Any] | str, item_key: str = ""):
    """The perturbed copy of an RGB PIL image (a new image; the input is not modified).

    ``item_key`` (the item's id) seeds the random artefact kinds together with the spec's seed.

    Parameters
    ----------
    image : PIL.Image.Image
        The unperturbed image (any mode; converted to RGB).
    spec : mapping or str
        A perturbation spec (``{"kind": "blur", "sigma": 2.0}``) or its JSON string.
    item_key : str
        The item's id; with the spec's ``seed`` it fixes the random artefact kinds' draws.

    Returns
    -------
    PIL.Image.Image
        A new RGB image of the same size.
    """
    from PIL import Image

    s = parse_perturbation(spec)
    img = image.convert("RGB")
    kind = s["kind"]
    if kind == "blur":
        sigma = s["sigma"] * min(img.size) / BLUR_REFERENCE_SIDE
        return Image.fromarray(_to_uint8(gaussian_blur(np.asarray(img), sigma)))
    if kind == "jpeg":
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=s["quality"], subsampling=2)
        buf.seek(0)
        with Image.open(buf) as decoded:
            decoded.load()
            return decoded.convert("RGB")
    if kind == "exposure":
        return Image.fromarray(_to_uint8(np.asarray(img, dtype=np.float64) * s["factor"]))
    rng = _item_rng(s["seed"], item_key)
    return {"pen": _pen, "bubble": _bubble, "fold": _fold}[kind](img, s, rng)


# --------------------------------------------------------------------------------------------------
# derived manifests
# --------------------------------------------------------------------------------------------------
def derive_manifest(manifest: pd.DataFrame, condition: Mapping[str, Any] | str,
                    splits: Sequence[str] = ("test",)) -> pd.DataFrame:
    """A manifest of the perturbed copies of the rows of ``splits`` (default: the test split).

    Every column is kept; ``item_id`` becomes ``<item_id>__<tag>``; added columns: ``perturbation`` (the
    canonical spec string), ``source_item_id`` (the unperturbed item) and ``condition`` (the tag). Rows that
    already carry a perturbation are refused (perturbations do not stack).

    Parameters
    ----------
    manifest : DataFrame
        A valid manifest (:func:`fmaudit.datasets.manifest.validate_manifest`), with a ``split`` column.
    condition : mapping or str
        The perturbation spec (or its JSON string).
    splits : sequence of str
        Splits whose rows are perturbed.

    Returns
    -------
    DataFrame
        The derived manifest, validated, index reset.

    Raises
    ------
    FmauditInputError
        An invalid manifest or spec, no row in ``splits``, or a row already perturbed.
    """
    validate_manifest(manifest)
    spec = perturbation_string(condition)
    tag = perturbation_tag(spec)
    rows = manifest[manifest["split"].isin(list(splits))].copy()
    if len(rows) == 0:
        raise FmauditInputError(f"derive_manifest: no rows in split(s) {list(splits)} to perturb")
    if PERTURBATION_COLUMN in rows.columns and rows[PERTURBATION_COLUMN].notna().any():
        first = rows.loc[rows[PERTURBATION_COLUMN].notna(), "item_id"].iloc[0]
        raise FmauditInputError(f"derive_manifest: item {first!r} is already perturbed; "
                                "derive from the original manifest")
    rows[SOURCE_ITEM_COLUMN] = rows["item_id"].astype("string")
    rows["item_id"] = (rows["item_id"].astype(str) + ID_SEPARATOR + tag).astype("string")
    rows[PERTURBATION_COLUMN] = pd.Series(spec, index=rows.index, dtype="string")
    rows[CONDITION_COLUMN] = pd.Series(tag, index=rows.index, dtype="string")
    return validate_manifest(rows.reset_index(drop=True), name=f"derived manifest {tag}")

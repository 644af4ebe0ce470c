"""The built-in demo data set: procedurally drawn, H&E-like tissue tiles from several acquisition domains.

Five tissue-like classes (``CLASS_NAMES``) are drawn as hematoxylin and eosin concentration maps (nuclei
as irregular ellipses, fibres as warped streaks, fat as Voronoi membranes ...), turned into RGB by
Beer-Lambert absorption with a domain's stain vectors, then put through the domain's acquisition: blur,
colour cast, gamma, sensor noise and JPEG-like 8×8 DCT quantisation. Patients are nested in domains and
carry their own stain strength and nucleus size, so tiles of one patient are correlated (the reason for
grouped splits and cluster bootstrap).

Conventions
- ``group`` is the patient id ``"<domain>_p<NN>"``; ``domain`` is ``scanner-a``, ``scanner-b`` ...
- Splits are group-disjoint within each domain: of ``n`` patients, ``max(1, round(0.2 n))`` are test,
  as many are val, the rest train (6 patients: 4 / 1 / 1), by a seeded permutation.
- Every tile is drawn from its own generator seeded by (seed, domain, patient, class, tile index), so a
  tile does not depend on how many others are drawn. Same seed, same pixels; the PNGs and the manifest are
  byte-identical on the same platform (numpy's exp and zlib may round differently elsewhere).
- Files: ``data_root/<dataset>/<domain>/<item_id>.png``. A file whose decoded pixels already match is
  not rewritten (``pixel_sha256`` in the manifest is the SHA-256 of the RGB bytes, format-independent).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
from PIL import Image

from fmaudit.datasets import register_preparer
from fmaudit.io import FmauditInputError, atomic_path

CLASS_NAMES = ("tumour", "stroma", "lymphocytes", "adipose", "mucus")

DEMO_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "image_size": 64,
    "n_patients_per_domain": 6,
    "tiles_per_patient_per_class": 4,
    "n_domains": 3,
}

# Ruifrok & Johnston optical-density vectors of hematoxylin and eosin (RGB)
_H_REF = (0.65, 0.70, 0.29)
_E_REF = (0.07, 0.99, 0.11)


@dataclass(frozen=True)
class AcquisitionDomain:
    """How one scanner/site renders stained tissue: stain colours and strengths, then optics and sensor."""

    name: str
    hematoxylin_od: tuple[float, float, float]
    eosin_od: tuple[float, float, float]
    hematoxylin_gain: float
    eosin_gain: float
    blur_sigma: float  # gaussian optical blur, pixels
    white_balance: tuple[float, float, float]  # per-channel gain of transmitted light
    gamma: float  # applied to [0, 1] intensities
    noise_sigma: float  # gaussian sensor noise, 8-bit units
    jpeg_quality: int | None  # IJG quality of the 8×8 DCT quantisation; None = lossless


DOMAINS: tuple[AcquisitionDomain, ...] = (
    AcquisitionDomain("scanner-a", _H_REF, _E_REF, 1.0, 1.0, 0.0, (1.0, 1.0, 1.0), 1.0, 2.0, None),
    # purple-brown hematoxylin, magenta eosin, dark nuclei, pale cytoplasm; soft focus and strong JPEG
    AcquisitionDomain("scanner-b", (0.50, 0.78, 0.40), (0.28, 0.90, 0.33), 1.3, 0.7, 1.0,
                      (0.96, 1.0, 1.05), 0.85, 4.0, 30),
    # faded hematoxylin, orange-red eosin, yellow light, brighter and noisier
    AcquisitionDomain("scanner-c", (0.75, 0.60, 0.28), (0.03, 0.80, 0.60), 0.65, 1.3, 0.6,
                      (1.0, 0.95, 0.84), 1.15, 7.0, None),
    # heavy blur, cool light, moderate JPEG
    AcquisitionDomain("scanner-d", (0.62, 0.72, 0.32), (0.12, 0.97, 0.20), 0.9, 0.9, 1.6,
                      (0.9, 0.98, 1.0), 1.0, 3.0, 50),
)


@dataclass(frozen=True)
class _Patient:
    hematoxylin_gain: float
    eosin_gain: float
    nucleus_scale: float
    od_jitter: np.ndarray  # (2, 3) added to the domain's H and E vectors


def _smooth_noise(rng: np.random.Generator, size: int, sigma: float) -> np.ndarray:
    """Gaussian-filtered white noise scaled to zero mean and unit standard deviation."""
    from scipy import ndimage

    field = ndimage.gaussian_filter(rng.standard_normal((size, size)).astype(np.float32), sigma, mode="wrap")
    return (field - field.mean()) / (field.std() + 1e-6)


def _draw_nuclei(
    canvas: np.ndarray,
    rng: np.random.Generator,
    n: int,
    radius: tuple[float, float],
    elongation: tuple[float, float],
    irregularity: float,
    intensity: float,
    texture: np.ndarray,
    texture_amount: float,
    angles: np.ndarray | None = None,
    centres: np.ndarray | None = None,
) -> None:
    """Stamp ``n`` soft-edged, optionally irregular ellipses into ``canvas`` (max-composited)."""
    size = canvas.shape[0]
    if centres is None:
        centres = rng.uniform(-4, size + 4, size=(n, 2))
    radii = rng.uniform(*radius, size=n)
    ratios = rng.uniform(*elongation, size=n)
    if angles is None:
        angles = rng.uniform(0, np.pi, size=n)
    harmonics = rng.normal(0, irregularity, size=(n, 3))
    phases = rng.uniform(0, 2 * np.pi, size=(n, 3))
    gains = rng.uniform(0.85, 1.15, size=n)
    for (cx, cy), r, ratio, ang, harm, ph, g in zip(centres, radii, ratios, angles, harmonics, phases, gains):
        a, b = r * np.sqrt(ratio), r / np.sqrt(ratio)
        reach = int(np.ceil(a * (1 + 3 * irregularity) + 2))
        x0, x1 = max(0, int(cx) - reach), min(size, int(cx) + reach + 1)
        y0, y1 = max(0, int(cy) - reach), min(size, int(cy) + reach + 1)
        if x0 >= x1 or y0 >= y1:
            continue
        yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
        dx, dy = xx - cx, yy - cy
        u = (dx * np.cos(ang) + dy * np.sin(ang)) / a
        v = (-dx * np.sin(ang) + dy * np.cos(ang)) / b
        rho = np.hypot(u, v)
        theta = np.arctan2(v, u)
        boundary = 1 + sum(h * np.cos((k + 2) * theta + p) for k, (h, p) in enumerate(zip(harm, ph)))
        coverage = np.clip((boundary - rho) * b + 0.5, 0, 1)
        value = coverage * intensity * g * (1 + texture_amount * texture[y0:y1, x0:x1])
        np.maximum(canvas[y0:y1, x0:x1], value, out=canvas[y0:y1, x0:x1])


def _tumour(rng: np.random.Generator, size: int, patient: _Patient) -> tuple[np.ndarray, np.ndarray]:
    """Crowded, large, irregular nuclei with coarse chromatin and nucleoli in purplish cytoplasm."""
    texture = _smooth_noise(rng, size, 0.7)
    h = 0.12 + 0.04 * _smooth_noise(rng, size, 3)
    e = 0.42 + 0.08 * _smooth_noise(rng, size, 4)
    n = int(size * size / 85)
    s = patient.nucleus_scale
    _draw_nuclei(h, rng, n, (3.8 * s, 6.2 * s), (1.0, 1.8), 0.14, 0.95, texture, 0.45)
    # nucleoli: small dark dots inside some nuclei
    _draw_nuclei(h, rng, n // 3, (0.8, 1.2), (1.0, 1.2), 0.0, 1.5, texture, 0.0)
    return h, e


def _stroma(rng: np.random.Generator, size: int, patient: _Patient) -> tuple[np.ndarray, np.ndarray]:
    """Wavy eosinophilic fibres in one direction, sparse spindle nuclei along them."""
    angle = rng.uniform(0, np.pi)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    along = xx * np.cos(angle) + yy * np.sin(angle)
    across = -xx * np.sin(angle) + yy * np.cos(angle)
    warp = 2.5 * _smooth_noise(rng, size, 10) + 0.6 * _smooth_noise(rng, size, 2)
    period = rng.uniform(3.5, 5.0)
    fibres = np.clip(1.3 * np.sin(2 * np.pi * (across + warp) / period) + 0.2, 0, 1)
    # fibres fade in and out along their length rather than running as unbroken stripes
    fibres *= np.clip(0.8 + 0.5 * _smooth_noise(rng, size, 3) + 0.2 * np.sin(along / 7), 0.1, 1.4)
    e = 0.22 + 0.6 * fibres
    h = 0.03 + 0.02 * _smooth_noise(rng, size, 3)
    n = int(size * size / 450)
    s = patient.nucleus_scale
    _draw_nuclei(h, rng, n, (3.0 * s, 4.0 * s), (5.0, 8.0), 0.03, 0.9, np.zeros((size, size), np.float32),
                 0.0, angles=np.full(n, angle))
    return h, e


def _lymphocytes(rng: np.random.Generator, size: int, patient: _Patient) -> tuple[np.ndarray, np.ndarray]:
    """Sheets of small, round, uniformly dark nuclei with little cytoplasm."""
    texture = _smooth_noise(rng, size, 0.6)
    h = 0.10 + 0.03 * _smooth_noise(rng, size, 3)
    e = 0.20 + 0.05 * _smooth_noise(rng, size, 4)
    n = int(size * size / 26)
    s = patient.nucleus_scale
    _draw_nuclei(h, rng, n, (2.0 * s, 2.7 * s), (1.0, 1.15), 0.03, 1.65, texture, 0.1)
    return h, e


def _adipose(rng: np.random.Generator, size: int, patient: _Patient) -> tuple[np.ndarray, np.ndarray]:
    """Empty polygonal fat cells outlined by thin membranes, a few flattened nuclei on them."""
    from scipy.spatial import cKDTree

    # fat cells of similar size: seeds on a jittered grid, so no sliver cells
    spacing = rng.uniform(15, 22)
    grid = np.arange(-spacing, size + 2 * spacing, spacing)
    gx, gy = np.meshgrid(grid, grid)
    seeds = np.stack([gx.ravel(), gy.ravel()], axis=1) + rng.uniform(-0.35, 0.35, (gx.size, 2)) * spacing
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    jitter = 0.8 * _smooth_noise(rng, size, 3)
    points = np.stack([xx.ravel() + jitter.ravel(), yy.ravel() - jitter.ravel()], axis=1)
    dist, _ = cKDTree(seeds).query(points, k=2)
    gap = (dist[:, 1] - dist[:, 0]).reshape(size, size)
    membrane = np.clip(1.4 - gap, 0, 1)
    e = 0.015 + 0.6 * membrane
    h = np.full((size, size), 0.01, dtype=np.float32)
    # a few flattened nuclei riding on the membranes
    on_membrane = np.argwhere(membrane > 0.9)
    n = min(len(on_membrane), int(size * size / 1500) + 1)
    if n:
        pick = on_membrane[rng.choice(len(on_membrane), size=n, replace=False)][:, ::-1].astype(np.float64)
        _draw_nuclei(h, rng, n, (2.5, 3.2), (3.0, 4.0), 0.0, 0.8, np.zeros((size, size), np.float32), 0.0,
                     centres=pick)
    return h, e


def _mucus(rng: np.random.Generator, size: int, patient: _Patient) -> tuple[np.ndarray, np.ndarray]:
    """Pale, faintly bluish wisps with the odd floating cell."""
    wisps = np.clip(_smooth_noise(rng, size, 5), 0, None)
    h = 0.10 + 0.10 * wisps
    e = 0.07 + 0.05 * np.clip(_smooth_noise(rng, size, 6), -1, None)
    n = int(rng.integers(0, 3))
    _draw_nuclei(h, rng, n, (2.5, 3.5), (1.0, 1.4), 0.1, 0.8, np.zeros((size, size), np.float32), 0.0)
    return h, e


# one painter per class, in CLASS_NAMES order: hematoxylin and eosin concentration maps
_PAINTERS: tuple[Callable[[np.random.Generator, int, _Patient], tuple[np.ndarray, np.ndarray]], ...] = (
    _tumour,
    _stroma,
    _lymphocytes,
    _adipose,
    _mucus,
)


def _unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v)


_JPEG_LUMA = np.array(
    [[16, 11, 10, 16, 24, 40, 51, 61], [12, 12, 14, 19, 26, 58, 60, 55], [14, 13, 16, 24, 40, 57, 69, 56],
     [14, 17, 22, 29, 51, 87, 80, 62], [18, 22, 37, 56, 68, 109, 103, 77], [24, 35, 55, 64, 81, 104, 113, 92],
     [49, 64, 78, 87, 103, 121, 120, 101], [72, 92, 95, 98, 112, 100, 103, 99]], dtype=np.float32)
_JPEG_CHROMA = np.full((8, 8), 99, dtype=np.float32)
_JPEG_CHROMA[:4, :4] = [[17, 18, 24, 47], [18, 21, 26, 66], [24, 26, 56, 99], [47, 66, 99, 99]]


def jpeg_like(rgb: np.ndarray, quality: int) -> np.ndarray:
    """JPEG's lossy step without a codec: YCbCr, 8×8 orthonormal DCT, IJG-scaled quantisation, inverse.

    Deterministic and free of libjpeg versions; no chroma subsampling. ``rgb`` is float in [0, 255].
    """
    from scipy import fft

    scale = 5000 / quality if quality < 50 else 200 - 2 * quality
    tables = [np.clip(np.floor((t * scale + 50) / 100), 1, 255) for t in (_JPEG_LUMA, _JPEG_CHROMA, _JPEG_CHROMA)]
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    ycc = np.stack([0.299 * r + 0.587 * g + 0.114 * b - 128,
                    -0.168736 * r - 0.331264 * g + 0.5 * b,
                    0.5 * r - 0.418688 * g - 0.081312 * b], axis=-1)
    h, w = rgb.shape[:2]
    ph, pw = -h % 8, -w % 8
    ycc = np.pad(ycc, ((0, ph), (0, pw), (0, 0)), mode="edge")
    H, W = ycc.shape[:2]
    out = np.empty_like(ycc)
    for c, table in enumerate(tables):
        blocks = ycc[..., c].reshape(H // 8, 8, W // 8, 8).transpose(0, 2, 1, 3)
        coef = fft.dctn(blocks, type=2, norm="ortho", axes=(-2, -1))
        coef = np.round(coef / table) * table
        out[..., c] = fft.idctn(coef, type=2, norm="ortho", axes=(-2, -1)).transpose(0, 2, 1, 3).reshape(H, W)
    out = out[:h, :w]
    y, cb, cr = out[..., 0] + 128, out[..., 1], out[..., 2]
    return np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], axis=-1)


def render_tile(
    class_index: int, domain: AcquisitionDomain, patient: _Patient, rng: np.random.Generator, size: int
) -> np.ndarray:
    """One ``size``×``size`` RGB uint8 tile of class ``class_index`` as ``domain`` acquires it."""
    from scipy import ndimage

    h, e = _PAINTERS[class_index](rng, size, patient)
    h = np.clip(h, 0, None) * domain.hematoxylin_gain * patient.hematoxylin_gain
    e = np.clip(e, 0, None) * domain.eosin_gain * patient.eosin_gain
    h_od = _unit(np.asarray(domain.hematoxylin_od) + patient.od_jitter[0])
    e_od = _unit(np.asarray(domain.eosin_od) + patient.od_jitter[1])
    od = h[..., None] * h_od + e[..., None] * e_od + 0.03
    rgb = np.exp(-od) * np.asarray(domain.white_balance, dtype=np.float32)
    if domain.blur_sigma > 0:
        rgb = ndimage.gaussian_filter(rgb, sigma=(domain.blur_sigma, domain.blur_sigma, 0), mode="reflect")
    rgb = 255.0 * np.clip(rgb, 0, 1) ** domain.gamma
    rgb = rgb + rng.normal(0, domain.noise_sigma, size=rgb.shape)
    if domain.jpeg_quality is not None:
        rgb = jpeg_like(np.clip(rgb, 0, 255), domain.jpeg_quality)
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def _patient(seed: int, d: int, p: int) -> _Patient:
    rng = np.random.default_rng([seed, d, p, 1_000_003])
    return _Patient(
        hematoxylin_gain=float(rng.uniform(0.85, 1.15)),
        eosin_gain=float(rng.uniform(0.85, 1.15)),
        nucleus_scale=float(rng.uniform(0.9, 1.1)),
        od_jitter=rng.normal(0, 0.03, size=(2, 3)).astype(np.float32),
    )


def patient_splits(n_patients: int, rng: np.random.Generator) -> list[str]:
    """Split of each patient (index order): 20 % test, 20 % val (at least one each), the rest train."""
    if n_patients < 3:
        raise FmauditInputError(f"demo data: n_patients_per_domain must be at least 3 (train/val/test), got {n_patients}")
    n_test = n_val = max(1, int(round(0.2 * n_patients)))
    order = rng.permutation(n_patients)
    splits = ["train"] * n_patients
    for rank, p in enumerate(order):
        if rank < n_test:
            splits[p] = "test"
        elif rank < n_test + n_val:
            splits[p] = "val"
    return splits


def pixel_sha256(rgb: np.ndarray) -> str:
    """SHA-256 of an image's shape and RGB bytes (independent of the file format that stores it)."""
    h = hashlib.sha256(repr(rgb.shape).encode())
    h.update(np.ascontiguousarray(rgb, dtype=np.uint8).tobytes())
    return h.hexdigest()


def _existing_pixels_hash(path: Path) -> str | None:
    try:
        with Image.open(path) as im:
            return pixel_sha256(np.asarray(im.convert("RGB")))
    except (OSError, ValueError):
        return None


def _write_png(path: Path, rgb: np.ndarray) -> None:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG", optimize=False, compress_level=6)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buf.getvalue())


def _check_params(dataset: str, params: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(params) - set(DEMO_DEFAULTS))
    if unknown:
        raise FmauditInputError(f"dataset {dataset!r}: unknown demo_tiles parameter(s) {unknown}; known: {sorted(DEMO_DEFAULTS)}")
    p = {**DEMO_DEFAULTS, **params}
    for key in DEMO_DEFAULTS:
        value = p[key]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise FmauditInputError(f"dataset {dataset!r}: demo_tiles parameter {key!r} must be an integer, got {value!r}")
        p[key] = int(value)
    if p["seed"] < 0:
        raise FmauditInputError(f"dataset {dataset!r}: seed must be >= 0, got {p['seed']}")
    if p["image_size"] < 16:
        raise FmauditInputError(f"dataset {dataset!r}: image_size must be at least 16, got {p['image_size']}")
    if p["tiles_per_patient_per_class"] < 1:
        raise FmauditInputError(f"dataset {dataset!r}: tiles_per_patient_per_class must be at least 1")
    if not 1 <= p["n_domains"] <= len(DOMAINS):
        raise FmauditInputError(f"dataset {dataset!r}: n_domains must be between 1 and {len(DOMAINS)}, got {p['n_domains']}")
    return p


@register_preparer("demo_tiles")
def prepare_demo_tiles(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Generate (or reuse) the demo tiles under ``data_root/<dataset>/`` and return their manifest.

    ``params``: ``seed``, ``image_size`` (px), ``n_patients_per_domain`` (>= 3),
    ``tiles_per_patient_per_class``, ``n_domains`` (1 to 4); defaults in ``DEMO_DEFAULTS``. Default size:
    5 classes × 3 domains × 6 patients × 4 tiles = 360 tiles of 64 px.
    """
    p = _check_params(dataset, params)
    seed, size = p["seed"], p["image_size"]
    root = Path(data_root) / dataset
    rows = []
    for d, domain in enumerate(DOMAINS[: p["n_domains"]]):
        splits = patient_splits(p["n_patients_per_domain"], np.random.default_rng([seed, d, 2_000_003]))
        for pi in range(p["n_patients_per_domain"]):
            patient = _patient(seed, d, pi)
            group = f"{domain.name}_p{pi:02d}"
            for c, class_name in enumerate(CLASS_NAMES):
                for k in range(p["tiles_per_patient_per_class"]):
                    rgb = render_tile(c, domain, patient, np.random.default_rng([seed, d, pi, c, k]), size)
                    item_id = f"{group}_{class_name}_{k:02d}"
                    path = root / domain.name / f"{item_id}.png"
                    digest = pixel_sha256(rgb)
                    if not path.exists() or _existing_pixels_hash(path) != digest:
                        _write_png(path, rgb)
                    rows.append(
                        {
                            "dataset": dataset,
                            "item_id": item_id,
                            "source": str(path),
                            "label": c,
                            "label_name": class_name,
                            "group": group,
                            "domain": domain.name,
                            "split": splits[pi],
                            "pixel_sha256": digest,
                        }
                    )
    return pd.DataFrame(rows)

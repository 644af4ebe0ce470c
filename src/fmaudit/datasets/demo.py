"""The built-in demo data set: procedurally drawn, H&E-like tissue tiles from several acquisition domains.

Five tissue-like classes (``CLASS_NAMES``) are drawn as hematoxylin and eosin concentration maps (nuclei
as irregular ellipses, fibres as warped streaks, fat as Voronoi membranes ...), turned into RGB by
Beer-Lambert absorption with a domain's stain vectors, then put through the domain's acquisition: blur,
colour cast, gamma, sensor noise and JPEG-like 8×8 DCT quantisation. Patients are nested in domains and
carry their own stain strength and nucleus size, so tiles of one patient are correlated (the reason for
grouped splits and cluster bootstrap).

How hard the task is, and how far the domains are apart, is set by four parameters (``dataset_params``;
the defaults draw clean, fully separable tiles, the demo config grades them):

- ``tissue_mixing`` (0 to 0.5): a tile of class c also shows a second, randomly chosen class in a blob
  covering a share drawn uniformly from [0, tissue_mixing] of it, as tiles cut across tissue borders do. The
  label stays the dominant class c, so tiles near 0.5 are genuinely ambiguous; this grades separability.
- ``label_noise`` (0 to 1): that share of tiles (in every split) carries another class's label, drawn
  uniformly: annotation error, which no encoder can learn past.
- ``patient_variability`` (>= 0): scales how much patients differ in stain strength, stain hue and nucleus
  size (1 = ±15 % stain gain, ±10 % nucleus size, 0.03 hue jitter); it grows within-class variability and the
  correlation of a patient's tiles.
- ``shift_strength`` (>= 0): how far each domain's acquisition (stain vectors and gains, blur, white balance,
  gamma, noise, JPEG quality) lies from the reference ``scanner-a``; 1 is the domains as ``DOMAINS`` defines
  them, 0 makes every domain acquire like ``scanner-a`` (patients still differ).

Conventions
- ``group`` is the patient id ``"<domain>_p<NN>"``; ``domain`` is ``scanner-a``, ``scanner-b`` ...
- Splits are group-disjoint within each domain: of ``n`` patients, ``max(1, round(0.2 n))`` are test,
  as many are val, the rest train (6 patients: 4 / 1 / 1), by a seeded permutation.
- Every tile is drawn from its own generators seeded by (seed, domain, patient, class, tile index), so a
  tile does not depend on how many others are drawn; its main tissue and acquisition noise do not depend on
  the grading either (the second tissue and the label flip have a generator of their own), so
  ``tissue_mixing: 0`` and ``label_noise: 0`` give the clean tiles of the same seed. Same seed, same pixels;
  the PNGs and the manifest are byte-identical on the same platform (numpy's exp and zlib may round
  differently elsewhere).
- Manifest columns beyond the standard ones: ``tissue_class`` (the drawn, dominant class; differs from
  ``label`` where the label is noisy), ``second_class`` and ``second_share`` (the mixed-in tissue, -1 and 0
  for none), ``pixel_sha256``.
- Files: ``data_root/<dataset>/<domain>/<item_id>.png``. A file whose decoded pixels already match is
  not rewritten (``pixel_sha256`` in the manifest is the SHA-256 of the RGB bytes, format-independent).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
from PIL import Image

from fmaudit.datasets import register_preparer
from fmaudit.io import FmauditInputError, atomic_path

CLASS_NAMES = ("tumour", "stroma", "lymphocytes", "adipose", "mucus")

#: The preparer's parameters and their defaults (``resources/datasets.yaml`` repeats them for the config;
#: a test keeps the two equal). Integers, then the four grading levers (floats).
DEMO_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "image_size": 64,
    "n_patients_per_domain": 6,
    "tiles_per_patient_per_class": 4,
    "n_domains": 3,
    "tissue_mixing": 0.0,
    "label_noise": 0.0,
    "patient_variability": 1.0,
    "shift_strength": 1.0,
}
_FLOAT_PARAMS = ("tissue_mixing", "label_noise", "patient_variability", "shift_strength")

# Ruifrok & Johnston optical-density vectors of hematoxylin and eosin (RGB)
_H_REF = (0.65, 0.70, 0.29)
_E_REF = (0.07, 0.99, 0.11)


@dataclass(frozen=True)
class AcquisitionDomain:
    """How one scanner/site renders stained tissue: stain colours and strengths, then optics and sensor.

    Attributes
    ----------
    name : str
        The domain's name, the manifest's ``domain`` (``scanner-a`` .. ``scanner-d``).
    hematoxylin_od, eosin_od : tuple of 3 float
        Optical-density (RGB) vectors of the two stains; normalised to unit length when imaged.
    hematoxylin_gain, eosin_gain : float
        Multipliers of each stain's concentration (stain strength).
    blur_sigma : float
        Gaussian optical blur, in pixels (0: none).
    white_balance : tuple of 3 float
        Per-channel gain of the transmitted light.
    gamma : float
        Exponent applied to [0, 1] intensities.
    noise_sigma : float
        Standard deviation of the Gaussian sensor noise, in 8-bit units.
    jpeg_quality : int or None
        IJG quality (1-100) of the 8×8 DCT quantisation; None: lossless.
    """

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

    def shifted_from(self, reference: "AcquisitionDomain", strength: float) -> "AcquisitionDomain":
        """This domain moved to ``strength`` × its distance from ``reference`` (0: acquires like the reference,
        1: itself; other values extrapolate). Lossless counts as JPEG quality 100.

        Parameters
        ----------
        reference : AcquisitionDomain
            The domain at strength 0 (the demo uses ``scanner-a``).
        strength : float
            The ``shift_strength`` lever, at least 0; 1 returns this domain itself.

        Returns
        -------
        AcquisitionDomain
            Every numeric field interpolated (or extrapolated) between ``reference`` and this domain, the name kept,
            blur and noise clipped at 0, JPEG quality clipped to [1, 100] with 100 meaning lossless.
        """
        if strength == 1.0:
            return self
        values = {}
        for f in fields(self):
            if f.name in ("name", "jpeg_quality"):
                continue
            ref, own = np.asarray(getattr(reference, f.name), float), np.asarray(getattr(self, f.name), float)
            mixed = ref + strength * (own - ref)
            values[f.name] = tuple(float(v) for v in mixed) if mixed.ndim else float(mixed)
        q_ref, q_own = reference.jpeg_quality or 100, self.jpeg_quality or 100
        quality = int(round(np.clip(q_ref + strength * (q_own - q_ref), 1, 100)))
        values["blur_sigma"] = max(0.0, values["blur_sigma"])
        values["noise_sigma"] = max(0.0, values["noise_sigma"])
        return replace(self, **values, jpeg_quality=None if quality >= 100 else quality)


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


@dataclass(frozen=True)
class _Nuclei:
    """How a population of nuclei looks: size (px, before the patient's scale), shape and staining."""

    radius: tuple[float, float]  # uniform range of the mean radius
    elongation: tuple[float, float]  # uniform range of the axis ratio
    irregularity: float  # sd of the boundary's 2nd-4th harmonics
    intensity: float  # hematoxylin concentration at the centre
    texture_amount: float = 0.0  # chromatin: relative modulation by the tile's texture field
    scales_with_patient: bool = True


def _draw_nuclei(
    canvas: np.ndarray,
    rng: np.random.Generator,
    n: int,
    look: _Nuclei,
    scale: float = 1.0,
    texture: np.ndarray | None = None,
    angles: np.ndarray | None = None,
    centres: np.ndarray | None = None,
) -> None:
    """Stamp ``n`` soft-edged, optionally irregular ellipses into ``canvas`` (max-composited), all at once."""
    size = canvas.shape[0]
    if n <= 0:
        return
    if centres is None:
        centres = rng.uniform(-4, size + 4, size=(n, 2))
    radii = rng.uniform(*look.radius, size=n) * scale
    ratios = rng.uniform(*look.elongation, size=n)
    if angles is None:
        angles = rng.uniform(0, np.pi, size=n)
    harmonics = rng.normal(0, look.irregularity, size=(n, 3))
    phases = rng.uniform(0, 2 * np.pi, size=(n, 3))
    gains = rng.uniform(0.85, 1.15, size=n)
    a, b = radii * np.sqrt(ratios), radii / np.sqrt(ratios)
    reach = int(np.ceil(a.max() * (1 + 3 * look.irregularity) + 2))
    offsets = np.arange(-reach, reach + 1)
    # one (n, w, w) window per nucleus around its centre pixel
    xs = np.floor(centres[:, 0]).astype(int)[:, None] + offsets
    ys = np.floor(centres[:, 1]).astype(int)[:, None] + offsets
    dx = (xs - centres[:, :1])[:, None, :]
    dy = (ys - centres[:, 1:])[:, :, None]
    cos, sin = np.cos(angles)[:, None, None], np.sin(angles)[:, None, None]
    u = (dx * cos + dy * sin) / a[:, None, None]
    v = (-dx * sin + dy * cos) / b[:, None, None]
    rho = np.hypot(u, v)
    # the boundary's harmonics only where a nucleus can reach (its radius is at most 1 + sum |harmonics|) and
    # on the canvas: most of a square window is neither
    reach_rho = 1 + np.abs(harmonics).sum(axis=1) + 0.5 / b
    on_canvas = ((ys >= 0) & (ys < size))[:, :, None] & ((xs >= 0) & (xs < size))[:, None, :]
    nucleus, wy, wx = np.nonzero(on_canvas & (rho < reach_rho[:, None, None]))
    u, v, rho = u[nucleus, wy, wx], v[nucleus, wy, wx], rho[nucleus, wy, wx]
    theta = np.arctan2(v, u)
    boundary = 1 + sum(harmonics[nucleus, k] * np.cos((k + 2) * theta + phases[nucleus, k]) for k in range(3))
    coverage = np.clip((boundary - rho) * b[nucleus] + 0.5, 0, 1)
    keep = coverage > 0
    nucleus, yy, xx = nucleus[keep], ys[nucleus[keep], wy[keep]], xs[nucleus[keep], wx[keep]]
    value = coverage[keep] * look.intensity * gains[nucleus]
    if texture is not None and look.texture_amount:
        value = value * (1 + look.texture_amount * texture[yy, xx])
    np.maximum.at(canvas.reshape(-1), yy * size + xx, value.astype(canvas.dtype))


@dataclass(frozen=True)
class _CellSheet:
    """A tissue that is a background stain under a sheet of nuclei (tumour, lymphocytes): background
    concentrations ``(mean, smooth-noise amplitude)``, nuclei at one per ``area_per_nucleus`` px², and
    optional small inclusions (nucleoli) in a third of them."""

    hematoxylin: tuple[float, float]
    eosin: tuple[float, float]
    texture_sigma: float
    area_per_nucleus: float
    nuclei: _Nuclei
    inclusions: _Nuclei | None = None

    def paint(self, rng: np.random.Generator, size: int, patient: _Patient) -> tuple[np.ndarray, np.ndarray]:
        texture = _smooth_noise(rng, size, self.texture_sigma)
        h = self.hematoxylin[0] + self.hematoxylin[1] * _smooth_noise(rng, size, 3)
        e = self.eosin[0] + self.eosin[1] * _smooth_noise(rng, size, 4)
        n = int(size * size / self.area_per_nucleus)
        _draw_nuclei(h, rng, n, self.nuclei, patient.nucleus_scale, texture)
        if self.inclusions is not None:
            _draw_nuclei(h, rng, n // 3, self.inclusions)
        return h, e


# crowded, large, irregular nuclei with coarse chromatin and nucleoli in purplish cytoplasm
_TUMOUR = _CellSheet((0.12, 0.04), (0.42, 0.08), 0.7, 85, _Nuclei((3.8, 6.2), (1.0, 1.8), 0.14, 0.95, 0.45),
                     inclusions=_Nuclei((0.8, 1.2), (1.0, 1.2), 0.0, 1.5))
# sheets of small, round, uniformly dark nuclei with little cytoplasm
_LYMPHOCYTES = _CellSheet((0.10, 0.03), (0.20, 0.05), 0.6, 26, _Nuclei((2.0, 2.7), (1.0, 1.15), 0.03, 1.65, 0.1))
_SPINDLE = _Nuclei((3.0, 4.0), (5.0, 8.0), 0.03, 0.9)
_FLAT_ON_MEMBRANE = _Nuclei((2.5, 3.2), (3.0, 4.0), 0.0, 0.8)
_FLOATING = _Nuclei((2.5, 3.5), (1.0, 1.4), 0.1, 0.8)


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
    _draw_nuclei(h, rng, n, _SPINDLE, patient.nucleus_scale, angles=np.full(n, angle))
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
        _draw_nuclei(h, rng, n, _FLAT_ON_MEMBRANE, centres=pick)
    return h, e


def _mucus(rng: np.random.Generator, size: int, patient: _Patient) -> tuple[np.ndarray, np.ndarray]:
    """Pale, faintly bluish wisps with the odd floating cell."""
    wisps = np.clip(_smooth_noise(rng, size, 5), 0, None)
    h = 0.10 + 0.10 * wisps
    e = 0.07 + 0.05 * np.clip(_smooth_noise(rng, size, 6), -1, None)
    _draw_nuclei(h, rng, int(rng.integers(0, 3)), _FLOATING)
    return h, e


# one painter per class, in CLASS_NAMES order: hematoxylin and eosin concentration maps
_PAINTERS: tuple[Callable[[np.random.Generator, int, _Patient], tuple[np.ndarray, np.ndarray]], ...] = (
    _TUMOUR.paint,
    _stroma,
    _LYMPHOCYTES.paint,
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

    Parameters
    ----------
    rgb : ndarray of shape (height, width, 3)
        Float RGB in [0, 255].
    quality : int
        IJG quality, 1 to 100 (lower: coarser quantisation).

    Returns
    -------
    ndarray of shape (height, width, 3)
        Float RGB after the round trip, not clipped or rounded.
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


@dataclass(frozen=True)
class TileComposition:
    """What one tile shows and how it is labelled: the dominant ``tissue_class``, a ``second_class`` (-1 for
    none) covering ``second_share`` of it, and the annotated ``label`` (another class where it is noisy).

    Attributes
    ----------
    tissue_class : int
        Index into ``CLASS_NAMES`` of the tissue covering most of the tile.
    second_class : int
        Index of the tissue laid over part of it, or -1 for none.
    second_share : float
        Share of the tile the second tissue covers, in [0, 0.5].
    label : int
        The annotated class: ``tissue_class``, or another class where label noise struck.
    """

    tissue_class: int
    second_class: int
    second_share: float
    label: int


def draw_composition(rng: np.random.Generator, tissue_class: int, tissue_mixing: float,
                     label_noise: float, n_classes: int = len(CLASS_NAMES)) -> TileComposition:
    """A tile's composition: second class uniform among the others at a share uniform in [0, tissue_mixing];
    with probability ``label_noise`` the label is another class, uniform among the others. The draws are the
    same whatever the levers, so a lever changes how much, not which tiles.

    Parameters
    ----------
    rng : Generator
        The tile's grading generator; four values are drawn from it whatever the levers.
    tissue_class : int
        The tile's dominant class.
    tissue_mixing : float
        The ``tissue_mixing`` lever, in [0, 0.5]: the largest share of a second class.
    label_noise : float
        The ``label_noise`` lever, in [0, 1]: the probability that the label is another class.
    n_classes : int
        Number of classes (default ``len(CLASS_NAMES)``, 5).

    Returns
    -------
    TileComposition
        ``second_class`` -1 when the drawn share is 0.
    """
    others = [c for c in range(n_classes) if c != tissue_class]
    share_u, second, flip_u, noisy = rng.uniform(), int(rng.choice(others)), rng.uniform(), int(rng.choice(others))
    share = float(share_u * tissue_mixing)
    return TileComposition(tissue_class, second if share > 0 else -1, share,
                           noisy if flip_u < label_noise else tissue_class)


def tissue_stains(composition: TileComposition, patient: _Patient, rng: np.random.Generator,
                  second_rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Hematoxylin and eosin concentration maps of a tile: the dominant tissue drawn with ``rng``, the second
    one (if any) drawn with ``second_rng`` and laid over a smooth blob covering ``second_share`` of the tile.

    Parameters
    ----------
    composition : TileComposition
        What the tile shows.
    patient : _Patient
        The patient's stain gains, nucleus scale and stain-vector jitter (drawn per domain and patient from the seed).
    rng : Generator
        Generator of the dominant tissue's drawing.
    second_rng : Generator
        Generator of the second tissue and of the blob's shape (the grading generator).
    size : int
        Tile side in pixels.

    Returns
    -------
    tuple of (ndarray, ndarray)
        Hematoxylin and eosin concentration maps, float arrays of shape (size, size).
    """
    h, e = _PAINTERS[composition.tissue_class](rng, size, patient)
    if composition.second_class < 0:
        return h, e
    h2, e2 = _PAINTERS[composition.second_class](second_rng, size, patient)
    field = _smooth_noise(second_rng, size, size / 6)
    threshold = np.quantile(field, 1 - composition.second_share)
    blob = np.clip((field - threshold) / 0.3 + 0.5, 0, 1)  # a soft border of a few pixels
    return h + blob * (h2 - h), e + blob * (e2 - e)


def acquire(h: np.ndarray, e: np.ndarray, domain: AcquisitionDomain, patient: _Patient,
            rng: np.random.Generator) -> np.ndarray:
    """Stain concentration maps as ``domain`` images them for ``patient``: RGB uint8.

    Parameters
    ----------
    h, e : ndarray of shape (size, size)
        Hematoxylin and eosin concentration maps (negative values are clipped to 0).
    domain : AcquisitionDomain
        The scanner that images them: stain vectors and gains, white balance, blur, gamma, noise, JPEG.
    patient : _Patient
        The patient's stain gains, nucleus scale and stain-vector jitter (drawn per domain and patient from the seed).
    rng : Generator
        Generator of the sensor noise.

    Returns
    -------
    ndarray of shape (size, size, 3)
        The RGB tile, uint8.
    """
    from scipy import ndimage

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


def render_tile(
    class_index: int, domain: AcquisitionDomain, patient: _Patient, rng: np.random.Generator, size: int
) -> np.ndarray:
    """One clean ``size``×``size`` RGB uint8 tile of class ``class_index`` as ``domain`` acquires it.

    Parameters
    ----------
    class_index : int
        Index into ``CLASS_NAMES``.
    domain : AcquisitionDomain
        The scanner that images it.
    patient : _Patient
        The patient's stain gains, nucleus scale and stain-vector jitter (drawn per domain and patient from the seed).
    rng : Generator
        Generator of the tissue's drawing and of the sensor noise.
    size : int
        Tile side in pixels.

    Returns
    -------
    ndarray of shape (size, size, 3)
        The RGB tile, uint8, with no second tissue.
    """
    h, e = _PAINTERS[class_index](rng, size, patient)
    return acquire(h, e, domain, patient, rng)


def _patient(seed: int, d: int, p: int, variability: float = 1.0) -> _Patient:
    rng = np.random.default_rng([seed, d, p, 1_000_003])
    h_u, e_u, n_u = rng.uniform(-1, 1, size=3)
    return _Patient(
        hematoxylin_gain=float(max(0.1, 1 + 0.15 * variability * h_u)),
        eosin_gain=float(max(0.1, 1 + 0.15 * variability * e_u)),
        nucleus_scale=float(max(0.3, 1 + 0.10 * variability * n_u)),
        od_jitter=(variability * rng.normal(0, 0.03, size=(2, 3))).astype(np.float32),
    )


def patient_splits(n_patients: int, rng: np.random.Generator) -> list[str]:
    """Split of each patient (index order): 20 % test, 20 % val (at least one each), the rest train.

    Parameters
    ----------
    n_patients : int
        Patients of one domain, at least 3.
    rng : Generator
        Generator of the permutation that picks them.

    Returns
    -------
    list of str
        ``train``, ``val`` or ``test`` for each patient index.

    Raises
    ------
    FmauditInputError
        When ``n_patients`` is below 3.
    """
    if n_patients < 3:
        raise FmauditInputError(f"demo data: n_patients_per_domain must be at least 3 (train/val/test), "
                                f"got {n_patients}")
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
    """SHA-256 of an image's shape and RGB bytes (independent of the file format that stores it).

    Parameters
    ----------
    rgb : ndarray of shape (height, width, 3)
        The image; converted to contiguous uint8 before hashing.

    Returns
    -------
    str
        Hex sha256 of the shape's ``repr`` followed by the bytes.
    """
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
        raise FmauditInputError(f"dataset {dataset!r}: unknown demo_tiles parameter(s) {unknown}; "
                                f"known: {sorted(DEMO_DEFAULTS)}")
    p = {**DEMO_DEFAULTS, **params}
    for key in DEMO_DEFAULTS:
        value = p[key]
        if key in _FLOAT_PARAMS:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(value):
                raise FmauditInputError(f"dataset {dataset!r}: demo_tiles parameter {key!r} must be a number, "
                                        f"got {value!r}")
            p[key] = float(value)
        elif isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise FmauditInputError(f"dataset {dataset!r}: demo_tiles parameter {key!r} must be an integer, "
                                    f"got {value!r}")
        else:
            p[key] = int(value)
    if p["seed"] < 0:
        raise FmauditInputError(f"dataset {dataset!r}: seed must be >= 0, got {p['seed']}")
    if p["image_size"] < 16:
        raise FmauditInputError(f"dataset {dataset!r}: image_size must be at least 16, got {p['image_size']}")
    if p["tiles_per_patient_per_class"] < 1:
        raise FmauditInputError(f"dataset {dataset!r}: tiles_per_patient_per_class must be at least 1")
    if not 1 <= p["n_domains"] <= len(DOMAINS):
        raise FmauditInputError(f"dataset {dataset!r}: n_domains must be between 1 and {len(DOMAINS)}, "
                                f"got {p['n_domains']}")
    if not 0 <= p["tissue_mixing"] <= 0.5:
        raise FmauditInputError(f"dataset {dataset!r}: tissue_mixing must be in [0, 0.5] (a tile's label is its "
                                f"dominant class), got {p['tissue_mixing']}")
    if not 0 <= p["label_noise"] <= 1:
        raise FmauditInputError(f"dataset {dataset!r}: label_noise must be in [0, 1], got {p['label_noise']}")
    for key in ("patient_variability", "shift_strength"):
        if p[key] < 0:
            raise FmauditInputError(f"dataset {dataset!r}: {key} must be >= 0, got {p[key]}")
    return p


@register_preparer("demo_tiles")
def prepare_demo_tiles(dataset: str, data_root: Path, params: dict[str, Any]) -> pd.DataFrame:
    """Generate (or reuse) the demo tiles under ``data_root/<dataset>/`` and return their manifest.

    ``params``: ``seed``, ``image_size`` (px), ``n_patients_per_domain`` (>= 3),
    ``tiles_per_patient_per_class``, ``n_domains`` (1 to 4), and the grading levers ``tissue_mixing``,
    ``label_noise``, ``patient_variability``, ``shift_strength`` (module docstring); defaults in
    ``DEMO_DEFAULTS``. Default size: 5 classes × 3 domains × 6 patients × 4 tiles = 360 tiles of 64 px.

    Parameters
    ----------
    dataset : str
        The data set's slug: the folder under ``data_root`` and the manifest's ``dataset`` column.
    data_root : Path
        Where the tiles are written, ``<data_root>/<dataset>/<domain>/<item_id>.png``; a PNG whose pixels already match
        is not rewritten.
    params : dict
        Any of ``DEMO_DEFAULTS``' keys; an unknown key or an out-of-range value raises.

    Returns
    -------
    DataFrame
        One row per tile: ``dataset``, ``item_id`` (``<domain>_p<NN>_<class>_<KK>``), ``source``, ``label``,
        ``label_name``, ``group`` (the patient), ``domain``, ``split`` (patient-level, per domain), and
        ``tissue_class``, ``second_class``, ``second_share``, ``pixel_sha256``.

    Raises
    ------
    FmauditInputError
        On an unknown parameter or a value of the wrong type or out of range.
    """
    p = _check_params(dataset, params)
    seed, size = p["seed"], p["image_size"]
    root = Path(data_root) / dataset
    rows = []
    for d, domain in enumerate(DOMAINS[: p["n_domains"]]):
        acquisition = domain.shifted_from(DOMAINS[0], p["shift_strength"])
        splits = patient_splits(p["n_patients_per_domain"], np.random.default_rng([seed, d, 2_000_003]))
        for pi in range(p["n_patients_per_domain"]):
            patient = _patient(seed, d, pi, p["patient_variability"])
            group = f"{domain.name}_p{pi:02d}"
            for c, class_name in enumerate(CLASS_NAMES):
                for k in range(p["tiles_per_patient_per_class"]):
                    # the dominant tissue and the acquisition noise draw from one generator, the grading from
                    # another: the levers never change the rest of a tile
                    grading_rng = np.random.default_rng([seed, d, pi, c, k, 3_000_017])
                    comp = draw_composition(grading_rng, c, p["tissue_mixing"], p["label_noise"])
                    rng = np.random.default_rng([seed, d, pi, c, k])
                    h, e = tissue_stains(comp, patient, rng, grading_rng, size)
                    rgb = acquire(h, e, acquisition, patient, rng)
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
                            "label": comp.label,
                            "label_name": CLASS_NAMES[comp.label],
                            "group": group,
                            "domain": domain.name,
                            "split": splits[pi],
                            "tissue_class": c,
                            "second_class": comp.second_class,
                            "second_share": comp.second_share,
                            "pixel_sha256": digest,
                        }
                    )
    return pd.DataFrame(rows)

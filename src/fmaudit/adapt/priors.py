"""Class-prior scenarios and the resampling of a labelled target pool to them (hema paper;
docs/methods.md#resampling-to-a-class-prior).

A *scenario* is a class prior pi (shares over the task's classes, >= 0, summing to 1). A target with
per-class pools is resampled to a fixed size n with class counts ``round(n * pi)`` by largest-remainder
rounding (floor every ``n * pi_k``, then give the leftover items to the largest fractional parts, ties to the
lowest class index), so every draw of a scenario has exactly the same class counts. Within a class, items are
drawn without replacement when the pool holds enough of them and with replacement only when it does not.

Draws are reproducible one by one: draw d of (source seed s, target t, prior p) uses
``np.random.default_rng(draw_seed(s, t, p, d))`` and that integer is recorded with its results. The seed does
not depend on the encoder, so every encoder is evaluated on the same items of the same draw (given the same
target pool in the same order), which is what label-free encoder selection compares.

Resampling is vectorised over draws: the result is an (R, n) index matrix into the pool. The only Python
loops run over draws (one call of the generator each) and over classes, never over items.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from fmaudit.io import FmauditInputError

#: The five WBC classes of the hema paper, in label order (the ``wbc5`` label map of the hematology data sets).
WBC5_CLASS_ORDER = ("basophil", "eosinophil", "lymphocyte", "monocyte", "neutrophil")


@dataclass(frozen=True)
class PriorScenario:
    """A named class prior; ``assumption`` says what is not from the hema paper (empty when nothing is).

    Parameters
    ----------
    name : str
        The scenario's name (``balanced``, ``mild`` ...).
    shares : mapping of str to float
        Class name -> share, over the five WBC classes, summing to 1.
    named_in_seed : bool
        Whether the hema paper names this scenario (True) or the project added it (False).
    assumption : str
        What is assumed rather than taken from the hema paper (e.g. the shares); empty when nothing is.
    """

    name: str
    shares: Mapping[str, float]
    named_in_seed: bool
    assumption: str = ""


_ADULT_DIFFERENTIAL = "shares assumed from an adult reference white-cell differential (the hema paper gives no numbers)"

#: The six WBC scenarios of the hema preset (resources/presets/hema.yaml ``prior_shift.priors``): the hema paper
#: names balanced, mild, clinical / peripheral-blood-like and neutrophil-heavy priors without giving their shares.
WBC5_SCENARIOS: dict[str, PriorScenario] = {
    s.name: s
    for s in (
        PriorScenario("balanced", dict.fromkeys(WBC5_CLASS_ORDER, 0.20), True),
        PriorScenario("mild", {"basophil": 0.10, "eosinophil": 0.15, "lymphocyte": 0.25, "monocyte": 0.20,
                               "neutrophil": 0.30}, True, "shares assumed (the hema paper names a mild prior only)"),
        PriorScenario("peripheral-blood", {"basophil": 0.01, "eosinophil": 0.03, "lymphocyte": 0.30,
                                           "monocyte": 0.06, "neutrophil": 0.60}, True, _ADULT_DIFFERENTIAL),
        PriorScenario("neutrophil-heavy", {"basophil": 0.005, "eosinophil": 0.015, "lymphocyte": 0.09,
                                           "monocyte": 0.04, "neutrophil": 0.85}, True,
                      "shares assumed (neutrophilia; the hema paper names the prior only)"),
        PriorScenario("lymphocytosis", {"basophil": 0.01, "eosinophil": 0.02, "lymphocyte": 0.65, "monocyte": 0.07,
                                        "neutrophil": 0.25}, False, "scenario and shares assumed"),
        PriorScenario("rare-enriched", {"basophil": 0.15, "eosinophil": 0.25, "lymphocyte": 0.15, "monocyte": 0.25,
                                        "neutrophil": 0.20}, False, "scenario and shares assumed"),
    )
}
#: Other names the hema paper uses for the scenarios above.
SCENARIO_ALIASES = {"clinical": "peripheral-blood", "peripheral-blood-like": "peripheral-blood"}


def balanced_prior(class_names: Sequence[str]) -> dict[str, float]:
    """Equal shares over ``class_names``.

    Parameters
    ----------
    class_names : sequence of str
        The task's classes, at least two.

    Returns
    -------
    dict of str to float
        Class name -> 1 / K.

    Raises
    ------
    FmauditInputError
        Fewer than two classes.
    """
    k = len(class_names)
    if k < 2:
        raise FmauditInputError(f"a prior needs at least 2 classes, got {list(class_names)}")
    return {str(c): 1.0 / k for c in class_names}


def named_scenario(name: str) -> PriorScenario:
    """A scenario of :data:`WBC5_SCENARIOS` by name or alias; an unknown name lists the known ones.

    Parameters
    ----------
    name : str
        A scenario name or an alias of ``SCENARIO_ALIASES`` (e.g. ``clinical``).

    Returns
    -------
    PriorScenario
        The scenario.

    Raises
    ------
    FmauditInputError
        An unknown name.
    """
    key = SCENARIO_ALIASES.get(name, name)
    if key not in WBC5_SCENARIOS:
        known = sorted([*WBC5_SCENARIOS, *SCENARIO_ALIASES])
        raise FmauditInputError(f"unknown prior {name!r}; named priors: {', '.join(known)}")
    return WBC5_SCENARIOS[key]


def prior_vector(prior: Mapping[str, float] | Sequence[float], class_names: Sequence[str],
                 name: str = "prior") -> np.ndarray:
    """The prior as a (K,) float array in the order of ``class_names``.

    ``prior`` is a class-name -> share mapping over exactly ``class_names``, or K shares in class order.
    Shares must be finite, >= 0 and sum to 1 (within 1e-6); they are renormalised to sum to 1 exactly.

    Parameters
    ----------
    prior : mapping of str to float, or sequence of float
        The shares, by class name or in class order.
    class_names : sequence of str
        The task's classes, in label order.
    name : str
        What the prior is (e.g. ``"prior 'mild'"``), for the error messages.

    Returns
    -------
    ndarray of shape (n_classes,)
        The shares in label order, summing to 1.

    Raises
    ------
    FmauditInputError
        Classes other than the task's, a wrong number of shares, non-numeric, negative or non-finite shares,
        or shares not summing to 1.
    """
    class_names = [str(c) for c in class_names]
    if isinstance(prior, Mapping):
        by_name = {str(k): v for k, v in prior.items()}
        if set(by_name) != set(class_names):
            missing = sorted(set(class_names) - set(by_name))
            extra = sorted(set(by_name) - set(class_names))
            raise FmauditInputError(
                f"{name}: classes differ from the task's {class_names} (missing {missing}, unknown {extra})")
        try:
            values = np.array([float(by_name[c]) for c in class_names])
        except (TypeError, ValueError) as err:
            raise FmauditInputError(f"{name}: shares must be numbers ({err})") from err
    else:
        values = np.asarray(prior, dtype=np.float64).ravel()
        if values.size != len(class_names):
            raise FmauditInputError(f"{name}: {values.size} shares for {len(class_names)} classes {class_names}")
    if not np.isfinite(values).all() or (values < 0).any():
        raise FmauditInputError(f"{name}: shares must be finite and >= 0, got {values.tolist()}")
    total = float(values.sum())
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        raise FmauditInputError(f"{name}: shares must sum to 1, got {total:g}")
    return values / total


def largest_remainder_counts(shares: Sequence[float] | np.ndarray, n: int) -> np.ndarray:
    """Class counts summing to ``n``: floor(n * share), then one more item for each of the largest fractional
    parts (ties to the lowest class index) until the total is ``n``.

    Parameters
    ----------
    shares : array-like of shape (n_classes,)
        Class shares, >= 0, summing to 1.
    n : int
        Total count, at least 1.

    Returns
    -------
    ndarray of shape (n_classes,), int64
        Items per class, summing to ``n``.

    Raises
    ------
    FmauditInputError
        ``n`` below 1, or shares not a non-empty 1-D array of non-negative values summing to 1.
    """
    shares = np.asarray(shares, dtype=np.float64)
    n = int(n)
    if n < 1:
        raise FmauditInputError(f"sample size must be >= 1, got {n}")
    if shares.ndim != 1 or shares.size == 0 or (shares < 0).any() or not math.isclose(shares.sum(), 1.0, abs_tol=1e-6):
        raise FmauditInputError(f"shares must be >= 0 and sum to 1, got {shares.tolist()}")
    # Rounding n * share to 1e-9 first keeps products like 0.29 * 100 = 28.999999999999996 from losing an item.
    exact = np.round(shares / shares.sum() * n, 9)
    counts = np.floor(exact).astype(np.int64)
    leftover = n - int(counts.sum())
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:leftover]] += 1
    return counts


def draw_seed(source_seed: int, target: str, prior: str, draw: int) -> int:
    """The recorded seed of one draw: a 32-bit integer derived from (source seed, target, prior, draw).

    Parameters
    ----------
    source_seed : int
        The source seed (source split) the draw belongs to.
    target : str
        Target domain name.
    prior : str
        Prior scenario name.
    draw : int
        Draw number 0..R-1.

    Returns
    -------
    int
        Seed for ``np.random.default_rng``, in 0..2**32 - 1; independent of the encoder.
    """
    entropy = [int(source_seed), zlib.crc32(str(target).encode()), zlib.crc32(str(prior).encode()), int(draw)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0])


@dataclass
class TargetDraws:
    """R resampled draws of one target under one prior.

    Parameters
    ----------
    index : ndarray of shape (R, n), int64
        Rows of the target pool, grouped by class in class order.
    seeds : ndarray of shape (R,), int64
        The recorded draw seeds.
    counts : ndarray of shape (K,), int64
        Items per class in every draw.
    with_replacement : ndarray of shape (K,), bool
        Whether a class's pool was too small, so that class was drawn with replacement.
    """

    index: np.ndarray
    seeds: np.ndarray
    counts: np.ndarray
    with_replacement: np.ndarray

    @property
    def n_draws(self) -> int:
        """Number of draws R."""
        return self.index.shape[0]

    @property
    def sample_size(self) -> int:
        """Items per draw n."""
        return self.index.shape[1]


def resample_target(labels: Sequence[int] | np.ndarray, shares: Sequence[float] | np.ndarray, sample_size: int,
                    seeds: Sequence[int] | np.ndarray, class_names: Sequence[str] | None = None,
                    where: str = "target") -> TargetDraws:
    """Resample a labelled pool to ``shares`` (K,), one draw per seed (see the module doc).

    ``labels`` are class indices 0..K-1 of the pool. A class with a positive count and an empty pool is an
    error that names the class and ``where``.

    Parameters
    ----------
    labels : array-like of shape (n_pool,)
        Integer class indices of the pool's items.
    shares : array-like of shape (n_classes,)
        The prior, in label order (:func:`prior_vector`).
    sample_size : int
        Items per draw n.
    seeds : sequence of int
        One seed per draw (:func:`draw_seed`), at least one.
    class_names : sequence of str or None
        Class names for the error messages (default ``class 0`` ...).
    where : str
        What the pool is (e.g. the target domain), for the error messages.

    Returns
    -------
    TargetDraws
        The (R, n) index matrix and how it was drawn.

    Raises
    ------
    FmauditInputError
        Labels not a non-empty 1-D integer array or outside the prior's classes, invalid shares or size, no
        seeds, or a class the prior asks for with no items in the pool.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise FmauditInputError(f"{where}: expected a non-empty 1-D label array, got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise FmauditInputError(f"{where}: labels must be integer class indices, got dtype {labels.dtype}")
    shares = np.asarray(shares, dtype=np.float64)
    k = shares.size
    if labels.min() < 0 or labels.max() >= k:
        raise FmauditInputError(f"{where}: label {int(labels.max() if labels.max() >= k else labels.min())} "
                                f"is outside 0..{k - 1} of the prior's {k} classes")
    names = list(class_names) if class_names is not None else [f"class {c}" for c in range(k)]
    counts = largest_remainder_counts(shares, sample_size)
    seeds = np.asarray(seeds, dtype=np.int64).ravel()
    if seeds.size == 0:
        raise FmauditInputError(f"{where}: no draws requested")
    n_pool, n = labels.size, int(counts.sum())
    # One generator per draw keeps each draw reproducible from its own recorded seed; each call is
    # vectorised over the whole pool (sort keys) and the whole draw (uniforms for drawing with replacement).
    keys = np.empty((seeds.size, n_pool))
    uniforms = np.empty((seeds.size, n))
    for r, seed in enumerate(seeds):
        rng = np.random.default_rng(int(seed))
        keys[r] = rng.random(n_pool)
        uniforms[r] = rng.random(n)
    index = np.empty((seeds.size, n), dtype=np.int64)
    replace = np.zeros(k, dtype=bool)
    start = 0
    for c in range(k):
        count = int(counts[c])
        if count == 0:
            continue
        pool = np.flatnonzero(labels == c)
        if pool.size == 0:
            raise FmauditInputError(
                f"{where}: class {names[c]!r} has no items, but the prior asks for {count} of {n} "
                f"(share {shares[c]:g})")
        stop = start + count
        if count <= pool.size:
            # the `count` smallest random keys of the class: a uniform draw without replacement
            chosen = np.argsort(keys[:, pool], axis=1, kind="stable")[:, :count]
            index[:, start:stop] = pool[chosen]
        else:
            replace[c] = True
            slots = np.minimum((uniforms[:, start:stop] * pool.size).astype(np.int64), pool.size - 1)
            index[:, start:stop] = pool[slots]
        start = stop
    return TargetDraws(index=index, seeds=seeds, counts=counts, with_replacement=replace)

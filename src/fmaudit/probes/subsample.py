"""Label-fraction subsampling and train/validation splits of a training set.

Conventions
- ``label_fraction_subsample`` keeps ``max(1, int(n_c * fraction))`` items of every class c present (PRISM,
  docs/methods.md#label-fractions). Each class is shuffled once by ``numpy.random.default_rng(random_state)`` in sorted
  class order and its first items are kept, so for one seed a smaller fraction's subset is contained in a
  larger fraction's subset (nested label fractions, as in a learning curve).
- ``prism_subsample`` reproduces PRISM's own draw exactly (numpy's legacy seeded generator and ``choice`` per
  class); its subsets are not nested across fractions. Use it to reproduce PRISM's per-run numbers.
- ``split_train_val`` without groups is a stratified shuffle split; with groups it keeps every group on one
  side and chooses, among a few seeded candidate splits, one whose train side has every class.
"""

from __future__ import annotations

import numpy as np

from fmaudit.io import FmauditInputError
from fmaudit.metrics import reject_missing_labels


def _as_labels(labels, name: str = "labels") -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise FmauditInputError(f"{name}: expected 1-D labels, got shape {labels.shape}")
    if labels.size == 0:
        raise FmauditInputError(f"{name}: no labels")
    reject_missing_labels(labels, name)
    return labels


def label_fraction_subsample(labels, fraction: float, random_state: int | None = 0) -> np.ndarray:
    """Nested label-fraction subset: ``max(1, int(n_c * fraction))`` items of each class (module doc).

    Parameters
    ----------
    labels : array-like of shape (N,)
    fraction : float in (0, 1]
    random_state : int or None, default 0
        Seed of the per-class order; one seed's subsets are nested across fractions.

    Returns
    -------
    ndarray of int, sorted
        Row indices of the subset.
    """
    labels = _as_labels(labels)
    fraction = float(fraction)
    if not 0.0 < fraction <= 1.0:
        raise FmauditInputError(f"fraction={fraction}: a label fraction must lie in (0, 1]")
    if fraction == 1.0:
        return np.arange(labels.size)
    rng = np.random.default_rng(random_state)
    classes, codes = np.unique(labels, return_inverse=True)
    keep = []
    for c in range(classes.size):
        members = np.flatnonzero(codes == c)
        n_keep = max(1, int(members.size * fraction))
        keep.append(members[rng.permutation(members.size)[:n_keep]])
    return np.sort(np.concatenate(keep))


# numpy's legacy seeding (np.random.seed / RandomState) takes integers in [0, 2**32).
_LEGACY_SEED_LIMIT = 2**32


def prism_subsample(labels, fraction: float, seed: int, per_class: bool = True) -> np.ndarray:
    """Sorted row indices of PRISM's label-fraction subset, drawn exactly as PRISM's code draws it.

    PRISM (``alicemkyn/prism-benchmark``, ``prism_bench/evaluator.py``: ``stratified_sample``) calls
    ``np.random.seed(seed)``, then for every class c of ``np.unique(labels)`` (sorted) draws
    ``np.random.choice(rows_of_c, size=max(1, int(n_c * fraction)), replace=False)`` from the same global
    stream, and returns the picked rows sorted. Here a fresh ``np.random.RandomState(seed)`` plays the global
    generator (same stream, no side effect on numpy's global state). ``per_class=False`` gives the
    class-agnostic draw of the per-dataset notebooks behind the submitted paper
    (``np.random.choice(n, int(n * fraction), replace=False)``, replaced by the per-class draw in the
    rebuttal revision, CHANGELOG_REBUTTAL section 3). PRISM's seeds are 42, 123 and 456. Unlike
    ``label_fraction_subsample`` the subsets of one seed are not nested across fractions.

    How PRISM fits and scores a run (``PRISMEvaluator.evaluate``, ``prism_bench/metrics.py``), for reproducing
    it: ``LogisticRegression(C=1.0, max_iter=1000, random_state=seed)`` (lbfgs, scikit-learn's default
    ``tol=1e-4``, multinomial for K > 2, scikit-learn's binary objective for K = 2) on the *unscaled* rows
    ``train_features[idx]`` (``fit_logistic_batch(..., standardize=False)`` is the same objective); at
    ``tol=1e-4`` lbfgs can stop far from the optimum on raw embeddings. Metrics use ``predict_proba``:
    AUROC is ``roc_auc_score`` on p(class 1) for K = 2, else one-vs-rest macro; macro-F1 is
    ``f1_score(average="macro", zero_division=0)`` over the labels present in the test labels or
    predictions; raw ECE has 15 equal-width bins closed on the left, ``[lo, hi)``, so a confidence of
    exactly 1.0 falls in no bin but still counts in the denominator; for K = 2 its confidence is p(class 1)
    against ``label == 1`` (not top-label), for K > 2 the top-label confidence against argmax accuracy.
    Temperature scaling uses the logits ``decision_function`` gives, a binary ``d`` turned into ``(-d, d)``
    (so its softmax is sigmoid(2d), not ``predict_proba``, and its fitted T is twice the T of
    ``sigmoid(d / T)``; fmaudit uses ``(-d/2, d/2)``), fitted by ``minimize_scalar`` bounded to
    ``[0.1, 10]`` on the validation NLL. ``n_classes`` is the number of classes in the training labels.

    Parameters
    ----------
    labels : array-like of shape (N,)
    fraction : float in (0, 1]
    seed : int
        numpy legacy seed in [0, 2**32).
    per_class : bool, default True
        False: the class-agnostic draw of the submitted paper.

    Returns
    -------
    ndarray of int, sorted
        Row indices of the subset.
    """
    labels = _as_labels(labels)
    fraction = float(fraction)
    if not 0.0 < fraction <= 1.0:
        raise FmauditInputError(f"fraction={fraction}: a label fraction must lie in (0, 1]")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise FmauditInputError(f"seed={seed!r}: PRISM's draw needs an integer seed")
    if not 0 <= int(seed) < _LEGACY_SEED_LIMIT:
        raise FmauditInputError(f"seed={seed}: numpy's legacy seeding takes integers in [0, 2**32)")
    generator = np.random.RandomState(int(seed))
    rows = np.arange(labels.size)
    if not per_class:
        n_keep = int(labels.size * fraction)
        if n_keep < 1:
            raise FmauditInputError(
                f"fraction={fraction}: the class-agnostic draw keeps int({labels.size} * {fraction}) = 0 rows"
            )
        return np.sort(generator.choice(labels.size, n_keep, replace=False))
    picked = []
    for c in np.unique(labels):
        members = rows[labels == c]
        picked.append(generator.choice(members, size=max(1, int(members.size * fraction)), replace=False))
    return np.sort(np.concatenate(picked))


def split_train_val(
    labels,
    groups=None,
    val_fraction: float = 0.2,
    random_state: int | None = 0,
    n_candidates: int = 20,
) -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, val_idx), sorted; group-disjoint when ``groups`` is given.

    Without groups: per class, ``round(n_c * val_fraction)`` items go to validation, but a class keeps at
    least one training item. With groups: whole groups are drawn at random until about ``val_fraction`` of
    the items are in validation; of ``n_candidates`` seeded draws the first whose train side holds every
    class is kept (else the one missing the fewest classes), and the validation side never takes the last
    group. Deterministic for a given ``random_state``.

    Parameters
    ----------
    labels : array-like of shape (N,)
    groups : array-like of shape (N,) or None, default None
        Patient or slide of each item.
    val_fraction : float in (0, 1), default 0.2
    random_state : int or None, default 0
    n_candidates : int, default 20
        Seeded group draws tried.

    Returns
    -------
    (train_idx, val_idx) : tuple of sorted int ndarrays
    """
    labels = _as_labels(labels)
    val_fraction = float(val_fraction)
    if not 0.0 < val_fraction < 1.0:
        raise FmauditInputError(f"val_fraction={val_fraction}: must lie in (0, 1)")
    rng = np.random.default_rng(random_state)
    n = labels.size
    if groups is None:
        classes, codes = np.unique(labels, return_inverse=True)
        val = []
        for c in range(classes.size):
            members = np.flatnonzero(codes == c)
            n_val = min(int(round(members.size * val_fraction)), members.size - 1)
            val.append(members[rng.permutation(members.size)[:n_val]])
        val_idx = np.sort(np.concatenate(val))
    else:
        groups = np.asarray(groups)
        if groups.shape != labels.shape:
            raise FmauditInputError(f"groups: {groups.shape[0] if groups.ndim else 0} groups for {n} labels")
        if groups.dtype.kind == "f" and not np.isfinite(groups).all():
            raise FmauditInputError(f"groups: missing group at row {int(np.flatnonzero(~np.isfinite(groups))[0])}")
        unique_groups, group_codes = np.unique(groups, return_inverse=True)
        if unique_groups.size < 2:
            raise FmauditInputError("groups: a group-disjoint split needs at least 2 groups")
        all_classes = np.unique(labels)
        group_sizes = np.bincount(group_codes)
        best, best_missing = None, None
        for _ in range(max(1, n_candidates)):
            order = rng.permutation(unique_groups.size)
            in_val = np.zeros(unique_groups.size, dtype=bool)
            filled = 0
            for g in order[:-1]:
                if filled >= val_fraction * n:
                    break
                in_val[g] = True
                filled += group_sizes[g]
            val_mask = in_val[group_codes]
            missing = np.setdiff1d(all_classes, labels[~val_mask]).size
            if best is None or missing < best_missing:
                best, best_missing = val_mask, missing
            if missing == 0:
                break
        val_idx = np.flatnonzero(best)
    train_mask = np.ones(n, dtype=bool)
    train_mask[val_idx] = False
    return np.flatnonzero(train_mask), val_idx

"""Slides and grades (seed 003's PANDA and SICAPv2 parts): slide-level aggregation of tile predictions, label
coarsening to the slide, SICAPv2 without its benign class, and the paper's 9,000-patch samples.

Aggregators (one slide = one bag of its tiles):

- ``majority_vote``: the tile probe's predictions voted per slide (ties to the lowest class); confidence =
  share of the slide's tiles voting for the winner (seed 003 ``patch_vote``).
- ``mean_probability``: the mean of the tile probe's probability vectors; prediction = argmax, confidence =
  max.
- ``mean_embedding``: the probe refitted on per-slide mean embeddings (seed 003 ``mean_pool``).
- ``attention_mil``: :class:`AttentionMILClassifier`, gated attention pooling (Ilse et al. 2018) trained on
  the training slides; seed 003's configuration by default (projection 256 + ReLU, attention 128, Adam
  lr 1e-4, weight decay 1e-4, 30 epochs, one bag per step, final-epoch weights, tiles standardised with the
  training tiles' mean and std), seeded by ``random_state``.

Slide metrics: :func:`fmaudit.ood.selective.prediction_summary` over slides (accuracy, QWK for the ordinal
grades, AURC, E-AURC, ECE), with a bootstrap whose unit is the slide (or the patient when slides are nested
in patients); the tile-level row resamples slides (clusters of tiles).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.io import FmauditInputError
from fmaudit.metrics import DEFAULT_N_BINS
from fmaudit.ood.selective import DEFAULT_COVERAGES, prediction_summary

PAPER_SAMPLE_SIZE = 9000
PAPER_SAMPLE_SEED = 42
AGGREGATORS = ("majority_vote", "mean_probability", "mean_embedding", "attention_mil")

__all__ = [
    "AGGREGATORS",
    "AttentionMILClassifier",
    "coarsen_to_slide",
    "label_coarsening",
    "majority_vote",
    "make_bags",
    "mean_probability",
    "paper_stratified_sample",
    "slide_aggregation",
    "without_classes",
]


# --------------------------------------------------------------------------------------------------
# bags
# --------------------------------------------------------------------------------------------------
def make_bags(slides: Any, labels: Any = None) -> tuple[np.ndarray, list[np.ndarray], np.ndarray | None]:
    """(sorted slide ids, tile indices of each slide, label of each slide or None).

    With ``labels``, every tile of a slide must carry the slide's label (raises naming the slide).
    """
    s = np.asarray(slides)
    if s.ndim != 1 or s.size == 0:
        raise FmauditInputError(f"slides: expected a non-empty 1-D array of slide ids, got shape {s.shape}")
    if s.dtype.kind == "O" and pd.isna(s).any():
        raise FmauditInputError(f"slides: missing slide id at row {int(np.flatnonzero(pd.isna(s))[0])}")
    ids, inverse = np.unique(s, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    index = np.split(order, np.cumsum(np.bincount(inverse))[:-1])
    if labels is None:
        return ids, index, None
    y = np.asarray(labels)
    if y.shape != s.shape:
        raise FmauditInputError(f"labels: {y.shape} for {s.size} tiles")
    bag_labels = np.array([y[i[0]] for i in index])
    for slide, i, label in zip(ids, index, bag_labels):
        if not (y[i] == label).all():
            raise FmauditInputError(f"slide {str(slide)!r}: its tiles carry different labels {sorted(set(y[i].tolist()))}; "
                                    "coarsen them to one slide label first (coarsen_to_slide)")
    return ids, index, bag_labels


def majority_vote(predictions: Any, index: Sequence[np.ndarray], n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per slide: the most frequent tile prediction (ties to the lowest class) and its share of the tiles."""
    pred = np.asarray(predictions, dtype=np.int64)
    counts = np.stack([np.bincount(pred[i], minlength=n_classes) for i in index])
    return counts.argmax(axis=1), counts.max(axis=1) / counts.sum(axis=1)


def mean_probability(probs: Any, index: Sequence[np.ndarray]) -> np.ndarray:
    """(n_slides, K) mean of the tile probability vectors of each slide."""
    p = np.asarray(probs, dtype=np.float64)
    return np.stack([p[i].mean(axis=0) for i in index])


def coarsen_to_slide(labels: Any, slides: Any) -> np.ndarray:
    """Each tile relabelled with the most severe (largest) label among the tiles of its slide (seed 003's
    SICAPv2 slide labels; pass every tile of the slide, training and test together)."""
    y = np.asarray(labels)
    s = np.asarray(slides)
    if y.shape != s.shape or y.ndim != 1:
        raise FmauditInputError(f"labels {y.shape} and slides {s.shape}: need one slide id per tile")
    _, inverse = np.unique(s, return_inverse=True)
    inverse = inverse.reshape(-1)
    top = np.full(inverse.max() + 1, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(top, inverse, y.astype(np.int64))
    return top[inverse]


# --------------------------------------------------------------------------------------------------
# attention MIL
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _one_torch_thread_on_cpu(device: str) -> Iterator[None]:
    # one bag per step is a chain of tiny ops: torch's thread pool only adds overhead on CPU (a test fit took
    # 49 s with 2 threads and 9 s with 1 on a shared 2-core machine)
    import torch

    if str(device).startswith("cuda"):
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class AttentionMILClassifier:
    """Gated attention MIL (Ilse et al. 2018) on bags of frozen tile embeddings.

    Parameters: ``embed_dim`` (tile projection, ReLU), ``attention_dim``, ``epochs``, ``lr``, ``weight_decay``
    (Adam), ``random_state`` (weight init through ``torch.manual_seed`` in a forked RNG, and the bag order of
    every epoch through ``numpy.random.default_rng``), ``device`` ("auto": CUDA when available). Tiles are
    standardised with the training tiles' mean and std (ddof 0, constant features scale 1).
    Fitted: ``model_`` (torch module, eval mode), ``mean_``, ``scale_``, ``n_classes_``, ``losses_`` (mean
    training loss per epoch), ``device_``.
    """

    def __init__(self, embed_dim: int = 256, attention_dim: int = 128, epochs: int = 30, lr: float = 1e-4,
                 weight_decay: float = 1e-4, random_state: int = 0, device: str = "auto"):
        self.embed_dim = embed_dim
        self.attention_dim = attention_dim
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.random_state = random_state
        self.device = device

    @staticmethod
    def _module(dim: int, n_classes: int, embed_dim: int, attention_dim: int):
        import torch.nn as nn

        class GatedAttention(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Sequential(nn.Linear(dim, embed_dim), nn.ReLU())
                self.attention_v = nn.Linear(embed_dim, attention_dim)
                self.attention_u = nn.Linear(embed_dim, attention_dim)
                self.attention_w = nn.Linear(attention_dim, 1)
                self.head = nn.Linear(embed_dim, n_classes)

            def forward(self, bag):
                import torch

                h = self.embed(bag)
                gate = torch.tanh(self.attention_v(h)) * torch.sigmoid(self.attention_u(h))
                weights = torch.softmax(self.attention_w(gate), dim=0)
                return self.head((weights * h).sum(0, keepdim=True))

        return GatedAttention()

    def fit(self, X: Any, bag_index: Sequence[np.ndarray], bag_labels: Any, n_classes: int | None = None
            ) -> "AttentionMILClassifier":
        import torch

        from fmaudit.devices import resolve_device
        from fmaudit.probes import subset_scaler
        from fmaudit.probes.logistic_batch import check_features

        X = check_features(X, "tile features")
        y = np.asarray(bag_labels, dtype=np.int64)
        if len(bag_index) != y.size or y.size == 0:
            raise FmauditInputError(f"{len(bag_index)} bags but {y.size} bag labels")
        k = int(n_classes) if n_classes is not None else int(y.max()) + 1
        if y.min() < 0 or y.max() >= k:
            raise FmauditInputError(f"bag labels outside 0..{k - 1}")
        if np.unique(y).size < 2:
            raise FmauditInputError("attention MIL: the training bags hold a single class; need at least two")
        self.mean_, self.scale_ = subset_scaler(X)
        Xs = ((X - self.mean_) / self.scale_).astype(np.float32)
        device = resolve_device(self.device)
        rng = np.random.default_rng(self.random_state)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.random_state))
            model = self._module(X.shape[1], k, int(self.embed_dim), int(self.attention_dim)).to(device)
        optimiser = torch.optim.Adam(model.parameters(), lr=float(self.lr), weight_decay=float(self.weight_decay))
        loss_fn = torch.nn.CrossEntropyLoss()
        tiles = torch.from_numpy(Xs).to(device)
        bags = [torch.as_tensor(np.asarray(i), dtype=torch.long, device=device) for i in bag_index]
        targets = torch.as_tensor(y, dtype=torch.long, device=device)
        model.train()
        losses = []
        with _one_torch_thread_on_cpu(str(device)):
            for _ in range(int(self.epochs)):
                total = 0.0
                for j in rng.permutation(len(bags)):
                    loss = loss_fn(model(tiles[bags[j]]), targets[j:j + 1])
                    optimiser.zero_grad()
                    loss.backward()
                    optimiser.step()
                    total += float(loss.detach())
                losses.append(total / len(bags))
        model.eval()
        self.model_, self.n_classes_, self.losses_, self.device_ = model, k, losses, str(device)
        self.n_features_in_ = X.shape[1]
        return self

    def predict_proba(self, X: Any, bag_index: Sequence[np.ndarray]) -> np.ndarray:
        """(n_bags, K) softmax of the bag logits."""
        import torch

        from fmaudit.probes.logistic_batch import check_features

        if not hasattr(self, "model_"):
            raise FmauditInputError("AttentionMILClassifier is not fitted yet: call fit first")
        X = check_features(X, "tile features")
        if X.shape[1] != self.n_features_in_:
            raise FmauditInputError(f"tile features have {X.shape[1]} dimensions; the model was fitted on {self.n_features_in_}")
        tiles = torch.from_numpy(((X - self.mean_) / self.scale_).astype(np.float32)).to(self.device_)
        with torch.inference_mode(), _one_torch_thread_on_cpu(self.device_):
            out = [torch.softmax(self.model_(tiles[torch.as_tensor(np.asarray(i), dtype=torch.long,
                                                                    device=self.device_)]), dim=1)[0]
                   for i in bag_index]
        return torch.stack(out).double().cpu().numpy()


# --------------------------------------------------------------------------------------------------
# analyses
# --------------------------------------------------------------------------------------------------
def _fit_probe(X, y, groups, n_classes, C=None, random_state=0):
    from fmaudit.probes import LogisticCVProbe, LogisticProbe

    if C is not None:
        return LogisticProbe(C=float(C), max_iter=10000, tol=1e-6, n_classes=n_classes).fit(X, y)
    probe = LogisticCVProbe(max_iter=10000, tol=1e-6, random_state=random_state, n_classes=n_classes)
    return probe.fit(X, y, groups=groups)


def _summary_row(labels, pred, conf, k, *, ordinal, coverages, groups, n_boot, seed, unit, n_bins=DEFAULT_N_BINS,
                 **meta) -> dict:
    return {**meta, **prediction_summary(labels, pred, conf, k, ordinal=ordinal, coverages=coverages, n_bins=n_bins,
                                         groups=groups, n_boot=n_boot, random_state=seed, unit=unit)}


def slide_aggregation(X_train: Any, y_train: Any, slides_train: Any, X_test: Any, y_test: Any, slides_test: Any, *,
                      n_classes: int, ordinal: bool = True, groups_train: Any = None, slide_groups_test: Any = None,
                      probe_C: float | None = None, aggregators: Sequence[str] = AGGREGATORS,
                      mil_params: Mapping[str, Any] | None = None, coverages: Sequence[float] = DEFAULT_COVERAGES,
                      n_boot: int, bootstrap_seed: int = 0, random_state: int = 0,
                      n_bins: int = DEFAULT_N_BINS) -> pd.DataFrame:
    """Slide-level grading from tile embeddings (seed 003 ``slide_aggregation``) on one train/test split.

    Every tile of a slide carries the slide's label. ``groups_train`` (default: the training slides) keep the
    probe's CV folds group-disjoint; ``slide_groups_test`` (per test tile: its patient) makes the slide-level
    bootstrap resample patients instead of slides. Returns one row per aggregator plus a ``tile_level`` row
    (the tile probe on the test tiles, unit tile, resampled by slide): aggregator, unit, n_train_slides,
    n_test_slides, and the :func:`prediction_summary` metrics (with intervals when ``n_boot > 0``).
    """
    unknown = [a for a in aggregators if a not in AGGREGATORS]
    if unknown:
        raise FmauditInputError(f"unknown aggregator(s) {unknown}; known: {list(AGGREGATORS)}")
    X_train, X_test = np.asarray(X_train, np.float64), np.asarray(X_test, np.float64)
    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    ids_tr, idx_tr, lab_tr = make_bags(slides_train, y_train)
    ids_te, idx_te, lab_te = make_bags(slides_test, y_test)
    both = set(ids_tr.tolist()) & set(ids_te.tolist())
    if both:
        raise FmauditInputError(f"slide {sorted(both)[0]!r} has tiles on both sides of the split")
    k = int(n_classes)
    groups_train = np.asarray(slides_train) if groups_train is None else np.asarray(groups_train)
    probe = _fit_probe(X_train, y_train, groups_train, k, probe_C, random_state)
    probs = probe.predict_proba(X_test)
    tile_pred, tile_conf = probs.argmax(axis=1), probs.max(axis=1)
    bag_groups = None
    if slide_groups_test is not None:
        sg = np.asarray(slide_groups_test)
        bag_groups = np.array([sg[i[0]] for i in idx_te])
    unit = "patient" if bag_groups is not None else "slide"
    common = dict(ordinal=ordinal, coverages=coverages, n_boot=n_boot, seed=bootstrap_seed, n_bins=n_bins,
                  n_train_slides=len(ids_tr), n_test_slides=len(ids_te))
    rows = [_summary_row(y_test, tile_pred, tile_conf, k, groups=np.asarray(slides_test), unit="slide",
                         aggregator="tile_level", level="tile", **common)]
    for name in aggregators:
        if name == "majority_vote":
            pred, conf = majority_vote(tile_pred, idx_te, k)
        elif name == "mean_probability":
            p = mean_probability(probs, idx_te)
            pred, conf = p.argmax(axis=1), p.max(axis=1)
        elif name == "mean_embedding":
            Z_tr = np.stack([X_train[i].mean(axis=0) for i in idx_tr])
            Z_te = np.stack([X_test[i].mean(axis=0) for i in idx_te])
            slide_probe = _fit_probe(Z_tr, lab_tr, None, k, probe_C, random_state)
            p = slide_probe.predict_proba(Z_te)
            pred, conf = p.argmax(axis=1), p.max(axis=1)
        else:
            mil = AttentionMILClassifier(random_state=random_state, **dict(mil_params or {}))
            p = mil.fit(X_train, idx_tr, lab_tr, k).predict_proba(X_test, idx_te)
            pred, conf = p.argmax(axis=1), p.max(axis=1)
        rows.append(_summary_row(lab_te, pred, conf, k, groups=bag_groups, unit=unit, aggregator=name,
                                 level="slide", **common))
    out = pd.DataFrame(rows)
    out["probe_C"] = float(getattr(probe, "C_", probe_C if probe_C is not None else np.nan))
    return out


def label_coarsening(X: Any, labels: Any, slides: Any, groups: Any, is_test: Any, *, n_classes: int,
                     ordinal: bool = True, probe_C: float | None = None, mil_params: Mapping[str, Any] | None = None,
                     coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int, bootstrap_seed: int = 0,
                     random_state: int = 0, n_bins: int = DEFAULT_N_BINS) -> pd.DataFrame:
    """Seed 003's SICAPv2 control: the probe under region-level tile labels and under labels coarsened to
    the slide (the most severe grade among all the slide's tiles, train and test together).

    Arms (rows): ``patch`` / patch_labels, ``slide`` / slide_labels, ``slide`` / patch_labels (the
    coarse-label probe scored against region labels), ``slide_mil`` / slide_labels (attention MIL on slide
    bags). Columns: arm, evaluation, unit, n_test, metrics, relabelled_share (tiles whose label changed).
    ``groups`` (patients) keep the CV folds and the bootstrap clustered.
    """
    X = np.asarray(X, np.float64)
    y = np.asarray(labels).astype(np.int64)
    s = np.asarray(slides)
    g = np.asarray(groups)
    test = np.asarray(is_test, dtype=bool)
    if not (X.shape[0] == y.size == s.size == g.size == test.size):
        raise FmauditInputError("label_coarsening: features, labels, slides, groups and is_test differ in length")
    if not test.any() or test.all():
        raise FmauditInputError("label_coarsening: need tiles on both sides of the split (is_test)")
    leaky = set(s[test].tolist()) & set(s[~test].tolist())
    if leaky:
        raise FmauditInputError(f"slide {sorted(leaky)[0]!r} has tiles on both sides of the split")
    coarse = coarsen_to_slide(y, s)
    k = int(n_classes)
    common = dict(ordinal=ordinal, coverages=coverages, n_boot=n_boot, seed=bootstrap_seed, n_bins=n_bins)
    rows = []
    tr, te = ~test, test
    probe = _fit_probe(X[tr], y[tr], g[tr], k, probe_C, random_state)
    p = probe.predict_proba(X[te])
    rows.append(_summary_row(y[te], p.argmax(1), p.max(1), k, groups=g[te], unit="patient", arm="patch",
                             evaluation="patch_labels", level="tile", **common))
    probe = _fit_probe(X[tr], coarse[tr], g[tr], k, probe_C, random_state)
    p = probe.predict_proba(X[te])
    for evaluation, target in (("slide_labels", coarse[te]), ("patch_labels", y[te])):
        rows.append(_summary_row(target, p.argmax(1), p.max(1), k, groups=g[te], unit="patient", arm="slide",
                                 evaluation=evaluation, level="tile", **common))
    _, idx_tr, bag_tr = make_bags(s[tr], coarse[tr])
    _, idx_te, bag_te = make_bags(s[te], coarse[te])
    mil = AttentionMILClassifier(random_state=random_state, **dict(mil_params or {}))
    p = mil.fit(X[tr], idx_tr, bag_tr, k).predict_proba(X[te], idx_te)
    bag_groups = np.array([g[te][i[0]] for i in idx_te])
    rows.append(_summary_row(bag_te, p.argmax(1), p.max(1), k, groups=bag_groups, unit="patient", arm="slide_mil",
                             evaluation="slide_labels", level="slide", **common))
    out = pd.DataFrame(rows)
    out["relabelled_share"] = float((coarse != y).mean())
    return out


def without_classes(X_train: Any, y_train: Any, groups_train: Any, X_test: Any, y_test: Any, groups_test: Any, *,
                    class_names: Sequence[str], removed: Sequence[str] = ("NC",), ordinal: bool = True,
                    probe_C: float | None = None, coverages: Sequence[float] = DEFAULT_COVERAGES, n_boot: int,
                    bootstrap_seed: int = 0, random_state: int = 0, n_bins: int = DEFAULT_N_BINS) -> dict[str, Any]:
    """The task with ``removed`` classes dropped from both splits (seed 003: SICAPv2 without its benign class
    NC); the probe is refitted on the remaining classes (renumbered in order). Returns the
    :func:`prediction_summary` of the remaining test tiles plus n_train, n_test, removed, and the number of
    patients contributing removed-class tiles in all and in the test split."""
    from fmaudit.ood.conditions import hold_out_classes

    tr = hold_out_classes(y_train, class_names, removed, condition="without " + "+".join(removed))
    te = hold_out_classes(y_test, class_names, removed)
    Xtr, Xte = np.asarray(X_train, np.float64)[tr.keep], np.asarray(X_test, np.float64)[te.keep]
    gtr, gte = np.asarray(groups_train)[tr.keep], np.asarray(groups_test)
    k = len(tr.class_names)
    probe = _fit_probe(Xtr, tr.labels[tr.keep], gtr, k, probe_C, random_state)
    p = probe.predict_proba(Xte)
    out = prediction_summary(te.labels[te.keep], p.argmax(1), p.max(1), k, ordinal=ordinal, coverages=coverages,
                             n_bins=n_bins,
                             groups=gte[te.keep], n_boot=n_boot, random_state=bootstrap_seed, unit="patient")
    removed_groups = np.r_[np.asarray(groups_train)[tr.held_out], gte[te.held_out]]
    return {"removed": "+".join(removed), "n_train": int(tr.keep.sum()), "n_test": int(te.keep.sum()),
            "removed_patients": int(np.unique(removed_groups).size),
            "removed_test_patients": int(np.unique(gte[te.held_out]).size),
            "probe_C": float(getattr(probe, "C_", probe_C if probe_C is not None else np.nan)), **out}


# --------------------------------------------------------------------------------------------------
# the paper's samples
# --------------------------------------------------------------------------------------------------
def paper_stratified_sample(manifest: pd.DataFrame, n: int = PAPER_SAMPLE_SIZE, seed: int = PAPER_SAMPLE_SEED
                            ) -> pd.DataFrame:
    """Seed 003's class-stratified sample of ``n`` items (NCT-CRC-HE-100K and PatchCamelyon: 9,000, seed 42).

    Reproduces ``train_test_split(paths, labels, train_size=n, random_state=seed, stratify=labels)`` on the
    items in seed 003's listing order (class by class in label order, paths sorted within a class), after
    duplicate removal; the kept rows are returned in the manifest's own order. A manifest of at most ``n``
    labelled items is returned unchanged.
    """
    from sklearn.model_selection import train_test_split

    if "label" not in manifest.columns or "source" not in manifest.columns:
        raise FmauditInputError("paper_stratified_sample: the manifest needs 'label' and 'source' columns")
    if manifest["label"].isna().any():
        raise FmauditInputError("paper_stratified_sample: unlabelled rows; a class-stratified sample needs labels")
    n = int(n)
    if n <= 0:
        raise FmauditInputError(f"paper_stratified_sample: n must be positive, got {n}")
    if len(manifest) <= n:
        return manifest.copy()
    labels_all = manifest["label"].astype(int).to_numpy()
    order = np.lexsort((manifest["source"].astype(str).to_numpy(), labels_all))  # by label, then path
    kept, _ = train_test_split(order, train_size=n, random_state=seed, stratify=labels_all[order])
    return manifest.iloc[np.sort(kept)].copy()

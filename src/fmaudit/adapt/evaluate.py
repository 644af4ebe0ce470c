"""The evaluation of every adaptation method on resampled target draws (hema paper).

Pipeline (docs/methods.md#adaptation-methods, docs/methods.md#linear-probes). The *source probe*
(:class:`fmaudit.adapt.source_probe.SourceProbe`: the project's default probe, fitted on the source training split,
with the source temperature, BBSE joint confusion and in-domain macro-F1 from a source hold-out) is adapted to each
target draw.

Methods, on a target draw (``fmaudit.adapt.methods``):

- ``none``: source scaler + source probe.
- ``global_standardization``: the draw's own mean and std replace the source scaler.
- ``class_balanced_restandardization`` (CBR): class-balanced statistics from the ``none`` pseudo-labels.
- ``oracle_restandardization``: the same from the true labels; NOT deployable (``deployable`` is False).
- ``shot_im``: the probe's head tuned by SHOT's information maximisation on the source-standardised draw.
- ``bbse``: ``none`` probabilities reweighted by the BBSE weights of the draw's ``none`` predictions.
- ``saerens_em``: ``none`` probabilities re-estimated by EM from the source prior.
- ``cbr_mean_only`` (ablation of CBR): CBR's class-balanced mean with the draw's global std (ddof 0), to
  separate what the balanced mean and the pooled within-class std each contribute.
- ``cbr_then_bbse`` (CBR followed by a label-shift correction): the CBR probabilities reweighted by the BBSE
  weights of the CBR predictions, with the source hold-out's joint confusion of the unadapted pipeline
  (assumption: CBR maps the target into the source-standardised space the hold-out confusion was measured in).

The re-standardising methods replace the scaler in raw feature space; the engine works in the source-
standardised space, where the same affine map is exact (a raw std s and eps become s / scale_s and
eps / scale_s), and folds each draw's statistics into the probe's weights instead of writing standardised
copies of the features.

Calibration under adaptation: ECE is reported at T = 1 (``ece_raw``) and with the source temperature
(``ece_source_t``). Logit-producing methods divide their logits by T; BBSE and EM, which reweight
probabilities, are applied to the temperature-scaled ``none`` probabilities (calibrate first, then correct the
prior, as Alexandari 2020 recommends), so their ``ece_source_t`` is that pipeline's. Macro-F1, recall and the
selection scores are those of the T = 1 pipeline. ECE: top-label, 15 equal-width bins, (lo, hi].

Everything is vectorised over the R draws of a target: one index matrix, one gather of the draw features, one
batched product per method; the probe is fitted once per source seed and serves every prior and draw.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit import metrics
from fmaudit.adapt import methods as m
from fmaudit.adapt.priors import draw_seed, prior_vector, resample_target
from fmaudit.adapt.source_probe import SourceProbe, _mask_absent, fit_source_probes
from fmaudit.io import FmauditInputError
from fmaudit.metrics import softmax_last_axis
from fmaudit.probes.logistic_batch import check_features, check_labels

log = logging.getLogger(__name__)

METHODS = ("none", "global_standardization", "class_balanced_restandardization", "shot_im", "bbse",
           "saerens_em", "oracle_restandardization", "cbr_mean_only", "cbr_then_bbse")
#: Methods that read target labels: reported as references, never as something a user could deploy.
NOT_DEPLOYABLE = frozenset({"oracle_restandardization"})
STANDARDIZING_METHODS = ("global_standardization", "class_balanced_restandardization", "oracle_restandardization",
                         "cbr_mean_only")
#: Methods whose probabilities come from CBR's re-standardised features (cbr_then_bbse reweights them).
CBR_BASED = ("cbr_then_bbse",)
ECE_CONVENTION = "top-label, {bins} equal-width bins, (lo,hi]"
SHOT_IM_DEFAULTS: dict[str, Any] = {"epochs": 15, "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-3,
                                    "batch_size": 64}
# Draw features gathered per chunk are bounded to about this many float64 values (128 MB).
_CHUNK_VALUES = 1 << 24


def check_methods(methods: Sequence[str]) -> list[str]:
    """The methods in evaluation order, ``none`` always included (every gain is against it).

    Parameters
    ----------
    methods : sequence of str
        Method names of ``METHODS``, each at most once.

    Returns
    -------
    list of str
        ``none`` first, then the other methods in the given order.

    Raises
    ------
    FmauditInputError
        An unknown or repeated method.
    """
    methods = list(methods)
    unknown = [x for x in methods if x not in METHODS]
    if unknown:
        raise FmauditInputError(f"unknown adaptation method(s) {unknown}; methods: {', '.join(METHODS)}")
    if len(set(methods)) != len(methods):
        raise FmauditInputError(f"methods: duplicated entries in {methods}")
    return ["none", *[x for x in methods if x != "none"]]



# --------------------------------------------------------------------------------------------------
# batched scoring
# --------------------------------------------------------------------------------------------------
def batch_scores(P: np.ndarray, y: np.ndarray, n_bins: int = metrics.DEFAULT_N_BINS) -> dict[str, np.ndarray]:
    """Per-draw metrics of probabilities P (R, n, K) against labels y (R, n), in the conventions of
    :mod:`fmaudit.metrics`: macro-F1 over all K classes (zero_division 0), balanced accuracy, per-class recall
    (NaN for a class absent from the draw), top-label ECE, and the label-free selection scores.

    Parameters
    ----------
    P : ndarray of shape (n_draws, n_items, n_classes)
        Class probabilities of each draw's items, rows summing to 1.
    y : ndarray of shape (n_draws, n_items)
        True class indices 0..K-1.
    n_bins : int
        Equal-width bins of the top-label ECE, (lo, hi] closure (default 15).

    Returns
    -------
    dict of str to ndarray
        ``macro_f1``, ``balanced_accuracy``, ``accuracy``, ``ece``, ``marginal_entropy`` (entropy of the mean
        prediction), ``mean_entropy``, ``mean_max_prob``, each (n_draws,); ``recall`` (n_draws, n_classes).
    """
    R, n, K = P.shape
    pred = P.argmax(axis=-1)
    flat = (np.arange(R)[:, None] * K + y) * K + pred
    cm = np.bincount(flat.ravel(), minlength=R * K * K).reshape(R, K, K).astype(np.float64)
    tp = np.einsum("rkk->rk", cm)
    true = cm.sum(axis=2)
    denom = cm.sum(axis=1) + true
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    recall = np.divide(tp, true, out=np.full_like(tp, np.nan), where=true > 0)
    conf = np.take_along_axis(P, pred[..., None], axis=-1)[..., 0]
    correct = (pred == y).astype(np.float64)
    bins = metrics.bin_indices(conf, n_bins) + np.arange(R)[:, None] * n_bins
    gap = np.bincount(bins.ravel(), weights=(correct - conf).ravel(), minlength=R * n_bins).reshape(R, n_bins)
    p_bar = P.mean(axis=1)
    return {
        "macro_f1": f1.mean(axis=1),
        "balanced_accuracy": np.nanmean(recall, axis=1),
        "accuracy": correct.mean(axis=1),
        "recall": recall,
        "ece": np.abs(gap).sum(axis=1) / n,
        "marginal_entropy": m._entropy(p_bar),
        "mean_entropy": m._entropy(P).mean(axis=1),
        "mean_max_prob": conf.mean(axis=1),
    }


@dataclass
class MethodScores:
    """Per-draw results of one method on R draws: arrays of shape (R,) unless said otherwise.

    Parameters
    ----------
    macro_f1, balanced_accuracy, accuracy : ndarray
        Discrimination of the T = 1 pipeline.
    recall : ndarray of shape (R, K)
        Per-class recall, NaN for a class absent from the draw.
    ece_raw : ndarray
        Top-label ECE at T = 1.
    ece_source_t : ndarray
        Top-label ECE with the source temperature.
    marginal_entropy, mean_entropy, mean_max_prob : ndarray
        Label-free selection scores of the T = 1 probabilities.
    extra : dict of str to ndarray
        Method-specific columns (``EXTRA_COLUMNS``: e.g. ``estimated_prior_l1``, ``em_iterations``).
    """

    macro_f1: np.ndarray
    balanced_accuracy: np.ndarray
    accuracy: np.ndarray
    recall: np.ndarray  # (R, K)
    ece_raw: np.ndarray
    ece_source_t: np.ndarray
    marginal_entropy: np.ndarray
    mean_entropy: np.ndarray
    mean_max_prob: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)


def _method_scores(P_raw: np.ndarray, P_t: np.ndarray, y: np.ndarray, n_bins: int, **extra) -> MethodScores:
    raw = batch_scores(P_raw, y, n_bins)
    ece_t = batch_scores(P_t, y, n_bins)["ece"]
    return MethodScores(raw["macro_f1"], raw["balanced_accuracy"], raw["accuracy"], raw["recall"], raw["ece"],
                        ece_t, raw["marginal_entropy"], raw["mean_entropy"], raw["mean_max_prob"], dict(extra))


def _bbse_estimates(weights: np.ndarray, confusion: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and macro-F1 of the unadapted probe on the target as BBSE predicts them: the hold-out joint
    confusion with each true-class column reweighted by w (label shift keeps P(pred | y))."""
    joint = confusion[None] * weights[:, None, :]  # (R, K_pred, K_true)
    total = joint.sum(axis=(1, 2))
    ok = total > 0
    joint = joint / np.where(ok, total, 1.0)[:, None, None]
    tp = np.einsum("rkk->rk", joint)
    denom = joint.sum(axis=1) + joint.sum(axis=2)
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0).mean(axis=1)
    acc = tp.sum(axis=1)
    return np.where(ok, acc, np.nan), np.where(ok, f1, np.nan)


@dataclass
class StandardizedPool:
    """A target pool seen through one source probe, computed once and reused for every prior and draw:
    source-standardised features ``Z`` (N, D) float64, labels (N,), unadapted logits (N, K).

    Parameters
    ----------
    probe : SourceProbe
        The fitted source probe.
    Z : ndarray of shape (n_items, n_features), float64
        The pool's features standardised by ``probe``.
    labels : ndarray of shape (n_items,)
        True class indices.
    logits : ndarray of shape (n_items, n_classes)
        Logits of the unadapted pipeline.
    """

    probe: SourceProbe
    Z: np.ndarray
    labels: np.ndarray
    logits: np.ndarray
    _Z32: np.ndarray | None = None

    @property
    def Z32(self) -> np.ndarray:
        """float32 copy of ``Z`` for SHOT-IM, which trains in float32."""
        if self._Z32 is None:
            self._Z32 = self.Z.astype(np.float32)
        return self._Z32


def standardize_pool(probe: SourceProbe, X: Any, y: Any) -> StandardizedPool:
    """The target pool (X, y) standardised by ``probe``, with its unadapted logits.

    Parameters
    ----------
    probe : SourceProbe
        A fitted source probe.
    X : array-like of shape (n_items, n_features)
        Raw target embeddings (the whole pool draws are taken from).
    y : array-like of shape (n_items,)
        Target class indices in the probe's label space.

    Returns
    -------
    StandardizedPool
        The pool, ready for :func:`score_draws`.
    """
    X = check_features(X, "target features")
    y = check_labels(y, X.shape[0], probe.n_classes_, "target labels")
    Z = probe.standardize(X)
    return StandardizedPool(probe, Z, y, probe.logits_standardized(Z))


def _draw_statistics(G: np.ndarray, label_sets: list[np.ndarray], K: int):
    """Global and class-balanced statistics of R draws, reading the draw features twice.

    Returns (global mean, global std, [(cb mean, cb std, collapsed, n_k) per label set]), shapes (R, D) and
    (R,), (R, K). Second moments come from sum z^2 and the class sums (within SS = sum z^2 - sum_k S_k^2 / n_k),
    which is exact to ~1e-12 in the source-standardised space where features have unit scale (tested against
    the residual form of fmaudit.adapt.methods).
    """
    R, n, D = G.shape
    S2 = np.einsum("rnd,rnd->rd", G, G)
    onehot = np.concatenate([(lab[:, None, :] == np.arange(K)[:, None]) for lab in label_sets], axis=1)
    S1 = np.matmul(onehot.astype(np.float64), G)  # (R, K * sets, D)
    g_mean = S1[:, :K].sum(axis=1) / n
    g_std = np.sqrt(np.maximum(S2 / n - g_mean * g_mean, 0.0))
    out = []
    for j in range(len(label_sets)):
        sums = S1[:, j * K:(j + 1) * K]
        n_k = onehot[:, j * K:(j + 1) * K].sum(axis=2).astype(np.float64)
        present = n_k > 0
        safe = np.where(present, n_k, 1.0)[..., None]
        mean = (sums / safe).sum(axis=1) / present.sum(axis=1, keepdims=True)
        within = np.maximum(S2 - (sums * sums / safe).sum(axis=1), 0.0)
        dof = n - present.sum(axis=1)  # sum_k (n_k - 1) over the non-empty classes
        # full collapse (every item in one pseudo-class, the hema paper's rule) or no class with two items: the source
        # std, which is 1 in the source-standardised space
        collapsed = (present.sum(axis=1) == 1) | (dof == 0)
        std = np.where(collapsed[:, None], 1.0, np.sqrt(within / np.where(dof == 0, 1, dof)[:, None]))
        out.append((mean, std, collapsed, n_k))
    return g_mean, g_std, out


def _cb_extra(stat) -> dict[str, np.ndarray]:
    _, _, collapsed, n_k = stat
    return {"std_fallback": collapsed.astype(np.float64), "n_empty_classes": (n_k == 0).sum(axis=1).astype(np.float64)}


def score_draws(pool: StandardizedPool, index: np.ndarray, methods: Sequence[str],
                n_bins: int = metrics.DEFAULT_N_BINS, shot_im: Mapping[str, Any] | None = None,
                device: Any = None) -> dict[str, MethodScores]:
    """Every method of ``methods`` on the R draws ``index`` (R, n) of a standardised target pool.

    Returns per method the per-draw :class:`MethodScores`. The re-standardising methods share one gather of
    the draw features, one pass for their statistics and one batched product for their logits.

    Parameters
    ----------
    pool : StandardizedPool
        The target pool.
    index : ndarray of shape (n_draws, n_items)
        Rows of the pool in each draw (``fmaudit.adapt.priors.resample_target``); draws beyond a memory bound
        are scored in chunks.
    methods : sequence of str
        Methods to score (``none`` is added first).
    n_bins : int
        Equal-width bins of the top-label ECE.
    shot_im : mapping or None
        Settings of SHOT-IM over ``SHOT_IM_DEFAULTS`` (``epochs``, ``lr``, ``momentum``, ``weight_decay``,
        ``batch_size``, ``dtype``).
    device : str or None
        Torch device of SHOT-IM's head.

    Returns
    -------
    dict of str to MethodScores
        Per method, in the order of :func:`check_methods`.

    Raises
    ------
    FmauditInputError
        An unknown method, or ``index`` not a non-empty 2-D matrix.
    """
    methods = check_methods(methods)
    probe = pool.probe
    index = np.asarray(index, dtype=np.int64)
    if index.ndim != 2 or index.size == 0:
        raise FmauditInputError(f"index: expected a non-empty (R, n) matrix of pool rows, got shape {index.shape}")
    R, n = index.shape
    D, K = probe.W_.shape
    chunk = max(1, _CHUNK_VALUES // max(1, n * D))
    if R > chunk:
        parts = [score_draws(pool, index[s:s + chunk], methods, n_bins, shot_im, device) for s in range(0, R, chunk)]
        return {name: _concat_scores([p[name] for p in parts]) for name in parts[0]}
    T = probe.temperature_
    y = pool.labels[index]
    L0 = pool.logits[index]
    P0, P0_t = softmax_last_axis(L0), softmax_last_axis(L0, T)
    pseudo = P0.argmax(axis=-1)
    # BBSE's weights of the unadapted predictions also give the label-free accuracy estimate of "none".
    C = probe.confusion_
    w = m.bbse_weights_from_confusion(C, pseudo)
    est_acc, est_f1 = _bbse_estimates(w, C)
    actual_prior = (y[..., None] == np.arange(K)).mean(axis=1)
    out: dict[str, MethodScores] = {"none": _method_scores(P0, P0_t, y, n_bins, bbse_estimated_accuracy=est_acc,
                                                           bbse_estimated_macro_f1=est_f1)}
    stat_methods = [x for x in methods if x in STANDARDIZING_METHODS]
    if any(x in CBR_BASED for x in methods) and "class_balanced_restandardization" not in stat_methods:
        stat_methods.append("class_balanced_restandardization")  # its probabilities feed cbr_then_bbse
    cbr_probs: tuple[np.ndarray, np.ndarray] | None = None
    if stat_methods:
        G = pool.Z[index]
        label_sets = [pseudo] + ([y] if "oracle_restandardization" in stat_methods else [])
        g_mean, g_std, cb = _draw_statistics(G, label_sets, K)
        eps = m.STD_EPS / probe.scale_  # the raw-space eps in source-standardised units
        stats = {"global_standardization": (g_mean, g_std, {}),
                 "class_balanced_restandardization": (cb[0][0], cb[0][1], _cb_extra(cb[0])),
                 "oracle_restandardization": (cb[-1][0], cb[-1][1], _cb_extra(cb[-1])),
                 "cbr_mean_only": (cb[0][0], g_std, {})}
        Ws, bs = [], []
        for name in stat_methods:
            mean, std, _ = stats[name]
            W = probe.W_[None] / (std + eps)[..., None]  # (R, D, K): the statistics folded into the probe
            Ws.append(W)
            bs.append(probe.b_ - np.einsum("rd,rdk->rk", mean, W))
        logits = np.matmul(G, np.concatenate(Ws, axis=2)) + np.concatenate(bs, axis=1)[:, None, :]
        del G
        for j, name in enumerate(stat_methods):
            L = _mask_absent(logits[..., j * K:(j + 1) * K], probe.present_)
            P, P_t = softmax_last_axis(L), softmax_last_axis(L, T)
            if name == "class_balanced_restandardization":
                cbr_probs = (P, P_t)
            out[name] = _method_scores(P, P_t, y, n_bins, **stats[name][2])
    for name in methods[1:]:
        if name == "shot_im":
            params = {**SHOT_IM_DEFAULTS, **dict(shot_im or {})}
            single = params.get("dtype", "float32") == "float32"
            G = (pool.Z32 if single else pool.Z)[index]
            head = m.ShotIMHead(**params, present=probe.present_, device=device).fit(G, probe.W_, probe.b_)
            L = np.matmul(G, head.W_.astype(G.dtype)).astype(np.float64) + head.b_[:, None, :]
            L = _mask_absent(L, probe.present_)
            out[name] = _method_scores(softmax_last_axis(L), softmax_last_axis(L, T), y, n_bins,
                                       im_loss_final=np.full(R, head.loss_[-1]))
        elif name == "bbse":
            q = m.bbse_target_prior(w, C.sum(axis=0))
            out[name] = _method_scores(m.bbse_adjust(P0, w), m.bbse_adjust(P0_t, w), y, n_bins,
                                       estimated_prior_l1=np.abs(q - actual_prior).sum(axis=1))
        elif name == "cbr_then_bbse":
            P_cbr, P_cbr_t = cbr_probs
            w_cbr = m.bbse_weights_from_confusion(C, P_cbr.argmax(axis=-1))
            q = m.bbse_target_prior(w_cbr, C.sum(axis=0))
            out[name] = _method_scores(m.bbse_adjust(P_cbr, w_cbr), m.bbse_adjust(P_cbr_t, w_cbr), y, n_bins,
                                       estimated_prior_l1=np.abs(q - actual_prior).sum(axis=1))
        elif name == "saerens_em":
            q, post, n_iter, _ = m._saerens_em(P0, probe.source_prior_, m.EM_TOL, m.EM_MAX_ITER)
            _, post_t, _, _ = m._saerens_em(P0_t, probe.source_prior_, m.EM_TOL, m.EM_MAX_ITER)
            out[name] = _method_scores(post, post_t, y, n_bins, estimated_prior_l1=np.abs(q - actual_prior).sum(axis=1),
                                       em_iterations=n_iter.astype(np.float64))
    return {name: out[name] for name in methods}


def _concat_scores(parts: list[MethodScores]) -> MethodScores:
    first = parts[0]
    kwargs = {f: np.concatenate([getattr(p, f) for p in parts]) for f in
              ("macro_f1", "balanced_accuracy", "accuracy", "recall", "ece_raw", "ece_source_t", "marginal_entropy",
               "mean_entropy", "mean_max_prob")}
    extra = {k: np.concatenate([p.extra[k] for p in parts]) for k in first.extra}
    return MethodScores(**kwargs, extra=extra)


EXTRA_COLUMNS = ("bbse_estimated_accuracy", "bbse_estimated_macro_f1", "estimated_prior_l1", "em_iterations",
                 "im_loss_final", "std_fallback", "n_empty_classes")


def scores_frame(scores: Mapping[str, MethodScores], class_names: Sequence[str], n_bins: int = metrics.DEFAULT_N_BINS,
                 draw_columns: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Tidy rows, one per draw x method (draws fastest within a method), with gains against ``none``.

    ``draw_columns``: per-draw values (length R) or constants prepended to every method's rows.
    Columns: method, deployable, macro_f1, gain_macro_f1, balanced_accuracy, accuracy, ece_raw, ece_source_t,
    delta_ece_raw / delta_ece_source_t (method minus none: negative is better calibrated), recall_<class>,
    marginal_entropy, mean_entropy, mean_max_prob, and the method-specific columns of ``EXTRA_COLUMNS`` (NaN
    where they do not apply).

    Parameters
    ----------
    scores : mapping of str to MethodScores
        Output of :func:`score_draws`; must hold ``none``.
    class_names : sequence of str
        Class names, in label order, for the ``recall_<class>`` columns.
    n_bins : int
        ECE bins, written to the ``ece_convention`` column.
    draw_columns : mapping or None
        Columns put first on every method's rows (e.g. ``prior``, ``draw``, ``draw_seed``, ``seed``).

    Returns
    -------
    DataFrame
        One row per draw and method, columns as above plus ``ece_convention``.
    """
    base = scores["none"]
    R = base.macro_f1.shape[0]
    frames = []
    for name, s in scores.items():
        cols: dict[str, Any] = {}
        for key, value in (draw_columns or {}).items():
            cols[key] = value
        cols.update({
            "method": name, "deployable": name not in NOT_DEPLOYABLE,
            "macro_f1": s.macro_f1, "gain_macro_f1": s.macro_f1 - base.macro_f1,
            "balanced_accuracy": s.balanced_accuracy, "accuracy": s.accuracy,
            "ece_raw": s.ece_raw, "ece_source_t": s.ece_source_t,
            "delta_ece_raw": s.ece_raw - base.ece_raw, "delta_ece_source_t": s.ece_source_t - base.ece_source_t,
        })
        for k, cname in enumerate(class_names):
            cols[f"recall_{cname}"] = s.recall[:, k]
        cols.update({"marginal_entropy": s.marginal_entropy, "mean_entropy": s.mean_entropy,
                     "mean_max_prob": s.mean_max_prob})
        for key in EXTRA_COLUMNS:
            cols[key] = s.extra.get(key, np.full(R, np.nan))
        frames.append(pd.DataFrame(cols, index=pd.RangeIndex(R)))
    out = pd.concat(frames, ignore_index=True)
    out["ece_convention"] = ECE_CONVENTION.format(bins=n_bins)
    return out


# --------------------------------------------------------------------------------------------------
# arrays in, one table out
# --------------------------------------------------------------------------------------------------
def evaluate_draws(Xs: Any, ys: Any, Xt: Any, yt: Any, methods: Sequence[str] = METHODS, *,
                   n_classes: int | None = None, class_names: Sequence[str] | None = None,
                   prior: Mapping[str, float] | Sequence[float] | None = None, prior_name: str | None = None,
                   sample_size: int | None = None, n_draws: int = 25, random_state: int = 0, C: float = 1.0,
                   val_fraction: float = 0.2, n_bins: int = metrics.DEFAULT_N_BINS, source_groups: Any = None,
                   shot_im: Mapping[str, Any] | None = None, device: Any = None) -> pd.DataFrame:
    """Per draw x method rows of :func:`evaluate` (see there); with ``prior=None`` one "draw", the whole target.

    Parameters
    ----------
    Xs : array-like of shape (n_source, n_features)
        Source embeddings.
    ys : array-like of shape (n_source,)
        Source class indices.
    Xt : array-like of shape (n_target, n_features)
        Target embeddings, same encoder and readout.
    yt : array-like of shape (n_target,)
        Target class indices (used to score, and by the non-deployable oracle only).
    methods : sequence of str
        Methods of ``METHODS`` (default all).
    n_classes : int or None
        Size of the label space (keyword-only; default ``len(class_names)`` or largest label + 1).
    class_names : sequence of str or None
        Class names in label order (default ``class_0`` ...).
    prior : mapping or sequence of float or None
        Target class prior to resample to (class -> share, or K shares); None scores the whole target once.
    prior_name : str or None
        Name of the prior in the ``prior`` column and the draw seeds (default ``custom``).
    sample_size : int or None
        Items per draw; required with ``prior``.
    n_draws : int
        Draws per prior.
    random_state : int
        Source seed: the source split and, with the prior's name, each draw's seed.
    C : float
        Inverse L2 strength of the source probe.
    val_fraction : float
        Source hold-out share.
    n_bins : int
        Equal-width bins of the top-label ECE.
    source_groups : array-like of shape (n_source,) or None
        Patient or slide of each source item (group-disjoint hold-out).
    shot_im : mapping or None
        SHOT-IM settings (see :func:`score_draws`).
    device : str or None
        Torch device of the probe engine and SHOT-IM.

    Returns
    -------
    DataFrame
        The rows of :func:`scores_frame`, led by ``prior``, ``draw``, ``draw_seed``, ``n_items`` (and
        ``classes_with_replacement`` with a prior), ``seed``, ``temperature_source``, ``in_domain_macro_f1``.

    Raises
    ------
    FmauditInputError
        Source and target of different widths, invalid labels, class names not one per class, unknown
        methods, a prior without ``sample_size`` or with unknown classes.
    """
    Xs = check_features(Xs, "source features")
    Xt = check_features(Xt, "target features")
    if Xs.shape[1] != Xt.shape[1]:
        raise FmauditInputError(f"source features have {Xs.shape[1]} dimensions, target features {Xt.shape[1]}")
    if n_classes is None and class_names is not None:
        n_classes = len(class_names)
    ys = check_labels(ys, Xs.shape[0], n_classes, "source labels")
    yt = check_labels(yt, Xt.shape[0], n_classes, "target labels")
    k = int(n_classes) if n_classes is not None else int(max(ys.max(), yt.max())) + 1
    names = [str(c) for c in class_names] if class_names is not None else [f"class_{c}" for c in range(k)]
    if len(names) != k:
        raise FmauditInputError(f"class_names: {len(names)} names for {k} classes")
    methods = check_methods(methods)
    probe = fit_source_probes(Xs, ys, k, [random_state], groups=source_groups, C=C, val_fraction=val_fraction,
                              device=device)[0]
    pool = standardize_pool(probe, Xt, yt)
    if prior is None:
        index = np.arange(Xt.shape[0])[None]
        draw_cols: dict[str, Any] = {"prior": "as given", "draw": 0, "draw_seed": -1, "n_items": Xt.shape[0]}
    else:
        label = prior_name or "custom"
        shares = prior_vector(prior, names, name=f"prior {label!r}")
        if sample_size is None:
            raise FmauditInputError("sample_size: required with a prior")
        seeds = [draw_seed(random_state, "target", label, d) for d in range(int(n_draws))]
        draws = resample_target(yt, shares, int(sample_size), seeds, names, where="target")
        index = draws.index
        replaced = ",".join(n for n, r in zip(names, draws.with_replacement) if r)
        draw_cols = {"prior": label, "draw": np.arange(draws.n_draws), "draw_seed": draws.seeds,
                     "n_items": draws.sample_size, "classes_with_replacement": replaced}
    scores = score_draws(pool, index, methods, n_bins, shot_im, device)
    frame = scores_frame(scores, names, n_bins, {**draw_cols, "seed": random_state,
                                                   "temperature_source": probe.temperature_,
                                                   "in_domain_macro_f1": probe.val_macro_f1_})
    return frame


SUMMARY_COLUMNS = ("macro_f1", "gain_macro_f1", "balanced_accuracy", "ece_raw", "ece_source_t", "delta_ece_raw",
                   "delta_ece_source_t", "marginal_entropy", "mean_entropy", "mean_max_prob",
                   "bbse_estimated_accuracy", "bbse_estimated_macro_f1", "estimated_prior_l1")


def summarize_draws(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per method: means over draws of the metric columns, with the number of draws and of draws
    where the method lost macro-F1 against ``none``.

    Parameters
    ----------
    rows : DataFrame
        Per-draw rows of :func:`evaluate_draws` (one prior).

    Returns
    -------
    DataFrame
        One row per method in first-seen order: ``method``, ``deployable``, the means of ``SUMMARY_COLUMNS``
        and ``recall_*``, ``n_draws``, ``n_draws_negative_gain``, and the constant columns (``prior``,
        ``n_items``, ``temperature_source`` ...) where present.
    """
    recall_cols = [c for c in rows.columns if c.startswith("recall_")]
    cols = [c for c in SUMMARY_COLUMNS if c in rows.columns] + recall_cols
    grouped = rows.groupby("method", sort=False)
    out = grouped[cols].mean()
    out.insert(0, "deployable", grouped["deployable"].first())
    out["n_draws"] = grouped.size()
    out["n_draws_negative_gain"] = grouped["gain_macro_f1"].apply(lambda g: int((g < 0).sum()))
    for col in ("prior", "n_items", "classes_with_replacement", "temperature_source", "in_domain_macro_f1",
                "ece_convention"):
        if col in rows.columns:
            out[col] = grouped[col].first()
    return out.reset_index()


def evaluate(Xs: Any, ys: Any, Xt: Any, yt: Any, methods: Sequence[str] = METHODS, **kwargs: Any) -> pd.DataFrame:
    """Fit the default source probe on (Xs, ys), adapt it to (Xt, yt) with every method, and score.

    One row per method (``none`` first) with macro-F1 and its gain over ``none``, ECE with and without the
    source temperature, per-class recall and the label-free selection scores (column meanings:
    :func:`scores_frame`). Without ``prior`` the whole target is evaluated once; with ``prior`` (class ->
    share, or K shares) and ``sample_size``, ``n_draws`` resampled draws (:mod:`fmaudit.adapt.priors`) are
    evaluated and the rows are their means. Keywords: those of :func:`evaluate_draws`.

    Parameters
    ----------
    Xs, ys : array-like
        Source embeddings (n_source, n_features) and class indices.
    Xt, yt : array-like
        Target embeddings (n_target, n_features) and class indices.
    methods : sequence of str
        Methods of ``METHODS`` (default all).
    **kwargs
        Keywords of :func:`evaluate_draws` (``class_names``, ``prior``, ``sample_size``, ``n_draws`` ...).

    Returns
    -------
    DataFrame
        :func:`summarize_draws` of the draws: one row per method, ``none`` first.
    """
    return summarize_draws(evaluate_draws(Xs, ys, Xt, yt, methods, **kwargs))

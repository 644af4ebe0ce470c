"""The supervised ResNet-18 trained from scratch on the source domain: the hema paper's non-frozen reference row.

The hema paper reports it beside the 15 frozen encoders ("Sup. ResNet-18 (scratch)": 0.908 in-domain, 0.255 on
MLL23), outside the encoder ranking. It answers whether a frozen foundation model transfers better than a
small network fitted to the source alone. The hema paper gives no training recipe; the project's (stated) one:

- ``torchvision.models.resnet18(weights=None, num_classes=K)``, every weight initialised under
  ``torch.manual_seed(random_state)``;
- inputs: RGB images as (N, H, W, 3) uint8 (0-255) or float (0-1) arrays at their own size, normalised with
  the per-channel mean and std of the training images; random horizontal and vertical flips (cells have no
  orientation), drawn from ``numpy.random.default_rng(random_state)``;
- SGD, momentum 0.9, weight decay 5e-4, learning rate ``lr`` with a cosine decay to 0 over the epochs,
  mini-batches of ``batch_size`` reshuffled each epoch, cross-entropy;
- after training, BatchNorm's running statistics are recomputed over the training images (one pass, cumulative
  average), so evaluation does not depend on how far the momentum averages got in a short training.

It is evaluated through the same metrics as the frozen probes (:func:`evaluate_scratch`): macro-F1, balanced
accuracy, per-class recall and ECE without and with the source temperature (fitted on a source hold-out), on
the source hold-out (in-domain) and on each target.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from fmaudit import metrics
from fmaudit.calibration import TemperatureScaler
from fmaudit.devices import resolve_device
from fmaudit.io import FmauditInputError
from fmaudit.probes import split_train_val

REFERENCE_NAME = "resnet18-scratch"


def _images(images: Any, name: str) -> np.ndarray:
    arr = np.asarray(images)
    if arr.ndim != 4 or arr.shape[-1] != 3 or arr.shape[0] == 0:
        raise FmauditInputError(f"{name}: expected RGB images of shape (N, H, W, 3), got {arr.shape}")
    if arr.dtype == np.uint8:
        return arr
    if not np.issubdtype(arr.dtype, np.floating) or not np.isfinite(arr).all():
        raise FmauditInputError(f"{name}: expected uint8 (0-255) or finite float (0-1) pixels, got dtype {arr.dtype}")
    return arr


def _as_float(batch: np.ndarray) -> np.ndarray:
    return batch.astype(np.float32) / 255.0 if batch.dtype == np.uint8 else batch.astype(np.float32)


class ScratchResNet18:
    """ResNet-18 trained from scratch on source images (recipe in the module doc).

    Parameters
    ----------
    epochs : int
        Training epochs (default 30).
    lr : float
        Initial SGD learning rate, decayed by a cosine to 0 over the epochs (default 0.05).
    batch_size : int
        Images per mini-batch (default 64).
    weight_decay : float
        L2 weight decay (default 5e-4).
    momentum : float
        SGD momentum (default 0.9).
    augment : bool
        Random horizontal and vertical flips during training (default True).
    random_state : int
        Seed of the weight initialisation, the batch order and the flips.
    device : str or None
        None or ``"cpu"``, ``"cuda"`` or ``"auto"``.

    Attributes
    ----------
    model_ : torch.nn.Module
        The trained network, in eval mode.
    mean_, std_ : ndarray of shape (3,)
        Per-channel input normalisation from the training images (0-1 scale).
    n_classes_ : int
        Size of the label space.
    loss_ : ndarray of shape (epochs,)
        Mean training loss per epoch.
    """

    def __init__(self, epochs: int = 30, lr: float = 0.05, batch_size: int = 64, weight_decay: float = 5e-4,
                 momentum: float = 0.9, augment: bool = True, random_state: int = 0, device: Any = None):
        self.epochs = epochs
        self.lr = lr
        self.batch_size = batch_size
        self.weight_decay = weight_decay
        self.momentum = momentum
        self.augment = augment
        self.random_state = random_state
        self.device = device

    def _tensor(self, batch: np.ndarray, device: torch.device) -> torch.Tensor:
        x = (_as_float(batch) - self.mean_) / self.std_
        return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).to(device)

    def fit(self, images: Any, labels: Any, n_classes: int | None = None) -> "ScratchResNet18":
        """Train the network on source images (the recipe of the module doc).

        Parameters
        ----------
        images : array-like of shape (n_items, height, width, 3)
            RGB images, uint8 (0-255) or float (0-1).
        labels : array-like of shape (n_items,)
            Integer class indices 0..K-1, at least two classes.
        n_classes : int or None
            Size of the label space K (default: largest label + 1).

        Returns
        -------
        ScratchResNet18
            ``self``, fitted.

        Raises
        ------
        FmauditInputError
            Images not (N, H, W, 3) uint8 or finite float, labels not one integer index per image, fewer than
            two classes, or non-positive epochs, batch size or learning rate.
        """
        from torchvision.models import resnet18

        images = _images(images, "source images")
        y = np.asarray(labels)
        if y.shape != (images.shape[0],) or not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
            raise FmauditInputError(f"source labels: expected {images.shape[0]} integer class indices, got shape "
                                    f"{y.shape} and dtype {y.dtype}")
        k = int(n_classes) if n_classes is not None else int(y.max()) + 1
        if y.max() >= k or np.unique(y).size < 2:
            raise FmauditInputError(f"source labels: need at least two classes within 0..{k - 1}")
        if int(self.epochs) < 1 or int(self.batch_size) < 1 or not self.lr > 0:
            raise FmauditInputError("ScratchResNet18: epochs, batch_size and lr must be positive")
        device = resolve_device(self.device)
        # per-channel statistics of the training images, streamed so large uint8 sets are never copied to float
        total, total_sq, count = np.zeros(3), np.zeros(3), 0
        for start in range(0, images.shape[0], 1024):
            chunk = _as_float(images[start:start + 1024]).reshape(-1, 3).astype(np.float64)
            total += chunk.sum(axis=0)
            total_sq += (chunk * chunk).sum(axis=0)
            count += chunk.shape[0]
        self.mean_ = (total / count).astype(np.float32)
        self.std_ = np.sqrt(np.maximum(total_sq / count - (total / count) ** 2, 1e-12)).astype(np.float32)
        self.n_classes_ = k
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.random_state))
            model = resnet18(weights=None, num_classes=k).to(device)
        optimiser = torch.optim.SGD(model.parameters(), lr=float(self.lr), momentum=float(self.momentum),
                                    weight_decay=float(self.weight_decay))
        rng = np.random.default_rng(self.random_state)
        n, batch = images.shape[0], int(self.batch_size)
        steps_per_epoch = -(-n // batch)
        total_steps = int(self.epochs) * steps_per_epoch
        targets = torch.as_tensor(y, dtype=torch.long)
        losses, step = [], 0
        model.train()
        for _ in range(int(self.epochs)):
            order = rng.permutation(n)
            epoch_loss = 0.0
            for start in range(0, n, batch):
                rows = order[start:start + batch]
                x = _as_float(images[rows])
                if self.augment:
                    flip_h = rng.random(rows.size) < 0.5
                    flip_v = rng.random(rows.size) < 0.5
                    x[flip_h] = x[flip_h, :, ::-1]
                    x[flip_v] = x[flip_v, ::-1]
                x = torch.from_numpy(np.ascontiguousarray(((x - self.mean_) / self.std_).transpose(0, 3, 1, 2)))
                for group in optimiser.param_groups:
                    group["lr"] = float(self.lr) * 0.5 * (1.0 + math.cos(math.pi * step / total_steps))
                logits = model(x.to(device))
                loss = torch.nn.functional.cross_entropy(logits, targets[rows].to(device))
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                epoch_loss += float(loss.detach()) * rows.size / n
                step += 1
            losses.append(epoch_loss)
        self._recompute_batchnorm_statistics(model, images, device)
        model.eval()
        self.model_ = model
        self.loss_ = np.asarray(losses)
        return self

    @torch.no_grad()
    def _recompute_batchnorm_statistics(self, model: torch.nn.Module, images: np.ndarray, device: torch.device) -> None:
        # Short trainings leave BatchNorm's running averages (momentum 0.1) far from the population statistics,
        # and eval mode then sees inputs the layers were never trained on. One pass over the (unaugmented)
        # training images with a cumulative average sets them to the final weights' own statistics.
        norms = [mod for mod in model.modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)]
        for mod in norms:
            mod.reset_running_stats()
            mod.momentum = None
        model.train()
        # shuffled like the training batches: class-sorted batches would hide the between-class variance
        order = np.random.default_rng(self.random_state).permutation(images.shape[0])
        for start in range(0, images.shape[0], int(self.batch_size)):
            model(self._tensor(images[order[start:start + int(self.batch_size)]], device))
        for mod in norms:
            mod.momentum = 0.1

    @torch.no_grad()
    def decision_logits(self, images: Any, batch_size: int = 256) -> np.ndarray:
        """Logits (N, K) in eval mode (BatchNorm running statistics).

        Parameters
        ----------
        images : array-like of shape (n_items, height, width, 3)
            RGB images, uint8 (0-255) or float (0-1).
        batch_size : int
            Images per forward pass (memory only; the logits do not depend on it).

        Returns
        -------
        ndarray of shape (n_items, n_classes), float64
            The logits.

        Raises
        ------
        FmauditInputError
            The network is not fitted, or invalid images.
        """
        if not hasattr(self, "model_"):
            raise FmauditInputError("ScratchResNet18: call fit first")
        images = _images(images, "images")
        device = next(self.model_.parameters()).device
        parts = [self.model_(self._tensor(images[s:s + batch_size], device)).double().cpu().numpy()
                 for s in range(0, images.shape[0], batch_size)]
        return np.concatenate(parts)

    def predict_proba(self, images: Any) -> np.ndarray:
        """Class probabilities, the softmax of :meth:`decision_logits`.

        Parameters
        ----------
        images : array-like of shape (n_items, height, width, 3)
            RGB images, uint8 (0-255) or float (0-1).

        Returns
        -------
        ndarray of shape (n_items, n_classes)
            Probabilities, rows summing to 1.
        """
        return metrics.softmax(self.decision_logits(images))


def _scores(logits: np.ndarray, y: np.ndarray, temperature: float, class_names: Sequence[str],
            n_bins: int) -> dict[str, Any]:
    P = metrics.softmax(logits)
    cm = metrics.confusion_counts(y, P.argmax(axis=1), P.shape[1])
    true = cm.sum(axis=1)
    row = {"n_items": int(y.size), "macro_f1": metrics.macro_f1(P, y),
           "balanced_accuracy": metrics.balanced_accuracy(P, y), "ece_raw": metrics.ece(P, y, n_bins),
           "ece_source_t": metrics.ece(metrics.softmax(logits, temperature), y, n_bins)}
    for k, name in enumerate(class_names):
        row[f"recall_{name}"] = cm[k, k] / true[k] if true[k] else np.nan
    return row


def evaluate_scratch(source_images: Any, source_labels: Any, targets: Mapping[str, tuple[Any, Any]],
                     class_names: Sequence[str], source_domain: str = "source", val_fraction: float = 0.2,
                     random_state: int = 0, n_bins: int = metrics.DEFAULT_N_BINS, source_groups: Any = None,
                     **model_params: Any) -> pd.DataFrame:
    """Train :class:`ScratchResNet18` on a source split and score it in-domain and on every target.

    ``targets``: target domain -> (images, labels). The source hold-out (``split_train_val``, seeded by
    ``random_state``) gives the in-domain row and the source temperature. One row per domain, with
    ``model`` = "resnet18-scratch", ``frozen`` False, ``in_domain``, the metrics and per-class recall.

    Parameters
    ----------
    source_images : array-like of shape (n_source, height, width, 3)
        Source RGB images, uint8 (0-255) or float (0-1).
    source_labels : array-like of shape (n_source,)
        Source class indices 0..K-1.
    targets : mapping of str to (array-like, array-like)
        Target domain -> (images, labels), labels one per image.
    class_names : sequence of str
        The K class names, label order (for the ``recall_<class>`` columns).
    source_domain : str
        Name of the source domain in the ``source_domain`` / ``target_domain`` columns.
    val_fraction : float
        Share of the source items (or groups) in the hold-out.
    random_state : int
        Seed of the source split and of the network (``seed`` column).
    n_bins : int
        Equal-width bins of the top-label ECE, (lo, hi] closure.
    source_groups : array-like of shape (n_source,) or None
        Patient or slide of each source image (group-disjoint hold-out).
    **model_params
        Further :class:`ScratchResNet18` parameters (``epochs``, ``lr``, ``device`` ...).

    Returns
    -------
    DataFrame
        One row per domain (the source hold-out first), columns ``model``, ``frozen``, ``source_domain``,
        ``target_domain``, ``in_domain``, ``n_items``, ``macro_f1``, ``balanced_accuracy``, ``ece_raw``,
        ``ece_source_t``, ``recall_<class>``, ``seed``, ``temperature_source``, ``n_source_train``,
        ``ece_convention``.

    Raises
    ------
    FmauditInputError
        Invalid images or labels, an empty source hold-out, or a target's labels not one per image.
    """
    images = _images(source_images, "source images")
    y = np.asarray(source_labels)
    k = len(class_names)
    train, val = split_train_val(y, groups=source_groups, val_fraction=val_fraction, random_state=random_state)
    if val.size == 0:
        raise FmauditInputError("source: the hold-out split is empty; the in-domain row and source temperature "
                                "need one")
    model = ScratchResNet18(random_state=random_state, **model_params).fit(images[train], y[train], n_classes=k)
    val_logits = model.decision_logits(images[val])
    temperature = TemperatureScaler().fit(val_logits, y[val]).temperature_
    rows = [{"target_domain": source_domain, "in_domain": True, **_scores(val_logits, y[val], temperature,
                                                                          class_names, n_bins)}]
    for name, (timg, tlab) in targets.items():
        tlab = np.asarray(tlab)
        logits = model.decision_logits(_images(timg, f"target {name} images"))
        if tlab.shape != (logits.shape[0],):
            raise FmauditInputError(f"target {name}: {tlab.shape[0] if tlab.ndim else 0} labels for "
                                    f"{logits.shape[0]} images")
        rows.append({"target_domain": name, "in_domain": False,
                     **_scores(logits, tlab, temperature, class_names, n_bins)})
    out = pd.DataFrame(rows)
    out.insert(0, "source_domain", source_domain)
    out.insert(0, "frozen", False)
    out.insert(0, "model", REFERENCE_NAME)
    out["seed"] = random_state
    out["temperature_source"] = temperature
    out["n_source_train"] = int(train.size)
    out["ece_convention"] = f"top-label, {n_bins} equal-width bins, (lo,hi]"
    return out

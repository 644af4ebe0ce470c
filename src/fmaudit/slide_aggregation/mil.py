"""The two neural aggregators: multiple-instance classifiers trained on bags of frozen tile embeddings (the audit
paper's ``abmil`` and ``transformer``; their one fixed recipe is in :mod:`fmaudit.slide_aggregation`)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fmaudit.devices import resolve_device
from fmaudit.io import FmauditInputError
from fmaudit.probes import subset_scaler
from fmaudit.probes.logistic_batch import check_features

#: The aggregators trained on bags (one module each), and the config key of their settings.
NEURAL_AGGREGATORS = {"attention_mil": "mil", "transformer_mil": "transformer"}


@contextlib.contextmanager
def _one_torch_thread_on_cpu(device: str) -> Iterator[None]:
    # one bag per step is a chain of tiny ops: torch's thread pool only adds overhead on CPU (a test fit took
    # 49 s with 2 threads and 9 s with 1 on a shared 2-core machine)
    if str(device).startswith("cuda"):
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class GatedAttentionPooling(nn.Module):
    """Gated attention pooling over the tiles of one bag (Ilse et al. 2018), then a linear head.

    Parameters
    ----------
    dim : int
        Width D of the tile embeddings.
    n_classes : int
        K, outputs of the head.
    embed_dim : int
        Width of the tile projection (Linear + ReLU).
    attention_dim : int
        Width of the gated attention's hidden layer.
    """

    def __init__(self, dim: int, n_classes: int, embed_dim: int, attention_dim: int):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(dim, embed_dim), nn.ReLU())
        self.attention_v = nn.Linear(embed_dim, attention_dim)
        self.attention_u = nn.Linear(embed_dim, attention_dim)
        self.attention_w = nn.Linear(attention_dim, 1)
        self.head = nn.Linear(embed_dim, n_classes)

    def forward(self, bag: torch.Tensor) -> torch.Tensor:  # bag: (n_tiles, dim) -> (1, n_classes)
        """Logits of one bag.

        Parameters
        ----------
        bag : Tensor of shape (n_tiles, dim)
            The bag's standardised tile embeddings.

        Returns
        -------
        Tensor of shape (1, n_classes)
        """
        h = self.embed(bag)
        gate = torch.tanh(self.attention_v(h)) * torch.sigmoid(self.attention_u(h))
        weights = torch.softmax(self.attention_w(gate), dim=0)
        return self.head((weights * h).sum(0, keepdim=True))


class ClassTokenTransformer(nn.Module):
    """A linear tile projection, a learned class token (zero-initialised), one transformer encoder layer over
    the class token and the tiles, and a linear head on the class token (the audit paper's ``TransformerMIL``).

    Parameters
    ----------
    dim : int
        Width D of the tile embeddings.
    n_classes : int
        K, outputs of the head.
    embed_dim : int
        Model width (a multiple of ``n_heads``).
    n_heads : int
        Attention heads of the encoder layer.
    feedforward_dim : int
        Hidden width of the layer's feed-forward block.
    dropout : float
        Dropout inside the encoder layer.
    """

    def __init__(self, dim: int, n_classes: int, embed_dim: int, n_heads: int, feedforward_dim: int, dropout: float):
        super().__init__()
        self.embed = nn.Linear(dim, embed_dim)
        self.class_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.encoder = nn.TransformerEncoderLayer(embed_dim, n_heads, feedforward_dim, dropout=dropout,
                                                  batch_first=True)
        self.head = nn.Linear(embed_dim, n_classes)

    def forward(self, bag: torch.Tensor) -> torch.Tensor:  # bag: (n_tiles, dim) -> (1, n_classes)
        """Logits of one bag, read from the class token.

        Parameters
        ----------
        bag : Tensor of shape (n_tiles, dim)
            The bag's standardised tile embeddings.

        Returns
        -------
        Tensor of shape (1, n_classes)
        """
        tokens = torch.cat([self.class_token, self.embed(bag).unsqueeze(0)], dim=1)
        return self.head(self.encoder(tokens)[:, 0])


class _BagClassifier:
    """A module trained on bags of standardised tile embeddings (the recipe: :mod:`fmaudit.slide_aggregation`).

    Fitted: ``model_`` (torch module, eval mode), ``mean_``, ``scale_`` (training tiles, ddof 0, constant
    features scale 1), ``n_classes_``, ``losses_`` (mean training loss per epoch), ``device_``,
    ``n_features_in_``."""

    epochs: int
    lr: float
    weight_decay: float
    random_state: int
    device: str

    def _module(self, dim: int, n_classes: int) -> nn.Module:
        raise NotImplementedError

    def fit(self, X: Any, bag_index: Sequence[np.ndarray], bag_labels: Any, n_classes: int | None = None):
        """Train the module on bags of tiles (the recipe of :mod:`fmaudit.slide_aggregation`).

        Parameters
        ----------
        X : array-like of shape (n_tiles, D)
            Finite tile embeddings of every training bag.
        bag_index : sequence of ndarray of int
            Positions in ``X`` of each bag's tiles (:func:`fmaudit.slide_aggregation.make_bags`).
        bag_labels : array-like of int, shape (n_bags,)
            Class of each bag, in 0..K-1; at least two classes.
        n_classes : int, optional
            K; default the largest label + 1.

        Returns
        -------
        self

        Raises
        ------
        FmauditInputError
            On non-finite features, as many labels as bags not given, labels outside 0..K-1 or a single class.
        """
        X = check_features(X, "tile features")
        y = np.asarray(bag_labels, dtype=np.int64)
        if len(bag_index) != y.size or y.size == 0:
            raise FmauditInputError(f"{len(bag_index)} bags but {y.size} bag labels")
        k = int(n_classes) if n_classes is not None else int(y.max()) + 1
        if y.min() < 0 or y.max() >= k:
            raise FmauditInputError(f"bag labels outside 0..{k - 1}")
        if np.unique(y).size < 2:
            raise FmauditInputError(f"{type(self).__name__}: the training bags hold a single class; need at least two")
        self.mean_, self.scale_ = subset_scaler(X)
        Xs = ((X - self.mean_) / self.scale_).astype(np.float32)
        device = resolve_device(self.device)
        rng = np.random.default_rng(self.random_state)
        losses = []
        with torch.random.fork_rng(devices=[]), _one_torch_thread_on_cpu(str(device)):
            torch.manual_seed(int(self.random_state))
            model = self._module(X.shape[1], k).to(device)
            optimiser = torch.optim.Adam(model.parameters(), lr=float(self.lr), weight_decay=float(self.weight_decay))
            loss_fn = nn.CrossEntropyLoss()
            tiles = torch.from_numpy(Xs).to(device)
            bags = [torch.as_tensor(np.asarray(i), dtype=torch.long, device=device) for i in bag_index]
            targets = torch.as_tensor(y, dtype=torch.long, device=device)
            model.train()
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
        """(n_bags, K) softmax of the bag logits.

        Parameters
        ----------
        X : array-like of shape (n_tiles, D)
            Tile embeddings with the fitted width D.
        bag_index : sequence of ndarray of int
            Positions in ``X`` of each bag's tiles.

        Returns
        -------
        ndarray of float64, shape (n_bags, K)

        Raises
        ------
        FmauditInputError
            When not fitted, or ``X`` has another width.
        """
        if not hasattr(self, "model_"):
            raise FmauditInputError(f"{type(self).__name__} is not fitted yet: call fit first")
        X = check_features(X, "tile features")
        if X.shape[1] != self.n_features_in_:
            raise FmauditInputError(f"tile features have {X.shape[1]} dimensions; the model was fitted on "
                                    f"{self.n_features_in_}")
        tiles = torch.from_numpy(((X - self.mean_) / self.scale_).astype(np.float32)).to(self.device_)
        with torch.inference_mode(), _one_torch_thread_on_cpu(self.device_):
            out = [torch.softmax(self.model_(tiles[torch.as_tensor(np.asarray(i), dtype=torch.long,
                                                                    device=self.device_)]), dim=1)[0]
                   for i in bag_index]
        return torch.stack(out).double().cpu().numpy()


class AttentionMILClassifier(_BagClassifier):
    """Gated attention MIL (Ilse et al. 2018) on bags of frozen tile embeddings (the audit paper's ``abmil``).

    ``fit(X, bag_index, bag_labels, n_classes)`` and ``predict_proba(X, bag_index)`` take the tiles of all bags
    and the tile positions of each bag (:func:`make_bags`). Fitted attributes: see :class:`_BagClassifier`.

    Parameters
    ----------
    embed_dim : int, default 256
        Width of the tile projection (Linear + ReLU).
    attention_dim : int, default 128
        Width of the gated attention's hidden layer.
    epochs : int, default 30
        Passes over the training bags, one bag per optimiser step.
    lr : float, default 1e-4
        Adam's learning rate.
    weight_decay : float, default 1e-4
        Adam's weight decay.
    random_state : int, default 0
        Seed of the weights and of the bag order.
    device : str, default "cpu"
        ``"cpu"`` as the audit paper, ``"cuda"``, or ``"auto"`` (CUDA when available).
    """

    def __init__(self, embed_dim: int = 256, attention_dim: int = 128, epochs: int = 30, lr: float = 1e-4,
                 weight_decay: float = 1e-4, random_state: int = 0, device: str = "cpu"):
        self.embed_dim = embed_dim
        self.attention_dim = attention_dim
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.random_state = random_state
        self.device = device

    def _module(self, dim: int, n_classes: int) -> nn.Module:
        return GatedAttentionPooling(dim, n_classes, int(self.embed_dim), int(self.attention_dim))


class TransformerMILClassifier(_BagClassifier):
    """One transformer encoder layer over a slide's tiles and a class token (the audit paper's ``transformer``).

    Used as :class:`AttentionMILClassifier`. Fitted attributes: see :class:`_BagClassifier`.

    Parameters
    ----------
    embed_dim : int, default 256
        Model width; a multiple of ``n_heads``.
    n_heads : int, default 4
        Attention heads.
    feedforward_dim : int, default 512
        Hidden width of the feed-forward block.
    dropout : float, default 0.1
        Dropout inside the layer (off at prediction).
    epochs : int, default 30
        Passes over the training bags, one bag per optimiser step.
    lr : float, default 1e-4
        Adam's learning rate.
    weight_decay : float, default 1e-4
        Adam's weight decay.
    random_state : int, default 0
        Seed of the weights, dropout and bag order.
    device : str, default "cpu"
        ``"cpu"`` as the audit paper, ``"cuda"``, or ``"auto"``.
    """

    def __init__(self, embed_dim: int = 256, n_heads: int = 4, feedforward_dim: int = 512, dropout: float = 0.1,
                 epochs: int = 30, lr: float = 1e-4, weight_decay: float = 1e-4, random_state: int = 0,
                 device: str = "cpu"):
        self.embed_dim = embed_dim
        self.n_heads = n_heads
        self.feedforward_dim = feedforward_dim
        self.dropout = dropout
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.random_state = random_state
        self.device = device

    def _module(self, dim: int, n_classes: int) -> nn.Module:
        if int(self.embed_dim) % int(self.n_heads):
            raise FmauditInputError(f"transformer: embed_dim {self.embed_dim} is not a multiple of n_heads "
                                    f"{self.n_heads}")
        return ClassTokenTransformer(dim, n_classes, int(self.embed_dim), int(self.n_heads),
                                     int(self.feedforward_dim), float(self.dropout))


_NEURAL_CLASSES = {"attention_mil": AttentionMILClassifier, "transformer_mil": TransformerMILClassifier}


def neural_aggregator(name: str, params: Mapping[str, Mapping[str, Any]] | None, random_state: int) -> _BagClassifier:
    """An unfitted neural aggregator with the config's settings.

    Parameters
    ----------
    name : {"attention_mil", "transformer_mil"}
        The aggregator (a key of :data:`NEURAL_AGGREGATORS`).
    params : Mapping, optional
        ``{"mil": {...}, "transformer": {...}}``: constructor keywords by the aggregator's config key.
    random_state : int
        The seed used when its settings give none.

    Returns
    -------
    AttentionMILClassifier or TransformerMILClassifier
    """
    settings = dict((params or {}).get(NEURAL_AGGREGATORS[name]) or {})
    settings.setdefault("random_state", random_state)
    return _NEURAL_CLASSES[name](**settings)

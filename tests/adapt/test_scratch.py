"""The ResNet-18 trained from scratch on the source: a non-frozen reference row, CPU-sized here."""

import numpy as np
import pytest

from fmaudit.adapt.scratch import ScratchResNet18, evaluate_scratch
from fmaudit.io import FmauditInputError


def colour_task(n_per, rng, cast=0.0, size=12):
    """Three classes told apart by their dominant colour channel; ``cast`` lowers it (a different scanner)."""
    images, labels = [], []
    for k in range(3):
        x = rng.normal(0.3, 0.1, size=(n_per, size, size, 3))
        x[..., k] += 0.4 - cast
        images.append(np.clip(x, 0, 1))
        labels += [k] * n_per
    return (np.concatenate(images) * 255).astype(np.uint8), np.array(labels)


def test_scratch_resnet_learns_and_is_reproducible():
    rng = np.random.default_rng(0)
    x, y = colour_task(12, rng)
    a = ScratchResNet18(epochs=3, batch_size=16, lr=0.02, random_state=1).fit(x, y, n_classes=3)
    b = ScratchResNet18(epochs=3, batch_size=16, lr=0.02, random_state=1).fit(x, y, n_classes=3)
    np.testing.assert_array_equal(a.decision_logits(x), b.decision_logits(x))  # same seed, same numbers
    assert (a.decision_logits(x).argmax(1) == y).mean() > 0.9
    assert a.loss_[-1] < a.loss_[0]


def test_evaluate_scratch_rows_use_the_probe_metrics():
    rng = np.random.default_rng(1)
    x, y = colour_task(15, rng)
    xt, yt = colour_task(8, rng, cast=0.2)
    out = evaluate_scratch(x, y, {"scanner-b": (xt, yt)}, ["r", "g", "b"], source_domain="scanner-a",
                           epochs=3, batch_size=16, lr=0.02)
    assert out["target_domain"].tolist() == ["scanner-a", "scanner-b"]
    assert out["in_domain"].tolist() == [True, False]
    assert (out["model"] == "resnet18-scratch").all() and not out["frozen"].any()
    for col in ("macro_f1", "balanced_accuracy", "ece_raw", "ece_source_t", "temperature_source",
                "recall_r", "recall_g", "recall_b", "ece_convention"):
        assert col in out.columns
    assert out.loc[0, "macro_f1"] > 0.8 and out.loc[1, "n_items"] == 24


def test_scratch_rejects_bad_input():
    with pytest.raises(FmauditInputError, match="RGB"):
        ScratchResNet18(epochs=1).fit(np.zeros((4, 8, 8)), np.array([0, 1, 0, 1]))
    with pytest.raises(FmauditInputError, match="labels"):
        ScratchResNet18(epochs=1).fit(np.zeros((4, 8, 8, 3), np.uint8), np.array([0, 1, 0]))
    with pytest.raises(FmauditInputError, match="two classes"):
        ScratchResNet18(epochs=1).fit(np.zeros((4, 8, 8, 3), np.uint8), np.zeros(4, int))
    with pytest.raises(FmauditInputError, match="fit first"):
        ScratchResNet18().decision_logits(np.zeros((1, 8, 8, 3), np.uint8))

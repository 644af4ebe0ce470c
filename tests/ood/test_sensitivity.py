"""Probe and scorer sensitivity tables."""

from __future__ import annotations

import numpy as np
import pytest

from fmaudit.io import FmauditInputError
from fmaudit.metrics import detection_auroc
from fmaudit.ood.scorers import KNNDistance
from fmaudit.ood.sensitivity import probe_sensitivity, scorer_sensitivity, select_C_by_cv
from fmaudit.probes import LogisticCVProbe


def test_log_loss_selection_agrees_with_the_probe_engine(task):
    X, y, g = task["train"]
    C, scores = select_C_by_cv(X, y, g, criterion="log_loss", n_classes=4)
    assert scores.shape == (3, 7)
    assert C == LogisticCVProbe(max_iter=10000, tol=1e-6, n_classes=4).fit(X, y, groups=g).C_
    C_acc, acc = select_C_by_cv(X, y, None, criterion="accuracy", n_classes=4)
    assert ((acc >= 0) & (acc <= 1)).all() and C_acc == np.logspace(-6, 0, 7)[np.argmax(acc.mean(0))]
    with pytest.raises(FmauditInputError, match="criterion"):
        select_C_by_cv(X, y, criterion="auc")


def test_probe_sensitivity_table(task):
    X, y, g = task["train"]
    Xt, yt, _ = task["test"]
    table = probe_sensitivity(X, y, g, Xt, yt, n_classes=4, Cs=(1e-3, 1.0), ordinal=True)
    fixed = table[table["analysis"] == "fixed_C"]
    assert fixed["C"].tolist() == [1e-3, 1.0]
    assert fixed.set_index("C").loc[1.0, "accuracy"] > fixed.set_index("C").loc[1e-3, "accuracy"] - 0.2
    sel = table[table["analysis"] == "selection"]
    assert list(zip(sel["folds"], sel["criterion"])) == [("grouped", "log_loss"), ("grouped", "accuracy"),
                                                         ("ungrouped", "log_loss"), ("ungrouped", "accuracy")]
    assert set(sel["selected_C"]) <= {1e-3, 1.0} and "qwk" in table.columns
    with pytest.raises(FmauditInputError, match="groups_train"):
        probe_sensitivity(X, y, None, Xt, yt, n_classes=4, Cs=(1.0,))


def test_scorer_sensitivity_table(task):
    X, y, _ = task["train"]
    Xt, yt, _ = task["test"]
    keep = y < 3
    ood = {"holdout_3": ("near", Xt[yt == 3]), "far": ("far", Xt[yt < 3] + 4.0)}
    table = scorer_sensitivity(X[keep], y[keep], Xt[yt < 3], ood, readout="cls", knn_ks=(1, 10))
    assert len(table) == 2 * (2 + 2 + 2 + 2) and set(table["readout"]) == {"cls"}
    by = table.set_index(["condition", "scorer", "setting"])
    # identical settings, fitted once, agree
    assert (by.loc[("far", "maha", "normalize=False"), "auroc"]
            == by.loc[("far", "maha", "covariance=ledoit_wolf"), "auroc"])
    direct = KNNDistance(k=10).fit(X[keep])
    ref = detection_auroc(direct.score(Xt[yt < 3]), direct.score(Xt[yt == 3]))
    assert by.loc[("holdout_3", "knn", "k=10"), "auroc"] == pytest.approx(ref)
    assert (table["n_id"] == (yt < 3).sum()).all()
    with pytest.raises(FmauditInputError, match="no OOD sets"):
        scorer_sensitivity(X, y, Xt, {})

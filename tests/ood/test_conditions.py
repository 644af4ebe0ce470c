"""Near (held-out classes) and far OOD condition builders."""

from __future__ import annotations

import numpy as np
import pytest

from fmaudit.io import FmauditInputError
from fmaudit.ood.conditions import far_ood_items, hold_out_classes


def test_hold_out_renumbers_the_remaining_classes_in_order():
    y = np.array([0, 1, 2, 3, 1, 3, 0])
    h = hold_out_classes(y, ["ADI", "BACK", "DEB", "TUM"], ["BACK", "DEB"])
    np.testing.assert_array_equal(h.held_out, np.isin(y, [1, 2]))
    np.testing.assert_array_equal(h.labels, [0, -1, -1, 1, -1, 1, 0])
    assert h.class_names == ["ADI", "TUM"] and h.held_out_names == ["BACK", "DEB"]


@pytest.mark.parametrize("held, match", [(["NORM"], "not classes of the task"), (["A", "A"], "repeat"),
                                         (["A", "B"], "leaves 1 class"), ([], "no class")])
def test_hold_out_errors(held, match):
    with pytest.raises(FmauditInputError, match=match):
        hold_out_classes(np.array([0, 1, 2]), ["A", "B", "C"], held, condition="c")


def test_far_items_are_the_donor_test_split():
    np.testing.assert_array_equal(far_ood_items(["train", "test", "test", "val"]), [1, 2])
    np.testing.assert_array_equal(far_ood_items(["unassigned"] * 3), [0, 1, 2])
    with pytest.raises(FmauditInputError, match="no items"):
        far_ood_items([])

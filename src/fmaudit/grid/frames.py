"""Run tables of hundreds of thousands of rows, built fast: Cartesian products from integer codes, and
concatenation that keeps categorical columns categorical."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = ["concat_runs", "product_frame"]


def product_frame(levels: Mapping[str, Sequence[Any]], **constants: Any) -> pd.DataFrame:
    """The Cartesian product of ``levels`` (first level slowest) as a frame, built from integer codes so a
    grid of hundreds of thousands of runs takes milliseconds; string levels become categoricals.

    Parameters
    ----------
    levels : Mapping of str to sequence
        Column -> its values, in product order: the first column varies slowest. A column of distinct strings
        becomes a categorical; strings with repeats stay object; other values keep their NumPy dtype.
    **constants
        Columns holding one value on every row (e.g. ``analysis="cells"``), as one-category categoricals, placed
        before the levels.

    Returns
    -------
    DataFrame
        ``prod(len(v))`` rows (none when a level is empty), the constant columns then one column per level.
    """
    sizes = [len(v) for v in levels.values()]
    n = int(np.prod(sizes)) if sizes else 0
    data: dict[str, Any] = {k: pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[v])
                            for k, v in constants.items()}
    inner = n
    for (name, values), size in zip(levels.items(), sizes):
        inner //= max(size, 1)
        codes = np.tile(np.repeat(np.arange(size), inner), n // max(size * inner, 1)) if n else np.array([], int)
        values = list(values)
        if values and all(isinstance(v, str) for v in values):
            data[name] = pd.Categorical.from_codes(codes, categories=list(dict.fromkeys(values))) \
                if len(set(values)) == len(values) else np.asarray(values, dtype=object)[codes]
        else:
            data[name] = np.asarray(values)[codes] if values else np.array([], dtype=object)
    return pd.DataFrame(data)


def concat_runs(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    """Run tables stacked into one; a column categorical in every table keeps one union of their categories.

    Parameters
    ----------
    frames : list of DataFrame
        Run tables, each holding every one of ``columns``.
    columns : list of str
        The columns to keep, in this order.

    Returns
    -------
    DataFrame
        The rows of ``frames`` in order with a fresh index; an empty frame with ``columns`` when there is none.
    """
    if not frames:
        return pd.DataFrame(columns=columns)
    frames = [f.copy(deep=False) for f in frames]
    for col in columns:
        if all(isinstance(f[col].dtype, pd.CategoricalDtype) for f in frames):
            # one set of categories, or concat would fall back to (slow, large) strings
            union = list(dict.fromkeys(c for f in frames for c in f[col].cat.categories))
            for f in frames:
                f[col] = f[col].cat.set_categories(union)
    return pd.concat(frames, ignore_index=True)[columns]

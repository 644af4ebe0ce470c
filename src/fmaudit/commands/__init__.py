"""Subcommands of the ``fmaudit`` command line, one module each.

Each module exposes ``register(subparsers)``: it adds its parser (with ``set_defaults(func=run)``) to the
``argparse`` sub-parsers of :func:`fmaudit.cli.build_parser`, and ``run(args) -> exit code``. A new command is a
new module here and one entry in :data:`fmaudit.cli.COMMANDS`. Option defaults that are workflow settings are
read from the config schema (:func:`fmaudit.config.schema_default`), so the command line and the workflow
share them.
"""

from __future__ import annotations


def floats(text: str) -> list[float]:
    """``"0.01,0.1 1"`` -> [0.01, 0.1, 1.0] (commas or spaces).

    Parameters
    ----------
    text : str
        A command-line value: numbers separated by commas, spaces or both.

    Returns
    -------
    list of float
        The numbers in the order given (an empty text gives an empty list).

    Raises
    ------
    ValueError
        When a piece is not a number (``argparse`` reports it as an invalid option value).
    """
    return [float(v) for v in text.replace(",", " ").split()]


def ints(text: str) -> list[int]:
    """``"0,1 2"`` -> [0, 1, 2] (commas or spaces).

    Parameters
    ----------
    text : str
        A command-line value: integers separated by commas, spaces or both.

    Returns
    -------
    list of int
        The integers in the order given (an empty text gives an empty list).

    Raises
    ------
    ValueError
        When a piece is not an integer (``argparse`` reports it as an invalid option value).
    """
    return [int(v) for v in text.replace(",", " ").split()]


def words(text: str) -> list[str]:
    """``"logistic,knn"`` -> ["logistic", "knn"].

    Parameters
    ----------
    text : str
        A command-line value: names separated by commas (no spaces are stripped).

    Returns
    -------
    list of str
        The non-empty names in the order given.
    """
    return [w for w in text.split(",") if w]

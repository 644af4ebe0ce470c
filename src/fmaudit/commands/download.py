"""``fmaudit download``: fetch and unpack one registered data set (resumable, checksummed)."""

from __future__ import annotations

import argparse

from fmaudit.config import schema_default
from fmaudit.datasets.download import download_dataset
from fmaudit.registry import load_dataset_registry, unknown_name_error

__all__ = ["register", "run"]


def run(args: argparse.Namespace) -> int:
    """Run ``fmaudit download``: fetch and unpack one registered data set under ``--data-root``.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options (``dataset``: a slug of the registry, ``data_root``, ``registry``).

    Returns
    -------
    int
        Exit status 0 once the data set is unpacked.

    Raises
    ------
    FmauditInputError
        When the slug is not in the registry (the message suggests the nearest names).
    """
    registry = load_dataset_registry(args.registry)
    if args.dataset not in registry:
        raise unknown_name_error("dataset", args.dataset, list(registry), args.registry)
    download_dataset(args.dataset, registry[args.dataset], args.data_root)
    print(f"{args.dataset}: ready under {args.data_root}")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``download`` to the ``fmaudit`` command line.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.

    Returns
    -------
    argparse.ArgumentParser
        The ``download`` parser, its ``func`` set to :func:`run`.
    """
    dl = subparsers.add_parser("download", help="fetch and unpack one registered data set (resumable, checksummed)")
    dl.add_argument("dataset", help="slug of the data-set registry")
    dl.add_argument("--data-root", required=True)
    dl.add_argument("--registry", default=schema_default("dataset_registry"),
                    help="data-set registry (default %(default)s)")
    dl.set_defaults(func=run)
    return dl


"""``fmaudit list encoders|datasets|kinds|analyses``: what a config can name, one line each.

    fmaudit list encoders [--configfile C]   registry slugs with loader, licence and what they are
    fmaudit list datasets [--configfile C]   data-set slugs with kind, preparer and what they hold
    fmaudit list kinds                       the data-set kinds, with the parameters of the own-data ones
    fmaudit list analyses                    the analyses of the grid, planned by a rule or declared

With ``--configfile``, the config's own registries and inline entries are listed with the built-in ones (the
registries as that config sees them).
"""

from __future__ import annotations

import argparse

import pandas as pd

from fmaudit.config import load_config
from fmaudit.datasets.own import OWN_KINDS
from fmaudit.grid import ANALYSES
from fmaudit.preflight import registries
from fmaudit.registry import DATASET_SCHEMA, load_dataset_registries, load_encoder_registries
from fmaudit.schema import load_yaml

__all__ = ["register", "run"]

WHAT = ("encoders", "datasets", "kinds", "analyses")
_ANALYSIS_WHAT = {
    "embed": "embeddings of each data set by each encoder (GPU jobs)",
    "probe": "linear (and other) probes per source domain, evaluated in-domain and on every other domain",
    "head_sweep": "extra probe heads and C values on the source domain",
    "cross_dataset": "a probe of one task evaluated on another task",
    "ood": "novelty scorers on far / blur / near / artefact / image-artefact OOD conditions",
    "ood_gate": "the two-threshold abstention gate",
    "ood_blur": "the test split re-embedded under Gaussian blur",
    "ood_image_artefact": "the test split re-embedded with synthetic image artefacts",
    "prior_shift": "targets resampled to class priors; label-free adaptation methods",
    "scratch_reference": "a ResNet-18 trained from scratch (a non-frozen reference)",
    "cell_features": "cell features at the nuclei of each section",
    "cells": "cell-level probes by protocol (IS, IOCD, MOCV, LOOO)",
}


def _first_sentence(text: object) -> str:
    s = " ".join(str(text or "").split())
    return s.split(". ")[0].rstrip(".")


def _table(args: argparse.Namespace) -> pd.DataFrame:
    if args.configfile and args.what in ("encoders", "datasets"):
        encoders, datasets = registries(load_config(args.configfile))
    else:
        encoders = load_encoder_registries() if args.what == "encoders" else {}
        datasets = load_dataset_registries() if args.what == "datasets" else {}
    if args.what == "encoders":
        return pd.DataFrame([{"encoder": slug, "loader": e.get("loader"), "family": e.get("family", ""),
                              "licence": e.get("licence", ""), "gated": e.get("gated", False),
                              "what": _first_sentence(e.get("description"))} for slug, e in encoders.items()])
    if args.what == "datasets":
        return pd.DataFrame([{"dataset": slug, "kind": e["kind"], "preparer": e["preparer"],
                              "group_unit": e.get("group_unit", (e.get("params") or {}).get("group_by", "")),
                              "what": _first_sentence(e.get("description") or "your own data")}
                             for slug, e in datasets.items()])
    if args.what == "kinds":
        schema = load_yaml(DATASET_SCHEMA)["$defs"]
        kinds = schema["dataset"]["properties"]["kind"]["enum"]
        rows = []
        for kind in kinds:
            own = kind in OWN_KINDS
            params = schema.get(kind, {}) if own else {}
            rows.append({"kind": kind, "declared in": "YAML only (dataset_entries)" if own else "a preparer (Python)",
                         "required params": ", ".join(params.get("required", [])),
                         "what": _first_sentence(params.get("description", "public data sets' own layouts"))})
        return pd.DataFrame(rows)
    return pd.DataFrame([{"analysis": name, "planned": "rule" if a.ruled else "declared",
                          "job per": " x ".join(a.job_keys), "what": _ANALYSIS_WHAT.get(name, "")}
                         for name, a in ANALYSES.items()])


def _short(value: object, width: int = 70) -> object:
    text = str(value)
    return value if len(text) <= width else text[: width - 3] + "..."


def run(args: argparse.Namespace) -> int:
    """Run ``fmaudit list``: print the table of what a config can name, one line each, in aligned columns.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options (``what``: one of :data:`WHAT`; ``configfile``: also that config's own entries).

    Returns
    -------
    int
        Exit status 0.
    """
    table = _table(args)
    table = table.apply(lambda col: col.map(lambda v: _short(v, 70 if col.name == "what" else 32)))
    widths = {c: max([len(str(c))] + [len(str(v)) for v in table[c]]) for c in table.columns}
    print("  ".join(str(c).ljust(widths[c]) for c in table.columns).rstrip())
    for row in table.itertuples(index=False):
        print("  ".join(str(v).ljust(widths[c]) for c, v in zip(table.columns, row)).rstrip())
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``list`` to the ``fmaudit`` command line.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.

    Returns
    -------
    argparse.ArgumentParser
        The ``list`` parser, its ``func`` set to :func:`run`.
    """
    p = subparsers.add_parser("list", help="list encoders, data sets, data-set kinds or analyses a config can name",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=WHAT)
    p.add_argument("--configfile", help="also list this config's own registries and entries")
    p.set_defaults(func=run)
    return p

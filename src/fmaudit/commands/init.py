"""``fmaudit init``: a study of your own data from a sheet, written as a config that runs as it stands.

    fmaudit init --images my-study/labels.csv --encoders uni,virchow2 --out my-study
    fmaudit init --slides my-study/slides.csv --encoders uni --out my-study

``--images``: a sheet of image files (``path,label,patient,domain``, optional ``slide``, ``split``; the
``image_table`` kind); ``--slides``: a sheet of labelled slides (``path,patient,domain`` and ``label`` or
``annotations``, optional ``slide``, ``split``, ``mpp``; the ``slide_table`` kind). Encoders: registry slugs,
``timm:<name>`` / ``hf:<repo>`` names (written as given), or ``<slug>=<checkpoint file>`` (the registry entry's
architecture and preprocessing with your weights: ``encoder_weights``). Writes ``<out>/config.yaml``, commented,
with its own ``study:``, the data-set entries it needs (``dataset_entries``), a task per sheet, the probe suite,
OOD detection with the abstention gate (a class held out where there are three or more) and class-prior shift
(between domains, where there are two or more); then runs every check of ``fmaudit check-config`` on it and
prints the jobs ``snakemake -n`` would plan (the grid summary, :func:`fmaudit.grid.summarize`). Paths in the
config are as given (relative to the working directory, where ``snakemake`` runs: the repository root).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import yaml

from fmaudit.commands.check_config import prepare_own_data
from fmaudit.config import fill_config, load_config
from fmaudit.datasets.annotations import read_regions
from fmaudit.datasets.own import IMAGE_COLUMNS, IMAGE_OPTIONAL, SLIDE_COLUMNS, SLIDE_OPTIONAL
from fmaudit.datasets.sheets import read_sheet, resolve_paths
from fmaudit.grid import summarize
from fmaudit.io import FmauditInputError, write_text
from fmaudit.preflight import FILE_CHECKS, check_config, check_data, data_checks, unusable_encoders
from fmaudit.registry import load_encoder_registries, unknown_name_error

__all__ = ["register", "run", "study_config_text"]

HELP = "write a config for your own tiles or slides (a sheet is enough), check it and show its plan"
_NAMED = re.compile(r"^(timm|hf):\S+$")


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._").lower()
    return slug if slug and slug[0].isalnum() else f"study-{slug}".strip("-")


def _classes(sheet: pd.DataFrame, given: Sequence[str] | None, where: str) -> list[str]:
    """The sheet's class names, in the order they first appear in its labels and then in its annotation files
    (or ``given``)."""
    if given:
        return list(given)
    found = list(dict.fromkeys(str(v) for v in sheet["label"].dropna())) if "label" in sheet.columns else []
    if "annotations" in sheet.columns:
        for path in resolve_paths(where, sheet["annotations"].dropna()):
            found += [c for c in read_regions(path).classes if c not in found]
    if len(found) < 2:
        raise FmauditInputError(f"{where}: the label column names {len(found)} class(es); a task needs two or more "
                                "(or give them with --classes)")
    return found


def parse_encoders(text: str, registry: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """``(encoder names, encoder_weights)`` of ``--encoders``: slugs, ``timm:``/``hf:`` names, ``slug=file``.

    Parameters
    ----------
    text : str
        The ``--encoders`` value: comma-separated registry slugs, ``timm:<name>`` / ``hf:<repo>`` names (kept as
        given) or ``<slug>=<checkpoint file>``.
    registry : dict
        The encoder registry (slug -> entry) the slugs are checked against.

    Returns
    -------
    encoders : list of str
        The encoder names in the order given.
    weights : dict of str to str
        Slug -> checkpoint path, for the ``slug=file`` entries (the config's ``encoder_weights``).

    Raises
    ------
    FmauditInputError
        When a slug is unknown (nearest names suggested), a checkpoint is given without its slug, or no encoder
        is given.
    FileNotFoundError
        When a ``slug=file`` checkpoint does not exist.
    """
    encoders, weights = [], {}
    for raw in (e.strip() for e in text.split(",")):
        if not raw:
            continue
        if _NAMED.match(raw):
            encoders.append(raw)
            continue
        if "=" in raw:
            slug, path = raw.split("=", 1)
            if slug not in registry:
                raise unknown_name_error("encoder", slug, list(registry), f"--encoders {raw}")
            if not Path(path).is_file():
                raise FileNotFoundError(f"--encoders {raw}: checkpoint {path} not found")
            encoders.append(slug)
            weights[slug] = path
            continue
        if Path(raw).is_file():
            raise FmauditInputError(f"--encoders {raw}: a checkpoint alone does not say its architecture; give it as "
                                    "<slug>=<file> with the registry encoder it is a checkpoint of (fmaudit list "
                                    "encoders), or add an entry of your own under encoder_entries")
        if raw not in registry:
            raise unknown_name_error("encoder", raw, list(registry), "--encoders")
        encoders.append(raw)
    if not encoders:
        raise FmauditInputError("--encoders: give at least one encoder")
    return encoders, weights


def _flow(value: Any) -> str:
    """``value`` as one line of YAML (a scalar without the document-end marker the dumper adds)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False, allow_unicode=True)
    return text.removesuffix("\n...\n").strip()


def _shares(classes: Sequence[str], weights: Sequence[float]) -> dict[str, float]:
    """Class shares rounded to 4 decimals that sum to 1 exactly (the last class takes the rounding)."""
    total = float(sum(weights))
    shares = [round(w / total, 4) for w in weights[:-1]]
    return dict(zip(classes, shares + [round(1.0 - sum(shares), 4)]))


def _data_block(name: str, kind: str, sheet_path: str, sheet: pd.DataFrame, classes: list[str],
                tiles: tuple[int, float, int | None] | None) -> list[str]:
    columns = ", ".join(sheet.columns.drop("sheet_line"))
    lines = [f"  {name}:",
             f"    kind: {kind}",
             "    params:",
             f"      sheet: {_flow(sheet_path)}  # columns {columns}; paths relative to the sheet",
             f"      classes: {_flow(classes)}  # label order; a label outside these stops the run, naming its line"]
    if "split" not in sheet.columns:
        lines.append("      fractions: [0.6, 0.2, 0.2]  # automatic split (train, val, test): grouped by patient, "
                     "stratified by label within each domain")
        lines.append("      seed: 0")
    else:
        lines.append("      # splits: the sheet's split column")
    if tiles is not None:
        lines.append(f"      tile_size: {tiles[0]}  # tiles of tile_size px at target_mpp µm/px where tissue covers "
                     "min_tissue_fraction (0.5) of them")
        lines.append(f"      target_mpp: {tiles[1]:g}")
        lines.append(f"      max_tiles_per_slide: {_flow(tiles[2])}  # a seeded sample of each slide's tiles "
                     "(null: all)")
        if "annotations" in sheet.columns:
            lines.append("      min_region_share: 0.5  # an annotated region must cover this share of a tile to "
                         "label it")
    return lines


def _task_block(name: str, dataset: str, domains: list[str], what: str) -> list[str]:
    return [f"  {name}:", f"    description: {_flow(what)}", f"    datasets: [{dataset}]",
            f"    domains: {_flow(domains)}"]


#: ``--quick``: a first look in minutes on a laptop (the settings each section states), not a published number.
QUICK = {"n_boot": 200, "seeds": [0], "kshot_k": [4, 8], "kshot_draws": 5, "gate_splits": 2, "ood_C": 1.0,
         "draws": 3, "methods": ["none", "global_standardization", "class_balanced_restandardization", "bbse"]}


def study_config_text(study: str, encoders: list[str], weights: dict[str, str],
                      data: list[dict[str, Any]], data_root: str, n_boot: int = 1000,
                      tiles: tuple[int, float, int | None] = (224, 0.5, 1000), quick: bool = False) -> str:
    """The commented config of a study over ``data`` (each: name, task, kind, sheet path, sheet, classes,
    domains and ``n_per_domain``, the labelled items of each domain); ``tiles``: (tile_size, target_mpp,
    max_tiles_per_slide) of slide sheets; ``quick``: the :data:`QUICK` settings, for a first look.

    Parameters
    ----------
    study : str
        The study's name (a slug; results go under ``results/<study>/``).
    encoders : list of str
        Encoder names as :func:`parse_encoders` returns them.
    weights : dict of str to str
        Slug -> checkpoint file, written as ``encoder_weights`` (empty: none).
    data : list of dict
        One per sheet, with keys ``name``, ``task``, ``kind`` (``image_table`` or ``slide_table``), ``sheet_path``,
        ``sheet`` (the read DataFrame), ``classes`` (label order), ``domains`` and ``n_per_domain``.
    data_root : str
        The study folder (``--out``), written as ``data_root`` and in the commented commands.
    n_boot : int
        Bootstrap resamples per interval (ignored with ``quick``, which writes :data:`QUICK`'s).
    tiles : tuple of (int, float, int or None)
        ``(tile_size, target_mpp, max_tiles_per_slide)`` of slide sheets (pixels, µm/px, tiles; None: all).
    quick : bool
        Write the shorter :data:`QUICK` settings (fewer resamples, seeds, gate divisions, draws), commented.

    Returns
    -------
    str
        The YAML text of the config, commented, ending in one newline.
    """
    lines = [
        f"# fmaudit study {study!r}, written by `fmaudit init`. Every key is described in",
        "# resources/schemas/config.schema.yaml; your own data in docs/own-data.md. From the repository root:",
        f"#   fmaudit check-config --configfile {Path(data_root) / 'config.yaml'}   (the checks, before any GPU hour)",
        f"#   snakemake --cores 4 --configfile {Path(data_root) / 'config.yaml'}    (the study; -n shows its plan)",
        f"study: {study}  # everything it writes goes under results/{study}/ (the report: results/{study}/report/)",
        f"data_root: {_flow(data_root)}  # not read by your own data sets: their sheets list their files",
        "",
        "# Encoders to audit: registry slugs (fmaudit list encoders), timm:/hf: names, or a registry slug whose",
        "# weights you bring (encoder_weights).",
        f"encoders: {_flow(encoders)}",
    ]
    if weights:
        lines += ["encoder_weights:  # your checkpoint of each, in place of the registry's weights"]
        lines += [f"  {slug}: {_flow(path)}" for slug, path in weights.items()]
    lines += ["", "# Your data: one entry per sheet (no Python; the kinds are in docs/own-data.md).",
              f"datasets: {_flow([d['name'] for d in data])}", "dataset_entries:"]
    for d in data:
        lines += _data_block(d["name"], d["kind"], d["sheet_path"], d["sheet"], d["classes"],
                             tiles if d["kind"] == "slide_table" else None)
    lines += ["", "# Tasks: a label space over the data, with the domains (scanners, sites) transfer runs between.",
              "tasks:"]
    for d in data:
        what = (f"{', '.join(d['classes'])} from {d['sheet_path']}, across {', '.join(d['domains'])}.")
        lines += _task_block(d["task"], d["name"], d["domains"], what)
    lines += ["", "# The probe suite: a logistic probe per source domain, evaluated in-domain and on every other",
              "# domain, with cluster-bootstrap intervals over the test patients.",
              "probe:", "  fractions: [1.0]  # label fractions of the training split (e.g. [0.1, 0.5, 1.0])",
              f"  seeds: {_flow(QUICK['seeds'] if quick else [0, 1, 2])}",
              "bootstrap:", f"  n_boot: {QUICK['n_boot'] if quick else int(n_boot)}  # resamples of the test "
              "patients per interval"]
    if quick:
        lines += ["calibration:  # --quick: a short K-shot ladder",
                  f"  kshot_k: {_flow(QUICK['kshot_k'])}", f"  kshot_draws: {QUICK['kshot_draws']}"]
    lines += [""]
    near = {d["task"]: [d["classes"][-1]] for d in data if len(d["classes"]) >= 3}
    if near:
        lines += ["# OOD detection and the abstention gate: a class held out as near-OOD (the probe and the novelty",
                  "# scorers are refitted without it); the gate's two thresholds are fitted on the training split.",
                  "ood:", "  near:"]
        lines += [f"    {task}: {_flow(names)}" for task, names in near.items()]
        lines += ["  gate:", "    near: true  # also gate each near condition's held-out class"]
        if quick:
            lines += [f"    n_splits: {QUICK['gate_splits']}  # --quick: 2 fit/validation divisions (audit paper: 5)",
                      "  probe:", f"    C: {QUICK['ood_C']}  # --quick: a fixed C (default: chosen by grouped CV)"]
        lines += [""]
    shifted = [d for d in data if len(d["domains"]) >= 2]
    if shifted:
        d = shifted[0]
        source, targets = d["domains"][0], d["domains"][1:]
        k = len(d["classes"])
        balanced = _shares(d["classes"], [1.0] * k)
        skew = _shares(d["classes"], [0.6] + [0.4 / (k - 1)] * (k - 1))
        sample = max(10, min(500, int(min(d["n_per_domain"].get(t, 0) for t in targets))))
        lines += [f"# Class-prior shift: the {', '.join(targets)} target(s) resampled to other class priors, each",
                  f"# label-free adaptation of the {source} probe evaluated on every draw.",
                  "prior_shift:", f"  task: {d['task']}", f"  source_domains: [{source}]",
                  f"  target_domains: {_flow(targets)}",
                  f"  sample_size: {sample}  # items per draw (at most the smallest target's {sample} items)",
                  f"  draws: {QUICK['draws'] if quick else 10}", "  priors:", f"    balanced: {_flow(balanced)}",
                  f"    {_slug(d['classes'][0])}-rich: {_flow(skew)}"]
        if quick:
            lines += [f"  methods: {_flow(QUICK['methods'])}  # --quick: without SHOT-IM's training"]
        lines += [""]
    return "\n".join(lines).rstrip() + "\n"


def _sheet_data(kind: str, path: str, study: str, classes: Sequence[str] | None) -> dict[str, Any]:
    required, optional = (IMAGE_COLUMNS, IMAGE_OPTIONAL) if kind == "image_table" else (SLIDE_COLUMNS, SLIDE_OPTIONAL)
    sheet = read_sheet(path, required, optional, what="image sheet" if kind == "image_table" else "slide sheet")
    suffix = "tiles" if kind == "image_table" else "slides"
    domains = sorted(sheet["domain"].dropna().astype(str).unique())
    return {"name": f"{study}-{suffix}", "task": f"{study}-{suffix}" if kind == "slide_table" else study,
            "kind": kind, "sheet_path": path, "sheet": sheet, "classes": _classes(sheet, classes, path),
            "domains": domains, "n_per_domain": sheet["domain"].value_counts().to_dict()}


def run(args: argparse.Namespace) -> int:
    """Run ``fmaudit init``: write ``<out>/config.yaml`` for the sheets, check it as the workflow would, print its plan.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options of :func:`register` (``images`` and/or ``slides``, ``encoders``, ``out``, ``study``,
        ``classes``, ``slides_classes``, ``n_boot``, ``tile_size``, ``target_mpp``, ``max_tiles_per_slide``,
        ``quick``, ``force``).

    Returns
    -------
    int
        Exit status 0 once the config is written and every check passed.

    Raises
    ------
    FmauditInputError
        When no sheet is given, the config exists without ``--force``, a sheet names fewer than two classes, or
        the written config fails a check.
    """
    if not args.images and not args.slides:
        raise FmauditInputError("fmaudit init: give --images SHEET or --slides SHEET (or both)")
    out = Path(args.out)
    config_path = out / "config.yaml"
    if config_path.exists() and not args.force:
        raise FmauditInputError(f"{config_path} exists; remove it or pass --force to write over it")
    study = _slug(args.study or out.resolve().name)
    registry = load_encoder_registries()
    encoders, weights = parse_encoders(args.encoders, registry)
    data = []
    if args.images:
        data.append(_sheet_data("image_table", args.images, study, args.classes))
    if args.slides:
        data.append(_sheet_data("slide_table", args.slides, study, args.slides_classes or args.classes))
    tiles = (int(args.tile_size), float(args.target_mpp), args.max_tiles_per_slide)

    def text(names: list[str] = encoders, checkpoints: dict[str, str] = weights) -> str:
        return study_config_text(study, names, checkpoints, data, str(out), n_boot=args.n_boot, tiles=tiles,
                                 quick=args.quick)

    # the data prepared in memory (checked as the validate rule checks them) give each domain's labelled items,
    # which size the prior-shift draws; the config is then written and checked as it stands. The draft needs no
    # encoder of the study (timm:/hf: names are resolved by the workflow): a built-in demo one stands in.
    draft = fill_config(yaml.safe_load(text(["demo-vit-tiny"], {})), source=f"{config_path} (draft)")
    _, datasets = check_config(draft)
    checks = data_checks(draft, datasets)
    frames = prepare_own_data(draft, datasets, {**checks.files, **checks.manifests})
    for d in data:
        frame = frames.get(d["name"])
        if frame is not None:
            d["n_per_domain"] = frame[frame["label"].notna()]["domain"].value_counts().to_dict()
    out.mkdir(parents=True, exist_ok=True)
    write_text(config_path, text())
    print(f"wrote {config_path}")
    config = load_config(config_path)
    encoder_registry, datasets = check_config(config)
    for why in unusable_encoders(config, encoder_registry).values():
        print(f"warning: {why}")
    report = check_data(data_checks(config, datasets), frames)
    for check in report.checks:
        if check.check in FILE_CHECKS:
            print(f"checked: {check.detail}")
    for warning in report.warnings:
        print(f"warning: {warning}")
    print(f"{config_path}: every check passed ({len(report.checks)} data checks)")
    summary = summarize(config, datasets)
    planned = summary[summary["planned"] & (summary["jobs"] > 0)]
    print("\nwhat `snakemake -n` plans (jobs by analysis; embeddings and analysis shards):")
    print(planned[["analysis", "protocol", "runs", "jobs"]].to_string(index=False))
    print(f"\nnext: snakemake --cores 4 --configfile {config_path}\n"
          f"      then read results/{study}/report/index.md")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``init`` to the ``fmaudit`` command line.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.

    Returns
    -------
    argparse.ArgumentParser
        The ``init`` parser, its ``func`` set to :func:`run`.
    """
    p = subparsers.add_parser("init", help=HELP, description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", help="sheet of image files: path,label,patient,domain[,slide,split] (CSV or TSV)")
    p.add_argument("--slides", help="sheet of labelled slides: path,patient,domain and label or annotations "
                   "(GeoJSON)[,slide,split,mpp]")
    p.add_argument("--encoders", required=True, help="comma-separated: registry slugs, timm:<name> / hf:<repo>, or "
                   "<slug>=<checkpoint file>")
    p.add_argument("--out", required=True, help="folder of the study's config.yaml")
    p.add_argument("--study", help="the study's name (default: the --out folder's name)")
    p.add_argument("--classes", type=lambda s: [c for c in s.split(",") if c],
                   help="class names in label order (default: as they first appear in the sheet)")
    p.add_argument("--slides-classes", type=lambda s: [c for c in s.split(",") if c],
                   help="class names of the slide sheet, when they differ from --classes")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples per interval")
    p.add_argument("--tile-size", type=int, default=224, help="slides: tile side in pixels at --target-mpp")
    p.add_argument("--target-mpp", type=float, default=0.5, help="slides: µm/px of the tiles")
    p.add_argument("--max-tiles-per-slide", type=int, default=1000, help="slides: tiles kept per slide at most (a "
                   "seeded sample)")
    p.add_argument("--quick", action="store_true", help="a first look in minutes: fewer resamples, seeds, gate "
                   "divisions and draws (each written in the config, commented); drop it for the audit itself")
    p.add_argument("--force", action="store_true", help="write over an existing config.yaml")
    p.set_defaults(func=run)
    return p

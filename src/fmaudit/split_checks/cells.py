"""The cell branch's split checks (CellPath-Bench): the same report as the task checks, over a panel of sections
and the partitions its protocols draw, before the first feature job."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from fmaudit.cells.protocols import make_partition, mask_excluded, panel_from_manifests, unit_sections
from fmaudit.io import FmauditInputError
from fmaudit.split_checks.report import SplitCheck, SplitValidationError, SplitValidationReport, name_examples

#: Checks of :func:`validate_cell_panel`, in the order they run.
CELL_CHECKS = ("section_classes", "partition_leakage", "training_classes", "evaluated_classes")


def validate_cell_panel(
    manifests: Mapping[str, pd.DataFrame],
    sections_by_organ: Mapping[str, Sequence[str]],
    taxonomies: Mapping[str, Mapping[str, Any]],
    protocols: Mapping[str, Mapping[str, Any]],
    probe: Mapping[str, Any],
    excluded: Mapping[str, str] | None = None,
    folds: Mapping[str, Sequence[str]] | None = None,
    max_examples: int = 5,
) -> SplitValidationReport:
    """Every check of the cell branch that can fail on cell data, before the first feature job.

    ``manifests``: section -> cell manifest (:mod:`fmaudit.cells.prepare`); ``taxonomies``: name (``fine``,
    ``coarse``) -> ``{"task": task, "allow_missing_classes": [class names]}``; ``protocols`` and ``probe``:
    the config's ``cells.protocols`` and ``cells.probe``; ``excluded``: section -> reason (sections with fewer
    than two valid classes, from their manifests' provenance); ``folds``: MOCV unit -> sections.

    - ``section_classes``: one row per section: ``excluded`` with the reason (its labels take no part; see
      :func:`fmaudit.cells.protocols.mask_excluded`), else ``ok``; every section excluded is an error.
    - ``partition_leakage``: the partition of every (protocol, unit, seed) is drawn exactly as the shards draw
      it and checked (no held-out cell trains or validates).
    - ``training_classes``: each partition's training cells hold at least two classes of each taxonomy; a unit
      whose test sections are all excluded is reported ``excluded`` instead.
    - ``evaluated_classes``: every class among a partition's test cells is among its training cells; class
      names in the taxonomy task's ``allow_missing_classes`` are ``allowed``.

    Raises :class:`SplitValidationError` listing every problem; returns the report otherwise (scope:
    ``protocol unit seed taxonomy``).

    Parameters
    ----------
    manifests : Mapping of str to DataFrame
        Section to its cell manifest.
    sections_by_organ : Mapping of str to sequence of str
        Organ to its sections (the protocols' units).
    taxonomies : Mapping of str to Mapping
        Taxonomy name to its ``task`` and ``allow_missing_classes``.
    protocols : Mapping of str to Mapping
        ``cells.protocols`` (a protocol set to None is skipped); each with ``seeds`` and its unit settings.
    probe : Mapping
        ``cells.probe``: ``val_fraction``, ``max_train_cells``, ``max_val_cells``.
    excluded : Mapping of str to str, optional
        Section to the reason it is excluded.
    folds : Mapping of str to sequence of str, optional
        MOCV fold to its sections.
    max_examples : int, default 5
        Largest number of class names named per problem.

    Returns
    -------
    SplitValidationReport

    Raises
    ------
    SplitValidationError
        Listing every problem, or at once when every section is excluded.
    """
    excluded = dict(excluded or {})
    report = SplitValidationReport()
    tax_names = list(taxonomies)
    for section in manifests:
        if section in excluded:
            report.checks.append(SplitCheck("cells", "section_classes", f"section {section}", "excluded",
                                            f"excluded from the cell-level analyses: {excluded[section]}"))
        else:
            report.checks.append(SplitCheck("cells", "section_classes", f"section {section}", "ok",
                                            "at least two valid classes in every taxonomy"))
    if manifests and all(s in excluded for s in manifests):
        report.checks.append(SplitCheck("cells", "section_classes", "panel", "error",
                                        "every section is excluded (fewer than two valid classes); nothing to probe"))
        raise SplitValidationError("cell validation failed:\n" + "\n".join(report.problems), report)
    panel = panel_from_manifests(mask_excluded(manifests, excluded, tax_names), tax_names)
    for protocol, spec in protocols.items():
        if spec is None:
            continue
        for unit in _cell_units(protocol, spec, sections_by_organ, folds):
            test_sections = _unit_test_sections(protocol, unit, sections_by_organ, folds)
            unit_excluded = all(s in excluded for s in test_sections)
            for seed in spec["seeds"]:
                scope = f"{protocol} {unit} seed {int(seed)}"
                try:
                    part = make_partition(panel, protocol, unit, int(seed), sections_by_organ=sections_by_organ,
                                          folds=folds, taxonomies=tax_names, roi_fraction=spec.get("roi_fraction", 0.5),
                                          val_fraction=probe["val_fraction"], max_train_cells=probe["max_train_cells"],
                                          max_val_cells=probe["max_val_cells"])
                except FmauditInputError as e:
                    report.checks.append(SplitCheck("cells", "partition_leakage", scope, "error", str(e)))
                    continue
                report.checks.append(SplitCheck("cells", "partition_leakage", scope, "ok",
                                                f"{part.train.size} train, {part.val.size} val, "
                                                f"{part.test.size} test cells"))
                for tax in tax_names:
                    task = str(taxonomies[tax]["task"])
                    allowed_names = set(taxonomies[tax].get("allow_missing_classes") or ())
                    labels = panel.labels[tax]
                    names = panel.class_names[tax]
                    train = np.unique(labels[part.train][labels[part.train] >= 0])
                    test = np.unique(labels[part.test][labels[part.test] >= 0])
                    where = f"{scope} {tax}"
                    if unit_excluded:
                        report.checks.append(SplitCheck(task, "training_classes", where, "excluded",
                                                        "every test section of the unit is excluded"))
                        continue
                    if train.size < 2:
                        report.add(task, "training_classes", where,
                                   [f"{train.size} class(es) among the {part.train.size} training cells "
                                    f"(need 2): {[names[c] for c in train]}"], "")
                        continue
                    report.add(task, "training_classes", where, [], f"{train.size} classes in training")
                    missing = [int(c) for c in test if c not in set(train.tolist())]
                    errors = [c for c in missing if names[c] not in allowed_names]
                    allowed = [c for c in missing if names[c] in allowed_names]
                    report.add(task, "evaluated_classes", where,
                               [f"class(es) {name_examples([names[c] for c in errors], max_examples)} among the test "
                                f"cells but absent from the training cells (allow them by name in "
                                f"tasks.{task}.allow_missing_classes)"] if errors else [],
                               f"every test class ({test.size}) is in training",
                               [f"class {names[c]!r} absent from training (allowed)" for c in allowed])
    if not report.ok:
        raise SplitValidationError("cell validation failed:\n" + "\n".join(report.problems), report)
    return report


def _cell_units(protocol: str, spec: Mapping[str, Any], sections_by_organ: Mapping[str, Sequence[str]],
                folds: Mapping[str, Sequence[str]] | None) -> list[str]:
    """A protocol's units as :func:`fmaudit.grid.cell_runs` declares them."""
    if protocol == "IS":
        return [s for secs in sections_by_organ.values() for s in secs]
    if protocol == "IOCD":
        return [s for secs in sections_by_organ.values() if len(secs) >= int(spec["min_sections_per_organ"])
                for s in secs]
    if protocol == "MOCV":
        return [f"fold{i}" for i in range(int(spec["folds"]))]
    return list(sections_by_organ)


def _unit_test_sections(protocol: str, unit: str, sections_by_organ: Mapping[str, Sequence[str]],
                        folds: Mapping[str, Sequence[str]] | None) -> list[str]:
    return unit_sections(protocol, unit, sections_by_organ, folds)[0]

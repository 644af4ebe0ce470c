"""Class-prior shift and label-free adaptation (hema paper): resampled target draws per (source seed, target
domain, prior), one job per (encoder, source domain, target domain); and the hema paper's non-frozen reference, a
ResNet-18 trained from scratch, one job per (source domain, seed) when ``prior_shift.scratch_reference`` is
enabled."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

import pandas as pd

from fmaudit.grid.frames import concat_runs, product_frame
from fmaudit.grid.studies import parts_with, require_domains, require_tasks
from fmaudit.io import FmauditInputError

__all__ = ["check_priors", "prior_shift_runs", "scratch_reference_runs"]

# Domains name the shard files of the prior-shift rules (results/shards/prior_shift/<task>/<encoder>/<s>/<t>)
_PATH_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_priors(priors: Mapping[str, Mapping[str, float]], where: str = "prior_shift.priors") -> None:
    """Each prior is a class -> share mapping over the same classes, shares >= 0 summing to 1.

    Parameters
    ----------
    priors : Mapping of str to Mapping of str to float
        Prior name -> class name -> share of the resampled target.
    where : str
        The config key of the priors, for the message.

    Raises
    ------
    FmauditInputError
        Naming ``<where>.<prior>`` whose shares are negative or do not sum to 1 (within 1e-6), or whose classes
        differ from the first prior's.
    """
    classes = None
    for name, prior in priors.items():
        total = float(sum(prior.values()))
        if not math.isclose(total, 1.0, abs_tol=1e-6) or min(prior.values()) < 0:
            raise FmauditInputError(f"config '{where}.{name}': shares must be >= 0 and sum to 1 (sum {total:g})")
        if classes is None:
            classes = set(prior)
        elif set(prior) != classes:
            raise FmauditInputError(f"config '{where}.{name}': classes {sorted(prior)} differ from {sorted(classes)}")


def prior_shift_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Class-prior shift (hema paper): encoder × source domain × source seed × target domain × prior × draw.
    Every adaptation method is evaluated on each draw, so methods do not multiply runs.

    Parameters
    ----------
    config : Mapping
        The filled config with a ``prior_shift`` block (``task``, ``priors``, ``assumed_priors``, ``source_domains``,
        ``target_domains``, ``seeds``, ``draws``).
    dataset_registry : Mapping, optional
        Data-set slug -> registry entry, for the task's domains.

    Returns
    -------
    DataFrame
        One row per draw, columns ``analysis`` (``prior_shift``), ``task``, ``encoder``, ``source_domain``, ``seed``,
        ``target_domain`` (never the source), ``prior``, ``draw`` (0-based).

    Raises
    ------
    FmauditInputError
        When the block names an unknown task, domain or assumed prior, a prior fails :func:`check_priors`, or a
        domain name is not safe in a file path.
    """
    frames = []
    for where, part, ps in parts_with(config, "prior_shift"):
        task = ps["task"]
        require_tasks(part, [task], f"{where}.task")
        check_priors(ps["priors"], f"{where}.priors")
        unknown = [name for name in ps.get("assumed_priors") or [] if name not in ps["priors"]]
        if unknown:
            raise FmauditInputError(f"config '{where}.assumed_priors': {unknown} are not priors of "
                                    f"'{where}.priors' ({', '.join(ps['priors'])})")
        domains = require_domains(part, task, ps.get("source_domains") or [], dataset_registry,
                                   f"{where}.source_domains")
        require_domains(part, task, ps.get("target_domains") or [], dataset_registry, f"{where}.target_domains")
        sources = list(ps.get("source_domains") or domains)
        for dom in domains:
            if not _PATH_SAFE.match(dom):
                raise FmauditInputError(f"config '{where}': domain {dom!r} of task {task!r} names shard files of the "
                                        "prior-shift rules; use letters, digits, '.', '_' and '-' only")
        for src in sources:
            targets = [d for d in (ps.get("target_domains") or domains) if d != src]
            frames.append(product_frame({
                "encoder": part["encoders"], "source_domain": [src], "seed": [int(s) for s in ps["seeds"]],
                "target_domain": targets, "prior": list(ps["priors"]), "draw": list(range(int(ps["draws"]))),
            }, analysis="prior_shift", task=task))
    cols = ["analysis", "task", "encoder", "source_domain", "seed", "target_domain", "prior", "draw"]
    return concat_runs(frames, cols)


def scratch_reference_runs(config: Mapping[str, Any],
                           dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The hema paper's ResNet-18 trained from scratch: one run (and job) per task x source domain x source seed of
    each enabled ``prior_shift.scratch_reference``, evaluated in-domain and on the prior-shift targets.

    Parameters
    ----------
    config : Mapping
        The filled config (``prior_shift.scratch_reference.enabled``).
    dataset_registry : Mapping, optional
        Data-set slug -> registry entry, for the task's domains.

    Returns
    -------
    DataFrame
        Columns ``analysis`` (``scratch_reference``), ``task``, ``source_domain``, ``seed``; empty when not enabled.

    Raises
    ------
    FmauditInputError
        When ``source_domains`` names a domain the task lacks.
    """
    frames = []
    for where, part, ps in parts_with(config, "prior_shift"):
        if not (ps.get("scratch_reference") or {}).get("enabled"):
            continue
        domains = require_domains(part, ps["task"], ps.get("source_domains") or [], dataset_registry,
                                  f"{where}.source_domains")
        frames.append(product_frame({"source_domain": list(ps.get("source_domains") or domains),
                                     "seed": [int(s) for s in ps["seeds"]]},
                                    analysis="scratch_reference", task=ps["task"]))
    return concat_runs(frames, ["analysis", "task", "source_domain", "seed"])

"""Class-prior shift and label-free adaptation (seed 000), declared ahead of its rule: resampled target draws
per (source seed, target domain, prior)."""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from fmaudit.grid.frames import concat_runs, product_frame
from fmaudit.grid.studies import parts_with, require_domains, require_tasks
from fmaudit.io import FmauditInputError

__all__ = ["check_priors", "prior_shift_runs"]


def check_priors(priors: Mapping[str, Mapping[str, float]], where: str = "prior_shift.priors") -> None:
    """Each prior is a class -> share mapping over the same classes, shares >= 0 summing to 1."""
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
    """Class-prior shift (seed 000): encoder × source domain × source seed × target domain × prior × draw.
    Every adaptation method is evaluated on each draw, so methods do not multiply runs."""
    frames = []
    for where, part, ps in parts_with(config, "prior_shift"):
        task = ps["task"]
        require_tasks(part, [task], f"{where}.task")
        check_priors(ps["priors"], f"{where}.priors")
        domains = require_domains(part, task, ps.get("source_domains") or [], dataset_registry,
                                   f"{where}.source_domains")
        require_domains(part, task, ps.get("target_domains") or [], dataset_registry, f"{where}.target_domains")
        sources = list(ps.get("source_domains") or domains)
        for src in sources:
            targets = [d for d in (ps.get("target_domains") or domains) if d != src]
            frames.append(product_frame({
                "encoder": part["encoders"], "source_domain": [src], "seed": [int(s) for s in ps["seeds"]],
                "target_domain": targets, "prior": list(ps["priors"]), "draw": list(range(int(ps["draws"]))),
            }, analysis="prior_shift", task=task))
    cols = ["analysis", "task", "encoder", "source_domain", "seed", "target_domain", "prior", "draw"]
    return concat_runs(frames, cols)

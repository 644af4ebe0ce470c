"""Imports run one way, downwards (README, "Layout"): no module imports a layer above its own, and nothing in
src/ imports snakemake."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fmaudit"

LAYERS = [  # top to bottom; a module may import its own layer and those below
    ("faces", {"cli", "commands"}),
    ("jobs", {"jobs"}),
    ("analyses", {"analyses"}),
    ("domain", {"config", "datasets", "slides", "embed", "encoders", "grid", "calibration", "stats", "report",
                "cells", "ood", "adapt", "validation", "profiles", "exposure", "slide_aggregation",
                "claims"}),
    ("foundations", {"io", "schema", "metrics", "probes", "registry", "devices", "logs"}),
]
LEVEL = {top: i for i, (_, tops) in enumerate(LAYERS) for top in tops}


def _top(module: str) -> str:
    return module.split(".")[1] if module.startswith("fmaudit.") else ""


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and n.level == 0]
    out += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return out


MODULES = sorted(p for p in SRC.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_run_downwards(path):
    rel = path.relative_to(SRC)
    own = rel.parts[0].removesuffix(".py")
    if own == "__init__":
        return
    assert own in LEVEL, f"{rel}: add its package to the layer table (README and this test)"
    for module in _imports(path):
        assert not module.startswith("snakemake"), f"{rel} imports {module}"
        top = _top(module)
        if top and top in LEVEL:
            assert LEVEL[top] >= LEVEL[own], f"{rel} ({LAYERS[LEVEL[own]][0]}) imports {module} ({LAYERS[LEVEL[top]][0]})"


def test_foundations_import_only_foundations():
    for path in MODULES:
        rel = path.relative_to(SRC)
        if rel.parts[0].removesuffix(".py") in LAYERS[-1][1]:
            tops = {_top(m) for m in _imports(path)} - {""}
            assert tops <= LAYERS[-1][1], f"{rel} imports {tops - LAYERS[-1][1]}"

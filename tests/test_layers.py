"""Imports run one way, downwards (docs/design.md#layers): no module imports a layer above its own, and nothing in
src/ imports snakemake."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fmaudit"

LAYERS = [  # top to bottom; a module may import its own layer and those below
    ("faces", {"cli", "commands"}),
    ("jobs", {"jobs"}),
    ("analyses", {"analyses"}),
    ("domain", {"config", "datasets", "slides", "embed", "encoders", "grid", "calibration", "stats", "report",
                "cells", "ood", "adapt", "split_checks", "preflight", "profiles", "exposure", "slide_aggregation",
                "claims", "cluster", "settings_reference", "costs"}),
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
    assert own in LEVEL, f"{rel}: add its package to the layer table (docs/design.md#layers and this test)"
    for module in _imports(path):
        assert not module.startswith("snakemake"), f"{rel} imports {module}"
        top = _top(module)
        if top and top in LEVEL:
            assert LEVEL[top] >= LEVEL[own], (f"{rel} ({LAYERS[LEVEL[own]][0]}) imports {module} "
                                              f"({LAYERS[LEVEL[top]][0]})")


def test_foundations_import_only_foundations():
    for path in MODULES:
        rel = path.relative_to(SRC)
        if rel.parts[0].removesuffix(".py") in LAYERS[-1][1]:
            tops = {_top(m) for m in _imports(path)} - {""}
            assert tops <= LAYERS[-1][1], f"{rel} imports {tops - LAYERS[-1][1]}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULE_PATHS = {_module_name(p): p for p in MODULES}


def _imported_modules(name: str, path: Path) -> set[str]:
    """fmaudit modules that ``name`` imports anywhere (module level or inside a function): ``from pkg import
    sub`` is an import of ``pkg.sub`` alone, ``from pkg import name`` of ``pkg``; relative imports resolved."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            subs = {f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULE_PATHS}
            out |= subs
            if module in MODULE_PATHS and len(subs) < len(node.names):
                out.add(module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in MODULE_PATHS}
    out.discard(name)
    return out


def test_no_import_cycles_function_local_imports_included():
    """A cycle hidden by a function-local import still means two modules that cannot be read apart; this walks
    every import statement of every module, in function bodies too, and names each cycle it finds."""
    graph = {name: _imported_modules(name, path) for name, path in MODULE_PATHS.items()}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _loaded(modules: list[str], libraries: tuple[str, ...]) -> list[str]:
    """Which of ``libraries`` a fresh interpreter has loaded after importing ``modules``."""
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted(k for k in {libraries!r} if k in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_modules_the_rules_import_load_no_torch_scipy_stats_or_scikit_learn():
    """Snakemake parses every rules file on every run, a dry run included: what they import must not load torch,
    the encoder libraries, scipy.stats or scikit-learn (0.2-1.4 s of CPU each per run; the jobs import what they
    use themselves). With scipy.stats and scikit-learn's model_selection loaded, a dry run of the demo took 3.1 s
    instead of 2.1 s."""
    root = Path(__file__).resolve().parents[1]
    modules = sorted({m for p in [root / "Snakefile", *(root / "rules").glob("*.smk")]
                      for m in re.findall(r"^from (fmaudit[\w.]*) import", p.read_text(), re.MULTILINE)})
    assert {"fmaudit.grid.ood", "fmaudit.preflight", "fmaudit.report"} <= set(modules), modules
    assert _loaded(modules, ("torch", "torchvision", "timm", "transformers", "open_clip", "scipy.stats",
                             "sklearn")) == []


def test_jobs_that_read_embeddings_back_load_no_torchvision():
    """The probe, OOD, prior-shift and cell shards and the report read embeddings back; they decode no image, so
    torchvision (1.1-1.4 s of CPU at each job's start, most of it torch._dynamo) must not load with them. The
    embedding jobs load it where they decode or build a transform (fmaudit.encoders.transforms)."""
    jobs = ["fmaudit.jobs.probe", "fmaudit.jobs.ood", "fmaudit.jobs.prior_shift", "fmaudit.jobs.cells",
            "fmaudit.jobs.report", "fmaudit.analyses.cell_suite", "fmaudit.analyses.prior_shift", "fmaudit.embed",
            "fmaudit.cells.features"]
    assert _loaded(jobs, ("torchvision", "timm", "transformers", "open_clip")) == []

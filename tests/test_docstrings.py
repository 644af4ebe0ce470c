"""Every public function, method and class of the library has a numpydoc docstring.

Public: a name without a leading underscore, in a module whose path has no component with one (``__init__.py``
counts as its package). A docstring is numpydoc when its sections are a title line underlined with dashes of its
length; it must have a ``Parameters`` section naming every parameter (``self`` and ``cls`` aside; ``*args`` and
``**kwargs`` by those spellings), and a ``Returns`` section (``Yields`` for a generator) when the function returns
a value. A class documents its constructor's parameters in its own docstring (numpydoc's convention); a dataclass
its fields, under ``Parameters`` or ``Attributes``. A property needs a summary only.

Failures are listed as ``path:line name: what is missing``, all at once, so one run shows the whole debt.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fmaudit"
SECTION = re.compile(r"^(?P<title>[A-Z][A-Za-z ]+)\n(?P<rule>-+)$", re.MULTILINE)
SKIPPED_DECORATORS = {"overload", "setter", "deleter"}


def public_modules() -> list[Path]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).parts
        if any(p.startswith("_") and p != "__init__.py" for p in parts):
            continue
        out.append(path)
    return out


def sections(doc: str) -> dict[str, str]:
    """The docstring's numpydoc sections, title -> body (the text up to the next section)."""
    found = [m for m in SECTION.finditer(doc) if len(m.group("rule")) == len(m.group("title"))]
    out = {}
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(doc)
        out[m.group("title")] = doc[m.end() : end]
    return out


def documented_names(body: str) -> set[str]:
    """The names a Parameters/Attributes section documents: ``name : type`` or ``name`` at the section's indent."""
    names: set[str] = set()
    for line in body.splitlines():
        if not line or line.startswith((" ", "\t")):
            continue
        head = line.split(" : ")[0].strip()
        for name in head.split(","):
            names.add(name.strip())
    return names


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    a = fn.args
    names = [p.arg for p in [*a.posonlyargs, *a.args]]
    if method and names and names[0] in ("self", "cls"):
        names = names[1:]
    names += [p.arg for p in a.kwonlyargs]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


def _own_nodes(fn: ast.AST):
    """The nodes of a function's body, not those of functions or classes nested in it."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def returns_value(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """'Yields' for a generator, 'Returns' for a function that returns a value, None otherwise."""
    nodes = list(_own_nodes(fn))
    if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in nodes):
        return "Yields"
    if any(isinstance(n, ast.Return) and n.value is not None and not _is_none(n.value) for n in nodes):
        return "Returns"
    return None


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _decorators(node) -> set[str]:
    out = set()
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        out.add(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return out


def _only_raises(fn) -> bool:
    body = [n for n in fn.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def check_function(fn, where: str, method: bool) -> list[str]:
    decorators = _decorators(fn)
    if decorators & SKIPPED_DECORATORS:
        return []
    doc = ast.get_docstring(fn)
    if not doc:
        return [f"{where}: no docstring"]
    if "property" in decorators or "cached_property" in decorators:
        return []
    problems = []
    found = sections(doc)
    names = parameters(fn, method)
    if names:
        if "Parameters" not in found:
            problems.append(f"{where}: no Parameters section (parameters {', '.join(names)})")
        else:
            missing = [n for n in names if n not in documented_names(found["Parameters"])]
            if missing:
                problems.append(f"{where}: Parameters does not name {', '.join(missing)}")
    kind = returns_value(fn)
    if kind and not _only_raises(fn) and kind not in found and not (kind == "Returns" and "Yields" in found):
        problems.append(f"{where}: no {kind} section")
    return problems


def check_class(cls: ast.ClassDef, where: str) -> list[str]:
    doc = ast.get_docstring(cls)
    if not doc:
        return [f"{where}: no docstring"]
    found = sections(doc)
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is not None:
        names = parameters(init, method=True)
        if names and "Parameters" not in found:
            return [f"{where}: no Parameters section for __init__ ({', '.join(names)})"]
        missing = [n for n in names if n not in documented_names(found.get("Parameters", ""))]
        return [f"{where}: Parameters does not name {', '.join(missing)}"] if missing else []
    if "dataclass" in _decorators(cls) or any(b for b in cls.bases if getattr(b, "id", "") == "NamedTuple"):
        fields = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
        fields = [f for f in fields if not f.startswith("_")]
        documented = documented_names(found.get("Parameters", "")) | documented_names(found.get("Attributes", ""))
        missing = [f for f in fields if f not in documented]
        if missing:
            return [f"{where}: Parameters/Attributes does not name {', '.join(missing)}"]
    return []


def module_problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    rel = path.relative_to(SRC.parents[1])
    problems = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            problems += check_function(node, f"{rel}:{node.lineno} {node.name}", method=False)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            problems += check_class(node, f"{rel}:{node.lineno} {node.name}")
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                    static = "staticmethod" in _decorators(item)
                    where = f"{rel}:{item.lineno} {node.name}.{item.name}"
                    problems += check_function(item, where, method=not static)
    return problems


@pytest.mark.parametrize("path", public_modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_public_functions_have_numpydoc_docstrings(path):
    problems = module_problems(path)
    assert not problems, f"{len(problems)} missing in {path.name}:\n" + "\n".join(problems)


def test_the_check_reads_numpydoc_sections():
    fn = ast.parse(
        'def f(a, b=1, *rest, c, **kw):\n    """Sum.\n\n    Parameters\n    ----------\n    a, b : int\n'
        '        Terms.\n    *rest\n        More.\n    c : int\n    **kw\n        Ignored.\n\n    Returns\n'
        '    -------\n    int\n    """\n    return a\n'
    ).body[0]
    assert check_function(fn, "f", method=False) == []
    bad = ast.parse('def g(a):\n    """Sum.\n\n    Parameters\n    ---\n    a : int\n    """\n    return a\n').body[0]
    expected = ["g: no Parameters section (parameters a)", "g: no Returns section"]
    assert check_function(bad, "g", method=False) == expected
    gen = ast.parse('def h():\n    """Count."""\n    yield 1\n').body[0]
    assert check_function(gen, "h", method=False) == ["h: no Yields section"]

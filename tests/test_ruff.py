"""`ruff check` is clean over the repository (the rules and per-file ignores in pyproject.toml), so a change that
brings an unused import, an undefined name or unsorted imports fails the tests as it fails `make lint`; and
`snakefmt --check` is clean over the workflow's files (pyproject.toml's [tool.snakefmt]: line length and the
house order of a rule's directives)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINTED = ["src", "tests", "scripts", "benchmarks"]  # as the Makefile's lint target


def _ruff() -> str:
    try:
        from ruff.__main__ import find_ruff_bin
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("ruff is missing (pyproject.toml's test extra pins it)")
        pytest.skip("ruff is not installed (pip install -c constraints.txt ruff)")
    return os.fsdecode(find_ruff_bin())


def test_ruff_check_is_clean():
    proc = subprocess.run([_ruff(), "check", "--no-cache", *LINTED], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_snakefmt_check_is_clean():
    snakefmt = Path(sys.executable).with_name("snakefmt")
    if not snakefmt.exists():
        if os.environ.get("CI"):
            pytest.fail("snakefmt is missing (pyproject.toml's test extra pins it)")
        pytest.skip("snakefmt is not installed (pip install -c constraints.txt snakefmt)")
    proc = subprocess.run([str(snakefmt), "--check", "Snakefile", "rules"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

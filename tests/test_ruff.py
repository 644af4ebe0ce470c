"""`ruff check` is clean over the repository (the rules and per-file ignores in pyproject.toml), so a change that
brings an unused import, an undefined name or unsorted imports fails the tests as it fails `make lint`."""

from __future__ import annotations

import os
import subprocess
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

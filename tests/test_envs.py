"""The conda environments of the rules (envs/*.yaml) pin exactly what constraints.txt pins, so a job run with
--use-conda gets the versions the tests ran with; and every package the project depends on is pinned there."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ENVS = sorted((REPO / "envs").glob("*.yaml"))
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)$")


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = PIN.match(line)
            assert match, f"constraints.txt: {line!r} is not a name==version pin"
            pins[_name(match.group(1))] = match.group(2)
    return pins


def _pip_pins(env: Path) -> list[str]:
    deps = yaml.safe_load(env.read_text())["dependencies"]
    return [p for d in deps if isinstance(d, dict) for p in d.get("pip", [])]


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_every_env_pins_what_constraints_pins(env):
    constraints = _constraints()
    for pin in _pip_pins(env):
        match = PIN.match(pin)
        assert match, f"{env.name}: {pin!r} is not pinned as name==version"
        name, version = _name(match.group(1)), match.group(2)
        assert name in constraints, f"{env.name}: {name} is not in constraints.txt"
        assert constraints[name] == version, f"{env.name}: {name}=={version}, constraints.txt has {constraints[name]}"
    conda = [d for d in yaml.safe_load(env.read_text())["dependencies"] if isinstance(d, str)]
    assert "python=3.11" in conda, f"{env.name}: the Python the project runs on (pyproject requires-python)"


def test_every_dependency_of_the_project_is_pinned():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project.get("optional-dependencies", {}).values()
                                              for r in extra]
    names = {_name(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in requirements}
    missing = names - set(_constraints())
    assert not missing, f"pyproject.toml depends on {sorted(missing)}, which constraints.txt does not pin"

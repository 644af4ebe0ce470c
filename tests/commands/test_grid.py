"""`fmaudit grid`: counts of a config's runs and jobs, as a table or JSON."""

import json

from fmaudit.cli import main
from fmaudit.schema import REPO_ROOT


def test_grid_json_counts_the_demo(capsys):
    assert main(["grid", "--configfile", str(REPO_ROOT / "config.yaml"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    fits = [r for r in rows if r["analysis"] == "probe" and r["protocol"].startswith("fits")][0]
    assert fits["runs"] == 4 * 3 * 1 * 2 * 2  # encoders × domains × heads × fractions × seeds
    assert fits["planned"] is True


def test_grid_table_and_a_missing_config(tmp_path, capsys):
    assert main(["grid", "--configfile", str(REPO_ROOT / "config.yaml")]) == 0
    out = capsys.readouterr().out
    assert "fits (in-domain)" in out and "encoder x dataset" in out
    assert main(["grid", "--configfile", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err

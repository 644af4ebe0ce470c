"""``fmaudit cells register`` and ``fmaudit cells demo`` on the command line."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from fmaudit.cli import main as cli_main
from fmaudit.io import read_provenance
from xenium_utils import make_section


def test_register_writes_one_row_per_cell(tmp_path, capsys):
    sec = make_section(tmp_path / "s", n=15, labels=["Fibroblast", "B cell", "Tumour cell"])
    out = tmp_path / "cells.parquet"
    argv = ["cells", "register", "--bundle", str(sec.bundle), "--he-image", str(sec.he_image),
            "--alignment", str(sec.alignment), "--out", str(out)]
    assert cli_main(argv + ["--cell-types", str(sec.cell_types), "--manifest", str(tmp_path / "m.parquet"),
                            "--qc", str(tmp_path / "qc.png"), "--min-cells-per-class", "2"]) == 0
    assert "wrote 15 cells" in capsys.readouterr().out
    got = pd.read_parquet(out)
    assert list(got.columns) == ["cell_id", "he_x", "he_y", "centre_source", "label"]
    truth = sec.truth.set_index("cell_id").loc[got["cell_id"]]
    assert np.hypot(got["he_x"] - truth["painted_x"].to_numpy(), got["he_y"] - truth["painted_y"].to_numpy()).max() < 1
    assert got["label"].tolist() == truth["label"].tolist()
    assert read_provenance(out)["counts"]["cells_registered"] == 15
    assert pd.read_parquet(tmp_path / "m.parquet")["label_fine_name"].notna().all() and (tmp_path / "qc.png").exists()
    # without annotations: no label column; csv output
    assert cli_main(argv[:-1] + [str(tmp_path / "cells.csv")]) == 0
    assert list(pd.read_csv(tmp_path / "cells.csv").columns) == ["cell_id", "he_x", "he_y", "centre_source"]


def test_register_errors_exit_2_with_the_file_named(tmp_path, capsys):
    sec = make_section(tmp_path / "s", n=4)
    bad = tmp_path / "bad.csv"
    bad.write_text("1,0,0\n0,0,0\n0,0,1\n")
    code = cli_main(["cells", "register", "--bundle", str(sec.bundle), "--he-image", str(sec.he_image),
                     "--alignment", str(bad), "--out", str(tmp_path / "x.parquet")])
    err = capsys.readouterr().err
    assert code == 2 and "bad.csv" in err and "singular" in err
    assert not (tmp_path / "x.parquet").exists()


def test_demo_command(tmp_path, capsys):
    assert cli_main(["cells", "demo", "--out", str(tmp_path), "--sections", "2", "--organs", "gut,lung",
                     "--window-px", "384", "--max-cells", "40"]) == 0
    sections = json.loads(capsys.readouterr().out)
    assert list(sections) == ["gut-1", "lung-1"] and sections["lung-1"]["organ"] == "lung"
    out = tmp_path / "r.parquet"
    s = sections["gut-1"]
    assert cli_main(["cells", "register", "--bundle", s["bundle"], "--he-image", s["he_image"], "--alignment",
                     s["alignment"], "--cell-types", s["cell_types"], "--out", str(out)]) == 0
    assert len(pd.read_parquet(out)) == 40

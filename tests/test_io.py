"""Atomic writes, table and array formats, feature files brought from elsewhere."""

import json
import os

import h5py
import numpy as np
import pandas as pd
import pytest

from fmaudit import io


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.parquet"
    with pytest.raises(RuntimeError):
        with io.atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_path_replaces_existing_file_only_on_success(tmp_path):
    target = tmp_path / "x.txt"
    target.write_text("old")
    with pytest.raises(ValueError):
        with io.atomic_path(target) as tmp:
            tmp.write_text("new")
            raise ValueError
    assert target.read_text() == "old"
    io.write_text(target, "new")
    assert target.read_text() == "new"


@pytest.mark.parametrize("ext", [".parquet", ".csv", ".tsv"])
def test_table_roundtrip(tmp_path, ext):
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"], "c": [0.5, np.nan]})
    io.write_table(tmp_path / f"t{ext}", df)
    back = io.read_table(tmp_path / f"t{ext}")
    pd.testing.assert_frame_equal(back, df, check_dtype=False)


def test_parquet_provenance_roundtrip(tmp_path):
    io.write_table(tmp_path / "t.parquet", pd.DataFrame({"a": [1]}), provenance={"encoder_config_hash": "abc", "n": 3})
    assert io.read_provenance(tmp_path / "t.parquet") == {"encoder_config_hash": "abc", "n": 3}


def test_markdown_table_escapes_pipes_and_formats_floats():
    md = io.dataframe_to_markdown(pd.DataFrame({"name": ["a|b"], "v": [0.12345]}))
    assert "a\\|b" in md and "0.123" in md
    assert md.splitlines()[1] == "| --- | --- |"


def test_unknown_extension_is_named(tmp_path):
    with pytest.raises(io.FmauditInputError, match=r"t\.xls"):
        io.write_table(tmp_path / "t.xls", pd.DataFrame({"a": [1]}))


def test_npz_roundtrip_with_provenance(tmp_path):
    io.write_npz(tmp_path / "e.npz", {"item_id": np.array(["a", "b"]), "feat__cls": np.ones((2, 3), np.float32)},
                 provenance={"encoder": "x"})
    arrays, prov = io.read_npz(tmp_path / "e.npz")
    assert prov == {"encoder": "x"}
    assert arrays["feat__cls"].shape == (2, 3) and list(arrays["item_id"]) == ["a", "b"]


def test_truncated_npz_is_a_clear_error(tmp_path):
    io.write_npz(tmp_path / "e.npz", {"x": np.arange(1000)})
    blob = (tmp_path / "e.npz").read_bytes()
    (tmp_path / "bad.npz").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(io.FmauditInputError, match="bad.npz"):
        io.read_npz(tmp_path / "bad.npz")


def test_load_feature_array_formats(tmp_path):
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.save(tmp_path / "f.npy", x)
    np.savez(tmp_path / "f.npz", features=x, other=np.zeros(2))
    np.savez(tmp_path / "g.npz", emb=x, other=np.zeros(2))
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["features"] = x[None]  # CLAM/TRIDENT style (1, N, D)
        f["coords"] = np.zeros((5, 2))
    for name in ("f.npy", "f.npz", "f.h5"):
        np.testing.assert_array_equal(io.load_feature_array(tmp_path / name), x)
    np.testing.assert_array_equal(io.load_feature_array(tmp_path / "g.npz", key="emb"), x)
    with pytest.raises(io.FmauditInputError, match="choose an array"):
        io.load_feature_array(tmp_path / "g.npz")
    with pytest.raises(io.FmauditInputError, match="no dataset 'feats'"):
        io.load_feature_array(tmp_path / "f.h5", key="feats")
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        io.load_feature_array(tmp_path / "missing.npy")


def test_hashes_are_stable_and_content_sensitive(tmp_path):
    assert io.stable_hash({"b": 1, "a": [1, 2]}) == io.stable_hash({"a": [1, 2], "b": 1})
    a = pd.DataFrame({"x": [1, 2]})
    assert io.dataframe_hash(a) == io.dataframe_hash(a.copy())
    assert io.dataframe_hash(a) != io.dataframe_hash(pd.DataFrame({"x": [2, 1]}))
    (tmp_path / "f").write_bytes(b"abc")
    assert io.sha256_file(tmp_path / "f") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_provenance_has_version():
    prov = io.provenance(encoder="e")
    assert prov["encoder"] == "e" and prov["fmaudit_version"]
    json.dumps(prov)


def test_atomic_write_has_normal_permissions(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        io.write_text(tmp_path / "p.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "p.txt").stat().st_mode) == 0o644


def test_npz_provenance_alone(tmp_path):
    io.write_npz(tmp_path / "e.npz", {"x": np.zeros((3, 2))}, provenance={"encoder": "x", "n_items": 3})
    assert io.read_npz_provenance(tmp_path / "e.npz") == {"encoder": "x", "n_items": 3}
    io.write_npz(tmp_path / "bare.npz", {"x": np.zeros(2)})
    assert io.read_npz_provenance(tmp_path / "bare.npz") == {}
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(io.FmauditInputError, match="bad.npz"):
        io.read_npz_provenance(tmp_path / "bad.npz")


KILLED_WRITER = """
import os, signal, sys
import numpy as np
from fmaudit import io

with io.atomic_path(sys.argv[1], suffix=".npz") as tmp:
    with open(tmp, "wb") as fh:
        np.savez(fh, x=np.zeros(1000))
    print(tmp, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # as a job killed by Slurm or the OOM killer: no cleanup runs
"""


def test_a_killed_writes_temp_file_is_cleaned_by_the_next_write(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    target = tmp_path / "emb" / "demo-tiles.npz"
    src = Path(io.__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(target)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == -9, done.stderr
    leftover = Path(done.stdout.strip())
    assert leftover.exists() and leftover.name.startswith(".demo-tiles.npz.") and leftover.name.endswith(".tmp.npz")
    assert not target.exists()
    # leftovers of this target from another host and from before writers were named go too; a live
    # writer's file (this process) and other targets' files stay
    foreign = target.parent / ".demo-tiles.npz.node07-4242.abcd1234.tmp.npz"
    legacy = target.parent / ".demo-tiles.npz.k3j_9x0a.tmp.npz"
    live = target.parent / f".demo-tiles.npz.{io._HOST}-{os.getpid()}.zzzzzzzz.tmp.npz"
    other = target.parent / ".demo-cells.npz.node07-4242.abcd1234.tmp.npz"
    for p in (foreign, legacy, live, other):
        p.write_bytes(b"partial")
    io.write_npz(target, {"x": np.ones(3)}, {"k": 1})
    assert not leftover.exists() and not foreign.exists() and not legacy.exists()
    assert live.exists() and other.exists()
    arrays, prov = io.read_npz(target)
    assert arrays["x"].tolist() == [1, 1, 1] and prov == {"k": 1}
    assert sorted(p.name for p in target.parent.iterdir()) == sorted(
        [target.name, live.name, other.name])


def test_table_writes_clean_their_own_leftovers_too(tmp_path):
    target = tmp_path / "runs.parquet"
    stale = tmp_path / ".runs.parquet.deadhost-1.abcdefgh.tmp.parquet"
    stale.write_bytes(b"x")
    io.write_table(target, pd.DataFrame({"a": [1]}))
    assert not stale.exists()
    assert io.remove_stale_temps(tmp_path / "missing" / "x.npz") == []

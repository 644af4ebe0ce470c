"""The embedding job: a manifest embedded by a demo encoder through the engine, with its log; a missing
weights override names the file."""

import numpy as np
import pytest
from PIL import Image

from fmaudit.datasets.manifest import make_manifest
from fmaudit.io import FmauditInputError, read_npz, write_table
from fmaudit.registry import get_encoder_spec


def _manifest(tmp_path, n=5):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        path = tmp_path / f"img_{i}.png"
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(path)
        rows.append({"dataset": "toy", "item_id": f"toy_{i}", "source": str(path), "label": i % 2,
                     "label_name": f"c{i % 2}", "group": f"p{i}", "domain": "a"})
    out = tmp_path / "toy.parquet"
    write_table(out, make_manifest(rows))
    return out


def test_embed_job_embeds_every_item_and_logs(tmp_path):
    from fmaudit.jobs.embed import embed_job

    spec = get_encoder_spec("demo-convnet")
    out = tmp_path / "emb" / "demo-convnet" / "toy.npz"
    embed_job("demo-convnet", spec, str(_manifest(tmp_path)), str(out), weights=None, batch_size=2, threads=1,
              log=str(tmp_path / "embed.log"))
    arrays, prov = read_npz(out)
    assert arrays["item_id"].tolist() == [f"toy_{i}" for i in range(5)]
    for readout in spec["readouts"]:
        assert arrays[f"feat__{readout}"].shape[0] == 5 and np.isfinite(arrays[f"feat__{readout}"]).all()
    assert prov["encoder"] == "demo-convnet" and prov["n_items"] == 5
    assert "embedding 5 items" in (tmp_path / "embed.log").read_text()


def test_embed_job_with_a_missing_weights_file_names_it(tmp_path):
    from fmaudit.jobs.embed import embed_job

    # (the workflow checks encoder_weights when it loads the config; called directly, the job names the file)
    with pytest.raises((FmauditInputError, FileNotFoundError), match="nowhere.safetensors"):
        embed_job("demo-convnet", get_encoder_spec("demo-convnet"), str(_manifest(tmp_path, 2)),
                  str(tmp_path / "out.npz"), weights=str(tmp_path / "nowhere.safetensors"), batch_size=2, threads=1)
    assert not (tmp_path / "out.npz").exists()


def test_embed_job_refuses_a_path_whose_key_is_not_its_settings(tmp_path):
    from fmaudit.jobs.embed import embed_job
    from fmaudit.registry import embedding_key, embedding_spec

    spec = embedding_spec(get_encoder_spec("demo-convnet"))
    assert "description" not in spec and "licence" not in spec  # what the workflow passes: numbers only
    out = tmp_path / "emb" / "demo-convnet" / "000000000000" / "toy.npz"
    with pytest.raises(FmauditInputError, match=f"embedding key in its path is 000000000000, but .* has key "
                                                f"{embedding_key(spec)}"):
        embed_job("demo-convnet", spec, str(_manifest(tmp_path, 2)), str(out), weights=None, batch_size=2,
                  threads=1, key="000000000000")
    assert not out.exists()
    good = tmp_path / "emb" / "demo-convnet" / embedding_key(spec) / "toy.npz"
    embed_job("demo-convnet", spec, str(_manifest(tmp_path, 2)), str(good), weights=None, batch_size=2, threads=1,
              key=embedding_key(spec))
    assert read_npz(good)[1]["embedding_key"] == embedding_key(spec)

"""A tiny task through the job functions, without Snakemake: a demo manifest, hand-made embeddings of two
"encoders" (features that carry the label, one noisier), probe shards, their aggregate and the report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fmaudit.config import fill_section
from fmaudit.io import read_table, write_npz

DEMO_ENTRY = {"preparer": "demo_tiles", "group_unit": "patient",
              "params": {"seed": 0, "image_size": 32, "n_patients_per_domain": 4, "tiles_per_patient_per_class": 2,
                         "n_domains": 2}}
TASK = {"datasets": ["demo-tiles"], "domains": ["scanner-a", "scanner-b"], "transfer": True, "split": "manifest"}
PROBE = fill_section("probe", {"fractions": [0.5, 1.0], "seeds": [0, 1], "readout": "cls"})
CALIBRATION = fill_section("calibration", {"kshot_k": [4], "kshot_draws": 2, "ece_bins": 10})
BOOTSTRAP = fill_section("bootstrap", {"n_boot": 30, "seed": 0, "paired_n_boot": 40})


def fake_embeddings(manifest_path: Path, out: Path, noise: float, seed: int) -> Path:
    """An fmaudit embeddings file whose ``cls`` features are class means plus noise."""
    man = read_table(manifest_path)
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=2.0, size=(5, 8))
    labels = man["label"].to_numpy().astype(int)
    feats = (means[labels] + rng.normal(scale=noise, size=(len(man), 8))).astype(np.float32)
    write_npz(out, {"item_id": np.asarray(man["item_id"].astype(str), dtype=str), "feat__cls": feats},
              {"encoder": out.parent.name, "encoder_config_hash": f"hash-{seed}", "n_items": len(man),
               "readouts": ["cls"], "embed_dim": {"cls": 8}})
    return out


@pytest.fixture(scope="package")
def job_chain(tmp_path_factory):
    """Paths of every file the jobs wrote, by name."""
    from fmaudit.jobs.data import prepare_manifest_job
    from fmaudit.jobs.probe import aggregate_job, probe_shard_job
    from fmaudit.jobs.report import report_job

    root = tmp_path_factory.mktemp("jobs")
    paths = {"manifest": root / "manifests" / "demo-tiles.parquet", "data_root": root / "data"}
    prepare_manifest_job("demo-tiles", DEMO_ENTRY, str(paths["data_root"]), str(paths["manifest"]),
                         log=str(root / "logs" / "manifest.log"))
    runs = []
    for i, (encoder, noise) in enumerate((("enc-a", 1.0), ("enc-b", 3.0))):
        emb = fake_embeddings(paths["manifest"], root / "embeddings" / encoder / "demo-tiles.npz", noise, seed=i)
        out_runs = root / "shards" / f"{encoder}.runs.parquet"
        out_preds = root / "shards" / f"{encoder}.predictions.parquet"
        probe_shard_job(encoder, "demo", TASK, [str(paths["manifest"])], [str(emb)], PROBE, CALIBRATION,
                        BOOTSTRAP, str(out_runs), str(out_preds), log=str(root / "logs" / f"{encoder}.log"))
        runs.append(out_runs)
        paths[f"embeddings_{encoder}"], paths[f"runs_{encoder}"], paths[f"predictions_{encoder}"] = (
            emb, out_runs, out_preds)
    paths["aggregate"] = root / "aggregate" / "probe_runs.parquet"
    aggregate_job([str(p) for p in runs], str(paths["aggregate"]), log=str(root / "logs" / "aggregate.log"))
    paths["report"] = root / "report"
    inputs = {"probe_runs": [str(paths["aggregate"])],
              "probe_predictions": [str(paths[f"predictions_{e}"]) for e in ("enc-a", "enc-b")],
              "embeddings": [str(paths[f"embeddings_{e}"]) for e in ("enc-a", "enc-b")]}
    report_job(inputs, {"calibration": {"demo": CALIBRATION}, "bootstrap": {"demo": BOOTSTRAP}}, str(paths["report"]),
               log=str(root / "logs" / "report.log"))
    paths["logs"] = root / "logs"
    return paths

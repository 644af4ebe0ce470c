"""Throughput of the full embedding path against the bare model forward, measured in the same process.

Full path: ``fmaudit.embed.embed_manifest`` on N generated PNG tiles (PIL decode + the encoder's transform +
DataLoader + model + chunk writes); its images/s is the one recorded in the output's provenance (the loop
only, encoder build excluded). Baseline: the same encoder's forward on the same images already decoded,
transformed and stacked into tensors, with the same batch size and thread count. Each side is run
``--repeats`` times and the best run is kept (these machines are shared and noisy).

    .venv/bin/python benchmarks/bench_embed.py --encoder demo-vit-tiny -n 600 --num-workers 0

prints both rates and ``loader/forward ratio = X`` (goal >= 0.9: the loader should keep the model busy).
``--random-weights`` runs a real entry's architecture with random weights (e.g. ``--encoder lunit-dino-vits8
--size 224``), to see the ratio where the model, not PNG decoding, dominates.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fmaudit.datasets.manifest import make_manifest
from fmaudit.embed import ItemDataset, embed_manifest
from fmaudit.encoders import build_encoder
from fmaudit.registry import get_encoder_spec


def make_images(folder: Path, n: int, size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        path = folder / f"tile_{i:05d}.png"
        # smooth-ish content compresses like tissue tiles rather than like white noise
        base = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        img = Image.fromarray(base).resize((size, size), Image.BILINEAR)
        img.save(path)
        rows.append({"dataset": "bench", "item_id": f"tile_{i:05d}", "source": str(path), "group": f"g{i % 10}",
                     "domain": "d"})
    return make_manifest(rows)


def forward_rate(encoder, batches: list[torch.Tensor]) -> float:
    n = sum(len(b) for b in batches)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            encoder(batch)
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", default="demo-vit-tiny")
    parser.add_argument("-n", type=int, default=600, help="number of generated images")
    parser.add_argument("--size", type=int, default=64, help="side of the generated images in pixels")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--random-weights", action="store_true",
                        help="random-init a real entry's architecture (measures its cost without its weights)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    spec = get_encoder_spec(args.encoder)
    if args.random_weights:
        spec["weights"] = {"source": "random", "seed": 0}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        manifest = make_images(tmp_path, args.n, args.size)

        encoder = build_encoder(spec)
        dataset = ItemDataset(manifest, encoder.transform)
        tensors = torch.stack([dataset[i][1] for i in range(len(dataset))])
        batches = list(torch.split(tensors, args.batch_size))
        forward_rate(encoder, batches[:2])  # warm-up: first-call allocations

        full, bare = [], []
        for r in range(args.repeats):
            bare.append(forward_rate(encoder, batches))
            prov = embed_manifest(manifest, spec, tmp_path / f"run{r}.npz", batch_size=args.batch_size,
                                  num_workers=args.num_workers, device="cpu", num_threads=args.threads)
            full.append(prov["images_per_s"])
        best_full, best_bare = max(full), max(bare)
        print(f"encoder {args.encoder}, {args.n} images of {args.size} px, batch {args.batch_size}, "
              f"{args.num_workers} worker(s), {args.threads} thread(s), best of {args.repeats}")
        print(f"full embed path (dataset + DataLoader + model): {best_full:8.1f} images/s  (runs: "
              + ", ".join(f"{x:.0f}" for x in full) + ")")
        print(f"bare model forward on preprocessed tensors:     {best_bare:8.1f} images/s  (runs: "
              + ", ".join(f"{x:.0f}" for x in bare) + ")")
        print(f"loader/forward ratio = {best_full / best_bare:.2f}")


if __name__ == "__main__":
    main()

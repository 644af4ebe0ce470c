"""Benchmark: images/s per DataLoader worker of the embedding path's decode, against the bare decode.

Inputs (written on the spot, nothing downloaded): ``-n`` tiles each of JPEG 224, JPEG 256, PNG 224 and PNG 256
px (smooth random content, compressing like tissue rather than like noise; JPEG quality 90), and ``-n``
``read_region`` tiles of 224 px at level 0 of the real slide resources/data/CMU-1-Small-Region.svs (openslide,
on a grid).

For each set, on one CPU thread per process:
- bare decode: a loop over the files in this process: JPEG by torchvision's ``decode_jpeg`` and by PIL, PNG by
  PIL and by torchvision (``decode_png``), each to a uint8 array; slide tiles by openslide ``read_region`` to
  RGB. The faster JPEG and PNG decoders are the ones the embedding path uses (their pixels are equal);
- the real path: ``fmaudit.embed.ItemDataset`` over a manifest of the same items, in a ``DataLoader`` with
  ONE worker process and batches of ``--batch-size`` (the main process only receives the batches), with the
  worker transform of each device: CPU (decode, PIL resize and crop of the ViT-L/16 entry ``--encoder``'s
  preprocessing: ``PixelTransform``) and GPU (decode only: ``DecodeOnly``; the device resizes and normalises,
  ``DevicePreprocess``).

Printed per set: bare images/s, each path's images/s per worker and its ratio to the bare decode. Then how
many such workers an H200's ViT-L/16 bf16 forward needs: the forward rate is an assumption here (no GPU):
its FLOPs per 224-px image (2 x multiply-adds of the patch embedding, 24 blocks of attention and MLP, 197
tokens) at ``--mfu`` of the H200's dense bf16 peak (``--peak-tflops``); benchmarks/gpu_check.sh measures the
real forward on an H200.

Run: ``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bench_loader.py [-n 400] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import openslide
import pandas as pd
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.io import decode_jpeg, decode_png, read_file

from fmaudit.datasets.manifest import make_manifest
from fmaudit.embed import ItemDataset
from fmaudit.encoders import resolve_data_config
from fmaudit.encoders.transforms import DecodeOnly, PixelTransform, collate_pixels
from fmaudit.registry import get_encoder_spec

REPO = Path(__file__).resolve().parents[1]
SLIDE = REPO / "resources" / "data" / "CMU-1-Small-Region.svs"
warnings.filterwarnings("ignore", message="The image decoding", category=DeprecationWarning)


def write_tiles(folder: Path, n: int, size: int, suffix: str, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        base = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        image = Image.fromarray(base).resize((size, size), Image.BILINEAR)
        path = folder / f"tile_{i:05d}.{suffix}"
        image.save(path, quality=90) if suffix == "jpg" else image.save(path)
        paths.append(path)
    return paths


def slide_positions(n: int, size: int = 224) -> list[tuple[int, int]]:
    with openslide.OpenSlide(str(SLIDE)) as slide:
        width, height = slide.dimensions
    grid = [(x, y) for y in range(0, height - size, size) for x in range(0, width - size, size)]
    return [grid[i % len(grid)] for i in range(n)]


def manifest_of(paths=None, positions=None, size: int = 224) -> pd.DataFrame:
    rows = []
    for i, path in enumerate(paths or []):
        rows.append({"dataset": "bench", "item_id": f"f{i}", "source": str(path), "label": 0, "label_name": "c",
                     "group": "g", "domain": "a"})
    for i, (x, y) in enumerate(positions or []):
        rows.append({"dataset": "bench", "item_id": f"s{i}", "source": str(SLIDE), "x": x, "y": y, "level": 0,
                     "size": size, "label": 0, "label_name": "c", "group": "g", "domain": "a"})
    return make_manifest(rows)


def rate(fn, n_items: int, repeats: int) -> float:
    fn()  # warm the page cache and the decoders
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return n_items / statistics.median(times)


def bare_decoders(paths, positions):
    """name -> loop decoding every item once in this process."""
    if positions:
        def read_regions():
            with openslide.OpenSlide(str(SLIDE)) as slide:
                for x, y in positions:
                    np.asarray(slide.read_region((x, y), 0, (224, 224)).convert("RGB"))
        return {"openslide read_region": read_regions}

    def pil():
        for p in paths:
            with Image.open(p) as im:
                np.asarray(im.convert("RGB"))

    def torchvision_decode():
        decode = decode_jpeg if paths[0].suffix == ".jpg" else decode_png
        for p in paths:
            decode(read_file(str(p))).numpy()

    return {"PIL": pil, "torchvision": torchvision_decode}


def loader_rate(manifest: pd.DataFrame, transform, batch_size: int, repeats: int, collate=None) -> float:
    """images/s of ItemDataset through a DataLoader with one worker process."""
    def run():
        dataset = ItemDataset(manifest, transform)
        loader = DataLoader(dataset, batch_size=batch_size, num_workers=1, collate_fn=collate,
                            worker_init_fn=lambda _: torch.set_num_threads(1))
        for _ in loader:
            pass
    return rate(run, len(manifest), repeats)


def vit_l16_flops(tokens: int = 197, width: int = 1024, depth: int = 24, mlp: int = 4096, patch: int = 16) -> float:
    """Forward FLOPs of one ViT-L/16 image (2 per multiply-add): patch embedding, then per block the qkv and
    output projections, attention scores and mixing, and the MLP."""
    embed = 2 * (tokens - 1) * (3 * patch * patch) * width
    block = 2 * tokens * width * (3 * width + width + 2 * mlp) + 2 * 2 * tokens * tokens * width
    return embed + depth * block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=400, help="items per set")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--encoder", default="uni", help="a ViT-L/16 entry whose preprocessing the workers apply")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="H200 dense bf16 peak (TFLOP/s)")
    parser.add_argument("--mfu", type=float, default=0.5, help="assumed share of the peak the forward reaches")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data_config = resolve_data_config(get_encoder_spec(args.encoder))
    print(f"load average at start {os.getloadavg()}; {args.n} items per set; one worker, batches of "
          f"{args.batch_size}; worker transforms of {args.encoder!r} ({data_config['input_size']} px, resize "
          f"{data_config['resize_size']}, {data_config['interpolation']}, crop {data_config['crop']})")
    cpu_transform, gpu_transform = PixelTransform(data_config), DecodeOnly()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-loader.") as tmp:
        sets = {f"{kind} {size}": (write_tiles(Path(tmp) / f"{kind}{size}", args.n, size, suffix), None)
                for kind, suffix in (("JPEG", "jpg"), ("PNG", "png")) for size in (224, 256)}
        sets["slide read_region 224"] = (None, slide_positions(args.n))
        for name, (paths, positions) in sets.items():
            bare = {decoder: rate(fn, args.n, args.repeats) for decoder, fn in bare_decoders(paths, positions).items()}
            best = max(bare, key=bare.get)
            manifest = manifest_of(paths, positions)
            cpu = loader_rate(manifest, cpu_transform, args.batch_size, args.repeats)
            gpu = loader_rate(manifest, gpu_transform, args.batch_size, args.repeats, collate=collate_pixels)
            rows.append({"set": name, **{f"bare {d} img/s": round(v, 1) for d, v in bare.items()},
                         "fastest": best, "CPU path img/s per worker": round(cpu, 1),
                         "CPU path / bare": round(cpu / bare[best], 2), "GPU path img/s per worker": round(gpu, 1),
                         "GPU path / bare": round(gpu / bare[best], 2)})
            print(f"{name}: bare {', '.join(f'{d} {v:.0f}' for d, v in bare.items())} img/s; path per worker: CPU "
                  f"{cpu:.0f} img/s ({cpu / bare[best]:.2f}x bare {best}), GPU (decode only) {gpu:.0f} img/s "
                  f"({gpu / bare[best]:.2f}x)")
    table = pd.DataFrame(rows)
    print()
    print(table.to_string(index=False))
    flops = vit_l16_flops()
    forward = args.mfu * args.peak_tflops * 1e12 / flops
    print(f"\nH200 ViT-L/16 bf16 forward, assumed: {flops / 1e9:.1f} GFLOP per 224-px image at {args.mfu:.0%} of "
          f"{args.peak_tflops:g} TFLOP/s -> {forward:,.0f} images/s (benchmarks/gpu_check.sh measures it)")
    for _, row in table.iterrows():
        per_worker = row["GPU path img/s per worker"]
        print(f"  {row['set']}: {math.ceil(forward / per_worker)} workers at {per_worker:.0f} img/s each (GPU path: "
              f"the device resizes and normalises); {math.ceil(forward / row['CPU path img/s per worker'])} with "
              f"the CPU path's resizing workers")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()

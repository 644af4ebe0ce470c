"""The GPU check (run by benchmarks/gpu_check.sh): what an H200 does with fmaudit's GPU work, in one command.

Needs no network: the ViT-L/16 is timm's architecture with random weights, the tiles are JPEGs written on
the spot, the cell panel is simulated. Steps, each printed as it finishes:

1. ViT-L/16 bf16 forward (``vit_large_patch16_224``, random init, autocast bfloat16, inference mode): images/s
   over a batch sweep, against its FLOP limit (the forward's FLOPs per image at the device's dense bf16 peak,
   ``--peak-tflops``), and the share of the peak reached.
2. The full embedding path (``fmaudit.embed.embed_manifest``: manifest rows, JPEG decoding in ``--workers``
   DataLoader workers, resize and normalisation on the device, the model, chunk writes) on the registry's
   ViT-L/16 entry ``--encoder`` with random weights: its images/s and the loader/forward ratio (against the
   step-1 forward at the same batch size).
3. The probe engine on the device against scikit-learn on this machine's CPUs (sequential and in
   ``--processes`` processes, the faster), each at equal accuracy: the PRISM tile grid
   (benchmarks/bench_probe_engine.py) and a CellPath IS shard (benchmarks/bench_cell_shard.py baseline).
4. Peak GPU memory of each step (``torch.cuda.max_memory_allocated``).

``--dry`` runs every step at toy size on the CPU (a tiny ViT, 16 tiles, a small grid and panel), so the
suite checks that this script works on any machine (tests/test_gpu_check.py); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_cell_shard  # (benchmarks/ is not a package: the sibling scripts by path)
import bench_probe_engine
from fmaudit.datasets.manifest import make_manifest
from fmaudit.embed import embed_manifest
from fmaudit.registry import get_encoder_spec


def vit_flops(model, image_size: int) -> float:
    """Forward FLOPs of one image (2 per multiply-add): patch embedding, then per block the qkv and output
    projections, attention scores and mixing, and the MLP."""
    width = model.embed_dim
    patch = model.patch_embed.patch_size[0]
    tokens = (image_size // patch) ** 2 + model.num_prefix_tokens
    mlp = model.blocks[0].mlp.fc1.out_features
    embed = 2 * (image_size // patch) ** 2 * 3 * patch * patch * width
    block = 2 * tokens * width * (4 * width + 2 * mlp) + 4 * tokens * tokens * width
    return embed + len(model.blocks) * block


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_memory(device: torch.device) -> str:
    if device.type != "cuda":
        return "n/a (CPU)"
    return f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"


def forward_sweep(args, device) -> dict[int, float]:
    name, size = ("vit_tiny_patch16_224", 32) if args.dry else ("vit_large_patch16_224", 224)
    model = timm.create_model(name, pretrained=False, num_classes=0, img_size=size).eval().to(device)
    flops = vit_flops(model, size)
    limit = args.peak_tflops * 1e12 / flops
    autocast = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device.type == "cuda" \
        else contextlib.nullcontext()
    print(f"[1] {name} forward, {flops / 1e9:.1f} GFLOP per {size}-px image; FLOP limit at {args.peak_tflops:g} "
          f"TFLOP/s: {limit:,.0f} images/s")
    rates = {}
    for batch in args.batches:
        x = torch.randn(batch, 3, size, size, device=device)
        with torch.inference_mode(), autocast:
            for _ in range(args.warmup):
                model(x)
            synchronize(device)
            start = time.perf_counter()
            for _ in range(args.iterations):
                model(x)
            synchronize(device)
        rates[batch] = batch * args.iterations / (time.perf_counter() - start)
        print(f"    batch {batch:4d}: {rates[batch]:9,.0f} images/s = {rates[batch] * flops / 1e12:7.1f} TFLOP/s, "
              f"{rates[batch] / limit:6.1%} of the FLOP limit")
    print(f"    peak GPU memory: {peak_memory(device)}")
    del model
    return rates


def embedding_path(args, device, forward: dict[int, float], tmp: Path) -> None:
    n, size = (16, 64) if args.dry else (args.tiles, 224)
    rng = np.random.default_rng(0)
    rows = []
    start = time.perf_counter()
    for i in range(n):
        base = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        path = tmp / f"tile_{i:05d}.jpg"
        Image.fromarray(base).resize((size, size), Image.BILINEAR).save(path, quality=90)
        rows.append({"dataset": "gpucheck", "item_id": f"t{i}", "source": str(path), "label": i % 2,
                     "label_name": f"c{i % 2}", "group": f"g{i % 8}", "domain": "a"})
    manifest = make_manifest(rows)
    spec = get_encoder_spec("demo-vit-tiny" if args.dry else args.encoder)
    spec["weights"] = {"source": "random", "seed": 0}
    batch = args.batches[-1]
    print(f"[2] embedding path: {n} JPEG tiles of {size} px (written in {time.perf_counter() - start:.0f} s), "
          f"encoder {spec['name']} (random weights), batch {batch}, {args.workers} worker(s)")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    prov = embed_manifest(manifest, spec, tmp / "emb.npz", batch_size=batch, num_workers=args.workers,
                          device=str(device), chunk_size=max(batch, 4 * batch))
    rate = prov["images_per_s"]
    ratio = rate / forward[batch] if not args.dry else float("nan")
    print(f"    {rate:,.0f} images/s (precision {prov['precision']}, pixels prepared on the device: "
          f"{prov['pixels_on_device']}); loader/forward ratio {ratio:.2f}" + (" (dry: another model, no ratio)"
                                                                            if args.dry else ""))
    print(f"    peak GPU memory: {peak_memory(device)}")


def engines(args, device, tmp: Path) -> None:
    cores = str(args.processes)
    print(f"[3a] PRISM tile grid: the engine on {device} against scikit-learn on the CPU ({cores} processes)")
    grid = ["--features", "std", "--device", str(device), "--threads", cores, "--std-reference", "engine64",
            "--baselines", f"sequential, 1 thread;{cores} processes", "--repeats", str(args.repeats)]
    if args.dry:
        grid += ["--n-train", "300", "--n-test", "60", "--dim", "16", "--classes", "3", "--repeats", "1",
                 "--target", "1e-2", "--tols", "1e-3,1e-4,1e-5", "--baselines", "sequential, 1 thread"]
    bench_probe_engine.main(grid)
    print(f"[3b] CellPath IS shard: the engine on {device} against scikit-learn on the CPU ({cores} processes)")
    root = tmp / "panel"
    cells, dim = ("60", "8") if args.dry else ("2000", "384")
    bench_cell_shard.main(["simulate", "--root", str(root), "--cells-per-section", cells, "--dim", dim])
    shard = ["baseline", "--root", str(root), "--protocol", "IS", "--dim", dim, "--device", str(device),
             "--threads", cores, "--processes", cores, "--baseline-units", "1", "--repeats", str(args.repeats),
             "--max-train-cells", "2000", "--max-val-cells", "500"]
    if args.dry:
        shard += ["--baseline-seeds", "1", "--repeats", "1", "--target", "5e-2", "--engine-tol", "1e-3"]
    bench_cell_shard.main(shard)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry", action="store_true", help="every step at toy size on the CPU")
    parser.add_argument("--batches", default="64,128,256,512", help="forward batch sweep")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--tiles", type=int, default=8192)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--encoder", default="uni", help="the registry's ViT-L/16 entry for the embedding path")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak (TFLOP/s)")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.dry:
        args.batches, args.iterations, args.warmup, args.workers, args.processes = [2, 4], 2, 1, 0, 2
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device; run with --dry to check the script on a CPU", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
        print(f"device: {torch.cuda.get_device_name(device)}; {os.cpu_count()} CPUs; torch {torch.__version__}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check.") as tmp:
        forward = forward_sweep(args, device)
        embedding_path(args, device, forward, Path(tmp))
        engines(args, device, Path(tmp))
    print(f"gpu_check: done in {time.perf_counter() - start:.0f} s"
          + (" (dry run: toy sizes, CPU)" if args.dry else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""benchmarks/gpu_check.sh --dry: every step of the GPU check at toy size on the CPU, as the suite can run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_runs_every_step():
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for marker in ("[1] vit_tiny_patch16_224 forward", "images/s", "of the FLOP limit", "[2] embedding path",
                   "pixels prepared on the device", "[3a] PRISM tile grid", "RATIO engine vs strongest baseline",
                   "[3b] CellPath IS shard", "peak GPU memory", "gpu_check: done"):
        assert marker in out, (marker, out[-4000:])
    assert out.count("RATIO engine vs strongest baseline") == 2

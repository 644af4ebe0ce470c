#!/usr/bin/env bash
# The GPU check: ViT-L/16 bf16 forward against its FLOP limit, the embedding path with decoding workers, the
# probe engine on the GPU against scikit-learn on the CPUs at equal accuracy, and peak GPU memory
# (benchmarks/gpu_check.py says what each step measures). One command, no network, under 8 minutes on an
# H200. Its output goes to the terminal and to benchmarks/gpu_check_<date>.log; record it in
# benchmarks/README.md with the date.
#
#   benchmarks/gpu_check.sh          # on a GPU machine
#   benchmarks/gpu_check.sh --dry    # every step at toy size on the CPU (what the test suite runs)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-$repo/.venv/bin/python}"
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
if [[ " $* " == *" --dry "* ]]; then
    exec "$python" "$here/gpu_check.py" "$@"
fi
log="$here/gpu_check_$(date +%Y-%m-%d_%H%M).log"
"$python" "$here/gpu_check.py" "$@" 2>&1 | tee "$log"
echo "log: $log"

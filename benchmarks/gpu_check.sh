#!/usr/bin/env bash
# The checks a machine with a GPU runs in one go (about 8 minutes budget), from the
# repository root: bash benchmarks/gpu_check.sh
# Needs only the package index (pip); prints one summary at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# the CUDA build of torch 2.13.0 from the index (the CPU wheel would hide the GPU)
.venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
  || .venv/bin/pip install --quiet torch==2.13.0
.venv/bin/pip install --quiet -e ".[dev]"
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
print('device:', torch.cuda.get_device_name(0), '| cores:', __import__('os').cpu_count())"

# Collection in the many-core regime (issue: collection throughput): 16 env workers.
timeout 240 .venv/bin/python benchmarks/collect.py --envs crafter --models size1m \
  --workers 16 --seconds 8 --json "$OUT/collect16.json" | tee "$OUT/collect16.txt"

echo
echo "== summary"
tail -n 3 "$OUT/collect16.txt"

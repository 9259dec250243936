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

# Learner modes: eager fp32, compiled + CUDA graph + bf16, torchrl's stepper (each
# command capped so the whole script stays within its 8 minutes).
for shape in "16 64" "32 256"; do
  set -- $shape
  for model in size12m size50m; do
    timeout 75 .venv/bin/python benchmarks/learner.py --model "$model" --batch "$1" \
      --length "$2" --json "$OUT/learner-$model-$1x$2.json" \
      | tee "$OUT/learner-$model-$1x$2.txt" || echo "learner $model $1x$2: timed out or failed"
  done
done

# 200 updates of the real trainer with the compiled, CUDA-graph, bf16 learner.
timeout 120 .venv/bin/python -m dreamer.train experiment=smoke run.steps=1100 eval.every=0 \
  learner.device=cuda learner.compile=true learner.cudagraph=true learner.precision=bf16 \
  run.logdir="$OUT/smoke" run.progress=false 2>&1 | tail -n 3 | tee "$OUT/smoke.txt"

# NCCL data parallel (needs 2 GPUs: NCCL refuses two ranks on one device): 20 updates
# on 2 ranks leave bit-identical weights.
if [ "$(.venv/bin/python -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  timeout 120 .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node=2 \
    -m tests.ddp_updates "$OUT/nccl" --batch 4 --updates 20 --device cuda >/dev/null 2>&1 \
    && .venv/bin/python -c "import torch; a, b = (torch.load(f'$OUT/nccl/rank{r}.pt')['loss'] for r in (0, 1)); \
print('nccl 2 ranks, 20 updates, identical weights:', all(torch.equal(a[k], b[k]) for k in a))" \
    | tee "$OUT/nccl.txt" || echo "nccl: failed" | tee "$OUT/nccl.txt"
else
  echo "nccl: skipped, one GPU (NCCL needs a device per rank)" | tee "$OUT/nccl.txt"
fi

# Collection in the many-core regime: 16 env workers on the 16 cores.
timeout 90 .venv/bin/python benchmarks/collect.py --envs crafter --models size1m \
  --workers 16 --seconds 8 --json "$OUT/collect16.json" | tee "$OUT/collect16.txt"

echo
echo "== summary"
for f in "$OUT"/learner-*.txt; do grep -A6 "GFLOP per update" "$f" || true; done
cat "$OUT/smoke.txt"
cat "$OUT/nccl.txt"
tail -n 3 "$OUT/collect16.txt"

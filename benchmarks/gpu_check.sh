#!/usr/bin/env bash
# The GPU check: what the design claims for a GPU, measured in one run of at most 5
# minutes, install included, on the offline H200 machine as it is (python3 with torch
# 2.11, numpy, matplotlib, tensorboard, tqdm, filelock, pytest; no package index), with
# the wheels of `make gpu-wheels` in .whl/ (git-ignored: the copy must carry it):
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine
#   bash benchmarks/gpu_check.sh --dry-run  # on a CPU: every step in its CPU form, tiny
#
# Writes gpu.json, summary.md, log.txt and a fail-<step>.txt for each of the first five
# steps that fail under $OUT (default benchmarks/results/gpu): the machine's 8 files.
# Each step has its own limit, capped by what is left of the budget (GPU_CHECK_SECONDS,
# default 255); GPU_CHECK_ONLY="trainer ..." runs only those steps: a second try.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; elif [ $# -gt 0 ]; then
  echo "usage: bash benchmarks/gpu_check.sh [--dry-run]" >&2
  exit 2
fi
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT/gpu.json" "$OUT/summary.md" "$OUT/log.txt" "$OUT"/fail-*.txt
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)  # step outputs and run dirs: kept off $OUT's limits
exec > >(tee "$OUT/log.txt") 2>&1
# 5 minutes with the install (~15 s) and start-up on the GPU; the dry run on a 2-core CPU,
# maybe shared with other work, gets 20x each limit
SCALE=${GPU_CHECK_SCALE:-$((DRY ? 20 : 1))}
DEADLINE=$((SECONDS + ${GPU_CHECK_SECONDS:-$((255 * SCALE))}))
FAIL_FILES=5  # + gpu.json, summary.md, log.txt: the 8 files that come back
export PYTHONUNBUFFERED=1 RL_WARNINGS=0

step() {  # step NAME SECONDS COMMAND...: the command under its own limit, capped by the budget
  local name=$1 limit=$(($2 * SCALE)) left=$((DEADLINE - SECONDS)) started=$SECONDS rc
  shift 2
  if [ -n "${GPU_CHECK_ONLY:-}" ]; then  # a second try: only these, each with what is left
    case " $GPU_CHECK_ONLY " in *" $name "*) limit=$left ;; *) return ;; esac
  fi
  if ((limit > left)); then limit=$left; fi
  if ((limit < 5)); then
    echo "== $name: skipped, the check's time is spent"
    printf '%s\tskipped\t0\n' "$name" >>"$WORK/steps.tsv"
    return
  fi
  echo "== $name (at most ${limit} s): $*"
  timeout -k 10 "$limit" "$@" >"$WORK/$name.txt" 2>&1
  rc=$?
  tail -n 25 "$WORK/$name.txt"
  if ((rc != 0)) && (($(find "$OUT" -name 'fail-*.txt' | wc -l) < FAIL_FILES)); then
    # the whole output (at most 16 MiB), torch's verbose partitioner dumps left out
    grep -v 'partitioner.py' "$WORK/$name.txt" | tail -c 16000000 >"$OUT/fail-$name.txt"
  fi
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - started))" >>"$WORK/steps.tsv"
  echo "-- $name: exit $rc after $((SECONDS - started)) s"
}

install() {  # the carried wheels, offline, into $1; the image's torch, numpy, ... stay
  PIP_CONFIG_FILE=/dev/null $PY -m pip install --quiet --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$1" .whl/*.whl
}

if ((DRY)); then
  # the project's venv, or PYTHON: a CPython 3.12 holding only the GPU image's packages
  # then runs every step on the carried wheels, as the GPU machine does
  VENV_PY=python3
  if [ -x .venv/bin/python ]; then VENV_PY=.venv/bin/python; fi
  PY=${PYTHON:-$VENV_PY}
  export PYTHONPATH=$PWD
  # the wheels: one per pinned name, pip resolves the project offline for cp312 from them
  PYTHONPATH= $VENV_PY benchmarks/gpu_wheels.py check || exit 1
  if $PY -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))"; then
    install "$WORK/site" || exit 1
    export PYTHONPATH=$PWD:$WORK/site
  else  # the same install, here for the GPU machine's interpreter and platform
    $VENV_PY benchmarks/gpu_wheels.py install --site "$WORK/site" || exit 1
  fi
  LEARNER_SHAPES=("tiny 2 8 1")
  LEARNER_MODES=(--modes ours fewer_starts --roof-size 256)  # a 2048 roof takes ~20 s here
  TINY=(model=tiny replay.batch=2 replay.length=8 run.train_ratio=16 run.train_starts=64
    collector.chunk=4 learner.device=cpu learner.precision=fp32
    collector.inference.static_batch=false)
  TRAIN=("${TINY[@]}" run.envs=2 run.steps=84 replay.size=1000 learner.compile=false
    learner.cudagraph=false)
  ATARI=("${TINY[@]}" run.steps=96)
  COLLECT=(--quick)
else
  PY=${PYTHON:-python3}  # the image's, with its torch
  SITE=${SITE:-/tmp/dreamer-site}
  install "$SITE" || exit 1
  export PYTHONPATH=$PWD:$SITE
  # the production shape first, then the recipe's; what the budget cuts is reported
  LEARNER_SHAPES=("size50m 32 256 5" "size12m 16 64 10" "size12m 32 256 5" "size50m 16 64 10")
  LEARNER_MODES=(--modes eager_fp32 compiled_cudagraph_bf16)  # the first: the ratios' base
  # every mode of the one update (ours = compiled_cudagraph_bf16 on CUDA: not twice)
  ALL_MODES=(--modes eager_fp32 eager_bf16 compiled_fp32 compiled_cudagraph_bf16 --roof-size 256)
  # minedojo_4gpu's learner (size50m, 32 x 256, compiled, CUDA graph, bf16) and one rank's
  # collector (16 workers, static-batch CUDA-graph inference) on Crafter, world size 1;
  # train ratio 512 so 200 updates need 3,200 env steps after 4,096 (16 per env x 256)
  TRAIN=(run.envs=16 run.train_ratio=512 run.train_starts=4096 run.steps=7296
    replay.size=20000)
  # the atari100k preset as it is (size200m, train ratio 256, one env), eager: 32 updates
  # after 1,024 agent steps
  ATARI=(run.train_starts=1024 run.steps=1152)
  COLLECT=(--models size1m --workers 16 --seconds 3 collector.inference.static_batch=true)
fi

$PY -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__,
'| cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0), '| usable cores', __import__('importlib').import_module('dreamer.runtime.cores').usable_cores(),
'of', __import__('os').cpu_count())"
if ((!DRY)); then
  $PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 1
fi

learner() {  # learner MODEL BATCH LENGTH UPDATES
  step "learner-$1-$2x$3" "$5" $PY benchmarks/learner.py --model "$1" --batch "$2" --length "$3" \
    --updates "$4" "${LEARNER_MODES[@]}" --json "$WORK/learner-$1-$2x$3.json"
}

# every mode once at a tiny shape: what fails shows in a minute, with its whole output
# (the dry run's learner step is that shape with those modes: it stands for this one)
if ((!DRY)); then
  step modes 60 $PY benchmarks/learner.py --model tiny --batch 2 --length 8 --updates 2 \
    "${ALL_MODES[@]}" --json "$WORK/modes.json"
fi
read -r -a shape <<<"${LEARNER_SHAPES[0]}"
learner "${shape[@]}" 80
# after the learner at the same shape, so its compiled graphs come from the cache
step trainer 70 $PY -m dreamer.train experiment=minedojo_4gpu env=crafter eval.every=0 \
  run.progress=false run.log_every=256 run.save_every=100000 "${TRAIN[@]}" \
  run.logdir="$WORK/trainer"
step atari 45 $PY -m dreamer.train experiment=atari100k env.game=pong eval.every=0 \
  learner.compile=false learner.cudagraph=false run.progress=false run.log_every=32 \
  run.save_every=100000 "${ATARI[@]}" run.logdir="$WORK/atari"
step collect 45 $PY benchmarks/collect.py --envs crafter "${COLLECT[@]}" --json "$WORK/collect.json"
for rest in "${LEARNER_SHAPES[@]:1:1}"; do
  read -r -a shape <<<"$rest"
  learner "${shape[@]}" 40
done
for rest in "${LEARNER_SHAPES[@]:2}"; do  # in what the steps above left unspent
  read -r -a shape <<<"$rest"
  learner "${shape[@]}" 30
done

echo
echo "== summary"
DRY_FLAG=()
if ((DRY)); then DRY_FLAG=(--dry-run); fi
$PY benchmarks/gpu_report.py "$WORK" "$OUT" "${DRY_FLAG[@]}"
rc=$?
rm -rf "$WORK"
exit $rc

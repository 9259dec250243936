#!/bin/bash
# The body of slurm/dreamer.sbatch and slurm/dreamer-cpu.sbatch (they set
# DREAMER_NPROC_PER_NODE and exec this): run directory, output, launch, preemption.
#
# - The run directory is run.logdir=... from the arguments, else runs/slurm-<job id>
#   (the same after a requeue, so the requeued job resumes there).
# - Everything the job prints is appended to <run dir>/slurm-<job id>.out.
# - SLURM's --signal=B:USR1@<lead> reaches this shell; it is forwarded to srun, which
#   forwards it to every node's slurm/node.sh, which forwards it to the ranks. They
#   checkpoint and stop; rank 0 leaves <run dir>/stopped, and this shell then runs
#   `scontrol requeue`.
set -u
ROOT=${DREAMER_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
cd "$ROOT" || exit 1
export DREAMER_PYTHON=${DREAMER_PYTHON:-$ROOT/.venv/bin/python}
args=("$@")
logdir=
for arg in "$@"; do
  case "$arg" in run.logdir=*) logdir=${arg#run.logdir=} ;; esac
done
if [ -z "$logdir" ]; then
  logdir=runs/slurm-$SLURM_JOB_ID
  args+=("run.logdir=$logdir")
fi
mkdir -p "$logdir"
exec >>"$logdir/slurm-$SLURM_JOB_ID.out" 2>&1
echo "== $(date -Is) job $SLURM_JOB_ID SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-unset}" \
  "nodes=$SLURM_JOB_NODELIST ranks/node=${DREAMER_NPROC_PER_NODE:-1}: ${args[*]}"
rm -f "$logdir/stopped"
# srun (SLURM >= 22.05) does not inherit --cpus-per-task from the batch job: pass it on
srun --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" --kill-on-bad-exit=1 \
  bash "$ROOT/slurm/node.sh" "${args[@]}" &
step=$!
trap 'echo "== $(date -Is) preemption signal: checkpointing"; kill -USR1 "$step"' USR1
trap 'echo "== $(date -Is) SIGTERM: checkpointing"; kill -TERM "$step"' TERM
while :; do
  wait "$step"
  code=$?
  kill -0 "$step" 2>/dev/null || break
done
if [ -f "$logdir/stopped" ]; then
  echo "== $(date -Is) $(cat "$logdir/stopped"); requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
echo "== $(date -Is) trainer exit code $code"
exit "$code"

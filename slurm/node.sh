#!/bin/bash
# One node's part of a dreamer SLURM job (srun starts one per node): torchrun with
# DREAMER_NPROC_PER_NODE ranks; with several nodes, a c10d rendezvous on the first one.
#
# A signal for the job step (srun forwards the batch shell's USR1) reaches every
# process of the step: this script, torchrun, the ranks and their env workers. So USR1
# is ignored here, and the ignoring is inherited by everything started below; only
# the ranks install a handler of their own (checkpoint, stop together, exit to be
# requeued), so one signal stops the run cleanly instead of killing torchrun.
set -u
trap '' USR1
nproc=${DREAMER_NPROC_PER_NODE:-1}
nnodes=${SLURM_NNODES:-1}
if [ "$nnodes" -gt 1 ]; then
  head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
  rendezvous=(--nnodes="$nnodes" --rdzv-backend=c10d --rdzv-id="$SLURM_JOB_ID"
    --rdzv-endpoint="$head:${DREAMER_RDZV_PORT:-29500}")
else
  rendezvous=(--standalone)
fi
exec "$DREAMER_PYTHON" -m torch.distributed.run "${rendezvous[@]}" --nproc_per_node="$nproc" \
  -m dreamer.train "$@"

#!/bin/bash
# A one-node SLURM cluster on localhost for the tests (Debian 12, SLURM 22.05, root,
# no systemd):
#   bash tests/slurm_cluster.sh up DIR     installs the packages if missing, starts munged
#                                          (unless one runs), slurmctld and slurmd; prints
#                                          the config path; pids go to DIR/*.pid
#   bash tests/slurm_cluster.sh down DIR   stops, by pid, the daemons `up` started
# On failure `up` prints the daemon logs and exits 1.
set -u
action=$1
dir=$2

up() {
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null \
      || { echo "cannot install slurmctld slurmd slurm-client munge"; return 1; }
  fi
  mkdir -p "$dir"/{state,spool,log}
  local host cpus memory
  host=$(hostname -s)
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc obeys OpenMP limits
  memory=$(($(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) * 8 / 10))
  [ -s /etc/munge/munge.key ] || mungekey --create --force 2>/dev/null \
    || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 0755 /run/munge
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    rm -f /run/munge/munged.pid
    setpriv --reuid=munge --regid=munge --clear-groups /usr/sbin/munged || return 1
    for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
    cp /run/munge/munged.pid "$dir/munged.pid"
  fi
  cat >"$dir/slurm.conf" <<CONF
ClusterName=dreamer-tests
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=5
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
InactiveLimit=0
KillWait=30
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF" || return 1
  slurmd -f "$SLURM_CONF" -N "$host" || return 1
  for _ in $(seq 150); do
    if [ "$(sinfo -h -n "$host" -o %t 2>/dev/null)" = idle ]; then
      echo "$SLURM_CONF"
      return 0
    fi
    sleep 0.2
  done
  echo "the SLURM node did not become idle:"
  sinfo
  return 1
}

down() {
  local name pid
  for name in slurmd slurmctld munged; do
    [ -s "$dir/$name.pid" ] || continue
    pid=$(cat "$dir/$name.pid")
    kill "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    rm -f "$dir/$name.pid"
  done
}

case "$action" in
  up)
    up || {
      for log in "$dir"/log/*.log; do echo "== $log"; tail -n 40 "$log"; done
      down
      exit 1
    }
    ;;
  down) down ;;
  *) echo "usage: $0 up|down DIR" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# A private one-node SLURM cluster on this machine, for tests: munged, slurmctld and slurmd
# with their own configuration, sockets, ports and state under $FERRO_SLURM_DIR (default
# /tmp/ferroccl-test-slurm-cluster), so nothing of a system-wide SLURM or munge is touched.
#   scripts/slurm-local.sh start   start (or find running) and wait until the node is idle;
#                                  prints the SLURM_CONF to export for srun
#   scripts/slurm-local.sh stop    stop the daemons it started and remove the directory
# Needs Debian's slurm-wlm and munge (scripts/setup.sh installs them); exits 3 without them.
set -euo pipefail
dir=${FERRO_SLURM_DIR:-/tmp/ferroccl-test-slurm-cluster}
conf=$dir/slurm.conf
host=$(hostname -s)

stop() {
  for d in slurmd slurmctld munged; do
    if [ -f "$dir/$d.pid" ]; then
      pid=$(cat "$dir/$d.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
  rm -rf "$dir"
}

start() {
  for b in munged slurmctld slurmd srun sinfo; do
    command -v "$b" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$b" >/dev/null 2>&1 || {
      echo "slurm-local: $b is not installed (apt-get install slurm-wlm munge)" >&2; exit 3; }
  done
  export PATH=$PATH:/usr/sbin
  if [ -f "$conf" ] && SLURM_CONF=$conf sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
    echo "$conf"; return
  fi
  stop
  mkdir -p "$dir/state" "$dir/spool"
  chmod 700 "$dir"
  dd if=/dev/urandom of="$dir/munge.key" bs=1 count=1024 status=none
  chmod 400 "$dir/munge.key"
  munged --force --key-file="$dir/munge.key" --socket="$dir/munge.sock" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"
  base=$(( 20000 + ($$ % 10000) ))
  cat > "$conf" <<CONF
ClusterName=ferroccl
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  slurmctld -f "$conf"
  slurmd -f "$conf"
  for _ in $(seq 100); do
    if SLURM_CONF=$conf sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix)'; then
      echo "$conf"; return
    fi
    sleep 0.2
  done
  echo "slurm-local: the node did not become idle; logs in $dir" >&2
  tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  exit 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

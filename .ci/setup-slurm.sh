#!/usr/bin/env bash
# Start a one-node Slurm cluster on localhost for the integration tests (tests/test_slurm_integration.py).
#
# Installs Debian's slurmctld, slurmd, slurm-client and munge when missing (apt-get update first), writes a
# slurm.conf for this machine (CPUs/RealMemory from `slurmd -C`, proctrack/linuxproc, task/none, select/cons_tres),
# keeps every state/spool/log file under $MOETUNE_SLURM_DIR (default /tmp/moetune-slurm), starts munged,
# slurmctld and slurmd, records their pids in $MOETUNE_SLURM_DIR/pids, and waits until `sinfo` shows the node idle.
# Idempotent: a second run with the daemons alive only re-checks the node. .ci/teardown-slurm.sh stops them by pid.
set -euo pipefail

STATE=${MOETUNE_SLURM_DIR:-/tmp/moetune-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by moetune .ci/setup-slurm.sh"

need_install=0
for b in slurmctld slurmd sbatch munged; do
  command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || need_install=1
done
if [ "$need_install" = 1 ]; then
  if [ "$(id -u)" != 0 ]; then echo "setup-slurm: need root to install slurm" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

# a recorded pid counts only while it is that daemon and not a zombie (pids recorded by an earlier, killed session
# may be reused by other processes or linger unreaped)
alive() {
  [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ] || return 1
  [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] || return 1
  [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}
pid_of() { [ -f "$STATE/pids" ] && awk -v n="$1" '$1==n{print $2}' "$STATE/pids" | tail -1; }

mkdir -p "$STATE"/{ctld,spool,log}
if alive "$(pid_of slurmctld)" slurmctld && alive "$(pid_of slurmd)" slurmd && alive "$(pid_of munged)" munged; then
  echo "setup-slurm: daemons already running"
else
  : > "$STATE/pids"
  # --- munge -----------------------------------------------------------------------------------------------
  mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge 2>/dev/null || true
  chmod 0400 /etc/munge/munge.key; chmod 0755 /run/munge
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
  for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
  echo "munged $(cat /run/munge/munged.pid)" >> "$STATE/pids"

  # --- slurm.conf for this node ------------------------------------------------------------------------------
  host=$(hostname -s)
  hw=$(slurmd -C | head -1)
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$hw")
  mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
  mem=$(( mem * 95 / 100 ))   # leave the OS some slack so the node is not drained for low memory
  boards=$(sed -n 's/.*\(Boards=[0-9]* SocketsPerBoard=[0-9]* CoresPerSocket=[0-9]* ThreadsPerCore=[0-9]*\).*/\1/p' <<<"$hw")
  mkdir -p /etc/slurm
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    cp "$CONF" "$STATE/slurm.conf.orig"
  fi
  cat > "$CONF" <<CONF
$MARK
ClusterName=moetune-ci
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=defer_batch
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
NodeName=$host CPUs=$cpus $boards RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  cp "$CONF" "$STATE/slurm.conf"

  # --- daemons -------------------------------------------------------------------------------------------
  rm -f "$STATE/slurmctld.pid" "$STATE/slurmd.pid"
  # -c: cold start (drop jobs a killed earlier run left in the state dir; CI wants an empty queue), -i: ignore
  # unreadable state files
  /usr/sbin/slurmctld -c -i
  for _ in $(seq 100); do [ -s "$STATE/slurmctld.pid" ] && break; sleep 0.1; done
  echo "slurmctld $(cat "$STATE/slurmctld.pid")" >> "$STATE/pids"
  /usr/sbin/slurmd
  for _ in $(seq 100); do [ -s "$STATE/slurmd.pid" ] && break; sleep 0.1; done
  echo "slurmd $(cat "$STATE/slurmd.pid")" >> "$STATE/pids"
fi

# --- wait for the node --------------------------------------------------------------------------------------
host=$(hostname -s)
for i in $(seq 60); do
  st=$(sinfo -h -n "$host" -o %T 2>/dev/null | head -1 || true)
  case "$st" in
    idle|idle\*|mixed|allocated) echo "setup-slurm: node $host $st (pids: $(tr '\n' ' ' < "$STATE/pids"))"; exit 0 ;;
    down*|drain*) scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 0.5
done
echo "setup-slurm: node $host never became idle (state: ${st:-none}); see $STATE/log" >&2
exit 1

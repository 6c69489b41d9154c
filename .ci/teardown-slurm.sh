#!/usr/bin/env bash
# Stop the daemons .ci/setup-slurm.sh started, by the pids it recorded (never by name).
set -uo pipefail
STATE=${MOETUNE_SLURM_DIR:-/tmp/moetune-slurm}
[ -f "$STATE/pids" ] || { echo "teardown-slurm: nothing recorded"; exit 0; }
# reverse start order: slurmd, slurmctld, munged
# running = exists and is not a zombie (nothing may reap a daemon whose parent is an init that does not wait)
running() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
tac "$STATE/pids" | while read -r name pid; do
  [ -n "$pid" ] || continue
  # only the daemon we recorded: a stale pid may since belong to another process
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || continue
  if running "$pid"; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do running "$pid" || break; sleep 0.1; done
    running "$pid" && kill -KILL "$pid" 2>/dev/null
    echo "teardown-slurm: stopped $name ($pid)"
  fi
done
rm -f "$STATE/pids"
if [ -f "$STATE/slurm.conf.orig" ]; then cp "$STATE/slurm.conf.orig" /etc/slurm/slurm.conf; fi
exit 0

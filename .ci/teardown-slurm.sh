#!/usr/bin/env bash
# Stop the daemons .ci/setup-slurm.sh started, by the pids it recorded (never by name).
set -uo pipefail
STATE=${MOETUNE_SLURM_DIR:-/tmp/moetune-slurm}
[ -f "$STATE/pids" ] || { echo "teardown-slurm: nothing recorded"; exit 0; }
# reverse start order: slurmd, slurmctld, munged
tac "$STATE/pids" | while read -r name pid; do
  [ -n "$pid" ] || continue
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    echo "teardown-slurm: stopped $name ($pid)"
  fi
done
rm -f "$STATE/pids"
if [ -f "$STATE/slurm.conf.orig" ]; then cp "$STATE/slurm.conf.orig" /etc/slurm/slurm.conf; fi
exit 0

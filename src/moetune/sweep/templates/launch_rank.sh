#!/bin/bash
# Per-rank command for run {{RUN}} ({{FRAMEWORK}}); started by srun, one task per GPU.
set -euo pipefail
export RANK=${SLURM_PROCID} WORLD_SIZE=${SLURM_NTASKS} LOCAL_RANK=${SLURM_LOCALID}
cd {{WORKDIR}}
{{PROFILER}}python {{ENTRY}} \
  {{ARGS}}

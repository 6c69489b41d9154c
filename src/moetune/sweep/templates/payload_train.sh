# Rendezvous for torch.distributed (env://): first node of the allocation
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR
export MASTER_PORT={{MASTER_PORT}}

# One task per GPU; the per-rank command lives in launch.sh next to this script.
srun {{SRUN_ARGS}} bash "$RUN_DIR/launch.sh" > "$RUN_DIR/logs/train.log" 2>&1
{{POST}}

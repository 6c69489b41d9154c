# --dry-run-replay: NO TRAINING. This job replays recorded artifacts through the scheduler so the sweep machinery
# (dependencies, collect, acceptance, report) can be exercised without GPUs. The command that a real run would
# execute is in launch.sh / command.txt. Sources:
{{REPLAY_SOURCES}}
srun --ntasks=1 --nodes=1 bash -c {{REPLAY_CMD}}

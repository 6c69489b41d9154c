"""Render a run into a Slurm batch script (``run.sbatch``) and a per-rank launch script (``launch.sh``).

Megatron-Bridge: ``scripts/training/run_recipe.py --recipe <recipe> section.field=value ...`` or the performance
harness ``scripts/performance/run_script.py`` (flags of its ``argument_parser.py``); Megatron-LM:
``pretrain_gpt.py --flags``. Both are started with ``srun`` one task per GPU, with RANK/WORLD_SIZE/LOCAL_RANK taken
from Slurm. Profile runs are wrapped in Nsight Systems (``nsys profile --capture-range=cudaProfilerApi``, the
framework opens/closes the range at the profiled steps) or use the framework's PyTorch profiler.
"""

from __future__ import annotations

import re
import shlex
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from moetune.sweep.overrides import harness_flags

if TYPE_CHECKING:  # annotations only: the planner's Slurm script imports this module without the sweep's contract
    from moetune.sweep.contract import Contract
    from moetune.sweep.phases import RunSpec

_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")
GPU_HARNESS_NAME = {"h100": "h100", "b200": "b200", "b300": "b300", "gb200": "gb200", "gb300": "gb300"}


def _no_items() -> list[str]:
    """A new empty list: ``Launcher``'s list defaults. ``default_factory=list`` would make pydantic read the builtin's
    signature (``inspect.signature(list)`` parses its text signature with ``tokenize``, compiling tokenize's regular
    expressions) while building the model, which ``moetune plan`` does for its Slurm script."""
    return []


class Launcher(BaseModel):
    """How runs are launched; part of the contract (a different launcher is a different experiment)."""

    model_config = ConfigDict(extra="forbid")

    framework: Literal["megatron-bridge", "megatron-lm"] = "megatron-bridge"
    entry: Literal["run_recipe", "run_script", "pretrain_gpt"] = "run_recipe"
    recipe: str | None = Field(default=None, description="Bridge recipe function, e.g. qwen3_30b_a3b_pretrain_config")
    model_family: str | None = Field(default=None, description="perf harness -m (run_script)")
    model_recipe: str | None = Field(default=None, description="perf harness -mr (run_script)")
    workdir: str = Field(default="/opt/Megatron-Bridge", description="where the entry script lives on the nodes")
    container_image: str | None = None
    container_mounts: list[str] = Field(default_factory=_no_items)
    account: str | None = None
    partition: str | None = None
    time_limit: str = "00:30:00"
    extra_sbatch: list[str] = Field(default_factory=_no_items, description="extra '#SBATCH' options, e.g. --exclusive")
    extra_srun: list[str] = Field(default_factory=_no_items)
    profiler: Literal["nsys", "torch"] = "nsys"
    profile_steps: tuple[int, int] | None = Field(default=None, description="(start, stop); None = screen window")


def template(name: str) -> str:
    return resources.files("moetune.sweep").joinpath("templates", name).read_text()


def render(name: str, values: dict[str, str]) -> str:
    """Fill ``{{NAME}}`` placeholders; every placeholder must be given (no silent blanks)."""
    text = template(name)
    missing = sorted({m for m in _PLACEHOLDER.findall(text) if m not in values})
    if missing:
        raise KeyError(f"template {name}: no value for {', '.join(missing)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def run_job(contract: Contract, run: RunSpec):
    """The run as a moetune ``Job`` (model and system from the catalogs)."""
    from moetune.catalog.systems import get_system
    from moetune.spec.features import Features
    from moetune.spec.job import Job
    from moetune.spec.layout import Layout

    fields = set(Features.model_fields)
    feats = Features(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in run.features.items()
                        if k in fields and k != "precision"}, precision=run.precision)
    layout = Layout(**{k: v for k, v in run.layout.items() if k in set(Layout.model_fields)})
    return Job(model=contract.arch(), system=get_system(contract.hardware.system), gpus=run.gpus,
               global_batch_size=contract.shape.global_batch_size, micro_batch_size=run.mbs,
               seq_length=contract.shape.seq_length, layout=layout, features=feats)


def run_config(contract: Contract, run: RunSpec) -> dict[str, Any]:
    """Bridge-form config of the run (``moetune.io.config_to_job.job_to_config``) plus the run length/logging."""
    from moetune.io.config_to_job import job_to_config

    cfg = job_to_config(run_job(contract, run))
    cfg.setdefault("train", {})["train_iters"] = run.window.steps
    cfg.setdefault("logger", {})["log_interval"] = 1
    cfg.setdefault("dataset", {})["seq_length"] = contract.shape.seq_length
    return cfg


def entry_and_args(contract: Contract, run: RunSpec) -> tuple[str, list[str]]:
    """The script to run and its arguments for this run (overrides/flags from ``moetune.io.config_to_job``)."""
    from moetune.io.config_to_job import config_to_bridge_overrides, config_to_megatron_args

    lc = contract.launcher
    sh = contract.shape
    prof_start, prof_end = lc.profile_steps or (run.window.first, min(run.window.first + 1, run.window.last))
    cfg = run_config(contract, run)
    if lc.framework == "megatron-lm":
        args = config_to_megatron_args(cfg)
        for flag, value in (("--train-iters", str(run.window.steps)), ("--log-interval", "1")):
            if flag not in args:
                args += [flag, value]
        args.append("--log-throughput")
        if run.profile:
            args += ["--profile", "--profile-step-start", str(prof_start), "--profile-step-end", str(prof_end),
                     "--profile-ranks", "0"]
            if lc.profiler == "torch":
                args += ["--use-pytorch-profiler", "--tensorboard-dir", "$RUN_DIR/traces"]
        return "pretrain_gpt.py", args
    if lc.entry == "run_script":
        gpu = contract.hardware.gpu_type.split("-")[0].lower()
        args = harness_flags(run.layout, run.features, precision=run.precision, gbs=sh.global_batch_size,
                             mbs=run.mbs, seq=sh.seq_length, steps=run.window.steps, gpus=run.gpus,
                             gpus_per_node=contract.hardware.gpus_per_node, gpu=GPU_HARNESS_NAME.get(gpu, gpu),
                             family=lc.model_family or "unknown", recipe=lc.model_recipe or "unknown")
        if run.profile:
            args += (["-en"] if lc.profiler == "nsys" else ["-pyp", "true"])
            args += ["--profiling_start_step", str(prof_start), "--profiling_stop_step", str(prof_end)]
        return "scripts/performance/run_script.py", args
    overrides = [o for o in config_to_bridge_overrides(cfg) if not o.startswith("env_vars")]
    args = ["--recipe", lc.recipe or "unknown_pretrain_config", *overrides]
    if run.profile:
        if lc.profiler == "nsys":
            args += ["profiling.use_nsys_profiler=true"]
        else:
            args += ["profiling.use_pytorch_profiler=true", "profiling.record_shapes=false"]
        args += [f"profiling.profile_step_start={prof_start}", f"profiling.profile_step_end={prof_end}",
                 "profiling.profile_ranks=[0]"]
    return "scripts/training/run_recipe.py", args


def _quote_arg(a: str) -> str:
    # keep $RUN_DIR expandable inside the launch script
    if "$RUN_DIR" in a:
        return '"' + a.replace('"', '\\"') + '"'
    return shlex.quote(a)


def render_launch(contract: Contract, run: RunSpec) -> str:
    entry, args = entry_and_args(contract, run)
    profiler = ""
    if run.profile and contract.launcher.profiler == "nsys" and contract.launcher.entry != "run_script":
        profiler = ('nsys profile -s none -t cuda,nvtx,osrt --capture-range=cudaProfilerApi '
                    '--capture-range-end=stop --force-overwrite=true '
                    '-o "$RUN_DIR/traces/profile_rank${SLURM_PROCID}" ')
    return render("launch_rank.sh", {
        "RUN": run.name, "FRAMEWORK": contract.launcher.framework, "WORKDIR": shlex.quote(contract.launcher.workdir),
        "PROFILER": profiler, "ENTRY": entry, "ARGS": " \\\n  ".join(_quote_arg(a) for a in args)})


def run_env(contract: Contract, run: RunSpec) -> dict[str, str]:
    """The contract's baseline environment, updated with what this run's features need
    (``moetune.io.env.feature_env``, the one implementation shared with the planner's launch output)."""
    from moetune.io.env import feature_env

    return {**contract.env, **feature_env(run_job(contract, run))}


def sbatch_lines(lc: Launcher) -> list[str]:
    """``#SBATCH`` account / partition / extra lines of a launcher (sweep runs and the planner's single script)."""
    extra = []
    if lc.account:
        extra.append(f"#SBATCH --account={lc.account}")
    if lc.partition:
        extra.append(f"#SBATCH --partition={lc.partition}")
    return extra + [f"#SBATCH {x}" for x in lc.extra_sbatch]


def srun_args(lc: Launcher, tasks_per_node: int) -> list[str]:
    """``srun`` arguments: one task per GPU, the container (pyxis ``--container-*``) and the launcher's extras."""
    srun = ["--ntasks-per-node", str(tasks_per_node), "--cpu-bind=none", "--kill-on-bad-exit=1"]
    if lc.container_image:
        srun += [f"--container-image={lc.container_image}", "--no-container-mount-home"]
        if lc.container_mounts:
            srun.append(f"--container-mounts={','.join(lc.container_mounts)}")
    return srun + list(lc.extra_srun)


def render_batch(contract: Contract, run: RunSpec, *, sweep_name: str, run_dir: str,
                 replay: dict[str, Any] | None) -> str:
    lc = contract.launcher
    gpn = contract.hardware.gpus_per_node
    extra = sbatch_lines(lc)
    env = run_env(contract, run)
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    if replay is None:
        nodes = max(1, -(-run.gpus // gpn))
        tasks = min(gpn, run.gpus)
        extra.insert(0, f"#SBATCH --gpus-per-node={tasks}")
        extra.append("#SBATCH --exclusive")
        srun = srun_args(lc, tasks)
        post = ""
        if run.profile and lc.profiler == "nsys":
            post = ('for f in "$RUN_DIR"/traces/*.nsys-rep; do [ -e "$f" ] || continue; '
                    'nsys export --type sqlite --force-overwrite true -o "${f%.nsys-rep}.sqlite" "$f" || true; done')
        payload = render("payload_train.sh", {"MASTER_PORT": "29500", "SRUN_ARGS": " ".join(
            shlex.quote(a) for a in srun), "POST": post})
    else:
        nodes, tasks = 1, 1
        sources = "\n".join(f"#   {k}: {v}" for k, v in replay.items() if v)
        cmds = ['set -e']
        if replay.get("log"):
            dest = "golden_values.json" if str(replay["log"]).endswith(".json") else "train.log"
            cmds.append(f'cp {shlex.quote(str(replay["log"]))} "$RUN_DIR/logs/{dest}"')
        if replay.get("trace"):
            name = str(replay["trace"]).rsplit("/", 1)[-1]
            cmds.append(f'cp {shlex.quote(str(replay["trace"]))} "$RUN_DIR/traces/{name}"')
        payload = render("payload_replay.sh", {"REPLAY_SOURCES": sources,
                                               "REPLAY_CMD": shlex.quote("; ".join(cmds))})
        payload = "export RUN_DIR\n" + payload
    return render("batch.sbatch", {
        "SWEEP": f"sweep {sweep_name}", "RUN": run.name, "PHASE": run.phase,
        "DESCRIPTION": ("; ".join(run.notes) or run.phase).replace("\n", " "),
        "JOB_NAME": f"mt-{sweep_name}-{run.name}"[:64], "NODES": str(nodes), "TASKS_PER_NODE": str(tasks),
        "TIME_LIMIT": lc.time_limit, "OUTPUT": f"{run_dir}/logs/slurm-%j.out", "RUN_DIR_Q": shlex.quote(run_dir),
        "SBATCH_EXTRA": "\n".join(extra), "ENV_EXPORTS": exports or "# (none)", "PAYLOAD": payload})

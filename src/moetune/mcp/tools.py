"""The MCP tools: one per ``moetune`` command, arguments and results exactly the command's (via ``moetune.service``).

Each tool's input schema is the command's own (read from its typer parameters by :mod:`moetune.service`); a tool
that stands for a command group (``catalog``) adds one ``kind`` argument naming the sub-command. The result is the
command's ``--json`` object as structured content (a JSON array, e.g. ``catalog``'s rows, comes wrapped as
``{"items": [...]}``: MCP structured content is an object).

Descriptions say when an agent should call the tool; they are written for the agent, not for a human reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moetune import service

#: the server-side argument every tool accepts: save the result as a JSON file inside the root (e.g. a plan for
#: ``sweep_init from_plan``); it is the only thing the server adds to the CLI's vocabulary
SAVE_ARG = "save_json"


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool: its name, the command(s) it runs and when to call it."""

    name: str
    commands: tuple[str, ...]  # one command, or the leaves of a group (chosen by ``kind``)
    when: str
    long: bool = False  # reports progress and is time-limited
    writes: bool = False  # may write files (inside the root)
    needs_submit: bool = False  # only with ``moetune mcp --allow-submit``

    def available(self, cmds: dict[str, service.Command]) -> bool:
        return all(c in cmds for c in self.commands)

    def input_schema(self) -> dict[str, Any]:
        cmds = [service.get_command(c) for c in self.commands]
        if len(cmds) == 1:
            sch = cmds[0].schema()
        else:
            props: dict[str, Any] = {}
            for c in cmds:
                props.update(c.schema()["properties"])
            kinds = [c.path[-1] for c in cmds]
            props = {"kind": {"type": "string", "enum": kinds, "description": "what to list: " + ", ".join(kinds)},
                     **props}
            sch = {"type": "object", "properties": props, "required": ["kind"], "additionalProperties": False}
        sch["properties"][SAVE_ARG] = {
            "type": "string",
            "description": "Optional: also write the result as JSON to this file inside the server's root folder "
                           "(e.g. plan.json for sweep_init's from_plan).",
        }
        return sch

    def command_for(self, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(service command, its arguments) for a tool call's arguments."""
        if len(self.commands) == 1:
            return self.commands[0], args
        kind = args.get("kind")
        kinds = {service.get_command(c).path[-1]: c for c in self.commands}
        if kind not in kinds:
            raise service.CommandError(f"kind={kind!r}: expected one of {', '.join(kinds)}", 2)
        return kinds[kind], {k: v for k, v in args.items() if k != "kind"}

    def description(self) -> str:
        cmds = [service.get_command(c) for c in self.commands]
        what = "; ".join(f"`moetune {c.name}`: {c.help}" for c in cmds)
        return f"{self.when}\n\nRuns {what} Returns the command's --json object."


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("plan", ("plan",), long=True, when=(
        "Call FIRST when the user asks which parallel layout (TP/PP/VPP/CP/EP/ETP, DP/EDP) and features (recompute, "
        "offload, FSDP, dispatcher, EP overlap, CUDA graphs, precision) to use for a model on N GPUs, what the fastest "
        "config that fits memory is, or what to launch. Gives ranked candidates with memory per stage, step time, "
        "tokens/s/GPU, MFU, the dominant wall, why #1 beats #2, and launch output (Bridge overrides, Megatron-LM "
        "flags, env, Slurm). Pin dimensions with fix (e.g. 'ep=8,tp=1'). An exact search: seconds for small jobs, "
        "up to about a minute for 1000+ GPUs (progress is reported). If nothing fits, the result says what would.")),
    ToolSpec("estimate", ("estimate",), long=True, when=(
        "Call when a layout is already chosen (flags, a Megatron-LM args file via megatron_args, or a Bridge YAML via "
        "bridge_config plus Hydra overrides) and you need its memory per pipeline stage and step time, itemised per "
        "component and per wall; explain=true lists what frees memory next in workflow order. Use it to confirm a "
        "config fits before launching and to predict the effect of one change (re-run with the change).")),
    ToolSpec("check", ("check",), when=(
        "Call before launching and after every config edit: evaluates every Megatron-Core / Megatron-Bridge rule on "
        "the effective config (a Bridge YAML, Megatron-LM args file or Bridge recipe, plus overrides in args) and "
        "returns findings with id, severity, fields, source and fix; fix=true adds the overrides that resolve the "
        "fixable errors. Errors in the result mean Megatron would reject the config.")),
    ToolSpec("recipes", ("recipes",), when=(
        "Call to find a Megatron-Bridge performance recipe (model, GPUs, system, precision) to start from, before "
        "check/estimate/plan with recipe=NAME.")),
    ToolSpec("layout", ("layout",), when=(
        "Call for pure layout arithmetic, instantly and without a performance model: is a TP/PP/CP/EP/ETP layout "
        "valid on N GPUs, its DP and EDP, microbatches, the minimum GPU count PP*lcm(TP*CP, ETP*EP), the attention "
        "and MoE meshes, which groups cross an NVLink domain, and (with model) the layers per pipeline stage.")),
    ToolSpec("flops", ("flops",), when=(
        "Call to convert between tokens/s and model TFLOP/s or MFU: model FLOPs per token and per step with "
        "Megatron-Bridge's definition (num_floating_point_operations), broken down by component.")),
    ToolSpec("model_show", ("model show",), when=(
        "Call to inspect one model (catalog name/alias or a Hugging Face config.json path): architecture fields and "
        "exact parameter counts (total, active per token, by component). Use it to confirm a config.json is read as "
        "intended before planning.")),
    ToolSpec("catalog", ("catalog models", "catalog systems"), when=(
        "Call to list the names moetune knows: kind='models' (architectures with total/active parameters) or "
        "kind='systems' (GPUs per node, NVLink domain, HBM, peak TFLOP/s). Use the names in plan/estimate/layout.")),
    ToolSpec("logs", ("logs",), when=(
        "Call on training logs (Megatron-LM, Megatron-Bridge, NeMo, or Megatron golden JSON) to measure what a run "
        "achieved: steady-window step time with a confidence interval, tokens/s/GPU, TFLOP/s/GPU, loss health and "
        "memory peaks. Use it to validate a change (>= 50 steps, window = last 10).")),
    ToolSpec("diagnose", ("diagnose",), when=(
        "Call when a run crashed, hung or misbehaved: finds OOM, NCCL timeouts, DeepEP/dispatcher failures, "
        "assertions, NaN and slowdowns in logs, with evidence lines, cause, how to confirm and ordered fixes.")),
    ToolSpec("compare", ("compare",), when=(
        "Call with two runs (a = baseline, b = candidate; logs or golden JSON) to decide whether b is slower or "
        "faster beyond noise (bootstrap CI), check that the measurement contract holds, and list the config "
        "differences that explain it. Use it for regressions and for accepting a tuning step.")),
    ToolSpec("trace", ("trace",), long=True, when=(
        "Call on profiler traces (PyTorch/Kineto JSON(.gz), Nsight Systems SQLite/recipe exports) to see where the "
        "step goes: hidden vs exposed communication (DeepEP/HybridEP counted), idle host-bound vs dependency, the "
        "dominant wall, proof that the intended dispatcher / CUDA graphs / FP8 kernels ran, and stragglers. "
        "paths=['diff', A, B] compares two runs.")),
    ToolSpec("sweep_init", ("sweep init",), writes=True, when=(
        "Call after plan (save it with save_json, then from_plan) or with a baseline config to turn the workflow "
        "(fit, scale, profile, retune one variable at a time, validate >= 50 steps) into a sweep directory "
        "(out, inside the root) with contract.yaml, sweep.yaml and one Slurm batch script per run. Nothing is "
        "submitted. Node-side strings (workdir, mount) count as paths: absolute ones outside the root are refused, "
        "so leave them at their defaults or relative.")),
    ToolSpec("sweep_collect", ("sweep collect",), writes=True, when=(
        "Call after sweep runs finished: parses their logs/traces, applies the acceptance criteria, picks the winner "
        "of each phase and writes collect/results.json and collect/calibration.csv.")),
    ToolSpec("report", ("report",), writes=True, when=(
        "Call to produce a report of a sweep directory, a saved plan JSON or estimate JSON: Markdown in the result, "
        "or self-contained HTML/Markdown files (html/md, inside the root).")),
    ToolSpec("calibrate", ("calibrate",), long=True, writes=True, when=(
        "Call with a CSV of measured runs from the user's cluster to refit moetune's few efficiency parameters; "
        "write them with out and pass that file as estimate's efficiency argument.")),
    ToolSpec("sweep_status", ("sweep status",), needs_submit=True, when=(
        "Call to see the Slurm state of a submitted sweep's jobs (squeue/sacct).")),
    ToolSpec("sweep_submit", ("sweep submit",), needs_submit=True, when=(
        "Call only when the user asked to launch: sbatch every run of a sweep directory with dependencies on the "
        "previous phase (dry_run=true prints the sbatch commands only).")),
)


def available_tools(*, allow_submit: bool) -> list[ToolSpec]:
    """The tools this server offers: those whose command exists, Slurm-touching ones only with ``allow_submit``."""
    cmds = service.commands()
    return [t for t in TOOLS if t.available(cmds) and (allow_submit or not t.needs_submit)]

"""MCP prompts: the tuning workflows as guided sequences of moetune tool calls.

The workflows restate public Megatron-Bridge performance guidance (MoE throughput tuning ordered by the memory,
communication and compute/host walls; correctness-first EP communication overlap; parallel-layout sizing) and turn
every decision in them into a tool call whose result decides the next step. The same workflows are the executable
skills under ``skills/`` (their SKILL.md files run the same commands from a shell).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptArg:
    name: str
    description: str
    required: bool = False
    default: str | None = None


@dataclass(frozen=True)
class PromptSpec:
    name: str
    title: str
    description: str
    args: tuple[PromptArg, ...]
    template: str

    def render(self, values: dict[str, str] | None) -> str:
        vals = {a.name: a.default for a in self.args}
        given = {k: v for k, v in (values or {}).items() if v not in (None, "")}
        unknown = sorted(set(given) - set(vals))
        if unknown:
            raise ValueError(f"unknown argument(s) {', '.join(unknown)} for prompt {self.name}; known: "
                             f"{', '.join(vals)}")
        vals.update(given)
        missing = [a.name for a in self.args if a.required and not vals.get(a.name)]
        if missing:
            raise ValueError(f"prompt {self.name} needs {', '.join(missing)}")
        return self.template.format(**{k: (v if v is not None else "?") for k, v in vals.items()})


_JOB = (
    PromptArg("model", "catalog model name or a Hugging Face config.json path inside the root", default="Qwen3-30B-A3B"),
    PromptArg("system", "catalog system (e.g. DGX-H100, DGX-B200, GB200-NVL72)", default="DGX-H100"),
    PromptArg("gpus", "GPUs available", default="16"),
    PromptArg("gbs", "global batch size (sequences)", default="1024"),
    PromptArg("seq", "sequence length", default="4096"),
)

_COMMON = """
Rules for every step: call the moetune tools, never guess numbers; quote the numbers the tools return (GiB, s,
tokens/s/GPU, %) with the tool that produced them; run `check` after every config change and resolve its errors
(fix=true gives the overrides) before moving on; change one variable at a time; a tool error carries the same
one-line message as the CLI: read it, correct the argument it names and call again.
"""

OPTIMIZE = PromptSpec(
    name="optimize_moe_throughput",
    title="Optimise MoE training throughput",
    description="Fit -> scale -> profile -> retune -> validate for one MoE job, every decision taken from a moetune "
                "tool result.",
    args=_JOB,
    template="""Optimise the training throughput of {model} on {gpus} x {system} (GBS {gbs}, sequence {seq}).
Work through the three walls in order: memory first (it must fit), then communication, then compute / host overhead.

1. Fit. Call `plan` with model={model}, system={system}, gpus={gpus}, gbs={gbs}, seq={seq} (save_json=plan.json).
   If it returns no candidates, report its `impossible` section (closest layouts, what would fit) and stop.
   Otherwise take candidate #1: its layout (TP, PP, VPP, CP, EP, ETP, DP, EDP, MBS), features (recompute,
   offload, dispatcher, EP overlap, CUDA graphs), memory (`memory`: binding stage, GiB of capacity) and time
   (`time`: step time, tokens/s/GPU, MFU, dominant wall). Quote `why` (what #1 gains over #2).
2. Confirm. Call `estimate` with the arguments of candidate #1's `reproduce` line (the estimate of exactly its
   job: layout, features, recipe; flags with underscores) and explain=true: the memory must fit with headroom and
   the step time equals the plan's; note what frees memory next.
   Call `check` with the Bridge overrides from candidate #1's `launch` (as args) or a config file, and fix=true.
3. Scale. Compare candidates #1..#3 of the plan: is the gain of #1 larger than the model's uncertainty (a few %)?
   If two are close, keep both for the measured scale phase. Call `layout` for #1 to see which groups cross an
   NVLink domain (EP crossing nodes makes communication the wall).
4. Profile and retune. Call `sweep_init` with from_plan=plan.json and out=sweep: it writes the phased sweep (fit,
   scale, profile, retune one variable at a time, validate >= 50 steps). After the runs, `trace` on the profile
   phase's traces tells the dominant wall measured (exposed EP/TP/DP communication, host-bound idle, compute);
   retune the feature aimed at that wall (dispatcher DeepEP/HybridEP, EP overlap, CUDA-graph scope, recompute
   modules, MBS), one variable per run, and `compare` each run with its baseline: accept only a change beyond noise.
5. Validate. `logs` on the validation run (>= 50 steps, window = last 10): step time with CI, tokens/s/GPU,
   loss health. Report measured vs predicted.
{common}""".replace("{common}", _COMMON),
)

EP_OVERLAP = PromptSpec(
    name="enable_ep_overlap",
    title="Enable and validate MoE expert-parallel communication overlap",
    description="Correctness first: alltoall EP overlap, then delayed wgrad, then flex DeepEP/HybridEP, each step "
                "checked, estimated and compared.",
    args=(*_JOB, PromptArg("ep", "expert-parallel size (> 1)", default="8"),
          PromptArg("config", "optional Bridge YAML or Megatron-LM args file inside the root", default="")),
    template="""Enable MoE expert-parallel (EP) communication overlap for {model} on {gpus} x {system}, EP {ep}
(GBS {gbs}, sequence {seq}; config: {config}). Hide the token dispatch / combine all-to-all behind expert compute,
correctness first, one step at a time.

0. Baseline. `recipes` model={model} system={system} lists the Bridge perf recipes to start from (use one as
   recipe=NAME in check/estimate). `estimate` with model={model}, system={system}, gpus={gpus}, gbs={gbs}, seq={seq}, ep={ep},
   dispatcher=alltoall (or bridge_config={config} when given): note step time and the exposed EP communication in
   `time`. If EP communication is small, overlap cannot gain much: say so.
1. Plain EP overlap on the alltoall dispatcher. `check` the config with
   comm_overlap.overlap_moe_expert_parallel_comm=true, comm_overlap.delay_wgrad_compute=false and
   model.moe_shared_expert_overlap=false (as args overrides, with a recipe or config file). Resolve every error:
   EP overlap needs EP > 1, alltoall or flex dispatch, no full recompute, bf16/fp16, shared-expert overlap off,
   VPP when PP > 1, at most one MTP layer, PyTorch >= 2.6 (pass torch= to check it). Then `plan` twice with
   fix='ep={ep},dispatcher=alltoall,ep_overlap=0' and fix='ep={ep},dispatcher=alltoall,ep_overlap=1': the
   difference of the step times (and of time.walls.comm_ep) is the predicted gain of overlap at this layout.
2. Delayed wgrad. Only after step 1 works: add comm_overlap.delay_wgrad_compute=true, `check` again (Transformer
   Engine >= 2.3; >= 2.7 with overlap_grad_reduce or gradient-accumulation fusion; CUDA-graph scopes limited).
3. Flex dispatcher. Only on GPUs and fabrics that support it: `check` with model.moe_token_dispatcher_type=flex and
   model.moe_flex_dispatcher_backend=deepep (or hybridep); the backend only takes effect with the flex dispatcher.
   `plan` with fix='ep={ep},dispatcher=deepep' and 'dispatcher=hybridep' to compare the predicted step times.
4. Validate each step on the cluster: `sweep_init` (retune phase) or the user's runs, then `trace` (EP
   communication hidden %, the dispatcher that actually ran) and `compare` against the step before; keep a change
   only when it is faster beyond noise and the loss matches. `diagnose` any hang or assertion.
{common}""".replace("{common}", _COMMON),
)

SIZE_LAYOUT = PromptSpec(
    name="size_parallel_layout",
    title="Size the parallel layout, including the minimum GPU count",
    description="TP/PP/CP/EP/ETP/DP for a model and GPU budget: minimum world size, validity, memory fit and the "
                "fastest layout.",
    args=_JOB,
    template="""Size the parallel layout for {model} on {system} with up to {gpus} GPUs (GBS {gbs}, sequence {seq}).

1. The model: `model_show` name={model} (total and active parameters, experts, layers, heads).
2. Fastest fitting layout: `plan` model={model}, system={system}, gpus={gpus}, gbs={gbs}, seq={seq}. Report
   candidate #1's TP, PP, VPP, CP, EP, ETP, DP, EDP and its attention / MoE meshes (Parallel Folding: the attention
   layers use TP x CP x DP x PP, the expert layers ETP x EP x EDP x PP on the same GPUs).
3. Minimum GPU count and validity: `layout` gpus={gpus} with #1's tp, pp, cp, ep, etp (and model={model},
   gbs={gbs}, seq={seq}): `min_world_size` is PP * lcm(TP*CP, ETP*EP) (not the product of all sizes); the world
   size must be a multiple of it; DP = W/(TP*CP*PP), EDP = W/(ETP*EP*PP). Note groups that cross an NVLink domain
   (keep TP, and EP where possible, inside one).
4. Fewer GPUs: does the model fit on less? `plan` with a smaller gpus (halve until no candidate fits); the
   smallest that returns a candidate is the minimum for memory; `estimate` it with explain=true.
5. Check the chosen layout: `check` with its Bridge overrides (launch section of the plan) and fix=true.
{common}""".replace("{common}", _COMMON),
)

REGRESSION = PromptSpec(
    name="diagnose_regression",
    title="Diagnose a throughput regression from two logs or traces",
    description="Baseline vs candidate: is it slower beyond noise, is the comparison fair, what changed and which "
                "wall moved.",
    args=(PromptArg("baseline", "baseline log, golden JSON or trace inside the root", required=True),
          PromptArg("candidate", "candidate log, golden JSON or trace inside the root", required=True),
          PromptArg("gpus", "GPU count when the logs do not print it", default="")),
    template="""Diagnose whether {candidate} regressed against {baseline} (GPUs: {gpus}).

1. Logs: `compare` a={baseline}, b={candidate} (with gpus when given). Report the verdict (regression,
   improvement, no_change, not_comparable), the step-time delta with its 95% CI, and the measurement contract:
   if it is broken (different GBS, sequence, GPU count, window, profiling on), say the comparison is not fair and
   what to rerun. List the config differences and the ones the model says explain the delta.
2. Each run alone: `logs` on both files (steady window, step time, tokens/s/GPU, loss health, memory) and
   `diagnose` on both (stragglers, NCCL timeouts, slowdowns within a run, NaN, OOM) with their evidence lines.
3. Traces (when the inputs are profiler traces): `trace` paths=['diff', {baseline}, {candidate}] shows which wall
   moved (exposed communication by kind, idle host-bound vs dependency, compute) and features that changed; `trace`
   on each names the dominant wall and stragglers.
4. Conclude: the most likely cause with its evidence, how to confirm it (one rerun that changes only that
   variable), and the fix.
{common}""".replace("{common}", _COMMON),
)

PROMPTS: tuple[PromptSpec, ...] = (OPTIMIZE, EP_OVERLAP, SIZE_LAYOUT, REGRESSION)

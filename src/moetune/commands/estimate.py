"""``moetune estimate``: per-rank memory and step time of one training job.

The job comes from :func:`moetune.io.load.load_job` (the one loader): flags (catalog model + system + layout + the
feature vocabulary shared with ``plan --fix``; features start from the Bridge perf recipe of the same model / system /
precision), ``--recipe NAME`` (a Bridge perf recipe, Hydra-style overrides and flags on top), a Megatron-LM argument
list / functional-test ``model_config.yaml`` (``--megatron-args``), or a Megatron-Bridge ConfigContainer YAML with
Hydra-style overrides (``--bridge-config``).
"""

import dataclasses
from typing import Annotated, Any

import typer

from moetune.commands import knobs
from moetune.output import console, print_json, readable

DEFAULT_SYSTEM = "DGX-H100"


def render_time(est, console) -> None:
    """Rich view: headline numbers, the walls as a stacked bar, and the dominant wall named."""
    from rich.table import Table
    from rich.text import Text

    from moetune.perfmodel.step import WALL_LABEL, WALL_ORDER

    colors = {"compute": "green", "recompute": "yellow", "comm_tp": "cyan", "comm_cp": "bright_cyan",
              "comm_ep": "magenta", "comm_pp": "blue", "comm_dp": "bright_blue", "pipeline_bubble": "white",
              "host": "red", "optimizer": "bright_black"}
    band = ""
    if est.band is not None:
        band = (f" ({100 * est.band.coverage:.0f} % band {est.band.lo_s:.3f}-{est.band.hi_s:.3f} s, "
                f"{est.band.cls})")
    console.print(f"[bold]Step time[/] {est.step_time_s:.3f} s{band}   "
                  f"[bold]tokens/s/GPU[/] {est.tokens_per_s_per_gpu:,.0f}"
                  f"   [bold]model TFLOP/s/GPU[/] {est.model_tflops_per_gpu:,.1f}   "
                  + f"MFU {est.mfu['vs_bf16_peak'] * 100:.1f}% of BF16 peak"
                  # the precision's own peak only when it is not the BF16 one (BF16/FP16 runs: said once)
                  + (f", {est.mfu['vs_precision_peak'] * 100:.1f}% of {est.precision.upper()} peak"
                     if est.precision not in ("bf16", "fp16") else ""))
    width = 60
    bar = Text()
    for k in WALL_ORDER:
        n = round(est.walls[k].share * width)
        if n:
            bar.append("█" * n, style=colors[k])
    console.print(bar)
    tab = Table(show_header=True, header_style="bold", box=None)
    tab.add_column("wall")
    tab.add_column("seconds", justify="right")
    tab.add_column("share", justify="right")
    for k in WALL_ORDER:
        w = est.walls[k]
        if w.seconds <= 0:
            continue
        tab.add_row(Text("■ ", style=colors[k]) + Text(WALL_LABEL[k]), f"{w.seconds:.3f}", f"{w.share * 100:.1f}%")
    console.print(readable(tab, names=("wall",)))
    console.print(f"Dominant wall: [bold]{WALL_LABEL[est.dominant_wall]}[/] "
                  f"({est.walls[est.dominant_wall].share * 100:.0f}% of the step)")
    if est.assumptions:
        console.print("[dim]Assumptions:[/]")
        for a in est.assumptions:
            console.print(f"[dim]  - {a}[/]")


def _launch(job) -> dict[str, Any]:
    """Bridge overrides (tuning subset and all) and Megatron-LM flags of the job, e.g. a generated pipeline layout."""
    from moetune.plan.launch import launch_for

    full = launch_for(job)
    return {k: full[k] for k in ("recipe", "bridge_overrides_tuning", "bridge_overrides", "megatron_args", "env",
                                 "notes")}


def _flops_per_token(job) -> float:
    from moetune.perfmodel.flops import task_flops_per_token

    return float(task_flops_per_token(job.model, job.seq_length, job.layout.tp, job.features.task))


def render_memory(est, suggestions=None) -> None:
    """Rich view: one column per PP stage, components as rows, the binding stage marked."""
    from rich.markup import escape
    from rich.table import Table

    names: list[str] = []
    for s in est.stages:
        for k in s.components:
            if k not in names:
                names.append(k)
    t = Table(title="Memory per GPU (GiB), per pipeline stage", show_lines=False)
    t.add_column("component")
    for s in est.stages:
        t.add_column(f"PP{s.pp_rank}{' ◀ binding' if s.binding else ''}", justify="right")
    for n in names:
        t.add_row(n, *(f"{s.components.get(n, 0.0):.2f}" for s in est.stages))
    t.add_row("[bold]peak allocated[/]", *(f"[bold]{s.peak_allocated_gib:.2f}[/]" for s in est.stages))
    t.add_row("reserved", *(f"{s.reserved_gib:.2f}" for s in est.stages))
    t.add_row("[bold]device total[/]", *(f"[bold]{s.device_gib:.2f}[/]" for s in est.stages))
    console.print(readable(t, names=("component",)))
    ct = Table(title="Virtual chunks: layers, activations per microbatch, microbatches in flight at the peak")
    ct.add_column("stage")
    ct.add_column("chunk")
    ct.add_column("contents")
    ct.add_column("GiB/microbatch", justify="right")
    ct.add_column("in flight", justify="right")
    for s in est.stages:
        for c in s.chunks:
            parts = []
            if c.embedding:
                parts.append("embedding")
            if c.layers:
                parts.append(f"layers {c.layers[0]}-{c.layers[-1]}" if len(c.layers) > 1 else f"layer {c.layers[0]}")
            if c.mtp_layers:
                parts.append(f"MTP x{c.mtp_layers}")
            if c.loss:
                parts.append("output+loss")
            ct.add_row(f"PP{s.pp_rank}", str(c.vchunk), ", ".join(parts) or "-",
                       f"{c.activation_gib_per_microbatch:.3f}", str(c.in_flight_at_peak))
    console.print(readable(ct, names=("stage",)))
    verdict = "[green]fits[/]" if est.fits else "[red]does NOT fit[/]"
    console.print(f"Binding stage PP{est.binding_stage}: {est.stages[est.binding_stage].device_gib:.2f} GiB of "
                  f"{est.capacity_gib:.1f} GiB -> {verdict}. Policy: {est.headroom_policy}")
    console.print(f"Last stage peak allocated (what Megatron logs as mem-max-allocated-bytes): "
                  f"{est.last_stage_peak_allocated_gib:.2f} GiB")
    for a in est.assumptions:
        console.print(escape(f"  - {a}"), style="dim")
    if suggestions is not None:
        console.print("[bold]What frees memory next[/] (workflow order):")
        if not suggestions:
            console.print("  nothing cheaper left")
        for i, s in enumerate(suggestions, 1):
            console.print(escape(f"  {i}. [{s.action}] {s.detail}: frees {s.frees_gib:.2f} GiB ({s.cost})"))


#: the training-task options, shared by ``estimate`` and ``plan`` (one vocabulary: :func:`moetune.io.load.task_updates`)
TASK_HELP = ("Training task: pretrain (default), sft (full fine-tune, priced as pre-training) or lora (frozen base "
             "with LoRA adapters; Bridge peft section). Megatron-LM has no LoRA.")
LORA_DIM_HELP = "LoRA rank r (Bridge peft.dim; default 32). Implies --task lora."
LORA_ALPHA_HELP = "LoRA alpha (Bridge peft.alpha; default 32; no effect on memory or time). Implies --task lora."
LORA_TARGETS_HELP = ("Linears with a LoRA adapter, comma list of linear_qkv, linear_proj, linear_fc1, linear_fc2 "
                     "(Bridge peft.target_modules; default all four). Implies --task lora.")


def task_json(f) -> dict[str, Any]:
    """The training task of a job's features for ``--json``: the task and, for LoRA, its adapter settings."""
    out: dict[str, Any] = {"task": f.task}
    if f.task == "lora":
        out["lora"] = {"dim": f.lora_dim, "alpha": f.lora_alpha, "target_modules": list(f.lora_target_modules)}
    return out


def task_label(task: dict[str, Any]) -> str:
    """``, LoRA r16 alpha 32 on linear_qkv`` / ``, SFT (full fine-tune)`` for a header line from a :func:`task_json`
    object; empty for pre-training."""
    if task.get("task") == "lora":
        lo = task["lora"]
        return f", LoRA r{lo['dim']} alpha {lo['alpha']} on {','.join(lo['target_modules'])}"
    return ", SFT (full fine-tune)" if task.get("task") == "sft" else ""


def job_options(**kw: Any):
    """The :class:`~moetune.io.load.JobFlags` of the estimate options (one vocabulary with ``plan --fix``)."""
    from moetune.io.load import FeatureChoices, JobFlags, SplitFlags

    ch = FeatureChoices(**{k: kw.pop(k) for k in list(kw) if k in FeatureChoices.__dataclass_fields__})
    sp = SplitFlags(pipeline_layout=kw.pop("pipeline_layout"), first=kw.pop("first_stage"), last=kw.pop("last_stage"),
                    account_embedding=bool(kw.pop("account_embedding")), account_loss=bool(kw.pop("account_loss")))
    return JobFlags(split=sp, choices=ch, **kw)


def run_estimate(fl, *, megatron_args: str | None = None, bridge_config: str | None = None,
                 overrides: list[str] | None = None, explain: bool = False, efficiency: str | None = None):
    """Job, memory estimate, suggestions, time estimate and FLOPs/token of one estimate request."""
    from moetune.io.load import load_job
    from moetune.perfmodel.memory import estimate_memory
    from moetune.perfmodel.step import estimate_time
    from moetune.plan.explain import explain_memory
    from moetune.spec.validate import validate_job

    job = load_job(fl, megatron_args=megatron_args, bridge_config=bridge_config, overrides=overrides or [])
    validate_job(job)
    from moetune.errors import InputError
    from moetune.rules.precision import precision_unsupported

    bad_precision = precision_unsupported(job.features.precision, job.system.gpu.name)
    if bad_precision:  # fail before any estimate (PRC-008), as plan does
        raise InputError(f"{job.system.name}: {bad_precision}", field="precision", value=job.features.precision)
    est = estimate_memory(job)
    suggestions = explain_memory(job, est) if explain else None
    tim = estimate_time(job, efficiency)
    return job, est, suggestions, tim, _flops_per_token(job)


def register(app: typer.Typer) -> None:
    @app.command("estimate")
    def estimate(
        overrides: Annotated[list[str] | None, typer.Argument(help="Hydra-style overrides for --recipe / --bridge-config "
                                                               "(model.tensor_model_parallel_size=4).")] = None,
        recipe: Annotated[str | None, typer.Option(
            "--recipe", help="Start from this Bridge perf recipe (`moetune recipes`); 'none' = library defaults, "
                             "'perf-common' = library defaults with the perf launcher's common settings. "
                             "Default: the recipe of the same model/system/precision when one exists, else "
                             "'perf-common'.")] = None,
        model: Annotated[str | None, typer.Option(help="Catalog model name or HF config.json path.")] = None,
        system: Annotated[str | None, typer.Option(help="Catalog system (default DGX-H100).")] = None,
        gpus: Annotated[int | None, typer.Option(help="World size.")] = None,
        gbs: Annotated[int | None, typer.Option(help="Global batch size (sequences).")] = None,
        mbs: Annotated[int | None, typer.Option(help="Micro batch size (default 1).")] = None,
        seq: Annotated[int | None, typer.Option("--seq", "--seq-length", help="Sequence length.")] = None,
        precision: Annotated[str | None, typer.Option(help="bf16, fp8_cs, fp8_blockwise, mxfp8, nvfp4 ... "
                                                           "(`moetune catalog` lists the names)")] = None,
        tp: Annotated[int | None, typer.Option(help="Tensor parallel size (default 1).")] = None,
        pp: Annotated[int | None, typer.Option(help="Pipeline parallel size (default 1).")] = None,
        vpp: Annotated[int | None, typer.Option(help="Virtual pipeline stages per rank.")] = None,
        pipeline_layout: Annotated[str | None, typer.Option("--pipeline-layout", help="e.g. 'Et*3|(tt|)*29m|L'")] = None,
        num_layers_in_first_pipeline_stage: Annotated[int | None, typer.Option("--num-layers-in-first-pipeline-stage",
                                                        help="decoder layers on the first PP stage")] = None,
        num_layers_in_last_pipeline_stage: Annotated[int | None, typer.Option("--num-layers-in-last-pipeline-stage",
                                                       help="decoder layers on the last PP stage")] = None,
        account_for_embedding_in_pipeline_split: Annotated[bool, typer.Option("--account-for-embedding-in-pipeline-split",
                                                        help="the embedding counts as one layer in the split")] = False,
        account_for_loss_in_pipeline_split: Annotated[bool, typer.Option("--account-for-loss-in-pipeline-split",
                                                   help="the loss counts as one layer in the split")] = False,
        cp: Annotated[int | None, typer.Option(help="Context parallel size (default 1).")] = None,
        ep: Annotated[int | None, typer.Option(help="Expert parallel size (default 1).")] = None,
        etp: Annotated[int | None, typer.Option(help="Expert tensor parallel size (Bridge default).")] = None,
        fsdp: Annotated[bool | None, typer.Option("--fsdp/--no-fsdp", help="Megatron-FSDP (optim_grads_params)")] = None,
        dispatcher: Annotated[str | None, typer.Option(help="alltoall, allgather, deepep, hybridep.")] = None,
        ep_overlap: Annotated[bool | None, typer.Option("--ep-overlap/--no-ep-overlap",
                                                        help="overlap_moe_expert_parallel_comm")] = None,
        delay_wgrad: Annotated[bool | None, typer.Option("--delay-wgrad/--no-delay-wgrad",
                                                         help="delay_wgrad_compute (with EP overlap)")] = None,
        tp_comm_overlap: Annotated[bool | None, typer.Option("--tp-comm-overlap/--no-tp-comm-overlap",
                                                             help="TE userbuffers TP comm overlap")] = None,
        recompute: Annotated[str | None, typer.Option(help="none | full[:uniform|block:N] | selective | "
                                                            "comma list of modules")] = None,
        offload_modules: Annotated[str | None, typer.Option("--offload-modules", "--offload",
                                                    help="fine-grained activation offload modules, layers:N "
                                                         "(CPU-offload the first N layers), or none")] = None,
        cuda_graph_scope: Annotated[str | None, typer.Option("--cuda-graph-scope",
                                                             help="attn,moe_router,... or none")] = None,
        rank_capacity_factor: Annotated[str | None, typer.Option(
            "--rank-capacity-factor", help="HybridEP static per-rank token budget over the mean (e.g. 1.5), or none")
                                        ] = None,
        paged_stash: Annotated[bool | None, typer.Option("--paged-stash/--no-paged-stash",
                                                         help="moe_paged_stash (needs a rank capacity factor)")] = None,
        cutedsl_fused_grouped_mlp: Annotated[bool | None, typer.Option(
            "--cutedsl-fused-grouped-mlp/--no-cutedsl-fused-grouped-mlp",
            help="TE CuTeDSL fused grouped MLP of the experts (NVTE_CUTEDSL_FUSED_GROUPED_MLP=1, TE op fuser; "
                 "Blackwell MXFP8/NVFP4)")] = None,
        optimizer_offload: Annotated[float | None, typer.Option(help="optimizer CPU offload fraction")] = None,
        expandable_segments: Annotated[bool | None, typer.Option("--expandable-segments/--no-expandable-segments")
                                       ] = None,
        routing_imbalance: Annotated[float | None, typer.Option(help="hottest/mean expert-rank load")] = None,
        force_balance: Annotated[bool | None, typer.Option("--force-balance/--no-force-balance",
                                                           help="benchmark-only force-balanced routing")] = None,
        dist_opt: Annotated[bool | None, typer.Option("--dist-opt/--no-dist-opt")] = None,
        task: Annotated[str | None, typer.Option(help=TASK_HELP)] = None,
        lora_dim: Annotated[int | None, typer.Option("--lora-dim", help=LORA_DIM_HELP)] = None,
        lora_alpha: Annotated[int | None, typer.Option("--lora-alpha", help=LORA_ALPHA_HELP)] = None,
        lora_target_modules: Annotated[str | None, typer.Option("--lora-target-modules", help=LORA_TARGETS_HELP)
                                       ] = None,
        megatron_args: Annotated[str | None, typer.Option("--megatron-args",
                                                          help="Megatron-LM args file/string or model_config.yaml")] = None,
        bridge_config: Annotated[str | None, typer.Option("--bridge-config", help="Megatron-Bridge YAML")] = None,
        explain: Annotated[bool, typer.Option("--explain", help="What would free the most memory next.")] = False,
        json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")] = False,
        efficiency: Annotated[str | None, typer.Option(
            "--efficiency", help="Efficiency YAML from `moetune calibrate` (default: shipped fit).")] = None,
    ) -> None:
        """Estimate per-GPU memory of every pipeline stage and the step time of one job."""
        fl = job_options(
            model=model, system=system, gpus=gpus, gbs=gbs, mbs=mbs, seq=seq, precision=precision, tp=tp, pp=pp,
            vpp=vpp, cp=cp, ep=ep, etp=etp, recipe=recipe, pipeline_layout=pipeline_layout,
            first_stage=num_layers_in_first_pipeline_stage, last_stage=num_layers_in_last_pipeline_stage,
            account_embedding=account_for_embedding_in_pipeline_split,
            account_loss=account_for_loss_in_pipeline_split, fsdp=fsdp,
            dispatcher=dispatcher, ep_overlap=ep_overlap, delay_wgrad=delay_wgrad, tp_comm_overlap=tp_comm_overlap,
            recompute=recompute, offload=offload_modules, cuda_graph_scope=cuda_graph_scope,
            rank_capacity_factor=rank_capacity_factor, paged_stash=paged_stash,
            cutedsl_fused_grouped_mlp=cutedsl_fused_grouped_mlp, optimizer_offload=optimizer_offload, expandable_segments=expandable_segments, dist_opt=dist_opt,
            force_balance=force_balance, routing_imbalance=routing_imbalance, task=task, lora_dim=lora_dim,
            lora_alpha=lora_alpha, lora_target_modules=lora_target_modules)
        job, est, suggestions, tim, flops = run_estimate(
            fl, megatron_args=megatron_args, bridge_config=bridge_config, overrides=overrides, explain=explain,
            efficiency=efficiency or knobs.efficiency())
        if json_out:
            out: dict[str, Any] = {
                "job": job.model_dump(mode="json"),
                "memory": est.to_dict(),
                "time": tim.model_dump(mode="json"),
                "flops_per_token": flops,
                "task": task_json(job.features),
                "launch": _launch(job),
                "assumptions": list(dict.fromkeys([*job.assumptions, *est.assumptions,
                                                   *tim.assumptions])),
            }
            if suggestions is not None:
                out["explain"] = [dataclasses.asdict(s) for s in suggestions]
            print_json(out)
            return
        lay = job.layout
        console.print(f"[bold]{job.model.name}[/] on {job.gpus}× {job.system.name}: {lay.short()} DP{job.dp} "
                      f"EDP{job.edp}, GBS {job.global_batch_size} MBS {job.micro_batch_size} seq {job.seq_length}, "
                      f"{job.num_microbatches} microbatches, {job.features.precision}{task_label(task_json(job.features))}")
        render_memory(est, suggestions)
        render_time(tim, console)
        launch = _launch(job)
        console.print("Bridge overrides: " + " ".join(launch["bridge_overrides_tuning"]), soft_wrap=True,
                      markup=False, style="dim")
        for note in launch["notes"]:
            console.print("note: " + note, soft_wrap=True, markup=False, style="yellow")

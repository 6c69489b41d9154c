"""``moetune estimate``: per-rank memory (and step time, when the time model is installed) of one training job.

The job comes from flags (catalog model + system + layout + features), a Megatron-LM argument list / functional-test
``model_config.yaml`` (``--megatron-args``), or a Megatron-Bridge ConfigContainer YAML with Hydra-style overrides
(``--bridge-config``).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer

from moetune.errors import InputError
from moetune.output import console, print_json

DEFAULT_SYSTEM = "DGX-H100"

_DISPATCHERS = {
    "allgather": ("allgather", None), "alltoall": ("alltoall", None), "flex": ("flex", "deepep"),
    "deepep": ("flex", "deepep"), "hybridep": ("flex", "hybridep"),
}


def parse_recompute(text: str | None) -> dict[str, Any]:
    """``--recompute`` value -> Features fields.

    Forms: ``none``; ``full`` / ``full:uniform:N`` / ``full:block:N``; ``selective`` (MCore default module
    core_attn) or a comma list of selective modules (``core_attn,moe_act``).
    """
    from moetune.perfmodel.activations import RECOMPUTE_MODULES

    if text is None or text.strip().lower() in ("", "none", "off"):
        return {"recompute_granularity": None, "recompute_modules": ()}
    t = text.strip().lower()
    if t.startswith("full"):
        parts = t.split(":")
        method = parts[1] if len(parts) > 1 and parts[1] else "uniform"
        if method not in ("uniform", "block"):
            raise InputError.bad_value("--recompute", text, "full[:uniform|block[:N]]")
        try:
            n = int(parts[2]) if len(parts) > 2 else 1
        except ValueError:
            raise InputError.bad_value("--recompute", text, "full:<method>:<integer layers>") from None
        if n < 1:
            raise InputError.bad_value("--recompute", text, "a positive number of layers")
        return {"recompute_granularity": "full", "recompute_method": method, "recompute_num_layers": n}
    if t == "selective":
        return {"recompute_granularity": "selective", "recompute_modules": ("core_attn",)}
    mods = tuple(m.strip() for m in t.split(",") if m.strip())
    bad = [m for m in mods if m not in RECOMPUTE_MODULES]
    if bad:
        raise InputError.bad_value("--recompute", text, f"none, full[:uniform|block:N], selective or modules from "
                                   f"{', '.join(RECOMPUTE_MODULES)}")
    return {"recompute_granularity": "selective", "recompute_modules": mods}


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise InputError.bad_value(name, value, "a positive integer")


def job_from_flags(*, model: str | None, system: str, gpus: int | None, gbs: int | None, mbs: int, seq: int | None,
                   precision: str, tp: int, pp: int, vpp: int | None, pipeline_layout: str | None, cp: int, ep: int,
                   etp: int | None, dispatcher: str | None, recompute: str | None, offload: str | None,
                   expandable_segments: bool, cuda_graph_scope: str | None, optimizer_offload: float | None,
                   routing_imbalance: float | None, force_balance: bool, dist_opt: bool):
    """A :class:`~moetune.spec.job.Job` from command-line flags (catalog model and system)."""
    from moetune.catalog.models import get_model
    from moetune.catalog.systems import get_system
    from moetune.spec.features import Features, parse_precision
    from moetune.spec.job import Job
    from moetune.spec.layout import Layout

    missing = [n for n, v in (("--model", model), ("--gpus", gpus), ("--gbs", gbs), ("--seq", seq)) if v is None]
    if missing:
        raise InputError(f"missing {', '.join(missing)} (or give --megatron-args / --bridge-config)")
    for name, val in (("--gpus", gpus), ("--gbs", gbs), ("--mbs", mbs), ("--seq", seq), ("--tp", tp), ("--pp", pp),
                      ("--vpp", vpp), ("--cp", cp), ("--ep", ep), ("--etp", etp)):
        _positive(name, val)
    arch = get_model(model)
    feats: dict[str, Any] = {"precision": parse_precision(precision), "expandable_segments": expandable_segments,
                             "use_distributed_optimizer": dist_opt,
                             # modern MoE recipes train without dropout (Bridge providers set 0.0)
                             "hidden_dropout": 0.0, "attention_dropout": 0.0}
    feats.update(parse_recompute(recompute))
    if dispatcher is not None:
        key = dispatcher.strip().lower()
        if key not in _DISPATCHERS:
            raise InputError.bad_value("--dispatcher", dispatcher, ", ".join(_DISPATCHERS))
        feats["moe_token_dispatcher_type"], feats["moe_flex_dispatcher_backend"] = _DISPATCHERS[key]
    if offload:
        from moetune.perfmodel.activations import OFFLOAD_MODULES

        mods = tuple(m.strip() for m in offload.split(",") if m.strip())
        bad = [m for m in mods if m not in OFFLOAD_MODULES]
        if bad:
            raise InputError.bad_value("--offload-modules", offload, f"modules from {', '.join(OFFLOAD_MODULES)}")
        feats["fine_grained_activation_offloading"] = True
        feats["offload_modules"] = mods
    if cuda_graph_scope:
        scopes = tuple(s.strip() for s in cuda_graph_scope.split(",") if s.strip())
        feats["cuda_graph_impl"] = "transformer_engine"
        feats["cuda_graph_scope"] = scopes
    if optimizer_offload is not None:
        if not 0.0 <= optimizer_offload <= 1.0:
            raise InputError.bad_value("--optimizer-offload", optimizer_offload, "a fraction in [0, 1]")
        feats["optimizer_cpu_offload"] = optimizer_offload > 0
        feats["optimizer_offload_fraction"] = optimizer_offload
    if routing_imbalance is not None:
        if routing_imbalance < 1.0:
            raise InputError.bad_value("--routing-imbalance", routing_imbalance, "max/mean load >= 1")
        feats["moe_routing_imbalance"] = routing_imbalance
    feats["moe_router_force_load_balancing"] = force_balance
    try:
        features = Features(**feats)
        layout = Layout(tp=tp, pp=pp, vpp=vpp, pipeline_layout=pipeline_layout, cp=cp, ep=ep, etp=etp)
        job = Job(model=arch, system=get_system(system), gpus=gpus, global_batch_size=gbs, micro_batch_size=mbs,
                  seq_length=seq, layout=layout, features=features)
    except ValueError as e:  # pydantic validation
        raise InputError(f"invalid job: {str(e).splitlines()[-1].strip()}") from None
    return job


def job_from_files(*, megatron_args: str | None, bridge_config: str | None, overrides: list[str], system: str | None,
                   gpus: int | None, model: str | None):
    """A Job from a Megatron-LM argument file/string or a Bridge YAML (helper C's readers)."""
    from moetune.io.config_to_job import job_from_config

    if megatron_args and bridge_config:
        raise InputError("give either --megatron-args or --bridge-config, not both")
    if megatron_args:
        if overrides:
            raise InputError(f"unexpected argument(s) {' '.join(overrides)}: overrides apply to --bridge-config only")
        from moetune.io.megatron_args import read_megatron_args

        cfg = read_megatron_args(megatron_args)
    else:
        from moetune.io.bridge import read_bridge_config

        cfg = read_bridge_config(bridge_config, overrides)
    _positive("--gpus", gpus)
    try:
        job = job_from_config(cfg, system=system, gpus=gpus, model=model)
    except (ValueError, TypeError) as e:  # a reader that did not name the field: still one line, exit 2
        raise InputError(f"{megatron_args or bridge_config}: invalid value ({str(e).splitlines()[0]})") from None
    return job


def _time_section(job, efficiency: str | None = None) -> tuple[Any, Any]:
    try:
        from moetune.perfmodel.step import estimate_time, render_time
    except ImportError:
        return None, None
    return estimate_time(job, efficiency), render_time


def _flops_per_token(job) -> float | None:
    try:
        from moetune.perfmodel.flops import flops_per_token
    except ImportError:
        return None
    return float(flops_per_token(job.model, job.seq_length, tp=job.layout.tp).total)


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
    console.print(t)
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
    console.print(ct)
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


def register(app: typer.Typer) -> None:
    @app.command("estimate")
    def estimate(
        overrides: Annotated[list[str] | None, typer.Argument(help="Hydra-style overrides for --bridge-config "
                                                               "(model.tensor_model_parallel_size=4).")] = None,
        model: Annotated[str | None, typer.Option(help="Catalog model name or JSON path.")] = None,
        system: Annotated[str | None, typer.Option(help="Catalog system (default DGX-H100).")] = None,
        gpus: Annotated[int | None, typer.Option(help="World size.")] = None,
        gbs: Annotated[int | None, typer.Option(help="Global batch size (sequences).")] = None,
        mbs: Annotated[int, typer.Option(help="Micro batch size.")] = 1,
        seq: Annotated[int | None, typer.Option(help="Sequence length.")] = None,
        precision: Annotated[str, typer.Option(help="BF16, FP8-CS, FP8-SC, MXFP8, NVFP4 ...")] = "bf16",
        tp: Annotated[int, typer.Option(help="Tensor parallel size.")] = 1,
        pp: Annotated[int, typer.Option(help="Pipeline parallel size.")] = 1,
        vpp: Annotated[int | None, typer.Option(help="Virtual pipeline stages per rank.")] = None,
        pipeline_layout: Annotated[str | None, typer.Option("--pipeline-layout", help="e.g. 'Et*3|(tt|)*29m|L'")] = None,
        cp: Annotated[int, typer.Option(help="Context parallel size.")] = 1,
        ep: Annotated[int, typer.Option(help="Expert parallel size.")] = 1,
        etp: Annotated[int | None, typer.Option(help="Expert tensor parallel size (Bridge default).")] = None,
        dispatcher: Annotated[str | None, typer.Option(help="allgather, alltoall, deepep, hybridep.")] = None,
        recompute: Annotated[str | None, typer.Option(help="none | full[:uniform|block:N] | selective | "
                                                            "comma list of modules")] = None,
        offload_modules: Annotated[str | None, typer.Option("--offload-modules",
                                                            help="fine-grained offload modules")] = None,
        expandable_segments: Annotated[bool, typer.Option("--expandable-segments/--no-expandable-segments")] = False,
        cuda_graph_scope: Annotated[str | None, typer.Option("--cuda-graph-scope", help="attn,moe_router,...")] = None,
        optimizer_offload: Annotated[float | None, typer.Option(help="optimizer CPU offload fraction")] = None,
        routing_imbalance: Annotated[float | None, typer.Option(help="hottest/mean expert-rank load")] = None,
        force_balance: Annotated[bool, typer.Option("--force-balance/--natural-routing")] = False,
        dist_opt: Annotated[bool, typer.Option("--dist-opt/--no-dist-opt")] = True,
        megatron_args: Annotated[str | None, typer.Option("--megatron-args",
                                                          help="Megatron-LM args file/string or model_config.yaml")] = None,
        bridge_config: Annotated[str | None, typer.Option("--bridge-config", help="Megatron-Bridge YAML")] = None,
        explain: Annotated[bool, typer.Option("--explain", help="What would free the most memory next.")] = False,
        json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")] = False,
        efficiency: Annotated[str | None, typer.Option(
            "--efficiency", help="Efficiency YAML from `moetune calibrate` (default: shipped fit).")] = None,
    ) -> None:
        """Estimate per-GPU memory of every pipeline stage (and step time when available)."""
        from moetune.perfmodel.memory import estimate_memory, explain_memory

        overrides = overrides or []
        if megatron_args or bridge_config:
            flagged = [n for n, v, d in (("--tp", tp, 1), ("--pp", pp, 1), ("--vpp", vpp, None), ("--cp", cp, 1),
                                         ("--ep", ep, 1), ("--etp", etp, None), ("--gbs", gbs, None),
                                         ("--seq", seq, None), ("--dispatcher", dispatcher, None),
                                         ("--recompute", recompute, None)) if v != d]
            if flagged:
                raise InputError(f"{', '.join(flagged)} cannot be combined with a config file; put them in the file "
                                 "(or as Bridge overrides)")
            job = job_from_files(megatron_args=megatron_args, bridge_config=bridge_config, overrides=overrides,
                                 system=system, gpus=gpus, model=model)
        else:
            if overrides:
                raise InputError(f"unexpected argument(s) {' '.join(overrides)} (overrides need --bridge-config)")
            job = job_from_flags(model=model, system=system or DEFAULT_SYSTEM, gpus=gpus, gbs=gbs, mbs=mbs, seq=seq,
                                 precision=precision, tp=tp, pp=pp, vpp=vpp, pipeline_layout=pipeline_layout, cp=cp,
                                 ep=ep, etp=etp, dispatcher=dispatcher, recompute=recompute, offload=offload_modules,
                                 expandable_segments=expandable_segments, cuda_graph_scope=cuda_graph_scope,
                                 optimizer_offload=optimizer_offload, routing_imbalance=routing_imbalance,
                                 force_balance=force_balance, dist_opt=dist_opt)
        try:
            from moetune.spec.validate import validate_job
        except ImportError:
            validate_job = None
        if validate_job is not None:
            validate_job(job)
        est = estimate_memory(job)
        suggestions = explain_memory(job, est) if explain else None
        tim, render_time = _time_section(job, efficiency)
        flops = _flops_per_token(job)
        if json_out:
            out: dict[str, Any] = {
                "job": job.model_dump(mode="json"),
                "memory": est.to_dict(),
                "time": tim.model_dump(mode="json") if tim is not None else None,
                "flops_per_token": flops,
                "assumptions": list(dict.fromkeys([*est.assumptions,
                                                   *(getattr(tim, "assumptions", None) or [])])),
            }
            if suggestions is not None:
                out["explain"] = [dataclasses.asdict(s) for s in suggestions]
            print_json(out)
            return
        lay = job.layout
        console.print(f"[bold]{job.model.name}[/] on {job.gpus}× {job.system.name}: {lay.short()} DP{job.dp} "
                      f"EDP{job.edp}, GBS {job.global_batch_size} MBS {job.micro_batch_size} seq {job.seq_length}, "
                      f"{job.num_microbatches} microbatches, {job.features.precision}")
        render_memory(est, suggestions)
        if tim is not None and render_time is not None:
            render_time(tim, console)

"""``moetune plan``: the main job — which layouts and features fit and run fastest, with launchable output."""

import functools
import sys
from typing import Annotated, Any

import typer

from moetune.commands import knobs
from moetune.commands.estimate import (
    LORA_ALPHA_HELP,
    LORA_DIM_HELP,
    LORA_TARGETS_HELP,
    TASK_HELP,
    task_json,
    task_label,
)
from moetune.errors import InputError
from moetune.output import console, err_console, print_json

DEFAULT = {"model": "DeepSeek-V3", "system": "DGX-H100", "gpus": 256, "gbs": 4096, "seq": 4096, "precision": "bf16"}


def _parse_fix(text: str | None) -> dict[str, Any]:
    """``--fix`` in the one vocabulary (:func:`moetune.io.load.parse_fix`; the same names as the estimate flags)."""
    from moetune.io.load import parse_fix

    return parse_fix(text)


def _layout_json(c) -> dict[str, Any]:
    lp, job = c.layout, c.job
    return {
        "tp": lp.tp, "pp": lp.pp, "vpp": lp.vpp, "cp": lp.cp, "ep": lp.ep, "etp": lp.etp, "dp": lp.dp,
        "edp": lp.edp, "mbs": lp.mbs, "pipeline_layout": lp.pipeline_layout,
        "num_microbatches": job.num_microbatches,
        "attention_mesh": f"TP{lp.tp} x CP{lp.cp} x DP{lp.dp} x PP{lp.pp}",
        "moe_mesh": f"ETP{lp.etp} x EP{lp.ep} x EDP{lp.edp} x PP{lp.pp}",
    }


def _dump(x: Any) -> Any:
    """Plain JSON-able data for a pydantic model, dataclass or value (one serialiser: moetune.output)."""
    import orjson

    from moetune.output import to_json_bytes

    return orjson.loads(to_json_bytes(x, indent=False))


def reproduce_line(c, starts: dict[str, Any] | None = None) -> str:
    """``moetune estimate …`` that rebuilds candidate ``c`` exactly (same time and memory)."""
    from moetune.io.load import reproduce_command

    st = (starts or {}).get(c.job.features.precision)
    return reproduce_command(c.job, st.recipe if st is not None else None,
                             st.recipe_layout if st is not None else None)


def candidate_json(c, nxt=None, *, with_launch: bool = True, starts: dict[str, Any] | None = None) -> dict[str, Any]:
    from moetune.plan.explain import why_better
    from moetune.plan.launch import launch_for

    out = {
        "reproduce": reproduce_line(c, starts),
        "layout": _layout_json(c),
        "features": c.job.features.model_dump(mode="json"),
        "memory": _dump(c.memory),
        "time": _dump(c.time),
        "warnings": [_dump(f) for f in c.findings],
    }
    if nxt is not None:
        out["why"] = why_better(c, nxt)
    if with_launch:
        out["launch"] = launch_for(c.job)
    return out


def _collector_paused(cmd):
    """Run the command with Python's cyclic collector paused (:func:`moetune.memo.collector_paused`): its start-up
    imports of the planner (numpy, the step and memory models, the rules registry) and its search allocate
    long-lived objects that no collection frees; ~0.04 s of start-up collections saved. Same signature for typer."""

    @functools.wraps(cmd)
    def run(*args, **kwargs):
        from moetune.memo import collector_paused

        with collector_paused():
            return cmd(*args, **kwargs)

    return run


def register(app: typer.Typer) -> None:
    @app.command("plan")
    @_collector_paused
    def plan_cmd(
        recipe: Annotated[str | None, typer.Option(
            "--recipe", help="Start from this Bridge perf recipe (`moetune recipes`): its model/system/GPUs/batch "
                             "unless given, its non-searched settings kept; 'none' = library defaults, 'perf-common' = "
                             "library defaults with the perf launcher's common settings. Default: the recipe of the "
                             "same model/system/precision when one exists, else 'perf-common'.")] = None,
        model: Annotated[str | None, typer.Option(help="Catalog model name or HF config.json path.")] = None,
        system: Annotated[str | None, typer.Option(help="Catalog system name or system YAML.")] = None,
        gpus: Annotated[int | None, typer.Option(help="World size.")] = None,
        gbs: Annotated[int | None, typer.Option(help="Global batch size (sequences).")] = None,
        seq: Annotated[int | None, typer.Option("--seq", "--seq-length", help="Sequence length.")] = None,
        precision: Annotated[str | None, typer.Option(help="Precision(s), comma-separated: bf16,fp8_cs,mxfp8,...")] = None,
        mbs: Annotated[str, typer.Option(help="Micro-batch sizes to search, comma-separated.")] = "1,2,4",
        fix: Annotated[str | None, typer.Option(
            help="Pin dimensions, the estimate flags' names: tp,pp,vpp,cp,ep,etp,mbs,pipeline_layout,precision,fsdp,"
                 "dispatcher,ep_overlap,delay_wgrad,tp_comm_overlap,recompute,offload,cuda_graph_scope (lists "
                 "joined with +), e.g. tp=2,ep=64,recompute=full,ep_overlap=1")] = None,
        dispatchers: Annotated[str, typer.Option(help="Dispatchers to search: alltoall,deepep,hybridep,allgather")]
        = "alltoall,deepep,hybridep",
        max_recompute: Annotated[str, typer.Option(help="none | selective | full")] = "full",
        min_headroom_gib: Annotated[float | None, typer.Option(
            help="GiB kept free on the most loaded rank (default: estimate's policy, max(3 % of HBM, 2 GiB)).")
        ] = None,
        top: Annotated[int, typer.Option(help="Candidates to report.")] = 5,
        no_offload: Annotated[bool, typer.Option("--no-offload", help="Never consider offloading.")] = False,
        task: Annotated[str | None, typer.Option(help=TASK_HELP)] = None,
        lora_dim: Annotated[int | None, typer.Option("--lora-dim", help=LORA_DIM_HELP)] = None,
        lora_alpha: Annotated[int | None, typer.Option("--lora-alpha", help=LORA_ALPHA_HELP)] = None,
        lora_target_modules: Annotated[str | None, typer.Option("--lora-target-modules", help=LORA_TARGETS_HELP)
                                       ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")] = False,
    ) -> None:
        """Search layouts and features; rank what fits by predicted step time; emit a launchable config."""
        from moetune.catalog.models import get_model
        from moetune.catalog.systems import get_system
        from moetune.io.load import RECIPE_NONE, RECIPE_PERF_COMMON
        from moetune.plan.search import DISPATCHERS, PlanRequest, plan, request_headroom
        from moetune.spec.features import Features, parse_precision

        given = {"model": model, "system": system, "gpus": gpus, "gbs": gbs, "seq": seq, "precision": precision}
        if recipe is not None and recipe.strip().lower() not in RECIPE_NONE | RECIPE_PERF_COMMON:
            given = _recipe_defaults(recipe, given)
        used_default = [k for k, v in given.items() if v is None]
        vals = {k: (v if v is not None else DEFAULT[k]) for k, v in given.items()}
        if max_recompute not in ("none", "selective", "full"):
            raise InputError.bad_value("--max-recompute", max_recompute, "none, selective or full")
        disp = tuple(d.strip().lower() for d in dispatchers.split(",") if d.strip())
        for d in disp:
            if d not in DISPATCHERS:
                raise InputError.bad_value("--dispatchers", d, f"one of {', '.join(DISPATCHERS)}")
        try:
            mbs_opts = tuple(int(x) for x in mbs.split(",") if x.strip())
        except ValueError:
            raise InputError.bad_value("--mbs", mbs, "comma-separated positive integers") from None
        if not mbs_opts or min(mbs_opts) < 1:
            raise InputError.bad_value("--mbs", mbs, "comma-separated positive integers")
        for k in ("gpus", "gbs", "seq"):
            if int(vals[k]) < 1:
                raise InputError.bad_value(f"--{k}", vals[k], "a positive integer")
        if min_headroom_gib is not None and not 0.0 <= min_headroom_gib < 1e6:  # also rejects nan
            raise InputError.bad_value("--min-headroom-gib", min_headroom_gib, "a non-negative number of GiB")
        if top < 1:
            raise InputError.bad_value("--top", top, "a positive number of candidates")
        from moetune.io.load import task_updates

        task_up = task_updates(task, lora_dim, lora_alpha, lora_target_modules)  # a property of the job, not searched
        fixd = _parse_fix(fix)
        precs = tuple(dict.fromkeys(parse_precision(p) for p in str(vals["precision"]).split(",") if p.strip()))
        if "precision" in fixd:
            precs = (parse_precision(fixd.pop("precision")),)
        if "dispatcher" in fixd:
            d = str(fixd.pop("dispatcher")).lower()
            disp = ("deepep" if d == "flex" else d,)
        model_arch, system_obj = get_model(str(vals["model"])), get_system(str(vals["system"]))
        from moetune.rules.precision import precision_unsupported

        for p in precs:  # fail before any search (PRC-008), not after it with "none fits"
            bad_precision = precision_unsupported(p, system_obj.gpu.name)
            if bad_precision:
                raise InputError(f"{system_obj.name}: {bad_precision}", field="precision", value=p)
        # plain text (no markup, nothing rich would change): printed without rich, which `--json` never loads
        if len(used_default) == len(given):
            print("Planning the embedded default: DeepSeek-V3 on 256 x DGX-H100, GBS 4096, sequence 4096, BF16 "
                  "(pass --model/--system/--gpus/--gbs/--seq/--precision to plan your own job).", file=sys.stderr)
        elif used_default:
            print("defaults used for: " + ", ".join(f"{k}={DEFAULT[k]}" for k in used_default), file=sys.stderr)
        req = PlanRequest(
            model=model_arch, system=system_obj, gpus=int(vals["gpus"]),
            global_batch_size=int(vals["gbs"]), seq_length=int(vals["seq"]), precisions=precs, mbs_options=mbs_opts,
            fix=fixd, dispatchers=disp, max_recompute=max_recompute, min_headroom_gib=min_headroom_gib,
            top=top, allow_offload=not no_offload, recipe=recipe, workers=knobs.workers(), efficiency=knobs.efficiency(),
            task=tuple(task_up.items()),
        )
        res = plan(req)  # progress: moetune.progress.report, rendered on stderr by the console script
        if not res.candidates:
            _impossible(res, json_out)
            raise typer.Exit(1)
        cands = res.candidates
        from moetune.plan.ties import group_candidates
        # the table shows the launch config of #1 only: the others' (Bridge / Megatron-LM / Slurm) are made for --json
        items = [candidate_json(c, cands[i + 1] if i + 1 < len(cands) else None, starts=res.starts,
                                with_launch=json_out or i == 0)
                 for i, c in enumerate(cands)]
        out = {
            "request": {"model": req.model.name, "system": req.system.name, "gpus": req.gpus,
                        "gbs": req.global_batch_size, "seq": req.seq_length, "precisions": list(precs),
                        "fix": fixd, "task": task_json(Features(**task_up)), "dispatchers": list(disp) if model_arch.is_moe else [],
                        "max_recompute": max_recompute,
                        "min_headroom_gib": request_headroom(req),
                        "defaults_used": used_default,
                        "recipe": {p: st.recipe for p, st in res.starts.items()},
                        "starting_features": {p: list(st.notes) for p, st in res.starts.items()}},
            "headroom_policy": f"device memory (reserved + CUDA context, NCCL, DeepEP) of the most loaded rank + "
                               f"{request_headroom(req):.2f} GiB <= HBM capacity (the policy of `moetune estimate`)",
            "candidates": items,
            "searched": res.searched, "feasible": res.feasible, "seconds": round(res.seconds, 3),
            "layouts": res.layouts, "pruned": {"memory_floor": res.pruned_memory, "compute_bound": res.pruned_bound,
                                               "checker": res.rejected_by_check},
            "notes": res.notes,
            # distinct layouts (VPP/MBS near-duplicates folded) and which tie with #1 (plan/ties.py)
            "groups": [g.to_json() for g in group_candidates(cands)],
        }
        if json_out:
            print_json(out)
            return
        _render(out)


def _recipe_defaults(recipe: str, given: dict[str, Any]) -> dict[str, Any]:
    """The plan request's model / system / GPUs / batch / sequence / precision from a recipe where not given."""
    from moetune.catalog.recipes import get_recipe, recipe_summary
    from moetune.io.load import RECIPE_PRECISION

    rec = get_recipe(recipe)
    row = recipe_summary(rec["name"])
    prec = next((k for k, v in RECIPE_PRECISION.items() if v == row["precision"]), None)
    fill = {"model": rec["model"], "system": rec["system"], "gpus": rec["gpus"], "gbs": row["gbs"],
            "seq": row["seq"], "precision": prec}
    return {k: (v if v is not None else fill.get(k)) for k, v in given.items()}


def _impossible(res, json_out: bool) -> None:
    from moetune.plan.suggest import suggestions_for_impossible

    info = suggestions_for_impossible(res)
    if json_out:
        print_json({"candidates": [], "searched": res.searched, "feasible": 0, "seconds": round(res.seconds, 3),
                    "impossible": info})
        return
    err_console.print(f"[bold red]No layout fits.[/] {info['summary']}")
    for c in info.get("closest", []):
        err_console.print(f"  closest: {c['layout']}  peak {c['peak_gib']:.1f} GiB vs {c['capacity_gib']:.1f} GiB "
                          f"(over by {c['over_gib']:.1f} GiB)")
    for s in info.get("what_would_fit", []):
        err_console.print(f"  - {s}")


def _render(out: dict[str, Any]) -> None:
    req = out["request"]
    label = task_label(req.get("task") or {})
    console.print(f"[bold]moetune plan[/] {req['model']} on {req['gpus']} x {req['system']}, GBS {req['gbs']}, "
                  f"seq {req['seq']}, {','.join(req['precisions'])}{label}")
    console.print(f"searched {out['searched']} configs over {out['layouts']} layouts in {out['seconds']} s; "
                  f"{out['feasible']} feasible")
    console.print(f"fit rule: {out['headroom_policy']}", style="dim", markup=False)
    groups = out.get("groups") or [{"members": [i + 1], "step_time_range_s": [0, 0], "vpp": [], "mbs": [],
                                    "ties_with_first": i == 0} for i in range(len(out["candidates"]))]
    for g in groups:
        i = g["members"][0] - 1
        c = out["candidates"][i]
        lay, f, m, tm = c["layout"], c["features"], c["memory"], c["time"]
        layout = f"TP{lay['tp']} PP{lay['pp']}" + (f" VPP{lay['vpp']}" if lay["vpp"] > 1 else "") + \
            f" CP{lay['cp']} EP{lay['ep']} ETP{lay['etp']} DP{lay['dp']} EDP{lay['edp']} MBS{lay['mbs']}"
        rec = f.get("recompute_granularity") or ""
        if rec == "selective":
            rec = "recompute " + "+".join(f.get("recompute_modules") or [])
        elif rec == "full":
            rec = "full recompute"
        parts = [f["moe_token_dispatcher_type"] + (f"/{f['moe_flex_dispatcher_backend']}"
                                                   if f.get("moe_flex_dispatcher_backend") else "")
                 if lay["ep"] * lay["etp"] > 1 else "", rec]
        if f.get("use_megatron_fsdp"):
            parts.append("Megatron-FSDP " + str(f.get("data_parallel_sharding_strategy")))
        if f.get("tp_comm_overlap"):
            parts.append("TP comm overlap")
        if f.get("overlap_moe_expert_parallel_comm"):
            parts.append("EP overlap" + (" + delayed wgrad" if f.get("delay_wgrad_compute") else ""))
        if f.get("cuda_graph_scope"):
            parts.append("graphs " + ",".join(f["cuda_graph_scope"]))
        if f.get("moe_expert_rank_capacity_factor") is not None:
            parts.append(f"rank capacity {f['moe_expert_rank_capacity_factor']:g}"
                         + (" + paged stash" if f.get("moe_paged_stash") else ""))
        if f.get("fine_grained_activation_offloading") or f.get("optimizer_cpu_offload"):
            parts.append("offload")
        band = tm.get("band")
        bt = f" [{band['lo_s']:.2f}-{band['hi_s']:.2f}]" if band else ""
        tie = "  (tie with #1: within noise)" if g["ties_with_first"] and i > 0 else ""
        # ranking lines stay within 100 columns: the stats move to the second line when the first would not fit
        head = f"#{i + 1} {layout}  {tm['step_time_s']:.2f}{bt} s/step"
        stats = f"{tm['model_tflops_per_gpu']:.0f} TFLOP/s/GPU  {m.get('peak_allocated_gib', 0):.1f} GiB"
        wall = f"wall: {tm.get('dominant_wall')}{tie}"
        if len(head) + 2 + len(stats) <= 100:
            head, wall = f"{head}  {stats}", wall
        else:
            wall = f"{stats}  {wall}"
        console.print(head, markup=False)
        if len(g["members"]) > 1:
            lo, hi = g["step_time_range_s"]
            console.print(f"    + {len(g['members']) - 1} near-duplicate(s) #"
                          + ",#".join(str(x) for x in g["members"][1:])
                          + f": VPP {'/'.join(map(str, g['vpp']))}, MBS {'/'.join(map(str, g['mbs']))}, "
                          f"{lo:.2f}-{hi:.2f} s/step", markup=False)
        import textwrap

        feats_text = ", ".join(p for p in parts if p) or "no recompute, no overlap or graph features"
        for line in textwrap.wrap(f"{wall}; {feats_text}", width=100, initial_indent="    ",
                                  subsequent_indent="      "):
            console.print(line, markup=False)
        console.print("    reproduce: " + c["reproduce"], markup=False, soft_wrap=True, style="dim")
    best = out["candidates"][0]
    bl, bt = best["layout"], best["time"]
    mfu = bt.get("mfu") or {}
    console.print(f"#1 meshes: Attention {bl['attention_mesh']} | MoE {bl['moe_mesh']}; "
                  f"{bl['num_microbatches']} microbatches; {bt['tokens_per_s_per_gpu']:.0f} tokens/s/GPU; "
                  f"MFU {100 * mfu.get('vs_bf16_peak', 0):.1f}% of BF16 peak", markup=False)
    why = best.get("why")
    if why:
        terms = ", ".join(f"{x['term']} {x['delta_s']:+.3f}s" for x in why["largest_terms"])
        ties = [f"#{g['members'][0]}" for g in groups[1:] if g["ties_with_first"]]
        if why.get("within_noise"):
            console.print(f"#1 vs #2: within noise (prediction bands overlap; {why['vs_next_pct']:.1f} % apart: "
                          f"{terms}); layouts tied with #1: {', '.join(ties) or 'none'}", markup=False)
        else:
            console.print(f"#1 beats #2 by {why['vs_next_step_time_s']:.3f} s/step ({why['vs_next_pct']:.1f} %), "
                          f"beyond the prediction bands: {terms}", markup=False)
    launch = best.get("launch") or {}
    if launch:
        console.print(f"\n[bold]Launch #1[/] ({launch['nodes']} nodes x {launch['gpus_per_node']} GPUs"
                      + (f", recipe {launch['recipe']}" if launch.get("recipe") else "") + ")")
        console.print("Bridge overrides (layout and features; --json has the architecture fields too): "
                      + " ".join(launch["bridge_overrides_tuning"]), soft_wrap=True, markup=False)
        console.print("env: " + " ".join(f"{k}={v}" for k, v in launch["env"].items()), soft_wrap=True,
                      markup=False)
        for note in launch.get("notes", []):
            console.print("note: " + note, soft_wrap=True, markup=False, style="yellow")
        console.print("(--json prints the Megatron-LM flags and the Slurm batch script)")

"""``moetune sweep init|submit|status|collect`` and ``moetune report``."""

from pathlib import Path
from typing import Annotated

import typer

from moetune.errors import InputError
from moetune.output import console, print_json

sweep_app = typer.Typer(help="Phased sweeps (fit, scale, profile, retune, validate) as Slurm jobs; collect and decide.",
                        no_args_is_help=True)


@sweep_app.command("init")
def init_cmd(
    out: Annotated[Path, typer.Option("--out", help="New sweep directory.")],
    from_plan: Annotated[Path | None, typer.Option("--from-plan", help="Output of `moetune plan --json`.")] = None,
    baseline: Annotated[Path | None, typer.Option("--baseline", help="Baseline config (Bridge YAML / MLM args).")] = None,
    candidate: Annotated[int, typer.Option("--candidate", help="Plan candidate index to tune.")] = 0,
    model: Annotated[str | None, typer.Option(help="Model (when the plan has no request).")] = None,
    system: Annotated[str | None, typer.Option(help="System (when the plan has no request).")] = None,
    gpus: Annotated[int | None, typer.Option(help="GPU count (when the plan has no request).")] = None,
    gbs: Annotated[int | None, typer.Option(help="Global batch size (when the plan has no request).")] = None,
    seq: Annotated[int | None, typer.Option(help="Sequence length (when the plan has no request).")] = None,
    framework: Annotated[str, typer.Option(help="megatron-bridge | megatron-lm")] = "megatron-bridge",
    entry: Annotated[str, typer.Option(help="run_recipe | run_script (Bridge perf harness) | pretrain_gpt")]
    = "run_recipe",
    recipe: Annotated[str | None, typer.Option(help="Bridge recipe, e.g. qwen3_30b_a3b_pretrain_config")] = None,
    model_family: Annotated[str | None, typer.Option(help="perf harness -m")] = None,
    model_recipe: Annotated[str | None, typer.Option(help="perf harness -mr")] = None,
    workdir: Annotated[str | None, typer.Option(help="Folder with the entry script on the nodes.")] = None,
    container_image: Annotated[str | None, typer.Option(help="srun --container-image (pyxis).")] = None,
    mount: Annotated[list[str] | None, typer.Option(help="Container mount SRC:DST (repeatable).")] = None,
    account: Annotated[str | None, typer.Option(help="Slurm account.")] = None,
    partition: Annotated[str | None, typer.Option(help="Slurm partition.")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="Slurm time limit per run.")] = None,
    profiler: Annotated[str, typer.Option(help="nsys | torch (profile phase)")] = "nsys",
    data: Annotated[str, typer.Option(help="'mock' (benchmark-only) or the dataset identity.")] = "mock",
    screen_iters: Annotated[int, typer.Option(help="Post-warm-up screen iterations (6-12).")] = 10,
    validate_steps: Annotated[int, typer.Option(help="Validation steps (>= 50; window = last 10).")] = 50,
    scale_candidates: Annotated[int, typer.Option(help="Plan candidates compared in the scale phase.")] = 3,
    dry_run_replay: Annotated[Path | None, typer.Option(
        "--dry-run-replay",
        help="TESTING ONLY: REPLAY.yaml mapping run-name patterns to recorded {log, trace}; jobs copy them "
             "instead of training.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Create a sweep directory: contract.yaml, sweep.yaml and one Slurm batch script per run."""
    from moetune.sweep.plan_input import read_baseline, read_plan
    from moetune.sweep.sweepdir import init_sweep

    if (from_plan is None) == (baseline is None):
        raise InputError("give exactly one of --from-plan PLAN.json or --baseline CONFIG")
    plan = read_plan(from_plan) if from_plan else read_baseline(baseline, system=system, gpus=gpus,  # type: ignore[arg-type]
                                                                model=model)
    if framework not in ("megatron-bridge", "megatron-lm"):
        raise InputError.bad_value("--framework", framework, "megatron-bridge or megatron-lm")
    if framework == "megatron-lm":
        entry = "pretrain_gpt"
    elif entry not in ("run_recipe", "run_script"):
        raise InputError.bad_value("--entry", entry, "run_recipe or run_script for megatron-bridge")
    if recipe is not None:
        from moetune.catalog.recipes import check_recipe_name

        recipe = check_recipe_name(recipe)
    if profiler not in ("nsys", "torch"):
        raise InputError.bad_value("--profiler", profiler, "nsys or torch")
    launcher = {"framework": framework, "entry": entry, "recipe": recipe, "model_family": model_family,
                "model_recipe": model_recipe, "workdir": workdir or ("/opt/megatron-lm" if framework == "megatron-lm"
                                                                     else "/opt/Megatron-Bridge"),
                "container_image": container_image, "container_mounts": list(mount or []), "account": account,
                "partition": partition, "time_limit": time_limit, "profiler": profiler}
    opts = {"model": model, "system": system, "gpus": gpus, "global_batch_size": gbs, "seq_length": seq,
            "launcher": launcher, "data": data, "screen_iters": screen_iters, "validate_steps": validate_steps}
    sweep = init_sweep(out, plan, candidate=candidate, opts=opts, replay_map=dry_run_replay,
                       scale_candidates=scale_candidates)
    if json_out:
        print_json(sweep)
        return
    console.print(f"sweep [bold]{sweep['name']}[/] in {out}: {len(sweep['runs'])} runs"
                  + ("  [yellow](--dry-run-replay: jobs replay recorded logs, no training)[/]" if dry_run_replay
                     else ""))
    for r in sweep["runs"]:
        dep = f" after{r['depends']['type'][5:]}:{','.join(r['depends']['on'])}" if r["depends"]["on"] else ""
        console.print(f"  {r['phase']:<9} {r['name']:<40} {r['variable'] or '':<14}{dep[:60]}", soft_wrap=True)
    console.print(f"next: moetune sweep submit {out}")


@sweep_app.command("submit")
def submit_cmd(
    directory: Annotated[Path, typer.Argument(help="Sweep directory.")],
    phase: Annotated[list[str] | None, typer.Option(help="Only these phases (repeatable).")] = None,
    run: Annotated[list[str] | None, typer.Option(help="Only these runs (repeatable).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the sbatch commands only.")] = False,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """sbatch every run with --dependency on the previous phase; job ids go to DIR/jobs.json."""
    from moetune.sweep.submit import submit_sweep

    res = submit_sweep(directory, phases=phase, runs=run, dry_run=dry_run)
    if json_out:
        print_json(res)
        return
    for c in res["commands"] if dry_run else []:
        console.print(c, soft_wrap=True)
    for name, job in res["submitted"].items():
        console.print(f"  {name:<40} {job}")


@sweep_app.command("status")
def status_cmd(directory: Annotated[Path, typer.Argument()],
               json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Job states from squeue / sacct / scontrol."""
    from moetune.sweep.status import sweep_status

    res = sweep_status(directory)
    if json_out:
        print_json(res)
        return
    for r in res["runs"]:
        console.print(f"  {r['phase']:<9} {r['run']:<40} {r['job_id'] or '-':>8} {r['state']:<12} {r['detail']}")
    console.print("all finished" if res["all_finished"] else "still running")


@sweep_app.command("collect")
def collect_cmd(directory: Annotated[Path, typer.Argument()],
                json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Parse logs/traces, apply acceptance, pick winners, write collect/results.json and collect/calibration.csv."""
    from moetune.commands import knobs
    from moetune.sweep.collect import collect_sweep

    res = collect_sweep(directory, efficiency=knobs.efficiency(), trace_workers=knobs.trace_workers())
    if json_out:
        print_json(res)
        return
    for r in res["runs"]:
        mark = ("[dim]pending [/]" if r.get("status") == "pending" else
                "[green]accepted[/]" if r["accepted"] else "[red]rejected[/]")
        st = f"{r['step_time_s']:.4g} s" if r.get("step_time_s") else "-"
        console.print(f"  {r['run']:<40} {mark} {st:>10}  {'; '.join(r['reasons'])}", soft_wrap=True)
    if res.get("pending"):
        console.print(f"{res['pending']} run(s) pending (not run yet): `moetune sweep submit {directory}`")
    for w in res["winners"]:
        console.print(f"winner {w['phase']}: {w.get('run') or '-'} ({w.get('reason', '')})")
    console.print(f"calibration rows: {res['calibration_csv']}")


def report_cmd(
    source: Annotated[Path, typer.Argument(help="Sweep directory, PLAN.json or ESTIMATE.json.")],
    html_out: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report.")] = None,
    md_out: Annotated[Path | None, typer.Option("--md", help="Write a Markdown report.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print what was written as JSON.")] = False,
) -> None:
    """Report with plots: memory per stage, time per wall, throughput vs headroom, predicted vs measured, A/B,
    evidence bundle."""
    from moetune.commands import knobs
    from moetune.report.data import load_report_input
    from moetune.report.render import render_html, render_markdown

    data = load_report_input(source, efficiency=knobs.efficiency(), trace_workers=knobs.trace_workers())
    written = {}
    if html_out is None and md_out is None:
        text = render_markdown(data)
        if json_out:
            print_json({"markdown": text})
        else:
            console.print(text, markup=False, highlight=False, soft_wrap=True)
        return
    from moetune.files import check_writable, write_atomic

    targets = [p for p in (html_out, md_out) if p is not None]
    check_writable(targets)  # every target checked before anything is written
    if html_out is not None and md_out is not None and html_out.resolve() == md_out.resolve():
        raise InputError.bad_value("--md", str(md_out), "a different file than --html")
    rendered = {"html": render_html(data) if html_out is not None else None,
                "md": render_markdown(data) if md_out is not None else None}
    for kind, path in (("html", html_out), ("md", md_out)):
        if path is not None:
            write_atomic(path, rendered[kind])
            written[kind] = str(path)
    if json_out:
        print_json({"written": written, "kind": data["kind"]})
    else:
        for k, v in written.items():
            console.print(f"wrote {k}: {v}")


def register(app: typer.Typer) -> None:
    app.add_typer(sweep_app, name="sweep")
    app.command("report")(report_cmd)

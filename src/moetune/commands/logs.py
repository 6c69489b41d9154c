"""``moetune logs``, ``moetune diagnose`` and ``moetune compare``: evidence from training logs.

* ``logs FILE… [--window A-B] [--gpus N] [--seq-length N] [--json]`` — per run: iterations, steady window, step time
  (median / mean / CI), tokens/s/GPU, TFLOP/s/GPU, loss health, memory peaks, layout and configuration.
  Exit code 1 when a file has no training iterations (it says so); 2 for unreadable or non-log input.
* ``diagnose FILE… [--json]`` — findings (kind, evidence lines, cause, how to confirm, ordered fixes).
* ``compare A B [--window-a A-B] [--window-b A-B] [--json]`` — regression / improvement / no_change /
  not_comparable with delta and bootstrap CI, the measurement-contract check and the config differences.
"""

from typing import Annotated, Any

import typer

from moetune.errors import MoetuneError
from moetune.output import console, err_console, print_json, readable


class NoIterationsError(MoetuneError):
    """A readable log without any training iteration line (exit code 1)."""

    exit_code = 1


def _fmt(x: Any, spec: str = ".4g", unit: str = "") -> str:
    if x is None:
        return "-"
    try:
        return f"{x:{spec}}{unit}"
    except (TypeError, ValueError):
        return str(x)


def _no_iter_message(rec) -> str:
    from moetune.evidence.diagnose import diagnose_run

    kinds = sorted({f.kind for f in diagnose_run(rec)})
    hint = f"; it shows: {', '.join(kinds)} (run `moetune diagnose`)" if kinds else ""
    return f"{rec.path}: no training iterations found ({rec.lines} lines read){hint}"


def logs_cmd(
    files: Annotated[list[str], typer.Argument(help="Training logs (Megatron-LM, Megatron-Bridge, NeMo) or golden JSON")],
    window: Annotated[str | None, typer.Option("--window", help="Declared steady window FIRST-LAST, e.g. 41-50")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="GPU count, when the log does not print it")] = None,
    seq_length: Annotated[int | None, typer.Option("--seq-length", min=1, help="Sequence length, if not printed")]
    = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout")] = False,
) -> None:
    """Steady-state step time, throughput, loss health and memory of each run."""
    from moetune.evidence.logs import read_run
    from moetune.evidence.steady import parse_window, summarize_run

    win = parse_window(window)
    records = [read_run(f) for f in files]
    empty = [r for r in records if not r.has_iterations]
    runs = [summarize_run(r, win, gpus=gpus, seq_length=seq_length) for r in records if r.has_iterations]
    if not runs:
        raise NoIterationsError(_no_iter_message(empty[0]))
    if json_out:
        print_json({"runs": runs, "without_iterations": [r.path for r in empty]})
    else:
        for s in runs:
            _print_summary(s)
    for r in empty:
        err_console.print(f"[yellow]note:[/] {_no_iter_message(r)}", markup=True, soft_wrap=True)
    if empty:
        raise typer.Exit(1)


def _print_summary(s) -> None:
    from rich.table import Table

    st = s.step_time_s
    t = Table(title=f"{s.file}  ({s.source})", show_header=False, title_justify="left")
    t.add_column("what")
    t.add_column("value")
    t.add_row("iterations", f"{s.iterations} logged, range {s.iteration_range}, segments {s.segments}")
    t.add_row("steady window", f"{s.steady_window} ({s.window_source}, {s.samples} samples)")
    ci = st.get("ci")
    t.add_row("step time", f"median {_fmt(st['median'])} s, mean {_fmt(st['mean'])} s"
              + (f", 95% CI of median [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else ""))
    t.add_row("tokens/s/GPU", _fmt(s.tokens_per_s_per_gpu, ".1f"))
    t.add_row("TFLOP/s/GPU", _fmt(s.tflops_per_gpu.get("median"), ".1f"))
    lo = s.loss
    t.add_row("loss", f"finite={lo['finite']}, NaN iterations {lo['nan_iterations'][:8]}, skipped "
              f"{lo['skipped_iterations']}, first {_fmt(lo.get('first'))}, last {_fmt(lo.get('last'))}")
    mem = s.memory
    if mem.get("peak_max_allocated_gib") is not None:
        t.add_row("memory", f"peak max-allocated {_fmt(mem['peak_max_allocated_gib'], '.2f')} GiB, max-reserved "
                  f"{_fmt(mem.get('peak_max_reserved_gib'), '.2f')} GiB over ranks {list(mem['per_rank'])}")
    if mem.get("theoretical_mib"):
        th = mem["theoretical_mib"]
        t.add_row("theoretical", f"weight+optimizer {th['weight_and_optimizer']} MiB, activation {th['activation']}, "
                  f"total {th['total']}")
    if s.layout:
        t.add_row("layout", ", ".join(f"{k}={v}" for k, v in s.layout.items()))
    if s.bridge_step_time_s:
        b = s.bridge_step_time_s
        t.add_row("Step Time lines", f"median {_fmt(b['median'])} s (excluded profiled {b['excluded_profiled']})")
    for n in s.notes:
        t.add_row("note", n)
    console.print(readable(t, names=("what",)))


def diagnose_cmd(
    files: Annotated[list[str], typer.Argument(help="Training logs to diagnose")],
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout")] = False,
) -> None:
    """Find failures and anomalies (OOM, NCCL timeouts, dispatcher failures, assertions, NaN, slowdowns)."""
    from moetune.evidence.diagnose import diagnose_paths

    findings = diagnose_paths(files)
    if json_out:
        print_json({"findings": findings})
        return
    if not findings:
        console.print("no findings: no failure or anomaly recognised in " + ", ".join(files))
        return
    from rich.markup import escape

    for i, f in enumerate(findings, 1):
        console.print(f"[bold]{i}. \\[{f.severity}] {f.kind}[/]: {escape(f.summary)}", markup=True, soft_wrap=True)
        for e in f.evidence[:6]:
            console.print(f"     {e.file or ''}:{e.line}: {e.text[:200]}", markup=False, soft_wrap=True)
        console.print(f"   cause: {f.cause}", markup=False, soft_wrap=True)
        console.print(f"   confirm: {f.confirm}", markup=False, soft_wrap=True)
        for j, fx in enumerate(f.fixes, 1):
            console.print(f"   fix {j}: {fx}", markup=False, soft_wrap=True)
        if f.rule_ids:
            console.print(f"   rules: {', '.join(f.rule_ids)} (moetune check)", markup=False)


def compare_cmd(
    a: Annotated[str, typer.Argument(help="Baseline run (log or golden JSON)")],
    b: Annotated[str, typer.Argument(help="Candidate run")],
    window_a: Annotated[str | None, typer.Option("--window-a", help="Declared window of A, FIRST-LAST")] = None,
    window_b: Annotated[str | None, typer.Option("--window-b", help="Declared window of B, FIRST-LAST")] = None,
    window: Annotated[str | None, typer.Option("--window", help="Declared window for both runs")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="GPU count (to rank differences by the model)")]
    = None,
    predicted: Annotated[str | None, typer.Option(
        "--predicted", help="Prediction for B (JSON of `moetune estimate --json` or `moetune plan --json`): report "
                            "whether B's measured step time lands inside the predicted band")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout")] = False,
) -> None:
    """Is B slower or faster than A, by how much, beyond noise, and which differences explain it."""
    from moetune.commands import knobs
    from moetune.evidence.compare import compare_runs
    from moetune.evidence.logs import read_run
    from moetune.evidence.steady import parse_window

    wa = parse_window(window_a) or parse_window(window)
    wb = parse_window(window_b) or parse_window(window)
    ra = read_run(a)
    rb = ra if b == a else read_run(b)
    for r in (ra, rb):
        if not r.has_iterations:
            raise NoIterationsError(_no_iter_message(r))
    pred = None
    if predicted is not None:
        from moetune.perfmodel.uncertainty import predicted_band_from_file

        pred = predicted_band_from_file(predicted)
    c = compare_runs(ra, rb, window_a=wa, window_b=wb, gpus=gpus, efficiency=knobs.efficiency())
    if pred is not None:
        meas = c.b.get("median_s")
        pred["measured_s"] = meas
        pred["inside_band"] = meas is not None and pred["lo_s"] <= meas <= pred["hi_s"]
    if json_out:
        if pred is None:
            print_json(c)
        else:
            import orjson

            from moetune.output import to_json_bytes

            print_json({**orjson.loads(to_json_bytes(c, indent=False)), "prediction": pred})
        return
    if not c.contract["ok"]:
        console.print("[bold red]contract broken:[/] " + "; ".join(c.contract["violations"]), markup=True,
                      soft_wrap=True)
    ci = c.ci_pct
    console.print(f"[bold]{c.verdict}[/]: B vs A {_fmt(c.delta_pct, '+.2f')}% step time"
                  + (f" (95% CI [{ci[0]:+.2f}%, {ci[1]:+.2f}%])" if ci else ""), markup=True, soft_wrap=True)
    for side, d in (("A", c.a), ("B", c.b)):
        console.print(f"  {side}: {d['file']} window {d['steady_window']} ({d['samples']} samples), median "
                      f"{_fmt(d['median_s'])} s", markup=False, soft_wrap=True)
    for d in c.contract["differences"]:
        console.print(f"  differs: {d['field']}: {d['a']!r} -> {d['b']!r}", markup=False, soft_wrap=True)
    for e in c.explanations:
        eff = f" (predicted {e.predicted_effect_pct:+.1f}%)" if e.predicted_effect_pct is not None else ""
        console.print(f"  explanation: {e.field}{eff}: {e.note}", markup=False, soft_wrap=True)
    console.print(f"  ranking: {c.ranking}", markup=False, soft_wrap=True)
    if pred is not None:
        where = "inside" if pred["inside_band"] else "OUTSIDE"
        console.print(f"  prediction: B measured {_fmt(pred['measured_s'])} s is {where} the predicted band "
                      f"{pred['lo_s']:.3f}-{pred['hi_s']:.3f} s (predicted {pred['step_time_s']:.3f} s, "
                      f"{pred['cls']})", markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("logs")(logs_cmd)
    app.command("diagnose")(diagnose_cmd)
    app.command("compare")(compare_cmd)

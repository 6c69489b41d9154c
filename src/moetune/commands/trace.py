"""``moetune trace PATH…`` (analyse profiler traces of one job) and ``moetune trace diff A B`` (matched A/B)."""

from pathlib import Path
from typing import Annotated

import typer

from moetune.errors import InputError
from moetune.output import console, print_json, readable


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.2f}"


def _short(name: str, width: int = 60) -> str:
    """Kernel name without return type, template and argument lists (display only)."""
    out, depth = [], 0
    for ch in name.removeprefix("void "):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    text = "".join(out).strip() or name
    return text if len(text) <= width else text[: width - 1] + "…"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def _show_report(rep) -> None:
    from rich.table import Table

    t = Table(title="moetune trace: per rank (ms over the analysed iterations; unions, never summed durations)")
    for col in ("rank", "iters", "iter med", "compute", "comm", "hidden", "exposed", "overlap %", "idle host",
                "idle dep", "dominant wall"):
        t.add_column(col, justify="right" if col not in ("dominant wall",) else "left")
    for r in rep.ranks:
        if not r.has_gpu_events:
            t.add_row(str(r.rank), "0", "—", "—", "—", "—", "—", "—", "—", "—", "no GPU events")
            continue
        t.add_row(
            str(r.rank), str(r.iterations), _ms(r.iteration_wall_s.median), _ms(r.compute_s), _ms(r.comm_s),
            _ms(r.hidden_comm_s), _ms(r.exposed_comm_s), _pct(r.comm_compute_overlap_pct),
            _ms(r.idle.host_bound_s), _ms(r.idle.dependency_s), r.dominant_wall or "—",
        )
    console.print(readable(t, names=("dominant wall",)))
    for r in rep.ranks:
        head = f"[bold]rank {r.rank}[/] {r.source} ({r.format}; {r.device or 'device ?'}; iterations: {r.iteration_source})"
        console.print(head)
        if not r.has_gpu_events:
            for n in r.notes:
                console.print(f"  note: {n}")
            continue
        if r.comm_by_kind:
            kinds = ", ".join(
                f"{k} {_ms(v)} (exposed {_ms(r.exposed_comm_by_kind.get(k))})" for k, v in r.comm_by_kind.items()
            )
            console.print(f"  comm by kind (ms): {kinds}")
        for e in r.dominant_wall_evidence:
            console.print(f"  wall evidence: {e}")
        f = r.features
        if f:
            console.print(
                f"  features: dispatcher={f.dispatcher}; EP comm {_ms(f.ep_comm_s)} ms hidden "
                f"{_pct(f.ep_comm_hidden_pct)}%; CUDA-graph launches {f.cuda_graph_launches} "
                f"(replayed kernels {f.graph_replayed_kernels}); FP8 kernels {f.fp8_kernels} "
                f"(FP8 GEMMs {f.fp8_gemm_kernels}); grouped GEMMs {f.grouped_gemm_kernels}; "
                f"attention {', '.join(f.attention) or '—'}"
            )
        if len(rep.ranks) == 1 and r.top_kernels:
            tk = Table(title="top kernels (summed kernel time, not wall)")
            for col in ("class", "count", "kernel ms", "mean µs", "name"):
                tk.add_column(col)
            for k in r.top_kernels:
                tk.add_row(k.kernel_class, str(k.count), _ms(k.kernel_time_s), f"{k.mean_us:.1f}", _short(k.name))
            console.print(readable(tk, names=("class",)))
        for n in r.notes:
            console.print(f"  note: {n}")
    if rep.clock_alignment:
        offs = ", ".join(f"{k}: {v:+.1f} µs (±{rep.clock_alignment.residual_us.get(k, 0):.1f})"
                         for k, v in rep.clock_alignment.offsets_us.items())
        console.print(f"clock offsets vs rank {rep.clock_alignment.reference_rank}: {offs}")
    for c in rep.collectives[:10]:
        console.print(
            f"collective {c.collective}: {c.instances} instances × {c.ranks} ranks, skew median {c.median_skew_us:.1f}"
            f" µs (max {c.max_skew_us:.1f}), transfer proxy {c.median_transfer_us:.1f} µs, jitter "
            f"{c.median_jitter_us:.1f} µs"
        )
    if rep.stragglers:
        for s in rep.stragglers:
            console.print(
                f"[bold yellow]straggler[/]: rank {s.rank} starts {s.collective} last in {100 * s.last_share:.0f}% of "
                f"{s.instances} instances (median {s.median_late_us:.1f} µs late)"
            )
    elif len([r for r in rep.ranks if r.has_gpu_events]) >= 2:
        console.print("stragglers: none")
    for n in rep.notes:
        console.print(f"note: {n}")


def _show_diff(d) -> None:
    from rich.table import Table

    console.print(f"A: {', '.join(d.a)}\nB: {', '.join(d.b)}  (ranks matched by {d.matched_by})")
    for rd in d.ranks:
        t = Table(title=f"rank {rd.rank_a} → {rd.rank_b}: per iteration (ms)")
        for col in ("metric", "A", "B", "Δ", "Δ %"):
            t.add_column(col, justify="right" if col != "metric" else "left")
        for x in rd.per_iteration:
            t.add_row(x.metric, _ms(x.a), _ms(x.b), _ms(x.delta), _pct(x.delta_pct))
        o = rd.comm_compute_overlap_pct
        t.add_row("comm∩compute %", _pct(o.a), _pct(o.b), _pct(o.delta), "")
        console.print(readable(t, names=("metric",)))
        for x in rd.exposed_comm_by_kind:
            console.print(f"  exposed {x.metric}: {_ms(x.a)} → {_ms(x.b)} ms/iter")
        console.print(f"  dominant wall: {rd.dominant_wall[0]} → {rd.dominant_wall[1]}")
        for k, (va, vb) in rd.features_changed.items():
            console.print(f"  feature {k}: {va} → {vb}")
        for m in rd.moved:
            console.print(f"  moved: {m}")
    for n in d.notes:
        console.print(f"note: {n}")


def register(app: typer.Typer) -> None:
    @app.command("trace")
    def trace(
        paths: Annotated[list[str], typer.Argument(help="trace files or per-rank directories (one job); "
                                                   "or: diff A B")],
        json_out: Annotated[bool, typer.Option("--json", help="machine-readable JSON on stdout")] = False,
        taxonomy: Annotated[
            Path | None, typer.Option("--taxonomy", help="kernel taxonomy YAML (default: the packaged one)")
        ] = None,
    ) -> None:
        """Analyse PyTorch-profiler (Kineto JSON/.json.gz) or Nsight Systems (SQLite, recipe CSV/parquet) traces:
        hidden vs exposed communication, idle split, dominant wall, features, stragglers.
        `moetune trace diff A B` compares two runs (A = baseline)."""
        from moetune.commands import knobs
        from moetune.evidence.traces.analyze import analyze_paths
        from moetune.evidence.traces.diff import diff_reports

        if paths and paths[0] == "diff" and not (len(paths) != 3 and Path("diff").exists()):
            if len(paths) != 3:
                raise InputError.bad_value("trace diff", " ".join(paths[1:]), "exactly two paths: A B")
            a = analyze_paths([paths[1]], taxonomy, workers=knobs.trace_workers())
            b = analyze_paths([paths[2]], taxonomy, workers=knobs.trace_workers())
            d = diff_reports(a, b)
            if json_out:
                print_json(d)
            else:
                _show_diff(d)
            return
        rep = analyze_paths(paths, taxonomy, workers=knobs.trace_workers())
        if json_out:
            print_json(rep)
        else:
            _show_report(rep)

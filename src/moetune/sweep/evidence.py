"""Adapter from a run directory to the evidence readers (``moetune.evidence.read_run`` / ``summarize_run`` /
``compare_runs``; ``moetune.evidence.traces.analyze_paths``).

No numbers are computed here beyond reading the readers' results into plain dicts: the steady-window statistics,
loss health and noise bands are the readers' (one implementation each).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from moetune.evidence.compare import compare_runs
from moetune.evidence.contract import contract_fields
from moetune.evidence.logs import read_run
from moetune.evidence.steady import summarize_run
from moetune.evidence.traces.analyze import analyze_paths

LOG_SUFFIXES = (".log", ".txt", ".out", ".json")
TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".pt.trace.json", ".csv.xz", ".parquet")


def as_dict(obj: Any) -> Any:
    """pydantic / dataclass / mapping -> plain dict (recursively)."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="python")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: as_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: as_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [as_dict(v) for v in obj]
    return obj


def run_logs(run_dir: Path) -> list[Path]:
    """Training logs / golden-values JSON of a run (Slurm's own stdout file excluded)."""
    d = run_dir / "logs"
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.is_file() and p.name.endswith(LOG_SUFFIXES)
                  and not p.name.startswith("slurm-") and p.name != "job.txt" and p.stat().st_size > 0)


def run_traces(run_dir: Path) -> list[Path]:
    d = run_dir / "traces"
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def _f(v: Any) -> float | None:
    """A finite float, else None (the readers' statistics are dicts: pass their ``["median"]``)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def read_log_evidence(path: Path, window: tuple[int, int], *, gpus: int | None = None,
                      seq_length: int | None = None, global_batch_size: int | None = None) -> dict[str, Any]:
    """The log's record and its steady-window summary, in the JSON shape of ``moetune logs --json``.

    ``gpus``/``seq_length``/``global_batch_size`` are what the run was launched with; they let the reader report
    tokens/s/GPU when the log omits them (golden-values JSON prints no batch shape). What the log itself states is
    read first (``observed``) so the contract check never sees the launch values."""
    rec = read_run(path)
    observed = {k: v for k, v in contract_fields(rec).items() if v is not None}
    notes = []
    if global_batch_size and observed.get("global_batch_size") is None and isinstance(getattr(rec, "config", None),
                                                                                         dict):
        rec.config["train.global_batch_size"] = global_batch_size
        notes.append(f"global batch size {global_batch_size} from the launch (the log does not print it)")
    summ = as_dict(summarize_run(rec, window=window, gpus=gpus, seq_length=seq_length, strict_window=False))
    it = getattr(rec, "iterations", None)
    iters = it.col("iteration") if it is not None and len(it) else np.zeros(0)
    gbs = it.col("gbs") if it is not None and len(it) else np.zeros(0)
    in_win = (iters >= window[0]) & (iters <= window[1])
    step_s = it.col("elapsed_s")[in_win] if it is not None and len(it) else np.zeros(0)
    loss = summ.get("loss") or {}
    st = summ.get("step_time_s") or {}
    # RunSummary.tflops_per_gpu is {"median", "mean", "source"} (moetune.evidence.steady); the steady-window median
    tf = summ.get("tflops_per_gpu")
    tf = tf.get("median") if isinstance(tf, dict) else tf
    return {
        "file": str(path),
        "record": rec,
        "source": getattr(rec, "source", None),
        "iterations": [int(x) for x in iters if math.isfinite(x)],
        "window_samples": int(in_win.sum()),
        "window_step_s": [float(x) for x in step_s if math.isfinite(x)],
        "observed_gbs": sorted({int(x) for x in gbs if math.isfinite(x)}),
        "steady_window": summ.get("steady_window"),
        "step_time_s": _f(st.get("median") if isinstance(st, dict) else st),
        "step_time_ci": st.get("ci") if isinstance(st, dict) else None,
        "tokens_per_s_per_gpu": _f(summ.get("tokens_per_s_per_gpu")),
        "tflops_per_gpu": _f(tf),
        "loss_finite": loss.get("finite"),
        "nan_iterations": loss.get("nan_iterations"),
        "skipped_iterations": loss.get("skipped_iterations"),
        "memory": summ.get("memory") or {},
        "config": summ.get("config") or as_dict(getattr(rec, "config", {}) or {}),
        "observed": observed,
        "notes": notes + list(summ.get("notes") or []),
        "versions": as_dict(getattr(rec, "versions", {}) or {}),
        "signals": [{"kind": getattr(s, "kind", ""), "line": getattr(s, "line", None),
                     "text": getattr(s, "text", "")} for s in (getattr(rec, "signals", None) or [])],
        "summary": summ,
    }


def peak_memory_gib(mem: dict[str, Any]) -> float | None:
    """Largest peak reported in a ``logs`` memory section (GiB), whatever its nesting."""
    best = None

    def walk(x: Any, key: str = "") -> None:
        nonlocal best
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, str(k))
        elif isinstance(x, list):
            for v in x:
                walk(v, key)
        elif isinstance(x, int | float) and "peak" in key.lower() and "gib" in key.lower():
            best = x if best is None else max(best, float(x))

    walk(mem)
    return best


def read_trace_evidence(paths: list[Path], *, workers: int | None = None) -> dict[str, Any]:
    """The trace report (:func:`moetune.evidence.traces.analyze.analyze_paths`) as a dict, plus the dispatcher backends / graph / FP8 evidence it contains."""
    rep = as_dict(analyze_paths([str(p) for p in paths], workers=workers))
    ranks = rep.get("ranks") or []
    backends: set[str] = set()
    graphs = False
    fp8 = False
    for r in ranks:
        f = r.get("features") or {}
        disp = str(f.get("dispatcher") or "")
        if disp in ("deepep", "hybridep"):
            backends.add(disp)
        for b in (f.get("comm_backends") or {}):
            backends.add(str(b).lower())
        graphs = graphs or bool(f.get("cuda_graph_launches") or f.get("graph_replayed_kernels"))
        fp8 = fp8 or bool(f.get("fp8_gemm_kernels") or f.get("fp8_kernels") or f.get("fp4_kernels"))
    return {"report": rep, "backends": sorted(backends), "cuda_graphs": graphs, "fp8": fp8,
            "dominant_wall": (ranks[0].get("dominant_wall") if ranks else None)}


def compare(a_record: Any, b_record: Any, window: tuple[int, int], *, efficiency: Any = None) -> dict[str, Any]:
    """The A/B verdict (:func:`moetune.evidence.compare.compare_runs`) ({verdict, delta_pct, ci_pct, contract}) of B against A."""
    return as_dict(compare_runs(a_record, b_record, window_a=window, window_b=window, efficiency=efficiency))

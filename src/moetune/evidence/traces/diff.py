"""Matched A/B comparison of two trace reports: what moved between compute, hidden/exposed communication and idle.

Quantities are compared *per iteration* (total over the analysed window ÷ iterations), so A and B may have profiled a
different number of steps. Ranks are matched by rank id when both sides have the same ids, otherwise by position
(docs/domain.md §7.1: hold everything fixed but the variable under test; §7.2 step 5: for A/Bs hidden = comm ∩
compute).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from moetune.evidence.traces.report import RankReport, TraceReport

_FIELDS = (
    ("iteration_wall_s", lambda r: r.iteration_wall_s.median),
    ("window_s", lambda r: r.window_s),
    ("compute_s", lambda r: r.compute_s),
    ("comm_s", lambda r: r.comm_s),
    ("hidden_comm_s", lambda r: r.hidden_comm_s),
    ("exposed_comm_s", lambda r: r.exposed_comm_s),
    ("memory_s", lambda r: r.memory_s),
    ("idle_s", lambda r: r.idle.total_s),
    ("host_bound_s", lambda r: r.idle.host_bound_s),
    ("dependency_s", lambda r: r.idle.dependency_s),
)


class Delta(BaseModel):
    metric: str
    a: float | None
    b: float | None
    delta: float | None = Field(description="b − a")
    delta_pct: float | None = Field(None, description="(b − a) / a × 100")


class RankDiff(BaseModel):
    rank_a: int | None
    rank_b: int | None
    per_iteration: list[Delta] = Field(description="seconds per iteration (iteration_wall_s: median)")
    comm_compute_overlap_pct: Delta
    comm_by_kind: list[Delta] = Field(description="per-iteration union seconds per comm kind")
    exposed_comm_by_kind: list[Delta]
    dominant_wall: tuple[str | None, str | None]
    features_changed: dict[str, tuple[object, object]] = Field(default_factory=dict)
    moved: list[str] = Field(default_factory=list, description="largest per-iteration moves, biggest first")


class TraceDiff(BaseModel):
    a: list[str]
    b: list[str]
    matched_by: str
    ranks: list[RankDiff]
    notes: list[str] = Field(default_factory=list)


def _per_iter(r: RankReport, value: float | None, name: str) -> float | None:
    if value is None:
        return None
    if name == "iteration_wall_s":
        return value
    return value / r.iterations if r.iterations else None


def _delta(metric: str, a: float | None, b: float | None) -> Delta:
    d = None if a is None or b is None else b - a
    pct = 100.0 * d / a if d is not None and a else None
    return Delta(metric=metric, a=a, b=b, delta=d, delta_pct=pct)


def _kind_deltas(ra: RankReport, rb: RankReport, da: dict, db: dict) -> list[Delta]:
    out = []
    for k in sorted(set(da) | set(db)):
        out.append(_delta(k, _per_iter(ra, da.get(k, 0.0), k), _per_iter(rb, db.get(k, 0.0), k)))
    return out


def diff_rank(ra: RankReport, rb: RankReport) -> RankDiff:
    per = [_delta(n, _per_iter(ra, f(ra), n), _per_iter(rb, f(rb), n)) for n, f in _FIELDS]
    feats: dict[str, tuple[object, object]] = {}
    if ra.features and rb.features:
        fa, fb = ra.features.model_dump(), rb.features.model_dump()
        for k in ("dispatcher", "a2a_overlapped_compute", "cuda_graph_launches", "fp8_kernels", "grouped_gemm_kernels"):
            if fa.get(k) != fb.get(k):
                feats[k] = (fa.get(k), fb.get(k))
    movable = [d for d in per if d.metric not in ("iteration_wall_s", "window_s") and d.delta is not None]
    movable.sort(key=lambda d: -abs(d.delta))
    moved = [
        f"{d.metric}: {d.a * 1e3:.3f} → {d.b * 1e3:.3f} ms/iter ({d.delta * 1e3:+.3f} ms)"
        for d in movable
        if d.delta
    ][:5]
    return RankDiff(
        rank_a=ra.rank,
        rank_b=rb.rank,
        per_iteration=per,
        comm_compute_overlap_pct=_delta(
            "comm_compute_overlap_pct", ra.comm_compute_overlap_pct, rb.comm_compute_overlap_pct
        ),
        comm_by_kind=_kind_deltas(ra, rb, ra.comm_by_kind, rb.comm_by_kind),
        exposed_comm_by_kind=_kind_deltas(ra, rb, ra.exposed_comm_by_kind, rb.exposed_comm_by_kind),
        dominant_wall=(ra.dominant_wall, rb.dominant_wall),
        features_changed=feats,
        moved=moved,
    )


def diff_reports(a: TraceReport, b: TraceReport) -> TraceDiff:
    """Compare report A (baseline) with report B (candidate)."""
    ra = [r for r in a.ranks if r.has_gpu_events]
    rb = [r for r in b.ranks if r.has_gpu_events]
    notes = []
    ids_a = [r.rank for r in ra]
    ids_b = [r.rank for r in rb]
    if ids_a and set(ids_a) == set(ids_b) and None not in ids_a and len(set(ids_a)) == len(ids_a):
        by = "rank id"
        lookup = {r.rank: r for r in rb}
        pairs = [(r, lookup[r.rank]) for r in ra]
    else:
        by = "position"
        pairs = list(zip(ra, rb, strict=False))
        if ids_a != ids_b:
            notes.append(f"rank ids differ (A {ids_a}, B {ids_b}): matched by position")
        if len(ra) != len(rb):
            notes.append(f"A has {len(ra)} GPU ranks, B has {len(rb)}: only {len(pairs)} compared")
    if not pairs:
        notes.append("no ranks with GPU events on both sides")
    return TraceDiff(a=a.paths, b=b.paths, matched_by=by, ranks=[diff_rank(x, y) for x, y in pairs], notes=notes)

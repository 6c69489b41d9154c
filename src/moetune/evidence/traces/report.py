"""Typed results of trace analysis (``TraceReport.model_dump()`` is the ``moetune trace --json`` output)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class IdleSplit(BaseModel):
    """GPU idle time (no kernel, memcpy or memset on any stream) split by what the GPU waited for."""

    total_s: float | None = None
    host_bound_s: float | None = Field(None, description="launch-starved: next op's launch call had not returned")
    dependency_s: float | None = Field(None, description="next op already launched: waiting on a dependency/sync")
    unattributed_s: float | None = Field(None, description="next op has no correlated launch record")


class TopKernel(BaseModel):
    name: str
    kernel_class: str
    group: str
    count: int
    kernel_time_s: float = Field(description="sum of durations (not wall time)")
    mean_us: float


class IterationStats(BaseModel):
    name: str
    start_s: float = Field(description="GPU window start, seconds from the rank's first GPU event")
    wall_s: float
    compute_s: float
    comm_s: float
    hidden_comm_s: float
    exposed_comm_s: float
    idle_s: float
    host_bound_s: float
    dependency_s: float


class Spread(BaseModel):
    n: int
    median: float | None = None
    min: float | None = None
    max: float | None = None


class WallBreakdown(BaseModel):
    """Disjoint parts of the analysed window (they sum to window_s)."""

    compute_s: float
    exposed_comm_s: float
    exposed_memory_s: float
    host_bound_idle_s: float
    dependency_idle_s: float
    unattributed_idle_s: float


class Features(BaseModel):
    """Feature-activation evidence from the kernels that actually ran (docs/domain.md §7.2 'Proof a feature ran')."""

    dispatcher: str = Field(description="deepep | hybridep | alltoall | none seen")
    comm_backends: dict[str, dict[str, float]] = Field(default_factory=dict, description="backend -> {kernels, wall_s}")
    ep_comm_s: float = 0.0
    ep_comm_hidden_pct: float | None = None
    a2a_overlapped_compute: bool | None = None
    cuda_graph_launches: int = 0
    graph_replayed_kernels: int = 0
    fp8_kernels: int = 0
    fp8_kernel_time_s: float = 0.0
    fp8_gemm_kernels: int = 0
    fp4_kernels: int = 0
    grouped_gemm_kernels: int = 0
    attention: list[str] = Field(default_factory=list)


class RankReport(BaseModel):
    rank: int | None
    rank_source: str
    source: str
    format: str
    device: str | None = None
    world_size: int | None = None
    gpu_events: int
    has_gpu_events: bool
    iterations: int
    iteration_source: str
    iteration_wall_s: Spread
    per_iteration: list[IterationStats] = Field(default_factory=list)
    window_s: float | None = None
    busy_s: float | None = None
    compute_s: float | None = None
    comm_s: float | None = None
    hidden_comm_s: float | None = Field(None, description="|comm ∩ compute| (interval unions)")
    exposed_comm_s: float | None = Field(None, description="|comm − compute|: an upper bound on what comm costs")
    exposed_comm_beside_memcpy_s: float | None = Field(
        None, description="part of exposed_comm_s during which only memcpy/memset ran (no compute)"
    )
    comm_compute_overlap_pct: float | None = Field(
        None, description="HTA get_comm_comp_overlap: |comm ∩ compute| / |comm| × 100"
    )
    comm_by_kind: dict[str, float] = Field(default_factory=dict, description="union wall time per comm kind")
    exposed_comm_by_kind: dict[str, float] = Field(default_factory=dict)
    memory_s: float | None = None
    idle: IdleSplit = Field(default_factory=IdleSplit)
    dominant_wall: str | None = None
    dominant_wall_evidence: list[str] = Field(default_factory=list)
    wall_breakdown: WallBreakdown | None = None
    kernel_time_by_class: dict[str, float] = Field(default_factory=dict, description="sum of durations per class")
    top_kernels: list[TopKernel] = Field(default_factory=list)
    features: Features | None = None
    clock_offset_us: float | None = None
    notes: list[str] = Field(default_factory=list)


class Straggler(BaseModel):
    rank: int | None
    collective: str
    instances: int
    last_share: float = Field(description="share of matched instances this rank started last")
    median_late_us: float
    max_late_us: float


class CollectiveSkew(BaseModel):
    collective: str
    instances: int
    ranks: int
    median_skew_us: float = Field(description="max − min aligned start across ranks, median over instances")
    max_skew_us: float
    median_transfer_us: float = Field(description="shortest participant's duration (transfer proxy), median")
    median_jitter_us: float = Field(description="own duration − transfer proxy, median over ranks × instances")


class ClockAlignment(BaseModel):
    reference_rank: int | None
    method: str
    offsets_us: dict[str, float] = Field(default_factory=dict)
    residual_us: dict[str, float] = Field(default_factory=dict)


class TraceReport(BaseModel):
    paths: list[str]
    ranks: list[RankReport]
    stragglers: list[Straggler] = Field(default_factory=list)
    collectives: list[CollectiveSkew] = Field(default_factory=list)
    clock_alignment: ClockAlignment | None = None
    notes: list[str] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)

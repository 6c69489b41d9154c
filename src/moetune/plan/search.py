"""The planner: fit, scale and retune as one search over folded layouts (docs/domain.md §6.1, S:wf).

Order of the workflow, as implemented (:func:`plan`, then :class:`Search`):

0. **Refuse** what nothing can fit, before any search: a precision the GPU cannot run (PRC-008) and a request whose
   memory floor (:mod:`moetune.plan.floor`: the model state of the whole model divided by the world size, at the
   least-storing state mode the request allows, plus the per-job runtime tail) already overflows the GPU.
1. **Enumerate** every layout Megatron accepts (:func:`moetune.plan.space.enumerate_layouts`).
2. **Fit** each feature variant of a layout (dispatcher, CUDA graphs) with the least recompute that fits the
   headroom policy: no recompute, then the selective ladder (:data:`moetune.plan.space.SELECTIVE_LADDER`,
   narrowest first), then full recompute (when allowed). The ladder stops once every variant has fitted: while a
   variant that needs memory (CUDA graphs' static buffers, a dispatcher's buffers) does not fit, it goes on for
   that variant, since more recompute can make room for a feature that saves more than the recompute costs
   (DeepSeek-V3 on 256 DGX-B200, the published TP1 PP8 VP2 EP32: graphs fit only with ``mla_up_proj`` recompute,
   19.92 against 21.38 s/step).
   A layout whose *floor* (full recompute) does not fit is pruned — no feature can make it fit (proof: every
   activation-saving feature the search enumerates is bounded by the full-recompute activations).
   Offloading is tried only when no layout fits without it.
3. **Retune** the features of each fitting layout (dispatcher and flex backend where the hardware gates allow,
   EP overlap and delayed wgrad, CUDA-graph scope, precision). A layout's variants are skipped without evaluation
   only when a proven lower bound on all of them (:func:`variant_floor` of its base estimate, or the tighter
   :func:`_schedule_floor`) already exceeds the k-th best step time found so far: the walls no variant can shorten
   add up to more than a winner's whole step, so no variant can win. A fitting variant is priced only when its own
   lower bound (:meth:`Search.variant_bounds`) leaves it a chance to be its layout's new best within the k-th best.
4. **Reject** what the checker rejects (any ``error*`` finding of :func:`moetune.rules.check_job`).
5. **Rank** by predicted step time; ties prefer the smaller model parallelism, then less recompute.
"""

from __future__ import annotations

import heapq
import itertools
import multiprocessing
import numbers
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from moetune.catalog.memory_constants import const
from moetune.errors import InputError
from moetune.io.check import check_job
from moetune.memo import collector_paused
from moetune.perfmodel.memory import (
    TIME_ONLY_FEATURES,
    cpu_offloaded_layer_bytes,
    device_peaks,
    estimate_memory,
    fit_peaks,
    fits_capacity,
    headroom_gib,
    ladder_drops,
    reserved_features,
    saved_activation_floor,
    state_floor_bytes,
)
from moetune.perfmodel.schedule import pipeline_step
from moetune.perfmodel.step import StepWalls, estimate_time, estimate_walls, resolve_efficiency, stage_a2a_and_sm
from moetune.plan.ladder import ladder_cores
from moetune.plan.queue_bound import QueueBound, ep_term
from moetune.plan.space import SELECTIVE_LADDER, LayoutPoint, SpaceLimits, enumerate_layouts, enumerate_meshes
from moetune.progress import report
from moetune.spec.features import Features
from moetune.spec.job import Job
from moetune.spec.layout import Layout
from moetune.spec.model import ModelArch
from moetune.spec.system import System

DISPATCHERS = ("alltoall", "deepep", "hybridep", "allgather")


@dataclass
class PlanRequest:
    """What the user asks for (``moetune plan`` flags)."""

    model: ModelArch
    system: System
    gpus: int
    global_batch_size: int
    seq_length: int
    precisions: tuple[str, ...] = ("bf16",)
    mbs_options: tuple[int, ...] = (1, 2, 4)
    fix: dict[str, Any] = field(default_factory=dict)
    dispatchers: tuple[str, ...] = ("alltoall", "deepep", "hybridep")
    max_recompute: str = "full"  # none | selective | full
    #: GiB of HBM kept free on the binding rank; None = the policy of ``estimate`` (:func:`moetune.perfmodel.memory.
    #: headroom_gib`: max(3 % of HBM, 2 GiB)), so plan and estimate give one verdict
    min_headroom_gib: float | None = None
    top: int = 5
    allow_offload: bool = True
    explore_graphs: bool = True
    explore_overlap: bool = True
    exact_ranking: bool = False  # check every layout's best variant (for ranking benches), not only the top-K
    explore_fsdp: bool = True  # Megatron-FSDP (optim_grads_params) instead of the distributed optimizer, PP = 1
    #: layer-level CPU activation offloading (``--cpu-offloading-num-layers``, PP = 1) as an alternative to recompute
    #: where the layout does not fit without either (:meth:`Search.layer_offload`)
    explore_layer_offload: bool = True
    #: worker processes (None: up to 2 of the CPUs for requests of >= 64 GPUs); see :func:`_plan_parallel`
    workers: int | None = None
    #: the time model's efficiency parameters (:func:`moetune.perfmodel.step.resolve_efficiency`: an Efficiency,
    #: a file written by ``moetune calibrate``, or None = the catalog's)
    efficiency: Any = None
    #: (index, count): search only the layouts whose (TP, CP, EP, ETP) group, numbered in enumeration order, is
    #: ``index`` modulo ``count``
    partition: tuple[int, int] = (0, 1)
    #: where the features start (:func:`moetune.io.load.starting_features`): None = the Bridge perf recipe of the same
    #: model / system / precision when one exists (else the perf launcher's common settings), a recipe name,
    #: ``"perf-common"`` or ``"none"`` (library defaults); the search
    #: replaces the dimensions it searches and keeps the recipe's other settings
    recipe: str | None = None
    #: stop at the first configuration that fits (layouts visited best-first by their variant floor): whether
    #: anything fits and an example, not the ranking (the "what would fit" suggestions)
    first_fit: bool = False
    #: the training task's Features fields (:func:`moetune.io.load.task_updates`: ``task``, ``lora_dim``, ...), set on
    #: the starting features of every precision (:func:`plan_starts`): a property of the job, never searched
    task: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        """The Job field constraints (``gpus``, ``global_batch_size``, ``seq_length``, every MBS > 0), checked once
        here: the search builds its jobs with ``Job.trusted`` (``model_construct``)."""
        for name, value in (("gpus", self.gpus), ("global_batch_size", self.global_batch_size),
                            ("seq_length", self.seq_length), *(("mbs_options", m) for m in self.mbs_options)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise InputError.bad_value(name, value, "a positive integer")


def request_headroom(req: PlanRequest) -> float:
    """GiB the headroom policy keeps free for this request (``--min-headroom-gib`` or estimate's policy)."""
    return req.min_headroom_gib if req.min_headroom_gib is not None else headroom_gib(req.system.gpu.hbm_gib)


@dataclass
class Candidate:
    job: Job
    layout: LayoutPoint
    #: the itemised memory and time estimates (:func:`moetune.perfmodel.memory.estimate_memory`,
    #: :func:`moetune.perfmodel.step.estimate_time`); a search builds them for the candidates it returns only
    #: (:meth:`Search.result`), None before
    memory: Any
    time: Any
    findings: list
    recompute_rank: int  # 0 none, 1.. selective ladder index+1, 99 full, 100+ offload
    #: predicted step seconds (``time.step_time_s``: :func:`moetune.perfmodel.step.estimate_walls` gives the same
    #: value, tests/test_plan_fastpath.py); None: read ``time``
    step: float | None = None

    @property
    def step_time_s(self) -> float:
        return self.step if self.step is not None else self.time.step_time_s

    def sort_key(self) -> tuple:
        return (round(self.step_time_s, 9), self.layout.model_parallel, self.recompute_rank,
                self.layout.key(), _feature_key(self.job.features))


def _feature_key(f: Features) -> tuple:
    return (f.precision, f.moe_token_dispatcher_type, f.moe_flex_dispatcher_backend or "",
            f.overlap_moe_expert_parallel_comm, f.delay_wgrad_compute, f.cuda_graph_impl, f.cuda_graph_scope)


@dataclass
class PlanResult:
    request: PlanRequest
    candidates: list[Candidate]
    searched: int
    feasible: int
    seconds: float
    layouts: int
    pruned_memory: int
    pruned_bound: int
    rejected_by_check: int
    #: (overflow GiB, floor job) of the closest misses among the layouts whose fit was tested: all of them when no
    #: candidate fits (a search that found candidates skips the fit tests of layouts its bound prunes)
    closest: list[tuple[float, Job]]
    notes: list[str] = field(default_factory=list)
    #: best predicted step time per layout (tp, cp, pp, vpp, ep, etp, mbs, pipeline_layout) over its features
    per_layout_best: dict[tuple, float] = field(default_factory=dict)
    #: rule id -> fitting configs the checker rejected with it (why a request with fitting layouts has no candidate)
    rejected_rules: dict[str, int] = field(default_factory=dict)
    #: per precision: where the features started (:class:`moetune.io.load.Start`: recipe name and notes)
    starts: dict[str, Any] = field(default_factory=dict)
    #: the request's memory floor (:class:`moetune.plan.floor.MemoryFloor`) when it proved that nothing fits (no
    #: search ran); None otherwise
    memory_floor: Any = None


# --------------------------------------------------------------------------------------------------------------
# helpers that build Jobs


def _state_modes(req: PlanRequest, lp: LayoutPoint) -> list[tuple[str, bool]]:
    """(precision, Megatron-FSDP) pairs searched for a layout. Megatron-FSDP (``optim_grads_params``: weights, grads
    and optimizer state sharded over DP) is enumerated where it replaces pipeline parallelism - PP = 1 and DP > 1,
    with any TP/CP, as in Bridge's FSDP perf rows (Llama-3 8B/70B at TP1, Llama-3.1 405B at TP2 on GB200). With TP
    or CP on pre-Blackwell GPUs Megatron-LM only warns about the CUDA_DEVICE_MAX_CONNECTIONS preferences
    (docs/rules.md MLM-001, FSDP-019); the launch leaves the variable unset as FSDP needs (FSDP-006)."""
    pinned = req.fix.get("fsdp")
    allowed = lp.pp == 1 and lp.dp > 1
    if pinned is not None:
        if int(pinned) and not allowed:
            return []
        fsdp = [bool(int(pinned))]
    else:
        fsdp = [False, True] if (req.explore_fsdp and allowed) else [False]
    return [(p, f) for p in req.precisions for f in fsdp]


#: the searched dimensions at their least-memory, least-time-floor settings: every variant the search prices is this
#: base plus its updates, so the floors (model state, full recompute, :data:`VARIANT_INVARIANT_WALLS`) bound them all
SEARCH_RESET: dict[str, Any] = {
    "recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None, "recompute_modules": (),
    "moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None,
    "overlap_moe_expert_parallel_comm": False, "delay_wgrad_compute": False,
    "cuda_graph_impl": "none", "cuda_graph_scope": (),
    "moe_expert_rank_capacity_factor": None, "moe_paged_stash": False,
    "fine_grained_activation_offloading": False, "offload_modules": (),
    "cpu_offloading": False, "cpu_offloading_num_layers": 0,
    "optimizer_cpu_offload": False, "optimizer_offload_fraction": 0.0,
}
#: fractions of the decoder layers the layer-offload option tries (the least that fits is priced): eighths, the grid
#: of the Bridge presets that offload (Llama-3-70B GB300 FP8-CS 20 of 80 layers, BF16 30, GB200 FP8-CS 40)
LAYER_OFFLOAD_EIGHTHS = (1, 2, 3, 4, 5, 6, 7)
#: the offloading the search tries when no layout fits without it (:meth:`Search.offload_pass`)
OFFLOAD_UPDATES: dict[str, Any] = {
    "fine_grained_activation_offloading": True,
    "offload_modules": ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"),
    "optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0,
}
#: ``--fix`` keys pinned once in the base features (the others select among the searched variants)
_BASE_PINNED = ("tp_comm_overlap", "offload")


def _base_features(model: ModelArch, precision: str, lp: LayoutPoint, fsdp: bool = False,
                   start: Features | None = None, fix: dict[str, Any] | None = None) -> Features:
    """The features every variant of a layout starts from: ``start`` (the Bridge perf recipe's features or, when None,
    :func:`moetune.io.load.library_features`) with the searched dimensions at :data:`SEARCH_RESET`, made legal for
    the layout (:func:`moetune.io.load.adapt_features`: SP with TP > 1, TP comm overlap needs SP); with ``fsdp`` the
    Megatron-FSDP settings of the Megatron-FSDP user guide (``--use-megatron-fsdp --data-parallel-sharding-strategy
    optim_grads_params --use-distributed-optimizer``); the ``--fix`` pins of TP comm overlap and offloading."""
    from moetune.io.load import FeatureChoices, adapt_features, choice_updates, fix_choices, library_features

    f = start if start is not None else library_features(model, precision)
    f = adapt_features(f.model_copy(update={**SEARCH_RESET, "precision": precision}), model, _layout(lp))
    pinned = fix_choices({k: v for k, v in (fix or {}).items() if k in _BASE_PINNED})
    upd = choice_updates(FeatureChoices(fsdp=fsdp))
    upd.update(choice_updates(pinned))
    return f.model_copy(update=upd)


#: relative slack of :meth:`Search.ladder_prefix_unfit` (of the GiB limit): float rounding of the activation sums is
#: ~1e-14 relative, so a bound above the limit by this much is above every covered option's device GiB's limit too
LADDER_FLOOR_SLACK = 1e-9


def ladder_cover(options: list[tuple[int, dict]]) -> int:
    """The last option ``c`` of the recompute ladder ``options`` (:func:`_recompute_options`, in order) whose
    dropped activation components (:func:`moetune.perfmodel.memory.ladder_drops`) include those of every option
    before it, so that :func:`~moetune.perfmodel.memory.saved_activation_floor` of ``c``'s job bounds the device
    GiB of options ``0..c``; 0 where there is none (a pinned recompute, full recompute first). The selective ladder
    is not nested (``moe_act,layernorm`` drops no ``mla_up_proj``), so the cover is a prefix: on DeepSeek-V3 options
    0-6 (up to ``mla_up_proj,moe_act,layernorm,mlp``)."""
    drops = [ladder_drops(Features().model_copy(update=rec)) for _, rec in options]
    for c in range(len(drops) - 1, 0, -1):
        dc = drops[c]
        if dc is not None and all(d is not None and d <= dc for d in drops[:c]):
            return c
    return 0


def _recompute_options(model: ModelArch, max_recompute: str, pinned: str | None = None) -> list[tuple[int, dict]]:
    """(rank, Features updates) in the workflow's order: none, selective ladder, full; only ``pinned`` (a
    ``--recompute`` value) when given. Every option sets all recompute fields (:func:`moetune.io.load.parse_recompute`),
    so an option means the same on any starting features."""
    from moetune.io.load import parse_recompute

    if pinned is not None:
        upd = parse_recompute(pinned)
        rank = 0 if upd["recompute_granularity"] is None else 99 if upd["recompute_granularity"] == "full" else 50
        return [(rank, upd)]
    opts: list[tuple[int, dict]] = [(0, parse_recompute("none"))]
    if max_recompute in ("selective", "full"):
        seen = set()
        for i, mods in enumerate(SELECTIVE_LADDER):
            keep = tuple(m for m in mods if _module_applies(model, m))
            if not keep or keep in seen:
                continue
            seen.add(keep)
            opts.append((i + 1, parse_recompute(",".join(keep))))
    if max_recompute == "full":
        opts.append((99, parse_recompute("full:uniform:1")))
    return opts


def _module_applies(model: ModelArch, module: str) -> bool:
    if module == "mla_up_proj":
        return model.multi_latent_attention
    if module in ("moe_act", "moe"):
        return model.is_moe
    if module == "mlp":
        return model.num_dense_mlp_layers > 0
    if module == "shared_experts":
        return bool(model.moe_shared_expert_intermediate_size)
    return True


def _dispatcher_variants(req: PlanRequest, lp: LayoutPoint) -> list[dict]:
    if not req.model.is_moe or lp.ep * lp.etp == 1:
        return [{"moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None}]
    out = []
    for d in req.dispatchers:
        if d in ("alltoall", "allgather"):
            out.append({"moe_token_dispatcher_type": d, "moe_flex_dispatcher_backend": None})
        elif d in ("deepep", "hybridep"):
            out.append({"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": d})
    return out


def _overlap_variants(req: PlanRequest, lp: LayoutPoint, recompute: dict) -> list[dict]:
    off = {"overlap_moe_expert_parallel_comm": False, "delay_wgrad_compute": False}
    if "ep_overlap" in req.fix or "delay_wgrad" in req.fix:
        # pinned: exactly what was asked (an illegal pin is rejected by the checker with its rule id)
        on = bool(int(req.fix.get("ep_overlap", 1 if int(req.fix.get("delay_wgrad", 0)) else 0)))
        delay = bool(int(req.fix.get("delay_wgrad", 0)))
        if not on and delay:
            return []
        if "delay_wgrad" in req.fix or not on:
            return [{"overlap_moe_expert_parallel_comm": on, "delay_wgrad_compute": delay}]
        return [{"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": False},
                {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True}]
    if not (req.explore_overlap and req.model.is_moe and lp.ep > 1):
        return [off]
    if recompute.get("recompute_granularity") == "full" or "moe" in recompute.get("recompute_modules", ()):
        return [off]  # EP overlap excludes full / moe recompute (docs/rules.md §4.1)
    if lp.pp > 1 and lp.vpp == 1:
        return [off]  # EP overlap with PP > 1 needs VPP (docs/rules.md §4.1)
    if req.model.mtp_num_layers > 1:
        return [off]
    return [off, {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": False},
            {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True}]


def _graph_variants(req: PlanRequest, recompute: dict, disp: dict | None = None) -> list[dict]:
    """CUDA-graph variants of a layout with recompute option ``recompute`` and dispatcher variant ``disp``: off,
    TE-scoped (``attn,moe_router,moe_preprocess`` / ``attn,mlp``; not with full recompute, docs/domain.md §6.4) and a
    whole-iteration graph (Megatron-LM ``FullCudaGraphWrapper`` around the pipeline schedule: any PP / VPP and
    recompute). A dropless MoE has static expert shapes in a whole-iteration graph only with HybridEP's rank capacity
    budget (rule CG-029; MOE-044 needs the flex dispatcher's HybridEP backend): there the variant carries the rank
    capacity factor and paged stash of Bridge's full-iteration presets (catalog memory.yaml
    ``full_iteration_moe_recipe``), and with other dispatchers it is not offered; nor with activation offloading in
    ``recompute`` (the option's updates: layer CPU offloading with a whole-iteration graph is documented as
    unsupported, CG-011w; fine-grained offloading needs settings the planner does not search, CG-020). ``--fix`` pins
    of ``cuda_graph_scope``, ``rank_capacity_factor`` and ``paged_stash`` are kept as given."""
    from moetune.io.load import FeatureChoices, choice_updates, fix_choices

    static = {"moe_expert_rank_capacity_factor": None, "moe_paged_stash": False}
    full = {"cuda_graph_impl": "local", "cuda_graph_scope": ("full_iteration",), **static}
    if req.model.is_moe:
        if disp is not None and disp.get("moe_flex_dispatcher_backend") == "hybridep":
            rc = const("full_iteration_moe_recipe")
            full.update(moe_expert_rank_capacity_factor=float(rc["moe_expert_rank_capacity_factor"]),
                        moe_paged_stash=bool(rc["moe_paged_stash"]))
        else:
            full = None
    if recompute.get("cpu_offloading") or recompute.get("fine_grained_activation_offloading"):
        full = None
    pinned_keys = {k: v for k, v in req.fix.items() if k in ("rank_capacity_factor", "paged_stash")}
    pins = choice_updates(fix_choices(pinned_keys)) if pinned_keys else {}
    if "cuda_graph_scope" in req.fix:
        pinned = choice_updates(FeatureChoices(cuda_graph_scope=str(req.fix["cuda_graph_scope"])))
        whole = "full_iteration" in pinned["cuda_graph_scope"]
        out = [{**static, **(full if whole and full else {}), **pinned}]
    else:
        out = [{"cuda_graph_impl": "none", "cuda_graph_scope": (), **static}]
        if req.explore_graphs:
            if recompute.get("recompute_granularity") != "full":
                scope = ("attn", "moe_router", "moe_preprocess") if req.model.is_moe else ("attn", "mlp")
                out.append({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": scope, **static})
            if full is not None:
                out.append(full)
    return [{**v, **pins} for v in out]


#: :meth:`Search.consider` answers: no feature variant of the recompute option fits, some do, every one does
NONE_FIT, SOME_FIT, ALL_FIT = 0, 1, 2


def _split_key(mode: tuple[str, bool], lp: LayoutPoint) -> tuple:
    """A layout point but its microbatch size, with the state mode."""
    return (mode, lp.tp, lp.cp, lp.pp, lp.vpp, lp.ep, lp.etp, lp.pipeline_layout)


def _layout(lp: LayoutPoint) -> Layout:
    return Layout(tp=lp.tp, pp=lp.pp, vpp=lp.vpp if lp.vpp > 1 else None, pipeline_layout=lp.pipeline_layout,
                  cp=lp.cp, ep=lp.ep, etp=lp.etp)


def _job(req: PlanRequest, lp: LayoutPoint, features: Features) -> Job:
    return Job(
        model=req.model, system=req.system, gpus=req.gpus, global_batch_size=req.global_batch_size,
        micro_batch_size=lp.mbs, seq_length=req.seq_length, layout=_layout(lp), features=features,
    )


# --------------------------------------------------------------------------------------------------------------


def _fits(mem, capacity_gib: float, headroom: float) -> tuple[bool, float]:
    """Headroom policy of ``estimate`` (:func:`moetune.perfmodel.memory.fits_capacity`): the most-loaded rank's device
    memory (reserved + CUDA context, NCCL, DeepEP) leaves ``headroom`` GiB of HBM free.

    Returns (fits, overflow GiB) where overflow = device + headroom - capacity.
    """
    return _fits_peaks([(s.device_gib, s.peak_allocated_gib) for s in mem.stages], capacity_gib, headroom)


def _fits_peaks(peaks: list[tuple[float, float]], capacity_gib: float, headroom: float) -> tuple[bool, float]:
    """:func:`_fits` from (device GiB, peak allocated GiB) per rank (:func:`moetune.perfmodel.memory.device_peaks`)."""
    peak = max(d for d, _ in peaks)
    return fits_capacity(peak, capacity_gib, headroom), peak + headroom - capacity_gib


def plan(req: PlanRequest, *, schedule_bound: bool = True) -> PlanResult:
    """Run the search and return the ranked feasible candidates (see module docstring and :class:`Search`).

    Requests of many GPUs are searched in several processes (:func:`_workers`, :func:`_plan_parallel`), the others
    by one :class:`Search`. ``schedule_bound``: skip the retuning of layouts (and recompute options) whose
    :func:`_schedule_floor` exceeds the k-th best; the result is the same either way (tests/test_plan_fastpath.py
    compares both), only the work differs.
    """
    t0 = time.perf_counter()
    refuse_unsupported_precision(req)
    starts = plan_starts(req)
    floor = request_floor(req, starts)
    if not floor.fits:
        return _floor_result(req, floor, starts, t0)
    n_workers = _workers(req)
    with collector_paused():
        if n_workers > 1:
            return _plan_parallel(req, n_workers, schedule_bound=schedule_bound, starts=starts)
        return Search(req, schedule_bound=schedule_bound, starts=starts).run()


def refuse_unsupported_precision(req: PlanRequest) -> None:
    """Raise :class:`moetune.errors.InputError` for a precision the GPU cannot run (PRC-008): every configuration
    of it would be rejected by the checker, so no search could find one."""
    from moetune.errors import InputError
    from moetune.rules.precision import precision_unsupported

    for p in req.precisions:
        bad = precision_unsupported(p, req.system.gpu.name)
        if bad:
            raise InputError(f"{req.system.name}: {bad}", field="precision", value=p)


def request_floor(req: PlanRequest, starts: dict[str, Any] | None = None):
    """The request's :class:`moetune.plan.floor.MemoryFloor`: over every precision and state mode the search may
    price (:func:`_state_modes` at PP 1 and DP > 1, with and without TP), their base features
    (:func:`_base_features`) and, where the offload pass may run, its optimizer CPU offload (:data:`OFFLOAD_UPDATES`:
    the searched dimensions change no other state bytes)."""
    from moetune.plan.floor import memory_floor

    starts = starts if starts is not None else plan_starts(req)
    offload = req.allow_offload and "offload" not in req.fix
    opt_off = {k: v for k, v in OFFLOAD_UPDATES.items() if k.startswith("optimizer_")}
    feats: list[tuple[str, Features]] = []
    for tp in (1, 2):  # sequence parallelism (and what depends on it) follows TP > 1 in the base features
        lp = LayoutPoint(tp, 1, 1, 1, 1, 1, 1, 2, 2)
        for precision, fsdp in _state_modes(req, lp):
            f = _base_features(req.model, precision, lp, fsdp=fsdp, start=starts[precision].features, fix=req.fix)
            mode = f"{precision}, {'Megatron-FSDP' if fsdp else 'distributed optimizer'}"
            feats.append((mode, f))
            if offload:
                feats.append((mode + ", optimizer offloaded", f.model_copy(update=opt_off)))
    return memory_floor(req, feats, request_headroom(req))


def _floor_result(req: PlanRequest, floor: Any, starts: dict[str, Any], t0: float) -> PlanResult:
    """The answer to a request whose memory floor does not fit: no candidate, no search, the floor in the notes."""
    limits = SpaceLimits(mbs_options=req.mbs_options, fix=dict(req.fix))
    layouts = sum(1 for _ in enumerate_layouts(req.model, req.system, req.gpus, req.global_batch_size,
                                               req.seq_length, limits))
    return PlanResult(req, [], 0, 0, time.perf_counter() - t0, layouts, layouts, 0, 0, [], [floor.message()],
                      starts=starts, memory_floor=floor)


class _StageA2A(NamedTuple):
    """What :func:`_schedule_floor` reads of a dispatcher's estimate: per stage, its EP dispatch/combine seconds."""

    stage_a2a: list[float]
    sm_frac: float  #: SM share of the dispatcher's kernels


class SharedBound:
    """The k-th best step time of a parallel search (:func:`_plan_parallel`) over every share's layouts, in
    process-shared memory created before the shares are forked: ``top`` holds the K smallest of the step times the
    shares :meth:`offer` (each share offers the first recorded step time of each new layout, as it pushes it on its own
    top-K heap, :meth:`Search.record`; the shares' layouts are disjoint, so these are K distinct layouts, each with a
    checked candidate at most that fast) and ``value`` their largest once K were offered. So ``value`` is the bound a
    single search would hold after the same records, at most each share's own k-th best: pruning a share with it loses
    no global top-K member (:meth:`Search.kth_best`). ``None`` (one process): the share's own bound."""

    def __init__(self, value: Any = None, top: Any = None) -> None:
        self._value = value
        self._top = top  #: K doubles (no lock of their own: guarded by ``value``'s lock), +inf where none yet

    def tighten(self, own: float) -> float:
        """The bound to prune with: min of this share's own k-th best and the union's."""
        if self._value is None:
            return own
        return min(own, self._value.value)

    def offer(self, step: float) -> None:
        """A new layout's first recorded step time (:meth:`Search.record`): kept if among the K smallest offered."""
        if self._value is None:
            return
        with self._value.get_lock():
            top = self._top
            worst = max(range(len(top)), key=top.__getitem__)
            if step < top[worst]:
                top[worst] = step
                kth = max(top)
                if kth < self._value.value:
                    self._value.value = kth


class Search:
    """One exact search over the layouts of a request (or of its share ``req.partition``).

    Two passes keep it exact and fast: :meth:`pass_1` queues every layout that survives the model-state floor;
    :meth:`pass_2` visits the layouts in increasing order of the :func:`_walls_floor` (= :func:`variant_floor`) of
    their base job (:meth:`order`: a layout's base job is priced only when a lower bound on that floor may make it
    the next, :mod:`moetune.plan.queue_bound`), fits recompute and prices every feature variant
    (:meth:`consider`), and stops as soon as a layout's floor exceeds the k-th best step time found: every later
    layout has a larger floor, so none can win. :meth:`offload_pass` runs only when nothing fits without offloading.

    Inside pass 2 a visited layout whose :func:`_schedule_floor` (the bubble, the slowest stage and the cheapest
    dispatcher's EP time added to the variant floor) exceeds the k-th best is not retuned (``schedule_bound``): none
    of its variants could be recorded, so the candidates and ``per_layout_best`` are those of the full walk (only the
    counters differ) and neither is its full-recompute fit tested: the skip needs a finite bound, so some layout fits,
    and the closest misses (:attr:`PlanResult.closest`) are reported - and complete - only when none does
    (``exact_ranking`` turns this skip off). A fitting variant whose :meth:`bounds_of` is at least its layout's
    best so far or above the k-th best is not priced either (it could not be recorded; the counters are unchanged,
    ``variant_bound=False`` prices it). Memory fits are decided rank by rank (:func:`moetune.perfmodel.memory.device_peaks`,
    stopping at the first rank that overflows); variants are priced by their walls (:func:`moetune.perfmodel.step.
    estimate_walls`), and the full memory / time estimates are built only for the candidates returned (:meth:`result`).

    State: the request and its fixed inputs (capacity, headroom, recompute options, starting features, efficiency),
    the bound (the heap of the top-K distinct layouts' step times, and ``shared`` across processes), the counters of
    :class:`PlanResult`, the results (best candidate and step time per layout, closest misses, offload queue) and
    memo tables that hold identical values for the duration of one search only (Features per combination of updates
    and their time-only-normalised twin, one Layout per layout point, one Job and step-time estimate per (layout,
    Features), memory peaks / fit verdicts / full estimates per (layout, memory-relevant Features)).
    """

    def __init__(self, req: PlanRequest, shared: SharedBound | None = None, schedule_bound: bool = True,
                 starts: dict[str, Any] | None = None, variant_bound: bool = True, queue_bound: bool = True,
                 ladder_bound: bool = True) -> None:
        self.req = req
        #: skip the fit tests of the ladder options that :meth:`ladder_prefix_unfit` proves cannot fit (same result
        #: and counters; ``False`` tests every option, tests/test_plan_ladder.py compares both)
        self.ladder_bound = ladder_bound
        #: price a queued layout's base job only when its bound may make it the next (:meth:`order`; ``False`` prices
        #: every layout first; same result and counters, tests/test_plan_queue.py compares both)
        self.queue_bound = queue_bound
        self.shared = shared if shared is not None and req.partition[1] > 1 else SharedBound()
        self.schedule_bound = schedule_bound and not req.exact_ranking
        #: skip pricing the variants that :meth:`bounds_of` proves cannot be recorded (same result and counters;
        #: ``False`` prices every fitting variant, tests/test_plan_fastpath.py compares both)
        self.variant_bound = variant_bound
        self.bounded = 0  # fitting variants not priced by that bound (part of ``feasible``)
        self.t0 = time.perf_counter()
        self.capacity = req.system.gpu.hbm_gib
        self.headroom = request_headroom(req)
        self.limits = SpaceLimits(mbs_options=req.mbs_options, fix=dict(req.fix))
        self.rec_opts = _recompute_options(req.model, req.max_recompute,
                                           str(req.fix["recompute"]) if "recompute" in req.fix else None)
        #: per ladder option: whether every later option recomputes at least what it does (:meth:`ladder_rest_pruned`)
        self._ladder_cores = ladder_cores(self.rec_opts)
        #: the ladder option whose :func:`~moetune.perfmodel.memory.saved_activation_floor` bounds every option up to
        #: it (:func:`ladder_cover`; 0: none)
        self._ladder_cover = ladder_cover(self.rec_opts)
        self.starts = starts if starts is not None else plan_starts(req)
        self.k = max(req.top, 1)
        self.eff = resolve_efficiency(req.efficiency)  # resolved once
        # bound and results
        self.best: list[tuple] = []  # heap of the top-K distinct layouts by (-step time): the pruning bound
        self.best_by_layout: dict[tuple, Candidate] = {}
        self.per_layout: dict[tuple, float] = {}
        self.closest: list[tuple] = []  # heap of (-overflow GiB, n, layout, mode): the closest misses
        self.offload_queue: list[tuple[float, LayoutPoint, tuple[str, bool]]] = []
        self.queue: list[tuple[LayoutPoint, tuple[str, bool]]] = []  # pass 1 -> pass 2 (:meth:`order`)
        self.rejected_rules: dict[str, int] = {}
        self.notes: list[str] = []
        # counters
        self.searched = self.feasible = self.layouts = 0
        self.pruned_mem = self.pruned_bound = self.rejected = 0
        self._tie = itertools.count()
        # memo tables of one search (identical values, fewer pydantic objects)
        self._base_cache: dict[tuple, Features] = {}
        self._state_cache: dict[tuple, float] = {}  # :meth:`state_floor`
        self._feat_cache: dict[tuple, Features] = {}
        self._mem_feats: dict[int, Features] = {}
        self._canon: dict[Features, Features] = {}
        self._layout_cache: dict[tuple, Layout] = {}
        self._graphs: dict[tuple, list[dict]] = {}  # :meth:`graph_variants`
        self._rest_graphs: dict[tuple, frozenset] = {}  # :meth:`rest_graphs`
        self._rest_overlap: dict[tuple, bool] = {}  # :meth:`rest_overlap`
        self._job_cache: dict[tuple, Job] = {}  # per (layout, Features instance); the instance check guards id reuse
        self._time_cache: dict[tuple, Any] = {}
        self._a2a_cache: dict[tuple, _StageA2A] = {}  # per (layout, Features instance) not priced in full
        self._mem_cache: dict[tuple, list] = {}  # (device, peak) GiB per rank
        self._fit_cache: dict[tuple, tuple[bool, Job]] = {}  # fits the headroom policy, and the job it was tested on
        self._full_mem: dict[tuple, Any] = {}
        self._overflow_rank: dict[tuple, int] = {}  # per layout: the rank that overflowed last (tested first next)
        self._reserved: dict[tuple, dict[int, float]] = {}  # per (layout, reserved_features): reserved GiB per rank
        self._time_only = {f: False for f in TIME_ONLY_FEATURES}

    # ----------------------------------------------------------------------------------------------------------
    # the phases

    def run(self) -> PlanResult:
        """:meth:`pass_1`, :meth:`pass_2`, :meth:`offload_pass`, then the ranked result."""
        self.pass_1()
        self.pass_2()
        self.offload_pass()
        return self.result()

    def pass_1(self) -> None:
        """Model-state floor (:meth:`state_floor`) of every layout, one mesh and split at a time (:func:`moetune.plan.
        space.enumerate_meshes`: its points differ only in MBS, which neither the state modes nor the floor read); the
        surviving layouts are queued for :meth:`pass_2` (priced by :meth:`order`) in the enumeration's order."""
        req = self.req
        part_i, part_n = req.partition
        # share by (TP, CP, EP, ETP), numbered in the order the enumeration first reaches them: per-layer work and
        # model-state floors stay in one process, and the other shares' layouts are neither built nor validated here
        groups: dict[tuple, int] = {}

        def mine(group: tuple) -> bool:
            return groups.setdefault(group, len(groups)) % part_n == part_i

        for lay, points in enumerate_meshes(req.model, req.system, req.gpus, req.global_batch_size, req.seq_length,
                                            self.limits, mine if part_n > 1 else None):
            first = points[0]  # the points of one mesh and split differ only in MBS, which neither reads below
            self.layout_of(first, lay)  # the validated layout is the one of every point
            # per (precision, Megatron-FSDP): the most loaded rank's model state (weights + grads + optimizer)
            # alone, above the limit by ``over`` GiB: no activation feature can go below it
            overs = [(mode, self.state_floor(mode, first) + self.headroom - self.capacity)
                     for mode in _state_modes(req, first)]
            for lp in points:
                self.layouts += 1
                for mode, over in overs:
                    if over > 0:
                        self.pruned_mem += 1
                        self.note_miss(over, lp, mode)
                        continue
                    self.queue.append((lp, mode))  # priced when :meth:`order` reaches it

    def state_floor(self, mode: tuple[str, bool], lp: LayoutPoint) -> float:
        """GiB of the most loaded rank's model state in the layout's base job (:func:`moetune.perfmodel.memory.
        state_floor_bytes`), memoised per (mode, TP, PP, VPP, pipeline layout, EP, ETP, DP x CP): it reads the
        split's parameters per rank (:func:`~moetune.perfmodel.memory._split_all_rank_params`: split, TP, EP, ETP),
        the base features (mode, TP > 1) and the distributed optimizer's shards (:func:`~moetune.perfmodel.memory.
        shard_sizes`: DP x CP and EDP = GPUs / (PP x EP x ETP)), neither CP otherwise nor the MBS, so the CP meshes
        of one split share it (tests/test_plan_fastpath.py compares it with the floor of every layout point)."""
        key = (mode, lp.tp, lp.pp, lp.vpp, lp.pipeline_layout, lp.ep, lp.etp, lp.dp * lp.cp)
        got = self._state_cache.get(key)
        if got is None:
            got = self._state_cache[key] = state_floor_bytes(self.job_of(lp, self.base_features(mode, lp))) / 1024.0**3
        return got

    def order(self):
        """The queued layouts as (queue key, layout, mode, :func:`_schedule_floor`) in increasing (key, queue index)
        order, the key being :func:`_walls_floor` of the base job's walls: what sorting the queue by (key, index)
        gives, pricing a layout's base job only when it may be next (:mod:`moetune.plan.queue_bound`).

        The profile of the first layout of each group (precision and state mode, TP, CP, EP, ETP, MBS) gives its
        group's bound; every layout enters a heap with its bound B <= its key (:class:`moetune.plan.queue_bound.
        QueueBound`; -inf with ``queue_bound=False``), a priced one with its key K. The least entry is
        popped; a bound entry is priced and pushed back with its key, a key entry is the next layout. Proof that the
        keys come out in sorted order: when the key entry (K, i) is the least, every layout j not yet priced has its
        bound entry (B_j, j) >= (K, i) in the heap, so (K_j, j) >= (B_j, j) >= (K, i), and j != i makes it strict;
        every priced layout not yet returned has its key entry in the heap, >= (K, i). So (K, i) is the least
        (key, index) of the layouts not yet returned. The caller stops early (the rest of the queue has keys above
        the k-th best): the layouts never popped are never priced.

        Two answers come without pricing, read against the k-th best when a bound entry is popped (the caller has
        done all its work on the layouts before, so it holds the same k-th best when it reads the answer): a bound
        B above it is yielded as the key (every key left is >= B: the caller stops as it would at the next key), and
        a layout whose bound S on its schedule floors (:meth:`QueueBound.step_bound`: at most the :meth:`ep_floor`
        that :meth:`pass_2` tests) exceeds it is yielded with S as its schedule floor (with
        ``schedule_bound``): the caller skips it (``pruned_bound`` + 1) as it would have when its key came up, since
        the k-th best only falls. Either way the layouts retuned, their order and the
        counters are those of the sorted walk; only fewer base jobs are priced."""
        heap: list[tuple[float, int, bool]] = []
        req = self.req
        qb = QueueBound(self.eff, req.gpus, req.global_batch_size) if self.queue_bound else None
        #: per (mode, layout but MBS): the optimizer and once-per-step host seconds of a priced base job (they read
        #: the split, the parameters per rank and the state mode, not the microbatch size: :func:`moetune.perfmodel.
        #: step._dp_and_optimizer`, :func:`~moetune.perfmodel.step._step_host`; tests/test_plan_queue.py checks it)
        fixed: dict[tuple, float] = {}
        for i, (lp, mode) in enumerate(self.queue):
            gkey = (mode, lp.tp, lp.cp, lp.ep, lp.etp, lp.mbs)
            if qb is not None:
                if gkey not in qb.groups:
                    qb.add_group(gkey, self.job_of(lp, self.features(mode, lp, {})))
                heap.append((qb.bound(gkey, lp, self.layout_of), i, False))
            else:
                heap.append((float("-inf"), i, False))
        heapq.heapify(heap)
        while heap:
            key, i, priced = heapq.heappop(heap)
            lp, mode = self.queue[i]
            if not priced:
                kth = self.kth_best()
                if key > kth:
                    # every layout left has a key >= this bound > the k-th best: the caller stops here (it reads
                    # only that the key exceeds the k-th best), as it would at the next key
                    yield key, lp, mode, float("inf")
                    return
                if self.schedule_bound and qb is not None and kth < float("inf"):
                    step = qb.step_bound((mode, lp.tp, lp.cp, lp.ep, lp.etp, lp.mbs), lp, self.layout_of,
                                         lambda lp=lp, mode=mode: self.dispatch_jobs(lp, mode),
                                         fixed.get(_split_key(mode, lp), 0.0))
                    if step > kth:
                        # its schedule floors exceed the k-th best (which only falls): the caller skips it
                        # unpriced, as it would when its key came up (:meth:`pass_2`, ``sched_floor``)
                        yield key, lp, mode, step
                        continue
            res = self.time_of(lp, self.features(mode, lp, {}))  # the base job (pass 2 prices it again)
            fixed.setdefault(_split_key(mode, lp), res.walls["optimizer"] + res.step_host)
            if priced:
                yield key, lp, mode, _schedule_floor(res)
            else:
                heapq.heappush(heap, (_walls_floor(res.walls), i, True))

    def dispatch_jobs(self, lp: LayoutPoint, mode: tuple[str, bool]) -> list[Job]:
        """The base job of the layout with each dispatcher the search tries, but the base job's own."""
        base = self.features(mode, lp, {})
        feats = (self.features(mode, lp, d) for d in _dispatcher_variants(self.req, lp))
        return [self.job_of(lp, f) for f in feats if f is not base]

    def pass_2(self) -> None:
        """Best-first by the variant floor (:meth:`order`): fit recompute (least first) and price the variants of
        each layout."""
        floor_rec = self.rec_opts[-1][1]
        n = len(self.queue)
        for i, (floor, lp, mode, sched_floor) in enumerate(self.order()):
            report(i, n, "layouts")
            if self.req.first_fit and self.best_by_layout:
                break
            if floor > self.kth_best():
                self.pruned_bound += n - i
                break
            if self.schedule_bound and (sched_floor > self.kth_best() or self.ep_floor(lp, mode) > self.kth_best()):
                # no variant can enter the top-K, so none would be recorded (:func:`_schedule_floor`): skip it, its
                # fit test too (the bound is finite, so candidates exist and the closest misses are not reported)
                self.pruned_bound += 1
                continue
            # the most memory-saving recompute allowed (pruning proof: see module docstring)
            floor_feats = self.features(mode, lp, floor_rec)
            if not self.fits(lp, floor_feats):
                over = _fits_peaks(self.memory_of(lp, floor_feats), self.capacity, self.headroom)[1]
                self.pruned_mem += 1
                self.note_miss(over, lp, mode)
                continue
            self.retune(lp, mode)

    def retune(self, lp: LayoutPoint, mode: tuple[str, bool]) -> None:
        """Retune a layout whose floor fits: layer-level CPU offloading where it applies (:meth:`layer_offload`), then
        the recompute ladder, least recompute first (module docstring step 2). When the least option does not end
        the ladder, one memory floor (:meth:`ladder_prefix_unfit`) may prove the options up to :func:`ladder_cover`
        unfit; their fit tests are then skipped (each would fail and record nothing, so answers and counters are
        those of testing them), and a core option among them is bounded by the rest of the ladder first
        (:meth:`ladder_ahead_pruned`)."""
        floor_rank = self.rec_opts[-1][0]
        self.layer_offload(lp, mode)
        fitted: set[tuple] = set()  # the (dispatcher, graphs) variants that have fitted at a lesser option
        unfit_upto = -1  # options 1..unfit_upto are proved not to fit (:meth:`ladder_prefix_unfit`)
        for j, (rank, rec) in enumerate(self.rec_opts):
            if (j and self.schedule_bound and self._ladder_cores[j] and len(self.best) >= self.k
                    and (j <= unfit_upto and self.ladder_ahead_pruned(lp, mode, j, unfit_upto, fitted)
                         or self.ladder_rest_pruned(lp, mode, j, fitted))):
                # no variant left to fit can be recorded under this option or any later one: the rest of the
                # ladder would record nothing (its fit tests and option bounds are skipped)
                self.pruned_bound += 1
                break
            if j == 1 and self.ladder_bound and self._ladder_cover > 1 and self.ladder_prefix_unfit(lp, mode):
                unfit_upto = self._ladder_cover
            if j <= unfit_upto and rank != floor_rank:
                continue  # its fit test would fail: the same as below, without the test
            if rank != floor_rank and not self.fits(lp, self.features(mode, lp, rec)):
                continue
            if rank and len(self.best) >= self.k:
                # recompute adds to the invariant walls: re-bound before pricing this layout's variants
                if self.option_floor(lp, mode, rec) > self.kth_best():
                    self.pruned_bound += 1
                    break
                if self.schedule_bound and self.ep_floor(lp, mode, rec) > self.kth_best():
                    # none of this option's variants can be recorded (:func:`_schedule_floor`); the ladder goes
                    # on exactly as after pricing them: it stops once every variant has fitted
                    self.pruned_bound += 1
                    if self.consider(lp, mode, rank, rec, dry=True, fitted=fitted) == ALL_FIT:
                        break
                    continue
            if self.consider(lp, mode, rank, rec, fitted=fitted) == ALL_FIT:
                # every variant has its least recompute that fits. While some variant (CUDA graphs, another
                # dispatcher's buffers) does not fit, the ladder goes on for those variants only: more recompute
                # can make room for a feature that saves more than the recompute costs
                break

    def ladder_ahead_pruned(self, lp: LayoutPoint, mode: tuple[str, bool], j: int, unfit_upto: int,
                            fitted: set[tuple]) -> bool:
        """Whether :meth:`retune`, going on past option ``j`` of the ladder (one that :meth:`ladder_prefix_unfit`
        proved unfit, ``j <= unfit_upto``), stops at a later option with :meth:`ladder_rest_pruned` before it does
        anything else: then it ends the ladder exactly as it does at ``j`` where ``ladder_rest_pruned(j)`` holds
        (``pruned_bound`` + 1, nothing recorded), so that test, which prices option ``j``'s base job, is not needed.

        The walk is :meth:`retune`'s own from ``j + 1``: a core option (:func:`moetune.plan.ladder.ladder_cores`)
        answers with its :meth:`ladder_rest_pruned`; an option proved unfit is skipped and an option whose fit test
        fails is passed over, neither changing the counters, ``fitted``, the bests or the bound; an option that fits,
        the floor option (pass 2 found that it fits) or the end of the ladder answers False (:meth:`retune` then
        tests ``j`` itself and walks on as before, the fit tests memoised). Option ``i``'s rest test runs with the
        ``fitted`` set and records :meth:`retune` would give it, only earlier; between the two only the k-th best
        (shared across processes) and the layout's best can change, both only fall, and a True answer stays True
        as they fall. So answers and counters are those of testing ``j`` first (tests/test_plan_ladder.py); only the
        fit tests that the ladder makes after ``j`` where its rest test fails are made where it holds too (they fill
        memo tables and :meth:`fits`'s rank order, which changes no answer). On DeepSeek-V3 the memory floor covers
        options 1-6 and option 2 is a core: the walk reaches option 8 after one fit test (option 7)."""
        floor_rank = self.rec_opts[-1][0]
        for i in range(j + 1, len(self.rec_opts)):
            rank, rec = self.rec_opts[i]
            if self._ladder_cores[i]:
                return self.ladder_rest_pruned(lp, mode, i, fitted)
            if i <= unfit_upto and rank != floor_rank:
                continue
            if rank == floor_rank or self.fits(lp, self.features(mode, lp, rec)):
                return False
        return False

    def ladder_prefix_unfit(self, lp: LayoutPoint, mode: tuple[str, bool]) -> bool:
        """Whether no option of the recompute ladder up to :func:`ladder_cover`'s option fits the layout's base
        features (so their fit tests in :meth:`retune` would all fail): the
        :func:`~moetune.perfmodel.memory.saved_activation_floor` of that option's base job, a lower bound on the
        device GiB of every option it covers, exceeds the capacity less the headroom on some rank by more than
        :data:`LADDER_FLOOR_SLACK` (the bound's float sums may round differently from each option's own; the slack
        is far above that rounding, so only options proved unfit by a strict margin are skipped)."""
        feats = self.features(mode, lp, self.rec_opts[self._ladder_cover][1])
        lk = lp.key()
        first = self._overflow_rank.get(lk, 0)
        floors = saved_activation_floor(self.job_of(lp, feats), [first, *(i for i in range(lp.pp) if i != first)])
        if floors is None:
            return False
        limit = self.capacity - self.headroom
        return any(gib > limit + LADDER_FLOOR_SLACK * max(1.0, abs(limit)) for gib in floors)

    def layer_offload(self, lp: LayoutPoint, mode: tuple[str, bool]) -> None:
        """Layer-level CPU activation offloading as the alternative to recompute of a PP-1 layout that does not fit
        without either: the first N decoder layers' saved activations go to host memory (Megatron-Core
        ``--cpu-offloading --cpu-offloading-num-layers N``; NVIDIA's Llama-3-70B GB200/GB300 Megatron-FSDP presets run
        it instead of recompute). N is the least of :data:`LAYER_OFFLOAD_EIGHTHS` x ``num_layers`` / 8 under which
        the base variant fits; its variants are priced next to the recompute ladder's (the copies cost the exposed
        host-link time, :func:`moetune.perfmodel.schedule.offload_exposed`), so the faster one wins. Offloading
        excludes recompute (rule OFF-003) and per-layer CUDA graphs (OFF-004: the checker rejects those variants).
        The offloaded bytes of one microbatch (PP 1: one in flight) must fit in the host memory per GPU
        (system catalog ``host_memory_gb_per_gpu``)."""
        req = self.req
        if (lp.pp != 1 or not req.explore_layer_offload or "offload" in req.fix or "recompute" in req.fix
                or req.max_recompute == "none"):
            return
        none = self.rec_opts[0][1]
        if self.rec_opts[0][0] != 0 or self.fits(lp, self.features(mode, lp, none)):
            return
        nl = req.model.num_layers
        host_gb = req.system.host_memory_gb_per_gpu  # the offloaded activations live in (pinned) host memory
        counts = [min(max(1, -(-k * nl // 8)), nl - 1) for k in LAYER_OFFLOAD_EIGHTHS]  # non-decreasing
        if (counts and counts[0] >= 1 and self.schedule_bound and len(self.best) >= self.k
                and self.offload_pruned(lp, mode, {**none, "cpu_offloading": True,
                                                   "cpu_offloading_num_layers": counts[0]})):
            self.pruned_bound += 1
            return
        tried: set[int] = set()
        for n in counts:
            if n in tried or n < 1:
                continue
            tried.add(n)
            extra = {"cpu_offloading": True, "cpu_offloading_num_layers": n}
            feats = self.features(mode, lp, {**none, **extra})
            if host_gb is not None and sum(cpu_offloaded_layer_bytes(self.job_of(lp, feats))) > host_gb * 1e9:
                return  # more layers offload more bytes: none of the rest fits in host memory either
            if self.fits(lp, feats):
                self.consider(lp, mode, 1, none, extra)
                return

    def offload_pruned(self, lp: LayoutPoint, mode: tuple[str, bool], upd: dict) -> bool:
        """Whether no variant :meth:`layer_offload` could price can be recorded, from the job ``upd`` (no recompute,
        the fewest layers it offloads, base features). Each variant's step time is at least the :func:`_schedule_floor`
        of that job with its dispatcher's dispatch/combine seconds (without EP overlap where the layout allows none)
        plus, per stage, the exposed offload copies of that job (``more=stage_offload``). Proof: EP overlap, delayed
        wgrad, CUDA graphs and the dispatcher leave a stage's compute, TP and CP walls unchanged (:func:`_schedule_floor`)
        and so the copies' exposed time too (:func:`moetune.perfmodel.schedule.offload_exposed` of the same layer time,
        and of the saved bytes of the offloaded layers, which no dispatcher or graph scope changes); offloading more
        layers copies a superset of the bytes behind a window of L // N layers that does not grow, so every term of the
        exposed time is at least as large. A variant is recorded only below its layout's best so far and at most at
        the k-th best (:meth:`consider`). The bounds are :meth:`offload_bounds`' with the layout's EP overlap."""
        req = self.req
        bounds = self.offload_bounds(lp, mode, upd)
        overlap = {"overlap_moe_expert_parallel_comm": any(ov["overlap_moe_expert_parallel_comm"]
                                                           for ov in _overlap_variants(req, lp, upd))}
        prev = self.best_by_layout.get(lp.key())
        for disp in _dispatcher_variants(req, lp):
            bound = bounds(disp, overlap)
            if not ((prev is not None and bound >= prev.step_time_s) or bound > self.kth_best()):
                return False
        return True

    def bounds_of(self, lp: LayoutPoint, mode: tuple[str, bool], rec: dict, extra: dict | None):
        """The per-variant lower bounds :meth:`consider` tests before pricing a fitting variant of recompute ``rec``
        with the updates ``extra``: :meth:`variant_bounds` of ``rec`` (no ``extra``), :meth:`offload_bounds` of
        layer-level CPU offloading (:meth:`layer_offload`), None (no bound) for the offload pass's updates."""
        if extra is None:
            return self.variant_bounds(lp, mode, rec)
        if extra.get("cpu_offloading"):
            return self.offload_bounds(lp, mode, {**rec, **extra})
        return None

    def offload_bounds(self, lp: LayoutPoint, mode: tuple[str, bool], upd: dict):
        """A function of (dispatcher update, overlap update) giving a lower bound on the step time of the variants
        of the layer-offloading updates ``upd`` (:meth:`layer_offload`: no recompute, ``cpu_offloading_num_layers``
        N) with that dispatcher and EP-overlap setting, any CUDA-graph setting: the :func:`_schedule_floor` of the
        job ``upd`` with the base features (the variants' first, priced already where it fits) with the dispatcher's
        dispatch/combine seconds (:meth:`a2a_of`; without EP overlap the whole of them, ``ep_overlap=False``) plus
        that job's exposed offload copies per stage (``more=stage_offload``). Proof: that of :meth:`offload_pruned`
        for N layers (the dispatcher, EP overlap, delayed wgrad and CUDA graphs change neither the invariant walls
        nor the copies' exposed time), per overlap setting as in :meth:`variant_bounds`. Each bound is computed once
        per call; :meth:`offload_pruned` reads it at the fewest layers, :meth:`consider` at the N that fits."""
        res = self.time_of(lp, self.features(mode, lp, upd))
        got: dict[tuple, float] = {}

        def bound(disp: dict, ov: dict) -> float:
            key = (disp["moe_token_dispatcher_type"], disp["moe_flex_dispatcher_backend"],
                   ov["overlap_moe_expert_parallel_comm"])
            b = got.get(key)
            if b is None:
                b = got[key] = _schedule_floor(res, [self.a2a_of(lp, self.features(mode, lp, disp))],
                                               ep_overlap=key[2], more=res.stage_offload)
            return b

        return bound

    def offload_pass(self) -> None:
        """When no layout fits without offloading: fine-grained activation and optimizer CPU offload on the 256
        closest misses (closest first), least recompute first; with ``first_fit`` it stops at the first layout that
        fits."""
        req = self.req
        if self.best_by_layout or not req.allow_offload or not self.offload_queue or "offload" in req.fix:
            return
        self.notes.append("no layout fits without offloading; tried fine-grained activation and optimizer CPU "
                          "offload on the 256 closest layouts")
        self.offload_queue.sort(key=lambda x: x[0])
        for _, lp, mode in self.offload_queue[:256]:
            if req.first_fit and self.best_by_layout:
                break  # first_fit: whether anything fits and an example (as in :meth:`pass_2`)
            for rank, rec in self.rec_opts:
                if self.consider(lp, mode, 100 + rank, rec, OFFLOAD_UPDATES) == ALL_FIT:
                    break

    def result(self) -> PlanResult:
        """The ranked result; the itemised memory and time estimates are built for the candidates returned only."""
        cands = sorted(self.best_by_layout.values(), key=Candidate.sort_key)
        for c in cands[: max(self.req.top, 1)]:
            if c.time is None:
                c.memory = self.full_memory_of(c.layout, c.job.features)
                c.time = estimate_time(c.job, self.eff)
        floor_rec = self.rec_opts[-1][1]
        miss = [(-o, self.job_of(lp, self.features(mode, lp, floor_rec)))
                for o, _, lp, mode in sorted(self.closest, reverse=True)]
        return PlanResult(self.req, cands[: max(self.req.top, 1)], self.searched, self.feasible,
                          time.perf_counter() - self.t0, self.layouts, self.pruned_mem, self.pruned_bound,
                          self.rejected, miss, self.notes, self.per_layout, self.rejected_rules, self.starts)

    def consider(self, lp: LayoutPoint, mode: tuple[str, bool], rank: int, rec: dict, extra: dict | None = None,
                 dry: bool = False, fitted: set[tuple] | None = None) -> int:
        """Price and record the feature variants of a layout with recompute ``rec``; returns :data:`NONE_FIT`,
        :data:`SOME_FIT` or :data:`ALL_FIT` (truthy when any fits). ``dry``: only that answer (for an option none
        of whose variants could be recorded).

        ``fitted`` (the recompute ladder of one layout, :meth:`pass_2`): the (dispatcher, CUDA graphs) variants that
        fitted under a lesser recompute option. Each variant is fitted with the least recompute that fits it (the
        workflow's order, module docstring step 2), so those are neither tested nor priced again; the ones that fit
        now are added. ALL_FIT then means every variant of this option has fitted, here or under a lesser option."""
        req = self.req
        upd = {**rec, **(extra or {})}
        any_ok = False
        all_ok = True
        lk = lp.key()
        bounds = self.bounds_of(lp, mode, rec, extra) if self.variant_bound and not dry else None
        overlaps = _overlap_variants(req, lp, rec)  # read only
        for disp in _dispatcher_variants(req, lp):
            for gr in self.graph_variants(upd, disp):
                if fitted is not None:
                    vkey = (disp["moe_token_dispatcher_type"], disp["moe_flex_dispatcher_backend"],
                            gr["cuda_graph_impl"], gr["cuda_graph_scope"])
                    if vkey in fitted:
                        continue
                ok = None
                for ov in overlaps:
                    feats = self.features(mode, lp, {**upd, **disp, **ov, **gr})
                    if ok is None:
                        ok = self.fits(lp, feats)
                        any_ok = any_ok or ok
                        all_ok = all_ok and ok
                        if ok and fitted is not None:
                            fitted.add(vkey)
                    if dry:
                        break
                    self.searched += 1
                    if not ok:
                        break
                    self.feasible += 1
                    prev = self.best_by_layout.get(lk)
                    if bounds is not None:
                        # a variant whose lower bound (:meth:`bounds_of`) already rules out both tests below is
                        # not priced: it could not be recorded (the bound never exceeds its step time)
                        bound = bounds(disp, ov)
                        if (prev is not None and bound >= prev.step_time_s) or (bound > self.kth_best()
                                                                                and not req.exact_ranking):
                            self.bounded += 1
                            continue
                    job = self.job_of(lp, feats)
                    step = self.time_of(lp, feats, job).step  # = estimate_time(job).step_time_s
                    # the checker runs only where the result could matter: a new best for this layout that can
                    # still enter the reported top-K (every reported candidate has passed it)
                    if prev is not None and step >= prev.step_time_s:
                        continue
                    if step > self.kth_best() and not req.exact_ranking:
                        continue
                    findings = check_job(job)
                    errors = [f for f in findings if str(f.severity).startswith("error")]
                    if errors:
                        self.rejected += 1
                        for f in errors:
                            self.rejected_rules[f.id] = self.rejected_rules.get(f.id, 0) + 1
                        continue
                    c = Candidate(job, lp, None, None, findings, rank, step)  # estimates: :meth:`result`
                    self.record(lk, c, step, prev is None)
        # with ``fitted``, every variant skipped here fitted under a lesser option
        if all_ok and (any_ok or fitted is not None):
            return ALL_FIT
        return SOME_FIT if any_ok else NONE_FIT

    def record(self, lk: tuple, c: Candidate, step: float, new_layout: bool) -> None:
        """Keep ``c`` as the best of its layout; a new layout enters the top-K heap (the bound)."""
        self.best_by_layout[lk] = c
        self.per_layout[lk] = step
        if new_layout:
            self.shared.offer(step)
            heapq.heappush(self.best, (-step, self.searched))
            if len(self.best) > self.k:
                heapq.heappop(self.best)
        if len(self.best_by_layout) >= 4096:  # bound memory: only the best few layouts can be reported
            keep = sorted(self.best_by_layout.values(), key=Candidate.sort_key)[: max(self.k, 64)]
            self.best_by_layout.clear()
            self.best_by_layout.update({x.layout.key(): x for x in keep})

    # ----------------------------------------------------------------------------------------------------------
    # bounds

    def kth_best(self) -> float:
        """The pruning bound: the k-th best step time of this share (inf until K layouts fit), tightened by the
        other shares' (:class:`SharedBound`)."""
        own = -self.best[0][0] if len(self.best) >= self.k else float("inf")
        return self.shared.tighten(own)

    def ep_floor(self, lp: LayoutPoint, mode: tuple[str, bool], rec: dict | None = None) -> float:
        """A lower bound on the step time of the variants with recompute ``rec`` (default none), for comparison with
        the k-th best: it exceeds the k-th best exactly when, for every dispatcher the search tries, the
        :func:`_schedule_floor` with that dispatcher's EP term does (each bounds the variants of its dispatcher; the
        dispatch/combine time does not depend on recompute, so the dispatchers are priced without). The base job's
        own dispatcher comes first (already priced); the others are priced one by one until one is within the
        bound (then no variant is skipped, and that value is returned)."""
        kth = self.kth_best()
        if rec and _recomputes_dispatch(rec):
            # the recompute wall depends on the dispatcher: each dispatcher's own job bounds its variants
            least = float("inf")
            for d in _dispatcher_variants(self.req, lp):
                b = self.time_of(lp, self.features(mode, lp, {**rec, **d}))
                bound = _schedule_floor(b, [b])
                if bound <= kth:
                    return bound
                least = min(least, bound)
            return least
        base = self.time_of(lp, self.features(mode, lp, rec or {}))
        own = _schedule_floor(base, [base])
        if own <= kth:
            return own
        least = float("inf")
        for d in _dispatcher_variants(self.req, lp):
            bound = _schedule_floor(base, [self.a2a_of(lp, self.features(mode, lp, d))])
            if bound <= kth:
                return bound
            least = min(least, bound)
        return least

    def option_floor(self, lp: LayoutPoint, mode: tuple[str, bool], rec: dict) -> float:
        """:func:`_walls_floor` bound on every variant of recompute option ``rec``: that of the option's base job, or,
        where the recompute re-runs the EP dispatch and combine (:func:`_recomputes_dispatch`: its recompute wall then
        depends on the dispatcher), the least of those of the base job with each dispatcher searched (each bounds the
        variants of its dispatcher: EP overlap, delayed wgrad and CUDA graphs leave :data:`VARIANT_INVARIANT_WALLS`
        unchanged). For comparison with the k-th best, as :meth:`ep_floor`: the dispatchers are priced one by one
        (in the request's order; alltoall, the base job's, first by default) until one is within the bound, and that
        value is returned (then no variant is skipped)."""
        if not _recomputes_dispatch(rec):
            return _walls_floor(self.time_of(lp, self.features(mode, lp, rec)).walls)
        kth = self.kth_best()
        least = float("inf")
        for d in _dispatcher_variants(self.req, lp):
            bound = _walls_floor(self.time_of(lp, self.features(mode, lp, {**rec, **d})).walls)
            if bound <= kth:
                return bound
            least = min(least, bound)
        return least

    def variant_bounds(self, lp: LayoutPoint, mode: tuple[str, bool], rec: dict):
        """A function of (dispatcher update, overlap update) giving a lower bound on the step time of the variants
        of recompute ``rec`` with that dispatcher and EP-overlap setting, any CUDA-graph setting: the
        :func:`_schedule_floor` of a priced job of recompute ``rec`` with that dispatcher's EP dispatch/combine
        seconds (without EP overlap the whole of them, ``ep_overlap=False``). Each bound is computed once per call.

        The priced job: EP overlap, delayed wgrad and CUDA graphs leave a stage's compute, recompute, TP and CP walls
        and its dispatch/combine seconds unchanged, and the dispatcher its compute, TP and CP walls
        (:data:`VARIANT_INVARIANT_WALLS`, :func:`_schedule_floor`); its recompute wall too unless the recompute re-runs
        the dispatch and combine (full recompute, or ``moe`` among the selective modules: :func:`_recomputes_dispatch`).
        So where it does not, the job of ``rec`` with the base features (the option's first variant, priced by
        :meth:`pass_2` or here) bounds every dispatcher, with the dispatcher's seconds of :meth:`a2a_of` (they depend
        on the dispatcher only, :meth:`ep_floor`); where it does, each dispatcher is bounded by its own variant without
        EP overlap or graphs (the first of its variants that :meth:`consider` prices, so that bound costs no estimate
        where it fits)."""
        got: dict[tuple, float] = {}
        own = _recomputes_dispatch(rec)

        def bound(disp: dict, ov: dict) -> float:
            key = (disp["moe_token_dispatcher_type"], disp["moe_flex_dispatcher_backend"],
                   ov["overlap_moe_expert_parallel_comm"])
            b = got.get(key)
            if b is None:
                if own:
                    base = self.time_of(lp, self.features(mode, lp, {**rec, **disp}))
                    b = _schedule_floor(base, [base], ep_overlap=key[2])
                else:
                    b = _schedule_floor(self.time_of(lp, self.features(mode, lp, rec)),
                                        [self.a2a_of(lp, self.features(mode, lp, disp))], ep_overlap=key[2])
                got[key] = b
            return b

        return bound

    def ladder_rest_pruned(self, lp: LayoutPoint, mode: tuple[str, bool], j: int, fitted: set[tuple]) -> bool:
        """Whether no variant the recompute ladder of a layout has still to fit can be recorded under option ``j`` or
        any later one, so that :meth:`pass_2` may end the ladder before option ``j`` (it would record nothing).

        Option ``j`` must recompute no more than any later option (:func:`moetune.plan.ladder.ladder_cores`). A
        variant the ladder may still price has a (dispatcher, CUDA graphs) pair not in ``fitted`` (those fitted under a
        lesser option are not priced again, :meth:`consider`) and one of the options ``j``..end. Its step time is at
        least the :func:`_schedule_floor` of option ``j`` with its dispatcher: that of the job of option ``j`` with the
        dispatcher where the recompute re-runs the EP dispatch and combine (:func:`_recomputes_dispatch`), else that
        of option ``j``'s base job with the dispatcher's dispatch/combine seconds (:meth:`variant_bounds`, same proof),
        without EP overlap where no later option allows it (:func:`_overlap_variants`). Proof: the floor bounds every
        variant of option ``j`` with that dispatcher (:func:`_schedule_floor`), and a later option adds at least the
        same recompute seconds to every stage (:mod:`moetune.plan.ladder`; float sums of the same non-negative terms
        in another order differ by far less than the floor's relative 1e-9). A variant is recorded only when its step
        is below its layout's best so far and at most the k-th best (:meth:`consider`); both only fall as the search
        goes on, so a bound at least the first or above the second rules the variant out for the rest of the ladder.

        Each dispatcher is first bounded without pricing option ``j``: by the same floor of the layout's base job,
        without recompute (priced by :meth:`pass_2`), which is at most option ``j``'s - also in floats, so the answer
        is the same. Its stage floors are compute + 0.0 + TP + CP with the same compute, TP and CP seconds as option
        ``j``'s job (with any dispatcher), whose recompute seconds are >= 0; float addition is monotone, and so is
        :func:`_schedule_floor` in each stage floor (it adds to them, takes their max and multiplies by positive
        constants); its other inputs (the EP overlap partner, the dispatcher's seconds, the PP send/recv, optimizer
        and host seconds, the schedule) do not read the recompute option (tests/test_plan_ladder.py compares each
        bit for bit). Where it rules the dispatcher out, option ``j``'s floor does too.
        """
        req = self.req
        rec = self.rec_opts[j][1]
        overlap = self.rest_overlap(lp, j)
        prev = self.best_by_layout.get(lp.key())
        own = _recomputes_dispatch(rec)
        feats = self.features(mode, lp, rec)
        least = self.time_of(lp, self.features(mode, lp, {}))  # no recompute: priced by :meth:`pass_2`
        for disp in _dispatcher_variants(req, lp):
            if self.rest_graphs(j, disp) <= fitted:
                continue
            a2a = self.a2a_of(lp, self.features(mode, lp, disp))
            # first without pricing option ``j``: the floor of the base job, without recompute, is at most option
            # ``j``'s with this dispatcher, in floats too (see the docstring)
            bound = _schedule_floor(least, [a2a], ep_overlap=overlap)
            if (prev is not None and bound >= prev.step_time_s) or bound > self.kth_best():
                continue
            if own:
                # then without pricing this dispatcher's job: option ``j``'s base job less its own recomputed
                # dispatch/combines, plus this dispatcher's (:func:`_schedule_floor`, ``less``)
                base = self.time_of(lp, feats)
                bound = _schedule_floor(base, [a2a], ep_overlap=overlap, less=base.stage_rec_a2a)
                if (prev is not None and bound >= prev.step_time_s) or bound > self.kth_best():
                    continue
                res = self.time_of(lp, self.features(mode, lp, {**rec, **disp}))
                bound = _schedule_floor(res, [res], ep_overlap=overlap)
            else:
                bound = _schedule_floor(self.time_of(lp, feats), [a2a], ep_overlap=overlap)
            if not ((prev is not None and bound >= prev.step_time_s) or bound > self.kth_best()):
                return False
        return True

    def rest_overlap(self, lp: LayoutPoint, j: int) -> bool:
        """Whether a recompute option ``j``..end of the ladder allows EP overlap on the layout (:func:`_overlap_variants`,
        which reads the request, the option and the layout's ``ep``, ``pp`` and ``vpp`` only: memoised on those)."""
        key = (j, lp.ep, lp.pp, lp.vpp)
        got = self._rest_overlap.get(key)
        if got is None:
            got = self._rest_overlap[key] = any(ov["overlap_moe_expert_parallel_comm"] for _, r in self.rec_opts[j:]
                                                for ov in _overlap_variants(self.req, lp, r))
        return got

    def rest_graphs(self, j: int, disp: dict) -> frozenset:
        """The (dispatcher, CUDA graphs) keys of the variants :meth:`consider` prices with dispatcher variant ``disp``
        under the recompute options ``j``..end of the ladder (:meth:`graph_variants`, which reads the request, the
        option and the dispatcher only): the keys :meth:`ladder_rest_pruned` looks up in ``fitted``."""
        dk = (disp["moe_token_dispatcher_type"], disp["moe_flex_dispatcher_backend"])
        got = self._rest_graphs.get((j, dk))
        if got is None:
            got = self._rest_graphs[(j, dk)] = frozenset(
                (*dk, g["cuda_graph_impl"], g["cuda_graph_scope"]) for _, r in self.rec_opts[j:]
                for g in self.graph_variants(r, disp))
        return got

    def note_miss(self, over: float, lp: LayoutPoint, mode: tuple[str, bool]) -> None:
        """A layout whose most memory-saving recompute does not fit (by ``over`` GiB): one of the closest misses
        (its job is built for the five kept, in :meth:`result`) and, where allowed, a layout to offload."""
        heapq.heappush(self.closest, (-over, next(self._tie), lp, mode))
        if len(self.closest) > 5:
            heapq.heappop(self.closest)
        if self.req.allow_offload:
            self.offload_queue.append((over, lp, mode))

    # ----------------------------------------------------------------------------------------------------------
    # memoised builders and estimates (one search's lifetime)

    def base_features(self, mode: tuple[str, bool], lp: LayoutPoint) -> Features:
        key = (mode, lp.tp > 1)
        got = self._base_cache.get(key)
        if got is None:
            got = self._base_cache[key] = _base_features(self.req.model, mode[0], lp, fsdp=mode[1],
                                                         start=self.starts[mode[0]].features, fix=self.req.fix)
        return got

    def features(self, mode: tuple[str, bool], lp: LayoutPoint, update: dict) -> Features:
        """``base_features(mode, lp).model_copy(update=update)``, one instance per distinct value."""
        key = (mode, lp.tp > 1, tuple(update.items()))
        got = self._feat_cache.get(key)
        if got is None:
            got = self.base_features(mode, lp).model_copy(update=update)
            got = self._feat_cache[key] = self._canon.setdefault(got, got)
        return got

    def graph_variants(self, recompute: dict, disp: dict) -> list[dict]:
        """:func:`_graph_variants` of the request, one list per distinct (recompute, dispatcher) updates (read only)."""
        key = (tuple(recompute.items()), tuple(disp.items()))
        got = self._graphs.get(key)
        if got is None:
            got = self._graphs[key] = _graph_variants(self.req, recompute, disp)
        return got

    def layout_of(self, lp: LayoutPoint, built: Layout | None = None) -> Layout:
        """``_layout(lp)``, one instance per layout point but its microbatch size (a Layout has none: the points of
        one mesh and split share the object, built, validated and hashed once); ``built``: that layout, already built
        (:func:`moetune.plan.space.enumerate_meshes`), kept when the point has none yet."""
        lk = (lp.tp, lp.cp, lp.pp, lp.vpp, lp.ep, lp.etp, lp.pipeline_layout)
        lay = self._layout_cache.get(lk)
        if lay is None:
            lay = self._layout_cache[lk] = _layout(lp) if built is None else built
        return lay

    def job_of(self, lp: LayoutPoint, feats: Features) -> Job:
        lk = lp.key()
        got = self._job_cache.get((lk, id(feats)))
        if got is not None and got.features is feats:
            return got
        lay = self.layout_of(lp)
        req = self.req
        # trusted (= model_construct): every field is an already validated spec (the request's, the layout's, the
        # variant's) or a request integer checked when the request was built; Job has no validator beyond those
        # field constraints, so validation would rebuild the same object (same fields, same fields_set)
        got = self._job_cache[(lk, id(feats))] = Job.trusted(
            model=req.model, system=req.system, gpus=req.gpus, global_batch_size=req.global_batch_size,
            micro_batch_size=lp.mbs, seq_length=req.seq_length, layout=lay, features=feats)
        return got

    def time_of(self, lp: LayoutPoint, feats: Features, job: Job | None = None) -> dict:
        """step.estimate_walls of the job (step seconds and walls), memoised per (layout, Features instance)."""
        key = (lp.key(), id(feats))
        got = self._time_cache.get(key)
        if got is None:
            got = self._time_cache[key] = estimate_walls(job or self.job_of(lp, feats), self.eff)
        return got

    def a2a_of(self, lp: LayoutPoint, feats: Features) -> Any:
        """The per-stage EP dispatch/combine seconds of the job (``stage_a2a`` of :meth:`time_of`, read from it when
        priced already, else :func:`moetune.perfmodel.step.stage_a2a_seconds`: the same values without the rest of
        the step model)."""
        key = (lp.key(), id(feats))
        got = self._time_cache.get(key)
        if got is None:
            got = self._a2a_cache.get(key)
            if got is None:
                got = self._a2a_cache[key] = _StageA2A(*stage_a2a_and_sm(self.job_of(lp, feats), self.eff))
        return got

    def mem_key(self, lp: LayoutPoint, feats: Features) -> tuple:
        """Variants that differ only in time-only features (memory.TIME_ONLY_FEATURES) share a memory estimate."""
        norm = self._mem_feats.get(id(feats))
        if norm is None:
            norm = feats.model_copy(update=self._time_only)
            norm = self._mem_feats[id(feats)] = self._canon.setdefault(norm, norm)
        return lp.key(), id(norm)

    def memory_of(self, lp: LayoutPoint, feats: Features) -> list:
        """(device, peak allocated) GiB of every rank: what the overflow of a miss reads (memory.device_peaks)."""
        key = self.mem_key(lp, feats)
        got = self._mem_cache.get(key)
        if got is None:
            got = self._mem_cache[key] = list(device_peaks(self.job_of(lp, feats)))
        return got

    def fits(self, lp: LayoutPoint, feats: Features) -> bool:
        """``_fits_peaks(memory_of(lp, feats))[0]``, exactly: the most-loaded rank fits iff every rank fits (x + h - c
        is monotone in x, also in floating point), so the ranks are priced one by one and the test stops at the first
        that overflows (the one that overflowed last for this layout is tried first).

        A rank's device GiB is its reserved GiB plus the job's non-PyTorch GiB (:func:`moetune.perfmodel.memory.
        device_peaks` adds :func:`~moetune.perfmodel.memory.non_torch_gib`, one float addition), and the reserved
        GiB are the same for the dispatcher variants of a job (:data:`~moetune.perfmodel.memory.DISPATCHER_FEATURES`,
        :func:`~moetune.perfmodel.memory.reserved_features`): a rank's reserved GiB is priced once for all of them
        (:func:`~moetune.perfmodel.memory.reserved_peaks`), each variant adds its own non-PyTorch GiB (both read
        with one lookup of the job's static part: :func:`~moetune.perfmodel.memory.fit_peaks`)."""
        key = self.mem_key(lp, feats)
        got = self._fit_cache.get(key)
        if got is None:
            job = self.job_of(lp, feats)
            lk = lp.key()
            first = self._overflow_rank.get(lk, 0)
            order = [first, *range(first), *range(first + 1, lp.pp)]
            known = self._reserved.setdefault((lk, reserved_features(self._mem_feats[id(feats)])), {})
            missing = [i for i in order if i not in known]
            non_torch, fresh = fit_peaks(job, missing)
            ok = True
            for i in order:
                if i in known:
                    reserved = known[i]
                else:
                    reserved = known[i] = next(fresh)[0]
                if not fits_capacity(reserved + non_torch, self.capacity, self.headroom):
                    self._overflow_rank[lk] = i
                    ok = False
                    break
            got = self._fit_cache[key] = (ok, job)
        return got[0]

    def tested_jobs(self) -> list[Job]:
        """Every configuration whose memory fit this search has tested (each once)."""
        return [job for _, job in self._fit_cache.values()]

    def full_memory_of(self, lp: LayoutPoint, feats: Features) -> Any:
        """The itemised estimate of the job :meth:`fits` tested, built for reported candidates only."""
        key = self.mem_key(lp, feats)
        got = self._full_mem.get(key)
        if got is None:
            self.fits(lp, feats)
            got = self._full_mem[key] = estimate_memory(self._fit_cache[key][1])
        return got


def plan_starts(req: PlanRequest) -> dict[str, Any]:
    """Per searched precision, the starting features (:func:`moetune.io.load.starting_features`)."""
    from moetune.io.load import starting_features

    starts = {p: starting_features(req.model, req.system, req.gpus, p, req.recipe) for p in req.precisions}
    if req.task:
        from dataclasses import replace

        starts = {p: replace(st, features=st.features.model_copy(update=dict(req.task))) for p, st in starts.items()}
    return starts


def _workers(req: PlanRequest) -> int:
    """Processes for this request: 1 inside a partition, for small requests (< 64 GPUs: the search takes well under
    a second) or where ``fork`` is unavailable; else ``req.workers`` or min(2, CPUs)."""
    if req.partition != (0, 1) or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    if req.workers is not None:
        return max(1, req.workers)
    return min(2, os.cpu_count() or 1) if req.gpus >= 64 else 1


def _plan_part(req: PlanRequest, i: int, n: int, shared: SharedBound, schedule_bound: bool,
               starts: dict[str, Any] | None) -> PlanResult:
    return Search(replace(req, partition=(i, n), allow_offload=False), shared, schedule_bound, starts).run()


def _share_child(conn, req: PlanRequest, i: int, n: int, shared: SharedBound, schedule_bound: bool,
                 starts: dict[str, Any] | None) -> None:
    """Body of a forked share: send (True, result) or (False, exception) back to the parent."""
    try:
        conn.send((True, _plan_part(req, i, n, shared, schedule_bound, starts)))
    except BaseException as exc:  # noqa: BLE001 - re-raised in the parent
        conn.send((False, exc))
    finally:
        conn.close()


def _plan_parallel(req: PlanRequest, n: int, schedule_bound: bool = True,
                   starts: dict[str, Any] | None = None) -> PlanResult:
    """The same search over ``n`` shares of the enumerated layouts (interleaved (TP, CP, EP, ETP) groups, so that
    each process builds the per-layer work and model-state floors of its own groups only), merged.

    Exact: each share's search returns every layout of its share that can be in the global top-K (same proofs as
    :class:`Search`, with the bound tightened to the k-th best of the layouts every share has recorded so far,
    :class:`SharedBound`, handed to every share), and the top-K of a union is the top-K of the shares' top-Ks. ``per_layout_best`` is the
    union of the shares' (each layout is in one share) and, like the work counters, depends on how fast the shares
    tightened the bound; the candidates do not. The closest misses are merged; offloading is tried - by the
    sequential search - only when no share has a candidate, as in :class:`Search`.
    """
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    shared = SharedBound(ctx.Value("d", float("inf")), ctx.Array("d", [float("inf")] * max(req.top, 1), lock=False))
    children = []
    try:
        for i in range(1, n):  # shares 1..n-1 in forked children; share 0 here, with this process's caches
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_share_child, args=(send, req, i, n, shared, schedule_bound, starts),
                               daemon=True)
            proc.start()
            send.close()
            children.append((proc, recv))
        parts = [_plan_part(req, 0, n, shared, schedule_bound, starts)]
        for proc, recv in children:
            ok, payload = recv.recv()
            proc.join()
            if not ok:
                raise payload
            parts.append(payload)
    finally:
        for proc, _ in children:
            if proc.is_alive():
                proc.terminate()
    cands = sorted((c for p in parts for c in p.candidates), key=Candidate.sort_key)
    if not cands and req.allow_offload:
        return Search(replace(req, workers=1), schedule_bound=schedule_bound, starts=starts).run()
    closest = sorted((m for p in parts for m in p.closest), key=lambda m: m[0])[:5]
    per_layout: dict[tuple, float] = {}
    for p in parts:
        per_layout.update(p.per_layout_best)
    notes = list(dict.fromkeys(x for p in parts for x in p.notes))
    rules: dict[str, int] = {}
    for p in parts:
        for r, n_r in p.rejected_rules.items():
            rules[r] = rules.get(r, 0) + n_r
    return PlanResult(req, cands[: max(req.top, 1)], sum(p.searched for p in parts), sum(p.feasible for p in parts),
                      time.perf_counter() - t0, sum(p.layouts for p in parts), sum(p.pruned_memory for p in parts),
                      sum(p.pruned_bound for p in parts), sum(p.rejected_by_check for p in parts), closest, notes,
                      per_layout, rules, parts[0].starts)


#: walls that no enumerated feature variant (dispatcher, EP overlap, delayed wgrad, CUDA graphs, more recompute)
#: can shorten: GEMM/attention compute (a flex dispatcher only takes SMs away), recompute (the ladder only adds; for
#: one dispatcher where the recompute re-runs the dispatch and combine, :func:`_recomputes_dispatch`),
#: TP/SP and CP collectives (TP overlap is not a variant), PP send/recv (activation bytes), the optimizer step.
#: EP comm, host, the bubble (it scales with stage time) and DP exposure (it shrinks as compute grows) are excluded.
VARIANT_INVARIANT_WALLS = ("compute", "recompute", "comm_tp", "comm_cp", "comm_pp", "optimizer")


def variant_floor(t) -> float:
    """Lower bound on the step time of every feature variant of a layout, from its base estimate ``t``: the walls
    add up to the step and are non-negative (perfmodel.step), and the :data:`VARIANT_INVARIANT_WALLS` cannot
    shrink under any variant the search enumerates."""
    return _walls_floor({w: t.walls[w].seconds for w in VARIANT_INVARIANT_WALLS})


def _schedule_floor(res: StepWalls, by_dispatcher: list[Any] | None = None, ep_overlap: bool = True,
                    less: list[float] | None = None, more: list[float] | None = None) -> float:
    """Lower bound on the step time of every feature variant of a layout (any dispatcher, EP overlap, delayed wgrad,
    CUDA graphs, recompute), from the :func:`moetune.perfmodel.step.evaluate` result ``res`` of its base job and,
    optionally, those of the base job with each dispatcher the search tries (``by_dispatcher``: anything with their
    ``stage_a2a``, such as :func:`moetune.perfmodel.step.stage_a2a_seconds`); at least :func:`variant_floor`.

    Proof: a stage's compute, TP and CP walls do not change under these variants and recompute only adds
    (:data:`VARIANT_INVARIANT_WALLS`), so every stage's per-microbatch time is at least its ``stage_floor`` plus its
    exposed EP time (host time is >= 0). The exposed EP time of a stage (:func:`moetune.perfmodel.schedule.ep_exposed`
    plus the flex dispatcher's SM share, >= 0) is at least its dispatch/combine time ``stage_a2a`` = A less
    H + ``sm_contention``(H, s), H = ep_overlap_eff x min(A, P) x (1 - 1/m), P the most compute the overlap can hide
    it behind (``stage_partner``: the stage's compute plus a third of its expert GEMMs, the partner with delayed
    wgrad) and s the dispatcher's SM share (``sm_frac``): ``ep_exposed`` hides ep_overlap_eff x min(A, partner) x
    (1 - 1/m) = h <= H, and the exposed time A - h + sm_contention(h, s) falls as h grows where sm_contention(1, s)
    <= 1 (else it is at least A, the term taken then; with ep_overlap_eff outside [0, 1] the term is 0). A and s depend
    only on the dispatcher (bytes and rates; not on overlap, graphs or recompute) and P on none of these variants
    (compute and expert GEMMs are variant-invariant, :data:`VARIANT_INVARIANT_WALLS`): the least term over the
    dispatchers bounds every variant (without ``by_dispatcher`` the EP term is 0). The slowest
    stage's time S_max is then at least the maximum over stages of these sums. The step is the steady state plus the
    bubble of :func:`moetune.perfmodel.schedule.pipeline_step` (non-decreasing in S_max) plus PP send/recv, the
    optimizer step and the once-per-step host time (``step_host``: the optimizer's launches against its GPU time, on
    the rank with the most parameter tensors; all variant-invariant) plus the DP exposure (>= 0). A relative 1e-9 is
    taken off for rounding.

    ``ep_overlap=False`` bounds only the variants without EP overlap (:meth:`Search.consider` bounds each variant by
    its own): without it a stage's exposed EP time is its whole ``stage_a2a`` (:func:`moetune.perfmodel.schedule.
    ep_exposed` returns the dispatch/combine time unchanged, and the flex dispatcher's SM share is charged only
    under overlap, :func:`moetune.perfmodel.step.evaluate`), so the factor is 1 instead of (1 - ep_overlap_eff).

    ``less`` (per stage, >= 0) is taken off each stage's floor first: with ``res.stage_rec_a2a`` (the recomputed
    dispatch/combines of ``res``'s dispatcher) the floor bounds the variants of ``res``'s recompute option with any
    dispatcher - theirs are >= 0, and the rest of the stage floor does not depend on the dispatcher. Taking off a
    part of a float sum leaves an error of the order of the sum's last bit, far below the relative 1e-9.

    ``more`` (per stage, >= 0) is added to each stage's floor: seconds that every variant bounded adds to the stage's
    per-microbatch time besides the floor and the EP time, such as the exposed host copies of layer-level CPU
    offloading (``res.stage_offload``, a term of the per-microbatch time in :func:`moetune.perfmodel.step.evaluate`).
    """
    m, pp, vpp = res.schedule
    per_stage = res.stage_floor if less is None else [x - y for x, y in zip(res.stage_floor, less, strict=True)]
    if more is not None:
        per_stage = [x + y for x, y in zip(per_stage, more, strict=True)]
    if by_dispatcher:
        eff = res.ep_overlap_eff if ep_overlap else 0.0
        if 0.0 <= eff <= 1.0:
            late = 1 - 1 / max(m, 1)
            partner = res.stage_partner
            if len(by_dispatcher) == 1:  # the min of one term is the term
                a2a, sm = by_dispatcher[0].stage_a2a, by_dispatcher[0].sm_frac if ep_overlap else 0.0
                per_stage = [x + ep_term(a, eff * min(a, q) * late, sm)
                             for x, a, q in zip(per_stage, a2a, partner, strict=True)]
            else:
                per_stage = [x + min(ep_term(d.stage_a2a[p], eff * min(d.stage_a2a[p], partner[p]) * late,
                                              d.sm_frac if ep_overlap else 0.0) for d in by_dispatcher)
                             for p, x in enumerate(per_stage)]
    steady, bubble = pipeline_step([max(per_stage)], m, pp, vpp)
    return (steady + bubble + res.walls["comm_pp"] + res.walls["optimizer"] + res.step_host) * (1.0 - 1e-9)


def _recomputes_dispatch(rec: dict) -> bool:
    """Whether recompute option ``rec`` (a :func:`_recompute_options` update) re-runs the EP dispatch and combine,
    so that its recompute wall depends on the dispatcher: full recompute of a MoE layer re-runs them
    (:func:`moetune.perfmodel.step._price_layer`: ``2 x`` one dispatch/combine per recomputed fraction), and so does
    selective ``moe`` recompute (``recompute_a2a`` of :func:`moetune.perfmodel.step.recompute_selection`)."""
    return rec.get("recompute_granularity") == "full" or "moe" in (rec.get("recompute_modules") or ())


def _walls_floor(walls: dict[str, float]) -> float:
    """:func:`variant_floor` from the wall seconds alone (:func:`moetune.perfmodel.step.estimate_walls`)."""
    return float(sum(walls[w] for w in VARIANT_INVARIANT_WALLS))

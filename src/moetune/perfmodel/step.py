"""Step time, throughput and the walls: ``estimate_time(job) -> TimeEstimate``.

Two phases keep the planner fast:

1. :func:`build_profile` turns a :class:`~moetune.spec.job.Job` into per-stage *work* (GEMM shapes and FLOPs,
   attention FLOPs, memory-bound bytes, collective bytes, kernel launches) — no efficiency parameters involved.
   Per-layer work is cached per (model, layer kind, the job fields it reads: :func:`_layer_work`).
2. :func:`evaluate` prices the work with an :class:`~moetune.perfmodel.calibration.Efficiency` set (plain floats,
   numpy's numbers: :func:`_price`), applies the schedule (:mod:`moetune.perfmodel.schedule`) and returns seconds
   per wall.

Per-microbatch stage time S = compute (fwd + 2× fwd for backward) + recompute + exposed TP/CP/EP communication +
exposed host time; step = (m + (p−1)/v)·S_max + exposed PP + exposed DP + optimizer step.
Model TFLOP/s/GPU uses the Megatron-Bridge FLOPs definition (:func:`moetune.perfmodel.flops.flops_per_token`,
docs/bridge_perf_notes.md §1): ``tokens/s/GPU × FLOPs/token``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import NamedTuple

import numpy as np
from pydantic import BaseModel, Field

from moetune.errors import LayoutError
from moetune.memo import FrozenMap, HashedTuple, memo
from moetune.perfmodel import comm as C
from moetune.perfmodel import compute as K
from moetune.perfmodel import flops as F
from moetune.perfmodel import host as H
from moetune.perfmodel import schedule as S
from moetune.perfmodel.calibration import Efficiency, default_efficiency, load_efficiency
from moetune.perfmodel.memory import (
    cpu_offloaded_layer_bytes,
    fine_grained_offloaded_bytes,
    grad_buffer_bytes,
    lora_rank_params,
    task_assumptions,
)
from moetune.perfmodel.params import layer_params, lora_adapters
from moetune.perfmodel.routing import expert_load, static_expert_shapes
from moetune.perfmodel.uncertainty import Band, band_for
from moetune.spec.features import FP8_PRECISIONS, Features
from moetune.spec.job import Job
from moetune.spec.layout import Layout
from moetune.spec.model import ModelArch
from moetune.spec.pipeline import SplitFields, layout_vpp, pipeline_stages, split_fields
from moetune.spec.system import System

WALL_ORDER = ("compute", "recompute", "comm_tp", "comm_cp", "comm_ep", "comm_pp", "comm_dp", "offload",
              "pipeline_bubble", "host", "optimizer")
WALL_LABEL = {
    "compute": "compute", "recompute": "recompute", "comm_tp": "TP/SP comm", "comm_cp": "CP comm",
    "comm_ep": "EP dispatch/combine", "comm_pp": "PP send/recv", "comm_dp": "DP grad/param comm",
    "offload": "activation offload copies", "pipeline_bubble": "pipeline bubble", "host": "host/launch",
    "optimizer": "optimizer step",
}


# ------------------------------------------------------------------------------------------------------------
# result model
# ------------------------------------------------------------------------------------------------------------


class Wall(BaseModel):
    seconds: float
    share: float = Field(description="seconds / step_time_s")


class TimeEstimate(BaseModel):
    """Predicted step time and its itemisation by wall (seconds and shares add up to the step)."""

    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float = Field(description="Megatron-Bridge definition (tokens/s/GPU × FLOPs/token)")
    mfu: dict[str, float] = Field(description="{'vs_bf16_peak': ..., 'vs_precision_peak': ...} (fractions)")
    precision: str = Field(description="canonical precision recipe of the job (whose peak MFU is taken against)")
    walls: dict[str, Wall]
    dominant_wall: str
    flops_per_token: float
    num_microbatches: int
    bottleneck_stage: int
    stage_seconds: list[float] = Field(description="per-microbatch time of each PP rank")
    compute_detail: dict[str, float] = Field(description="seconds per step on the bottleneck stage by kernel kind")
    assumptions: list[str]
    efficiency_source: str
    band: Band | None = Field(default=None, description="prediction interval of step_time_s from the cross-validated "
                                                        "residuals of its class of system and model")


# ------------------------------------------------------------------------------------------------------------
# profile (work, no efficiency)
# ------------------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class LayerWork:
    """Compute work of one decoder layer kind (fwd, one microbatch, one GPU, :func:`_layer_work`) and the counts of
    its launches that the work decides. Compares by identity: a memo key of its price (:func:`_price_work`), shared
    read only by every :class:`LayerType` whose work inputs are equal (feature variants that change only the
    collectives or the launches, e.g. CUDA-graph scopes or the dispatcher, price one work once)."""

    work: K.Work
    n_quant: int  #: quantised GEMM inputs (FP8 / FP4 cast kernels of the launches)
    n_lora: int  #: LoRA adapters of the layer
    n_lora_attn: int  #: of them, on the attention linears
    #: forward bytes one rank sends in the Mamba CP all-to-alls
    #: (:func:`moetune.perfmodel.comm.mamba_cp_bytes_per_layer`)
    cp_a2a_bytes: float = 0.0


@dataclass(eq=False)
class LayerType:
    """Work of one decoder layer kind (fwd, one microbatch, one GPU). Compares by identity: a memo key of its
    prices (:func:`_price_layer`), shared read only."""

    key: tuple
    work: LayerWork  #: the compute work (shared by the layer types of equal work inputs)
    tp_bytes: float  # sum of full-tensor sizes of the forward AG/RS collectives
    cp_bytes: float
    a2a_intra: float  # per A2A (dispatch or combine), bytes sent by one rank
    a2a_inter: float
    is_moe: bool
    launches: H.LayerLaunches
    #: forward bytes one rank sends in the Mamba CP all-to-alls (:func:`moetune.perfmodel.comm.mamba_cp_bytes_per_layer`;
    #: exposed, unlike attention's p2p ring)
    cp_a2a_bytes: float = 0.0


@dataclass(eq=False)
class StageWork:
    layer_counts: dict[tuple, float] = field(default_factory=dict)
    extra: ExtraWork | None = None  # embedding / logits / loss work
    extra_kernels: float = 0.0
    dense_params: float = 0.0  # local (per GPU) params, dense mesh
    expert_params: float = 0.0  # local expert params
    layers: int = 0


@dataclass
class Profile:
    job: Job
    types: dict[tuple, LayerType]
    stages: list[StageWork]
    m: int
    pp: int
    vpp: int
    flops_per_token: float
    recompute_frac: dict[int, float]  # tag -> fraction of its forward recomputed (selective)
    recompute_a2a: float  # A2As recomputed per MoE layer (moe recompute)
    full_recompute_frac: float
    assumptions: list[str]
    pp_bytes: float
    pp_cross: bool
    quant_bytes: float
    pcls: str
    #: bytes per microbatch of each layer that layer-level CPU offloading copies to the host and back
    #: (:func:`moetune.perfmodel.memory.cpu_offloaded_layer_bytes`); empty without it
    offload_bytes: tuple[float, ...] = ()
    #: bytes per microbatch of each decoder-layer kind (mixer, mlp) that fine-grained activation offloading copies to
    #: the host and back (:func:`moetune.perfmodel.memory.fine_grained_offloaded_bytes`)
    fg_offload: dict[tuple[str, str], float] = field(default_factory=dict)


@memo(maxsize=65536)
def _layer_flops(model: ModelArch, i: int, seq: int) -> dict[str, float]:
    """:func:`moetune.perfmodel.flops.layer_flops` (Bridge definition), memoised; read only."""
    return dict(F.layer_flops(model, i, seq))


@memo(maxsize=4096)
def _total_flops(model: ModelArch, seq: int, tp: int) -> float:
    """Model FLOPs per token (:func:`moetune.perfmodel.flops.flops_per_token`, Bridge definition), memoised."""
    return float(F.flops_per_token(model, seq, tp).total)


@memo(maxsize=1024)
def _task_flops(model: ModelArch, seq: int, tp: int, task: str) -> float:
    """Model FLOPs per token of a training task (:func:`moetune.perfmodel.flops.task_flops_per_token`), memoised."""
    return float(F.task_flops_per_token(model, seq, tp, task))


class Kind(Enum):
    """Work kinds of a decoder layer in this module: each names how its FLOPs are priced (GEMM shape, attention
    kernel) and the recompute / TP-sharding class they belong to."""

    CORE_ATTN = "core_attn"
    ATTN_PROJ = "attn_proj"
    MLP = "mlp"
    MIXER = "mixer"
    EXPERTS = "experts"
    SHARED = "shared"
    ROUTER = "router"
    OTHER = "other"


#: component keys of :func:`moetune.perfmodel.flops.layer_flops` (``_sublayer_flops``) -> work kind; a key that is
#: missing here is an error (a new FLOPs component must say how it is priced)
COMPONENT_KIND: dict[str, Kind] = {
    "attention_proj": Kind.ATTN_PROJ,
    "core_attention": Kind.CORE_ATTN,
    "mixer": Kind.MIXER,  # Mamba / GDN projections (GEMMs)
    "mixer_core": Kind.CORE_ATTN,  # the SSM scan / delta-rule core: priced like core attention (not a GEMM)
    "dense_mlp": Kind.MLP,
    "routed_experts": Kind.EXPERTS,
    "moe_latent_proj": Kind.ATTN_PROJ,  # latent MoE down/up projections: TP-sharded GEMMs of the hidden width
    "shared_experts": Kind.SHARED,
    "mtp_proj": Kind.ATTN_PROJ,
    "router": Kind.ROUTER,
}


def _classify(name: str) -> Kind:
    """Work kind of a component key of ``layer_flops`` (:data:`COMPONENT_KIND`)."""
    try:
        return COMPONENT_KIND[name]
    except KeyError:
        raise KeyError(f"layer_flops component {name!r} has no work kind in perfmodel.step.COMPONENT_KIND") from None


@memo(maxsize=4096)
def _mla_up_fraction(model: ModelArch) -> float:
    """Share of MLA projection FLOPs in the up-projections (shape split for ``mla_up_proj`` recompute), memoised
    (every new attention layer work reads it)."""
    if not model.multi_latent_attention:
        return 0.0
    h, n = model.hidden_size, model.num_attention_heads
    d_qk = (model.qk_head_dim or 0) + (model.qk_pos_emb_head_dim or 0)
    r_q, r_kv, d_v = model.q_lora_rank, model.kv_lora_rank or 0, model.v_head_dim or 0
    q_down = h * r_q if r_q else 0
    q_up = r_q * n * d_qk if r_q else h * n * d_qk
    kv_down = h * (r_kv + (model.qk_pos_emb_head_dim or 0))
    kv_up = r_kv * n * ((model.qk_head_dim or 0) + d_v)
    o = n * d_v * h
    tot = q_down + q_up + kv_down + kv_up + o
    return (q_up + kv_up) / tot if tot else 0.0


class LayerInputs(NamedTuple):
    """Everything of a job besides the model that :func:`_layer_type` reads: the batch shape, the mesh, the NVLink
    domain and the Features fields that change a layer's work (names as in :class:`~moetune.spec.features.Features`).

    :func:`_layer_type` takes this projection instead of the job, so its memo key is exactly what it can read. A
    NamedTuple: built per job and hashed / compared on every lookup, in C."""

    seq_length: int
    micro_batch_size: int
    tp: int
    cp: int
    ep: int
    etp: int
    nvlink_domain: int
    precision: str
    moe_token_dispatcher_type: str
    moe_flex_dispatcher_backend: str | None
    sequence_parallel: bool
    cp_comm_type: str
    cuda_graph_impl: str
    cuda_graph_scope: tuple[str, ...]
    moe_expert_capacity_factor: float | None
    tp_comm_overlap: bool
    attention_backend: str
    moe_grouped_gemm: bool
    moe_permute_fusion: bool
    apply_rope_fusion: bool
    expert_load: float  #: :func:`moetune.perfmodel.routing.expert_load` of the features
    static_expert_shapes: bool  #: :func:`moetune.perfmodel.routing.static_expert_shapes` (no per-layer host sync)
    ep_overlap: bool  #: ``overlap_moe_expert_parallel_comm`` with EP > 1: the combined 1F1B schedule's nodes (host)
    shared_expert_overlap: bool  #: ``moe_shared_expert_overlap``: the shared expert's TP collectives beside the dispatch
    lora_targets: tuple[str, ...] = ()  #: ``lora_target_modules`` when the task is LoRA, else ()
    lora_dim: int = 0  #: ``lora_dim`` when the task is LoRA, else 0
    #: the routed experts run TE's CuTeDSL fused grouped MLP in the quantised layers (:func:`fused_grouped_mlp`)
    fused_grouped_mlp: bool = False

    @classmethod
    def of(cls, job: Job) -> LayerInputs:
        lay = job.layout
        return cls.of_fields(job.seq_length, job.micro_batch_size, lay.tp, lay.cp, lay.ep, lay.expert_tp,
                             job.system.nvlink_domain, job.features,
                             fused_grouped_mlp(job.model, job.system.gpu.arch, job.features, lay.expert_tp))

    @classmethod
    def of_fields(cls, seq: int, mbs: int, tp: int, cp: int, ep: int, etp: int, nvlink_domain: int, f: Features,
                  fused_mlp: bool = False) -> LayerInputs:
        """:meth:`of` from the batch shape, the mesh, the NVLink domain and the features of a job (``fused_mlp``:
        :func:`fused_grouped_mlp` of the job). Built with ``tuple.__new__`` from every field in order (what the
        NamedTuple's generated ``__new__`` does after binding 28 arguments, at a quarter of its cost)."""
        return tuple.__new__(cls, (
            seq, mbs, tp, cp, ep, etp, nvlink_domain, f.precision, f.moe_token_dispatcher_type,
            f.moe_flex_dispatcher_backend, f.sequence_parallel, f.cp_comm_type, f.cuda_graph_impl,
            f.cuda_graph_scope, f.moe_expert_capacity_factor, f.tp_comm_overlap, f.attention_backend,
            f.moe_grouped_gemm, f.moe_permute_fusion, f.apply_rope_fusion, expert_load(f),
            static_expert_shapes(f), bool(f.overlap_moe_expert_parallel_comm and ep > 1),
            f.moe_shared_expert_overlap,
            *((tuple(f.lora_target_modules), f.lora_dim) if f.task == "lora" else ((), 0)), fused_mlp))


def fused_grouped_mlp(model: ModelArch, arch: str, f: Features, etp: int) -> bool:
    """Whether the job's routed experts run TE's CuTeDSL fused grouped MLP (``Features.cutedsl_fused_grouped_mlp``
    where Transformer Engine actually fuses: :func:`moetune.perfmodel.compute.fused_grouped_mlp_runs`)."""
    if not (f.cutedsl_fused_grouped_mlp and model.is_moe):  # not requested: never fused (fused_grouped_mlp_runs)
        return False
    return K.fused_grouped_mlp_runs(
        requested=f.cutedsl_fused_grouped_mlp, arch=arch, precision=f.precision, etp=etp,
        grouped_gemm=f.moe_grouped_gemm, activation=model.activation,
        d_in=int(model.moe_latent_size or model.hidden_size), ffn=int(model.moe_ffn_hidden_size or 0))


@memo(maxsize=4096)
def _first_layer(model: ModelArch, mixer: str, mlp: str) -> int:
    """Index of the first decoder layer of a (mixer, mlp) kind."""
    return next(i for i, kind in enumerate(zip(model.mixer_pattern, model.mlp_pattern, strict=True))
                if kind == (mixer, mlp))


@memo(maxsize=32768)
def _layer_type(model: ModelArch, mixer: str, mlp: str, quant: bool, inp: LayerInputs, kernels: FrozenMap
                ) -> LayerType:
    """Forward work of a decoder layer of kind (mixer, mlp) (one microbatch, one GPU): every layer of a kind has the
    same work (:func:`moetune.perfmodel.flops.layer_flops` depends on the kind only). ``kernels``:
    ``kernels_per_layer`` of the efficiency constants. The compute work: :func:`_layer_work` of the inputs it reads."""
    feat = inp
    s, b = inp.seq_length, inp.micro_batch_size
    tp, cp, ep, etp = inp.tp, inp.cp, inp.ep, inp.etp
    lw = _layer_work(model, mixer, mlp, quant, s, b, tp, cp, ep, etp, K.QUANT_BYTES[feat.precision],
                     feat.tp_comm_overlap and feat.sequence_parallel and tp > 1, inp.expert_load,
                     feat.apply_rope_fusion, feat.cp_comm_type == "p2p", feat.attention_backend == "unfused",
                     inp.lora_targets, inp.lora_dim)
    h = model.hidden_size
    t_a = s * b / cp  # tokens per attention (TP) group on this rank's CP shard
    t_gpu = t_a / tp  # SP-sharded tokens per GPU
    k_top = float(model.moe_router_topk or 1)
    E = float(model.num_moe_experts or 1)
    load = inp.expert_load  # the hottest expert rank computes, receives and returns load x the mean tokens
    hd = model.head_dim
    # communication
    n_tp = C.tp_collectives_per_layer(mixer, mlp, etp, tp, shared=bool(model.moe_shared_expert_intermediate_size)
                                      and not inp.shared_expert_overlap)
    tp_bytes = n_tp * t_a * h * C.BF16
    if not feat.sequence_parallel and tp > 1:
        tp_bytes *= 2  # all-reduce instead of AG/RS
    cp_b = 0.0
    if mixer in ("A", "W") and cp > 1:
        kv_w = 2 * model.query_groups * hd / tp
        if model.multi_latent_attention:
            kv_w = model.num_attention_heads * ((model.qk_head_dim or 0) + (model.qk_pos_emb_head_dim or 0)
                                                + (model.v_head_dim or 0)) / tp
        cp_b = C.cp_bytes_per_layer(t_a, kv_w, cp, feat.cp_comm_type)
    intra = inter = 0.0
    if mlp == "E":
        # latent MoE (Nemotron-3 Super) dispatches the latent projection, not the hidden state
        intra, inter = C.a2a_bytes(t_gpu, float(model.moe_latent_size or h), k_top, ep, etp, inp.nvlink_domain,
                                   feat.moe_token_dispatcher_type, feat.moe_flex_dispatcher_backend)
        intra, inter = intra * load, inter * load
    scopes = frozenset(feat.cuda_graph_scope)
    graphs_on = feat.cuda_graph_impl != "none" and bool(scopes)
    dropless = not feat.static_expert_shapes  # per-layer host sync of the expert token counts (perfmodel.host)
    launches = H.layer_launches(mixer, mlp, mla=model.multi_latent_attention,
                                quant_gemms=lw.n_quant if quant else 0,
                                scopes=scopes, graphs_on=graphs_on, dropless=dropless, ep=ep,
                                kernels=kernels,
                                shared=bool(model.moe_shared_expert_intermediate_size),
                                tp_overlap_tp=tp if (feat.tp_comm_overlap and feat.sequence_parallel) else 1,
                                local_experts=E / max(ep, 1), grouped_gemm=feat.moe_grouped_gemm,
                                permute_fusion=feat.moe_permute_fusion,
                                unfused_attention=feat.attention_backend == "unfused",
                                unfused_rope=not feat.apply_rope_fusion, ep_overlap=inp.ep_overlap,
                                dispatcher=feat.moe_token_dispatcher_type,
                                flex_backend=feat.moe_flex_dispatcher_backend, lora_attn=lw.n_lora_attn,
                                lora_mlp=lw.n_lora - lw.n_lora_attn,
                                fused_grouped_mlp=inp.fused_grouped_mlp and quant)
    return LayerType((mixer, mlp, quant), lw, tp_bytes, cp_b, intra, inter, mlp == "E", launches, lw.cp_a2a_bytes)


@memo(maxsize=32768)
def _layer_work(model: ModelArch, mixer: str, mlp: str, quant: bool, s: int, b: int, tp: int, cp: int, ep: int,
                etp: int, qb: float, chunked: bool, load: float, rope_fusion: bool, cp_p2p: bool, unfused_attn: bool,
                lora_targets: tuple[str, ...], lora_dim: int) -> LayerWork:
    """Compute work of a decoder layer of kind (mixer, mlp) (:func:`_layer_type`), from what it reads of the job:
    the batch shape ``s`` x ``b``, the mesh, ``qb`` (:data:`moetune.perfmodel.compute.QUANT_BYTES` of the precision),
    ``chunked`` (TE userbuffers TP overlap: tp_comm_overlap with SP and TP > 1), ``load``
    (:func:`moetune.perfmodel.routing.expert_load`), ``rope_fusion`` (apply_rope_fusion), ``cp_p2p``
    (cp_comm_type p2p), ``unfused_attn`` (the unfused attention backend) and the LoRA targets and rank (() and 0
    without LoRA)."""
    i = _first_layer(model, mixer, mlp)  # the layer the FLOPs are read from and the work rows are tagged with
    h = model.hidden_size
    t_a = s * b / cp  # tokens per attention (TP) group on this rank's CP shard
    t_gpu = t_a / tp  # SP-sharded tokens per GPU
    comps = _layer_flops(model, i, s)
    wl = K.WorkList()
    k_top = float(model.moe_router_topk or 1)
    E = float(model.num_moe_experts or 1)
    up_frac = _mla_up_fraction(model) if mixer in ("A", "W") else 0.0
    # TE userbuffers TP overlap (ring exchange) runs each TP-sharded GEMM as TP chunks of t_a/TP rows
    m_tp = t_a / tp if chunked else t_a
    # load: the hottest expert rank computes, receives and returns load x the mean tokens
    cast_elems = 0.0
    n_quant = 0
    for name, f in comps.items():
        if f <= 0:
            continue
        kind = _classify(name)
        if kind is Kind.CORE_ATTN:
            wl.attn(t_a * f / tp, layer=i)
        elif kind is Kind.ATTN_PROJ:
            n_eff = f / (2 * h) / tp
            if up_frac > 0:
                wl.gemm(t_a * f / tp * up_frac, m_tp, n_eff, h, quant=quant, tag="mla_up", layer=i)
                wl.gemm(t_a * f / tp * (1 - up_frac), m_tp, n_eff, h, quant=quant, tag="attn_proj", layer=i)
            else:
                wl.gemm(t_a * f / tp, m_tp, n_eff, h, quant=quant, tag="attn_proj", layer=i)
            cast_elems += 2 * h
            n_quant += 2
        elif kind is Kind.MLP:
            wl.gemm(t_a * f / tp, m_tp, f / (2 * h) / tp, h, quant=quant, tag="mlp", layer=i)
            cast_elems += h  # FC2's input is quantised inside the fused activation kernel (TE act + cast)
            n_quant += 2
        elif kind is Kind.MIXER:
            wl.gemm(t_a * f / tp, m_tp, f / (2 * h) / tp, h, quant=quant, tag="mixer", layer=i)
            cast_elems += 2 * h
            n_quant += 2
        elif kind is Kind.EXPERTS:
            m_exp = t_gpu * k_top * ep * etp / E * load
            groups = max(E / ep, 1.0)
            d_in = float(model.moe_latent_size or h)  # latent MoE runs its experts at the latent width
            n_exp = f / (2 * d_in * k_top) / etp
            wl.gemm(t_gpu * f * load, m_exp, n_exp, d_in, groups=groups, quant=quant, tag="experts", layer=i)
            # FC1's input: after the dispatcher's all-gather over the expert-TP group every ETP rank holds ETP x
            # the tokens at the full input width (Megatron-Core ``MoEAlltoAllTokenDispatcher``: gather over tp_ep)
            cast_elems += k_top * d_in * etp
            n_quant += 2
        elif kind is Kind.SHARED:
            wl.gemm(t_a * f / tp, m_tp, f / (2 * h) / tp, h, quant=quant, tag="shared", layer=i)
            cast_elems += h
            n_quant += 2
        elif kind is Kind.ROUTER:
            wl.gemm(t_gpu * f, t_gpu, E, h, quant=False, tag="router", layer=i)
        else:
            wl.gemm(t_a * f / tp, t_a, max(f / (2 * h) / tp, 1.0), h, quant=False, tag="other", layer=i)
    n_lora = n_lora_attn = 0
    if lora_targets:
        _adapter_gemms(wl, model, mixer, mlp, lora_targets, float(lora_dim), t_a, tp, etp, i,
                       t_a * k_top * etp * load / tp)
        adapters = lora_adapters(model, mixer, mlp, lora_targets)
        n_lora = len(adapters)
        n_lora_attn = sum(1 for a in adapters if a.module in ("linear_qkv", "linear_proj"))
    # memory-bound kernels (forward bytes on this GPU)
    hd = model.head_dim
    if mixer != "_":
        wl.mem(t_gpu * (K.norm_bytes(h) + K.residual_bytes(h)), tag="norm", layer=i)
    if mixer in ("A", "W"):
        qk = (model.num_attention_heads + model.query_groups) * hd
        rope = K.rope_bytes if rope_fusion else K.unfused_rope_bytes
        wl.mem(t_a * rope(qk) / tp, tag="attn_proj", layer=i)
        if cp > 1 and cp_p2p:
            v_dim = float(model.v_head_dim or hd) if model.multi_latent_attention else float(hd)
            wl.mem(t_a * K.cp_correction_bytes(cp, model.num_attention_heads / tp * v_dim), tag="core_attn", layer=i)
        if unfused_attn:
            # Megatron's unfused DotProductAttention materialises the scores: causal context ~ core FLOPs / (4·q)
            ctx = comps.get("core_attention", 0.0) / (4.0 * model.num_attention_heads * hd) * 2
            wl.mem(t_a * K.unfused_attention_bytes(model.num_attention_heads / tp, ctx), tag="core_attn", layer=i,
                   stream=True)
    mamba_cp = 0.0
    if mixer == "M":
        heads = float(model.mamba_num_heads or (2 * h) // (model.mamba_head_dim or 64))
        pdim = float(model.mamba_head_dim or 64)
        groups, d_state = float(model.mamba_num_groups or 1), float(model.mamba_state_dim or 128)
        wl.mem(t_a / tp * K.mamba_bytes(heads * pdim, groups, d_state, heads, pdim), tag="mixer", layer=i)
        mamba_cp = C.mamba_cp_bytes_per_layer(t_a, heads * pdim, heads, groups, d_state, tp, cp)
        if cp > 1:  # the layout copies around those all-to-alls
            wl.mem(t_a * K.mamba_cp_copy_bytes(heads * pdim / tp, groups / tp, d_state, heads / tp, cp), tag="mixer",
                   layer=i)
    if mlp != "_":
        wl.mem(t_gpu * (K.norm_bytes(h) + K.residual_bytes(h)), tag="norm", layer=i)
    if mlp == "D":
        wl.mem(t_a * K.glu_bytes(model.ffn_hidden_size, model.gated_linear_unit, model.activation) / tp, tag="mlp_act", layer=i)
    elif mlp == "E":
        wl.mem(t_gpu * K.router_bytes(E, k_top), tag="router", layer=i)
        wl.mem(t_gpu * K.permute_bytes(h, k_top), tag="moe_perm", layer=i)
        # ETP x the tokens at 1/ETP of the FFN width per ETP rank: the same activation elements as ETP = 1
        wl.mem(t_gpu * k_top * K.glu_bytes(model.moe_ffn_hidden_size or 0, model.gated_linear_unit, model.activation),
               tag="moe_act", layer=i)
        if model.moe_shared_expert_intermediate_size:
            wl.mem(t_a * K.glu_bytes(model.moe_shared_expert_intermediate_size, model.gated_linear_unit,
                                    model.activation) / tp,
                   tag="shared", layer=i)
    if quant and cast_elems:
        wl.mem(t_gpu * K.cast_bytes(cast_elems, qb), tag="other", layer=i)
    return LayerWork(wl.rows(), n_quant, n_lora, n_lora_attn, mamba_cp)


#: the base linears whose input dimension is split over TP (row-parallel: ``input_is_parallel`` in Bridge's adapter)
_ROW_PARALLEL = frozenset({"linear_proj", "linear_fc2"})
#: work tag of each adapter's GEMMs (the tag of the linear it wraps: recompute and EP-overlap classes follow it)
_ADAPTER_TAG = {"linear_qkv": "attn_proj", "linear_proj": "attn_proj"}


def _adapter_gemms(wl: K.WorkList, model: ModelArch, mixer: str, mlp: str, targets: tuple[str, ...], r: float,
                   t_a: float, tp: int, etp: int, layer: int, expert_rows: float) -> None:
    """Forward GEMMs of a layer's LoRA adapters (:func:`moetune.perfmodel.params.lora_adapters`), BF16, marked
    ``adapter`` (trainable: they keep wgrad when the base is frozen, :func:`_price`).

    Per adapter two GEMMs over the rows the wrapped linear sees: A (x @ A, d_in -> r) and B (. @ B, r -> d_out), split
    over TP as Bridge's ``ParallelLinearAdapter`` splits them (:class:`moetune.perfmodel.params.LoraAdapter`): for a
    row-parallel base A reads the TP-split input (K = d_in / TP, N = r), for a column-parallel base A reads the whole
    input (K = d_in, N = r / TP); B writes d_out / TP columns. Dense adapters run on the TP group's tokens (t_a);
    the routed experts' shared adapter (``share_expert_adapters``) on every token routed to the rank
    (``expert_rows``), split over ETP. At rank 16-32 each GEMM is bandwidth-bound (a 16-wide N or K): the roofline
    of :func:`moetune.perfmodel.compute.gemm_pass_seconds` prices it by the bytes it moves, i.e. by reading the
    input activation once more (forward), and dX / X again (backward). ``r``: the LoRA rank; ``t_a``: the TP group's
    tokens on this rank's CP shard."""
    for a in lora_adapters(model, mixer, mlp, targets):
        split = float(etp if a.expert else tp)
        rows = expert_rows if a.expert else t_a
        tag = "experts" if a.expert else _ADAPTER_TAG.get(a.module, "shared" if mlp == "E" else "mlp")
        if a.module in _ROW_PARALLEL:
            n_a, k_a = r, a.d_in / split
        else:
            n_a, k_a = r / split, float(a.d_in)
        wl.gemm(2 * rows * n_a * k_a, rows, n_a, k_a, quant=False, tag=tag, layer=layer, adapter=True)
        n_b = a.d_out / split
        wl.gemm(2 * rows * n_b * r, rows, n_b, r, quant=False, tag=tag, layer=layer, adapter=True)


@dataclass(frozen=True, slots=True)
class PipelineSplit:
    """Decoder layers, embedding / loss flags and MTP layers of each PP rank, the VPP size, and the notes on how
    the split was made (when the layout gives no valid one)."""

    layers: tuple[tuple[int, ...], ...]
    embedding: tuple[bool, ...]
    loss: tuple[bool, ...]
    mtp: tuple[int, ...]
    vpp: int
    notes: tuple[str, ...] = ()


def _rest_fwd(model: ModelArch, seq: int, tp: int) -> float:
    """Forward FLOPs per token outside the decoder layers and MTP layers (output layer + loss, MTP projections):
    a third of the model total (fwd + 2x bwd) minus the layers."""
    fwd = _fwd_layer_flops(model, seq)
    return max(_total_flops(model, seq, tp) / 3.0 - sum(fwd) - model.mtp_num_layers * fwd[-1], 0.0)


@memo(maxsize=16384)
def _pipeline_split(model: ModelArch, fields: SplitFields, seq: int, tp: int) -> PipelineSplit:
    """Layers per PP rank (:func:`moetune.spec.pipeline.pipeline_stages` of a layout's split fields). When the layout
    gives no valid split (e.g. 61 layers on PP16 without a layout string, as published rows that rely on a recipe's
    ``pipeline_model_parallel_layout``), layers are spread over the PP·VPP stages by forward FLOPs (which depend on
    the sequence and, through the padded vocabulary, on TP) and a note says so."""
    try:
        ranks = pipeline_stages(model, fields)
    except LayoutError as exc:
        pp = fields.pp
        v = (layout_vpp(fields.pipeline_layout, pp) if fields.vpp is None and fields.pipeline_layout is not None
             else fields.vpp or 1)  # Layout.vpp_size
        n_st = pp * v
        nl = model.num_layers
        n_mtp = model.mtp_num_layers
        # balance forward FLOPs over the stages: decoder layers, MTP layers (copies of the last layer) and the
        # output layer + loss on the last stage, as hand-written Bridge layouts do for such models
        fwd = _fwd_layer_flops(model, seq)
        loss_w = _rest_fwd(model, seq, tp)
        weights = [*fwd, *([fwd[-1]] * n_mtp)]
        grand = sum(weights) + loss_w
        target = grand / n_st
        ids: list[list[int]] = [[] for _ in range(pp)]
        mtp = [0] * pp
        acc = 0.0
        for u, w in enumerate(weights):
            k = min(int((acc + w / 2) / target), n_st - 1)
            acc += w
            if u < nl:
                ids[k % pp].append(u)
            else:
                mtp[k % pp] += 1
        note = f"pipeline split: {str(exc)[:90]} -> layers split over {n_st} stages by forward FLOPs"
        return PipelineSplit(tuple(tuple(x) for x in ids), tuple(p == 0 for p in range(pp)),
                             tuple(p == pp - 1 for p in range(pp)), tuple(mtp), v, (note,))
    v = len(ranks[0].chunks) if ranks else 1
    return PipelineSplit(tuple(r.layers for r in ranks), tuple(r.embedding for r in ranks),
                         tuple(r.loss for r in ranks), tuple(r.mtp_layers for r in ranks), v)


def _param_split(model: ModelArch, i: int) -> tuple[float, float]:
    """(dense-mesh params, expert params) of decoder layer i (moetune.perfmodel.params)."""
    lp = layer_params(model, i)
    expert = float(lp.routed_experts)
    return float(lp.total) - expert, expert


@memo(maxsize=4096)
def _fwd_layer_flops(model: ModelArch, seq: int) -> tuple[float, ...]:
    """Model (Bridge) forward FLOPs per token of each decoder layer; the router GEMM is informational in
    ``layer_flops`` and not part of Bridge's total."""
    return tuple(sum(v for k, v in _layer_flops(model, i, seq).items() if k != "router")
                 for i in range(model.num_layers))


@memo(maxsize=65536)
def _stage_summary(model: ModelArch, ids: tuple[int, ...], n_mtp: int, quant_on: bool, bf16: frozenset[int]
                   ) -> tuple[dict[tuple[int, bool], float], float, float]:
    """Layer kinds of a stage as {(first layer index of the kind, quantised): count} and its (dense, expert) params;
    MTP layers count as copies of the last decoder layer."""
    nl = model.num_layers
    first: dict[tuple, int] = {}
    kinds: dict[tuple[int, bool], float] = {}
    dense = exp = 0.0
    for i in (*ids, *([nl - 1] * n_mtp)):
        quant = quant_on and i not in bf16
        kind = (model.mixer_pattern[i], model.mlp_pattern[i], quant)
        j = first.setdefault(kind, i)
        kinds[(j, quant)] = kinds.get((j, quant), 0.0) + 1.0
        d, e = _param_split(model, i)
        dense += d
        exp += e
    return kinds, dense, exp


@dataclass(eq=False)
class ExtraWork:
    """Embedding / logits / loss work of a PP rank (one object per distinct value: prices of it are memoised on
    the object, which compares by identity)."""

    work: K.Work


@memo(maxsize=8192)
def _extra_work(model: ModelArch, seq: int, mbs: int, cp: int, tp: int, emb: bool, loss: bool) -> ExtraWork:
    """Forward work of the embedding (first stage) and of the output layer + loss (last stage) of one rank."""
    h = model.hidden_size
    t_a = seq * mbs / cp
    n_mtp = model.mtp_num_layers
    vpad = model.padded_vocab_size(tp)
    wl = K.WorkList()
    if emb:
        wl.mem(t_a / tp * h * K.BF16_BYTES * 2, tag="other", layer=-1)
    if loss:
        share = (1 + n_mtp) if n_mtp else 1
        f = _rest_fwd(model, seq, tp)  # logits (+ MTP projections)
        wl.gemm(t_a * f / tp, t_a, max(f / (2 * h) / tp / share, 1.0), h, quant=False, tag="logits", layer=-1)
        # logits written in BF16, fused cross-entropy reads them and writes FP32 grads
        wl.mem(t_a * share * vpad / tp * (2 * K.BF16_BYTES + 4.0), tag="logits", layer=-1)
    return ExtraWork(wl.rows())


@memo(maxsize=16384)
def _stage_works(model: ModelArch, lay: Layout, seq: int, mbs: int, quant_on: bool, bf16_layers: frozenset[int],
                 kernels: FrozenMap) -> tuple[StageWork, ...]:
    """Per-PP-rank work of :func:`build_profile` that no feature changes (layer kinds and counts, embedding / logits /
    loss work, local params).

    The planner prices many feature variants of one layout. The returned StageWork objects are shared and read
    only."""
    split = _pipeline_split(model, split_fields(lay), seq, lay.tp)
    h = model.hidden_size
    tp = lay.tp
    vpad = model.padded_vocab_size(tp)
    stages: list[StageWork] = []
    same: dict[tuple, StageWork] = {}
    ranks, _ = _stage_kinds(model, split.layers, split.mtp, quant_on, bf16_layers)
    ep_etp = lay.ep * lay.expert_tp
    for p, (counts, n_layers, dense_p, exp_p) in enumerate(ranks):
        emb, loss = split.embedding[p], split.loss[p]
        kern = 0.0
        if emb:
            kern += kernels["embedding_loss"] / 2
            dense_p += vpad * h
        if loss:
            kern += kernels["embedding_loss"] / 2
            if model.untie_embeddings_and_output_weights or lay.pp > 1:
                dense_p += vpad * h
        dense, expert = dense_p / tp, exp_p / ep_etp
        # ranks with the same content share one object (evaluate prices each distinct object once), built once
        sig = (tuple(counts.items()), emb, loss, n_layers, kern, dense, expert)
        st = same.get(sig)
        if st is None:
            # one work object per value across layouts (it depends on the batch shape, TP and the edge flags only),
            # so evaluate's price memo (_price_extra, keyed on the object) is shared by every layout
            st = same[sig] = StageWork(dict(counts), _extra_work(model, seq, mbs, lay.cp, tp, emb, loss), kern, dense,
                                       expert, n_layers)
        stages.append(st)
    return tuple(stages)


@memo(maxsize=16384)
def _stage_kinds(model: ModelArch, split: tuple[tuple[int, ...], ...], mtp: tuple[int, ...], quant_on: bool,
                 bf16_layers: frozenset[int]
                 ) -> tuple[list[tuple[dict, int, float, float]], tuple[tuple[int, bool], ...]]:
    """Per PP rank: ({LayerType.key: count}, layers, dense params, expert params) before TP/EP sharding and the edge
    (embedding / output) params, plus the (first layer index, quantised) of each layer kind in first-seen order.
    Depends on the layer split only (not on TP, CP, EP or the batch): shared by every layout with that split."""
    first: dict[tuple, tuple[int, bool]] = {}
    ranks = []
    for p, ids in enumerate(split):
        kinds, dense_p, exp_p = _stage_summary(model, ids, mtp[p], quant_on, bf16_layers)
        counts: dict[tuple, float] = {}
        for (i, quant), n in kinds.items():
            lkey = (model.mixer_pattern[i], model.mlp_pattern[i], quant)  # LayerType.key of _layer_type
            first.setdefault(lkey, (i, quant))
            counts[lkey] = counts.get(lkey, 0.0) + n
        ranks.append((counts, len(ids) + mtp[p], dense_p, exp_p))
    return ranks, tuple(first.values())


@memo(maxsize=16384)
def _layout_work(model: ModelArch, lay: Layout, seq: int, mbs: int, quant_on: bool, bf16_layers: frozenset[int],
                 kernels: FrozenMap) -> tuple[PipelineSplit, float, tuple[StageWork, ...]]:
    """What :func:`build_profile` reads of a layout, in one lookup: its pipeline split (:func:`_pipeline_split`), the
    model FLOPs per token (:func:`_total_flops`) and the stage works (:func:`_stage_works`)."""
    split = _pipeline_split(model, split_fields(lay), seq, lay.tp)
    total = _total_flops(model, seq, lay.tp)
    return split, total, _stage_works(model, lay, seq, mbs, quant_on, bf16_layers, kernels)


@memo(maxsize=4096)
def _model_kinds(model: ModelArch, quant_on: bool, bf16_layers: frozenset[int]) -> tuple[tuple[int, bool], ...]:
    """(first layer index, quantised) of each decoder-layer kind of the model, in layer order (:func:`_stage_kinds`
    of one rank holding every layer). These are the kinds of every pipeline split: a split places each decoder layer
    on one rank, and an MTP layer is a copy of the last decoder layer, of that layer's kind (:func:`_stage_summary`);
    so a profile's layer kinds do not depend on its layout (tests/test_step_fastpath.py)."""
    return _stage_kinds(model, (tuple(range(model.num_layers)),), (0,), quant_on, bf16_layers)[1]


@memo(maxsize=32768)
def _layer_types(model: ModelArch, quant_on: bool, bf16_layers: frozenset[int], feat: Features, seq: int, mbs: int,
                 tp: int, cp: int, ep: int, etp: int, nvlink_domain: int, kernels: FrozenMap, fused_mlp: bool = False
                 ) -> dict[tuple, LayerType]:
    """{LayerType.key: work} of the model's layer kinds (:func:`_model_kinds`; :func:`_layer_type` of the job's
    :class:`LayerInputs`), the same for every layout of a mesh, batch shape and features; read only."""
    inp = LayerInputs.of_fields(seq, mbs, tp, cp, ep, etp, nvlink_domain, feat, fused_mlp)
    types: dict[tuple, LayerType] = {}
    for i, quant in _model_kinds(model, quant_on, bf16_layers):
        lt = _layer_type(model, model.mixer_pattern[i], model.mlp_pattern[i], quant, inp, kernels)
        types[lt.key] = lt
    return types


@memo(maxsize=16384)
def recompute_selection(feat: Features, first_rank_layers: int, v: int
                         ) -> tuple[dict[int, float], float, float, tuple[str, ...]]:
    """(tag -> fraction of its forward recomputed, A2As recomputed per MoE layer, fraction of full recompute, notes)
    of the recompute features; ``first_rank_layers``: decoder layers of PP rank 0, ``v``: VPP. Read only."""
    rf: dict[int, float] = {}
    rec_a2a = 0.0
    full_frac = 0.0
    notes: tuple[str, ...] = ()
    if feat.recompute_granularity == "full":
        n_rec = feat.recompute_num_layers
        per_chunk = max(first_rank_layers / max(v, 1), 1.0)
        if feat.recompute_method == "block" and n_rec is not None:
            full_frac = min(1.0, n_rec / per_chunk)
        else:
            full_frac = 1.0
    elif feat.recompute_granularity == "selective" or feat.recompute_modules:
        mods = feat.recompute_modules or ("core_attn",)
        if not feat.recompute_modules:
            notes = ("recompute_modules unset with selective granularity: MCore default [core_attn]",)
        sel = {
            "core_attn": ("core_attn",), "layernorm": ("norm",), "mlp": ("mlp", "mlp_act"),
            "moe_act": ("moe_act",), "shared_experts": ("shared",), "mla_up_proj": ("mla_up",),
            "moe": ("router", "moe_perm", "experts", "moe_act", "shared"),
        }
        for mname in mods:
            for tag in sel.get(mname, ()):
                rf[K.TAG[tag]] = 1.0
            if mname == "moe":
                rec_a2a = 2.0
    return rf, rec_a2a, full_frac, notes


def quantised_layers(model: ModelArch, feat: Features) -> tuple[bool, frozenset[int]]:
    """(whether the precision quantises the GEMMs, the decoder layers kept in BF16: the first and last with
    ``first_last_layers_bf16``) of :func:`build_profile`."""
    quant_on = feat.precision in FP8_PRECISIONS
    bf16_layers: frozenset[int] = frozenset()
    if quant_on and feat.first_last_layers_bf16:
        bf16_layers = frozenset({0, model.num_layers - 1})
    return quant_on, bf16_layers


class LayerKinds(NamedTuple):
    """The layer kinds of a job and what pricing them reads (:func:`_layer_prices`): the part of a :class:`Profile`
    that does not depend on the pipeline split (beyond the first rank's layers and VPP of a full recompute). Field
    names as in :class:`Profile`."""

    job: Job
    types: dict[tuple, LayerType]
    recompute_frac: dict[int, float]
    recompute_a2a: float
    full_recompute_frac: float
    quant_bytes: float
    pcls: str
    offload_bytes: tuple[float, ...]
    fg_offload: dict[tuple[str, str], float]
    notes: tuple[str, ...]  #: the recompute selection's and the fused grouped MLP's assumptions


def _layer_kinds(job: Job, eff: Efficiency, split: PipelineSplit, quant: tuple[bool, frozenset[int]]) -> LayerKinds:
    """:class:`LayerKinds` of ``job`` with pipeline split ``split`` and :func:`quantised_layers` ``quant``: the layer
    kinds' work (:func:`_layer_types`) and the recompute selection (:func:`recompute_selection`), memoised on what
    they read, and the offloaded bytes."""
    model, lay, feat, sysm = job.model, job.layout, job.features, job.system
    arch, etp = sysm.gpu.arch, lay.expert_tp
    fused_mlp = fused_grouped_mlp(model, arch, feat, etp)
    types = _layer_types(model, *quant, feat, job.seq_length, job.micro_batch_size, lay.tp, lay.cp, lay.ep, etp,
                         sysm.nvlink_domain, eff.kernels, fused_mlp)
    rf, rec_a2a, full_frac, notes = recompute_selection(feat, len(split.layers[0]), split.vpp)
    if feat.cutedsl_fused_grouped_mlp and model.is_moe and not fused_mlp:
        notes = (*notes, "cutedsl_fused_grouped_mlp is set but Transformer Engine does not fuse this job's experts "
                         "(it needs an SM 10.x GPU, MXFP8 or NVFP4, ETP 1, SwiGLU / clamped GLU / squared ReLU and "
                         "sizes that are multiples of 64; rules MOE-091..MOE-095): priced unfused")
    # LayerKinds(job, types, recompute_frac, recompute_a2a, full_recompute_frac, quant_bytes, pcls, offload_bytes,
    # fg_offload, notes), built in C as StepWalls is
    return tuple.__new__(LayerKinds, (job, types, rf, rec_a2a, full_frac, K.QUANT_BYTES[feat.precision],
                                      K.precision_class(feat.precision, arch), cpu_offloaded_layer_bytes(job),
                                      fine_grained_offloaded_bytes(job), notes))


def build_profile(job: Job, eff: Efficiency | None = None) -> Profile:
    """Work of every pipeline stage of ``job`` for one microbatch (see module doc). The layout's part
    (:func:`_layout_work`) and the layer kinds' part (:func:`_layer_kinds`) are memoised on what they read."""
    eff = eff or default_efficiency()
    model, lay, feat = job.model, job.layout, job.features
    seq, mbs = job.seq_length, job.micro_batch_size
    quant = quantised_layers(model, feat)
    split, total, stages = _layout_work(model, lay, seq, mbs, *quant, eff.kernels)
    kinds = _layer_kinds(job, eff, split, quant)
    assumptions: list[str] = [*job.assumptions, *job.model.approximations, *split.notes, *task_assumptions(feat),
                              *kinds.notes]
    # PP send/recv of one microbatch's activations at a stage boundary
    t_a, tp, h = seq * mbs / lay.cp, lay.tp, model.hidden_size
    pp_bytes = t_a / (tp if feat.sequence_parallel else 1) * h * C.BF16
    pp_cross = lay.pp > 1 and (job.gpus // lay.pp) >= job.system.nvlink_domain
    m = max(job.num_microbatches, 1)
    if feat.task == "lora":  # the model FLOPs reported (TFLOP/s/GPU) as Bridge counts a LoRA job
        total = _task_flops(model, seq, lay.tp, feat.task)
    return Profile(job, kinds.types, list(stages), m, lay.pp, split.vpp, total, kinds.recompute_frac,
                   kinds.recompute_a2a, kinds.full_recompute_frac, assumptions, pp_bytes, pp_cross, kinds.quant_bytes,
                   kinds.pcls, kinds.offload_bytes, kinds.fg_offload)


# ------------------------------------------------------------------------------------------------------------
# evaluation (efficiency → seconds)
# ------------------------------------------------------------------------------------------------------------


def _price(work: K.Work, r: Rates | ComputeRates, rf: dict[int, float], full_frac: float
           ) -> tuple[float, float, float, float, float, float]:
    """(a third of the fwd + bwd gemm s, fwd attn s, fwd mem s, recompute fwd s, a third of the fwd + bwd gemm s of
    TP-sharded kinds, of MoE experts). GEMMs are priced per pass (forward, dgrad, wgrad with the main-gradient
    accumulation, :func:`compute.gemm_row_seconds`), the rest by the 3x-forward convention of the callers.

    Each row in plain floats and each total as ``np.sum`` of the rows' array (:func:`compute.pairwise_sum`): the
    numbers of pricing the work's columns with numpy (tests/test_step_fastpath.py). A zero rate prices the rows as
    numpy float64 values instead, which give numpy's inf / NaN where plain floats would raise."""
    try:
        return _price_rows(work, r, rf, full_frac)
    except ZeroDivisionError:
        f64 = np.float64
        return _price_rows(K.Work(tuple((f64(f), f64(m), f64(n), f64(k), f64(g), *rest)
                                        for f, m, n, k, g, *rest in work.gemms),
                                  tuple((f64(f), tag) for f, tag in work.attn),
                                  tuple((f64(b), *rest) for b, *rest in work.mem)), r, rf, full_frac)


def _price_rows(work: K.Work, r: Rates | ComputeRates, rf: dict[int, float], full_frac: float
                ) -> tuple[float, float, float, float, float, float]:
    """:func:`_price` of the rows' numbers as they are (floats, or np.float64 for numpy's division by zero)."""
    sum_ = K.pairwise_sum
    gemm_row, attn_s, mem_s = K.gemm_row_seconds, K.attention_seconds, K.memory_seconds
    rates = (r.peak_quant, r.eff_quant, r.peak_bf16, r.eff_bf16, r.knee, r.hbm_gbs, r.hbm_eff, r.quant_bytes,
             r.grad_accum_bytes)  # gemm_row_seconds' rates, in its order
    frozen = r.frozen_base  # LoRA: the frozen base GEMMs skip wgrad, the adapters' GEMMs keep it
    tg: list[float] = []
    tfb: list[float] = []
    g_tags: list[int] = []
    for flops, m, n, k, groups, quant, tag, adapter in work.gemms:
        fwd, bwd = gemm_row(flops, m, n, k, groups, quant, *rates, adapter or not frozen)
        tg.append(fwd)
        tfb.append((fwd + bwd) / 3.0)
        g_tags.append(tag)
    peak, attn_eff = r.peak_bf16, r.attn_eff
    ta = [attn_s(f, peak, attn_eff) for f, _ in work.attn]
    hbm, hbm_eff, stream_eff = r.hbm_gbs, r.hbm_eff, r.hbm_stream_eff
    te = [mem_s(b, hbm, hbm_eff, stream, stream_eff) for b, _, stream in work.mem]
    g, a, e = float(sum_(tg)), float(sum_(ta)), float(sum_(te))
    g_fb = float(sum_(tfb))
    rec = 0.0
    if full_frac > 0:
        rec = full_frac * (g + a + e)
    elif rf:
        for tag, frac in rf.items():
            if tg:
                rec += frac * float(sum_([t for t, x in zip(tg, g_tags, strict=True) if x == tag]))
            if ta:
                rec += frac * float(sum_([t for t, (_, x) in zip(ta, work.attn, strict=True) if x == tag]))
            if te:
                rec += frac * float(sum_([t for t, (_, x, _) in zip(te, work.mem, strict=True) if x == tag]))
    experts = K.TAG["experts"]
    tp_kinds = float(sum_([t for t, x in zip(tfb, g_tags, strict=True) if x != experts])) if tg else 0.0
    exp = float(sum_([t for t, x in zip(tfb, g_tags, strict=True) if x == experts])) if tg else 0.0
    return g_fb, a, e, rec, tp_kinds, exp


class Rates(NamedTuple):
    """Achievable rates of one job's GPU, precision and network (peak x efficiency parameter), and the few
    per-job constants the pricing reads. Every efficiency value comes from the parameter set (a missing one is an
    error, :meth:`Efficiency.__getitem__`). A NamedTuple: part of the pricing memo keys (hashed in C)."""

    peak_bf16: float  #: BF16 dense peak, TFLOP/s (system catalog)
    peak_quant: float  #: peak of the precision class (FP8 / MXFP8 / NVFP4), TFLOP/s; = peak_bf16 for BF16
    eff_bf16: float  #: ``gemm_eff.<arch>.bf16`` (x ``clock_scale.blackwell_ultra`` on B300)
    eff_quant: float  #: ``gemm_eff.<arch>.<class>`` (likewise)
    knee: float  #: ``gemm_knee``
    hbm_gbs: float  #: HBM bandwidth, GB/s
    hbm_eff: float  #: ``hbm_eff``
    hbm_stream_eff: float  #: ``hbm_stream_eff`` (streaming kernels: unfused attention scores)
    attn_eff: float  #: ``attn_eff.<arch class>`` (x ``attn_fp8_gain`` with FP8 attention, :func:`_fp8_attention`)
    nvlink_gbs: float  #: NVLink bus bandwidth x ``nvlink_eff``, GB/s
    nic_gbs: float  #: scale-out bandwidth x ``scaleout_eff``, GB/s
    nic_a2a_gbs: float  #: scale-out rate of one EP dispatch/combine (:func:`moetune.perfmodel.comm.a2a_network`)
    a2a_latency_s: float  #: start-up seconds of one EP dispatch/combine (:func:`moetune.perfmodel.comm.a2a_network`)
    nvlink_a2a_gbs: float  #: NVLink bandwidth x ``nvlink_a2a_eff`` (all-to-all), GB/s
    #: p of the NVLink / network stages of one EP dispatch/combine (:func:`moetune.perfmodel.comm.a2a_seconds`):
    #: ``hierarchical_a2a_sharpness`` for DeepEP / HybridEP, infinite (the max) for NCCL
    a2a_stage_sharpness: float
    launch_us: float  #: ``launch_us.<host CPU family>``, µs per kernel launch
    quant_bytes: float  #: bytes per element of quantised GEMM inputs
    ep_overlap_eff: float  #: ``ep_overlap_eff``
    grad_accum_bytes: float  #: main-gradient accumulation in the wgrad epilogue: read + write per weight
    host_queue_sharpness: float  #: ``host_queue_sharpness``
    frozen_base: bool = False  #: LoRA: base weights frozen, wgrad only for adapter GEMMs (:func:`_price`)


def _fp8_attention(f) -> bool:
    """FP8 attention applies: ``fp8_dot_product_attention`` inside an FP8 recipe (Transformer Engine enables
    ``fp8_dpa`` only under an FP8 autocast recipe; BF16 and NVFP4 runs keep BF16 attention)."""
    return f.fp8_dot_product_attention and f.precision in FP8_PRECISIONS


@memo(maxsize=4096)
def _rates_of(system: System, eff: Efficiency, pcls: str, qb: float, ep: int, etp: int, dispatcher: str,
              backend: str | None, grad_accum_bytes: float, fp8_attention: bool = False, frozen_base: bool = False
              ) -> Rates:
    """:class:`Rates` of a system, precision class and EP mesh / dispatcher under an efficiency set; read only.
    ``grad_accum_bytes``: read + write bytes per weight of the main-gradient accumulation (2 x the grad bytes of
    :func:`moetune.perfmodel.memory.state_bytes`); ``fp8_attention``: :func:`_fp8_attention` of the job."""
    gpu = system.gpu
    arch = gpu.arch if gpu.arch != "ampere" else "hopper"
    # Blackwell Ultra (B300/GB300) doubles the SFU exponential rate that bounds softmax in attention
    attn_cls = "blackwell_ultra" if (arch == "blackwell" and "B300" in gpu.name.upper()) else arch
    peak_b = gpu.peak_tflops["bf16"]
    pk = K.peak_key(pcls)
    peak_q = gpu.peak_tflops.get(pk, gpu.peak_tflops.get("fp8", peak_b)) if pcls != "bf16" else peak_b
    eff_b = eff[f"gemm_eff.{arch}.bf16"]
    eff_q = eff[f"gemm_eff.{arch}.{pcls}"] if pcls != "bf16" else eff_b
    if attn_cls == "blackwell_ultra":
        scale = eff["clock_scale.blackwell_ultra"]
        eff_b, eff_q = eff_b * scale, eff_q * scale
    cpu = H.host_cpu_family(system.host_cpu)
    nic_a2a, a2a_lat = C.a2a_network(
        ep, etp, system.nvlink_domain, dispatcher, backend, system.scaleout_bw_gbs, scaleout_eff=eff["scaleout_eff"],
        wire_eff=eff["a2a_wire_eff"],
        latency_us=eff.constants["a2a_latency_us"])
    return Rates(
        peak_bf16=peak_b, peak_quant=peak_q, eff_bf16=eff_b, eff_quant=eff_q, knee=eff["gemm_knee"],
        hbm_gbs=gpu.hbm_bw_gbs, hbm_eff=eff["hbm_eff"], hbm_stream_eff=eff["hbm_stream_eff"],
        attn_eff=eff[f"attn_eff.{attn_cls}"] * (eff["attn_fp8_gain"] if fp8_attention else 1.0),
        nvlink_gbs=system.nvlink_bw_gbs * eff["nvlink_eff"],
        nic_gbs=system.scaleout_bw_gbs * eff["scaleout_eff"], nic_a2a_gbs=nic_a2a, a2a_latency_s=a2a_lat,
        nvlink_a2a_gbs=system.nvlink_bw_gbs * eff["nvlink_a2a_eff"],
        a2a_stage_sharpness=(eff["hierarchical_a2a_sharpness"] if C.hierarchical_a2a(dispatcher, backend)
                             else math.inf),
        launch_us=eff[f"launch_us.{cpu}"], quant_bytes=qb, ep_overlap_eff=eff["ep_overlap_eff"],
        grad_accum_bytes=grad_accum_bytes,
        host_queue_sharpness=eff["host_queue_sharpness"], frozen_base=frozen_base,
    )


class _PriceFields(NamedTuple):
    """The fields of :class:`PriceInputs`."""

    rates: Rates
    recompute_frac: tuple[tuple[int, float], ...]
    full_recompute_frac: float
    recompute_a2a: float
    tp: int
    cp: int
    tp_busbw: float
    cp_busbw: float
    tp_overlap: bool
    tp_overlap_splits: int
    tp_overlap_sm_frac: float
    cp_comm_type: str
    nvlink_domain: int  #: GPUs per NVLink domain (the CP group's all-to-alls, :func:`comm.group_a2a_seconds`)
    cp_a2a_nic_gbs: float  #: NIC rate of an all-to-all's inter-node bytes: raw x ``a2a_wire_eff`` (comm module doc)
    cp_a2a_latency_s: float  #: start-up of one all-to-all over the CP group (:func:`comm.a2a_latency_s`)
    graph_launch_us: float
    native_launch_us: float
    host_sync_us: float


class PriceInputs(_PriceFields):
    """Everything :func:`_price_layer` reads besides the layer work: the rates, the recompute selection, the TP / CP
    mesh and bandwidths, TP-overlap settings and the host constants (its memo key). Its hash is computed once (as
    :class:`moetune.memo.HashedTuple`'s): a tuple re-hashes its ~40 numbers, the rates' included, on every lookup,
    and evaluate looks one price up per layer kind."""

    __hash__ = HashedTuple.__hash__

    def __reduce__(self):
        return (PriceInputs._make, (tuple(self),))


@dataclass(frozen=True, slots=True)
class LayerPrice:
    """Seconds of one layer kind for one microbatch (fwd + bwd unless noted)."""

    comp: float  #: compute: 3 x (gemm + attention + memory-bound) forward
    gemm: float
    attn: float
    mem: float
    rec: float  #: recompute (incl. recomputed A2As)
    tp: float  #: exposed TP communication
    cp: float  #: exposed CP communication
    a2a: float  #: EP dispatch + combine, fwd + bwd, before hiding
    exp: float  #: expert GEMMs (fwd + bwd)
    host: float  #: host launch time
    sync: float  #: host syncs (dropless dispatch)
    rec_a2a: float = 0.0  #: the recomputed EP dispatch/combines included in ``rec`` (full or ``moe`` recompute)
    #: :func:`layer_host_gap` of this price without EP overlap at its rates' ``host_queue_sharpness`` (set by
    #: :func:`_price_layer`: every evaluation of a stage without EP overlap reads it)
    gap: float = 0.0


@memo(maxsize=65536)
def _price_layer(lt: LayerType, q: PriceInputs) -> LayerPrice:
    """Price of one layer type (:func:`_price` plus its communication and host time); read only."""
    r = q.rates
    g, a, e, rec, g_tp, g_exp = _price_work(lt.work, compute_rates(r), q.recompute_frac, q.full_recompute_frac)
    comp = 3 * (g + a + e)  # fwd + bwd (dgrad + wgrad ≈ 2× fwd; attention bwd counted as 2× fwd FLOPs)
    tp_comm = 2 * C.ring_seconds(lt.tp_bytes, q.tp, q.tp_busbw) if q.tp > 1 else 0.0
    tp_exp = S.tp_exposed(tp_comm, 3 * g_tp, overlap=q.tp_overlap, splits=q.tp_overlap_splits,
                          sm_frac=q.tp_overlap_sm_frac)
    cp_comm = 2 * lt.cp_bytes / (q.cp_busbw * 1e9) if q.cp > 1 else 0.0
    cp_exp = S.cp_exposed(cp_comm, 3 * a, cp_comm_type=q.cp_comm_type)
    if lt.cp_a2a_bytes > 0 and q.cp > 1:  # Mamba CP all-to-alls (fwd + bwd) sit on the critical path
        cp_exp += 2 * C.group_a2a_seconds(lt.cp_a2a_bytes, q.cp, q.tp, q.nvlink_domain, r.nvlink_a2a_gbs,
                                          q.cp_a2a_nic_gbs, q.cp_a2a_latency_s, C.MAMBA_CP_A2AS)
    a2a_one = (C.a2a_seconds(lt.a2a_intra, lt.a2a_inter, r.nvlink_a2a_gbs, r.nic_a2a_gbs, r.a2a_latency_s,
                             r.a2a_stage_sharpness) if lt.is_moe else 0.0)
    rec_a2a = q.recompute_a2a * a2a_one
    if q.full_recompute_frac > 0 and lt.is_moe:
        rec_a2a = 2 * a2a_one * q.full_recompute_frac
    p = LayerPrice(comp=comp, gemm=3 * g, attn=3 * a, mem=3 * e, rec=rec + rec_a2a, tp=tp_exp, cp=cp_exp,
                   a2a=4 * a2a_one, exp=3 * g_exp,
                   host=H.host_seconds(lt.launches, launch_us=r.launch_us, graph_launch_us=q.graph_launch_us,
                                       native_us=q.native_launch_us),
                   sync=lt.launches.syncs * q.host_sync_us * 1e-6, rec_a2a=rec_a2a)
    object.__setattr__(p, "gap", layer_host_gap(p, False, r.host_queue_sharpness))  # frozen: set once, here
    return p


@memo(maxsize=65536)
def _price_work(lw: LayerWork, cr: ComputeRates, recompute_frac: tuple[tuple[int, float], ...],
                full_recompute_frac: float) -> tuple[float, float, float, float, float, float]:
    """:func:`_price` of a layer kind's compute work with the compute rates of :class:`Rates` (the only ones it
    reads), memoised: layer types of equal work (:class:`LayerWork`) share one price; read only."""
    return _price(lw.work, cr, dict(recompute_frac), full_recompute_frac)


class ComputeRates(NamedTuple):
    """The fields of :class:`Rates` that :func:`_price` reads (GEMM, attention and memory-bound rates): the memo key of
    the non-layer work's price (:func:`_price_extra_of`), which the EP mesh and dispatcher (the all-to-all rates of
    :class:`Rates`) do not change."""

    peak_bf16: float
    peak_quant: float
    eff_bf16: float
    eff_quant: float
    knee: float
    hbm_gbs: float
    hbm_eff: float
    hbm_stream_eff: float
    attn_eff: float
    quant_bytes: float
    grad_accum_bytes: float
    frozen_base: bool = False  #: LoRA: the frozen base GEMMs (the output layer's too) skip wgrad


@memo(maxsize=4096)
def compute_rates(r: Rates) -> ComputeRates:
    """:class:`ComputeRates` of ``r`` (one instance per value of ``r`` while in the table)."""
    return ComputeRates(r.peak_bf16, r.peak_quant, r.eff_bf16, r.eff_quant, r.knee, r.hbm_gbs, r.hbm_eff,
                        r.hbm_stream_eff, r.attn_eff, r.quant_bytes, r.grad_accum_bytes, r.frozen_base)


def _price_extra(extra: ExtraWork, r: Rates) -> tuple[float, float, float]:
    """(fwd gemm s, fwd attn s, fwd mem s) of a stage's non-layer work (:func:`_price` of its work with ``r``'s
    :class:`ComputeRates`, the only rates it reads: one price for the layouts of every EP mesh and dispatcher); read
    only."""
    return _price_extra_of(extra, compute_rates(r))


@memo(maxsize=65536)
def _price_extra_of(extra: ExtraWork, cr: ComputeRates) -> tuple[float, float, float]:
    """:func:`_price_extra`, keyed on the compute rates."""
    g, a, e, _, _, _ = _price(extra.work, cr, {}, 0.0)
    return g, a, e


class StepWalls(NamedTuple):
    """What :func:`evaluate` returns: the step time and its walls (plain floats; the planner's hot path). A
    NamedTuple: immutable (the search's caches share it) and built in C (:func:`evaluate` passes its fields in this
    order to ``tuple.__new__``; a frozen dataclass sets each field through ``object.__setattr__``)."""

    walls: dict[str, float]  #: seconds per wall (keys :data:`WALL_ORDER`); they add up to ``step``
    step: float  #: seconds per step (= :attr:`TimeEstimate.step_time_s`)
    stage_seconds: list[float]  #: per-microbatch time of each PP rank
    bottleneck: int  #: PP rank with the longest per-microbatch time
    detail: dict[str, float]  #: seconds per step on the bottleneck stage: gemm, attention, memory_bound
    #: per stage, the walls no feature variant shortens (compute, recompute, TP, CP), for the planner's bounds
    stage_floor: list[float]
    stage_a2a: list[float]  #: per stage, EP dispatch/combine seconds before any hiding (planner bounds)
    #: per stage, the recomputed EP dispatch/combine seconds included in its ``stage_floor`` (planner bounds)
    stage_rec_a2a: list[float]
    #: per stage, the exposed host-copy seconds of layer-level CPU offloading (not in ``stage_floor``; planner bounds)
    stage_offload: list[float]
    #: per stage, the most compute EP overlap can hide the dispatch/combine behind: the stage's compute plus a third of
    #: its expert GEMMs (the partner of :func:`moetune.perfmodel.schedule.ep_exposed` with delayed wgrad; planner bounds)
    stage_partner: list[float]
    #: SM share of the dispatcher's kernels (charged on the hidden EP time under EP overlap; planner bounds)
    sm_frac: float
    #: the once-per-step host time inside ``walls["host"]`` (:func:`_step_host`; planner bounds)
    step_host: float
    ep_overlap_eff: float  #: the ``ep_overlap_eff`` parameter the walls were priced with
    schedule: tuple[int, int, int]  #: (microbatches, PP, VPP)


def _layer_prices(prof: Profile | LayerKinds, eff: Efficiency) -> tuple[Rates, float, dict[tuple, LayerPrice]]:
    """The rates of a profile's job, the SM share of its flex dispatcher and the price of each of its layer kinds
    (:func:`_price_layer`): the first part of :func:`evaluate`, shared with :func:`stage_a2a_seconds`."""
    job = prof.job
    lay = job.layout
    return _priced_kinds(job.system, eff, job.features, lay.tp, lay.cp, lay.ep, lay.expert_tp, prof.pcls,
                         prof.quant_bytes, tuple(prof.recompute_frac.items()), prof.full_recompute_frac,
                         prof.recompute_a2a, tuple(prof.types.values()))


@memo(maxsize=16384)
def _priced_kinds(sysm: System, eff: Efficiency, feat: Features, tp: int, cp: int, ep: int, etp: int, pcls: str,
                  qb: float, recompute_frac: tuple[tuple[int, float], ...], full_recompute_frac: float,
                  recompute_a2a: float, types: tuple[LayerType, ...]
                  ) -> tuple[Rates, float, dict[tuple, LayerPrice]]:
    """:func:`_layer_prices` of the layer types ``types`` (the values of a profile's ``types``, keyed by their
    ``key`` as there) in one lookup: the job's :func:`_price_context` and the price of each layer type
    (:func:`_price_layer`). The planner prices many jobs of one price context and one set of layer types (feature
    variants that change neither, e.g. the memory-only ones); read only."""
    r, sm_frac, q = _price_context(sysm, eff, feat, tp, cp, ep, etp, pcls, qb, 2 * grad_buffer_bytes(feat),
                                   recompute_frac, full_recompute_frac, recompute_a2a)
    # per layer type: price once
    return r, sm_frac, {lt.key: _price_layer(lt, q) for lt in types}


@memo(maxsize=16384)
def _price_context(sysm: System, eff: Efficiency, feat: Features, tp: int, cp: int, ep: int, etp: int, pcls: str,
                   qb: float, grad_accum_bytes: float, recompute_frac: tuple[tuple[int, float], ...],
                   full_recompute_frac: float, recompute_a2a: float) -> tuple[Rates, float, PriceInputs]:
    """(rates, SM share of the dispatcher's kernels, :class:`PriceInputs`) of a job's system, features, mesh and
    recompute selection (:func:`_layer_prices`); read only."""
    consts = eff.constants
    r = _rates_of(sysm, eff, pcls, qb, ep, etp, feat.moe_token_dispatcher_type, feat.moe_flex_dispatcher_backend,
                  grad_accum_bytes, _fp8_attention(feat), feat.task == "lora")
    tp_busbw = C.bus_bandwidth(tp, 1, sysm.nvlink_domain, r.nvlink_gbs, r.nic_gbs)
    cp_busbw = C.bus_bandwidth(cp, tp, sysm.nvlink_domain, r.nvlink_gbs, r.nic_gbs)
    cp_dom, cp_in = C.domains_spanned(cp, tp, sysm.nvlink_domain)
    cp_lat = C.a2a_latency_s(cp_dom - 1, cp - cp_in, consts["a2a_latency_us"]) if cp > 1 else 0.0
    n_sms = 0
    if feat.moe_token_dispatcher_type == "flex":
        n_sms = feat.moe_flex_dispatcher_num_sms or (consts["deepep_sms"] if feat.moe_flex_dispatcher_backend
                                                     == "deepep" else consts["hybridep_sms"])
    elif feat.moe_token_dispatcher_type == "alltoall":
        n_sms = consts["alltoall_sms"]  # NCCL all-to-all kernels: one CTA per channel (catalog source)
    sm_frac = n_sms / sysm.gpu.sm_count
    q = PriceInputs(
        r, recompute_frac, full_recompute_frac, recompute_a2a, tp, cp,
        tp_busbw, cp_busbw, feat.tp_comm_overlap and tp > 1 and feat.sequence_parallel,
        consts["tp_overlap_splits"], consts["tp_overlap_sms"] / sysm.gpu.sm_count, feat.cp_comm_type,
        sysm.nvlink_domain, sysm.scaleout_bw_gbs * eff["a2a_wire_eff"], cp_lat,
        consts["graph_launch_us"], consts["native_launch_us"], consts["host_sync_us"])
    return r, sm_frac, q


def _stage_a2a(st: StageWork, priced: dict[tuple, LayerPrice]) -> float:
    """EP dispatch/combine seconds of one stage per microbatch before any hiding (``StepWalls.stage_a2a``)."""
    a2a = 0.0
    for key, n in st.layer_counts.items():
        a2a += n * priced[key].a2a
    return a2a


def stage_a2a_seconds(job: Job, efficiency: Efficiency | None = None) -> list[float]:
    """``estimate_walls(job).stage_a2a`` (the same values, one implementation: :func:`_stage_a2a` of the prices of
    :func:`_layer_prices`) without the rest of :func:`evaluate`: what the planner's EP bound reads of the base job
    with another dispatcher."""
    return stage_a2a_and_sm(job, efficiency)[0]


def stage_a2a_and_sm(job: Job, efficiency: Efficiency | None = None) -> tuple[list[float], float]:
    """:func:`stage_a2a_seconds` and the SM share of the job's dispatcher kernels (``StepWalls.sm_frac``)."""
    eff = resolve_efficiency(efficiency)
    prof = build_profile(job, eff)
    _, sm_frac, priced = _layer_prices(prof, eff)
    done: dict[StageWork, float] = {}
    out = []
    for st in prof.stages:
        a = done.get(st)
        if a is None:
            a = done[st] = _stage_a2a(st, priced)
        out.append(a)
    return out, sm_frac


def layer_host_gap(p: LayerPrice, ep_overlap: bool, sharp: float, ep_wall_frac: float = 0.0) -> float:
    """GPU idle seconds the host adds to one layer of price ``p`` per microbatch (:func:`evaluate`): its launches
    against the layer's GPU time (:func:`moetune.perfmodel.host.host_exposed`) plus its host syncs (none under EP
    overlap).

    The layer's GPU time is the time its kernels keep the device busy, during which the host can enqueue ahead: the
    compute, recompute and exposed TP / CP time and the dispatch/combine. Under EP overlap (the combined 1F1B
    schedule) the dispatch/combine runs on the communication stream, and the compute stream waits on it
    (``ScheduleNode.stream_acquire_context``: ``cudaStreamWaitEvent``, a device-side wait) only for the exposed part;
    that part and the compute the dispatcher's SMs take away (:func:`moetune.perfmodel.schedule.sm_contention`) are
    still device time behind which the host runs ahead, the hidden part is not. ``ep_wall_frac`` is that share of the
    dispatch/combine seconds (exposed + SM contention over the stage's dispatch/combine, :func:`evaluate`)."""
    gpu_t = p.comp + p.tp + p.cp + p.rec + (ep_wall_frac * p.a2a if ep_overlap else p.a2a)
    return H.host_exposed(p.host, gpu_t, sharp) + (0.0 if ep_overlap else p.sync)


def evaluate(prof: Profile, eff: Efficiency) -> StepWalls:
    """Seconds per wall for a profile (see module doc); no pydantic (hot path of the fit/planner)."""
    job = prof.job
    lay, feat = job.layout, job.features
    r, sm_frac, priced = _layer_prices(prof, eff)
    m = prof.m
    ep_overlap = feat.overlap_moe_expert_parallel_comm and lay.ep > 1
    delay_wgrad = feat.delay_wgrad_compute
    sharp = r.host_queue_sharpness
    host_exposed = H.host_exposed
    cr = compute_rates(r)  # the non-layer work's price reads these (_price_extra)
    # per stage: (compute, recompute, comm_tp, comm_cp, comm_ep, host, gemm, attn, mem, EP dispatch/combine before
    # any hiding (not a wall; for the planner's bounds), per-microbatch seconds, the variant-invariant floor, the
    # offload wall, the recomputed dispatch/combines inside recompute and the largest EP-overlap partner (planner
    # bounds))
    stage_walls: list[tuple[float, ...]] = []
    done: dict[StageWork, tuple[float, ...]] = {}  # stages shared by object (identical work) are priced once
    for st in prof.stages:
        w = done.get(st)
        if w is not None:
            stage_walls.append(w)
            continue
        comp = rec = ctp = ccp = gemm = attn = mem = 0.0
        exp_tot = rec_a2a = 0.0
        host_gap = extra_host = 0.0
        for key, n in st.layer_counts.items():
            p = priced[key]
            host_gap += n * p.gap  # the host gaps without EP overlap (recomputed below with it)
            comp += n * p.comp
            gemm += n * p.gemm
            attn += n * p.attn
            mem += n * p.mem
            rec += n * p.rec
            rec_a2a += n * p.rec_a2a
            ctp += n * p.tp
            ccp += n * p.cp
            exp_tot += n * p.exp
        a2a_tot = _stage_a2a(st, priced)
        layers_s = comp + ctp + ccp  # the decoder layers' fwd + bwd (the offload copies hide behind them)
        if st.extra is not None:
            g, a, e = _price_extra_of(st.extra, cr)
            comp += 3 * (g + a + e)
            gemm += 3 * g
            mem += 3 * e
            extra_host = host_exposed(st.extra_kernels * r.launch_us * 1e-6, 3 * (g + a + e), sharp)
        # EP dispatch/combine: hidden behind the partner microbatch's compute under EP overlap
        partner = comp
        if delay_wgrad and not r.frozen_base:  # LoRA's frozen experts have no wgrad to delay
            partner += exp_tot / 3.0  # expert wgrad moved behind the dispatch
        ep_exp = S.ep_exposed(a2a_tot, partner, m, overlap=ep_overlap, eff=r.ep_overlap_eff)
        if ep_overlap and sm_frac > 0:
            # compute that runs next to the flex dispatcher loses its SMs for the hidden time
            ep_exp += S.sm_contention(a2a_tot - ep_exp, sm_frac)
        # the host enqueues ahead behind the device time of the layers, exposed dispatch/combine included
        if ep_overlap:
            frac = ep_exp / a2a_tot if a2a_tot > 0 else 0.0
            host_gap = 0.0
            for key, n in st.layer_counts.items():
                host_gap += n * layer_host_gap(priced[key], ep_overlap, sharp, frac)
        host_gap += extra_host
        # layer-level CPU offloading (PP 1): host copies longer than the layer they hide behind
        off_exp = (S.offload_exposed(prof.offload_bytes, _host_copy_gbs(job), layers_s / st.layers,
                                     job.model.num_layers // len(prof.offload_bytes))
                   if prof.offload_bytes and st.layers else 0.0)
        if prof.fg_offload and st.layers:
            # fine-grained activation offloading: each layer's copies hide behind about one layer (schedule doc)
            gbs, layer_s = _host_copy_gbs(job, duplex=True), layers_s / st.layers
            for key, n in st.layer_counts.items():
                b = prof.fg_offload.get(key[:2], 0.0)
                if b > 0:
                    off_exp += n * S.offload_exposed((b,), gbs, layer_s)
        # the per-microbatch time: sum() of the walls in this order (the same additions as summing them by name)
        w = (comp, rec, ctp, ccp, ep_exp, host_gap, gemm, attn, mem, a2a_tot,
             sum((comp, rec, ctp, ccp, ep_exp, host_gap, off_exp)), comp + rec + ctp + ccp, off_exp, rec_a2a,
             comp + exp_tot / 3.0)
        stage_walls.append(w)
        done[st] = w
    cols = tuple(zip(*stage_walls))  # per wall, its value on each stage (in C, instead of one list per wall)
    per_mb = list(cols[10])
    # an interleaved schedule's host enqueues ahead of its GPU except at the forward's dropless host syncs
    blocks = any(lt.launches.syncs > 0 for lt in prof.types.values())
    steady, bubble = S.pipeline_step(per_mb, m, prof.pp, prof.vpp, stage_host=list(cols[5]), fwd_host_blocks=blocks)
    if any(map(math.isnan, per_mb)):  # a NaN: numpy's rule (first NaN)
        bott = int(np.argmax(per_mb))
    else:  # np.argmax (first maximum) without building an array: max keeps the first of equal values
        bott = per_mb.index(max(per_mb))
    b_comp, b_rec, b_tp, b_cp, b_ep, b_host, b_gemm, b_attn, b_mem = stage_walls[bott][:9]
    b_off = stage_walls[bott][12]
    # PP send/recv: warm-up/flush transfers are on the critical path; steady-state ones overlap (overlap_p2p_comm)
    pp_exp = 0.0
    if prof.pp > 1:
        bw = r.nic_gbs if prof.pp_cross else r.nvlink_gbs
        t_p2p = prof.pp_bytes / (bw * 1e9)
        pp_exp = 2 * (prof.pp - 1) * t_p2p
        if prof.vpp <= 1:  # interleaved schedules overlap p2p with compute (overlap_p2p_comm auto with VPP > 1)
            pp_exp += 2 * m * t_p2p
    # DP gradient reduce-scatter / parameter all-gather (distributed optimizer) and optimizer step
    dp_exp, opt = _dp_and_optimizer(prof, eff, r, b_comp + b_rec, m)
    step_host = _step_host(prof, eff, r, opt)
    walls = {
        "compute": m * b_comp, "recompute": m * b_rec, "comm_tp": m * b_tp, "comm_cp": m * b_cp, "comm_ep": m * b_ep,
        "comm_pp": pp_exp, "comm_dp": dp_exp, "offload": m * b_off, "pipeline_bubble": bubble, "host": m * b_host + step_host,
        "optimizer": opt,
    }
    step = sum(walls.values())
    detail = {"gemm": m * b_gemm, "attention": m * b_attn, "memory_bound": m * b_mem}
    # StepWalls(walls, step, stage_seconds, bottleneck, detail, stage_floor, stage_a2a, stage_rec_a2a, stage_offload,
    # stage_partner, sm_frac, step_host, ep_overlap_eff, schedule)
    return tuple.__new__(StepWalls, (walls, step, per_mb, bott, detail, list(cols[11]), list(cols[9]), list(cols[13]),
                                     list(cols[12]), list(cols[14]), sm_frac, step_host, r.ep_overlap_eff,
                                     (m, prof.pp, prof.vpp)))


def _host_copy_gbs(job: Job, duplex: bool = False) -> float:
    """Host-copy bandwidth per GPU per direction left for activation-offload copies: the system's ``pcie_bw_gbs``,
    less the scale-out NIC's line rate (``scaleout_bw_gbs``) where the NIC's GPUDirect RDMA traffic shares the GPU's
    PCIe link (``host_link_shared_with_nic``, x86 DGX) and the job spans nodes - the worst case, with the NIC busy
    throughout (the DP / FSDP collectives of an offloading PP-1 job overlap the whole step) - and at most the GPU's
    share of the node's host DRAM bandwidth (``host_memory_bw_gbs_per_gpu``: every GPU of the node offloads in the
    same schedule), halved when ``duplex``: the offloads and the reloads run at the same time and share that
    bandwidth. Layer-level offloading (TE ``AsyncDoubleBufferGroupOffloadHandler``) waits for each offload before the
    forward goes on (``synchronize_on_group_commit_forward``), so its two directions take turns; Megatron-Core's
    fine-grained offloading never makes the forward wait for an offload (``on_group_commit_forward``), so the offload
    stream trails into the backward and its reloads (``duplex``)."""
    s = job.system
    link = s.pcie_bw_gbs
    if s.host_link_shared_with_nic and job.gpus > s.gpus_per_node:
        link = max(s.pcie_bw_gbs - s.scaleout_bw_gbs, 0.0)
    if s.host_memory_bw_gbs_per_gpu is None:
        return link
    return min(link, s.host_memory_bw_gbs_per_gpu / (2.0 if duplex else 1.0))


def _step_host(prof: Profile, eff: Efficiency, r: Rates, opt_s: float) -> float:
    """Exposed host time of the once-per-step work (optimizer, gradient clipping, loss bookkeeping;
    :func:`moetune.perfmodel.host.step_launches`) on the rank with the most parameter tensors, against the
    optimizer's GPU time (launches and their host seconds: :func:`_step_launches`)."""
    consts = eff.constants
    if not consts["param_tensors"]:
        return 0.0
    f = prof.job.features
    sl, host_s = _step_launches(prof.job.model, tuple(prof.stages), prof.job.layout.ep, eff, r.launch_us,
                                tuple(f.lora_target_modules) if f.task == "lora" else None)
    return H.host_exposed(host_s, opt_s, r.host_queue_sharpness) + sl.syncs * consts["host_sync_us"] * 1e-6


@memo(maxsize=16384)
def _step_launches(model: ModelArch, stages: tuple[StageWork, ...], ep: int, eff: Efficiency, launch_us: float,
                   lora_targets: tuple[str, ...] | None = None) -> tuple[H.LayerLaunches, float]:
    """(launches, host seconds to issue them) of the once-per-step work of :func:`_step_host` on the rank with the
    most parameter tensors (``eff.constants``: ``param_tensors``, ``kernels_per_layer``, ``graph_launch_us``). Under
    LoRA (``lora_targets``) the step walks the adapters' weights alone (``param_tensors.lora_adapter`` each)."""
    consts = eff.constants
    kern = consts["kernels_per_layer"]
    tensors = consts["param_tensors"]
    local = float(model.num_moe_experts or 1) / max(ep, 1)
    if lora_targets is not None:
        per = tensors.get("lora_adapter", 0.0)
        n = max(sum(cnt * per * len(lora_adapters(model, key[0], key[1], lora_targets))
                    for key, cnt in st.layer_counts.items()) for st in dict.fromkeys(stages))
    else:
        n = max(H.param_tensors(st.layer_counts, local_experts=local,
                                shared=bool(model.moe_shared_expert_intermediate_size),
                                mla=model.multi_latent_attention, tensors=tensors)
                for st in dict.fromkeys(stages))  # stages shared by object (identical work) counted once
    sl = H.step_launches(n, kern)
    return sl, H.host_seconds(sl, launch_us=launch_us, graph_launch_us=consts["graph_launch_us"])


def _dp_and_optimizer(prof: Profile, eff: Efficiency, r: Rates, per_mb_compute: float, m: int
                      ) -> tuple[float, float]:
    """(exposed DP seconds, optimizer-step seconds) of a step whose bottleneck stage computes (and recomputes)
    ``per_mb_compute`` seconds per microbatch; the collectives' seconds: :func:`_dp_collectives`."""
    job = prof.job
    feat, sysm = job.features, job.system
    consts = eff.constants
    grad_b = float(grad_buffer_bytes(feat))
    param_b = 1.0 if (feat.fp8_param_gather and feat.precision in ("fp8_cs", "fp8_delayed")) else 2.0
    lora = lora_rank_params(job)
    stages = tuple(prof.stages) if lora is None else _trainable_stages(tuple(prof.stages), lora)
    st, edp, n_dense, rs, ag, buckets = _dp_collectives(stages, job.gpus, job.layout, sysm.nvlink_domain,
                                                        r.nvlink_gbs, r.nic_gbs, grad_b, param_b,
                                                        consts["ddp_bucket_params"])
    if feat.use_megatron_fsdp:
        # Megatron-FSDP (optim_grads_params): params gathered for fwd and bwd and grads reduce-scattered every
        # microbatch, prefetched behind the previous layer's compute
        per_mb = 2 * ag + rs
        dp_exp = m * max(per_mb / buckets, per_mb - per_mb_compute)
        shard = max(n_dense, 1)
    elif feat.use_distributed_optimizer:
        dp_exp = S.dp_exposed(rs, per_mb_compute * 2 / 3, buckets, overlap=feat.overlap_grad_reduce)
        dp_exp += S.dp_exposed(ag, per_mb_compute / 3, buckets, overlap=feat.overlap_param_gather)
        shard = max(n_dense, 1)
    else:
        dp_exp = S.dp_exposed(2 * rs, per_mb_compute * 2 / 3, buckets, overlap=feat.overlap_grad_reduce)
        shard = 1
    # the hidden part still runs NCCL kernels on ``dp_overlap_sms`` SMs that the overlapped compute loses (Bridge
    # keeps NVTE_FWD/BWD_LAYERNORM_SM_MARGIN=16 SMs free for the DP collectives, docs/domain.md section 4.4)
    total = m * (2 * ag + rs) if feat.use_megatron_fsdp else (rs + ag if feat.use_distributed_optimizer else 2 * rs)
    dp_exp += S.sm_contention(max(total - dp_exp, 0.0), consts["dp_overlap_sms"] / sysm.gpu.sm_count)
    opt_params = st.dense_params / shard + st.expert_params / (max(edp, 1) if shard > 1 else 1)
    opt = opt_params * consts["optimizer_bytes_per_param"] / (r.hbm_gbs * 1e9 * r.hbm_eff)
    return dp_exp, opt


@memo(maxsize=4096)
def _trainable_stages(stages: tuple[StageWork, ...], lora: tuple[tuple[float, float], ...]) -> tuple[StageWork, ...]:
    """The stages with their local params replaced by the trainable ones (LoRA adapters,
    :func:`moetune.perfmodel.memory.lora_rank_params`): Megatron-Core DDP puts only ``requires_grad`` parameters in
    its gradient / parameter buffers (``distributed_data_parallel.py``), so the gradient reduce-scatter, the
    parameter all-gather and the optimizer step cover the adapters alone. One object per distinct input (the
    :func:`_dp_collectives` memo compares stages by identity)."""
    return tuple(replace(st, dense_params=d, expert_params=e) for st, (d, e) in zip(stages, lora, strict=True))


@memo(maxsize=16384)
def _dp_collectives(stages: tuple[StageWork, ...], gpus: int, lay: Layout, nvlink_domain: int, nvlink_gbs: float,
                    nic_gbs: float, grad_b: float, param_b: float, bucket_params: float
                    ) -> tuple[StageWork, int, int, float, float, float]:
    """(the rank with the most local params, EDP, dense DP group size DP·CP, gradient reduce-scatter seconds,
    parameter all-gather seconds, DDP buckets) of :func:`_dp_and_optimizer`: ring collectives over the dense and
    expert data-parallel groups (:func:`moetune.perfmodel.comm.ring_seconds`) at ``grad_b`` / ``param_b`` bytes per
    parameter."""
    st = max(stages, key=lambda s: s.dense_params + s.expert_params)
    dp, edp = lay.dp(gpus), lay.edp(gpus)
    n_dense = dp * lay.cp
    bw_dense = C.bus_bandwidth(n_dense, lay.tp, nvlink_domain, nvlink_gbs, nic_gbs)
    bw_exp = C.bus_bandwidth(edp, lay.ep * lay.expert_tp, nvlink_domain, nvlink_gbs, nic_gbs)
    rs = C.ring_seconds(st.dense_params * grad_b, n_dense, bw_dense) + C.ring_seconds(st.expert_params * grad_b,
                                                                                       edp, bw_exp)
    ag = C.ring_seconds(st.dense_params * param_b, n_dense, bw_dense) + C.ring_seconds(st.expert_params * param_b,
                                                                                        edp, bw_exp)
    local = st.dense_params + st.expert_params
    buckets = max(local / bucket_params, 1.0)
    return st, edp, n_dense, rs, ag, buckets


# ------------------------------------------------------------------------------------------------------------
# public API
# ------------------------------------------------------------------------------------------------------------


def resolve_efficiency(efficiency: Efficiency | str | Path | None) -> Efficiency:
    """An Efficiency object, a file written by ``moetune calibrate``, or None: the shipped catalog values (the
    commands pass ``$MOETUNE_EFFICIENCY``, :mod:`moetune.commands.knobs`)."""
    if efficiency is None:
        return default_efficiency()
    if isinstance(efficiency, str | Path):
        return _load_cached(str(efficiency))
    if isinstance(efficiency, Efficiency):
        return efficiency
    return load_efficiency(efficiency)


def _load_cached(path: str) -> Efficiency:
    """:func:`load_efficiency` of a file, read again when its modification time changes."""
    try:
        mtime = Path(path).stat().st_mtime
    except OSError:
        return load_efficiency(path)  # raises the one-line InputError
    return _load_efficiency_at(path, mtime)


@memo(maxsize=64)
def _load_efficiency_at(path: str, mtime: float) -> Efficiency:
    return load_efficiency(path)


def predict_tflops(prof: Profile, eff: Efficiency) -> float:
    """Model TFLOP/s/GPU of a profile (hot path of the fit)."""
    res = evaluate(prof, eff)
    job = prof.job
    tok = job.global_batch_size * job.seq_length / (res.step * job.gpus)
    return tok * prof.flops_per_token / 1e12


def estimate_walls(job: Job, efficiency: Efficiency | str | Path | None = None) -> StepWalls:
    """:func:`evaluate` of ``job``: ``step`` is :func:`estimate_time`'s ``step_time_s`` and ``walls`` its wall
    seconds (same values, plain floats), without the throughput / MFU / assumption fields (the planner prices every
    variant with this and builds the full estimate only for the candidates it reports)."""
    eff = resolve_efficiency(efficiency)
    return evaluate(build_profile(job, eff), eff)


def estimate_time(job: Job, efficiency: Efficiency | str | Path | None = None) -> TimeEstimate:
    """Step time, throughput, MFU and the walls of ``job`` (see module doc)."""
    eff = resolve_efficiency(efficiency)
    prof = build_profile(job, eff)
    res = evaluate(prof, eff)
    step = res.step
    tok = job.global_batch_size * job.seq_length / (step * job.gpus)
    tflops = tok * prof.flops_per_token / 1e12
    gpu = job.system.gpu
    pk = K.peak_key(prof.pcls)
    mfu = {"vs_bf16_peak": tflops / gpu.peak_tflops["bf16"],
           "vs_precision_peak": tflops / gpu.peak_tflops.get(pk, gpu.peak_tflops["bf16"])}
    # plain dicts: validated into Wall objects in the one TimeEstimate validation (same values, one Rust call)
    walls = {k: {"seconds": res.walls[k], "share": res.walls[k] / step if step else 0.0} for k in WALL_ORDER}
    dominant = max(WALL_ORDER, key=lambda k: res.walls[k])
    assumptions = list(prof.assumptions)
    assumptions.append(f"efficiency parameters: {eff.origin}")
    if job.model.is_moe and not job.features.moe_router_force_load_balancing:
        assumptions.append(f"hottest expert rank holds {expert_load(job.features):g}x the mean tokens "
                           "(moe_routing_imbalance; 1 = balanced)")
    return TimeEstimate(
        step_time_s=step, tokens_per_s_per_gpu=tok, model_tflops_per_gpu=tflops, mfu=mfu,
        precision=job.features.precision, walls=walls,
        dominant_wall=dominant, flops_per_token=prof.flops_per_token, num_microbatches=prof.m,
        bottleneck_stage=res.bottleneck, stage_seconds=res.stage_seconds, compute_detail=res.detail,
        assumptions=assumptions, efficiency_source=eff.origin,
        band=band_for(job.model, job.system, step),
    )


# ------------------------------------------------------------------------------------------------------------
# what the planner's queue bound reads (moetune.plan.queue_bound): the pieces of evaluate, same implementations
# ------------------------------------------------------------------------------------------------------------


def job_layer_prices(job: Job, eff: Efficiency) -> tuple[LayerKinds, Rates, dict[tuple, LayerPrice], float]:
    """The layer kinds of ``job`` (:func:`_layer_kinds`, the fields of :func:`build_profile`'s profile that do not
    depend on the stage works), its rates, the price of each of its layer kinds and the SM share of its dispatcher's
    kernels (:func:`_layer_prices`), as :func:`evaluate` reads them; without the stage works of the layout, which
    the planner's group bound does not read (most of its representatives' layouts are never priced)."""
    lay = job.layout
    kinds = _layer_kinds(job, eff, _pipeline_split(job.model, split_fields(lay), job.seq_length, lay.tp),
                         quantised_layers(job.model, job.features))
    r, sm_frac, priced = _layer_prices(kinds, eff)
    return kinds, r, priced, sm_frac


def pipeline_split(model: ModelArch, lay: Layout, seq: int) -> PipelineSplit:
    """The pipeline split :func:`build_profile` prices for a layout (:func:`_pipeline_split`)."""
    return _pipeline_split(model, split_fields(lay), seq, lay.tp)


def rank_kind_counts(model: ModelArch, ids: tuple[int, ...], n_mtp: int, quant_on: bool, bf16_layers: frozenset[int]
                     ) -> dict[tuple, float]:
    """{LayerType.key: count} of one PP rank holding decoder layers ``ids`` and ``n_mtp`` MTP layers, as
    :func:`_stage_works` counts them (:func:`_stage_kinds`)."""
    return _stage_kinds(model, (ids,), (n_mtp,), quant_on, bf16_layers)[0][0][0]


def extra_floor_seconds(model: ModelArch, seq: int, mbs: int, cp: int, tp: int, emb: bool, loss: bool, r: Rates
                        ) -> float:
    """Compute seconds per microbatch of a rank's embedding / output-layer work as :func:`evaluate` adds them to the
    stage: 3 x (gemm + attention + memory-bound) of :func:`_price_extra` of :func:`_extra_work`."""
    g, a, e = _price_extra(_extra_work(model, seq, mbs, cp, tp, emb, loss), r)
    return 3 * (g + a + e)

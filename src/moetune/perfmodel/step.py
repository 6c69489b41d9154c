"""Step time, throughput and the walls: ``estimate_time(job) -> TimeEstimate``.

Two phases keep the planner fast:

1. :func:`build_profile` turns a :class:`~moetune.spec.job.Job` into per-stage *work* (GEMM shapes and FLOPs,
   attention FLOPs, memory-bound bytes, collective bytes, kernel launches) — no efficiency parameters involved.
   Per-layer work is cached per (model, layer type, batch shape, layout, precision).
2. :func:`evaluate` prices the work with an :class:`~moetune.perfmodel.calibration.Efficiency` set (numpy), applies
   the schedule (:mod:`moetune.perfmodel.schedule`) and returns seconds per wall.

Per-microbatch stage time S = compute (fwd + 2× fwd for backward) + recompute + exposed TP/CP/EP communication +
exposed host time; step = (m + (p−1)/v)·S_max + exposed PP + exposed DP + optimizer step.
Model TFLOP/s/GPU uses the Megatron-Bridge FLOPs definition (:func:`moetune.perfmodel.flops.flops_per_token`,
docs/bridge_perf_notes.md §1): ``tokens/s/GPU × FLOPs/token``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from moetune.perfmodel import comm as C
from moetune.perfmodel import compute as K
from moetune.perfmodel import host as H
from moetune.perfmodel import schedule as S
from moetune.perfmodel.calibration import Efficiency, default_efficiency, load_efficiency
from moetune.perfmodel.memory import state_bytes
from moetune.perfmodel.uncertainty import Band, band_for
from moetune.spec.job import Job
from moetune.spec.model import ModelArch

WALL_ORDER = ("compute", "recompute", "comm_tp", "comm_cp", "comm_ep", "comm_pp", "comm_dp", "pipeline_bubble",
              "host", "optimizer")
WALL_LABEL = {
    "compute": "compute", "recompute": "recompute", "comm_tp": "TP/SP comm", "comm_cp": "CP comm",
    "comm_ep": "EP dispatch/combine", "comm_pp": "PP send/recv", "comm_dp": "DP grad/param comm",
    "pipeline_bubble": "pipeline bubble", "host": "host/launch", "optimizer": "optimizer step",
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


@dataclass
class LayerType:
    """Work of one decoder layer kind (fwd, one microbatch, one GPU)."""

    key: tuple
    work: dict[str, np.ndarray]
    tp_bytes: float  # sum of full-tensor sizes of the forward AG/RS collectives
    cp_bytes: float
    a2a_intra: float  # per A2A (dispatch or combine), bytes sent by one rank
    a2a_inter: float
    is_moe: bool
    launches: H.LayerLaunches


@dataclass
class StageWork:
    layer_counts: dict[tuple, float] = field(default_factory=dict)
    extra: dict[str, np.ndarray] | None = None  # embedding / logits / loss work
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


_FLOPS_CACHE: dict[tuple, Any] = {}


def _flops_api():
    from moetune.perfmodel import flops as F  # helper A's module: one implementation of the FLOPs formulas

    return F


def _model_key(model: ModelArch) -> tuple:
    return (id(model), model.name)


def _layer_flops(model: ModelArch, i: int, seq: int) -> dict[str, float]:
    key = (_model_key(model), "layer", i, seq)
    v = _FLOPS_CACHE.get(key)
    if v is None:
        v = dict(_flops_api().layer_flops(model, i, seq))
        _FLOPS_CACHE[key] = (model, v)
        return v
    return v[1]


def _total_flops(model: ModelArch, seq: int, tp: int = 1) -> float:
    key = (_model_key(model), "total", seq, tp)
    v = _FLOPS_CACHE.get(key)
    if v is None:
        fb = _flops_api().flops_per_token(model, seq, tp)
        total = float(getattr(fb, "total", fb))
        _FLOPS_CACHE[key] = (model, total)
        return total
    return v[1]


def _classify(name: str) -> str:
    """Map a component key of ``layer_flops`` to a work kind of this module."""
    n = name.lower()
    if "core" in n or "sdpa" in n or ("attention" in n and ("score" in n or "context" in n)):
        return "core_attn"
    if "router" in n or "gate" == n:
        return "router"
    if "shared" in n:
        return "shared"
    if "expert" in n or "routed" in n or n == "moe":
        return "experts"
    if "mamba" in n or "ssm" in n or "deltanet" in n or "gdn" in n or "mixer" in n or "linear_attn" in n:
        return "mixer"
    if "mlp" in n or "ffn" in n or "dense" in n:
        return "mlp"
    if "attn" in n or "attention" in n or "qkv" in n or "proj" in n or "mla" in n:
        return "attn_proj"
    if "logit" in n or "output" in n or "lm_head" in n:
        return "logits"
    return "other"


def _expert_load(feat, num_experts: float, topk: float) -> float:
    """Tokens on the hottest expert rank relative to the mean: the capacity factor when inputs are padded to
    capacity (drop-and-pad), else the routing imbalance (1 under force-balancing); dropless runs wait for the
    hottest rank (docs/domain.md §3.2-3.3)."""
    if feat.moe_expert_capacity_factor is not None and feat.moe_pad_expert_input_to_capacity:
        return float(feat.moe_expert_capacity_factor)
    if feat.moe_router_force_load_balancing:
        return 1.0
    load = float(feat.moe_routing_imbalance)
    if feat.moe_expert_capacity_factor is not None:
        load = min(load, float(feat.moe_expert_capacity_factor))
    return load


def _mla_up_fraction(model: ModelArch) -> float:
    """Share of MLA projection FLOPs in the up-projections (shape split for ``mla_up_proj`` recompute)."""
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


def _layer_type(job: Job, i: int, quant: bool, consts: dict) -> LayerType:
    model, lay, feat = job.model, job.layout, job.features
    mixer, mlp = model.mixer_pattern[i], model.mlp_pattern[i]
    s, b = job.seq_length, job.micro_batch_size
    tp, cp, ep, etp = lay.tp, lay.cp, lay.ep, lay.expert_tp
    h = model.hidden_size
    t_a = s * b / cp  # tokens per attention (TP) group on this rank's CP shard
    t_gpu = t_a / tp  # SP-sharded tokens per GPU
    comps = _layer_flops(model, i, s)
    wl = K.WorkList()
    qb = K.QUANT_BYTES.get(feat.precision, 2.0)
    k_top = float(model.moe_router_topk or 1)
    E = float(model.num_moe_experts or 1)
    up_frac = _mla_up_fraction(model) if mixer in ("A", "W") else 0.0
    # TE userbuffers TP overlap (ring exchange) runs each TP-sharded GEMM as TP chunks of t_a/TP rows
    m_tp = t_a / tp if (feat.tp_comm_overlap and feat.sequence_parallel and tp > 1) else t_a
    cast_elems = 0.0
    n_quant = 0
    for name, f in comps.items():
        if f <= 0:
            continue
        kind = _classify(name)
        if kind == "core_attn":
            wl.attn(t_a * f / tp, layer=i)
        elif kind == "attn_proj":
            n_eff = f / (2 * h) / tp
            if up_frac > 0:
                wl.gemm(t_a * f / tp * up_frac, m_tp, n_eff, h, quant=quant, tag="mla_up", layer=i)
                wl.gemm(t_a * f / tp * (1 - up_frac), m_tp, n_eff, h, quant=quant, tag="attn_proj", layer=i)
            else:
                wl.gemm(t_a * f / tp, m_tp, n_eff, h, quant=quant, tag="attn_proj", layer=i)
            cast_elems += 2 * h
            n_quant += 2
        elif kind == "mlp":
            wl.gemm(t_a * f / tp, m_tp, f / (2 * h) / tp, h, quant=quant, tag="mlp", layer=i)
            cast_elems += h  # FC2's input is quantised inside the fused activation kernel (TE act + cast)
            n_quant += 2
        elif kind == "mixer":
            wl.gemm(t_a * f / tp, m_tp, f / (2 * h) / tp, h, quant=quant, tag="mixer", layer=i)
            cast_elems += 2 * h
            n_quant += 2
        elif kind == "experts":
            load = _expert_load(feat, E, k_top)
            m_exp = t_gpu * k_top * ep * etp / E * load
            groups = max(E / ep, 1.0)
            d_in = float(model.moe_latent_size or h)  # latent MoE runs its experts at the latent width
            n_exp = f / (2 * d_in * k_top) / etp
            wl.gemm(t_gpu * f * load, m_exp, n_exp, d_in, groups=groups, quant=quant, tag="experts", layer=i)
            # FC1's input: after the dispatcher's all-gather over the expert-TP group every ETP rank holds ETP x
            # the tokens at the full input width (Megatron-Core ``MoEAlltoAllTokenDispatcher``: gather over tp_ep)
            cast_elems += k_top * d_in * etp
            n_quant += 2
        elif kind == "shared":
            wl.gemm(t_a * f / tp, m_tp, f / (2 * h) / tp, h, quant=quant, tag="shared", layer=i)
            cast_elems += h
            n_quant += 2
        elif kind == "router":
            wl.gemm(t_gpu * f, t_gpu, E, h, quant=False, tag="router", layer=i)
        else:
            wl.gemm(t_a * f / tp, t_a, max(f / (2 * h) / tp, 1.0), h, quant=False, tag="other", layer=i)
    # memory-bound kernels (forward bytes on this GPU)
    hd = model.head_dim
    if mixer != "_":
        wl.mem(t_gpu * (K.norm_bytes(h) + K.residual_bytes(h)), tag="norm", layer=i)
    if mixer in ("A", "W"):
        qk = (model.num_attention_heads + model.query_groups) * hd
        wl.mem(t_a * K.rope_bytes(qk) / tp, tag="attn_proj", layer=i)
        if cp > 1 and feat.cp_comm_type == "p2p":
            v_dim = float(model.v_head_dim or hd) if model.multi_latent_attention else float(hd)
            wl.mem(t_a * K.cp_correction_bytes(cp, model.num_attention_heads / tp * v_dim), tag="core_attn", layer=i)
        if feat.attention_backend == "unfused":
            # Megatron's unfused DotProductAttention materialises the scores: causal context ~ core FLOPs / (4·q)
            ctx = comps.get("core_attention", 0.0) / (4.0 * model.num_attention_heads * hd) * 2
            wl.mem(t_a * K.unfused_attention_bytes(model.num_attention_heads / tp, ctx), tag="core_attn", layer=i,
                   stream=True)
    if mixer == "M":
        heads = float(model.mamba_num_heads or (2 * h) // (model.mamba_head_dim or 64))
        pdim = float(model.mamba_head_dim or 64)
        wl.mem(t_a / tp * K.mamba_bytes(heads * pdim, float(model.mamba_num_groups or 1),
                                        float(model.mamba_state_dim or 128), heads, pdim), tag="mixer", layer=i)
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
    # communication
    n_tp = C.tp_collectives_per_layer(mixer, mlp, etp, tp)
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
        intra, inter = C.a2a_bytes(t_gpu, float(model.moe_latent_size or h), k_top, ep, etp, job.system.nvlink_domain,
                                   feat.moe_token_dispatcher_type, feat.moe_flex_dispatcher_backend)
        load = _expert_load(feat, E, k_top)  # the hottest expert rank receives (and returns) load x the mean
        intra, inter = intra * load, inter * load
    scopes = frozenset(feat.cuda_graph_scope)
    graphs_on = feat.cuda_graph_impl != "none" and bool(scopes)
    dropless = feat.moe_expert_capacity_factor is None
    launches = H.layer_launches(mixer, mlp, mla=model.multi_latent_attention, quant_gemms=n_quant if quant else 0,
                                scopes=scopes, graphs_on=graphs_on, dropless=dropless, ep=ep,
                                kernels=consts["kernels_per_layer"],
                                shared=bool(model.moe_shared_expert_intermediate_size),
                                tp_overlap_tp=tp if (feat.tp_comm_overlap and feat.sequence_parallel) else 1,
                                local_experts=E / max(ep, 1), grouped_gemm=feat.moe_grouped_gemm,
                                permute_fusion=feat.moe_permute_fusion,
                                unfused_attention=feat.attention_backend == "unfused")
    return LayerType((mixer, mlp, quant), wl.arrays(), tp_bytes, cp_b, intra, inter, mlp == "E", launches)


_TYPE_CACHE: dict[tuple, tuple[Any, LayerType]] = {}


def _layer_type_key_rest(job: Job, consts: dict) -> tuple:
    """The part of :func:`_cached_layer_type`'s key that does not depend on the layer (same for a whole job)."""
    lay, feat = job.layout, job.features
    return (job.seq_length,
            job.micro_batch_size, lay.tp, lay.cp, lay.ep, lay.expert_tp, job.system.nvlink_domain, feat.precision,
            feat.moe_token_dispatcher_type, feat.moe_flex_dispatcher_backend, feat.sequence_parallel,
            feat.cp_comm_type, feat.cuda_graph_impl, feat.cuda_graph_scope, feat.moe_expert_capacity_factor,
            feat.tp_comm_overlap, feat.attention_backend, feat.moe_router_force_load_balancing,
            feat.moe_routing_imbalance, feat.moe_pad_expert_input_to_capacity, feat.moe_grouped_gemm,
            feat.moe_permute_fusion, feat.transformer_impl, id(consts))


def _cached_layer_type(job: Job, i: int, quant: bool, consts: dict, rest: tuple | None = None) -> LayerType:
    if rest is None:
        rest = _layer_type_key_rest(job, consts)
    key = (_model_key(job.model), job.model.mixer_pattern[i], job.model.mlp_pattern[i], quant, *rest)
    hit = _TYPE_CACHE.get(key)
    if hit is not None:
        return hit[1]
    # layers of one kind share their work only if their FLOPs match; key on the first index of the kind
    lt = _layer_type(job, i, quant, consts)
    if len(_TYPE_CACHE) > 20000:
        _TYPE_CACHE.clear()
    _TYPE_CACHE[key] = (job.model, lt)
    return lt


def _stages(job: Job, notes: list[str]) -> tuple[list[list[int]], list[bool], list[bool], list[int], int]:
    """(decoder layer ids per PP rank, embedding flags, loss flags, MTP layers per rank, vpp).

    Uses :func:`moetune.spec.pipeline.pipeline_stages`. When the layout gives no valid split (e.g. 61 layers on
    PP16 without a layout string, as published rows that rely on a recipe's ``pipeline_model_parallel_layout``),
    layers are spread as evenly as possible over the PP·VPP stages and the assumption is listed.
    """
    from moetune.errors import LayoutError
    from moetune.perfmodel.memory import _stages as pipeline_stages  # memoised pipeline_stages, shared with memory

    key = (_model_key(job.model), "stages", job.layout)
    hit = _SUMMARY_CACHE.get(key)
    if hit is not None:
        notes.extend(hit[1][1])
        return hit[1][0]
    before = len(notes)
    out = _stages_uncached(job, notes, pipeline_stages, LayoutError)
    _SUMMARY_CACHE[key] = (job.model, (out, notes[before:]))
    return out


def _stages_uncached(job: Job, notes: list[str], pipeline_stages, LayoutError):
    try:
        ranks = pipeline_stages(job.model, job.layout)
    except LayoutError as exc:
        pp, v = job.layout.pp, job.layout.vpp_size
        n_st = pp * v
        model = job.model
        nl = model.num_layers
        n_mtp = model.mtp_num_layers
        # balance forward FLOPs over the stages: decoder layers, MTP layers (copies of the last layer) and the
        # output layer + loss on the last stage, as hand-written Bridge layouts do for such models
        fwd = _fwd_layer_flops(model, job.seq_length)
        total = _total_flops(model, job.seq_length, job.layout.tp)
        loss_w = max(total / 3.0 - sum(fwd) - n_mtp * fwd[-1], 0.0)
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
        notes.append(f"pipeline split: {str(exc)[:90]} -> layers split over {n_st} stages by forward FLOPs")
        return ids, [p == 0 for p in range(pp)], [p == pp - 1 for p in range(pp)], mtp, v
    v = len(ranks[0].chunks) if ranks else 1
    return ([list(r.layers) for r in ranks], [r.embedding for r in ranks], [r.loss for r in ranks],
            [r.mtp_layers for r in ranks], v)


def _param_split(model: ModelArch, i: int) -> tuple[float, float]:
    """(dense-mesh params, expert params) of decoder layer i (moetune.perfmodel.params)."""
    from moetune.perfmodel.params import layer_params

    lp = layer_params(model, i)
    expert = float(lp.routed_experts)
    return float(lp.total) - expert, expert


_SUMMARY_CACHE: dict[tuple, Any] = {}


def _fwd_layer_flops(model: ModelArch, seq: int) -> list[float]:
    """Model (Bridge) forward FLOPs per token of each decoder layer; the router GEMM is informational in
    ``layer_flops`` and not part of Bridge's total."""
    key = (_model_key(model), "fwd_layers", seq)
    hit = _SUMMARY_CACHE.get(key)
    if hit is None:
        hit = (model, [sum(v for k, v in _layer_flops(model, i, seq).items() if k != "router")
                       for i in range(model.num_layers)])
        _SUMMARY_CACHE[key] = hit
    return hit[1]


def _stage_summary(model: ModelArch, ids: tuple[int, ...], n_mtp: int, quant_on: bool, bf16: frozenset[int]
                   ) -> tuple[dict[tuple[int, bool], float], float, float]:
    """Layer kinds of a stage as {(first layer index of the kind, quantised): count} and its (dense, expert) params;
    MTP layers count as copies of the last decoder layer."""
    key = (_model_key(model), "stage", ids, n_mtp, quant_on, bf16)
    hit = _SUMMARY_CACHE.get(key)
    if hit is not None:
        return hit[1]
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
    if len(_SUMMARY_CACHE) > 200000:
        _SUMMARY_CACHE.clear()
    _SUMMARY_CACHE[key] = (model, (kinds, dense, exp))
    return kinds, dense, exp


def _stage_works(job: Job, consts: dict, layers_per_rank: list[list[int]], emb: list[bool], loss: list[bool],
                 mtp: list[int], quant_on: bool, bf16_layers: frozenset[int]) -> tuple[list[StageWork], list[tuple]]:
    """Per-PP-rank work of :func:`build_profile` that no feature changes (layer kinds and counts, embedding / logits /
    loss work, local params), and the (first layer index, quantised) of each layer kind in first-seen order.

    Memoised on everything it reads (model, layout, sequence, microbatch, quantised layers, kernel constants): the
    planner prices many feature variants of one layout. The returned StageWork objects are shared and read only."""
    model, lay = job.model, job.layout
    key = (_model_key(model), "stage_works", lay, job.seq_length, job.micro_batch_size, quant_on, bf16_layers,
           id(consts))
    hit = _SUMMARY_CACHE.get(key)
    if hit is not None and hit[1][2] is consts:
        return hit[1][0], hit[1][1]
    seq = job.seq_length
    total = _total_flops(model, seq, lay.tp)
    # model FLOPs per layer (the router GEMM is informational in layer_flops, not part of Bridge's total)
    fwd_layers = _fwd_layer_flops(model, seq)
    n_mtp = model.mtp_num_layers
    rest_fwd = max(total / 3.0 - sum(fwd_layers) - n_mtp * fwd_layers[-1], 0.0)  # logits (+ MTP projections)
    h = model.hidden_size
    t_a = seq * job.micro_batch_size / lay.cp
    tp = lay.tp
    vpad = model.padded_vocab_size(tp)
    stages: list[StageWork] = []
    same: dict[tuple, StageWork] = {}
    ranks, first = _stage_kinds(model, layers_per_rank, mtp, quant_on, bf16_layers)
    for p, (counts, n_layers, dense_p, exp_p) in enumerate(ranks):
        st = StageWork()
        st.layer_counts = dict(counts)
        st.layers = n_layers
        kern = 0.0
        if emb[p]:
            kern += consts["kernels_per_layer"]["embedding_loss"] / 2
            dense_p += vpad * h
        if loss[p]:
            kern += consts["kernels_per_layer"]["embedding_loss"] / 2
            if model.untie_embeddings_and_output_weights or lay.pp > 1:
                dense_p += vpad * h
        # one arrays object per value across layouts (it depends on the batch shape, TP and the edge flags only),
        # so evaluate's price memo (_price_extra, keyed on the object) is shared by every layout
        xkey = (_model_key(model), "extra", seq, job.micro_batch_size, lay.cp, tp, emb[p], loss[p], id(consts))
        xhit = _SUMMARY_CACHE.get(xkey)
        if xhit is None or xhit[1][1] is not consts:
            wl = K.WorkList()
            if emb[p]:
                wl.mem(t_a / tp * h * K.BF16_BYTES * 2, tag="other", layer=-1)
            if loss[p]:
                share = (1 + n_mtp) if n_mtp else 1
                f = rest_fwd
                wl.gemm(t_a * f / tp, t_a, max(f / (2 * h) / tp / share, 1.0), h, quant=False, tag="logits",
                        layer=-1)
                # logits written in BF16, fused cross-entropy reads them and writes FP32 grads
                wl.mem(t_a * share * vpad / tp * (2 * K.BF16_BYTES + 4.0), tag="logits", layer=-1)
            xhit = _SUMMARY_CACHE[xkey] = (model, (wl.arrays(), consts))
        st.extra = xhit[1][0]
        st.extra_kernels = kern
        st.dense_params = dense_p / tp
        st.expert_params = exp_p / (lay.ep * lay.expert_tp)
        # ranks with the same content share one object (evaluate prices each distinct object once)
        sig = (tuple(st.layer_counts.items()), emb[p], loss[p], st.layers, kern, st.dense_params, st.expert_params)
        stages.append(same.setdefault(sig, st))
    if len(_SUMMARY_CACHE) > 200000:
        _SUMMARY_CACHE.clear()
    _SUMMARY_CACHE[key] = (model, (stages, first, consts))
    return stages, first


def _stage_kinds(model: ModelArch, layers_per_rank: list[list[int]], mtp: list[int], quant_on: bool,
                 bf16_layers: frozenset[int]) -> tuple[list[tuple[dict, int, float, float]], list[tuple[int, bool]]]:
    """Per PP rank: ({LayerType.key: count}, layers, dense params, expert params) before TP/EP sharding and the edge
    (embedding / output) params, plus the (first layer index, quantised) of each layer kind in first-seen order.
    Depends on the layer split only (not on TP, CP, EP or the batch): memoised for every layout with that split."""
    split = tuple(tuple(ids) for ids in layers_per_rank)
    key = (_model_key(model), "stage_kinds", split, tuple(mtp), quant_on, bf16_layers)
    hit = _SUMMARY_CACHE.get(key)
    if hit is not None:
        return hit[1]
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
    out = (ranks, list(first.values()))
    if len(_SUMMARY_CACHE) > 200000:
        _SUMMARY_CACHE.clear()
    _SUMMARY_CACHE[key] = (model, out)
    return out


def build_profile(job: Job, eff: Efficiency | None = None) -> Profile:
    """Work of every pipeline stage of ``job`` for one microbatch (see module doc)."""
    eff = eff or default_efficiency()
    consts = eff.constants
    model, lay, feat = job.model, job.layout, job.features
    assumptions: list[str] = [*job.assumptions, *job.model.approximations]
    layers_per_rank, emb, loss, mtp, v = _stages(job, assumptions)
    nl = model.num_layers
    quant_on = feat.precision not in ("bf16", "fp16")
    bf16_layers: set[int] = set()
    if quant_on and feat.first_last_layers_bf16:
        bf16_layers = {0, nl - 1}
    seq = job.seq_length
    total = _total_flops(model, seq, lay.tp)
    key_rest = _layer_type_key_rest(job, consts)
    stages, first_kinds = _stage_works(job, consts, layers_per_rank, emb, loss, mtp, quant_on, frozenset(bf16_layers))
    types: dict[tuple, LayerType] = {}
    for i, quant in first_kinds:
        lt = _cached_layer_type(job, i, quant, consts, key_rest)
        types[lt.key] = lt
    # recompute selection
    rf: dict[int, float] = {}
    rec_a2a = 0.0
    full_frac = 0.0
    if feat.recompute_granularity == "full":
        n_rec = feat.recompute_num_layers
        per_chunk = max(len(layers_per_rank[0]) / max(v, 1), 1.0)
        if feat.recompute_method == "block" and n_rec is not None:
            full_frac = min(1.0, n_rec / per_chunk)
        else:
            full_frac = 1.0
    elif feat.recompute_granularity == "selective" or feat.recompute_modules:
        mods = feat.recompute_modules or ("core_attn",)
        if not feat.recompute_modules:
            assumptions.append("recompute_modules unset with selective granularity: MCore default [core_attn]")
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
    # PP send/recv of one microbatch's activations at a stage boundary
    t_a, tp, h = seq * job.micro_batch_size / lay.cp, lay.tp, model.hidden_size
    pp_bytes = t_a / (tp if feat.sequence_parallel else 1) * h * C.BF16
    pp_cross = lay.pp > 1 and (job.gpus // lay.pp) >= job.system.nvlink_domain
    m = max(job.num_microbatches, 1)
    pcls = K.precision_class(feat.precision, job.system.gpu.arch)
    return Profile(job, types, stages, m, lay.pp, v, total, rf, rec_a2a, full_frac, assumptions, pp_bytes, pp_cross,
                   K.QUANT_BYTES.get(feat.precision, 2.0), pcls)


# ------------------------------------------------------------------------------------------------------------
# evaluation (efficiency → seconds)
# ------------------------------------------------------------------------------------------------------------


def _price(work: dict[str, np.ndarray], r: dict[str, float], rf: dict[int, float], full_frac: float
           ) -> tuple[float, float, float, float, float, float]:
    """(a third of the fwd + bwd gemm s, fwd attn s, fwd mem s, recompute fwd s, a third of the fwd + bwd gemm s of
    TP-sharded kinds, of MoE experts). GEMMs are priced per pass (forward, dgrad, wgrad with the main-gradient
    accumulation, :func:`compute.gemm_pass_seconds`), the rest by the 3x-forward convention of the callers."""
    gf = work["g_flops"]
    if gf.size:
        kw = dict(peak_quant_tflops=r["peak_q"], eff_quant=r["eff_q"], peak_bf16_tflops=r["peak_b"],
                  eff_bf16=r["eff_b"], knee=r["knee"], hbm_gbs=r["hbm"], hbm_eff=r["hbm_eff"], quant_bytes=r["qb"])
        args = (gf, work["g_m"], work["g_n"], work["g_k"], work["g_groups"], work["g_quant"])
        tg, tb = K.gemm_pass_seconds(*args, **kw, grad_accum_bytes=r["acc"])
        tfb = (tg + tb) / 3.0
    else:
        tg = tfb = gf
    ta = K.attention_seconds(work["a_flops"], peak_bf16_tflops=r["peak_b"], eff=r["attn_eff"])
    te = K.memory_seconds(work["e_bytes"], hbm_gbs=r["hbm"], hbm_eff=r["hbm_eff"], stream=work.get("e_stream"),
                          stream_eff=r["hbm_stream_eff"])
    g, a, e = float(tg.sum()), float(ta.sum()), float(te.sum())
    g_fb = float(tfb.sum())
    rec = 0.0
    if full_frac > 0:
        rec = full_frac * (g + a + e)
    elif rf:
        for tag, frac in rf.items():
            if tg.size:
                rec += frac * float(tg[work["g_tag"] == tag].sum())
            if ta.size:
                rec += frac * float(ta[work["a_tag"] == tag].sum())
            if te.size:
                rec += frac * float(te[work["e_tag"] == tag].sum())
    tp_kinds = float(tfb[work["g_tag"] != K.TAG["experts"]].sum()) if tg.size else 0.0
    exp = float(tfb[work["g_tag"] == K.TAG["experts"]].sum()) if tg.size else 0.0
    return g_fb, a, e, rec, tp_kinds, exp


def _rates(job: Job, eff: Efficiency, pcls: str, qb: float) -> dict[str, float]:
    gpu = job.system.gpu
    arch = gpu.arch if gpu.arch != "ampere" else "hopper"
    # Blackwell Ultra (B300/GB300) doubles the SFU exponential rate that bounds softmax in attention
    attn_cls = "blackwell_ultra" if (arch == "blackwell" and "B300" in gpu.name.upper()) else arch
    peak_b = gpu.peak_tflops["bf16"]
    pk = K.peak_key(pcls)
    peak_q = gpu.peak_tflops.get(pk, gpu.peak_tflops.get("fp8", peak_b)) if pcls != "bf16" else peak_b
    eff_b = eff.get(f"gemm_eff.{arch}.bf16", 0.7)
    eff_q = eff.get(f"gemm_eff.{arch}.{pcls}", eff.get(f"gemm_eff.{arch}.fp8", eff_b)) if pcls != "bf16" else eff_b
    if attn_cls == "blackwell_ultra":
        scale = eff.get("clock_scale.blackwell_ultra", 1.0)
        eff_b, eff_q = eff_b * scale, eff_q * scale
    cpu = H.host_cpu_family(job.system.host_cpu)
    lay, feat = job.layout, job.features
    nic_a2a, a2a_lat = C.a2a_network(
        lay.ep, lay.expert_tp, job.system.nvlink_domain, feat.moe_token_dispatcher_type,
        feat.moe_flex_dispatcher_backend, job.system.scaleout_bw_gbs, scaleout_eff=eff["scaleout_eff"],
        falloff=eff.get("scaleout_a2a_falloff", 0.0), deepep_rdma_eff=eff.get("deepep_rdma_eff", eff["scaleout_eff"]),
        latency_us=eff.constants.get("a2a_latency_us", {}))
    return {
        "nic_a2a": nic_a2a, "a2a_lat": a2a_lat,
        "peak_b": peak_b, "peak_q": peak_q, "eff_b": eff_b, "eff_q": eff_q, "knee": eff["gemm_knee"],
        "hbm": gpu.hbm_bw_gbs, "hbm_eff": eff["hbm_eff"], "hbm_stream_eff": eff.get("hbm_stream_eff", eff["hbm_eff"]),
        "attn_eff": eff.get(f"attn_eff.{attn_cls}", eff.get(f"attn_eff.{arch}", 0.45)),
        "nv": job.system.nvlink_bw_gbs * eff["nvlink_eff"], "nic": job.system.scaleout_bw_gbs * eff["scaleout_eff"],
        "nv_a2a": job.system.nvlink_bw_gbs * eff.get("nvlink_a2a_eff", eff["nvlink_eff"]),
        "launch_us": eff.get(f"launch_us.{cpu}", 6.0), "qb": qb, "ep_eff": eff["ep_overlap_eff"],
        # main-gradient accumulation in the wgrad epilogue: read + write one element per weight per microbatch
        "acc": 2 * state_bytes(job).grad,
        "host_p": eff.get("host_queue_sharpness", 4.0),
    }


#: per-layer-type prices, keyed on (id of the LayerType, every other input of the pricing); values are read only
_PRICED_CACHE: dict[tuple, tuple[Any, dict[str, float]]] = {}


#: embedding / logits / loss work prices, keyed on (id of the work arrays, the rates); values are read only
_EXTRA_CACHE: dict[tuple, tuple[Any, tuple[float, float, float]]] = {}


def _price_extra(work: dict[str, np.ndarray], r: dict[str, float], rkey: tuple) -> tuple[float, float, float]:
    """(fwd gemm s, fwd attn s, fwd mem s) of a stage's non-layer work (:func:`_price`, memoised)."""
    hit = _EXTRA_CACHE.get((id(work), rkey))
    if hit is not None and hit[0] is work:
        return hit[1]
    g, a, e, _, _, _ = _price(work, r, {}, 0.0)
    if len(_EXTRA_CACHE) > 50000:
        _EXTRA_CACHE.clear()
    _EXTRA_CACHE[(id(work), rkey)] = (work, (g, a, e))  # holds the work, so its id is not reused while cached
    return g, a, e


def evaluate(prof: Profile, eff: Efficiency) -> dict[str, Any]:
    """Seconds per wall for a profile (see module doc); plain dict, no pydantic (hot path of the fit/planner)."""
    job = prof.job
    lay, feat, sysm = job.layout, job.features, job.system
    consts = eff.constants
    r = _rates(job, eff, prof.pcls, prof.quant_bytes)
    m = prof.m
    # per layer type: price once
    priced: dict[tuple, dict[str, float]] = {}
    tp_busbw = C.bus_bandwidth(lay.tp, 1, sysm.nvlink_domain, r["nv"], r["nic"])
    cp_busbw = C.bus_bandwidth(lay.cp, lay.tp, sysm.nvlink_domain, r["nv"], r["nic"])
    n_sms = 0
    if feat.moe_token_dispatcher_type == "flex":
        n_sms = feat.moe_flex_dispatcher_num_sms or (consts["deepep_sms"] if feat.moe_flex_dispatcher_backend
                                                     == "deepep" else consts["hybridep_sms"])
    sm_frac = n_sms / job.system.gpu.sm_count
    splits = consts["tp_overlap_splits"]
    tp_overlap = feat.tp_comm_overlap and lay.tp > 1 and feat.sequence_parallel
    tp_sms = consts["tp_overlap_sms"]
    graph_launch_us, host_sync_us = consts["graph_launch_us"], consts["host_sync_us"]
    sm_count = job.system.gpu.sm_count
    # everything the per-type pricing below reads besides the layer type itself (memo key, exact values)
    rkey = tuple(r.values())
    pkey = (rkey, tuple(prof.recompute_frac.items()), prof.full_recompute_frac, prof.recompute_a2a,
            lay.tp, lay.cp, tp_busbw, cp_busbw, tp_overlap, splits, tp_sms, sm_count, feat.cp_comm_type,
            graph_launch_us, host_sync_us)
    for key, lt in prof.types.items():
        hit = _PRICED_CACHE.get((id(lt), pkey))
        if hit is not None and hit[0] is lt:
            priced[key] = hit[1]
            continue
        g, a, e, rec, g_tp, g_exp = _price(lt.work, r, prof.recompute_frac, prof.full_recompute_frac)
        comp = 3 * (g + a + e)  # fwd + bwd (dgrad + wgrad ≈ 2× fwd; attention bwd counted as 2× fwd FLOPs)
        tp_comm = 2 * C.ring_seconds(lt.tp_bytes, lay.tp, tp_busbw) if lay.tp > 1 else 0.0
        tp_exp = S.tp_exposed(tp_comm, 3 * g_tp, overlap=tp_overlap, splits=splits,
                              sm_frac=consts["tp_overlap_sms"] / job.system.gpu.sm_count)
        cp_comm = 2 * lt.cp_bytes / (cp_busbw * 1e9) if lay.cp > 1 else 0.0
        cp_exp = S.cp_exposed(cp_comm, 3 * a, cp_comm_type=feat.cp_comm_type)
        a2a_one = (C.a2a_seconds(lt.a2a_intra, lt.a2a_inter, r["nv_a2a"], r["nic_a2a"], r["a2a_lat"]) if lt.is_moe
                   else 0.0)
        rec_a2a = prof.recompute_a2a * a2a_one
        if prof.full_recompute_frac > 0 and lt.is_moe:
            rec_a2a = 2 * a2a_one * prof.full_recompute_frac
        a2a = 4 * a2a_one
        priced[key] = {"comp": comp, "gemm": 3 * g, "attn": 3 * a, "mem": 3 * e, "rec": rec + rec_a2a,
                       "tp": tp_exp, "cp": cp_exp, "a2a": a2a, "exp": 3 * g_exp,
                       "host": H.host_seconds(lt.launches, launch_us=r["launch_us"],
                                              graph_launch_us=consts["graph_launch_us"],
                                              native_us=consts.get("native_launch_us", 0.0)),
                       "sync": lt.launches.syncs * consts["host_sync_us"] * 1e-6}
        if len(_PRICED_CACHE) > 50000:
            _PRICED_CACHE.clear()
        _PRICED_CACHE[(id(lt), pkey)] = (lt, priced[key])  # holds lt, so its id is not reused while cached
    stage_walls: list[dict[str, float]] = []
    ep_overlap = feat.overlap_moe_expert_parallel_comm and lay.ep > 1
    done: dict[int, dict[str, float]] = {}  # stages shared by object (identical work) are priced once
    for st in prof.stages:
        w = done.get(id(st))
        if w is not None:
            stage_walls.append(w)
            continue
        w = {"compute": 0.0, "recompute": 0.0, "comm_tp": 0.0, "comm_cp": 0.0, "comm_ep": 0.0, "host": 0.0,
             "gemm": 0.0, "attn": 0.0, "mem": 0.0}
        a2a_tot = 0.0
        exp_tot = 0.0
        host_gap = 0.0
        for key, n in st.layer_counts.items():
            q = priced[key]
            w["compute"] += n * q["comp"]
            w["gemm"] += n * q["gemm"]
            w["attn"] += n * q["attn"]
            w["mem"] += n * q["mem"]
            w["recompute"] += n * q["rec"]
            w["comm_tp"] += n * q["tp"]
            w["comm_cp"] += n * q["cp"]
            a2a_tot += n * q["a2a"]
            exp_tot += n * q["exp"]
            gpu_t = q["comp"] + q["tp"] + q["cp"] + q["rec"] + (0.0 if ep_overlap else q["a2a"])
            host_gap += n * (H.host_exposed(q["host"], gpu_t, r["host_p"]) + (0.0 if ep_overlap else q["sync"]))
        if st.extra is not None:
            g, a, e = _price_extra(st.extra, r, rkey)
            w["compute"] += 3 * (g + a + e)
            w["gemm"] += 3 * g
            w["mem"] += 3 * e
            host_gap += H.host_exposed(st.extra_kernels * r["launch_us"] * 1e-6, 3 * (g + a + e), r["host_p"])
        # EP dispatch/combine: hidden behind the partner microbatch's compute under EP overlap
        partner = w["compute"]
        if feat.delay_wgrad_compute:
            partner += exp_tot / 3.0  # expert wgrad moved behind the dispatch
        ep_exp = S.ep_exposed(a2a_tot, partner, m, overlap=ep_overlap, eff=r["ep_eff"])
        if ep_overlap and sm_frac > 0:
            # compute that runs next to the flex dispatcher loses its SMs for the hidden time
            ep_exp += S.sm_contention(a2a_tot - ep_exp, sm_frac)
        w["comm_ep"] = ep_exp
        w["host"] = host_gap
        w["a2a_total"] = a2a_tot  # EP dispatch/combine before any hiding (not a wall; for the planner's bounds)
        stage_walls.append(w)
        done[id(st)] = w
    per_mb = [sum(w[k] for k in ("compute", "recompute", "comm_tp", "comm_cp", "comm_ep", "host"))
              for w in stage_walls]
    steady, bubble = S.pipeline_step(per_mb, m, prof.pp, prof.vpp)
    bott = int(np.argmax(per_mb))
    wb = stage_walls[bott]
    # PP send/recv: warm-up/flush transfers are on the critical path; steady-state ones overlap (overlap_p2p_comm)
    pp_exp = 0.0
    if prof.pp > 1:
        bw = r["nic"] if prof.pp_cross else r["nv"]
        t_p2p = prof.pp_bytes / (bw * 1e9)
        pp_exp = 2 * (prof.pp - 1) * t_p2p
        if prof.vpp <= 1:  # interleaved schedules overlap p2p with compute (overlap_p2p_comm auto with VPP > 1)
            pp_exp += 2 * m * t_p2p
    # DP gradient reduce-scatter / parameter all-gather (distributed optimizer) and optimizer step
    dp_exp, opt = _dp_and_optimizer(prof, eff, r, wb, m)
    step_host = _step_host(prof, consts, r, opt)
    walls = {
        "compute": m * wb["compute"], "recompute": m * wb["recompute"], "comm_tp": m * wb["comm_tp"],
        "comm_cp": m * wb["comm_cp"], "comm_ep": m * wb["comm_ep"], "comm_pp": pp_exp, "comm_dp": dp_exp,
        "pipeline_bubble": bubble, "host": m * wb["host"] + step_host, "optimizer": opt,
    }
    step = sum(walls.values())
    detail = {"gemm": m * wb["gemm"], "attention": m * wb["attn"], "memory_bound": m * wb["mem"]}
    # per stage: the walls no feature variant shortens (compute, recompute, TP, CP), for the planner's bounds
    stage_floor = [w["compute"] + w["recompute"] + w["comm_tp"] + w["comm_cp"] for w in stage_walls]
    return {"walls": walls, "step": step, "stage_seconds": per_mb, "bottleneck": bott, "detail": detail,
            "stage_floor": stage_floor, "stage_a2a": [w["a2a_total"] for w in stage_walls], "ep_eff": r["ep_eff"],
            "schedule": (m, prof.pp, prof.vpp)}


def _step_host(prof: Profile, consts: dict, r: dict[str, float], opt_s: float) -> float:
    """Exposed host time of the once-per-step work (optimizer, gradient clipping, loss bookkeeping;
    :func:`moetune.perfmodel.host.step_launches`) on the rank with the most parameter tensors, against the
    optimizer's GPU time."""
    model = prof.job.model
    kern = consts["kernels_per_layer"]
    tensors = consts.get("param_tensors")
    if not tensors:
        return 0.0
    local = float(model.num_moe_experts or 1) / max(prof.job.layout.ep, 1)
    n = max(H.param_tensors(st.layer_counts, local_experts=local, shared=bool(model.moe_shared_expert_intermediate_size),
                            mla=model.multi_latent_attention, tensors=tensors) for st in prof.stages)
    sl = H.step_launches(n, kern)
    host_s = H.host_seconds(sl, launch_us=r["launch_us"], graph_launch_us=consts["graph_launch_us"])
    return H.host_exposed(host_s, opt_s, r["host_p"]) + sl.syncs * consts["host_sync_us"] * 1e-6


def _dp_and_optimizer(prof: Profile, eff: Efficiency, r: dict[str, float], wb: dict[str, float], m: int
                      ) -> tuple[float, float]:
    job = prof.job
    lay, feat, sysm = job.layout, job.features, job.system
    consts = eff.constants
    st = max(prof.stages, key=lambda s: s.dense_params + s.expert_params)
    dp, edp = job.dp, job.edp
    n_dense = dp * lay.cp
    grad_b = 4.0 if (feat.grad_reduce_in_fp32 and feat.main_grads_dtype == "fp32") else 2.0
    param_b = 1.0 if (feat.fp8_param_gather and feat.precision in ("fp8_cs", "fp8_delayed")) else 2.0
    bw_dense = C.bus_bandwidth(n_dense, lay.tp, sysm.nvlink_domain, r["nv"], r["nic"])
    bw_exp = C.bus_bandwidth(edp, lay.ep * lay.expert_tp, sysm.nvlink_domain, r["nv"], r["nic"])
    rs = C.ring_seconds(st.dense_params * grad_b, n_dense, bw_dense) + C.ring_seconds(st.expert_params * grad_b,
                                                                                       edp, bw_exp)
    ag = C.ring_seconds(st.dense_params * param_b, n_dense, bw_dense) + C.ring_seconds(st.expert_params * param_b,
                                                                                        edp, bw_exp)
    local = st.dense_params + st.expert_params
    buckets = max(local / consts["ddp_bucket_params"], 1.0)
    per_mb_compute = wb["compute"] + wb["recompute"]
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
    dp_exp += S.sm_contention(max(total - dp_exp, 0.0), consts.get("dp_overlap_sms", 0) / sysm.gpu.sm_count)
    opt_params = st.dense_params / shard + st.expert_params / (max(edp, 1) if shard > 1 else 1)
    opt = opt_params * consts["optimizer_bytes_per_param"] / (r["hbm"] * 1e9 * r["hbm_eff"])
    return dp_exp, opt


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


_EFF_FILES: dict[str, tuple[float, Efficiency]] = {}


def _load_cached(path: str) -> Efficiency:
    try:
        mtime = Path(path).stat().st_mtime
    except OSError:
        return load_efficiency(path)  # raises the one-line InputError
    hit = _EFF_FILES.get(path)
    if hit is None or hit[0] != mtime:
        hit = (mtime, load_efficiency(path))
        _EFF_FILES[path] = hit
    return hit[1]


def predict_tflops(prof: Profile, eff: Efficiency) -> float:
    """Model TFLOP/s/GPU of a profile (hot path of the fit)."""
    res = evaluate(prof, eff)
    job = prof.job
    tok = job.global_batch_size * job.seq_length / (res["step"] * job.gpus)
    return tok * prof.flops_per_token / 1e12


def estimate_walls(job: Job, efficiency: Efficiency | str | Path | None = None) -> dict[str, Any]:
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
    step = res["step"]
    tok = job.global_batch_size * job.seq_length / (step * job.gpus)
    tflops = tok * prof.flops_per_token / 1e12
    gpu = job.system.gpu
    pk = K.peak_key(prof.pcls)
    mfu = {"vs_bf16_peak": tflops / gpu.peak_tflops["bf16"],
           "vs_precision_peak": tflops / gpu.peak_tflops.get(pk, gpu.peak_tflops["bf16"])}
    # plain dicts: validated into Wall objects in the one TimeEstimate validation (same values, one Rust call)
    walls = {k: {"seconds": res["walls"][k], "share": res["walls"][k] / step if step else 0.0} for k in WALL_ORDER}
    dominant = max(WALL_ORDER, key=lambda k: res["walls"][k])
    assumptions = list(prof.assumptions)
    assumptions.append(f"efficiency parameters: {eff.origin}")
    if job.model.is_moe and not job.features.moe_router_force_load_balancing:
        assumptions.append(f"hottest expert rank holds {_expert_load(job.features, 1, 1):g}x the mean tokens "
                           "(moe_routing_imbalance; 1 = balanced)")
    return TimeEstimate(
        step_time_s=step, tokens_per_s_per_gpu=tok, model_tflops_per_gpu=tflops, mfu=mfu,
        precision=job.features.precision, walls=walls,
        dominant_wall=dominant, flops_per_token=prof.flops_per_token, num_microbatches=prof.m,
        bottleneck_stage=res["bottleneck"], stage_seconds=res["stage_seconds"], compute_detail=res["detail"],
        assumptions=assumptions, efficiency_source=eff.origin,
        band=band_for(job.model, job.system, step),
    )

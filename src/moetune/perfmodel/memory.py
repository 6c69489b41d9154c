"""Per-rank, per-pipeline-stage memory of a training job, as the PyTorch allocator reports it.

Peak allocated on a PP rank = model state (parameters, main gradients, optimizer state; Megatron-Core
``DistributedDataParallel`` buffers and ``DistributedOptimizer`` shards) + activations of the microbatches in flight
on that rank under the 1F1B / interleaved schedule (megatron/core/pipeline_parallel/schedules.py) + the working set of
the layer being processed + library workspaces (:mod:`moetune.perfmodel.runtime_tail`). Reserved adds allocator
fragmentation and CUDA-graph pools; device memory adds what lives outside PyTorch (context, NCCL, DeepEP).

Model state (docs/domain.md §3.1; Megatron-LM megatron/training/theoretical_memory_usage.py for the plain case):
bytes/param = weight (2, or 1 for FP8 params) + main grad (4 when reduced in FP32, else 2) + optimizer (FP32 master 4
+ Adam m, v 4+4; BF16 moments with the precision-aware optimizer) / S, where S = DP·CP / instances for dense
parameters and EDP / instances for expert parameters with the distributed optimizer, 1 without. Megatron-FSDP
``optim_grads_params`` also shards weights and grads. Optimizer CPU offload keeps (1 − f) of the optimizer state.

LoRA (``Features.task == "lora"``, Megatron-Bridge ``peft/lora.py``): the base weights are frozen (``PEFT.freeze_model``
sets ``requires_grad = False``), and Megatron-Core ``DistributedDataParallel`` builds its main-gradient buffers and the
distributed optimizer its shards only from parameters with ``requires_grad`` (``distributed_data_parallel.py``:
``if not param.requires_grad: continue``). So the base keeps its weights (and FP8 weight caches) and nothing else;
the adapters (:func:`moetune.perfmodel.params.lora_adapters`, BF16 like the model: ``lora_dtype`` None) carry weights,
main grads and optimizer state like any trainable parameter (:func:`lora_rank_params`).

Fast path: everything per model and layer is memoised (:mod:`moetune.memo`) on its hashable arguments;
:func:`estimate_memory` builds only dataclasses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import reduce
from itertools import groupby, repeat
from operator import add
from typing import NamedTuple

import numpy as np

from moetune.catalog.memory_constants import const
from moetune.memo import HashedTuple, canonical, memo
from moetune.perfmodel import activations as act
from moetune.perfmodel.params import (
    LayerParams,
    embedding_params,
    final_norm_params,
    layer_params,
    lora_adapters,
    mtp_block_layers,
    mtp_block_params,
    mtp_extra_params,
)
from moetune.perfmodel.routing import expert_buffer_load, expert_load, rank_capacity_active
from moetune.perfmodel.runtime_tail import GIB, shared_tail_builder, tail_features
from moetune.spec.features import FP8_PRECISIONS, Features
from moetune.spec.job import Job
from moetune.spec.layout import Layout
from moetune.spec.model import ModelArch
from moetune.spec.pipeline import PipelineRank, SplitFields, pipeline_stages, split_fields
from moetune.spec.system import System

# --------------------------------------------------------------------------------------------------------------
# result types (dataclasses: cheap to build for the planner)
# --------------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ChunkMemory:
    """One virtual pipeline chunk of a rank: its layers and per-microbatch activation bytes."""

    vchunk: int
    layers: tuple[int, ...]
    embedding: bool
    loss: bool
    mtp_layers: int
    params: float  #: parameters held by this rank for the chunk
    activation_gib_per_microbatch: float
    in_flight_at_peak: int


@dataclass(slots=True)
class StageMemory:
    """One pipeline-parallel rank (all its virtual chunks)."""

    pp_rank: int
    peak_allocated_gib: float
    reserved_gib: float
    device_gib: float  #: reserved + memory outside PyTorch (what nvidia-smi shows)
    components: dict[str, float]  #: name -> GiB (allocated components, then reserved/non-torch tail items)
    chunks: list[ChunkMemory] = field(default_factory=list)
    binding: bool = False


@dataclass(slots=True)
class MemoryEstimate:
    stages: list[StageMemory]
    peak_allocated_gib: float
    last_stage_peak_allocated_gib: float
    binding_stage: int
    capacity_gib: float
    headroom_gib: float
    fits: bool
    headroom_policy: str
    assumptions: list[str]

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


# --------------------------------------------------------------------------------------------------------------
# model state
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per parameter for weight / grad / optimizer and the shard divisor of each."""

    weight: float
    grad: float
    optimizer: float


def grad_buffer_bytes(f: Features) -> int:
    """Bytes per parameter of the main-gradient buffer (what the DP collectives reduce, too).

    Megatron-Core ``distributed_data_parallel.py`` (``grad_dtype = torch.float if ddp_config.grad_reduce_in_fp32
    else param.dtype``) and Megatron-FSDP's mixed-precision policy (``build_fully_shard_mixed_precision_policy``: FP32
    main grads with ``grad_reduce_in_fp32``, else ``megatron_fsdp_main_grads_dtype``, None = the BF16 compute dtype)
    keep FP32 gradients only when the gradients are reduced in FP32; Megatron-LM ``validate_args`` turns that on for
    ``--bf16`` unless ``--grad-reduce-in-bf16`` or a BF16 ``--main-grads-dtype``. The Bridge perf recipes set
    ``ddp.grad_reduce_in_fp32 = False`` (``perf_recipes/_common.py`` ``_benchmark_common`` / ``_perf_precision``), so
    their gradient buffers are BF16. An explicit FP32 ``megatron_fsdp_main_grads_dtype`` without FP32 reduction is not a
    Features field and is taken as None (BF16).
    """
    db = const("dtype_bytes")
    return db["fp32"] if (f.grad_reduce_in_fp32 and f.main_grads_dtype == "fp32") else db["bf16"]


def state_bytes(job: Job) -> StateBytes:
    """Bytes per parameter before sharding (docs/domain.md §3.1 table); the gradient: :func:`grad_buffer_bytes`."""
    f = job.features
    db = const("dtype_bytes")
    weight = db["fp8"] if (f.fp8_param_gather and f.precision in FP8_PRECISIONS) else db["bf16"]
    grad = grad_buffer_bytes(f)
    master = db["fp32"] if f.main_params_dtype == "fp32" else db["fp16"]
    if f.use_precision_aware_optimizer:
        moments = db[f.exp_avg_dtype] + db[f.exp_avg_sq_dtype]
    else:
        moments = 2 * db["fp32"]
    opt = (master + moments) * (1.0 - (f.optimizer_offload_fraction if f.optimizer_cpu_offload else 0.0))
    return StateBytes(weight, grad, opt)


def shard_sizes(job: Job) -> tuple[int, int]:
    """(dense, expert) distributed-optimizer shard sizes: DP·CP and EDP, divided by the optimizer instances
    (Megatron-Core distributed/ DistributedOptimizer over the data-parallel-with-CP / expert-data-parallel groups)."""
    lay = job.layout
    inst = max(1, job.features.num_distributed_optimizer_instances)
    dense = max(1, lay.dp(job.gpus) * lay.cp // inst)
    expert = max(1, lay.edp(job.gpus) // inst)
    return dense, expert


@memo(maxsize=4096)
def _params_of_type(model: ModelArch, mixer: str, mlp: str) -> LayerParams:
    """Parameters of a decoder layer with this (mixer, mlp) type (:func:`moetune.perfmodel.params.layer_params`)."""
    for i, (a, b) in enumerate(zip(model.mixer_pattern, model.mlp_pattern, strict=True)):
        if a == mixer and b == mlp:
            return layer_params(model, i)
    raise KeyError(f"{model.name}: no decoder layer of type {mixer}{mlp}")


def _split(lp: LayerParams, tp: int, ep: int, etp: int) -> tuple[float, float, float]:
    tp_split = lp.attention + lp.mixer + lp.dense_mlp + lp.shared_experts + lp.moe_latent_proj
    dense = tp_split / tp + lp.norms + lp.router
    expert = lp.routed_experts / (ep * etp)
    return dense, expert, tp_split / tp + expert


@memo(maxsize=8192)
def _layer_split(model: ModelArch, mixer: str, mlp: str, tp: int, ep: int, etp: int) -> tuple[float, float, float]:
    """(dense, expert, fp8-castable linear) params of one layer held by one rank: TP-split weights / TP, replicated
    norms and router, routed experts / (EP·ETP)."""
    return _split(_params_of_type(model, mixer, mlp), tp, ep, etp)


@memo(maxsize=4096)
def _largest_layer(model: ModelArch, tp: int, ep: int, etp: int) -> float:
    """The (dense + expert) params one rank holds of the model's largest decoder layer (:func:`_layer_split`): what
    Megatron-FSDP gathers unsharded at once (:func:`_model_state`)."""
    return max(sum(_layer_split(model, a, b, tp, ep, etp)[:2])
               for a, b in zip(model.mixer_pattern, model.mlp_pattern, strict=True))


@memo(maxsize=4096)
def _mtp_split(model: ModelArch, tp: int, ep: int, etp: int) -> tuple[float, float, float]:
    dense, expert, lin = _split(mtp_block_params(model), tp, ep, etp)
    h = model.hidden_size
    extra = mtp_extra_params(model)
    dense += (extra - 2 * h * h) + 2 * h * h / tp  # eh_proj column-parallel, norms replicated
    return dense, expert, lin + 2 * h * h / tp


def pipeline_ranks(model: ModelArch, layout) -> tuple[PipelineRank, ...]:
    """:func:`moetune.spec.pipeline.pipeline_stages` of the layout (raises its LayoutError); read only. One split for
    all layouts with the same :class:`~moetune.spec.pipeline.SplitFields` (any TP / CP / EP / ETP)."""
    return _pipeline_ranks(model, split_fields(layout))


@memo(maxsize=8192)
def _pipeline_ranks(model: ModelArch, fields: SplitFields) -> tuple[PipelineRank, ...]:
    return tuple(pipeline_stages(model, fields))


@memo(maxsize=2048)
def _vocab_params_per_rank(model: ModelArch, tp: int) -> float:
    """Embedding (or output layer) rows held by one TP rank: V padded for TP (Megatron _vocab_size_with_padding)."""
    per_row = embedding_params(model) / model.padded_vocab_size(1)
    return model.padded_vocab_size(tp) * per_row / tp


@memo(maxsize=32768)
def _all_rank_params(m: ModelArch, lay) -> tuple[tuple[float, float, float, tuple[float, ...]], ...]:
    """(dense, expert, fp8-linear, per-chunk total) params of every PP rank of the layout, in rank order: those of
    the layout's fields that they read (:func:`_split_all_rank_params`: layouts that differ in CP or DP share them)."""
    return _split_all_rank_params(m, split_fields(lay), lay.tp, lay.ep, lay.expert_tp)


@memo(maxsize=16384)
def _split_all_rank_params(m: ModelArch, fields: SplitFields, tp: int, ep: int, etp: int
                           ) -> tuple[tuple[float, float, float, tuple[float, ...]], ...]:
    """:func:`_split_rank_params` of every PP rank of the split, in rank order."""
    per_layer = _layer_splits(m, tp, ep, etp)
    return tuple(_split_rank_params(m, fields.pp, rank, per_layer, tp, ep, etp) for rank in _pipeline_ranks(m, fields))


@memo(maxsize=4096)
def _layer_splits(m: ModelArch, tp: int, ep: int, etp: int) -> tuple[tuple[float, float, float], ...]:
    """:func:`_layer_split` of every decoder layer, by layer index."""
    return tuple(_layer_split(m, a, b, tp, ep, etp) for a, b in zip(m.mixer_pattern, m.mlp_pattern, strict=True))


def _split_rank_params(m: ModelArch, pp: int, rank: PipelineRank, per_layer: tuple[tuple[float, float, float], ...],
                       tp: int, ep: int, etp: int) -> tuple[float, float, float, tuple[float, ...]]:
    """(dense, expert, fp8-linear, per-chunk total) params of one PP rank of a split over ``pp`` ranks: its layers'
    (``per_layer``: :func:`_layer_splits`), its embedding / output layer rows and final norm, its MTP blocks."""
    dense = expert = lin = 0.0
    per_chunk: list[float] = []
    vocab = _vocab_params_per_rank(m, tp)
    has_emb_anywhere = rank.embedding
    for ch in rank.chunks:
        cd = ce = 0.0
        for i in ch.layers:
            d, e, li = per_layer[i]
            cd, ce, lin = cd + d, ce + e, lin + li
        if ch.embedding:
            cd += vocab
        if ch.loss:
            cd += final_norm_params(m)
            # output layer; tied weights still need a copy on the last stage when PP > 1
            if m.untie_embeddings_and_output_weights or pp > 1 or not has_emb_anywhere:
                cd += vocab
        if ch.mtp_layers:
            copies = 1 if m.mtp_use_repeated_layer else ch.mtp_layers
            d, e, li = _mtp_split(m, tp, ep, etp)
            cd, ce, lin = cd + copies * d, ce + copies * e, lin + copies * li
            if not has_emb_anywhere and m.untie_embeddings_and_output_weights:
                cd += vocab  # MTP embeds the shifted tokens: the last stage keeps an embedding copy
                has_emb_anywhere = True
        dense, expert = dense + cd, expert + ce
        per_chunk.append(cd + ce)
    return dense, expert, lin, tuple(per_chunk)


def _model_state(job: Job, dense: float, expert: float, lin: float, largest_layer: float,
                 per_job: tuple[StateBytes, int, int] | None = None,
                 trainable: tuple[float, float] | None = None) -> dict[str, float]:
    """Bytes of weights, grads, optimizer state (and FP8 weight caches / FSDP buffers) on one rank.
    ``per_job`` = (:func:`state_bytes`, *:func:`shard_sizes`) of the job when the caller already has them.
    ``trainable``: (dense, expert) LoRA adapter params of the rank (:func:`lora_rank_params`) when the base is frozen
    (module doc): then only they have main grads and optimizer state, and their BF16 weights join the base's."""
    f = job.features
    if per_job is None:
        sb = state_bytes(job)
        s_dense, s_exp = shard_sizes(job)
    else:
        sb, s_dense, s_exp = per_job
    g_dense, g_exp = (dense, expert) if trainable is None else trainable
    out: dict[str, float] = {}
    if f.use_megatron_fsdp:
        strat = f.data_parallel_sharding_strategy
        w_div = (s_dense, s_exp) if strat == "optim_grads_params" else (1, 1)
        g_div = (s_dense, s_exp) if strat in ("optim_grads", "optim_grads_params") else (1, 1)
        o_div = (s_dense, s_exp) if strat != "no_shard" else (1, 1)
        out["weights"] = sb.weight * (dense / w_div[0] + expert / w_div[1])
        out["main_grads"] = sb.grad * (g_dense / g_div[0] + g_exp / g_div[1])
        out["optimizer_state"] = sb.optimizer * (g_dense / o_div[0] + g_exp / o_div[1])
        if strat == "optim_grads_params":
            # all-gathered params of the current + prefetched module and the unsharded grads being reduced
            grads = largest_layer if trainable is None else 0.0
            out["fsdp_unsharded_buffers"] = 2 * sb.weight * largest_layer + sb.grad * grads
    else:
        out["weights"] = _weight_bytes(job, sb, dense + expert, lin)
        out["main_grads"] = sb.grad * (g_dense + g_exp)
        if f.use_distributed_optimizer:
            out["optimizer_state"] = sb.optimizer * (g_dense / s_dense + g_exp / s_exp)
        else:
            out["optimizer_state"] = sb.optimizer * (g_dense + g_exp)
    if trainable is not None:
        out["lora_adapter_weights"] = const("dtype_bytes")["bf16"] * (g_dense + g_exp)
    if f.precision in FP8_PRECISIONS and not f.fp8_param_gather:
        out["fp8_weight_cache"] = _quantized_weight_bytes_per_param(job) * lin
    return out


def _quantized_weight_bytes_per_param(job: Job) -> float:
    """Bytes per linear weight of its quantized copy for training: row-wise and column-wise data with their scales
    (catalog ``fp8_weight_cache_bytes_per_param`` per GPU arch, ``fp4_weight_cache_bytes_per_param`` for NVFP4)."""
    if job.features.precision == "nvfp4":
        return const("fp4_weight_cache_bytes_per_param")
    return const("fp8_weight_cache_bytes_per_param")[job.system.gpu.arch]


def _weight_bytes(job: Job, sb: StateBytes, params: float, lin: float) -> float:
    """Model weights on one rank (not Megatron-FSDP).

    With FP8 parameters (``fp8_param_gather``: Transformer Engine ``quantized_model_init`` / ``fp8_model_init``) only
    the FP8-capable linear weights (``lin``) are quantized tensors; TE ``TransformerEngineBaseModule.reset_parameters``
    (transformer_engine/pytorch/module/base.py) sets their quantizer to row-wise *and* column-wise usage when gradients
    are enabled, so each keeps both copies with their scales (:func:`_quantized_weight_bytes_per_param`, the same
    bytes as the weight cache without FP8 parameters). Embedding, output layer, norms and router stay BF16
    (``sb.weight`` is their byte size without FP8 parameters)."""
    f = job.features
    if f.fp8_param_gather and f.precision in FP8_PRECISIONS:
        return const("dtype_bytes")["bf16"] * (params - lin) + _quantized_weight_bytes_per_param(job) * lin
    return sb.weight * params


def weight_and_optimizer_bytes(job: Job) -> list[float]:
    """Weights + grads + optimizer state per PP rank (bytes) — the quantity Megatron-LM prints as
    "Theoretical memory footprints: weight and optimizer" (for its most loaded shard); with LoRA the adapters'
    weights too."""
    per_job = (state_bytes(job), *shard_sizes(job))
    lora = lora_rank_params(job)
    params = _all_rank_params(job.model, job.layout)  # one lookup per layout, not one per rank
    return [_state_sum(job, *params[rank.pp_rank][:3], per_job, None if lora is None else lora[rank.pp_rank])
            for rank in pipeline_ranks(job.model, job.layout)]


def state_floor_bytes(job: Job) -> float:
    """``max(weight_and_optimizer_bytes(job))``: the most loaded PP rank's weights + grads + optimizer state (bytes),
    each distinct (dense, expert, fp8-linear params, LoRA adapters) of a rank priced once - ranks that hold the same
    parameters hold the same bytes (:func:`_model_state` reads nothing else of the rank), and the middle ranks of a
    split usually do (tests/test_plan_fastpath.py compares both on every layout of several requests)."""
    per_job = (state_bytes(job), *shard_sizes(job))
    lora = lora_rank_params(job)
    lay = job.layout  # its split's parameters, without hashing the layout (pass 1 prices most layouts only here)
    params = _split_all_rank_params(job.model, split_fields(lay), lay.tp, lay.ep, lay.expert_tp)  # in rank order
    ranks = dict.fromkeys((p[0], p[1], p[2], None if lora is None else lora[i]) for i, p in enumerate(params))
    return max(_state_sum(job, d, e, li, per_job, t) for d, e, li, t in ranks)


def _state_sum(job: Job, dense: float, expert: float, lin: float, per_job: tuple[StateBytes, int, int],
               trainable: tuple[float, float] | None) -> float:
    """Weights + grads + optimizer state (+ LoRA adapter weights) of one rank with these params (bytes), from
    :func:`_model_state` without Megatron-FSDP's gathered buffers."""
    ms = _model_state(job, dense, expert, lin, 0.0, per_job, trainable)
    return ms["weights"] + ms["main_grads"] + ms["optimizer_state"] + ms.get("lora_adapter_weights", 0.0)


def lora_rank_params(job: Job) -> tuple[tuple[float, float], ...] | None:
    """Per PP rank, the (dense, expert) LoRA adapter parameters one GPU holds; None unless the job's task is LoRA.
    Adapters of TP-split linears are split over TP (:class:`moetune.perfmodel.params.LoraAdapter`), the routed
    experts' shared adapter over ETP; MTP layers carry adapters like decoder layers (Bridge matches every module)."""
    f = job.features
    if f.task != "lora":
        return None
    lay = job.layout
    fields = split_fields(lay)
    return tuple(_lora_rank_params(job.model, fields, lay.tp, lay.expert_tp, r.pp_rank,
                                   tuple(f.lora_target_modules), f.lora_dim)
                 for r in _pipeline_ranks(job.model, fields))


@memo(maxsize=16384)
def _lora_rank_params(m: ModelArch, fields: SplitFields, tp: int, etp: int, pp_rank: int, targets: tuple[str, ...],
                      dim: int) -> tuple[float, float]:
    rank = _pipeline_ranks(m, fields)[pp_rank]
    kinds: list[tuple[str, str]] = []
    for ch in rank.chunks:
        kinds += [(m.mixer_pattern[i], m.mlp_pattern[i]) for i in ch.layers]
        if ch.mtp_layers:
            kinds += mtp_block_layers(m) * (1 if m.mtp_use_repeated_layer else ch.mtp_layers)
    dense = expert = 0.0
    for kind, group in groupby(sorted(kinds)):
        n = sum(1 for _ in group)
        for a in lora_adapters(m, *kind, targets):
            if a.expert:
                expert += n * a.params(dim) / etp
            else:
                dense += n * a.params(dim) / tp
    return dense, expert


# --------------------------------------------------------------------------------------------------------------
# activations and the pipeline schedule
# --------------------------------------------------------------------------------------------------------------


def routing_factor(job: Job) -> float:
    """ρ = hottest expert rank's token load / mean load (:func:`moetune.perfmodel.routing.expert_load`, the one
    formula the step-time model uses too)."""
    return expert_load(job.features)


def act_config(job: Job, recompute: frozenset[str] | None = None) -> act.ActConfig:
    """The :class:`~moetune.perfmodel.activations.ActConfig` of the job (``recompute``: instead of the job's recompute
    modules); memoised on the fields it reads (:func:`_job_act_config`). Its EP size is the layout's with the
    allgather dispatcher and 1 otherwise: only that dispatcher's gathered tokens read it
    (:func:`moetune.perfmodel.activations.layer_transient_bytes`), so the configs of layouts that differ only in EP
    are one value, and the activation memos keyed on it share their rows (tests/test_memory_fastpath.py)."""
    lay, f = job.layout, job.features
    ep = lay.ep if f.moe_token_dispatcher_type == "allgather" else 1
    return _job_act_config(f, lay.tp, lay.cp, lay.expert_tp, ep, job.seq_length, job.micro_batch_size, recompute)


@memo(maxsize=65536)
def _job_act_config(f: Features, tp: int, cp: int, etp: int, ep: int, seq: int, mbs: int,
                    recompute: frozenset[str] | None) -> act.ActConfig:
    unfused = f.attention_backend in ("unfused", "local") or f.transformer_impl == "local"
    rec = act_config_recompute(f)
    off = frozenset(f.offload_modules) if f.fine_grained_activation_offloading else frozenset()
    return _act_config(
        seq=seq, mbs=mbs, tp=tp, cp=cp, etp=etp,
        sp=bool(f.sequence_parallel and tp > 1), fp8=f.precision in FP8_PRECISIONS,
        unfused_attention=unfused, attention_dropout=f.attention_dropout > 0, hidden_dropout=f.hidden_dropout > 0,
        routing_factor=expert_buffer_load(f), recompute=rec if recompute is None else recompute, offload=off,
        ep=ep, allgather_dispatcher=f.moe_token_dispatcher_type == "allgather",
        te_cross_entropy=f.cross_entropy_loss_fusion and f.cross_entropy_fusion_impl == "te",
        lora_targets=frozenset(f.lora_target_modules) if f.task == "lora" else None,
        lora_dim=f.lora_dim if f.task == "lora" else 0,
    )


@memo(maxsize=65536)
def _act_config(**kw) -> act.ActConfig:
    """One :class:`ActConfig` instance per distinct value while in the table, so the activation memos keyed on it
    mostly compare by identity."""
    return act.ActConfig(**kw)


def inflight_states(pp: int, vpp: int, m: int, rank: int) -> tuple[tuple[int, ...], ...]:
    """Microbatches in flight per virtual chunk, after each forward of the schedule (the candidate peak points).

    Megatron-Core schedules.py: non-interleaved 1F1B runs ``pp - rank - 1`` warm-up forwards, then one-forward-one-
    backward; interleaved runs ``(pp - rank - 1)·2 + (vpp - 1)·pp`` warm-up forwards; the forward chunk of virtual
    microbatch k is ``(k mod pp·vpp) // pp`` and the backward chunk is ``vpp - 1 -`` that. The steady state is periodic
    with period pp·vpp, so two periods past the warm-up suffice. Memoised on :func:`_schedule_microbatches` (the
    microbatch counts past it give the same states).
    """
    return _inflight_states(pp, vpp, _schedule_microbatches(pp, vpp, m, rank), rank)


def _schedule_microbatches(pp: int, vpp: int, m: int, rank: int) -> int:
    """``m`` (>= 1) clipped where the schedule walk of :func:`inflight_states` stops reading it: the states of the
    result equal those of ``m`` microbatches. PP 1: the states do not read ``m`` (1). VPP 1: they read
    ``min(pp - rank, m)`` only. Interleaved: with
    W = (pp - rank - 1)·2 + (vpp - 1)·pp warm-up forwards and B = W + 2·pp·vpp + 1, once m·vpp >= B the warm-up is W
    (not clipped), the walk stops at B forwards, and every backward before it has a microbatch (kb < kf <= B <= m·vpp),
    so the walk, and the states, do not read ``m``: ``m`` is clipped at ceil(B / vpp)."""
    if pp == 1:
        return 1
    if vpp == 1:
        return min(m, pp - rank)
    return min(m, -(-((pp - rank - 1) * 2 + (vpp - 1) * pp + 2 * pp * vpp + 1) // vpp))


@memo(maxsize=4096)
def _inflight_states(pp: int, vpp: int, m: int, rank: int) -> tuple[tuple[int, ...], ...]:
    if pp == 1:
        return ((1,) * vpp,) if vpp > 1 else ((1,),)
    if vpp == 1:
        return ((min(pp - rank, m),),)
    total = m * vpp
    warm = min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
    counts = [0] * vpp
    states: set[tuple[int, ...]] = set()
    kf = kb = 0
    horizon = min(total, warm + 2 * pp * vpp + 1)
    while kf < horizon:
        counts[(kf % (pp * vpp)) // pp] += 1
        kf += 1
        states.add(tuple(counts))
        if kf > warm and kb < total:
            counts[vpp - 1 - (kb % (pp * vpp)) // pp] -= 1
            kb += 1
    return tuple(sorted(states))


#: Features fields that change step time but not memory in this model (EP overlap merges the backward of one
#: microbatch with the forward of the next without holding more activations, docs/domain.md §3.2; delayed wgrad
#: moves expert weight-gradient GEMMs later in the same backward). Callers that evaluate many feature variants
#: (the planner) may reuse one memory estimate across them; tests/test_memory.py checks the invariance.
TIME_ONLY_FEATURES = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")


@memo(maxsize=4096)
def _inflight_array_of(pp: int, vpp: int, m: int, rank: int) -> np.ndarray:
    """:func:`_inflight_states` as a (states x chunks) float array, for one matrix product per rank (read only; ``m``
    clipped by :func:`_schedule_microbatches`: one array for the microbatch counts that share the states)."""
    return np.asarray(_inflight_states(pp, vpp, m, rank), dtype=float)


def graph_scope(job: Job) -> frozenset[str]:
    """CUDA-graph scope in effect (MCore: an empty ``cuda_graph_scope`` with graphs on captures whole layers)."""
    return _graph_scope(job.features)


def _graph_scope(f) -> frozenset[str]:
    if f.cuda_graph_impl == "none":
        return frozenset()
    return frozenset(f.cuda_graph_scope) or frozenset({"attn", "mlp", "moe", "mamba"})


class ChunkFeatures(NamedTuple):
    """The Features fields that :func:`_chunk_activation_of` reads (it takes this projection, not the features)."""

    graph_scope: frozenset[str]
    recompute_granularity: str | None
    recompute_method: str | None
    recompute_num_layers: int | None
    cpu_offloading_num_layers: int  #: 0 without layer-level CPU offloading


@memo(maxsize=65536)
def chunk_features(f: Features) -> ChunkFeatures:
    """:class:`ChunkFeatures` of a Features object; memoised (the fit test reads it once per job), so the activation
    memos keyed on it mostly compare one shared instance by identity."""
    return ChunkFeatures(_graph_scope(f), f.recompute_granularity, f.recompute_method, f.recompute_num_layers,
                         f.cpu_offloading_num_layers if f.cpu_offloading else 0)


def _chunk_signatures(m: ModelArch, lay) -> tuple[tuple[tuple, ...], ...]:
    """Per PP rank, per chunk: the signature :func:`_chunk_activation_of` is keyed on (layer types, MTP layers,
    embedding, loss). Equal signatures and equal rows of them are one object while in the :func:`canonical`
    table, so the row memo below compares them by identity first, and each hashes once (:class:`HashedTuple`).
    A function of the pipeline split only (:func:`pipeline_ranks`): one table for all layouts with the same
    :class:`~moetune.spec.pipeline.SplitFields`."""
    return _split_signatures(m, split_fields(lay))


@memo(maxsize=8192)
def _split_signatures(m: ModelArch, fields: SplitFields) -> tuple[tuple[tuple, ...], ...]:
    return tuple(canonical(HashedTuple(canonical(HashedTuple(
        (tuple((m.mixer_pattern[i], m.mlp_pattern[i]) for i in ch.layers), ch.mtp_layers, ch.embedding, ch.loss)))
        for ch in rank.chunks)) for rank in _pipeline_ranks(m, fields))


@memo(maxsize=262144)
def _activation_row(m: ModelArch, fkey: ChunkFeatures, cfg: act.ActConfig, sigs: tuple, vocab_padded: int) -> tuple:
    """One PP rank's activation table from its chunk signatures (a row of :func:`_chunk_signatures`): per chunk the
    saved bytes per microbatch outside CUDA graphs (tuple and array), inside graphs (array, None when none), and the
    rank's max transient and max offload-resident bytes. Ranks of many layouts share one row; read only."""
    saved, graphed, trans, resident = [], [], 0.0, 0.0
    for sig in sigs:
        s, g, t, r = _chunk_activation_of(m, fkey, cfg, sig, vocab_padded)
        saved.append(s - g)
        graphed.append(g)
        if t > trans:  # max(trans, t), max(resident, r) without the calls (the same first-maximum rule)
            trans = t
        if r > resident:
            resident = r
    return (tuple(saved), np.asarray(saved), np.asarray(graphed) if any(graphed) else None, trans, resident)


@memo(maxsize=262144)
def _rank_activations(m: ModelArch, fkey: ChunkFeatures, cfg: act.ActConfig, sigs: tuple, vocab_padded: int,
                      schedule: tuple[int, int, int, int]) -> tuple:
    """One PP rank's activations at the schedule's peak, without static CUDA-graph I/O: (its :func:`_activation_row`,
    the index of the in-flight state where the saved activations outside graphs peak (the first maximum, in the
    sorted order of :func:`inflight_states`), that peak in bytes, the peak of the graphed activations (>= 0));
    ``schedule``: the arguments of :func:`_inflight_states`. A function of the row and the in-flight states only, so
    the ranks of many jobs share it (the EP variants of a split, which read the same row and states); read only."""
    row = _activation_row(m, fkey, cfg, sigs, vocab_padded)
    chunk_saved, saved_arr, graphed_arr = row[:3]
    inflight = _inflight_states(*schedule)
    states = _inflight_array_of(*schedule)
    if len(inflight) == 1 == len(chunk_saved):
        # one chunk, one in-flight state (no interleaving): the matrix product is its one term, a product of two
        # doubles (the in-flight count is a small integer), computed without arrays
        i_best, best = 0, inflight[0][0] * chunk_saved[0]
    else:
        totals = states @ saved_arr
        i_best = int(totals.argmax())
        best = float(totals[i_best])
    best_graphed = 0.0 if graphed_arr is None else max(0.0, float((states @ graphed_arr).max()))
    return row, i_best, best, best_graphed


@memo(maxsize=65536)
def _chunk_activation_of(m: ModelArch, fkey: ChunkFeatures, cfg: act.ActConfig, sig: tuple, vocab_padded: int
                         ) -> tuple[float, float, float, float]:
    scope, granularity, method, num_layers, cpu_n = fkey
    layer_types, mtp_count, has_embedding, has_loss = sig
    graphed = 0.0
    layers = list(layer_types)
    mtp_layers = mtp_block_layers(m) * mtp_count if mtp_count else []
    saved = 0.0
    transient = 0.0
    offl = 0.0
    full = granularity == "full"
    n_rec = num_layers or 1
    if full and layers:
        inp = act.layer_input_bytes(m, cfg)
        if method == "block":
            rec, keep = layers[:n_rec], layers[n_rec:]
            saved += inp * len(rec)
        else:  # uniform (MCore default method for full)
            groups = -(-len(layers) // n_rec)
            rec, keep = layers, []
            saved += inp * groups
        # max over the recomputed layers, one lookup per run of one layer type (max is idempotent: the same value)
        group = min(n_rec, len(rec))
        for (mx, ml), _ in groupby(rec):
            transient = max(transient, act.layer_bytes(m, mx, ml, cfg) * group)
    else:
        keep = layers
    # Per layer (keep, then the MTP layers), in order: the first ``n_off`` layers of ``keep`` (layer-level CPU
    # offloading keeps the last kept layer on the GPU) are offloaded - only the largest stays resident - and the others
    # add their saved and graphed bytes; transient and offloaded bytes are maxima over all. Runs of one layer type are
    # looked up once and added as many times, one by one (the same additions in the same order as a loop per layer).
    items = keep + mtp_layers
    n_off = max(0, min(cpu_n, len(keep) - 1)) if cpu_n else 0
    for part, summed in ((items[:n_off], False), (items[n_off:], True)):
        for kind, run in groupby(part):
            b, g, t, o = _layer_activation(m, *kind, cfg, scope)
            if summed:
                n = len(list(run))
                saved = reduce(add, repeat(b, n), saved)
                graphed = reduce(add, repeat(g, n), graphed)
            elif b > offl:
                offl = b
            if t > transient:  # max(transient, t), max(offl, o) without the calls (the same first-maximum rule)
                transient = t
            if o > offl:
                offl = o
    if mtp_count or has_embedding or has_loss:
        mtp_extra, embedding, loss_saved, loss_transient = _stage_extras(m, cfg, vocab_padded)
        if mtp_count:
            saved += mtp_count * mtp_extra
        if has_embedding:
            saved += embedding
        if has_loss:
            saved += loss_saved
            transient = max(transient, loss_transient)
    resident = const("fine_grained_offload_resident_layers") * offl if cfg.offload else (offl if cpu_n else 0.0)
    return saved, graphed, transient, resident


@memo(maxsize=65536)
def _stage_extras(m: ModelArch, cfg: act.ActConfig, vocab_padded: int) -> tuple[float, float, float, float]:
    """(MTP depth extra, embedding stage, loss stage saved, loss stage transient) bytes per microbatch
    (:func:`moetune.perfmodel.activations.mtp_extra_bytes`, ``embedding_stage_bytes``, ``loss_stage_bytes``): one
    lookup for the chunks of :func:`_chunk_activation_of` that hold them."""
    return (act.mtp_extra_bytes(m, cfg, vocab_padded), act.embedding_stage_bytes(m, cfg),
            *act.loss_stage_bytes(m, cfg, vocab_padded))


def cpu_offloaded_layer_bytes(job: Job) -> tuple[float, ...]:
    """Bytes that layer-level CPU offloading (``--cpu-offloading --cpu-offloading-num-layers N``, PP 1) copies to
    host memory per microbatch, one entry per offloaded decoder layer: the saved activations
    (:func:`moetune.perfmodel.activations.layer_bytes`) of the first N layers, the layers
    :func:`_chunk_activation_of` takes off the GPU (N is capped at ``num_layers - 1``: Megatron-Core's
    ``cpu_offloading_num_layers`` must be below the layer count, rule OFF-001). Each is copied device-to-host after
    its forward and back before its backward (Transformer Engine ``get_cpu_offload_context``, used by
    ``megatron/core/transformer/transformer_block.py``). Empty without offloading or with PP > 1 (rule OFF-002)."""
    f = job.features
    if not (f.cpu_offloading and f.cpu_offloading_num_layers) or job.layout.pp > 1:
        return ()
    m = job.model
    n = max(0, min(f.cpu_offloading_num_layers, m.num_layers - 1))
    return _offloaded_layer_bytes(m, act_config(job), chunk_features(f).graph_scope, n)


@memo(maxsize=16384)
def _offloaded_layer_bytes(m: ModelArch, cfg: act.ActConfig, scope: frozenset[str], n: int) -> tuple[float, ...]:
    """:func:`cpu_offloaded_layer_bytes` of the first ``n`` decoder layers (``scope``: the job's :func:`graph_scope`);
    memoised: the step model and the planner's host-memory test read it for every job with offloading."""
    return tuple(_layer_activation(m, m.mixer_pattern[i], m.mlp_pattern[i], cfg, scope)[0] for i in range(n))


def fine_grained_offloaded_bytes(job: Job) -> dict[tuple[str, str], float]:
    """Bytes that fine-grained activation offloading (``--fine-grained-activation-offloading --offload-modules``)
    copies to host memory and back per microbatch, per decoder-layer kind (mixer, mlp): the saved inputs of the
    offloaded modules (:func:`moetune.perfmodel.activations.layer_offloaded_bytes`, the bytes the memory estimate takes
    off the GPU). Megatron-Core ``pipeline_parallel/fine_grained_activation_offload.py`` copies them on its own
    device-to-host stream when each module group's forward commits and reloads them on its host-to-device stream in
    backward. Empty without fine-grained offloading."""
    if not (job.features.fine_grained_activation_offloading and job.features.offload_modules):
        return {}
    m = job.model
    cfg = act_config(job)
    kinds = dict.fromkeys(zip(m.mixer_pattern, m.mlp_pattern, strict=True))
    return {k: b for k in kinds if (b := act.layer_offloaded_bytes(m, k[0], k[1], cfg)) > 0}


@memo(maxsize=65536)
def _layer_activation(m: ModelArch, mixer: str, mlp: str, cfg: act.ActConfig, scope: frozenset[str]
                      ) -> tuple[float, float, float, float]:
    """(saved, graphed, transient + recompute-rebuilt, offloaded) bytes of one layer and microbatch
    (:mod:`moetune.perfmodel.activations`), one lookup for :func:`_chunk_activation_of`."""
    return (act.layer_bytes(m, mixer, mlp, cfg), act.layer_graphed_bytes(m, mixer, mlp, cfg, scope),
            act.layer_transient_bytes(m, mixer, mlp, cfg) + act.layer_recompute_extra_bytes(m, mixer, mlp, cfg),
            act.layer_offloaded_bytes(m, mixer, mlp, cfg))


def _graphed_io_of(job: Job, cfg: act.ActConfig, scope: frozenset[str]) -> tuple[np.ndarray, ...] | None:
    """Static input/output buffers of TE/local CUDA graphs (TE ``make_graphed_callables``) per microbatch in flight,
    one entry per virtual chunk of the job's PP ranks (``[pp_rank][chunk]`` bytes); None where the job has no static
    graph buffers (0 bytes on every rank).

    Megatron-Core ``TECudaGraphHelper`` (megatron/core/transformer/cuda_graphs.py) captures one forward and one
    backward graph per (layer, microbatch) in the schedule's order and, with TE >= 2.7, passes
    ``_reuse_graph_input_output_buffers=True``: TE (transformer_engine/pytorch/graph.py ``_make_graphed_callables``)
    then hands a microbatch's static inputs to the next microbatch *of the same chunk* whose forward starts after
    its backward, weak-references each forward graph's static outputs once its backward graph is captured (their
    pool memory is reused), keeps one static grad-output buffer per tensor shape, and drops each static grad input
    after the next backward of the chunk. So what stays allocated are the inputs and outputs of the captured modules
    of each in-flight (chunk, microbatch): the per-chunk sums below, times the chunk's in-flight microbatches of the
    schedule (:func:`inflight_states`, in :func:`_rank_memory`). The shared gradient buffers are one module's I/O
    and are left out. Inputs are the BF16 hidden states of the sequence shard; outputs are hidden states, or the FP32
    router probabilities/map for router-only scopes. ``scope``: the job's :func:`graph_scope` (the caller has it in
    its :func:`chunk_features`)."""
    if not scope or "full_iteration" in scope or not job.features.cuda_graph_impl:
        return None
    m, lay = job.model, job.layout
    hid = const("dtype_bytes")["bf16"] * m.hidden_size * cfg.tokens_sp
    router_out = const("router_bytes_per_expert_per_token") * (m.num_moe_experts or 0) * cfg.tokens_sp
    return _graphed_io_per_chunk(m, split_fields(lay), scope, hid, router_out)


@memo(maxsize=131072)
def _graphed_io_per_chunk(m: ModelArch, fields: SplitFields, scope: frozenset[str], hid: float, router_out: float
                          ) -> tuple[np.ndarray, ...]:
    """Per PP rank, per virtual chunk: static graph I/O bytes of one microbatch (:func:`_graphed_io_of`), memoised
    on the pipeline split (:func:`pipeline_ranks`: the layouts that differ in TP / CP / EP / ETP only share it where
    their ``hid`` and ``router_out`` are equal); read only."""
    out = []
    for rank in _pipeline_ranks(m, fields):
        row = []
        for ch in rank.chunks:
            per_mb = 0.0
            for i in ch.layers:
                mx, ml = m.mixer_pattern[i], m.mlp_pattern[i]
                if ("attn" in scope and mx in "AW") or ("mamba" in scope and mx in "MG"):
                    per_mb += 2 * hid
                if "mlp" in scope and ml == "D":
                    per_mb += 2 * hid
                if ml == "E":
                    if "moe" in scope:
                        per_mb += 2 * hid
                    elif {"moe_router", "moe_preprocess"} & scope:
                        per_mb += hid + router_out
            row.append(per_mb)
        out.append(np.asarray(row))
    return tuple(out)


# --------------------------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------------------------


def headroom_gib(capacity: float) -> float:
    h = const("headroom")
    return max(h["fraction"] * capacity, h["min_gib"])


def reserved_peaks(job: Job, order: Iterable[int] | None = None) -> Iterator[tuple[float, float]]:
    """(reserved GiB, peak allocated GiB) of the PP ranks in ``order`` (default: rank order), lazily: the
    ``reserved_gib`` / ``peak_allocated_gib`` of :func:`estimate_memory`'s stages (same values, one implementation)
    without the itemised components, chunks and assumptions. A fit test can stop at the first rank that overflows."""
    return _rank_memory(job, act_config(job), False, order)


def device_peaks(job: Job, order: Iterable[int] | None = None) -> Iterator[tuple[float, float]]:
    """(device GiB, peak allocated GiB) of the PP ranks in ``order``, lazily: the ``device_gib`` (reserved + CUDA
    context, NCCL, DeepEP: what the headroom policy of :func:`estimate_memory` tests) and ``peak_allocated_gib`` of
    its stages (same values, one implementation)."""
    return _rank_memory(job, act_config(job), "device", order)


def fit_peaks(job: Job, order: list[int]) -> tuple[float, Iterator[tuple[float, float]]]:
    """(:func:`non_torch_gib`, :func:`reserved_peaks` of the ranks in ``order``) of the job, with one lookup of its
    :func:`_rank_static` for both (the planner's fit test reads both; nothing is priced for an empty ``order``)."""
    static = _rank_static(job)
    return static.tail.non_torch, _rank_memory(job, act_config(job), False, order, static) if order else iter(())


def non_torch_gib(job: Job) -> float:
    """GiB outside PyTorch (CUDA context, NCCL, DeepEP / HybridEP buffers): the same on every PP rank, and what
    :func:`device_peaks` adds to each rank's reserved GiB of :func:`reserved_peaks` (``device = reserved + this``)."""
    return _rank_static(job).tail.non_torch


#: Features fields that change the memory model only through the non-PyTorch runtime tail (DeepEP / HybridEP
#: buffers, :func:`non_torch_gib`) and the allgather dispatcher's gathered tokens (an activation,
#: ``ActConfig.allgather_dispatcher``): jobs that differ only here, none of them with the allgather dispatcher, have
#: the same reserved GiB on every rank (tests/test_plan_fastpath.py checks it)
DISPATCHER_FEATURES = ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend")


@memo(maxsize=65536)
def reserved_features(f: Features) -> Features:
    """One representative of the features whose jobs have the same :func:`reserved_peaks` (on any layout, batch and
    system) by :data:`DISPATCHER_FEATURES`: ``f`` with the alltoall dispatcher unless it uses allgather (its own
    class); one instance per value (:func:`moetune.memo.canonical`)."""
    if f.moe_token_dispatcher_type == "allgather":
        return canonical(f)
    return canonical(f.model_copy(update={"moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None}))


def fits_capacity(device_gib: float, capacity_gib: float, headroom: float) -> bool:
    """The headroom policy, one expression for ``estimate`` and ``plan``: the binding rank's device memory leaves at
    least ``headroom`` GiB of HBM free (:func:`headroom_gib` by default)."""
    return device_gib <= capacity_gib - headroom


#: Features fields that only the activations read (not the model state, the schedule or the runtime tail): the
#: per-job part of :func:`_rank_memory` is shared by jobs that differ only in these (the recompute ladder)
ACTIVATION_ONLY_FEATURES = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")
#: Features fields that the model state and the schedule (:func:`_rank_state_of`) do not read besides
#: :data:`ACTIVATION_ONLY_FEATURES`: the dispatcher (its buffers are runtime tail, the allgather dispatcher's gather
#: is an activation), CUDA graphs (graphed activations, static graph buffers and pools) and the fields below
#: (tests/test_memory.py checks that the model state and schedule do not change with any of them)
TAIL_FEATURES = ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "cuda_graph_impl", "cuda_graph_scope",
                 # layer-level CPU offloading (activations, :func:`chunk_features`) and the HybridEP rank capacity
                 # budget / paged stash of a whole-iteration graph (runtime tail): the planner's layer-offload and
                 # graph variants of a layout share the model state too
                 "cpu_offloading", "cpu_offloading_num_layers", "moe_expert_rank_capacity_factor", "moe_paged_stash")


@memo(maxsize=65536)
def static_features(f: Features) -> Features:
    """The features with :data:`ACTIVATION_ONLY_FEATURES` at their defaults: what the non-activation part of the
    memory model (:func:`_rank_static`) is given, so jobs of one recompute ladder share it. One instance per value
    (:func:`moetune.memo.canonical`), so the memo keys built from it compare by identity."""
    return canonical(f.model_copy(update={k: Features.model_fields[k].default for k in ACTIVATION_ONLY_FEATURES}))


@memo(maxsize=65536)
def state_features(f: Features) -> Features:
    """:func:`static_features` with :data:`TAIL_FEATURES` also at their defaults: what the model state and the
    schedule (:func:`_rank_state_of`) are given, so the dispatcher and CUDA-graph variants of a layout share them."""
    sf = static_features(f)
    return canonical(sf.model_copy(update={k: Features.model_fields[k].default for k in TAIL_FEATURES}))


class RankStatic(NamedTuple):
    """The part of :func:`_rank_memory` that the activations do not change (read only)."""

    stages: tuple[PipelineRank, ...]
    vocab_padded: int
    #: per rank: (model-state components, their sum, per-chunk params, in-flight states array, in-flight states,
    #: schedule key), :func:`_rank_state_of`
    ranks: list[tuple]
    #: the runtime tail builder (:func:`moetune.perfmodel.runtime_tail.tail_builder`), shared by the jobs whose tails
    #: read the same values (:func:`moetune.perfmodel.runtime_tail.shared_tail_builder`)
    tail: Callable
    signatures: tuple  #: :func:`_chunk_signatures` of the layout


def _rank_static(job: Job) -> RankStatic:
    """The part of :func:`_rank_memory` that the activations do not change (:func:`_rank_static_of` of the job with
    :func:`static_features`)."""
    return _rank_static_of(job.model, job.layout, job.system, job.gpus, job.global_batch_size, job.micro_batch_size,
                           job.seq_length, static_features(job.features))


def _job_of(m: ModelArch, lay: Layout, system: System, gpus: int, gbs: int, mbs: int, seq: int,
            f: Features) -> Job:
    """The job of these fields, every one taken from a valid job (``f``: a projection of its features), so
    validation would rebuild the same object: :meth:`moetune.spec.base.FrozenSpec.trusted`."""
    return Job.trusted(model=m, system=system, gpus=gpus, global_batch_size=gbs, micro_batch_size=mbs, seq_length=seq,
                       layout=lay, features=f)


@memo(maxsize=32768)
def _rank_static_of(m: ModelArch, lay: Layout, system: System, gpus: int, gbs: int, mbs: int, seq: int,
                    f: Features) -> RankStatic:
    """:class:`RankStatic` of the job (``f``: its :func:`static_features`): the model state and schedule of
    :func:`_rank_state_of` (given :func:`state_features`, shared by the dispatcher and CUDA-graph variants), the
    runtime tail builder and the chunk signatures."""
    stages, vocab_padded, ranks = _rank_state_of(m, lay, system, gpus, gbs, mbs, seq, state_features(f))
    tail = shared_tail_builder(m, system, gpus, gbs, mbs, seq, lay.tp, lay.cp, lay.ep, lay.expert_tp, lay.pp,
                               tail_features(f))
    return RankStatic(stages, vocab_padded, ranks, tail, _chunk_signatures(m, lay))


@memo(maxsize=32768)
def _rank_state_of(m: ModelArch, lay: Layout, system: System, gpus: int, gbs: int, mbs: int, seq: int,
                   f: Features) -> tuple:
    """Pipeline ranks, vocabulary padding and, per rank, (model-state components, their sum, per-chunk params,
    in-flight states array, in-flight states, their schedule key: the arguments of :func:`_inflight_states`, the
    microbatch count clipped by :func:`_schedule_microbatches`) of the job (``f``: its :func:`state_features`); read
    only. The model state is the layout's (:func:`_layout_state_of`), shared by its batch shapes."""
    stages, vocab_padded, states = _layout_state_of(m, lay, system, gpus, f)
    vpp = len(stages[0].chunks)
    nmb = max(1, lay.num_microbatches(gpus, gbs, mbs))  # Job.num_microbatches
    ranks = []
    for rank, (comps, total, per_chunk_params) in zip(stages, states, strict=True):
        schedule = (lay.pp, vpp, _schedule_microbatches(lay.pp, vpp, nmb, rank.pp_rank), rank.pp_rank)
        ranks.append((comps, total, per_chunk_params, _inflight_array_of(*schedule), _inflight_states(*schedule),
                      schedule))
    return stages, vocab_padded, ranks


@memo(maxsize=16384)
def _layout_state_of(m: ModelArch, lay: Layout, system: System, gpus: int, f: Features) -> tuple:
    """Pipeline ranks, vocabulary padding and, per rank, (model-state components, their sum, per-chunk params) of the
    jobs of this layout (``f``: their :func:`state_features`), which read neither the batch nor the sequence: they
    are priced on a job without those fields (global batch and sequence length absent, so a read would raise; the
    microbatch size at its default, read by nothing here). Read only."""
    job = Job.trusted(model=m, system=system, gpus=gpus, layout=lay, features=f)
    stages = pipeline_ranks(m, lay)
    largest_layer = 0.0
    if f.use_megatron_fsdp:
        largest_layer = _largest_layer(m, lay.tp, lay.ep, lay.expert_tp)
    per_job = (state_bytes(job), *shard_sizes(job))
    params = _all_rank_params(m, lay)
    lora = lora_rank_params(job)
    states = []
    for rank in stages:
        dense, expert, lin, per_chunk_params = params[rank.pp_rank]
        comps = _model_state(job, dense, expert, lin, largest_layer, per_job,
                             None if lora is None else lora[rank.pp_rank])
        states.append((comps, sum(comps.values()), per_chunk_params))
    return stages, m.padded_vocab_size(lay.tp), states


def ladder_drops(f: Features) -> frozenset[str] | None:
    """The activation components that the selective recompute of ``f`` drops (the union of
    :data:`moetune.perfmodel.activations._RECOMPUTE_TARGETS` of its modules, as :func:`act_config` reads them; empty
    without recompute); None for full recompute (it changes which layers are kept, not only their components)."""
    if f.recompute_granularity == "full":
        return None
    rec = act_config_recompute(f)
    return frozenset(n for mod in rec for n in act._RECOMPUTE_TARGETS.get(mod, ()))


def act_config_recompute(f: Features) -> frozenset[str]:
    """The selective recompute modules :func:`act_config` gives the activation model (MCore's default list,
    ``core_attn``, where selective recompute names none)."""
    if f.recompute_granularity != "selective":
        return frozenset()
    return frozenset(f.recompute_modules) if f.recompute_modules else frozenset({"core_attn"})


def saved_activation_floor(job: Job, order: Iterable[int] | None = None) -> Iterator[float] | None:
    """Per PP rank in ``order`` (default: rank order), lazily: a lower bound on the device GiB (:func:`device_peaks`)
    of every job that equals ``job`` but for a selective recompute (or none) that drops a subset of the components
    ``job``'s recompute drops (:func:`ladder_drops`). None where the bound is not proved: ``job`` has full
    recompute, CUDA graphs with a scope, layer-level or fine-grained activation offloading.

    The bound is the rank's model state + its non-graphed saved activations at their peak in-flight state + the
    non-PyTorch GiB (:func:`_rank_memory` with the working set, the runtime tail's allocated and reserved items, the
    graph pool and the static graph buffers left out; each is >= 0 and the allocated peak takes the max of the
    phases, so the device GiB is at least this sum). Proof that it bounds the other jobs too: the model state, the
    in-flight states and the non-PyTorch GiB do not read the recompute fields (:data:`ACTIVATION_ONLY_FEATURES`,
    :func:`static_features`); a chunk's saved bytes are a sum over its layers of
    :func:`moetune.perfmodel.activations.layer_bytes` (the components left after the recompute's drops, each >= 0)
    plus the embedding, loss and MTP extras (no recompute input), so dropping a subset keeps every term at least
    as large, and the in-flight maximum of non-negative combinations is monotone too. Equal up to the rounding of
    those float sums: callers compare with a slack (:meth:`moetune.plan.search.Search.ladder_prefix_unfit`)."""
    f = job.features
    if f.recompute_granularity == "full" or f.fine_grained_activation_offloading or f.cpu_offloading:
        return None
    fkey = chunk_features(f)
    if fkey[0] or fkey[4]:  # a CUDA-graph scope (graphed activations, static buffers) or offloaded layers
        return None
    return _saved_floor(job, fkey, order)


def _saved_floor(job: Job, fkey: ChunkFeatures, order: Iterable[int] | None) -> Iterator[float]:
    m = job.model
    cfg = act_config(job)
    stages, vocab_padded, ranks, tail_of, sig_rows = _rank_static(job)
    non_torch = tail_of.non_torch
    for idx in range(len(stages)) if order is None else order:
        rank = stages[idx]
        static, schedule = ranks[idx][1], ranks[idx][5]
        best = _rank_activations(m, fkey, cfg, sig_rows[rank.pp_rank], vocab_padded, schedule)[2]
        yield (static + best) / GIB + non_torch


def _rank_memory(job: Job, cfg: act.ActConfig, detail: bool | str, order: Iterable[int] | None = None,
                 static: RankStatic | None = None) -> Iterator:
    """Per PP rank in ``order`` (default: rank order): a :class:`StageMemory` (``detail`` True) or just
    (reserved GiB, peak allocated GiB) (False) or (device GiB, peak allocated GiB) (``"device"``). ``static``: the
    job's :func:`_rank_static` where the caller has it."""
    m, f = job.model, job.features
    stages, vocab_padded, ranks, tail_of, sig_rows = _rank_static(job) if static is None else static
    tail_kinds = tail_of.kinds
    fkey = chunk_features(f)
    graphed_io_of = _graphed_io_of(job, cfg, fkey.graph_scope)
    for idx in range(len(stages)) if order is None else order:
        rank = stages[idx]
        comps, static, per_chunk_params, states, inflight, schedule = ranks[idx]
        row, i_best, best, best_graphed = _rank_activations(m, fkey, cfg, sig_rows[rank.pp_rank], vocab_padded,
                                                            schedule)
        chunk_saved, saved_arr, _, chunk_trans, resident = row
        if graphed_io_of is None:
            graphed_io = 0.0
        else:  # static graph I/O is held per in-flight (chunk, microbatch) like the saved activations
            totals = states @ saved_arr
            io_totals = states @ graphed_io_of[rank.pp_rank]
            i_best = int((totals + io_totals).argmax())
            graphed_io = float(io_totals[i_best])
            best = float(totals[i_best])
        best_state = inflight[i_best]
        working = chunk_trans + resident
        # Activations inside CUDA graphs come from the graphs' private pool, filled once while capturing (before
        # training, following the schedule order); replays do not allocate. The allocated peak is the larger of the
        # capture phase and the training phase (non-graphed activations + working set + static graph buffers).
        eager_peak = best + working + graphed_io
        dyn = max(eager_peak, best_graphed + (working if best_graphed else 0.0))
        alloc_bytes = static + dyn
        tail_alloc, tail_reserved, tail_non_torch = tail_kinds(best + best_graphed, alloc_bytes)
        peak = alloc_bytes / GIB + tail_alloc
        # the graph pool stays reserved while eager activations are allocated next to it
        pool_extra = max(0.0, best_graphed + eager_peak - dyn) / GIB
        reserved = peak + tail_reserved + pool_extra
        if detail == "device":
            yield reserved + tail_non_torch, peak
            continue
        if not detail:
            yield reserved, peak
            continue
        tail = tail_of(best + best_graphed, alloc_bytes)
        comps = dict(comps)  # the cached model-state components stay as they are
        comps["activations"] = best
        comps["working_set"] = working
        if graphed_io:
            comps["cuda_graph_static_io"] = graphed_io
        comp_gib = {k: v / GIB for k, v in comps.items()}
        if best_graphed:
            # capture-phase peak of the graphed part (reported; the allocated peak takes the larger phase)
            comp_gib["cuda_graph_activations"] = best_graphed / GIB
        for it in tail.items:
            comp_gib[it.name] = it.gib
        device = reserved + tail_non_torch
        chunks = [ChunkMemory(ch.vchunk, ch.layers, ch.embedding, ch.loss, ch.mtp_layers, per_chunk_params[j],
                              chunk_saved[j] / GIB, best_state[j]) for j, ch in enumerate(rank.chunks)]
        yield StageMemory(rank.pp_rank, peak, reserved, device, comp_gib, chunks)


def estimate_memory(job: Job) -> MemoryEstimate:
    """Per-PP-rank memory (peak allocated, reserved, device) with itemised components and assumptions."""
    cfg = act_config(job)
    out = list(_rank_memory(job, cfg, detail=True))
    binding = max(range(len(out)), key=lambda i: (out[i].device_gib, i))
    out[binding].binding = True
    cap = job.system.gpu.hbm_gib
    head = headroom_gib(cap)
    fits = fits_capacity(out[binding].device_gib, cap, head)
    policy = (f"fits when reserved + non-PyTorch memory (CUDA context, NCCL, DeepEP) of the binding rank leaves "
              f">= {head:.1f} GiB free (max({const('headroom')['fraction']:.0%} of HBM, "
              f"{const('headroom')['min_gib']} GiB))")
    return MemoryEstimate(
        stages=out,
        peak_allocated_gib=max(s.peak_allocated_gib for s in out),
        last_stage_peak_allocated_gib=out[-1].peak_allocated_gib,
        binding_stage=binding,
        capacity_gib=cap,
        headroom_gib=head,
        fits=fits,
        headroom_policy=policy,
        assumptions=_assumptions(job, cfg),
    )


def task_assumptions(f: Features) -> list[str]:
    """What the memory and time models assume about the job's training task (both list it; ``estimate`` merges)."""
    if f.task == "lora":
        return [f"LoRA r={f.lora_dim} alpha={f.lora_alpha} on {', '.join(f.lora_target_modules)} (Megatron-Bridge "
                "peft/lora.py): base weights frozen - no main grads or optimizer state, forward + dgrad only; BF16 "
                "adapters trainable (DP reduce and optimizer step over them alone); the frozen linears keep no input for "
                "backward, the adapters keep theirs (BF16) and their rank-r outputs",
                "fine-tuning sequences at full length seq_length (Bridge packs fine-tuning data into sequences of "
                "packed_sequence_size; without the data's sub-sequence statistics attention runs full length)"]
    if f.task == "sft":
        return ["SFT (full fine-tune) priced as pre-training, sequences at full length seq_length (Bridge packs "
                "fine-tuning data into sequences of packed_sequence_size; without the data's sub-sequence statistics "
                "attention runs full length)"]
    return []


def _assumptions(job: Job, cfg: act.ActConfig) -> list[str]:
    f = job.features
    a = [*job.assumptions, *job.model.approximations, *task_assumptions(f)]
    a.append(f"activations in {'FP8 (linear inputs) + ' if cfg.fp8 else ''}BF16; "
             f"{'unfused attention keeps a*s^2 softmax per layer' if cfg.unfused_attention else 'flash/fused attention (LSE only)'}")
    if job.model.is_moe:
        if rank_capacity_active(f):
            why = (f"HybridEP rank capacity budget {f.moe_expert_rank_capacity_factor:g}x the mean tokens"
                   + (", saved expert tensors in a paged stash of "
                      f"{const('moe_paged_stash_buffer_size_factor_cuda'):g}x the mean" if f.moe_paged_stash else ""))
        elif f.moe_expert_capacity_factor is not None and f.moe_pad_expert_input_to_capacity:
            why = f"inputs padded to capacity factor {f.moe_expert_capacity_factor:g}"
        elif f.moe_router_force_load_balancing:
            why = "force-balanced routing"
        elif f.moe_expert_capacity_factor is not None:
            why = f"capacity factor {f.moe_expert_capacity_factor:g}"
        elif cfg.routing_factor == 1.0:
            why = ("natural dropless routing assumed balanced; hot expert ranks early in training can hold more "
                   "tokens (give moe_routing_imbalance / --routing-imbalance)")
        else:
            why = "given imbalance factor"
        a.append(f"expert token load factor rho={cfg.routing_factor:g} ({why}); routing probs applied in the "
                 "expert activation (FC2 output not kept)")
    a.append("distributed optimizer shards: dense over DP*CP, experts over EDP" if f.use_distributed_optimizer
             else "no distributed optimizer: full optimizer state on every rank")
    a.append("peak = model state + in-flight microbatch activations at the schedule's worst point + one layer's "
             "backward working set; NCCL/context/DeepEP are outside torch allocated")
    return a

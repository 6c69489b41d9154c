"""Training features: recompute, offloading, dispatcher, overlaps, precision, CUDA graphs, optimizer, routing.

Field names follow Megatron-Core ``TransformerConfig`` / Bridge ``ConfigContainer`` (docs/domain.md §8); defaults
are the Megatron-Core defaults unless noted (recipes often override them).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from moetune.errors import InputError
from moetune.spec.base import FrozenSpec

Precision = Literal["bf16", "fp16", "fp8_delayed", "fp8_cs", "fp8_blockwise", "mxfp8", "nvfp4"]

#: accepted precision spellings (lower-cased, '-' and ' ' -> '_') -> canonical recipe.
#: 'fp8' alone means FP8 current (tensorwise) scaling, Bridge's default fp8_recipe (docs/domain.md §8).
PRECISION_ALIASES: dict[str, str] = {
    "bf16": "bf16", "bf16_mixed": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "fp16_mixed": "fp16",
    "fp8": "fp8_cs", "fp8_cs": "fp8_cs", "fp8_tensorwise": "fp8_cs", "tensorwise": "fp8_cs",
    "bf16_with_fp8_current_scaling_mixed": "fp8_cs", "fp8_current_scaling": "fp8_cs",
    "fp8_delayed": "fp8_delayed", "delayed": "fp8_delayed", "bf16_with_fp8_delayed_scaling_mixed": "fp8_delayed",
    "fp8_sc": "fp8_blockwise", "fp8_blockwise": "fp8_blockwise", "blockwise": "fp8_blockwise",
    "fp8_block": "fp8_blockwise", "bf16_with_fp8_subchannel_scaling_mixed": "fp8_blockwise",
    "fp8_mx": "mxfp8", "mxfp8": "mxfp8", "bf16_with_mxfp8_mixed": "mxfp8",
    "nvfp4": "nvfp4", "fp4": "nvfp4", "bf16_with_nvfp4_mixed": "nvfp4",
}

#: Bridge ``mixed_precision`` recipe name for each canonical precision
BRIDGE_MIXED_PRECISION: dict[str, str] = {
    "bf16": "bf16_mixed",
    "fp16": "fp16_mixed",
    "fp8_delayed": "bf16_with_fp8_delayed_scaling_mixed",
    "fp8_cs": "bf16_with_fp8_current_scaling_mixed",
    "fp8_blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
    "nvfp4": "bf16_with_nvfp4_mixed",
}


def parse_precision(label: str) -> str:
    """Canonical precision for a label such as 'BF16', 'FP8-CS', 'FP8-MX', 'MXFP8', 'NVFP4', 'bf16_mixed'."""
    key = label.strip().lower().replace("-", "_").replace(" ", "_")
    if key not in PRECISION_ALIASES:
        raise InputError.bad_value("precision", label, "one of BF16, FP16, FP8, FP8-CS, FP8-DS, FP8-SC, FP8-MX, "
                                   "MXFP8, NVFP4 (or a Bridge mixed_precision recipe name)")
    return PRECISION_ALIASES[key]


def precision_peak_key(precision: str) -> str:
    """Key of ``GPU.peak_tflops`` that bounds GEMMs in this precision."""
    return {"bf16": "bf16", "fp16": "bf16", "fp8_delayed": "fp8", "fp8_cs": "fp8", "fp8_blockwise": "fp8",
            "mxfp8": "fp8", "nvfp4": "nvfp4"}[precision]


RecomputeModule = Literal[
    "core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj", "mhc"
]
OffloadModule = Literal[
    "attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act", "fused_group_mlp"
]
CudaGraphScope = Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration"]


class Features(FrozenSpec):
    """Everything besides the layout that changes memory or time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # --- precision ---------------------------------------------------------------------------------------
    precision: Precision = Field(default="bf16", description="Canonical recipe; see PRECISION_ALIASES.")
    fp8_param_gather: bool = Field(default=False, description="Keep FP8 params (halves param all-gather).")
    first_last_layers_bf16: bool = Field(default=False, description="Keep first/last layers in BF16 (FP8-CS recipes).")

    # --- recompute / offload -----------------------------------------------------------------------------
    recompute_granularity: Literal["selective", "full"] | None = None
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: int | None = None
    recompute_modules: tuple[RecomputeModule, ...] = Field(
        default=(), description="Selective recompute modules (MCore default when selective and unset: core_attn)."
    )
    fine_grained_activation_offloading: bool = False
    offload_modules: tuple[OffloadModule, ...] = ()
    cpu_offloading: bool = Field(default=False, description="Layer-level activation offload (needs PP=1).")
    cpu_offloading_num_layers: int = 0
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = Field(default=0.0, ge=0.0, le=1.0)

    # --- MoE dispatch and kernels ------------------------------------------------------------------------
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] = "alltoall"
    moe_flex_dispatcher_backend: Literal["deepep", "hybridep"] | None = None
    moe_flex_dispatcher_num_sms: int | None = Field(default=None, description="None -> DeepEP 20, HybridEP 16.")
    moe_grouped_gemm: bool = True
    moe_permute_fusion: bool = True
    moe_router_fusion: bool = False
    moe_router_force_load_balancing: bool = Field(default=False, description="Benchmark-only balanced routing.")
    moe_expert_capacity_factor: float | None = Field(default=None, description="None = dropless.")
    moe_pad_expert_input_to_capacity: bool = False
    moe_routing_imbalance: float = Field(
        default=1.0, ge=1.0, description="max/mean tokens per expert rank when dropless and not force-balanced."
    )

    # --- overlap ------------------------------------------------------------------------------------------
    sequence_parallel: bool = Field(default=True, description="SP (required for MoE with TP>1; forced False at TP1).")
    overlap_moe_expert_parallel_comm: bool = False
    delay_wgrad_compute: bool = False
    moe_shared_expert_overlap: bool = False
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    overlap_p2p_comm: bool = True
    cp_comm_type: Literal["p2p", "a2a", "allgather", "a2a+p2p"] = "p2p"

    # --- CUDA graphs --------------------------------------------------------------------------------------
    cuda_graph_impl: Literal["none", "local", "transformer_engine"] = "none"
    cuda_graph_scope: tuple[CudaGraphScope, ...] = ()

    # --- optimizer ----------------------------------------------------------------------------------------
    use_distributed_optimizer: bool = True
    num_distributed_optimizer_instances: int = 1
    use_precision_aware_optimizer: bool = False
    exp_avg_dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    exp_avg_sq_dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    main_grads_dtype: Literal["fp32", "bf16"] = "fp32"
    main_params_dtype: Literal["fp32", "fp16"] = "fp32"
    grad_reduce_in_fp32: bool = True
    use_megatron_fsdp: bool = False
    data_parallel_sharding_strategy: Literal["no_shard", "optim", "optim_grads", "optim_grads_params"] = "no_shard"

    # --- runtime environment --------------------------------------------------------------------------------
    expandable_segments: bool = Field(default=False, description="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    manual_gc: bool = False

    # --- attention / loss kernels (memory: unfused attention keeps a*s^2 score tensors) -------------------
    attention_backend: Literal["auto", "flash", "fused", "unfused", "local"] = Field(
        default="auto", description="Megatron --attention-backend / Bridge model.attention_backend."
    )
    transformer_impl: Literal["transformer_engine", "local"] = Field(
        default="transformer_engine", description="--transformer-impl (local = unfused attention, torch linears)."
    )
    attention_dropout: float = Field(default=0.1, ge=0.0, lt=1.0, description="TransformerConfig default 0.1.")
    hidden_dropout: float = Field(default=0.1, ge=0.0, lt=1.0, description="TransformerConfig default 0.1.")
    cross_entropy_loss_fusion: bool = Field(default=False, description="--cross-entropy-loss-fusion.")
    cross_entropy_fusion_impl: Literal["native", "te"] = Field(
        default="native", description="--cross-entropy-fusion-impl (te: TE parallel cross entropy, BF16 grad in place)."
    )

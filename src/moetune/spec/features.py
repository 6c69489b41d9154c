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

#: precisions whose recipe quantises the linear layers (TE ``fp8_autocast`` / FP4 recipes): every canonical
#: precision but BF16 and FP16
FP8_PRECISIONS = frozenset({"fp8_delayed", "fp8_cs", "fp8_blockwise", "mxfp8", "nvfp4"})

#: accepted precision spellings (lower-cased, '-' and ' ' -> '_') -> canonical recipe.
#: 'fp8' alone means FP8 current (tensorwise) scaling, Bridge's default fp8_recipe (docs/domain.md §8).
PRECISION_ALIASES: dict[str, str] = {
    "bf16": "bf16", "bf16_mixed": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "fp16_mixed": "fp16",
    "fp8": "fp8_cs", "fp8_cs": "fp8_cs", "fp8_tensorwise": "fp8_cs", "tensorwise": "fp8_cs",
    "bf16_with_fp8_current_scaling_mixed": "fp8_cs", "fp8_current_scaling": "fp8_cs",
    "fp8_delayed": "fp8_delayed", "fp8_ds": "fp8_delayed", "delayed": "fp8_delayed", "bf16_with_fp8_delayed_scaling_mixed": "fp8_delayed",
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


#: the labels an error message offers (the Bridge performance tables' spellings); each one parses
PRECISION_LABELS = ("BF16", "FP16", "FP8", "FP8-CS", "FP8-DS", "FP8-SC", "FP8-MX", "MXFP8", "NVFP4")


#: Transformer Engine's switch of the CuTeDSL fused grouped MLP, read once at import as
#: ``int(os.environ.get(name, "0")) > 0`` (transformer_engine/pytorch/ops/fused/grouped_mlp.py
#: ``_GroupedMLP_CuTeGEMMBase.is_supported``; :func:`env_flag_on`)
CUTEDSL_FUSED_GROUPED_MLP_ENV = "NVTE_CUTEDSL_FUSED_GROUPED_MLP"
#: the GLU interleave width the fused kernels require (``moe_mlp_glu_interleave_size``; TE ``validate_grouped_mlp_dims``)
FUSED_GROUPED_MLP_GLU_INTERLEAVE = 32
#: FC1 input and expert widths must be multiples of this (TE ``validate_grouped_mlp_dims``)
FUSED_GROUPED_MLP_DIM_ALIGN = 64


def env_flag_on(value: object) -> bool:
    """TE's reading of an integer switch variable: on when its integer value is > 0 (unset, empty or not an integer
    counts as off)."""
    try:
        return int(str(value).strip()) > 0
    except (TypeError, ValueError):
        return False


def parse_precision(label: str) -> str:
    """Canonical precision for a label such as 'BF16', 'FP8-CS', 'FP8-MX', 'MXFP8', 'NVFP4', 'bf16_mixed'."""
    key = label.strip().lower().replace("-", "_").replace(" ", "_")
    if key not in PRECISION_ALIASES:
        raise InputError.bad_value("precision", label, f"one of {', '.join(PRECISION_LABELS)} "
                                   "(or a Bridge mixed_precision recipe name)")
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
#: the linear layers a LoRA adapter can wrap (Megatron-Bridge ``peft/lora.py`` ``LoRA.target_modules``: the fused QKV
#: projection, the attention output projection, the MLP / expert FC1 (fused gate+up) and FC2)
LoraTarget = Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
#: Bridge ``LoRA`` defaults (``peft/lora.py``: ``dim = 32``, ``alpha = 32``, every linear of the layer)
LORA_DEFAULT_TARGETS: tuple[str, ...] = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
TrainingTask = Literal["pretrain", "sft", "lora"]
CudaGraphScope = Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration"]


class Features(FrozenSpec):
    """Everything besides the layout that changes memory or time.

    Each field names its Megatron-LM flag (``--x``; TransformerConfig / DDP / optimizer config attribute of the same
    name unless noted) and the Megatron-Bridge ``ConfigContainer`` path (``model.``, ``ddp.``, ``optimizer.``,
    ``train.``). Defaults are the Megatron-Core defaults unless noted; counts are plain numbers, fractions are in
    [0, 1].
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # --- precision ---------------------------------------------------------------------------------------
    precision: Precision = Field(
        default="bf16", description="Canonical mixed-precision recipe (PRECISION_ALIASES). Megatron --bf16 / --fp16 "
        "with --fp8-format/--fp8-recipe or --fp4-format/--fp4-recipe; Bridge mixed_precision (recipe names in "
        "BRIDGE_MIXED_PRECISION). Default bf16.")
    fp8_param_gather: bool = Field(
        default=False, description="Keep the parameters in FP8 and all-gather them in FP8 (halves the param "
        "all-gather; no separate FP8 weight cache). --fp8-param-gather; Bridge ddp.fp8_param_gather. Default False.")
    first_last_layers_bf16: bool = Field(
        default=False, description="Run the first and last decoder layers in BF16 inside an FP8/FP4 recipe. "
        "--first-last-layers-bf16; Bridge model.first_last_layers_bf16. Default False (FP8-CS recipes set it).")
    fp8_dot_product_attention: bool = Field(
        default=False, description="Run the attention matmuls (QK^T, PV) in FP8 inside an FP8 recipe (Transformer "
        "Engine DotProductAttention with fp8_dpa: cuDNN FP8 fused attention). Bridge "
        "mixed_precision.fp8_dot_product_attention (Megatron-LM has no flag for it). Default False.")

    # --- recompute / offload -----------------------------------------------------------------------------
    recompute_granularity: Literal["selective", "full"] | None = Field(
        default=None, description="Activation recompute: 'selective' (the modules in recompute_modules) or 'full' "
        "(whole layers, with recompute_method / recompute_num_layers). --recompute-granularity; Bridge "
        "model.recompute_granularity. Default None (no recompute).")
    recompute_method: Literal["uniform", "block"] | None = Field(
        default=None, description="With full recompute: 'uniform' (every layer, in groups of recompute_num_layers "
        "keeping one input per group) or 'block' (the first recompute_num_layers layers of each pipeline chunk). "
        "--recompute-method; Bridge model.recompute_method. Default None (MCore then uses uniform).")
    recompute_num_layers: int | None = Field(
        default=None, description="Layers per recompute group (uniform) or recomputed layers per chunk (block), a "
        "count. --recompute-num-layers; Bridge model.recompute_num_layers. Default None (1).")
    recompute_modules: tuple[RecomputeModule, ...] = Field(
        default=(), description="Modules recomputed by selective recompute. --recompute-modules; Bridge "
        "model.recompute_modules. Default () (MCore default when selective and unset: core_attn).")
    fine_grained_activation_offloading: bool = Field(
        default=False, description="Offload the activations of offload_modules to host memory, layer by layer. "
        "--fine-grained-activation-offloading; Bridge model.fine_grained_activation_offloading. Default False.")
    offload_modules: tuple[OffloadModule, ...] = Field(
        default=(), description="Modules whose saved activations fine-grained offloading moves to the host. "
        "--offload-modules; Bridge model.offload_modules. Default ().")
    cpu_offloading: bool = Field(
        default=False, description="Layer-level activation offload to the host (needs PP=1). --cpu-offloading; "
        "Bridge model.cpu_offloading. Default False.")
    cpu_offloading_num_layers: int = Field(
        default=0, description="Decoder layers whose activations cpu_offloading moves to the host, a count. "
        "--cpu-offloading-num-layers; Bridge model.cpu_offloading_num_layers. Default 0.")
    optimizer_cpu_offload: bool = Field(
        default=False, description="Keep (part of) the optimizer state and step on the host (HybridDeviceOptimizer). "
        "--optimizer-cpu-offload; Bridge optimizer.optimizer_cpu_offload. Default False.")
    optimizer_offload_fraction: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Fraction of the optimizer state offloaded when "
        "optimizer_cpu_offload is on, in [0, 1]. --optimizer-offload-fraction; Bridge "
        "optimizer.optimizer_offload_fraction. Default 0.0 here (Megatron's default is 1.0; moetune reads the "
        "value given).")

    # --- MoE dispatch and kernels ------------------------------------------------------------------------
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] = Field(
        default="alltoall", description="MoE token dispatcher: all-gather, all-to-all, or flex (DeepEP / HybridEP "
        "kernels, moe_flex_dispatcher_backend). --moe-token-dispatcher-type; Bridge model.moe_token_dispatcher_type. "
        "Default alltoall (MCore's default is allgather; every shipped recipe sets it).")
    moe_flex_dispatcher_backend: Literal["deepep", "hybridep"] | None = Field(
        default=None, description="Kernels of the flex dispatcher. --moe-flex-dispatcher-backend; Bridge "
        "model.moe_flex_dispatcher_backend. Default None (deepep when the dispatcher is flex).")
    moe_flex_dispatcher_num_sms: int | None = Field(
        default=None, description="SMs the flex dispatcher's kernels occupy, a count. --moe-flex-dispatcher-num-sms "
        "(per backend: --moe-deepep-num-sms, --moe-hybridep-num-sms); Bridge model.moe_flex_dispatcher_num_sms. "
        "None -> DeepEP 20, HybridEP 16 (efficiency constants deepep_sms / hybridep_sms).")
    moe_grouped_gemm: bool = Field(
        default=True, description="Run the local experts as one grouped GEMM (TE GroupedLinear). --moe-grouped-gemm; "
        "Bridge model.moe_grouped_gemm. Default True here (Megatron's default is False; every MoE recipe sets it).")
    moe_permute_fusion: bool = Field(
        default=True, description="Fused token permute/unpermute kernels. --moe-permute-fusion; Bridge "
        "model.moe_permute_fusion. Default True here (Megatron's default is False; recipes set it).")
    moe_router_fusion: bool = Field(
        default=False, description="Fused router top-k / score kernels. --moe-router-fusion; Bridge "
        "model.moe_router_fusion. Default False.")
    moe_router_force_load_balancing: bool = Field(
        default=False, description="Benchmark-only routing that sends every expert the mean load (MOE-031). "
        "--moe-router-force-load-balancing; Bridge model.moe_router_force_load_balancing. Default False.")
    moe_expert_capacity_factor: float | None = Field(
        default=None, description="Expert capacity as a multiple of the mean tokens per expert; tokens above it are "
        "dropped. --moe-expert-capacity-factor; Bridge model.moe_expert_capacity_factor. Default None (dropless).")
    moe_pad_expert_input_to_capacity: bool = Field(
        default=False, description="Pad every expert's input to the capacity (static shapes: drop-and-pad; needs a "
        "capacity factor). --moe-pad-expert-input-to-capacity; Bridge model.moe_pad_expert_input_to_capacity. "
        "Default False.")
    moe_expert_rank_capacity_factor: float | None = Field(
        default=None, gt=0, description="Static per-rank token budget of the HybridEP dispatcher, as a multiple of "
        "the rank's mean routed tokens (local tokens x top-k): the receive and expert buffers have that fixed size, "
        "so dispatch needs no host sync and the MoE layer can be captured in a whole-iteration CUDA graph. Tokens "
        "above it are dropped in the step, which Megatron-LM then reruns dropless (PagedStashRunner), so training "
        "stays dropless. Needs the flex dispatcher with HybridEP and the TE op fuser (MOE-044; Megatron-Core "
        "TransformerConfig.moe_expert_rank_capacity_factor, moe/token_dispatcher.py _HybridEPManager.setup_metadata). "
        "--moe-expert-rank-capacity-factor; Bridge model.moe_expert_rank_capacity_factor. Default None (dynamic "
        "shapes).")
    moe_paged_stash: bool = Field(
        default=False, description="Keep the expert MLP's saved activations in a paged stash sized by the mean "
        "token load (moe_paged_stash_buffer_size_factor_cuda x mean) instead of the rank capacity budget; needs "
        "moe_expert_rank_capacity_factor (OFF-019; Megatron-Core moe/paged_stash.py). --moe-paged-stash; Bridge "
        "model.moe_paged_stash. Default False.")
    cutedsl_fused_grouped_mlp: bool = Field(
        default=False, description="Transformer Engine's CuTeDSL fused grouped MLP for the routed experts: one "
        "cuDNN-frontend kernel runs FC1's grouped GEMM with the GLU / squared-ReLU activation, the router-probability "
        "scaling and the quantisation of FC2's input in its epilogue, and one runs FC2's data-gradient GEMM with the "
        "activation backward (TE ops/fused/grouped_mlp.py GroupedMLP_CuTeGEMMGLU / GroupedMLP_CuTeGEMMUnary). Runs "
        "only on SM 10.x (B200, B300, GB200, GB300) with an MXFP8 or NVFP4 recipe, ETP 1 and 32-wide GLU "
        "interleaving (rules MOE-090..MOE-095). Launch: environment NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 with "
        "--use-transformer-engine-op-fuser and --moe-mlp-glu-interleave-size 32 (Bridge model."
        "use_transformer_engine_op_fuser, model.moe_mlp_glu_interleave_size = 32: the cutedsl_fused_grouped_mlp "
        "preset field of scripts/performance/utils/overrides.py). Default False.")
    moe_routing_imbalance: float = Field(
        default=1.0, ge=1.0, description="moetune input, no Megatron flag: max/mean tokens per expert rank when "
        "dropless and not force-balanced (>= 1; moetune.perfmodel.routing.expert_load). Default 1.0 (balanced).")

    # --- overlap ------------------------------------------------------------------------------------------
    sequence_parallel: bool = Field(
        default=True, description="Sequence parallelism over the TP group (required for MoE with TP>1; forced False "
        "at TP1). --sequence-parallel; Bridge model.sequence_parallel. Default True here (Megatron's default is "
        "False).")
    overlap_moe_expert_parallel_comm: bool = Field(
        default=False, description="Hide the EP dispatch/combine behind another microbatch's compute (1F1B "
        "A2A overlap). --overlap-moe-expert-parallel-comm; Bridge model.overlap_moe_expert_parallel_comm. "
        "Default False.")
    delay_wgrad_compute: bool = Field(
        default=False, description="Delay the expert weight-gradient GEMMs behind the dispatch (with EP overlap). "
        "--delay-wgrad-compute; Bridge model.delay_wgrad_compute. Default False.")
    moe_shared_expert_overlap: bool = Field(
        default=False, description="Run the shared experts concurrently with the dispatch. "
        "--moe-shared-expert-overlap; Bridge model.moe_shared_expert_overlap. Default False.")
    tp_comm_overlap: bool = Field(
        default=False, description="TE userbuffers overlap of the TP all-gather/reduce-scatter with the GEMMs "
        "(needs sequence_parallel). --tp-comm-overlap; Bridge model.tp_comm_overlap. Default False.")
    overlap_grad_reduce: bool = Field(
        default=True, description="Overlap the DP gradient reduce(-scatter) with the backward pass. "
        "--overlap-grad-reduce; Bridge ddp.overlap_grad_reduce. Default True here (Megatron's default is False; "
        "recipes set it).")
    overlap_param_gather: bool = Field(
        default=True, description="Overlap the distributed optimizer's parameter all-gather with the forward pass. "
        "--overlap-param-gather; Bridge ddp.overlap_param_gather. Default True here (Megatron's default is False; "
        "recipes set it).")
    overlap_p2p_comm: bool = Field(
        default=True, description="Overlap the pipeline send/recv with compute. On unless "
        "--no-overlap-p2p-communication (config overlap_p2p_comm); Bridge model.overlap_p2p_comm. Default True.")
    cp_comm_type: Literal["p2p", "a2a", "allgather", "a2a+p2p"] = Field(
        default="p2p", description="Context-parallel attention communication: ring p2p, all-to-all (Ulysses), "
        "all-gather, or hierarchical a2a+p2p. --cp-comm-type; Bridge model.cp_comm_type. Default p2p.")

    # --- CUDA graphs --------------------------------------------------------------------------------------
    cuda_graph_impl: Literal["none", "local", "transformer_engine"] = Field(
        default="none", description="CUDA-graph implementation: MCore's own (local) or TE make_graphed_callables. "
        "--cuda-graph-impl; Bridge model.cuda_graph_impl. Default none.")
    cuda_graph_scope: tuple[CudaGraphScope, ...] = Field(
        default=(), description="Parts captured in CUDA graphs. --cuda-graph-scope; Bridge model.cuda_graph_scope. "
        "Default () (graphs on: whole layers).")

    # --- optimizer ----------------------------------------------------------------------------------------
    use_distributed_optimizer: bool = Field(
        default=True, description="Shard the optimizer state over the data-parallel ranks (ZeRO-1). "
        "--use-distributed-optimizer; Bridge ddp.use_distributed_optimizer. Default True here (Megatron's default "
        "is False; recipes set it).")
    num_distributed_optimizer_instances: int = Field(
        default=1, description="Distributed-optimizer replicas (the shard group is DP / instances), a count. "
        "--num-distributed-optimizer-instances; Bridge ddp.num_distributed_optimizer_instances. Default 1.")
    use_precision_aware_optimizer: bool = Field(
        default=False, description="TE FusedAdam with the moment / master dtypes below. "
        "--use-precision-aware-optimizer; Bridge optimizer.use_precision_aware_optimizer. Default False.")
    exp_avg_dtype: Literal["fp32", "bf16", "fp16", "fp8"] = Field(
        default="fp32", description="Adam first-moment dtype (with the precision-aware optimizer). --exp-avg-dtype; "
        "Bridge optimizer.exp_avg_dtype. Default fp32.")
    exp_avg_sq_dtype: Literal["fp32", "bf16", "fp16", "fp8"] = Field(
        default="fp32", description="Adam second-moment dtype (with the precision-aware optimizer). "
        "--exp-avg-sq-dtype; Bridge optimizer.exp_avg_sq_dtype. Default fp32.")
    main_grads_dtype: Literal["fp32", "bf16"] = Field(
        default="fp32", description="Dtype of the main gradient buffers. --main-grads-dtype; Bridge "
        "optimizer.main_grads_dtype. Default fp32.")
    main_params_dtype: Literal["fp32", "fp16"] = Field(
        default="fp32", description="Dtype of the optimizer's master weights. --main-params-dtype; Bridge "
        "optimizer.main_params_dtype. Default fp32.")
    grad_reduce_in_fp32: bool = Field(
        default=True, description="Reduce the gradients over DP in FP32. --accumulate-allreduce-grads-in-fp32; "
        "Bridge ddp.grad_reduce_in_fp32. Default True here (Megatron's default is False; recipes set it).")
    use_megatron_fsdp: bool = Field(
        default=False, description="Megatron-FSDP: shard weights/grads/optimizer state per "
        "data_parallel_sharding_strategy. --use-megatron-fsdp; Bridge ddp.use_megatron_fsdp. Default False.")
    data_parallel_sharding_strategy: Literal["no_shard", "optim", "optim_grads", "optim_grads_params"] = Field(
        default="no_shard", description="What Megatron-FSDP shards over DP: nothing, optimizer state, + grads, + "
        "params. --data-parallel-sharding-strategy; Bridge ddp.data_parallel_sharding_strategy. Default no_shard.")

    # --- training task (pre-training, full fine-tune, LoRA) -----------------------------------------------
    task: TrainingTask = Field(
        default="pretrain", description="What the job trains: 'pretrain' (every weight), 'sft' (full fine-tune: "
        "every weight, priced as pre-training) or 'lora' (frozen base weights with low-rank adapters: the base "
        "linears run forward and dgrad only and carry no main gradient or optimizer state, Megatron-Bridge "
        "peft/lora.py). Bridge: a ``peft`` section (LoRA) or a finetune dataset; Megatron-LM has no LoRA. "
        "Default pretrain.")
    lora_dim: int = Field(
        default=32, gt=0, description="LoRA rank r, a count (> 0): adapter A is in x r, B is r x out. Bridge "
        "peft.dim. Default 32 (Bridge LoRA default; the Llama-3-70B perf recipes use 16).")
    lora_alpha: int = Field(
        default=32, gt=0, description="LoRA scaling alpha (output scaled by alpha / r; no effect on memory or "
        "time). Bridge peft.alpha. Default 32.")
    lora_target_modules: tuple[LoraTarget, ...] = Field(
        default=LORA_DEFAULT_TARGETS, description="Linear layers that get a LoRA adapter. Bridge "
        "peft.target_modules. Default every linear (linear_qkv, linear_proj, linear_fc1, linear_fc2).")

    # --- runtime environment --------------------------------------------------------------------------------
    expandable_segments: bool = Field(
        default=False, description="PyTorch allocator expandable segments (less fragmentation). Environment "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, no Megatron flag. Default False.")
    manual_gc: bool = Field(
        default=False, description="Disable Python's automatic GC and collect at fixed steps. --manual-gc; Bridge "
        "train.manual_gc. Default False.")

    # --- attention / loss kernels (memory: unfused attention keeps a*s^2 score tensors) -------------------
    attention_backend: Literal["auto", "flash", "fused", "unfused", "local"] = Field(
        default="auto", description="Attention kernel choice. --attention-backend; Bridge model.attention_backend. "
        "Default auto.")
    apply_rope_fusion: bool = Field(
        default=True, description="Fused RoPE kernel (TE fused_apply_rotary_pos_emb) on Q and K; False runs "
        "Megatron-Core's unfused _apply_rotary_pos_emb_bshd (rotate-half, two multiplies, an add: several "
        "elementwise kernels). --no-rope-fusion; Bridge model.apply_rope_fusion. Default True (Megatron-LM's "
        "argparse default; MLM sets it False for non-RoPE position embeddings, where nothing is rotated).")
    transformer_impl: Literal["transformer_engine", "local"] = Field(
        default="transformer_engine", description="Layer implementation (local = unfused attention, torch "
        "linears). --transformer-impl; Bridge: the model provider's layer spec. Default transformer_engine.")
    attention_dropout: float = Field(
        default=0.1, ge=0.0, lt=1.0, description="Dropout probability after the attention softmax, in [0, 1) (> 0 "
        "keeps a mask). --attention-dropout; Bridge model.attention_dropout. Default 0.1.")
    hidden_dropout: float = Field(
        default=0.1, ge=0.0, lt=1.0, description="Dropout probability on the residual branches, in [0, 1) (> 0 keeps "
        "masks). --hidden-dropout; Bridge model.hidden_dropout. Default 0.1.")
    cross_entropy_loss_fusion: bool = Field(
        default=False, description="Fused vocab-parallel cross entropy. --cross-entropy-loss-fusion; Bridge "
        "model.cross_entropy_loss_fusion. Default False.")
    cross_entropy_fusion_impl: Literal["native", "te"] = Field(
        default="native", description="Fused cross-entropy kernel (te: TE parallel cross entropy, BF16 grad in "
        "place). --cross-entropy-fusion-impl; Bridge model.cross_entropy_fusion_impl. Default native.")

"""(c) Communication overlap: EP overlap / delayed wgrad, TP overlap, DP overlap, PP overlap (docs/rules.md §4).

Sources: MCore ``transformer_config.py`` (TC L2763-2857), ``model_parallel_config.py`` (MPC),
``pipeline_parallel/schedules.py``, ``distributed/distributed_data_parallel_config.py``,
``optimizer/optimizer_config.py``; Bridge ``training/comm_overlap.py`` (B/ovl), ``training/config.py`` (B/cfg).
"""

from __future__ import annotations

from moetune.rules.common import ENV, I_, RT, W_, E, ovl, rewritten_on_model
from moetune.rules.engine import UNKNOWN, Ctx, any_of, rule

A = "overlap"


def _off(c: Ctx, *fields: str) -> dict:
    out: dict = {}
    for f in fields:
        out.update(ovl(c, f, False))
    return out


def _ep_off(c: Ctx) -> dict:
    return _off(c, "overlap_moe_expert_parallel_comm", "delay_wgrad_compute")


def _pre_blackwell(c: Ctx):
    return c.gpu_is(lambda cc, name: cc[0] < 10)


rule("OVL-001", A, ENV, "C", ["model.overlap_moe_expert_parallel_comm", "env.torch"],
     lambda c: c.ep_overlap and c.torch_below("2.6.0"),
     "EP all-to-all overlap hangs with PyTorch < 2.6", "TC L2763; B/ovl", fix=_ep_off, env=("PyTorch version",))
rule("OVL-002", A, E, "C", ["model.overlap_moe_expert_parallel_comm", "model.pipeline_model_parallel_size",
                            "model.virtual_pipeline_model_parallel_size"],
     lambda c: c.ep_overlap and c.pp > 1 and c.vpp is None,
     "EP overlap with pipeline parallelism requires virtual pipeline (VPP) to be set", "TC L2767; B/ovl",
     fix=lambda c: {"model.virtual_pipeline_model_parallel_size": 2} if c.num_layers and c.num_layers % (2 * c.pp) == 0
     else _ep_off(c))
rule("OVL-003", A, E, "C", ["model.overlap_moe_expert_parallel_comm", "model.expert_model_parallel_size"],
     lambda c: c.ep_overlap and (c.ep <= 1 or (c.num_experts is not None and c.num_experts <= 1)),
     "EP overlap requires expert parallelism (EP > 1)", "TC L2772; B/ovl", fix=_ep_off)
rule("OVL-004", A, E, "C", ["model.overlap_moe_expert_parallel_comm", "model.moe_token_dispatcher_type"],
     lambda c: c.ep_overlap and c.dispatcher not in ("alltoall", "flex"),
     "EP overlap requires the alltoall or flex dispatcher", "TC L2775; B/ovl",
     fix={"model.moe_token_dispatcher_type": "alltoall"})
rule("OVL-005", A, E, "C", ["model.overlap_moe_expert_parallel_comm", "model.recompute_granularity",
                            "model.recompute_method", "model.recompute_num_layers", "model.recompute_modules"],
     lambda c: c.ep_overlap and (c.m("recompute_granularity") == "full" or c.m("recompute_method") is not None
                                 or c.m("recompute_num_layers") is not None or "moe" in c.rmods),
     "EP overlap does not support full recompute, a recompute method/layer count, or 'moe' recompute",
     "TC L2780-2789; B/ovl",
     fix=lambda c: {"model.recompute_granularity": "selective" if c.rmods else None, "model.recompute_method": None,
                    "model.recompute_num_layers": None,
                    **({"model.recompute_modules": [m for m in c.rmods if m != "moe"]} if "moe" in c.rmods else {}),
                    **({"model.moe_layer_recompute": False} if c.m("moe_layer_recompute") else {})})
rule("OVL-006", A, E, "C", ["model.overlap_moe_expert_parallel_comm", "model.bf16", "model.fp16"],
     lambda c: c.ep_overlap and not (c.m("bf16") or c.m("fp16")),
     "EP overlap supports only bf16 or fp16 models", "TC L2794; B/ovl",
     fix=lambda c: {"mixed_precision.bf16": True, "mixed_precision.params_dtype": "bfloat16"}
     if c.bridge and isinstance(c.raw.get("mixed_precision"), dict) else {"model.bf16": True})
rule("OVL-007", A, E, "C", ["model.overlap_moe_expert_parallel_comm", "model.moe_shared_expert_overlap"],
     lambda c: c.ep_overlap and bool(c.m("moe_shared_expert_overlap")),
     "EP overlap requires moe_shared_expert_overlap=False (DeepSeek bridges default it to True)", "TC L2798; B/ovl",
     fix={"model.moe_shared_expert_overlap": False})
rule("OVL-008", A, E, "C", ["model.overlap_moe_expert_parallel_comm", "model.mtp_num_layers", "env.mcore"],
     lambda c: c.ep_overlap and (
         c.m("mtp_num_layers") not in (None, 0, 1)
         # before NVIDIA/Megatron-LM#5912 (merged 2026-07-20, in megatron-core 0.20) the check was
         # `mtp_num_layers is None or == 1`, rejecting 0 (hybrid providers default to 0; Megatron-LM#5921)
         or (c.m("mtp_num_layers") == 0 and c.mcore_below("0.20.0") is True)),
     "MTP layernum only supports 1 when enabling overlap_moe_expert_parallel_comm", "TC L2801; B/ovl",
     fix=lambda c: {"model.mtp_num_layers": 1 if c.m("mtp_num_layers") else None})
rule("OVL-009", A, E, "C", ["model.overlap_moe_expert_parallel_comm", "model.moe_flex_dispatcher_backend",
                            "model.offload_modules"],
     lambda c: c.ep_overlap and c.flex_backend == "ncclep" and bool(c.m("fine_grained_activation_offloading"))
     and "expert_fc1" in (c.m("offload_modules") or []),
     "EP overlap with ncclep does not support offloading expert_fc1", "TC L2813",
     fix=lambda c: {"model.offload_modules": [m for m in c.m("offload_modules") if m != "expert_fc1"]})
rule("OVL-010", A, E, "C", ["model.overlap_moe_expert_parallel_comm", "model.cuda_graph_impl",
                            "model.cuda_graph_modules"],
     lambda c: c.ep_overlap and c.te_graph and ("moe" in c.cg_mods or "mlp" in c.cg_mods),
     "EP overlap is not supported with TE CUDA graphs capturing moe/mlp (allowed: attn, moe_router, moe_preprocess)",
     "TC L2824", fix={"model.cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"],
                      "model.cuda_graph_scope": None})
rule("OVL-010b", A, RT, "R", ["model.overlap_moe_expert_parallel_comm", "model.cuda_graph_impl",
                              "model.cuda_graph_modules"],
     lambda c: c.ep_overlap and c.te_graph and not c.cg_mods,
     "EP overlap must be disabled when the CUDA graph captures the whole layer (empty module list)",
     "transformer_layer.py _te_cuda_graph_replay_impl",
     fix={"model.cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"], "model.cuda_graph_scope": None})
rule("OVL-011", A, RT, "R", ["model.overlap_moe_expert_parallel_comm",
                             "model.num_microbatches_with_partial_activation_checkpoints"],
     lambda c: c.ep_overlap and c.m("num_microbatches_with_partial_activation_checkpoints") is not None,
     "partial per-microbatch checkpointing is unsupported with EP overlap", "pipeline_parallel/combined_1f1b.py",
     fix={"model.num_microbatches_with_partial_activation_checkpoints": None})
rule("OVL-012", A, RT, "B", ["model.overlap_moe_expert_parallel_comm", "ddp.use_megatron_fsdp",
                             "ddp.fsdp_double_buffer", "model.cuda_graph_impl", "model.pipeline_model_parallel_size"],
     lambda c: c.ep_overlap and c.fsdp and (
         bool(c.get("ddp.fsdp_double_buffer")) or c.per_layer_graph or c.pp > 1),
     "EP overlap with Megatron-FSDP needs PP=1, no fsdp_double_buffer and no per-layer CUDA graphs",
     "distributed/fsdp/mcore_fsdp_adapter.py; combined_1f1b.py",
     fix={"ddp.fsdp_double_buffer": False, "model.pipeline_model_parallel_size": 1,
          "model.virtual_pipeline_model_parallel_size": None, "model.cuda_graph_impl": "none"})
rule("OVL-013", A, W_, "C", ["comm_overlap"],
     lambda c: c.bridge and isinstance(c.raw.get("comm_overlap"), dict) and rewritten_on_model(
         c, ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "tp_comm_overlap",
             "defer_embedding_wgrad_compute", "wgrad_deferral_limit", "overlap_p2p_comm", "batch_p2p_comm")),
     "model overlap fields set directly are overwritten by CommOverlapConfig; set them on comm_overlap.*",
     "B/ovl _get_model_comm_overlap_cfgs, _apply_cfgs")
rule("OVL-014", A, W_, "C", ["dataset.packing_buffer_size", "model.overlap_moe_expert_parallel_comm"],
     lambda c: c.get("dataset.packing_buffer_size") is not None and bool(
         c.raw_get("model.overlap_moe_expert_parallel_comm") or c.raw_get("comm_overlap.overlap_moe_expert_parallel_comm")
         or c.raw_get("model.delay_wgrad_compute") or c.raw_get("comm_overlap.delay_wgrad_compute")),
     "Energon native packing disables EP overlap and delayed wgrad", "B/cfg _disable_native_energon_packing_moe_overlap")
rule("OVL-015", A, E, "C", ["model.delay_wgrad_compute", "model.overlap_moe_expert_parallel_comm"],
     lambda c: bool(c.m("delay_wgrad_compute")) and not c.ep_overlap,
     "delay_wgrad_compute requires overlap_moe_expert_parallel_comm", "TC L2834; B/ovl",
     fix=lambda c: _off(c, "delay_wgrad_compute"))
rule("OVL-016", A, ENV, "B", ["model.delay_wgrad_compute", "env.te"],
     lambda c: bool(c.m("delay_wgrad_compute")) and c.te_below("2.3.0"),
     "only Transformer Engine >= 2.3 supports delay_wgrad_compute", "extensions/transformer_engine.py",
     fix=lambda c: _off(c, "delay_wgrad_compute"), env=("Transformer Engine version",))
rule("OVL-017", A, ENV, "C", ["model.delay_wgrad_compute", "model.cuda_graph_impl", "env.te"],
     lambda c: bool(c.m("delay_wgrad_compute")) and c.te_graph and c.te_below("2.10.0"),
     "delayed wgrad with TE CUDA graphs needs Transformer Engine >= 2.10", "TC L2838",
     fix=lambda c: _off(c, "delay_wgrad_compute"), env=("Transformer Engine version",))
rule("OVL-018", A, ENV, "C", ["model.delay_wgrad_compute", "ddp.overlap_grad_reduce",
                              "model.gradient_accumulation_fusion", "env.te"],
     lambda c: c.bridge and bool(c.raw_get("comm_overlap.delay_wgrad_compute")) and (
         bool(c.get("ddp.overlap_grad_reduce")) or bool(c.m("gradient_accumulation_fusion"))) and c.te_below("2.7.0"),
     "delayed wgrad with overlap_grad_reduce or gradient-accumulation fusion needs Transformer Engine >= 2.7",
     "B/ovl", fix=lambda c: _off(c, "delay_wgrad_compute"), env=("Transformer Engine version",))


def _ovl019_cfg(c: Ctx) -> bool:
    if not (c.bridge and c.raw_get("comm_overlap.delay_wgrad_compute")):
        return False
    scopes = set(c.m("_cuda_graph_modules_raw") or []) | set(c.cg_mods)
    attn = "attn" in scopes
    router = "moe_router" in scopes and c.has_shared_experts and not c.m("moe_shared_expert_overlap")
    return attn or router


rule("OVL-019", A, E, "C", ["model.delay_wgrad_compute", "model.cuda_graph_modules",
                            "model.gradient_accumulation_fusion", "model.add_bias_linear", "model.add_qkv_bias"],
     lambda c: _ovl019_cfg(c) and (not c.m("gradient_accumulation_fusion") or (
         "attn" in (set(c.m("_cuda_graph_modules_raw") or []) | set(c.cg_mods))
         and bool(c.m("add_bias_linear") or c.m("add_qkv_bias")))),
     "delayed wgrad with attn/moe_router captured in a CUDA graph needs gradient_accumulation_fusion=True and no "
     "attention bias", "B/ovl",
     fix=lambda c: {"model.gradient_accumulation_fusion": True, "model.add_bias_linear": False,
                    "model.add_qkv_bias": False})
rule("OVL-019e", A, ENV, "C", ["model.delay_wgrad_compute", "model.cuda_graph_modules", "env.te"],
     lambda c: _ovl019_cfg(c) and c.te_below("2.12.0"),
     "delayed wgrad with attn/moe_router captured in a CUDA graph needs Transformer Engine >= 2.12", "B/ovl",
     fix=lambda c: _off(c, "delay_wgrad_compute"), env=("Transformer Engine version",))
rule("OVL-020", A, E, "C", ["model.overlap_dispatch_backward_with_experts_wgrad",
                            "model.overlap_moe_expert_parallel_comm", "model.delay_wgrad_compute"],
     lambda c: bool(c.m("overlap_dispatch_backward_with_experts_wgrad")) and (
         c.ep_overlap or bool(c.m("delay_wgrad_compute"))),
     "overlap_dispatch_backward_with_experts_wgrad is mutually exclusive with EP overlap and delayed wgrad",
     "TC L2844-2851", fix={"model.overlap_dispatch_backward_with_experts_wgrad": False})
rule("OVL-020e", A, ENV, "C", ["model.overlap_dispatch_backward_with_experts_wgrad", "env.te"],
     lambda c: bool(c.m("overlap_dispatch_backward_with_experts_wgrad")) and c.te_below("2.3.0"),
     "overlap_dispatch_backward_with_experts_wgrad needs Transformer Engine >= 2.3", "TC L2851",
     fix={"model.overlap_dispatch_backward_with_experts_wgrad": False}, env=("Transformer Engine version",))
rule("OVL-021", A, E, "C", ["model.ep_overlap_early_attn_memory_release", "model.overlap_moe_expert_parallel_comm"],
     lambda c: bool(c.m("ep_overlap_early_attn_memory_release")) and not c.ep_overlap,
     "ep_overlap_early_attn_memory_release requires EP overlap", "TC L2857",
     fix={"model.ep_overlap_early_attn_memory_release": False})
rule("OVL-022", A, E, "C", ["model.overlap_moe_expert_parallel_comm", "model.pipeline_model_parallel_size"],
     lambda c: c.ep_overlap and c.pp > 1 and bool(c.m("is_hybrid_model") or c.m("hybrid_layer_pattern")),
     "hybrid (Mamba) models cannot use EP overlap with PP>1 (VPP unsupported for hybrid models)", "derived OVL-002 + PAR-034",
     fix=_ep_off, frontends=("bridge",))
rule("OVL-023", A, W_, "-", ["model.overlap_moe_expert_parallel_comm", "model.tensor_model_parallel_size",
                             "model.context_parallel_size", "env.gpu"],
     lambda c: c.ep_overlap and (c.tp > 1 or c.cp > 1) and _pre_blackwell(c),
     "EP overlap with TP/CP on pre-Blackwell GPUs: conflicting CUDA_DEVICE_MAX_CONNECTIONS preferences "
     "(TP/CP want 1, EP overlap wants more)", "MLM training/arguments.py validate_args")
# TP overlap -------------------------------------------------------------------------------------------------------
rule("OVL-030", A, W_, "C", ["comm_overlap.tp_comm_overlap", "model.tensor_model_parallel_size",
                             "model.sequence_parallel"],
     lambda c: c.bridge and bool(c.raw_get("comm_overlap.tp_comm_overlap")) and (c.tp < 2
                                                                                 or not c.m("sequence_parallel")),
     "TP comm overlap requested but disabled by Bridge (needs TP >= 2 and sequence_parallel)", "B/ovl")
rule("OVL-031", A, W_, "-", ["model.tp_comm_overlap", "model.sequence_parallel"],
     lambda c: bool(c.m("tp_comm_overlap")) and not c.m("sequence_parallel")
     and not isinstance(c.raw.get("comm_overlap"), dict),
     "tp_comm_overlap without sequence parallelism (MLM asserts; TE userbuffers assume SP)", "MLM validate_args")
rule("OVL-032", A, W_, "I", ["model.tp_comm_overlap", "comm_overlap.tp_comm_bootstrap_backend", "env.te"],
     lambda c: bool(c.m("tp_comm_overlap")) and c.get("comm_overlap.tp_comm_bootstrap_backend", "nccl") != "mpi"
     and c.te_below("1.9.0") is True,
     "TE < 1.9 only supports the MPI bootstrap for TP comm overlap", "B/init _initialize_tp_communicators")
rule("OVL-034", A, ENV, "C", ["model.symmetric_ar_type", "env.torch", "env.te"],
     lambda c: c.m("symmetric_ar_type") is not None and any_of(c.torch_below("2.7.0"), c.te_below("2.3.0")),
     "symmetric-memory all-reduce needs PyTorch >= 2.7 and Transformer Engine >= 2.3", "TC L2892",
     fix={"model.symmetric_ar_type": None}, env=("PyTorch / Transformer Engine versions",))
# DP overlap -------------------------------------------------------------------------------------------------------
rule("OVL-040", A, I_, "C", ["ddp.overlap_grad_reduce", "ddp.overlap_param_gather", "ddp.bucket_size"],
     lambda c: c.bridge and isinstance(c.raw.get("comm_overlap"), dict) and c.dist_opt,
     "CommOverlapConfig + distributed optimizer set DDP overlap_grad_reduce/overlap_param_gather/bucket_size",
     "B/ovl _get_optimizer_overlap_cfgs")
rule("OVL-041", A, W_, "C", ["ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"],
     lambda c: c.bridge and (
         bool(c.raw_get("ddp.use_distributed_optimizer")) != bool(c.raw_get("optimizer.use_distributed_optimizer"))
         and c.raw_has("ddp.use_distributed_optimizer") and c.raw_has("optimizer.use_distributed_optimizer")),
     "ddp/optimizer use_distributed_optimizer disagree; Bridge turns both on",
     "B/cfg _validate_and_sync_distributed_optimizer_settings")
rule("OVL-042", A, W_, "-", ["ddp.overlap_param_gather", "ddp.use_distributed_optimizer", "ddp.overlap_grad_reduce"],
     lambda c: bool(c.get("ddp.overlap_param_gather")) and not c.fsdp and (
         not c.dist_opt or not c.get("ddp.overlap_grad_reduce")),
     "overlap_param_gather without the distributed optimizer or without overlap_grad_reduce (MLM rejects)",
     "MLM validate_args")
rule("OVL-043", A, E, "C", ["optimizer.overlap_param_gather_with_optimizer_step",
                            "ddp.reuse_grad_buf_for_mxfp8_param_ag"],
     lambda c: bool(c.get("optimizer.overlap_param_gather_with_optimizer_step")) and bool(
         c.get("ddp.reuse_grad_buf_for_mxfp8_param_ag") or c.get("optimizer.reuse_grad_buf_for_mxfp8_param_ag")),
     "overlap_param_gather_with_optimizer_step is not supported with reuse_grad_buf_for_mxfp8_param_ag",
     "optimizer/optimizer_config.py OptimizerConfig.__post_init__",
     fix={"optimizer.overlap_param_gather_with_optimizer_step": False})
rule("OVL-044", A, RT, "B", ["ddp.overlap_grad_reduce", "model.no_sync_func"],
     lambda c: bool(c.get("ddp.overlap_grad_reduce")) and c.m("no_sync_func") is not None,
     "a custom no_sync_func is not supported with overlapped grad reduce", "Bridge training/setup.py",
     fix={"model.no_sync_func": None}, frontends=("bridge",))
rule("OVL-045", A, E, "C", ["ddp.num_buckets", "ddp.bucket_size"],
     lambda c: c.get("ddp.num_buckets") is not None and (c.get("ddp.bucket_size") is not None
                                                         or c.get("ddp.num_buckets") <= 0),
     "set only one of ddp.num_buckets and ddp.bucket_size (num_buckets positive)",
     "distributed_data_parallel_config.py __post_init__", fix={"ddp.num_buckets": None})
# PP overlap -------------------------------------------------------------------------------------------------------
rule("OVL-050", A, RT, "R", ["model.overlap_p2p_comm", "model.batch_p2p_comm"],
     lambda c: c.pp > 1 and c.vpp is not None and bool(c.m("overlap_p2p_comm")) and bool(c.m("batch_p2p_comm")),
     "interleaved schedule cannot use overlap_p2p_comm and batch_p2p_comm together", "schedules.py L1069",
     fix=lambda c: ovl(c, "batch_p2p_comm", False))
rule("OVL-051", A, RT, "R", ["model.overlap_p2p_comm", "model.pipeline_model_parallel_size",
                             "model.virtual_pipeline_model_parallel_size"],
     lambda c: c.pp > 1 and c.vpp is None and bool(c.m("overlap_p2p_comm")),
     "non-interleaved pipeline schedule does not support overlap_p2p_comm", "schedules.py L2165",
     fix=lambda c: ovl(c, "overlap_p2p_comm", False))
rule("OVL-052", A, E, "C", ["model.overlap_p2p_comm_warmup_flush", "model.overlap_p2p_comm", "model.batch_p2p_comm"],
     lambda c: bool(c.m("overlap_p2p_comm_warmup_flush")) and (not c.m("overlap_p2p_comm") or bool(c.m("batch_p2p_comm"))),
     "overlap_p2p_comm_warmup_flush needs overlap_p2p_comm without batch_p2p_comm", "MPC L572",
     fix={"model.overlap_p2p_comm_warmup_flush": False})
rule("OVL-053", A, E, "C", ["model.defer_embedding_wgrad_compute", "model.pipeline_model_parallel_size",
                            "model.gradient_accumulation_fusion", "model.wgrad_deferral_limit"],
     lambda c: bool(c.m("defer_embedding_wgrad_compute")) and (
         c.pp == 1 or not c.m("gradient_accumulation_fusion") or (c.m("wgrad_deferral_limit") or 0) < 0),
     "defer_embedding_wgrad_compute needs PP > 1, gradient_accumulation_fusion and wgrad_deferral_limit >= 0 "
     "(CommOverlapConfig fills -1)", "MPC L546-556; B/ovl",
     fix=lambda c: ovl(c, "defer_embedding_wgrad_compute", False))
rule("OVL-054", A, W_, "-", ["model.virtual_pipeline_model_parallel_size", "model.pipeline_model_parallel_size",
                             "model.overlap_p2p_comm"],
     lambda c: c.vpp is not None and c.pp == 2 and not c.m("overlap_p2p_comm"),
     "VPP with PP=2 and overlap_p2p_comm=False (MLM requires PP > 2 here)", "MLM validate_args")
rule("OVL-055", A, I_, "-", ["model.overlap_moe_expert_parallel_comm", "model.virtual_pipeline_model_parallel_size"],
     lambda c: c.ep_overlap and c.pp > 1 and c.vpp is not None,
     "combined 1F1B adds one extra warm-up micro-batch per stage", "schedules.py")
_ = UNKNOWN

"""Megatron-LM CLI-only rules (docs/rules.md §12, MLM-*): ``megatron/training/arguments.py::validate_args``.

Bridge does not enforce them, so for Bridge configs they are warnings. For Megatron-LM input they are what
``pretrain_gpt.py`` rejects at argument validation: deterministic ones are errors there.
"""

from __future__ import annotations

from moetune.rules.common import W_, E
from moetune.rules.engine import Ctx, rule

A = "mlm"
MLM = ("megatron-lm",)
BR = ("bridge",)


def _pre_blackwell(c: Ctx):
    return c.gpu_is(lambda cc, n: cc[0] < 10)


def _both(id_: str, fields, when, text, source, fix=None, env=()):
    """Register the rule twice: an error for Megatron-LM input, a warning for Bridge input."""
    rule(id_, A, E, "C", fields, when, text, source, fix=fix, frontends=MLM, env=env)
    rule(f"{id_}w", A, W_, "-", fields, when, f"{text} (Megatron-LM only; Bridge does not check)", source,
         frontends=BR)


_both("MLM-001", ["model.tensor_model_parallel_size", "model.context_parallel_size", "env.CUDA_DEVICE_MAX_CONNECTIONS"],
      lambda c: (c.tp > 1 or c.cp > 1) and not (c.fsdp or c.ep_overlap) and _pre_blackwell(c)
      and c.var("CUDA_DEVICE_MAX_CONNECTIONS") != "1",
      "TP>1 or CP>1 on pre-Blackwell GPUs requires env CUDA_DEVICE_MAX_CONNECTIONS=1",
      "MLM training/arguments.py validate_args", fix={"env_vars.CUDA_DEVICE_MAX_CONNECTIONS": "1"},
      env=("GPU type / env CUDA_DEVICE_MAX_CONNECTIONS",))
_both("MLM-002", ["model.tp_comm_overlap", "model.sequence_parallel"],
      lambda c: bool(c.m("tp_comm_overlap")) and not c.m("sequence_parallel"),
      "tp_comm_overlap requires sequence_parallel", "MLM validate_args", fix={"model.sequence_parallel": True})
_both("MLM-004", ["model.moe_grouped_gemm", "env.gpu"],
      lambda c: c.is_moe and bool(c.m("moe_grouped_gemm")) and c.gpu_is(lambda cc, n: cc < (8, 0)),
      "moe_grouped_gemm requires GPU compute capability >= 8.0", "MLM validate_args",
      fix={"model.moe_grouped_gemm": False}, env=("GPU type",))
_both("MLM-005", ["ddp.overlap_param_gather", "ddp.use_distributed_optimizer", "ddp.overlap_grad_reduce"],
      lambda c: bool(c.get("ddp.overlap_param_gather")) and not c.fsdp and (
          not c.dist_opt or not c.get("ddp.overlap_grad_reduce")),
      "overlap_param_gather requires the distributed optimizer and overlap_grad_reduce", "MLM validate_args",
      fix={"ddp.use_distributed_optimizer": True, "ddp.overlap_grad_reduce": True})
_both("MLM-006", ["ddp.fp8_param_gather", "ddp.use_distributed_optimizer"],
      lambda c: bool(c.get("ddp.fp8_param_gather")) and not c.dist_opt and not c.fsdp,
      "fp8_param_gather requires the distributed optimizer or FSDP", "MLM validate_args",
      fix={"ddp.use_distributed_optimizer": True})
_both("MLM-007", ["model.virtual_pipeline_model_parallel_size", "model.pipeline_model_parallel_size",
                  "model.overlap_p2p_comm"],
      lambda c: c.vpp is not None and c.pp <= 2 and not c.m("overlap_p2p_comm") and c.pp > 1,
      "with VPP and overlap_p2p_comm=False the pipeline size must be > 2", "MLM validate_args",
      fix={"model.overlap_p2p_comm": True, "model.batch_p2p_comm": False})
_both("MLM-008", ["model.recompute_granularity", "model.recompute_method", "model.distribute_saved_activations"],
      lambda c: (c.m("recompute_granularity") == "selective" and c.m("recompute_method") is not None)
      or (bool(c.m("distribute_saved_activations")) and (c.tp <= 1 or c.m("recompute_granularity") != "full"
                                                          or c.m("recompute_method") is None)),
      "selective recompute needs recompute_method=None; distribute_saved_activations needs TP>1 and full recompute "
      "with a method", "MLM validate_args",
      fix=lambda c: {"model.recompute_method": None} if c.m("recompute_granularity") == "selective"
      else {"model.distribute_saved_activations": False})
_both("MLM-009", ["model.delay_wgrad_compute", "model.transformer_impl"],
      lambda c: bool(c.m("delay_wgrad_compute")) and c.m("transformer_impl", "transformer_engine") != "transformer_engine",
      "delay_wgrad_compute requires transformer_impl=transformer_engine", "MLM validate_args",
      fix={"model.transformer_impl": "transformer_engine"})
_both("MLM-010", ["optimizer.optimizer_cpu_offload", "optimizer.use_precision_aware_optimizer"],
      lambda c: bool(c.get("optimizer.optimizer_cpu_offload")) and not c.get("optimizer.use_precision_aware_optimizer"),
      "optimizer_cpu_offload requires use_precision_aware_optimizer", "MLM validate_args",
      fix={"optimizer.use_precision_aware_optimizer": True})
_both("MLM-011", ["model.cuda_graph_impl", "rerun_state_machine.check_for_nan_in_loss"],
      lambda c: c.full_iter_graph and bool(c.get("rerun_state_machine.check_for_nan_in_loss", True)),
      "cuda_graph_impl=full_iteration requires --no-check-for-nan-in-loss-and-grad", "MLM validate_args",
      fix={"rerun_state_machine.check_for_nan_in_loss": False})
_both("MLM-011b", ["model.cuda_graph_impl", "env.PYTORCH_CUDA_ALLOC_CONF", "env.NCCL_GRAPH_REGISTER"],
      lambda c: c.te_graph and "expandable_segments:true" in str(c.var("PYTORCH_CUDA_ALLOC_CONF") or "").lower()
      and c.var("NCCL_GRAPH_REGISTER") != "0",
      "TE CUDA graphs with expandable_segments:True require NCCL_GRAPH_REGISTER=0", "MLM validate_args",
      fix={"env_vars.NCCL_GRAPH_REGISTER": "0"}, env=("env NCCL_GRAPH_REGISTER",))
_both("MLM-012", ["model.mtp_num_layers", "model.position_embedding_type"],
      lambda c: (c.m("mtp_num_layers") or 0) > 0
      and c.m("position_embedding_type", "learned_absolute") not in ("learned_absolute", "rope", "mrope", "none"),
      "MTP only with position embedding learned_absolute, rope, mrope or none", "MLM validate_args",
      fix={"model.position_embedding_type": "rope"})
_both("MLM-013", ["dist.use_torch_fsdp2", "model.pipeline_model_parallel_size", "model.expert_model_parallel_size"],
      lambda c: bool(c.get("dist.use_torch_fsdp2")) and (c.pp > 1 or c.ep > 1 or c.dist_opt
                                                         or bool(c.m("gradient_accumulation_fusion"))),
      "torch FSDP2 needs PP=1, EP=1, no distributed optimizer and no gradient-accumulation fusion",
      "MLM validate_args", fix={"dist.use_torch_fsdp2": False})
_both("MLM-014", ["model.hybrid_context_parallel", "model.pipeline_model_parallel_size", "model.cuda_graph_impl"],
      lambda c: bool(c.m("hybrid_context_parallel")) and (c.pp > 1 or c.cg_impl != "none" or c.fsdp
                                                          or not c.m("calculate_per_token_loss")),
      "hybrid CP needs PP=1, no CUDA graph, no Megatron-FSDP and per-token loss", "MLM validate_args",
      fix={"model.hybrid_context_parallel": False})
_both("MLM-015", ["model.fp32_residual_connection", "model.bf16", "model.fp16"],
      lambda c: bool(c.m("fp32_residual_connection")) and not (c.m("bf16") or c.m("fp16")),
      "fp32_residual_connection requires fp16 or bf16", "MLM validate_args",
      fix={"model.fp32_residual_connection": False})
_both("MLM-017", ["model.moe_latent_size", "model.num_moe_experts"],
      lambda c: c.m("moe_latent_size") is not None and (c.m("moe_latent_size") <= 0 or
                                                         (c.num_experts is None and c.arch_known)),
      "moe_latent_size must be > 0 and requires experts", "MLM validate_args", fix={"model.moe_latent_size": None})
_both("MLM-018", ["model.tensor_parallel_num_weight_shards", "model.fp8_recipe", "ddp.fp8_param_gather"],
      lambda c: (c.m("tensor_parallel_num_weight_shards") or 1) > 1 and c.m("fp8_recipe") == "mxfp8"
      and c.fp8 is not None and not (c.get("ddp.fp8_param_gather") and c.get("ddp.reuse_grad_buf_for_mxfp8_param_ag")),
      "GTP with mxfp8 requires fp8_param_gather and reuse_grad_buf_for_mxfp8_param_ag", "MLM validate_args",
      fix={"model.tensor_parallel_num_weight_shards": None})

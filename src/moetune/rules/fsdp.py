"""(h) Megatron-FSDP / torch FSDP2 (docs/rules.md §9, FSDP-*). Sources: Bridge ``training/config.py`` (B/cfg
``_validate_and_apply_megatron_fsdp_*``), MCore ``distributed_data_parallel_config.py``,
``distributed/fsdp/mcore_fsdp_adapter.py``, ``distributed_data_parallel.py``."""

from __future__ import annotations

from moetune.rules.common import ENV, I_, RT, W_, E
from moetune.rules.engine import Ctx, any_of, rule

A = "fsdp"


def _v1(c: Ctx) -> bool:
    return c.fsdp and c.fsdp_version == 1


def _ckpt(c: Ctx) -> bool:
    return bool(c.get("checkpoint.save") or c.get("checkpoint.load"))


def _v2_violation(c: Ctx) -> bool:
    if not (c.fsdp and c.fsdp_version == 2):
        return False
    return bool(
        not c.m("bf16") or c.m("fp16") or str(c.m("params_dtype")) != "bfloat16" or c.tp != 1 or c.pp != 1
        or c.cp != 1 or c.ep != 1 or c.is_moe or c.vpp is not None or c.get("dist.use_tp_pp_dp_mapping")
        or c.get("rng.data_parallel_random_init") or (c.get("ddp.num_distributed_optimizer_instances") or 1) != 1
        or c.get("ddp.outer_dp_sharding_strategy", "no_shard") != "no_shard" or _ckpt(c)
        or c.get("optimizer.loss_scale") is not None or (c.get("optimizer.clip_grad") or 0) > 0
        or c.get("optimizer.use_precision_aware_optimizer") or c.get("optimizer.optimizer_cpu_offload")
        or c.m("calculate_per_token_loss") or c.fp8 is not None or c.fp4 is not None or c.cg_impl != "none")


rule("FSDP-001", A, E, "C", ["dist.use_megatron_fsdp", "dist.use_torch_fsdp2"],
     lambda c: c.fsdp and bool(c.get("dist.use_torch_fsdp2")),
     "Megatron-FSDP and torch FSDP2 are mutually exclusive", "B/cfg validate L1482",
     fix={"dist.use_torch_fsdp2": False})
rule("FSDP-002", A, E, "C", ["ddp.megatron_fsdp_version"],
     lambda c: c.fsdp and c.get("ddp.megatron_fsdp_version", 1) not in (1, 2),
     "ddp.megatron_fsdp_version must be 1 or 2", "distributed_data_parallel_config.py",
     fix={"ddp.megatron_fsdp_version": 1})
rule("FSDP-003", A, I_, "C", ["ddp.use_megatron_fsdp", "ddp.use_distributed_optimizer"],
     lambda c: c.bridge and _v1(c),
     "Megatron-FSDP v1: Bridge forces the distributed optimizer and adjusts average_in_collective / mxfp8 reuse",
     "B/cfg _validate_and_apply_megatron_fsdp_v1_configs")
rule("FSDP-004", A, E, "C", ["ddp.use_megatron_fsdp", "checkpoint.ckpt_format"],
     lambda c: _v1(c) and _ckpt(c) and c.get("checkpoint.ckpt_format") != "fsdp_dtensor",
     "Megatron-FSDP requires checkpoint.ckpt_format=fsdp_dtensor", "B/cfg L1108",
     fix={"checkpoint.ckpt_format": "fsdp_dtensor"})
rule("FSDP-005", A, E, "C", ["checkpoint.ckpt_format", "ddp.use_megatron_fsdp"],
     lambda c: _ckpt(c) and c.get("checkpoint.ckpt_format") == "fsdp_dtensor" and (
         not c.fsdp or bool(c.get("dist.use_torch_fsdp2"))),
     "ckpt_format fsdp_dtensor only works with Megatron-FSDP", "B/cfg L1532",
     fix={"checkpoint.ckpt_format": "torch_dist"})
rule("FSDP-006", A, ENV, "C", ["ddp.use_megatron_fsdp", "env.CUDA_DEVICE_MAX_CONNECTIONS"],
     lambda c: c.bridge and _v1(c) and c.var("CUDA_DEVICE_MAX_CONNECTIONS") == "1",
     "Megatron-FSDP needs CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset", "B/cfg L1110",
     fix={"env_vars.CUDA_DEVICE_MAX_CONNECTIONS": "8"}, env=("env CUDA_DEVICE_MAX_CONNECTIONS",),
     frontends=("bridge",))
rule("FSDP-007", A, E, "C", ["ddp.fsdp_manual_registration", "ddp.nccl_ub"],
     lambda c: _v1(c) and bool(c.get("ddp.fsdp_manual_registration")) and not c.get("ddp.nccl_ub"),
     "fsdp_manual_registration requires ddp.nccl_ub=True", "B/cfg L1118", fix={"ddp.fsdp_manual_registration": False})
rule("FSDP-008", A, E, "C", ["ddp.data_parallel_sharding_strategy", "train.check_weight_hash_across_dp_replicas_interval"],
     lambda c: _v1(c) and c.get("ddp.data_parallel_sharding_strategy") == "optim_grads_params"
     and c.get("train.check_weight_hash_across_dp_replicas_interval") is not None,
     "weight-hash checking is unsupported with optim_grads_params sharding", "B/cfg L1120",
     fix={"train.check_weight_hash_across_dp_replicas_interval": None})
rule("FSDP-009", A, E, "C", ["ddp.use_megatron_fsdp", "dist.use_tp_pp_dp_mapping"],
     lambda c: _v1(c) and bool(c.get("dist.use_tp_pp_dp_mapping")),
     "Megatron-FSDP conflicts with the tp-cp-ep-pp-dp rank order", "B/cfg L1124",
     fix={"dist.use_tp_pp_dp_mapping": False})
rule("FSDP-010", A, E, "C", ["ddp.megatron_fsdp_version", "model.num_moe_experts", "model.tensor_model_parallel_size"],
     _v2_violation,
     "Megatron-FSDP v2 is DP-only BF16 without MoE, model parallelism, fp8/fp4, checkpoints, grad clipping or graphs",
     "B/cfg _validate_and_apply_megatron_fsdp_v2_configs", fix={"ddp.megatron_fsdp_version": 1})
rule("FSDP-011", A, ENV, "B", ["ddp.use_megatron_fsdp", "model.gradient_accumulation_fusion", "env.te"],
     lambda c: _v1(c) and bool(c.m("gradient_accumulation_fusion")) and c.te_below("2.10.0"),
     "Megatron-FSDP with gradient_accumulation_fusion needs Transformer Engine >= 2.10",
     "distributed/fsdp/mcore_fsdp_adapter.py L159", fix={"model.gradient_accumulation_fusion": False},
     env=("Transformer Engine version",))
rule("FSDP-013", A, I_, "B", ["ddp.data_parallel_sharding_strategy"],
     lambda c: c.fsdp and c.get("ddp.data_parallel_sharding_strategy") in ("optim_grads", "optim_grads_params"),
     "Megatron-FSDP forces overlap_grad_reduce (and overlap_param_gather for optim_grads_params)",
     "megatron_fsdp/megatron_fsdp.py")
rule("FSDP-014", A, RT, "B", ["model.calculate_per_token_loss", "ddp.average_in_collective"],
     lambda c: bool(c.m("calculate_per_token_loss")) and bool(c.get("ddp.average_in_collective")),
     "cannot average in the collective with per-token loss", "distributed/distributed_data_parallel.py",
     fix={"ddp.average_in_collective": False})
rule("FSDP-015", A, ENV, "C", ["ddp.nccl_ub", "env.torch", "env.PYTORCH_CUDA_ALLOC_CONF"],
     lambda c: bool(c.get("ddp.nccl_ub")) and "expandable_segments:true" in str(
         c.var("PYTORCH_CUDA_ALLOC_CONF") or "").lower() and c.torch_below("2.11.0"),
     "NCCL user buffers (nccl_ub) are incompatible with expandable_segments:True on PyTorch < 2.11",
     "distributed_data_parallel_config.py", fix={"env_vars.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
     env=("PyTorch version / env PYTORCH_CUDA_ALLOC_CONF",))
rule("FSDP-016", A, E, "C", ["ddp.param_name_patterns_for_fp32_local_accumulation", "ddp.grad_reduce_in_fp32"],
     lambda c: bool(c.get("ddp.param_name_patterns_for_fp32_local_accumulation")) and bool(
         c.get("ddp.grad_reduce_in_fp32")),
     "fp32 local-accumulation patterns are only needed when main grads are not FP32",
     "distributed_data_parallel_config.py", fix={"ddp.param_name_patterns_for_fp32_local_accumulation": None})
rule("FSDP-017", A, W_, "-", ["model.init_model_with_meta_device", "ddp.use_megatron_fsdp"],
     lambda c: bool(c.m("init_model_with_meta_device")) and not c.fsdp,
     "init_model_with_meta_device is documented to work only with Megatron-FSDP", "TC field docstring")
rule("FSDP-018", A, W_, "-", ["ddp.fsdp_all_gather_in_start_param_sync", "model.cuda_graph_impl"],
     lambda c: c.fsdp and c.full_iter_graph and bool(c.get("ddp.fsdp_all_gather_in_start_param_sync")),
     "disable fsdp_all_gather_in_start_param_sync with full-iteration CUDA graphs",
     "distributed_data_parallel_config.py docstring")
rule("FSDP-019", A, W_, "-", ["ddp.use_megatron_fsdp", "model.tensor_model_parallel_size",
                              "model.context_parallel_size", "env.gpu"],
     lambda c: (c.fsdp or bool(c.get("dist.use_torch_fsdp2"))) and (c.tp > 1 or c.cp > 1)
     and c.gpu_is(lambda cc, n: cc[0] < 10),
     "FSDP with TP/CP on pre-Blackwell: conflicting CUDA_DEVICE_MAX_CONNECTIONS needs", "MLM validate_args")
rule("FSDP-020", A, W_, "-", ["dist.use_torch_fsdp2"],
     lambda c: bool(c.get("dist.use_torch_fsdp2")),
     "torch FSDP2 fails before training on this Bridge branch (MLM also rejects PP>1, EP>1, dist-opt, ...)",
     "skills nemo-mbridge-perf-megatron-fsdp")
rule("FSDP-021", A, I_, "-", ["ddp.megatron_fsdp_max_pool_double_buffer"],
     lambda c: bool(c.get("ddp.megatron_fsdp_max_pool_double_buffer")),
     "megatron_fsdp_max_pool_double_buffer forces fsdp_double_buffer=True", "distributed_data_parallel_config.py")
_ = any_of

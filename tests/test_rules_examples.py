"""Every error rule: a config that triggers it, and the same config with the rule's own fix applied no longer does.

One small MoE config (16 GPUs of an 8-GPU NVLink domain, TP2 SP, PP2 VPP2, EP4 ETP1) checks clean; each example
is a handful of overrides on it (and, for environment-gated rules, a known environment)."""

from __future__ import annotations

import copy

import pytest

from moetune.io.check import check_config
from moetune.io.effective import normalize_input, resolve_mixed_precision
from moetune.overrides import apply_overrides
from moetune.rules import Env, load_rules
from moetune.rules.values import NO_FIX_RULES

BASE: dict = {
    "frontend": "bridge",
    "model": {
        "num_layers": 8, "hidden_size": 1024, "ffn_hidden_size": 4096, "num_attention_heads": 16,
        "num_query_groups": 4, "kv_channels": 64, "vocab_size": 32000, "seq_length": 4096,
        "num_moe_experts": 16, "moe_ffn_hidden_size": 512, "moe_router_topk": 2, "moe_layer_freq": 1,
        "moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True, "moe_permute_fusion": False,
        "moe_router_dtype": "fp32", "moe_aux_loss_coeff": 1e-3,
        "tensor_model_parallel_size": 2, "sequence_parallel": True, "pipeline_model_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": 2, "context_parallel_size": 1, "expert_model_parallel_size": 4,
        "expert_tensor_parallel_size": 1, "add_bias_linear": False, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "gradient_accumulation_fusion": True, "bias_dropout_fusion": False,
    },
    "train": {"global_batch_size": 64, "micro_batch_size": 1},
    "optimizer": {"optimizer": "adam", "use_distributed_optimizer": True},
    "ddp": {"use_distributed_optimizer": True},
    "mixed_precision": resolve_mixed_precision("bf16_mixed"),
    "comm_overlap": {"tp_comm_overlap": False},
    "rerun_state_machine": {"check_for_nan_in_loss": True},
    "env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
}
ENV = dict(gpus=16, gpu="h100", nvlink_domain=8, gpus_per_node=8, torch="2.7.0", te="2.8.0", mcore="0.16.0",
           vars={"MOETUNE_HAS_DEEPEP": "1", "MOETUNE_HAS_HYBRIDEP": "1", "MOETUNE_HAS_NCCLEP": "1"})

EPO = {"comm_overlap.overlap_moe_expert_parallel_comm": True}
DW = {**EPO, "comm_overlap.delay_wgrad_compute": True}
TEG = {"model.cuda_graph_impl": "transformer_engine", "model.use_te_rng_tracker": True}
SEL = {"model.recompute_granularity": "selective"}
FULL = {"model.recompute_granularity": "full", "model.recompute_method": "uniform", "model.recompute_num_layers": 1}
FP8 = {"mixed_precision.fp8": "hybrid", "mixed_precision.fp8_recipe": "tensorwise"}
FG = {"model.fine_grained_activation_offloading": True}
FSDP = {"ddp.use_megatron_fsdp": True}
MLM = {"frontend": "megatron-lm"}
FLEX = {"model.moe_token_dispatcher_type": "flex"}

#: rule id -> (overrides, environment changes)
EXAMPLES: dict[str, tuple[dict, dict]] = {
    "PAR-001": ({}, {"gpus": 18}),
    "PAR-002": ({}, {"gpus": 12}),
    "PAR-005": ({"dist.use_tp_pp_dp_mapping": True}, {}),
    "PAR-006": ({"model.pipeline_model_parallel_size": 1}, {}),
    "PAR-007": ({"ddp.num_distributed_optimizer_instances": 3}, {}),
    "PAR-008": ({"model.context_parallel_size": 2, "model.hierarchical_context_parallel_sizes": [2, 2]}, {}),
    "PAR-009": ({"model.cp_comm_type": "a2a+p2p"}, {}),
    "PAR-010": ({"dist.use_decentralized_pg": True, "model.hierarchical_context_parallel_sizes": [1]}, {}),
    "PAR-011": ({"model.context_parallel_size": 2, "model.cp_comm_type": ["p2p", "p2p", "p2p"]}, {}),
    "PAR-012": ({"model.context_parallel_size": 2, "model.cp_comm_type": "a2a+p2p",
                 "model.hierarchical_context_parallel_sizes": [2]}, {"te": "1.11.0"}),
    "PAR-013": ({"model.context_parallel_size": 2, "model.cp_comm_type": "a2a", "model.num_query_groups": 2}, {}),
    "PAR-014": ({"model.context_parallel_size": 2, "model.seq_length": 4098}, {}),
    "PAR-015": ({"model.context_parallel_size": 2, "dataset._class": "GPTSFTDatasetConfig"}, {}),
    "PAR-016": ({"dataset.seq_length": 2048}, {}),
    "PAR-018": ({"model.tensor_model_parallel_size": 4, "model.seq_length": 4098}, {}),
    "PAR-019": ({"model.num_attention_heads": 15}, {}),
    "PAR-020": ({"model.num_query_groups": 3}, {}),
    "PAR-021": ({"model.experimental_attention_variant": "gdn", "model.linear_num_key_heads": 3,
                 "model.linear_num_value_heads": 6}, {}),
    "PAR-022": ({"model.moe_layer_freq": [0, 1, 1, 1, 1, 1, 1, 1], "model.ffn_hidden_size": 4097}, {}),
    "PAR-023": ({"model.moe_ffn_hidden_size": 513, "model.expert_tensor_parallel_size": 2}, {}),
    "PAR-024": ({"model.num_moe_experts": 18}, {}),
    "PAR-025": ({"model.num_moe_experts": None}, {}),
    "PAR-026": ({"model.num_layers": 9}, {}),
    "PAR-027": ({"model.num_layers": 12, "model.virtual_pipeline_model_parallel_size": 4}, {}),
    "PAR-028": ({"model.num_layers_in_first_pipeline_stage": 3, "model.num_layers_in_last_pipeline_stage": 3}, {}),
    "PAR-029": ({"model.num_layers_in_first_pipeline_stage": 4,
                 "model.account_for_embedding_in_pipeline_split": True}, {}),
    "PAR-030": ({"model.pipeline_model_parallel_layout": "Et*4|t*4L",
                 "model.num_layers_in_first_pipeline_stage": 4}, {}),
    "PAR-031": ({"model.pipeline_model_parallel_layout": "Et*2|t*2|t*2|t*2L",
                 "model.virtual_pipeline_model_parallel_size": 4}, {}),
    "PAR-032": ({"model.pipeline_model_parallel_layout": "Et*2|t*2|t*2|t*3L"}, {}),
    "PAR-033": ({"model.num_layers": 2, "model.account_for_embedding_in_pipeline_split": True,
                 "model.account_for_loss_in_pipeline_split": True}, {}),
    "PAR-034": ({"model.is_hybrid_model": True, "model.hybrid_layer_pattern": "M*M*M*M*"}, {}),
    "PAR-035": ({"train.global_batch_size": 66}, {}),
    "PAR-036": ({"validation.eval_global_batch_size": 6}, {}),
    "PAR-037": ({"train.global_batch_size": 4}, {}),
    "PAR-038": ({"train.global_batch_size": 12}, {}),
    "PAR-040": ({"dist.sharp_enabled_group": "dp"}, {}),
    "PAR-041": ({"model.tensor_parallel_num_weight_shards": 3}, {}),
    "PAR-042": ({"model.hybrid_context_parallel": True}, {"gpus": 4}),
    "PAR-043": ({"dataset.enable_offline_packing": True, "train.micro_batch_size": 2}, {}),
    "PAR-044": ({"dataset.packing_buffer_size": 4}, {}),
    "PAR-046": ({"model.sequence_parallel": False}, {}),
    "PAR-047": ({"model.context_parallel_size": 2, "model.cp_comm_type": "a2a+p2p",
                 "model.hierarchical_context_parallel_sizes": [2], "dataset.packed_sequence_specs": {"pad": True}}, {}),
    "MOE-001": ({"model.num_moe_experts": 0}, {}),
    "MOE-003": ({"model.num_moe_experts": None, "model.expert_model_parallel_size": 1}, {}),
    "MOE-004": ({"model.moe_layer_freq": [1, 1, 1]}, {}),
    "MOE-005": ({"model.add_bias_linear": True, "model.expert_tensor_parallel_size": 2}, {}),
    "MOE-006": ({"model.moe_shared_expert_intermediate_size": 0}, {}),
    "MOE-007": ({"model.moe_shared_expert_intermediate_size": 1024, "model.add_bias_linear": True}, {}),
    "MOE-008": ({"model.add_bias_linear": True, "model.bias_dropout_fusion": True}, {}),
    "MOE-010": ({"model.moe_single_grouped_weight": True}, {}),
    "MOE-011": ({"model.use_transformer_engine_op_fuser": True, "model.expert_tensor_parallel_size": 2}, {}),
    "MOE-095": ({"model.use_transformer_engine_op_fuser": True, "model.activation_func": "gelu"}, {}),
    "MOE-012": ({"model.moe_apply_probs_on_input": True}, {}),
    "MOE-013": ({"model.moe_latent_size": 256, "model.moe_shared_expert_overlap": True}, {}),
    "MOE-014": ({"model.gated_linear_unit": True, "model.activation_func_clamp_value": 7.0,
                 "model.use_te_activation_func": True}, {}),
    "MOE-020": ({"model.moe_router_topk": 1}, {}),
    "MOE-021": ({"model.moe_router_topk": 17}, {}),
    "MOE-022": ({"model.moe_router_group_topk": 2}, {}),
    "MOE-025": ({"model.moe_router_enable_expert_bias": True}, {}),
    "MOE-026": ({"model.moe_router_load_balancing_type": ["aux_loss", "seq_aux_loss"]}, {}),
    "MOE-027": ({"model.moe_router_load_balancing_type": "sinkhorn"}, {}),
    "MOE-028": ({"model.moe_router_load_balancing_type": "quantile_balancing"}, {}),
    "MOE-029": ({"model.moe_router_fusion": True}, {"te": "2.5.0"}),
    "MOE-033": ({"model.moe_router_score_function": "tanh"}, {}),
    "MOE-040": ({"model.moe_expert_capacity_factor": 1.0, "model.moe_router_load_balancing_type": "sinkhorn",
                 "model.moe_aux_loss_coeff": 0.0}, {}),
    "MOE-041": ({"model.moe_pad_expert_input_to_capacity": True}, {}),
    "MOE-042": ({**FLEX, "model.moe_flex_dispatcher_backend": "deepep", "model.moe_expert_capacity_factor": 1.0,
                 "model.moe_pad_expert_input_to_capacity": True}, {}),
    "MOE-043": ({**FLEX, "model.moe_flex_dispatcher_backend": "ncclep", "model.moe_expert_capacity_factor": 1.0}, {}),
    "MOE-044": ({"model.moe_expert_rank_capacity_factor": 1.0}, {}),
    "MOE-046": ({"model.moe_expert_capacity_factor": 1.0, "model.moe_token_drop_policy": "random"}, {}),
    "MOE-050": ({"model.moe_token_dispatcher_type": "alltoall_seq"}, {}),
    "MOE-051": ({"model.moe_token_dispatcher_type": "allgather", "model.variable_seq_lengths": True}, {}),
    "MOE-052": ({"model.moe_router_padding_for_quantization": True}, {}),
    "MOE-053": ({"model.moe_enable_deepep": True}, {}),
    "MOE-054": ({"model.moe_flex_dispatcher_backend": "ncclep"}, {}),
    "MOE-056": ({**FLEX, "model.moe_flex_dispatcher_backend": "deepep", "model.expert_model_parallel_size": 1}, {}),
    "MOE-057": ({**FLEX, "model.moe_flex_dispatcher_backend": "deepep"},
                {"vars": {"MOETUNE_HAS_DEEPEP": "0"}}),
    "MOE-058": ({**FLEX, "model.moe_flex_dispatcher_backend": "deepep"}, {"gpu": "gb200"}),
    "MOE-059": ({**FLEX, "model.moe_flex_dispatcher_backend": "hybridep"}, {"gpu": "rtx6000"}),
    "MOE-065": ({**FLEX, "model.moe_flex_dispatcher_backend": "ncclep",
                 "model.moe_expert_rank_capacity_factor": 1.0}, {}),
    "MOE-066": ({**MLM, "model.moe_deepep_num_sms": 20, "model.moe_hybridep_num_sms": 16}, {}),
    "MOE-067": ({"model.moe_permute_fusion": True}, {"te": "2.0.0"}),
    "MOE-069": ({"model.moe_shared_expert_intermediate_size": 1024, "model.moe_shared_expert_overlap": True,
                 "model.moe_token_dispatcher_type": "allgather"}, {}),
    "MOE-081": ({"model.mtp_num_layers": 1, **FULL, "model.recompute_num_layers": 2}, {}),
    "MOE-084": ({"model.mtp_num_layers": 1, "dataset.packing_buffer_size": 4}, {}),
    "OVL-001": (EPO, {"torch": "2.5.0"}),
    "OVL-002": ({**EPO, "model.virtual_pipeline_model_parallel_size": None}, {}),
    "OVL-003": ({**EPO, "model.expert_model_parallel_size": 1}, {}),
    "OVL-004": ({**EPO, "model.moe_token_dispatcher_type": "allgather"}, {}),
    "OVL-005": ({**EPO, **FULL}, {}),
    "OVL-006": ({**EPO, "mixed_precision": None}, {}),
    "OVL-007": ({**EPO, "model.moe_shared_expert_overlap": True}, {}),
    "OVL-008": ({**EPO, "model.mtp_num_layers": 2}, {}),
    "OVL-009": ({**EPO, **FLEX, "model.moe_flex_dispatcher_backend": "ncclep", **FG,
                 "model.offload_modules": ["expert_fc1"]}, {}),
    "OVL-010": ({**EPO, **TEG, "model.cuda_graph_modules": ["moe"]}, {}),
    "OVL-010b": ({**EPO, **TEG}, {}),
    "OVL-011": ({**EPO, "model.num_microbatches_with_partial_activation_checkpoints": 2}, {}),
    "OVL-012": ({**EPO, **FSDP}, {}),
    "OVL-015": ({"comm_overlap.delay_wgrad_compute": True}, {}),
    "OVL-016": (DW, {"te": "2.2.0"}),
    "OVL-017": ({**DW, **TEG, "model.cuda_graph_modules": ["attn"]}, {"te": "2.9.0"}),
    "OVL-018": (DW, {"te": "2.6.0"}),
    "OVL-019": ({**DW, **TEG, "model.cuda_graph_modules": ["attn"], "model.gradient_accumulation_fusion": False},
                {"te": "2.12.0"}),
    "OVL-019e": ({**DW, **TEG, "model.cuda_graph_modules": ["attn"]}, {"te": "2.11.0"}),
    "OVL-020": ({**EPO, "model.overlap_dispatch_backward_with_experts_wgrad": True}, {}),
    "OVL-020e": ({"model.overlap_dispatch_backward_with_experts_wgrad": True}, {"te": "2.2.0"}),
    "OVL-021": ({"model.ep_overlap_early_attn_memory_release": True}, {}),
    "OVL-022": ({**EPO, "model.is_hybrid_model": True, "model.hybrid_layer_pattern": "M*M*M*M*"}, {}),
    "OVL-034": ({"model.symmetric_ar_type": "two_shot"}, {"torch": "2.6.0"}),
    "OVL-043": ({"optimizer.overlap_param_gather_with_optimizer_step": True,
                 "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag": True}, {}),
    "OVL-044": ({"model.no_sync_func": "my.func"}, {}),
    "OVL-045": ({"ddp.num_buckets": 4}, {}),
    "OVL-050": ({"comm_overlap.batch_p2p_comm": True}, {}),
    "OVL-051": ({"model.virtual_pipeline_model_parallel_size": None, "comm_overlap.overlap_p2p_comm": True}, {}),
    "OVL-052": ({"comm_overlap": None, "model.overlap_p2p_comm_warmup_flush": True}, {}),
    "OVL-053": ({"comm_overlap.defer_embedding_wgrad_compute": True}, {}),
    "RCP-001": ({"model.recompute_granularity": "partial"}, {}),
    "RCP-002": ({**FULL, "model.recompute_method": "random"}, {}),
    "RCP-003": ({**FULL, "model.recompute_method": None}, {}),
    "RCP-004": ({**FULL, "model.recompute_num_layers": None}, {}),
    "RCP-005": ({**SEL, "model.recompute_num_layers": 2}, {}),
    "RCP-007": ({**FULL, "model.distribute_saved_activations": True}, {}),
    "RCP-008": ({**SEL, "model.recompute_modules": ["foo"]}, {}),
    "RCP-009": ({**SEL, "model.recompute_modules": ["moe_act"], "model.moe_grouped_gemm": False}, {}),
    "RCP-010": ({**SEL, "model.recompute_modules": ["mla_up_proj"]}, {}),
    "RCP-011": ({**SEL, "model.recompute_modules": ["gdn_norm_out"]}, {}),
    "RCP-013": ({**SEL, "model.recompute_modules": ["shared_experts"], "model.moe_shared_expert_overlap": True,
                 "model.moe_shared_expert_intermediate_size": 1024}, {}),
    "RCP-014": ({**SEL, "model.recompute_modules": ["layernorm"], **FP8, "mixed_precision.fp8_recipe": "delayed"}, {}),
    "RCP-014e": ({**SEL, "model.recompute_modules": ["moe_act"], **FP8}, {"te": "2.5.0"}),
    "RCP-015": ({**FULL, "model.moe_layer_recompute": True}, {}),
    "RCP-016": ({**SEL, "model.cpu_offloading": True}, {}),
    "RCP-018": ({**FULL, **TEG, "model.cuda_graph_modules": ["attn"]}, {}),
    "RCP-019": ({**SEL, "model.recompute_modules": ["moe"], **TEG, "model.cuda_graph_modules": ["moe_router"]}, {}),
    "RCP-020": ({**SEL, "model.recompute_modules": ["core_attn"], **TEG, "model.cuda_graph_modules": ["attn"],
                 "model.attention_dropout": 0.1}, {}),
    "RCP-022": ({**SEL, "model.recompute_modules": ["moe"], **FG, "model.offload_modules": ["moe_act"]}, {}),
    "CG-001": ({"model.cuda_graph_impl": "cudagraph"}, {}),
    "CG-002": ({"model.enable_cuda_graph": True, "model.external_cuda_graph": True}, {}),
    "CG-003": ({**TEG, "model.cuda_graph_scope": ["attn"], "model.cuda_graph_modules": ["attn"]}, {}),
    "CG-004": ({**TEG, "model.cuda_graph_modules": ["full", "attn"]}, {}),
    "CG-005": ({**TEG, "model.cuda_graph_modules": ["bogus"]}, {}),
    "CG-006": ({**TEG, "model.cuda_graph_modules": ["attn"], "model.inference_cuda_graph_scope": "layer"}, {}),
    "CG-007": ({"model.cuda_graph_impl": "full_iteration", "model.cuda_graph_modules": ["attn"]}, {}),
    "CG-008": ({"model.cuda_graph_impl": "local", "model.cuda_graph_modules": ["attn"]}, {}),
    "CG-009": ({**TEG, "model.use_te_rng_tracker": False, "model.cuda_graph_modules": ["attn"]}, {}),
    "CG-010": ({"model.cuda_graph_impl": "full_iteration", "model.use_te_rng_tracker": True}, {}),
    "CG-011": ({**TEG, "model.cuda_graph_modules": ["attn"], "model.cpu_offloading": True}, {}),
    "CG-012": ({**TEG, "model.cuda_graph_modules": ["moe", "moe_router"]}, {}),
    "CG-013": ({**TEG, "model.cuda_graph_modules": ["moe_preprocess"]}, {}),
    "CG-014": ({**TEG, "model.cuda_graph_modules": ["moe_router"], "model.num_moe_experts": None,
                "model.moe_ffn_hidden_size": None, "model.expert_model_parallel_size": 1}, {}),
    "CG-015": ({**TEG, "model.cuda_graph_modules": ["mlp"]}, {}),
    "CG-016": ({**TEG, "model.cuda_graph_modules": ["moe"]}, {}),
    "CG-017": ({**TEG, "model.cuda_graph_modules": ["moe_router", "moe_preprocess"],
                "model.moe_expert_capacity_factor": 1.0}, {}),
    "CG-020": ({**FG, "model.offload_modules": ["attn_norm"], "model.cuda_graph_impl": "local",
                "model.use_te_rng_tracker": True}, {}),
    "CG-021": ({**FG, "model.offload_modules": ["core_attn"], **TEG, "model.cuda_graph_modules": ["attn"]},
               {"torch": "2.8.0"}),
    "CG-024": ({**TEG, "model.cuda_graph_modules": ["attn"],
                "env_vars.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, {}),
    "CG-026": ({**TEG, "model.cuda_graph_modules": ["attn"], "dataset.packed_sequence_specs": {"pad": True}}, {}),
    "CG-027": ({**TEG, "model.cuda_graph_modules": ["attn"], "dataset.offline_packing_specs": {"packed": True},
                "dataset.pad_to_max_length": False}, {}),
    "CG-028": ({**TEG, "model.cuda_graph_modules": ["attn"], "dataset.packing_buffer_size": 4}, {}),
    "PRC-001": ({"mixed_precision.fp16": True}, {}),
    "PRC-003": ({"mixed_precision.fp4": "e2m1", "mixed_precision.fp8": "hybrid"}, {}),
    "PRC-003e": ({"mixed_precision.fp4": "e2m1"}, {"te": "2.6.0", "gpu": "b200"}),
    "PRC-004": ({"mixed_precision.fp4": "e2m1", "mixed_precision.fp8": "hybrid"}, {"gpu": "b200"}),
    "PRC-005": ({"mixed_precision.fp8": "e5m2"}, {}),
    "PRC-006": ({**FP8, "mixed_precision.fp8_recipe": "custom"}, {}),
    "PRC-007": (FP8, {"te": "2.1.0"}),
    "PRC-008": ({**FP8, "mixed_precision.fp8_recipe": "mxfp8"}, {}),
    "PRC-009": ({**FP8, "mixed_precision.fp8_recipe": "delayed", "mixed_precision.first_last_layers_bf16": True}, {}),
    "PRC-010": ({**FP8, "mixed_precision.first_last_layers_bf16": True,
                 "mixed_precision.num_layers_at_start_in_bf16": 5}, {}),
    "PRC-011": ({"mixed_precision.fp8_param": True, "mixed_precision.fp8_param_gather": True}, {}),
    "PRC-012": ({"model.fp8_output_proj": True}, {}),
    "PRC-013": (FP8, {"te": "1.10.0"}),
    "PRC-014": ({"mixed_precision.fp8": "e4m3", "mixed_precision.fp8_recipe": "mxfp8",
                 "mixed_precision.fp8_param_gather": True, "mixed_precision.fp8_param": True}, {"gpu": "b200"}),
    "PRC-015": ({"mixed_precision.reuse_grad_buf_for_mxfp8_param_ag": True}, {}),
    "PRC-017": ({"optimizer.use_precision_aware_optimizer": True, "optimizer.optimizer": "sgd"}, {}),
    "PRC-018": ({"optimizer.exp_avg_dtype": "bfloat16"}, {}),
    "PRC-019": ({"mixed_precision": None, "model.bf16": True, "model.params_dtype": "bfloat16",
                 "optimizer.use_precision_aware_optimizer": True}, {}),
    "PRC-026": ({"checkpoint.restore_modelopt_state": True}, {}),
    "PRC-028": ({"model.batch_invariant_mode": True, "model.context_parallel_size": 2}, {}),
    "OFF-001": ({"model.cpu_offloading": True, "model.cpu_offloading_num_layers": 8}, {}),
    "OFF-002": ({"model.cpu_offloading": True}, {}),
    "OFF-003": ({"model.cpu_offloading": True, **SEL}, {}),
    "OFF-004": ({"model.cpu_offloading": True, **TEG, "model.cuda_graph_modules": ["attn"]}, {}),
    "OFF-005": ({"model.cpu_offloading": True, **FG, "model.offload_modules": ["attn_norm"]}, {}),
    "OFF-006": ({"model.cpu_offloading": True, "model.moe_paged_stash": True}, {}),
    "OFF-007": ({"model.cpu_offloading": True, "model.transformer_impl": "local"}, {}),
    "OFF-010": ({**FG, "model.offload_modules": []}, {}),
    "OFF-011": ({**FG, "model.offload_modules": ["attn_proj"]}, {}),
    "OFF-013": ({**FG, "model.offload_modules": ["attn_norm"], "model.min_offloaded_tensor_size": -1}, {}),
    "OFF-014": ({**FG, "model.offload_modules": ["fused_group_mlp"]}, {}),
    "OFF-015": ({**FG, "model.offload_modules": ["attn_norm"], "model.transformer_impl": "local"}, {}),
    "OFF-016": ({**FG, "model.offload_modules": ["attn_norm"]}, {"te": "2.10.0"}),
    "OFF-019": ({"model.moe_paged_stash": True}, {}),
    "OFF-020": ({"optimizer.optimizer_cpu_offload": True, "optimizer.decoupled_weight_decay": False}, {}),
    "FSDP-001": ({**FSDP, "dist.use_torch_fsdp2": True}, {}),
    "FSDP-002": ({**FSDP, "ddp.megatron_fsdp_version": 3}, {}),
    "FSDP-004": ({**FSDP, "checkpoint.save": "/ckpt", "checkpoint.ckpt_format": "torch_dist"}, {}),
    "FSDP-005": ({"checkpoint.save": "/ckpt", "checkpoint.ckpt_format": "fsdp_dtensor"}, {}),
    "FSDP-006": (FSDP, {}),
    "FSDP-007": ({**FSDP, "ddp.fsdp_manual_registration": True}, {}),
    "FSDP-008": ({**FSDP, "ddp.data_parallel_sharding_strategy": "optim_grads_params",
                  "train.check_weight_hash_across_dp_replicas_interval": 10}, {}),
    "FSDP-009": ({**FSDP, "dist.use_tp_pp_dp_mapping": True}, {}),
    "FSDP-010": ({**FSDP, "ddp.megatron_fsdp_version": 2}, {}),
    "FSDP-011": (FSDP, {"te": "2.9.0"}),
    "FSDP-014": ({"model.calculate_per_token_loss": True, "ddp.average_in_collective": True}, {}),
    "FSDP-015": ({"ddp.nccl_ub": True, "env_vars.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, {}),
    "FSDP-016": ({"ddp.param_name_patterns_for_fp32_local_accumulation": ["router"]}, {}),
    "MLM-001": ({**MLM, "env_vars.CUDA_DEVICE_MAX_CONNECTIONS": "8"}, {}),
    "MLM-002": ({**MLM, "model.tp_comm_overlap": True, "model.sequence_parallel": False}, {}),
    "MLM-004": (MLM, {"gpu": "v100"}),
    "MLM-005": ({**MLM, "ddp.overlap_param_gather": True, "ddp.use_distributed_optimizer": False,
                 "optimizer.use_distributed_optimizer": False}, {}),
    "MLM-006": ({**MLM, "ddp.fp8_param_gather": True, "ddp.use_distributed_optimizer": False,
                 "optimizer.use_distributed_optimizer": False}, {}),
    "MLM-007": ({**MLM, "model.overlap_p2p_comm": False}, {}),
    "MLM-008": ({**MLM, **SEL, "model.recompute_method": "uniform"}, {}),
    "MLM-009": ({**MLM, "model.delay_wgrad_compute": True, "model.transformer_impl": "local"}, {}),
    "MLM-010": ({**MLM, "optimizer.optimizer_cpu_offload": True}, {}),
    "MLM-011": ({**MLM, "model.cuda_graph_impl": "full_iteration"}, {}),
    "MLM-011b": ({**MLM, **TEG, "model.cuda_graph_modules": ["attn"],
                  "env_vars.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, {}),
    "MLM-012": ({**MLM, "model.mtp_num_layers": 1, "model.position_embedding_type": "alibi"}, {}),
    "MLM-013": ({**MLM, "dist.use_torch_fsdp2": True}, {}),
    "MLM-014": ({**MLM, "model.hybrid_context_parallel": True}, {}),
    "MLM-015": ({**MLM, "model.fp32_residual_connection": True}, {}),
    "MLM-017": ({**MLM, "model.moe_latent_size": -1}, {}),
    "MLM-018": ({**MLM, "model.tensor_parallel_num_weight_shards": 4, "model.fp8": "hybrid",
                 "model.fp8_recipe": "mxfp8"}, {}),
    # impossible values (rules/values.py): each field set to a value no job can have
    **{rid: ({path: bad}, {}) for rid, path, bad in (
        ("VAL-001", "model.tensor_model_parallel_size", -4), ("VAL-002", "model.pipeline_model_parallel_size", 0),
        ("VAL-003", "model.context_parallel_size", -1), ("VAL-004", "model.expert_model_parallel_size", 0),
        ("VAL-005", "model.expert_tensor_parallel_size", -2),
        ("VAL-006", "model.virtual_pipeline_model_parallel_size", 0), ("VAL-007", "model.num_layers", 0),
        ("VAL-008", "model.hidden_size", -512), ("VAL-009", "model.ffn_hidden_size", -1),
        ("VAL-010", "model.num_attention_heads", 0), ("VAL-011", "model.num_query_groups", -4),
        ("VAL-012", "model.kv_channels", 0), ("VAL-013", "model.seq_length", -4096),
        ("VAL-014", "model.num_moe_experts", 0), ("VAL-015", "model.moe_router_topk", 0),
        ("VAL-016", "model.moe_ffn_hidden_size", -512), ("VAL-017", "model.vocab_size", 0),
        ("VAL-018", "model.make_vocab_size_divisible_by", 0), ("VAL-019", "model.mtp_num_layers", -1),
        ("VAL-020", "model.moe_shared_expert_intermediate_size", -1), ("VAL-021", "model.recompute_num_layers", 0),
        ("VAL-022", "model.cpu_offloading_num_layers", -1), ("VAL-023", "train.micro_batch_size", 0),
        ("VAL-024", "train.global_batch_size", -64), ("VAL-025", "ddp.num_distributed_optimizer_instances", 0),
        ("VAL-026", "dataset.sequence_length", 0), ("VAL-027", "train.train_iters", -1))},
}


def _env(changes: dict) -> Env:
    kw = copy.deepcopy(ENV)
    vars_ = kw.pop("vars")
    vars_.update(changes.get("vars", {}))
    kw.update({k: v for k, v in changes.items() if k != "vars"})
    return Env(vars=vars_, **kw)


def _cfg(overrides: dict) -> dict:
    ov = dict(overrides)
    cfg = copy.deepcopy(BASE)
    if "frontend" in ov:
        cfg["frontend"] = ov.pop("frontend")
    return apply_overrides(cfg, ov)


def _ids(res) -> set[str]:
    return {f.id for f in res.errors}


@pytest.mark.parametrize("frontend", ["bridge", "megatron-lm"])
def test_base_config_is_clean(frontend):
    res = check_config(_cfg({"frontend": frontend}), _env({}))
    assert not res.errors, [(f.id, f.message) for f in res.errors]


def test_every_error_rule_has_an_example():
    error_rules = {r.id for r in load_rules().values() if r.is_error_rule}
    assert error_rules - set(EXAMPLES) == set()
    assert set(EXAMPLES) - error_rules == set()


@pytest.mark.parametrize("rule_id", sorted(EXAMPLES))
def test_rule_triggers_and_fix_resolves(rule_id):
    overrides, env_changes = EXAMPLES[rule_id]
    env = _env(env_changes)
    cfg = _cfg(overrides)
    res = check_config(cfg, env)
    hits = [f for f in res.findings if f.id == rule_id]
    assert hits, f"{rule_id} did not fire; errors: {sorted(_ids(res))}"
    f = hits[0]
    assert f.is_error, (f.severity, f.message)
    if rule_id in NO_FIX_RULES:  # an impossible architecture / batch value: only the user knows the intent
        assert f.fix is None and all(path in f.message for path in f.fields)
        return
    assert f.fix, f"{rule_id} has no concrete fix"
    for path in f.fields:  # the message names every field it reads, with its value
        assert path in f.message
    fixed = apply_overrides(normalize_input(cfg), f.fix)
    res2 = check_config(fixed, env)
    assert rule_id not in {x.id for x in res2.findings if x.is_error or x.severity == "depends-on-environment"}, (
        f"fix {f.fix} did not resolve {rule_id}")


def test_moe044_accepts_the_op_fuser_or_grouped_tensors_with_hybridep():
    """Megatron-Core ``TransformerConfig.__post_init__``: a rank capacity factor with HybridEP needs
    ``use_transformer_engine_op_fuser`` or ``moe_use_grouped_tensor``; either one passes, neither is MOE-044."""
    base = {**FLEX, "model.moe_flex_dispatcher_backend": "hybridep", "model.moe_expert_rank_capacity_factor": 1.5}
    assert "MOE-044" in _ids(check_config(_cfg(base), _env({"gpu": "gb200"})))
    for extra in ({"model.use_transformer_engine_op_fuser": True}, {"model.moe_use_grouped_tensor": True}):
        assert "MOE-044" not in _ids(check_config(_cfg({**base, **extra}), _env({"gpu": "gb200"}))), extra

"""(g) CPU offloading: layer activation offload, fine-grained activation offload, optimizer offload
(docs/rules.md §8, OFF-*). Sources: MCore ``transformer_config.py`` (TC L1767-1981), ``transformer_block.py``,
``optimizer/__init__.py``; Bridge ``training/config.py`` (B/cfg)."""

from __future__ import annotations

from moetune.rules.common import ENV, RT, W_, E
from moetune.rules.engine import Ctx, rule

A = "offload"
VALID_OFF = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
             "fused_group_mlp")


def _fg(c: Ctx) -> bool:
    return bool(c.m("fine_grained_activation_offloading"))


def _off(c: Ctx) -> list[str]:
    return list(c.m("offload_modules") or [])


rule("OFF-001", A, E, "C", ["model.cpu_offloading", "model.cpu_offloading_num_layers", "model.num_layers"],
     lambda c: bool(c.m("cpu_offloading")) and c.num_layers is not None and not (
         0 <= (c.m("cpu_offloading_num_layers") or 0) < c.num_layers),
     "cpu_offloading_num_layers must be in [0, num_layers)", "TC L1767",
     fix=lambda c: {"model.cpu_offloading_num_layers": max(0, c.num_layers - 1)})
rule("OFF-002", A, E, "C", ["model.cpu_offloading", "model.pipeline_model_parallel_size"],
     lambda c: bool(c.m("cpu_offloading")) and c.pp > 1,
     "CPU offloading does not support pipeline parallelism (PP > 1)", "TC L1772", fix={"model.cpu_offloading": False})
rule("OFF-003", A, E, "C", ["model.cpu_offloading", "model.recompute_granularity"],
     lambda c: bool(c.m("cpu_offloading")) and c.m("recompute_granularity") is not None,
     "CPU offloading is incompatible with activation recompute", "TC L1777",
     fix={"model.recompute_granularity": None, "model.recompute_method": None, "model.recompute_num_layers": None})
rule("OFF-004", A, E, "C", ["model.cpu_offloading", "model.cuda_graph_impl"],
     lambda c: bool(c.m("cpu_offloading")) and c.per_layer_graph,
     "CUDA graphs (local / transformer_engine) are not supported with CPU offloading", "TC L2560",
     fix={"model.cpu_offloading": False})
rule("OFF-005", A, E, "C", ["model.cpu_offloading", "model.fine_grained_activation_offloading"],
     lambda c: bool(c.m("cpu_offloading")) and _fg(c),
     "cpu_offloading and fine_grained_activation_offloading are mutually exclusive", "TC L1906",
     fix={"model.cpu_offloading": False})
rule("OFF-006", A, E, "C", ["model.cpu_offloading", "model.moe_paged_stash"],
     lambda c: bool(c.m("cpu_offloading")) and bool(c.m("moe_paged_stash")),
     "cpu_offloading and moe_paged_stash are mutually exclusive", "TC L1971", fix={"model.cpu_offloading": False})
rule("OFF-007", A, ENV, "B", ["model.cpu_offloading", "model.transformer_impl"],
     lambda c: bool(c.m("cpu_offloading")) and c.m("transformer_impl", "transformer_engine") != "transformer_engine",
     "CPU offloading needs Transformer Engine", "transformer_block.py TransformerBlock.__init__",
     fix={"model.cpu_offloading": False}, env=("Transformer Engine installed",))
rule("OFF-008", A, W_, "-", ["model.cpu_offloading_double_buffering", "env.te"],
     lambda c: bool(c.m("cpu_offloading")) and bool(c.m("cpu_offloading_double_buffering"))
     and c.te_below("2.5.0") is True,
     "cpu_offloading_double_buffering is not forwarded to TE < 2.5", "extensions/transformer_engine.py")
rule("OFF-010", A, E, "C", ["model.fine_grained_activation_offloading", "model.offload_modules"],
     lambda c: _fg(c) and (not _off(c) or any(m not in VALID_OFF for m in _off(c))),
     "fine-grained offloading needs a non-empty list of valid offload_modules", "TC L1909-1921",
     fix=lambda c: {"model.offload_modules": [m for m in _off(c) if m in VALID_OFF]} if any(
         m in VALID_OFF for m in _off(c)) else {"model.fine_grained_activation_offloading": False})
rule("OFF-011", A, E, "C", ["model.offload_modules"],
     lambda c: _fg(c) and "attn_proj" in _off(c) and "core_attn" not in _off(c),
     "offloading attn_proj needs core_attn offloaded too", "TC L1926",
     fix=lambda c: {"model.offload_modules": _off(c) + ["core_attn"]})
rule("OFF-013", A, E, "C", ["model.min_offloaded_tensor_size", "model.activation_offload_fraction",
                            "model.delta_offload_bytes_across_pp_ranks"],
     lambda c: _fg(c) and ((c.m("min_offloaded_tensor_size") or 0) < 0
                           or not (0 <= (c.m("activation_offload_fraction") if c.m("activation_offload_fraction")
                                         is not None else 1) <= 1)
                           or (c.m("delta_offload_bytes_across_pp_ranks") or 0) < 0),
     "fine-grained offloading range checks (sizes >= 0, fraction in [0, 1])", "TC L1942-1948",
     fix={"model.min_offloaded_tensor_size": None, "model.activation_offload_fraction": None,
          "model.delta_offload_bytes_across_pp_ranks": None})
rule("OFF-014", A, E, "C", ["model.offload_modules", "model.use_transformer_engine_op_fuser"],
     lambda c: _fg(c) and "fused_group_mlp" in _off(c) and (
         not c.m("use_transformer_engine_op_fuser") or "expert_fc1" in _off(c) or "moe_act" in _off(c)),
     "fused_group_mlp offload needs the TE op fuser and replaces expert_fc1/moe_act", "TC L1954-1957",
     fix=lambda c: {"model.offload_modules": [m for m in _off(c) if m not in ("expert_fc1", "moe_act")],
                    "model.use_transformer_engine_op_fuser": True})
rule("OFF-015", A, E, "C", ["model.fine_grained_activation_offloading", "model.transformer_impl"],
     lambda c: _fg(c) and c.m("transformer_impl", "transformer_engine") != "transformer_engine",
     "fine-grained offloading supports only transformer_impl=transformer_engine",
     "B/cfg _validate_fine_grained_activation_offloading", fix={"model.transformer_impl": "transformer_engine"})
rule("OFF-016", A, ENV, "C", ["model.fine_grained_activation_offloading", "env.te", "env.NVTE_CPU_OFFLOAD_V1"],
     lambda c: _fg(c) and c.te_below("2.10.0") is False and c.var("NVTE_CPU_OFFLOAD_V1") != "1",
     "fine-grained offloading with TE >= 2.10 needs env NVTE_CPU_OFFLOAD_V1=1",
     "B/cfg _validate_fine_grained_activation_offloading", fix={"env_vars.NVTE_CPU_OFFLOAD_V1": "1"},
     env=("Transformer Engine version / env NVTE_CPU_OFFLOAD_V1",))
rule("OFF-019", A, E, "C", ["model.moe_paged_stash", "model.moe_expert_rank_capacity_factor", "model.offload_modules"],
     lambda c: bool(c.m("moe_paged_stash")) and (
         c.m("moe_expert_rank_capacity_factor") is None
         or bool(set(_off(c)) & {"expert_fc1", "moe_act", "fused_group_mlp"})),
     "moe_paged_stash needs moe_expert_rank_capacity_factor and covers expert_fc1/moe_act offload itself",
     "TC L1973-1981", fix={"model.moe_paged_stash": False})
rule("OFF-020", A, RT, "B", ["optimizer.optimizer_cpu_offload", "optimizer.decoupled_weight_decay"],
     lambda c: bool(c.get("optimizer.optimizer_cpu_offload")) and c.get("optimizer.decoupled_weight_decay") is False,
     "optimizer CPU offloading is only supported in AdamW mode (decoupled_weight_decay=True)",
     "optimizer/__init__.py", fix={"optimizer.decoupled_weight_decay": True})
rule("OFF-021", A, W_, "-", ["optimizer.optimizer_offload_fraction"],
     lambda c: bool(c.get("optimizer.optimizer_cpu_offload")) and not (
         0 <= (c.get("optimizer.optimizer_offload_fraction") or 0) <= 1),
     "optimizer_offload_fraction outside [0, 1] is meaningless", "optimizer/cpu_offloading/hybrid_optimizer.py")
rule("OFF-022", A, W_, "-", ["optimizer.optimizer_cpu_offload", "optimizer.use_distributed_optimizer",
                             "optimizer.use_precision_aware_optimizer"],
     lambda c: bool(c.get("optimizer.optimizer_cpu_offload")) and (
         not c.dist_opt or not c.get("optimizer.use_precision_aware_optimizer")),
     "optimizer CPU offload without the distributed optimizer or the precision-aware optimizer (MLM asserts)",
     "MLM validate_args; docs cpu-offloading.md")
rule("OFF-023", A, W_, "-", ["optimizer.optimizer_cpu_offload", "env.torch"],
     lambda c: bool(c.get("optimizer.optimizer_cpu_offload")) and c.torch_below("2.3.0") is True,
     "optimizer CPU offload with torch < 2.3 is untested", "optimizer/__init__.py")

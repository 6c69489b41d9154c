"""(d) Activation recompute (docs/rules.md §5, RCP-*). Sources: MCore ``transformer_config.py`` (TC L1779-1935,
L2613-2679), ``megatron/core/recompute.py``; MLM ``validate_args``."""

from __future__ import annotations

from moetune.rules.common import ENV, I_, RT, W_, E
from moetune.rules.engine import Ctx, any_of, rule

A = "recompute"
VALID_RMODS = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts", "gdn_norm_out"}


def _full_graph(c: Ctx) -> bool:
    return c.full_iter_graph or (c.per_layer_graph and not c.cg_mods)


def _captured(c: Ctx, mod: str) -> bool:
    return _full_graph(c) or mod in c.cg_mods


def _graphs_on(c: Ctx) -> bool:
    return c.cg_impl != "none"


rule("RCP-001", A, E, "C", ["model.recompute_granularity"],
     lambda c: c.m("recompute_granularity") not in (None, "full", "selective"),
     "recompute_granularity must be full or selective", "TC L1782", fix={"model.recompute_granularity": None})
rule("RCP-002", A, E, "C", ["model.recompute_method"],
     lambda c: c.m("recompute_method") is not None and c.m("recompute_method") not in ("uniform", "block"),
     "recompute_method must be uniform or block", "TC L1789", fix={"model.recompute_method": "uniform"})
rule("RCP-003", A, E, "C", ["model.recompute_granularity", "model.recompute_method"],
     lambda c: c.m("recompute_granularity") == "full" and c.m("recompute_method") is None,
     "full recompute needs recompute_method uniform or block", "TC L1795",
     fix={"model.recompute_method": "uniform"})
rule("RCP-004", A, E, "C", ["model.recompute_granularity", "model.recompute_num_layers"],
     lambda c: c.m("recompute_granularity") == "full" and c.m("recompute_num_layers") is None,
     "full recompute needs recompute_num_layers (1 .. num_layers/PP)", "TC L1801",
     fix={"model.recompute_num_layers": 1})
rule("RCP-005", A, E, "C", ["model.recompute_granularity", "model.recompute_num_layers"],
     lambda c: c.m("recompute_granularity") == "selective" and c.m("recompute_num_layers") is not None,
     "recompute_num_layers must be None for selective recompute", "TC L1810",
     fix={"model.recompute_num_layers": None})
rule("RCP-006", A, W_, "-", ["model.recompute_granularity", "model.recompute_method"],
     lambda c: c.m("recompute_granularity") == "selective" and c.m("recompute_method") is not None,
     "recompute_method with selective recompute (MLM rejects; trips EP overlap)", "MLM validate_args")
rule("RCP-007", A, E, "C", ["model.distribute_saved_activations", "model.sequence_parallel"],
     lambda c: c.m("recompute_granularity") is not None and bool(c.m("distribute_saved_activations"))
     and bool(c.m("sequence_parallel")),
     "distribute_saved_activations is incompatible with sequence parallelism", "TC L1816",
     fix={"model.distribute_saved_activations": False})
#: recompute modules added after the pinned MCore (docs/rules.md §11: valid on Megatron-LM main HEAD)
HEAD_RMODS = {"gdp_in_proj", "gdp_qkv", "mhc"}


def _rcp008(c: Ctx):
    bad = {m for m in c.rmods if m not in VALID_RMODS}
    if not bad:
        return False
    if bad <= HEAD_RMODS:  # valid only on newer MCore: the verdict depends on the installed version
        return c.mcore_below("0.21.0")
    return True


rule("RCP-008", A, E, "C", ["model.recompute_modules", "env.mcore"], _rcp008,
     "invalid recompute module (core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts, gdn_norm_out)",
     "TC L1837", fix=lambda c: {"model.recompute_modules": [m for m in c.rmods if m in VALID_RMODS]},
     env=("Megatron-Core version",))
rule("RCP-009", A, E, "C", ["model.recompute_modules", "model.moe_grouped_gemm"],
     lambda c: "moe_act" in c.rmods and not c.m("moe_grouped_gemm"),
     "moe_act recompute needs moe_grouped_gemm", "TC L1843", fix={"model.moe_grouped_gemm": True})
rule("RCP-010", A, E, "C", ["model.recompute_modules", "model.multi_latent_attention"],
     lambda c: "mla_up_proj" in c.rmods and not c.m("multi_latent_attention") and c.arch_known,
     "mla_up_proj recompute is only for multi-latent attention", "TC L1848",
     fix=lambda c: {"model.recompute_modules": [m for m in c.rmods if m != "mla_up_proj"]})
rule("RCP-011", A, E, "C", ["model.recompute_modules", "model.experimental_attention_variant"],
     lambda c: "gdn_norm_out" in c.rmods and c.m("experimental_attention_variant") not in ("gdn", "gdn2")
     and c.arch_known,
     "gdn_norm_out recompute is only for Gated DeltaNet", "TC L1856",
     fix=lambda c: {"model.recompute_modules": [m for m in c.rmods if m != "gdn_norm_out"]})
rule("RCP-012", A, W_, "C", ["model.recompute_modules"],
     lambda c: "core_attn" in c.rmods,
     "core_attn recompute is usually unnecessary with TE fused/flash attention", "TC L1862")
rule("RCP-013", A, E, "C", ["model.recompute_modules", "model.moe_shared_expert_overlap"],
     lambda c: "shared_experts" in c.rmods and c.has_shared_experts and bool(c.m("moe_shared_expert_overlap")),
     "shared_experts recompute cannot be used with moe_shared_expert_overlap", "TC L1874",
     fix={"model.moe_shared_expert_overlap": False})
rule("RCP-014", A, E, "C", ["model.recompute_modules", "model.fp8", "model.fp8_recipe"],
     lambda c: c.fp8 is not None and any(m in c.rmods for m in ("moe_act", "layernorm"))
     and c.m("fp8_recipe") == "delayed",
     "moe_act/layernorm recompute is not supported with FP8 delayed scaling", "TC L1881",
     fix=lambda c: {"model.recompute_modules": [m for m in c.rmods if m not in ("moe_act", "layernorm")]})
rule("RCP-014e", A, ENV, "C", ["model.recompute_modules", "model.fp8", "env.te"],
     lambda c: c.fp8 is not None and any(m in c.rmods for m in ("moe_act", "layernorm"))
     and c.m("fp8_recipe") != "delayed" and c.te_below("2.6.0.dev0"),
     "moe_act/layernorm recompute with FP8 needs Transformer Engine >= 2.6.0.dev0", "TC L1886",
     fix=lambda c: {"model.recompute_modules": [m for m in c.rmods if m not in ("moe_act", "layernorm")]},
     env=("Transformer Engine version",))
rule("RCP-015", A, E, "C", ["model.moe_layer_recompute", "model.recompute_granularity"],
     lambda c: bool(c.m("moe_layer_recompute")) and c.m("recompute_granularity") == "full",
     "deprecated moe_layer_recompute cannot be combined with full recompute", "TC L1893-1898",
     fix={"model.moe_layer_recompute": False})
rule("RCP-015w", A, W_, "C", ["model.moe_layer_recompute"],
     lambda c: bool(c.raw_get("model.moe_layer_recompute")),
     "moe_layer_recompute is deprecated: converted to selective recompute of 'moe'", "TC L1893")
rule("RCP-016", A, E, "C", ["model.cpu_offloading", "model.recompute_granularity"],
     lambda c: bool(c.m("cpu_offloading")) and c.m("recompute_granularity") is not None,
     "CPU offloading does not work with activation recompute", "TC L1779",
     fix={"model.recompute_granularity": None, "model.recompute_method": None, "model.recompute_num_layers": None})
rule("RCP-018", A, E, "C", ["model.recompute_granularity", "model.cuda_graph_impl"],
     lambda c: c.m("recompute_granularity") == "full" and c.cg_impl not in ("none", "full_iteration"),
     "full recompute is only supported with full-iteration CUDA graphs", "TC L2613-2617",
     fix={"model.cuda_graph_impl": "none"})
rule("RCP-019", A, E, "C", ["model.recompute_modules", "model.cuda_graph_modules"],
     lambda c: c.te_graph and "moe" in c.rmods and "moe_router" in c.cg_mods,
     "moe recompute is not supported with the moe_router TE CUDA graph", "TC L2620-2627",
     fix=lambda c: {"model.recompute_modules": [m for m in c.rmods if m != "moe"]})
rule("RCP-020", A, E, "C", ["model.cuda_graph_impl", "model.cuda_graph_modules", "model.recompute_modules",
                            "model.attention_dropout", "model.hidden_dropout", "model.moe_input_jitter_eps"],
     lambda c: _graphs_on(c) and c.m("recompute_granularity") == "selective" and (
         ((c.m("attention_dropout") or 0) != 0 and "core_attn" in c.rmods and _captured(c, "attn"))
         or ((c.m("hidden_dropout") or 0) != 0 and (("mlp" in c.rmods and _captured(c, "mlp"))
                                                    or ("moe" in c.rmods and _captured(c, "moe"))))
         or (c.m("moe_input_jitter_eps") is not None and "moe" in c.rmods and _captured(c, "moe"))),
     "graphed recompute modules cannot consume random numbers (dropout / input jitter)", "TC L2629-2664",
     fix={"model.attention_dropout": 0.0, "model.hidden_dropout": 0.0, "model.moe_input_jitter_eps": None})
rule("RCP-022", A, E, "C", ["model.recompute_modules", "model.offload_modules"],
     lambda c: bool(c.m("fine_grained_activation_offloading")) and "moe" in c.rmods
     and bool(set(c.m("offload_modules") or []) & {"moe_act", "expert_fc1", "fused_group_mlp"}),
     "do not offload moe_act/expert_fc1/fused_group_mlp inside a recomputed MoE", "TC L1935",
     fix=lambda c: {"model.offload_modules": [m for m in c.m("offload_modules")
                                              if m not in ("moe_act", "expert_fc1", "fused_group_mlp")]})
rule("RCP-024", A, I_, "-", ["model.recompute_method", "model.fp8"],
     lambda c: c.m("recompute_granularity") == "full" and c.m("recompute_method") == "block"
     and (c.fp8 is not None or c.fp4 is not None),
     "block recompute with FP8/FP4 skips layers whose input needs no grad", "megatron/core/recompute.py")
rule("RCP-025", A, W_, "-", ["model.recompute_modules", "model.moe_layer_freq"],
     lambda c: "mlp" in c.rmods and c.all_layers_moe,
     "'mlp' recompute has no effect on an all-MoE model (only dense MLPs)", "TC recompute_modules docstring")
_ = (RT, any_of)

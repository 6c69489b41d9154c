"""(b) MoE: experts, router, capacity, dispatchers/backends and hardware gates, MTP (docs/rules.md §3, MOE-*).

Sources: MCore ``transformer_config.py`` (TC), ``moe/moe_layer.py``, ``moe/router.py``, ``moe/moe_utils.py``,
``moe/token_dispatcher.py``, ``moe/experts.py``, ``multi_token_prediction.py``; Bridge
``training/flex_dispatcher_backend.py`` (B/flex).
"""

from __future__ import annotations

import math

from moetune.rules.common import ENV, I_, RT, W_, E, modules
from moetune.rules.engine import Ctx, all_of, rule
from moetune.spec.features import (
    CUTEDSL_FUSED_GROUPED_MLP_ENV,
    FUSED_GROUPED_MLP_DIM_ALIGN,
    FUSED_GROUPED_MLP_GLU_INTERLEAVE,
    env_flag_on,
)

A = "moe"
LB_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "quantile_balancing", "none")


def _lb(c: Ctx) -> list[str]:
    return [str(x) for x in modules(c.m("moe_router_load_balancing_type", "aux_loss"))]


def _coeffs(c: Ctx) -> list[float]:
    v = c.m("moe_aux_loss_coeff", 0.0)
    return [float(x) for x in (v if isinstance(v, list) else [v or 0.0])]


def _group_limited(c: Ctx) -> bool:
    return c.m("moe_router_group_topk") is not None


rule("MOE-001", A, E, "C", ["model.num_moe_experts"],
     lambda c: c.num_experts is not None and c.num_experts <= 0,
     "num_moe_experts must be positive (None for a dense model)", "TC L1584", fix={"model.num_moe_experts": None})
rule("MOE-002", A, W_, "C", ["model.num_moe_experts", "model.moe_ffn_hidden_size", "model.ffn_hidden_size"],
     lambda c: c.num_experts is not None and c.m("moe_ffn_hidden_size") is None,
     "moe_ffn_hidden_size unset: falls back to ffn_hidden_size", "TC L1588")
rule("MOE-003", A, E, "C", ["model.num_moe_experts", "model.moe_ffn_hidden_size", "model.moe_layer_freq"],
     lambda c: c.num_experts is None and c.m("moe_ffn_hidden_size") is not None and c.arch_known
     and not c.meta.get("moe")
     and not ((isinstance(c.m("moe_layer_freq"), int) and c.m("moe_layer_freq") > 1)
              or (isinstance(c.m("moe_layer_freq"), list) and 0 in c.m("moe_layer_freq"))),
     "moe_ffn_hidden_size set on a dense model (num_moe_experts is None)", "TC L1595-1603",
     fix={"model.moe_ffn_hidden_size": None})
rule("MOE-004", A, RT, "B", ["model.moe_layer_freq", "model.num_layers"],
     lambda c: c.num_experts is not None and c.num_layers is not None and not c.m("is_hybrid_model") and (
         (isinstance(c.m("moe_layer_freq"), list) and (len(c.m("moe_layer_freq")) != c.num_layers
                                                        or set(c.m("moe_layer_freq")) - {0, 1}))
         or not isinstance(c.m("moe_layer_freq"), (int, list))),
     "moe_layer_freq list must have num_layers entries of 0/1 (or be an int)", "models/gpt/gpt_layer_specs.py",
     fix={"model.moe_layer_freq": 1})
rule("MOE-005", A, E, "C", ["model.num_moe_experts", "model.add_bias_linear", "model.expert_tensor_parallel_size"],
     lambda c: c.num_experts is not None and bool(c.m("add_bias_linear")) and c.etp != 1,
     "bias in MoE layers is only supported with expert_tensor_parallel_size == 1", "TC L2372",
     fix={"model.expert_tensor_parallel_size": 1})
rule("MOE-006", A, E, "C", ["model.moe_shared_expert_intermediate_size"],
     lambda c: c.m("moe_shared_expert_intermediate_size") is not None and c.m("moe_shared_expert_intermediate_size") <= 0,
     "moe_shared_expert_intermediate_size must be positive (num_shared_experts x shared FFN size)", "TC L1697",
     fix={"model.moe_shared_expert_intermediate_size": None})
rule("MOE-007", A, RT, "B", ["model.moe_shared_expert_intermediate_size", "model.add_bias_linear"],
     lambda c: c.has_shared_experts and bool(c.m("add_bias_linear")),
     "shared experts do not support bias (add_bias_linear)", "moe/shared_experts.py SharedExpertMLP.__init__",
     fix={"model.add_bias_linear": False})
rule("MOE-008", A, RT, "B", ["model.add_bias_linear", "model.bias_dropout_fusion", "model.moe_grouped_gemm"],
     lambda c: c.is_moe and bool(c.m("add_bias_linear")) and bool(c.m("bias_dropout_fusion"))
     and bool(c.m("moe_grouped_gemm")) and c.m("transformer_impl", "transformer_engine") == "transformer_engine",
     "bias_dropout_fusion is not supported in TEGroupedMLP with bias", "moe/experts.py TEGroupedMLP.__init__",
     fix={"model.bias_dropout_fusion": False})
rule("MOE-009", A, W_, "B", ["model.moe_grouped_gemm", "env.te"],
     lambda c: c.is_moe and bool(c.m("moe_grouped_gemm")) and c.te_below("1.9.0") is True,
     "moe_grouped_gemm without TE GroupedLinear silently falls back to SequentialMLP (slow)",
     "extensions/transformer_engine_spec_provider.py grouped_mlp_modules")
rule("MOE-010", A, E, "C", ["model.moe_single_grouped_weight", "model.moe_grouped_gemm",
                            "model.use_transformer_engine_op_fuser"],
     lambda c: bool(c.m("moe_single_grouped_weight") or c.m("moe_single_grouped_bias")) and (
         not c.m("moe_grouped_gemm") or (c.m("moe_single_grouped_weight") and not c.m("use_transformer_engine_op_fuser"))
         or (c.m("moe_single_grouped_bias") and not c.m("add_bias_linear"))),
     "single grouped weight/bias storage needs grouped GEMM, the TE op fuser (weight) and add_bias_linear (bias)",
     "TC L1608-1645", fix={"model.moe_single_grouped_weight": False, "model.moe_single_grouped_bias": False})
rule("MOE-011", A, RT, "B", ["model.use_transformer_engine_op_fuser", "model.expert_tensor_parallel_size",
                             "model.moe_apply_probs_on_input"],
     lambda c: c.is_moe and bool(c.m("use_transformer_engine_op_fuser")) and (
         c.etp > 1 or bool(c.m("moe_apply_probs_on_input")) or not c.m("moe_grouped_gemm")),
     "fused grouped MLP (TE op fuser) unsupported for this config (needs ETP 1, grouped GEMM, no "
     "moe_apply_probs_on_input)", "moe/experts.py TEGroupedMLP._is_fused_impl_supported",
     fix={"model.use_transformer_engine_op_fuser": False})
rule("MOE-012", A, RT, "R", ["model.moe_apply_probs_on_input", "model.moe_router_topk"],
     lambda c: bool(c.m("moe_apply_probs_on_input")) and c.m("moe_router_topk", 2) != 1,
     "moe_apply_probs_on_input only works with top-1 routing", "moe/experts.py",
     fix={"model.moe_apply_probs_on_input": False})
rule("MOE-013", A, RT, "R", ["model.moe_latent_size", "model.moe_shared_expert_overlap"],
     lambda c: c.m("moe_latent_size") is not None and bool(c.m("moe_shared_expert_overlap")),
     "shared-expert overlap with latent MoE projections is not supported in training", "moe/moe_layer.py preprocess",
     fix={"model.moe_shared_expert_overlap": False})
rule("MOE-014", A, E, "C", ["model.activation_func_clamp_value", "model.num_moe_experts",
                            "model.use_te_activation_func"],
     lambda c: c.m("activation_func_clamp_value") is not None and bool(c.m("gated_linear_unit")) and (
         not (isinstance(c.m("activation_func_clamp_value"), (int, float)) and
              math.isfinite(c.m("activation_func_clamp_value")) and c.m("activation_func_clamp_value") > 0)
         or (c.num_experts is None and c.arch_known) or bool(c.m("use_te_activation_func"))),
     "clamped SwiGLU needs a positive finite clamp, MoE experts and no TE activation function", "TC L2230-2254",
     fix=lambda c: {"model.use_te_activation_func": False} if (
         isinstance(c.m("activation_func_clamp_value"), (int, float)) and c.m("activation_func_clamp_value") > 0
         and c.num_experts is not None) else {"model.activation_func_clamp_value": None})
# router ---------------------------------------------------------------------------------------------------------
rule("MOE-020", A, E, "C", ["model.moe_router_topk", "model.moe_router_score_function", "model.moe_router_pre_softmax",
                            "model.moe_router_load_balancing_type"],
     lambda c: c.is_moe and c.m("moe_router_topk", 2) == 1 and c.m("moe_router_score_function", "softmax") == "softmax"
     and not c.m("moe_router_pre_softmax") and "sinkhorn" not in _lb(c),
     "top-1 routing with softmax scoring needs moe_router_pre_softmax=True", "TC L2428",
     fix={"model.moe_router_pre_softmax": True})
rule("MOE-021", A, RT, "R", ["model.moe_router_topk", "model.num_moe_experts", "model.moe_router_group_topk",
                             "model.moe_router_num_groups"],
     lambda c: c.num_experts is not None and c.num_experts > 0 and (
         c.m("moe_router_topk", 2) > c.num_experts
         or (_group_limited(c) and c.m("moe_router_num_groups") and c.num_experts % c.m("moe_router_num_groups") == 0
             and c.m("moe_router_topk", 2) > c.m("moe_router_group_topk")
             * (c.num_experts // c.m("moe_router_num_groups")))),
     "moe_router_topk exceeds the experts available to a token (torch.topk fails at the first forward)",
     "moe/moe_utils.py topk_routing_with_score_function / group_limited_topk",
     fix=lambda c: {"model.moe_router_topk": min(c.num_experts, c.m("moe_router_topk", 2))}
     if c.m("moe_router_topk", 2) > c.num_experts else {"model.moe_router_group_topk": None,
                                                        "model.moe_router_num_groups": None})
rule("MOE-022", A, E, "C", ["model.moe_router_group_topk", "model.moe_router_num_groups", "model.num_moe_experts"],
     lambda c: _group_limited(c) and not c.m("_topk_limited_devices_migrated") and (
         c.m("moe_router_num_groups") is None
         or (c.num_experts is not None and c.num_experts % c.m("moe_router_num_groups") != 0)
         or c.m("moe_router_group_topk") > c.m("moe_router_num_groups")),
     "group-limited routing needs moe_router_num_groups dividing num_moe_experts and group_topk <= num_groups",
     "TC L2430-2447", fix={"model.moe_router_group_topk": None, "model.moe_router_num_groups": None})
rule("MOE-023", A, W_, "C", ["model.moe_router_topk_limited_devices"],
     lambda c: c.raw_get("model.moe_router_topk_limited_devices") is not None,
     "moe_router_topk_limited_devices is deprecated (becomes group_topk=value, num_groups=EP)", "TC L2450")
rule("MOE-024", A, W_, "-", ["model.moe_router_topk", "model.moe_router_group_topk"],
     lambda c: _group_limited(c) and c.m("moe_router_topk", 2) < c.m("moe_router_group_topk"),
     "moe_router_topk < moe_router_group_topk: per-group top count is 0 and group scores degenerate",
     "moe/moe_utils.py group_limited_topk")
rule("MOE-025", A, E, "C", ["model.moe_router_enable_expert_bias", "model.moe_router_score_function"],
     lambda c: bool(c.m("moe_router_enable_expert_bias"))
     and c.m("moe_router_score_function", "softmax") not in ("sigmoid", "sqrtsoftplus"),
     "expert bias (aux-loss-free balancing) requires sigmoid or sqrtsoftplus scoring", "TC L2380",
     fix={"model.moe_router_score_function": "sigmoid"})
rule("MOE-026", A, E, "C", ["model.moe_router_load_balancing_type", "model.moe_aux_loss_coeff"],
     lambda c: isinstance(c.m("moe_router_load_balancing_type"), list)
     and (not isinstance(c.m("moe_aux_loss_coeff"), list)
          or len(c.m("moe_aux_loss_coeff")) != len(c.m("moe_router_load_balancing_type"))),
     "a list of load-balancing types needs one moe_aux_loss_coeff per type", "TC L1711",
     fix=lambda c: {"model.moe_aux_loss_coeff": [_coeffs(c)[0]] * len(c.m("moe_router_load_balancing_type"))})
rule("MOE-027", A, RT, "R", ["model.moe_router_load_balancing_type", "model.moe_aux_loss_coeff"],
     lambda c: c.is_moe and "sinkhorn" in _lb(c) and any(x != 0 for x in _coeffs(c)),
     "sinkhorn load balancing does not support an aux loss coefficient", "moe/router.py sinkhorn_load_balancing",
     fix={"model.moe_aux_loss_coeff": 0.0})
rule("MOE-028", A, E, "B", ["model.moe_router_load_balancing_type", "model.moe_aux_loss_coeff",
                            "model.moe_router_fusion", "model.moe_router_group_topk"],
     lambda c: c.is_moe and "quantile_balancing" in _lb(c) and (
         any(x > 0 for x in _coeffs(c)) or bool(c.m("moe_router_fusion")) or _group_limited(c)),
     "quantile balancing disallows aux-loss coefficients, router fusion and group-limited routing", "moe/router.py",
     fix={"model.moe_aux_loss_coeff": 0.0, "model.moe_router_fusion": False, "model.moe_router_group_topk": None,
          "model.moe_router_num_groups": None})
rule("MOE-029", A, ENV, "R", ["model.moe_router_fusion", "env.te"],
     lambda c: c.is_moe and bool(c.m("moe_router_fusion")) and (
         c.te_below("2.13.0") if c.m("moe_router_score_function") == "sqrtsoftplus" else
         c.te_below("2.7.0") if any(t != "none" for t in _lb(c)) else c.te_below("2.6.0")),
     "moe_router_fusion needs fused router kernels (TE >= 2.6; aux loss 2.7; sqrtsoftplus 2.13)", "moe/moe_utils.py",
     fix={"model.moe_router_fusion": False}, env=("Transformer Engine version",))
rule("MOE-030", A, W_, "C", ["model.num_moe_experts", "model.moe_router_dtype"],
     lambda c: c.num_experts is not None and c.num_experts >= 32 and c.m("moe_router_dtype") is None,
     "32 or more experts without moe_router_dtype: fp32 routing is recommended for stability", "TC L2883")
rule("MOE-031", A, W_, "-", ["model.moe_router_force_load_balancing"],
     lambda c: c.is_moe and bool(c.m("moe_router_force_load_balancing") or c.m("moe_router_force_biased")),
     "forced load-balanced routing is benchmark-only: it changes training semantics (do not train with it)",
     "TC field docstrings; skills nemo-mbridge-perf")
rule("MOE-032", A, I_, "-", ["model.moe_aux_loss_coeff", "model.moe_router_load_balancing_type"],
     lambda c: c.is_moe and any(t.endswith("aux_loss") for t in _lb(c)) and all(x == 0 for x in _coeffs(c)),
     "aux-loss load balancing with coefficient 0: the aux loss is effectively disabled", "moe/router.py is_aux_loss_enabled")
rule("MOE-033", A, RT, "R", ["model.moe_router_score_function"],
     lambda c: c.is_moe and c.m("moe_router_score_function", "softmax") not in ("softmax", "sigmoid", "sqrtsoftplus"),
     "invalid moe_router_score_function (softmax, sigmoid or sqrtsoftplus)", "moe/moe_utils.py",
     fix={"model.moe_router_score_function": "softmax"})
rule("MOE-034", A, W_, "-", ["model.moe_router_load_balancing_type"],
     lambda c: c.is_moe and any(t not in LB_TYPES for t in _lb(c)),
     "unknown moe_router_load_balancing_type behaves like plain top-k without that loss", "moe/router.py")
# capacity -------------------------------------------------------------------------------------------------------
rule("MOE-040", A, E, "C", ["model.moe_expert_capacity_factor", "model.moe_router_load_balancing_type"],
     lambda c: c.m("moe_expert_capacity_factor") is not None and any(
         t not in ("aux_loss", "seq_aux_loss", "global_aux_loss", "none") for t in _lb(c)),
     "a capacity factor only works with aux_loss/seq_aux_loss/global_aux_loss/none balancing", "TC L1718-1739",
     fix={"model.moe_expert_capacity_factor": None, "model.moe_pad_expert_input_to_capacity": False})
rule("MOE-041", A, E, "C", ["model.moe_pad_expert_input_to_capacity", "model.moe_expert_capacity_factor"],
     lambda c: bool(c.m("moe_pad_expert_input_to_capacity")) and c.m("moe_expert_capacity_factor") is None,
     "padding to capacity needs moe_expert_capacity_factor", "TC L1746",
     fix={"model.moe_pad_expert_input_to_capacity": False})
rule("MOE-042", A, E, "C", ["model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend",
                            "model.moe_pad_expert_input_to_capacity"],
     lambda c: (c.flex_backend == "deepep" or bool(c.m("moe_enable_deepep")))
     and bool(c.m("moe_pad_expert_input_to_capacity")),
     "the DeepEP flex dispatcher does not support padding to capacity", "TC L1662",
     fix={"model.moe_pad_expert_input_to_capacity": False})
rule("MOE-043", A, RT, "B", ["model.moe_flex_dispatcher_backend", "model.moe_expert_capacity_factor"],
     lambda c: c.flex_backend == "ncclep" and (c.m("moe_expert_capacity_factor") is not None
                                               or bool(c.m("moe_pad_expert_input_to_capacity"))),
     "drop-and-pad is not supported with the ncclep backend", "moe/token_dispatcher.py _NCCLEPManager.__init__",
     fix={"model.moe_expert_capacity_factor": None, "model.moe_pad_expert_input_to_capacity": False})
rule("MOE-044", A, E, "C", ["model.moe_expert_rank_capacity_factor", "model.moe_flex_dispatcher_backend",
                            "model.use_transformer_engine_op_fuser", "model.moe_use_grouped_tensor"],
     lambda c: c.m("moe_expert_rank_capacity_factor") is not None and (
         c.m("moe_flex_dispatcher_backend") not in ("hybridep", "ncclep")
         or (c.m("moe_flex_dispatcher_backend") == "hybridep" and not c.m("use_transformer_engine_op_fuser")
             and not c.m("moe_use_grouped_tensor"))),
     "per-rank capacity is a HybridEP/NCCL-EP feature (HybridEP also needs the TE op fuser or grouped tensors)",
     "TC L1752-1760 (transformer_config.py __post_init__)", fix={"model.moe_expert_rank_capacity_factor": None})
rule("MOE-046", A, RT, "R", ["model.moe_expert_capacity_factor", "model.moe_token_drop_policy"],
     lambda c: c.m("moe_expert_capacity_factor") is not None
     and c.m("moe_token_drop_policy", "probs") not in ("probs", "position"),
     "invalid moe_token_drop_policy (probs or position)", "moe/moe_utils.py apply_router_token_dropping",
     fix={"model.moe_token_drop_policy": "probs"})
# dispatchers ----------------------------------------------------------------------------------------------------
rule("MOE-050", A, RT, "B", ["model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"],
     lambda c: c.is_moe and (c.dispatcher not in ("allgather", "alltoall", "flex")
                             or (c.dispatcher == "flex" and c.flex_backend not in ("deepep", "hybridep", "ncclep",
                                                                                   None))),
     "unsupported token dispatcher type or flex backend", "moe/moe_layer.py MoELayer.__init__",
     fix={"model.moe_token_dispatcher_type": "alltoall"})
rule("MOE-051", A, E, "C", ["model.moe_token_dispatcher_type", "model.variable_seq_lengths"],
     lambda c: c.is_moe and c.dispatcher == "allgather" and bool(c.m("variable_seq_lengths")),
     "the allgather dispatcher does not support variable sequence lengths", "TC L2738",
     fix={"model.moe_token_dispatcher_type": "alltoall"})
rule("MOE-052", A, E, "C", ["model.moe_router_padding_for_quantization", "model.fp8", "model.fp4",
                            "model.moe_token_dispatcher_type"],
     lambda c: bool(c.m("moe_router_padding_for_quantization")) and (
         (c.fp8 is None and c.fp4 is None) or c.dispatcher == "allgather"),
     "routing-map padding for quantization needs FP8/FP4 and a non-allgather dispatcher", "TC L2402-2415",
     fix={"model.moe_router_padding_for_quantization": False, "model.moe_router_padding_for_fp8": False})
rule("MOE-053", A, E, "C", ["model.moe_enable_deepep", "model.moe_token_dispatcher_type",
                            "model.moe_flex_dispatcher_backend"],
     lambda c: bool(c.m("moe_enable_deepep")) and (c.dispatcher != "flex" or c.m("moe_flex_dispatcher_backend")
                                                   == "hybridep"),
     "deprecated moe_enable_deepep needs the flex dispatcher and forces backend deepep", "TC L1647-1653",
     fix={"model.moe_enable_deepep": False})
rule("MOE-054", A, E, "C", ["model.moe_flex_dispatcher_backend", "model.moe_token_dispatcher_type"],
     lambda c: c.m("moe_flex_dispatcher_backend") == "ncclep" and c.dispatcher != "flex",
     "the ncclep backend requires moe_token_dispatcher_type=flex", "TC L1669",
     fix={"model.moe_token_dispatcher_type": "flex"})
rule("MOE-055", A, W_, "-", ["model.moe_flex_dispatcher_backend", "model.moe_token_dispatcher_type"],
     lambda c: c.is_moe and c.raw_get("model.moe_flex_dispatcher_backend") in ("hybridep", "deepep")
     and c.dispatcher != "flex",
     "moe_flex_dispatcher_backend has no effect unless the dispatcher is flex (use apply_flex_dispatcher_backend)",
     "skills nemo-mbridge-perf-moe-comm-overlap")
rule("MOE-056", A, RT, "B", ["model.moe_flex_dispatcher_backend", "model.expert_tensor_parallel_size",
                             "model.expert_model_parallel_size"],
     lambda c: c.flex_backend in ("deepep", "ncclep") and c.etp * c.ep == 1,
     "DeepEP / NCCL-EP dispatchers need ETP*EP > 1", "moe/token_dispatcher.py MoEFlexTokenDispatcher.__init__",
     fix={"model.moe_token_dispatcher_type": "alltoall"})
rule("MOE-057", A, ENV, "B", ["model.moe_flex_dispatcher_backend"],
     lambda c: c.flex_backend in ("deepep", "hybridep", "ncclep") and c.pkg_missing(c.flex_backend),
     "the flex dispatcher backend's package (DeepEP / DeepEP hybrid-ep / TE with NCCL EP) must be installed "
     "(--env MOETUNE_HAS_<BACKEND>=1 declares it present)",
     "moe/token_dispatcher.py managers", fix={"model.moe_token_dispatcher_type": "alltoall"},
     env=("installed DeepEP/HybridEP",))
rule("MOE-058", A, ENV, "C", ["model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend", "env.gpu"],
     lambda c: c.flex_backend == "deepep" and c.gpu_is(
         lambda cc, name: not (cc[0] in (8, 9) or name.startswith(("NVIDIA B200", "NVIDIA B300")))),
     "Bridge rejects the DeepEP backend on this GPU (only compute capability 8.x/9.x, B200, B300; not GB200/GB300)",
     "B/flex validate_flex_dispatcher_backend",
     fix=lambda c: {"model.moe_flex_dispatcher_backend": "hybridep"} if c.cc() and c.cc()[0] == 10
     else {"model.moe_token_dispatcher_type": "alltoall"}, env=("GPU type",))
rule("MOE-059", A, ENV, "C", ["model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend", "env.gpu"],
     lambda c: c.flex_backend == "hybridep" and c.gpu_is(lambda cc, name: cc[0] not in (8, 9, 10)),
     "Bridge rejects the HybridEP backend on this GPU (compute capability 8, 9 or 10 required)", "B/flex",
     fix={"model.moe_token_dispatcher_type": "alltoall"}, env=("GPU type",))
rule("MOE-060", A, I_, "C", ["model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"],
     lambda c: c.bridge and c.raw_get("model.moe_token_dispatcher_type") == "flex"
     and c.raw_has("model.moe_flex_dispatcher_backend") and c.raw_get("model.moe_flex_dispatcher_backend") is None,
     "flex dispatcher with backend None is silently restored to alltoall", "B/flex validate_flex_dispatcher_backend")
rule("MOE-062", A, I_, "C", ["model.moe_flex_dispatcher_backend", "model.cuda_graph_impl"],
     lambda c: c.bridge and c.flex_backend == "hybridep" and c.cg_impl == "none",
     "Bridge enables moe_hybridep_pad_uneven_dispatch_inputs (extra MAX all-reduce + padding)",
     "B/tc _enable_safe_hybridep_dispatch")
rule("MOE-063", A, W_, "-", ["model.moe_flex_dispatcher_backend", "model.cuda_graph_impl"],
     lambda c: c.flex_backend == "hybridep" and c.cg_impl != "none" and bool(
         c.m("variable_seq_lengths") or c.get("dataset.packed_sequence_specs")),
     "HybridEP with CUDA graphs and varying per-rank token counts: uneven-input padding is not enabled",
     "B/tc _enable_safe_hybridep_dispatch")
rule("MOE-064", A, W_, "R", ["model.moe_flex_dispatcher_backend", "model.moe_router_dtype"],
     lambda c: c.flex_backend == "deepep" and str(c.m("moe_router_dtype")) not in ("fp32", "float32"),
     "DeepEP only supports fp32 router probabilities (warns and casts at run time)",
     "moe/token_dispatcher.py _DeepepManager.dispatch")
rule("MOE-065", A, RT, "B", ["model.moe_flex_dispatcher_backend", "model.moe_expert_rank_capacity_factor",
                             "model.use_transformer_engine_op_fuser", "model.moe_grouped_gemm"],
     lambda c: c.flex_backend == "ncclep" and (
         (bool(c.m("moe_ncclep_zero_copy")) and c.m("moe_expert_rank_capacity_factor") is None)
         or (c.m("moe_expert_rank_capacity_factor") is not None
             and not (c.m("use_transformer_engine_op_fuser") and c.m("moe_grouped_gemm")))),
     "NCCL-EP static-shape mode needs a rank capacity factor with the TE op fuser and grouped GEMM",
     "moe/token_dispatcher.py _NCCLEPManager.__init__",
     fix={"model.use_transformer_engine_op_fuser": True, "model.moe_grouped_gemm": True})
rule("MOE-066", A, E, "C", ["model.moe_deepep_num_sms", "model.moe_hybridep_num_sms",
                            "model.moe_flex_dispatcher_num_sms"],
     lambda c: c.m("moe_deepep_num_sms") is not None and c.m("moe_hybridep_num_sms") is not None
     and c.m("moe_deepep_num_sms") != c.m("moe_hybridep_num_sms") and c.m("moe_flex_dispatcher_num_sms") is None,
     "conflicting deprecated moe_deepep_num_sms / moe_hybridep_num_sms without moe_flex_dispatcher_num_sms",
     "TC L1683-1689",
     fix=lambda c: {"model.moe_flex_dispatcher_num_sms": c.m("moe_hybridep_num_sms" if c.flex_backend == "hybridep"
                                                               else "moe_deepep_num_sms")})
rule("MOE-067", A, ENV, "C", ["model.moe_permute_fusion", "env.te"],
     lambda c: c.is_moe and bool(c.m("moe_permute_fusion")) and c.te_below("2.1.0"),
     "fused permutation needs Transformer Engine >= 2.1", "TC L2759; moe/moe_utils.py",
     fix={"model.moe_permute_fusion": False}, env=("Transformer Engine version",))
rule("MOE-069", A, E, "C", ["model.moe_shared_expert_overlap", "model.moe_token_dispatcher_type"],
     lambda c: bool(c.m("moe_shared_expert_overlap")) and c.has_shared_experts
     and c.dispatcher not in ("alltoall", "flex"),
     "shared-expert overlap only works with the alltoall or flex dispatcher", "TC L1706",
     fix={"model.moe_shared_expert_overlap": False})
# TE CuTeDSL fused grouped MLP (NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 + the op fuser) ---------------------------------
# transformer_engine/pytorch/ops/fused/grouped_mlp.py (TE/gm): ``_GroupedMLP_CuTeGEMMBase.is_supported`` (env > 0,
# compute capability 10.x), ``fuse_grouped_mlp_ops`` (MXFP8 / NVFP4 recipe with RHT; SwiGLU, clamped GeGLU, SReLU),
# ``validate_grouped_mlp_dims`` (sizes % 64, GLU interleave 32): where a condition fails TE silently keeps the op
# sequence unfused. megatron/core/transformer/moe/experts.py ``TEGroupedMLP._is_fused_impl_supported`` (MCore/ex).


def _cutedsl_env(c: Ctx) -> bool:
    # a str, None (unset) or UNKNOWN (process environment not known): only a str can be on
    v = c.var(CUTEDSL_FUSED_GROUPED_MLP_ENV)
    return isinstance(v, str) and env_flag_on(v)


def _cutedsl(c: Ctx) -> bool:
    """The fused grouped MLP is asked for: the variable on and the experts built by the TE op fuser."""
    return c.is_moe and _cutedsl_env(c) and bool(c.m("use_transformer_engine_op_fuser"))


def _glu_experts(c: Ctx) -> bool:
    return bool(c.m("gated_linear_unit")) and str(c.m("activation_func") or "silu").lower() in (
        "silu", "swiglu", "quick_gelu")


def _block_scaled(c: Ctx) -> bool:
    if c.fp4 is not None:
        return c.m("fp4_recipe", "nvfp4") == "nvfp4"
    return c.fp8 is not None and c.m("fp8_recipe", "delayed") == "mxfp8"


def _dims_misaligned(c: Ctx) -> bool:
    sizes = [c.m("moe_latent_size") or c.m("hidden_size"), c.m("moe_ffn_hidden_size")]
    return any(isinstance(x, int) and x % FUSED_GROUPED_MLP_DIM_ALIGN for x in sizes)


rule("MOE-090", A, W_, "B", ["env.NVTE_CUTEDSL_FUSED_GROUPED_MLP", "model.use_transformer_engine_op_fuser"],
     lambda c: c.is_moe and _cutedsl_env(c) and not c.m("use_transformer_engine_op_fuser"),
     "NVTE_CUTEDSL_FUSED_GROUPED_MLP has no effect without use_transformer_engine_op_fuser: only the op-fuser expert "
     "MLP reaches TE's fused grouped MLP", "MCore/ex TEGroupedMLP._make_fused_ops; TE/gm fuse_grouped_mlp_ops",
     fix=lambda c: {"model.use_transformer_engine_op_fuser": True,
                    **({"model.moe_mlp_glu_interleave_size": FUSED_GROUPED_MLP_GLU_INTERLEAVE} if _glu_experts(c) else {})},
     env=("env NVTE_CUTEDSL_FUSED_GROUPED_MLP",))
rule("MOE-091", A, W_, "R", ["env.NVTE_CUTEDSL_FUSED_GROUPED_MLP", "env.gpu"],
     lambda c: _cutedsl(c) and c.gpu_is(lambda cc, n: cc[0] != 10) is True,  # unknown GPU (VR200): no verdict
     "the CuTeDSL fused grouped MLP runs only on SM 10.x (B200, GB200, B300, GB300): elsewhere the experts run unfused",
     "TE/gm _GroupedMLP_CuTeGEMMBase.is_supported", fix={f"env_vars.{CUTEDSL_FUSED_GROUPED_MLP_ENV}": "0"},
     env=("GPU type", "env NVTE_CUTEDSL_FUSED_GROUPED_MLP"))
rule("MOE-092", A, W_, "R", ["env.NVTE_CUTEDSL_FUSED_GROUPED_MLP", "model.fp8_recipe", "model.fp4_recipe"],
     lambda c: _cutedsl(c) and not _block_scaled(c),
     "the CuTeDSL fused grouped MLP needs an MXFP8 or NVFP4 recipe: with another precision the experts run unfused",
     "TE/gm fuse_grouped_mlp_ops (recipe.mxfp8() or recipe.nvfp4())", fix={f"env_vars.{CUTEDSL_FUSED_GROUPED_MLP_ENV}": "0"},
     env=("env NVTE_CUTEDSL_FUSED_GROUPED_MLP",))
rule("MOE-093", A, W_, "B", ["env.NVTE_CUTEDSL_FUSED_GROUPED_MLP", "model.moe_mlp_glu_interleave_size"],
     lambda c: _cutedsl(c) and _glu_experts(c) and c.m("moe_mlp_glu_interleave_size") != FUSED_GROUPED_MLP_GLU_INTERLEAVE,
     "the CuTeDSL fused grouped MLP needs 32-wide GLU interleaving (moe_mlp_glu_interleave_size=32): without it the "
     "experts run unfused", "TE/gm validate_grouped_mlp_dims", fix={"model.moe_mlp_glu_interleave_size": FUSED_GROUPED_MLP_GLU_INTERLEAVE},
     env=("env NVTE_CUTEDSL_FUSED_GROUPED_MLP",))
rule("MOE-094", A, W_, "B", ["env.NVTE_CUTEDSL_FUSED_GROUPED_MLP", "model.hidden_size", "model.moe_ffn_hidden_size",
                             "model.moe_latent_size"],
     lambda c: _cutedsl(c) and _dims_misaligned(c),
     "the CuTeDSL fused grouped MLP needs the expert input and FFN sizes to be multiples of 64: the experts run unfused",
     "TE/gm validate_grouped_mlp_dims", fix={f"env_vars.{CUTEDSL_FUSED_GROUPED_MLP_ENV}": "0"},
     env=("env NVTE_CUTEDSL_FUSED_GROUPED_MLP",))
rule("MOE-095", A, RT, "B", ["model.use_transformer_engine_op_fuser", "model.activation_func",
                             "model.gated_linear_unit", "model.use_fused_weighted_squared_relu"],
     lambda c: c.is_moe and bool(c.m("use_transformer_engine_op_fuser")) and c.m("activation_func") is not None
     and not (
         _glu_experts(c) or (str(c.m("activation_func") or "").lower() == "squared_relu"
                             and bool(c.m("use_fused_weighted_squared_relu")) and not c.m("gated_linear_unit"))),
     "the TE op fuser builds the expert MLP only for SwiGLU, quick-GeGLU or weighted squared ReLU "
     "(use_fused_weighted_squared_relu) experts", "MCore/ex TEGroupedMLP._is_fused_impl_supported (assert in __init__)",
     fix=lambda c: {"model.use_fused_weighted_squared_relu": True}
     if str(c.m("activation_func") or "").lower() == "squared_relu" and not c.m("gated_linear_unit")
     else {"model.use_transformer_engine_op_fuser": False})
# MTP ------------------------------------------------------------------------------------------------------------
rule("MOE-080", A, I_, "B", ["model.mtp_num_layers", "model.pipeline_model_parallel_size"],
     lambda c: (c.m("mtp_num_layers") or 0) > 0 and c.m("pipeline_model_parallel_layout") is None and c.pp > 1,
     "MTP layers are built on the last pipeline stage (its memory grows)",
     "multi_token_prediction.py get_mtp_num_layers_to_build")
rule("MOE-081", A, RT, "R", ["model.mtp_num_layers", "model.recompute_granularity", "model.recompute_method",
                             "model.recompute_num_layers"],
     lambda c: (c.m("mtp_num_layers") or 0) > 0 and c.m("recompute_granularity") == "full"
     and c.m("recompute_method") == "uniform" and c.m("recompute_num_layers") != 1,
     "MTP with full/uniform recompute requires recompute_num_layers == 1",
     "multi_token_prediction.py _checkpointed_forward", fix={"model.recompute_num_layers": 1})
rule("MOE-082", A, W_, "R", ["model.mtp_num_layers", "model.recompute_method"],
     lambda c: (c.m("mtp_num_layers") or 0) > 0 and c.m("recompute_method") == "block",
     "block recompute is not implemented for MTP layers (they are not recomputed)", "multi_token_prediction.py")
rule("MOE-084", A, E, "C", ["model.mtp_num_layers", "dataset.packing_buffer_size"],
     lambda c: (c.m("mtp_num_layers") or 0) > 0 and c.get("dataset.packing_buffer_size") is not None,
     "MTP is not supported with Energon native packing", "B/cfg validate", fix={"model.mtp_num_layers": None})
rule("MOE-085", A, W_, "-", ["model.mtp_num_layers", "dataset.packed_sequence_specs"],
     lambda c: (c.m("mtp_num_layers") or 0) > 0 and bool(c.get("dataset.packed_sequence_specs")),
     "MTP with SFT packed sequences is not supported (docs)", "docs multi-token-prediction.md")
_ = all_of

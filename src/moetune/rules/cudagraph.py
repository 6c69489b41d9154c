"""(e) CUDA graphs (docs/rules.md §6, CG-*). Sources: MCore ``transformer_config.py`` (TC L2455-2731),
``cuda_graph_config.py`` (CGC), ``transformer/cuda_graphs.py``; Bridge ``utils/cuda_graph.py`` (B/cg),
``training/config.py`` (B/cfg)."""

from __future__ import annotations

from moetune.rules.common import ENV, I_, RT, W_, E
from moetune.rules.engine import Ctx, any_of, rule

A = "cuda_graphs"
IMPLS = ("none", "local", "transformer_engine", "full_iteration")
MODS = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
OFFLOAD_MOE = {"expert_fc1", "moe_act", "fused_group_mlp"}


def _drop_and_pad(c: Ctx) -> bool:
    return c.m("moe_expert_capacity_factor") is not None and bool(c.m("moe_pad_expert_input_to_capacity"))


def _raw_mods(c: Ctx) -> list[str]:
    return list(c.m("_cuda_graph_modules_raw") or [])


def _bridge_full_iter(c: Ctx) -> bool:
    return c.full_iter_graph


rule("CG-001", A, E, "C", ["model.cuda_graph_impl"], lambda c: c.cg_impl not in IMPLS,
     "invalid cuda_graph_impl (none, local, transformer_engine, full_iteration)", "TC L2537",
     fix={"model.cuda_graph_impl": "none"})
rule("CG-002", A, E, "C", ["model.enable_cuda_graph", "model.external_cuda_graph", "model.cuda_graph_impl"],
     lambda c: (bool(c.raw_get("model.enable_cuda_graph")) and bool(c.raw_get("model.external_cuda_graph")))
     or (bool(c.raw_get("model.enable_cuda_graph") or c.raw_get("model.external_cuda_graph"))
         and c.raw_get("model.cuda_graph_impl") not in (None, "none")),
     "deprecated enable_cuda_graph/external_cuda_graph cannot be combined with cuda_graph_impl or each other",
     "TC L2458-2469", fix={"model.enable_cuda_graph": False, "model.external_cuda_graph": False})
rule("CG-003", A, E, "C", ["model.cuda_graph_scope", "model.cuda_graph_modules"],
     lambda c: c.raw_get("model.cuda_graph_scope") not in (None, [], "") and c.raw_get("model.cuda_graph_modules")
     not in (None, [], "", "full", ["full"]) and c.raw_get("model.cuda_graph_impl", "none") != "none",
     "set cuda_graph_modules or the deprecated cuda_graph_scope, not both", "TC L2476",
     fix={"model.cuda_graph_scope": None})
rule("CG-004", A, E, "C", ["model.cuda_graph_modules"],
     lambda c: "full" in _raw_mods(c) and len(_raw_mods(c)) > 1,
     "'full' cannot be mixed with other CUDA-graph modules", "CGC normalize_cuda_graph_modules",
     fix=lambda c: {"model.cuda_graph_modules": [m for m in _raw_mods(c) if m != "full"], "model.cuda_graph_scope": None})
rule("CG-005", A, E, "C", ["model.cuda_graph_modules", "model.cuda_graph_impl"],
     lambda c: c.cg_impl != "none" and (
         ("full_iteration" in _raw_mods(c) and c.cg_impl == "transformer_engine")
         or any(m not in MODS + ("full", "full_iteration", "full_iteration_inference") for m in _raw_mods(c))),
     "invalid CUDA-graph module list (unknown module, or legacy full_iteration with the TE implementation)",
     "CGC validate_deprecated_cuda_graph_modules_migration_inputs",
     fix=lambda c: {"model.cuda_graph_modules": [m for m in c.cg_mods if m in MODS], "model.cuda_graph_scope": None})
rule("CG-006", A, E, "C", ["model.inference_cuda_graph_scope", "model.cuda_graph_impl"],
     lambda c: c.m("inference_cuda_graph_scope") not in (None, "none") and not (
         c.cg_impl == "local" and c.m("inference_cuda_graph_scope") in ("layer", "block")),
     "inference_cuda_graph_scope not allowed for this implementation", "TC L2548",
     fix={"model.inference_cuda_graph_scope": None})
rule("CG-007", A, E, "C", ["model.cuda_graph_impl", "model.cuda_graph_modules"],
     lambda c: c.full_iter_graph and bool(c.cg_mods),
     "cuda_graph_impl=full_iteration requires an empty cuda_graph_modules", "TC L2553",
     fix={"model.cuda_graph_modules": None, "model.cuda_graph_scope": None})
rule("CG-008", A, E, "C", ["model.cuda_graph_impl", "model.cuda_graph_modules"],
     lambda c: c.cg_impl == "local" and not (not c.cg_mods and c.m("inference_cuda_graph_scope") in ("layer", "block")),
     "Bridge supports cuda_graph_impl=local only for full-iteration graphs; use transformer_engine for scoped capture",
     "B/cg validate_cuda_graph_configuration", fix={"model.cuda_graph_impl": "transformer_engine"})
rule("CG-009", A, E, "B", ["model.cuda_graph_impl", "model.use_te_rng_tracker", "rng.te_rng_tracker"],
     lambda c: c.cg_impl != "none" and not c.m("use_te_rng_tracker"),
     "CUDA graphs require the TE RNG tracker (set model.use_te_rng_tracker=True)", "B/gpt provide; B/cfg validate L1415",
     fix={"model.use_te_rng_tracker": True, "rng.te_rng_tracker": True}, frontends=("bridge",))
rule("CG-010", A, E, "C", ["model.cuda_graph_impl", "rerun_state_machine.check_for_nan_in_loss"],
     lambda c: _bridge_full_iter(c) and bool(c.get("rerun_state_machine.check_for_nan_in_loss", True)),
     "full-iteration CUDA graphs need rerun_state_machine.check_for_nan_in_loss=False", "B/cfg validate L1508",
     fix={"rerun_state_machine.check_for_nan_in_loss": False})
rule("CG-011", A, E, "C", ["model.cpu_offloading", "model.cuda_graph_impl"],
     lambda c: bool(c.m("cpu_offloading")) and c.per_layer_graph,
     "CUDA graphs are not supported with (layer) CPU offloading", "TC L2560", fix={"model.cuda_graph_impl": "none"})
rule("CG-011w", A, W_, "-", ["model.cpu_offloading", "model.cuda_graph_impl"],
     lambda c: bool(c.m("cpu_offloading")) and c.full_iter_graph,
     "full-iteration CUDA graphs with CPU offloading are documented as unsupported (MCore does not reject it)",
     "docs/skills vs TC L2560")
rule("CG-012", A, E, "C", ["model.cuda_graph_modules"],
     lambda c: c.per_layer_graph and "moe" in c.cg_mods and "moe_router" in c.cg_mods,
     "'moe' and 'moe_router' CUDA-graph modules are mutually exclusive", "TC L2576",
     fix=lambda c: {"model.cuda_graph_modules": [m for m in c.cg_mods if m != "moe"], "model.cuda_graph_scope": None})
rule("CG-013", A, E, "C", ["model.cuda_graph_modules"],
     lambda c: c.te_graph and "moe_preprocess" in c.cg_mods and "moe_router" not in c.cg_mods,
     "moe_preprocess graph capture needs moe_router", "TC L2566-2585",
     fix=lambda c: {"model.cuda_graph_modules": c.cg_mods + ["moe_router"], "model.cuda_graph_scope": None})
rule("CG-014", A, E, "C", ["model.cuda_graph_modules", "model.num_moe_experts"],
     lambda c: c.per_layer_graph and (c.num_experts is None or c.num_experts <= 1) and c.arch_known
     and not c.meta.get("moe") and ("moe" in c.cg_mods or "moe_router" in c.cg_mods),
     "MoE CUDA-graph modules need an MoE model", "TC L2585",
     fix=lambda c: {"model.cuda_graph_modules": [m for m in c.cg_mods if m not in ("moe", "moe_router",
                                                                                   "moe_preprocess")],
                    "model.cuda_graph_scope": None})
rule("CG-015", A, E, "C", ["model.cuda_graph_modules", "model.moe_layer_freq"],
     lambda c: c.per_layer_graph and c.all_layers_moe and "mlp" in c.cg_mods,
     "the mlp CUDA-graph module is for dense layers and this model has none", "TC L2593",
     fix=lambda c: {"model.cuda_graph_modules": [m for m in c.cg_mods if m != "mlp"], "model.cuda_graph_scope": None})
rule("CG-016", A, E, "C", ["model.cuda_graph_modules", "model.moe_expert_capacity_factor",
                           "model.moe_pad_expert_input_to_capacity"],
     lambda c: c.per_layer_graph and "moe" in c.cg_mods and not _drop_and_pad(c),
     "the 'moe' CUDA-graph module requires drop-and-pad MoE (capacity factor + pad to capacity)", "TC L2601",
     fix=lambda c: {"model.cuda_graph_modules": [m if m != "moe" else "moe_router" for m in c.cg_mods]
                    + (["moe_preprocess"] if "moe_preprocess" not in c.cg_mods else []),
                    "model.cuda_graph_scope": None})
rule("CG-017", A, E, "C", ["model.cuda_graph_modules", "model.moe_token_dispatcher_type",
                           "model.moe_expert_capacity_factor", "model.moe_router_padding_for_fp8"],
     lambda c: c.per_layer_graph and not _drop_and_pad(c) and c.dispatcher == "alltoall"
     and (c.m("moe_expert_capacity_factor") is not None or bool(c.m("moe_router_padding_for_fp8")))
     and "moe_preprocess" in c.cg_mods,
     "moe_preprocess capture has device-to-host syncs with alltoall + capacity factor / fp8 padding", "TC L2608",
     fix=lambda c: {"model.cuda_graph_modules": [m for m in c.cg_mods if m != "moe_preprocess"],
                    "model.cuda_graph_scope": None})


def _cg020(c: Ctx) -> bool:
    if not c.m("fine_grained_activation_offloading") or c.cg_impl == "none":
        return False
    off = set(c.m("offload_modules") or [])
    if c.cg_impl == "local":
        return (not off <= OFFLOAD_MOE) or not c.cg_mods or "moe" in c.cg_mods
    if c.cg_impl not in ("transformer_engine", "full_iteration"):
        return True
    if "moe" in c.cg_mods or (c.m("cuda_graph_warmup_steps", 3) or 0) <= 0:
        return True
    return c.full_iter_graph and (c.m("fine_grained_offloading_max_inflight_offloads") is None
                                  or c.m("fine_grained_offloading_max_inflight_offloads") < 0)


rule("CG-020", A, E, "C", ["model.fine_grained_activation_offloading", "model.cuda_graph_impl",
                           "model.cuda_graph_modules", "model.offload_modules", "model.cuda_graph_warmup_steps"],
     _cg020, "fine-grained activation offloading + CUDA-graph restrictions (impl, captured modules, warmup steps)",
     "TC L2688-2731", fix={"model.fine_grained_activation_offloading": False, "model.offload_modules": []})
_ATTN_OFF = {"core_attn", "attn_proj", "qkv_linear", "attn_norm"}


rule("CG-021", A, ENV, "B", ["model.offload_modules", "model.cuda_graph_modules", "env.torch", "env.te"],
     lambda c: bool(c.m("fine_grained_activation_offloading")) and c.te_graph and (
         ("attn" in c.cg_mods and bool(set(c.m("offload_modules") or []) & _ATTN_OFF))
         or ("mlp" in c.cg_mods and "mlp_norm" in (c.m("offload_modules") or [])))
     and any_of(c.torch_below("2.9.0"), c.te_below("2.14.0")),
     "offloading inside a captured CUDA graph needs PyTorch >= 2.9 and Transformer Engine >= 2.14",
     "transformer_layer.py", fix={"model.fine_grained_activation_offloading": False, "model.offload_modules": []},
     env=("PyTorch / Transformer Engine versions",))
rule("CG-024", A, RT, "B", ["model.cuda_graph_impl", "env.PYTORCH_CUDA_ALLOC_CONF", "env.NCCL_GRAPH_REGISTER"],
     lambda c: c.te_graph and "expandable_segments:true" in str(c.var("PYTORCH_CUDA_ALLOC_CONF") or "").lower()
     and c.var("NCCL_GRAPH_REGISTER") != "0",
     "TE CUDA graphs with expandable_segments:True need NCCL_GRAPH_REGISTER=0 (else illegal memory access)",
     "transformer/cuda_graphs.py TECudaGraphHelper.__init__ L2116",
     fix={"env_vars.NCCL_GRAPH_REGISTER": "0"}, env=("env NCCL_GRAPH_REGISTER",))
rule("CG-026", A, RT, "R", ["model.cuda_graph_impl", "model.cuda_graph_modules"],
     lambda c: c.te_graph and ("attn" in c.cg_mods or not c.cg_mods) and bool(
         c.get("dataset.packed_sequence_specs") or c.get("dataset.offline_packing_specs")),
     "TE CUDA graphs cannot capture attention with packed (THD) sequences", "transformer_layer.py _te_cuda_graph_replay",
     fix=lambda c: {"model.cuda_graph_modules": [m for m in c.cg_mods if m != "attn"] or ["moe_router"]})
rule("CG-027", A, E, "C", ["dataset.offline_packing_specs", "dataset.pad_to_max_length", "model.cuda_graph_impl",
                           "model.cuda_graph_modules"],
     lambda c: bool(c.get("dataset.offline_packing_specs")) and (c.te_graph or c.full_iter_graph) and (
         not c.get("dataset.pad_to_max_length")
         or (("attn" in c.cg_mods or not c.cg_mods) and not (c.get("dataset.offline_packing_specs") or {}).get(
             "pad_cu_seqlens"))),
     "packed sequences with CUDA graphs need pad_to_max_length (static width) and padded cu_seqlens when attention "
     "is captured", "B/cfg validate",
     fix={"dataset.pad_to_max_length": True, "dataset.offline_packing_specs.pad_cu_seqlens": True})
rule("CG-028", A, E, "C", ["dataset.packing_buffer_size", "model.cuda_graph_impl"],
     lambda c: c.get("dataset.packing_buffer_size") is not None and c.cg_impl != "none",
     "Energon native packing does not support CUDA graphs", "B/cfg validate", fix={"model.cuda_graph_impl": "none"})
rule("CG-029", A, W_, "-", ["model.moe_expert_capacity_factor", "model.moe_expert_rank_capacity_factor",
                            "model.cuda_graph_impl", "model.cuda_graph_modules"],
     lambda c: c.is_moe and c.m("moe_expert_capacity_factor") is None and c.m("moe_expert_rank_capacity_factor") is None
     and (c.full_iter_graph or (c.te_graph and not c.cg_mods)),
     "dropless MoE with whole-layer or full-iteration CUDA graphs: dynamic expert shapes; the supported dropless "
     "recipes are partial capture (attn, moe_router, moe_preprocess) or, for full_iteration, HybridEP with "
     "moe_expert_rank_capacity_factor (static budget, overflow rerun dropless) and moe_paged_stash",
     "docs moe-optimization.md; Bridge set_full_iter_cg_configs; moe/paged_stash.py PagedStashRunner")
rule("CG-030", A, W_, "-", ["model.cuda_graph_impl", "model.first_last_layers_bf16", "env.te"],
     lambda c: c.te_graph and c.fp8 is not None and bool(c.m("first_last_layers_bf16")) and c.te_below("2.8.0") is True,
     "TE < 2.8 CUDA graphs run all captured layers in FP8 (first/last BF16 ignored)", "cuda_graphs.py")
rule("CG-031", A, W_, "-", ["model.cuda_graph_impl", "model.variable_seq_lengths"],
     lambda c: c.cg_impl != "none" and bool(c.m("variable_seq_lengths")),
     "CUDA graphs need static shapes (variable sequence lengths)", "docs cuda-graphs.md")
rule("CG-035", A, W_, "-", ["model.cuda_graph_impl", "model.pipeline_model_parallel_size"],
     lambda c: c.full_iter_graph or (c.cg_impl != "none" and c.pp > 1),
     "CUDA graphs raise memory (each PP stage keeps its graphs; full-iteration capture up to 1.5-2x peak)",
     "skills nemo-mbridge-perf-cuda-graphs")
rule("CG-036", A, I_, "-", ["model.tensor_parallel_num_weight_shards", "model.cuda_graph_impl"],
     lambda c: c.cg_impl != "none" and (c.m("tensor_parallel_num_weight_shards") or 0) > c.tp,
     "GTP forces at least 2 warm-up steps per graph", "TC cuda_graph_warmup_steps docstring")

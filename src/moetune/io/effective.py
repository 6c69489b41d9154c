"""Effective config: replay Megatron-Bridge's rewrites and defaults in Bridge's order (docs/rules.md §0.3).

``effective_config(cfg, env)`` returns a new nested dict (same field names) as the library will see it after
``runtime_config_update`` -> ``ConfigContainer.validate`` -> ``TransformerConfig.__post_init__``, plus ``_notes``
(the rewrites performed, for info findings). Megatron-LM inputs (``frontend='megatron-lm'``) get the MLM argparse
defaults and ``validate_args`` rewrites instead of the Bridge steps.

Sources (paraphrased, not copied): Bridge ``training/config.py::runtime_config_update``/``ConfigContainer.validate``,
``training/mixed_precision.py`` (recipes and ``update_config_with_precision_overrides``),
``training/comm_overlap.py::CommOverlapConfig.setup``, ``models/transformer_config.py::finalize``,
``training/flex_dispatcher_backend.py``; MCore ``transformer_config.py::__post_init__``,
``cuda_graph_config.py``; MLM ``training/arguments.py::validate_args``.
"""

from __future__ import annotations

import copy
from typing import Any

from moetune.errors import InputError
from moetune.rules.engine import Env
from moetune.spec.layout import bridge_default_etp

#: Megatron-Core ``TransformerConfig``/``ModelParallelConfig`` defaults at the pinned commit (docs/rules.md §1).
MODEL_DEFAULTS: dict[str, Any] = {
    "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "virtual_pipeline_model_parallel_size": None,
    "context_parallel_size": 1, "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,
    "sequence_parallel": False, "pipeline_dtype": None, "params_dtype": "float32", "bf16": False, "fp16": False,
    "num_moe_experts": None, "moe_ffn_hidden_size": None, "moe_router_topk": 2,
    "moe_token_dispatcher_type": "allgather", "moe_flex_dispatcher_backend": "deepep",
    "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.0, "moe_router_score_function": "softmax",
    "moe_router_pre_softmax": False, "moe_router_dtype": None, "moe_expert_capacity_factor": None,
    "moe_pad_expert_input_to_capacity": False, "moe_grouped_gemm": False, "moe_permute_fusion": False,
    "moe_router_fusion": False, "moe_shared_expert_overlap": False, "moe_layer_freq": 1,
    "moe_shared_expert_intermediate_size": None, "moe_router_num_groups": None, "moe_router_group_topk": None,
    "moe_router_topk_limited_devices": None, "moe_router_enable_expert_bias": False,
    "moe_router_force_load_balancing": False, "moe_enable_deepep": False, "moe_token_drop_policy": "probs",
    "moe_router_padding_for_quantization": False, "moe_router_padding_for_fp8": False, "moe_layer_recompute": False,
    "moe_apply_probs_on_input": False, "moe_latent_size": None, "moe_expert_rank_capacity_factor": None,
    "moe_paged_stash": False, "moe_input_jitter_eps": None,
    "add_bias_linear": True, "add_qkv_bias": False, "bias_dropout_fusion": False, "hidden_dropout": 0.1,
    "attention_dropout": 0.1, "gradient_accumulation_fusion": False, "recompute_granularity": None,
    "recompute_method": None, "recompute_num_layers": None, "recompute_modules": None,
    "distribute_saved_activations": False, "cuda_graph_impl": "none", "cuda_graph_modules": None,
    "cuda_graph_scope": None, "cuda_graph_warmup_steps": 3, "enable_cuda_graph": False, "external_cuda_graph": False,
    "use_te_rng_tracker": False, "overlap_moe_expert_parallel_comm": False, "delay_wgrad_compute": False,
    "overlap_dispatch_backward_with_experts_wgrad": False, "ep_overlap_early_attn_memory_release": False,
    "tp_comm_overlap": False, "overlap_p2p_comm": False, "batch_p2p_comm": True,
    "overlap_p2p_comm_warmup_flush": False, "defer_embedding_wgrad_compute": False, "wgrad_deferral_limit": 0,
    "fp8": None, "fp8_recipe": "delayed", "fp8_param": False, "fp4": None, "fp4_recipe": "nvfp4", "fp4_param": False,
    "first_last_layers_bf16": False, "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1,
    "fp8_output_proj": False, "cpu_offloading": False, "cpu_offloading_num_layers": 0,
    "fine_grained_activation_offloading": False, "offload_modules": None, "mtp_num_layers": None,
    "num_layers_in_first_pipeline_stage": None, "num_layers_in_last_pipeline_stage": None,
    "account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False,
    "pipeline_model_parallel_layout": None, "cp_comm_type": None, "hierarchical_context_parallel_sizes": None,
    "multi_latent_attention": False, "num_query_groups": None, "microbatch_group_size_per_vp_stage": None,
    "transformer_impl": "transformer_engine", "use_transformer_engine_op_fuser": False,
    "calculate_per_token_loss": False, "init_model_with_meta_device": False, "fp32_residual_connection": False,
    "symmetric_ar_type": None, "variable_seq_lengths": False, "experimental_attention_variant": None,
    "activation_func_clamp_value": None, "moe_single_grouped_weight": False, "moe_single_grouped_bias": False,
    "inference_cuda_graph_scope": None, "tensor_parallel_num_weight_shards": None, "hybrid_context_parallel": False,
    "moe_expert_capacity_factor_negative_to_none": None,
}
MODEL_DEFAULTS.pop("moe_expert_capacity_factor_negative_to_none")

#: MCore ``DistributedDataParallelConfig`` defaults.
DDP_DEFAULTS: dict[str, Any] = {
    "use_distributed_optimizer": False, "overlap_grad_reduce": False, "overlap_param_gather": False,
    "align_param_gather": False, "bucket_size": None, "num_buckets": None, "grad_reduce_in_fp32": False,
    "average_in_collective": False, "num_distributed_optimizer_instances": 1, "use_megatron_fsdp": False,
    "data_parallel_sharding_strategy": "no_shard", "fp8_param_gather": False,
    "reuse_grad_buf_for_mxfp8_param_ag": False, "check_for_nan_in_grad": False, "nccl_ub": False,
    "fsdp_double_buffer": False, "megatron_fsdp_version": 1, "fsdp_manual_registration": False,
    "outer_dp_sharding_strategy": "no_shard",
}
#: MCore ``OptimizerConfig`` defaults.
OPTIMIZER_DEFAULTS: dict[str, Any] = {
    "optimizer": "adam", "use_distributed_optimizer": False, "bf16": False, "fp16": False,
    "use_precision_aware_optimizer": False, "main_grads_dtype": "float32", "main_params_dtype": "float32",
    "exp_avg_dtype": "float32", "exp_avg_sq_dtype": "float32", "optimizer_cpu_offload": False,
    "optimizer_offload_fraction": 0.0, "decoupled_weight_decay": True, "overlap_param_gather_with_optimizer_step": False,
    "overlap_param_gather": False,
}
DIST_DEFAULTS = {"use_tp_pp_dp_mapping": False, "use_decentralized_pg": False, "use_megatron_fsdp": False,
                 "use_torch_fsdp2": False, "use_sharp": False, "sharp_enabled_group": None}
RNG_DEFAULTS = {"te_rng_tracker": False, "data_parallel_random_init": False}
RERUN_DEFAULTS = {"check_for_nan_in_loss": True}
TRAIN_DEFAULTS = {"micro_batch_size": 1, "decrease_batch_size_if_needed": False}

#: Megatron-LM argparse defaults that differ from MCore (megatron/training/arguments.py).
MLM_MODEL_DEFAULTS = {"gradient_accumulation_fusion": True, "bias_dropout_fusion": True, "params_dtype": "float32",
                      "moe_token_dispatcher_type": "allgather", "transformer_impl": "transformer_engine",
                      "overlap_p2p_comm": True}

#: ``MixedPrecisionConfig`` field defaults (Bridge training/mixed_precision.py).
MP_DEFAULTS: dict[str, Any] = {
    "fp32": False, "fp16": False, "bf16": False, "params_dtype": None, "pipeline_dtype": None, "autocast_dtype": None,
    "autocast_enabled": False, "grad_reduce_in_fp32": True, "fp8": None, "fp8_recipe": "tensorwise",
    "first_last_layers_bf16": False, "fp8_margin": 0, "fp8_amax_history_len": 1, "fp8_amax_compute_algo": "most_recent",
    "fp8_wgrad": True, "fp8_dot_product_attention": False, "fp8_multi_head_attention": False, "fp8_param": None,
    "fp8_param_gather": False, "fp4": None, "fp4_recipe": "nvfp4", "fp4_param": None, "fp4_param_gather": False,
    "loss_scale": None, "initial_loss_scale": 4294967296, "min_loss_scale": 1.0, "loss_scale_window": 1000,
    "hysteresis": 2, "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 0,
    "reuse_grad_buf_for_mxfp8_param_ag": False,
}
_BF16 = {"bf16": True, "params_dtype": "bfloat16", "pipeline_dtype": "bfloat16", "grad_reduce_in_fp32": True}
_FP16 = {"fp16": True, "params_dtype": "float16", "pipeline_dtype": "float16", "grad_reduce_in_fp32": False}
#: Bridge ``MIXED_PRECISION_RECIPES`` (training/mixed_precision.py), as field overrides of MP_DEFAULTS.
MP_RECIPES: dict[str, dict[str, Any]] = {
    "bf16_mixed": _BF16,
    "fp16_mixed": _FP16,
    "bf16_with_fp8_delayed_scaling_mixed": {**_BF16, "fp8": "hybrid", "fp8_recipe": "delayed",
                                            "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max",
                                            "fp8_param_gather": True},
    "fp16_with_fp8_delayed_scaling_mixed": {**_FP16, "fp8": "hybrid", "fp8_recipe": "delayed",
                                            "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max",
                                            "fp8_param_gather": True},
    "bf16_with_mxfp8_mixed": {**_BF16, "fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True,
                              "reuse_grad_buf_for_mxfp8_param_ag": True},
    "fp16_with_mxfp8_mixed": {**_FP16, "fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True,
                              "reuse_grad_buf_for_mxfp8_param_ag": True},
    "bf16_with_fp8_current_scaling_mixed": {**_BF16, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                                            "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1,
                                            "num_layers_at_end_in_bf16": 1, "fp8_param_gather": True},
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": {**_BF16, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                                                       "first_last_layers_bf16": True,
                                                       "num_layers_at_start_in_bf16": 2,
                                                       "num_layers_at_end_in_bf16": 2, "fp8_param_gather": True},
    "fp16_with_fp8_current_scaling_mixed": {**_FP16, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                                            "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1,
                                            "num_layers_at_end_in_bf16": 1, "fp8_param_gather": True},
    "bf16_with_fp8_subchannel_scaling_mixed": {**_BF16, "fp8": "hybrid", "fp8_recipe": "blockwise",
                                               "fp8_param_gather": False},
    "fp16_with_fp8_subchannel_scaling_mixed": {**_FP16, "fp8": "hybrid", "fp8_recipe": "blockwise",
                                               "fp8_param_gather": False},
    "bf16_with_nvfp4_mixed": {**_BF16, "fp4": "e2m1", "fp4_recipe": "nvfp4"},
}
#: fields of MixedPrecisionConfig present on each target (Bridge ``update_config_with_precision_overrides`` copies
#: every same-named attribute; these are the attributes each MCore/Bridge dataclass has).
MP_MODEL_FIELDS = ("fp16", "bf16", "params_dtype", "pipeline_dtype", "autocast_dtype", "fp8", "fp8_recipe",
                   "first_last_layers_bf16", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo",
                   "fp8_wgrad", "fp8_dot_product_attention", "fp8_multi_head_attention", "fp8_param", "fp4",
                   "fp4_recipe", "fp4_param", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16")
MP_OPTIMIZER_FIELDS = ("fp16", "bf16", "params_dtype", "loss_scale", "initial_loss_scale", "min_loss_scale",
                       "loss_scale_window", "hysteresis", "fp8_recipe", "reuse_grad_buf_for_mxfp8_param_ag")
MP_DDP_FIELDS = ("grad_reduce_in_fp32", "fp8_param_gather", "reuse_grad_buf_for_mxfp8_param_ag")

#: model fields ``CommOverlapConfig`` owns (B/ovl ``_get_model_comm_overlap_cfgs``)
OVERLAP_MODEL_FIELDS = ("tp_comm_overlap", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
                        "defer_embedding_wgrad_compute", "wgrad_deferral_limit", "overlap_p2p_comm", "batch_p2p_comm")
#: Bridge DDP bucket size set by CommOverlapConfig with the distributed optimizer (B/ovl, 128M parameters)
BRIDGE_OVERLAP_BUCKET_SIZE = 128 * 1024 * 1024

_DTYPE_ALIASES = {"torch.bfloat16": "bfloat16", "bf16": "bfloat16", "torch.float16": "float16", "torch.half": "float16",
                  "half": "float16", "fp16": "float16", "torch.float32": "float32", "float": "float32",
                  "fp32": "float32", "torch.float": "float32"}


def norm_dtype(v: Any) -> Any:
    if isinstance(v, str):
        return _DTYPE_ALIASES.get(v, v.replace("torch.", ""))
    return v


def resolve_mixed_precision(mp: Any) -> dict[str, Any] | None:
    """A ``mixed_precision`` value (recipe name or field mapping) -> full MixedPrecisionConfig field dict."""
    if mp is None or mp is False:
        return None
    if isinstance(mp, str):
        key = mp.replace("-", "_")
        if key not in MP_RECIPES:
            raise InputError.bad_value("mixed_precision", mp, f"a Bridge recipe name ({', '.join(sorted(MP_RECIPES))})")
        out = {**MP_DEFAULTS, **MP_RECIPES[key]}
    elif isinstance(mp, dict):
        unknown = [k for k in mp if k not in MP_DEFAULTS]
        if unknown:
            raise InputError(f"mixed_precision.{unknown[0]}: unknown MixedPrecisionConfig field")
        out = {**MP_DEFAULTS, **mp}
    else:
        raise InputError.bad_value("mixed_precision", mp, "a recipe name or a mapping")
    for k in ("params_dtype", "pipeline_dtype", "autocast_dtype"):
        out[k] = norm_dtype(out[k])
    # __setattr__ keeps fp8_param <-> fp8_param_gather in sync; finalize() fills fp8_param from fp8_param_gather
    if out["fp8_param"] is None:
        out["fp8_param"] = out["fp8_param_gather"]
    if out["fp4_param"] is None:
        out["fp4_param"] = out["fp4_param_gather"]
    return out


#: immutable default values that :func:`effective_config` stores without a deep copy (a copy of one is itself)
#: (a set: ``type(v) in _ATOMIC`` is one hash probe, where a tuple compared the type with each entry in turn)
_ATOMIC = frozenset((type(None), bool, int, float, str, bytes))


def copy_config(x: Any, memo: dict[int, Any] | None = None) -> Any:
    """``copy.deepcopy(x)`` of a config tree, faster: plain dicts, lists and tuples are copied here and everything
    else through ``copy.deepcopy`` with the same memo, so the result is the same tree as deepcopy's - equal values,
    the same sharing (an object reached twice is copied once), a tuple whose items copy to themselves returned as
    is, immutable scalars not copied (tests/test_plan_fastpath.py compares both). The planner checks ~200
    configs per plan; ``copy.deepcopy``'s per-object dispatch was a fifth of each check."""
    if memo is None:
        memo = {}
    t = type(x)
    if t in _ATOMIC:
        return x
    got = memo.get(id(x), memo)
    if got is not memo:
        return got
    if t is dict:
        y: Any = {}
        memo[id(x)] = y
        for k, v in x.items():
            y[k if type(k) in _ATOMIC else copy_config(k, memo)] = v if type(v) in _ATOMIC else copy_config(v, memo)
        return y
    if t is list:
        if _ATOMIC.issuperset(map(type, x)):  # e.g. a per-layer moe_layer_freq: the loop below, in C
            y = memo[id(x)] = list(x)
            return y
        y = []
        memo[id(x)] = y
        y.extend(v if type(v) in _ATOMIC else copy_config(v, memo) for v in x)
        return y
    if t is tuple:
        items = [v if type(v) in _ATOMIC else copy_config(v, memo) for v in x]
        got = memo.get(id(x), memo)  # a tuple reached again through its own items (deepcopy's check)
        if got is not memo:
            return got
        y = x if all(a is b for a, b in zip(items, x, strict=True)) else tuple(items)
        if y is not x:
            memo[id(x)] = y
        return y
    return copy.deepcopy(x, memo)


def normalize_input(cfg: dict, owned: bool = False) -> dict:
    """Deep copy with a string ``mixed_precision`` expanded to its fields (so fixes can address them). ``owned``: the
    caller built ``cfg`` for this call and never reads it again (:func:`moetune.io.check.check_job`), so it is
    normalised in place instead of copied."""
    out = cfg if owned else copy_config(cfg)
    if isinstance(out.get("mixed_precision"), str):
        out["mixed_precision"] = resolve_mixed_precision(out["mixed_precision"])
    return out


def _as_list(v: Any) -> list:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    return list(v)


#: integer-typed fields of MCore ``ModelParallelConfig``/``TransformerConfig`` and Bridge ``TrainingConfig`` that the
#: replay and the Job conversion do arithmetic on (section -> fields)
INT_FIELDS: dict[str, tuple[str, ...]] = {
    "model": ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
              "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "num_layers",
              "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
              "seq_length", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "mtp_num_layers",
              "recompute_num_layers", "vocab_size", "make_vocab_size_divisible_by", "cpu_offloading_num_layers",
              "moe_shared_expert_intermediate_size", "num_layers_in_first_pipeline_stage",
              "num_layers_in_last_pipeline_stage"),
    "train": ("micro_batch_size", "global_batch_size"),
    "ddp": ("num_distributed_optimizer_instances",),
}


#: fields the replay iterates over or compares as names (section -> field -> what they hold): a module list may be
#: one name or a list of names; a recipe / dispatcher name must be a string
LIST_FIELDS: dict[str, tuple[str, ...]] = {
    "model": ("cuda_graph_scope", "recompute_modules", "offload_modules", "hierarchical_context_parallel_sizes",
              "cp_comm_type"),
}
NAME_FIELDS: dict[str, tuple[str, ...]] = {
    "model": ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "recompute_granularity", "recompute_method",
              "fp8", "fp8_recipe", "fp4", "fp4_recipe", "cuda_graph_impl", "attention_backend", "transformer_impl",
              "normalization", "position_embedding_type"),
    "mixed_precision": ("fp8", "fp8_recipe", "fp4", "fp4_recipe"),
}


def check_field_types(cfg: dict) -> None:
    """One-line :class:`InputError` naming the first list or name field holding something else (the override
    ``model.cuda_graph_scope=0``): what the replay would otherwise fail on with a bare TypeError."""
    for section, fields in LIST_FIELDS.items():
        sec = cfg.get(section)
        if isinstance(sec, dict):
            for name in fields:
                v = sec.get(name)
                if v is not None and not isinstance(v, str | list | tuple):
                    raise InputError.bad_value(f"{section}.{name}", v, "a name or a list of names")
                if isinstance(v, list | tuple) and any(isinstance(x, dict | list) for x in v):
                    raise InputError.bad_value(f"{section}.{name}", v, "a flat list")
    for section, fields in NAME_FIELDS.items():
        sec = cfg.get(section)
        if isinstance(sec, dict):
            for name in fields:
                v = sec.get(name)
                if v is not None and not isinstance(v, str | bool):
                    raise InputError.bad_value(f"{section}.{name}", v, "a name (string) or null")
    mp = cfg.get("mixed_precision")
    if mp is not None and not isinstance(mp, str | dict):
        raise InputError.bad_value("mixed_precision", mp, "a recipe name (bf16_mixed, ...) or a mapping of fields")


def check_int_fields(cfg: dict) -> None:
    """One-line :class:`InputError` naming the first integer field holding a non-integer (e.g. the override
    ``model.tensor_model_parallel_size=abc``); integral floats and digit strings pass."""
    check_field_types(cfg)
    for section, fields in INT_FIELDS.items():
        sec = cfg.get(section)
        if not isinstance(sec, dict):
            continue
        for name in fields:
            v = sec.get(name)
            if v is None or (isinstance(v, int) and not isinstance(v, bool)):
                continue
            if isinstance(v, float) and v.is_integer():
                continue
            if isinstance(v, str) and v.strip().lstrip("+-").isdigit():
                continue
            raise InputError.bad_value(f"{section}.{name}", v, "an integer")


def effective_config(cfg: dict, env: Env | None = None) -> dict:
    """The config as the library sees it (docs/rules.md §0.3). Never mutates ``cfg``."""
    env = env or Env()
    check_int_fields(cfg)
    eff = copy_config(cfg)
    frontend = eff.get("frontend", "bridge")
    notes: list[tuple[str, str]] = []
    for sec in ("model", "train", "optimizer", "ddp", "dist", "rng", "rerun_state_machine", "dataset", "checkpoint"):
        if eff.get(sec) is None:
            eff[sec] = {}
        elif not isinstance(eff[sec], dict):
            raise InputError.bad_value(sec, eff[sec], "a mapping of fields")
    model, ddp, opt = eff["model"], eff["ddp"], eff["optimizer"]
    for d in (model, opt):
        for k in ("params_dtype", "pipeline_dtype", "main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                  "exp_avg_sq_dtype", "autocast_dtype"):
            if k in d:
                d[k] = norm_dtype(d[k])
    user_model = set(model)

    # defaults (MCore dataclass defaults, MLM argparse defaults for MLM input)
    defaults = {**MODEL_DEFAULTS, **MLM_MODEL_DEFAULTS} if frontend == "megatron-lm" else MODEL_DEFAULTS
    # the absent ones, in the defaults' order; setdefault would deep-copy every default, present or not
    model.update({k: v if type(v) in _ATOMIC else copy_config(v) for k, v in defaults.items() if k not in model})
    for sec, dd in (("ddp", DDP_DEFAULTS), ("optimizer", OPTIMIZER_DEFAULTS), ("dist", DIST_DEFAULTS),
                    ("rng", RNG_DEFAULTS), ("rerun_state_machine", RERUN_DEFAULTS), ("train", TRAIN_DEFAULTS)):
        s = eff[sec]
        s.update({k: v for k, v in dd.items() if k not in s})  # setdefault of each, in order

    # 1. env vars: config env_vars with setdefault (process env = --env wins)
    envvars = {str(k): str(v) for k, v in (eff.get("env_vars") or {}).items()}
    envvars.update({k: str(v) for k, v in env.vars.items()})
    eff["_env_vars_effective"] = envvars
    eff["_env_vars_known"] = bool(env.vars) or bool(eff.get("_env_vars_known"))

    _vpp_from_layout(model, notes)
    tp = int(model.get("tensor_model_parallel_size") or 1)
    pp = int(model.get("pipeline_model_parallel_size") or 1)
    cp = int(model.get("context_parallel_size") or 1)
    vpp = model.get("virtual_pipeline_model_parallel_size")
    W = env.gpus
    dp = W // (tp * pp * cp) if W and W % (tp * pp * cp) == 0 else None

    if frontend == "bridge":
        # 2. mixed precision overwrites every same-named field (PRC-002)
        mp = resolve_mixed_precision(eff.get("mixed_precision"))
        if mp is not None:
            eff["mixed_precision"] = mp
            for fields, target in ((MP_MODEL_FIELDS, model), (MP_OPTIMIZER_FIELDS, opt), (MP_DDP_FIELDS, ddp)):
                for f in fields:
                    target[f] = mp[f]
            ddp["fp8_param_gather"] = mp["fp8_param_gather"]
            notes.append(("PRC-002", "mixed_precision overwrote model/optimizer/ddp precision fields"))
        # 4. Energon native packing clears EP-overlap flags (OVL-014)
        if (eff.get("dataset") or {}).get("packing_buffer_size") is not None:
            for f in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute"):
                model[f] = False
                if isinstance(eff.get("comm_overlap"), dict):
                    eff["comm_overlap"][f] = False
            notes.append(("OVL-014", "Energon native packing disabled EP overlap and delayed wgrad"))
        # 5. CommOverlapConfig.setup
        co = eff.get("comm_overlap")
        if isinstance(co, dict):
            sp = bool(model.get("sequence_parallel")) and tp > 1
            want_tp = bool(co.get("tp_comm_overlap", False))
            model["tp_comm_overlap"] = want_tp and tp >= 2 and sp
            model["overlap_moe_expert_parallel_comm"] = bool(co.get("overlap_moe_expert_parallel_comm") or False)
            model["delay_wgrad_compute"] = bool(co.get("delay_wgrad_compute") or False)
            model["defer_embedding_wgrad_compute"] = bool(co.get("defer_embedding_wgrad_compute") or False)
            wdl = co.get("wgrad_deferral_limit")
            model["wgrad_deferral_limit"] = -1 if wdl is None else wdl
            if pp > 1 and vpp is not None and vpp > 1:
                p2p = (True, False)
            elif pp > 1:
                p2p = (False, True)
            else:
                p2p = (False, False)
            model["overlap_p2p_comm"] = co["overlap_p2p_comm"] if co.get("overlap_p2p_comm") is not None else p2p[0]
            model["batch_p2p_comm"] = co["batch_p2p_comm"] if co.get("batch_p2p_comm") is not None else p2p[1]
            if ddp.get("use_distributed_optimizer") or opt.get("use_distributed_optimizer"):
                dp_gt1 = True if dp is None else dp > 1
                derived = {"overlap_grad_reduce": dp_gt1, "overlap_param_gather": dp_gt1,
                           "align_param_gather": dp_gt1 and pp > 1 and vpp is not None and vpp > 1,
                           "bucket_size": BRIDGE_OVERLAP_BUCKET_SIZE}
                for k, v in derived.items():
                    ddp[k] = co[k] if co.get(k) is not None else v
                opt["overlap_param_gather"] = ddp["overlap_param_gather"]
                if dp is None:
                    notes.append(("OVL-040", "world size unknown: assumed DP>1 for CommOverlapConfig DDP overlap"))
            notes.append(("OVL-040", "CommOverlapConfig set model/DDP overlap fields"))
        # 6. validate(): distributed optimizer sync, FSDP, RNG sync, model.finalize
        if ddp.get("use_distributed_optimizer") or opt.get("use_distributed_optimizer"):
            ddp["use_distributed_optimizer"] = opt["use_distributed_optimizer"] = True
        if ddp.get("overlap_param_gather") or opt.get("overlap_param_gather"):
            ddp["overlap_param_gather"] = opt["overlap_param_gather"] = True
        if eff["dist"].get("use_megatron_fsdp") or ddp.get("use_megatron_fsdp"):
            eff["dist"]["use_megatron_fsdp"] = ddp["use_megatron_fsdp"] = True
            if int(ddp.get("megatron_fsdp_version") or 1) == 1:
                ddp["use_distributed_optimizer"] = opt["use_distributed_optimizer"] = True
                if not ddp.get("disable_symmetric_registration"):
                    ddp["average_in_collective"] = False
                ddp["reuse_grad_buf_for_mxfp8_param_ag"] = False
                notes.append(("FSDP-003", "Megatron-FSDP v1 forced the distributed optimizer"))
        if eff["rng"].get("te_rng_tracker") or model.get("use_te_rng_tracker"):
            eff["rng"]["te_rng_tracker"] = model["use_te_rng_tracker"] = True
        # Bridge clears graph scopes when impl is none (B/tc), before MCore post-init
        if model.get("cuda_graph_impl") in (None, "none") and not model.get("enable_cuda_graph") \
                and not model.get("external_cuda_graph"):
            model["cuda_graph_scope"] = None
            model["cuda_graph_modules"] = None
        # B/tc finalize pre-steps
        if pp > 1 and model.get("pipeline_dtype") is None:
            model["pipeline_dtype"] = model.get("params_dtype")
            notes.append(("PAR-039", "pipeline_dtype filled from params_dtype"))
        if model.get("sequence_parallel") and tp <= 1:
            model["sequence_parallel"] = False
            notes.append(("PAR-017", "sequence_parallel forced False because TP<=1"))
        if model.get("expert_tensor_parallel_size") is None:
            ep = int(model.get("expert_model_parallel_size") or 1)
            model["expert_tensor_parallel_size"] = bridge_default_etp(tp, ep)
            notes.append(("PAR-003", f"expert_tensor_parallel_size None -> {model['expert_tensor_parallel_size']}"))
        # deprecated per-backend SM knobs -> moe_flex_dispatcher_num_sms from the active backend's value, both
        # aliases cleared (Bridge models/model_load_save.py _normalize_moe_dispatcher_sm_config)
        if model.get("moe_flex_dispatcher_num_sms") is None and (
                model.get("moe_deepep_num_sms") is not None or model.get("moe_hybridep_num_sms") is not None):
            key = "moe_hybridep_num_sms" if model.get("moe_flex_dispatcher_backend") == "hybridep" \
                else "moe_deepep_num_sms"
            model["moe_flex_dispatcher_num_sms"] = model.get(key)
            model["moe_deepep_num_sms"] = model["moe_hybridep_num_sms"] = None
            notes.append(("MOE-066", "deprecated *_num_sms migrated to moe_flex_dispatcher_num_sms"))
        # flex dispatcher with backend None -> alltoall (MOE-060)
        if model.get("moe_token_dispatcher_type") == "flex" and "moe_flex_dispatcher_backend" in user_model \
                and cfg.get("model", {}).get("moe_flex_dispatcher_backend") is None:
            model["moe_token_dispatcher_type"] = "alltoall"
            model["moe_flex_dispatcher_backend"] = None
            notes.append(("MOE-060", "flex dispatcher with backend None restored to alltoall"))
        if model.get("moe_token_dispatcher_type") == "flex" and model.get("moe_flex_dispatcher_backend") == "hybridep" \
                and model.get("cuda_graph_impl") in (None, "none"):
            model["moe_hybridep_pad_uneven_dispatch_inputs"] = True
            notes.append(("MOE-062", "HybridEP uneven-input padding enabled"))
    else:
        # Megatron-LM validate_args rewrites
        if model.get("expert_tensor_parallel_size") is None:
            model["expert_tensor_parallel_size"] = tp
        if model.get("sequence_parallel") and tp <= 1:
            model["sequence_parallel"] = False
        if pp > 1 and model.get("pipeline_dtype") is None:
            model["pipeline_dtype"] = model.get("params_dtype")
        # MLM: without VPP overlap_p2p_comm is forced off; batch_p2p_comm = not overlap_p2p_comm (MLM-007)
        if vpp is None:
            model["overlap_p2p_comm"] = False
        model["batch_p2p_comm"] = not model.get("overlap_p2p_comm")
        if model.get("cuda_graph_impl") not in (None, "none") and model.get("transformer_impl") == "transformer_engine":
            model["use_te_rng_tracker"] = eff["rng"]["te_rng_tracker"] = True
        if ddp.get("use_megatron_fsdp"):
            eff["dist"]["use_megatron_fsdp"] = True
        if eff["dist"].get("use_megatron_fsdp"):
            ddp["use_megatron_fsdp"] = True
        if eff["rng"].get("te_rng_tracker"):
            model["use_te_rng_tracker"] = True
        if not eff["rerun_state_machine"].get("check_for_nan_in_loss", True):
            pass

    _mcore_post_init(model, notes)
    eff["_notes"] = notes
    eff["frontend"] = frontend
    return eff


def _vpp_from_layout(model: dict, notes: list[tuple[str, str]]) -> None:
    """VPP from the pipeline layout when unset (TC L2039; MLM validate_args: a layout of one stage per rank
    leaves VPP None)."""
    lay = model.get("pipeline_model_parallel_layout")
    if lay is not None and model.get("virtual_pipeline_model_parallel_size") is None \
            and not (isinstance(lay, str) and lay.startswith("<")):
        from moetune.errors import LayoutError
        from moetune.spec.pipeline import layout_vpp

        try:
            v = layout_vpp(lay, int(model.get("pipeline_model_parallel_size") or 1))
        except LayoutError:
            v = 1  # PAR-031/PAR-032 report it
        if v > 1:
            model["virtual_pipeline_model_parallel_size"] = v
            notes.append(("PAR-031", f"virtual_pipeline_model_parallel_size={v} from the pipeline layout"))


def _mcore_post_init(model: dict, notes: list[tuple[str, str]]) -> None:
    """Silent rewrites of MCore ``TransformerConfig.__post_init__`` / ``cuda_graph_config.py``."""
    # deprecated graph flags
    if model.get("enable_cuda_graph") and model.get("cuda_graph_impl") in (None, "none"):
        model["cuda_graph_impl"] = "local"
    if model.get("external_cuda_graph") and model.get("cuda_graph_impl") in (None, "none"):
        model["cuda_graph_impl"] = "transformer_engine"
    scope = model.get("cuda_graph_scope")
    mods = model.get("cuda_graph_modules")
    model["_cuda_graph_scope_given"] = scope not in (None, [], "")
    model["_cuda_graph_modules_given"] = mods not in (None, [], "", "full", ["full"])
    if scope not in (None, [], "") and mods in (None, [], "", "full"):
        mods = scope
    mods_l = _as_list(mods)
    if "full_iteration" in mods_l and model.get("cuda_graph_impl") == "local":
        model["cuda_graph_impl"] = "full_iteration"
        mods_l = [m for m in mods_l if m != "full_iteration"]
        notes.append(("CG-005", "legacy scope full_iteration migrated to cuda_graph_impl=full_iteration"))
    model["_cuda_graph_modules_raw"] = mods_l
    model["cuda_graph_modules"] = [] if mods_l == ["full"] else mods_l
    model["cuda_graph_scope"] = None
    # recompute
    if model.get("moe_layer_recompute") and model.get("recompute_granularity") != "full":
        model["recompute_granularity"] = "selective"
        rm = _as_list(model.get("recompute_modules"))
        if "moe" not in rm:
            rm.append("moe")
        model["recompute_modules"] = rm
        notes.append(("RCP-015", "moe_layer_recompute converted to selective recompute of 'moe'"))
    if model.get("recompute_modules") is None:
        model["recompute_modules"] = ["core_attn"]
    elif isinstance(model.get("recompute_modules"), str):
        model["recompute_modules"] = [model["recompute_modules"]]
    # MoE rewrites
    if model.get("moe_enable_deepep") and model.get("moe_token_dispatcher_type") == "flex":
        model["moe_flex_dispatcher_backend"] = "deepep"
    if model.get("moe_router_topk_limited_devices") and not model.get("moe_router_group_topk"):
        model["moe_router_group_topk"] = model["moe_router_topk_limited_devices"]
        model["moe_router_num_groups"] = model.get("expert_model_parallel_size")
        model["_topk_limited_devices_migrated"] = True
    cf = model.get("moe_expert_capacity_factor")
    if isinstance(cf, (int, float)) and not isinstance(cf, bool) and cf < 0:
        model["moe_expert_capacity_factor"] = None
    if model.get("moe_router_padding_for_fp8"):
        model["moe_router_padding_for_quantization"] = True
    if model.get("fp32_residual_connection"):
        model["pipeline_dtype"] = "float32"
    if model.get("offload_modules") is None:
        model["offload_modules"] = []

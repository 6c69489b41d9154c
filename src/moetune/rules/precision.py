"""(f) Precision (docs/rules.md §7, PRC-*). Sources: MCore ``transformer_config.py``, ``fp8_utils.py``,
``optimizer/optimizer_config.py``, ``distributed_data_parallel_config.py``; Bridge ``training/mixed_precision.py``
(B/mp) and ``training/config.py`` (B/cfg); TE ``pytorch/quantization.py`` (hardware gates)."""

from __future__ import annotations

from moetune.rules.common import ENV, RT, W_, E, prec, rewritten_on_model
from moetune.rules.engine import UNKNOWN, Ctx, any_of, rule

A = "precision"
MP_FIELDS_ON_MODEL = ("fp8", "fp8_recipe", "fp8_param", "first_last_layers_bf16", "num_layers_at_start_in_bf16",
                      "num_layers_at_end_in_bf16", "fp4", "fp4_recipe", "bf16", "fp16", "params_dtype",
                      "pipeline_dtype")


def _recipe(c: Ctx) -> str | None:
    if c.fp4 is not None:
        return c.m("fp4_recipe", "nvfp4")
    if c.fp8 is not None:
        return c.m("fp8_recipe", "delayed")
    return None


def _te_min(recipe: str | None) -> str | None:
    return {"tensorwise": "2.2.0.dev0", "blockwise": "2.3.0.dev0", "mxfp8": "2.1.0", "nvfp4": "2.7.0.dev0"}.get(
        recipe or "")


def recipe_rejected(recipe: str, cc: tuple[int, int]) -> bool:
    """TE ``check_recipe_support``: does a GPU of compute capability ``cc`` lack this FP8/FP4 recipe?

    delayed / tensorwise need sm_89+; blockwise sm_90 up to (not incl.) sm_120; mxfp8 sm_100..sm_11x; nvfp4 sm_100+.
    (Blockwise on sm_100 is accepted by newer TE only: PRC-008w warns.)"""
    if recipe in ("delayed", "tensorwise"):
        return cc < (8, 9)
    if recipe == "blockwise":
        return cc < (9, 0) or cc[0] >= 12
    if recipe == "mxfp8":
        return not ((10, 0) <= cc < (12, 0))
    if recipe == "nvfp4":
        return cc < (10, 0)
    return False


def _gpu_rejects(c: Ctx):
    """TE check_recipe_support: compute-capability gates per recipe (:func:`recipe_rejected`)."""
    r = _recipe(c)
    if r is None:
        return False
    return c.gpu_is(lambda cc, n: recipe_rejected(r, cc))


#: canonical moetune precision (``spec.features.Precision``) -> TE recipe name checked by PRC-008
PRECISION_RECIPE = {"fp8_delayed": "delayed", "fp8_cs": "tensorwise", "fp8_blockwise": "blockwise",
                    "mxfp8": "mxfp8", "nvfp4": "nvfp4"}


def precision_unsupported(precision: str, gpu_name: str) -> str | None:
    """PRC-008 before any work: why ``precision`` cannot run on ``gpu_name`` (a catalog GPU / system name), or None.

    The planner and the estimator call this at their entrance, so FP8 on A100 or NVFP4 on H100 fails at once with
    the same verdict ``moetune check`` gives (one gate: :func:`recipe_rejected`)."""
    from moetune.rules.engine import GPU_CC, gpu_key

    recipe = PRECISION_RECIPE.get(precision)
    key = gpu_key(gpu_name)
    if recipe is None or key not in GPU_CC:
        return None
    cc, device = GPU_CC[key]
    if not recipe_rejected(recipe, cc):
        return None
    ok = [p for p, r in PRECISION_RECIPE.items() if not recipe_rejected(r, cc)]
    return (f"precision={precision}: {device} (sm_{cc[0]}{cc[1]}) has no {recipe} support "
            f"(PRC-008, TE check_recipe_support); expected one of bf16, fp16{''.join(', ' + p for p in ok)}")


def _suggest_recipe(c: Ctx) -> dict:
    cc = c.cc()
    fix_recipe = "tensorwise" if cc and cc >= (8, 9) else None
    if fix_recipe is None:
        return {**prec(c, "fp8", None), **prec(c, "fp4", None)}
    if c.fp4 is not None:
        return {**prec(c, "fp4", None), **prec(c, "fp8", "hybrid"), **prec(c, "fp8_recipe", fix_recipe)}
    return prec(c, "fp8_recipe", fix_recipe)


rule("PRC-001", A, E, "C", ["model.bf16", "model.fp16", "optimizer.bf16", "optimizer.fp16"],
     lambda c: (bool(c.m("bf16")) and bool(c.m("fp16"))) or (bool(c.get("optimizer.bf16"))
                                                              and bool(c.get("optimizer.fp16"))),
     "only one of bf16 / fp16 may be set", "TC L1338; B/cfg _validate_mixed_precision_consistency",
     fix=lambda c: {**prec(c, "fp16", False), **({"optimizer.fp16": False} if not c.bridge
                                                   or not isinstance(c.raw.get("mixed_precision"), dict) else {})})
rule("PRC-002", A, W_, "C", ["mixed_precision"],
     lambda c: c.bridge and c.raw.get("mixed_precision") is not None and rewritten_on_model(c, MP_FIELDS_ON_MODEL),
     "mixed_precision overwrites precision fields set directly on model/optimizer/ddp; set them on mixed_precision",
     "B/mp MixedPrecisionConfig.setup, update_config_with_precision_overrides")
rule("PRC-003", A, E, "C", ["mixed_precision.fp4", "mixed_precision.fp8"],
     lambda c: c.bridge and isinstance(c.raw.get("mixed_precision"), dict)
     and c.get("mixed_precision.fp4") is not None and c.get("mixed_precision.fp8") is not None,
     "fp4 and fp8 cannot be used simultaneously", "B/mp finalize", fix={"mixed_precision.fp8": None})
rule("PRC-003e", A, ENV, "C", ["mixed_precision.fp4", "env.te"],
     lambda c: c.bridge and c.get("mixed_precision.fp4") is not None and c.te_below("2.7.0.dev0"),
     "NVFP4 needs Transformer Engine >= 2.7.0.dev0", "B/mp finalize", fix={"mixed_precision.fp4": None},
     env=("Transformer Engine version",))
rule("PRC-004", A, E, "C", ["model.fp4", "model.fp8"],
     lambda c: c.fp4 is not None and c.fp8 is not None,
     "fp4 and fp8 are mutually exclusive", "TC L1487", fix=lambda c: prec(c, "fp8", None))
rule("PRC-005", A, RT, "B", ["model.fp8"],
     lambda c: c.fp8 is not None and c.fp8 not in ("e4m3", "hybrid"),
     "fp8 format must be e4m3 or hybrid", "fp8_utils.py get_fp8_recipe", fix=lambda c: prec(c, "fp8", "hybrid"))
rule("PRC-006", A, E, "C", ["model.fp8_recipe", "model.fp8_quantizer_factory"],
     lambda c: (c.fp8 is not None and c.m("fp8_recipe") == "custom" and not c.m("fp8_quantizer_factory"))
     or (c.fp4 is not None and c.m("fp4_recipe") == "custom" and not c.m("fp4_quantizer_factory")),
     "custom FP8/FP4 recipes need a quantizer factory import path", "TC L1465, L1491",
     fix=lambda c: prec(c, "fp8_recipe", "tensorwise"))
rule("PRC-007", A, ENV, "B", ["model.fp8_recipe", "model.fp4_recipe", "env.te"],
     lambda c: _te_min(_recipe(c)) is not None and c.te_below(_te_min(_recipe(c))),
     "this FP8/FP4 recipe needs a newer Transformer Engine (tensorwise 2.2, blockwise 2.3, mxfp8 2.1, nvfp4 2.7)",
     "fp8_utils.py get_fp8_recipe; fp4_utils.py", fix=lambda c: prec(c, "fp8_recipe", "delayed") if c.fp8 else
     prec(c, "fp4", None), env=("Transformer Engine version",))
rule("PRC-008", A, ENV, "R", ["model.fp8_recipe", "model.fp4_recipe", "env.gpu"],
     lambda c: _recipe(c) is not None and not (_recipe(c) == "blockwise" and c.gpu_is(lambda cc, n: cc[0] == 10)
                                               is True) and _gpu_rejects(c),
     "this FP8/FP4 recipe is not supported on the GPU (H100/H200: delayed/tensorwise/blockwise; "
     "B200/GB200/B300/GB300: delayed/tensorwise/mxfp8/nvfp4)", "TE pytorch/quantization.py check_recipe_support",
     fix=_suggest_recipe, env=("GPU type",))
rule("PRC-008w", A, W_, "R", ["model.fp8_recipe", "env.gpu"],
     lambda c: _recipe(c) == "blockwise" and c.gpu_is(lambda cc, n: cc[0] == 10) is True,
     "blockwise FP8 on Blackwell is only supported by newer TE releases", "TE pytorch/quantization.py")
rule("PRC-009", A, E, "C", ["model.fp8", "model.first_last_layers_bf16", "model.fp8_recipe"],
     lambda c: c.fp8 is not None and bool(c.m("first_last_layers_bf16")) and c.m("fp8_recipe") == "delayed",
     "delayed scaling does not support first/last layers in BF16", "TC L1435",
     fix=lambda c: prec(c, "first_last_layers_bf16", False))
rule("PRC-010", A, E, "C", ["model.first_last_layers_bf16", "model.num_layers_at_start_in_bf16",
                            "model.num_layers_at_end_in_bf16", "model.num_layers", "model.pipeline_model_parallel_size"],
     lambda c: c.fp8 is not None and bool(c.m("first_last_layers_bf16")) and c.num_layers is not None and any(
         not (0 <= (c.m(f) or 0) <= c.num_layers // c.pp)
         for f in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16")),
     "num_layers_at_start/end_in_bf16 must lie in [0, num_layers // PP]", "TC L1448-1457",
     fix=lambda c: {**prec(c, "num_layers_at_start_in_bf16", 1), **prec(c, "num_layers_at_end_in_bf16", 1)})
rule("PRC-011", A, E, "C", ["model.fp8_param", "model.fp8", "model.fp4_param", "model.fp4"],
     lambda c: (bool(c.m("fp8_param")) and c.fp8 is None) or (bool(c.m("fp4_param")) and c.fp4 is None),
     "fp8_param/fp4_param need fp8/fp4 enabled", "TC L1472, L1484",
     fix=lambda c: {**prec(c, "fp8_param", False),
                    **prec(c, "fp8_param_gather" if c.bridge and isinstance(c.raw.get("mixed_precision"), dict)
                           else "fp8_param", False),
                    **({"ddp.fp8_param_gather": False} if not (c.bridge and isinstance(c.raw.get("mixed_precision"),
                                                                                        dict)) else {}),
                    **prec(c, "fp4_param_gather" if c.bridge and isinstance(c.raw.get("mixed_precision"), dict)
                           else "fp4_param", False)})
rule("PRC-012", A, E, "C", ["model.fp8_output_proj", "model.fp8", "model.fp8_recipe"],
     lambda c: bool(c.m("fp8_output_proj")) and (c.fp8 is None or c.m("fp8_recipe") != "mxfp8"),
     "fp8_output_proj needs FP8 with the mxfp8 recipe", "TC L1476", fix={"model.fp8_output_proj": False})
rule("PRC-013", A, ENV, "C", ["model.fp8", "model.moe_grouped_gemm", "env.te"],
     lambda c: c.is_moe and c.fp8 is not None and any_of(
         c.te_below("1.7.0.dev0"), c.te_below("1.11.0") if c.m("moe_grouped_gemm") else False),
     "MoE with FP8 needs TE >= 1.7 (grouped GEMM: >= 1.11)", "TC L2389-2395", fix=lambda c: prec(c, "fp8", None),
     env=("Transformer Engine version",))
rule("PRC-014", A, E, "C", ["mixed_precision.fp8_param_gather", "mixed_precision.fp8_recipe",
                            "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag"],
     lambda c: c.bridge and not c.fsdp and isinstance(c.raw.get("mixed_precision"), dict)
     and bool(c.get("mixed_precision.fp8_param_gather")) and c.get("mixed_precision.fp8_recipe") == "mxfp8"
     and not c.get("mixed_precision.reuse_grad_buf_for_mxfp8_param_ag"),
     "MXFP8 param gather needs reuse_grad_buf_for_mxfp8_param_ag=True", "B/cfg validate L1497; B/mp finalize",
     fix={"mixed_precision.reuse_grad_buf_for_mxfp8_param_ag": True})
rule("PRC-015", A, E, "C", ["ddp.reuse_grad_buf_for_mxfp8_param_ag", "ddp.fp8_param_gather"],
     lambda c: bool(c.get("ddp.reuse_grad_buf_for_mxfp8_param_ag")) and not c.get("ddp.fp8_param_gather"),
     "reuse_grad_buf_for_mxfp8_param_ag only when keeping params in MXFP8 (fp8_param_gather)",
     "distributed_data_parallel_config.py __post_init__",
     fix=lambda c: prec(c, "reuse_grad_buf_for_mxfp8_param_ag", False) if c.bridge and isinstance(
         c.raw.get("mixed_precision"), dict) else {"ddp.reuse_grad_buf_for_mxfp8_param_ag": False})
rule("PRC-016", A, W_, "C", ["optimizer.fp8_recipe", "ddp.reuse_grad_buf_for_mxfp8_param_ag"],
     lambda c: c.get("optimizer.fp8_recipe") == "mxfp8" and c.fp8 is not None
     and not c.get("ddp.reuse_grad_buf_for_mxfp8_param_ag") and not c.fsdp,
     "MXFP8 without reuse_grad_buf_for_mxfp8_param_ag costs significant extra memory", "optimizer_config.py")


def _pao_bad(c: Ctx) -> bool:
    return bool(c.get("optimizer.use_precision_aware_optimizer")) and (
        c.get("optimizer.optimizer", "adam") != "adam" or not c.dist_opt)


rule("PRC-017", A, E, "C", ["optimizer.use_precision_aware_optimizer", "optimizer.optimizer",
                            "optimizer.use_distributed_optimizer"], _pao_bad,
     "the precision-aware optimizer needs Adam and the distributed optimizer", "optimizer_config.py __post_init__",
     fix=lambda c: {"optimizer.use_distributed_optimizer": True, "ddp.use_distributed_optimizer": True,
                    **({"optimizer.optimizer": "adam"} if c.get("optimizer.optimizer", "adam") != "adam" else {})})
rule("PRC-018", A, E, "C", ["optimizer.use_precision_aware_optimizer", "optimizer.main_grads_dtype",
                            "optimizer.main_params_dtype", "optimizer.exp_avg_dtype", "optimizer.exp_avg_sq_dtype"],
     lambda c: not c.get("optimizer.use_precision_aware_optimizer") and any(
         str(c.get(f"optimizer.{f}", "float32")) not in ("float32", "fp32", "None")
         for f in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")),
     "reduced optimizer dtypes need use_precision_aware_optimizer=True", "optimizer_config.py __post_init__",
     fix={"optimizer.use_precision_aware_optimizer": True})
rule("PRC-019", A, E, "C", ["optimizer.use_precision_aware_optimizer", "model.bf16", "optimizer.bf16",
                            "model.fp16", "optimizer.fp16"],
     lambda c: c.bridge and bool(c.get("optimizer.use_precision_aware_optimizer")) and (
         (bool(c.m("bf16")) and not c.get("optimizer.bf16")) or (bool(c.m("fp16")) and not c.get("optimizer.fp16"))
         or (not c.m("bf16") and not c.m("fp16") and bool(c.get("optimizer.bf16") or c.get("optimizer.fp16")))),
     "with the precision-aware optimizer, optimizer bf16/fp16 must match the model",
     "B/cfg _validate_mixed_precision_consistency",
     fix=lambda c: {"optimizer.bf16": bool(c.m("bf16")), "optimizer.fp16": bool(c.m("fp16"))})
rule("PRC-020", A, W_, "-", ["model.moe_router_dtype"],
     lambda c: c.is_moe and c.m("moe_router_dtype") is not None
     and str(c.m("moe_router_dtype")) not in ("fp32", "fp64", "float32", "float64"),
     "moe_router_dtype other than fp32/fp64 silently means 'no dtype change'", "moe/router.py")
rule("PRC-024", A, W_, "-", ["ddp.fp8_param_gather", "ddp.use_distributed_optimizer"],
     lambda c: bool(c.get("ddp.fp8_param_gather")) and not c.dist_opt and not c.fsdp,
     "fp8_param_gather without the distributed optimizer (MLM rejects)", "MLM validate_args")
rule("PRC-025", A, W_, "C", ["model.fp32_residual_connection"],
     lambda c: bool(c.m("fp32_residual_connection")),
     "fp32_residual_connection forces pipeline_dtype=float32", "TC L1326")
rule("PRC-026", A, E, "C", ["checkpoint.restore_modelopt_state", "model.gradient_accumulation_fusion"],
     lambda c: bool(c.get("checkpoint.restore_modelopt_state") or c.m("restore_modelopt_state"))
     and bool(c.m("gradient_accumulation_fusion")),
     "ModelOpt/quantized models do not support gradient_accumulation_fusion", "B/cfg validate",
     fix={"model.gradient_accumulation_fusion": False}, frontends=("bridge",))
rule("PRC-028", A, E, "C", ["model.batch_invariant_mode", "model.context_parallel_size", "model.attention_dropout"],
     lambda c: bool(c.m("batch_invariant_mode")) and (
         c.cp != 1 or (c.m("attention_dropout") or 0) != 0 or str(c.m("params_dtype")) != "bfloat16"
         or (c.is_moe and (c.dispatcher != "alltoall" or c.fp8 is not None or c.fp4 is not None
                           or bool(c.m("moe_permute_fusion"))))),
     "batch-invariant mode restrictions (bf16, CP 1, no attention dropout; MoE: alltoall, no fp8/fp4, no permute "
     "fusion)", "TC L2958-3008", fix={"model.batch_invariant_mode": False})
_ = (UNKNOWN, RT)

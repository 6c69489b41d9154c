"""``--with-mcore``: build Megatron-Core's own ``TransformerConfig`` (a ``ModelParallelConfig``) for the effective
model config and compare its verdict with moetune's config-stage rules sourced from ``TransformerConfig.__post_init__``
/ ``ModelParallelConfig.__post_init__`` (docs/rules.md sources ``TC`` / ``MPC``).

Needs the optional extra ``moetune[mcore]`` (megatron-core 0.16.x + CPU torch). Version drift is expected: moetune's
rules follow the MCore commit pinned by Bridge (docs/rules.md §0), the installed release may be older; every
disagreement is reported, none is hidden.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moetune.rules.engine import CheckResult

_DTYPE_FIELDS = ("params_dtype", "pipeline_dtype", "autocast_dtype")
#: fields whose values are callables/objects in MCore; a string cannot be passed through
#: kernel-availability flags MCore validates against the installed Transformer Engine / GPU; a CPU-only install
#: cannot have them, so they are turned off for the cross-check (moetune's env rules, e.g. MOE-029/MOE-067, cover
#: them when --te is given)
KERNEL_FLAGS = ("apply_rope_fusion", "moe_permute_fusion", "moe_router_fusion", "gradient_accumulation_fusion",
                "bias_activation_fusion", "bias_dropout_fusion", "masked_softmax_fusion", "persist_layer_norm",
                "cross_entropy_loss_fusion", "use_transformer_engine_op_fuser")
_SKIP = {"activation_func", "init_method", "output_layer_init_method", "bias_init_method", "no_sync_func",
         "grad_sync_func", "param_sync_func", "finalize_model_grads_func", "grad_scale_func", "timers",
         "barrier_with_L1_time", "transformer_layer_spec", "quant_recipe"}


def mcore_available() -> tuple[bool, str | None]:
    try:
        import megatron.core as mc  # noqa: F401
        import torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return False, f"{e.__class__.__name__}: {e}"
    try:
        from importlib.metadata import version

        return True, version("megatron-core")
    except Exception:  # noqa: BLE001
        return True, None


def build_kwargs(model: dict) -> dict[str, Any]:
    """Keyword arguments for ``TransformerConfig`` from the effective ``model`` section."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw: dict[str, Any] = {}
    for k, v in model.items():
        if k.startswith("_") or k in _SKIP or k not in names:
            continue
        if isinstance(v, str) and v.startswith("<"):  # placeholder (e.g. layout rebuilt by a recipe builder)
            continue
        if k in _DTYPE_FIELDS and isinstance(v, str):
            v = getattr(torch, v, None)
            if v is None:
                continue
        kw[k] = v
    for k in KERNEL_FLAGS:
        if k in kw and kw[k]:
            kw[k] = False
    if "cuda_graph_modules" not in names and "cuda_graph_scope" in names:
        mods = model.get("cuda_graph_modules")
        if mods:
            kw["cuda_graph_scope"] = list(mods)
    return kw


def crosscheck_mcore(res: CheckResult) -> dict[str, Any]:
    """Build MCore's TransformerConfig for ``res.effective`` and compare verdicts."""
    ok, version = mcore_available()
    if not ok:
        return {"available": False, "summary": f"megatron-core not installed ({version}); "
                                              "install moetune[mcore]"}
    model = res.effective.get("model", {})
    if not (model.get("num_layers") and model.get("hidden_size") and model.get("num_attention_heads")):
        return {"available": True, "version": version, "summary": "skipped: model architecture unknown"}
    ours = [f for f in res.findings if f.severity == "error" and f.stage == "C"
            and (f.source.startswith("TC") or f.source.startswith("MPC") or " TC " in f.source)]
    import warnings

    try:
        kwargs = build_kwargs(model)
        from megatron.core.transformer.transformer_config import TransformerConfig

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            TransformerConfig(**kwargs)
        verdict, message = "ok", None
    except (ImportError, ModuleNotFoundError, RuntimeError) as e:
        # needs a GPU / Transformer Engine for this path: not a config verdict
        return {"available": True, "version": version, "verdict": "environment",
                "message": f"{e.__class__.__name__}: {' '.join(str(e).split())[:300]}",
                "moetune_errors": [f.id for f in ours],
                "summary": f"megatron-core {version} could not evaluate this config without its runtime "
                           f"({e.__class__.__name__})"}
    except Exception as e:  # noqa: BLE001 - any assertion/ValueError is MCore's verdict
        text = " ".join(str(e).split())
        if isinstance(e, TypeError) and "Version" in text or "install TE" in text or "Transformer Engine" in text:
            # a version lookup of an absent Transformer Engine: not a config verdict
            return {"available": True, "version": version, "verdict": "environment",
                    "message": f"{e.__class__.__name__}: {text[:300]}", "moetune_errors": [f.id for f in ours],
                    "summary": f"megatron-core {version} needs Transformer Engine to evaluate this config "
                               f"({text[:120]})"}
        verdict, message = "error", f"{e.__class__.__name__}: {text[:300]}"
    agree = (verdict == "error") == bool(ours)
    disagreements = []
    if verdict == "error" and not ours:
        disagreements.append(f"megatron-core {version} rejects the config but moetune has no config-stage "
                             f"TransformerConfig error: {message}")
    if verdict == "ok" and ours:
        disagreements.append(f"moetune reports {', '.join(f.id for f in ours)} (rules of the pinned MCore) but "
                             f"megatron-core {version} accepts the config")
    summary = (f"megatron-core {version}: {verdict}" + (f" ({message})" if message else "")
               + ("; agrees with moetune" if agree else "; DISAGREES with moetune"))
    return {"available": True, "version": version, "verdict": verdict, "message": message,
            "moetune_errors": [f.id for f in ours], "agree": agree, "disagreements": disagreements,
            "summary": summary}

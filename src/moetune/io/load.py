"""The one loader: every input moetune accepts becomes a :class:`~moetune.spec.job.Job` here.

Inputs: command-line flags (a catalog model or HF ``config.json``, a system, the layout and the feature vocabulary
below), a Megatron-Bridge perf recipe (``--recipe NAME``, :mod:`moetune.catalog.recipes`), a Bridge ConfigContainer
YAML with Hydra-style overrides, a Megatron-LM argument file / functional-test ``model_config.yaml``. ``estimate``,
``plan`` and ``check`` build their jobs through this module (and the MCP server and web API call those commands), so
the same question gets the same Job everywhere.

**One feature vocabulary** (:class:`FeatureChoices`): the dimensions ``plan --fix`` pins are the ``estimate`` flags of
the same name (``fsdp``, ``dispatcher``, ``ep_overlap``, ``delay_wgrad``, ``tp_comm_overlap``, ``recompute``,
``offload``, ``cuda_graph_scope``, ``mbs``, ``precision``), and a plan candidate's ``reproduce:`` line
(:func:`reproduce_args`) writes every one of them explicitly, so ``moetune estimate`` rebuilds the identical Job.

**Starting features** (:func:`starting_features`): the Bridge perf recipe for the same model / system / precision
when one exists (the features Bridge benchmarks with; routing stays natural unless ``--recipe`` is named or
``--force-balance`` given), else the library defaults with the perf launcher's common settings
(:func:`perf_common_features`: BF16 gradient reduction, manual GC, TE cross-entropy); ``--recipe none`` forces the
library defaults (:func:`library_features`). The starting point is named in the job's assumptions.

**Pipeline splits as Megatron does them** (:func:`pipeline_split`): an explicit ``--pipeline-layout``, or
``--num-layers-in-first/last-pipeline-stage``, or ``--account-for-embedding/loss-in-pipeline-split`` are checked with
Megatron's rules (:mod:`moetune.spec.pipeline`: ``TransformerConfig.__post_init__``,
``transformer_block.get_num_layers_to_build``); with none given, the recipe's split when its PP x VPP match, else the
uniform split when ``num_layers % (PP*VPP) == 0``, else the FLOPs-balanced layout the planner generates
(:func:`moetune.perfmodel.balance.balanced_layout`) - stated in the assumptions and emitted in the launch overrides.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from moetune.errors import InputError, MoetuneError
from moetune.memo import memo
from moetune.spec.features import BRIDGE_MIXED_PRECISION, Features, parse_precision
from moetune.spec.job import Job
from moetune.spec.layout import Layout
from moetune.spec.model import ModelArch
from moetune.spec.system import System

DEFAULT_SYSTEM = "DGX-H100"
#: ``--recipe`` values that mean "no recipe: library defaults"
RECIPE_NONE = frozenset({"none", "off", "defaults", "library"})
#: ``--recipe`` values that mean "no recipe: library defaults with the perf launcher's common settings"
#: (:func:`perf_common_features`, the start of a model without a perf recipe; what a plan's reproduce line writes)
RECIPE_PERF_COMMON = frozenset({"perf-common", "perf_common"})

#: ``--dispatcher`` names -> (moe_token_dispatcher_type, moe_flex_dispatcher_backend); MCore ``flex`` alone = DeepEP
DISPATCHERS: dict[str, tuple[str, str | None]] = {
    "alltoall": ("alltoall", None), "allgather": ("allgather", None), "deepep": ("flex", "deepep"),
    "hybridep": ("flex", "hybridep"), "flex": ("flex", "deepep"),
}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


# --------------------------------------------------------------------------------------------------------------
# the feature vocabulary


@dataclass(frozen=True)
class FeatureChoices:
    """What the user pinned, in the one vocabulary of ``estimate`` flags and ``plan --fix`` keys (None = not given).

    ``recompute``: ``none`` | ``full[:uniform|block[:N]]`` | ``selective`` | comma list of modules;
    ``offload`` / ``cuda_graph_scope``: comma lists of modules / scopes, or ``none``; ``offload`` also
    ``layers:N`` (layer-level CPU offloading of the first N decoder layers, ``--cpu-offloading-num-layers``);
    ``dispatcher``: ``alltoall``, ``allgather``, ``deepep``, ``hybridep`` (``flex`` = DeepEP);
    ``rank_capacity_factor``: a number > 0 or ``none`` (HybridEP's static per-rank budget,
    ``--moe-expert-rank-capacity-factor``); ``paged_stash``: ``--moe-paged-stash``; ``cutedsl_fused_grouped_mlp``:
    TE's CuTeDSL fused grouped MLP of the experts (``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1`` with the op fuser; the
    planner keeps it as given, never searches it).
    """

    fsdp: bool | None = None
    dispatcher: str | None = None
    ep_overlap: bool | None = None
    delay_wgrad: bool | None = None
    tp_comm_overlap: bool | None = None
    recompute: str | None = None
    offload: str | None = None
    cuda_graph_scope: str | None = None
    rank_capacity_factor: str | None = None
    paged_stash: bool | None = None
    cutedsl_fused_grouped_mlp: bool | None = None
    optimizer_offload: float | None = None
    expandable_segments: bool | None = None
    dist_opt: bool | None = None
    force_balance: bool | None = None
    routing_imbalance: float | None = None
    #: the training task (a property of the job, never searched by ``plan``): ``pretrain``, ``sft``, ``lora``;
    #: the LoRA settings (``--lora-dim`` etc.) imply ``lora`` (:func:`task_updates`)
    task: str | None = None
    lora_dim: int | None = None
    lora_alpha: int | None = None
    lora_target_modules: str | None = None

    def given(self) -> set[str]:
        return {f.name for f in fields(self) if getattr(self, f.name) is not None}


def parse_recompute(text: str | None) -> dict[str, Any]:
    """``--recompute`` / ``--fix recompute=`` value -> Features fields (every recompute field set, so the result does
    not depend on the starting features).

    Forms: ``none``; ``full`` / ``full:uniform:N`` / ``full:block:N``; ``selective`` (MCore default module
    core_attn) or a comma list of selective modules (``core_attn,moe_act``; ``+`` also separates).
    """
    from moetune.perfmodel.activations import RECOMPUTE_MODULES

    off = {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None,
           "recompute_modules": ()}
    if text is None or text.strip().lower() in ("", "none", "off"):
        return off
    t = text.strip().lower()
    if t.startswith("full"):
        parts = t.split(":")
        method = parts[1] if len(parts) > 1 and parts[1] else "uniform"
        if method not in ("uniform", "block"):
            raise InputError.bad_value("--recompute", text, "full[:uniform|block[:N]]")
        try:
            n = int(parts[2]) if len(parts) > 2 else 1
        except ValueError:
            raise InputError.bad_value("--recompute", text, "full:<method>:<integer layers>") from None
        if n < 1:
            raise InputError.bad_value("--recompute", text, "a positive number of layers")
        return {**off, "recompute_granularity": "full", "recompute_method": method, "recompute_num_layers": n}
    if t == "selective":
        return {**off, "recompute_granularity": "selective", "recompute_modules": ("core_attn",)}
    mods = tuple(m.strip() for m in t.replace("+", ",").split(",") if m.strip())
    bad = [m for m in mods if m not in RECOMPUTE_MODULES]
    if bad or not mods:
        raise InputError.bad_value("--recompute", text, f"none, full[:uniform|block:N], selective or modules from "
                                   f"{', '.join(RECOMPUTE_MODULES)}")
    return {**off, "recompute_granularity": "selective", "recompute_modules": mods}


def _modules(text: str, flag: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    mods = tuple(m.strip() for m in text.replace("+", ",").split(",") if m.strip())
    bad = [m for m in mods if m not in allowed]
    if bad or not mods:
        raise InputError.bad_value(flag, text, f"none or a comma list of {', '.join(allowed)}")
    return mods


def choice_updates(ch: FeatureChoices) -> dict[str, Any]:
    """Features fields for every pinned dimension of ``ch`` (validated; one-line errors name the flag)."""
    from moetune.perfmodel.activations import OFFLOAD_MODULES

    up: dict[str, Any] = {}
    if ch.fsdp is not None:
        up.update({"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads_params",
                   "use_distributed_optimizer": True} if ch.fsdp else {"use_megatron_fsdp": False})
    if ch.dist_opt is not None:
        up["use_distributed_optimizer"] = bool(ch.dist_opt) or bool(ch.fsdp)
    if ch.dispatcher is not None:
        key = ch.dispatcher.strip().lower()
        if key not in DISPATCHERS:
            raise InputError.bad_value("--dispatcher", ch.dispatcher, ", ".join(DISPATCHERS))
        up["moe_token_dispatcher_type"], up["moe_flex_dispatcher_backend"] = DISPATCHERS[key]
    if ch.ep_overlap is not None:
        up["overlap_moe_expert_parallel_comm"] = bool(ch.ep_overlap)
    if ch.delay_wgrad is not None:
        up["delay_wgrad_compute"] = bool(ch.delay_wgrad)
    if ch.tp_comm_overlap is not None:
        up["tp_comm_overlap"] = bool(ch.tp_comm_overlap)
    if ch.recompute is not None:
        up.update(parse_recompute(ch.recompute))
    if ch.offload is not None:
        t = ch.offload.strip().lower()
        if t in ("", "none", "off"):
            up.update(fine_grained_activation_offloading=False, offload_modules=(), cpu_offloading=False,
                      cpu_offloading_num_layers=0)
        elif t.startswith("layers:"):
            # layer-level CPU offloading of the first N decoder layers (--cpu-offloading --cpu-offloading-num-layers)
            n = t.split(":", 1)[1]
            if not n.isdigit() or int(n) < 1:
                raise InputError.bad_value("--offload-modules", ch.offload, "layers:N with N >= 1 decoder layers")
            up.update(fine_grained_activation_offloading=False, offload_modules=(), cpu_offloading=True,
                      cpu_offloading_num_layers=int(n))
        else:
            up.update(fine_grained_activation_offloading=True, cpu_offloading=False, cpu_offloading_num_layers=0,
                      offload_modules=_modules(ch.offload, "--offload-modules", OFFLOAD_MODULES))
    if ch.cuda_graph_scope is not None:
        if ch.cuda_graph_scope.strip().lower() in ("", "none", "off"):
            up.update(cuda_graph_impl="none", cuda_graph_scope=())
        else:
            scopes = _modules(ch.cuda_graph_scope, "--cuda-graph-scope",
                              ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration"))
            # a whole-iteration graph is MCore's local implementation (cuda_graph_impl=full_iteration in Bridge)
            up.update(cuda_graph_impl="local" if "full_iteration" in scopes else "transformer_engine",
                      cuda_graph_scope=scopes)
    if ch.rank_capacity_factor is not None:
        up["moe_expert_rank_capacity_factor"] = parse_rank_capacity(ch.rank_capacity_factor)
    if ch.paged_stash is not None:
        up["moe_paged_stash"] = bool(ch.paged_stash)
    if ch.cutedsl_fused_grouped_mlp is not None:
        up["cutedsl_fused_grouped_mlp"] = bool(ch.cutedsl_fused_grouped_mlp)
    if ch.optimizer_offload is not None:
        if not 0.0 <= ch.optimizer_offload <= 1.0:
            raise InputError.bad_value("--optimizer-offload", ch.optimizer_offload, "a fraction in [0, 1]")
        up.update(optimizer_cpu_offload=ch.optimizer_offload > 0, optimizer_offload_fraction=float(ch.optimizer_offload))
    if ch.expandable_segments is not None:
        up["expandable_segments"] = bool(ch.expandable_segments)
    if ch.force_balance is not None:
        up["moe_router_force_load_balancing"] = bool(ch.force_balance)
    if ch.routing_imbalance is not None:
        if not 1.0 <= ch.routing_imbalance < float("inf"):  # also nan
            raise InputError.bad_value("--routing-imbalance", ch.routing_imbalance, "max/mean load >= 1")
        up["moe_routing_imbalance"] = float(ch.routing_imbalance)
    up.update(task_updates(ch.task, ch.lora_dim, ch.lora_alpha, ch.lora_target_modules))
    return up


#: ``--task`` values: Features.task (``peft`` is Bridge's word for the adapter methods; LoRA is the one modelled)
TASKS = ("pretrain", "sft", "lora")


def task_updates(task: str | None, dim: int | None = None, alpha: int | None = None,
                 targets: str | list[str] | tuple[str, ...] | None = None, *, where: str = "--") -> dict[str, Any]:
    """Features fields of the training task (``--task``, ``--lora-dim``, ``--lora-alpha``, ``--lora-target-modules``
    on the command line; ``where`` = ``"peft."`` names the Bridge YAML fields instead). Any LoRA setting implies
    ``lora``; a LoRA setting with another task is an error. Unset LoRA settings keep Bridge's ``LoRA`` defaults
    (``peft/lora.py``: dim 32, alpha 32, every linear)."""
    from moetune.spec.features import LORA_DEFAULT_TARGETS

    names = {"task": "--task", "dim": "--lora-dim", "alpha": "--lora-alpha", "targets": "--lora-target-modules"} \
        if where == "--" else {"task": "peft", "dim": "peft.dim", "alpha": "peft.alpha",
                               "targets": "peft.target_modules"}
    up: dict[str, Any] = {}
    lora_given = [n for n, v in (("dim", dim), ("alpha", alpha), ("targets", targets)) if v is not None]
    if task is not None:
        t = str(task).strip().lower()
        if t == "peft":
            t = "lora"
        if t not in TASKS:
            raise InputError.bad_value(names["task"], task, ", ".join(TASKS))
        if lora_given and t != "lora":
            raise InputError.bad_value(names[lora_given[0]], {"dim": dim, "alpha": alpha, "targets": targets}[
                lora_given[0]], f"a LoRA setting only with --task lora (task is {t})")
        up["task"] = t
    elif lora_given:
        up["task"] = "lora"
    for key, field, v in (("dim", "lora_dim", dim), ("alpha", "lora_alpha", alpha)):
        if v is None:
            continue
        try:
            n = int(v)
        except (TypeError, ValueError):
            n = 0
        if n < 1 or str(n) != str(v).strip():
            raise InputError.bad_value(names[key], v, "a positive integer" + (" (the LoRA rank r)" if key == "dim"
                                                                              else ""))
        up[field] = n
    if targets is not None:
        items = targets if isinstance(targets, list | tuple) else str(targets).replace("+", ",").split(",")
        mods = tuple(str(m).strip() for m in items if str(m).strip())
        bad = [m for m in mods if m not in LORA_DEFAULT_TARGETS]
        if bad or not mods:
            raise InputError.bad_value(names["targets"], targets,
                                       f"a comma list of {', '.join(LORA_DEFAULT_TARGETS)}")
        up["lora_target_modules"] = mods
    return up


def parse_rank_capacity(text: str | float) -> float | None:
    """``--rank-capacity-factor`` / ``--fix rank_capacity_factor=`` value: ``none`` or a number > 0."""
    t = str(text).strip().lower()
    if t in ("", "none", "off"):
        return None
    try:
        v = float(t)
    except ValueError:
        v = float("nan")
    if not 0.0 < v < float("inf"):  # also nan
        raise InputError.bad_value("--rank-capacity-factor", text, "none or a number > 0 (e.g. 1.5)")
    return v


#: ``--fix`` keys: layout dimensions (ints) and the feature vocabulary (same names as the ``estimate`` flags)
FIX_INT_KEYS = ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs")
FIX_BOOL_KEYS = ("fsdp", "ep_overlap", "delay_wgrad", "tp_comm_overlap", "paged_stash")
FIX_TEXT_KEYS = ("recompute", "pipeline_layout", "dispatcher", "precision", "offload", "cuda_graph_scope",
                 "rank_capacity_factor")
FIX_KEYS = (*FIX_INT_KEYS, *FIX_BOOL_KEYS, *FIX_TEXT_KEYS)
_FIX_ALIASES = {"graphs": "cuda_graph_scope", "cuda_graphs": "cuda_graph_scope", "offload_modules": "offload",
                "delay_wgrad_compute": "delay_wgrad", "overlap_moe_expert_parallel_comm": "ep_overlap",
                "moe_expert_rank_capacity_factor": "rank_capacity_factor", "moe_paged_stash": "paged_stash"}


def parse_fix(text: str | None) -> dict[str, Any]:
    """``--fix tp=2,ep=64,recompute=full,fsdp=1,ep_overlap=1,cuda_graph_scope=attn+moe_router,...`` -> dict.

    Integers for the layout keys, booleans (stored as 0/1) for fsdp / ep_overlap / delay_wgrad / tp_comm_overlap,
    text otherwise; list values inside ``--fix`` use ``+`` between items (the comma separates pairs). Every value is
    validated with the parser ``estimate`` uses for the flag of the same name.
    """
    out: dict[str, Any] = {}
    if not text:
        return out
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise InputError.bad_value("--fix", part, "KEY=VALUE pairs separated by commas, e.g. tp=2,ep=64")
        k, v = (x.strip() for x in part.split("=", 1))
        k = _FIX_ALIASES.get(k.replace("-", "_"), k.replace("-", "_"))
        if k not in FIX_KEYS:
            from moetune.errors import UnknownNameError

            raise UnknownNameError("--fix key", k, FIX_KEYS)
        if k in FIX_INT_KEYS:
            if not v.isdigit() or int(v) < 1:
                raise InputError.bad_value(f"--fix {k}", v, "a positive integer")
            out[k] = int(v)
        elif k in FIX_BOOL_KEYS:
            if v.lower() not in (*_TRUE, *_FALSE):
                raise InputError.bad_value(f"--fix {k}", v, "1 or 0")
            out[k] = int(v.lower() in _TRUE)
        else:
            out[k] = v
    choice_updates(fix_choices(out))  # validate the feature values now (one-line errors)
    if "precision" in out:
        parse_precision(str(out["precision"]))
    return out


def fix_choices(fix: dict[str, Any]) -> FeatureChoices:
    """The :class:`FeatureChoices` a ``--fix`` dict pins."""
    b = {k: (bool(int(fix[k])) if k in fix else None) for k in FIX_BOOL_KEYS}
    return FeatureChoices(fsdp=b["fsdp"], ep_overlap=b["ep_overlap"], delay_wgrad=b["delay_wgrad"],
                          tp_comm_overlap=b["tp_comm_overlap"], dispatcher=fix.get("dispatcher"),
                          recompute=fix.get("recompute"),
                          offload=fix.get("offload"), cuda_graph_scope=fix.get("cuda_graph_scope"),
                          rank_capacity_factor=fix.get("rank_capacity_factor"), paged_stash=b["paged_stash"])


# --------------------------------------------------------------------------------------------------------------
# starting features: Bridge perf recipe or library defaults


def library_features(model: ModelArch, precision: str) -> Features:
    """moetune's defaults: Megatron-Core defaults plus what Bridge's ``mixed_precision`` recipe of ``precision`` sets
    (FP8 param gather for the current-scaling and MXFP8 recipes), dropout 0 (Bridge providers of modern MoE models),
    alltoall dispatch, natural routing, expandable segments (the launch output sets it) and TE userbuffers TP overlap
    for dense models (Bridge's dense perf recipes use the ``userbuffers_*_tp{2,4,8}`` configs of
    ``megatron/bridge/training/comm_overlap.py``; off in every MoE perf recipe). SP and TP overlap follow TP in
    :func:`adapt_features`."""
    from moetune.io.effective import resolve_mixed_precision

    mp = resolve_mixed_precision(BRIDGE_MIXED_PRECISION[precision]) or {}
    return Features(precision=precision, fp8_param_gather=bool(mp.get("fp8_param_gather")),
                    tp_comm_overlap=not model.is_moe, moe_token_dispatcher_type="alltoall",
                    moe_router_force_load_balancing=False, expandable_segments=True,
                    hidden_dropout=0.0, attention_dropout=0.0)


#: the settings Megatron-Bridge's performance launcher gives every model, whatever its recipe: ``perf_recipes/
#: _common.py`` ``_benchmark_common`` (``ddp.grad_reduce_in_fp32 = False`` and ``mixed_precision.grad_reduce_in_fp32
#: = False``, ``train.manual_gc = True``, ``model.cross_entropy_fusion_impl = "te"``; ``_perf_precision`` keeps
#: ``grad_reduce_in_fp32 = False`` when a recipe swaps its precision config) over the provider default
#: ``cross_entropy_loss_fusion = True`` (``models/gpt_provider.py``); before the flat recipes the same per family in
#: ``scripts/performance/configs/*/*_llm_pretrain.py`` (e.g. ``set_llama31_common_configs``, Bridge v0.3)
PERF_COMMON: dict[str, Any] = {"grad_reduce_in_fp32": False, "manual_gc": True, "cross_entropy_loss_fusion": True,
                               "cross_entropy_fusion_impl": "te"}


def perf_common_features(model: ModelArch, precision: str) -> Features:
    """The starting features of a model that has no Bridge perf recipe in the catalog (dense Llama, a user's model):
    :func:`library_features` (the precision config's FP8 param gather, expandable segments, dense TP overlap) with the
    performance launcher's common settings :data:`PERF_COMMON` (``perf_recipes/_common.py`` ``_benchmark_common`` /
    ``_perf_precision``), which every catalog recipe already carries, so a model without a recipe is priced as NVIDIA
    launches it. One place for the published-row jobs (:func:`build_published_job`) and :func:`starting_features`."""
    return library_features(model, precision).model_copy(update=PERF_COMMON)


#: canonical precision -> precision label of the Bridge perf recipe catalog
RECIPE_PRECISION = {"bf16": "BF16", "fp16": "BF16", "fp8_cs": "FP8", "fp8_delayed": "FP8 (delayed scaling)",
                    "fp8_blockwise": "FP8 (subchannel/blockwise)", "mxfp8": "MXFP8", "nvfp4": "NVFP4"}


def find_perf_recipe(model: ModelArch, system: System, gpus: int | None, precision: str | None,
                     *, any_precision: bool = True) -> dict | None:
    """The Bridge perf recipe (pretrain) for a model on a system: the run's precision first, then (when
    ``any_precision``) any precision; the GPU count nearest ``gpus``. None when the catalog has none."""
    from moetune.catalog.recipes import find_recipe

    want = RECIPE_PRECISION.get(precision) if precision else None
    for prec in dict.fromkeys((want, None) if any_precision else (want,)):
        for name in (model.name, *model.aliases):
            rec = find_recipe(name, system.name, gpus=gpus, precision=prec)
            if rec:
                return rec
    return None


@memo(maxsize=256)
def _recipe_job_cached(name: str, system: System | None, gpus: int | None, model: ModelArch | None,
                       overrides: tuple[str, ...] = ()) -> Job:
    """The Job a recipe builds (Hydra-style ``overrides`` applied to its config first) on ``system`` / ``gpus`` /
    ``model`` (None: the recipe's own)."""
    from moetune.catalog.recipes import recipe_config
    from moetune.io.config_to_job import job_from_config
    from moetune.overrides import apply_overrides

    cfg = recipe_config(name)
    if overrides:
        from moetune.io.bridge import check_override_fields

        check_override_fields(list(overrides))  # unknown fields: Bridge rejects them, so do we
        cfg = apply_overrides(cfg, list(overrides))
        from moetune.io.effective import check_int_fields
        from moetune.rules.values import first_impossible

        check_int_fields(cfg)
        bad = first_impossible(cfg)
        if bad:
            raise InputError(f"recipe {name}: {bad}")
    try:
        return job_from_config(cfg, system=system, gpus=gpus, model=model)
    except (ValueError, TypeError) as e:  # a field the reader did not name: still one line
        from moetune.errors import validation_message

        raise InputError(f"recipe {name}: invalid value ({validation_message(e)})") from None


def recipe_job(model: ModelArch, system: System, gpus: int, precision: str) -> tuple[Job | None, list[str]]:
    """The Job of the Megatron-Bridge perf recipe for (model, system, GPUs, precision) from the recipe catalog, or
    None; the second item lists what was assumed."""
    rec = find_perf_recipe(model, system, gpus, precision)
    if not rec:
        return None, []
    try:
        rjob = _recipe_job_cached(rec["name"], system, gpus, model)
    except MoetuneError as exc:  # a recipe that cannot be read leaves the run on library defaults
        return None, [f"Bridge recipe {rec['name']} unreadable ({exc}): library defaults"]
    note = f"features from Bridge perf recipe {rec['name']}"
    if RECIPE_PRECISION.get(precision) != rec.get("precision"):
        note += f" (recipe precision {rec.get('precision')}, run precision {precision})"
    return rjob, [note]


@dataclass(frozen=True)
class Start:
    """Where a job's features start: the features, the recipe (None = library defaults) and what was assumed."""

    features: Features
    recipe: str | None
    notes: tuple[str, ...]
    recipe_layout: Layout | None = None


def starting_features(model: ModelArch, system: System, gpus: int, precision: str, recipe: str | None = None,
                      *, force_balance: bool | None = None, overrides: tuple[str, ...] = ()) -> Start:
    """The starting features of a job (module docstring): ``recipe`` None = the perf recipe for this model / system /
    precision when the catalog has one, a name = that recipe (unknown names: one-line error with the closest),
    ``none`` = library defaults. Routing: natural unless the recipe was named or ``force_balance``."""
    from moetune.catalog.recipes import get_recipe

    lib = library_features(model, precision)
    if recipe is not None and recipe.strip().lower() in RECIPE_NONE:
        return Start(lib, None, ("features: library defaults (--recipe none)",))
    if recipe is not None and recipe.strip().lower() in RECIPE_PERF_COMMON:
        return Start(perf_common_features(model, precision), None,
                     ("features: library defaults with the Bridge perf launcher's common settings "
                      "(--recipe perf-common)",))
    named = recipe is not None
    rec = get_recipe(recipe) if named else find_perf_recipe(model, system, gpus, precision)
    if rec is None:
        return Start(perf_common_features(model, precision), None,
                     (f"no Bridge perf recipe for {model.name} on {system.name} ({precision}): features from library "
                      "defaults with the Bridge perf launcher's common settings (BF16 grad reduction, manual GC, TE "
                      "cross-entropy)",))
    try:
        rjob = _recipe_job_cached(rec["name"], system, gpus, model, tuple(overrides))
    except MoetuneError as exc:
        if named:
            raise
        return Start(lib, None, (f"Bridge recipe {rec['name']} unreadable ({exc}): library defaults",))
    rf = rjob.features
    up: dict[str, Any] = {"precision": precision}
    notes = [f"features from Bridge perf recipe {rec['name']}"]
    if rf.precision != precision:
        mp = lib  # the precision recipe's own settings (FP8 param gather) for the run's precision
        up["fp8_param_gather"] = mp.fp8_param_gather
        notes[0] += f" (recipe precision {rec.get('precision')}, run precision {precision})"
    if not named and rf.moe_router_force_load_balancing:
        up["moe_router_force_load_balancing"] = False
        notes.append("routing natural (the recipe's benchmark-only force-balanced routing needs --force-balance)")
    if force_balance is not None:
        up["moe_router_force_load_balancing"] = force_balance
    return Start(rf.model_copy(update=up), rec["name"], tuple(notes), rjob.layout)


def adapt_features(feats: Features, model: ModelArch, layout: Layout, given: set[str] | frozenset[str] = frozenset(),
                   notes: list[str] | None = None) -> Features:
    """Starting features made legal for ``layout`` (dimensions in ``given`` - :meth:`FeatureChoices.given` - are the
    user's and stay): SP exactly with TP > 1 (Bridge forces it off at TP 1; MoE with TP > 1 requires it, PAR-046);
    TP comm overlap needs SP; EP overlap needs a MoE model with EP > 1, VPP when PP > 1, no full / ``moe`` recompute
    and at most one MTP layer (docs/rules.md §4.1), delayed wgrad needs EP overlap; a flex dispatcher needs an expert
    group (EP x ETP > 1); a rank capacity factor (and the paged stash) needs the HybridEP dispatcher (MOE-044); TE-scoped CUDA graphs exclude full recompute; Megatron-FSDP replaces PP (PP = 1); the CuTeDSL fused grouped MLP
    needs a MoE model with ETP 1 (the op fuser, MOE-011)."""
    up: dict[str, Any] = {"sequence_parallel": layout.tp > 1}
    f = feats
    if "tp_comm_overlap" not in given and f.tp_comm_overlap and layout.tp <= 1:
        up["tp_comm_overlap"] = False
    vpp = layout.vpp_size
    full = f.recompute_granularity == "full" or "moe" in f.recompute_modules
    if "ep_overlap" not in given and f.overlap_moe_expert_parallel_comm and (
            not model.is_moe or layout.ep <= 1 or (layout.pp > 1 and vpp <= 1) or full or model.mtp_num_layers > 1):
        up["overlap_moe_expert_parallel_comm"] = False
        if notes is not None:
            notes.append("EP overlap of the starting features off: it needs EP > 1, VPP with PP > 1, no full/moe "
                         "recompute (docs/rules.md §4.1)")
    if "delay_wgrad" not in given and f.delay_wgrad_compute and not up.get(
            "overlap_moe_expert_parallel_comm", f.overlap_moe_expert_parallel_comm):
        up["delay_wgrad_compute"] = False
    if "dispatcher" not in given and f.moe_token_dispatcher_type == "flex" and layout.ep * layout.expert_tp <= 1:
        up.update(moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend=None)
    if "cuda_graph_scope" not in given and f.recompute_granularity == "full" and f.cuda_graph_impl == "transformer_engine":
        up.update(cuda_graph_impl="none", cuda_graph_scope=())
    if "fsdp" not in given and f.use_megatron_fsdp and layout.pp > 1:
        up["use_megatron_fsdp"] = False
        if notes is not None:
            notes.append("Megatron-FSDP of the starting features off: it replaces pipeline parallelism (PP = 1)")
    if "rank_capacity_factor" not in given and f.moe_expert_rank_capacity_factor is not None and not (
            model.is_moe and up.get("moe_token_dispatcher_type", f.moe_token_dispatcher_type) == "flex"
            and f.moe_flex_dispatcher_backend == "hybridep"):
        # a rank capacity budget is HybridEP's (MOE-044); paged stashing needs it (OFF-019)
        up["moe_expert_rank_capacity_factor"] = None
        if "paged_stash" not in given:
            up["moe_paged_stash"] = False
    if "cutedsl_fused_grouped_mlp" not in given and f.cutedsl_fused_grouped_mlp and (
            not model.is_moe or layout.expert_tp > 1):
        # the TE op fuser that carries the fused grouped MLP builds no expert MLP with expert TP (MOE-011)
        up["cutedsl_fused_grouped_mlp"] = False
    if not up.get("sequence_parallel") and "tp_comm_overlap" not in given:
        up["tp_comm_overlap"] = False
    return f.model_copy(update={k: v for k, v in up.items() if getattr(f, k) != v})


# --------------------------------------------------------------------------------------------------------------
# pipeline split


@dataclass(frozen=True)
class SplitFlags:
    """The Megatron pipeline-split options a user may give (``None``/False = not given)."""

    pipeline_layout: str | None = None
    first: int | None = None
    last: int | None = None
    account_embedding: bool = False
    account_loss: bool = False

    @property
    def given(self) -> bool:
        return bool(self.pipeline_layout or self.first is not None or self.last is not None or self.account_embedding
                    or self.account_loss)


def pipeline_split(model: ModelArch, pp: int, vpp: int | None, split: SplitFlags, *, seq: int,
                   recipe_layout: Layout | None = None, notes: list[str] | None = None) -> dict[str, Any]:
    """Layout fields of the pipeline split (see the module docstring for the order). Megatron's rules are checked
    when the Layout is validated (:func:`moetune.spec.validate.layout_violation`, the rules engine's PAR-026..033
    use the same functions of :mod:`moetune.spec.pipeline`)."""
    from moetune.perfmodel.balance import balanced_layout, stage_weights
    from moetune.spec.pipeline import even_split_error

    if split.given:
        return {"pipeline_layout": split.pipeline_layout, "num_layers_in_first_pipeline_stage": split.first,
                "num_layers_in_last_pipeline_stage": split.last,
                "account_for_embedding_in_pipeline_split": split.account_embedding,
                "account_for_loss_in_pipeline_split": split.account_loss}
    v = vpp or 1
    if pp <= 1:
        return {}
    rl = recipe_layout
    if rl is not None and _recipe_split_applies(Layout(pp=pp, vpp=vpp), rl):
        out = {"pipeline_layout": rl.pipeline_layout,
               "num_layers_in_first_pipeline_stage": rl.num_layers_in_first_pipeline_stage,
               "num_layers_in_last_pipeline_stage": rl.num_layers_in_last_pipeline_stage,
               "account_for_embedding_in_pipeline_split": rl.account_for_embedding_in_pipeline_split,
               "account_for_loss_in_pipeline_split": rl.account_for_loss_in_pipeline_split}
        if notes is not None:
            desc = (f"layout {rl.pipeline_layout}" if rl.pipeline_layout else ", ".join(
                f"{k}={val}" for k, val in out.items() if k != "pipeline_layout" and val not in (None, False)))
            notes.append(f"pipeline split from the Bridge recipe ({desc})")
        return out
    if even_split_error(model.num_layers, pp, v) is None:
        return {}
    w = stage_weights(model, seq)
    text = balanced_layout(model.num_layers, pp * v, model.mtp_num_layers, pp=pp, layer_weights=w[0],
                           mtp_weight=w[1], loss_weight=w[2], embedding_weight=0.0)
    if text is None:
        return {}
    if notes is not None:
        notes.append(f"num_layers={model.num_layers} does not split evenly over PP{pp} x VPP{v}: FLOPs-balanced "
                     f"pipeline_model_parallel_layout {text} (as the planner generates; pass --pipeline-layout, "
                     "--num-layers-in-first/last-pipeline-stage or --account-for-*-in-pipeline-split to choose)")
    return {"pipeline_layout": text}


# --------------------------------------------------------------------------------------------------------------
# flags -> Job


@dataclass(frozen=True)
class JobFlags:
    """Every flag of ``moetune estimate`` that describes a job (None = not given: default or recipe value)."""

    model: str | ModelArch | None = None
    system: str | System | None = None
    gpus: int | None = None
    gbs: int | None = None
    mbs: int | None = None
    seq: int | None = None
    precision: str | None = None
    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    split: SplitFlags = SplitFlags()
    choices: FeatureChoices = FeatureChoices()
    recipe: str | None = None


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise InputError.bad_value(name, value, "a positive integer")


def _check_positive(fl: JobFlags) -> None:
    for name, val in (("--gpus", fl.gpus), ("--gbs", fl.gbs), ("--mbs", fl.mbs), ("--seq", fl.seq), ("--tp", fl.tp),
                      ("--pp", fl.pp), ("--vpp", fl.vpp), ("--cp", fl.cp), ("--ep", fl.ep), ("--etp", fl.etp),
                      ("--num-layers-in-first-pipeline-stage", fl.split.first),
                      ("--num-layers-in-last-pipeline-stage", fl.split.last)):
        _positive(name, val)


def _resolve_model_system(fl: JobFlags) -> tuple[ModelArch, System]:
    from moetune.catalog.models import get_model
    from moetune.catalog.systems import get_system

    model = fl.model if isinstance(fl.model, ModelArch) else get_model(str(fl.model))
    system = fl.system if isinstance(fl.system, System) else get_system(str(fl.system or DEFAULT_SYSTEM))
    return model, system


def _build(model: ModelArch, system: System, gpus: int, gbs: int, mbs: int, seq: int, layout_kw: dict,
           features: Features, notes: list[str]) -> Job:
    try:
        layout = Layout(**layout_kw)
        return Job(model=model, system=system, gpus=gpus, global_batch_size=gbs, micro_batch_size=mbs,
                   seq_length=seq, layout=layout, features=features, assumptions=tuple(dict.fromkeys(notes)))
    except ValueError as e:  # pydantic validation
        from moetune.errors import validation_message

        raise InputError(f"invalid job: {validation_message(e)}") from None


def job_from_flags(fl: JobFlags, overrides: tuple[str, ...] = ()) -> Job:
    """A Job from flags (catalog model / HF config.json, system, layout, features). Features start from
    :func:`starting_features` (the Bridge perf recipe of the same model / system / precision, ``fl.recipe``, or the
    library defaults), the pinned vocabulary on top, then made legal for the layout (:func:`adapt_features`)."""
    missing = [n for n, v in (("--model", fl.model), ("--gpus", fl.gpus), ("--gbs", fl.gbs), ("--seq", fl.seq))
               if v is None]
    if missing:
        raise InputError(f"missing {', '.join(missing)} (or give --recipe / --megatron-args / --bridge-config)")
    _check_positive(fl)
    model, system = _resolve_model_system(fl)
    precision = parse_precision(fl.precision or "bf16")
    start = starting_features(model, system, int(fl.gpus), precision, fl.recipe,
                              force_balance=fl.choices.force_balance, overrides=tuple(overrides))
    notes = list(start.notes)
    tp, pp, cp, ep = fl.tp or 1, fl.pp or 1, fl.cp or 1, fl.ep or 1
    vpp = fl.vpp if (fl.vpp or 1) > 1 else None
    split = pipeline_split(model, pp, vpp, fl.split, seq=int(fl.seq), recipe_layout=start.recipe_layout, notes=notes)
    lay_kw = {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "ep": ep, "etp": fl.etp, **split}
    feats = start.features.model_copy(update=choice_updates(fl.choices))
    try:
        layout = Layout(**lay_kw)
    except ValueError as e:
        from moetune.errors import validation_message

        raise InputError(f"invalid layout: {validation_message(e)}") from None
    feats = adapt_features(feats, model, layout, fl.choices.given(), notes)
    return _build(model, system, int(fl.gpus), int(fl.gbs), int(fl.mbs or 1), int(fl.seq), lay_kw, feats, notes)


def job_from_recipe(name: str, fl: JobFlags, overrides: list[str] | tuple[str, ...] = ()) -> Job:
    """A Job from a Bridge perf recipe: what the flags leave out (model, system, GPUs, batch, precision, layout and
    pipeline split) comes from the recipe (Hydra-style ``overrides`` applied to its config first), its features are the
    starting features (:func:`starting_features` with the recipe named, so its routing stays), the flags given go on
    top; then :func:`job_from_flags`."""
    from moetune.catalog.models import get_model
    from moetune.catalog.recipes import get_recipe
    from moetune.catalog.systems import get_system

    _check_positive(fl)
    rec = get_recipe(name)
    model = fl.model if fl.model is not None else rec["model"]
    arch = model if isinstance(model, ModelArch) else get_model(str(model))
    system = fl.system if isinstance(fl.system, System) else get_system(str(fl.system or rec["system"]))
    gpus = int(fl.gpus or rec["gpus"])
    base = _recipe_job_cached(rec["name"], system, gpus, arch, tuple(overrides))
    bl = base.layout
    fill: dict[str, Any] = {"model": arch, "system": system, "gpus": gpus, "recipe": rec["name"],
                            "gbs": fl.gbs or base.global_batch_size, "mbs": fl.mbs or base.micro_batch_size,
                            "seq": fl.seq or base.seq_length, "precision": fl.precision or base.features.precision}
    if not any(v is not None for v in (fl.tp, fl.pp, fl.vpp, fl.cp, fl.ep, fl.etp)) and not fl.split.given:
        fill.update(tp=bl.tp, pp=bl.pp, vpp=bl.vpp_size if bl.vpp_size > 1 else None, cp=bl.cp, ep=bl.ep, etp=bl.etp)
    else:
        fill.update(tp=fl.tp or bl.tp, pp=fl.pp or bl.pp, cp=fl.cp or bl.cp, ep=fl.ep or bl.ep,
                    vpp=fl.vpp if (fl.vpp is not None or fl.pp is not None) else (
                        bl.vpp_size if bl.vpp_size > 1 else None),
                    etp=fl.etp if fl.etp is not None else (bl.etp if fl.tp is None and fl.ep is None else None))
    full = JobFlags(**{**{f.name: getattr(fl, f.name) for f in fields(fl)}, **fill})
    return job_from_flags(full, tuple(overrides))


def job_from_files(*, megatron_args: str | None, bridge_config: str | None, overrides: list[str] | tuple[str, ...] = (),
                   system: str | None = None, gpus: int | None = None, model: str | None = None) -> Job:
    """A Job from a Megatron-LM argument file/string or a Bridge YAML with Hydra-style overrides."""
    from moetune.io.config_to_job import job_from_config

    if megatron_args and bridge_config:
        raise InputError("give either --megatron-args or --bridge-config, not both")
    if megatron_args:
        if overrides:
            raise InputError(f"unexpected argument(s) {' '.join(overrides)}: overrides apply to --bridge-config only")
        from moetune.io.megatron_args import read_megatron_args

        cfg = read_megatron_args(megatron_args)
    else:
        from moetune.io.bridge import read_bridge_config

        cfg = read_bridge_config(bridge_config, list(overrides))
    _positive("--gpus", gpus)
    from moetune.errors import validation_message
    from moetune.rules.values import first_impossible

    source = megatron_args or bridge_config
    bad = first_impossible(cfg)  # micro_batch_size: 0 must not quietly become 1
    if bad:
        raise InputError(f"{source}: {bad}")
    try:
        return job_from_config(cfg, system=system, gpus=gpus, model=model)
    except InputError as e:
        if source and source not in str(e):  # name the file the value came from
            raise InputError(f"{source}: {e}", field=e.field, value=e.value, expected=e.expected) from None
        raise
    except (ValueError, TypeError) as e:  # a reader that did not name the field: still one line, exit 2
        raise InputError(f"{source}: invalid value ({validation_message(e)})") from None


def load_job(fl: JobFlags, *, megatron_args: str | None = None, bridge_config: str | None = None,
             overrides: list[str] | tuple[str, ...] = ()) -> Job:
    """The one entry point: a Job from whichever input was given (config file, recipe, or flags)."""
    if megatron_args or bridge_config:
        if fl.recipe is not None:
            raise InputError("give either --recipe or a config file (--megatron-args / --bridge-config), not both")
        flagged = [n for n, v in (("--tp", fl.tp), ("--pp", fl.pp), ("--vpp", fl.vpp), ("--cp", fl.cp),
                                  ("--ep", fl.ep), ("--etp", fl.etp), ("--gbs", fl.gbs), ("--seq", fl.seq),
                                  ("--mbs", fl.mbs), ("--precision", fl.precision)) if v is not None]
        flagged += [f"--{k.replace('_', '-')}" for k in sorted(fl.choices.given())]
        if fl.split.given:
            flagged.append("pipeline split flags")
        if flagged:
            raise InputError(f"{', '.join(flagged)} cannot be combined with a config file; put them in the file "
                             "(or as Bridge overrides)")
        model = fl.model if isinstance(fl.model, str) or fl.model is None else fl.model.name
        system = fl.system if isinstance(fl.system, str) or fl.system is None else fl.system.name
        return job_from_files(megatron_args=megatron_args, bridge_config=bridge_config, overrides=overrides,
                              system=system, gpus=fl.gpus, model=model)
    if fl.recipe is not None and fl.recipe.strip().lower() not in RECIPE_NONE | RECIPE_PERF_COMMON:
        return job_from_recipe(fl.recipe, fl, tuple(overrides))
    if overrides:
        raise InputError(f"unexpected argument(s) {' '.join(overrides)} (overrides need --recipe or --bridge-config)")
    return job_from_flags(fl)


# --------------------------------------------------------------------------------------------------------------
# Job -> the estimate command line that rebuilds it


def _b(flag: str, on: bool) -> str:
    return f"--{flag}" if on else f"--no-{flag}"


def feature_args(f: Features) -> list[str]:
    """The feature vocabulary of ``f`` as ``estimate`` flags, every dimension explicit."""
    if f.recompute_granularity == "full":
        rec = f"full:{f.recompute_method or 'uniform'}:{f.recompute_num_layers or 1}"
    elif f.recompute_granularity == "selective":
        rec = ",".join(f.recompute_modules or ("core_attn",))
    else:
        rec = "none"
    disp = f.moe_token_dispatcher_type if f.moe_token_dispatcher_type != "flex" else (
        f.moe_flex_dispatcher_backend or "deepep")
    graphs = ",".join(f.cuda_graph_scope) if f.cuda_graph_impl != "none" and f.cuda_graph_scope else "none"
    offload = ",".join(f.offload_modules) if f.fine_grained_activation_offloading and f.offload_modules else "none"
    if f.cpu_offloading and f.cpu_offloading_num_layers:
        offload = f"layers:{f.cpu_offloading_num_layers}"
    out = [f"--precision {f.precision}", _b("fsdp", f.use_megatron_fsdp), f"--dispatcher {disp}",
           _b("ep-overlap", f.overlap_moe_expert_parallel_comm), _b("delay-wgrad", f.delay_wgrad_compute),
           _b("tp-comm-overlap", f.tp_comm_overlap), f"--recompute {rec}", f"--offload-modules {offload}",
           f"--cuda-graph-scope {graphs}"]
    if f.optimizer_cpu_offload or f.optimizer_offload_fraction:
        out.append(f"--optimizer-offload {f.optimizer_offload_fraction:g}")
    out += [_b("expandable-segments", f.expandable_segments), _b("dist-opt", f.use_distributed_optimizer),
            _b("force-balance", f.moe_router_force_load_balancing)]
    if f.moe_routing_imbalance != 1.0:
        out.append(f"--routing-imbalance {f.moe_routing_imbalance:g}")
    cap = f.moe_expert_rank_capacity_factor
    out += [f"--rank-capacity-factor {'none' if cap is None else f'{cap:g}'}", _b("paged-stash", f.moe_paged_stash)]
    out.append(_b("cutedsl-fused-grouped-mlp", f.cutedsl_fused_grouped_mlp))
    if f.task != "pretrain":
        out.append(f"--task {f.task}")
    if f.task == "lora":
        out += [f"--lora-dim {f.lora_dim}", f"--lora-alpha {f.lora_alpha}",
                f"--lora-target-modules {','.join(f.lora_target_modules)}"]
    return out


def _recipe_split_applies(lay: Layout, recipe_layout: Layout | None) -> bool:
    rl = recipe_layout
    return rl is not None and rl.pp == lay.pp and rl.vpp_size == lay.vpp_size and bool(
        rl.pipeline_layout or rl.num_layers_in_first_pipeline_stage is not None
        or rl.num_layers_in_last_pipeline_stage is not None or rl.account_for_embedding_in_pipeline_split
        or rl.account_for_loss_in_pipeline_split)


def reproduce_args(job: Job, recipe: str | None, recipe_layout: Layout | None = None) -> list[str]:
    """``moetune estimate`` arguments that rebuild ``job`` exactly from flags: model, system, batch, the whole
    layout (pipeline split included) and every feature of the vocabulary, starting from ``recipe`` (None: no recipe,
    written ``--recipe perf-common`` when ``job`` carries :data:`PERF_COMMON` - the settings outside the flag
    vocabulary come only from the start - else ``--recipe none``). A uniform split is written as an explicit layout string where the recipe's
    own split (``recipe_layout``) would otherwise apply (:func:`pipeline_split`)."""
    from moetune.spec.pipeline import layout_to_str, stage_strings

    lay = job.layout
    split = (lay.pipeline_layout or lay.num_layers_in_first_pipeline_stage is not None
             or lay.num_layers_in_last_pipeline_stage is not None or lay.account_for_embedding_in_pipeline_split
             or lay.account_for_loss_in_pipeline_split)
    if not split and lay.pp > 1 and _recipe_split_applies(lay, recipe_layout):
        lay = lay.model_copy(update={"pipeline_layout": layout_to_str(stage_strings(job.model, lay))})
    model = job.model.name
    args = [f"--model {shlex.quote(model)}", f"--system {shlex.quote(job.system.name)}", f"--gpus {job.gpus}",
            f"--gbs {job.global_batch_size}", f"--mbs {job.micro_batch_size}", f"--seq {job.seq_length}",
            f"--tp {lay.tp}", f"--pp {lay.pp}"]
    if lay.vpp and lay.vpp > 1:
        args.append(f"--vpp {lay.vpp}")
    if lay.pipeline_layout:
        args.append(f"--pipeline-layout {shlex.quote(lay.pipeline_layout)}")
    if lay.num_layers_in_first_pipeline_stage is not None:
        args.append(f"--num-layers-in-first-pipeline-stage {lay.num_layers_in_first_pipeline_stage}")
    if lay.num_layers_in_last_pipeline_stage is not None:
        args.append(f"--num-layers-in-last-pipeline-stage {lay.num_layers_in_last_pipeline_stage}")
    if lay.account_for_embedding_in_pipeline_split:
        args.append("--account-for-embedding-in-pipeline-split")
    if lay.account_for_loss_in_pipeline_split:
        args.append("--account-for-loss-in-pipeline-split")
    feats = feature_args(job.features)  # every dimension explicit, so the line rebuilds the same job
    args += [f"--cp {lay.cp}", f"--ep {lay.ep}", f"--etp {lay.expert_tp}", *feats,
             f"--recipe {recipe or _no_recipe_start(job.features)}"]
    return args


def _no_recipe_start(f: Features) -> str:
    """The ``--recipe`` value of a start without a recipe whose features are ``f``'s (:func:`reproduce_args`)."""
    return "perf-common" if all(getattr(f, k) == v for k, v in PERF_COMMON.items()) else "none"


def reproduce_command(job: Job, recipe: str | None, recipe_layout: Layout | None = None) -> str:
    """``moetune estimate …`` (one line) that gives the same time and memory as ``job``."""
    return "moetune estimate " + " ".join(reproduce_args(job, recipe, recipe_layout))


# --------------------------------------------------------------------------------------------------------------
# published performance rows


def published_task(model_name: str, task: str, release: str | None) -> tuple[dict[str, Any], str | None]:
    """(Features updates, note) of a published row's training task: :func:`task_updates` of the table's ``task``
    with the release's fine-tuning preset on top where the catalog has one
    (:func:`~moetune.catalog.release_configs.finetune_preset`: LoRA rank / alpha / targets and the preset's CUDA
    graphs); the note names the preset or says that none is known."""
    from moetune.catalog.release_configs import finetune_preset

    up = {"task": "pretrain", **task_updates(task)}
    if up["task"] == "pretrain":
        return up, None
    ft = finetune_preset(model_name, up["task"], release)
    if ft is None:
        return up, (f"no {up['task']} preset of release {release} in the catalog"
                    + (": Bridge's LoRA defaults" if up["task"] == "lora" else ""))
    return {**up, **ft[0]}, ft[1]


def build_published_job(*, model: Any, system: str, gpus: int, precision: str, gbs: int, mbs: int, seq: int, tp: int,
                        pp: int, cp: int, vp: int | None, ep: int, etp: int | None = None, fsdp: int = 0,
                        release: str | None = None, task: str = "pretrain") -> Job:
    """The Job of a published Bridge performance row (the "recipe path" of bench/steptime_accuracy.py and of
    ``moetune calibrate``): the table's layout and batch, features from the Bridge perf recipe for that
    model/system/precision when one exists (else :func:`perf_common_features`), routing force-balanced and dropless
    (the tables' footnote). With the row's ``release``, the searched features (dispatcher, CUDA graphs, EP overlap,
    recompute, offloading) are those of the workload preset the release was published with, where one has the row's
    layout and batch (:mod:`moetune.catalog.release_configs`); where the table's VP / MBS match no preset of the
    release, the VP and MBS of the publishing commit's preset with the row's parallelism, GPU count and batch
    (:func:`~moetune.catalog.release_configs.run_preset`: what the release's scripts ran). A fine-tuning row
    (``task`` ``sft`` or ``lora``, the table's ``task`` column) is priced as its task (:func:`task_updates`) with the
    release's fine-tuning preset where the catalog has it (:func:`~moetune.catalog.release_configs.finetune_preset`:
    LoRA rank, target modules, CUDA graphs); the pre-training presets do not apply to it."""
    from moetune.catalog.release_configs import preset_features, release_preset, run_preset
    from moetune.catalog.systems import get_system

    sysm = get_system(system)
    rjob, notes = recipe_job(model, sysm, gpus, precision)
    feats = rjob.features if rjob is not None else None
    preset = None
    task_up, task_note = published_task(model.name, task, release)
    if task_note:
        notes.append(task_note)
    if task_up["task"] != "pretrain":
        release = None  # the release presets are pre-training presets
    if release:
        ran = run_preset(model.name, sysm.name, precision, release, gpus=gpus, tp=tp, pp=pp, cp=cp, vp=vp, ep=ep,
                         etp=etp, gbs=gbs, mbs=mbs)
        if ran is not None:
            notes.append(ran.run_note(vp, mbs))
            vp, mbs = ran.fields["virtual_pipeline_model_parallel_size"], ran.fields["micro_batch_size"]
        preset = release_preset(model.name, sysm.name, precision, release, gpus=gpus, tp=tp, pp=pp, cp=cp, vp=vp,
                                ep=ep, etp=etp, gbs=gbs, mbs=mbs)
    pl_fields: dict[str, Any] = {}
    if rjob is not None and rjob.layout.pp == pp and rjob.layout.vpp_size == (vp or 1):
        rl = rjob.layout
        pl_fields = {"pipeline_layout": rl.pipeline_layout,
                     "num_layers_in_first_pipeline_stage": rl.num_layers_in_first_pipeline_stage,
                     "num_layers_in_last_pipeline_stage": rl.num_layers_in_last_pipeline_stage,
                     "account_for_embedding_in_pipeline_split": rl.account_for_embedding_in_pipeline_split,
                     "account_for_loss_in_pipeline_split": rl.account_for_loss_in_pipeline_split}
    if preset is not None and preset.fields.get("pp_layout"):
        # the preset's own Megatron layout string (else the recipe helper's, as the release's launcher did)
        pl_fields = {"pipeline_layout": preset.fields["pp_layout"]}
    update: dict[str, Any] = {"precision": precision, "moe_router_force_load_balancing": True,
                              "moe_expert_capacity_factor": None, "sequence_parallel": tp > 1}
    if fsdp:
        update["use_megatron_fsdp"] = True
    if vp is not None and vp > 1 and pp <= 1:
        vp = None
    if feats is None:
        feats = perf_common_features(model, precision)
        notes.append("no Bridge perf recipe for this model/system/precision: library defaults with the perf "
                     "launcher's common settings")
    if preset is not None:
        pupd, pnotes = preset_features(preset, sysm.gpu.name)
        if not model.is_moe:
            pupd = {k: v for k, v in pupd.items() if not k.startswith(("moe_", "overlap_moe", "delay_wgrad"))}
        update.update(pupd)
        notes.extend(pnotes)
    if not model.is_moe:
        update["overlap_moe_expert_parallel_comm"] = False
        if rjob is None and tp > 1:
            # Bridge's dense Llama perf recipes run TP comm overlap (userbuffers configs
            # ``userbuffers_*_tp{4,8}_*`` in megatron/bridge/training/comm_overlap.py)
            update["tp_comm_overlap"] = True
            notes.append("dense perf recipe not in the catalog: TP comm overlap on as Bridge's Llama perf recipes")
    if ep <= 1:
        update["overlap_moe_expert_parallel_comm"] = False
    update.update(task_up)
    if not (update.get("sequence_parallel") and tp > 1):
        update["tp_comm_overlap"] = False
    if update.get("overlap_moe_expert_parallel_comm", feats.overlap_moe_expert_parallel_comm) and pp > 1 and not (
            vp and vp > 1):
        update["overlap_moe_expert_parallel_comm"] = False
    if not update.get("overlap_moe_expert_parallel_comm", feats.overlap_moe_expert_parallel_comm):
        update["delay_wgrad_compute"] = False  # delayed wgrad needs EP overlap (docs/rules.md §4.1)
    feats = feats.model_copy(update=update)
    layout = Layout(tp=tp, pp=pp, vpp=vp if (vp and vp > 1) else None, cp=cp, ep=ep, etp=etp, **pl_fields)
    return Job(model=model, system=sysm, gpus=gpus, global_batch_size=gbs, micro_batch_size=mbs, seq_length=seq,
               layout=layout, features=feats, assumptions=tuple(notes))


# --------------------------------------------------------------------------------------------------------------
# config files (``moetune check`` reads configs, not Jobs)


def _load_job_json(path: Path, text: str) -> dict:
    from moetune.io.config_to_job import job_to_config
    from moetune.spec import Job

    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a JSON object (moetune job or ConfigContainer)")
    if "layout" in doc or "features" in doc or "gpus" in doc:
        try:
            job = Job.model_validate(doc.get("job", doc))
        except ValueError as e:
            from moetune.errors import validation_message

            raise InputError(f"{path}: not a valid moetune job ({validation_message(e)})") from None
        return job_to_config(job)
    from moetune.io.bridge import clean_node, unknown_field

    cfg = clean_node(doc)
    if "model" not in cfg:
        raise InputError(f"{path}: no 'model' section; expected a moetune job or a ConfigContainer")
    unknown_field(cfg, None, str(path))
    cfg.setdefault("frontend", "bridge")
    return cfg


def load_config(config_file: str | None, recipe: str | None, megatron_args: str | None,
                overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """The input config (nested ConfigContainer form) of ``moetune check``: a Bridge YAML, a Megatron-LM argument
    file / ``model_config.yaml``, a moetune job JSON or ConfigContainer JSON, or a recipe; Hydra-style
    ``overrides`` applied on top (on a Bridge config, a field Bridge does not know is an error, as in Bridge)."""
    cfg = _read_config(config_file, recipe, megatron_args)
    if overrides:
        from moetune.overrides import apply_overrides

        if cfg.get("frontend", "bridge") == "bridge":
            from moetune.io.bridge import check_override_fields

            check_override_fields(list(overrides))  # model.no_such_field=1: Bridge rejects it, so do we
        cfg = apply_overrides(cfg, list(overrides))
    return cfg


def _read_config(config_file: str | None, recipe: str | None, megatron_args: str | None) -> dict:
    from moetune.io.bridge import load_bridge_dict
    from moetune.io.megatron_args import read_megatron_args

    given = [x for x in (config_file, recipe, megatron_args) if x]
    if len(given) > 1:
        raise InputError("give only one of CONFIG_FILE, --recipe, --megatron-args")
    if recipe:
        from moetune.catalog.recipes import recipe_config

        return recipe_config(recipe)
    if megatron_args:
        return read_megatron_args(megatron_args)
    if not config_file:
        raise InputError("nothing to check: give CONFIG_FILE, --recipe NAME or --megatron-args FILE")
    from moetune.files import read_text

    p = Path(config_file)
    text = read_text(p, "a Bridge YAML, Megatron-LM args / model_config.yaml or moetune job JSON")
    if not text.strip():
        raise InputError(f"{config_file}: empty file, expected a Bridge YAML, Megatron-LM args / model_config.yaml "
                         "or moetune job JSON")
    if p.suffix == ".json":
        return _load_job_json(p, text)
    stripped = text.lstrip()
    if "MODEL_ARGS" in text or stripped.startswith("--") or p.suffix in (".sh", ".txt", ".args"):
        return read_megatron_args(str(p))
    return load_bridge_dict(text, config_file)

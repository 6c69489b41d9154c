"""Embedded Megatron-Bridge performance recipes (``recipes.json``, produced by ``bench/extract_recipes.py`` from
Bridge's flat perf recipes ``src/megatron/bridge/perf_recipes/<family>/<gpu>/<model>.py`` at the commit recorded in
the file's ``source``).

``recipe_config(name)`` returns the nested ConfigContainer dict a recipe builds: the provider/bridge architecture
fields of its model (Bridge provider values), Bridge's MoE model-bridge defaults (docs/rules.md §1), then every
field the recipe assigns. It is package data: nothing outside the installed package is read.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from typing import Any

from moetune.errors import UnknownNameError
from moetune.memo import memo

#: Bridge defaults that a recipe inherits from the HF model bridge / GPTModelProvider when it does not set them
#: (docs/rules.md §1: MoE bridges set grouped GEMM + permute fusion + alltoall; providers use dropout 0, no bias;
#: GPTModelProvider enables gradient-accumulation fusion when TE is importable).
PROVIDER_DEFAULTS: dict[str, Any] = {
    "moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True, "moe_permute_fusion": True,
    "hidden_dropout": 0.0, "attention_dropout": 0.0, "add_bias_linear": False, "gradient_accumulation_fusion": True,
    "bias_dropout_fusion": False,
}


@memo(maxsize=1)
def _data() -> dict:
    """The catalog, parsed by orjson (the planner reads it on every run: 340 kB, ~2.5x faster than ``json``; the same
    objects, ``tests/test_recipes.py``)."""
    import orjson

    return orjson.loads(resources.files("moetune.catalog").joinpath("recipes.json").read_bytes())


def _expand(r: dict) -> dict:
    blocks = _data()["blocks"]
    cfg = {sec: copy.deepcopy(blocks[sec][ix]) for sec, ix in r["config"].items()}
    return {**r, "config": cfg, "env_vars": dict(blocks["env_vars"][r["env_vars"]])}


def recipes_source() -> dict:
    """Where the recipe catalog was extracted from (repository, commit, note)."""
    return _data()["source"]


def list_recipes() -> list[dict]:
    """Summary rows: name, model, task, gpus, system, gpu, precision, variant."""
    return [{k: r[k] for k in ("name", "model", "task", "gpus", "system", "gpu", "precision", "variant")}
            for r in _data()["recipes"]]


def name_key(s: str) -> str:
    """A name as the recipe catalog compares names: lower case, without ``-``, ``_``, ``.`` and spaces."""
    return s.lower().replace("-", "").replace("_", "").replace(".", "").replace(" ", "")


def get_recipe(name: str) -> dict:
    """Full recipe record (config sections expanded). Raises :class:`UnknownNameError`."""
    key = name.strip().removesuffix("()")
    for r in _data()["recipes"]:
        if r["name"] == key or r["name"] == f"{key}_config":
            return _expand(r)
    raise UnknownNameError("recipe", name, [r["name"] for r in _data()["recipes"]])


@memo(maxsize=256)
def system_identity(name: str) -> str:
    """Canonical identity of a system or GPU name: the catalog system it names (aliases resolved, so 'DGX-GB200',
    'gb200' and 'GB200-NVL72' are one system and 'DGX-B200'/'b200' another), else the normalised name itself.
    Whole-name identity, never a substring test ('b200' is not inside 'GB200')."""
    from moetune.catalog.systems import get_system
    from moetune.errors import InputError

    try:
        return name_key(get_system(name).name)
    except (UnknownNameError, InputError):
        return name_key(name)


def find_recipe(model_name: str, system_name: str, gpus: int | None = None, precision: str | None = None,
                task: str = "pretrain") -> dict | None:
    """Best matching recipe for a model on a system (GPU count / precision optional); None when there is none.
    The system matches by identity (:func:`system_identity` of the recipe's system or GPU), so a GB200 system never
    gets a B200 recipe."""
    r = _best_record(model_name, system_name, gpus, precision, task)
    return None if r is None else _expand(r)


def find_recipe_name(model_name: str, system_name: str, gpus: int | None = None, precision: str | None = None,
                     task: str = "pretrain") -> str | None:
    """The name of :func:`find_recipe`'s recipe, without expanding its config (the planner's launch output)."""
    r = _best_record(model_name, system_name, gpus, precision, task)
    return None if r is None else r["name"]


@memo(maxsize=256)
def _best_record(model_name: str, system_name: str, gpus: int | None, precision: str | None,
                 task: str) -> dict | None:
    """:func:`find_recipe`'s catalog record, not expanded (shared: read only). The planner asks for the same one
    for every candidate it reports (five launch configs)."""
    m, s = name_key(model_name), system_identity(system_name)
    p = name_key(precision) if precision else None
    cands = []
    for r in _data()["recipes"]:
        if name_key(r["model"]) != m:
            continue
        if s not in (system_identity(r["system"]), system_identity(r["gpu"])):
            continue
        if p and p != name_key(r["precision"]):
            continue
        if task and r["task"] != task:
            continue
        cands.append(r)
    if not cands:
        return None
    cands.sort(key=lambda r: (r["variant"] is not None, abs((r["gpus"] or 0) - (gpus or r["gpus"] or 0)),
                              r["gpus"] or 0))
    return cands[0]


def model_arch_fields(model: str) -> dict:
    """Bridge provider architecture fields for a recipe model name (may be empty when Bridge derives it from HF)."""
    return dict(_data()["models"].get(model, {}).get("arch", {}))


def recipe_config(name: str) -> dict:
    """Effective nested config (input form) of a recipe: arch + provider defaults + recipe fields + env vars."""
    r = get_recipe(name)
    cfg = copy.deepcopy(r["config"])
    arch = model_arch_fields(r["model"])
    if not arch:
        arch = _catalog_arch(r["model"])
    model = {**PROVIDER_DEFAULTS, **arch, **cfg.get("model", {})}
    if model.get("add_bias_linear") is None:
        model["add_bias_linear"] = False
    cfg["model"] = model
    cfg["env_vars"] = dict(r["env_vars"])
    cfg["frontend"] = "bridge"
    cfg["_meta"] = {"recipe": r["name"], "model": r["model"], "gpus": r["gpus"], "system": r["system"],
                    "gpu": r["gpu"], "precision": r["precision"], "task": r["task"], "variant": r["variant"],
                    "moe": True, "arch_unknown": "num_layers" not in arch}
    return cfg


def _catalog_arch(model: str) -> dict:
    """Architecture fields from moetune's model catalog when Bridge builds the model from a HF config."""
    from moetune.catalog.models import get_model
    from moetune.errors import MoetuneError
    from moetune.spec.model_fields import arch_to_model_fields

    try:
        return arch_to_model_fields(get_model(model))
    except MoetuneError:  # not in the catalog: architecture stays unknown
        return {}


def recipe_summary(name: str) -> dict[str, Any]:
    """One row of ``moetune recipes``: identity, layout, batch and key features of a recipe (values as the recipe
    assigns them, Bridge defaults of :data:`PROVIDER_DEFAULTS` where it assigns nothing)."""
    cfg = recipe_config(name)
    meta, m = cfg["_meta"], cfg["model"]
    ddp, co, train = cfg.get("ddp") or {}, cfg.get("comm_overlap") or {}, cfg.get("train") or {}
    layout = {"tp": m.get("tensor_model_parallel_size") or 1, "pp": m.get("pipeline_model_parallel_size") or 1,
              "vpp": m.get("virtual_pipeline_model_parallel_size"), "cp": m.get("context_parallel_size") or 1,
              "ep": m.get("expert_model_parallel_size") or 1, "etp": m.get("expert_tensor_parallel_size"),
              "pipeline_layout": m.get("pipeline_model_parallel_layout")}
    for k in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
              "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
        if m.get(k):
            layout[k] = m[k]
    disp = m.get("moe_token_dispatcher_type") or "alltoall"
    if disp == "flex":
        disp = m.get("moe_flex_dispatcher_backend") or "deepep"
    gran = m.get("recompute_granularity")
    rec = "none" if not gran else ("full" if gran == "full" else ",".join(m.get("recompute_modules") or
                                                                        ["core_attn"]))
    impl = m.get("cuda_graph_impl") or "none"
    graphs = "none" if impl == "none" else ("full_iteration" if impl == "full_iteration" else
                                            ",".join(m.get("cuda_graph_scope") or []) or impl)
    features = {"dispatcher": disp, "recompute": rec, "cuda_graph_scope": graphs,
                "ep_overlap": bool(co.get("overlap_moe_expert_parallel_comm")),
                "delay_wgrad": bool(co.get("delay_wgrad_compute")),
                "tp_comm_overlap": bool(co.get("tp_comm_overlap")) and layout["tp"] > 1,
                "fsdp": bool(ddp.get("use_megatron_fsdp")),
                "offload": ",".join(m.get("offload_modules") or []) if m.get("fine_grained_activation_offloading")
                else "none",
                "force_balance": bool(m.get("moe_router_force_load_balancing"))}
    return {"name": meta["recipe"], "model": meta["model"], "task": meta["task"], "system": meta["system"],
            "gpu": meta["gpu"], "gpus": meta["gpus"], "precision": meta["precision"], "variant": meta["variant"],
            "arch_known": not meta["arch_unknown"], "layout": layout,
            "gbs": train.get("global_batch_size"), "mbs": train.get("micro_batch_size"), "seq": m.get("seq_length"),
            "features": features}


@memo(maxsize=1)
def bridge_recipe_names() -> frozenset[str]:
    """Every recipe function name Megatron-Bridge knows: its library recipes (``bridge_recipe_names.json``, the
    public ``*_config`` functions under ``src/megatron/bridge/recipes/`` at the recorded commit) and the embedded
    perf recipes (``recipes.json``)."""
    lib = json.loads(resources.files("moetune.catalog").joinpath("bridge_recipe_names.json").read_text())["recipes"]
    return frozenset(lib) | {r["name"] for r in _data()["recipes"]}


_TASKS = ("_pretrain", "_finetune", "_sft", "_peft")


def _stem(name: str) -> str | None:
    """Model stem of a conventional recipe name: ``qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config`` -> qwen3_30b_a3b."""
    cut = [name.find(t) for t in _TASKS if name.find(t) > 0]
    return name[:min(cut)] if cut else None


def check_recipe_name(name: str) -> str:
    """``name`` if Megatron-Bridge has such a recipe function, else :class:`UnknownNameError` with the closest.

    Accepted: a known library or perf recipe, or a conventional ``<model>_<task>..._config`` name whose model stem
    Bridge has recipes for (older Bridge releases named them ``qwen3_30b_a3b_pretrain_config``)."""
    key = name.strip().removesuffix("()")
    known = bridge_recipe_names()
    if key in known or f"{key}_config" in known:
        return key
    stem = _stem(key)
    if key.endswith("_config") and stem and stem in {_stem(k) for k in known}:
        return key
    raise UnknownNameError("recipe", name, known)

"""Megatron-Bridge performance presets as published per release (``release_configs.json``, written by
``tools/extract_release_configs.py`` from the Bridge history; its ``_source`` names the files and commits).

Each published throughput row was run with the ``WorkloadBaseConfig`` preset of its release, not with today's flat
recipe: the Qwen3-30B-A3B B200 rows of 25.11 and 26.02 ran the alltoall dispatcher with router-only CUDA graphs at
MBS 1 (HybridEP arrived for B200 in 0ec1df783, 2026-02-27); the 25.11 H100 rows used PP2 VP12 with EP A2A overlap
and no graphs. :func:`release_preset` finds the preset of a row - same model, GPU, precision and release, and the
row's own parallelism and batch (which also picks among a preset's V1 / V2 versions) - and :func:`preset_features`
turns it into Features updates with the semantics of ``scripts/performance/utils/overrides.py``
(``set_workload_base_configs``) and ``apply_flex_dispatcher_backend`` of that commit.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from moetune.catalog.memory_constants import const
from moetune.catalog.recipes import name_key
from moetune.memo import memo

#: the preset token of each run precision (``<MODEL>_PRETRAIN_CONFIG_<GPU>_<PRECISION>_<VERSION>``)
PRECISION_TOKEN = {"bf16": "BF16", "fp8_cs": "FP8_CS", "fp8_delayed": "FP8_DS", "mxfp8": "FP8_MX", "nvfp4": "NVFP4"}
#: WorkloadBaseConfig fields that are modelled (the others are reported, not priced)
MODELLED = frozenset({
    "num_gpus", "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "virtual_pipeline_model_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "global_batch_size", "micro_batch_size", "use_megatron_fsdp", "cuda_graph_impl", "cuda_graph_scope",
    "cpu_offloading_num_layers", "recompute_num_layers", "recompute_modules", "moe_flex_dispatcher_backend",
    "moe_a2a_overlap", "peft", "pp_layout", "fine_grained_activation_offloading", "offload_modules", "fp8_dot_product_attention",
    "cutedsl_fused_grouped_mlp",
})


@dataclass(frozen=True)
class ReleasePreset:
    """One preset of one release: its name, the commit it was read at, its fields (defaults filled in) and the
    flex-dispatcher device gate of that commit."""

    release: str
    name: str
    commit: str
    fields: dict[str, Any]
    flex_gate: dict[str, str]

    def run_vp_mbs(self) -> tuple[int, int]:
        """(VP, micro batch) this preset runs (VP 1 without interleaving)."""
        return self.fields["virtual_pipeline_model_parallel_size"] or 1, self.fields["micro_batch_size"]

    def run_note(self, vp: int | None, mbs: int) -> str:
        """What a published row whose table VP ``vp`` / MBS ``mbs`` match no preset of its release ran instead
        (:func:`run_preset`): this preset's VP and MBS."""
        rvp, rmbs = self.run_vp_mbs()
        return (f"table VP{vp or 1} MBS{mbs} match no preset of release {self.release}: VP{rvp} MBS{rmbs} of preset "
                f"{self.name} (commit {self.commit[:9]})")


@memo(maxsize=1)
def _data() -> dict:
    return json.loads(resources.files("moetune.catalog").joinpath("release_configs.json").read_text())


def releases() -> tuple[str, ...]:
    """The releases with presets (those published before the flat recipes replaced the presets)."""
    return tuple(_data()["releases"])


def _gpu_token(system_name: str) -> str:
    """``DGX-GB200`` / ``GB200-NVL72`` -> ``GB200``."""
    return system_name.upper().removeprefix("DGX-").split("-")[0]


def release_preset(model_name: str, system_name: str, precision: str, release: str, *, gpus: int, tp: int, pp: int,
                   cp: int, vp: int | None, ep: int, etp: int | None, gbs: int, mbs: int) -> ReleasePreset | None:
    """The preset a published row of ``release`` ran with (same model, GPU and precision), in this order: the one of
    the publishing commit with the row's parallelism (TP, PP, CP, VP, EP, ETP), GPU count and batch; else the newest
    earlier version since the previous release with all of these (the table can report a run made before the presets
    moved on); else the first (by name) of the publishing commit with the row's parallelism alone (a scaled-out run
    of it). None when the release has no presets or none has the row's parallelism."""
    rel = _data()["releases"].get(release)
    tok = PRECISION_TOKEN.get(precision)
    if rel is None or tok is None:
        return None
    want = (tp, pp, cp, vp if vp and vp > 1 else None, ep, etp or 1, gpus, gbs, mbs)
    prefix = f"_PRETRAIN_CONFIG_{_gpu_token(system_name)}_{tok}_"
    model_key = name_key(model_name)
    gate = dict(rel["flex_gate"])

    def matches(group: dict, n_fields: int) -> ReleasePreset | None:
        for name in sorted(group["presets"]):
            head, sep, tail = name.partition(prefix)
            if not sep or name_key(head) != model_key or not re.fullmatch(r"V\d+|BASE_CONFIG", tail):
                continue
            f = {**rel["defaults"], **_data()["table"][group["presets"][name]]}
            if _run_key(f)[:n_fields] == want[:n_fields]:
                return ReleasePreset(release, name, group["commit"], f, dict(group.get("flex_gate", gate)))
        return None

    for group in (rel, *rel.get("earlier", ())):
        found = matches(group, 9)
        if found is not None:
            return found
    return matches(rel, 6)


def _run_key(f: dict[str, Any]) -> tuple:
    """(TP, PP, CP, VP or None, EP, ETP, GPUs, global batch, micro batch) of a preset's fields."""
    vpf = f["virtual_pipeline_model_parallel_size"]
    return (f["tensor_model_parallel_size"], f["pipeline_model_parallel_size"], f["context_parallel_size"],
            vpf if vpf and vpf > 1 else None, f["expert_model_parallel_size"], f["expert_tensor_parallel_size"] or 1,
            f["num_gpus"], f["global_batch_size"], f["micro_batch_size"])


def run_preset(model_name: str, system_name: str, precision: str, release: str, *, gpus: int, tp: int, pp: int,
               cp: int, vp: int | None, ep: int, etp: int | None, gbs: int, mbs: int) -> ReleasePreset | None:
    """The preset a published row ran with when the table's VP / MBS cells match no preset of its release: the one
    of the publishing commit with the row's model, GPU, precision, GPU count, global batch and TP / PP / CP / EP /
    ETP, whose VP and MBS are then the run's (the release's scripts ran that preset; e.g. the 26.02.01 table gives
    Llama-3-70B 64 GB300 MXFP8 as PP4 MBS2 without VP, and every GB300 FP8_MX preset of its commit cfeddcd is
    ``LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_MX_V1/V2``: PP4 VP5 MBS1). None when a preset has the row's whole layout
    and batch (:func:`release_preset` finds it) or when none has its parallelism, GPU count and batch."""
    found = release_preset(model_name, system_name, precision, release, gpus=gpus, tp=tp, pp=pp, cp=cp, vp=vp, ep=ep,
                           etp=etp, gbs=gbs, mbs=mbs)
    want = (tp, pp, cp, vp if vp and vp > 1 else None, ep, etp or 1, gpus, gbs, mbs)
    if found is not None and _run_key(found.fields) == want:
        return None
    for p in publishing_presets(model_name, system_name, precision, release, gpus=gpus, gbs=gbs):
        got = _run_key(p.fields)
        if got[:3] + got[4:8] == want[:3] + want[4:8]:
            return p
    return None


def publishing_presets(model_name: str, system_name: str, precision: str, release: str, *, gpus: int,
                       gbs: int) -> tuple[ReleasePreset, ...]:
    """The presets of ``release``'s publishing commit for this model, GPU, precision, GPU count and global batch, by
    name, whatever their parallelism: what NVIDIA's scripts ran for a row whose table layout cannot exist."""
    rel = _data()["releases"].get(release)
    tok = PRECISION_TOKEN.get(precision)
    if rel is None or tok is None:
        return ()
    prefix = f"_PRETRAIN_CONFIG_{_gpu_token(system_name)}_{tok}_"
    out = []
    for name in sorted(rel["presets"]):
        head, sep, tail = name.partition(prefix)
        if not sep or name_key(head) != name_key(model_name) or not re.fullmatch(r"V\d+|BASE_CONFIG", tail):
            continue
        f = {**rel["defaults"], **_data()["table"][rel["presets"][name]]}
        if f["num_gpus"] == gpus and f["global_batch_size"] == gbs:
            out.append(ReleasePreset(release, name, rel["commit"], f, dict(rel["flex_gate"])))
    return tuple(out)


def _flex_allowed(backend: str, gpu_name: str, gate: dict[str, str]) -> bool:
    """``apply_flex_dispatcher_backend``'s device check at the preset's commit (module doc): HybridEP on GB200/GB300
    only, or on SM 8.x-10.x (every GPU of the catalog); DeepEP on Ampere, Hopper, B200 and B300."""
    g = gpu_name.upper()
    rule = gate.get(backend, "")
    if backend == "hybridep":
        return ("GB200" in g or "GB300" in g) if rule == "GB200,GB300" else True
    if backend == "deepep":
        return not ("GB200" in g or "GB300" in g)
    return False


def preset_features(p: ReleasePreset, gpu_name: str) -> tuple[dict[str, Any], list[str]]:
    """Features updates of a preset (overrides.py semantics) and notes: CUDA graphs as set (unset = none); the flex
    dispatcher with its backend where the commit's device gate admits the GPU, else the Bridge MoE providers'
    ``alltoall``; ``moe_a2a_overlap`` = EP overlap + delayed wgrad; ``recompute_modules`` = selective,
    ``recompute_num_layers`` = full / block; a full-iteration graph with HybridEP adds the rank capacity factor and
    paged stash of Bridge's ``set_full_iter_cg_configs``; ``cpu_offloading_num_layers``; fine-grained activation offloading of
    ``offload_modules``; Megatron-FSDP; ``cutedsl_fused_grouped_mlp`` = TE's CuTeDSL fused grouped MLP (overrides.py: the
    op fuser with 32-wide GLU interleaving; ``perf_plugins.py``: ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1``), set from the
    preset either way (a preset without it ran without, whatever today's flat recipe sets)."""
    f = p.fields
    upd: dict[str, Any] = {}
    notes = [f"features of Bridge preset {p.name} (release {p.release}, commit {p.commit[:9]})"]
    impl = f.get("cuda_graph_impl")
    scope = f.get("cuda_graph_scope")
    if isinstance(scope, str):
        scope = [scope]
    if impl in (None, "none"):
        upd.update(cuda_graph_impl="none", cuda_graph_scope=())
    elif impl == "full_iteration" or (scope and "full_iteration" in scope):
        # MCore's whole-step graph: ``local`` with the ``full_iteration`` scope (Features' spelling)
        upd.update(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",))
    else:
        upd.update(cuda_graph_impl=impl, cuda_graph_scope=tuple(scope or ()))
    backend = f.get("moe_flex_dispatcher_backend")
    if backend and _flex_allowed(backend, gpu_name, p.flex_gate):
        upd.update(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend=backend)
    else:
        upd.update(moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend=None)
        if backend:
            notes.append(f"{backend} not applied on {gpu_name} at that commit (device gate): alltoall")
    # Bridge's set_full_iter_cg_configs (26.06 presets): a whole-iteration graph of a HybridEP MoE runs with the
    # static rank capacity budget and the paged stash (catalog memory.yaml full_iteration_moe_recipe); other presets
    # leave both unset
    full_moe = upd["cuda_graph_scope"] == ("full_iteration",) and upd["moe_flex_dispatcher_backend"] == "hybridep"
    companions = const("full_iteration_moe_recipe")
    upd.update(moe_expert_rank_capacity_factor=companions["moe_expert_rank_capacity_factor"] if full_moe else None,
               moe_paged_stash=bool(companions["moe_paged_stash"]) if full_moe else False)
    on = bool(f.get("moe_a2a_overlap"))
    upd.update(overlap_moe_expert_parallel_comm=on, delay_wgrad_compute=on)
    if f.get("recompute_num_layers") is not None:
        upd.update(recompute_granularity="full", recompute_method="block",
                   recompute_num_layers=int(f["recompute_num_layers"]), recompute_modules=())
    elif f.get("recompute_modules"):
        upd.update(recompute_granularity="selective", recompute_method=None, recompute_num_layers=None,
                   recompute_modules=tuple(f["recompute_modules"]))
    else:
        upd.update(recompute_granularity=None, recompute_method=None, recompute_num_layers=None, recompute_modules=())
    n_off = f.get("cpu_offloading_num_layers")
    if n_off:
        upd.update(cpu_offloading=True, cpu_offloading_num_layers=int(n_off))
    if f.get("fine_grained_activation_offloading"):
        upd.update(fine_grained_activation_offloading=True, offload_modules=tuple(f.get("offload_modules") or ()))
    if f.get("use_megatron_fsdp"):
        upd["use_megatron_fsdp"] = True
    upd["fp8_dot_product_attention"] = bool(f.get("fp8_dot_product_attention"))
    upd["cutedsl_fused_grouped_mlp"] = bool(f.get("cutedsl_fused_grouped_mlp"))
    other = sorted(k for k, v in f.items() if k not in MODELLED and v not in (None, False, 0, [], ""))
    if other:
        notes.append(f"preset fields not modelled: {', '.join(other)}")
    return upd, notes


@memo(maxsize=1)
def _finetune_data() -> dict:
    return json.loads(resources.files("moetune.catalog").joinpath("finetune_presets.json").read_text())


def finetune_preset(model_name: str, task: str, release: str | None) -> tuple[dict[str, Any], str] | None:
    """(Features updates, note) of the fine-tuning preset (``task`` ``lora`` or ``sft``) a published row of
    ``release`` ran with (``finetune_presets.json``: the LoRA rank / alpha / target modules and the CUDA graphs of
    Bridge's ``LLAMA3_70B_{LORA,SFT}_CONFIG_*`` presets); None when the catalog has none for this model, task and
    release. The pre-training presets (:func:`release_preset`) never apply to a fine-tuning row."""
    rel = _finetune_data()["releases"].get(release or "")
    if rel is None:
        return None
    for key, tasks in rel["presets"].items():
        if name_key(key) == name_key(model_name) and task in tasks:
            p = dict(tasks[task])
            name = p.pop("preset")
            for k in ("lora_target_modules", "cuda_graph_scope"):
                if k in p:
                    p[k] = tuple(p[k])
            return p, f"fine-tuning preset {name} of release {release} (commit {rel['commit'][:9]})"
    return None

"""The measurement contract of an A/B comparison (docs/domain.md §7.1).

Hold fixed everything but the variable under test: software versions; GPU count, SKU and platform; model; batch
shape (GBS, MBS, sequence); the TP/PP/VPP/CP/EP/ETP layout; precision; dispatcher; routing mode; recompute;
overlaps; CUDA-graph scope; the timing window. :func:`contract_fields` extracts those fields from whatever a run
record printed (Megatron printed arguments, Bridge configuration dump, functional-test ``model_config.yaml``),
accepting both Megatron argument names and Bridge ``section.field`` names. :func:`check_contract` compares two runs.

Field classes:

* ``hard`` — a difference makes step times incomparable (different work per step or different hardware class):
  model shape, GBS, sequence length, GPU SKU, GPU count.
* ``soft`` — execution knobs: one of them may be the variable under test; two or more differing at once break the
  one-variable-at-a-time rule.
* ``info`` — recorded for the reader (versions unknown on one side, window lengths), never a violation alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from moetune.evidence.logs.model import RunRecord

#: contract field -> (class, candidate config leaf names in priority order)
FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpu": ("hard", ("gpu", "gpu_type", "device_name")),
    "gpus": ("hard", ("world_size", "num_gpus", "gpus")),
    "num_layers": ("hard", ("num_layers",)),
    "hidden_size": ("hard", ("hidden_size",)),
    "num_experts": ("hard", ("num_moe_experts", "num_experts")),
    "moe_router_topk": ("hard", ("moe_router_topk",)),
    "moe_ffn_hidden_size": ("hard", ("moe_ffn_hidden_size",)),
    "global_batch_size": ("hard", ("global_batch_size",)),
    "seq_length": ("hard", ("seq_length", "sequence_length", "encoder_seq_length")),
    "platform": ("soft", ("platform", "cluster")),
    "micro_batch_size": ("soft", ("micro_batch_size",)),
    "tp": ("soft", ("tensor_model_parallel_size",)),
    "pp": ("soft", ("pipeline_model_parallel_size",)),
    "vpp": ("soft", ("virtual_pipeline_model_parallel_size", "num_virtual_stages_per_pipeline_rank")),
    "cp": ("soft", ("context_parallel_size",)),
    "ep": ("soft", ("expert_model_parallel_size",)),
    "etp": ("soft", ("expert_tensor_parallel_size",)),
    "pipeline_layout": ("soft", ("pipeline_model_parallel_layout",)),
    "precision": ("soft", ()),
    "dispatcher": ("soft", ()),
    "routing": ("soft", ()),
    "recompute": ("soft", ("recompute_granularity", "recompute_method", "recompute_modules", "recompute_num_layers")),
    "cuda_graph": ("soft", ("cuda_graph_impl", "cuda_graph_scope", "cuda_graph_modules", "enable_cuda_graph",
                            "external_cuda_graph")),
    "overlap": ("soft", ("overlap_grad_reduce", "overlap_param_gather", "overlap_moe_expert_parallel_comm",
                         "delay_wgrad_compute", "tp_comm_overlap", "moe_shared_expert_overlap")),
    "offload": ("soft", ("fine_grained_activation_offloading", "offload_modules", "cpu_offloading",
                         "optimizer_cpu_offload")),
    "optimizer": ("soft", ("use_distributed_optimizer", "use_precision_aware_optimizer",
                           "num_distributed_optimizer_instances")),
    "allocator": ("soft", ("PYTORCH_CUDA_ALLOC_CONF",)),
    "versions": ("info", ()),
}


#: config leaves behind the derived contract fields (precision, dispatcher, routing)
DERIVED_LEAVES: dict[str, tuple[str, ...]] = {
    "precision": ("bf16", "fp16", "fp8", "fp8_recipe", "fp4", "fp4_recipe", "mixed_precision"),
    "dispatcher": ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_enable_deepep"),
    "routing": ("moe_router_force_load_balancing", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
                "moe_router_load_balancing_type"),
}


def field_of_leaf(leaf: str) -> str | None:
    """The contract field a config leaf belongs to."""
    for name, (_cls, leaves) in FIELDS.items():
        if leaf in leaves:
            return name
    for name, leaves in DERIVED_LEAVES.items():
        if leaf in leaves:
            return name
    return None


def _leaf_map(config: dict[str, Any]) -> dict[str, Any]:
    """``section.field`` and plain names -> value (first occurrence wins; ``model.`` beats other sections)."""
    out: dict[str, Any] = {}
    for key in sorted(config, key=lambda k: (not k.startswith(("model.", "train.")), k)):
        leaf = key.rsplit(".", 1)[-1]
        out.setdefault(leaf, config[key])
    return out


def _pick(leaves: dict[str, Any], names: tuple[str, ...]) -> Any:
    for n in names:
        if n in leaves and leaves[n] is not None:
            return leaves[n]
    return None


def _precision(leaves: dict[str, Any]) -> str | None:
    fp8 = leaves.get("fp8")
    fp4 = leaves.get("fp4")
    if fp4 not in (None, False, "None"):
        return f"fp4:{leaves.get('fp4_recipe') or 'nvfp4'}"
    if fp8 not in (None, False, "None"):
        return f"fp8:{leaves.get('fp8_recipe') or fp8}"
    mp = leaves.get("mixed_precision")
    if isinstance(mp, str):
        return mp
    if leaves.get("bf16") is True:
        return "bf16"
    if leaves.get("fp16") is True:
        return "fp16"
    return None


def contract_fields(rec: RunRecord) -> dict[str, Any]:
    """The contract fields a run record states (None = not stated in the log)."""
    leaves = _leaf_map(rec.config)
    for k in ("gpu", "platform"):
        if rec.meta.get(k):
            leaves.setdefault(k, rec.meta[k])
    out: dict[str, Any] = {}
    for name, (_cls, names) in FIELDS.items():
        if names:
            if len(names) > 1 and name in ("recompute", "cuda_graph", "overlap", "offload", "optimizer"):
                sub = {n: leaves[n] for n in names if leaves.get(n) not in (None, False, [], (), "none", "None")}
                out[name] = sub or None
            else:
                out[name] = _pick(leaves, names)
    out["precision"] = _precision(leaves)
    disp = leaves.get("moe_token_dispatcher_type")
    if disp is not None and leaves.get("moe_flex_dispatcher_backend") and disp == "flex":
        disp = f"flex:{leaves['moe_flex_dispatcher_backend']}"
    elif leaves.get("moe_enable_deepep") is True:
        disp = "flex:deepep"
    out["dispatcher"] = disp
    routing = {n: leaves[n] for n in ("moe_router_force_load_balancing", "moe_expert_capacity_factor",
                                      "moe_pad_expert_input_to_capacity", "moe_router_load_balancing_type")
               if leaves.get(n) not in (None, False)}
    out["routing"] = routing or None
    if out.get("global_batch_size") is None and len(rec.iterations):
        import numpy as np

        g = rec.iterations.col("gbs")
        g = g[np.isfinite(g)]
        if len(g):
            out["global_batch_size"] = int(np.median(g))
    out["versions"] = dict(rec.versions) or None
    return out


@dataclass
class ContractItem:
    field: str
    cls: str
    a: Any
    b: Any

    def describe(self) -> str:
        return f"{self.field}: {self.a!r} -> {self.b!r}"


@dataclass
class ContractCheck:
    """Result of :func:`check_contract`: ``ok`` is False when the comparison breaks the contract."""

    ok: bool
    violations: list[str] = field(default_factory=list)
    differences: list[ContractItem] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["differences"] = [asdict(x) for x in self.differences]
        return d


def _norm(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return tuple(_norm(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _norm(x)) for k, x in v.items()))
    if isinstance(v, str):
        return v.strip().lower()
    return v


def check_contract(fa: dict[str, Any], fb: dict[str, Any], *, window_a: int, window_b: int,
                   min_samples: int = 3) -> ContractCheck:
    """Compare the contract fields of two runs and their window sizes (samples in each steady window)."""
    chk = ContractCheck(ok=True)
    soft_diffs: list[ContractItem] = []
    for name, (cls, _names) in FIELDS.items():
        a, b = fa.get(name), fb.get(name)
        if a is None and b is None:
            continue
        if a is None or b is None:
            chk.unknown.append(f"{name}: stated only in {'B' if a is None else 'A'} ({a if a is not None else b!r})")
            continue
        if name == "versions":
            for comp in sorted(set(a) & set(b)):
                if a[comp] != b[comp]:
                    soft_diffs.append(ContractItem(f"version:{comp}", "soft", a[comp], b[comp]))
            continue
        if _norm(a) != _norm(b):
            item = ContractItem(name, cls, a, b)
            chk.differences.append(item)
            if cls == "hard":
                chk.violations.append(f"{item.describe()} (changes the work per step or the hardware class)")
            else:
                soft_diffs.append(item)
    for item in soft_diffs:
        if item not in chk.differences:
            chk.differences.append(item)
    if len(soft_diffs) > 1:
        chk.violations.append("more than one variable changed at once: " + ", ".join(d.field for d in soft_diffs))
    for label, n in (("A", window_a), ("B", window_b)):
        if n < min_samples:
            chk.violations.append(f"window {label}: {n} steady samples (need >= {min_samples})")
    if window_a and window_b and max(window_a, window_b) > 4 * min(window_a, window_b):
        chk.notes.append(f"window lengths differ a lot ({window_a} vs {window_b} samples)")
    chk.ok = not chk.violations
    return chk

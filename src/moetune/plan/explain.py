"""Why one candidate beats the next: the largest differing step-time terms, and what would free memory on one job
(``estimate --explain``): the model (:mod:`moetune.perfmodel`) computes, this module compares and suggests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moetune.catalog.memory_constants import const
from moetune.errors import MoetuneError
from moetune.perfmodel.activations import RECOMPUTE_MODULES
from moetune.perfmodel.memory import MemoryEstimate, estimate_memory
from moetune.spec.job import Job
from moetune.spec.validate import validate_job


def flatten_walls(time_est: Any) -> dict[str, float]:
    """``{wall or sub-wall name: seconds}`` from a time estimate's ``walls`` (nested dicts allowed)."""
    walls = time_est.walls if not isinstance(time_est, dict) else time_est.get("walls", {})
    if hasattr(walls, "model_dump"):
        walls = walls.model_dump()
    out: dict[str, float] = {}

    def visit(prefix: str, v: Any) -> None:
        if hasattr(v, "model_dump"):
            v = v.model_dump()
        if isinstance(v, dict):
            if "seconds" in v and isinstance(v["seconds"], int | float):
                out[prefix] = float(v["seconds"])
            for kk, vv in v.items():
                if kk in ("seconds", "share", "fraction"):
                    continue
                if isinstance(vv, dict | int | float) or hasattr(vv, "model_dump"):
                    visit(f"{prefix}.{kk}" if prefix else kk, vv)
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[prefix] = float(v)

    visit("", walls)
    return out


def why_better(a: Any, b: Any, *, top: int = 3) -> dict[str, Any]:
    """Compare candidate ``a`` (ranked higher) with ``b``: step-time gain and the largest differing wall terms."""
    wa, wb = flatten_walls(a.time), flatten_walls(b.time)
    diffs = sorted(((k, wb.get(k, 0.0) - wa.get(k, 0.0)) for k in set(wa) | set(wb)),
                   key=lambda kv: -abs(kv[1]))
    # keep leaf-most names first when a parent and its child carry the same delta
    terms = [{"term": k, "delta_s": round(d, 6)} for k, d in diffs if abs(d) > 1e-9][:top]
    layout_diff = {k: (getattr(a.layout, k), getattr(b.layout, k)) for k in
                   ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs") if getattr(a.layout, k) != getattr(b.layout, k)}
    fa, fb = a.job.features, b.job.features
    feat_diff = {k: (getattr(fa, k), getattr(fb, k)) for k in type(fa).model_fields if getattr(fa, k) != getattr(fb, k)}
    from moetune.plan.ties import within_noise

    return {
        "within_noise": within_noise(a, b),
        "vs_next_step_time_s": round(b.step_time_s - a.step_time_s, 6),
        "vs_next_pct": round(100.0 * (b.step_time_s - a.step_time_s) / b.step_time_s, 3) if b.step_time_s else 0.0,
        "layout_differences": {k: list(v) for k, v in layout_diff.items()},
        "feature_differences": {k: [_j(v[0]), _j(v[1])] for k, v in feat_diff.items()},
        "largest_terms": terms,
    }


def _j(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


@dataclass(slots=True)
class Suggestion:
    """One change that frees memory on the binding rank (``estimate --explain``)."""

    action: str  #: "expandable_segments" | "recompute" | "layout" | "offload"
    detail: str
    frees_gib: float
    cost: str


def explain_memory(job: Job, est: MemoryEstimate | None = None) -> list[Suggestion]:
    """What would free the most memory next, in the workflow order (docs/domain.md §6.1, S:mem):
    expandable_segments (when fragmentation is large), selective recompute modules ranked by GiB freed per relative
    cost, layout changes (more PP / EP), offloading last. Each with the GiB it frees on the binding rank."""
    est = est or estimate_memory(job)
    b = est.binding_stage
    base = est.stages[b]
    f = job.features
    out: list[Suggestion] = []
    frag = base.components.get("fragmentation", 0.0)
    gap_matters = frag >= const("explain_min_fragmentation_gib") or (
        not est.fits and base.device_gib - frag <= est.capacity_gib - est.headroom_gib)
    if not f.expandable_segments and gap_matters:
        new = estimate_memory(job.with_(features=f.model_copy(update={"expandable_segments": True})))
        out.append(Suggestion("expandable_segments", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                              base.device_gib - new.stages[b].device_gib, "free (not with --use-nccl-ub)"))
    if f.recompute_granularity != "full":
        costs = const("recompute_relative_cost")
        have = set(f.recompute_modules) if f.recompute_granularity == "selective" else set()
        recs = []
        for mod in RECOMPUTE_MODULES:
            if mod in have:
                continue
            if mod == "mla_up_proj" and not job.model.multi_latent_attention:
                continue
            if mod in ("moe", "moe_act", "shared_experts") and not job.model.is_moe:
                continue
            if mod == "shared_experts" and not job.model.moe_shared_expert_intermediate_size:
                continue
            feat = f.model_copy(update={"recompute_granularity": "selective",
                                        "recompute_modules": tuple(sorted(have | {mod}))})
            new = estimate_memory(job.with_(features=feat))
            freed = base.device_gib - new.stages[b].device_gib
            if freed > 0.01:
                recs.append((freed / costs.get(mod, 0.5), Suggestion(
                    "recompute", f"add '{mod}' to recompute_modules", freed,
                    f"~{costs.get(mod, 0.5):.0%} extra forward compute of the module")))
        out.extend(s for _, s in sorted(recs, key=lambda x: -x[0]))
    lay = job.layout
    for label, change in (("pp", {"pp": lay.pp * 2}), ("ep", {"ep": lay.ep * 2})):
        if label == "ep" and not job.model.is_moe:
            continue
        try:
            j2 = job.with_(layout=lay.model_copy(update=change))
            validate_job(j2)
            new = estimate_memory(j2)
        except MoetuneError:  # an invalid neighbour layout is simply not suggested
            continue
        freed = base.device_gib - max(s.device_gib for s in new.stages)
        if freed > 0.01:
            out.append(Suggestion("layout", f"{label.upper()} {getattr(lay, label)} -> {change[label]}", freed,
                                  "more pipeline bubble" if label == "pp" else "more all-to-all traffic"))
    if job.model.is_moe and not f.fine_grained_activation_offloading:
        feat = f.model_copy(update={"fine_grained_activation_offloading": True,
                                    "offload_modules": ("expert_fc1", "moe_act")})
        new = estimate_memory(job.with_(features=feat))
        freed = base.device_gib - new.stages[b].device_gib
        if freed > 0.01:
            out.append(Suggestion("offload", "fine_grained_activation_offloading with offload_modules "
                                  "[expert_fc1, moe_act]", freed, "~2 % throughput (S:wf), needs host bandwidth"))
    if f.use_distributed_optimizer and not f.optimizer_cpu_offload:
        feat = f.model_copy(update={"optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0})
        new = estimate_memory(job.with_(features=feat))
        freed = base.device_gib - new.stages[b].device_gib
        if freed > 0.01:
            out.append(Suggestion("offload", "optimizer_cpu_offload (fraction 1.0)", freed,
                                  "0.1-0.2 s/iter on DSV3 (S:off); best on GB200 C2C"))
    return out

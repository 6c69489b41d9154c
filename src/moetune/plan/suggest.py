"""Explanations for an impossible plan request: the closest candidates and what would make it fit."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from moetune.plan.search import request_headroom
from moetune.plan.space import SpaceLimits, enumerate_layouts


def _any_layout(req, gpus: int) -> bool:
    lim = SpaceLimits(mbs_options=req.mbs_options, fix=dict(req.fix))
    return next(iter(enumerate_layouts(req.model, req.system, gpus, req.global_batch_size, req.seq_length, lim)),
                None) is not None


def suggestions_for_impossible(res) -> dict[str, Any]:
    """Closest candidates (smallest memory overflow) and concrete changes that would make the request fit."""
    req = res.request
    info: dict[str, Any] = {"closest": [], "what_would_fit": []}
    if res.layouts == 0:
        info["summary"] = (f"no layout divides {req.gpus} GPUs for {req.model.name} with GBS {req.global_batch_size}"
                           f" (DP*TP*CP*PP = EDP*ETP*EP*PP = W, GBS % (MBS*DP) == 0, heads % TP, experts % EP)")
        for g in _nearby_gpu_counts(req.gpus):
            if _any_layout(req, g):
                info["what_would_fit"].append(f"use {g} GPUs (a world size some layout divides)")
                break
        if req.fix:
            info["what_would_fit"].append(f"drop or change --fix {req.fix}")
        return info
    pinned_mp = {k: v for k, v in req.fix.items() if k == "pp" and int(v) > 1}
    if req.fix.get("fsdp") and not res.closest and (pinned_mp or req.gpus <= 1):
        info["summary"] = (f"Megatron-FSDP (fsdp=1) is searched only without pipeline parallelism "
                           f"(PP = 1, DP > 1); the request pins {pinned_mp or {'gpus': req.gpus}}")
        info["what_would_fit"].append("drop fsdp=1 from --fix, or pin pp=1 with it")
        return info
    info["summary"] = (f"{res.layouts} layouts enumerated; none fits {req.system.gpu.hbm_gib:.1f} GiB with "
                       f"{request_headroom(req):.1f} GiB headroom")
    rules = getattr(res, "rejected_rules", None) or {}
    if rules:
        info["rejected_by_checker"] = dict(rules)
        info["summary"] = (f"{res.layouts} layouts enumerated; {res.rejected_by_check} fitting config(s) rejected by "
                           "the checker (" + ", ".join(f"{k} x{v}" for k, v in sorted(rules.items())) +
                           "; `moetune check` explains each)")
    from moetune.perfmodel.memory import estimate_memory

    for _over, job in res.closest[:3]:
        mem = estimate_memory(job)
        peak = max(s.device_gib for s in mem.stages)
        info["closest"].append({"layout": job.layout.short() + f" MBS{job.micro_batch_size}",
                                "peak_gib": round(peak, 2), "capacity_gib": req.system.gpu.hbm_gib,
                                "over_gib": round(peak + request_headroom(req) - req.system.gpu.hbm_gib, 2)})
    if req.max_recompute != "full":
        info["what_would_fit"].append("allow full recompute (--max-recompute full)")
    if not req.allow_offload:
        info["what_would_fit"].append("allow activation/optimizer offloading (drop --no-offload)")
    if max(req.mbs_options) > 1:
        info["what_would_fit"].append("use MBS 1 (--mbs 1)")
    if req.fix:
        info["what_would_fit"].append(f"unpin --fix {req.fix}")
    # more GPUs: the first multiple of the request that has a fitting layout
    from moetune.plan.search import plan

    for mult in (2, 4, 8):
        g = req.gpus * mult
        sub = replace(req, gpus=g, global_batch_size=max(req.global_batch_size, g), top=1, explore_graphs=False,
                      explore_overlap=False, dispatchers=req.dispatchers[:1])
        r = plan(sub)
        if r.candidates:
            c = r.candidates[0]
            info["what_would_fit"].append(
                f"use {g} GPUs (e.g. {c.job.layout.short()} fits at "
                f"{c.memory.peak_allocated_gib:.1f} GiB; GBS >= {sub.global_batch_size})")
            break
    return info


def _nearby_gpu_counts(g: int) -> list[int]:
    out = []
    p = 1
    while p < 4 * g:
        p *= 2
        if p >= g:
            out.append(p)
    return out

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
    floor = getattr(res, "memory_floor", None)
    if floor is not None:
        return _floor_suggestions(res, floor, info)
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
    _more_gpus(req, info)
    return info


def _floor_suggestions(res, floor, info: dict[str, Any]) -> dict[str, Any]:
    """A request whose memory floor (:mod:`moetune.plan.floor`) overflows: recompute and MBS cannot help, only more
    GPUs, offloading or other pins."""
    req = res.request
    info["summary"] = floor.message()
    info["memory_floor_gib"] = round(floor.gib, 2)
    info["capacity_gib"] = floor.capacity_gib
    if not req.allow_offload:
        info["what_would_fit"].append("allow optimizer offloading (drop --no-offload)")
    if req.fix:
        info["what_would_fit"].append(f"unpin --fix {req.fix}")
    _more_gpus(req, info, floor.min_gpus() or req.gpus)
    return info


def _more_gpus(req, info: dict[str, Any], at_least: int = 0) -> None:
    """More GPUs: the first multiple of the request (2x, 4x, 8x, ... up to three searched) from ``at_least`` GPUs
    that has a fitting layout (smaller multiples are answered by their memory floor without a search)."""
    from moetune.plan.search import plan

    tried = 0
    for mult in (2, 4, 8, 16, 32, 64):
        g = req.gpus * mult
        if g < at_least:
            continue
        sub = replace(req, gpus=g, global_batch_size=max(req.global_batch_size, g), top=1, explore_graphs=False,
                      explore_overlap=False, dispatchers=req.dispatchers[:1], first_fit=True, workers=1)
        r = plan(sub)
        if r.candidates:
            c = r.candidates[0]
            info["what_would_fit"].append(
                f"use {g} GPUs (e.g. {c.job.layout.short()} fits at "
                f"{c.memory.peak_allocated_gib:.1f} GiB; GBS >= {sub.global_batch_size})")
            return
        tried += 1
        if tried >= 3:
            return


def _nearby_gpu_counts(g: int) -> list[int]:
    out = []
    p = 1
    while p < 4 * g:
        p *= 2
        if p >= g:
            out.append(p)
    return out

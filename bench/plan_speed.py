"""Planner speed: DeepSeek-V3 on 1,024 H100 and on 256 GB200, full search space.

Prints candidates evaluated, seconds and candidates/s on this machine. Target: the 1,024-GPU search under 3 s
(Calculon, dense only, evaluates ~316 configs/s on the same kind of machine). Requests of >= 64 GPUs run the exact
search in min(2, CPUs) processes (``MOETUNE_WORKERS=1`` for one); "evaluated" counts priced feature variants.
"""

from __future__ import annotations

import time

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.plan.search import PlanRequest, _workers, plan

CASES = [
    ("DeepSeek-V3", "DGX-H100", 1024, 8192, 4096, ("bf16",)),
    ("DeepSeek-V3", "GB200-NVL72", 256, 4096, 4096, ("mxfp8",)),
    ("Qwen3-30B-A3B", "DGX-H100", 16, 1024, 4096, ("bf16",)),
]


def main() -> None:
    print(f"{'model':<16} {'system':<12} {'GPUs':>5} {'procs':>5} {'layouts':>8} {'evaluated':>9} {'feasible':>8} "
          f"{'pruned(mem/bound/check)':>24} {'seconds':>8} {'cand/s':>8}  top-1")
    for model, system, gpus, gbs, seq, precs in CASES:
        req = PlanRequest(model=get_model(model), system=get_system(system), gpus=gpus, global_batch_size=gbs,
                          seq_length=seq, precisions=precs, top=5)
        t0 = time.perf_counter()
        res = plan(req)
        dt = time.perf_counter() - t0
        evaluated = res.searched
        top = res.candidates[0] if res.candidates else None
        desc = (f"{top.job.layout.short()} MBS{top.layout.mbs} {top.time.step_time_s:.2f}s "
                f"{top.time.model_tflops_per_gpu:.0f} TFLOP/s") if top else "none fits"
        pr = f"{res.pruned_memory}/{res.pruned_bound}/{res.rejected_by_check}"
        print(f"{model:<16} {system:<12} {gpus:>5} {_workers(req):>5} {res.layouts:>8} {evaluated:>9} {res.feasible:>8} "
              f"{pr:>24} "
              f"{dt:>8.2f} {evaluated / dt:>8.0f}  {desc}")


if __name__ == "__main__":
    main()

"""The memory floor of a plan request: a proven lower bound on the device memory of every configuration the search
can price, computed before any search, so that a request nothing can fit is answered at once.

Bound (per GPU, for every layout, feature variant and PP rank the planner enumerates):

* **Model state.** Every parameter is held by at least one GPU, and each GPU holding it keeps its weight, its main
  gradient and its share of the optimizer state. In :mod:`moetune.perfmodel.memory` a PP rank holds the TP-split
  weights / TP, the replicated norms and router, the routed experts / (EP·ETP), the vocabulary padded for TP; its
  Megatron-FSDP and distributed-optimizer divisors (:func:`~moetune.perfmodel.memory.shard_sizes`) never exceed the
  number of GPUs that hold the same slice. Summed over all GPUs the model state is therefore at least the model state
  of the whole model on one GPU (TP = PP = CP = EP = 1, nothing sharded: :func:`~moetune.perfmodel.memory.
  weight_and_optimizer_bytes` of that job), and the most loaded GPU holds at least the mean: that sum / GPUs. This is
  the model state "at the most sharded layout" (everything divided by the world size).
* **Bytes per parameter** (:func:`~moetune.perfmodel.memory.state_bytes`) are those of the searched features that
  store the least: each precision and state mode the request allows (:func:`moetune.plan.search._state_modes`:
  Megatron-FSDP or the distributed optimizer), with optimizer CPU offloading where the search may try it. The searched
  dimensions (recompute, dispatcher, overlap, CUDA graphs, activation offloading) do not change them.
* **Runtime tail** (:func:`moetune.perfmodel.runtime_tail.tail_builder`): the per-job items every rank carries
  (library workspaces, CUDA context) and the fragmentation share of the allocated peak, at the model-state floor as
  allocated peak and no activations; the other items (NCCL communicators, dispatcher buffers, CUDA-graph pools) are
  >= 0 and taken as 0.
* **Activations** are >= 0 and taken as 0: at the most sharded layout with full recompute they are a few hundred MiB
  at most, and bounding them below needs the activation model's monotonicity in every searched dimension.

The device memory of a rank is its allocated peak (model state + activations + working set) plus the tail, each term
non-decreasing in the allocated peak (:func:`moetune.perfmodel.memory.device_peaks`), so the floor bounds it.
tests/test_plan_floor.py checks that no configuration a search prices is below the floor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from moetune.perfmodel.memory import fits_capacity, state_bytes, weight_and_optimizer_bytes
from moetune.perfmodel.runtime_tail import tail_builder
from moetune.spec.features import Features
from moetune.spec.job import Job
from moetune.spec.layout import Layout

GIB = float(1 << 30)

@dataclass(frozen=True)
class MemoryFloor:
    """The least device memory (GiB) any configuration of the request can need, and what it is made of."""

    gib: float  #: floor of the most loaded GPU's device memory
    state_gib: float  #: model state (weights + grads + optimizer) of the whole model on one GPU
    tail_gib: float  #: runtime tail at the floor (library workspaces, CUDA context, fragmentation)
    fixed_tail_gib: float  #: the part of the tail that does not grow with the allocated peak
    gpus: int
    capacity_gib: float
    headroom_gib: float
    mode: str  #: the precision / state mode that stores the least, in words
    bytes_per_param: float  #: weight + grad + optimizer bytes per parameter of that mode

    @property
    def fits(self) -> bool:
        """False: no configuration of the request can fit (the floor already overflows)."""
        return fits_capacity(self.gib, self.capacity_gib, self.headroom_gib)

    @property
    def params(self) -> float:
        """Parameters counted (the whole model, vocabulary padded)."""
        return self.state_gib * GIB / self.bytes_per_param if self.bytes_per_param else 0.0

    def min_gpus(self) -> int | None:
        """The fewest GPUs whose floor fits (the floor falls as 1 / GPUs; a lower bound on the GPUs any fitting
        configuration needs), or None when the per-job tail alone does not fit."""
        per_gpu = self.state_gib / self.gpus
        grow = (self.tail_gib - self.fixed_tail_gib) / per_gpu if per_gpu else 0.0  # fragmentation share
        room = self.capacity_gib - self.headroom_gib - self.fixed_tail_gib
        if room <= 0:
            return None
        n = max(1, math.ceil(self.state_gib * (1.0 + grow) / room))
        while n > 1 and fits_capacity(self.state_gib / (n - 1) * (1.0 + grow) + self.fixed_tail_gib,
                                      self.capacity_gib, self.headroom_gib):
            n -= 1  # rounding: the smallest n that fits
        while not fits_capacity(self.state_gib / n * (1.0 + grow) + self.fixed_tail_gib, self.capacity_gib,
                                self.headroom_gib):
            n += 1
        return n

    def message(self) -> str:
        n = self.min_gpus()
        need = f"; the model state needs at least {n} GPUs" if n and n > self.gpus else ""
        return (f"memory floor {self.gib:.1f} GiB per GPU > {self.capacity_gib:.1f} GiB HBM - "
                f"{self.headroom_gib:.1f} GiB headroom: weights + grads + optimizer state of "
                f"{self.params / 1e9:.1f} B parameters ({self.mode}, {self.state_gib:.0f} GiB) sharded over all "
                f"{self.gpus} GPUs, plus {self.tail_gib:.1f} GiB runtime; no layout, recompute or offload fits{need}")


def memory_floor(req, features: Iterable[tuple[str, Features]], headroom: float) -> MemoryFloor:
    """The :class:`MemoryFloor` of a :class:`moetune.plan.search.PlanRequest` (see module docstring), over
    ``features``: (mode in words, features) of every precision and state mode the request allows, with the least
    storing optimizer settings the search may try (:func:`moetune.plan.search.request_floor` builds them)."""
    best: MemoryFloor | None = None
    for mode, f in features:
        job = Job(model=req.model, system=req.system, gpus=1, global_batch_size=req.global_batch_size,
                  micro_batch_size=1, seq_length=req.seq_length, layout=Layout(), features=f)
        state = weight_and_optimizer_bytes(job)[0]  # one rank holds the whole model
        per_gpu = state / req.gpus
        tail_of = tail_builder(job)
        tail = sum(tail_of.totals(0.0, per_gpu).values())
        fixed = sum(tail_of.totals(0.0, 0.0).values())
        sb = state_bytes(job)
        got = MemoryFloor(gib=per_gpu / GIB + tail, state_gib=state / GIB, tail_gib=tail, fixed_tail_gib=fixed,
                          gpus=req.gpus, capacity_gib=req.system.gpu.hbm_gib, headroom_gib=headroom, mode=mode,
                          bytes_per_param=sb.weight + sb.grad + sb.optimizer)
        if best is None or got.gib < best.gib:
            best = got
    if best is None:
        raise ValueError("memory_floor: no features given")
    return best

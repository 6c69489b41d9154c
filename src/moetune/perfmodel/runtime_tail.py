"""The runtime tail: memory that formula estimators omit (docs/domain.md §3.3), each item with its assumption.

Three kinds, because the PyTorch allocator reports them differently:

* **allocated** (counted in ``torch.cuda.max_memory_allocated``): library workspaces (cuBLAS / TE cuBLASLt), CUDA-graph
  static input/output buffers.
* **reserved only** (``memory_reserved`` − allocated): allocator fragmentation (smaller with
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), CUDA-graph private pools of full-iteration graphs.
* **outside PyTorch** (only in ``nvidia-smi``): CUDA context and kernels, NCCL communicator buffers (one set per
  process group the layout creates; Megatron-Core ``parallel_state.initialize_model_parallel``), DeepEP / HybridEP
  dispatcher buffers (``cudaMalloc`` in the dispatcher init, megatron/core/transformer/moe/fused_a2a.py).

Constants come from ``catalog/memory.yaml`` with their sources.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from moetune.catalog.memory_constants import const
from moetune.spec.job import Job

GIB = float(1 << 30)
MIB = float(1 << 20)
TAIL_KINDS = ("allocated", "reserved", "non_torch")
DYNAMIC_KIND = "reserved"  #: kind of the per-rank tail items (CUDA-graph pool, fragmentation)


@dataclass(slots=True)
class TailItem:
    name: str
    gib: float
    kind: str  #: "allocated" | "reserved" | "non_torch"
    assumption: str


@dataclass(slots=True)
class RuntimeTail:
    items: list[TailItem] = field(default_factory=list)

    def total(self, kind: str) -> float:
        return sum(i.gib for i in self.items if i.kind == kind)

    def add(self, name: str, gib: float, kind: str, assumption: str) -> None:
        if gib > 0:
            self.items.append(TailItem(name, gib, kind, assumption))


def communicators(job: Job) -> dict[str, int]:
    """Process groups with more than one rank that one rank joins, with their sizes (Megatron-Core
    ``initialize_model_parallel``: tp, pp, dp(-cp), cp, ep, etp, edp, tp-ep for expert dispatch, embedding group)."""
    lay = job.layout
    w = job.gpus
    dp, edp = lay.dp(w), lay.edp(w)
    etp = lay.expert_tp
    groups = {
        "tp": lay.tp,
        "cp": lay.cp,
        "dp_cp": dp * lay.cp,
        "ep": lay.ep,
        "etp": etp,
        "edp": edp,
        "tp_ep": etp * lay.ep if lay.ep > 1 else 1,
        "pp": lay.pp,
        "embedding": 2 if lay.pp > 1 else 1,
    }
    if lay.cp > 1 and dp > 1:
        groups["dp"] = dp
    inst = job.features.num_distributed_optimizer_instances
    if inst > 1:
        groups["inter_dist_opt"] = inst
    return {k: v for k, v in groups.items() if v > 1}


def runtime_tail(job: Job, *, activation_peak_bytes: float, allocated_peak_bytes: float) -> RuntimeTail:
    """All tail items for one rank. ``activation_peak_bytes`` / ``allocated_peak_bytes`` size the full-iteration
    graph pool and the fragmentation. (Static buffers of CUDA-graphed modules are part of the allocated peak and are
    computed with the activations, in :mod:`moetune.perfmodel.memory`.)"""
    return tail_builder(job)(activation_peak_bytes, allocated_peak_bytes)


def tail_builder(job: Job):
    """:func:`runtime_tail` split into its per-job part (computed here, once) and its per-rank part (the returned
    function of ``(activation_peak_bytes, allocated_peak_bytes)``), so a caller looping over PP ranks does the per-job
    work once. Items, values and order are those of :func:`runtime_tail`."""
    f = job.features
    lib = TailItem("library_workspaces", const("library_workspaces_gib"), "allocated",
                   "cuBLAS + TE cuBLASLt workspaces and small persistent buffers (catalog library_workspaces_gib)")
    pool_factor = None
    if f.cuda_graph_impl != "none" and "full_iteration" in f.cuda_graph_scope:
        pool_factor = const("cuda_graph_full_iteration_factor") - 1.0
    frac = const("fragmentation_fraction")["expandable_segments" if f.expandable_segments else "default"]

    # assumption texts are formatted only when the items are built (the memory fit test reads the totals only)
    def frag_text() -> str:
        return (f"allocator fragmentation {frac:.0%} of the allocated peak "
                f"({'with' if f.expandable_segments else 'without'} expandable_segments)")

    after: list[tuple[str, float, str, Callable[[], str]]] = []  # (name, GiB, kind, assumption text function)
    ctx = const("cuda_context_gib")
    if ctx > 0:
        after.append(("cuda_context", ctx, "non_torch", lambda: "CUDA context + kernel images (not in torch stats)"))
    comms = communicators(job)
    nccl = len(comms) * const("nccl_mib_per_communicator") * MIB / GIB
    if nccl > 0:
        after.append((
            "nccl_buffers", nccl, "non_torch",
            lambda: f"NCCL buffers for {len(comms)} communicators "
                    f"({', '.join(f'{k}={v}' for k, v in comms.items())}), "
                    f"{const('nccl_mib_per_communicator')} MiB each"))
    if f.moe_token_dispatcher_type == "flex" and job.model.is_moe and job.layout.ep > 1:
        ep_span = job.layout.ep * job.layout.expert_tp
        internode = ep_span > job.system.nvlink_domain
        if (f.moe_flex_dispatcher_backend or "deepep") == "hybridep":
            item = ("hybridep_buffers", const("hybridep_buffer_gib"), "non_torch",
                    lambda: "HybridEP dispatch/combine buffers (catalog hybridep_buffer_gib)")
        else:
            item = ("deepep_buffers", const("deepep_buffer_gib")["internode" if internode else "intranode"],
                    "non_torch",
                    lambda: f"DeepEP NVL{' + RDMA' if internode else ''} buffers (catalog deepep_buffer_gib)")
        if item[1] > 0:
            after.append(item)
    head = [lib] if lib.gib > 0 else []

    def pool_text() -> str:
        return "full-iteration CUDA graph private pool: 1.5x the activation peak (S:cg)"

    def dynamic_gib(activation_peak_bytes: float, allocated_peak_bytes: float) -> list[tuple[str, float, Callable[[], str]]]:
        """(name, GiB, assumption function) of the per-rank items, all of kind :data:`DYNAMIC_KIND`, in item
        order."""
        out = []
        if pool_factor is not None:
            pool = pool_factor * activation_peak_bytes / GIB
            if pool > 0:
                out.append(("cuda_graph_pool", pool, pool_text))
        fr = frac * allocated_peak_bytes / GIB
        if fr > 0:
            out.append(("fragmentation", fr, frag_text))
        return out

    def build(activation_peak_bytes: float, allocated_peak_bytes: float) -> RuntimeTail:
        dyn = [TailItem(n, g, DYNAMIC_KIND, a()) for n, g, a in dynamic_gib(activation_peak_bytes,
                                                                           allocated_peak_bytes)]
        return RuntimeTail([*head, *dyn, *(TailItem(n, g, k, a()) for n, g, k, a in after)])

    # RuntimeTail.total of each kind without the RuntimeTail: the same GiB values summed in the same order
    head_of = {k: [i.gib for i in head if i.kind == k] for k in TAIL_KINDS}
    after_of = {k: [g for _, g, kind, _ in after if kind == k] for k in TAIL_KINDS}
    fixed = {k: sum([*head_of[k], *after_of[k]]) for k in TAIL_KINDS if k != DYNAMIC_KIND}

    # (allocated, reserved, non_torch) without a dict: the memory fit test calls it once per rank
    head_dyn, after_dyn = head_of[DYNAMIC_KIND], after_of[DYNAMIC_KIND]
    allocated, non_torch = fixed["allocated"], fixed["non_torch"]

    def kinds(activation_peak_bytes: float, allocated_peak_bytes: float) -> tuple[float, float, float]:
        # the GiB of :func:`dynamic_gib` (same expressions, same order) without its tuples and text functions, summed
        # in item order as RuntimeTail.total sums them
        vals = [*head_dyn]
        if pool_factor is not None:
            pool = pool_factor * activation_peak_bytes / GIB
            if pool > 0:
                vals.append(pool)
        fr = frac * allocated_peak_bytes / GIB
        if fr > 0:
            vals.append(fr)
        vals.extend(after_dyn)
        return allocated, sum(vals), non_torch

    def totals(activation_peak_bytes: float, allocated_peak_bytes: float) -> dict[str, float]:
        """GiB per kind: the fixed kinds and the dynamic one of :func:`kinds`."""
        return {**fixed, DYNAMIC_KIND: kinds(activation_peak_bytes, allocated_peak_bytes)[1]}

    build.totals = totals  # type: ignore[attr-defined]
    build.kinds = kinds  # type: ignore[attr-defined]
    build.non_torch = non_torch  # type: ignore[attr-defined]  # = kinds(...)[2], the same on every rank
    return build

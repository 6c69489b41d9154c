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

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from moetune.catalog.memory_constants import const
from moetune.memo import canonical, memo
from moetune.perfmodel.activations import sp_tokens
from moetune.perfmodel.comm import domains_spanned
from moetune.spec.features import Features
from moetune.spec.job import Job
from moetune.spec.layout import Layout
from moetune.spec.model import ModelArch
from moetune.spec.system import System

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


def hybridep_buffer_bytes(hidden: int, tokens_per_rank: float, local_experts: int, ranks_per_domain: int,
                          domains: int, *, fp8: bool = False, shared: bool = True) -> tuple[float, float]:
    """(NVLink-registered bytes, RDMA bytes) that one rank's HybridEP buffer allocates at construction: device memory
    outside the PyTorch allocator (``cudaMalloc`` / the fabric allocator), held for the whole run.

    Source: DeepEP ``hybrid-ep`` branch @94a9f8f. ``deep_ep/hybrid_ep_buffer.py::HybridEPBuffer.__init__`` splits the
    group into ``ranks_per_domain`` R (the ranks it can reach over NVLink, ``detect_accessible_ranks``) × ``domains``
    N and builds ``Configurer`` (csrc/hybrid_ep/config.cuh), which pads the token capacity to
    T = ceil(max(tokens, 512) / 64)·64 (``hybrid_ep_pad_num_of_tokens_per_rank``, combine chunk 64). With
    M = T·R·N (the worst case: every token of the group lands on this rank), H = ``hidden``, L = ``local_experts``,
    s = 2 bytes per BF16 element (1 with FP8) and FP32 probabilities / scales (one scale per 128 elements):

    * ``buffer/intranode.cu`` ``NVLCoordinator::allocate_combine_buffers``: expert-input tokens M·H·2 and probs
      M·L·R·4; ``allocate_dispatch_buffers``: the FP32 scaling factors M·(H/128)·4, and, only without
      ``use_shared_buffer`` (default True: dispatch reuses the combine buffers), tokens M·H·s and probs M·L·R·4;
    * ``extension/allgather.cu`` ``CustomAllgather::allocate_ag_buffer``: the gathered boolean routing map
      (L·R·N experts) × M;
    * N > 1, ``buffer/internode_doca.cu`` (``internode_nixl.cu`` the same) ``RDMACoordinator::allocate_dispatch_buffers``:
      the rank's own tokens T·H·s, probs T·L·R·N·4 and scales T·(H/128)·4, plus the same per remote domain
      (T·(N−1)·(H·s + L·R·4 + H/128·4)); ``allocate_combine_buffers``: two staging copies per remote domain,
      2·T·(N−1)·(H·2 + L·R·4).

    Synchronisation flags (a few KiB) are left out. Megatron-Core creates the buffer once per process at the first
    dispatch (megatron/core/transformer/moe/fused_a2a.py ``HybridEPDispatch.forward`` → ``init_hybrid_ep_buffer``
    with ``num_tokens`` = the rows of the dispatcher input, ``fp8_dispatch = False``: FP8 dispatch is not supported);
    ``moe_expert_rank_capacity_factor`` sizes only the permuted expert tensors (torch activations), not this buffer.
    Constants: catalog ``hybridep_buffer``."""
    c = const("hybridep_buffer")
    dt = const("dtype_bytes")
    chunk = c["tokens_per_chunk"]
    t = math.ceil(max(tokens_per_rank, c["min_tokens_per_rank"]) / chunk) * chunk
    m = t * ranks_per_domain * domains
    s, bf16, f32 = dt["fp8" if fp8 else "bf16"], dt["bf16"], dt["fp32"]
    scales = hidden // c["scale_block"]
    probs = local_experts * ranks_per_domain
    nvl = m * (hidden * bf16 + probs * f32) + m * scales * f32
    if not shared:
        nvl += m * (hidden * s + probs * f32)
    nvl += local_experts * ranks_per_domain * domains * m * c["routing_map_bytes"]
    rdma = 0.0
    if domains > 1:
        remote = domains - 1
        rdma = t * (hidden * s + local_experts * ranks_per_domain * domains * f32 + scales * f32)
        rdma += t * remote * (hidden * s + probs * f32 + scales * f32)
        rdma += 2 * t * remote * (hidden * bf16 + probs * f32)
    return float(nvl), float(rdma)


def _hybridep_item(job: Job) -> tuple[str, float, str, Callable[[], str]]:
    """The ``hybridep_buffers`` tail item of a flex/HybridEP job: :func:`hybridep_buffer_bytes` of its MoE
    communication group (Megatron-Core ``MoEFlexTokenDispatcher``: the ETP×EP group, ``num_local_experts`` = E / EP,
    input rows = the sequence-parallel tokens of one microbatch, :func:`moetune.perfmodel.activations.sp_tokens`)."""
    lay, f = job.layout, job.features
    group = lay.ep * lay.expert_tp
    domains, per_domain = domains_spanned(group, 1, job.system.nvlink_domain)
    tokens = sp_tokens(job.seq_length, job.micro_batch_size, lay.tp, lay.cp, f.sequence_parallel)
    local = (job.model.num_moe_experts or 0) // lay.ep
    nvl, rdma = hybridep_buffer_bytes(job.model.hidden_size, tokens, local, per_domain, domains)

    def text() -> str:
        where = f"{per_domain} ranks per NVLink domain" + (f" x {domains} domains" if domains > 1 else "")
        return (f"HybridEP buffers for {tokens:.0f} tokens per rank, {where}: {nvl / GIB:.2f} GiB NVLink"
                + (f" + {rdma / GIB:.2f} GiB RDMA" if rdma else "") + " (DeepEP hybrid-ep Configurer / NVLCoordinator"
                + (" / RDMACoordinator" if rdma else "") + ")")
    return "hybridep_buffers", (nvl + rdma) / GIB, "non_torch", text


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
    if _graph_pool(f):
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
            item = _hybridep_item(job)
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

    # (allocated, reserved, non_torch) without a dict: the memory fit test calls it once per rank. No fixed item is of
    # the dynamic kind (the library workspaces are allocated, the items after the dynamic ones non-PyTorch), so the
    # dynamic total is the sum of the items of :func:`dynamic_gib` alone
    if head_of[DYNAMIC_KIND] or after_of[DYNAMIC_KIND]:
        raise AssertionError("tail_builder: a fixed runtime-tail item of the per-rank kind")
    allocated, non_torch = fixed["allocated"], fixed["non_torch"]

    def kinds(activation_peak_bytes: float, allocated_peak_bytes: float) -> tuple[float, float, float]:
        # the GiB of :func:`dynamic_gib` (same expressions, same order) without its list, tuples and text functions,
        # summed as RuntimeTail.total sums them: from the int 0 (0 with no item, 0.0 + x = x for the first), then
        # in item order (two items: also what the compensated sum of Python >= 3.12 gives)
        dyn = 0
        if pool_factor is not None:
            pool = pool_factor * activation_peak_bytes / GIB
            if pool > 0:
                dyn = pool
        fr = frac * allocated_peak_bytes / GIB
        if fr > 0:
            dyn += fr
        return allocated, dyn, non_torch

    def totals(activation_peak_bytes: float, allocated_peak_bytes: float) -> dict[str, float]:
        """GiB per kind: the fixed kinds and the dynamic one of :func:`kinds`."""
        return {**fixed, DYNAMIC_KIND: kinds(activation_peak_bytes, allocated_peak_bytes)[1]}

    build.totals = totals  # type: ignore[attr-defined]
    build.kinds = kinds  # type: ignore[attr-defined]
    build.non_torch = non_torch  # type: ignore[attr-defined]  # = kinds(...)[2], the same on every rank
    return build


#: The Features fields :func:`tail_builder` reads (the CUDA-graph fields only through the full-iteration pool test
#: :func:`_graph_pool`); of the rest of the job it reads the layout's TP, CP, EP, ETP and PP (with the GPU count: DP
#: and EDP), the GPU count, the system's NVLink domain, the model's MoE fields and hidden size, and the sequence length
#: and microbatch size (HybridEP tokens)
TAIL_GRAPH_FEATURES = ("cuda_graph_impl", "cuda_graph_scope")
TAIL_OTHER_FEATURES = ("expandable_segments", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
                       "num_distributed_optimizer_instances", "sequence_parallel")
TAIL_READ_FEATURES = TAIL_GRAPH_FEATURES + TAIL_OTHER_FEATURES


def _graph_pool(f: Features) -> bool:
    """Whether the job keeps a full-iteration CUDA-graph pool (the one graph test of :func:`tail_builder`)."""
    return f.cuda_graph_impl != "none" and "full_iteration" in f.cuda_graph_scope


@memo(maxsize=65536)
def tail_features(f: Features) -> Features:
    """The features with every field besides :data:`TAIL_READ_FEATURES` at its default, and the CUDA-graph fields at
    theirs where the job keeps no full-iteration pool: what :func:`shared_tail_builder` is given, so the jobs whose
    tails read the same values (recompute, offloading, graph-scope and other variants) share one builder. One
    instance per value (:func:`moetune.memo.canonical`). Not validated (a projection for the tail only)."""
    keep = TAIL_READ_FEATURES if _graph_pool(f) else TAIL_OTHER_FEATURES
    return canonical(Features.model_construct(**{k: getattr(f, k) for k in keep}))


@memo(maxsize=32768)
def shared_tail_builder(m: ModelArch, system: System, gpus: int, gbs: int, mbs: int, seq: int, tp: int, cp: int,
                        ep: int, etp: int, pp: int, f: Features):
    """:func:`tail_builder` of a job with these fields (``f``: its :func:`tail_features`) and a layout of these
    sizes alone (the pipeline split, VPP and ETP default are not read: :data:`TAIL_READ_FEATURES`); read only."""
    lay = Layout.trusted(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp)
    return tail_builder(Job.trusted(model=m, system=system, gpus=gpus, global_batch_size=gbs, micro_batch_size=mbs,
                                    seq_length=seq, layout=lay, features=f))

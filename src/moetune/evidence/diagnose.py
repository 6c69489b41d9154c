"""Failure diagnosis from training logs: a closed set of finding kinds, each with evidence lines, cause, how to
confirm it and ordered fixes (docs/domain.md §7.4, docs/rules.md rule ids for configuration assertions).

Finding kinds (:data:`KINDS`):

``oom``                 CUDA caching-allocator out-of-memory (phase from the traceback; requested / allocated /
                        reserved; fragmentation when reserved-but-unallocated is large).
``nccl_timeout``        ProcessGroupNCCL watchdog timeout (op, SeqNum, process group, which parallel group it most
                        likely is, last enqueued vs completed work).
``nccl_error``          other NCCL / c10d failures (DistBackendError, ncclUniqueId fetch, NCCL WARN).
``dispatcher_failure``  MoE token dispatcher failures: DeepEP/HybridEP (``num_recv_tokens: -1``, dispatch tracebacks)
                        and all-to-all/all-gather dispatcher shape errors.
``config_assertion``    a configuration assertion / validation error; mapped to ``moetune check`` rule ids.
``python_error``        any other exception, or a traceback whose exception line is missing.
``process_killed``      launcher exit codes / signals (OOM killer, SIGTERM cascade).
``nan_loss``            NaN loss (Megatron counter, a missing loss field with no skipped iteration, or a nan/inf
                        grad norm while the counters stay 0).
``loss_spike``          a loss value far above its recent median.
``throughput_drop``     the step time shifts up inside one run with healthy loss.
``skipped_iterations``  fp16 loss-scale overflows (optimizer step skipped).
``profiler_window``     iterations inflated by a profiler capture (excluded from the steady window).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moetune.evidence.logs import RunRecord, Signal, read_run
from moetune.evidence.logs.model import FLAG_PROFILED
from moetune.evidence.steady import detected_level_shift, loss_health, nan_as_zero

KINDS = (
    "oom",
    "nccl_timeout",
    "nccl_error",
    "dispatcher_failure",
    "config_assertion",
    "python_error",
    "process_killed",
    "nan_loss",
    "loss_spike",
    "throughput_drop",
    "skipped_iterations",
    "profiler_window",
)
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
GIB = 2**30

#: reserved-but-unallocated memory counts as fragmentation when it is at least this share of the failed request,
#: or at least this share of the GPU's capacity (PyTorch's own hint: "If reserved but unallocated memory is large
#: try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
FRAG_SHARE_OF_REQUEST = 0.5
FRAG_SHARE_OF_CAPACITY = 0.05
#: loss spike: loss above median(previous LOSS_SPIKE_HISTORY) by LOSS_SPIKE_REL and by LOSS_SPIKE_MADS robust SDs
LOSS_SPIKE_HISTORY = 20
LOSS_SPIKE_MIN_HISTORY = 8
LOSS_SPIKE_REL = 0.10
LOSS_SPIKE_MADS = 6.0
#: a reduce-scatter / all-gather this large (elements) is a gradient / parameter collective, not an activation one
LARGE_COLLECTIVE_NUMEL = 10_000_000
EVIDENCE_PER_FINDING = 12


@dataclass
class Evidence:
    line: int
    text: str
    file: str | None = None


@dataclass
class Finding:
    """One diagnosis: what happened, the lines that show it, the likely cause, how to confirm, ordered fixes."""

    kind: str
    severity: str
    summary: str
    evidence: list[Evidence]
    cause: str
    confirm: str
    fixes: list[str]
    file: str = ""
    rule_ids: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind


# --------------------------------------------------------------------------------------------------- assertions
@dataclass(frozen=True)
class AssertionPattern:
    """Message pattern -> docs/rules.md rule id(s), with the fix to apply."""

    pattern: str
    rule_ids: tuple[str, ...]
    cause: str
    fixes: tuple[str, ...]


#: Configuration error messages of Megatron-Core / Megatron-Bridge mapped to docs/rules.md ids.
ASSERTION_TABLE: tuple[AssertionPattern, ...] = (
    AssertionPattern(
        r"MTP layernum only supports 1 when enabling overlap_moe_expert_parallel_comm",
        ("OVL-008",),  # the rule spec folds MOE-083 into OVL-008
        "EP communication overlap (overlap_moe_expert_parallel_comm) allows at most one MTP layer; the check "
        "rejects mtp_num_layers outside {None, 0, 1} (older Megatron-Core versions also rejected 0).",
        ("set mtp_num_layers to 1 or leave it None (use None instead of 0 on Megatron-Core versions that reject 0)",
         "or disable overlap_moe_expert_parallel_comm (and delay_wgrad_compute)"),
    ),
    AssertionPattern(
        r"[Ee]xpert data parallel size should be divisible by partial DistOpt shard factor"
        r"|data parallel size.*divisible by.*(?:partial DistOpt|num_distributed_optimizer_instances)",
        ("PAR-007",),
        "num_distributed_optimizer_instances must divide both DP·CP and the expert data-parallel size "
        "EDP = W / (ETP·EP·PP).",
        ("set ddp.num_distributed_optimizer_instances to a divisor of gcd(DP·CP, EDP) (1 always works)",
         "or change EP/ETP/PP so that EDP is a multiple of the instance count"),
    ),
    AssertionPattern(
        r"world_size \(\d+\) is not divisible by expert_tensor_model_pipeline_parallel size \(\d+\)"
        r"|not divisible by expert_tensor.*pipeline",
        ("PAR-002",),
        "The world size must be divisible by ETP·EP·PP (the expert mesh of every pipeline stage).",
        ("choose EP·ETP·PP dividing the GPU count (moetune layout shows the legal meshes)",
         "or run on a GPU count that is a multiple of ETP·EP·PP"),
    ),
    AssertionPattern(
        r"world_size \(\d+\) is not divisible by tensor_model_parallel_size|is not divisible by "
        r"(?:tensor_model_parallel_size|model[_ ]parallel[_ ]size)",
        ("PAR-001",),
        "The world size must be divisible by TP·PP·CP.",
        ("choose TP·PP·CP dividing the GPU count",),
    ),
    AssertionPattern(
        r"pipeline-model-parallel size should be greater than 1 with interleaved|virtual.*pipeline.*(?:requires|needs)"
        r".*pipeline",
        ("PAR-006",),
        "The interleaved (virtual) pipeline schedule needs PP > 1.",
        ("unset virtual_pipeline_model_parallel_size, or use PP > 1",),
    ),
    AssertionPattern(
        r"num_attention_heads.*(?:must|should) be (?:a multiple of|divisible by).*tensor|number of attention heads.*"
        r"divisible",
        ("PAR-019",),
        "num_attention_heads must be a multiple of TP.",
        ("choose TP dividing num_attention_heads",),
    ),
    AssertionPattern(
        r"num_query_groups.*(?:divisible|multiple)",
        ("PAR-020",),
        "num_query_groups must be a multiple or a divisor of TP.",
        ("choose TP that divides num_query_groups or is a multiple of it",),
    ),
    AssertionPattern(
        r"number of model chunks must be the same across all pipeline stages|num_layers.*(?:should|must) be "
        r"divisible by.*pipeline|layers.*not divisible.*pipeline",
        ("PAR-026", "PAR-027"),
        "The decoder layers do not split evenly over PP ranks and virtual stages.",
        ("use num_layers divisible by PP (and by PP·VPP with VPP), or an explicit pipeline_model_parallel_layout / "
         "num_layers_in_first/last_pipeline_stage",),
    ),
    AssertionPattern(
        r"global batch size.*(?:not divisible|divisible).*micro.?batch|micro.?batch.*data.?parallel",
        ("PAR-035",),
        "GBS must be divisible by MBS·DP (DP = W/(TP·PP·CP)).",
        ("pick GBS as a multiple of MBS·DP, or change MBS/layout",),
    ),
    AssertionPattern(
        r"sequence.?parallel.*(?:must|should|needs to) be (?:enabled|true|on).*(?:MoE|expert|tensor)|"
        r"During training, performance may degrade if MoE and tensor parallelism are enabled without also enabling "
        r"sequence parallelism",
        ("PAR-046",),
        "MoE layers with TP > 1 require sequence parallelism in training.",
        ("set sequence_parallel=True",),
    ),
    AssertionPattern(
        r"num_moe_experts.*(?:must be|should be) divisible by.*expert|experts.*not divisible by.*(?:ep|expert)",
        ("PAR-024",),
        "The number of experts must be divisible by EP.",
        ("choose EP dividing num_moe_experts",),
    ),
    AssertionPattern(
        r"[Ss]equence length.*divisible by 2\s*[x*×]?\s*(?:cp|context)",
        ("PAR-014",),
        "With CP > 1 the sequence length must be divisible by 2·CP.",
        ("pick seq_length divisible by 2·CP",),
    ),
    AssertionPattern(
        r"moe_expert_capacity_factor.*only (?:works|supported) with",
        ("MOE-040",),
        "A capacity factor only works with aux_loss / seq_aux_loss / global_aux_loss / none balancing.",
        ("change moe_router_load_balancing_type, or unset moe_expert_capacity_factor",),
    ),
    AssertionPattern(
        r"moe_pad_expert_input_to_capacity.*(?:capacity factor|moe_expert_capacity_factor)",
        ("MOE-041",),
        "Padding to capacity needs a capacity factor.",
        ("set moe_expert_capacity_factor, or turn off moe_pad_expert_input_to_capacity",),
    ),
    AssertionPattern(
        r"(?:DeepEP|deep_ep|HybridEP|hybrid_ep).*(?:not installed|is not available|No module)",
        ("MOE-057",),
        "The flex dispatcher backend's package is not installed in the container.",
        ("install DeepEP (or the hybrid-ep branch) in the container", "or use moe_token_dispatcher_type=alltoall"),
    ),
    AssertionPattern(
        r"overlap_moe_expert_parallel_comm.*(?:torch|PyTorch).*2\.6",
        ("OVL-001",),
        "EP overlap hangs with PyTorch < 2.6.",
        ("upgrade PyTorch to >= 2.6", "or disable overlap_moe_expert_parallel_comm"),
    ),
    AssertionPattern(
        r"(?:virtual pipeline|VPP|vpp).*(?:must|should|need).*(?:overlap|A2A|a2a)|overlap_moe_expert_parallel_comm.*"
        r"(?:virtual|vpp)",
        ("OVL-002",),
        "EP overlap with PP > 1 needs an interleaved (virtual) pipeline.",
        ("set virtual_pipeline_model_parallel_size (VPP) when PP > 1",),
    ),
    AssertionPattern(
        r"overlap_moe_expert_parallel_comm.*(?:expert.?model.?parallel|EP).*(?:> ?1|greater)",
        ("OVL-003",),
        "EP overlap needs expert parallelism (EP > 1).",
        ("use EP > 1 or disable overlap_moe_expert_parallel_comm",),
    ),
    AssertionPattern(
        r"overlap_moe_expert_parallel_comm.*(?:alltoall|flex)",
        ("OVL-004",),
        "EP overlap works only with the alltoall or flex dispatcher.",
        ("set moe_token_dispatcher_type to alltoall or flex",),
    ),
    AssertionPattern(
        r"overlap_moe_expert_parallel_comm.*recompute|recompute.*(?:not supported|must be).*overlap",
        ("OVL-005",),
        "EP overlap forbids full recompute, a recompute method / layer count, and whole-MoE recompute.",
        ("use selective recompute without recompute_method / recompute_num_layers and without 'moe' in "
         "recompute_modules",),
    ),
    AssertionPattern(
        r"overlap_moe_expert_parallel_comm.*(?:bf16|fp16)",
        ("OVL-006",),
        "EP overlap only supports bf16/fp16 models.",
        ("train in bf16",),
    ),
    AssertionPattern(
        r"moe_shared_expert_overlap.*overlap_moe_expert_parallel_comm|overlap_moe_expert_parallel_comm.*"
        r"shared.?expert",
        ("OVL-007",),
        "EP overlap and shared-expert overlap are mutually exclusive.",
        ("set moe_shared_expert_overlap=False",),
    ),
    AssertionPattern(
        r"EP overlap must be disabled when CUDA graph captures the whole MLP",
        ("OVL-010",),
        "A CUDA graph that captures the MoE/MLP part cannot be combined with EP overlap.",
        ("restrict cuda_graph_scope to attn / moe_router / moe_preprocess", "or disable EP overlap"),
    ),
    AssertionPattern(
        r"delay_wgrad_compute.*(?:requires|only).*overlap|overlap required",
        ("OVL-015",),
        "delay_wgrad_compute requires overlap_moe_expert_parallel_comm.",
        ("enable comm_overlap.overlap_moe_expert_parallel_comm first, or disable delay_wgrad_compute",),
    ),
    AssertionPattern(
        r"hierarchical_context_parallel_sizes",
        ("PAR-008", "PAR-009"),
        "Hierarchical CP sizes must multiply to CP and are required by cp_comm_type a2a+p2p.",
        ("set hierarchical_context_parallel_sizes with product CP, or use cp_comm_type p2p/a2a",),
    ),
    AssertionPattern(
        r"shape '\[[\d, ]+\]' is invalid for input of size 0",
        ("MOE-056",),
        "A tensor that should hold this rank's tokens is empty.",
        ("see the dispatcher_failure finding",),
    ),
)
_COMPILED = tuple((re.compile(p.pattern), p) for p in ASSERTION_TABLE)
_CONFIG_FRAMES = ("parallel_state.py", "arguments.py", "transformer_config.py", "model_parallel_config.py",
                  "config.py", "initialize.py", "validate")


def match_assertion(message: str) -> AssertionPattern | None:
    for rx, pat in _COMPILED:
        if rx.search(message):
            return pat
    return None


def _rule_fix_text(rule_id: str) -> str | None:
    """The rule's own text from the rule registry (:func:`moetune.rules.load_rules`), None for an unknown id."""
    from moetune.rules import load_rules

    r = load_rules().get(rule_id)
    return getattr(r, "text", None) if r is not None else None


# --------------------------------------------------------------------------------------------------- helpers
def _ev(sig: Signal, file: str, with_context: bool = False) -> list[Evidence]:
    out = []
    if with_context:
        out.extend(Evidence(c.line, c.text, file) for c in sig.context[-2:])
    out.append(Evidence(sig.line, sig.text, file))
    return out


def _gib(x: float | None) -> str:
    return "?" if x is None else f"{x / GIB:.2f} GiB"


def _phase(frames: Iterable[str], rec: RunRecord) -> str:
    fr = " ".join(frames).lower()
    for keys, name in (
        (("cuda_graph", "cudagraph", "graph_capture"), "CUDA-graph capture"),
        (("optimizer.step", "optimizer.py", "adam", "_copy_main_params", "distrib_optimizer"),
         "optimizer step"),
        (("backward", "allreduce_params", "reduce_scatter", "finish_grad_sync", "start_grad_sync"),
         "backward / gradient sync"),
        (("forward", "linear_with_grad", "attention", "moe_layer", "token_dispatcher"), "forward"),
        (("setup_model_and_optimizer", "get_model", "build_model", "__init__", "initialize"), "model / optimizer init"),
        (("load_checkpoint", "checkpointing"), "checkpoint load"),
        (("save_checkpoint",), "checkpoint save"),
    ):
        if any(k in fr for k in keys):
            phase = name
            break
    else:
        phase = "unknown phase (no traceback frames)"
    if len(rec.iterations):
        phase += f", after iteration {int(rec.iterations.last('iteration'))}"
    elif frames:
        phase += ", before the first logged iteration"
    return phase


def _fetch_lines(path: str, wanted: set[int]) -> dict[int, str]:
    """Text of a few line numbers (a second, prefiltered pass; stops after the last wanted line)."""
    if not wanted or not Path(path).is_file():
        return {}
    last = max(wanted)
    out: dict[int, str] = {}
    try:
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                if n in wanted:
                    out[n] = raw.decode("utf-8", "replace").rstrip("\r\n")
                if n >= last:
                    break
    except OSError:
        return out
    return out


# --------------------------------------------------------------------------------------------------- per kind
def _oom_findings(rec: RunRecord) -> list[Finding]:
    out = []
    for sig in rec.signals_of("oom"):
        d = sig.data
        req, alloc, res, cap = d.get("requested"), d.get("allocated"), d.get("reserved"), d.get("capacity")
        ru = d.get("reserved_unallocated")
        frag = ru is not None and ((req and ru >= FRAG_SHARE_OF_REQUEST * req) or
                                   (cap and ru >= FRAG_SHARE_OF_CAPACITY * cap))
        phase = _phase(sig.frames, rec)
        summary = (f"CUDA OOM{f' on rank {sig.rank}' if sig.rank is not None else ''} during {phase}: tried "
                   f"{_gib(req)}; allocated {_gib(alloc)}, reserved {_gib(res)}, capacity {_gib(cap)}")
        if frag:
            cause = (f"fragmentation: {_gib(ru)} is reserved by the caching allocator but unallocated, "
                     f"{'more than half of' if req and ru >= FRAG_SHARE_OF_REQUEST * req else 'a large share of'} "
                     "the failed request, yet no contiguous block fits")
            fixes = ["set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (first: removes most fragmentation)",
                     "selective activation recompute (recompute_granularity=selective, add modules such as "
                     "moe_act/layernorm/mla_up_proj)",
                     "change the layout to cut per-GPU state: more PP or EP, distributed optimizer, fewer "
                     "microbatches in flight (moetune estimate shows the per-rank peak)",
                     "offload: fine-grained activation offloading or optimizer CPU offload"]
            confirm = ("rerun with expandable_segments:True; if it still fails the limit is real capacity — compare "
                       "`moetune estimate` per-rank peak with the GPU memory, and run through optimizer init and "
                       "several steps")
        else:
            cause = "real capacity limit: allocated memory plus the request exceeds what the GPU can hold"
            fixes = ["selective activation recompute (or full recompute of some layers)",
                     "change the layout: more PP or EP, distributed optimizer, smaller MBS",
                     "offload: fine-grained activation offloading or optimizer CPU offload",
                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (small gain when the gap is small)"]
            confirm = ("compare the per-rank peak of `moetune estimate` with the capacity; check whether the OOM "
                       "moves rank or moves later when a fix is applied (a hot stage shifted, not solved)")
        ev = _ev(sig, rec.path)
        if sig.frames:
            ev.insert(0, Evidence(sig.line, "traceback: " + " <- ".join(reversed(sig.frames[-3:])), rec.path))
        out.append(Finding("oom", "error", summary, ev, cause, confirm, fixes, rec.path,
                           data={k: v for k, v in d.items()} | {"phase": phase, "fragmentation": bool(frag)}))
    return out


def _collective_group(op: str, nin: int | None, nout: int | None) -> tuple[str, int | None]:
    """Which parallel group a timed-out collective most likely belongs to, and the group size when derivable."""
    o = op.upper().lstrip("_")
    size = None
    if nin and nout:
        if "REDUCE_SCATTER" in o and nout and nin % nout == 0:
            size = nin // nout
        elif "ALLGATHER" in o and nin and nout % nin == 0:
            size = nout // nin
    if o.startswith("ALLTOALL"):
        if nin is not None and nout is not None and nin != nout:
            return ("EP all-to-all (MoE token dispatch/combine: uneven split sizes, NumelIn != NumelOut)", None)
        return ("all-to-all: EP token dispatch/combine in a MoE model (or CP/Ulysses all-to-all)", None)
    if "REDUCE_SCATTER" in o:
        if nin and nin >= LARGE_COLLECTIVE_NUMEL:
            return (f"DP gradient reduce-scatter (distributed optimizer) over {size or '?'} ranks", size)
        return (f"TP/SP reduce-scatter over {size or '?'} ranks", size)
    if "ALLGATHER" in o:
        if nout and nout >= LARGE_COLLECTIVE_NUMEL:
            return (f"DP parameter all-gather (distributed optimizer) over {size or '?'} ranks", size)
        return (f"small all-gather over {size or '?'} ranks (TP/SP activations, MoE allgather dispatcher or "
                "metadata)", size)
    if o == "ALLREDUCE":
        if nin is not None and nin <= 16:
            return ("scalar all-reduce (loss / token count / grad-norm / found-inf / MoE aux-loss tracker)", None)
        if nin and nin >= LARGE_COLLECTIVE_NUMEL:
            return ("DP gradient all-reduce (no distributed optimizer)", None)
        return ("all-reduce (TP activations or DP gradients)", None)
    if o in ("SEND", "RECV") or "SEND" in o or "RECV" in o:
        return ("PP send/recv (pipeline point-to-point)", None)
    if "BROADCAST" in o:
        return ("broadcast (TP-group batch broadcast or checkpoint)", None)
    return (op, None)


def _nccl_findings(rec: RunRecord) -> list[Finding]:
    wd = rec.signals_of("nccl_watchdog")
    lw = rec.signals_of("nccl_last_work")
    out = []
    groups: dict[tuple, list[Signal]] = {}
    for s in wd:
        key = (s.data["op"], s.data["seq"], s.data.get("pg"))
        groups.setdefault(key, []).append(s)
    extra = rec.signals_of("nccl_error") + rec.signals_of("nccl_connection_closed")
    for (op, seq, pg), sigs in groups.items():
        d = sigs[0].data
        where, size = _collective_group(op, d.get("numel_in"), d.get("numel_out"))
        ranks = sorted({s.rank if s.rank is not None else s.data.get("rank") for s in sigs} - {None})
        work = [s for s in lw if s.data.get("work") == seq]
        enq = max((s.data["last_enqueued"] for s in work), default=None)
        comp = min((s.data["last_completed"] for s in work), default=None)
        pg_ids = sorted({s.data.get("pg") for s in work if s.data.get("pg") is not None} | ({pg} - {None}))
        names = sorted({s.data.get("pg_name") for s in sigs + work if s.data.get("pg_name")})
        summary = (f"NCCL watchdog timeout: {op} SeqNum={seq}"
                   f"{f' (PG {pg_ids[0]})' if pg_ids else ''} ran {max(s.data['ran_ms'] for s in sigs)} ms "
                   f"(timeout {d.get('timeout_ms')} ms) on rank(s) {ranks or '?'} — {where}")
        if enq is not None:
            summary += f"; last enqueued {enq}, last completed {comp}"
        queued = (enq - comp) if enq is not None and comp is not None else None
        cause = f"a peer never joined {op} #{seq}: {where}."
        if queued is not None and queued > 1:
            cause += (f" This rank had already enqueued {queued - 1} later collective(s), so it was not stuck itself: "
                      "the lagging rank is one that never reached #" f"{seq} (it is missing from or lowest in the "
                      "watchdog lines).")
        if names:
            cause += f" Process group name(s): {', '.join(names)}."
        o = op.upper().lstrip("_")
        if o.startswith("ALLTOALL"):
            fixes = ["find the lagging rank: compare last-completed work across all ranks (flight recorder: "
                     "TORCH_NCCL_TRACE_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1)",
                     "check for a routing pathology or token imbalance on that rank (test with "
                     "moe_router_force_load_balancing=True; check capacity / drop settings)",
                     "with overlap_moe_expert_parallel_comm: PyTorch >= 2.6 (OVL-001) and the known EP-overlap "
                     "deadlocks; disable the overlap to confirm",
                     "raise distributed_timeout_minutes only once the cause is known"]
        elif o == "ALLREDUCE" and (d.get("numel_in") or 0) <= 16:
            fixes = ["look for ranks that diverged in control flow (a different number of scalar all-reduces: e.g. "
                     "the MoE aux-loss tracker with MTP + PP reducing different sizes)",
                     "find the first error on any rank (a dead rank leaves the others in this all-reduce): torchrun's "
                     "`Failures:` section, the earliest traceback",
                     "check data loading / checkpoint I/O stalls on one rank (rank 0 save_artifacts)"]
        elif "REDUCE_SCATTER" in o or "ALLGATHER" in o or o == "ALLREDUCE":
            fixes = ["find the slow or failed node: nccl-tests (all_reduce_perf / reduce_scatter_perf) on the same "
                     "nodes, NCCL_DEBUG=INFO, check NIC/IB errors",
                     "check for a straggler (host contention, thermal throttling) with a per-rank step-time survey",
                     "reduce the DDP bucket size (ddp.bucket_size) so single collectives stay short",
                     "raise distributed_timeout_minutes for very large gradient buckets"]
        else:
            fixes = ["find the rank that never reached this collective (flight recorder dumps)",
                     "raise distributed_timeout_minutes only once the cause is known"]
        ev = []
        for s in sorted(sigs + work, key=lambda x: x.line)[:EVIDENCE_PER_FINDING]:
            ev.append(Evidence(s.line, s.text, rec.path))
        for s in extra[:3]:
            ev.append(Evidence(s.line, s.text, rec.path))
        out.append(Finding("nccl_timeout", "error", summary, ev, cause,
                           "compare SeqNum / last completed work across every rank's watchdog lines; dump the NCCL "
                           "flight recorder (TORCH_NCCL_DUMP_ON_TIMEOUT=1) or py-spy the ranks that did not time "
                           "out", fixes, rec.path,
                           data={"op": op, "seq": seq, "pg": pg_ids, "pg_names": names, "group": where,
                                 "group_size": size, "ranks": ranks, "last_enqueued": enq, "last_completed": comp,
                                 "numel_in": d.get("numel_in"), "numel_out": d.get("numel_out"),
                                 "timeout_ms": d.get("timeout_ms")}))
    if not groups:
        errs = rec.signals_of("nccl_error") + rec.signals_of("nccl_unique_id") + rec.signals_of("nccl_warn")
        if errs:
            uid = rec.signals_of("nccl_unique_id")
            cause = ("nodes 2+ timed out fetching ncclUniqueId: rank 0 died or was slow (e.g. saving artifacts)"
                     if uid else "an NCCL / c10d communicator failure")
            out.append(Finding("nccl_error", "error", f"NCCL error: {errs[0].text[:160]}",
                               [Evidence(s.line, s.text, rec.path) for s in errs[:EVIDENCE_PER_FINDING]], cause,
                               "NCCL_DEBUG=INFO on a rerun; check the first failing rank's log",
                               ["inspect rank 0 / the first failing rank", "check the network fabric (nccl-tests)",
                                "raise the timeout if rank 0 is just slow"], rec.path))
    return out


_DISPATCH_FRAMES = ("token_dispatcher", "fused_a2a", "fused_dispatch", "fused_combine", "deep_ep", "hybrid_ep",
                    "moe_utils.py", "_DeepepManager", "HybridEP")


def _dispatcher_findings(rec: RunRecord, used: set[int]) -> list[Finding]:
    out = []
    deepep = rec.signals_of("deepep")
    neg = [s for s in deepep if s.data.get("num_recv_tokens") == -1 or "-1" in s.text]
    if neg:
        ranks = sorted({s.data["rank"] for s in neg if "rank" in s.data})
        out.append(Finding(
            "dispatcher_failure", "error",
            f"DeepEP internode dispatch failed: num_recv_tokens = -1 on global rank(s) {ranks or '?'} "
            "(CPU-side timeout waiting for the token counts)",
            [Evidence(s.line, s.text, rec.path) for s in neg[:EVIDENCE_PER_FINDING]],
            "internode (RDMA / NVSHMEM) transport failure: the receiving rank never saw its peers' token counts, so "
            "DeepEP's CPU wait timed out with the -1 sentinel",
            "run DeepEP's internode test on the same nodes; check NVSHMEM/IBGDA initialisation messages and the NIC "
            "mapping of each GPU",
            ["use NVSHMEM >= 3.5 (its transport fallback) and set NVSHMEM_IB_ENABLE_IBGDA to match the fabric",
             "set DEEP_EP_DEVICE_TO_HCA_MAPPING so every GPU uses its own NIC",
             "fall back to moe_token_dispatcher_type=alltoall to confirm the rest of the job is healthy"],
            rec.path, data={"ranks": ranks}))
        used.update(s.line for s in neg)
    for sig in rec.signals:
        if sig.line in used or sig.kind not in ("exception", "traceback_unterminated"):
            continue
        frames = " ".join(sig.frames)
        ctx = " ".join(c.text for c in sig.context)
        in_dispatch = any(k in frames for k in _DISPATCH_FRAMES) or "hidden_shape" in ctx or \
            "token_dispatcher" in ctx or "dispatch(" in ctx
        if not in_dispatch:
            continue
        msg = sig.data.get("message", "")
        deep = any(k in frames for k in ("fused_dispatch", "fused_combine", "deep_ep", "hybrid_ep", "fused_a2a"))
        if sig.kind == "traceback_unterminated":
            summary = ("MoE dispatcher failure inside " + ("DeepEP/HybridEP fused dispatch" if deep else
                       "the token dispatcher") + f" (traceback cut before its exception; last frame {sig.frames[-1]})")
            cause = ("the failure is inside the flex dispatcher's fused dispatch kernel (DeepEP/HybridEP): typical "
                     "causes are transport/IBGDA configuration (e.g. unsupported queue-pair settings), buffer sizing "
                     "or an unsupported GPU/NIC combination" if deep else "the token dispatcher raised")
        else:
            summary = f"MoE token dispatcher failure: {sig.data.get('type')}: {msg}"
            if "size 0" in msg:
                cause = ("the dispatcher returned no tokens on this rank where the un-permute reshape (hidden_shape) "
                         "expected [tokens, batch, hidden]: an expert/tensor-parallel group mismatch (TP vs ETP vs "
                         "EP), or an empty all-to-all result")
            else:
                cause = "the token dispatcher raised while permuting/communicating tokens"
        fixes = (["check the DeepEP/HybridEP build and transport settings (NVSHMEM, IBGDA, NIC mapping); run "
                  "DeepEP's own tests on the nodes",
                  "check GPU support for the backend (MOE-058/MOE-059: DeepEP needs sm80/sm90/B200/B300)",
                  "fall back to moe_token_dispatcher_type=alltoall to isolate the dispatcher"] if deep else
                 ["run `moetune check` on the config: TP/ETP/EP layout rules (PAR-002, PAR-023, MOE-056)",
                  "switch dispatcher (alltoall <-> allgather) to isolate it",
                  "upgrade Megatron-Core: dispatcher shape bugs for TP > 1 with ETP = 1 have been fixed upstream"])
        ev = [Evidence(c.line, c.text, rec.path) for c in sig.context[-2:]]
        if sig.frames:
            ev.append(Evidence(sig.line, "frames: " + " <- ".join(reversed(sig.frames[-4:])), rec.path))
        ev.append(Evidence(sig.line, sig.text, rec.path))
        out.append(Finding("dispatcher_failure", "error", summary, ev, cause,
                           "rerun the first failing step with the alternative dispatcher; read the full traceback of "
                           "the first failing rank", fixes, rec.path, rule_ids=["MOE-056"] if "size 0" in msg else [],
                           data={"frames": list(sig.frames), "rank": sig.rank}))
        used.add(sig.line)
    return out


def _exception_findings(rec: RunRecord, used: set[int]) -> list[Finding]:
    out = []
    first_error = min((s.line for s in rec.signals if s.kind in ("exception", "oom")), default=None)
    for sig in rec.signals:
        if sig.line in used or sig.kind not in ("exception", "traceback_unterminated"):
            continue
        if sig.kind == "traceback_unterminated" and first_error is not None and sig.line > first_error:
            continue  # the same failure printed again (another rank / chained traceback) after its exception line
        if sig.kind == "exception":
            typ, msg = sig.data.get("type", ""), sig.data.get("message", "")
            pat = match_assertion(msg)
            config_frame = any(k in " ".join(sig.frames) for k in _CONFIG_FRAMES)
            if pat is not None or (typ == "AssertionError" and config_frame):
                rule_ids = list(pat.rule_ids) if pat else []
                fixes = list(pat.fixes) if pat else ["run `moetune check` on the configuration"]
                for rid in rule_ids:
                    txt = _rule_fix_text(rid)
                    if txt:
                        fixes.append(f"{rid}: {txt}")
                cause = pat.cause if pat else "a configuration validation assertion failed"
                out.append(Finding(
                    "config_assertion", "error", f"{typ}: {msg}" + (f" [{', '.join(rule_ids)}]" if rule_ids else ""),
                    _ev(sig, rec.path, with_context=True), cause,
                    "run `moetune check` on the same configuration: it reports " +
                    (", ".join(rule_ids) if rule_ids else "the violated rule") + " before launch",
                    fixes, rec.path, rule_ids=rule_ids, data={"type": typ, "frames": list(sig.frames)}))
            else:
                out.append(Finding(
                    "python_error", "error", f"{typ}: {msg}"[:300], _ev(sig, rec.path, with_context=True),
                    "an exception stopped this rank" + (f" in {sig.frames[-1]}" if sig.frames else ""),
                    "read the full traceback of the first failing rank (earliest timestamp)",
                    ["fix the error reported by the exception; rerun", "if it appears on only some ranks, check "
                     "for rank-dependent data or configuration"], rec.path, data={"type": typ,
                                                                                "frames": list(sig.frames)}))
        else:
            key = sig.frames[-2:]
            same = [s for s in rec.signals if s.kind == "traceback_unterminated" and s.frames[-2:] == key]
            used.update(s.line for s in same)
            ranks = sorted({s.rank for s in same if s.rank is not None})
            out.append(Finding(
                "python_error", "warning",
                f"traceback without its exception line (cut off or interleaved); last frame {sig.frames[-1]}"
                + (f" ({len(same)} tracebacks, ranks {ranks[:16]})" if len(same) > 1 else ""),
                [Evidence(s.line, "frames: " + " <- ".join(reversed(s.frames[-4:])), rec.path)
                 for s in same[:EVIDENCE_PER_FINDING]],
                "the log excerpt ends (or the ranks' output is interleaved) before the exception line; the frames show "
                f"where it was raised ({_phase(sig.frames, rec)})",
                "find the exception line in the complete log of the same rank" + (f" (ranks {ranks})" if ranks else ""),
                ["get the full per-rank log (torchrun --tee 3 / --log-dir) and rerun `moetune diagnose`"], rec.path,
                data={"frames": list(sig.frames)}))
        used.add(sig.line)
    return out


def _process_findings(rec: RunRecord) -> list[Finding]:
    sigs = rec.signals_of("process_exit")
    if not sigs:
        return []
    text = " ".join(s.text for s in sigs)
    if "-9" in text or "SIGKILL" in text or "Killed" in text or "Signal 9" in text:
        cause = "a process was killed with SIGKILL: usually the host OOM killer (CPU memory) or the scheduler"
        fixes = ["check host memory (dmesg / Slurm MaxRSS): CPU offloading, dataloader workers and pinned memory",
                 "find the first failing rank in torchrun's `Failures:` section"]
    elif "143" in text or "SIGTERM" in text or "-15" in text:
        cause = "SIGTERM cascade: the launcher terminated the other ranks after one failed"
        fixes = ["find the first failure (earliest traceback / `Failures:` entry); the SIGTERMs are consequences"]
    else:
        cause = "a worker exited with an error code"
        fixes = ["find the first failing rank's exception"]
    return [Finding("process_killed", "error", f"worker exit: {sigs[0].text[:160]}",
                    [Evidence(s.line, s.text, rec.path) for s in sigs[:EVIDENCE_PER_FINDING]], cause,
                    "read the launcher's `Failures:` block: the root cause is the earliest failure", fixes, rec.path)]


def _iteration_evidence(rec: RunRecord, idx: Iterable[int], describe) -> list[Evidence]:
    idx = list(idx)[:EVIDENCE_PER_FINDING]
    lines = rec.iterations.col("line")
    texts = _fetch_lines(rec.path, {int(lines[i]) for i in idx if lines[i] > 0}) if rec.source != "megatron-golden" \
        else {}
    out = []
    for i in idx:
        ln = int(lines[i])
        out.append(Evidence(ln, texts.get(ln) or describe(i), rec.path))
    return out


def loss_spikes(vals: np.ndarray, *, prefilter: bool = True) -> list[tuple[int, float]]:
    """Loss spikes in the finite losses ``vals`` (in iteration order): ``(index j, reference)`` for each ``vals[j]``
    above the median of the up to ``LOSS_SPIKE_HISTORY`` values before it by ``LOSS_SPIKE_REL`` and by
    ``LOSS_SPIKE_MADS`` robust SDs (the median absolute deviation, at least 1e-3 of the median), from the
    ``LOSS_SPIKE_MIN_HISTORY``-th value on. Scanned in chunks of 65536 windows (bounded memory); the scan stops after
    the chunk that brings the count to 1000.

    ``prefilter`` (exact, the default): a window's median is at least its minimum, so where that minimum is >= 0 a
    value at most ``1 + LOSS_SPIKE_REL`` times it cannot pass the first test (float multiplication by a positive
    constant is monotone); only the other windows' medians and MADs are computed (numpy's ``nanmedian`` of a window
    depends on that window alone). ``prefilter=False`` computes every window (the reference the tests compare with).
    """
    spikes: list[tuple[int, float]] = []
    if len(vals) <= LOSS_SPIKE_MIN_HISTORY:
        return spikes
    h = LOSS_SPIKE_HISTORY
    padded = np.concatenate([np.full(h - 1, np.nan), vals])
    win_all = np.lib.stride_tricks.sliding_window_view(padded, h)[: len(vals) - 1]  # window ending before j
    chunk = 65536
    for start in range(0, len(win_all), chunk):
        stop = min(start + chunk, len(win_all))
        rows = np.arange(start, stop)
        rows = rows[rows + 1 >= LOSS_SPIKE_MIN_HISTORY]
        if prefilter and len(rows):  # the minimum of each window (NaN where it reaches into the padding: kept)
            low = padded[start:stop].copy()
            for k in range(1, h):
                np.minimum(low, padded[start + k:stop + k], out=low)
            with np.errstate(invalid="ignore"):
                keep = ~((low >= 0) & (vals[start + 1:stop + 1] <= low * (1 + LOSS_SPIKE_REL)))
            rows = rows[keep[rows - start]]
        if len(rows):
            win = win_all[rows]
            ref = np.nanmedian(win, axis=1)
            mad = np.nanmedian(np.abs(win - ref[:, None]), axis=1)
            cur = vals[rows + 1]
            hit = (cur > ref * (1 + LOSS_SPIKE_REL)) & \
                (cur - ref > LOSS_SPIKE_MADS * np.maximum(mad, 1e-3 * np.abs(ref)))
            spikes += [(int(rows[i]) + 1, float(ref[i])) for i in np.flatnonzero(hit)]
        if len(spikes) >= 1000:
            break
    return spikes


def _loss_findings(rec: RunRecord, health: dict[str, Any] | None = None) -> list[Finding]:
    out = []
    tab = rec.iterations
    if not len(tab):
        return out
    health = health or loss_health(rec)
    it = tab.col("iteration")
    if health["nan_iterations"]:
        nan_set = set(health["nan_iterations"])
        idx = [i for i in range(len(tab)) if int(it[i]) in nan_set]
        counters_zero = health["nan_counter_total"] == 0
        loss = tab.col("loss")
        gn = tab.col("grad_norm")

        def desc(i: int) -> str:
            return f"step {int(it[i])}: lm loss {loss[i]}, grad norm {gn[i]}"

        summary = (f"NaN loss at iteration(s) {sorted(nan_set)[:10]}" +
                   (" — Megatron's nan-iteration counter stayed 0" if counters_zero else "") +
                   f" (detected by: {'; '.join(health['nan_detected_by'])})")
        out.append(Finding(
            "nan_loss", "error", summary, _iteration_evidence(rec, idx, desc),
            "the loss (or the gradient norm) became NaN/inf: divergence (learning rate, loss spike before it), bad "
            "data, or a numerical bug (fp8/fp16 overflow, attention backend); Megatron omits a NaN loss from the "
            "line and its counter counts only when check_for_nan_in_loss is on",
            "look at the loss and grad-norm trend before the first NaN iteration; rerun from the last checkpoint "
            "with check_for_nan_in_loss (rerun state machine) to see whether it reproduces on the same batch",
            ["resume from the last good checkpoint with a lower learning rate / longer warm-up",
             "skip or inspect the data batch of that iteration",
             "enable rerun_state_machine.check_for_nan_in_loss so NaNs stop the run and are attributed",
             "if fp8/fp16: use bf16 for the first/last layers (first_last_layers_bf16) or a more robust recipe"],
            rec.path, data={"nan_iterations": sorted(nan_set), "counters_zero": counters_zero}))
    # loss spikes
    loss = tab.col("loss")
    fin = np.isfinite(loss) & (tab.col("loss_missing") != 1)
    vals = loss[fin]
    pos = np.flatnonzero(fin)
    spikes = [(int(pos[j]), ref) for j, ref in loss_spikes(vals)]
    if spikes:
        first = spikes[0][0]

        def desc2(i: int) -> str:
            return f"step {int(it[i])}: lm loss {loss[i]:.5g}"

        out.append(Finding(
            "loss_spike", "warning",
            f"loss spike at iteration(s) {[int(it[i]) for i, _ in spikes][:10]}: {loss[first]:.4g} vs recent median "
            f"{spikes[0][1]:.4g}", _iteration_evidence(rec, [i for i, _ in spikes], desc2),
            "optimizer instability (learning rate too high for the batch, Adam epsilon/beta2, router instability in "
            "MoE) or an unusual data batch",
            "check grad norm and MoE load-balancing loss around the spike; replay the same data batch",
            ["lower the learning rate or lengthen warm-up", "enable/strengthen gradient clipping",
             "check MoE router stability (aux-loss coefficient, router dtype fp32, expert bias update rate)",
             "inspect the data around that iteration"], rec.path,
            data={"iterations": [int(it[i]) for i, _ in spikes]}))
    return out


def _timing_findings(rec: RunRecord, health: dict[str, Any] | None = None) -> list[Finding]:
    out = []
    tab = rec.iterations
    if len(tab):
        ls = detected_level_shift(rec)
        if ls and ls["ratio"] > 1:
            it = tab.col("iteration")
            t = tab.col("elapsed_s")
            at = int(np.flatnonzero(it == ls["at_iteration"])[0])
            idx = [i for i in (at - 1, at) if 0 <= i < len(tab)]
            health = health or loss_health(rec)
            out.append(Finding(
                "throughput_drop", "warning",
                f"step time rises from {ls['before_s']:.4g} s to {ls['after_s']:.4g} s (+{(ls['ratio'] - 1) * 100:.0f}%)"
                f" at iteration {ls['at_iteration']} (Mann-Whitney p={ls['p_value']:.2g})"
                + (" with healthy loss" if health["finite"] else ""),
                _iteration_evidence(rec, idx, lambda i: f"step {int(it[i])}: {t[i]:.4g} s"),
                "the same job slowed down mid-run with unchanged loss behaviour: a host, network or straggler problem "
                "(thermal throttling, a degraded NIC/link, noisy neighbour, storage/dataloader stalls, checkpoint "
                "I/O), not the model",
                "survey per-rank step time / timers around the shift (Megatron --log-timers-to-tensorboard, "
                "timing-log-level 2); check nvidia-smi clocks and NIC counters on every node",
                ["identify and drain the slow node (per-rank jitter analysis)",
                 "check the network fabric with nccl-tests",
                 "check dataloader / storage throughput and checkpoint I/O at the time of the shift",
                 "enable manual GC (train.manual_gc with an interval) if Python GC pauses grow"],
                rec.path, data=dict(ls)))
    if len(rec.step_time):
        f = rec.step_time.col("flags").astype(np.int64)
        t = rec.step_time.col("elapsed_s")
        prof = np.flatnonzero(f & FLAG_PROFILED)
        clean = t[(f & FLAG_PROFILED) == 0]
        if len(prof) and len(clean):
            base = float(np.median(clean))
            lines = rec.step_time.col("line")
            ev = [Evidence(e.line, e.text, rec.path) for e in rec.events if e.kind.startswith("profile")][:4]
            ev += [Evidence(int(lines[i]), f"Step Time : {t[i]:.2f}s (profiled)", rec.path) for i in prof[:4]]
            out.append(Finding(
                "profiler_window", "info",
                f"profiler capture inflated the step time: {t[prof[0]]:.4g} s vs {base:.4g} s unprofiled "
                f"(+{(t[prof[0]] / base - 1) * 100:.0f}%); those steps are excluded from the steady window",
                ev, "nsys / torch-profiler capture adds overhead to the captured iterations",
                "compare the unprofiled steps before and after the capture range",
                ["judge speed from unprofiled steps; use the trace only for relative breakdowns",
                 "keep capture windows short (profile_step_start/end) and outside the measured window"],
                rec.path, data={"profiled_s": [float(t[i]) for i in prof], "unprofiled_median_s": base}))
    return out


def _skipped_findings(rec: RunRecord) -> list[Finding]:
    tab = rec.iterations
    if not len(tab):
        return []
    sk = nan_as_zero(tab.col("skipped"))
    if sk.sum() <= 0:
        return []
    it = tab.col("iteration")
    ls = tab.col("loss_scale")
    idx = list(np.flatnonzero(sk > 0))
    # the warm-up overflows are the run of logged intervals with skips that starts at the first logged line
    first_clean = int(np.argmin(sk > 0)) if (sk == 0).any() else len(sk)
    at_start = idx[0] == 0
    early = int(sk[:first_clean].sum()) if at_start else 0
    late = [int(it[i]) for i in idx if i >= first_clean or not at_start]
    scales = [float(x) for x in ls[np.isfinite(ls)]]
    summary = (f"{int(sk.sum())} skipped iteration(s) (loss-scale overflow) at logged iteration(s) "
               f"{[int(it[i]) for i in idx][:10]}; loss scale {scales[0]:.0f} -> {scales[-1]:.0f}" if scales else
               f"{int(sk.sum())} skipped iteration(s)")
    start_scale = scales[0] if scales else math.nan
    cause = ("fp16 dynamic loss scaling warm-up: the scale starts high (first logged value "
             f"{start_scale:.0f} = 2^{int(round(math.log2(start_scale))) if start_scale > 0 else '?'}) and halves on "
             "every overflow; each overflow skips the optimizer step. Expected in the first iterations."
             if at_start else
             "gradient overflow under fp16 loss scaling later in training (the scale dropped): skipped steps do not "
             "update the model")
    if at_start and late:
        cause += f" Later overflows at iteration(s) {late[:10]}."
    return [Finding(
        "skipped_iterations", "info" if at_start and not late else "warning", summary,
        _iteration_evidence(rec, idx, lambda i: f"step {int(it[i])}: {int(sk[i])} skipped, loss scale {ls[i]}"),
        cause, "watch the loss-scale column: it should settle after the warm-up overflows; a falling scale later "
        "means growing gradients",
        ["nothing to do if skips stop after the warm-up",
         "lower the initial loss scale (--initial-loss-scale) to shorten the warm-up",
         "train in bf16 (no loss scaling)",
         "if skips recur later: lower the learning rate / check for a diverging layer"], rec.path,
        data={"skipped_total": int(sk.sum()), "skipped_at": [int(it[i]) for i in idx], "early": early})]


def diagnose_run(rec: RunRecord) -> list[Finding]:
    """All findings for one run record, most severe first."""
    with rec.iterations.decoded(), rec.step_time.decoded():
        return _diagnose(rec)


def _diagnose(rec: RunRecord) -> list[Finding]:
    used: set[int] = set()
    findings: list[Finding] = []
    findings += _oom_findings(rec)
    used.update(s.line for s in rec.signals_of("oom"))
    findings += _nccl_findings(rec)
    findings += _dispatcher_findings(rec, used)
    findings += _exception_findings(rec, used)
    findings += _process_findings(rec)
    health = loss_health(rec) if len(rec.iterations) else None  # (read by both)
    findings += _loss_findings(rec, health)
    findings += _timing_findings(rec, health)
    findings += _skipped_findings(rec)
    findings.sort(key=lambda f: (SEVERITY_ORDER[f.severity], f.evidence[0].line if f.evidence else 0))
    return findings


def diagnose_paths(paths: Iterable[str | Path]) -> list[Finding]:
    """Read each file (streaming) and diagnose it; raises InputError for unreadable / non-log input."""
    out: list[Finding] = []
    for p in paths:
        out += diagnose_run(read_run(p))
    return out

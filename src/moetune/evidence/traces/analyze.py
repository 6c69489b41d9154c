"""Per-rank and multi-rank analysis of GPU traces: interval unions, hidden/exposed communication, idle split,
dominant wall, feature evidence, clock alignment and stragglers.

Method (docs/domain.md §7.2, from Megatron-Bridge skills/nemo-mbridge-perf-nsys-analysis):
- iterations are anchored on ``ProfilerStep#N`` / NVTX step ranges; a GPU op belongs to the step in which it was
  *launched* (host timestamp of its correlated runtime call), and iteration i's GPU window runs from its first GPU op
  to the first GPU op of iteration i+1. With ≥ 2 steps the last one is left out (the profiler stops inside it; this
  is also HTA's default, hta/common/trace.py ``_filter_irrelevant_gpu_kernels``);
- interval unions per class clipped to the windows, never sums of durations;
- hidden comm = comm ∩ compute, exposed = comm − compute (upper bound; the part beside memcpy/memset only is
  reported separately); ``comm_compute_overlap_pct`` = |comm ∩ compute| / |comm| (HTA ``get_comm_comp_overlap``);
- idle = window − (kernels ∪ memcpy ∪ memset); each idle gap is split at the moment the launch call of the op that
  ends the gap returned: before it the GPU was launch-starved (host-bound), after it the op was queued and waiting on
  a dependency or synchronisation.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from moetune.errors import InputError
from moetune.evidence.traces import intervals as iv
from moetune.evidence.traces.rank_trace import RankTrace
from moetune.evidence.traces.report import (
    ClockAlignment,
    CollectiveSkew,
    Features,
    IdleSplit,
    IterationStats,
    RankReport,
    Spread,
    Straggler,
    TopKernel,
    TraceReport,
    WallBreakdown,
)
from moetune.evidence.traces.taxonomy import GROUP_COMM, GROUP_COMPUTE, GROUP_MEMORY, Taxonomy, load_taxonomy

NS = 1e-9
_EP_KINDS = ("deepep_", "hybridep_", "nccl_alltoall", "nccl_sendrecv")
_TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".csv", ".csv.xz", ".parquet")


# ----------------------------------------------------------------------------------------------------- reading
def _expand(paths: list[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file() and f.name.lower().endswith(_TRACE_SUFFIXES))
            if not files:
                raise InputError(f"{p}: directory holds no trace files (.json, .json.gz, .sqlite, .csv(.xz), .parquet)")
            out.extend(files)
        elif p.exists():
            out.append(p)
        else:
            raise InputError(f"{p}: no such file or directory", field="path", value=str(p), expected="a trace file")
    return out


def read_traces(paths: list[str | Path], *, workers: int | None = None) -> list[RankTrace]:
    """Read every file (a directory = all its per-rank files, one job) into RankTraces; the Kineto files in
    ``workers`` processes (None: one per CPU, at most one per file)."""
    from moetune.evidence.traces.kineto import read_kineto

    files = _expand(paths)
    kineto = [f for f in files if not f.name.lower().endswith((".sqlite", ".db", ".csv", ".csv.xz", ".parquet"))]
    workers = workers or min(os.cpu_count() or 1, len(kineto))
    parsed: dict[Path, RankTrace] = {}
    if workers > 1 and len(kineto) > 1:
        # one file per process, like HTA's parser pool; results come back as compact numpy arrays
        import multiprocessing as mp

        with mp.get_context("fork").Pool(workers) as pool:
            parsed = dict(zip(kineto, pool.map(read_kineto, kineto, chunksize=1), strict=True))
    traces: list[RankTrace] = []
    for f in files:
        if f in parsed:
            traces.append(parsed[f])
            continue
        low = f.name.lower()
        if low.endswith((".sqlite", ".db")):
            from moetune.evidence.traces.nsys import read_nsys_sqlite

            traces.extend(read_nsys_sqlite(f))
        elif low.endswith((".csv", ".csv.xz", ".parquet")):
            from moetune.evidence.traces.nsys import read_nsys_recipe

            traces.extend(read_nsys_recipe(f))
        else:
            traces.append(read_kineto(f))
    return traces


# ----------------------------------------------------------------------------------------------------- helpers
def _launch_index(tr: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """For every GPU op: index of its correlated runtime call (or -1), via sorted correlation ids."""
    if tr.rt_corr.size == 0 or tr.gpu_corr.size == 0:
        return np.full(tr.n_gpu, -1, np.int64), np.zeros(tr.n_gpu, bool)
    valid_rt = np.flatnonzero(tr.rt_corr >= 0)
    order = valid_rt[np.argsort(tr.rt_corr[valid_rt], kind="stable")]
    keys = tr.rt_corr[order]
    pos = np.searchsorted(keys, tr.gpu_corr)
    pos = np.clip(pos, 0, max(keys.size - 1, 0))
    ok = (keys.size > 0) & (tr.gpu_corr >= 0)
    ok = ok & (keys[pos] == tr.gpu_corr) if keys.size else np.zeros(tr.n_gpu, bool)
    idx = np.where(ok, order[pos] if keys.size else -1, -1)
    return idx, ok


def _detect_optimizer_iterations(tr: RankTrace, cls: np.ndarray, tax: Taxonomy):
    """Iterations anchored on recurring optimizer steps (domain.md §7.2 step 2), when no step ranges exist.

    Optimizer kernels (class ``optimizer``: multi_tensor_apply/Adam) that follow each other without a GEMM,
    attention or communication kernel in between form one optimizer step; iteration k runs from the end of
    optimizer step k to the end of step k+1. Needs at least two optimizer steps.
    """
    names = [c.name for c in tax.classes]
    if "optimizer" not in names:
        return None
    opt_id = names.index("optimizer")
    heavy_ids = [i for i, c in enumerate(tax.classes)
                 if c.group == "comm" or c.name.startswith(("gemm", "attention"))]
    order = np.argsort(tr.gpu_start, kind="stable")
    c = cls[order]
    is_opt = c == opt_id
    if is_opt.sum() < 2:
        return None
    heavy_before = np.cumsum(np.isin(c, heavy_ids))
    opt_pos = np.flatnonzero(is_opt)
    new_burst = np.r_[True, heavy_before[opt_pos[1:]] > heavy_before[opt_pos[:-1]]]
    burst = np.cumsum(new_burst) - 1
    if burst[-1] < 1:
        return None
    ends = np.zeros(burst[-1] + 1, np.int64)
    np.maximum.at(ends, burst, tr.gpu_end[order[opt_pos]])
    w0, w1 = ends[:-1], ends[1:]
    keep = w1 > w0
    w0, w1 = w0[keep], w1[keep]
    if w0.size == 0:
        return None
    sel = (tr.gpu_start >= w0[0]) & (tr.gpu_start < w1[-1])
    wn = [f"detected iteration {i + 1}" for i in range(w0.size)]
    return wn, w0, w1, f"detected from {burst[-1] + 1} optimizer steps (no step ranges)", sel


def _windows(
    tr: RankTrace, launch_ts: np.ndarray, tax: Taxonomy, cls: np.ndarray
) -> tuple[list[str], np.ndarray, np.ndarray, str, np.ndarray]:
    """Iteration GPU windows [w0, w1), their names, and the mask of GPU ops analysed (launched in those steps)."""
    names = tr.steps.name
    if names:
        st = np.array(tr.steps.start, np.int64)
        en = np.array(tr.steps.end, np.int64)
        order = np.argsort(st, kind="stable")
        st, en = st[order], en[order]
        nm = [names[i] for i in order]
        # keep top-level steps only (an NVTX iteration range may contain a nested one)
        keep = np.r_[True, st[1:] >= np.maximum.accumulate(en)[:-1]]
        st, en, nm = st[keep], en[keep], [n for n, k in zip(nm, keep, strict=True) if k]
        step_of = np.searchsorted(st, launch_ts, side="right") - 1
        n_use = st.size - 1 if st.size >= 2 else st.size
        if st.size == 1:  # a single step: ops launched after it ended are not part of it
            step_of = np.where(launch_ts <= en[0], step_of, -1)
        sel = (step_of >= 0) & (step_of < n_use)
        big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        first_start = np.full(st.size, big, np.int64)
        last_end = np.full(st.size, small, np.int64)
        inside = step_of >= 0
        np.minimum.at(first_start, step_of[inside], tr.gpu_start[inside])
        np.maximum.at(last_end, step_of[inside], tr.gpu_end[inside])
        has = first_start < big
        used = [i for i in range(n_use) if has[i]]
        w0, w1, wn = [], [], []
        for pos, i in enumerate(used):
            if pos + 1 < len(used):
                end = first_start[used[pos + 1]]
            else:  # the last analysed step runs until the (left-out) next step starts, or its last op ends
                later = [first_start[j] for j in range(i + 1, st.size) if has[j]]
                end = max(later[0] if later else last_end[i], int(tr.gpu_end[sel].max()))
            if end > first_start[i]:
                w0.append(first_start[i])
                w1.append(end)
                wn.append(nm[i])
        src = "ProfilerStep" if nm and nm[0].startswith("ProfilerStep") else "NVTX step ranges"
        if st.size >= 2:
            src += f" ({st.size - 1} of {st.size}; the last step is left out as incomplete)"
        if w0:
            return wn, np.array(w0, np.int64), np.array(w1, np.int64), src, sel
    all_ops = np.ones(tr.n_gpu, bool)
    if tr.n_gpu == 0:
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64), "none", all_ops
    detected = _detect_optimizer_iterations(tr, cls, tax)
    if detected is not None:
        return detected
    lo, hi = int(tr.gpu_start.min()), int(tr.gpu_end.max())
    return ["whole trace"], np.array([lo], np.int64), np.array([hi], np.int64), "whole trace (no step ranges)", all_ops


def _sets_in(tr: RankTrace, mask: np.ndarray) -> iv.IntervalSet:
    return iv.union(tr.gpu_start[mask], tr.gpu_end[mask])


def _spread(x: list[float]) -> Spread:
    if not x:
        return Spread(n=0)
    a = np.asarray(x, float)
    return Spread(n=int(a.size), median=float(np.median(a)), min=float(a.min()), max=float(a.max()))


# ----------------------------------------------------------------------------------------------------- per rank
class _RankState:
    """Arrays kept after per-rank analysis for the multi-rank pass."""

    def __init__(self, tr: RankTrace, cls: np.ndarray, tax: Taxonomy):
        self.tr = tr
        self.cls = cls
        self.tax = tax


def analyze_rank(tr: RankTrace, tax: Taxonomy | None = None, top: int = 10) -> tuple[RankReport, _RankState]:
    tax = tax or load_taxonomy()
    cls = tax.classify_ids(tr.names, tr.gpu_name, tr.gpu_kind, tr.forced_class)
    state = _RankState(tr, cls, tax)
    base = RankReport(
        rank=tr.rank,
        rank_source=tr.rank_source,
        source=tr.source,
        format=tr.fmt,
        device=tr.device,
        world_size=tr.world_size,
        gpu_events=tr.n_gpu,
        has_gpu_events=tr.n_gpu > 0,
        iterations=0,
        iteration_source="none",
        iteration_wall_s=Spread(n=0),
        notes=list(tr.notes),
    )
    if tr.n_gpu == 0:
        base.notes.append(
            f"no GPU events (no kernels, memcpy or memset) in {tr.source}: "
            f"{tr.n_events} events, host-side only; GPU-time analysis not possible"
        )
        return base, state

    groups = tax.group_table()[cls]
    is_comm = groups == GROUP_COMM
    is_comp = groups == GROUP_COMPUTE
    is_mem = groups == GROUP_MEMORY
    rt_idx, has_rt = _launch_index(tr)
    launch_ts = np.where(has_rt, tr.rt_start[np.maximum(rt_idx, 0)] if tr.rt_start.size else 0, tr.gpu_start)
    orphan = np.zeros(tr.n_gpu, bool)
    if (tr.rt_corr >= 0).any():
        # a correlation id without a recorded launch: launched before host-side recording began (an iteration that
        # was not profiled) or its launch record was lost. It cannot be attributed to a step, so with step ranges it
        # is left out -- HTA's kernel filter (a join on launch records) does the same
        orphan = ~has_rt & (tr.gpu_corr >= 0)
        launch_ts = np.where(orphan, np.iinfo(np.int64).min, launch_ts)
    launch_end = np.where(has_rt, tr.rt_end[np.maximum(rt_idx, 0)] if tr.rt_end.size else 0, -1)

    wnames, w0, w1, wsrc, sel = _windows(tr, launch_ts, tax, cls)
    is_comm &= sel
    is_comp &= sel
    is_mem &= sel
    busy = _sets_in(tr, sel)
    comp = _sets_in(tr, is_comp)
    comm = _sets_in(tr, is_comm)
    mem = _sets_in(tr, is_mem)
    hidden = iv.intersect(comm, comp)  # hidden comm = comm ∩ compute (also HTA's overlap numerator)
    exposed = iv.subtract(comm, comp)
    exposed_mem_only = iv.intersect(exposed, mem)  # exposed comm that only memcpy/memset ran beside
    exp_mem = iv.subtract(mem, iv.merge(comp, comm))

    def m(a: iv.IntervalSet) -> np.ndarray:
        return iv.measure_in_windows(a, w0, w1)

    win = (w1 - w0).astype(np.int64)
    busy_w, comp_w, comm_w, hid_w, exp_w = m(busy), m(comp), m(comm), m(hidden), m(exposed)
    mem_w, expmem_w = m(mem), m(exp_mem)
    idle_w = win - busy_w

    # ---- idle split: gaps between busy intervals inside each window
    host_w = np.zeros(w0.size, np.int64)
    dep_w = np.zeros(w0.size, np.int64)
    unk_w = np.zeros(w0.size, np.int64)
    sel_idx = np.flatnonzero(sel)
    order = sel_idx[np.argsort(tr.gpu_start[sel_idx], kind="stable")]
    s_sorted = tr.gpu_start[order]
    for i in range(w0.size):
        gs, ge = iv.complement(iv.clip(busy, int(w0[i]), int(w1[i])), int(w0[i]), int(w1[i]))
        if gs.size == 0:
            continue
        k = np.searchsorted(s_sorted, ge, side="left")
        found = (k < s_sorted.size) & (s_sorted[np.minimum(k, s_sorted.size - 1)] == ge)
        op = order[np.minimum(k, s_sorted.size - 1)]
        le = np.where(found, launch_end[op], -1)
        known = found & (le >= 0)
        host = np.where(known, np.clip(le - gs, 0, ge - gs), 0)
        host_w[i] = int(host.sum())
        dep_w[i] = int(np.where(known, (ge - gs) - host, 0).sum())
        unk_w[i] = int(np.where(known, 0, ge - gs).sum())

    t0 = int(tr.gpu_start.min())
    per_iter = [
        IterationStats(
            name=wnames[i],
            start_s=(int(w0[i]) - t0) * NS,
            wall_s=int(win[i]) * NS,
            compute_s=int(comp_w[i]) * NS,
            comm_s=int(comm_w[i]) * NS,
            hidden_comm_s=int(hid_w[i]) * NS,
            exposed_comm_s=int(exp_w[i]) * NS,
            idle_s=int(idle_w[i]) * NS,
            host_bound_s=int(host_w[i]) * NS,
            dependency_s=int(dep_w[i]) * NS,
        )
        for i in range(w0.size)
    ]
    W = int(win.sum())
    comm_t = int(comm_w.sum())

    # ---- comm by kind (union per kind) and exposed per kind
    kinds: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(tr.n_gpu, bool))
    for ci in np.unique(cls[is_comm]):
        kinds[tax.classes[ci].kind or tax.classes[ci].name] |= is_comm & (cls == ci)
    comm_by_kind, exp_by_kind = {}, {}
    for kind, mask in sorted(kinds.items()):
        u = _sets_in(tr, mask)
        comm_by_kind[kind] = int(m(u).sum()) * NS
        exp_by_kind[kind] = int(m(iv.subtract(u, comp)).sum()) * NS

    # ---- kernel time by class and top kernels (sums of durations, labelled as such)
    in_any = sel
    dur = tr.gpu_end - tr.gpu_start
    ktime: dict[str, float] = {}
    for ci in np.unique(cls[in_any]):
        ktime[tax.classes[ci].name] = int(dur[in_any & (cls == ci)].sum()) * NS
    top_k = []
    if in_any.any():
        ids = tr.gpu_name[in_any]
        sums = np.bincount(ids, weights=dur[in_any], minlength=len(tr.names))
        cnts = np.bincount(ids, minlength=len(tr.names))
        for nid in np.argsort(-sums)[:top]:
            if cnts[nid] == 0:
                break
            first = np.flatnonzero(in_any & (tr.gpu_name == nid))[0]
            c = tax.classes[cls[first]]
            top_k.append(
                TopKernel(
                    name=tr.names[nid],
                    kernel_class=c.name,
                    group=c.group,
                    count=int(cnts[nid]),
                    kernel_time_s=float(sums[nid]) * NS,
                    mean_us=float(sums[nid]) / cnts[nid] / 1e3,
                )
            )

    # ---- wall breakdown and dominant wall
    comm_only = iv.subtract(comm, comp)
    bd = WallBreakdown(
        compute_s=int(comp_w.sum()) * NS,
        exposed_comm_s=int(m(comm_only).sum()) * NS,
        exposed_memory_s=int(expmem_w.sum()) * NS,
        host_bound_idle_s=int(host_w.sum()) * NS,
        dependency_idle_s=int(dep_w.sum()) * NS,
        unattributed_idle_s=int(unk_w.sum()) * NS,
    )
    parts = {
        "compute": bd.compute_s,
        "communication": bd.exposed_comm_s,
        "memory_transfer": bd.exposed_memory_s,
        "host": bd.host_bound_idle_s,
        "dependency": bd.dependency_idle_s + bd.unattributed_idle_s,
    }
    wall = max(parts, key=parts.get) if W else None
    evidence = [f"{k}: {v * 1e3:.3f} ms ({100 * v / (W * NS):.1f}% of {W * NS * 1e3:.3f} ms analysed)"
                for k, v in sorted(parts.items(), key=lambda kv: -kv[1])] if W else []
    if comm_by_kind and W:
        worst = max(exp_by_kind, key=exp_by_kind.get)
        evidence.append(f"largest exposed comm kind: {worst} {exp_by_kind[worst] * 1e3:.3f} ms")
    if top_k:
        evidence.append(
            f"top kernel ({top_k[0].kernel_class}, {top_k[0].kernel_time_s * 1e3:.3f} ms summed): {top_k[0].name[:80]}"
        )

    feats = _features(tr, tax, cls, sel, comp, m, rt_idx, has_rt)
    base.iterations = int(w0.size)
    base.iteration_source = wsrc
    base.iteration_wall_s = _spread([x.wall_s for x in per_iter])
    base.per_iteration = per_iter
    base.window_s = W * NS
    base.busy_s = int(busy_w.sum()) * NS
    base.compute_s = int(comp_w.sum()) * NS
    base.comm_s = comm_t * NS
    base.hidden_comm_s = int(hid_w.sum()) * NS
    base.exposed_comm_s = int(exp_w.sum()) * NS
    base.exposed_comm_beside_memcpy_s = int(m(exposed_mem_only).sum()) * NS
    base.comm_compute_overlap_pct = 100.0 * int(hid_w.sum()) / comm_t if comm_t else None
    base.comm_by_kind = comm_by_kind
    base.exposed_comm_by_kind = exp_by_kind
    base.memory_s = int(mem_w.sum()) * NS
    base.idle = IdleSplit(
        total_s=int(idle_w.sum()) * NS,
        host_bound_s=int(host_w.sum()) * NS,
        dependency_s=int(dep_w.sum()) * NS,
        unattributed_s=int(unk_w.sum()) * NS,
    )
    base.dominant_wall = wall
    base.dominant_wall_evidence = evidence
    base.wall_breakdown = bd
    base.kernel_time_by_class = ktime
    base.top_kernels = top_k
    base.features = feats
    if not comm_t:
        base.notes.append("no communication kernels in the analysed window (overlap undefined)")
    if not has_rt.any():
        base.notes.append("no launch records correlated with GPU ops: idle time cannot be split (unattributed)")
    elif orphan.any() and tr.steps.name:
        base.notes.append(f"{int(orphan.sum())} GPU ops without a launch record left out (cannot be assigned to a step)")
    return base, state


def _features(tr, tax, cls, sel, comp, m, rt_idx, has_rt) -> Features:
    backends: dict[str, dict[str, float]] = {}
    for b in sorted({c.backend for c in tax.classes if c.backend}):
        ids = [i for i, c in enumerate(tax.classes) if c.backend == b and c.group == "comm"]
        mask = np.isin(cls, ids) & sel
        if mask.any():
            backends[b] = {"kernels": float(mask.sum()), "wall_s": int(m(_sets_in(tr, mask)).sum()) * NS}
    kind_of = [c.kind or "" for c in tax.classes]
    ep_ids = [i for i, k in enumerate(kind_of) if k.startswith(_EP_KINDS)]
    ep_mask = np.isin(cls, ep_ids) & sel
    ep = _sets_in(tr, ep_mask)
    ep_t = int(m(ep).sum())
    ep_hidden = int(m(iv.intersect(ep, comp)).sum())
    names_cls = [tax.classes[i].name for i in np.unique(cls[sel])]
    if "deepep" in backends:
        disp = "deepep"
    elif "hybridep" in backends:
        disp = "hybridep"
    elif any(n in ("nccl_alltoall", "nccl_sendrecv") for n in names_cls):
        disp = "alltoall (NCCL AllToAll/SendRecv; SendRecv may also be pipeline p2p)"
    else:
        disp = "none seen"
    graph_launch = np.zeros(tr.rt_name.size, bool)
    if tr.rt_name.size:
        rt_names = np.array([bool(tax.runtime.get("graph_launch") and tax.runtime["graph_launch"].search(n))
                             for n in tr.names], bool)
        graph_launch = rt_names[tr.rt_name]
    replayed = int((sel & has_rt & graph_launch[np.maximum(rt_idx, 0)]).sum()) if graph_launch.size else 0
    replayed += int((sel & (tr.gpu_graph >= 0)).sum()) if not replayed else 0
    fp8 = tax.tag_table("fp8")[cls] & sel
    fp4 = tax.tag_table("fp4")[cls] & sel
    dur = tr.gpu_end - tr.gpu_start
    fp8_gemm = sel & np.isin(cls, [i for i, c in enumerate(tax.classes) if c.name.startswith("gemm") and "fp8" in c.tags])
    grouped = sel & np.isin(cls, [i for i, c in enumerate(tax.classes) if c.name.startswith("gemm_grouped")])
    attn = sorted({tax.classes[i].name for i in np.unique(cls[sel]) if tax.classes[i].name.startswith("attention")})
    return Features(
        dispatcher=disp,
        comm_backends=backends,
        ep_comm_s=ep_t * NS,
        ep_comm_hidden_pct=100.0 * ep_hidden / ep_t if ep_t else None,
        a2a_overlapped_compute=(ep_hidden > 0) if ep_t else None,
        cuda_graph_launches=int(graph_launch.sum()),
        graph_replayed_kernels=replayed,
        fp8_kernels=int(fp8.sum()),
        fp8_kernel_time_s=int(dur[fp8].sum()) * NS,
        fp8_gemm_kernels=int(fp8_gemm.sum()),
        fp4_kernels=int(fp4.sum()),
        grouped_gemm_kernels=int(grouped.sum()),
        attention=attn,
    )


# ----------------------------------------------------------------------------------------------------- multi rank
def _comm_instances(st: _RankState) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Comm kernels per key (class + process group when known), in start order."""
    tr, tax = st.tr, st.tax
    groups = tax.group_table()[st.cls]
    out: dict[str, list[int]] = defaultdict(list)
    for i in np.flatnonzero(groups == GROUP_COMM):
        meta = tr.comm_meta.get(int(i), {})
        key = tax.classes[st.cls[i]].name
        if meta.get("pg_name") is not None:
            key += f"[pg {meta['pg_name']}]"
        out[key].append(int(i))
    res = {}
    for k, idx in out.items():
        idx = np.array(idx, np.int64)
        idx = idx[np.argsort(tr.gpu_start[idx], kind="stable")]
        res[k] = (tr.gpu_start[idx], tr.gpu_end[idx])
    return res


def _multi_rank(states: list[_RankState], reports: list[RankReport], tax: Taxonomy, out: TraceReport) -> None:
    inst = [_comm_instances(s) for s in states]
    keys = set.intersection(*(set(d) for d in inst)) if inst else set()
    if not keys:
        out.notes.append("no collective kernels common to all ranks: no clock alignment, skew or straggler analysis")
        return
    ref = 0
    offsets = np.zeros(len(states))
    residual = np.zeros(len(states))
    for r in range(len(states)):
        diffs = []
        for k in keys:
            n = min(inst[r][k][1].size, inst[ref][k][1].size)
            diffs.append(inst[r][k][1][:n] - inst[ref][k][1][:n])
        d = np.concatenate(diffs) if diffs else np.zeros(0)
        if d.size:
            offsets[r] = float(np.median(d))
            residual[r] = float(np.median(np.abs(d - offsets[r])))
    label = [str(rep.rank if rep.rank is not None else i) for i, rep in enumerate(reports)]
    out.clock_alignment = ClockAlignment(
        reference_rank=reports[ref].rank,
        method="constant offset per rank = median difference of matched collective end times (collectives end "
        "together); residual = median absolute deviation",
        offsets_us={label[r]: offsets[r] / 1e3 for r in range(len(states))},
        residual_us={label[r]: residual[r] / 1e3 for r in range(len(states))},
    )
    for r, rep in enumerate(reports):
        rep.clock_offset_us = offsets[r] / 1e3
    min_late = tax.thresholds.get("straggler_min_late_us", 500.0) * 1e3
    share_thr = tax.thresholds.get("straggler_last_share", 0.5)
    cap = int(tax.thresholds.get("max_matched_instances", 100000))
    R = len(states)
    for k in sorted(keys):
        n = min(min(inst[r][k][0].size for r in range(R)), cap)
        if n == 0:
            continue
        starts = np.stack([inst[r][k][0][:n] - offsets[r] for r in range(R)])  # R × n
        ends = np.stack([inst[r][k][1][:n] - offsets[r] for r in range(R)])
        durs = ends - starts
        skew = starts.max(0) - starts.min(0)
        proxy = durs.min(0)
        jitter = durs - proxy
        out.collectives.append(
            CollectiveSkew(
                collective=k,
                instances=int(n),
                ranks=R,
                median_skew_us=float(np.median(skew)) / 1e3,
                max_skew_us=float(skew.max()) / 1e3,
                median_transfer_us=float(np.median(proxy)) / 1e3,
                median_jitter_us=float(np.median(jitter)) / 1e3,
            )
        )
        if R < 2:
            continue
        late = starts - starts.min(0)
        last = np.argmax(starts, axis=0)
        for r in range(R):
            share = float((last == r).mean())
            med = float(np.median(late[r]))
            if share > share_thr and med >= min_late:
                out.stragglers.append(
                    Straggler(
                        rank=reports[r].rank,
                        collective=k,
                        instances=int(n),
                        last_share=share,
                        median_late_us=med / 1e3,
                        max_late_us=float(late[r].max()) / 1e3,
                    )
                )
    if out.collectives:
        proxy = float(np.median([c.median_transfer_us for c in out.collectives])) * 1e3
        loose = [label[r] for r in range(R) if residual[r] > proxy]
        if loose:
            out.notes.append(
                f"matched collective ends of ranks {loose} scatter by more than the median transfer time "
                f"({proxy / 1e3:.1f} µs): the files may not be one job or one window; clock alignment, skew and "
                "straggler verdicts are unreliable"
            )
    mism = [k for k in keys if len({inst[r][k][0].size for r in range(R)}) > 1]
    if mism:
        out.notes.append(f"collective counts differ across ranks for {sorted(mism)[:5]}: matched by order, "
                         "the first min(count) instances")


# ----------------------------------------------------------------------------------------------------- entry points
def analyze_traces(traces: list[RankTrace], tax: Taxonomy | None = None, paths: list[str] | None = None) -> TraceReport:
    tax = tax or load_taxonomy()
    reports, states = [], []
    for tr in traces:
        rep, st = analyze_rank(tr, tax)
        reports.append(rep)
        states.append(st)
    out = TraceReport(
        paths=[str(p) for p in (paths or [t.source for t in traces])],
        ranks=reports,
        assumptions=[
            "times are interval unions clipped to iteration windows, never sums of kernel durations",
            "a GPU op belongs to the step in which it was launched; with >= 2 steps the last step is left out",
            "comm_compute_overlap_pct follows HTA get_comm_comp_overlap: |comm ∩ compute| / |comm|",
            "hidden comm = comm ∩ compute, exposed = comm − compute (an upper bound: the time comm could cost)",
            "kernel classes from catalog/kernel_taxonomy.yaml (first matching regex)",
        ],
    )
    ranks = [r.rank for r in reports]
    if len([r for r in ranks if r is not None]) != len({r for r in ranks if r is not None}):
        out.notes.append(f"duplicate ranks {ranks}: these files do not look like one job")
    gpu_states = [(s, r) for s, r in zip(states, reports, strict=True) if r.has_gpu_events]
    if len(gpu_states) >= 2:
        _multi_rank([s for s, _ in gpu_states], [r for _, r in gpu_states], tax, out)
    if not any(r.has_gpu_events for r in reports):
        out.notes.append("no GPU events in any input: the traces are host-side only")
    return out


def analyze_paths(paths: list[str | Path] | str | Path, taxonomy: str | Path | None = None, *,
                  workers: int | None = None) -> TraceReport:
    """Read and analyse trace files / directories (one job). Raises InputError on unreadable input. ``workers``:
    processes that read the Kineto files (:func:`read_traces`)."""
    if isinstance(paths, str | Path | os.PathLike):
        paths = [paths]
    tax = load_taxonomy(taxonomy)
    traces = read_traces(list(paths), workers=workers)
    return analyze_traces(traces, tax, [str(p) for p in paths])

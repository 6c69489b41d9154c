"""A lower bound on a layout's pass-2 queue key without pricing the layout (:meth:`moetune.plan.search.Search.order`).

The planner visits layouts best-first by their queue key: :func:`moetune.plan.search._walls_floor` of the base job's
walls (:func:`moetune.perfmodel.step.evaluate`): K = m x (compute + recompute + TP + CP seconds per microbatch of the
bottleneck rank b) + PP send/recv + optimizer step, where b is the rank with the longest per-microbatch time. Pricing
every layout's base job only to learn K is about half the work of a large search; most layouts' K then exceeds the
k-th best step time and they are never retuned. :class:`QueueBound` gives each layout a B <= K from values shared by
the layouts of a *group* (same precision and state mode, TP, CP, EP, ETP and MBS): the search prices a layout only
when its B is the least left in the queue, so layouts whose B exceeds the k-th best are never priced, and the order
in which layouts are retuned is that of sorting by K (proof in :meth:`moetune.plan.search.Search.order`).

The bound. Per PP rank q, :func:`~moetune.perfmodel.step.evaluate` adds per microbatch
``per_mb_q = F_q + E_q + H_q + O_q``: the floor F_q = compute + recompute + TP + CP (the stage floor), the exposed EP
dispatch/combine E_q, the exposed host time H_q and the exposed offload copies O_q, each >= 0. Per layer kind k
(:func:`~moetune.perfmodel.step._price_layer`, one :class:`~moetune.perfmodel.step.LayerPrice` per kind, the same for
every layout of a group: it reads the system, the features, TP, CP, EP, ETP, MBS and the recompute selection - none
for the base job - but not the pipeline split) with n_qk layers on rank q:

* F_q = sum_k n_qk (comp_k + rec_k + tp_k + cp_k) + 3 (g + a + e) of the rank's embedding / output-layer work
  (:func:`~moetune.perfmodel.step._extra_work`, :func:`~moetune.perfmodel.step._price_extra`; it depends on the
  group and on whether the rank holds the embedding and the loss);
* E_q = sum_k n_qk a2a_k without EP overlap (:func:`moetune.perfmodel.schedule.ep_exposed` returns the whole
  dispatch/combine time, and no SM share is charged): the base features never overlap EP (``SEARCH_RESET``; a
  group whose base job does is not bounded);
* H_q = sum_k n_qk h_k + host_exposed(extra kernels x launch, .) with h_k = :func:`~moetune.perfmodel.step.
  layer_host_gap` of kind k without EP overlap (the same for every layout of the group): the non-layer part is >= 0
  and at most ``kernels.embedding_loss x launch_us``: :func:`moetune.perfmodel.host.host_exposed` is
  ``||(gpu, host)||_p - gpu``, between 0 and ``host`` for p >= 1 (a p-norm is at least the max-norm and at most the
  1-norm; a group with p < 1 is not bounded), and a rank's non-layer kernels are at most ``embedding_loss`` (half on
  the embedding rank, half on the loss rank, :func:`~moetune.perfmodel.step._stage_works`);
* O_q = 0: the base job offloads nothing, neither layers nor fine-grained modules (a group whose profile offloads is
  not bounded).

So with Xlo_q = sum_k n_qk (a2a_k + h_k) and Xbar_q = Xlo_q + embedding_loss x launch_us, X_q := per_mb_q - F_q
lies in [Xlo_q, Xbar_q]. As b is the rank with the longest per-microbatch time, per_mb_b >= per_mb_p >= F_p + Xlo_p
for every p, so per_mb_b >= M := max_p (F_p + Xlo_p), and F_b = per_mb_b - X_b >= M - Xbar_b. Also F_b + Xbar_b >=
per_mb_b >= M: b is one of the ranks q with F_q + Xbar_q >= M, so F_b >= min over those q of max(F_q, M - Xbar_q).
The walls PP send/recv and optimizer are >= 0, so the key K >= m x F_b. Float sums of these non-negative terms in
another order (and the one subtraction, of terms of the size of a stage's time) differ from evaluate's by far less
than the relative 1e-6 taken off (the rank test ``F_q + Xbar_q >= M`` takes it off too). A group whose representative
falls outside these premises gets B = -inf (its layouts are priced as before); tests/test_plan_queue.py checks B <= K
on every layout of several requests.
"""

from __future__ import annotations

from typing import Any

from moetune.perfmodel.step import (
    extra_floor_seconds,
    job_layer_prices,
    layer_host_gap,
    pipeline_split,
    quantised_layers,
    rank_kind_counts,
)
from moetune.spec.job import Job

#: relative amount taken off the bound for rounding (module docstring)
SLACK = 1e-6


class _Group:
    """The shared parts of one group's bound: per layer kind (floor, Xlo seconds per microbatch), the floor
    seconds of the non-layer work per (embedding, loss) flags, the non-layer host seconds bound, and a memo of
    (F_q, Xlo_q) per rank content (numbered by :class:`QueueBound`)."""

    __slots__ = ("kinds", "extra", "extra_host", "ranks", "args", "quant")

    def __init__(self, kinds: dict, extra_host: float, args: tuple, quant: tuple[bool, frozenset[int]]) -> None:
        self.kinds = kinds
        self.extra: dict[tuple[bool, bool], float] = {}
        self.extra_host = extra_host
        self.ranks: dict[int, tuple[float, float]] = {}
        self.args = args  # (model, seq, mbs, cp, tp, rates) for the non-layer work
        self.quant = quant  # :func:`moetune.perfmodel.step.quantised_layers` of the group's features


class QueueBound:
    """:meth:`bound` of a layout's queue key (module docstring), from the priced representative of its group
    (:meth:`add_group`). One instance per search; its tables live as long as the search."""

    def __init__(self, eff: Any, gpus: int, gbs: int) -> None:
        self.eff = eff
        self.gpus, self.gbs = gpus, gbs
        self.groups: dict[tuple, _Group | None] = {}
        #: per (PP, VPP, pipeline layout, TP): the numbers of the distinct rank contents of its split
        self._splits: dict[tuple, tuple[int, ...]] = {}
        self._contents: dict[tuple, int] = {}  # rank content (layer ids, MTP layers, embedding, loss) -> number
        self._by_number: list[tuple] = []
        self._m: dict[tuple, int] = {}  # microbatches per (TP, CP, PP, MBS)
        self._counts: dict[tuple, tuple] = {}  # (rank content number, quantised layers) -> ((kind, count), ...)
        self._model: Any = None

    def add_group(self, gkey: tuple, job: Job) -> None:
        """Record the shared parts of group ``gkey`` from ``job``, a base job of the group (no bound when the
        premises do not hold for it: EP overlap, recompute, offloading, a host sharpness below 1)."""
        eff = self.eff
        prof, r, priced = job_layer_prices(job, eff)
        feat, lay = job.features, job.layout
        if (prof.offload_bytes or prof.fg_offload or (feat.overlap_moe_expert_parallel_comm and lay.ep > 1)
                or not r.host_queue_sharpness >= 1.0 or prof.full_recompute_frac or prof.recompute_frac
                or prof.recompute_a2a):
            self.groups[gkey] = None
            return
        sharp = r.host_queue_sharpness
        kinds = {k: (p.comp + p.rec + p.tp + p.cp, p.a2a + layer_host_gap(p, False, sharp)) for k, p in priced.items()}
        extra_host = eff.kernels["embedding_loss"] * r.launch_us * 1e-6
        self.groups[gkey] = _Group(kinds, max(extra_host, 0.0),
                                   (job.model, job.seq_length, job.micro_batch_size, lay.cp, lay.tp, r),
                                   quantised_layers(job.model, feat))

    def bound(self, gkey: tuple, lp: Any, layout_of: Any) -> float:
        """B <= the queue key of the base job of group ``gkey`` with layout point ``lp`` (module docstring); -inf
        where the group has no bound. ``layout_of(lp)``: its :class:`moetune.spec.layout.Layout` (read on the first
        layout of each split and of each microbatch count only: the search's layouts set no other split field)."""
        g = self.groups.get(gkey)
        if g is None:
            return float("-inf")
        tp = lp.tp
        sk = (lp.pp, lp.vpp, lp.pipeline_layout, tp)
        ranks = self._splits.get(sk)
        if ranks is None:
            ranks = self._splits[sk] = self._split(g, layout_of(lp))
        memo = g.ranks
        rows = []
        for n in ranks:
            got = memo.get(n)
            if got is None:
                got = memo[n] = _rank(g, self._by_number[n], self._kinds(n, g.quant))
            rows.append(got)
        top = max(f + x for f, x in rows)
        extra = g.extra_host
        cut = top * (1.0 - SLACK)
        least = min((max(f, top - x - extra) for f, x in rows if f + x + extra >= cut), default=None)
        if least is None:
            least = min(f for f, _ in rows)
        mk = (tp, lp.cp, lp.pp, lp.mbs)
        m = self._m.get(mk)
        if m is None:
            m = self._m[mk] = max(layout_of(lp).num_microbatches(self.gpus, self.gbs, lp.mbs), 1)
        b = m * least * (1.0 - SLACK)
        return b if b == b else float("-inf")

    def _kinds(self, n: int, quant: tuple[bool, frozenset[int]]) -> tuple[tuple[tuple, float], ...]:
        """(layer kind, count) of rank content ``n`` as :func:`moetune.perfmodel.step._stage_works` reads them
        (:func:`~moetune.perfmodel.step._stage_kinds` of the rank alone), for the quantised layers ``quant``."""
        got = self._counts.get((n, quant))
        if got is None:
            ids, n_mtp = self._by_number[n][:2]
            got = self._counts[(n, quant)] = tuple(rank_kind_counts(self._model, ids, n_mtp, *quant).items())
        return got

    def _split(self, g: _Group, lay: Any) -> tuple[int, ...]:
        """The numbers of the distinct rank contents of a layout's pipeline split (that of :func:`moetune.perfmodel.
        step.build_profile`: it reads the sequence only where the layout gives no valid split)."""
        model, seq = g.args[0], g.args[1]
        self._model = model  # one request: one model
        split = pipeline_split(model, lay, seq)
        out = []
        for p in range(len(split.layers)):
            content = (split.layers[p], split.mtp[p], split.embedding[p], split.loss[p])
            n = self._contents.get(content)
            if n is None:
                n = self._contents[content] = len(self._by_number)
                self._by_number.append(content)
            out.append(n)
        return tuple(dict.fromkeys(out))


def _rank(g: _Group, rank: tuple, kinds: tuple[tuple[tuple, float], ...]) -> tuple[float, float]:
    """(F_q, Xlo_q) of one rank content (decoder layer ids, MTP layers, embedding, loss) with layer kinds and counts
    ``kinds`` (:meth:`QueueBound._kinds`) in group ``g``, priced with the group's per-kind seconds."""
    emb, loss = rank[2], rank[3]
    f = x = 0.0
    gk = g.kinds
    for key, n in kinds:
        fk, xk = gk[key]
        f += n * fk
        x += n * xk
    fe = g.extra.get((emb, loss))
    if fe is None:
        model, seq, mbs, cp, tp, r = g.args
        fe = g.extra[(emb, loss)] = extra_floor_seconds(model, seq, mbs, cp, tp, emb, loss, r)
    return f + fe, x

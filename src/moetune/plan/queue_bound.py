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

from moetune.perfmodel.schedule import sm_contention
from moetune.perfmodel.step import (
    extra_floor_seconds,
    job_layer_prices,
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
    (F_q, Xlo_q) per rank signature (numbered by :class:`QueueBound`) and of the bound's least F_b per split's
    signatures."""

    __slots__ = ("kinds", "extra", "extra_host", "ranks", "least", "args", "quant", "a2a_base", "partner", "a2a",
                 "a2a_ranks")

    def __init__(self, kinds: dict, extra_host: float, args: tuple, quant: tuple[bool, frozenset[int]],
                 a2a_base: tuple[dict, float], partner: dict) -> None:
        self.kinds = kinds
        self.a2a_base = a2a_base  # (per layer kind, the base job's dispatch/combine seconds per microbatch; SM share)
        self.partner = partner  # per layer kind, its compute plus a third of its expert GEMMs (``stage_partner``)
        self.extra: dict[tuple[bool, bool], float] = {}
        self.extra_host = extra_host
        self.ranks: dict[int, tuple[float, float]] = {}
        self.least: dict[tuple[int, ...], float] = {}  # per distinct rank signatures of a split: the min of the bound
        self.args = args  # (model, seq, mbs, cp, tp, rates) for the non-layer work
        self.quant = quant  # :func:`moetune.perfmodel.step.quantised_layers` of the group's features
        #: per dispatcher searched (the base job's first): (per layer kind, the dispatch/combine seconds per
        #: microbatch; the SM share of its kernels), None until :meth:`QueueBound.step_bound` first needs them; and per
        #: rank signature, (its EP-overlap partner seconds, per dispatcher (dispatch/combine seconds, SM share))
        self.a2a: list[tuple[dict, float]] | None = None
        self.a2a_ranks: dict[int, tuple[float, list[tuple[float, float]]]] = {}


class QueueBound:
    """:meth:`bound` of a layout's queue key (module docstring), from the priced representative of its group
    (:meth:`add_group`). One instance per search; its tables live as long as the search."""

    def __init__(self, eff: Any, gpus: int, gbs: int) -> None:
        self.eff = eff
        self.gpus, self.gbs = gpus, gbs
        self.groups: dict[tuple, _Group | None] = {}
        #: per (PP, VPP, pipeline layout, TP): the numbers of the distinct rank contents of its split, and its VPP
        self._splits: dict[tuple, tuple[tuple[int, ...], int]] = {}
        self._contents: dict[tuple, int] = {}  # rank content (layer ids, MTP layers, embedding, loss) -> number
        self._by_number: list[tuple] = []
        #: per (PP, VPP, pipeline layout, TP, quantised layers): the numbers of the distinct rank signatures of its
        #: split, and its VPP
        self._sig_splits: dict[tuple, tuple[tuple[int, ...], int]] = {}
        #: rank signature (((layer kind, count), ...), embedding, loss): all that a rank's terms read -> number
        self._sigs: dict[tuple, int] = {}
        self._sig_by_number: list[tuple] = []
        self._m: dict[tuple, int] = {}  # microbatches per (TP, CP, PP, MBS)
        self._sig_of: dict[tuple, int] = {}  # (rank content number, quantised layers) -> rank signature number
        self._model: Any = None

    def add_group(self, gkey: tuple, job: Job) -> None:
        """Record the shared parts of group ``gkey`` from ``job``, a base job of the group (no bound when the
        premises do not hold for it: EP overlap, recompute, offloading, a host sharpness below 1)."""
        eff = self.eff
        prof, r, priced, sm_frac = job_layer_prices(job, eff)
        feat, lay = job.features, job.layout
        if (prof.offload_bytes or prof.fg_offload or (feat.overlap_moe_expert_parallel_comm and lay.ep > 1)
                or not r.host_queue_sharpness >= 1.0 or prof.full_recompute_frac or prof.recompute_frac
                or prof.recompute_a2a):
            self.groups[gkey] = None
            return
        # ``p.gap``: :func:`layer_host_gap` of the price without EP overlap at the job's host sharpness
        kinds = {k: (p.comp + p.rec + p.tp + p.cp, p.a2a + p.gap) for k, p in priced.items()}
        extra_host = eff.kernels["embedding_loss"] * r.launch_us * 1e-6
        self.groups[gkey] = _Group(kinds, max(extra_host, 0.0),
                                   (job.model, job.seq_length, job.micro_batch_size, lay.cp, lay.tp, r),
                                   quantised_layers(job.model, feat), ({k: p.a2a for k, p in priced.items()}, sm_frac),
                                   {k: p.comp + p.exp / 3.0 for k, p in priced.items()})

    def bound(self, gkey: tuple, lp: Any, layout_of: Any) -> float:
        """B <= the queue key of the base job of group ``gkey`` with layout point ``lp`` (module docstring); -inf
        where the group has no bound. ``layout_of(lp)``: its :class:`moetune.spec.layout.Layout` (read on the first
        layout of each split and of each microbatch count only: the search's layouts set no other split field)."""
        g = self.groups.get(gkey)
        if g is None:
            return float("-inf")
        sigs = self._ranks(g, lp, layout_of)[0]
        least = g.least.get(sigs)
        if least is None:  # the least F_b for these rank signatures (splits of one group often share them)
            rows = self._rows(g, sigs)
            top = max(f + x for f, x in rows)
            extra = g.extra_host
            cut = top * (1.0 - SLACK)
            least = min((max(f, top - x - extra) for f, x in rows if f + x + extra >= cut), default=None)
            if least is None:
                least = min(f for f, _ in rows)
            g.least[sigs] = least
        b = self._micro(lp, layout_of) * least * (1.0 - SLACK)
        return b if b == b else float("-inf")

    def step_bound(self, gkey: tuple, lp: Any, layout_of: Any, dispatch_jobs: Any, fixed: float = 0.0) -> float:
        """S <= the :func:`moetune.plan.search._schedule_floor` of the base job of group ``gkey`` with layout point
        ``lp`` with the EP term of the base job's own dispatcher and with that of each job in ``dispatch_jobs()``
        (the group's base job with each dispatcher the search tries, called once per group): so S <=
        :meth:`moetune.plan.search.Search.ep_floor` of the layout, the bound :meth:`~moetune.plan.search.Search.
        pass_2` compares with the k-th best before it retunes a layout (an EP term is >= 0: the ``_schedule_floor``
        without one, tested first there, is never above it). ``fixed``: at most the PP send/recv, optimizer and once-per-step host seconds of
        that base job (0 when unknown). -inf where the group has no bound.

        Proof. ``_schedule_floor`` is :func:`moetune.perfmodel.schedule.pipeline_step` of the largest per-stage sum
        plus the PP send/recv, optimizer and once-per-step host seconds (each >= 0), less a relative 1e-9. A stage's
        sum is its floor (F_q of the module docstring: the same non-negative terms in another order) plus, where
        ``ep_overlap_eff`` is in [0, 1], the least over the dispatchers d of :func:`ep_term` (A_dq, ``ep_overlap_eff``
        x min(A_dq, P_q) x (1 - 1/m), s_d), which this bound computes the same way from: A_dq = sum_k n_qk a2a_k(d),
        the stage's dispatch/combine seconds (:func:`moetune.perfmodel.step._stage_a2a`; the per-kind seconds and
        the dispatcher's SM share s_d are the group's: they do not read the split), and P_q = ``stage_partner`` of
        the base job = sum_k n_qk (comp_k + exp_k / 3) + the non-layer compute (``_schedule_floor`` reads the base
        job's partner whatever the dispatcher). ``pipeline_step`` of one stage time S_max is ``(m + (pp - 1) / vpp)
        x S_max`` (``m x S_max`` at PP 1), non-decreasing in S_max, so S = (m + (pp - 1) / vpp) x max_q (F_q +
        min_d ep_term) + ``fixed``, less the relative :data:`SLACK`, is at most each of those floors: the sums here
        add the same terms in another order, and ``ep_term`` moves by at most its argument's rounding (its slope in
        A and P is within [-1, 1]), far less than the slack."""
        g = self.groups.get(gkey)
        if g is None:
            return float("-inf")
        if g.a2a is None:
            g.a2a = [g.a2a_base]
            for job in dispatch_jobs():
                _, _, priced, sm_frac = job_layer_prices(job, self.eff)
                g.a2a.append(({k: p.a2a for k, p in priced.items()}, sm_frac))
        ranks, vpp = self._ranks(g, lp, layout_of)
        rows = self._rows(g, ranks)
        m = self._micro(lp, layout_of)
        eff = g.args[5].ep_overlap_eff
        late = 1 - 1 / max(m, 1)
        memo = g.a2a_ranks
        top = 0.0
        for n, (f, _) in zip(ranks, rows, strict=True):
            got = memo.get(n)
            if got is None:
                kinds, emb, loss = self._sig_by_number[n]
                pq = g.extra[(emb, loss)]
                for key, cnt in kinds:
                    pq += cnt * g.partner[key]
                got = memo[n] = (pq, [(sum(cnt * a2a.get(key, 0.0) for key, cnt in kinds), sm) for a2a, sm in g.a2a])
            pq, by_disp = got
            v = f
            if 0.0 <= eff <= 1.0:
                v += min(ep_term(a, eff * min(a, pq) * late, sm) for a, sm in by_disp)
            if v > top:
                top = v
        steps = m + (lp.pp - 1) / max(vpp, 1) if lp.pp > 1 else m
        s = (steps * top + fixed) * (1.0 - SLACK)
        return s if s == s else float("-inf")

    def _ranks(self, g: _Group, lp: Any, layout_of: Any) -> tuple[tuple[int, ...], int]:
        """The numbers of the distinct rank signatures (:meth:`_sig`) of the layout point's split (:meth:`_split`,
        memoised per (PP, VPP, pipeline layout, TP)) with the group's quantised layers, and its VPP; memoised per
        (PP, VPP, pipeline layout, TP, quantised layers). Ranks of one signature have the same (F_q, Xlo_q) and the
        same EP terms, and the bounds are a max and a min over ranks, so each signature is read once."""
        key = (lp.pp, lp.vpp, lp.pipeline_layout, lp.tp, g.quant)
        got = self._sig_splits.get(key)
        if got is None:
            sk = key[:4]
            split = self._splits.get(sk)
            if split is None:
                split = self._splits[sk] = self._split(g, layout_of(lp))
            got = self._sig_splits[key] = (tuple(dict.fromkeys(self._sig(n, g.quant) for n in split[0])), split[1])
        return got

    def _rows(self, g: _Group, ranks: tuple[int, ...]) -> list[tuple[float, float]]:
        """(F_q, Xlo_q) of each rank signature numbered in ``ranks`` (memoised per group)."""
        memo = g.ranks
        rows = []
        for n in ranks:
            row = memo.get(n)
            if row is None:
                row = memo[n] = _rank(g, self._sig_by_number[n])
            rows.append(row)
        return rows

    def _micro(self, lp: Any, layout_of: Any) -> int:
        """Microbatches per step of the layout point (at least 1, as :func:`moetune.perfmodel.step.build_profile`)."""
        mk = (lp.tp, lp.cp, lp.pp, lp.mbs)
        m = self._m.get(mk)
        if m is None:
            m = self._m[mk] = max(layout_of(lp).num_microbatches(self.gpus, self.gbs, lp.mbs), 1)
        return m

    def _sig(self, n: int, quant: tuple[bool, frozenset[int]]) -> int:
        """The number of the signature of rank content ``n`` for the quantised layers ``quant``: ((layer kind,
        count), ...) as :func:`moetune.perfmodel.step._stage_works` reads them (:func:`~moetune.perfmodel.step.
        _stage_kinds` of the rank alone), in their order, and the embedding and loss flags - all that
        :func:`_rank` and :meth:`step_bound` read of a rank (the middle ranks of a split mostly share one)."""
        got = self._sig_of.get((n, quant))
        if got is None:
            ids, n_mtp, emb, loss = self._by_number[n]
            sig = (tuple(rank_kind_counts(self._model, ids, n_mtp, *quant).items()), emb, loss)
            got = self._sigs.get(sig)
            if got is None:
                got = self._sigs[sig] = len(self._sig_by_number)
                self._sig_by_number.append(sig)
            self._sig_of[(n, quant)] = got
        return got

    def _split(self, g: _Group, lay: Any) -> tuple[tuple[int, ...], int]:
        """The numbers of the distinct rank contents of a layout's pipeline split (that of :func:`moetune.perfmodel.
        step.build_profile`: it reads the sequence only where the layout gives no valid split), and its virtual
        stages per rank (the ``vpp`` of the schedule, :func:`moetune.perfmodel.step.evaluate`)."""
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
        return tuple(dict.fromkeys(out)), split.vpp


def _rank(g: _Group, sig: tuple) -> tuple[float, float]:
    """(F_q, Xlo_q) of a rank of signature ``sig`` (:meth:`QueueBound._sig`: ((layer kind, count), ...), embedding,
    loss) in group ``g``, priced with the group's per-kind seconds."""
    kinds, emb, loss = sig
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


def ep_term(a2a: float, hidden: float, sm_frac: float) -> float:
    """The least exposed EP time of :func:`moetune.plan.search._schedule_floor`: ``a2a`` less at most ``hidden``
    seconds hidden, plus the SM contention charged on what is hidden (:func:`moetune.perfmodel.schedule.sm_contention`)
    where that falls as more is hidden, else ``a2a``."""
    if sm_contention(1.0, sm_frac) <= 1.0:
        return a2a - hidden + sm_contention(hidden, sm_frac)
    return a2a

"""The planner's lazy queue (Search.order, plan/queue_bound.py): each layout's bound never exceeds its queue key, the
layouts come out in the order of sorting by (key, index), and a search with the bound returns exactly what the search
that prices every layout's base job first returns (candidates, per-layout bests, misses, notes, counters)."""

from __future__ import annotations

import pytest

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.plan import search as P
from moetune.plan.queue_bound import QueueBound


def _req(model: str, system: str, gpus: int, gbs: int, **kw) -> P.PlanRequest:
    return P.PlanRequest(model=get_model(model), system=get_system(system), gpus=gpus, global_batch_size=gbs,
                         seq_length=kw.pop("seq", 4096), workers=1, **kw)


#: MoE and dense models, BF16 and FP8 / MXFP8 (quantised and BF16 edge layers), MTP + loss stages, Megatron-FSDP modes
_REQUESTS = [
    dict(model="Qwen3-30B-A3B", system="DGX-H100", gpus=16, gbs=512),
    dict(model="DeepSeek-V2-Lite", system="DGX-H100", gpus=16, gbs=512, precisions=("bf16", "fp8_cs")),
    dict(model="DeepSeek-V3", system="GB200-NVL72", gpus=64, gbs=512, precisions=("mxfp8",)),
    dict(model="GPT-OSS-20B", system="DGX-B200", gpus=8, gbs=128),
    dict(model="Llama-3-8B", system="DGX-H100", gpus=8, gbs=128, seq=8192),
]


def _queued(req: P.PlanRequest) -> P.Search:
    s = P.Search(req)
    s.pass_1()
    return s


@pytest.mark.parametrize("kw", _REQUESTS)
def test_queue_bound_never_exceeds_the_key(kw):
    """B <= K for every queued layout (the soundness of QueueBound), and the bound is informative: within 10 % of the
    key for most layouts (a bound that returned -inf everywhere would pass the first test)."""
    kw = dict(kw)
    req = _req(kw.pop("model"), kw.pop("system"), kw.pop("gpus"), kw.pop("gbs"), **kw)
    s = _queued(req)
    qb = QueueBound(s.eff, req.gpus, req.global_batch_size)
    tight = n = 0
    for lp, mode in s.queue:
        gkey = (mode, lp.tp, lp.cp, lp.ep, lp.etp, lp.mbs)
        feats = s.features(mode, lp, {})
        if gkey not in qb.groups:
            qb.add_group(gkey, s.job_of(lp, feats))
        b = qb.bound(gkey, lp, s.layout_of)
        k = P._walls_floor(s.time_of(lp, feats).walls)
        assert b <= k, (lp, mode, b, k)
        n += 1
        tight += b >= 0.9 * k
    assert n and tight >= 0.8 * n


@pytest.mark.parametrize("kw", _REQUESTS[:3])
def test_lazy_order_is_the_sorted_order(kw):
    """Search.order with the bound yields every queued layout in the order of sorting the priced keys by (key, index),
    the order of the search without it."""
    kw = dict(kw)
    req = _req(kw.pop("model"), kw.pop("system"), kw.pop("gpus"), kw.pop("gbs"), **kw)
    lazy, plain = _queued(req), P.Search(req, queue_bound=False)
    plain.pass_1()
    got = [(k, lp.key(), mode, sf) for k, lp, mode, sf in lazy.order()]
    want = [(k, lp.key(), mode, sf) for k, lp, mode, sf in plain.order()]
    keys = sorted((P._walls_floor(plain.time_of(lp, plain.features(mode, lp, {})).walls), i)
                  for i, (lp, mode) in enumerate(plain.queue))
    assert got == want
    assert [k for k, *_ in got] == [k for k, _ in keys]
    assert [x[1:3] for x in got] == [(plain.queue[i][0].key(), plain.queue[i][1]) for _, i in keys]


@pytest.mark.parametrize("kw", [*_REQUESTS, dict(model="Qwen3-30B-A3B", system="DGX-H100", gpus=8, gbs=256, top=3,
                                                 exact_ranking=True, mbs_options=(1, 2))])
def test_queue_bound_changes_nothing_but_the_work(kw):
    """The same candidates, per-layout bests, closest misses, notes and counters as the search that prices every
    layout's base job before visiting any; fewer base jobs priced."""
    kw = dict(kw)
    req = _req(kw.pop("model"), kw.pop("system"), kw.pop("gpus"), kw.pop("gbs"), **kw)
    fast, plain = P.Search(req), P.Search(req, queue_bound=False)
    got, want = fast.run(), plain.run()

    def summary(res):
        return ([(c.sort_key(), c.time.model_dump(), [(x.pp_rank, x.peak_allocated_gib, x.reserved_gib, x.device_gib, x.components)
                  for x in c.memory.stages], c.recompute_rank) for c in res.candidates],
                res.per_layout_best, [(o, j) for o, j in res.closest], res.notes, res.searched, res.feasible,
                res.layouts, res.pruned_memory, res.pruned_bound, res.rejected_by_check, res.rejected_rules)

    assert summary(got) == summary(want)
    assert len(fast._time_cache) <= len(plain._time_cache)


def _ep_floor_of(s: P.Search, lp, mode) -> float:
    """What :meth:`Search.ep_floor` compares with the k-th best: the least ``_schedule_floor`` of the base job with
    its own dispatcher's EP term or with that of each dispatcher searched."""
    base = s.time_of(lp, s.features(mode, lp, {}))
    disp = [s.a2a_of(lp, s.features(mode, lp, d)) for d in P._dispatcher_variants(s.req, lp)]
    return min(P._schedule_floor(base, [x]) for x in [base, *disp])


def _some(queue: list) -> list:
    """The whole queue, or two runs of it (consecutive layouts: those of one split at every MBS) when long."""
    n = len(queue)
    return queue if n < 1200 else queue[:400] + queue[n // 2:n // 2 + 400] + queue[-400:]


#: the requests of ``_REQUESTS`` and a pipelined MoE with VPP, all dispatchers (flex ones with an SM share)
_STEP_REQUESTS = [*_REQUESTS, dict(model="DeepSeek-V3", system="DGX-H100", gpus=256, gbs=1024,
                                   dispatchers=("alltoall", "deepep", "hybridep", "allgather"))]


@pytest.mark.parametrize("kw", _STEP_REQUESTS)
def test_step_bound_never_exceeds_the_ep_floor(kw):
    """S <= the EP floor (the schedule floor with the least dispatcher EP term) for every queued layout, with the
    optimizer and once-per-step host seconds of the same layout at another MBS as the search passes them; and S is
    informative: within 20 % of that floor for most layouts."""
    kw = dict(kw)
    req = _req(kw.pop("model"), kw.pop("system"), kw.pop("gpus"), kw.pop("gbs"), **kw)
    s = _queued(req)
    qb = QueueBound(s.eff, req.gpus, req.global_batch_size)
    queue = _some(s.queue)
    fixed: dict[tuple, float] = {}
    tight = n = 0
    for lp, mode in queue:
        gkey = (mode, lp.tp, lp.cp, lp.ep, lp.etp, lp.mbs)
        if gkey not in qb.groups:
            qb.add_group(gkey, s.job_of(lp, s.features(mode, lp, {})))
        res = s.time_of(lp, s.features(mode, lp, {}))
        sk = P._split_key(mode, lp)
        step = qb.step_bound(gkey, lp, s.layout_of, lambda lp=lp, mode=mode: s.dispatch_jobs(lp, mode),
                             fixed.get(sk, 0.0))
        fixed.setdefault(sk, res.walls["optimizer"] + res.step_host)
        floor = _ep_floor_of(s, lp, mode)
        assert step <= floor, (lp, mode, step, floor)
        if qb.groups[gkey] is not None:
            n += 1
            tight += step >= 0.8 * floor
    assert n and tight >= 0.8 * n


@pytest.mark.parametrize("kw", _STEP_REQUESTS)
def test_optimizer_and_step_host_do_not_read_the_microbatch_size(kw):
    """The premise of the ``fixed`` term the search passes to the step bound: base jobs that differ only in MBS have
    the same optimizer and once-per-step host seconds."""
    kw = dict(kw)
    req = _req(kw.pop("model"), kw.pop("system"), kw.pop("gpus"), kw.pop("gbs"), **kw)
    s = _queued(req)
    seen: dict[tuple, float] = {}
    mbs: dict[tuple, set] = {}
    for lp, mode in _some(s.queue):
        res = s.time_of(lp, s.features(mode, lp, {}))
        sk = P._split_key(mode, lp)
        assert seen.setdefault(sk, res.walls["optimizer"] + res.step_host) == res.walls["optimizer"] + res.step_host
        mbs.setdefault(sk, set()).add(lp.mbs)
    assert any(len(v) > 1 for v in mbs.values())


@pytest.mark.parametrize("kw", [_REQUESTS[0], _REQUESTS[2], _STEP_REQUESTS[-1]])
def test_unpriced_skips_change_nothing(kw):
    """The layouts :meth:`Search.order` answers without pricing (a bound above the k-th best, a step bound above it)
    are some, and the search gives exactly what the search without them gives (queue bound off: every base job is
    priced and every layout goes through :meth:`Search.pass_2`'s own tests), counters included."""
    kw = dict(kw)
    req = _req(kw.pop("model"), kw.pop("system"), kw.pop("gpus"), kw.pop("gbs"), **kw)
    fast, plain = P.Search(req), P.Search(req, queue_bound=False)
    skipped = []
    order = fast.order

    def watched():
        for key, lp, mode, sf in order():
            if (lp.key(), id(fast.features(mode, lp, {}))) not in fast._time_cache:
                skipped.append(lp)
            yield key, lp, mode, sf

    fast.order = watched
    got, want = fast.run(), plain.run()
    assert skipped
    assert [c.sort_key() for c in got.candidates] == [c.sort_key() for c in want.candidates]
    assert got.per_layout_best == want.per_layout_best
    assert (got.searched, got.feasible, got.pruned_memory, got.pruned_bound, got.rejected_by_check) == \
        (want.searched, want.feasible, want.pruned_memory, want.pruned_bound, want.rejected_by_check)


class _PerContent(QueueBound):
    """The bounds read rank content by rank content (the oracle of the signatures): every distinct rank content of
    the split gets its own signature, so no two contents share their terms, and no split reuses another's least."""

    def bound(self, gkey, lp, layout_of):
        if self.groups.get(gkey) is not None:
            self.groups[gkey].least.clear()
        return super().bound(gkey, lp, layout_of)

    def _sig(self, n, quant):
        from moetune.perfmodel.step import rank_kind_counts

        got = self._sig_of.get((n, quant))
        if got is None:
            ids, n_mtp, emb, loss = self._by_number[n]
            got = self._sig_of[(n, quant)] = len(self._sig_by_number)
            self._sig_by_number.append((tuple(rank_kind_counts(self._model, ids, n_mtp, *quant).items()), emb, loss))
        return got

    def _ranks(self, g, lp, layout_of):
        contents, vpp = self._split(g, layout_of(lp))
        return tuple(self._sig(n, g.quant) for n in contents), vpp


@pytest.mark.parametrize("kw", _STEP_REQUESTS)
def test_rank_signatures_give_the_per_content_bounds(kw):
    """B and S read each distinct rank signature once (ranks with the same layer-kind counts, embedding and loss share
    their terms, splits with the same signatures their least F_b): both equal, bit for bit, the bounds read rank
    content by rank content, on every queued layout."""
    kw = dict(kw)
    req = _req(kw.pop("model"), kw.pop("system"), kw.pop("gpus"), kw.pop("gbs"), **kw)
    s = _queued(req)
    fast, slow = (cls(s.eff, req.gpus, req.global_batch_size) for cls in (QueueBound, _PerContent))
    shared = 0
    for lp, mode in s.queue:
        gkey = (mode, lp.tp, lp.cp, lp.ep, lp.etp, lp.mbs)
        for qb in (fast, slow):
            if gkey not in qb.groups:
                qb.add_group(gkey, s.job_of(lp, s.features(mode, lp, {})))
        assert fast.bound(gkey, lp, s.layout_of) == slow.bound(gkey, lp, s.layout_of)
        jobs = lambda lp=lp, mode=mode: s.dispatch_jobs(lp, mode)  # noqa: E731
        assert fast.step_bound(gkey, lp, s.layout_of, jobs, 1.5) == slow.step_bound(gkey, lp, s.layout_of, jobs, 1.5)
        if fast.groups[gkey] is not None:
            shared += len(fast._ranks(fast.groups[gkey], lp, s.layout_of)[0]) < len(
                slow._ranks(slow.groups[gkey], lp, s.layout_of)[0])
    assert shared

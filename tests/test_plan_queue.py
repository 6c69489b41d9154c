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

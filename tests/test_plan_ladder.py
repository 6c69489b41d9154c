"""The bounds that end a layout's retuning early are sound: the recompute ladder's (Search.ladder_rest_pruned,
moetune.plan.ladder: the options it calls contained recompute at least as much on every stage, its bound never exceeds
the step time of a variant of the rest of the ladder) and layer-level CPU offloading's (Search.offload_pruned); plans
with and without them are the same."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.perfmodel import step as T
from moetune.plan import ladder as L
from moetune.plan import search as P
from moetune.plan.space import SpaceLimits, enumerate_layouts


def _req(model: str, gpus: int, gbs: int, **kw) -> P.PlanRequest:
    return P.PlanRequest(model=get_model(model), system=get_system(kw.pop("system", "DGX-H100")), gpus=gpus,
                         global_batch_size=gbs, seq_length=4096, dispatchers=("alltoall", "deepep", "hybridep",
                                                                             "allgather"), **kw)


_DSV2 = _req("DeepSeek-V2-Lite", 16, 512)
_DSV2_LAYOUTS = list(enumerate_layouts(_DSV2.model, _DSV2.system, 16, 512, 4096, SpaceLimits()))
_QWEN = _req("Qwen3-30B-A3B", 16, 512)
_QWEN_LAYOUTS = list(enumerate_layouts(_QWEN.model, _QWEN.system, 16, 512, 4096, SpaceLimits()))


def test_containment_follows_the_recompute_modules():
    """Full recompute (uniform) contains every option, block full recompute none; a selective option contains the
    ones whose modules recompute a subset of its tags; ``moe`` contains ``moe_act`` (it re-runs the activation too)."""
    from moetune.io.load import parse_recompute

    terms = {t: L.recompute_terms(parse_recompute(t)) for t in
             ("none", "moe_act", "moe", "mla_up_proj", "mla_up_proj,moe_act", "full", "full:block:2", "layernorm")}
    assert all(L.contains(terms["full"], t) for k, t in terms.items() if k != "full:block:2")
    assert not L.contains(terms["full:block:2"], terms["none"]) and not L.contains(terms["full"], terms["full:block:2"])
    assert L.contains(terms["moe"], terms["moe_act"]) and not L.contains(terms["moe_act"], terms["moe"])
    assert L.contains(terms["mla_up_proj,moe_act"], terms["mla_up_proj"])
    assert not L.contains(terms["moe"], terms["mla_up_proj"]) and not L.contains(terms["moe"], terms["layernorm"])
    assert all(L.contains(t, terms["none"]) for k, t in terms.items() if k != "full:block:2")
    opts = P._recompute_options(get_model("DeepSeek-V3"), "full")
    cores = L.ladder_cores(opts)
    assert cores[0] and cores[-1]  # no recompute is contained in every option; the last option has no later one
    assert [r for (r, _), c in zip(opts, cores, strict=True) if c] == [0, 2, 8, 9, 99]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_DSV2_LAYOUTS + _QWEN_LAYOUTS), st.sampled_from(("alltoall", "deepep", "allgather")))
def test_contained_recompute_adds_at_least_as_much_on_every_stage(lp, dispatcher):
    """What the proof rests on: where option ``big`` contains option ``small``, every stage's variant-invariant floor
    (compute + recompute + TP + CP, ``StepWalls.stage_floor``) under ``big`` is at least that under ``small``, for the
    same layout and dispatcher, and the EP dispatch/combine seconds are the same."""
    req = _DSV2 if lp in _DSV2_LAYOUTS else _QWEN
    search = P.Search(req)
    mode = (req.precisions[0], False)
    disp = next(d for d in P._dispatcher_variants(req, lp)
                if d["moe_token_dispatcher_type"] == dispatcher or d["moe_flex_dispatcher_backend"] == dispatcher
                or lp.ep == 1)
    opts = [rec for _, rec in search.rec_opts]
    terms = [L.recompute_terms(rec) for rec in opts]
    walls = [T.estimate_walls(search.job_of(lp, search.features(mode, lp, {**rec, **disp}))) for rec in opts]
    for i, small in enumerate(terms):
        for j, big in enumerate(terms):
            if i != j and L.contains(big, small):
                assert all(b >= s * (1 - 1e-12) for b, s in zip(walls[j].stage_floor, walls[i].stage_floor,
                                                                   strict=True))
                assert walls[j].stage_a2a == walls[i].stage_a2a


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([lp for lp in _DSV2_LAYOUTS + _QWEN_LAYOUTS if lp.ep > 1]))
def test_stage_floor_less_recomputed_dispatch_does_not_depend_on_the_dispatcher(lp):
    """What ``_schedule_floor(..., less=stage_rec_a2a)`` rests on: for every recompute option, a stage's floor less
    its recomputed dispatch/combines is the same with every dispatcher (those seconds are >= 0, and > 0 only where the
    recompute re-runs the dispatch), and without such recompute they are 0."""
    req = _DSV2 if lp in _DSV2_LAYOUTS else _QWEN
    search = P.Search(req)
    mode = (req.precisions[0], False)
    for _, rec in search.rec_opts:
        got = []
        for d in P._dispatcher_variants(req, lp):
            w = T.estimate_walls(search.job_of(lp, search.features(mode, lp, {**rec, **d})))
            assert all(x >= 0.0 for x in w.stage_rec_a2a)
            assert any(w.stage_rec_a2a) == (P._recomputes_dispatch(rec) and any(w.stage_a2a))
            got.append([f - r for f, r in zip(w.stage_floor, w.stage_rec_a2a, strict=True)])
        for other in got[1:]:
            assert other == pytest.approx(got[0], rel=1e-12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([lp for lp in _DSV2_LAYOUTS + _QWEN_LAYOUTS if lp.ep > 1] + _DSV2_LAYOUTS[::50]),
       st.integers(0, 10**6))
def test_ladder_rest_bound_never_prunes_a_recordable_variant(lp, pick):
    """Where Search.ladder_rest_pruned ends the ladder before option ``j`` (the k-th best and the layout's best so far
    set just above / at the bound), no variant of option ``j`` or a later one that is not already fitted has a step
    time that could be recorded (below the layout's best and at most the k-th best)."""
    req = _DSV2 if lp in _DSV2_LAYOUTS else _QWEN
    search = P.Search(req)
    mode = (req.precisions[0], False)
    variants = [(j, d, g, ov) for j, (_, rec) in enumerate(search.rec_opts) for d in P._dispatcher_variants(req, lp)
                for g in P._graph_variants(req, rec, d) for ov in P._overlap_variants(req, lp, rec)]
    step = {}
    for j, d, g, ov in variants:
        rec = search.rec_opts[j][1]
        job = search.job_of(lp, search.features(mode, lp, {**rec, **d, **ov, **g}))
        step[(j, *d.values(), *g.values(), *ov.values())] = T.estimate_time(job).step_time_s
    vkeys = sorted({(d["moe_token_dispatcher_type"], d["moe_flex_dispatcher_backend"], g["cuda_graph_impl"],
                     g["cuda_graph_scope"]) for _, d, g, _ in variants}, key=repr)
    fitted = {v for i, v in enumerate(vkeys) if (pick >> i) & 1}  # any subset may have fitted at a lesser option
    ordered = sorted(step.values())
    for j, core in enumerate(search._ladder_cores):
        if not core:
            continue
        rest = [s for (i, disp, backend, impl, scope, *_), s in step.items()
                if i >= j and (disp, backend, impl, scope) not in fitted]
        for kth in (ordered[0] * 0.999, ordered[len(ordered) // 2], ordered[-1]):
            for prev in (None, kth * 0.98, kth * 1.5):
                search.kth_best = lambda kth=kth: kth
                search.best_by_layout = {} if prev is None else {lp.key(): _Best(prev)}
                if search.ladder_rest_pruned(lp, mode, j, fitted):
                    assert all(s > kth or (prev is not None and s >= prev) for s in rest)


class _Best:
    """A layout's best so far, as Search.consider reads it."""

    def __init__(self, step: float) -> None:
        self.step_time_s = step


@pytest.mark.parametrize("req,layouts", [
    (_DSV2, _DSV2_LAYOUTS[::7]), (_QWEN, _QWEN_LAYOUTS[::5]),
    (_req("Qwen3-30B-A3B", 16, 512, fix={"cuda_graph_scope": "full_iteration", "paged_stash": 1}), _QWEN_LAYOUTS[::11]),
    (_req("DeepSeek-V2-Lite", 16, 512, fix={"ep_overlap": 1}, max_recompute="full"), _DSV2_LAYOUTS[::13]),
    (_req("Llama-3.1-8B", 16, 512), [None])])
def test_rest_keys_equal_the_per_call_sets(req, layouts):
    """Search.rest_graphs / rest_overlap (memoised per ladder option and dispatcher / ep, pp, vpp) equal the sets
    ladder_rest_pruned built on every call from the rest of the ladder, on every layout point and option."""
    if layouts == [None]:
        layouts = list(enumerate_layouts(req.model, req.system, 16, 512, 4096, SpaceLimits()))[::9]
    s = P.Search(req)
    assert layouts
    for lp in layouts:
        for j in range(len(s.rec_opts)):
            rest = [r for _, r in s.rec_opts[j:]]
            overlap = any(ov["overlap_moe_expert_parallel_comm"] for r in rest for ov in P._overlap_variants(req, lp, r))
            assert s.rest_overlap(lp, j) is overlap
            for disp in P._dispatcher_variants(req, lp):
                dk = (disp["moe_token_dispatcher_type"], disp["moe_flex_dispatcher_backend"])
                graphs = {(*dk, g["cuda_graph_impl"], g["cuda_graph_scope"]) for r in rest
                          for g in P._graph_variants(req, r, disp)}
                assert s.rest_graphs(j, disp) == graphs


@pytest.mark.parametrize("kw", [dict(model="DeepSeek-V2-Lite", gpus=16, gbs=512, top=3),
                                dict(model="DeepSeek-V2-Lite", gpus=32, gbs=1024, top=5, precisions=("bf16", "fp8_cs")),
                                dict(model="Qwen3-30B-A3B", gpus=16, gbs=1024, top=3, mbs_options=(1, 2)),
                                dict(model="Mixtral-8x7B", gpus=16, gbs=256, top=4)])
def test_plans_with_and_without_the_ladder_bound_agree(kw, monkeypatch):
    """Plans whose ladders end early are those of the full ladders: same candidates, per-layout bests, closest misses
    and notes (only the work counters differ), and the bound does end some ladders."""
    from tests.test_plan_fastpath import _summary

    kw = dict(kw)
    req = _req(kw.pop("model"), kw.pop("gpus"), kw.pop("gbs"), **kw)
    fast = P.Search(req)
    got = fast.run()
    calls = []
    real = P.Search.ladder_rest_pruned

    def spy(self, *a):
        calls.append(real(self, *a))
        return False

    monkeypatch.setattr(P.Search, "ladder_rest_pruned", spy)
    want = P.Search(req).run()
    assert _summary(got) == _summary(want)
    assert calls and any(calls)


_OFFLOAD = _req("Qwen3-30B-A3B", 8, 128)
_PP1 = [lp for lp in enumerate_layouts(_OFFLOAD.model, _OFFLOAD.system, 8, 128, 4096, SpaceLimits()) if lp.pp == 1]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_PP1))
def test_offload_bound_never_prunes_a_recordable_variant(lp):
    """Where Search.offload_pruned rules the layer-offloading variants out (the k-th best and the layout's best so far
    set around the bound), no variant Search.layer_offload could price - any offloaded layer count of the eighths,
    dispatcher, EP overlap, CUDA graphs - could be recorded; and the exposed copies grow with the offloaded layers."""
    req = _OFFLOAD
    search = P.Search(req)
    mode = (req.precisions[0], False)
    none = search.rec_opts[0][1]
    nl = req.model.num_layers
    counts = sorted({min(max(1, -(-k * nl // 8)), nl - 1) for k in P.LAYER_OFFLOAD_EIGHTHS})
    steps, copies = [], []
    for n in counts:
        extra = {"cpu_offloading": True, "cpu_offloading_num_layers": n}
        copies.append(T.estimate_walls(search.job_of(lp, search.features(mode, lp, {**none, **extra}))).stage_offload)
        for d in P._dispatcher_variants(req, lp):
            for g in P._graph_variants(req, {**none, **extra}, d):
                for ov in P._overlap_variants(req, lp, none):
                    job = search.job_of(lp, search.features(mode, lp, {**none, **extra, **d, **ov, **g}))
                    steps.append(T.estimate_time(job).step_time_s)
    assert all(b >= a for x, y in zip(copies, copies[1:], strict=False) for a, b in zip(x, y, strict=True))
    upd = {**none, "cpu_offloading": True, "cpu_offloading_num_layers": counts[0]}
    pruned = 0
    for kth in sorted(steps)[:: max(1, len(steps) // 4)] + [min(steps) * 0.9, 0.0]:
        for prev in (None, kth * 0.97, kth * 1.3):
            search.kth_best = lambda kth=kth: kth
            search.best_by_layout = {} if prev is None else {lp.key(): _Best(prev)}
            if search.offload_pruned(lp, mode, upd):
                pruned += 1
                assert all(s > kth or (prev is not None and s >= prev) for s in steps)
    assert pruned  # with a k-th best of 0 s the bound rules every variant out


def test_plans_with_and_without_the_offload_bound_agree(monkeypatch):
    """Plans where the layer-offloading bound skips layouts are those that price their offloading variants."""
    from tests.test_plan_fastpath import _summary

    req = P.PlanRequest(model=get_model("Qwen3-30B-A3B"), system=get_system("DGX-H100"), gpus=16,
                        global_batch_size=1024, seq_length=4096, top=3)
    calls = []
    real = P.Search.offload_pruned

    def spy(self, *a):
        calls.append(real(self, *a))
        return calls[-1]

    monkeypatch.setattr(P.Search, "offload_pruned", spy)
    got = P.Search(req).run()
    monkeypatch.setattr(P.Search, "offload_pruned", lambda self, *a: False)
    assert _summary(P.Search(req).run()) == _summary(got)
    assert calls and any(calls)


def _sreq(model: str, gpus: int, gbs: int, system: str = "DGX-H100", seq: int = 4096, **kw) -> P.PlanRequest:
    return P.PlanRequest(model=get_model(model), system=get_system(system), gpus=gpus, global_batch_size=gbs,
                         seq_length=seq, workers=1, **kw)


def test_ladder_cover_is_the_nested_prefix():
    """The memory floor's cover (Search._ladder_cover): every option up to it drops a subset of its components; the
    next option does not (so the prefix is the longest)."""
    from moetune.perfmodel.memory import ladder_drops
    from moetune.spec.features import Features

    for model in ("DeepSeek-V3", "DeepSeek-V2-Lite", "Qwen3-30B-A3B"):
        opts = P._recompute_options(get_model(model), "full")
        c = P.ladder_cover(opts)
        drops = [ladder_drops(Features().model_copy(update=rec)) for _, rec in opts]
        assert c > 1 and all(d <= drops[c] for d in drops[:c])
        assert drops[-1] is None  # full recompute is never covered
    assert P.ladder_cover(P._recompute_options(get_model("DeepSeek-V3"), "full", "full")) == 0
    dsv3 = P._recompute_options(get_model("DeepSeek-V3"), "full")
    assert P.ladder_cover(dsv3) == 6


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pick=st.integers(0, 10**6), which=st.sampled_from(("dsv2", "qwen")), fp8=st.booleans())
def test_saved_activation_floor_bounds_every_covered_option(pick, which, fp8):
    """saved_activation_floor of the cover option's job is at most the device GiB (device_peaks) of every option it
    covers, rank by rank, on random layouts: the bound the ladder skip relies on (within its float slack)."""
    from moetune.perfmodel.memory import device_peaks, saved_activation_floor

    req, layouts = (_DSV2, _DSV2_LAYOUTS) if which == "dsv2" else (_QWEN, _QWEN_LAYOUTS)
    lp = layouts[pick % len(layouts)]
    opts = P._recompute_options(req.model, "full")
    c = P.ladder_cover(opts)
    base = P._base_features(req.model, "fp8_cs" if fp8 else "bf16", lp)
    floors = list(saved_activation_floor(P._job(req, lp, base.model_copy(update=opts[c][1]))))
    for _, rec in opts[: c + 1]:
        device = [d for d, _ in device_peaks(P._job(req, lp, base.model_copy(update=rec)))]
        for f, d in zip(floors, device, strict=True):
            assert f <= d + P.LADDER_FLOOR_SLACK * max(1.0, d)


def test_saved_activation_floor_declines_what_it_does_not_bound():
    from moetune.perfmodel.memory import saved_activation_floor

    lp = _QWEN_LAYOUTS[0]
    base = P._base_features(_QWEN.model, "bf16", lp)
    for upd in ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
                {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("attn",)},
                {"cpu_offloading": True, "cpu_offloading_num_layers": 2}):
        assert saved_activation_floor(P._job(_QWEN, lp, base.model_copy(update=upd))) is None


@pytest.mark.parametrize("args,kw", [(("DeepSeek-V2-Lite", 8, 256), dict(top=3)),
                                     (("Qwen3-30B-A3B", 8, 256), dict(top=3, seq=8192)),
                                     (("DeepSeek-V2-Lite", 4, 256), dict(top=4, seq=8192, exact_ranking=True)),
                                     (("DeepSeek-V2-Lite", 8, 256, "DGX-A100"), dict(top=3, seq=8192)),
                                     (("Qwen3-30B-A3B", 8, 128), dict(top=2, max_recompute="selective"))])
def test_plans_with_and_without_the_ladder_memory_floor_agree(args, kw):
    """Ladder options the memory floor proves unfit (Search.ladder_prefix_unfit) are not fit-tested: the same
    candidates, per-layout bests, closest misses, notes and counters as the search that tests every option, with
    fewer fit tests (so the floor is exercised)."""
    fast, plain = P.Search(_sreq(*args, **kw)), P.Search(_sreq(*args, **kw), ladder_bound=False)
    got, want = fast.run(), plain.run()
    key = [([(c.sort_key(), c.time.model_dump(), c.recompute_rank, c.job) for c in r.candidates], r.per_layout_best,
            [] if r.candidates else r.closest, r.notes) for r in (got, want)]
    assert key[0] == key[1]
    counters = ("searched", "feasible", "layouts", "pruned_memory", "pruned_bound", "rejected_by_check", "rejected_rules")
    assert [getattr(got, c) for c in counters] == [getattr(want, c) for c in counters]
    assert len(fast._fit_cache) < len(plain._fit_cache)


@pytest.mark.parametrize("args,kw", [(("DeepSeek-V2-Lite", 8, 256), dict(top=3)),
                                     (("DeepSeek-V2-Lite", 4, 256), dict(top=4, seq=8192)),
                                     (("DeepSeek-V2-Lite", 8, 256, "DGX-A100"), dict(top=3, seq=8192)),
                                     (("DeepSeek-V3", 128, 1024), dict(top=3))])
def test_plans_with_and_without_the_ladder_look_ahead_agree(args, kw, monkeypatch):
    """A core option inside the prefix the memory floor proved unfit is not bounded itself where the ladder's walk
    past it ends with a later option's rest bound (Search.ladder_ahead_pruned): the same candidates, per-layout
    bests, closest misses, notes and counters as the search that tests the option's own rest bound first, with
    fewer base jobs priced; the walk answers both ways on these requests."""
    fast = P.Search(_sreq(*args, **kw))
    calls = []
    real = P.Search.ladder_ahead_pruned

    def spy(self, *a):
        calls.append(real(self, *a))
        return calls[-1]

    monkeypatch.setattr(P.Search, "ladder_ahead_pruned", spy)
    got = fast.run()
    monkeypatch.setattr(P.Search, "ladder_ahead_pruned", lambda self, *a: False)
    plain = P.Search(_sreq(*args, **kw))
    want = plain.run()
    key = [([(c.sort_key(), c.time.model_dump(), c.recompute_rank, c.job) for c in r.candidates], r.per_layout_best,
            [] if r.candidates else r.closest, r.notes) for r in (got, want)]
    assert key[0] == key[1]
    counters = ("searched", "feasible", "layouts", "pruned_memory", "pruned_bound", "rejected_by_check", "rejected_rules")
    assert [getattr(got, c) for c in counters] == [getattr(want, c) for c in counters]
    assert True in calls and False in calls
    assert len(fast._time_cache) < len(plain._time_cache)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_PP1))
def test_offload_variant_bound_never_exceeds_a_variant(lp):
    """Search.offload_bounds of N offloaded layers is a lower bound on the step time of every layer-offloading
    variant with N layers that Search.consider may price (each dispatcher / EP-overlap setting, any CUDA graphs)."""
    req = _OFFLOAD
    search = P.Search(req)
    mode = (req.precisions[0], False)
    none = search.rec_opts[0][1]
    nl = req.model.num_layers
    for n in sorted({min(max(1, -(-k * nl // 8)), nl - 1) for k in P.LAYER_OFFLOAD_EIGHTHS}):
        extra = {"cpu_offloading": True, "cpu_offloading_num_layers": n}
        bound = search.bounds_of(lp, mode, none, extra)
        for d in P._dispatcher_variants(req, lp):
            for g in P._graph_variants(req, {**none, **extra}, d):
                for ov in P._overlap_variants(req, lp, none):
                    job = search.job_of(lp, search.features(mode, lp, {**none, **extra, **d, **ov, **g}))
                    assert bound(d, ov) <= T.estimate_time(job).step_time_s


@pytest.mark.parametrize("model,gpus,gbs,system", [("DeepSeek-V2-Lite", 8, 256, "DGX-H100"),
                                                    ("Mixtral-8x7B", 16, 256, "DGX-H100"),
                                                    ("GPT-OSS-20B", 8, 128, "DGX-H100"),
                                                    ("Llama-3-70B", 32, 256, "DGX-H100")])
def test_plans_with_and_without_the_offload_variant_bound_agree(model, gpus, gbs, system, monkeypatch):
    """Layer-offloading variants the per-variant bound does not price (Search.offload_bounds in Search.consider)
    could not have been recorded: the same candidates, per-layout bests, closest misses, notes and counters as the
    search that prices every fitting offloading variant, and the bound does skip some."""
    from tests.test_plan_fastpath import _summary

    req = P.PlanRequest(model=get_model(model), system=get_system(system), gpus=gpus, global_batch_size=gbs,
                        seq_length=4096, top=3)
    fast = P.Search(req)
    got = fast.run()
    real = P.Search.bounds_of
    monkeypatch.setattr(P.Search, "bounds_of", lambda self, lp, mode, rec, extra: (
        real(self, lp, mode, rec, extra) if extra is None else None))
    plain = P.Search(req)
    want = plain.run()
    assert _summary(got) == _summary(want)
    counters = ("searched", "feasible", "layouts", "pruned_memory", "pruned_bound", "rejected_by_check", "rejected_rules")
    assert [getattr(got, c) for c in counters] == [getattr(want, c) for c in counters]
    assert fast.bounded > plain.bounded


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_DSV2_LAYOUTS + _QWEN_LAYOUTS), st.booleans())
def test_no_recompute_floor_is_at_most_every_option_floor_bit_for_bit(lp, fp8):
    """What the first test of Search.ladder_rest_pruned rests on: the base job's (no recompute, the layout's default
    dispatcher) stage floors are at most those of every recompute option with every dispatcher, bit for bit, and the
    other inputs of _schedule_floor are the same; so its floor with a dispatcher's seconds is at most each floor the
    rest bound computes for that dispatcher (option base job with the dispatcher's seconds, the option's own job with
    the dispatcher), with or without EP overlap, in floats."""
    from dataclasses import replace

    req = replace(_DSV2 if lp in _DSV2_LAYOUTS else _QWEN, precisions=("bf16", "fp8_cs"))
    search = P.Search(req)
    mode = ("fp8_cs" if fp8 else "bf16", False)
    least = T.estimate_walls(search.job_of(lp, search.features(mode, lp, {})))
    for disp in P._dispatcher_variants(req, lp):
        a2a = search.a2a_of(lp, search.features(mode, lp, disp))
        for _, rec in search.rec_opts:
            base = T.estimate_walls(search.job_of(lp, search.features(mode, lp, rec)))
            own = T.estimate_walls(search.job_of(lp, search.features(mode, lp, {**rec, **disp})))
            for res in (base, own):
                assert all(x <= y for x, y in zip(least.stage_floor, res.stage_floor, strict=True))
                assert (least.stage_partner, least.schedule, least.step_host, least.ep_overlap_eff) == (
                    res.stage_partner, res.schedule, res.step_host, res.ep_overlap_eff)
                assert [least.walls[w] for w in ("comm_pp", "optimizer")] == [res.walls[w] for w in ("comm_pp",
                                                                                                   "optimizer")]
            assert (list(own.stage_a2a), own.sm_frac) == (list(a2a.stage_a2a), a2a.sm_frac)
            for ov in (False, True):
                first = P._schedule_floor(least, [a2a], ep_overlap=ov)
                assert first <= P._schedule_floor(base, [a2a], ep_overlap=ov)
                assert first <= P._schedule_floor(own, [own], ep_overlap=ov)


def _rest_pruned_priced(self, lp, mode, j, fitted):
    """Search.ladder_rest_pruned without its first, unpriced test (the code it replaced): the oracle."""
    rec = self.rec_opts[j][1]
    overlap = self.rest_overlap(lp, j)
    prev = self.best_by_layout.get(lp.key())
    own = P._recomputes_dispatch(rec)
    feats = self.features(mode, lp, rec)
    for disp in P._dispatcher_variants(self.req, lp):
        if self.rest_graphs(j, disp) <= fitted:
            continue
        if own:
            base = self.time_of(lp, feats)
            bound = P._schedule_floor(base, [self.a2a_of(lp, self.features(mode, lp, disp))], ep_overlap=overlap,
                                      less=base.stage_rec_a2a)
            if (prev is not None and bound >= prev.step_time_s) or bound > self.kth_best():
                continue
            res = self.time_of(lp, self.features(mode, lp, {**rec, **disp}))
            bound = P._schedule_floor(res, [res], ep_overlap=overlap)
        else:
            bound = P._schedule_floor(self.time_of(lp, feats), [self.a2a_of(lp, self.features(mode, lp, disp))],
                                      ep_overlap=overlap)
        if not ((prev is not None and bound >= prev.step_time_s) or bound > self.kth_best()):
            return False
    return True


@pytest.mark.parametrize("args,kw", [(("DeepSeek-V2-Lite", 8, 256), dict(top=3)),
                                     (("DeepSeek-V2-Lite", 4, 256), dict(top=4, seq=8192)),
                                     (("Qwen3-30B-A3B", 16, 1024), dict(top=3)),
                                     (("DeepSeek-V3", 128, 1024), dict(top=3))])
def test_rest_bound_answers_as_the_priced_rest_bound(args, kw, monkeypatch):
    """Search.ladder_rest_pruned answers as the rest bound that prices option ``j`` for every dispatcher (every call
    of a search, and so the same plans and counters), with fewer jobs priced."""
    fast = P.Search(_sreq(*args, **kw))
    real = P.Search.ladder_rest_pruned
    answers = []

    def both(self, *a):
        answers.append(real(self, *a))
        n = len(self._time_cache)
        assert _rest_pruned_priced(self, *a) == answers[-1]
        answers.append(len(self._time_cache) > n)  # the oracle priced what the first test did not
        return answers[-2]

    monkeypatch.setattr(P.Search, "ladder_rest_pruned", both)
    fast.run()
    assert True in answers[0::2] and True in answers[1::2]

"""The planner's fast paths return what the plain evaluation returns: memoised step-time / memory pieces equal a
cold evaluation, ``reserved_peaks`` equals ``estimate_memory``'s stages, ``estimate_walls`` equals
``estimate_time``, the schedule bound never exceeds a variant's step time, and plans are deterministic."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import moetune.memo
from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.perfmodel import memory as M
from moetune.perfmodel import step as T
from moetune.plan import search as P
from moetune.plan.space import SpaceLimits, enumerate_layouts


def _clear_caches() -> None:
    """Drop every memo (a cold evaluation follows)."""
    moetune.memo.clear()


def _req(model: str, gpus: int, gbs: int, **kw) -> P.PlanRequest:
    return P.PlanRequest(model=get_model(model), system=get_system(kw.pop("system", "DGX-H100")), gpus=gpus,
                         global_batch_size=gbs, seq_length=4096, dispatchers=("alltoall", "deepep", "hybridep",
                                                                             "allgather"), **kw)


def _variants(req: P.PlanRequest, lp, fsdp: bool = False) -> list:
    """Every feature variant the planner can price for a layout (recompute ladder x dispatcher x graphs x overlap)."""
    base = P._base_features(req.model, req.precisions[0], lp, fsdp=fsdp)
    out = []
    for _, rec in P._recompute_options(req.model, req.max_recompute):
        for disp in P._dispatcher_variants(req, lp):
            for gr in P._graph_variants(req, rec, disp):
                for ov in P._overlap_variants(req, lp, rec):
                    out.append(P._job(req, lp, base.model_copy(update={**rec, **disp, **ov, **gr})))
    return out


_QWEN = _req("Qwen3-30B-A3B", 16, 512)
_QWEN_LAYOUTS = list(enumerate_layouts(_QWEN.model, _QWEN.system, 16, 512, 4096, SpaceLimits()))
_DSV2 = _req("DeepSeek-V2-Lite", 16, 512, precisions=("fp8_cs",))
_DSV2_LAYOUTS = list(enumerate_layouts(_DSV2.model, _DSV2.system, 16, 512, 4096, SpaceLimits()))
#: layouts with EP > 1 (several dispatchers), among them Qwen3 TP1 PP1 EP16 layouts where the alltoall job's walls
#: under full recompute exceed a flex dispatcher's step
_EP_LAYOUTS = [lp for lp in _QWEN_LAYOUTS[10:22] + _DSV2_LAYOUTS[::160] if lp.ep > 1]


def _mem_values(est) -> list:
    return [(s.pp_rank, s.peak_allocated_gib, s.reserved_gib, s.device_gib, s.components,
             [(c.layers, c.params, c.activation_gib_per_microbatch, c.in_flight_at_peak) for c in s.chunks])
            for s in est.stages]


@pytest.mark.parametrize("req,layouts", [(_QWEN, _QWEN_LAYOUTS[::97]), (_DSV2, _DSV2_LAYOUTS[::83])])
def test_memoised_estimates_equal_cold_ones(req, layouts):
    jobs = [j for lp in layouts for j in _variants(req, lp)[::5]]
    warm_t = [T.estimate_time(j).model_dump() for j in jobs]
    warm_m = [_mem_values(M.estimate_memory(j)) for j in jobs]
    warm_r = [list(M.reserved_peaks(j)) for j in jobs]
    for j, t, mem, r in zip(jobs, warm_t, warm_m, warm_r, strict=True):
        _clear_caches()
        assert T.estimate_time(j).model_dump() == t
        _clear_caches()
        assert _mem_values(M.estimate_memory(j)) == mem
        _clear_caches()
        assert list(M.reserved_peaks(j)) == r


@pytest.mark.parametrize("req,layouts", [(_QWEN, _QWEN_LAYOUTS[::41]), (_DSV2, _DSV2_LAYOUTS[::37])])
def test_fast_paths_equal_the_full_estimates(req, layouts):
    for lp in layouts:
        for job in _variants(req, lp)[::3]:
            est = M.estimate_memory(job)
            peaks = [(s.reserved_gib, s.peak_allocated_gib) for s in est.stages]
            assert list(M.reserved_peaks(job)) == peaks
            order = list(range(len(peaks)))[::-1]
            assert list(M.reserved_peaks(job, order)) == [peaks[i] for i in order]
            t = T.estimate_time(job)
            res = T.estimate_walls(job)
            assert res.step == t.step_time_s
            assert res.walls == {k: w.seconds for k, w in t.walls.items()}
            assert P._walls_floor(res.walls) == P.variant_floor(t)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_QWEN_LAYOUTS + _DSV2_LAYOUTS))
def test_schedule_floor_bounds_every_variant(lp):
    req = _QWEN if lp in _QWEN_LAYOUTS else _DSV2
    feats = P._base_features(req.model, req.precisions[0], lp)
    res = T.estimate_walls(P._job(req, lp, feats))
    by_disp = [T.estimate_walls(P._job(req, lp, feats.model_copy(update=d))) for d in P._dispatcher_variants(req, lp)]
    bound = P._schedule_floor(res)
    bound_ep = P._schedule_floor(res, by_disp)
    assert P._walls_floor(res.walls) <= bound / (1.0 - 1e-9) * (1 + 1e-12)
    assert bound <= bound_ep
    own = {}  # each dispatcher's bound, for the variants of that dispatcher (Search.ep_floor)
    for d, r in zip(P._dispatcher_variants(req, lp), by_disp, strict=True):
        own[(d["moe_token_dispatcher_type"], d["moe_flex_dispatcher_backend"])] = P._schedule_floor(res, [r])
    for job in _variants(req, lp):
        step = T.estimate_time(job).step_time_s
        f = job.features
        assert bound_ep <= own[(f.moe_token_dispatcher_type, f.moe_flex_dispatcher_backend)] <= step


def _summary(res: P.PlanResult) -> tuple:
    """What a plan reports: candidates, per-layout bests, notes, and the closest misses when nothing fits."""
    return ([(c.sort_key(), c.time.model_dump(), _mem_values(c.memory), c.recompute_rank) for c in res.candidates],
            res.per_layout_best, [] if res.candidates else [(o, j) for o, j in res.closest], res.notes)


@pytest.mark.parametrize("kw", [dict(top=4), dict(top=6, exact_ranking=True, mbs_options=(1, 2)),
                                dict(top=3, max_recompute="selective", precisions=("bf16", "fp8_cs"))])
def test_plan_is_deterministic_and_cache_independent(kw):
    req = _req("Qwen3-30B-A3B", 8, 256, **kw)
    _clear_caches()
    cold = _summary(P.plan(req))
    warm = _summary(P.plan(req))
    assert warm == cold


@pytest.mark.parametrize("kw", [dict(model="Qwen3-30B-A3B", gpus=16, gbs=512, top=3),
                                dict(model="DeepSeek-V2-Lite", gpus=16, gbs=512, top=5, precisions=("bf16", "fp8_cs")),
                                dict(model="GPT-OSS-20B", gpus=8, gbs=128, top=4, max_recompute="selective")])
def test_schedule_bound_skips_change_nothing(kw):
    kw = dict(kw)
    req = _req(kw.pop("model"), kw.pop("gpus"), kw.pop("gbs"), **kw)
    with_skips = _summary(P.plan(req))
    assert _summary(P.plan(req, schedule_bound=False)) == with_skips


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_QWEN_LAYOUTS + _DSV2_LAYOUTS), st.integers(0, 10**6), st.booleans())
def test_dispatcher_variants_share_reserved_memory(lp, pick, cold):
    """What Search.fits shares between the dispatcher variants of a job: every rank's reserved GiB is that of the
    job's :func:`reserved_features` (the same for alltoall, DeepEP and HybridEP; allgather on its own), and its device
    GiB is that plus :func:`non_torch_gib`, bit for bit."""
    req = _QWEN if lp in _QWEN_LAYOUTS else _DSV2
    jobs = _variants(req, lp)
    for job in jobs[pick % len(jobs)::7]:
        if cold:
            _clear_caches()
        reserved = list(M.reserved_peaks(job))
        assert list(M.device_peaks(job)) == [(r + M.non_torch_gib(job), p) for r, p in reserved]
        rep = job.model_copy(update={"features": M.reserved_features(job.features)})
        if cold:
            _clear_caches()
        assert list(M.reserved_peaks(rep)) == reserved
        f = job.features
        if f.moe_token_dispatcher_type == "allgather":
            assert rep.features == f
        else:
            for disp in P._dispatcher_variants(req, lp):
                if disp["moe_token_dispatcher_type"] != "allgather":
                    twin = job.model_copy(update={"features": f.model_copy(update=disp)})
                    assert M.reserved_features(twin.features) == rep.features
                    assert list(M.reserved_peaks(twin)) == reserved


@pytest.mark.parametrize("kw", [dict(model="Qwen3-30B-A3B", gpus=16, gbs=512, top=3),
                                dict(model="DeepSeek-V2-Lite", gpus=16, gbs=512, top=5, precisions=("bf16", "fp8_cs")),
                                dict(model="Llama-3-70B", gpus=8, gbs=64, top=3)])
def test_search_fit_verdicts_equal_the_scalar_path(kw, monkeypatch):
    """Every fit verdict of a search (shared reserved GiB across dispatcher variants, ranks priced until the first
    overflow) is the headroom policy applied to all of :func:`device_peaks`; and the plan is the one of a search that
    shares nothing (each variant its own class)."""
    kw = dict(kw)
    req = _req(kw.pop("model"), kw.pop("gpus"), kw.pop("gbs"), **kw)
    search = P.Search(req)
    shared = _summary(search.run())
    assert search._fit_cache
    for ok, job in search._fit_cache.values():
        assert ok == M.fits_capacity(max(d for d, _ in M.device_peaks(job)), search.capacity, search.headroom)
    monkeypatch.setattr(P, "reserved_features", lambda f: f)
    _clear_caches()
    assert _summary(P.plan(req)) == shared


def test_memory_static_part_is_shared_by_the_recompute_ladder_only():
    """The non-activation memory memo is keyed on the features with the activation-only fields at their defaults:
    jobs that differ only there share it, any other field gives another key, and a pickled copy (a worker's job)
    maps to an equal key."""
    import pickle

    from moetune.spec.features import Features

    f = Features(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    key = M.static_features(f)
    assert key == M.static_features(Features())
    assert M.static_features(Features(precision="fp8_cs")) != key
    assert M.static_features(pickle.loads(pickle.dumps(f))) == key


def test_collector_paused_restores_state_even_on_error():
    """The search pauses the cyclic GC and always restores the caller's setting."""
    import gc

    import pytest

    from moetune.plan.search import collector_paused

    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


_DSV3 = _req("DeepSeek-V3", 128, 1024)
_DSV3_LAYOUTS = list(enumerate_layouts(_DSV3.model, _DSV3.system, 128, 1024, 4096, SpaceLimits()))


@pytest.mark.parametrize("req,layouts", [(_QWEN, _QWEN_LAYOUTS[::29]), (_DSV2, _DSV2_LAYOUTS[::31]),
                                         (_DSV3, _DSV3_LAYOUTS[::131])])
def test_stage_a2a_seconds_equal_the_full_estimate(req, layouts):
    """The EP bound's per-stage dispatch/combine seconds without the rest of the step model (Search.a2a_of) are
    those of estimate_walls, for every dispatcher."""
    for lp in layouts:
        base = P._base_features(req.model, req.precisions[0], lp)
        for d in P._dispatcher_variants(req, lp):
            job = P._job(req, lp, base.model_copy(update=d))
            assert T.stage_a2a_seconds(job) == T.estimate_walls(job).stage_a2a


@pytest.mark.parametrize("model,gpus,gbs,kw", [
    ("Qwen3-30B-A3B", 16, 1024, {}),
    ("DeepSeek-V2-Lite", 16, 512, {"precisions": ("fp8_cs",)}),
])
def test_each_variant_gets_its_least_fitting_recompute(model, gpus, gbs, kw):
    """The recompute ladder is per feature variant (module docstring, step 2): a candidate's (dispatcher, CUDA
    graphs) variant does not fit under any lesser recompute option; the ladder stops once every variant has fitted."""
    req = _req(model, gpus, gbs, top=8, exact_ranking=True, **kw)
    res = P.plan(req)
    assert res.candidates
    opts = P.Search(req).rec_opts
    headroom = P.request_headroom(req)
    for c in res.candidates:
        lesser = [rec for rank, rec in opts if rank < c.recompute_rank]
        for rec in lesser:
            job = c.job.model_copy(update={"features": c.job.features.model_copy(update=rec)})
            mem = M.estimate_memory(job)
            device = max(s.device_gib for s in mem.stages)
            assert not M.fits_capacity(device, req.system.gpu.hbm_gib, headroom), (c.job.layout.short(), rec)
    assert res.per_layout_best


def test_memo_keys_tell_efficiency_sets_apart():
    """The step model's memo tables are keyed on the efficiency set by value (:meth:`Efficiency.__hash__` of its
    values, equality over every field): a set with other values, or the same values and other constants, prices
    every job as a cold evaluation does, whichever set filled the tables first."""
    from moetune.perfmodel.calibration import Efficiency

    base = T.resolve_efficiency(None)
    scaled = base.with_values({k: v * 0.9 for k, v in base.values.items()})
    consts = dict(base.constants)
    consts["param_tensors"] = {k: 2 * v for k, v in consts["param_tensors"].items()}
    consts["ddp_bucket_params"] = consts["ddp_bucket_params"] / 4
    consts["deepep_sms"] = consts["deepep_sms"] * 2
    other_consts = Efficiency(base.specs, consts, base.prior_weight, base.fit_info, "test", dict(base.values))
    assert hash(other_consts) == hash(base) and other_consts != base
    jobs = [j for lp in _QWEN_LAYOUTS[::131] for j in _variants(_QWEN, lp)[::7]]
    assert jobs
    cold = {}
    for name, eff in (("base", base), ("scaled", scaled), ("consts", other_consts)):
        for i, j in enumerate(jobs):
            _clear_caches()
            cold[name, i] = T.estimate_walls(j, eff)
    _clear_caches()
    for name, eff in (("base", base), ("scaled", scaled), ("consts", other_consts), ("base", base)):
        for i, j in enumerate(jobs):
            assert T.estimate_walls(j, eff) == cold[name, i]
            assert T.stage_a2a_seconds(j, eff) == cold[name, i].stage_a2a
    assert any(cold["base", i] != cold["scaled", i] for i in range(len(jobs)))
    assert any(cold["base", i] != cold["consts", i] for i in range(len(jobs)))


@pytest.mark.parametrize("given", [("model", "system", "gpus", "global_batch_size", "seq_length"),
                                   ("model", "system", "gpus", "global_batch_size", "micro_batch_size", "seq_length",
                                    "layout", "features"),
                                   ("model", "system", "gpus", "global_batch_size", "seq_length", "features",
                                    "assumptions")])
def test_trusted_construction_equals_model_construct(given):
    """``FrozenSpec.trusted`` (the planner's job builder) is ``model_construct``: same field values in the same
    order, same fields set, same hash and no extra / private values, whichever fields are given."""
    from moetune.spec.features import Features
    from moetune.spec.job import Job
    from moetune.spec.layout import Layout

    values = dict(model=_QWEN.model, system=_QWEN.system, gpus=16, global_batch_size=512, micro_batch_size=2,
                  seq_length=4096, layout=Layout(tp=2, ep=8), features=Features(precision="fp8_cs"),
                  assumptions=("a",))
    kw = {k: values[k] for k in given}
    a, b = Job.model_construct(**kw), Job.trusted(**kw)
    assert list(a.__dict__.items()) == list(b.__dict__.items())
    assert a.model_fields_set == b.model_fields_set == set(given)
    assert (a.__pydantic_extra__, a.__pydantic_private__) == (b.__pydantic_extra__, b.__pydantic_private__)
    assert a == b and hash(a) == hash(b) and a.model_dump() == b.model_dump()
    assert b == Job(**kw)


@pytest.mark.parametrize("kw", [dict(model="Qwen3-30B-A3B", gpus=16, gbs=512, top=3),
                                dict(model="DeepSeek-V2-Lite", gpus=16, gbs=512, top=5, precisions=("bf16", "fp8_cs")),
                                dict(model="GPT-OSS-20B", gpus=8, gbs=128, top=4, max_recompute="selective"),
                                dict(model="Mixtral-8x7B", gpus=16, gbs=256, top=4, exact_ranking=True),
                                dict(model="Llama-3-8B", gpus=8, gbs=128, top=3)])
def test_variant_bound_skips_change_nothing(kw):
    """Variants the per-variant bound does not price (Search.variant_bounds) could not have been recorded: the same
    candidates, per-layout bests, closest misses, notes and counters as the search that prices every fitting
    variant."""
    kw = dict(kw)
    req = _req(kw.pop("model"), kw.pop("gpus"), kw.pop("gbs"), **kw)
    fast, plain = P.Search(req), P.Search(req, variant_bound=False)
    got, want = fast.run(), plain.run()
    assert _summary(got) == _summary(want)
    counters = ("searched", "feasible", "layouts", "pruned_memory", "pruned_bound", "rejected_by_check", "rejected_rules")
    assert [getattr(got, c) for c in counters] == [getattr(want, c) for c in counters]
    assert plain.bounded == 0 and len(fast._time_cache) + fast.bounded >= len(plain._time_cache)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_QWEN_LAYOUTS + _DSV2_LAYOUTS) | st.sampled_from(_EP_LAYOUTS))
def test_variant_bound_never_exceeds_a_variant(lp):
    """Search.variant_bounds is a lower bound on the step time of every variant of every recompute option (each
    dispatcher / EP-overlap setting, any CUDA graphs), also where the recompute re-runs the dispatch and combine."""
    req = _QWEN if lp in _QWEN_LAYOUTS else _DSV2
    search = P.Search(req)
    mode = (req.precisions[0], False)
    for _, rec in P._recompute_options(req.model, req.max_recompute):
        bound = search.variant_bounds(lp, mode, rec)
        for disp in P._dispatcher_variants(req, lp):
            for gr in P._graph_variants(req, rec, disp):
                for ov in P._overlap_variants(req, lp, rec):
                    job = P._job(req, lp, search.features(mode, lp, {**rec, **disp, **ov, **gr}))
                    assert bound(disp, ov) <= T.estimate_time(job).step_time_s


@pytest.mark.parametrize("lp", _EP_LAYOUTS, ids=lambda lp: "-".join(map(str, lp.key()[:7])))
def test_recompute_option_floor_never_exceeds_a_variant(lp):
    """Search.option_floor (the ladder's re-bound) exceeds a k-th best only when no variant of its recompute option
    is within it, also where the recompute re-runs the EP dispatch and combine (its recompute wall then depends on
    the dispatcher, so the base job's alltoall walls alone do not bound a faster dispatcher's variants)."""
    req = _QWEN if lp in _QWEN_LAYOUTS else _DSV2
    search = P.Search(req)
    mode = (req.precisions[0], False)
    for _, rec in P._recompute_options(req.model, req.max_recompute):
        steps = sorted(T.estimate_time(P._job(req, lp, search.features(mode, lp, {**rec, **disp, **ov, **gr})))
                       .step_time_s for disp in P._dispatcher_variants(req, lp) for gr in P._graph_variants(req, rec, disp)
                       for ov in P._overlap_variants(req, lp, rec))
        for kth in (steps[0] * 0.999, steps[0], steps[-1], float("inf")):
            search.kth_best = lambda kth=kth: kth
            if search.option_floor(lp, mode, rec) > kth:  # the ladder would stop: no variant may be within kth
                assert steps[0] > kth


@pytest.mark.parametrize("upd", [{}, {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("full_iteration",)},
                                 {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep",
                                  "expandable_segments": True}])
def test_tail_kinds_equal_the_itemised_tail(upd):
    """The runtime tail's per-kind GiB that the fit test reads (``kinds``, ``non_torch``) are the totals of the
    itemised tail (:func:`moetune.perfmodel.runtime_tail.runtime_tail`), bit for bit, for any activation and
    allocated peak."""
    from moetune.perfmodel.runtime_tail import TAIL_KINDS, runtime_tail, tail_builder

    lp = next(lp for lp in _QWEN_LAYOUTS if lp.ep > 1)
    job = P._job(_QWEN, lp, P._base_features(_QWEN.model, "bf16", lp).model_copy(update=upd))
    build = tail_builder(job)
    for act_b, alloc_b in ((0.0, 0.0), (3.5e9, 41.25e9), (17e9, 70e9)):
        tail = runtime_tail(job, activation_peak_bytes=act_b, allocated_peak_bytes=alloc_b)
        assert build.kinds(act_b, alloc_b) == tuple(tail.total(k) for k in TAIL_KINDS)
        assert build.non_torch == tail.total("non_torch")


def _findings(fs) -> list:
    return [(f.id, str(f.severity), f.message, repr(f.fix)) for f in fs]


@pytest.mark.parametrize("req,layouts", [(_QWEN, _QWEN_LAYOUTS[::41]), (_DSV2, _DSV2_LAYOUTS[::61])])
def test_check_job_fast_path_equals_the_copying_path(req, layouts):
    """The planner's :func:`moetune.io.check.check_job` (its fresh config normalised in place, present defaults not
    copied) gives the same findings as :func:`moetune.io.check.check_config` on a config it must not touch, on every
    feature variant of many layouts, and leaves that config as it was."""
    import copy

    from moetune.io.check import check_config, check_job
    from moetune.io.config_to_job import env_from_job, job_to_config

    jobs = [j for lp in layouts for j in _variants(req, lp)[::3]]
    assert len(jobs) > 40
    verdicts = set()
    for job in jobs:
        cfg = job_to_config(job)
        before = copy.deepcopy(cfg)
        slow = check_config(cfg, env_from_job(job)).findings
        assert cfg == before
        fast = check_job(job)
        assert _findings(fast) == _findings(slow)
        verdicts.add(any(str(f.severity).startswith("error") for f in fast))
    assert verdicts == {True, False}  # both verdicts occur among the variants


def test_effective_config_shares_no_mutable_default(monkeypatch):
    """Defaults are stored without a copy only where immutable: a mutable default (list, dict) in an effective
    config is never the defaults table's own object, so changing it cannot leak into the next config."""
    from moetune.io import effective as E

    monkeypatch.setitem(E.MODEL_DEFAULTS, "_test_list_default", [1, [2]])
    eff = E.effective_config({"model": {}})
    got = eff["model"]["_test_list_default"]
    assert got == [1, [2]] and got is not E.MODEL_DEFAULTS["_test_list_default"]
    assert got[1] is not E.MODEL_DEFAULTS["_test_list_default"][1]
    assert eff["model"]["tensor_model_parallel_size"] == E.MODEL_DEFAULTS["tensor_model_parallel_size"]



def _shape(x, seen=None):
    """The tree of ``x`` with each container as (type, the order it was first reached in, its items), a container
    reached again as ("again", that number): equal for two trees exactly when values, types and sharing agree."""
    seen = {} if seen is None else seen
    if isinstance(x, dict | list | tuple | set):
        if id(x) in seen:
            return ("again", seen[id(x)])
        n = seen[id(x)] = len(seen)
        if isinstance(x, dict):
            items = [(_shape(k, seen), _shape(v, seen)) for k, v in x.items()]
        else:
            items = [_shape(v, seen) for v in (sorted(x) if isinstance(x, set) else x)]
        return (type(x).__name__, n, items)
    return (type(x).__name__, repr(x))


def _containers(x, out=None) -> set[int]:
    """ids of the mutable containers (dict, list, set, non-plain objects) reachable from ``x``."""
    out = set() if out is None else out
    if isinstance(x, dict | list | set | tuple):
        if not isinstance(x, tuple):
            out.add(id(x))
        for v in (x.values() if isinstance(x, dict) else x):
            _containers(v, out)
    elif not isinstance(x, int | float | str | bytes | type(None)):
        out.add(id(x))
    return out


@pytest.mark.parametrize("req,layouts", [(_QWEN, _QWEN_LAYOUTS[::41]), (_DSV2, _DSV2_LAYOUTS[::61])])
def test_copy_config_is_deepcopy(req, layouts):
    """:func:`moetune.io.effective.copy_config` returns what ``copy.deepcopy`` does, on the planner's configs and on
    a tree with shared lists and dicts, tuples holding mutable items, sets and a dict subclass: equal values, types
    and sharing, no mutable container of the original reachable from the copy, and a tuple of immutable items
    returned as is."""
    import copy
    from collections import OrderedDict

    from moetune.io.config_to_job import job_to_config
    from moetune.io.effective import copy_config

    shared, inner, odd = [1, 2], {"a": [3]}, OrderedDict(x=[1])
    trees = [job_to_config(j) for lp in layouts[:6] for j in _variants(req, lp)[:2]]
    trees.append({"m": {"l": shared, "k": shared, "t": (shared, 1), "u": (1, "x"), "d": inner, "e": [inner, inner]},
                  "s": {1, 2}, "o": odd, "o2": odd, "f": 1.5, "n": None, "b": b"x"})
    for tree in trees:
        want, got = copy.deepcopy(tree), copy_config(tree)
        assert got == want and _shape(got) == _shape(want)
        assert not _containers(got) & _containers(tree)
    t = (1, "a", None)
    assert copy_config(t) is t and copy.deepcopy(t) is t


def test_split_fields_cached_on_the_layout_is_the_fresh_value():
    """split_fields keeps its value on the frozen layout: equal to the fields read afresh, not carried over by
    model_copy or pickling, and invisible to equality, hashing and serialisation."""
    import pickle

    from moetune.spec.layout import Layout
    from moetune.spec.pipeline import SplitFields, split_fields

    def fresh(lay):
        return SplitFields(lay.pp, lay.vpp, lay.pipeline_layout, lay.num_layers_in_first_pipeline_stage,
                           lay.num_layers_in_last_pipeline_stage, lay.account_for_embedding_in_pipeline_split,
                           lay.account_for_loss_in_pipeline_split)

    lay = Layout(tp=2, pp=4, vpp=2, ep=8)
    plain = Layout(tp=2, pp=4, vpp=2, ep=8)
    got = split_fields(lay)
    assert got == fresh(lay) and split_fields(lay) is got
    assert lay == plain and plain == lay and hash(lay) == hash(plain) and lay.model_dump() == plain.model_dump()
    other = lay.model_copy(update={"pp": 8, "vpp": None})
    assert split_fields(other) == fresh(other) != got
    back = pickle.loads(pickle.dumps(lay))
    assert back == lay and split_fields(back) == got


def _old_rank_params(m, lay, pp_rank: int) -> tuple:
    """The per-rank parameter sums as ``_split_rank_params`` computed them before the per-split table (the oracle of
    :func:`test_rank_params_equal_the_per_rank_sums`): layer kinds looked up one rank at a time."""
    rank = M.pipeline_ranks(m, lay)[pp_rank]
    tp, ep, etp, pp = lay.tp, lay.ep, lay.expert_tp, lay.pp
    dense = expert = lin = 0.0
    per_chunk = []
    vocab = M._vocab_params_per_rank(m, tp)
    has_emb_anywhere = rank.embedding
    for ch in rank.chunks:
        cd = ce = 0.0
        for i in ch.layers:
            d, e, li = M._layer_split(m, m.mixer_pattern[i], m.mlp_pattern[i], tp, ep, etp)
            cd, ce, lin = cd + d, ce + e, lin + li
        if ch.embedding:
            cd += vocab
        if ch.loss:
            cd += M.final_norm_params(m)
            if m.untie_embeddings_and_output_weights or pp > 1 or not has_emb_anywhere:
                cd += vocab
        if ch.mtp_layers:
            copies = 1 if m.mtp_use_repeated_layer else ch.mtp_layers
            d, e, li = M._mtp_split(m, tp, ep, etp)
            cd, ce, lin = cd + copies * d, ce + copies * e, lin + copies * li
            if not has_emb_anywhere and m.untie_embeddings_and_output_weights:
                cd += vocab
                has_emb_anywhere = True
        dense, expert = dense + cd, expert + ce
        per_chunk.append(cd + ce)
    return dense, expert, lin, tuple(per_chunk)


#: (model, GPUs, GBS, request options): MTP with and without repeated layers, tied embeddings, dense, LoRA, FP8
#: parameters (the fp8_cs starting recipe), Megatron-FSDP (every request)
_STATE_REQUESTS = [
    ("DeepSeek-V3", 256, 4096, {}),
    ("DeepSeek-V2-Lite", 16, 512, {"precisions": ("fp8_cs",)}),
    ("Qwen3-30B-A3B", 16, 512, {"task": (("task", "lora"),)}),
    ("Llama-3-70B", 64, 128, {"precisions": ("bf16", "fp8_cs")}),
    ("GPT-OSS-120B", 64, 1280, {"recipe": "none"}),
]


@pytest.mark.parametrize("name,gpus,gbs,kw", _STATE_REQUESTS)
def test_rank_params_equal_the_per_rank_sums(name, gpus, gbs, kw):
    """``_all_rank_params`` (one table per split and TP / EP / ETP, layers read from a per-layer table) equals the
    per-rank sums of every layout of the request, bit for bit; also with repeated MTP layers and tied embeddings."""
    req = _req(name, gpus, gbs, **kw)
    models = [req.model]
    if req.model.mtp_num_layers:
        models.append(req.model.model_copy(update={"mtp_use_repeated_layer": not req.model.mtp_use_repeated_layer}))
    models.append(req.model.model_copy(update={"untie_embeddings_and_output_weights":
                                               not req.model.untie_embeddings_and_output_weights}))
    n = 0
    for m in models:
        _clear_caches()
        for lp in enumerate_layouts(m, req.system, gpus, gbs, 4096):
            lay = P._layout(lp)
            got = M._all_rank_params(m, lay)
            assert got == tuple(_old_rank_params(m, lay, r.pp_rank) for r in M.pipeline_ranks(m, lay))
            n += 1
    assert n > 50


@pytest.mark.parametrize("name,gpus,gbs,kw", _STATE_REQUESTS)
def test_state_floor_is_the_most_loaded_rank(name, gpus, gbs, kw):
    """``state_floor_bytes`` (each distinct rank priced once) is ``max(weight_and_optimizer_bytes)`` of the base job of
    every layout and state mode, Megatron-FSDP, LoRA and FP8 parameters included."""
    req = _req(name, gpus, gbs, **kw)
    s = P.Search(req)
    modes = set()
    for lp in enumerate_layouts(req.model, req.system, gpus, gbs, 4096):
        for mode in P._state_modes(req, lp):
            job = s.job_of(lp, s.base_features(mode, lp))
            assert M.state_floor_bytes(job) == max(M.weight_and_optimizer_bytes(job))
            modes.add((mode, job.features.use_megatron_fsdp, job.features.task, job.features.fp8_param_gather))
    assert len(modes) >= 2


def _old_pass_1(s: P.Search) -> None:
    """Pass 1 as it was: every layout point and state mode, the floor ``max(weight_and_optimizer_bytes)`` of its
    base job, memoised per (mode, layout but MBS)."""
    req, GiB, cache = s.req, 1024.0**3, {}
    part_i, part_n = req.partition
    groups: dict = {}

    def mine(group):
        return groups.setdefault(group, len(groups)) % part_n == part_i

    for lp in enumerate_layouts(req.model, req.system, req.gpus, req.global_batch_size, req.seq_length, s.limits,
                                mine if part_n > 1 else None):
        s.layouts += 1
        for mode in P._state_modes(req, lp):
            skey = (mode, lp.tp, lp.cp, lp.pp, lp.vpp, lp.ep, lp.etp, lp.pipeline_layout)
            if skey not in cache:
                cache[skey] = max(M.weight_and_optimizer_bytes(s.job_of(lp, s.base_features(mode, lp)))) / GiB
            over = cache[skey] + s.headroom - s.capacity
            if over > 0:
                s.pruned_mem += 1
                s.note_miss(over, lp, mode)
                continue
            s.queue.append((lp, mode))


@pytest.mark.parametrize("name,gpus,gbs,kw", [
    *_STATE_REQUESTS, ("DeepSeek-V3", 64, 512, {}), ("DeepSeek-V3", 256, 4096, {"partition": (1, 2)}),
    ("Qwen3-235B-A22B", 64, 1024, {"precisions": ("bf16", "fp8_cs")})])
def test_pass_1_equals_the_per_point_floor(name, gpus, gbs, kw):
    """Pass 1 per mesh (one layout and state modes per mesh and split, one ``state_floor_bytes`` per split, TP, EP,
    ETP and DP x CP: shared by the CP meshes) queues the same layouts in the same order, prunes and counts the same,
    and keeps the same closest misses and offload queue as the per-point walk with ``max(weight_and_optimizer_bytes)``;
    the layout of each point is the validated one."""
    req = _req(name, gpus, gbs, **kw)
    new, old = P.Search(req), P.Search(req)
    new.pass_1()
    _old_pass_1(old)
    assert new.layouts == old.layouts and new.pruned_mem == old.pruned_mem
    assert [(lp, mode) for lp, mode in new.queue] == [(lp, mode) for lp, mode in old.queue]
    assert new.closest == old.closest and new.offload_queue == old.offload_queue
    assert new.queue or new.closest
    for lp, _ in new.queue[::7]:
        lay = new.layout_of(lp)
        want = P._layout(lp)
        assert lay == want and lay.model_fields_set == want.model_fields_set
        assert {k: v for k, v in lay.__dict__.items() if not k.startswith("_")} == want.__dict__


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_QWEN_LAYOUTS + _DSV2_LAYOUTS) | st.sampled_from(_EP_LAYOUTS))
def test_schedule_floor_of_one_dispatcher_is_the_min_over_dispatchers(lp):
    """_schedule_floor with one dispatcher's seconds (its direct path) equals, bit for bit, the general min over the
    dispatchers given that dispatcher twice, with and without EP overlap, ``less`` and ``more``, on the base job and on jobs with flex dispatchers (SM share), recompute and layer offloading."""
    req = _QWEN if lp in _QWEN_LAYOUTS else _DSV2
    search = P.Search(req)
    mode = (req.precisions[0], False)
    updates = [{}, {"recompute_granularity": "selective", "recompute_modules": ("moe",)}]
    if lp.pp == 1:
        updates.append({"cpu_offloading": True, "cpu_offloading_num_layers": 2})
    disps = [search.a2a_of(lp, search.features(mode, lp, d)) for d in P._dispatcher_variants(req, lp)]
    for upd in updates:
        res = T.estimate_walls(search.job_of(lp, search.features(mode, lp, upd)))
        for d in [*disps, res]:
            for ov in (False, True):
                for kw in ({}, {"less": res.stage_rec_a2a}, {"more": res.stage_offload}):
                    one = P._schedule_floor(res, [d], ep_overlap=ov, **kw)
                    assert one == P._schedule_floor(res, [d, d], ep_overlap=ov, **kw)

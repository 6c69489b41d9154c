"""The step model's fast paths return what the paths they replace return, bit for bit: the plain-float pricing of a
work's rows (:func:`moetune.perfmodel.step._price`) equals pricing its columns with numpy (the implementation it
replaced, kept here as the oracle), :func:`moetune.perfmodel.compute.pairwise_sum` equals ``np.sum``, and the compute
work and price shared by the layer types of equal work inputs (``_layer_work``, ``_price_work``) equal a cold
evaluation of each job."""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest

import moetune.memo
from conftest import DATA
from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.io.load import build_published_job
from moetune.perfmodel import compute as K
from moetune.perfmodel import step as T
from moetune.perfmodel.calibration import read_measured_csv
from moetune.plan import search as P
from moetune.plan.space import SpaceLimits, enumerate_layouts

# ------------------------------------------------------------------------------------------------------------
# the oracle: the numpy pricing of a work's columns that _price replaced
# ------------------------------------------------------------------------------------------------------------


def _columns(work: K.Work) -> dict[str, np.ndarray]:
    g, a, e = work.gemms, work.attn, work.mem

    def col(rows, i, dtype):
        return np.asarray([row[i] for row in rows], dtype)

    return {"g_flops": col(g, 0, float), "g_m": col(g, 1, float), "g_n": col(g, 2, float), "g_k": col(g, 3, float),
            "g_groups": col(g, 4, float), "g_quant": col(g, 5, bool), "g_tag": col(g, 6, int),
            "g_adapter": col(g, 7, bool), "a_flops": col(a, 0, float), "a_tag": col(a, 1, int),
            "e_bytes": col(e, 0, float), "e_tag": col(e, 1, int), "e_stream": col(e, 2, bool)}


def _numpy_gemm_pass_seconds(flops, m, n, k, groups, quant, *, peak_quant_tflops, eff_quant, peak_bf16_tflops,
                             eff_bf16, knee, hbm_gbs, hbm_eff, quant_bytes, grad_accum_bytes, wgrad):
    util = (m / (m + knee)) * (n / (n + knee)) * (k / (k + knee))
    rate = np.where(quant, peak_quant_tflops * eff_quant, peak_bf16_tflops * eff_bf16) * 1e12 * util
    t_flop = flops / rate
    bpe = np.where(quant, quant_bytes, K.BF16_BYTES)
    bw = hbm_gbs * 1e9 * hbm_eff
    fwd = np.maximum(t_flop, groups * (bpe * (m * k + k * n) + K.BF16_BYTES * m * n) / bw)
    dgrad = groups * (bpe * (m * n + k * n) + K.BF16_BYTES * m * k) / bw
    wgrad_s = groups * (bpe * (m * k + m * n) + grad_accum_bytes * k * n) / bw
    return fwd, np.maximum(t_flop, dgrad) + np.where(wgrad, np.maximum(t_flop, wgrad_s), 0.0)


def _numpy_price(work: K.Work, r, rf: dict[int, float], full_frac: float) -> tuple[float, ...]:
    """moetune 061ecef ``step._price`` on the work's columns."""
    work = _columns(work)
    gf = work["g_flops"]
    if gf.size:
        kw = dict(peak_quant_tflops=r.peak_quant, eff_quant=r.eff_quant, peak_bf16_tflops=r.peak_bf16,
                  eff_bf16=r.eff_bf16, knee=r.knee, hbm_gbs=r.hbm_gbs, hbm_eff=r.hbm_eff, quant_bytes=r.quant_bytes)
        args = (gf, work["g_m"], work["g_n"], work["g_k"], work["g_groups"], work["g_quant"])
        wgrad = work["g_adapter"] if r.frozen_base else True
        tg, tb = _numpy_gemm_pass_seconds(*args, **kw, grad_accum_bytes=r.grad_accum_bytes, wgrad=wgrad)
        tfb = (tg + tb) / 3.0
    else:
        tg = tfb = gf
    ta = work["a_flops"] / (r.peak_bf16 * 1e12 * r.attn_eff)
    stream = work["e_stream"]
    if not stream.size:
        te = work["e_bytes"] / (r.hbm_gbs * 1e9 * r.hbm_eff)
    else:
        te = work["e_bytes"] / (r.hbm_gbs * 1e9 * np.where(stream, r.hbm_stream_eff, r.hbm_eff))
    g, a, e = float(tg.sum()), float(ta.sum()), float(te.sum())
    g_fb = float(tfb.sum())
    rec = 0.0
    if full_frac > 0:
        rec = full_frac * (g + a + e)
    elif rf:
        for tag, frac in rf.items():
            if tg.size:
                rec += frac * float(tg[work["g_tag"] == tag].sum())
            if ta.size:
                rec += frac * float(ta[work["a_tag"] == tag].sum())
            if te.size:
                rec += frac * float(te[work["e_tag"] == tag].sum())
    tp_kinds = float(tfb[work["g_tag"] != K.TAG["experts"]].sum()) if tg.size else 0.0
    exp = float(tfb[work["g_tag"] == K.TAG["experts"]].sum()) if tg.size else 0.0
    return g_fb, a, e, rec, tp_kinds, exp


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Equal bit for bit, NaN equal to NaN."""
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------------------------------
# jobs: the measured runs (every precision, LoRA, CP, unfused attention, Mamba hybrids) and planner variants
# ------------------------------------------------------------------------------------------------------------


def _measured_jobs() -> list:
    runs, _ = read_measured_csv(DATA / "perf" / "mbridge_perf_calibration.csv", job_builder=build_published_job)
    return [r.job for r in runs]


def _planner_jobs() -> list:
    out = []
    for model, system, gpus, gbs, prec in (("Qwen3-30B-A3B", "DGX-H100", 16, 512, "bf16"),
                                           ("DeepSeek-V2-Lite", "DGX-H100", 16, 512, "fp8_cs"),
                                           ("Nemotron-3.5-Lightning", "GB200-NVL72", 32, 256, "mxfp8")):
        req = P.PlanRequest(model=get_model(model), system=get_system(system), gpus=gpus, global_batch_size=gbs,
                            seq_length=4096, precisions=(prec,),
                            dispatchers=("alltoall", "deepep", "hybridep", "allgather"))
        layouts = list(enumerate_layouts(req.model, req.system, gpus, gbs, 4096, SpaceLimits()))
        for lp in layouts[::max(len(layouts) // 12, 1)]:
            base = P._base_features(req.model, prec, lp)
            for _, rec in P._recompute_options(req.model, req.max_recompute):
                for disp in P._dispatcher_variants(req, lp):
                    for gr in P._graph_variants(req, rec, disp):
                        out.append(P._job(req, lp, base.model_copy(update={**rec, **disp, **gr})))
    return out


def _unfused(jobs) -> list:
    """``jobs`` with Megatron's unfused attention and RoPE (streamed score rows)."""
    return [j.model_copy(update={"features": j.features.model_copy(update={"attention_backend": "unfused",
                                                                             "apply_rope_fusion": False})})
            for j in jobs]


_PLANNED = _planner_jobs()
_JOBS = _measured_jobs()[::2] + _PLANNED[::3] + _unfused(_PLANNED[1::30])


def _priced_works(jobs) -> list:
    """(work, rates, recompute selection, full-recompute fraction) of every layer kind and non-layer work of ``jobs``,
    as evaluate prices them."""
    eff = T.resolve_efficiency(None)
    out = []
    for job in jobs:
        prof = T.build_profile(job, eff)
        r, _, _ = T._layer_prices(prof, eff)
        rf = dict(prof.recompute_frac)
        for lt in prof.types.values():
            out.append((lt.work.work, r, rf, prof.full_recompute_frac))
        for st in dict.fromkeys(prof.stages):
            if st.extra is not None:
                out.append((st.extra.work, r, {}, 0.0))
    return out


def test_the_jobs_cover_the_work_kinds():
    """The jobs reach every branch the pricing has: quantised and BF16 GEMMs, LoRA adapters under a frozen base,
    streamed (unfused attention) rows, selective and full recompute, expert GEMMs, empty GEMM lists."""
    works = _priced_works(_JOBS)
    gemms = [row for w, *_ in works for row in w.gemms]
    assert any(row[5] for row in gemms) and not all(row[5] for row in gemms)
    assert any(row[7] for row in gemms) and any(r.frozen_base for _, r, _, _ in works)
    assert any(row[2] for w, *_ in works for row in w.mem)
    assert any(rf for _, _, rf, _ in works) and any(ff > 0 for *_, ff in works)
    assert any(row[6] == K.TAG["experts"] for row in gemms)
    assert any(len(w.mem) >= 8 for w, *_ in works)  # np.sum's eight running sums
    assert len(works) > 500


def test_plain_float_pricing_equals_numpy_columns():
    works = _priced_works(_JOBS)
    bad = [i for i, (w, r, rf, ff) in enumerate(works) if T._price(w, r, rf, ff) != _numpy_price(w, r, rf, ff)]
    assert not bad


@pytest.mark.parametrize("field", ["hbm_eff", "eff_bf16", "attn_eff", "hbm_gbs"])
def test_a_zero_rate_prices_as_numpy_does(field):
    """Where a rate is zero numpy gives inf / NaN (with a warning) and plain floats would raise: the float64 rows
    give numpy's numbers."""
    works = _priced_works(_JOBS[::25])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for w, r, rf, ff in works:
            zero = r._replace(**{field: 0.0})
            assert _same(T._price(w, zero, rf, ff), _numpy_price(w, zero, rf, ff))


def test_pairwise_sum_is_np_sum():
    rng = random.Random(19)
    for n in list(range(0, 140)) + [255, 256, 257, 300, 1000]:
        for _ in range(20):
            xs = [rng.uniform(0.0, 1.0) * 10.0 ** rng.randrange(-9, 9) for _ in range(n)]
            assert K.pairwise_sum(xs) == float(np.asarray(xs, float).sum())


def test_gemm_pass_seconds_is_the_numpy_roofline():
    """The column API (:func:`compute.gemm_pass_seconds`, row by row) gives the numpy roofline's arrays."""
    works = _priced_works(_JOBS[::10])
    for w, r, _, _ in works:
        if not w.gemms:
            continue
        c = _columns(w)
        kw = dict(peak_quant_tflops=r.peak_quant, eff_quant=r.eff_quant, peak_bf16_tflops=r.peak_bf16,
                  eff_bf16=r.eff_bf16, knee=r.knee, hbm_gbs=r.hbm_gbs, hbm_eff=r.hbm_eff, quant_bytes=r.quant_bytes)
        args = (c["g_flops"], c["g_m"], c["g_n"], c["g_k"], c["g_groups"], c["g_quant"])
        fwd, bwd = K.gemm_pass_seconds(*args, **kw, grad_accum_bytes=r.grad_accum_bytes, wgrad=c["g_adapter"])
        f0, b0 = _numpy_gemm_pass_seconds(*args, **kw, grad_accum_bytes=r.grad_accum_bytes, wgrad=c["g_adapter"])
        assert fwd.tolist() == f0.tolist() and bwd.tolist() == b0.tolist()


def test_shared_layer_work_equals_a_cold_one():
    """Layer types of equal work inputs share one compute work and one price (``_layer_work``, ``_price_work``):
    each job's layer kinds priced on the shared tables equal the same job priced on empty tables."""
    eff = T.resolve_efficiency(None)
    jobs = _JOBS[::4]
    moetune.memo.clear()
    warm = []
    for job in jobs:
        prof = T.build_profile(job, eff)
        warm.append(({k: lt.work.work for k, lt in prof.types.items()}, T._layer_prices(prof, eff)[2]))
    assert moetune.memo.stats()["moetune.perfmodel.step._layer_work"].hits > 0
    for job, (works, prices) in zip(jobs, warm, strict=True):
        moetune.memo.clear()
        prof = T.build_profile(job, eff)
        assert {k: lt.work.work for k, lt in prof.types.items()} == works
        assert T._layer_prices(prof, eff)[2] == prices


def _layout_jobs() -> list:
    """Base jobs of many layouts (PP / VPP splits, the FLOPs split of layouts without a valid one, MTP layers, BF16
    first and last layers, hybrid Mamba models)."""
    out = []
    for model, system, gpus, gbs, prec, kw in (
            ("DeepSeek-V3", "DGX-H100", 256, 4096, "fp8_cs", {"first_last_layers_bf16": True}),
            ("Nemotron-3.5-Lightning", "GB200-NVL72", 32, 256, "mxfp8", {}),
            ("Qwen3-30B-A3B", "DGX-H100", 16, 512, "bf16", {})):
        req = P.PlanRequest(model=get_model(model), system=get_system(system), gpus=gpus, global_batch_size=gbs,
                            seq_length=4096, precisions=(prec,))
        layouts = list(enumerate_layouts(req.model, req.system, gpus, gbs, 4096, SpaceLimits()))
        for lp in layouts[::max(len(layouts) // 60, 1)]:
            base = P._base_features(req.model, prec, lp)
            out.append(P._job(req, lp, base.model_copy(update=kw)))
    return out


_LAYOUT_JOBS = _layout_jobs()


def test_profile_layer_kinds_are_the_stage_kinds():
    """A profile prices the model's layer kinds (:func:`step._model_kinds`), whatever its layout: exactly the kinds
    its stages hold (evaluate reads every stage kind's price, and whether any priced kind syncs the host)."""
    eff = T.resolve_efficiency(None)
    assert any(j.layout.pp > 1 for j in _LAYOUT_JOBS) and any(j.model.mtp_num_layers for j in _LAYOUT_JOBS)
    for job in _LAYOUT_JOBS + _JOBS[::7]:
        prof = T.build_profile(job, eff)
        assert set(prof.types) == {key for st in prof.stages for key in st.layer_counts}


def test_job_layer_prices_equal_the_profile_path():
    """:func:`step.job_layer_prices` (the layer kinds without the stage works) returns the rates, prices and SM share
    of :func:`step._layer_prices` of the full profile, and the profile's fields the group bound reads."""
    eff = T.resolve_efficiency(None)
    for job in _LAYOUT_JOBS + _JOBS[::5]:
        kinds, r, priced, sm = T.job_layer_prices(job, eff)
        prof = T.build_profile(job, eff)
        assert (r, sm, priced) == (*T._layer_prices(prof, eff)[:2], T._layer_prices(prof, eff)[2])
        for name in ("types", "recompute_frac", "recompute_a2a", "full_recompute_frac", "quant_bytes", "pcls",
                     "offload_bytes", "fg_offload"):
            assert getattr(kinds, name) == getattr(prof, name), name


def test_priced_kinds_equal_pricing_each_kind():
    """:func:`step._layer_prices` (one :func:`step._priced_kinds` lookup per price context and set of layer types)
    returns what the path it replaced computes per call: the job's :func:`step._price_context` and
    :func:`step._price_layer` of each of the profile's layer types, keyed and ordered as its ``types``, here priced
    without the price memo; jobs that share a lookup (feature variants) included."""
    import dataclasses

    from moetune.perfmodel.memory import grad_buffer_bytes

    eff = T.resolve_efficiency(None)
    moetune.memo.clear()
    for job in _JOBS + _PLANNED[1::2]:
        prof = T.build_profile(job, eff)
        r, sm, priced = T._layer_prices(prof, eff)
        lay = job.layout
        r0, sm0, q = T._price_context.__wrapped__(
            job.system, eff, job.features, lay.tp, lay.cp, lay.ep, lay.expert_tp, prof.pcls, prof.quant_bytes,
            2 * grad_buffer_bytes(job.features), tuple(prof.recompute_frac.items()), prof.full_recompute_frac,
            prof.recompute_a2a)
        assert r == r0 and sm == sm0
        assert list(priced) == list(prof.types)
        for key, lt in prof.types.items():
            assert _same(dataclasses.astuple(priced[key]), dataclasses.astuple(T._price_layer.__wrapped__(lt, q)))
    assert moetune.memo.stats()["moetune.perfmodel.step._priced_kinds"].hits > 0


def test_price_carries_its_host_gap():
    """``LayerPrice.gap`` (what evaluate adds per layer without EP overlap) is :func:`step.layer_host_gap` of the
    price without EP overlap at its rates' host-queue sharpness."""
    eff = T.resolve_efficiency(None)
    n = 0
    for job in _JOBS[::3]:
        r, _, priced = T._layer_prices(T.build_profile(job, eff), eff)
        for p in priced.values():
            assert p.gap == T.layer_host_gap(p, False, r.host_queue_sharpness)
            n += p.gap > 0
    assert n


def test_price_inputs_hash_once_and_pickle_afresh():
    """:class:`step.PriceInputs` hashes like its plain tuple (computed once) and pickles to a fresh instance of its
    class without the cached hash (string hashes are salted per process)."""
    import pickle

    eff = T.resolve_efficiency(None)
    job = _JOBS[0]
    prof = T.build_profile(job, eff)
    lay = job.layout
    _, _, q = T._price_context(job.system, eff, job.features, lay.tp, lay.cp, lay.ep, lay.expert_tp, prof.pcls,
                               prof.quant_bytes, 2.0, (), 0.0, 0.0)
    assert hash(q) == hash(tuple(q)) == hash(q) and q == tuple(q)
    back = pickle.loads(pickle.dumps(q))
    assert type(back) is T.PriceInputs and back == q and "_hash" not in back.__dict__
    assert type(q._replace(tp=2)) is T.PriceInputs and hash(q._replace(tp=2)) == hash(tuple(q._replace(tp=2)))


def _stage_works_rank_by_rank(model, lay, seq, mbs, quant_on, bf16_layers, kernels):
    """moetune 4c30f81 ``step._stage_works``: builds every rank's StageWork, then shares those of equal content."""
    split = T._pipeline_split(model, T.split_fields(lay), seq, lay.tp)
    h, tp = model.hidden_size, lay.tp
    vpad = model.padded_vocab_size(tp)
    stages, same = [], {}
    ranks, _ = T._stage_kinds(model, split.layers, split.mtp, quant_on, bf16_layers)
    for p, (counts, n_layers, dense_p, exp_p) in enumerate(ranks):
        emb, loss = split.embedding[p], split.loss[p]
        st = T.StageWork()
        st.layer_counts = dict(counts)
        st.layers = n_layers
        kern = 0.0
        if emb:
            kern += kernels["embedding_loss"] / 2
            dense_p += vpad * h
        if loss:
            kern += kernels["embedding_loss"] / 2
            if model.untie_embeddings_and_output_weights or lay.pp > 1:
                dense_p += vpad * h
        st.extra = T._extra_work(model, seq, mbs, lay.cp, tp, emb, loss)
        st.extra_kernels = kern
        st.dense_params = dense_p / tp
        st.expert_params = exp_p / (lay.ep * lay.expert_tp)
        sig = (tuple(st.layer_counts.items()), emb, loss, st.layers, kern, st.dense_params, st.expert_params)
        stages.append(same.setdefault(sig, st))
    return tuple(stages)


def test_stage_works_equal_building_every_rank():
    """:func:`step._stage_works` (a rank whose content an earlier rank has is not built) returns the stages, and the
    sharing of equal ranks by one object, of building every rank first."""
    eff = T.resolve_efficiency(None)
    shared = 0
    for job in _LAYOUT_JOBS + _JOBS[::3]:
        args = (job.model, job.layout, job.seq_length, job.micro_batch_size,
                *T.quantised_layers(job.model, job.features), eff.kernels)
        got, want = T._stage_works.__wrapped__(*args), _stage_works_rank_by_rank(*args)
        assert len(got) == len(want)
        assert [got.index(st) for st in got] == [want.index(st) for st in want]
        for a, b in zip(got, want, strict=True):
            assert (a.layer_counts, a.extra, a.extra_kernels, a.dense_params, a.expert_params, a.layers) == (
                b.layer_counts, b.extra, b.extra_kernels, b.dense_params, b.expert_params, b.layers)
            assert list(a.layer_counts) == list(b.layer_counts)
        shared += len(got) - len(set(map(id, got)))
    assert shared > 50


def test_layer_inputs_of_fields_is_the_named_tuple():
    """:meth:`step.LayerInputs.of_fields` (built with ``tuple.__new__``) equals the NamedTuple built field by field
    by name, class included, for jobs with LoRA, fused grouped MLP, EP overlap and every dispatcher."""
    from moetune.perfmodel.routing import expert_load, static_expert_shapes

    n_lora = 0
    for job in _JOBS + _PLANNED:
        lay, f = job.layout, job.features
        fused = T.fused_grouped_mlp(job.model, job.system.gpu.arch, f, lay.expert_tp)
        lora = f.task == "lora"
        n_lora += lora
        want = T.LayerInputs(
            seq_length=job.seq_length, micro_batch_size=job.micro_batch_size, tp=lay.tp, cp=lay.cp, ep=lay.ep,
            etp=lay.expert_tp, nvlink_domain=job.system.nvlink_domain, precision=f.precision,
            moe_token_dispatcher_type=f.moe_token_dispatcher_type,
            moe_flex_dispatcher_backend=f.moe_flex_dispatcher_backend, sequence_parallel=f.sequence_parallel,
            cp_comm_type=f.cp_comm_type, cuda_graph_impl=f.cuda_graph_impl, cuda_graph_scope=f.cuda_graph_scope,
            moe_expert_capacity_factor=f.moe_expert_capacity_factor, tp_comm_overlap=f.tp_comm_overlap,
            attention_backend=f.attention_backend, moe_grouped_gemm=f.moe_grouped_gemm,
            moe_permute_fusion=f.moe_permute_fusion, apply_rope_fusion=f.apply_rope_fusion,
            expert_load=expert_load(f), static_expert_shapes=static_expert_shapes(f),
            ep_overlap=bool(f.overlap_moe_expert_parallel_comm and lay.ep > 1),
            shared_expert_overlap=f.moe_shared_expert_overlap,
            lora_targets=tuple(f.lora_target_modules) if lora else (), lora_dim=f.lora_dim if lora else 0,
            fused_grouped_mlp=fused)
        got = T.LayerInputs.of(job)
        assert type(got) is T.LayerInputs and len(got) == len(T.LayerInputs._fields)
        assert got == want and got._asdict() == want._asdict()
    assert n_lora


def test_step_walls_stage_lists_are_one_entry_per_stage():
    """``evaluate``'s per-stage lists (the columns of its per-stage walls, transposed with ``zip``) are lists with
    one entry per PP rank, equal where the ranks share one stage object, and ``stage_seconds`` is at least the
    floor and offload walls of each stage (the per-microbatch sum that holds them)."""
    eff = T.resolve_efficiency(None)
    for job in _LAYOUT_JOBS + _JOBS[::4]:
        prof = T.build_profile(job, eff)
        res = T.evaluate(prof, eff)
        cols = (res.stage_seconds, res.stage_floor, res.stage_a2a, res.stage_rec_a2a, res.stage_offload,
                res.stage_partner)
        for col in cols:
            assert type(col) is list and len(col) == len(prof.stages) == job.layout.pp
        for i, st in enumerate(prof.stages):
            j = prof.stages.index(st)
            assert all(col[i] == col[j] or col[i] != col[i] for col in cols)
            assert res.stage_seconds[i] >= res.stage_floor[i] + res.stage_offload[i] - 1e-12 * res.stage_seconds[i]
        assert res.stage_seconds[res.bottleneck] == max(res.stage_seconds)


def test_step_walls_fields_in_order():
    """``evaluate`` builds :class:`step.StepWalls` positionally (``tuple.__new__``): each field holds what its name
    says - the walls add up to the step, the bottleneck is the first slowest stage, the detail is the bottleneck's
    gemm / attention / memory-bound, the rates' EP-overlap efficiency and the dispatcher's SM share, the schedule."""
    eff = T.resolve_efficiency(None)
    for job in _LAYOUT_JOBS + _JOBS[::4]:
        prof = T.build_profile(job, eff)
        r, sm, _ = T._layer_prices(prof, eff)
        res = T.evaluate(prof, eff)
        assert type(res) is T.StepWalls and len(res) == len(T.StepWalls._fields)
        assert list(res.walls) == list(T.WALL_ORDER) and res.step == sum(res.walls.values())
        assert type(res.bottleneck) is int and res.bottleneck == int(np.argmax(res.stage_seconds))
        assert list(res.detail) == ["gemm", "attention", "memory_bound"]
        assert res.detail["gemm"] <= res.walls["compute"] * (1 + 1e-12)
        assert (res.sm_frac, res.ep_overlap_eff, res.schedule) == (sm, r.ep_overlap_eff, (prof.m, prof.pp, prof.vpp))
        assert res.step_host <= res.walls["host"] * (1 + 1e-12) + 1e-15
        assert res == T.StepWalls(**res._asdict())


def test_layer_kinds_fields_by_name():
    """:func:`step._layer_kinds` builds :class:`step.LayerKinds` positionally (``tuple.__new__``): it equals the
    NamedTuple built field by field by name from the functions each field comes from."""
    from moetune.perfmodel.memory import cpu_offloaded_layer_bytes, fine_grained_offloaded_bytes

    eff = T.resolve_efficiency(None)
    for job in _LAYOUT_JOBS + _JOBS[::3] + _PLANNED[::7]:
        model, lay, f = job.model, job.layout, job.features
        split = T.pipeline_split(model, lay, job.seq_length)
        quant = T.quantised_layers(model, f)
        fused = T.fused_grouped_mlp(model, job.system.gpu.arch, f, lay.expert_tp)
        rf, rec_a2a, full, notes = T.recompute_selection(f, len(split.layers[0]), split.vpp)
        got = T._layer_kinds(job, eff, split, quant)
        want = T.LayerKinds(
            job=job, types=T._layer_types(model, *quant, f, job.seq_length, job.micro_batch_size, lay.tp, lay.cp,
                                          lay.ep, lay.expert_tp, job.system.nvlink_domain, eff.kernels, fused),
            recompute_frac=rf, recompute_a2a=rec_a2a, full_recompute_frac=full, quant_bytes=K.QUANT_BYTES[f.precision],
            pcls=K.precision_class(f.precision, job.system.gpu.arch), offload_bytes=cpu_offloaded_layer_bytes(job),
            fg_offload=fine_grained_offloaded_bytes(job), notes=got.notes)
        assert type(got) is T.LayerKinds and len(got) == len(T.LayerKinds._fields)
        assert got._asdict() == want._asdict()
        assert got.notes[:len(notes)] == notes


def test_mla_up_fraction_memo_is_the_fresh_value():
    """The memoised :func:`step._mla_up_fraction` is the value computed afresh, for MLA and other models."""
    models = {job.model.name: job.model for job in _JOBS + _PLANNED}
    assert any(m.multi_latent_attention for m in models.values()) and not all(
        m.multi_latent_attention for m in models.values())
    for m in models.values():
        got = T._mla_up_fraction(m)
        assert got == T._mla_up_fraction.__wrapped__(m) and (got > 0) == bool(m.multi_latent_attention)

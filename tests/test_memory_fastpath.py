"""The memory fit test's fast paths equal the plain evaluation they replace, on every job a few searches test (every
PP rank, every chunk; equal with ``==``): the activation table of a chunk (runs of one layer type, the stage extras
looked up once) equals the per-layer loop, and the activation configs without recompute / offloading are the
configs built fresh."""

from __future__ import annotations

import pytest

import moetune.memo
from moetune.catalog.memory_constants import const
from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.perfmodel import activations as act
from moetune.perfmodel import memory as M
from moetune.perfmodel.params import mtp_block_layers
from moetune.spec.pipeline import pipeline_stages
from moetune.plan import search as P

_DISPATCHERS = ("alltoall", "deepep", "hybridep", "allgather")
_REQUESTS = [
    dict(model="Qwen3-30B-A3B", gpus=16, gbs=512),
    dict(model="DeepSeek-V2-Lite", gpus=16, gbs=512, precisions=("fp8_cs",)),
    dict(model="Llama-3-70B", gpus=8, gbs=64),
    dict(model="DeepSeek-V3", gpus=256, gbs=4096, system="GB200-NVL72", precisions=("mxfp8",)),
]


def _tested_jobs(kw: dict) -> list:
    kw = dict(kw)
    req = P.PlanRequest(model=get_model(kw.pop("model")), system=get_system(kw.pop("system", "DGX-H100")),
                        gpus=kw.pop("gpus"), global_batch_size=kw.pop("gbs"), seq_length=4096,
                        dispatchers=_DISPATCHERS, top=3, **kw)
    moetune.memo.clear()
    search = P.Search(req)
    search.run()
    return search.tested_jobs()


@pytest.fixture(scope="module")
def jobs() -> list:
    out = [job for kw in _REQUESTS for job in _tested_jobs(kw)]
    feats = [job.features for job in out]
    # the searches test the branches of the chunk table: full recompute, selective recompute, layer-level CPU
    # offloading, CUDA graphs, MTP layers
    assert any(f.recompute_granularity == "full" for f in feats)
    assert any(f.recompute_granularity == "selective" for f in feats)
    assert any(f.cpu_offloading for f in feats)
    assert any(f.cuda_graph_impl != "none" for f in feats)
    assert any(job.model.mtp_num_layers for job in out)
    return out


def _chunk_activation_per_layer(m, fkey, cfg, sig, vocab_padded) -> tuple[float, float, float, float]:
    """The chunk table as one pass per layer (the loop :func:`moetune.perfmodel.memory._chunk_activation_of`
    replaced): every layer looked up and added on its own, the stage extras computed where they are added."""
    scope, granularity, method, num_layers, cpu_n = fkey
    layer_types, mtp_count, has_embedding, has_loss = sig
    layers = list(layer_types)
    mtp_layers = mtp_block_layers(m) * mtp_count if mtp_count else []
    saved = graphed = transient = offl = 0.0
    n_rec = num_layers or 1
    if granularity == "full" and layers:
        inp = act.layer_input_bytes(m, cfg)
        if method == "block":
            rec, keep = layers[:n_rec], layers[n_rec:]
            saved += inp * len(rec)
        else:
            rec, keep = layers, []
            saved += inp * -(-len(layers) // n_rec)
        for mx, ml in rec:
            transient = max(transient, act.layer_bytes(m, mx, ml, cfg) * min(n_rec, len(rec)))
    else:
        keep = layers
    items = keep + mtp_layers
    n_off = max(0, min(cpu_n, len(keep) - 1)) if cpu_n else 0
    for i, (mx, ml) in enumerate(items):
        b, g, t, o = M._layer_activation(m, mx, ml, cfg, scope)
        if i < n_off:
            offl = max(offl, b)
        else:
            saved += b
            graphed += g
        transient = max(transient, t)
        offl = max(offl, o)
    if mtp_count:
        saved += mtp_count * act.mtp_extra_bytes(m, cfg, vocab_padded)
    if has_embedding:
        saved += act.embedding_stage_bytes(m, cfg)
    if has_loss:
        s, t = act.loss_stage_bytes(m, cfg, vocab_padded)
        saved += s
        transient = max(transient, t)
    resident = const("fine_grained_offload_resident_layers") * offl if cfg.offload else (offl if cpu_n else 0.0)
    return saved, graphed, transient, resident


def test_chunk_activations_equal_the_per_layer_loop(jobs):
    """Every chunk of the tested jobs, with the job's own recompute and offloading and (every 5th job) with full
    recompute of 2 or 3 layers per group / block and 2 CPU-offloaded layers."""
    seen = set()
    for i, job in enumerate(jobs):
        m, cfg, fkey = job.model, M.act_config(job), M.chunk_features(job.features)
        fkeys = [fkey]
        if i % 5 == 0:
            fkeys += [fkey._replace(recompute_granularity="full", recompute_method=method, recompute_num_layers=n)
                      for method in ("uniform", "block") for n in (2, 3)]
            fkeys.append(fkey._replace(cpu_offloading_num_layers=2))
        vocab = m.padded_vocab_size(job.layout.tp)
        for row in M._chunk_signatures(m, job.layout):
            for sig in row:
                for fk in fkeys:
                    key = (m.name, fk, cfg, sig, vocab)
                    if key in seen:
                        continue
                    seen.add(key)
                    assert M._chunk_activation_of(m, fk, cfg, sig, vocab) == _chunk_activation_per_layer(
                        m, fk, cfg, sig, vocab), (job.layout, job.features, fk)
    assert len(seen) > 1000


def test_configs_without_recompute_or_offload_equal_fresh_ones(jobs):
    cfgs = {M.act_config(job) for job in jobs}
    cfgs |= {M.act_config(job, frozenset({"core_attn", "mlp"})) for job in jobs[::7]}
    assert any(c.recompute for c in cfgs) and any(not c.recompute for c in cfgs)
    for cfg in cfgs:
        for rec, off in ((False, True), (True, True), (True, False)):
            upd = {**({"recompute": frozenset()} if rec else {}), **({"offload": frozenset()} if off else {})}
            got = act.without(cfg, recompute=rec, offload=off)
            assert got == act.ActConfig(**{**act._asdict(cfg), **upd})
            assert hash(got) == hash(act.ActConfig(**{**act._asdict(cfg), **upd}))


def test_chunk_signatures_of_the_split_equal_the_layouts_own(jobs):
    """The signature table is keyed on the pipeline split: equal to the one built from the layout's own ranks."""
    layouts = {(job.model.name, job.layout): job for job in jobs}
    for job in layouts.values():
        m = job.model
        own = tuple(tuple((tuple((m.mixer_pattern[i], m.mlp_pattern[i]) for i in ch.layers), ch.mtp_layers,
                           ch.embedding, ch.loss) for ch in rank.chunks)
                    for rank in pipeline_stages(m, job.layout))
        assert M._chunk_signatures(m, job.layout) == own
    assert len(layouts) > 100


def test_inflight_states_of_the_clipped_microbatch_count_equal_the_walk():
    """The in-flight states are memoised on the clipped microbatch count (``_schedule_microbatches``): equal to the
    schedule walk of the count itself, for every rank of PP 1-16 and VPP 1-6 and counts up to past the clip."""
    walk = M._inflight_states.__wrapped__
    n = 0
    for pp in (1, 2, 3, 4, 6, 8, 16):
        for vpp in (1, 2, 3, 4, 6):
            for rank in range(pp):
                clip = M._schedule_microbatches(pp, vpp, 10**6, rank)
                for m in sorted({1, 2, 3, clip - 1, clip, clip + 1, clip + 7, 2 * clip + 3} - {0}):
                    assert M.inflight_states(pp, vpp, m, rank) == walk(pp, vpp, m, rank), (pp, vpp, m, rank)
                    clipped = M._inflight_array_of(pp, vpp, M._schedule_microbatches(pp, vpp, m, rank), rank)
                    assert clipped.tolist() == [list(s) for s in walk(pp, vpp, m, rank)]
                    n += 1
    assert n > 1000


def test_one_state_one_chunk_product_equals_the_matrix_product(jobs):
    """Ranks with one chunk and one in-flight state take the activation peak as one product of floats instead of
    the (1 x 1) matrix product: equal on every such rank of the tested jobs (and the other ranks take the product)."""
    n = 0
    for job in jobs:
        m, cfg, fkey = job.model, M.act_config(job), M.chunk_features(job.features)
        static = M._rank_static(job)
        for idx, (_, _, _, states, inflight, _) in enumerate(static.ranks):
            chunk_saved, saved_arr = M._activation_row(m, fkey, cfg, static.signatures[idx], static.vocab_padded)[:2]
            if len(inflight) == 1 == len(chunk_saved):
                assert inflight[0][0] * chunk_saved[0] == float((states @ saved_arr)[0])
                n += 1
    assert n > 100


def test_tail_kinds_equal_the_itemised_tail_totals(jobs):
    """The runtime tail's per-kind GiB of the fit test (``tail_builder(job).kinds``: the per-rank GiB added without
    a list) are the totals of the itemised tail (:func:`moetune.perfmodel.runtime_tail.runtime_tail`,
    ``RuntimeTail.total``), bit for bit and of the same type, on every tested job and its full-iteration graph and
    expandable-segments variants, for zero, the rank's own and other peaks."""
    from moetune.perfmodel.runtime_tail import TAIL_KINDS, runtime_tail, tail_builder

    variants = ({}, {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("full_iteration",)},
                {"expandable_segments": True})
    seen = set()
    for job in jobs[::7]:
        for upd in variants:
            j = job.model_copy(update={"features": job.features.model_copy(update=upd)})
            kinds = tail_builder(j).kinds
            peaks = [(0.0, 0.0), (3.5e9, 0.0), (0.0, 41.25e9), (17e9 / 3, 70e9 / 7)]
            peaks += [(a * 1e9, p * 1e9) for _, p in M.reserved_peaks(j) for a in (0.0, p / 3)]
            for act_b, alloc_b in peaks:
                tail = runtime_tail(j, activation_peak_bytes=act_b, allocated_peak_bytes=alloc_b)
                got, want = kinds(act_b, alloc_b), tuple(tail.total(k) for k in TAIL_KINDS)
                assert [(type(v), repr(v)) for v in got] == [(type(v), repr(v)) for v in want]
                seen.add(sum(1 for it in tail.items if it.kind == "reserved"))
    assert seen == {0, 1, 2}  # no per-rank item, one, both (graph pool and fragmentation)


def test_chunk_features_memo_equals_the_projection(jobs):
    """The memoised :func:`moetune.perfmodel.memory.chunk_features` (one shared instance per features value) equals
    the projection computed fresh, field by field, on every tested job."""
    for job in jobs:
        f = job.features
        got = M.chunk_features(f)
        assert got == M.chunk_features.__wrapped__(f)
        assert got == (M.graph_scope(job), f.recompute_granularity, f.recompute_method, f.recompute_num_layers,
                       f.cpu_offloading_num_layers if f.cpu_offloading else 0)
        assert got is M.chunk_features(f.model_copy())


def _layout_ep_config(job):
    """The activation config with the layout's own EP size (what :func:`moetune.perfmodel.memory.act_config` gave
    before it set EP to 1 without the allgather dispatcher)."""
    lay = job.layout
    return M._job_act_config(job.features, lay.tp, lay.cp, lay.expert_tp, lay.ep, job.seq_length,
                             job.micro_batch_size, None)


def test_config_without_the_allgather_dispatcher_drops_ep_and_nothing_changes(jobs):
    """The activation config keeps the layout's EP size only with the allgather dispatcher (the one reader): the
    itemised memory of every rank (components, chunks, peaks: :func:`moetune.perfmodel.memory._rank_memory`) and
    the device GiB equal those priced with the layout's EP, on every tested job with EP > 1."""
    n = gathered = 0
    for job in jobs:
        cfg, own = M.act_config(job), _layout_ep_config(job)
        if job.features.moe_token_dispatcher_type == "allgather":
            assert cfg is own
            gathered += job.layout.ep > 1
            continue
        assert cfg.ep == 1 and cfg == act.ActConfig(**{**act._asdict(own), "ep": 1})
        if job.layout.ep == 1:
            continue
        assert list(M._rank_memory(job, cfg, True)) == list(M._rank_memory(job, own, True)), (job.layout, job.features)
        assert list(M._rank_memory(job, cfg, "device")) == list(M._rank_memory(job, own, "device"))
        n += 1
    assert n > 300 and gathered > 10


def test_shared_tail_builder_equals_the_jobs_own(jobs):
    """The runtime tail the fit test uses is built once per value of what it reads
    (:func:`moetune.perfmodel.runtime_tail.shared_tail_builder` of the layout's sizes and
    :func:`~moetune.perfmodel.runtime_tail.tail_features`): its items (names, GiB, kinds, assumption texts), per-kind
    totals and non-PyTorch GiB equal those of ``tail_builder`` of the job itself, on every tested job (and, every
    5th, its full-iteration graph, local graph, expandable-segments and HybridEP with the other sequence parallelism
    variants), for several peaks; and the jobs of one builder are many."""
    from moetune.perfmodel.runtime_tail import tail_builder

    variants = ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("full_iteration",)},
                {"cuda_graph_impl": "local", "cuda_graph_scope": ("attn",)}, {"expandable_segments": True})
    peaks = [(0.0, 0.0), (3.5e9, 0.0), (0.0, 41.25e9), (17e9 / 3, 70e9 / 7)]
    builders, n = set(), 0
    for i, job in enumerate(jobs):
        hybridep = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep",
                    "sequence_parallel": not job.features.sequence_parallel}
        js = [job] + ([job.model_copy(update={"features": job.features.model_copy(update=u)})
                       for u in (*variants, hybridep)] if i % 5 == 0 else [])
        for j in js:
            shared, own = M._rank_static(j).tail, tail_builder(j)
            builders.add(id(shared))
            assert shared.non_torch == own.non_torch
            for a, b in peaks:
                assert shared.kinds(a, b) == own.kinds(a, b) and shared.totals(a, b) == own.totals(a, b)
                assert shared(a, b) == own(a, b), (j.layout, j.features)
            n += 1
    assert n > 2 * len(builders)


def _rank_peaks_inline(job) -> list[tuple]:
    """Per PP rank, (in-flight state at the peak, peak saved bytes outside graphs, graphed peak), as
    :func:`moetune.perfmodel.memory._rank_memory` computed them inline before the per-rank memo
    (``_rank_activations``), static graph I/O included."""
    m, cfg, fkey = job.model, M.act_config(job), M.chunk_features(job.features)
    static = M._rank_static(job)
    io = M._graphed_io_of(job, cfg, fkey.graph_scope)
    out = []
    for idx, rank in enumerate(static.stages):
        states, inflight = static.ranks[idx][3:5]
        chunk_saved, saved_arr, graphed_arr = M._activation_row(m, fkey, cfg, static.signatures[rank.pp_rank],
                                                                static.vocab_padded)[:3]
        if io is None and len(inflight) == 1 == len(chunk_saved):
            i_best, best = 0, inflight[0][0] * chunk_saved[0]
        else:
            totals = states @ saved_arr
            i_best = int(totals.argmax() if io is None else (totals + states @ io[rank.pp_rank]).argmax())
            best = float(totals[i_best])
        graphed = 0.0 if graphed_arr is None else max(0.0, float((states @ graphed_arr).max()))
        out.append((inflight[i_best], best, graphed))
    return out


def test_rank_activation_memo_equals_the_inline_peaks(jobs):
    """The per-rank activation peak memo (keyed on the row and the schedule: shared by the EP variants of a split)
    gives every rank's itemised activations, graphed activations and in-flight state at the peak of the inline
    computation it replaced, bit for bit, on every tested job (those with static graph I/O included), and the saved
    activation floor its former matrix-product maximum."""
    n = io = floors = 0
    for job in jobs:
        cfg = M.act_config(job)
        io += M._graphed_io_of(job, cfg, M.chunk_features(job.features).graph_scope) is not None
        for stage, (state, best, graphed) in zip(M._rank_memory(job, cfg, True), _rank_peaks_inline(job), strict=True):
            assert stage.components["activations"] == best / M.GIB
            assert stage.components.get("cuda_graph_activations", 0.0) == (graphed / M.GIB if graphed else 0.0)
            assert tuple(c.in_flight_at_peak for c in stage.chunks) == state
            n += 1
        got = M.saved_activation_floor(job)
        if got is not None:
            m, fkey, static = job.model, M.chunk_features(job.features), M._rank_static(job)
            want = [(static.ranks[i][1] + float((static.ranks[i][3] @ M._activation_row(
                m, fkey, cfg, static.signatures[i], static.vocab_padded)[1]).max())) / M.GIB + static.tail.non_torch
                for i in range(len(static.stages))]
            assert list(got) == want
            floors += 1
    assert n > 3000 and io > 50 and floors > 300


def test_fit_peaks_equal_the_non_torch_and_reserved_peaks(jobs):
    """The fit test's one lookup (:func:`moetune.perfmodel.memory.fit_peaks`) gives :func:`non_torch_gib` and
    :func:`reserved_peaks` of the ranks in the order asked (all, reversed, the last first, none), bit for bit."""
    for job in jobs[::3]:
        pp = job.layout.pp
        for order in ([], list(range(pp)), list(range(pp))[::-1], [pp - 1, *range(pp - 1)]):
            non_torch, peaks = M.fit_peaks(job, order)
            assert non_torch == M.non_torch_gib(job)
            assert list(peaks) == list(M.reserved_peaks(job, order))


def test_offloaded_layer_bytes_memo_equals_the_per_layer_lookups(jobs):
    """:func:`moetune.perfmodel.memory.cpu_offloaded_layer_bytes` (memoised on the model, activation config, graph
    scope and layer count) equals the saved bytes of the first N layers looked up one by one, on every tested job
    with layer-level offloading (and is empty for the others)."""
    n = 0
    for job in jobs:
        f, m = job.features, job.model
        got = M.cpu_offloaded_layer_bytes(job)
        if not (f.cpu_offloading and f.cpu_offloading_num_layers) or job.layout.pp > 1:
            assert got == ()
            continue
        cfg = M.act_config(job)
        k = max(0, min(f.cpu_offloading_num_layers, m.num_layers - 1))
        assert got == tuple(act.layer_bytes(m, m.mixer_pattern[i], m.mlp_pattern[i], cfg) for i in range(k))
        n += 1
    assert n > 50


def test_layout_model_state_equals_the_jobs_own(jobs):
    """The model state of :func:`moetune.perfmodel.memory._rank_state_of` is priced once per layout, on a job without
    batch fields (``_layout_state_of``): every rank's components, their sum and per-chunk params equal those of the
    job itself, and the in-flight states those of its microbatch count, on every other tested job and (every 10th)
    its Megatron-FSDP, LoRA and FP8-parameter variants."""
    variants = ({"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads_params"},
                {"task": "lora"}, {"precision": "fp8_cs", "fp8_param_gather": True})
    n = 0
    for i, job in enumerate(jobs[::2]):
        for upd in ({}, *(variants if i % 5 == 0 else ())):
            m, lay = job.model, job.layout
            f = M.state_features(job.features.model_copy(update=upd))
            full = M._job_of(m, lay, job.system, job.gpus, job.global_batch_size, job.micro_batch_size,
                             job.seq_length, f)
            stages, vocab, ranks = M._rank_state_of(m, lay, job.system, job.gpus, job.global_batch_size,
                                                    job.micro_batch_size, job.seq_length, f)
            assert vocab == m.padded_vocab_size(lay.tp)
            per_job = (M.state_bytes(full), *M.shard_sizes(full))
            lora, params = M.lora_rank_params(full), M._all_rank_params(m, lay)
            largest = M._largest_layer(m, lay.tp, lay.ep, lay.expert_tp) if f.use_megatron_fsdp else 0.0
            for rank, got in zip(M.pipeline_ranks(m, lay), ranks, strict=True):
                r = rank.pp_rank
                comps = M._model_state(full, *params[r][:3], largest, per_job, None if lora is None else lora[r])
                assert got[:3] == (comps, sum(comps.values()), params[r][3])
                assert got[4] == M.inflight_states(lay.pp, len(rank.chunks), max(1, full.num_microbatches), r)
                n += 1
    assert n > 1000


def test_graphed_io_of_the_split_equals_the_layouts_own(jobs):
    """The static CUDA-graph I/O table is keyed on the pipeline split (``_graphed_io_per_chunk``): equal to the
    per-chunk sums over the layout's own stages (:func:`moetune.spec.pipeline.pipeline_stages`, unmemoised), on every
    tested job with graph buffers and (every 5th) its attention, MoE and router graph-scope variants."""
    scopes = (("attn",), ("moe",), ("mlp", "moe_router"), ("attn", "moe_preprocess"))
    n = 0
    for i, job in enumerate(jobs):
        js = [job] + ([job.model_copy(update={"features": job.features.model_copy(
            update={"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": sc})}) for sc in scopes]
            if i % 5 == 0 else [])
        for j in js:
            m, cfg = j.model, M.act_config(j)
            scope = M.graph_scope(j)
            got = M._graphed_io_of(j, cfg, scope)
            if got is None:
                continue
            hid = const("dtype_bytes")["bf16"] * m.hidden_size * cfg.tokens_sp
            router_out = const("router_bytes_per_expert_per_token") * (m.num_moe_experts or 0) * cfg.tokens_sp
            want = []
            for rank in pipeline_stages(m, j.layout):
                row = []
                for ch in rank.chunks:
                    per_mb = 0.0
                    for k in ch.layers:
                        mx, ml = m.mixer_pattern[k], m.mlp_pattern[k]
                        if ("attn" in scope and mx in "AW") or ("mamba" in scope and mx in "MG"):
                            per_mb += 2 * hid
                        if "mlp" in scope and ml == "D":
                            per_mb += 2 * hid
                        if ml == "E":
                            if "moe" in scope:
                                per_mb += 2 * hid
                            elif {"moe_router", "moe_preprocess"} & scope:
                                per_mb += hid + router_out
                    row.append(per_mb)
                want.append(row)
            assert [a.tolist() for a in got] == want, (j.layout, scope)
            n += 1
    assert n > 200

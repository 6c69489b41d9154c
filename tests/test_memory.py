"""Per-rank memory model (perfmodel/memory.py): model state, schedule in-flight counts, tail, monotonicity, logs."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.perfmodel import memory as mem
from moetune.perfmodel.params import count_params
from moetune.spec.features import Features
from moetune.spec.job import Job
from moetune.spec.layout import Layout
from moetune.spec.model import ModelArch, uniform_pattern

GIB = float(1 << 30)


def _gpt7b() -> ModelArch:
    """The 6.44B dense GPT of fixstars/mdk pretrain_7b_mpi.patch: 30 layers, h 4096, 32 heads, SwiGLU (MLM default
    FFN int(4h*2/3/64)*64 = 10880), LayerNorm (MLM default), GPT-2 vocab 50257, untied embeddings."""
    mix, mlp = uniform_pattern(30, moe=False)
    return ModelArch(name="gpt-6.44b", num_layers=30, hidden_size=4096, ffn_hidden_size=10880, num_attention_heads=32,
                     vocab_size=50257, normalization="LayerNorm", mixer_pattern=mix, mlp_pattern=mlp)


def job(model=None, gpus=8, layout=None, features=None, gbs=64, mbs=1, seq=4096, system="DGX-H100") -> Job:
    return Job(model=model or get_model("Qwen3-30B-A3B"), system=get_system(system), gpus=gpus,
               global_batch_size=gbs, micro_batch_size=mbs, seq_length=seq, layout=layout or Layout(),
               features=features or Features(hidden_dropout=0.0, attention_dropout=0.0))


@pytest.mark.parametrize("log,gpus", [("log_iteration_theoretical_memory_1.txt", 8),
                                      ("log_iteration_theoretical_memory_2.txt", 16)])
def test_weight_and_optimizer_reproduces_megatron_log(shared_data, log, gpus):
    text = (shared_data / "logs" / log).read_text()
    want = float(re.search(r"weight and optimizer=([\d.]+) MB", text).group(1))
    shard = float(re.search(r"most loaded shard in billions: ([\d.]+)", text).group(1))
    j = job(_gpt7b(), gpus=gpus, gbs=1024, mbs=2, features=Features(precision="fp8_delayed"))
    assert count_params(j.model).total / 1e9 == pytest.approx(shard, abs=5e-5)
    got = mem.weight_and_optimizer_bytes(j)[0] / 2**20
    assert got == pytest.approx(want, abs=0.05)


def _state(j: Job) -> dict[str, float]:
    return mem.estimate_memory(j).stages[0].components


def test_bytes_per_param_table():
    m = _gpt7b()
    p = count_params(m).total
    # DDP: 2 weight + 4 grad + 12 optimizer = 18 B/param
    s = _state(job(m, features=Features(use_distributed_optimizer=False)))
    assert (s["weights"] + s["main_grads"] + s["optimizer_state"]) * GIB == pytest.approx(18 * p, rel=1e-9)
    # distributed optimizer over DP=8: 6 + 12/8
    s = _state(job(m))
    assert (s["weights"] + s["main_grads"] + s["optimizer_state"]) * GIB == pytest.approx(7.5 * p, rel=1e-9)
    # precision-aware optimizer, BF16 moments: 6 + 8/8
    f = Features(use_precision_aware_optimizer=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    s = _state(job(m, features=f))
    assert s["optimizer_state"] * GIB == pytest.approx(8 / 8 * p, rel=1e-9)
    # BF16 main grads
    s = _state(job(m, features=Features(main_grads_dtype="bf16")))
    assert s["main_grads"] * GIB == pytest.approx(2 * p, rel=1e-9)
    # two distributed-optimizer instances shard over DP/2
    s = _state(job(m, features=Features(num_distributed_optimizer_instances=2)))
    assert s["optimizer_state"] * GIB == pytest.approx(12 / 4 * p, rel=1e-9)
    # optimizer CPU offload keeps (1 - f)
    s = _state(job(m, features=Features(optimizer_cpu_offload=True, optimizer_offload_fraction=0.75)))
    assert s["optimizer_state"] * GIB == pytest.approx(0.25 * 12 / 8 * p, rel=1e-9)
    # FP8 params: row- and column-wise FP8 linear weights (1 + 1 B; Hopper's column-wise copy is the transpose), the
    # other parameters BF16, so 2 B per parameter and no separate FP8 weight cache
    s = _state(job(m, features=Features(precision="fp8_cs", fp8_param_gather=True)))
    assert s["weights"] * GIB == pytest.approx(2 * p, rel=1e-9) and "fp8_weight_cache" not in s
    assert "fp8_weight_cache" in _state(job(m, features=Features(precision="fp8_cs")))
    # NVFP4 caches 4-bit row- and column-wise weights with 1/16 E4M3 scales: 1.125 B vs FP8's 2 B per param
    fp4 = _state(job(m, features=Features(precision="nvfp4")))["fp8_weight_cache"]
    fp8 = _state(job(m, features=Features(precision="fp8_cs")))["fp8_weight_cache"]
    assert fp4 == pytest.approx(fp8 * 1.125 / 2, rel=1e-9)
    # Megatron-FSDP optim_grads_params: everything over DP
    s = _state(job(m, features=Features(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params")))
    assert (s["weights"] + s["main_grads"] + s["optimizer_state"]) * GIB == pytest.approx(18 / 8 * p, rel=1e-9)


def test_grad_buffer_follows_grad_reduce_in_fp32():
    """Megatron-Core DDP / Megatron-FSDP keep FP32 gradient buffers only when gradients are reduced in FP32; the Bridge
    perf recipes reduce in BF16 (``ddp.grad_reduce_in_fp32 = False``), so their gradients take 2 B/param."""
    m = _gpt7b()
    p = count_params(m).total
    assert mem.grad_buffer_bytes(Features()) == 4
    assert mem.grad_buffer_bytes(Features(grad_reduce_in_fp32=False)) == 2
    assert mem.grad_buffer_bytes(Features(main_grads_dtype="bf16")) == 2
    s = _state(job(m, features=Features(grad_reduce_in_fp32=False)))
    assert s["main_grads"] * GIB == pytest.approx(2 * p, rel=1e-9)
    assert s["main_grads"] == pytest.approx(s["weights"], rel=1e-12)
    f = Features(grad_reduce_in_fp32=False, use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params")
    s = _state(job(m, features=f))
    assert (s["weights"] + s["main_grads"] + s["optimizer_state"]) * GIB == pytest.approx(16 / 8 * p, rel=1e-9)


def test_gpt_oss_b200_recipe_fits():
    """NVIDIA's GPT-OSS-120B 64xB200 BF16 recipe (TP1 PP1 EP8 MBS4, layernorm + moe_act recompute) ran, so it fits:
    with its BF16 gradient buffers the model state is 30.7 + 30.7 + 20.4 GiB (not 61.3 GiB of FP32 gradients)."""
    from moetune.catalog.recipes import recipe_config
    from moetune.io.config_to_job import job_from_config

    j = job_from_config(recipe_config("gpt_oss_120b_pretrain_64gpu_b200_bf16_config"))
    assert not j.features.grad_reduce_in_fp32
    est = mem.estimate_memory(j)
    s = est.stages[0].components
    assert s["main_grads"] == pytest.approx(s["weights"], rel=1e-12)
    assert est.fits


def test_expert_state_sharded_over_edp():
    m = get_model("Qwen3-30B-A3B")
    lay = Layout(ep=8, etp=1)
    f8 = Features()
    a = _state(job(m, gpus=8, layout=lay, features=f8))
    b = _state(job(m, gpus=16, layout=lay, features=f8, gbs=64))
    # weights/grads per rank unchanged; optimizer shrinks (dense DP 8->16, experts EDP 1->2)
    assert a["weights"] == pytest.approx(b["weights"])
    assert b["optimizer_state"] < a["optimizer_state"] * 0.55


def test_inflight_microbatches():
    # 1F1B: stage r holds min(P - r, m)
    assert [mem.inflight_states(4, 1, 8, r) for r in range(4)] == [((4,),), ((3,),), ((2,),), ((1,),)]
    assert mem.inflight_states(4, 1, 2, 0) == ((2,),)
    # interleaved: warm-up (P - r - 1)*2 + (v - 1)*P forwards, +1 at the first steady forward
    for r in range(4):
        peak = max(sum(s) for s in mem.inflight_states(4, 2, 16, r))
        assert peak == (4 - r - 1) * 2 + (2 - 1) * 4 + 1
    # the last rank holds its last (loss) chunk for one microbatch at a time at most twice
    assert max(s[-1] for s in mem.inflight_states(2, 4, 4, 1)) <= 2


def test_stage_structure_and_binding():
    j = job(get_model("Qwen3-30B-A3B"), gpus=32, layout=Layout(pp=4, ep=8), gbs=256)
    est = mem.estimate_memory(j)
    assert [s.pp_rank for s in est.stages] == [0, 1, 2, 3]
    assert sum(s.binding for s in est.stages) == 1
    assert est.stages[est.binding_stage].binding
    assert est.last_stage_peak_allocated_gib == est.stages[-1].peak_allocated_gib
    assert est.peak_allocated_gib == max(s.peak_allocated_gib for s in est.stages)
    # first stage holds the most in-flight microbatches
    assert est.stages[0].components["activations"] > est.stages[-1].components["activations"]
    for s in est.stages:
        assert s.reserved_gib >= s.peak_allocated_gib and s.device_gib >= s.reserved_gib
        assert s.chunks and s.chunks[0].in_flight_at_peak >= 1
    assert est.assumptions and est.headroom_policy


def test_expandable_segments_reduce_reserved_not_allocated():
    m = get_model("Qwen3-30B-A3B")
    a = mem.estimate_memory(job(m, gpus=16, layout=Layout(ep=16)))
    b = mem.estimate_memory(job(m, gpus=16, layout=Layout(ep=16),
                                features=Features(expandable_segments=True, hidden_dropout=0, attention_dropout=0)))
    assert a.peak_allocated_gib == pytest.approx(b.peak_allocated_gib)
    assert b.stages[0].reserved_gib < a.stages[0].reserved_gib


def test_runtime_tail_items():
    m = get_model("Qwen3-30B-A3B")
    f = Features(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep")
    c = mem.estimate_memory(job(m, gpus=16, layout=Layout(ep=16), features=f)).stages[0].components
    assert c["deepep_buffers"] > 0 and c["nccl_buffers"] > 0 and c["cuda_context"] > 0
    assert c["fragmentation"] > 0 and c["library_workspaces"] > 0


def test_routing_imbalance_and_capacity():
    m = get_model("Qwen3-30B-A3B")
    base = job(m, gpus=16, layout=Layout(ep=16))
    hot = base.with_(features=base.features.model_copy(update={"moe_routing_imbalance": 2.0}))
    capped = base.with_(features=base.features.model_copy(update={"moe_routing_imbalance": 2.0,
                                                                  "moe_expert_capacity_factor": 1.25}))
    forced = base.with_(features=hot.features.model_copy(update={"moe_router_force_load_balancing": True}))
    a, h, c, fb = (mem.estimate_memory(j).peak_allocated_gib for j in (base, hot, capped, forced))
    assert a < c < h and fb == pytest.approx(a)


def test_full_recompute_below_selective_below_none():
    m = get_model("Qwen3-30B-A3B")
    lay = Layout(pp=2, ep=8)

    def act(**kw):
        f = Features(hidden_dropout=0, attention_dropout=0, **kw)
        return mem.estimate_memory(job(m, gpus=16, layout=lay, features=f, gbs=128)).stages[0].components[
            "activations"]

    none = act()
    sel = act(recompute_granularity="selective", recompute_modules=("moe_act", "layernorm"))
    full = act(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    block = act(recompute_granularity="full", recompute_method="block", recompute_num_layers=4)
    assert full < block < none and full < sel < none


def test_cuda_graph_capture_phase():
    m = get_model("Qwen3-30B-A3B")
    f = Features(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",), hidden_dropout=0,
                 attention_dropout=0)
    c = mem.estimate_memory(job(m, gpus=16, layout=Layout(ep=16), features=f)).stages[0].components
    assert c["cuda_graph_activations"] > 0 and c["cuda_graph_static_io"] > 0


@pytest.mark.parametrize("pp,vpp", [(1, 1), (2, 1), (2, 2), (4, 3)])
def test_cuda_graph_static_io_is_held_per_inflight_chunk(pp, vpp):
    """TE >= 2.7 make_graphed_callables with ``_reuse_graph_input_output_buffers`` (set by Megatron-Core's
    TECudaGraphHelper) keeps the static inputs/outputs of each in-flight (chunk, microbatch): the captured layers of
    that chunk, not of the whole rank, times its in-flight count (the old model multiplied the rank's layers by the
    in-flight total over all chunks, and doubled it for gradient buffers that TE shares by shape)."""
    m = get_model("Qwen3-30B-A3B")  # 48 identical attention + MoE layers
    f = Features(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",), hidden_dropout=0,
                 attention_dropout=0)
    lay = Layout(pp=pp, vpp=vpp if vpp > 1 else None, ep=8)
    est = mem.estimate_memory(job(m, gpus=8 * pp, layout=lay, features=f, gbs=64 * pp))
    hid = 2 * m.hidden_size * 4096  # BF16 hidden states of one microbatch (TP1 CP1, MBS 1)
    for st_ in est.stages:
        want = sum(ch.in_flight_at_peak * len(ch.layers) * 2 * hid for ch in st_.chunks) / 2**30
        assert st_.components["cuda_graph_static_io"] == pytest.approx(want, rel=1e-9)
        assert want > 0


@pytest.mark.parametrize("precision,system", [("mxfp8", "DGX-GB200"), ("fp8_cs", "DGX-H100")])
def test_fp8_parameters_keep_row_and_column_wise_copies(precision, system):
    """With FP8 parameters (fp8_param_gather) TE keeps each linear weight's row-wise and column-wise quantized data
    (reset_parameters: usage rowwise=True, columnwise=grad enabled), and embedding / output layer / norms stay BF16:
    no BF16 linear weights but the same bytes as the FP8 weight cache, so the weights of a rank take what BF16 weights
    take (2 B per parameter), and no separate cache. The old model charged 1 B to every parameter."""
    m = get_model("DeepSeek-V3")
    lay = Layout(ep=64)  # PP1: every layer, MTP, embedding and the untied output layer on the rank

    def comps(gather):
        f = Features(precision=precision, fp8_param_gather=gather, hidden_dropout=0, attention_dropout=0)
        est = mem.estimate_memory(job(m, gpus=256, layout=lay, features=f, gbs=4096, system=system))
        return est.stages[0].components

    with_fp8_params, without = comps(True), comps(False)
    assert without["fp8_weight_cache"] > 0 and "fp8_weight_cache" not in with_fp8_params
    # BF16 weights (2 B) without FP8 parameters; row + column-wise FP8 linears (1 + 1 B) and BF16 others with them
    assert with_fp8_params["weights"] == pytest.approx(without["weights"], rel=1e-9)


def test_published_te_graph_runs_fit():
    """NVIDIA measured DeepSeek-V3 on 256 GB200 (MXFP8, TP1 PP4 VP4 EP64, HybridEP, TE graphs
    attn/moe_router/moe_preprocess) in releases 26.02 and 26.04: the model must not put those runs over capacity
    (with the static graph I/O counted for every layer of the rank per in-flight microbatch it was 203.6 and 233.9
    GiB of 184.3)."""
    from moetune.io.load import build_published_job

    for release in ("26.02", "26.04"):
        j = build_published_job(model=get_model("DeepSeek-V3"), system="DGX-GB200", gpus=256, precision="mxfp8",
                                gbs=4096, mbs=1, seq=4096, tp=1, pp=4, cp=1, vp=4, ep=64, release=release)
        assert j.features.cuda_graph_impl == "transformer_engine" and "attn" in j.features.cuda_graph_scope
        est = mem.estimate_memory(j)
        assert est.fits, (release, est.stages[est.binding_stage].device_gib)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["Qwen3-30B-A3B", "DeepSeek-V3", "Mixtral-8x7B", "GPT-OSS-20B"]), st.sampled_from([1, 2, 4]))
def test_more_pp_never_raises_per_rank_params(name, pp):
    m = get_model(name)
    if m.num_layers % (2 * pp):
        return
    f = Features(use_distributed_optimizer=False)

    def worst_weights(p):
        est = mem.estimate_memory(job(m, gpus=64 * p, layout=Layout(pp=p, ep=8), features=f, gbs=1024))
        return max(s.components["weights"] for s in est.stages)

    assert worst_weights(2 * pp) <= worst_weights(pp) + 1e-9


def test_explain_workflow_order():
    from moetune.plan.explain import explain_memory

    m = get_model("Qwen3-30B-A3B")
    j = job(m, gpus=16, layout=Layout(ep=16))
    sug = explain_memory(j)
    order = [s.action for s in sug]
    assert order[0] == "expandable_segments"
    assert all(s.frees_gib > 0 for s in sug)
    # offloading comes last, layout before offloading, recompute before layout
    rank = {"expandable_segments": 0, "recompute": 1, "layout": 2, "offload": 3}
    assert [rank[a] for a in order] == sorted(rank[a] for a in order)


def test_bridge_baseline_by_hand():
    """bridge_perf_notes.md §4 on a tiny dense model at PP=1, TP=1, DDP: 18 B/param + Korthikanti 34-ish terms."""
    from moetune.perfmodel.bridge_baseline import bridge_theoretical_memory

    h, L, f, V = 64, 2, 256, 1024
    m = ModelArch(name="t", num_layers=L, hidden_size=h, ffn_hidden_size=f, num_attention_heads=4, vocab_size=V,
                  gated_linear_unit=False, activation="gelu", mixer_pattern="AA", mlp_pattern="DD")
    j = job(m, gpus=1, gbs=1, mbs=1, seq=128, features=Features(use_distributed_optimizer=False))
    est = bridge_theoretical_memory(j)
    p = L * (2 * h * h * 2 + 4 * h + 2 * h * f) + 2 * h + 2 * h * V  # attention, LN, MLP; final LN; untied emb
    assert est.weight_and_optimizer_gib * GIB == pytest.approx(18 * p)
    s = 128
    a = s * h * (18 + 4 * f / h) * L + 8 * s + s * h + 4 * s * h * (1 + V / h)
    assert est.activation_gib * GIB == pytest.approx(a)


def test_communicators_follow_the_layout():
    from moetune.perfmodel.runtime_tail import communicators

    j = job(get_model("Qwen3-30B-A3B"), gpus=64, layout=Layout(tp=2, pp=2, cp=2, ep=8, etp=1), gbs=64)
    c = communicators(j)
    assert c["tp"] == 2 and c["pp"] == 2 and c["cp"] == 2 and c["ep"] == 8
    assert c["dp_cp"] == 64 // (2 * 2 * 2) * 2 and c["edp"] == 64 // (8 * 2) and c["dp"] == 8
    assert "etp" not in c  # size-1 groups create no communicator
    single = communicators(job(_gpt7b(), gpus=1, gbs=1))
    assert single == {}


def test_uneven_pipeline_layout_moves_params_and_activations():
    m = get_model("Qwen3-30B-A3B")  # 48 layers
    even = mem.estimate_memory(job(m, gpus=32, layout=Layout(pp=4, ep=8), gbs=256))
    lay = Layout(pp=4, ep=8, num_layers_in_first_pipeline_stage=6, num_layers_in_last_pipeline_stage=6)
    uneven = mem.estimate_memory(job(m, gpus=32, layout=lay, gbs=256))
    assert [len(c.layers) for c in uneven.stages[0].chunks] == [6]
    assert uneven.stages[0].components["weights"] < even.stages[0].components["weights"]
    assert uneven.stages[1].components["weights"] > even.stages[1].components["weights"]
    assert uneven.stages[0].components["activations"] < even.stages[0].components["activations"]


def test_layer_cpu_offloading_and_fine_grained_offload_reduce_activations():
    m = get_model("Qwen3-30B-A3B")
    base = Features(hidden_dropout=0, attention_dropout=0)
    a = mem.estimate_memory(job(m, gpus=16, layout=Layout(ep=16), features=base)).stages[0]
    b = mem.estimate_memory(job(m, gpus=16, layout=Layout(ep=16), features=base.model_copy(
        update={"cpu_offloading": True, "cpu_offloading_num_layers": 24}))).stages[0]
    c = mem.estimate_memory(job(m, gpus=16, layout=Layout(ep=16), features=base.model_copy(
        update={"fine_grained_activation_offloading": True, "offload_modules": ("expert_fc1", "moe_act")}))).stages[0]
    assert b.components["activations"] < 0.6 * a.components["activations"]
    assert c.components["activations"] < a.components["activations"]
    assert c.components["working_set"] > a.components["working_set"]  # resident offload buffers
    assert c.peak_allocated_gib < a.peak_allocated_gib


def test_time_only_features_do_not_change_memory():
    """The planner shares one memory estimate across variants that differ only in TIME_ONLY_FEATURES."""
    from moetune.catalog.models import get_model
    from moetune.catalog.systems import get_system
    from moetune.perfmodel.memory import TIME_ONLY_FEATURES, estimate_memory
    from moetune.spec import Features, Job, Layout

    base = Job(model=get_model("Qwen3-30B-A3B"), system=get_system("DGX-H100"), gpus=16, global_batch_size=256,
               seq_length=4096, layout=Layout(pp=2, vpp=2, ep=8),
               features=Features(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep"))
    ref = estimate_memory(base)
    for field in TIME_ONLY_FEATURES:
        other = base.with_(features=base.features.model_copy(update={field: True}))
        got = estimate_memory(other)
        assert [s.reserved_gib for s in got.stages] == [s.reserved_gib for s in ref.stages], field
        assert got.peak_allocated_gib == ref.peak_allocated_gib


@pytest.mark.parametrize("model,gpus,lay,upd", [
    ("DeepSeek-V3", 256, Layout(tp=1, pp=1, ep=64), {"cpu_offloading": True, "cpu_offloading_num_layers": 23}),
    ("Qwen3-30B-A3B", 256, Layout(tp=2, pp=4, vpp=2, ep=32),
     {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep", "cuda_graph_impl": "local",
      "cuda_graph_scope": ("full_iteration",), "moe_expert_rank_capacity_factor": 1.5, "moe_paged_stash": True}),
    ("Llama-3-70B", 64, Layout(tp=2, pp=1), {"use_megatron_fsdp": True, "data_parallel_sharding_strategy":
                                             "optim_grads_params", "use_distributed_optimizer": True,
                                             "cpu_offloading": True, "cpu_offloading_num_layers": 40}),
])
def test_model_state_does_not_read_the_tail_features(model, gpus, lay, upd):
    """The model state and schedule (``_rank_state_of``) of a job's static features equal those of its
    ``state_features`` (:data:`moetune.perfmodel.memory.TAIL_FEATURES` at their defaults), so the memo may share them."""
    f = Features().model_copy(update={"sequence_parallel": lay.tp > 1, **upd})
    sf = mem.static_features(f)
    assert mem.state_features(f) != sf
    args = (get_model(model), lay, get_system("DGX-H100"), gpus, 1024, 1, 4096)
    got = mem._rank_state_of.__wrapped__(*args, mem.state_features(f))
    want = mem._rank_state_of.__wrapped__(*args, sf)
    assert got[:2] == want[:2]
    for a, b in zip(got[2], want[2], strict=True):
        assert a[0] == b[0] and a[1] == b[1] and a[2] == b[2] and a[4] == b[4]
        assert a[3].tolist() == b[3].tolist()

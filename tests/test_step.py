"""Step-time model invariants: walls add up, bandwidth and batch monotonicity, feature directions."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.commands.estimate import render_time
from moetune.perfmodel.calibration import default_efficiency, precision_variants
from moetune.perfmodel.step import WALL_ORDER, estimate_time
from moetune.spec.features import Features, parse_precision
from moetune.spec.job import Job
from moetune.spec.layout import Layout


def qwen_job(**feat) -> Job:
    f = dict(precision="bf16", moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
             cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe_router", "moe_preprocess"),
             moe_router_force_load_balancing=True, sequence_parallel=False)
    f.update(feat)
    return Job(model=get_model("Qwen3-30B-A3B"), system=get_system("DGX-H100"), gpus=16, global_batch_size=1024,
               micro_batch_size=1, seq_length=4096, layout=Layout(tp=1, pp=1, ep=16), features=Features(**f))


def llama_job(tp=4, **feat) -> Job:
    f = dict(precision="fp8_cs", tp_comm_overlap=True)
    f.update(feat)
    return Job(model=get_model("Llama-3-70B"), system=get_system("DGX-H100"), gpus=32, global_batch_size=32,
               micro_batch_size=1, seq_length=4096, layout=Layout(tp=tp, pp=4, vpp=5), features=Features(**f))


def dsv3_job(system="GB200-NVL72", gpus=256, gbs=4096) -> Job:
    return Job(model=get_model("DeepSeek-V3"), system=get_system(system), gpus=gpus, global_batch_size=gbs,
               micro_batch_size=1, seq_length=4096, layout=Layout(tp=1, pp=4, vpp=4, ep=64),
               features=Features(precision="mxfp8", moe_token_dispatcher_type="flex",
                                 moe_flex_dispatcher_backend="hybridep", moe_router_force_load_balancing=True))


JOBS = [qwen_job, llama_job, dsv3_job]


@pytest.mark.parametrize("make", JOBS)
def test_walls_add_up_to_the_step(make):
    est = estimate_time(make())
    assert set(est.walls) == set(WALL_ORDER)
    assert sum(w.seconds for w in est.walls.values()) == pytest.approx(est.step_time_s, rel=1e-9)
    assert sum(w.share for w in est.walls.values()) == pytest.approx(1.0, rel=1e-9)
    assert all(w.seconds >= 0 for w in est.walls.values())
    assert est.dominant_wall == max(est.walls, key=lambda k: est.walls[k].seconds)
    job = make()
    assert est.tokens_per_s_per_gpu == pytest.approx(job.global_batch_size * job.seq_length /
                                                     (est.step_time_s * job.gpus))
    assert est.model_tflops_per_gpu == pytest.approx(est.tokens_per_s_per_gpu * est.flops_per_token / 1e12)
    assert est.mfu["vs_bf16_peak"] == pytest.approx(est.model_tflops_per_gpu / job.system.gpu.peak_tflops["bf16"])
    assert est.mfu["vs_precision_peak"] <= est.mfu["vs_bf16_peak"]
    assert est.precision == job.features.precision


@settings(max_examples=15, deadline=None)
@given(i=st.integers(0, len(JOBS) - 1), field=st.sampled_from(["nvlink_bw_gbs", "scaleout_bw_gbs", "hbm"]),
       factor=st.floats(1.0, 8.0))
def test_more_bandwidth_never_slows_a_job(i, field, factor):
    job = JOBS[i]()
    sysm = job.system
    if field == "hbm":
        faster = sysm.model_copy(update={"gpu": sysm.gpu.model_copy(update={"hbm_bw_gbs": sysm.gpu.hbm_bw_gbs * factor})})
    else:
        faster = sysm.model_copy(update={field: getattr(sysm, field) * factor})
    assert estimate_time(job.with_(system=faster)).step_time_s <= estimate_time(job).step_time_s * (1 + 1e-9)


@settings(max_examples=12, deadline=None)
@given(i=st.integers(0, len(JOBS) - 1), mult=st.integers(1, 16))
def test_larger_gbs_never_lowers_tokens_per_gpu(i, mult):
    job = JOBS[i]()
    big = job.with_(global_batch_size=job.global_batch_size * (mult + 1))
    small = job.with_(global_batch_size=job.global_batch_size * mult)
    assert estimate_time(big).tokens_per_s_per_gpu >= estimate_time(small).tokens_per_s_per_gpu * (1 - 1e-9)


@pytest.mark.parametrize("label,canon", [("BF16", ["bf16"]), ("FP8", ["fp8_cs"]), ("FP8-CS", ["fp8_cs"]),
                                         ("FP8-MX", ["mxfp8"]), ("MXFP8", ["mxfp8"]), ("NVFP4", ["nvfp4"]),
                                         ("FP8-CS (FP8-MX)", ["fp8_cs", "mxfp8"])])
def test_published_precision_labels_are_accepted(label, canon):
    assert [parse_precision(v) for v in precision_variants(label)] == canon
    for c in canon:
        est = estimate_time(dsv3_job().with_(features=dsv3_job().features.model_copy(update={"precision": c})))
        assert est.step_time_s > 0


def test_fp8_is_faster_than_bf16_and_quantises_only_linear_layers():
    bf = estimate_time(llama_job(precision="bf16"))
    f8 = estimate_time(llama_job(precision="fp8_cs"))
    assert f8.step_time_s < bf.step_time_s
    assert f8.compute_detail["attention"] == pytest.approx(bf.compute_detail["attention"])


def test_feature_directions():
    base = estimate_time(qwen_job())
    ovl = estimate_time(qwen_job(overlap_moe_expert_parallel_comm=True))
    assert ovl.walls["comm_ep"].seconds < base.walls["comm_ep"].seconds
    assert ovl.step_time_s < base.step_time_s
    rec = estimate_time(llama_job(recompute_granularity="selective", recompute_modules=("mlp",)))
    plain = estimate_time(llama_job())
    assert rec.walls["recompute"].seconds > 0 == plain.walls["recompute"].seconds
    full = estimate_time(llama_job(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1))
    assert full.walls["recompute"].seconds > rec.walls["recompute"].seconds
    no_ovl = estimate_time(llama_job(tp_comm_overlap=False))
    assert no_ovl.walls["comm_tp"].seconds > plain.walls["comm_tp"].seconds
    eager = estimate_time(qwen_job(cuda_graph_impl="none", cuda_graph_scope=()))
    assert eager.walls["host"].seconds >= base.walls["host"].seconds


def test_pipeline_bubble_shrinks_with_vpp():
    a = estimate_time(llama_job().with_(layout=Layout(tp=4, pp=4, vpp=None)))
    b = estimate_time(llama_job())
    assert b.walls["pipeline_bubble"].seconds < a.walls["pipeline_bubble"].seconds


def test_render_names_the_dominant_wall():
    est = estimate_time(qwen_job())
    buf = io.StringIO()
    render_time(est, Console(file=buf, width=120))
    assert "Dominant wall" in buf.getvalue()


def test_efficiency_file_and_env(tmp_path, monkeypatch):
    from moetune.perfmodel.calibration import save_efficiency

    eff = default_efficiency().with_values({"hbm_eff": 0.2})
    p = tmp_path / "eff.yaml"
    save_efficiency(eff, p)
    slow = estimate_time(qwen_job(), p)
    assert slow.step_time_s > estimate_time(qwen_job()).step_time_s
    # the library reads no environment: $MOETUNE_EFFICIENCY is the commands' (tests/test_estimate_cli.py)
    monkeypatch.setenv("MOETUNE_EFFICIENCY", str(p))
    assert estimate_time(qwen_job()).step_time_s < slow.step_time_s


def test_routing_imbalance_and_unfused_attention_slow_the_step():
    balanced = estimate_time(qwen_job())
    hot = estimate_time(qwen_job(moe_router_force_load_balancing=False, moe_routing_imbalance=1.3))
    assert hot.step_time_s > balanced.step_time_s
    assert any("1.3x" in a for a in hot.assumptions)
    padded = estimate_time(qwen_job(moe_expert_capacity_factor=1.5, moe_pad_expert_input_to_capacity=True))
    assert padded.step_time_s > balanced.step_time_s
    assert estimate_time(llama_job(attention_backend="unfused")).step_time_s > estimate_time(llama_job()).step_time_s


def test_dispatcher_and_topology_directions():
    a2a = estimate_time(qwen_job(moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend=None))
    deepep = estimate_time(qwen_job(moe_flex_dispatcher_backend="deepep"))
    # 16 GPUs = 2 NVLink domains: DeepEP/HybridEP send a token once per remote node instead of once per expert
    assert deepep.walls["comm_ep"].seconds < a2a.walls["comm_ep"].seconds
    eight = estimate_time(qwen_job().with_(gpus=8, global_batch_size=512, layout=Layout(tp=1, pp=1, ep=8)))
    assert eight.walls["comm_ep"].share < estimate_time(qwen_job()).walls["comm_ep"].share  # EP inside the domain


def test_hidden_dp_comm_still_costs_the_sms_it_runs_on():
    """Megatron-FSDP moves every parameter and gradient each microbatch; even fully overlapped, the NCCL kernels
    take ``dp_overlap_sms`` SMs from the compute (Bridge keeps 16 free for the DP collectives)."""
    import dataclasses

    job = Job(model=get_model("Llama-3-8B"), system=get_system("DGX-H100"), gpus=8, global_batch_size=64,
              micro_batch_size=1, seq_length=4096, layout=Layout(tp=1, pp=1),
              features=Features(precision="bf16", use_megatron_fsdp=True,
                                data_parallel_sharding_strategy="optim_grads_params"))
    eff = default_efficiency()
    no_sms = dataclasses.replace(eff, constants={**eff.constants, "dp_overlap_sms": 0},
                                 values=dict(eff.values))
    with_sms = estimate_time(job, eff).walls["comm_dp"].seconds
    without = estimate_time(job, no_sms).walls["comm_dp"].seconds
    assert with_sms > without >= 0.0
    # the same FSDP traffic with the distributed optimizer instead is once per step: far less contention
    dist = job.model_copy(update={"features": Features(precision="bf16")})
    assert estimate_time(dist, eff).walls["comm_dp"].seconds < with_sms


_GOLDEN = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "megatron_golden"


def _golden_iteration_time(case: str) -> float:
    import json
    import statistics

    vals = json.loads((_GOLDEN / f"case_{case}_golden.json").read_text())["iteration-time"]["values"]
    return statistics.median(float(v) for k, v in vals.items() if v not in ("nan", None) and int(k) > 5)


@pytest.mark.parametrize("case, wall, tol", [
    ("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed", "compute", 0.2),  # README example 5, unfused attention
    ("gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_optimizer", "host", 0.3),  # hidden 512, one microbatch
    ("gpt3_mcore_te_tp2_pp1_te_8experts2parallel_ddp_average_in_collective", "host", 0.3),
])
def test_functional_test_goldens_iteration_time(case, wall, tol):
    """Megatron-LM functional-test goldens (8 H100): small host-bound jobs and the README example land near the
    measured median iteration time, with the right dominant wall."""
    from moetune.io.config_to_job import job_from_config
    from moetune.io.megatron_args import read_megatron_args

    job = job_from_config(read_megatron_args(_GOLDEN / f"case_{case}_config.yaml"), system="DGX-H100", gpus=8)
    est = estimate_time(job)
    measured = _golden_iteration_time(case)
    assert est.dominant_wall == wall
    assert abs(est.step_time_s / measured - 1) < tol, (est.step_time_s, measured)


def test_every_precision_label_offered_parses():
    """The labels the precision error offers are all accepted (FP8-DS was offered but refused)."""
    from moetune.spec.features import BRIDGE_MIXED_PRECISION, PRECISION_LABELS, parse_precision

    for label in PRECISION_LABELS:
        assert parse_precision(label) in BRIDGE_MIXED_PRECISION
    assert parse_precision("FP8-DS") == "fp8_delayed"
    for name in BRIDGE_MIXED_PRECISION.values():
        assert BRIDGE_MIXED_PRECISION[parse_precision(name)] == name


def test_fp8_attention_speeds_attention_only_inside_an_fp8_recipe():
    """``fp8_dot_product_attention`` divides the attention seconds by ``attn_fp8_gain`` under an FP8 recipe; BF16
    runs keep BF16 attention (Transformer Engine applies fp8_dpa only under an FP8 autocast)."""
    gain = default_efficiency()["attn_fp8_gain"]
    for prec, expect in (("fp8_cs", 1.0 / gain), ("mxfp8", 1.0 / gain), ("bf16", 1.0)):
        off = estimate_time(qwen_job(precision=prec)).compute_detail["attention"]
        on = estimate_time(qwen_job(precision=prec, fp8_dot_product_attention=True)).compute_detail["attention"]
        assert on == pytest.approx(off * expect, rel=1e-9)


def test_fp8_attention_is_read_from_a_bridge_config_and_written_back():
    from moetune.io.config_to_job import job_from_config, job_to_config

    job = qwen_job(precision="mxfp8", fp8_dot_product_attention=True)
    cfg = job_to_config(job)
    assert cfg["mixed_precision"]["fp8_dot_product_attention"] is True
    assert job_from_config(cfg, system="DGX-H100", gpus=16).features.fp8_dot_product_attention


def test_unfused_rope_prices_its_elementwise_passes_and_kernels():
    """``apply_rope_fusion`` off: the memory-bound wall grows by exactly the extra passes of
    ``compute.unfused_rope_bytes`` over the fused kernel's read + write, on every attention layer, at ``hbm_eff``;
    the host wall grows by the ``unfused_rope`` kernels (Megatron-Core ``_apply_rotary_pos_emb_bshd``)."""
    from moetune.perfmodel import compute as K

    model, system = get_model("Llama-3-8B"), get_system("DGX-H100")

    def job(**f):
        return Job(model=model, system=system, gpus=8, global_batch_size=16, micro_batch_size=1, seq_length=2048,
                   layout=Layout(tp=1, pp=1), features=Features(precision="bf16", **f))

    eff = default_efficiency()
    fused, unfused = estimate_time(job(), eff), estimate_time(job(apply_rope_fusion=False), eff)
    m = 16 // 8
    qk = (model.num_attention_heads + model.query_groups) * model.head_dim
    extra = 2048 * (K.unfused_rope_bytes(qk) - K.rope_bytes(qk))  # forward-equivalent bytes per layer
    want = m * model.num_layers * 3 * extra / (system.gpu.hbm_bw_gbs * 1e9 * eff["hbm_eff"])
    got = unfused.compute_detail["memory_bound"] - fused.compute_detail["memory_bound"]
    assert got == pytest.approx(want, rel=1e-6)
    assert K.unfused_rope_bytes(qk) == pytest.approx(sum(K.UNFUSED_ROPE_PASSES) / 3 * qk * 2)
    assert unfused.walls["host"].seconds >= fused.walls["host"].seconds
    assert unfused.step_time_s > fused.step_time_s


def test_no_rope_fusion_flag_reaches_the_features_only_where_rope_runs():
    """Megatron-LM ``--no-rope-fusion`` (dest apply_rope_fusion) unfuses RoPE; without
    ``--position-embedding-type rope`` MLM's learned absolute embedding rotates nothing, so nothing is unfused."""
    from moetune.io.config_to_job import job_from_config, job_to_config
    from moetune.io.megatron_args import read_megatron_args

    base = ("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
            "--micro-batch-size 2 --global-batch-size 16 --bf16 --vocab-size 32000 --tokenizer-type NullTokenizer")

    def feats(extra: str) -> Features:
        return job_from_config(read_megatron_args(f"{base} {extra}"), system="DGX-H100", gpus=8).features

    assert feats("--position-embedding-type rope").apply_rope_fusion is True
    unfused = feats("--position-embedding-type rope --no-rope-fusion")
    assert unfused.apply_rope_fusion is False
    assert feats("--no-rope-fusion").apply_rope_fusion is True  # learned_absolute: no RoPE to fuse
    assert Features().apply_rope_fusion is True
    assert job_to_config(qwen_job(apply_rope_fusion=False))["model"]["apply_rope_fusion"] is False
    assert "apply_rope_fusion" not in job_to_config(qwen_job())["model"]


@pytest.mark.parametrize("dispatcher", [("alltoall", None), ("flex", "deepep"), ("flex", "hybridep")])
def test_non_layer_price_reads_only_the_compute_rates(dispatcher):
    """The embedding / output-layer work is priced from the compute rates alone (step.ComputeRates): jobs whose Rates
    differ only in the EP mesh and dispatcher (the all-to-all rates) get the value of pricing with their own full
    Rates (step._price), so one memoised price serves them all."""
    from moetune.perfmodel import step as T

    model, system = get_model("DeepSeek-V3"), get_system("DGX-H100")
    feats = Features(moe_token_dispatcher_type=dispatcher[0], moe_flex_dispatcher_backend=dispatcher[1])
    extra = T._extra_work(model, 4096, 1, 1, 2, True, True)
    rates = []
    for ep in (8, 64):
        job = Job(model=model, system=system, gpus=256, global_batch_size=1024, micro_batch_size=1, seq_length=4096,
                  layout=Layout(tp=2, pp=4, ep=ep), features=feats)
        r = T.job_layer_prices(job, default_efficiency())[1]
        rates.append(r)
        assert T._price_extra(extra, r) == T._price(extra.work, r, {}, 0.0)[:3]
    assert rates[0] != rates[1] and T.compute_rates(rates[0]) == T.compute_rates(rates[1])


def test_ep_overlap_host_hides_behind_the_exposed_dispatch_combine():
    """Under EP overlap the compute stream waits on the communication stream only for the exposed dispatch/combine
    (a device-side event wait), so the host keeps enqueueing behind it as behind any device time: the layer's host gap
    shrinks as more of its dispatch/combine stays exposed (:func:`moetune.perfmodel.step.layer_host_gap`), and with all
    of it exposed it is the gap without overlap, less the dropless host sync the combined schedule hides."""
    from moetune.perfmodel.step import LayerPrice, layer_host_gap

    p = LayerPrice(comp=1.0, gemm=0.6, attn=0.2, mem=0.2, rec=0.0, tp=0.0, cp=0.0, a2a=0.5, exp=0.3, host=1.2,
                   sync=0.01)
    gaps = [layer_host_gap(p, True, 4.0, f) for f in (0.0, 0.5, 1.0)]
    assert gaps[0] > gaps[1] > gaps[2] > 0
    assert gaps[2] == pytest.approx(layer_host_gap(p, False, 4.0) - p.sync)


def test_ep_overlap_ab_on_qwen3_16xh100_hybridep():
    """docs/domain.md §4.4 (S:epo): Qwen3-30B-A3B 16xH100 BF16 EP16 HybridEP, router + preprocess graphs, plain EP
    overlap 24.71 -> 20.99 s (+17.7 % TFLOP/s). The two nodes' dispatch/combine is priced as the Hybrid-EP kernels'
    EP16 rate and the host hides behind the exposed part of it: the predicted gain is within half of the measured
    one, and the step without overlap within 10 %."""
    off = estimate_time(qwen_job(moe_flex_dispatcher_num_sms=32))
    on = estimate_time(qwen_job(moe_flex_dispatcher_num_sms=32, overlap_moe_expert_parallel_comm=True))
    gain = off.step_time_s / on.step_time_s - 1
    assert 0.5 * 0.177 <= gain <= 1.5 * 0.177
    assert off.step_time_s == pytest.approx(24.71, rel=0.10)


def test_ep_overlap_prices_the_schedule_nodes_host_work_on_every_layer():
    """``overlap_moe_expert_parallel_comm`` with EP > 1: every layer's launches gain the combined 1F1B schedule's
    engine and bookkeeping calls (:func:`moetune.perfmodel.host.ep_overlap_node_ops`); EP 1 runs no such schedule."""
    from moetune.perfmodel import host as H
    from moetune.perfmodel.step import build_profile

    def launches(job):
        return {k: lt.launches for k, lt in build_profile(job).types.items()}

    off = launches(qwen_job(overlap_moe_expert_parallel_comm=False))
    on = launches(qwen_job(overlap_moe_expert_parallel_comm=True))
    engine, calls = H.ep_overlap_node_ops(True, freed_inputs=1)  # HybridEP: only the combine's input is freed
    for key, lt in on.items():
        assert lt.eager_kernels - off[key].eager_kernels == engine
        assert lt.native_kernels - off[key].native_kernels == calls
    one = qwen_job(overlap_moe_expert_parallel_comm=True).with_(layout=Layout(tp=1, pp=1, ep=1))
    assert launches(one) == launches(qwen_job(overlap_moe_expert_parallel_comm=False).with_(
        layout=Layout(tp=1, pp=1, ep=1)))


def _moe_layer_types(job):
    from moetune.perfmodel.step import build_profile

    return {k: lt for k, lt in build_profile(job).types.items() if k[1] == "E"}


def test_shared_expert_tp_collectives_are_priced_at_etp1_unless_overlapped():
    """Nemotron-3-Nano (shared expert 3712) at TP 2, ETP 1: each MoE layer pays the shared expert's SP all-gather and
    reduce-scatter of the full [s, b, h] tensor over the attention TP group (shared_experts.py), which
    ``moe_shared_expert_overlap`` moves beside the dispatch; at TP 1 there is none."""
    def job(tp, **feat):
        f = dict(precision="bf16", moe_token_dispatcher_type="alltoall", moe_router_force_load_balancing=True)
        f.update(feat)
        return Job(model=get_model("Nemotron-3-Nano"), system=get_system("DGX-H100"), gpus=16,
                   global_batch_size=256, micro_batch_size=1, seq_length=8192, layout=Layout(tp=tp, pp=1, ep=8),
                   features=Features(**f))

    h = get_model("Nemotron-3-Nano").hidden_size
    plain, hidden = _moe_layer_types(job(2)), _moe_layer_types(job(2, moe_shared_expert_overlap=True))
    assert plain and plain.keys() == hidden.keys()
    for key, lt in plain.items():
        assert hidden[key].tp_bytes == 0.0  # MoE-only layers of the hybrid pattern: no attention collectives
        assert lt.tp_bytes == pytest.approx(2 * 8192 * h * 2)  # AG + RS of [s, b, h] BF16
    assert all(lt.tp_bytes == 0.0 for lt in _moe_layer_types(job(1)).values())
    slow, fast = estimate_time(job(2)), estimate_time(job(2, moe_shared_expert_overlap=True))
    assert slow.walls["comm_tp"].seconds > fast.walls["comm_tp"].seconds


def test_mamba_context_parallel_all_to_alls_are_priced():
    """Nemotron-3-Nano's Mamba layers under CP 2 pay the sequence/head all-to-alls of mamba_context_parallel.py
    (comm.mamba_cp_bytes_per_layer, fully exposed); CP 1 and the attention / MoE layers pay none of them."""
    from moetune.perfmodel import comm as C
    from moetune.perfmodel.step import build_profile

    def job(cp):
        return Job(model=get_model("Nemotron-3-Nano"), system=get_system("DGX-H100"), gpus=16,
                   global_batch_size=256, micro_batch_size=1, seq_length=8192, layout=Layout(tp=1, cp=cp, pp=1, ep=8),
                   features=Features(precision="bf16", moe_token_dispatcher_type="alltoall",
                                     moe_router_force_load_balancing=True, sequence_parallel=False))

    m = get_model("Nemotron-3-Nano")
    types = build_profile(job(2)).types
    for key, lt in types.items():
        if key[0] == "M":
            assert lt.cp_a2a_bytes == pytest.approx(C.mamba_cp_bytes_per_layer(
                8192 / 2, m.mamba_num_heads * m.mamba_head_dim, m.mamba_num_heads, m.mamba_num_groups,
                m.mamba_state_dim, 1, 2))
            assert lt.cp_a2a_bytes > 0
        else:
            assert lt.cp_a2a_bytes == 0.0
    assert all(lt.cp_a2a_bytes == 0.0 for lt in build_profile(job(1)).types.values())
    assert estimate_time(job(2)).walls["comm_cp"].seconds > 0

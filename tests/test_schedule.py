"""Pipeline schedule and overlap rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moetune.perfmodel import host as H
from moetune.perfmodel import schedule as S


def test_pipeline_bubble_is_p_minus_1_over_v():
    steady, bubble = S.pipeline_step([1.0, 2.0, 1.5, 1.0], m=16, pp=4, vpp=2)
    assert steady == 32.0 and bubble == pytest.approx(3 / 2 * 2.0)
    assert S.pipeline_step([1.0], m=8, pp=1, vpp=1) == (8.0, 0.0)


@given(a2a=st.floats(0, 10), partner=st.floats(0, 10), m=st.integers(1, 256), eff=st.floats(0.1, 1.0))
def test_ep_overlap_never_exposes_more_than_the_a2a(a2a, partner, m, eff):
    off = S.ep_exposed(a2a, partner, m, overlap=False, eff=eff)
    on = S.ep_exposed(a2a, partner, m, overlap=True, eff=eff)
    assert off == a2a
    assert 0.0 <= on <= off + 1e-12


def test_tp_and_dp_overlap():
    assert S.tp_exposed(1.0, 10.0, overlap=False, splits=4) == 1.0
    assert S.tp_exposed(1.0, 10.0, overlap=True, splits=4) == 0.25
    assert S.tp_exposed(1.0, 0.0, overlap=True, splits=4) == 1.0
    assert S.dp_exposed(1.0, 5.0, 4, overlap=True) == 0.25
    assert S.dp_exposed(1.0, 0.2, 4, overlap=True) == pytest.approx(0.8)
    assert S.cp_exposed(1.0, 0.0, cp_comm_type="a2a") == 1.0


def test_sm_contention_is_the_work_the_lost_sms_would_have_done():
    """While ``hidden`` seconds of communication hold a share f of the SMs, SM-bound compute beside it does
    (1 - f) x hidden seconds of whole-GPU work; the f x hidden seconds it could not do run afterwards."""
    f, hidden, compute = 32 / 148, 0.05, 0.30
    done_during_overlap = (1 - f) * hidden
    finish = hidden + (compute - done_during_overlap)  # the rest at full speed after the communication ends
    assert S.sm_contention(hidden, f) == pytest.approx(finish - compute)
    assert S.sm_contention(hidden, 0.0) == 0.0 and S.sm_contention(0.0, f) == 0.0
    assert S.sm_contention(hidden, 1.0) == pytest.approx(hidden)  # all SMs taken: the compute waits it out


def test_cuda_graph_scopes_remove_kernels():
    kern = {"attn": 40, "mla_extra": 20, "mamba": 40, "mlp": 20, "moe_router": 25, "moe_preprocess": 25,
            "moe_dispatch": 20, "moe_experts": 30, "shared_experts": 20, "fp8_casts_per_gemm": 3}
    common = dict(mla=False, quant_gemms=0, dropless=True, ep=8, kernels=kern)
    eager = H.layer_launches("A", "E", scopes=frozenset(), graphs_on=False, **common)
    part = H.layer_launches("A", "E", scopes=frozenset({"attn", "moe_router", "moe_preprocess"}), graphs_on=True,
                            **common)
    full = H.layer_launches("A", "E", scopes=frozenset({"full_iteration"}), graphs_on=True, **common)
    assert eager.eager_kernels == 40 + 25 + 25 + 20 + 30
    assert part.eager_kernels == 20 + 30 and part.graph_launches == 6
    assert full.eager_kernels == 0 and full.syncs == 0
    assert eager.syncs == 1  # dropless dispatcher: token counts to the host
    assert H.host_cpu_family("NVIDIA Grace (72 cores)") == "grace"
    assert H.host_cpu_family("2x Intel Xeon Platinum 8480C") == "x86"
    assert H.host_seconds(eager, launch_us=5.0, graph_launch_us=10.0) == pytest.approx(140 * 5e-6)


def test_unfused_paths_and_step_host_work():
    kern = {"attn": 40, "mla_extra": 20, "mamba": 40, "mlp": 20, "moe_router": 25, "moe_preprocess": 25,
            "moe_dispatch": 20, "moe_experts": 30, "shared_experts": 20, "fp8_casts_per_gemm": 3,
            "unfused_attention": 16, "moe_unfused_permute": 20, "sequential_mlp_per_expert": 10,
            "step_per_param_tensor": 4, "step_fixed": 100, "step_syncs": 6}
    common = dict(mla=False, quant_gemms=0, dropless=True, ep=4, kernels=kern, scopes=frozenset(), graphs_on=False)
    fused = H.layer_launches("A", "E", local_experts=2, **common)
    unfused = H.layer_launches("A", "E", local_experts=2, grouped_gemm=False, permute_fusion=False,
                               unfused_attention=True, **common)
    assert unfused.eager_kernels - fused.eager_kernels == 16 + 20 + 10 * 2
    tp8 = H.layer_launches("A", "D", tp_overlap_tp=8, **common)
    assert tp8.native_kernels == 2 * H.tp_overlap_kernels(2, 8) and tp8.eager_kernels == 40 + 20
    assert H.host_seconds(tp8, launch_us=50.0, graph_launch_us=10.0, native_us=5.0) == pytest.approx(
        (60 * 50.0 + tp8.native_kernels * 5.0) * 1e-6)
    tensors = {"attn": 4, "mla_extra": 4, "mamba": 6, "mlp": 3, "moe": 2, "per_local_expert": 2,
               "shared_experts": 2, "edges": 3}
    n = H.param_tensors({("A", "E", False): 6.0, ("A", "D", False): 2.0}, local_experts=4, shared=True, mla=False,
                        tensors=tensors)
    assert n == 3 + 6 * (4 + 2 + 2 * 4 + 2) + 2 * (4 + 3)
    step = H.step_launches(n, kern)
    assert step.eager_kernels == n * 4 + 100 and step.syncs == 6


def test_unfused_rope_adds_its_kernels_to_attention_layers_only():
    """apply_rope_fusion off (Megatron-Core ``_apply_rotary_pos_emb_bshd``): the ``unfused_rope`` kernels join the
    attention block's eager kernels, and a CUDA-graphed attention block still replays them as one graph."""
    kern = {"attn": 40, "mla_extra": 20, "mamba": 40, "mlp": 20, "moe_router": 25, "moe_preprocess": 25,
            "moe_dispatch": 20, "moe_experts": 30, "shared_experts": 20, "fp8_casts_per_gemm": 3, "unfused_rope": 32}
    common = dict(mla=False, quant_gemms=0, dropless=True, ep=4, kernels=kern)
    eager = dict(scopes=frozenset(), graphs_on=False)
    fused = H.layer_launches("A", "E", **eager, **common)
    unfused = H.layer_launches("A", "E", unfused_rope=True, **eager, **common)
    assert unfused.eager_kernels - fused.eager_kernels == 32
    mamba = H.layer_launches("M", "E", unfused_rope=True, **eager, **common)
    assert mamba.eager_kernels == H.layer_launches("M", "E", **eager, **common).eager_kernels
    graphed = dict(scopes=frozenset({"attn"}), graphs_on=True)
    assert H.layer_launches("A", "D", unfused_rope=True, **graphed, **common) == \
        H.layer_launches("A", "D", **graphed, **common)


def test_ep_overlap_schedule_nodes_add_engine_calls_and_bookkeeping_calls():
    """EP overlap's combined 1F1B schedule (Megatron-Core ``ScheduleNode`` / ``TransformerLayerNode``): a MoE layer
    adds 4 autograd engine calls (eager cost) and 37 stream / event / tensor calls (native cost) with the alltoall
    dispatcher and several local experts; a dense layer 2 and 12; nothing under a whole-iteration graph."""
    kern = {"attn": 40, "mla_extra": 20, "mamba": 40, "mlp": 20, "moe_router": 25, "moe_preprocess": 25,
            "moe_dispatch": 20, "moe_experts": 30, "shared_experts": 20, "fp8_casts_per_gemm": 3,
            "grouped_gemm_per_expert": 2}
    common = dict(mla=False, quant_gemms=0, dropless=True, ep=4, kernels=kern, local_experts=2)
    eager = dict(scopes=frozenset(), graphs_on=False)
    for mlp, engine, calls in (("E", 4, 37), ("D", 2, 12)):
        off = H.layer_launches("A", mlp, **eager, **common)
        on = H.layer_launches("A", mlp, ep_overlap=True, **eager, **common)
        assert on.eager_kernels - off.eager_kernels == engine
        assert on.native_kernels - off.native_kernels == calls
        assert on.syncs == off.syncs and on.graph_launches == off.graph_launches
        assert H.host_seconds(on, launch_us=50.0, graph_launch_us=10.0, native_us=5.0) - H.host_seconds(
            off, launch_us=50.0, graph_launch_us=10.0, native_us=5.0) == pytest.approx((engine * 50 + calls * 5) * 1e-6)
    full = dict(scopes=frozenset({"full_iteration"}), graphs_on=True)
    assert H.layer_launches("A", "E", ep_overlap=True, **full, **common) == H.layer_launches("A", "E", **full, **common)
    shared = H.layer_launches("A", "E", ep_overlap=True, shared=True, **eager, **common)
    assert shared.native_kernels - H.layer_launches("A", "E", shared=True, **eager, **common).native_kernels == 39


def test_ep_overlap_freed_inputs_follow_should_free_input():
    """Megatron-Core ``should_free_input``: combine 1; dispatch 2 unless flex or a graphed ``moe_preprocess``; the
    experts 1 with FP8, or with several local experts / a non-alltoall dispatcher, never with HybridEP / NCCL EP."""
    f = H.ep_overlap_freed_inputs
    assert f("alltoall", None, 2, quantised=False, preprocess_graphed=False) == 4
    assert f("alltoall", None, 1, quantised=False, preprocess_graphed=False) == 3
    assert f("alltoall", None, 1, quantised=True, preprocess_graphed=False) == 4
    assert f("alltoall", None, 2, quantised=False, preprocess_graphed=True) == 2
    assert f("flex", "deepep", 1, quantised=False, preprocess_graphed=False) == 2
    assert f("flex", "hybridep", 8, quantised=False, preprocess_graphed=False) == 1
    assert f("flex", "hybridep", 8, quantised=True, preprocess_graphed=False) == 2
    assert H.ep_overlap_node_ops(True, freed_inputs=1) == (4.0, 37.0 - 2 * 3)


def test_ep_overlap_nodes_are_counted_on_layers_with_an_mlp_block_only():
    """Hybrid models: a mixer-only layer runs inside its group's pre-dispatch node (no nodes of its own); a
    MoE-only layer (no mixer) is still split into the four MoE nodes."""
    kern = {"attn": 40, "mla_extra": 20, "mamba": 40, "mlp": 20, "moe_router": 25, "moe_preprocess": 25,
            "moe_dispatch": 20, "moe_experts": 30, "shared_experts": 20, "fp8_casts_per_gemm": 3}
    common = dict(mla=False, quant_gemms=0, dropless=True, ep=8, kernels=kern, scopes=frozenset(), graphs_on=False,
                  local_experts=4)
    assert H.layer_launches("M", "_", ep_overlap=True, **common) == H.layer_launches("M", "_", **common)
    moe_only = H.layer_launches("_", "E", ep_overlap=True, **common)
    assert moe_only.native_kernels - H.layer_launches("_", "E", **common).native_kernels == 37

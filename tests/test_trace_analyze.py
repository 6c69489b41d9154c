"""Analysis: hidden/exposed comm, idle split, DeepEP on the real DeepSeek-V3 trace, stragglers, diff, JSON shape."""

from __future__ import annotations

import json
import os

import pytest

from conftest import DATA, run_cli
from moetune.evidence.traces.analyze import analyze_paths
from moetune.evidence.traces.diff import diff_reports
from trace_synth import KinetoBuilder

TRACES = DATA / "traces"
US = 1e-6


def test_hidden_exposed_and_hta_overlap(tmp_path):
    b = KinetoBuilder()
    b.step(1, 0, 1000)
    b.kernel("sm90_xmma_gemm_bf16f32_bf16f32_f32_tn_n", 0, 100, launch_ts=-10, stream=7)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", 50, 100, launch_ts=-8, stream=20)
    b.kernel("Memcpy DtoD (Device -> Device)", 120, 10, launch_ts=-6, stream=21, cat="gpu_memcpy",
             runtime="cudaMemcpyAsync")
    r = analyze_paths(b.write(tmp_path / "r0.json")).ranks[0]
    assert r.comm_s == pytest.approx(100 * US)
    assert r.comm_compute_overlap_pct == pytest.approx(50.0)  # HTA: |comm ∩ compute| / |comm|
    assert r.hidden_comm_s == pytest.approx(50 * US)  # comm ∩ compute
    assert r.exposed_comm_s == pytest.approx(50 * US)
    assert r.exposed_comm_beside_memcpy_s == pytest.approx(10 * US)  # only the memcpy ran beside it there
    assert r.comm_by_kind == {"nccl_allreduce": pytest.approx(100 * US)}
    assert r.exposed_comm_by_kind["nccl_allreduce"] == pytest.approx(50 * US)
    assert r.window_s == pytest.approx(150 * US) and r.busy_s == pytest.approx(150 * US)


def test_idle_split_host_bound_vs_dependency(tmp_path):
    b = KinetoBuilder()
    b.step(1, -20, 200)
    b.kernel("k_a", 0, 10, launch_ts=-5, launch_dur=2)
    b.kernel("k_b", 20, 10, launch_ts=15, launch_dur=2)  # launch returns at 17: 7 µs launch-starved, 3 µs other
    b.kernel("k_c", 40, 10, launch_ts=0, launch_dur=2)  # queued long before: 10 µs waiting on a dependency
    r = analyze_paths(b.write(tmp_path / "r.json")).ranks[0]
    assert r.idle.total_s == pytest.approx(20 * US)
    assert r.idle.host_bound_s == pytest.approx(7 * US)
    assert r.idle.dependency_s == pytest.approx(13 * US)
    assert r.dominant_wall == "compute"


def test_host_bound_wall_and_graph_evidence(tmp_path):
    b = KinetoBuilder()
    b.step(1, -20, 2000)
    t = 0.0
    for i in range(20):  # tiny kernels each launched only after the previous one finished
        b.kernel(f"void at::native::vectorized_elementwise_kernel<{i}>", t, 2, launch_ts=t - 1, launch_dur=1)
        t += 50
    b.kernel("sm90_xmma_gemm_e4m3bf16_e4m3f32", t, 5, launch_ts=t - 40, runtime="cudaGraphLaunch")
    r = analyze_paths(b.write(tmp_path / "r.json")).ranks[0]
    assert r.dominant_wall == "host"
    assert r.features.cuda_graph_launches == 1 and r.features.graph_replayed_kernels == 1
    assert r.features.fp8_gemm_kernels == 1
    assert r.features.dispatcher == "none seen"


def test_last_profiler_step_left_out(tmp_path):
    b = KinetoBuilder()
    for i in range(3):
        b.step(i, i * 1000, 1000)
        b.kernel("k", i * 1000 + 10, 100, launch_ts=i * 1000 + 1)
    r = analyze_paths(b.write(tmp_path / "r.json")).ranks[0]
    assert r.iterations == 2 and [x.name for x in r.per_iteration] == ["ProfilerStep#0", "ProfilerStep#1"]
    assert r.iteration_wall_s.median == pytest.approx(1000 * US)
    assert r.compute_s == pytest.approx(200 * US)


def test_deepseek_deepep_is_communication(shared_data):
    r = analyze_paths(TRACES / "deepseek_profile_data_train.json").ranks[0]
    assert r.rank == 0 and r.world_size == 64
    assert set(r.comm_by_kind) == {"deepep_dispatch", "deepep_combine", "deepep_notify"}
    # index: 113,440 µs of DeepEP kernel time, 129,012 µs GPU span; the union is below the sum
    assert 0.100 < r.comm_s <= 0.11344
    assert r.hidden_comm_s / r.comm_s > 0.9  # "overlaps almost all of it"
    assert r.exposed_comm_s > 0
    assert r.comm_s + r.compute_s > r.window_s  # durations would not fit: unions, not sums
    f = r.features
    assert f.dispatcher == "deepep" and f.a2a_overlapped_compute is True and f.ep_comm_hidden_pct > 90
    assert f.fp8_gemm_kernels > 0 and f.grouped_gemm_kernels > 0 and "attention_flash" in f.attention


def _straggler_job(tmp_path, late_rank: int, clock_shift_us: float):
    d = tmp_path / "job"
    d.mkdir()
    for rank in range(4):
        b = KinetoBuilder(rank=rank, world=4)
        sh = clock_shift_us if rank == 2 else 0.0
        b.step(1, sh - 100, 30000)
        for i in range(10):
            t0 = i * 2000.0 + sh
            late = 800.0 if rank == late_rank else 0.0
            b.kernel("sm90_xmma_gemm_bf16", t0, 500, launch_ts=t0 - 50)
            b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", t0 + 600 + late, 1000 - late,
                     launch_ts=t0 - 40, stream=20,
                     args={"Collective name": "allreduce", "Process Group Name": "0", "Group size": 4})
        b.write(d / f"trace_{rank}.json")
    return d


def test_straggler_and_clock_alignment(tmp_path):
    rep = analyze_paths(_straggler_job(tmp_path, late_rank=1, clock_shift_us=5000.0))
    assert [r.rank for r in rep.ranks] == [0, 1, 2, 3]
    assert rep.clock_alignment.offsets_us["2"] == pytest.approx(5000.0)
    assert [s.rank for s in rep.stragglers] == [1]
    s = rep.stragglers[0]
    assert s.last_share == 1.0 and s.median_late_us == pytest.approx(800.0)
    c = rep.collectives[0]
    assert c.median_skew_us == pytest.approx(800.0) and c.median_transfer_us == pytest.approx(200.0)


def test_no_straggler_when_in_step(tmp_path):
    rep = analyze_paths(_straggler_job(tmp_path, late_rank=-1, clock_shift_us=0.0))
    assert rep.stragglers == []


def test_directory_is_one_job(shared_data, tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    for n in ("hta_trace_filter_sampled_rank-0.json.gz", "hta_trace_filter_sampled_rank-1.json.gz"):
        os.symlink(TRACES / n, d / n)
    rep = analyze_paths(d)
    assert [r.rank for r in rep.ranks] == [0, 1]
    assert rep.clock_alignment is not None and rep.collectives


@pytest.mark.parametrize("name", ["hta_trace_filter_sampled_rank-0.json.gz", "hta_trace_filter_sampled_rank-1.json.gz"])
def test_nccl_only_trace_has_no_fp8_evidence(shared_data, name):
    """FBGEMM's FP8 comm codecs in the HTA sample traces are not FP8 training kernels."""
    f = analyze_paths(TRACES / name).ranks[0].features
    assert (f.fp8_kernels, f.fp8_gemm_kernels, f.fp8_kernel_time_s) == (0, 0, 0.0)


def test_diff_control_vs_test(shared_data):
    a = analyze_paths(TRACES / "hta_trace_diff_control_control.json.gz")
    b = analyze_paths(TRACES / "hta_trace_diff_test_test.json.gz")
    d = diff_reports(a, b)
    assert d.matched_by == "position" and len(d.ranks) == 1
    rd = d.ranks[0]
    per = {x.metric: x for x in rd.per_iteration}
    assert per["comm_s"].delta == pytest.approx(b.ranks[0].comm_s / b.ranks[0].iterations
                                                 - a.ranks[0].comm_s / a.ranks[0].iterations)
    assert rd.comm_compute_overlap_pct.delta == pytest.approx(
        b.ranks[0].comm_compute_overlap_pct - a.ranks[0].comm_compute_overlap_pct)
    assert rd.moved


def test_cli_json_shape_and_diff(shared_data):
    r = run_cli("trace", str(TRACES / "deepseek_profile_data_train.json"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) >= {"ranks", "stragglers"}
    rk = doc["ranks"][0]
    for k in ("rank", "iterations", "comm_compute_overlap_pct", "comm_s", "hidden_comm_s", "exposed_comm_s",
              "comm_by_kind", "compute_s", "idle", "dominant_wall", "features"):
        assert k in rk
    assert set(rk["idle"]) >= {"host_bound_s", "dependency_s"}
    r = run_cli("trace", "diff", str(TRACES / "hta_trace_diff_control_control.json.gz"),
                str(TRACES / "hta_trace_diff_test_test.json.gz"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ranks"][0]["per_iteration"]
    r = run_cli("trace", "diff", str(TRACES / "hta_trace_diff_control_control.json.gz"))
    assert r.returncode == 2 and "two paths" in r.stderr


def test_missing_path_exit_2(tmp_path):
    r = run_cli("trace", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "nope.json" in r.stderr


def test_iterations_detected_from_optimizer_steps(tmp_path):
    b = KinetoBuilder()
    for it in range(3):
        t = it * 1000.0
        b.kernel("sm90_xmma_gemm_bf16", t, 300, launch_ts=t - 5)
        b.kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", t + 300, 200, launch_ts=t - 4, stream=20)
        for j in range(3):  # one optimizer step = a burst of multi_tensor_apply kernels (+ small elementwise)
            b.kernel("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>",
                     t + 600 + 50 * j, 20, launch_ts=t - 3)
            b.kernel("void at::native::vectorized_elementwise_kernel<4, MulFunctor>", t + 625 + 50 * j, 5,
                     launch_ts=t - 3)
    r = analyze_paths(b.write(tmp_path / "nosteps.json")).ranks[0]
    assert r.iteration_source.startswith("detected from 3 optimizer steps")
    assert r.iterations == 2 and r.iteration_wall_s.median == pytest.approx(1000 * US)

"""Layer-level CPU activation offloading (``--cpu-offloading-num-layers``): its host-copy price, the bytes it moves,
and the planner's layer-offload option against NVIDIA's Llama-3-70B GB200/GB300 Megatron-FSDP presets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moetune.catalog.models import get_model
from moetune.catalog.release_configs import release_preset
from moetune.catalog.systems import get_system
from moetune.io.load import build_published_job
from moetune.perfmodel import schedule as S
from moetune.perfmodel.memory import (
    _layer_activation,
    act_config,
    cpu_offloaded_layer_bytes,
    estimate_memory,
    graph_scope,
)
from moetune.perfmodel.step import estimate_time
from moetune.plan.search import PlanRequest, plan


def test_offload_exposed_is_the_copy_beyond_one_layers_forward_and_backward():
    # 10 GB at 100 GB/s = 0.1 s per direction; a layer of 0.15 s fwd+bwd hides 0.05 s (fwd) and 0.1 s (bwd)
    assert S.offload_exposed((10e9,), 100.0, 0.15) == pytest.approx(0.05)
    assert S.offload_exposed((10e9, 10e9), 100.0, 0.15) == pytest.approx(0.10)
    assert S.offload_exposed((10e9,), 100.0, 0.45) == 0.0  # both copies hidden
    assert S.offload_exposed((), 100.0, 0.1) == 0.0
    assert S.offload_exposed((10e9,), 0.0, 0.1) == 0.0
    # TE's layer_window_map: with N of L layers offloaded each copy has L // N layers to hide behind
    assert S.offload_exposed((10e9,), 100.0, 0.15, window=2) == pytest.approx(0.0, abs=1e-12)
    assert S.offload_exposed((10e9,), 100.0, 0.06, window=2) == pytest.approx((0.1 - 0.04) + (0.1 - 0.08))


@given(st.floats(1e6, 1e11), st.floats(1.0, 1000.0), st.floats(1e-4, 1.0))
def test_offload_exposed_falls_with_a_faster_link_and_never_exceeds_the_copies(b, gbs, layer_s):
    slow = S.offload_exposed((b,), gbs, layer_s)
    fast = S.offload_exposed((b,), 2 * gbs, layer_s)
    assert 0.0 <= fast <= slow <= 2 * b / (gbs * 1e9) + 1e-12


def _llama_fsdp_job(system: str, n_off: int, pp: int = 1):
    job = build_published_job(model=get_model("LLAMA3_70B"), system=system, gpus=64, precision="fp8_cs", gbs=256,
                              mbs=2, seq=8192, tp=1, pp=pp, cp=1, vp=None, ep=1, fsdp=64)
    f = job.features.model_copy(update={
        "use_megatron_fsdp": pp == 1, "data_parallel_sharding_strategy": "optim_grads_params",
        "use_distributed_optimizer": True, "fp8_param_gather": True, "recompute_granularity": None,
        "recompute_modules": (), "cuda_graph_impl": "none", "cuda_graph_scope": (),
        "cpu_offloading": n_off > 0, "cpu_offloading_num_layers": n_off})
    return job.with_(features=f)


def test_offloaded_bytes_are_the_saved_activations_of_the_first_layers():
    job = _llama_fsdp_job("GB300", 20)
    m = job.model
    per_layer = _layer_activation(m, m.mixer_pattern[0], m.mlp_pattern[0], act_config(job), graph_scope(job))[0]
    got = cpu_offloaded_layer_bytes(job)
    assert len(got) == 20 and all(b == pytest.approx(per_layer) for b in got)
    # their saved activations leave the GPU; one offloaded layer stays resident (the copy buffer, in the working set)
    c0 = estimate_memory(_llama_fsdp_job("GB300", 0)).stages[0].components
    c1 = estimate_memory(job).stages[0].components
    assert (c0["activations"] - c1["activations"]) * 1024**3 == pytest.approx(20 * per_layer, rel=1e-9)
    assert (c1["working_set"] - c0["working_set"]) * 1024**3 == pytest.approx(per_layer, rel=0.05)
    assert cpu_offloaded_layer_bytes(_llama_fsdp_job("GB300", 0)) == ()
    assert cpu_offloaded_layer_bytes(_llama_fsdp_job("GB300", 20, pp=2)) == ()


def _offload_wall(job, host_gbs: float) -> float:
    return estimate_time(job.with_(system=job.system.model_copy(update={"pcie_bw_gbs": host_gbs}))).walls[
        "offload"].seconds


def test_offload_wall_is_priced_from_the_host_link_and_the_window():
    assert estimate_time(_llama_fsdp_job("GB300", 0)).walls["offload"].seconds == 0.0
    # NVIDIA's 20 of 80 layers on GB300 (NVLink-C2C): each 3.6 GB copy has 4 layers' forward to hide behind
    assert estimate_time(_llama_fsdp_job("GB300", 20)).walls["offload"].seconds == 0.0
    # 79 of 80 layers (one layer of window each) over PCIe Gen5 x16 and over a link 4x as fast
    pcie, fast = _offload_wall(_llama_fsdp_job("GB300", 79), 64.0), _offload_wall(_llama_fsdp_job("GB300", 79), 256.0)
    assert pcie > fast >= 0.0 and pcie > 0.0


@pytest.mark.parametrize("system", ["GB300", "GB200"])
def test_planner_offloads_the_layers_nvidia_offloads(system):
    """NVIDIA's Llama-3-70B 64-GPU FP8-CS Megatron-FSDP presets (TP1 PP1 MBS2, release 26.04.01) offload
    ``cpu_offloading_num_layers`` layers instead of recomputing; with that layout pinned the planner finds the
    same number (the least eighth of the layers that fits) and no recompute."""
    preset = release_preset("Llama-3-70B", f"DGX-{system}", "fp8_cs", "26.04.01", gpus=64, tp=1, pp=1, cp=1, vp=None,
                            ep=1, etp=None, gbs=256, mbs=2)
    assert preset is not None and preset.fields["use_megatron_fsdp"]
    req = PlanRequest(model=get_model("LLAMA3_70B"), system=get_system(system), gpus=64, global_batch_size=256,
                      seq_length=8192, precisions=("fp8_cs",), top=1,
                      fix={"tp": 1, "pp": 1, "cp": 1, "vpp": 1, "ep": 1, "mbs": 2, "fsdp": 1})
    f = plan(req).candidates[0].job.features
    assert f.cpu_offloading and f.cpu_offloading_num_layers == preset.fields["cpu_offloading_num_layers"]
    assert f.recompute_granularity is None
    off = plan(PlanRequest(**{**req.__dict__, "explore_layer_offload": False})).candidates[0].job.features
    assert not off.cpu_offloading and off.recompute_granularity == "selective"


def test_reproduce_line_rebuilds_a_layer_offloaded_job():
    from moetune.io.load import FeatureChoices, choice_updates, feature_args

    f = _llama_fsdp_job("GB300", 20).features
    args = feature_args(f)
    assert "--offload-modules layers:20" in args
    upd = choice_updates(FeatureChoices(offload="layers:20"))
    assert upd["cpu_offloading"] and upd["cpu_offloading_num_layers"] == 20
    assert not upd["fine_grained_activation_offloading"]
    assert not choice_updates(FeatureChoices(offload="none"))["cpu_offloading"]

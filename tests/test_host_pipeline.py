"""Host-bound pipelines and fine-grained activation offloading in the step model (docs/time.md, issue 15):
the bubble of an interleaved schedule leaves out the host time its host enqueues ahead, a non-interleaved one keeps
it (Megatron's batch_p2p_sync), and the offload copies of fine-grained offloading share the host DRAM bandwidth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.catalog.systems import get_system
from moetune.io.config_to_job import job_from_config
from moetune.io.megatron_args import read_megatron_args
from moetune.perfmodel import schedule as S
from moetune.perfmodel.calibration import default_efficiency
from moetune.perfmodel.memory import fine_grained_offloaded_bytes
from moetune.perfmodel.step import _host_copy_gbs, build_profile, estimate_time, estimate_walls

OFFLOAD_CASE = "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading"


def test_interleaved_bubble_leaves_out_the_host_time_enqueued_ahead():
    stages, host = [1.0, 1.0], [0.9, 0.9]
    # no VPP: the exchanges synchronise the device, the neighbours' host time stays in the bubble
    assert S.pipeline_step(stages, m=4, pp=2, vpp=1, stage_host=host) == (4.0, pytest.approx(1.0))
    # VPP without host syncs in the chunks: the bubble is GPU time only
    _, free = S.pipeline_step(stages, m=4, pp=2, vpp=2, stage_host=host, fwd_host_blocks=False)
    assert free == pytest.approx(0.5 * 0.1)
    # dropless MoE syncs the host in forward: the forward third of the host time stays
    _, blocked = S.pipeline_step(stages, m=4, pp=2, vpp=2, stage_host=host, fwd_host_blocks=True)
    assert blocked == pytest.approx(0.5 * (1.0 - 0.6))
    # the old formula (p - 1)/v * S_max is the bound with no host time
    assert S.pipeline_step(stages, m=4, pp=2, vpp=2) == (4.0, pytest.approx(0.5))
    # the slowest stage's GPU time sets the bubble, not the stage with the most host time
    _, mixed = S.pipeline_step([1.0, 0.8], m=4, pp=2, vpp=2, stage_host=[0.9, 0.0], fwd_host_blocks=False)
    assert mixed == pytest.approx(0.5 * 0.8)


def _offload_job(system: str = "DGX-H100"):
    gdir = Path(__file__).resolve().parents[1] / "data" / "megatron_golden"
    cfg = read_megatron_args(gdir / f"case_{OFFLOAD_CASE}_config.yaml")
    return job_from_config(cfg, system=system, gpus=8), gdir


def test_host_bound_interleaved_job_has_a_shorter_bubble_than_its_stage_time():
    job, _ = _offload_job()
    w = estimate_walls(job)
    m, pp, vpp = w.schedule
    assert vpp > 1 and w.walls["host"] > 0
    full = (pp - 1) / vpp * max(w.stage_seconds)
    assert w.walls["pipeline_bubble"] < full  # the old formula charged the full stage time
    assert w.walls["pipeline_bubble"] >= (pp - 1) / vpp * max(w.stage_floor)


def test_fine_grained_offload_copies_share_the_host_dram_bandwidth():
    job, _ = _offload_job()
    h100 = get_system("DGX-H100")
    # layer-level offloading copies one direction at a time: the PCIe link limits
    assert _host_copy_gbs(job) == h100.pcie_bw_gbs
    # fine-grained offloads and reloads run together: half the GPU's share of the node's DRAM bandwidth
    assert _host_copy_gbs(job, duplex=True) == pytest.approx(h100.host_memory_bw_gbs_per_gpu / 2)
    assert _host_copy_gbs(job, duplex=True) < h100.pcie_bw_gbs
    by_kind = fine_grained_offloaded_bytes(job)
    assert by_kind and all(b > 0 for b in by_kind.values())
    prof = build_profile(job, default_efficiency())
    assert prof.fg_offload == by_kind
    off = estimate_walls(job).walls["offload"]
    no_off = job.with_(features=job.features.model_copy(update={"fine_grained_activation_offloading": False,
                                                                "offload_modules": ()}))
    assert off > 0 and estimate_walls(no_off).walls["offload"] == 0.0
    # a faster host (no DRAM bound, link 4x) hides more of the copies
    fast = job.with_(system=job.system.model_copy(update={"pcie_bw_gbs": 256.0, "host_memory_bw_gbs_per_gpu": None}))
    assert 0.0 <= estimate_walls(fast).walls["offload"] < off


@pytest.mark.parametrize(("suffix", "system"), [("", "DGX-H100"), ("_dev_dgx_gb200", "GB200-NVL72")])
def test_fine_grained_offloading_golden_iteration_time(suffix, system):
    """The functional test's median iteration time after warm-up (bench/steptime_accuracy.py golden_checks) within
    25 % (it was under-predicted by 73 % / 38 % before the copies were priced)."""
    job, gdir = _offload_job(system)
    vals = json.loads((gdir / f"case_{OFFLOAD_CASE}_golden{suffix}.json").read_text())["iteration-time"]["values"]
    steady = sorted(float(v) for k, v in vals.items() if int(k) > 5 and v != "nan")
    n = len(steady)
    measured = steady[n // 2] if n % 2 else (steady[n // 2 - 1] + steady[n // 2]) / 2
    assert estimate_time(job).step_time_s == pytest.approx(measured, rel=0.25)

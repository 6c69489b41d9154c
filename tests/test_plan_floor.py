"""The memory floor (moetune.plan.floor) is a true lower bound of the memory model: no configuration a search prices
needs less device memory, so a request whose floor overflows has no fitting configuration; such requests are
answered without a search, with the floor and the capacity in the answer."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.cli import app
from moetune.errors import InputError
from moetune.perfmodel.memory import device_peaks
from moetune.plan.search import PlanRequest, Search, plan, request_floor

_MODELS = ("OLMoE-1B-7B", "Qwen3-30B-A3B", "DeepSeek-V2-Lite", "GPT-OSS-20B", "Mixtral-8x7B", "Llama-3-8B")


def _priced_device_gib(search: Search) -> list[float]:
    """Device GiB of the most loaded rank of every configuration the search tested for fit or priced memory of."""
    return [max(d for d, _ in device_peaks(j)) for j in search.tested_jobs()]


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(_MODELS), system=st.sampled_from(("DGX-H100", "DGX-A100")),
       gpus=st.sampled_from((1, 2, 4, 8)), gbs=st.sampled_from((32, 64, 128)),
       seq=st.sampled_from((1024, 2048, 4096)), fp8=st.booleans(), offload=st.booleans(), fsdp=st.booleans(),
       fix=st.sampled_from(({}, {"fsdp": 1}, {"fsdp": 0}, {"recompute": "full"}, {"tp": 1}, {"pp": 1})))
def test_no_priced_configuration_is_below_the_floor(model, system, gpus, gbs, seq, fp8, offload, fsdp, fix):
    precision = "fp8_cs" if fp8 and system == "DGX-H100" else "bf16"
    req = PlanRequest(model=get_model(model), system=get_system(system), gpus=gpus, global_batch_size=gbs,
                      seq_length=seq, precisions=(precision,), mbs_options=(1, 2), top=2, allow_offload=offload,
                      explore_fsdp=fsdp, explore_graphs=False, workers=1, fix=dict(fix))
    floor = request_floor(req)
    search = Search(req)  # the search itself, without the floor's short cut
    res = search.run()
    priced = _priced_device_gib(search) + [max(d for d, _ in device_peaks(j)) for _, j in res.closest]
    assume(priced)  # every layout pruned by its model state alone (their misses are in res.closest)
    assert min(priced) >= floor.gib
    if not floor.fits:
        assert not res.candidates
    for c in res.candidates:
        assert max(s.device_gib for s in c.memory.stages) >= floor.gib


def test_floor_is_at_most_the_best_fitting_configuration():
    req = PlanRequest(model=get_model("Qwen3-30B-A3B"), system=get_system("DGX-H100"), gpus=8,
                      global_batch_size=256, seq_length=4096, top=3, workers=1)
    res = plan(req)
    floor = request_floor(req)
    assert res.candidates and res.memory_floor is None and floor.fits
    assert all(max(s.device_gib for s in c.memory.stages) >= floor.gib for c in res.candidates)


def test_a_request_over_the_floor_is_answered_without_a_search():
    req = PlanRequest(model=get_model("DeepSeek-V3"), system=get_system("DGX-H100"), gpus=16,
                      global_batch_size=256, seq_length=4096)
    res = plan(req)
    floor = res.memory_floor
    assert floor is not None and not floor.fits
    assert not res.candidates and res.searched == 0 and res.layouts > 0
    assert floor.gib + floor.headroom_gib > floor.capacity_gib
    assert floor.min_gpus() > 16
    assert f"{floor.gib:.1f} GiB" in res.notes[0] and f"{floor.capacity_gib:.1f} GiB" in res.notes[0]
    # more GPUs lower the floor: at its minimum GPU count it fits, one fewer does not
    n = floor.min_gpus()
    from dataclasses import replace

    assert request_floor(replace(req, gpus=n)).fits and not request_floor(replace(req, gpus=n - 1)).fits


def test_cli_names_the_floor_and_the_capacity():
    r = CliRunner().invoke(app, ["plan", "--model", "DeepSeek-V3", "--system", "DGX-H100", "--gpus", "16",
                                 "--gbs", "256", "--json"])
    assert r.exit_code == 1, r.output
    info = json.loads(r.stdout)["impossible"]
    assert info["memory_floor_gib"] > info["capacity_gib"] - 3
    assert "memory floor" in info["summary"] and "GiB HBM" in info["summary"]
    assert any("GPUs" in s for s in info["what_would_fit"])


def test_unsupported_precision_is_refused_before_the_search():
    req = PlanRequest(model=get_model("Llama-4-Scout"), system=get_system("DGX-A100"), gpus=8,
                      global_batch_size=256, seq_length=4096, precisions=("fp8_cs",))
    with pytest.raises(InputError, match="PRC-008"):
        plan(req)

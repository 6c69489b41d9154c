"""The planner: emitted configs pass the checker, --fix is honoured, memory policy, determinism, impossible
requests."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.io.bridge import read_bridge_config
from moetune.io.check import check_config
from moetune.io.config_to_job import job_to_config
from moetune.io.megatron_args import read_megatron_args
from moetune.perfmodel.memory import estimate_memory
from moetune.plan.launch import launch_for
from moetune.plan.search import PlanRequest, plan, request_headroom


def _req(**kw) -> PlanRequest:
    base = dict(model=get_model("OLMoE-1B-7B"), system=get_system("DGX-H100"), gpus=8, global_batch_size=256,
                seq_length=4096, top=4)
    base.update(kw)
    return PlanRequest(**base)


@pytest.fixture(scope="module")
def olmoe_plan():
    return plan(_req())


def _errors(result) -> list:
    return [f for f in result.findings if str(f.severity).startswith("error")]


def test_candidates_ranked_and_distinct(olmoe_plan):
    c = olmoe_plan.candidates
    assert c, "OLMoE on 8 H100 must have a feasible layout"
    times = [x.step_time_s for x in c]
    assert times == sorted(times)
    assert len({x.layout.key() for x in c}) == len(c)
    assert olmoe_plan.searched >= len(c) and olmoe_plan.layouts > 0


def test_no_candidate_exceeds_memory_with_headroom(olmoe_plan):
    req = olmoe_plan.request
    for c in olmoe_plan.candidates:
        mem = estimate_memory(c.job)
        peak = max(s.device_gib for s in mem.stages)
        assert peak + request_headroom(req) <= req.system.gpu.hbm_gib + 1e-9
        assert mem.fits  # one headroom policy: estimate's verdict


def test_every_emitted_config_passes_check(olmoe_plan):
    for c in olmoe_plan.candidates:
        assert not _errors(check_config(job_to_config(c.job)))
        launch = launch_for(c.job)
        # the Bridge overrides, read back the way `moetune check` reads them
        cfg = read_bridge_config(None, launch["bridge_overrides"], base={})
        assert not _errors(check_config(cfg)), launch["bridge_overrides"]
        # the Megatron-LM flags, read back by the Megatron-LM reader
        margs = read_megatron_args(" ".join(launch["megatron_args"]))
        assert not _errors(check_config(margs))
        assert launch["nodes"] == 1 and "srun" in launch["slurm_script"]
        assert launch["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        f = c.job.features
        if f.overlap_moe_expert_parallel_comm or c.layout.tp > 1:
            assert "CUDA_DEVICE_MAX_CONNECTIONS" in launch["env"]
        if f.cuda_graph_impl != "none":
            assert launch["env"]["NCCL_GRAPH_REGISTER"] == "0"


def test_fix_is_honoured():
    res = plan(_req(fix={"ep": 4, "mbs": 1}))
    assert res.candidates
    assert all(c.layout.ep == 4 and c.layout.mbs == 1 for c in res.candidates)


def test_deterministic(olmoe_plan):
    again = plan(_req())
    assert [c.sort_key() for c in again.candidates] == [c.sort_key() for c in olmoe_plan.candidates]


def test_cli_json_shape(cli):
    r = cli("plan", "--model", "OLMoE-1B-7B", "--system", "DGX-H100", "--gpus", "8", "--gbs", "256", "--seq",
            "4096", "--top", "2", "--fix", "ep=8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"candidates", "searched", "feasible", "seconds"} <= set(out)
    c = out["candidates"][0]
    assert {"tp", "pp", "vpp", "cp", "ep", "etp", "dp", "edp", "mbs"} <= set(c["layout"])
    assert {"features", "memory", "time", "launch"} <= set(c)
    assert c["layout"]["ep"] == 8
    assert c["time"]["step_time_s"] > 0 and c["memory"]["peak_allocated_gib"] > 0


def test_impossible_request_explains_and_exits_1(cli):
    # above the memory floor (tests/test_plan_floor.py), so searched: the activations of 32k tokens without
    # recompute overflow every layout
    r = cli("plan", "--model", "Llama-3-8B", "--system", "DGX-H100", "--gpus", "8", "--gbs", "64", "--seq", "32768",
            "--fix", "tp=1,cp=1", "--max-recompute", "none", "--no-offload", "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["candidates"] == []
    info = out["impossible"]
    assert info["closest"] and info["closest"][0]["over_gib"] > 0
    assert any("recompute" in s or "offload" in s for s in info["what_would_fit"])
    # below it: DeepSeek-V3 on 8 GPUs is answered by the floor, with more GPUs as the way out
    r = cli("plan", "--model", "DeepSeek-V3", "--system", "DGX-H100", "--gpus", "8", "--gbs", "64", "--seq", "4096",
            "--no-offload", "--json")
    assert r.returncode == 1, r.stderr
    info = json.loads(r.stdout)["impossible"]
    assert "memory floor" in info["summary"] and info["memory_floor_gib"] > info["capacity_gib"]
    assert any("GPUs" in s or "offload" in s for s in info["what_would_fit"])


def test_bad_fix_is_one_line_error(cli):
    r = cli("plan", "--model", "OLMoE-1B-7B", "--gpus", "8", "--fix", "tp=two")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "tp" in r.stderr


def test_mxfp8_on_blackwell_has_candidates_that_pass_check():
    """Regression: the base features must follow Bridge's bf16_with_mxfp8_mixed recipe (FP8 param gather), or the
    checker rejects every MXFP8 candidate (PRC-015)."""
    res = plan(_req(model=get_model("Qwen3-30B-A3B"), system=get_system("GB200-NVL72"), gpus=8,
                    global_batch_size=64, precisions=("mxfp8",), fix={"ep": 8}, top=2))
    assert res.candidates
    for c in res.candidates:
        assert c.job.features.precision == "mxfp8" and c.job.features.fp8_param_gather
        assert not _errors(check_config(job_to_config(c.job)))


def test_fsdp_pinned_gives_checked_fsdp_candidates():
    res = plan(_req(model=get_model("Llama-3-8B"), fix={"fsdp": 1}, top=2))
    assert res.candidates
    for c in res.candidates:
        f = c.job.features
        assert f.use_megatron_fsdp and f.data_parallel_sharding_strategy == "optim_grads_params"
        assert c.layout.pp == 1
        launch = launch_for(c.job)
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in launch["env"] or launch["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] != "1"
        cfg = job_to_config(c.job)
        assert cfg["model"]["gradient_accumulation_fusion"] is False  # Megatron-FSDP user guide
        assert not _errors(check_config(cfg))
        launch = launch_for(c.job)
        assert "ddp.data_parallel_sharding_strategy=optim_grads_params" in launch["bridge_overrides_tuning"]
        assert not _errors(check_config(read_bridge_config(None, launch["bridge_overrides"], base={})))


def test_fsdp_pinned_with_pipeline_parallelism_has_no_candidate():
    res = plan(_req(model=get_model("Llama-3-8B"), fix={"fsdp": 1, "pp": 2}, allow_offload=False))
    assert not res.candidates
    tp2 = plan(_req(model=get_model("Llama-3-8B"), fix={"fsdp": 1, "tp": 2}, top=1))  # FSDP with TP is searched
    assert tp2.candidates and tp2.candidates[0].job.features.use_megatron_fsdp


def test_fsdp_shrinks_model_state_where_searched():
    """Llama-3-70B on 64 GB200 at TP1 PP1: the distributed optimizer alone does not fit the weights + grads,
    Megatron-FSDP does; the search finds it without being told."""
    res = plan(_req(model=get_model("Llama-3-70B"), system=get_system("GB200-NVL72"), gpus=64, global_batch_size=256,
                    seq_length=8192, precisions=("fp8_cs",), fix={"tp": 1, "pp": 1, "cp": 1}, top=1,
                    allow_offload=False))
    assert res.candidates and res.candidates[0].job.features.use_megatron_fsdp


def test_dense_tp_candidates_overlap_tp_comm_moe_ones_do_not():
    dense = plan(_req(model=get_model("Llama-3-8B"), fix={"tp": 2}, top=1, explore_fsdp=False))
    assert dense.candidates and all(c.job.features.tp_comm_overlap for c in dense.candidates)
    moe = plan(_req(fix={"tp": 2}, top=1))
    assert moe.candidates and not any(c.job.features.tp_comm_overlap for c in moe.candidates)


def test_fsdp_with_pinned_pipeline_parallelism_is_explained(cli):
    r = cli("plan", "--model", "Llama-3-8B", "--gpus", "8", "--gbs", "64", "--seq", "4096", "--fix", "fsdp=1,pp=2",
            "--json")
    assert r.returncode == 1, r.stderr
    info = json.loads(r.stdout)["impossible"]
    assert "PP = 1" in info["summary"] and any("fsdp" in s for s in info["what_would_fit"])


def test_parallel_search_finds_the_sequential_candidates():
    """Two forked shares with a shared k-th-best bound return exactly the sequential top-K."""
    from dataclasses import replace

    req = _req(model=get_model("Qwen3-30B-A3B"), gpus=64, global_batch_size=1024, top=5)
    par, seq = plan(replace(req, workers=2)), plan(replace(req, workers=1))
    assert par.candidates and [c.sort_key() for c in par.candidates] == [c.sort_key() for c in seq.candidates]
    assert par.layouts == seq.layouts
    for key, t in seq.per_layout_best.items():
        if t <= seq.candidates[-1].step_time_s:
            assert par.per_layout_best[key] == pytest.approx(t, rel=1e-12)


def test_shared_bound_is_the_kth_best_of_every_shares_records():
    """The parallel search's bound: the K-th smallest of the new-layout step times every share has offered (a single
    search's bound after the same records), +inf until K were offered; a share prunes with the smaller of it and its
    own k-th best."""
    import multiprocessing

    from moetune.plan.search import SharedBound

    ctx = multiprocessing.get_context("fork")
    inf = float("inf")
    b = SharedBound(ctx.Value("d", inf), ctx.Array("d", [inf] * 3, lock=False))
    for step in (5.0, 9.0):  # share A
        b.offer(step)
    assert b.tighten(inf) == inf and b.tighten(7.0) == 7.0
    b.offer(4.0)  # share B: three offered -> 9.0
    assert b.tighten(inf) == 9.0
    for step in (3.0, 9.5, 6.0):  # B, A, A: the three smallest are 3, 4, 5
        b.offer(step)
    assert b.tighten(inf) == 5.0 and b.tighten(4.5) == 4.5
    one = SharedBound()  # one process: the share's own bound, offers ignored
    one.offer(1.0)
    assert one.tighten(inf) == inf and one.tighten(2.0) == 2.0


def test_bad_worker_count_is_one_line_error(cli, monkeypatch):
    monkeypatch.setenv("MOETUNE_WORKERS", "many")
    r = cli("plan", "--model", "Qwen3-30B-A3B", "--gpus", "64", "--gbs", "1024")
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1 and "MOETUNE_WORKERS" in errors[0] and "Traceback" not in r.stderr


def test_first_fit_stops_at_the_first_offloaded_fit():
    """first_fit (the 'use N GPUs' suggestions) answers whether anything fits and one example: when only offloading
    fits, the offload pass stops at its first fitting layout instead of pricing the 256 closest misses."""
    req = PlanRequest(model=get_model("Llama-3-70B"), system=get_system("DGX-H100"), gpus=8, global_batch_size=64,
                      seq_length=8192, workers=1)
    full = plan(req)
    first = plan(replace(req, first_fit=True))
    assert full.candidates and first.candidates and "offload" in " ".join(first.notes)
    assert first.candidates[0].recompute_rank >= 100  # an offloaded configuration
    assert first.feasible < full.feasible and first.searched < full.searched

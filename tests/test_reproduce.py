"""Plan and estimate give one answer: every plan candidate's ``reproduce:`` line rebuilds the identical Job (same
step time and memory), a layout that estimate says fits is never called infeasible by plan with the same features,
and Llama-4 Scout / Maverick plan on 64 H100 (before the sigmoid router was modelled, the checker rejected every
fitting layout with MOE-020 and plan reported "No layout fits").

Commands run in-process through typer's CliRunner on the app (flags and ``--json`` are the contract).
"""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.cli import app
from moetune.io.check import check_job
from moetune.io.load import FeatureChoices, JobFlags, SplitFlags, load_job
from moetune.perfmodel.memory import estimate_memory
from moetune.plan.space import SpaceLimits, enumerate_layouts

RUNNER = CliRunner()


def invoke(*args: str) -> dict:
    res = RUNNER.invoke(app, [*args, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output[-2000:]
    return json.loads(res.stdout)


# (model, system, gpus, gbs, seq, extra plan flags): small models and GPU counts so the suite stays fast
REQUESTS = [
    ("Qwen3-30B-A3B", "DGX-H100", 16, 1024, 4096, ()),
    ("Qwen3-30B-A3B", "DGX-H100", 8, 256, 4096, ("--fix", "ep_overlap=1")),
    ("Qwen3-30B-A3B", "DGX-B200", 8, 256, 4096, ("--precision", "fp8_cs,bf16")),
    ("Qwen3-30B-A3B", "GB200-NVL72", 8, 512, 4096, ("--fix", "dispatcher=hybridep")),
    ("Qwen3-30B-A3B", "DGX-H100", 16, 512, 4096, ("--fix", "pp=2,recompute=full")),
    # whole-iteration graphs of a dropless MoE: HybridEP with the rank capacity factor and paged stash
    ("Qwen3-30B-A3B", "GB200-NVL72", 8, 512, 4096, ("--fix", "dispatcher=hybridep,cuda_graph_scope=full_iteration")),
    ("Qwen3-30B-A3B", "DGX-H100", 16, 512, 4096, ("--fix", "cuda_graph_scope=attn+moe_router+moe_preprocess")),
    ("Qwen3-30B-A3B", "DGX-H100", 16, 1024, 4096, ("--recipe", "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config")),
    ("Qwen3-30B-A3B", "DGX-H100", 16, 1024, 4096, ("--recipe", "none")),
    ("DeepSeek-V2-Lite", "DGX-H100", 16, 256, 4096, ("--precision", "fp8_cs")),
    ("DeepSeek-V2-Lite", "DGX-H100", 8, 128, 4096, ("--fix", "recompute=mla_up_proj+moe_act")),
    ("DeepSeek-V2-Lite", "DGX-B200", 16, 512, 4096, ()),
    ("OLMoE-1B-7B", "DGX-H100", 8, 64, 2048, ()),
    ("OLMoE-1B-7B", "DGX-H100", 8, 128, 4096, ("--fix", "fsdp=1")),
    ("OLMoE-1B-7B", "DGX-H100", 4, 64, 4096, ()),
    ("Mixtral-8x7B", "DGX-H100", 16, 256, 4096, ()),
    ("Mixtral-8x7B", "DGX-H100", 16, 256, 4096, ("--fix", "tp=2,offload=expert_fc1+moe_act")),
    ("Moonlight-16B-A3B", "DGX-H100", 16, 512, 4096, ()),
    ("GPT-OSS-20B", "DGX-H100", 8, 128, 4096, ()),
    ("GPT-OSS-20B", "DGX-B200", 8, 256, 8192, ("--fix", "delay_wgrad=1")),
    ("Llama-3-8B", "DGX-H100", 8, 128, 4096, ()),
    ("Llama-3-8B", "DGX-H100", 8, 128, 8192, ("--fix", "tp=2,tp_comm_overlap=0")),
    ("Llama-3-8B", "GB200-NVL72", 16, 256, 8192, ("--precision", "mxfp8")),
    ("Qwen2-57B-A14B", "DGX-H100", 16, 256, 4096, ()),
    ("Nemotron-3-Nano", "DGX-H100", 8, 128, 4096, ()),
    # fine-tuning is a property of the job, carried by every reproduce line (docs/memory.md §7)
    ("Llama-3-8B", "DGX-H100", 8, 128, 4096, ("--task", "lora", "--lora-dim", "16",
                                              "--lora-target-modules", "linear_qkv,linear_fc2")),
    ("Qwen3-30B-A3B", "DGX-H100", 8, 256, 4096, ("--task", "lora")),
    ("OLMoE-1B-7B", "DGX-H100", 8, 64, 2048, ("--task", "sft")),
]


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: f"{r[0]}-{r[1]}-{r[2]}-{'_'.join(r[5])}")
def test_every_candidate_reproduces_with_estimate(req):
    """Must show: the ``reproduce:`` line of every plan candidate gives identical time and memory."""
    model, system, gpus, gbs, seq, extra = req
    plan = invoke("plan", "--model", model, "--system", system, "--gpus", str(gpus), "--gbs", str(gbs),
                  "--seq", str(seq), "--top", "3", *extra)
    assert plan["candidates"], plan
    for c in plan["candidates"]:
        line = c["reproduce"]
        assert line.startswith("moetune estimate ")
        est = invoke(*shlex.split(line)[1:])
        assert est["time"]["step_time_s"] == c["time"]["step_time_s"], line
        assert est["memory"]["stages"] == c["memory"]["stages"], line
        assert est["job"]["features"] == c["features"], line
        assert est["memory"]["fits"], line  # the planner's headroom rule is never looser than estimate's verdict


@pytest.mark.parametrize("model", ["Llama-4-Scout", "Llama-4-Maverick"])
def test_llama4_plans_on_64_h100(model):
    out = invoke("plan", "--model", model, "--gpus", "64", "--gbs", "512", "--seq", "4096", "--top", "2")
    assert out["candidates"]
    best = out["candidates"][0]
    est = invoke(*shlex.split(best["reproduce"])[1:])
    assert est["memory"]["fits"] and est["time"]["step_time_s"] == best["time"]["step_time_s"]
    # the pinned request: estimate says it fits, so plan must find it
    pinned = invoke("plan", "--model", model, "--gpus", "64", "--gbs", "512", "--seq", "4096", "--fix",
                    "tp=1,pp=8,ep=8,recompute=full", "--top", "1")
    assert pinned["candidates"] and pinned["candidates"][0]["layout"]["pp"] == 8


_SMALL = [("Qwen3-30B-A3B", 8, 256), ("DeepSeek-V2-Lite", 16, 256), ("OLMoE-1B-7B", 8, 64), ("Mixtral-8x7B", 16, 128),
          ("Llama-4-Scout", 16, 64), ("GPT-OSS-20B", 8, 64)]
_RECOMPUTE = ["none", "moe_act", "full"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(req=st.sampled_from(_SMALL), pick=st.integers(0, 10_000), rec=st.sampled_from(_RECOMPUTE),
       disp=st.sampled_from(["alltoall", "deepep"]))
def test_estimate_fits_implies_plan_finds_it(req, pick, rec, disp):
    """Property: for a random small request and a random layout the planner enumerates, when estimate says the job
    fits, plan with that layout and those features pinned reports it (never "No layout fits")."""
    name, gpus, gbs = req
    model, system = get_model(name), get_system("DGX-H100")
    layouts = list(enumerate_layouts(model, system, gpus, gbs, 4096, SpaceLimits(mbs_options=(1,))))
    lp = layouts[pick % len(layouts)]
    disp = disp if lp.ep * lp.etp > 1 else "alltoall"
    job = load_job(JobFlags(model=model, system=system, gpus=gpus, gbs=gbs, mbs=1, seq=4096, tp=lp.tp, pp=lp.pp,
                            vpp=lp.vpp if lp.vpp > 1 else None, cp=lp.cp, ep=lp.ep, etp=lp.etp,
                            split=SplitFlags(pipeline_layout=lp.pipeline_layout),
                            choices=FeatureChoices(fsdp=False, dispatcher=disp, ep_overlap=False, delay_wgrad=False,
                                                   recompute=rec, offload="none", cuda_graph_scope="none")))
    if not estimate_memory(job).fits or any(str(f.severity).startswith("error") for f in check_job(job)):
        return  # estimate says it does not fit, or Megatron rejects it (the checker; plan names the rule)
    fix = f"tp={lp.tp},pp={lp.pp},vpp={lp.vpp},cp={lp.cp},ep={lp.ep},etp={lp.etp},mbs=1,recompute={rec}," \
          f"fsdp=0,ep_overlap=0,cuda_graph_scope=none,dispatcher={disp}"
    if lp.pipeline_layout:
        fix += f",pipeline_layout={lp.pipeline_layout}"
    out = invoke("plan", "--model", name, "--gpus", str(gpus), "--gbs", str(gbs), "--seq", "4096", "--mbs", "1",
                 "--fix", fix, "--top", "1", "--no-offload")
    assert out["candidates"], (fix, out.get("impossible"))
    assert out["candidates"][0]["time"]["step_time_s"] > 0

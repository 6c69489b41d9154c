"""config_to_megatron_args emits every field job_to_config writes (Bridge mixed_precision / comm_overlap included):
Job -> Bridge config -> Megatron-LM flags -> read back gives the same layout and features as the Bridge config."""

from __future__ import annotations

import shlex

import pytest

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.io.config_to_job import config_to_megatron_args, job_from_config, job_to_config
from moetune.io.megatron_args import read_megatron_args
from moetune.spec import Features, Job, Layout

CASES = {
    "ep_overlap_delay_wgrad_tp_overlap": ("DGX-H100", dict(tp=2, pp=2, vpp=2, ep=8), dict(
        precision="bf16", overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True, tp_comm_overlap=True,
        moe_token_dispatcher_type="alltoall"),
        ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--tp-comm-overlap", "--bf16"]),
    "flex_deepep_selective_fp8_blockwise": ("DGX-H100", dict(tp=1, pp=1, ep=8), dict(
        precision="fp8_blockwise", moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep",
        recompute_granularity="selective", recompute_modules=("core_attn", "moe_act")),
        ["--moe-flex-dispatcher-backend", "deepep", "--fp8-recipe", "blockwise", "--recompute-modules", "moe_act"]),
    "flex_hybridep_te_graphs_mxfp8": ("GB200-NVL72", dict(tp=1, pp=4, ep=16), dict(
        precision="mxfp8", moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
        cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn", "moe_router", "moe_preprocess")),
        ["hybridep", "--fp8-recipe", "mxfp8", "--fp8-format", "e4m3", "--cuda-graph-impl", "transformer_engine",
         "moe_preprocess", "--te-rng-tracker"]),
    "full_iteration_rank_capacity_paged_stash": ("GB200-NVL72", dict(tp=1, pp=2, vpp=2, ep=8), dict(
        precision="mxfp8", moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
        cuda_graph_impl="local", cuda_graph_scope=("full_iteration",), moe_expert_rank_capacity_factor=1.5,
        moe_paged_stash=True),
        ["--cuda-graph-impl", "full_iteration", "--moe-expert-rank-capacity-factor", "1.5", "--moe-paged-stash",
         "--use-transformer-engine-op-fuser", "--no-check-for-nan-in-loss-and-grad"]),
    "full_recompute_fp8_cs": ("DGX-B200", dict(tp=2, pp=1, ep=8), dict(
        precision="fp8_cs", recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
        first_last_layers_bf16=True, fp8_param_gather=True),
        ["--recompute-granularity", "full", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
         "--fp8-param-gather"]),
}


def _job(system: str, layout: dict, features: dict) -> Job:
    return Job(model=get_model("qwen3-30b-a3b"), system=get_system(system), gpus=64, global_batch_size=512,
               micro_batch_size=1, seq_length=4096, layout=Layout(**layout), features=Features(**features))


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_args_round_trip_layout_and_features(name):
    system, layout, features, flags = CASES[name]
    job = _job(system, layout, features)
    cfg = job_to_config(job)
    args = config_to_megatron_args(cfg)
    for flag in flags:
        assert flag in args, (name, flag)
    assert len([a for a in args if a.startswith("--")]) == len({a for a in args if a.startswith("--")})
    mlm = job_from_config(read_megatron_args(shlex.join(args)), system=job.system, gpus=job.gpus)
    bridge = job_from_config(cfg, system=job.system, gpus=job.gpus)
    assert mlm.layout == bridge.layout
    assert mlm.layout.model_copy(update={"etp": None}) == job.layout and mlm.layout.expert_tp == job.layout.expert_tp
    assert mlm.features == bridge.features
    for key, value in features.items():
        assert getattr(mlm.features, key) == value, (name, key)


def test_bf16_config_without_comm_overlap_section_still_gets_precision_flag():
    cfg = job_to_config(_job("DGX-H100", dict(tp=1, pp=1, ep=8), dict(precision="bf16")))
    cfg.pop("comm_overlap")
    args = config_to_megatron_args(cfg)
    assert "--bf16" in args and "--fp8-format" not in args

"""Transformer Engine's CuTeDSL fused grouped MLP (``Features.cutedsl_fused_grouped_mlp``): one vocabulary (estimate
flag, Bridge / Megatron-LM loaders from ``NVTE_CUTEDSL_FUSED_GROUPED_MLP`` + the op fuser, release presets), the
launch output (env, op fuser, GLU interleave 32), the rules of its constraints (MOE-090..MOE-095), and the step-time
effect: only where TE fuses (SM 10.x, MXFP8 / NVFP4, ETP 1, supported activation, sizes % 64), fewer host launches
(the activation's HBM traffic is kept: docs/time.md "The CuTeDSL fused grouped MLP")."""

from __future__ import annotations

import copy

import pytest
from typer.testing import CliRunner

from moetune.catalog.models import get_model
from moetune.catalog.release_configs import preset_features, release_preset
from moetune.catalog.systems import get_system
from moetune.cli import app
from moetune.io.check import check_config, check_job
from moetune.io.config_to_job import (
    config_to_megatron_args,
    cutedsl_requested,
    job_from_config,
    job_to_config,
)
from moetune.io.effective import normalize_input
from moetune.io.env import feature_env
from moetune.io.load import FeatureChoices, adapt_features, choice_updates, feature_args
from moetune.overrides import apply_overrides
from moetune.perfmodel import compute as K
from moetune.perfmodel import host as H
from moetune.perfmodel.calibration import default_efficiency
from moetune.perfmodel.step import estimate_time, fused_grouped_mlp
from moetune.rules import Env
from moetune.spec import Features, Job, Layout
from moetune.spec.features import env_flag_on

RUNNER = CliRunner()
ON = {"cutedsl_fused_grouped_mlp": True}


def _job(features: dict, *, model: str = "Qwen3-30B-A3B", system: str = "GB200-NVL72", precision: str = "mxfp8",
         layout: dict | None = None) -> Job:
    return Job(model=get_model(model), system=get_system(system), gpus=8, global_batch_size=256, micro_batch_size=1,
               seq_length=4096, layout=Layout(**(layout or dict(tp=1, pp=1, ep=8))),
               features=Features(precision=precision, **features))


# --- where TE fuses --------------------------------------------------------------------------------------------


def test_runs_only_where_transformer_engine_fuses():
    ok = dict(requested=True, arch="blackwell", precision="mxfp8", etp=1, grouped_gemm=True, activation="swiglu",
              d_in=2048, ffn=768)
    assert K.fused_grouped_mlp_runs(**ok)
    assert K.fused_grouped_mlp_runs(**{**ok, "precision": "nvfp4"})
    assert K.fused_grouped_mlp_runs(**{**ok, "activation": "swiglu_clamped"})
    assert K.fused_grouped_mlp_runs(**{**ok, "activation": "squared_relu"})
    for bad in ({"requested": False}, {"arch": "hopper"}, {"precision": "fp8_cs"}, {"precision": "bf16"},
                {"etp": 2}, {"grouped_gemm": False}, {"activation": "gelu"}, {"d_in": 2880 + 32}, {"ffn": 800}):
        assert not K.fused_grouped_mlp_runs(**{**ok, **bad}), bad
    assert fused_grouped_mlp(get_model("Qwen3-30B-A3B"), "blackwell", Features(precision="mxfp8", **ON), 1)
    assert not fused_grouped_mlp(get_model("Llama-3-70B"), "blackwell", Features(precision="mxfp8", **ON), 1)


FULL = dict(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",))


def test_step_time_prices_the_fewer_launches_only_where_it_fuses():
    """Eager (host-bound) MoE layers launch ``fused_grouped_mlp_saved`` fewer kernels; under a whole-iteration CUDA
    graph nothing changes (the activation's HBM traffic is kept: docs/time.md "The CuTeDSL fused grouped MLP")."""
    eff = default_efficiency()
    on, off = estimate_time(_job(ON), eff), estimate_time(_job({}), eff)
    assert on.walls["host"].seconds < off.walls["host"].seconds
    assert on.walls["compute"].seconds == off.walls["compute"].seconds
    assert on.step_time_s < off.step_time_s
    # the host saving is the kernel count times the launch cost: small against the layer's own launches
    assert off.walls["host"].seconds - on.walls["host"].seconds < 0.1 * off.walls["host"].seconds
    assert estimate_time(_job({**ON, **FULL}), eff).step_time_s == estimate_time(_job(FULL), eff).step_time_s
    # not on Hopper, not in FP8 current scaling or BF16, not with expert TP: TE leaves the ops unfused
    for kw in (dict(system="DGX-H100", precision="fp8_cs"), dict(precision="fp8_cs"), dict(precision="bf16")):
        assert estimate_time(_job(ON, **kw), eff).step_time_s == estimate_time(_job({}, **kw), eff).step_time_s, kw
    two = dict(tp=1, pp=1, ep=4, etp=2)
    assert estimate_time(_job(ON, layout=two), eff).step_time_s == \
        estimate_time(_job({}, layout=two), eff).step_time_s


def test_host_launches_three_fewer_kernels_per_moe_layer_when_eager():
    kernels = dict(default_efficiency().kernels)
    assert kernels["fused_grouped_mlp_saved"] == 3
    kw = dict(mla=False, quant_gemms=2, scopes=frozenset(), graphs_on=False, dropless=True, ep=8, kernels=kernels)
    unfused = H.layer_launches("A", "E", **kw)
    fused = H.layer_launches("A", "E", fused_grouped_mlp=True, **kw)
    assert unfused.eager_kernels - fused.eager_kernels == 3
    full = dict(kw, scopes=frozenset({"full_iteration"}), graphs_on=True)
    assert H.layer_launches("A", "E", fused_grouped_mlp=True, **full) == H.layer_launches("A", "E", **full)


# --- vocabulary, loaders, launch ------------------------------------------------------------------------------


def test_flag_choice_and_reproduce_line():
    assert choice_updates(FeatureChoices(cutedsl_fused_grouped_mlp=True)) == ON
    assert "--cutedsl-fused-grouped-mlp" in feature_args(Features(**ON))
    assert "--no-cutedsl-fused-grouped-mlp" in feature_args(Features())
    base = ["estimate", "--model", "Qwen3-30B-A3B", "--system", "GB200-NVL72", "--gpus", "8", "--precision", "mxfp8",
            "--gbs", "256", "--mbs", "1", "--seq", "4096", "--tp", "1", "--pp", "1", "--ep", "8", "--recipe", "none",
            "--json"]
    import json

    on = json.loads(RUNNER.invoke(app, [*base, "--cutedsl-fused-grouped-mlp"], catch_exceptions=False).stdout)
    off = json.loads(RUNNER.invoke(app, [*base, "--no-cutedsl-fused-grouped-mlp"], catch_exceptions=False).stdout)
    assert on["launch"]["env"]["NVTE_CUTEDSL_FUSED_GROUPED_MLP"] == "1"
    assert "NVTE_CUTEDSL_FUSED_GROUPED_MLP" not in off["launch"]["env"]
    assert on["time"]["step_time_s"] < off["time"]["step_time_s"]  # eager: fewer launches on the host


def test_config_reader_needs_the_variable_and_the_op_fuser():
    assert env_flag_on("1") and env_flag_on(1) and not env_flag_on("0") and not env_flag_on("") \
        and not env_flag_on(None) and not env_flag_on("yes")
    fuser = {"use_transformer_engine_op_fuser": True}
    assert cutedsl_requested(fuser, {"NVTE_CUTEDSL_FUSED_GROUPED_MLP": "1"})
    assert not cutedsl_requested({}, {"NVTE_CUTEDSL_FUSED_GROUPED_MLP": "1"})
    assert not cutedsl_requested(fuser, {})


def test_launch_config_round_trips_and_carries_the_bridge_companions():
    job = _job({**ON, "overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True,
                "moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"})
    cfg = job_to_config(job)
    m = cfg["model"]
    assert cfg["env_vars"]["NVTE_CUTEDSL_FUSED_GROUPED_MLP"] == "1"
    assert m["use_transformer_engine_op_fuser"] and m["moe_mlp_glu_interleave_size"] == 32
    assert m["high_priority_a2a_comm_stream"] and m["moe_hybridep_num_sms_preprocessing"] == 32
    assert job_from_config(cfg).features.cutedsl_fused_grouped_mlp
    env = feature_env(job)
    assert env["NVTE_CUTEDSL_FUSED_GROUPED_MLP"] == "1" and env["CUDNNFE_CLUSTER_OVERLAP_MARGIN"] == "8"
    args = " ".join(config_to_megatron_args(cfg))
    assert "--use-transformer-engine-op-fuser" in args and "--moe-mlp-glu-interleave-size 32" in args
    assert not [f.id for f in check_job(job) if f.id.startswith("MOE-09")]
    off = job_to_config(_job({}))
    assert "NVTE_CUTEDSL_FUSED_GROUPED_MLP" not in off["env_vars"] and "moe_mlp_glu_interleave_size" not in off["model"]
    assert not job_from_config(off).features.cutedsl_fused_grouped_mlp


def test_squared_relu_experts_get_the_weighted_op_the_op_fuser_needs():
    cfg = job_to_config(_job(ON, model="Nemotron-3-Nano"))
    assert cfg["model"]["use_fused_weighted_squared_relu"] is True
    assert "moe_mlp_glu_interleave_size" not in cfg["model"]


def test_planner_keeps_it_but_drops_it_with_expert_tp():
    model = get_model("Qwen3-30B-A3B")
    f = Features(precision="mxfp8", **ON)
    assert adapt_features(f, model, Layout(tp=1, pp=1, ep=8), set()).cutedsl_fused_grouped_mlp
    assert not adapt_features(f, model, Layout(tp=1, pp=1, ep=4, etp=2), set()).cutedsl_fused_grouped_mlp
    assert adapt_features(f, model, Layout(tp=1, pp=1, ep=4, etp=2),
                          {"cutedsl_fused_grouped_mlp"}).cutedsl_fused_grouped_mlp


def test_release_presets_set_it_either_way():
    on = release_preset("Qwen3-30B-A3B", "GB200-NVL72", "mxfp8", "26.06", gpus=8, tp=1, pp=1, cp=1, vp=None, ep=8,
                        etp=1, gbs=512, mbs=8)
    assert on is not None and on.fields["cutedsl_fused_grouped_mlp"]
    assert preset_features(on, "GB200")[0]["cutedsl_fused_grouped_mlp"] is True
    old = release_preset("Qwen3-30B-A3B", "DGX-H100", "fp8_cs", "26.02", gpus=16, tp=1, pp=2, cp=1, vp=12, ep=8,
                         etp=None, gbs=1024, mbs=1)
    assert old is not None and preset_features(old, "H100")[0]["cutedsl_fused_grouped_mlp"] is False


# --- rules ------------------------------------------------------------------------------------------------------

BASE = {
    "frontend": "bridge",
    "model": {
        "num_layers": 4, "hidden_size": 2048, "ffn_hidden_size": 6144, "num_attention_heads": 32,
        "num_query_groups": 4, "kv_channels": 128, "vocab_size": 32000, "seq_length": 4096,
        "num_moe_experts": 16, "moe_ffn_hidden_size": 768, "moe_router_topk": 2, "moe_layer_freq": 1,
        "gated_linear_unit": True, "activation_func": "silu",
        "moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True, "moe_router_dtype": "fp32",
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
        "expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1,
        "use_transformer_engine_op_fuser": True, "moe_mlp_glu_interleave_size": 32,
    },
    "train": {"global_batch_size": 64, "micro_batch_size": 1},
    "optimizer": {"optimizer": "adam", "use_distributed_optimizer": True},
    "ddp": {"use_distributed_optimizer": True},
    "mixed_precision": "bf16_with_mxfp8_mixed",
    "env_vars": {"NVTE_CUTEDSL_FUSED_GROUPED_MLP": "1"},
}
ENV = dict(gpus=8, gpu="gb200", nvlink_domain=72, gpus_per_node=4)
RULES = ("MOE-090", "MOE-091", "MOE-092", "MOE-093", "MOE-094", "MOE-095")


def _check(overrides: dict, env: dict | None = None) -> tuple[dict, set[str], list]:
    cfg = apply_overrides(normalize_input(copy.deepcopy(BASE)), overrides)
    res = check_config(cfg, Env(**{**ENV, **(env or {})}))
    return cfg, {f.id for f in res.findings if f.id in RULES}, res.findings


def test_a_launchable_fused_config_is_clean():
    assert _check({})[1] == set()
    job = job_from_config(apply_overrides(normalize_input(copy.deepcopy(BASE)), {}), system="GB200-NVL72", gpus=8)
    assert job.features.cutedsl_fused_grouped_mlp


@pytest.mark.parametrize("rule_id,overrides,env", [
    ("MOE-090", {"model.use_transformer_engine_op_fuser": False}, None),
    ("MOE-091", {}, {"gpu": "h100"}),
    ("MOE-092", {"mixed_precision": "bf16_with_fp8_current_scaling_mixed"}, None),
    ("MOE-093", {"model.moe_mlp_glu_interleave_size": None}, None),
    ("MOE-094", {"model.moe_ffn_hidden_size": 800}, None),
    ("MOE-095", {"model.activation_func": "gelu"}, None),
])
def test_each_constraint_fires_and_its_fix_resolves_it(rule_id, overrides, env):
    cfg, ids, findings = _check(overrides, env)
    assert rule_id in ids, ids
    f = next(x for x in findings if x.id == rule_id)
    assert f.fix
    res = check_config(apply_overrides(cfg, f.fix), Env(**{**ENV, **(env or {})}))
    assert rule_id not in {x.id for x in res.findings}


def test_gpu_gate_needs_a_known_gpu():
    """NVIDIA's VR200 recipes set the variable; a GPU the catalog does not know gets no MOE-091 verdict."""
    assert "MOE-091" not in _check({}, {"gpu": None})[1]
    assert "MOE-091" not in _check({}, {"gpu": "b300"})[1]


def test_estimate_says_when_the_request_does_not_fuse():
    from moetune.perfmodel.step import build_profile

    note = "Transformer Engine does not fuse"
    assert any(note in a for a in build_profile(_job(ON, system="DGX-H100", precision="fp8_cs")).assumptions)
    assert not any(note in a for a in build_profile(_job(ON)).assumptions)
    assert not any(note in a for a in build_profile(_job({}, precision="bf16")).assumptions)

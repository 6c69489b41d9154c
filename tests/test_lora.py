"""Fine-tuning as a training task: LoRA (frozen base, low-rank adapters) and SFT (full fine-tune).

Sources: Megatron-Bridge ``peft/lora.py`` (``LoRA``: dim 32, alpha 32, every linear by default), ``peft/utils.py``
(``ParallelLinearAdapter``: A and B split over TP), Megatron-Core DDP (grad buffers only for ``requires_grad``
params), Transformer Engine (no wgrad for a frozen weight), Bridge ``flop_utils.py`` (LoRA FLOPs: frozen x 2/3).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.conftest import run_cli

from moetune.catalog.models import get_model
from moetune.io.load import FeatureChoices, JobFlags, build_published_job, choice_updates, feature_args, job_from_flags
from moetune.perfmodel import compute as K
from moetune.perfmodel.flops import flops_per_token, task_flops_per_token
from moetune.perfmodel.memory import estimate_memory, lora_rank_params, state_bytes
from moetune.perfmodel.params import lora_adapters
from moetune.perfmodel.step import estimate_time
from moetune.plan.launch import launch_for

LLAMA = "Llama-3-70B"


def _job(task: str = "pretrain", *, model: str = LLAMA, gpus: int = 8, tp: int = 1, pp: int = 1, ep: int = 1,
         dim: int | None = None, targets: str | None = None, **kw):
    ch = FeatureChoices(task=task, lora_dim=dim, lora_target_modules=targets, recompute="full")
    return job_from_flags(JobFlags(model=model, system="DGX-GB200", gpus=gpus, gbs=32, seq=4096, tp=tp, pp=pp, ep=ep,
                                   precision="bf16", recipe="none", choices=ch, **kw))


# --------------------------------------------------------------------------------------------------------------
# adapter parameters


def test_llama_adapter_shapes_by_hand():
    """Llama-3-70B (h 8192, 64 heads, 8 KV groups of 128, FFN 28672 SwiGLU): A is d_in x r, B is r x d_out."""
    m = get_model(LLAMA)
    h, q, kv, f = 8192, 64 * 128, 8 * 128, 28672
    assert (m.hidden_size, m.num_attention_heads * m.head_dim, m.query_groups * m.head_dim, m.ffn_hidden_size) == (
        h, q, kv, f)
    got = {a.module: (a.d_in, a.d_out) for a in lora_adapters(m, "A", "D", ("linear_qkv", "linear_proj",
                                                                             "linear_fc1", "linear_fc2"))}
    assert got == {"linear_qkv": (h, q + 2 * kv), "linear_proj": (q, h), "linear_fc1": (h, 2 * f),
                   "linear_fc2": (f, h)}
    r = 16
    per_layer = r * (h + q + 2 * kv) + r * (q + h) + r * (h + 2 * f) + r * (f + h)
    assert per_layer == 2_195_456
    dense, expert = lora_rank_params(_job("lora", dim=r))[0]
    assert (dense, expert) == (80 * per_layer, 0.0)
    # TP splits both A and B (ParallelLinearAdapter); the qkv-only perf preset is a small fraction of it
    assert lora_rank_params(_job("lora", dim=r, tp=2))[0][0] == pytest.approx(80 * per_layer / 2)
    assert lora_rank_params(_job("lora", dim=r, targets="linear_qkv"))[0][0] == 80 * r * (h + q + 2 * kv)
    assert lora_rank_params(_job("pretrain")) is None


def test_moe_expert_adapter_shared_per_ep_rank():
    """Bridge's default share_expert_adapters: one adapter for the local experts of an EP rank, so EP does not
    divide it (ETP does); attention adapters follow TP."""
    m = get_model("Qwen3-30B-A3B")
    h, f = m.hidden_size, m.moe_ffn_hidden_size
    ads = lora_adapters(m, "A", "E", ("linear_fc1", "linear_fc2"))
    assert [(a.module, a.d_in, a.d_out, a.expert) for a in ads] == [("linear_fc1", h, 2 * f, True),
                                                                     ("linear_fc2", f, h, True)]
    r = 8
    per_exp = r * (h + 2 * f) + r * (f + h)
    q, kv = m.num_attention_heads * m.head_dim, m.query_groups * m.head_dim
    per_attn = r * (h + q + 2 * kv) + r * (q + h)
    dense, expert = lora_rank_params(_job("lora", model="Qwen3-30B-A3B", dim=r, ep=8))[0]
    assert expert == m.num_layers * per_exp
    assert dense == m.num_layers * per_attn


# --------------------------------------------------------------------------------------------------------------
# memory: the frozen base has no main grads and no optimizer state


def test_frozen_base_has_no_grads_or_optimizer_state():
    pre, lora = _job("pretrain"), _job("lora", dim=16)
    cp, cl = estimate_memory(pre).stages[0].components, estimate_memory(lora).stages[0].components
    gib = 1024.0**3
    sb = state_bytes(lora)
    adapters = lora_rank_params(lora)[0][0]
    assert cl["weights"] == cp["weights"]  # the base weights stay
    assert cl["lora_adapter_weights"] * gib == pytest.approx(2 * adapters)  # BF16 adapters
    assert cl["main_grads"] * gib == pytest.approx(sb.grad * adapters)
    assert cl["optimizer_state"] * gib == pytest.approx(sb.optimizer * adapters / lora.dp)  # distributed optimizer
    assert cp["main_grads"] * gib == pytest.approx(sb.grad * 70.55e9, rel=0.01)  # pre-training: every weight
    assert cl["main_grads"] < cp["main_grads"] / 100


def test_lora_fits_where_pretraining_does_not():
    """Llama-3-70B on 8 GB200 as NVIDIA ran the 26.06 LoRA row (TP1 PP2 VP20): pre-training needs ~300 GiB, LoRA
    keeps the base weights and activations only."""
    kw = dict(model=get_model(LLAMA), system="DGX-GB200", gpus=8, precision="fp8_cs", gbs=32, mbs=1, seq=4096, tp=1,
              pp=2, cp=1, vp=20, ep=1, release="26.06")
    pre = estimate_memory(build_published_job(**kw))
    job = build_published_job(**kw, task="lora")
    lora = estimate_memory(job)
    assert not pre.fits and lora.fits
    f = job.features
    assert (f.task, f.lora_dim, f.lora_alpha, f.lora_target_modules) == ("lora", 16, 32, ("linear_qkv",))
    assert (f.cuda_graph_impl, f.cuda_graph_scope) == ("transformer_engine", ("mlp",))
    assert any("LLAMA3_70B_LORA_CONFIG" in a for a in job.assumptions)


def test_frozen_linears_keep_no_input():
    """TE saves a linear's input only for wgrad (weight.requires_grad): with LoRA on linear_qkv alone, FC1 / FC2 keep
    no input (the SwiGLU input, FC1's output, stays), the qkv adapter keeps its BF16 input and its r-wide output."""
    from moetune.perfmodel.activations import layer_components
    from moetune.perfmodel.memory import act_config

    m = get_model(LLAMA)
    pre = dict(layer_components(m, "A", "D", act_config(_job("pretrain"))))
    job = _job("lora", dim=16, targets="linear_qkv")
    lora = dict(layer_components(m, "A", "D", act_config(job)))
    t, h, f = 4096.0, 8192, 28672
    assert "mlp_norm_out" in pre and "mlp_norm_out" not in lora
    assert pre["mlp"] == 2 * (2 * f * t) + 2 * f * t  # FC1 output (GLU) + FC2 input, BF16
    assert lora["mlp"] == 2 * (2 * f * t)
    assert lora["attn_norm_out"] == 2 * h * t
    assert lora["lora_adapters"] == 2 * 16 * t
    assert lora["attn_qkv"] == pre["attn_qkv"] and lora["attn_proj_in"] == pre["attn_proj_in"]


# --------------------------------------------------------------------------------------------------------------
# step time


def test_frozen_gemm_has_no_wgrad():
    """A compute-bound GEMM: backward = dgrad + wgrad = 2x forward; frozen (LoRA base): dgrad only = 1x."""
    one = np.array([1.0])
    rows = (np.array([2 * 8192.0**3]), one * 8192, one * 8192, one * 8192, one, np.array([False]))
    kw = dict(peak_quant_tflops=1000.0, eff_quant=1.0, peak_bf16_tflops=1000.0, eff_bf16=1.0, knee=0.0,
              hbm_gbs=1e9, hbm_eff=1.0, quant_bytes=1.0, grad_accum_bytes=4.0)
    fwd, bwd = K.gemm_pass_seconds(*rows, **kw)
    _, frozen = K.gemm_pass_seconds(*rows, **kw, wgrad=np.array([False]))
    assert bwd[0] == pytest.approx(2 * fwd[0])
    assert frozen[0] == pytest.approx(fwd[0])


def test_lora_step_drops_wgrad_dp_and_optimizer():
    pre, lora = estimate_time(_job("pretrain")), estimate_time(_job("lora", dim=16))
    wp, wl = pre.walls, lora.walls
    # the decoder GEMMs lose wgrad (a third of fwd + bwd) and gain the small adapter GEMMs; attention is unchanged
    assert 0.6 * wp["compute"].seconds < wl["compute"].seconds < 0.9 * wp["compute"].seconds
    # optimizer step and DP traffic cover the adapters alone (PP 1: one stage)
    ratio = lora_rank_params(_job("lora", dim=16))[0][0] / 70.55e9
    assert wl["optimizer"].seconds == pytest.approx(wp["optimizer"].seconds * ratio, rel=0.01)
    assert wl["comm_dp"].seconds <= wp["comm_dp"].seconds


def test_adapter_gemms_are_priced():
    """More target modules, more adapter GEMMs: LoRA on every linear costs more than on linear_qkv alone."""
    qkv = estimate_time(_job("lora", dim=16, targets="linear_qkv")).walls["compute"].seconds
    every = estimate_time(_job("lora", dim=16)).walls["compute"].seconds
    assert qkv < every


def test_lora_flops_as_bridge_counts_them():
    m = get_model(LLAMA)
    fb = flops_per_token(m, 4096)
    core = fb.core_attention + fb.mixer_core
    assert task_flops_per_token(m, 4096, task="lora") == pytest.approx((fb.total - core) * 2 / 3 + core)
    assert task_flops_per_token(m, 4096, task="sft") == fb.total


# --------------------------------------------------------------------------------------------------------------
# vocabulary: flags, YAML, launch, bad input


def test_task_flags_round_trip_and_launch_note():
    job = _job("lora", dim=16, targets="linear_qkv,linear_fc1")
    args = feature_args(job.features)
    assert "--task lora" in args and "--lora-dim 16" in args and "--lora-target-modules linear_qkv,linear_fc1" in args
    launch = launch_for(job)
    assert "peft.dim=16" in launch["bridge_overrides"]
    assert any("Megatron-LM has no LoRA" in n for n in launch["notes"])
    assert launch_for(_job("pretrain"))["notes"] == []
    # a LoRA setting implies the task
    assert choice_updates(FeatureChoices(lora_dim=8)) == {"task": "lora", "lora_dim": 8}


def test_estimate_cli_lora_json_has_task():
    r = run_cli("estimate", "--model", LLAMA, "--system", "DGX-GB200", "--gpus", "8", "--gbs", "32", "--seq", "4096",
                "--pp", "2", "--vpp", "20", "--precision", "fp8_cs", "--task", "lora", "--lora-dim", "16",
                "--lora-target-modules", "linear_qkv", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["task"] == {"task": "lora", "lora": {"dim": 16, "alpha": 32, "target_modules": ["linear_qkv"]}}
    assert d["job"]["features"]["task"] == "lora"
    assert any(a.startswith("LoRA r=16") for a in d["assumptions"])
    assert any("Megatron-LM has no LoRA" in n for n in d["launch"]["notes"])
    assert d["flops_per_token"] == pytest.approx(task_flops_per_token(get_model(LLAMA), 4096, task="lora"))


def test_plan_cli_lora():
    r = run_cli("plan", "--model", LLAMA, "--system", "DGX-GB200", "--gpus", "8", "--gbs", "32", "--seq", "4096",
                "--precision", "fp8_cs", "--mbs", "1", "--task", "lora", "--lora-dim", "16", "--lora-target-modules",
                "linear_qkv", "--top", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["request"]["task"]["task"] == "lora"
    for c in d["candidates"]:
        assert (c["features"]["task"], c["features"]["lora_dim"]) == ("lora", 16)
        assert "--task lora" in c["reproduce"]


def test_bridge_yaml_peft_section(tmp_path):
    base = ("model:\n  num_layers: 4\n  hidden_size: 1024\n  ffn_hidden_size: 4096\n  num_attention_heads: 16\n"
            "  num_query_groups: 4\n  seq_length: 2048\ntrain:\n  global_batch_size: 8\n  micro_batch_size: 1\n")
    p = tmp_path / "lora.yaml"
    p.write_text(base + "peft:\n  _target_: megatron.bridge.peft.lora.LoRA\n  dim: 8\n  alpha: 16\n"
                        "  target_modules: [linear_qkv, linear_proj]\n")
    r = run_cli("estimate", "--bridge-config", str(p), "--gpus", "8", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["task"] == {"task": "lora", "lora": {"dim": 8, "alpha": 16, "target_modules": ["linear_qkv",
                                                                                           "linear_proj"]}}
    sft = tmp_path / "sft.yaml"
    sft.write_text(base + "dataset:\n  _target_: megatron.bridge.training.config.FinetuningDatasetConfig\n"
                          "  seq_length: 2048\n")
    r = run_cli("estimate", "--bridge-config", str(sft), "--gpus", "8", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["task"] == {"task": "sft"}
    dora = tmp_path / "dora.yaml"
    dora.write_text(base + "peft:\n  _target_: megatron.bridge.peft.dora.DoRA\n  dim: 8\n")
    _one_line_error(run_cli("estimate", "--bridge-config", str(dora), "--gpus", "8"), "peft", "dora")
    zero = tmp_path / "zero.yaml"
    zero.write_text(base + "peft:\n  _target_: megatron.bridge.peft.lora.LoRA\n  dim: 0\n")
    _one_line_error(run_cli("estimate", "--bridge-config", str(zero), "--gpus", "8"), "peft.dim", "0")


def _one_line_error(r, *needles: str) -> None:
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("flags,needles", [
    (["--task", "lora", "--lora-dim", "0"], ("--lora-dim", "0", "positive")),
    (["--lora-dim", "-4"], ("--lora-dim", "-4")),
    (["--task", "peft-ia3"], ("--task", "peft-ia3", "pretrain, sft, lora")),
    (["--lora-target-modules", "linear_q"], ("--lora-target-modules", "linear_q")),
    (["--task", "sft", "--lora-dim", "8"], ("--lora-dim", "--task lora")),
])
def test_bad_task_input_is_one_line_exit_2(flags, needles):
    _one_line_error(run_cli("estimate", "--model", LLAMA, "--gpus", "8", "--gbs", "32", "--seq", "4096", *flags),
                    *needles)
    if flags[:2] == ["--task", "lora"]:
        _one_line_error(run_cli("plan", "--model", LLAMA, "--gpus", "8", "--gbs", "32", "--seq", "4096", *flags),
                        *needles)


def test_service_gives_the_cli_number():
    """MCP and the web API call the commands through moetune.service: the same LoRA question, the same answer."""
    from moetune import service

    args = {"model": LLAMA, "system": "DGX-GB200", "gpus": 8, "gbs": 32, "seq": 4096, "pp": 2, "vpp": 20,
            "precision": "fp8_cs", "task": "lora", "lora_dim": 16, "lora_target_modules": "linear_qkv"}
    got = service.call("estimate", args).data
    r = run_cli("estimate", *[x for k, v in args.items() for x in (f"--{k.replace('_', '-')}", str(v))], "--json")
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout)
    assert got["task"] == want["task"]
    assert got["time"]["step_time_s"] == want["time"]["step_time_s"]


def test_adapter_launches_and_step_tensors():
    """Each adapter adds kernels_per_layer.lora_adapter launches to the module it wraps (eager unless that module is
    graphed), and the optimizer step walks only the adapters' two weights each."""
    from moetune.perfmodel import host as H
    from moetune.perfmodel.calibration import default_efficiency
    from moetune.perfmodel.step import _step_launches, build_profile

    kern = dict(default_efficiency().constants["kernels_per_layer"])
    base = dict(mla=False, quant_gemms=0, dropless=False, ep=1, kernels=kern)
    plain = H.layer_launches("A", "D", scopes=frozenset(), graphs_on=False, **base)
    lora = H.layer_launches("A", "D", scopes=frozenset(), graphs_on=False, lora_attn=1, lora_mlp=2, **base)
    assert lora.eager_kernels - plain.eager_kernels == 3 * kern["lora_adapter"]
    graphed = H.layer_launches("A", "D", scopes=frozenset({"mlp"}), graphs_on=True, lora_attn=1, lora_mlp=2, **base)
    graphed_plain = H.layer_launches("A", "D", scopes=frozenset({"mlp"}), graphs_on=True, **base)
    assert graphed.eager_kernels - graphed_plain.eager_kernels == kern["lora_adapter"]  # the MLP's are in its graph
    job = _job("lora", dim=16, targets="linear_qkv")
    eff = default_efficiency()
    prof = build_profile(job, eff)
    sl, _ = _step_launches(job.model, tuple(prof.stages), 1, eff, 1.0, ("linear_qkv",))
    per = eff.constants["param_tensors"]["lora_adapter"]
    assert sl == H.step_launches(80 * per, kern)

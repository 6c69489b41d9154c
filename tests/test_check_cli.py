"""``moetune check`` end to end (real exit codes): JSON shape, errors + --fix, inputs, one-line bad-input errors."""

from __future__ import annotations

import json

import pytest

from conftest import DATA, run_cli

RECIPE = "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"

BRIDGE_YAML = """
model:
  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider
  num_layers: 8
  hidden_size: 1024
  ffn_hidden_size: 4096
  num_attention_heads: 16
  num_query_groups: 4
  seq_length: 4096
  num_moe_experts: 16
  moe_ffn_hidden_size: 512
  moe_token_dispatcher_type: alltoall
  moe_router_dtype: fp32
  tensor_model_parallel_size: 2
  sequence_parallel: false
  pipeline_model_parallel_size: 2
  expert_model_parallel_size: 4
  add_bias_linear: false
  hidden_dropout: 0.0
  attention_dropout: 0.0
  params_dtype:
    _target_: torch.bfloat16
    _call_: false
train:
  global_batch_size: 64
  micro_batch_size: 1
optimizer:
  use_distributed_optimizer: true
ddp:
  use_distributed_optimizer: true
mixed_precision: bf16_mixed
comm_overlap:
  tp_comm_overlap: false
  overlap_moe_expert_parallel_comm: true
"""


def _json(proc):
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def test_recipe_json_is_clean():
    proc = run_cli("check", "--recipe", RECIPE, "--json")
    assert proc.returncode == 0, proc.stderr
    out = _json(proc)
    assert set(out) == {"findings", "effective"}
    assert out["effective"]["model"]["expert_model_parallel_size"] >= 1
    for f in out["findings"]:
        assert set(f) == {"id", "severity", "message", "fields", "fix", "source"}
        assert f["severity"] in ("depends-on-environment", "warning", "info")


def test_errors_exit_1_and_fix_resolves(tmp_path):
    cfg = tmp_path / "run_config.yaml"
    cfg.write_text(BRIDGE_YAML)
    proc = run_cli("check", str(cfg), "--system", "DGX-H100", "--gpus", "16", "--json", "--fix")
    assert proc.returncode == 1, proc.stderr
    out = _json(proc)
    ids = {f["id"] for f in out["findings"] if f["severity"].startswith("error")}
    assert {"PAR-046", "OVL-002"} <= ids
    par046 = next(f for f in out["findings"] if f["id"] == "PAR-046")
    assert par046["fix"] == {"model.sequence_parallel": True}
    assert "model.sequence_parallel=False" in par046["message"]
    assert out["fix"]["remaining_errors"] == []
    fixed = run_cli("check", str(cfg), "--system", "DGX-H100", "--gpus", "16", "--json", *out["fix"]["overrides"])
    assert fixed.returncode == 0, [f["id"] for f in _json(fixed)["findings"] if f["severity"].startswith("error")]


def test_recipe_with_overrides_and_human_output():
    proc = run_cli("check", "--recipe", RECIPE, "model.tensor_model_parallel_size=2", "model.sequence_parallel=false",
                   "--te", "2.8.0", "--env", "NCCL_GRAPH_REGISTER=0")
    assert proc.returncode == 1
    assert "PAR-046" in proc.stdout and "error(s)" in proc.stdout


def test_megatron_golden_config(shared_data):
    path = DATA / "megatron_golden" / "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_config.yaml"
    proc = run_cli("check", "--megatron-args", str(path), "--gpus", "8", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert _json(proc)["effective"]["frontend"] == "megatron-lm"
    bad = run_cli("check", "--megatron-args", str(path), "--gpus", "8", "--json",
                  "model.pipeline_model_parallel_size=4")
    assert bad.returncode == 1


def test_job_json_input(tmp_path):
    from moetune.catalog.recipes import recipe_config
    from moetune.io.config_to_job import job_from_config

    job = job_from_config(recipe_config(RECIPE))
    p = tmp_path / "job.json"
    p.write_text(job.model_dump_json())
    proc = run_cli("check", str(p), "--json")
    assert proc.returncode == 0, proc.stdout[-1500:]


@pytest.mark.parametrize("args,needle", [
    (["/nonexistent/run_config.yaml"], "/nonexistent/run_config.yaml"),
    (["--recipe", "no_such_recipe_config"], "no_such_recipe_config"),
    (["--recipe", RECIPE, "model..x=1"], "model..x=1"),
    (["--recipe", RECIPE, "--env", "NOEQUALS"], "NOEQUALS"),
    (["--megatron-args", "--num-layers 4 --frobnicate 2"], "--frobnicate"),
    (["--recipe", RECIPE, "--system", "DGX-Nope"], "DGX-Nope"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    proc = run_cli("check", *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert proc.stdout == ""


def test_malformed_yaml_exit_2(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("model: {tensor_model_parallel_size: [1,\n")
    proc = run_cli("check", str(p))
    assert proc.returncode == 2 and str(p) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_with_mcore_flag_reports_availability():
    proc = run_cli("check", "--recipe", RECIPE, "--json", "--with-mcore")
    assert proc.returncode == 0, proc.stderr
    assert "available" in _json(proc)["mcore"]

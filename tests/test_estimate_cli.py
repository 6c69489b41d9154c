"""``moetune estimate``: every input path (flags, Megatron-LM args, model_config.yaml, Bridge YAML + overrides) and
one-line errors with exit code 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.conftest import run_cli

FIXTURES = Path(__file__).parent / "fixtures"


def _json(*args: str) -> dict:
    r = run_cli("estimate", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _one_line_error(r, *needles: str) -> None:
    assert r.returncode == 2
    assert r.stdout == ""
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_flags_json_shape():
    d = _json("--model", "Qwen3-30B-A3B", "--gpus", "32", "--gbs", "256", "--seq", "4096", "--pp", "2", "--ep", "8",
              "--recompute", "moe_act,layernorm", "--explain")
    assert set(d) >= {"job", "memory", "time", "flops_per_token", "assumptions", "explain"}
    m = d["memory"]
    assert len(m["stages"]) == 2
    for s in m["stages"]:
        assert s["peak_allocated_gib"] > 0 and s["reserved_gib"] >= s["peak_allocated_gib"]
        assert {"weights", "main_grads", "optimizer_state", "activations"} <= set(s["components"])
    assert m["peak_allocated_gib"] == max(s["peak_allocated_gib"] for s in m["stages"])
    assert m["last_stage_peak_allocated_gib"] == m["stages"][-1]["peak_allocated_gib"]
    assert isinstance(m["fits"], bool) and m["capacity_gib"] > 70 and m["headroom_policy"]
    assert d["job"]["features"]["recompute_modules"] == ["moe_act", "layernorm"]
    assert d["explain"] and d["explain"][0]["frees_gib"] > 0


def test_rich_view_marks_binding_stage():
    r = run_cli("estimate", "--model", "Qwen3-30B-A3B", "--gpus", "32", "--gbs", "256", "--seq", "4096", "--pp", "2",
                "--ep", "8")
    assert r.returncode == 0, r.stderr
    assert "binding" in r.stdout and "peak allocated" in r.stdout


def test_megatron_args_string_file(tmp_path):
    p = tmp_path / "args.txt"
    p.write_text("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 "
                 "--max-position-embeddings 1024 --micro-batch-size 2 --global-batch-size 16 --num-experts 4 "
                 "--moe-router-topk 2 --expert-model-parallel-size 2 --bf16 --vocab-size 32000 "
                 "--tokenizer-type NullTokenizer --use-distributed-optimizer")
    d = _json("--megatron-args", str(p), "--gpus", "4")
    assert d["job"]["layout"]["ep"] == 2
    assert d["job"]["features"]["moe_token_dispatcher_type"] == "allgather"  # MLM default
    assert len(d["memory"]["stages"]) == 1


def test_megatron_model_config_yaml(shared_data):
    cfg = shared_data / "megatron_golden" / "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_config.yaml"
    d = _json("--megatron-args", str(cfg), "--gpus", "8")
    assert d["job"]["features"]["attention_backend"] == "unfused"
    assert d["job"]["layout"]["vpp"] == 4
    # golden peak (last rank) 55.98 GiB: within 20 %
    assert d["memory"]["last_stage_peak_allocated_gib"] == pytest.approx(55.98, rel=0.2)


def test_bridge_yaml_with_override():
    d = _json("--bridge-config", str(FIXTURES / "memory_bridge_small.yaml"), "--gpus", "8")
    assert len(d["memory"]["stages"]) == 2
    d = _json("--bridge-config", str(FIXTURES / "memory_bridge_small.yaml"), "--gpus", "8",
              "model.pipeline_model_parallel_size=1")
    assert len(d["memory"]["stages"]) == 1


@pytest.mark.parametrize("args,needles", [
    (("--model", "Qwen3-30B-A3B", "--gpus", "16", "--gbs", "abc", "--seq", "4096"), ("--gbs",)),
    (("--model", "NoSuchModel", "--gpus", "16", "--gbs", "64", "--seq", "4096"), ("NoSuchModel",)),
    (("--model", "Qwen3-30B-A3B", "--gpus", "16", "--gbs", "64", "--seq", "4096", "--recompute", "everything"),
     ("--recompute", "everything")),
    (("--model", "Qwen3-30B-A3B", "--gpus", "16", "--gbs", "64", "--seq", "4096", "--ep", "3"), ("EP",)),
    (("--megatron-args", "--num-layers 4 --hidden-size 512 --bogus-flag 3", "--gpus", "8"), ("bogus-flag",)),
    (("--megatron-args", "--num-layers 4 --hidden-size abc", "--gpus", "8"), ("hidden-size",)),
    (("--megatron-args", "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 "
      "--global-batch-size 8 --recompute-activations --recompute-granularity full", "--gpus", "8"),
     ("contradicts",)),
    (("--megatron-args", "/nonexistent/args.yaml", "--gpus", "8"), ("/nonexistent/args.yaml",)),
    (("--bridge-config", str(FIXTURES / "memory_bridge_small.yaml"), "--gpus", "8",
      "model.tensor_model_parallel_size=abc"), ("tensor_model_parallel_size",)),
])
def test_bad_input_one_line_exit_2(args, needles):
    _one_line_error(run_cli("estimate", *args), *needles)


def test_config_plus_layout_flag_contradicts(shared_data):
    cfg = shared_data / "megatron_golden" / "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_config.yaml"
    _one_line_error(run_cli("estimate", "--megatron-args", str(cfg), "--gpus", "8", "--tp", "4"), "--tp")


def test_efficiency_from_the_environment(tmp_path, monkeypatch):
    """``$MOETUNE_EFFICIENCY`` (read by the command, passed to the time model) acts like ``--efficiency``."""
    from moetune.perfmodel.calibration import default_efficiency, save_efficiency

    p = tmp_path / "eff.yaml"
    save_efficiency(default_efficiency().with_values({"hbm_eff": 0.2}), p)
    args = ("--model", "Qwen3-30B-A3B", "--gpus", "16", "--gbs", "256", "--seq", "4096", "--ep", "16")
    shipped = _json(*args)["time"]["step_time_s"]
    flag = _json(*args, "--efficiency", str(p))["time"]["step_time_s"]
    monkeypatch.setenv("MOETUNE_EFFICIENCY", str(p))
    assert flag > shipped
    assert _json(*args)["time"]["step_time_s"] == flag

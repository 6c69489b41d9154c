"""CLI: catalog models/systems, model show, flops (JSON interfaces and one-line errors)."""

from __future__ import annotations

import json

from conftest import run_cli


def test_catalog_models_json():
    r = run_cli("catalog", "models", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    by = {row["name"]: row for row in rows}
    assert {"name", "aliases", "total_params", "active_params"} <= set(rows[0])
    assert by["Qwen3-30B-A3B"]["total_params"] == 30_532_122_624
    assert "DeepSeekV3" in by["DeepSeek-V3"]["aliases"]


def test_catalog_systems_json():
    r = run_cli("catalog", "systems", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows and {"name", "aliases", "gpus_per_node", "nvlink_domain", "hbm_gib", "peak_tflops"} <= set(rows[0])
    assert all(isinstance(row["peak_tflops"], dict) and "bf16" in row["peak_tflops"] for row in rows)


def test_model_show_json_name_and_hf_path(shared_data):
    r = run_cli("model", "show", "GPT OSS 20B", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["total_params"] == 20_914_757_184
    assert sum(d["params_by_component"].values()) == d["total_params"]
    assert d["num_layers"] == 24 and d["window_size"] == 128
    r = run_cli("model", "show", str(shared_data / "models" / "hf_deepseek-v2-lite-chat.json"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total_params"] == 15_706_484_224


def test_model_show_human():
    r = run_cli("model", "show", "Mixtral-8x7B")
    assert r.returncode == 0 and "active params" in r.stdout


def test_flops_json():
    r = run_cli("flops", "--model", "DeepSeekV3", "--seq", "4096", "--gbs", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert abs(d["flops_per_token"] / 2.600e11 - 1) < 1e-3
    assert d["flops_per_step"] == d["flops_per_token"] * 2 * 4096
    r = run_cli("flops", "--model", "Qwen3_30B_a3B", "--seq", "4096", "--json")
    assert json.loads(r.stdout)["flops_per_step"] is None


def test_unknown_model_one_line_exit_2():
    r = run_cli("flops", "--model", "Qwen3_30B_a4B", "--seq", "4096", "--json")
    assert r.returncode == 2
    assert r.stdout == ""
    assert "closest" in r.stderr and "Qwen3-30B-A3B" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_bad_hf_config_one_line(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "mixtral", "hidden_size": 64}))
    r = run_cli("model", "show", str(p), "--json")
    assert r.returncode == 2 and "num_hidden_layers" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    p.write_text("{not json")
    r = run_cli("model", "show", str(p))
    assert r.returncode == 2 and "malformed JSON" in r.stderr
    r = run_cli("model", "show", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_bad_seq_exit_2():
    r = run_cli("flops", "--model", "Llama-3-8B", "--seq", "0")
    assert r.returncode == 2 and "seq_length" in r.stderr

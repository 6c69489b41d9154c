"""Hugging Face config.json import."""

from __future__ import annotations

import json

import pytest

from conftest import DATA
from moetune.catalog.hf import model_from_hf_config, model_from_hf_dict
from moetune.catalog.models import get_model
from moetune.errors import InputError
from moetune.perfmodel.params import count_params

PAIRS = {
    "hf_deepseek-v2-lite-chat.json": "DeepSeek-V2-Lite",
    "hf_deepseek-v3.json": "DeepSeek-V3",
    "hf_gpt-oss-120b.json": "GPT-OSS-120B",
    "hf_gpt-oss-20b.json": "GPT-OSS-20B",
    "hf_kimi-k2-instruct.json": "Kimi-K2",
    "hf_llama-4-scout-17b-16e-instruct.json": "Llama-4-Scout",
    "hf_mixtral-8x22b.json": "Mixtral-8x22B",
    "hf_mixtral-8x7b.json": "Mixtral-8x7B",
    "hf_qwen3-235b-a22b.json": "Qwen3-235B-A22B",
    "hf_qwen3-30b-a3b.json": "Qwen3-30B-A3B",
}
ARCH_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size", "mixer_pattern",
               "mlp_pattern", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
               "moe_shared_expert_intermediate_size", "q_lora_rank", "kv_lora_rank", "window_size", "mtp_num_layers")


@pytest.mark.parametrize("fname,name", sorted(PAIRS.items()))
def test_hf_config_equals_catalog(shared_data, fname, name):
    got = model_from_hf_config(shared_data / "models" / fname)
    want = get_model(name)
    for f in ARCH_FIELDS:
        assert getattr(got, f) == getattr(want, f), f
    assert count_params(got).total == count_params(want).total


def test_get_model_accepts_json_path(shared_data):
    m = get_model(str(shared_data / "models" / "hf_deepseek-v2-lite-chat.json"))
    assert count_params(m).total == 15_706_484_224


def test_missing_field_is_named(tmp_path, shared_data):
    data = json.loads((shared_data / "models" / "hf_qwen3-30b-a3b.json").read_text())
    del data["moe_intermediate_size"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    with pytest.raises(InputError, match="moe_intermediate_size"):
        model_from_hf_config(p)


def test_malformed_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"model_type": "llama",')
    with pytest.raises(InputError, match="malformed JSON"):
        model_from_hf_config(p)


def test_unsupported_model_type():
    with pytest.raises(InputError, match="unsupported model_type='bert'"):
        model_from_hf_dict({"model_type": "bert"})


def test_nemotron_h_with_latent_moe_and_mtp():
    pattern = "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME"
    cfg = {"model_type": "nemotron_h", "hidden_size": 4096, "num_hidden_layers": 88, "vocab_size": 131072,
           "hybrid_override_pattern": pattern, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
           "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4,
           "n_routed_experts": 512, "num_experts_per_tok": 22, "moe_intermediate_size": 2688,
           "moe_latent_size": 1024, "moe_shared_expert_intermediate_size": 5376, "intermediate_size": 2688,
           "num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*E", "tie_word_embeddings": False}
    m = model_from_hf_dict(cfg)
    ref = get_model("Nemotron-3-Super")
    assert m.mixer_pattern == ref.mixer_pattern and m.mlp_pattern == ref.mlp_pattern
    # HF stores one shared MTP block; the catalog entry (Bridge recipe) repeats it twice with shared weights
    assert count_params(m).total == count_params(ref).total


def test_llama4_maverick_interleave():
    cfg = {"model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
           "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "intermediate_size": 8192,
           "intermediate_size_mlp": 16384, "num_local_experts": 128, "num_experts_per_tok": 1,
           "interleave_moe_layer_step": 2}
    m = model_from_hf_dict(cfg)
    assert m.mlp_pattern == get_model("Llama-4-Maverick").mlp_pattern == "DE" * 24


def test_decoder_sparse_step_pattern_as_hf_builds_it(shared_data):
    """Qwen3MoeDecoderLayer: MoE iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0."""
    data = json.loads((shared_data / "models" / "hf_qwen3-30b-a3b.json").read_text())
    data.update(num_hidden_layers=8, decoder_sparse_step=2)
    assert model_from_hf_dict(data).mlp_pattern == "DEDEDEDE"
    data.update(mlp_only_layers=[3])
    assert model_from_hf_dict(data).mlp_pattern == "DEDDDEDE"
    data.update(decoder_sparse_step=1, mlp_only_layers=[0, 7])
    assert model_from_hf_dict(data).mlp_pattern == "DEEEEEED"


def test_transformers5_field_names_equal_the_old_ones(shared_data):
    """transformers 5 writes num_local_experts (Qwen3-MoE) and mlp_layer_types; older files num_experts and
    first_k_dense_replace: both give the same model."""
    old = json.loads((shared_data / "models" / "hf_qwen3-30b-a3b.json").read_text())
    new = dict(old)
    new["num_local_experts"] = new.pop("num_experts")
    assert model_from_hf_dict(new) == model_from_hf_dict(old)
    dsv3 = json.loads((shared_data / "models" / "hf_deepseek-v3.json").read_text())
    k = dsv3["first_k_dense_replace"]
    v5 = {key: v for key, v in dsv3.items() if key != "first_k_dense_replace"}
    v5["mlp_layer_types"] = ["dense"] * k + ["sparse"] * (dsv3["num_hidden_layers"] - k)
    assert model_from_hf_dict(v5).mlp_pattern == model_from_hf_dict(dsv3).mlp_pattern == "DDD" + "E" * 58


JAMBA = {"model_type": "jamba", "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
         "num_key_value_heads": 4, "intermediate_size": 2048, "vocab_size": 65536, "num_experts": 16,
         "num_experts_per_tok": 2, "attn_layer_period": 8, "attn_layer_offset": 4, "expert_layer_period": 2,
         "expert_layer_offset": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2}


def test_unpriced_layers_are_named_in_every_estimate(tmp_path, capsys):
    """Jamba's Mamba-1 layers are counted exactly but priced with the Mamba-2 formulas: estimate says so."""
    from moetune.cli import main

    m = model_from_hf_dict(JAMBA)
    assert m.mixer_pattern == "MMMMAMMM" and m.mlp_pattern == "DEDEDEDE" and m.mamba_version == 1
    assert any("Mamba-1" in a and "approximate" in a for a in m.approximations)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(JAMBA))
    with pytest.raises(SystemExit) as exc:
        main(["estimate", "--model", str(p), "--system", "H100-SXM", "--gpus", "8", "--gbs", "16", "--seq", "4096",
              "--json"])
    assert exc.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert any("Mamba-1" in a and "approximate" in a for a in out["assumptions"])
    with pytest.raises(SystemExit) as exc:
        main(["flops", "--model", str(p), "--seq", "4096", "--json"])
    assert exc.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert any("Mamba-1" in a and "approximate" in a for a in out["assumptions"])


def test_standard_attention_models_have_no_approximation_note(shared_data):
    assert model_from_hf_config(shared_data / "models" / "hf_deepseek-v3.json").approximations == ()


def test_router_score_function_from_the_config_or_the_family():
    """``scoring_func`` is read where the config writes it; Llama-4's router is a sigmoid (Llama4TextMoe), so a
    top-1 Llama-4 HF config passes Megatron's top-1 rule (MOE-020 rejects top-1 softmax)."""
    assert model_from_hf_config(DATA / "models" / "hf_deepseek-v3.json").moe_router_score_function == "sigmoid"
    assert model_from_hf_config(DATA / "models" / "hf_deepseek-v2-lite-chat.json").moe_router_score_function == "softmax"
    scout = model_from_hf_config(DATA / "models" / "hf_llama-4-scout-17b-16e-instruct.json")
    assert scout.moe_router_topk == 1 and scout.moe_router_score_function == "sigmoid"
    assert model_from_hf_config(DATA / "models" / "hf_mixtral-8x7b.json").moe_router_score_function == "softmax"

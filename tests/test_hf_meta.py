"""moetune's parameter count of an HF config equals what transformers instantiates.

Every case builds the transformers config class of a MoE / hybrid family (class defaults shrunk to a small width,
or variants that exercise each layer-pattern field), writes it as ``config.json`` would hold it (``to_dict``), reads
that dict with :func:`moetune.catalog.hf.model_from_hf_dict`, and compares :func:`moetune.perfmodel.params.count_params`
(``total_without_mtp``: transformers does not build MTP layers) with ``AutoModelForCausalLM.from_config`` built on
the meta device: its parameters plus the router's ``e_score_correction_bias`` buffers (the aux-loss-free expert
bias, which the checkpoint stores and Megatron keeps as ``expert_bias``; the other buffers are rotary tables and
decay constants, not weights). The vocabulary is a multiple of every Megatron padding
divisor moetune uses (128, 1280, 3200), so Megatron's padding adds nothing.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from moetune.catalog.hf import model_from_hf_dict  # noqa: E402
from moetune.perfmodel.params import count_params  # noqa: E402

VOCAB = 6400  # multiple of 128, 1280 and 3200
#: Small sizes applied to whichever of these fields the family's config class has.
SMALL = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts=8, n_routed_experts=8, num_experts_per_tok=2, moe_topk=2, moe_k=2,
             moe_num_experts=8, shared_expert_intermediate_size=48, shared_intermediate_size=40, kv_lora_rank=16,
             q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, intermediate_size_mlp=80,
             linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
             index_n_heads=4, index_head_dim=16, linear_head_dim=8, linear_num_heads=4, mamba_n_heads=8,
             mamba_d_head=16, mamba_d_state=16, expert_ffn_hidden_size=32, max_position_embeddings=256)
NO_TOKENS = dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)

# (case id, model_type, overrides on top of the shrunk class defaults)
CASES: list[tuple[str, str, dict]] = [
    ("qwen2_moe", "qwen2_moe", {}),
    ("qwen2_moe-step2-mlp_only", "qwen2_moe", dict(num_hidden_layers=8, decoder_sparse_step=2, mlp_only_layers=[5])),
    ("qwen3_moe", "qwen3_moe", {}),
    ("qwen3_moe-step2", "qwen3_moe", dict(num_hidden_layers=8, decoder_sparse_step=2)),
    ("qwen3_moe-step3-mlp_only", "qwen3_moe", dict(num_hidden_layers=9, decoder_sparse_step=3, mlp_only_layers=[2, 4])),
    ("qwen3_moe-attention_bias", "qwen3_moe", dict(num_hidden_layers=4, attention_bias=True)),
    ("qwen3_moe-tied", "qwen3_moe", dict(num_hidden_layers=4, tie_word_embeddings=True)),
    ("qwen3_next", "qwen3_next", {}),
    ("qwen3_next-interval3", "qwen3_next", dict(num_hidden_layers=6, full_attention_interval=3, decoder_sparse_step=2)),
    ("qwen3_5_moe_text", "qwen3_5_moe_text", {}),
    ("mixtral", "mixtral", {}),
    ("deepseek_v2", "deepseek_v2", dict(num_experts_per_tok=2)),
    ("deepseek_v2-lite", "deepseek_v2", dict(num_hidden_layers=6, q_lora_rank=None, first_k_dense_replace=1,
                                             num_experts_per_tok=2, n_shared_experts=2)),
    ("deepseek_v3", "deepseek_v3", {}),
    ("deepseek_v3-k2", "deepseek_v3", dict(num_hidden_layers=5, first_k_dense_replace=2, n_shared_experts=2)),
    ("deepseek_v32", "deepseek_v32", dict(num_hidden_layers=6)),
    ("glm4_moe", "glm4_moe", {}),
    ("glm4_moe-qknorm-bias", "glm4_moe", dict(num_hidden_layers=5, first_k_dense_replace=2, use_qk_norm=True,
                                                attention_bias=True)),
    ("glm4_moe_lite", "glm4_moe_lite", dict(num_hidden_layers=6)),
    ("glm_moe_dsa", "glm_moe_dsa", dict(num_hidden_layers=6)),
    ("llama4_text", "llama4_text", {}),
    ("llama4_text-interleave2", "llama4_text", dict(num_hidden_layers=8, interleave_moe_layer_step=2)),
    ("gpt_oss", "gpt_oss", {}),
    ("olmoe", "olmoe", {}),
    ("flex_olmo", "flex_olmo", {}),
    ("granitemoe", "granitemoe", {}),
    ("granitemoeshared", "granitemoeshared", {}),
    ("granitemoehybrid", "granitemoehybrid", {}),
    ("granitemoehybrid-mixed", "granitemoehybrid", dict(num_hidden_layers=4, layer_types=[
        "mamba", "attention", "mamba", "attention"])),
    ("phimoe", "phimoe", {}),
    ("phimoe-bias", "phimoe", dict(num_hidden_layers=4, attention_bias=True, lm_head_bias=True)),
    ("ernie4_5_moe", "ernie4_5_moe", {}),
    ("ernie4_5_moe-interval2", "ernie4_5_moe", dict(num_hidden_layers=8, moe_layer_interval=2, moe_layer_start_index=2,
                                                     moe_layer_end_index=6, moe_num_shared_experts=0)),
    ("hunyuan_v1_moe", "hunyuan_v1_moe", dict(num_hidden_layers=4, head_dim=16)),
    ("dots1", "dots1", dict(num_hidden_layers=5, n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=1,
                            first_k_dense_replace=1)),
    ("dbrx", "dbrx", dict(d_model=64, n_heads=4, n_layers=4, attn_config=dict(kv_n_heads=2, rope_theta=10000.0),
                          ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2))),
    ("minimax", "minimax", {}),
    ("minimax_m2", "minimax_m2", {}),
    ("kimi_linear", "kimi_linear", {}),
    ("jamba", "jamba", {}),
    ("jamba-period4", "jamba", dict(num_hidden_layers=8, attn_layer_period=4, attn_layer_offset=1,
                                    expert_layer_period=4, expert_layer_offset=3)),
    ("sarvam_mla", "sarvam_mla", dict(num_hidden_layers=4)),
    ("sarvam_moe", "sarvam_moe", dict(num_hidden_layers=4)),
    ("solar_open", "solar_open", dict(num_hidden_layers=4)),
    ("exaone_moe", "exaone_moe", dict(num_hidden_layers=8)),
    ("hy_v3", "hy_v3", dict(num_hidden_layers=4)),
    ("mellum", "mellum", dict(num_hidden_layers=6)),
    ("flint", "flint", dict(num_hidden_layers=6)),
    ("granitemoe_swa", "granitemoe_swa", dict(num_hidden_layers=4)),
    ("afmoe", "afmoe", dict(num_hidden_layers=6, num_dense_layers=2)),
    ("kolibri1", "kolibri1", dict(num_hidden_layers=4)),
    ("cohere2_moe", "cohere2_moe", dict(num_hidden_layers=4)),
    ("cohere2_moe-dense-prefix", "cohere2_moe", dict(num_hidden_layers=5, first_k_dense_replace=2,
                                                     prefix_dense_intermediate_size=80, num_shared_experts=1)),
    ("nemotron_h", "nemotron_h", dict(mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2)),
    ("nemotron_h-pattern", "nemotron_h", dict(hybrid_override_pattern="M-M*ME", mamba_num_heads=8, mamba_head_dim=16,
                                              ssm_state_size=16, n_groups=2, moe_shared_expert_intermediate_size=48)),
]


def _config(model_type: str, over: dict):
    cls = CONFIG_MAPPING[model_type]
    defaults = cls().to_dict()
    kw = {k: v for k, v in SMALL.items() if defaults.get(k) is not None}
    kw.update(vocab_size=VOCAB, **NO_TOKENS)
    kw.update(over)
    return AutoConfig.for_model(model_type, **kw)


def _hf_count(cfg) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    return params + buffers


@pytest.mark.parametrize("case,model_type,over", CASES, ids=[c[0] for c in CASES])
def test_param_count_equals_transformers(case, model_type, over):
    transformers.logging.set_verbosity_error()
    cfg = _config(model_type, over)
    data = cfg.to_dict()
    model = model_from_hf_dict(data, f"{case}/config.json")
    assert count_params(model).total_without_mtp == _hf_count(cfg)


def test_at_least_25_configs_and_every_family():
    from moetune.catalog.hf_families import FAMILIES

    assert len(CASES) >= 25
    tested = {mt for _, mt, _ in CASES}
    untested = set(FAMILIES) - tested - {"llama", "kimi_k2"}  # dense reference / a DeepSeek-V3 alias
    assert not untested, untested


REAL = sorted((Path(__file__).resolve().parents[1] / "data" / "models").glob("hf_*.json"))


@pytest.mark.parametrize("path", REAL, ids=[p.stem for p in REAL])
def test_real_config_equals_transformers(path):
    """The published config.json files in data/models (DeepSeek-V3 671.0 B, Kimi-K2 1.03 T, ...): moetune's count is
    what transformers builds, plus Megatron's vocabulary padding (Llama-4's 202048 is padded to a multiple of 128)."""
    transformers.logging.set_verbosity_error()
    data = json.loads(path.read_text())
    model = model_from_hf_dict(data, path)
    # Kimi-K2 names its own model_type with remote code; its architecture is DeepseekV3ForCausalLM
    mtype = data["model_type"] if data["model_type"] in CONFIG_MAPPING else "deepseek_v3"
    cfg = AutoConfig.for_model(mtype, **{k: v for k, v in data.items() if k not in ("auto_map", "model_type")})
    if hasattr(cfg, "text_config") and mtype == "llama4":
        cfg = cfg.text_config
    pad = (model.padded_vocab_size(1) - model.vocab_size) * model.hidden_size
    pad *= 2 if model.untie_embeddings_and_output_weights else 1
    assert count_params(model).total_without_mtp - pad == _hf_count(cfg)

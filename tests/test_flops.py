"""Model FLOPs (Megatron-Bridge definition) against hand-derived values and the published perf table."""

from __future__ import annotations

import csv

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetune.catalog.models import get_model, list_models
from moetune.errors import InputError
from moetune.perfmodel.flops import (
    MODEL_FLOP_KEYS,
    bridge_definition_for_release,
    flops_per_step,
    flops_per_token,
    is_hybrid_stack,
    layer_flops,
    logits_flops,
    swa_context,
)
from moetune.spec.model import ModelArch


def test_deepseek_v3_matches_bridge_notes():
    """bridge_perf_notes §1: DSV3 at s=4096 is 2.600e11 FLOPs/token (1635 TFLOP/s / 6288 tok/s)."""
    f = flops_per_token(get_model("DeepSeek-V3"), 4096)
    assert f.total == pytest.approx(2.600e11, rel=1e-3)
    assert f.logits == pytest.approx(1.112e10, rel=1e-3)
    assert f.mtp > 0
    assert flops_per_token(get_model("DeepSeekV3 (w/o MTP)"), 4096).total < f.total


def test_dense_llama_closed_form():
    """Llama-3-8B: 6·[L·(2h(q+2kv)/2... )] written out from the Bridge formula by hand."""
    m = get_model("Llama-3-8B")
    h, L, f, q, kv, s, V = 4096, 32, 14336, 4096, 1024, 8192, 128256
    attn = 6 * L * (h * (q + 2 * kv) + q * h + q * s)
    mlp = 6 * L * h * 3 * f
    logits = 6 * h * V
    assert flops_per_token(m, s).total == pytest.approx(attn + mlp + logits, rel=1e-12)


def test_mla_without_q_lora():
    m = get_model("DeepSeek-V2-Lite")
    h, n, s = 2048, 16, 4096
    q = h * n * 192
    kv = 512 * (h + n * 256 + 1) + h * 64
    o = n * 128 * h
    lf = layer_flops(m, 0, s)
    assert lf["attention_proj"] == 2 * (q + kv + o)
    assert lf["core_attention"] == s * n * (192 + 128)


def test_sliding_window_context_and_layers():
    m = get_model("GPT-OSS-120B")
    s = 4096
    w = 129
    assert swa_context(m, s) == pytest.approx(w - w * (w - 1) / (2 * s))
    q = 64 * 64
    assert layer_flops(m, 0, s)["core_attention"] == pytest.approx(2 * q * 2 * swa_context(m, s))
    assert layer_flops(m, 1, s)["core_attention"] == pytest.approx(2 * q * s)
    # legacy Bridge definition: windows ignored, GLU factor 2 for the non-SiLU clamped GLU
    legacy = layer_flops(m, 0, s, definition="legacy")
    assert legacy["core_attention"] == 2 * q * s
    assert legacy["routed_experts"] == pytest.approx(layer_flops(m, 0, s)["routed_experts"] * 2 / 3)


def test_gdn_and_output_gate():
    m = get_model("Qwen3-Next-80B-A3B")
    h = 2048
    gdn = layer_flops(m, 0, 4096)
    qk, v, nv = 128 * 16, 128 * 32, 32
    assert gdn["mixer"] == 2 * (h * (2 * qk + 2 * v + 2 * nv) + 4 * (2 * qk + v) + h * v)
    assert gdn["mixer_core"] == 2 * 4 * nv * 128**2
    full = layer_flops(m, 3, 4096)
    q, kv = 16 * 256, 2 * 256
    assert full["attention_proj"] == 2 * (h * (2 * q + 2 * kv) + q * h)


def test_hybrid_mamba_and_latent_moe():
    m = get_model("Nemotron-3-Super")
    assert is_hybrid_stack(m)
    h = 4096
    mamba = layer_flops(m, 0, 8192)
    d = 2 * h  # Bridge uses d_in = 2h
    assert mamba["mixer"] == 2 * h * (2 * d + 2 * 8 * 128 + 128) + 2 * d * h
    assert mamba["mixer_core"] == 7 * d * 128
    moe = layer_flops(m, 1, 8192)
    assert moe["routed_experts"] == 2 * 1024 * 2 * 2688 * 22
    assert moe["moe_latent_proj"] == 4 * h * 1024
    assert moe["shared_experts"] == 2 * h * 2 * 5376
    # hybrid path: MTP depths cost their pattern layers but no eh_proj term; logits x (1 + depth)
    f = flops_per_token(m, 8192)
    assert f.logits == 3 * logits_flops(m) == 3 * 2 * h * 131072 * 3


def test_vocab_padding_with_tp():
    m = get_model("Llama-3-70B")
    assert m.padded_vocab_size(4) == 128512
    assert flops_per_token(m, 8192, tp=4).total > flops_per_token(m, 8192, tp=1).total


def test_router_not_in_model_flops():
    m = get_model("Qwen3-30B-A3B")
    f = flops_per_token(m, 4096)
    parts = f.attention_proj + f.core_attention + f.mixer + f.mixer_core + f.dense_mlp + f.routed_experts
    parts += f.moe_latent_proj + f.shared_experts + f.mtp + f.logits
    assert f.total == pytest.approx(parts)
    assert layer_flops(m, 0, 4096)["router"] == 2 * 2048 * 128
    per_layer = sum(sum(layer_flops(m, i, 4096)[k] for k in MODEL_FLOP_KEYS) for i in range(m.num_layers))
    assert f.total == pytest.approx(3 * per_layer + f.logits)


def test_release_definition():
    assert bridge_definition_for_release("26.04.01") == "legacy"
    assert bridge_definition_for_release("25.09") == "legacy"
    assert bridge_definition_for_release("26.06") == "current"
    with pytest.raises(InputError):
        bridge_definition_for_release("latest")


def test_bad_inputs():
    m = get_model("Qwen3-30B-A3B")
    with pytest.raises(InputError):
        flops_per_token(m, 0)
    with pytest.raises(InputError):
        flops_per_step(m, 4096, -1)
    with pytest.raises(InputError):
        flops_per_token(m, 4096, definition="nope")


def test_published_table_rows(shared_data):
    """Every current-definition pretrain row of the calibration table for the anchor models is within 1.5 %."""
    checked = 0
    with open(shared_data / "perf" / "mbridge_perf_calibration.csv") as f:
        for r in csv.DictReader(f):
            if r["task"] != "pretrain" or r["model"] not in ("DeepSeekV3", "Qwen3_30B_a3B", "GPT OSS 120B",
                                                            "Nemotron_3_Nano", "Nemotron_3_Super"):
                continue
            try:
                tok, tfl = float(r["tokens_per_sec_per_gpu"]), float(r["model_tflops_per_gpu"])
            except ValueError:
                continue
            d = bridge_definition_for_release(r["release"])
            ours = flops_per_token(get_model(r["model"]), int(r["seq_len"]), int(r["tp"] or 1), d).total
            assert ours == pytest.approx(tfl * 1e12 / tok, rel=0.015), r
            checked += 1
    assert checked > 50


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([m.name for m in list_models()]), st.integers(64, 65536), st.integers(1, 64))
def test_step_flops_scale_linearly(name, seq, gbs):
    m = get_model(name)
    per_tok = flops_per_token(m, seq).total
    assert per_tok > 0
    assert flops_per_step(m, seq, gbs) == pytest.approx(per_tok * seq * gbs)
    # longer sequences never cost less per token (core attention grows with s)
    assert flops_per_token(m, seq * 2).total >= per_tok


def test_mtp_layer_copies_last_layer_type():
    kw = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, vocab_size=1000,
              mixer_pattern="AA", mlp_pattern="DD")
    base = ModelArch(name="b", **kw)
    mtp = ModelArch(name="m", mtp_num_layers=1, **kw)
    diff = flops_per_token(mtp, 128).total - flops_per_token(base, 128).total
    layer = sum(layer_flops(base, 1, 128)[k] for k in MODEL_FLOP_KEYS)
    h = 64
    assert diff == pytest.approx(3 * (layer + 2 * (3 * h + 2 * h * h)) + 3 * 2 * h * 1024)

"""Per-layer activation components on small hand-checkable configs (perfmodel/activations.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetune.perfmodel import activations as act
from moetune.spec.model import ModelArch

H, HEADS, F, S, B = 64, 4, 128, 16, 2  # T = s*b = 32 tokens


def _dense() -> ModelArch:
    return ModelArch(name="tiny", num_layers=2, hidden_size=H, ffn_hidden_size=F, num_attention_heads=HEADS,
                     vocab_size=1000, mixer_pattern="AA", mlp_pattern="DD")


def _moe(shared: int | None = None) -> ModelArch:
    return ModelArch(name="tiny-moe", num_layers=2, hidden_size=H, ffn_hidden_size=F, num_attention_heads=HEADS,
                     vocab_size=1000, mixer_pattern="AA", mlp_pattern="DE", num_moe_experts=8, moe_router_topk=2,
                     moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=shared)


def _mla() -> ModelArch:
    return ModelArch(name="tiny-mla", num_layers=1, hidden_size=H, ffn_hidden_size=F, num_attention_heads=HEADS,
                     vocab_size=1000, mixer_pattern="A", mlp_pattern="D", multi_latent_attention=True, q_lora_rank=24,
                     kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8)


def cfg(**kw) -> act.ActConfig:
    base = dict(seq=S, mbs=B, tp=1, cp=1, etp=1, sp=False, fp8=False, unfused_attention=False,
                attention_dropout=False, hidden_dropout=False, routing_factor=1.0)
    base.update(kw)
    return act.ActConfig(**base)


def comps(model, mixer, mlp, c) -> dict[str, float]:
    return dict(act.layer_components(model, mixer, mlp, c))


def test_dense_layer_by_hand():
    c = comps(_dense(), "A", "D", cfg())
    t = S * B
    assert c["attn_norm_in"] == 2 * H * t
    assert c["attn_norm_out"] == 2 * H * t
    assert c["attn_qkv"] == 2 * (64 + 2 * 64) * t  # q = 4 heads x 16, MHA kv = q
    assert c["core_attn"] == 4 * HEADS * t  # FP32 LSE per head
    assert c["attn_proj_in"] == 2 * 64 * t
    assert c["mlp"] == 2 * 2 * F * t + 2 * F * t  # GLU FC1 out (2f) + activation out (f)
    assert "attn_dropout_mask" not in c


def test_unfused_attention_keeps_scores():
    t = S * B
    assert comps(_dense(), "A", "D", cfg(unfused_attention=True))["core_attn"] == 2 * HEADS * S * t
    # Korthikanti 5*a*s^2*b with attention dropout (softmax 2 + mask 1 + dropout output 2 bytes)
    assert comps(_dense(), "A", "D", cfg(unfused_attention=True, attention_dropout=True))["core_attn"] == \
        5 * HEADS * S * t


def test_hidden_dropout_masks():
    c = comps(_dense(), "A", "D", cfg(hidden_dropout=True))
    assert c["attn_dropout_mask"] == H * S * B and c["mlp_dropout_mask"] == H * S * B


def test_tp_with_sequence_parallel_divides_everything():
    full = act.layer_bytes(_dense(), "A", "D", cfg())
    assert act.layer_bytes(_dense(), "A", "D", cfg(tp=2, sp=True)) == pytest.approx(full / 2)
    # without SP the norm regions are replicated on every TP rank
    no_sp = comps(_dense(), "A", "D", cfg(tp=2, sp=False))
    assert no_sp["attn_norm_in"] == 2 * H * S * B
    assert no_sp["attn_qkv"] == 2 * (64 + 2 * 64) * S * B / 2


def test_cp_divides_tokens():
    assert act.layer_bytes(_dense(), "A", "D", cfg(cp=2)) == pytest.approx(
        act.layer_bytes(_dense(), "A", "D", cfg()) / 2)


def test_moe_layer_by_hand():
    c = comps(_moe(shared=64), "A", "E", cfg(routing_factor=1.5))
    t = S * B
    copies = 2 * t * 1.5  # k * T * rho
    assert c["router"] == 9 * 8 * t
    assert c["moe_dispatched"] == 2 * H * copies
    assert c["moe_fc1_out"] == 2 * 2 * 32 * copies + 4 * copies
    assert c["moe_act"] == 2 * 32 * copies
    assert c["shared_experts"] == 2 * 2 * 64 * t + 2 * 64 * t


def test_expert_tp_gathers_tokens_and_splits_width():
    one = comps(_moe(), "A", "E", cfg())
    two = comps(_moe(), "A", "E", cfg(etp=2))
    assert two["moe_dispatched"] == 2 * one["moe_dispatched"]
    assert two["moe_act"] == one["moe_act"]  # 2x tokens, half width


def test_mla_components():
    c = comps(_mla(), "A", "D", cfg())
    t = S * B
    assert c["mla_up_proj"] == 2 * HEADS * (2 * (8 + 4) + 8) * t
    assert c["attn_qkv"] == 2 * (24 + 16 + 4) * t + 2 * (24 + 16) * t + 2 * 4 * t
    assert c["attn_proj_in"] == 2 * HEADS * 8 * t
    assert "mla_up_proj" not in comps(_mla(), "A", "D", cfg(recompute=frozenset({"mla_up_proj"})))


def test_fp8_halves_linear_inputs_only():
    bf, f8 = comps(_moe(), "A", "E", cfg()), comps(_moe(), "A", "E", cfg(fp8=True))
    assert f8["moe_dispatched"] == bf["moe_dispatched"] / 2
    assert f8["attn_norm_out"] == bf["attn_norm_out"] / 2
    assert f8["attn_norm_in"] == bf["attn_norm_in"]
    assert f8["moe_fc1_out"] == bf["moe_fc1_out"]


def test_selective_recompute_targets():
    c = comps(_moe(shared=64), "A", "E", cfg(recompute=frozenset({"moe"})))
    assert not {"router", "moe_dispatched", "moe_fc1_out", "moe_act", "shared_experts"} & set(c)
    c = comps(_dense(), "A", "D", cfg(recompute=frozenset({"layernorm", "mlp"})))
    assert "attn_norm_out" not in c and "mlp_norm_out" not in c and "mlp" not in c
    assert "attn_norm_in" in c


def test_offload_moves_components_to_host():
    c = cfg(offload=frozenset({"expert_fc1", "moe_act"}))
    kept = comps(_moe(), "A", "E", c)
    assert "moe_dispatched" not in kept and "moe_fc1_out" not in kept
    assert act.layer_offloaded_bytes(_moe(), "A", "E", c) == pytest.approx(
        act.layer_bytes(_moe(), "A", "E", cfg()) - act.layer_bytes(_moe(), "A", "E", c))


def test_loss_stage_fp32_softmax():
    saved, transient = act.loss_stage_bytes(_dense(), cfg(tp=2, sp=True), padded_vocab=1024)
    t = S * B
    assert transient == 2 * (1024 / 2) * t
    assert saved == pytest.approx(2 * H * (t / 2) * 2 + 4 * (1024 / 2) * t + 28 * t)


@settings(max_examples=60, deadline=None)
@given(st.sets(st.sampled_from(act.RECOMPUTE_MODULES)), st.sets(st.sampled_from(act.RECOMPUTE_MODULES)),
       st.booleans(), st.sampled_from(["D", "E"]))
def test_more_recompute_never_raises_activations(a, b, unfused, mlp):
    model = _moe(shared=64)
    small = cfg(recompute=frozenset(a), unfused_attention=unfused)
    big = cfg(recompute=frozenset(a | b), unfused_attention=unfused)
    assert act.layer_bytes(model, "A", mlp, big) <= act.layer_bytes(model, "A", mlp, small)


def test_allgather_dispatcher_gathers_whole_group_transiently():
    a2a = act.layer_transient_bytes(_moe(), "A", "E", cfg(ep=64))
    ag = act.layer_transient_bytes(_moe(), "A", "E", cfg(ep=64, allgather_dispatcher=True))
    t = S * B
    assert ag == pytest.approx(t * 64 * (2 * H + 5 * 8))
    assert ag > a2a


def test_te_cross_entropy_keeps_bf16_logits_only():
    native_saved, native_tr = act.loss_stage_bytes(_dense(), cfg(), padded_vocab=1024)
    te_saved, te_tr = act.loss_stage_bytes(_dense(), cfg(te_cross_entropy=True), padded_vocab=1024)
    assert native_saved - te_saved == pytest.approx((4 - 2) * 1024 * S * B)
    assert te_tr == 0 and native_tr == 2 * 1024 * S * B

"""ModelArch <-> the architecture fields of a Megatron-Core / Bridge model config (``model.*`` of a ConfigContainer).

Pure mapping on the spec types, shared by the recipe catalog (a recipe's provider architecture), the launch output
and the config reader (:mod:`moetune.io.config_to_job`).
"""

from __future__ import annotations

from typing import Any

from moetune.spec.model import ModelArch

#: ``hybrid_layer_pattern`` symbol -> (mixer, MLP) of ModelArch's ``mixer_pattern`` / ``mlp_pattern``: ``M`` Mamba,
#: ``*`` attention, ``E`` MoE, ``-`` MLP as in ``megatron/core/ssm/mamba_hybrid_layer_allocation.py``; ``G`` a
#: gated-delta-net mixer
HYBRID_LAYER_SYMBOLS = {"M": ("M", "_"), "*": ("A", "_"), "E": ("_", "E"), "-": ("_", "D"), "G": ("G", "_")}


def arch_to_model_fields(arch: ModelArch) -> dict:
    """The ``model.*`` fields of a ConfigContainer (Megatron-Core ``TransformerConfig`` / Bridge ``GPTModelProvider``
    names) that describe ``arch``; inverse of :func:`moetune.io.config_to_job.arch_from_model_fields`."""
    f: dict[str, Any] = {
        "num_layers": arch.num_layers, "hidden_size": arch.hidden_size, "ffn_hidden_size": arch.ffn_hidden_size,
        "num_attention_heads": arch.num_attention_heads, "num_query_groups": arch.num_query_groups,
        "kv_channels": arch.kv_channels, "vocab_size": arch.vocab_size,
        "make_vocab_size_divisible_by": arch.make_vocab_size_divisible_by,
        "share_embeddings_and_output_weights": not arch.untie_embeddings_and_output_weights,
        "gated_linear_unit": arch.gated_linear_unit, "normalization": arch.normalization,
        "qk_layernorm": arch.qk_layernorm, "add_bias_linear": arch.add_bias_linear, "add_qkv_bias": arch.add_qkv_bias,
        "activation_func": {"swiglu": "silu", "swiglu_clamped": "silu", "geglu": "gelu"}.get(arch.activation,
                                                                                              arch.activation),
    }
    hybrid = any(c not in "AW" for c in arch.mixer_pattern) or "_" in arch.mlp_pattern
    if hybrid:
        inv = {v: k for k, v in HYBRID_LAYER_SYMBOLS.items()}
        f["hybrid_layer_pattern"] = "".join(inv.get((a, b), "*") for a, b in zip(arch.mixer_pattern, arch.mlp_pattern,
                                                                                  strict=True))
        f["is_hybrid_model"] = True
    if arch.multi_latent_attention:
        f.update(multi_latent_attention=True, q_lora_rank=arch.q_lora_rank, kv_lora_rank=arch.kv_lora_rank,
                 qk_head_dim=arch.qk_head_dim, qk_pos_emb_head_dim=arch.qk_pos_emb_head_dim,
                 v_head_dim=arch.v_head_dim)
    if arch.is_moe:
        f.update(num_moe_experts=arch.num_moe_experts, moe_router_topk=arch.moe_router_topk,
                 moe_ffn_hidden_size=arch.moe_ffn_hidden_size,
                 moe_shared_expert_intermediate_size=arch.moe_shared_expert_intermediate_size,
                 moe_router_num_groups=arch.moe_router_num_groups, moe_router_group_topk=arch.moe_router_group_topk,
                 moe_latent_size=arch.moe_latent_size)
        if arch.moe_router_score_function != "softmax":
            f["moe_router_score_function"] = arch.moe_router_score_function
        if not hybrid:
            flags = [1 if c == "E" else 0 for c in arch.mlp_pattern]
            f["moe_layer_freq"] = 1 if all(flags) else flags
    if arch.mtp_num_layers:
        f["mtp_num_layers"] = arch.mtp_num_layers
    for k in ("mamba_state_dim", "mamba_head_dim", "mamba_num_heads", "mamba_num_groups", "linear_num_key_heads",
              "linear_num_value_heads"):
        if getattr(arch, k) is not None:
            f[k] = getattr(arch, k)
    return {k: v for k, v in f.items() if v is not None}

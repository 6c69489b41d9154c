"""Model architecture: what Megatron-Core builds, in Megatron-Core / Bridge field names.

Layers are described by two parallel per-layer strings so that dense, MoE, interleaved (Llama-4),
first-k-dense (DeepSeek), sliding-window (GPT-OSS) and hybrid Mamba / gated-DeltaNet (Nemotron-H,
Qwen3-Next) models share one representation:

* ``mixer_pattern[i]`` — the token mixer of decoder layer *i*:
  ``A`` full (causal) self-attention (GQA/MHA, or MLA when ``multi_latent_attention``),
  ``W`` sliding-window attention (window ``window_size``), ``M`` Mamba-2 block, ``G`` gated DeltaNet
  (linear attention; ``linear_attention_kind`` names the variant: gated DeltaNet, MiniMax lightning attention,
  Kimi delta attention), ``_`` none (an MLP-only layer of a hybrid model). ``M`` is Mamba-1 when
  ``mamba_version`` is 1 (Jamba).
* ``mlp_pattern[i]`` — the channel mixer of decoder layer *i*: ``D`` dense MLP (width ``ffn_hidden_size``),
  ``E`` MoE (``num_moe_experts`` routed experts of width ``moe_ffn_hidden_size``, top ``moe_router_topk``, plus
  shared experts of total width ``moe_shared_expert_intermediate_size``), ``_`` none (a mixer-only layer).

``num_layers`` counts decoder layers (Megatron's ``--num-layers``; for hybrid models one per pattern char, as
Megatron's ``hybrid_override_pattern``); MTP layers are extra (``mtp_num_layers``) and copy the last layer's type.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from moetune.spec.base import FrozenSpec

MIXERS = {"A": "attention", "W": "sliding_window_attention", "M": "mamba", "G": "gated_deltanet", "_": "none"}
MLPS = {"D": "dense", "E": "moe", "_": "none"}


class ModelArch(FrozenSpec):
    """A decoder-only (MoE) transformer as Megatron-Core builds it. Field names follow ``TransformerConfig``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Catalog name, e.g. 'DeepSeek-V3'.")
    aliases: tuple[str, ...] = Field(default=(), description="Other accepted spellings (case-insensitive).")
    family: str = Field(default="gpt", description="Architecture family: deepseek, qwen3_moe, mixtral, gpt_oss, ...")
    hf_id: str | None = Field(default=None, description="Hugging Face repository id, when there is one.")
    source: str | None = Field(default=None, description="Where the numbers come from (HF config, Bridge provider).")

    # --- trunk -------------------------------------------------------------------------------------------
    num_layers: int = Field(gt=0, description="Decoder layers (--num-layers), MTP excluded.")
    hidden_size: int = Field(gt=0, description="h (--hidden-size).")
    ffn_hidden_size: int = Field(ge=0, description="Dense MLP width f (--ffn-hidden-size); 0 when no dense MLP.")
    num_attention_heads: int = Field(gt=0, description="Query heads a (--num-attention-heads).")
    num_query_groups: int | None = Field(default=None, description="KV heads for GQA (--num-query-groups); None = MHA.")
    kv_channels: int | None = Field(default=None, description="Head dim (--kv-channels); None = h / heads.")
    vocab_size: int = Field(gt=0, description="Tokenizer vocabulary before padding.")
    make_vocab_size_divisible_by: int = Field(default=128, description="Megatron pads V to a multiple of this x TP.")
    untie_embeddings_and_output_weights: bool = Field(default=True, description="False = tied input/output embedding.")
    gated_linear_unit: bool = Field(default=True, description="SwiGLU/GeGLU MLPs (FC1 is 2 x width).")
    activation: Literal["swiglu", "geglu", "gelu", "relu", "squared_relu", "swiglu_clamped"] = "swiglu"
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    qk_layernorm: bool = Field(default=False, description="Per-head RMSNorm on Q and K (Qwen3, OLMoE).")
    add_bias_linear: bool = Field(default=False, description="Biases on all linear layers (GPT-OSS).")
    add_qkv_bias: bool = Field(default=False, description="Bias on the QKV projection only (Qwen2).")
    add_proj_bias: bool = Field(
        default=False, description="Bias on the attention output projection (HF attention_bias with add_qkv_bias)."
    )
    post_sublayer_norms: bool = Field(
        default=False, description="Extra norms on the attention and MLP outputs (sandwich norm: AFMoE, Kolibri;"
        " Megatron post_self_attn_layernorm / post_mlp_layernorm)."
    )
    parallel_attention_mlp: bool = Field(
        default=False, description="Attention and MLP read one shared input norm in parallel (Cohere2-MoE)."
    )
    output_layer_bias: bool = Field(default=False, description="Bias on the output layer (Phi-3.5-MoE lm_head_bias).")
    softmax_sinks: bool = Field(default=False, description="Learned attention sinks, one scalar per head (GPT-OSS).")
    qk_layernorm_full_width: bool = Field(
        default=False, description="Q/K norms span all heads (OLMoE: q_norm over h, k_norm over groups x head dim)."
    )
    attention_output_gate: bool = Field(
        default=False, description="Gated attention: Q projection also yields a sigmoid output gate (Qwen3-Next)."
    )

    # --- per-layer pattern --------------------------------------------------------------------------------
    mixer_pattern: str = Field(description="One char per decoder layer: A, W, M, G, _ (see module doc).")
    mlp_pattern: str = Field(description="One char per decoder layer: D, E, _ (see module doc).")
    window_size: int | None = Field(default=None, description="Sliding-window size in tokens for 'W' layers.")

    # --- MLA (DeepSeek-V2/V3, Kimi-K2, Moonlight) ------------------------------------------------------------
    multi_latent_attention: bool = False
    q_lora_rank: int | None = Field(default=None, description="Query low-rank dim r_q; None = full-rank Q (V2-Lite).")
    kv_lora_rank: int | None = Field(default=None, description="KV latent dim r_kv.")
    qk_head_dim: int | None = Field(default=None, description="Non-rotary Q/K head dim (qk_nope_head_dim).")
    qk_pos_emb_head_dim: int | None = Field(default=None, description="Rotary Q/K head dim (qk_rope_head_dim).")
    v_head_dim: int | None = Field(default=None, description="Value head dim.")

    # --- MoE --------------------------------------------------------------------------------------------
    num_moe_experts: int | None = Field(default=None, description="Routed experts E (--num-experts).")
    moe_router_topk: int = Field(default=2, description="Experts per token k.")
    moe_ffn_hidden_size: int | None = Field(default=None, description="Per-expert width f_moe.")
    moe_shared_expert_intermediate_size: int | None = Field(
        default=None, description="Total width of the shared expert(s) f_sh (num_shared x width)."
    )
    moe_shared_expert_gate: bool = Field(default=False, description="Sigmoid gate on the shared expert (Qwen2/3-Next).")
    moe_router_num_groups: int | None = Field(default=None, description="Device-limited routing groups (DSV3: 8).")
    moe_router_group_topk: int | None = Field(default=None, description="Groups kept per token (DSV3: 4).")
    moe_router_enable_expert_bias: bool = Field(
        default=False, description="Aux-loss-free expert bias, one per expert (DSV3 e_score_correction_bias)."
    )
    moe_latent_size: int | None = Field(default=None, description="Latent MoE: experts run at this width (Nemotron).")
    moe_router_score_function: Literal["softmax", "sigmoid", "sqrtsoftplus"] = Field(
        default="softmax", description="Router scoring (--moe-router-score-function; Llama-4: sigmoid, Bridge "
                                       "Llama4ModelProvider). Top-1 softmax routing needs pre-softmax (MOE-020).")

    # --- hybrid mixers ----------------------------------------------------------------------------------
    mamba_state_dim: int | None = None
    mamba_head_dim: int | None = None
    mamba_num_heads: int | None = None
    mamba_num_groups: int | None = None
    mamba_d_conv: int = 4
    linear_key_head_dim: int | None = Field(default=None, description="Gated DeltaNet key head dim.")
    linear_value_head_dim: int | None = Field(default=None, description="Gated DeltaNet value head dim.")
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_conv_kernel_dim: int = 4
    linear_attention_kind: Literal["gated_deltanet", "lightning", "kda"] = Field(
        default="gated_deltanet", description="Variant of the 'G' mixer: gated DeltaNet (Qwen3-Next), lightning "
        "attention (MiniMax-Text-01), Kimi delta attention (Kimi-Linear)."
    )
    mamba_version: Literal[1, 2] = Field(default=2, description="Mamba-2 (SSD, Megatron MambaMixer) or Mamba-1 (Jamba).")
    mamba_dt_rank: int | None = Field(default=None, description="Mamba-1 dt projection rank.")
    mamba_inner_layernorms: bool = Field(default=False, description="Mamba-1 RMSNorms on dt, B and C (Jamba).")
    mamba_conv_bias: bool = Field(default=True, description="Bias on the Mamba conv1d.")
    mamba_proj_bias: bool = Field(default=False, description="Biases on the Mamba in/out projections.")
    dsa_indexer_n_heads: int | None = Field(
        default=None, description="DeepSeek sparse attention lightning-indexer heads (DeepSeek-V3.2, GLM-5)."
    )
    dsa_indexer_head_dim: int | None = Field(default=None, description="DSA indexer head dim.")

    # --- MTP --------------------------------------------------------------------------------------------
    mtp_num_layers: int = Field(default=0, ge=0, description="Multi-token-prediction depth (DSV3: 1).")
    mtp_mixer_pattern: str | None = Field(
        default=None, description="Mixer chars of the layers inside one MTP block (hybrid models, e.g. 'A_');"
        " None = one layer of the last decoder layer's type."
    )
    mtp_mlp_pattern: str | None = Field(default=None, description="MLP chars of one MTP block (e.g. '_E').")
    mtp_use_repeated_layer: bool = Field(
        default=False, description="All MTP depths share one block's weights (Bridge mtp_use_repeated_layer)."
    )

    approximations: tuple[str, ...] = Field(
        default=(), description="What the memory / time models price approximately for this model (layers read"
        " and counted exactly but priced with a stand-in formula); listed in every estimate's assumptions."
    )

    # --- published reference numbers (for checks, never used in formulas) ----------------------------------
    published_total_params: int | None = Field(default=None, description="Published total parameter count.")
    published_active_params: int | None = Field(default=None, description="Published active parameters per token.")

    @model_validator(mode="after")
    def _check(self) -> ModelArch:
        # pydantic re-runs this validator whenever the instance is passed as a field value (every Job); the
        # instance is frozen, so one successful check is enough (the mark is not a field and copies drop it)
        if self.__dict__.get("_moetune_checked"):
            return self
        if len(self.mixer_pattern) != self.num_layers or len(self.mlp_pattern) != self.num_layers:
            raise ValueError(
                f"{self.name}: mixer_pattern/mlp_pattern length ({len(self.mixer_pattern)}/{len(self.mlp_pattern)})"
                f" must equal num_layers={self.num_layers}"
            )
        bad = set(self.mixer_pattern) - set(MIXERS)
        if bad:
            raise ValueError(f"{self.name}: mixer_pattern has unknown chars {sorted(bad)}; expected {sorted(MIXERS)}")
        bad = set(self.mlp_pattern) - set(MLPS)
        if bad:
            raise ValueError(f"{self.name}: mlp_pattern has unknown chars {sorted(bad)}; expected {sorted(MLPS)}")
        if "E" in self.mlp_pattern and not (self.num_moe_experts and self.moe_ffn_hidden_size):
            raise ValueError(f"{self.name}: MoE layers need num_moe_experts and moe_ffn_hidden_size")
        if "E" in self.mlp_pattern and not 1 <= self.moe_router_topk <= self.num_moe_experts:
            raise ValueError(f"{self.name}: moe_router_topk={self.moe_router_topk}: expected 1 to num_moe_experts="
                             f"{self.num_moe_experts}")
        if self.multi_latent_attention and not (self.kv_lora_rank and self.qk_head_dim and self.v_head_dim):
            raise ValueError(f"{self.name}: MLA needs kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim")
        self._check_sizes()
        self.__dict__["_moetune_checked"] = True
        return self

    def _check_sizes(self) -> None:
        """Impossible sizes Megatron-Core would reject or divide by: every optional width / count positive,
        top-k within the experts (``TransformerConfig.__post_init__``: ``moe_router_topk`` <= ``num_moe_experts``),
        group-limited routing within the groups, shared-expert width non-negative."""
        for f in ("num_query_groups", "kv_channels", "num_moe_experts", "moe_ffn_hidden_size", "window_size",
                  "moe_router_num_groups", "moe_router_group_topk", "moe_latent_size", "q_lora_rank", "kv_lora_rank",
                  "qk_head_dim", "v_head_dim", "linear_key_head_dim", "linear_value_head_dim",
                  "make_vocab_size_divisible_by"):
            v = getattr(self, f, None)
            if v is not None and v < 1:
                raise ValueError(f"{self.name}: {f}={v}: expected a positive integer")
        for f in ("moe_shared_expert_intermediate_size", "qk_pos_emb_head_dim"):
            v = getattr(self, f, None)
            if v is not None and v < 0:
                raise ValueError(f"{self.name}: {f}={v}: expected a non-negative integer")
        if self.moe_router_topk < 1:
            raise ValueError(f"{self.name}: moe_router_topk={self.moe_router_topk}: expected a positive integer")
        if self.num_moe_experts and self.moe_router_topk > self.num_moe_experts:
            raise ValueError(f"{self.name}: moe_router_topk={self.moe_router_topk}: expected at most "
                             f"num_moe_experts={self.num_moe_experts} (a token cannot use more experts than exist)")
        if self.num_query_groups and self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"{self.name}: num_query_groups={self.num_query_groups}: expected a divisor of "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.moe_router_group_topk and self.moe_router_num_groups and \
                self.moe_router_group_topk > self.moe_router_num_groups:
            raise ValueError(f"{self.name}: moe_router_group_topk={self.moe_router_group_topk}: expected at most "
                             f"moe_router_num_groups={self.moe_router_num_groups}")

    # --- derived ----------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return "E" in self.mlp_pattern

    @property
    def query_groups(self) -> int:
        """KV heads (= attention heads for MHA)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @cached_property
    def num_moe_layers(self) -> int:
        return self.mlp_pattern.count("E")

    @cached_property
    def num_dense_mlp_layers(self) -> int:
        return self.mlp_pattern.count("D")

    @cached_property
    def num_attention_layers(self) -> int:
        return self.mixer_pattern.count("A") + self.mixer_pattern.count("W")

    def padded_vocab_size(self, tp: int = 1) -> int:
        """Vocab padded as Megatron does (``_vocab_size_with_padding``): multiple of divisible_by x TP."""
        m = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // m) * m

    def layer_types(self) -> list[tuple[str, str]]:
        """[(mixer, mlp)] per decoder layer, as names (see MIXERS / MLPS)."""
        return [(MIXERS[a], MLPS[b]) for a, b in zip(self.mixer_pattern, self.mlp_pattern, strict=True)]


def uniform_pattern(num_layers: int, *, first_k_dense: int = 0, moe_layer_freq: int | list[int] = 1,
                    moe: bool = True, mixer: str = "A") -> tuple[str, str]:
    """(mixer_pattern, mlp_pattern) for a standard transformer.

    ``first_k_dense`` leading dense layers (DeepSeek ``first_k_dense_replace``); ``moe_layer_freq`` as Megatron's
    ``--moe-layer-freq``: an int N puts MoE on every N-th layer (layer i is MoE iff i % N == 0), or an explicit
    0/1 list.
    """
    if not moe:
        return mixer * num_layers, "D" * num_layers
    if isinstance(moe_layer_freq, int):
        flags = [1 if i % moe_layer_freq == 0 else 0 for i in range(num_layers)]
    else:
        if len(moe_layer_freq) != num_layers:
            raise ValueError(f"moe_layer_freq list has {len(moe_layer_freq)} entries, expected {num_layers}")
        flags = list(moe_layer_freq)
    for i in range(min(first_k_dense, num_layers)):
        flags[i] = 0
    return mixer * num_layers, "".join("E" if f else "D" for f in flags)

"""Model FLOPs exactly as Megatron-Bridge defines them for "model TFLOP/s/GPU".

Source: Megatron-Bridge ``src/megatron/bridge/training/utils/flop_utils.py::num_floating_point_operations``
(HEAD 067f987df0): ``transformer_flops`` for GPT/MoE/MLA/GDN models and ``hybrid_flops`` for Megatron hybrid
stacks (Nemotron-H / Nemotron-3, one mixer *or* one MLP per layer). Both count GEMM FLOPs at 2 per multiply-add,
forward + 2x backward (factor 3), with fixed-length sequences (core factor c = s). Summary in
``docs/bridge_perf_notes.md`` §1.

Per token and layer, *forward*, with h hidden, g = 3 (GLU) or 2, s sequence length:

* GQA/MHA projections 2·[h·(q + 2kv + q·[output gate]) + q·h], q = kv_ch·heads, kv = kv_ch·groups;
  core attention 2·q·s (QKᵀ and AV, 2·q·s each, times the causal ½); sliding-window layers 2·q·2·C_swa with
  C_swa = W − W(W−1)/(2s) for W = window + 1 < s, else s/2.
* MLA projections 2·[q_term + kv_term + n·d_v·h] with q_term = r_q·(h + n·d_qk + 1) (or h·n·d_qk without q-LoRA),
  kv_term = r_kv·(h + n·(d_nope + d_v) + 1) + h·d_rope; core s·n·(d_qk + d_v).
* Gated DeltaNet 2·[h·(2qk + 2v + 2n_v) + K·(2qk + v) + 4·n_v·d_v² + h·v] (projections + conv, then recurrence).
* Mamba-2 2·h·(2d + 2·G·N + H) + 7·d·N + 2·d·h with d = 2h (Bridge ``mamba_layer_flops`` uses d_in = 2h, not
  heads·head_dim).
* Dense MLP 2·h·g·f; routed experts 2·h·g·f_moe·k (latent MoE: 2·ℓ·g·f_moe·k + 4·h·ℓ); shared experts 2·h·g·f_sh.
* MTP depth (transformer path only): its layer(s) + 2·(3h + 2h²) for enorm/hnorm/final norm and ``eh_proj``.
* Logits 2·h·V_pad·(1 + m), V_pad padded to a multiple of ``make_vocab_size_divisible_by``·TP.

Legacy definition (``definition="legacy"``): Bridge before PR #3947 (commit baa0259bd, 2026-05-28; performance
releases up to 26.04.01) counted the GLU factor 3 only for SiLU-gated MLPs (``activation_func == F.silu``; GPT-OSS's
clamped GLU counted 2) and ignored sliding windows (every attention layer full causal, core 2·q·s). The published
tables of those releases were computed with it, so :func:`bridge_definition_for_release` picks it for them.

The router GEMM (2·h·E) is *not* part of Bridge's definition; :func:`layer_flops` reports it under ``router`` for
the time model, and :func:`flops_per_token` leaves it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moetune.errors import InputError
from moetune.spec.model import ModelArch

DEFINITIONS = ("current", "legacy")
# First Megatron-Bridge performance release computed with the current definition (PR #3947 merged 2026-05-28,
# between releases 26.04.01 and 26.06; the 26.06 GPT-OSS rows match it, the 26.04.01 rows match the legacy one).
FIRST_RELEASE_WITH_CURRENT_DEFINITION = (26, 6)
FWD_BWD = 3  # forward + backward (2x forward), as Bridge's "3 * 2 * ..." factors
# Keys of layer_flops() that Bridge counts in model FLOPs (router excluded, see module doc).
MODEL_FLOP_KEYS = ("attention_proj", "core_attention", "mixer", "mixer_core", "dense_mlp", "routed_experts",
                   "moe_latent_proj", "shared_experts", "mtp_proj")
ALL_KEYS = (*MODEL_FLOP_KEYS, "router")


def is_hybrid_stack(model: ModelArch) -> bool:
    """True for Megatron hybrid stacks (``hybrid_layer_pattern``: each layer one mixer *or* one MLP), which Bridge
    costs with ``hybrid_flops``; False for transformer layers (mixer + MLP per layer, incl. Qwen3-Next GDN)."""
    return any(a == "_" or b == "_" for a, b in zip(model.mixer_pattern, model.mlp_pattern, strict=True))


def _glu(model: ModelArch, definition: str = "current") -> int:
    if definition == "legacy":
        return 3 if (model.gated_linear_unit and model.activation == "swiglu") else 2
    return 3 if model.gated_linear_unit else 2


def bridge_definition_for_release(release: str) -> str:
    """'current' or 'legacy' for a Megatron-Bridge performance release label such as '26.04.01'."""
    try:
        key = tuple(int(p) for p in release.split(".")[:2])
    except ValueError as exc:
        raise InputError.bad_value("release", release, "a release label like '26.06' or '26.04.01'") from exc
    return "current" if key >= FIRST_RELEASE_WITH_CURRENT_DEFINITION else "legacy"


def _check_definition(definition: str) -> None:
    if definition not in DEFINITIONS:
        raise InputError.bad_value("definition", definition, f"one of {', '.join(DEFINITIONS)}")


def swa_context(model: ModelArch, seq_length: int) -> float:
    """Average causal context of a sliding-window layer (Bridge ``calculate_swa_context``); window W = w + 1
    for Megatron's (w, 0) window."""
    w = (model.window_size or 0) + 1
    if w < seq_length:
        return w - w * (w - 1) / (2 * seq_length)
    return seq_length / 2


def _attention(model: ModelArch, mixer: str, s: int, definition: str = "current") -> tuple[float, float]:
    """(projection, core) forward FLOPs per token of one attention layer."""
    h, n = model.hidden_size, model.num_attention_heads
    if model.multi_latent_attention:
        d_nope, d_rope, d_v, r_kv = model.qk_head_dim, model.qk_pos_emb_head_dim or 0, model.v_head_dim, \
            model.kv_lora_rank
        d_qk = d_nope + d_rope
        q_term = model.q_lora_rank * (h + n * d_qk + 1) if model.q_lora_rank else h * n * d_qk
        kv_term = r_kv * (h + n * (d_nope + d_v) + 1) + h * d_rope
        o_term = n * d_v * h
        return 2.0 * (q_term + kv_term + o_term), float(s * n * d_qk + s * n * d_v)
    q = model.head_dim * n
    kv = model.head_dim * model.query_groups
    gate = q if (model.attention_output_gate and not is_hybrid_stack(model)) else 0
    proj = h * (q + 2 * kv + gate) + q * h
    ctx = 2 * swa_context(model, s) if (mixer == "W" and definition == "current") else s
    return 2.0 * proj, 2.0 * q * ctx


def _gdn(model: ModelArch) -> tuple[float, float]:
    h = model.hidden_size
    qk = model.linear_key_head_dim * model.linear_num_key_heads
    v = model.linear_value_head_dim * model.linear_num_value_heads
    nv = model.linear_num_value_heads
    proj = h * (2 * qk + 2 * v + 2 * nv) + model.linear_conv_kernel_dim * (2 * qk + v) + h * v
    return 2.0 * proj, 2.0 * 4 * nv * model.linear_value_head_dim ** 2


def _mamba(model: ModelArch) -> tuple[float, float]:
    h = model.hidden_size
    d_in = 2 * h  # Bridge mamba_layer_flops
    groups = model.mamba_num_groups or 1
    heads = model.mamba_num_heads or d_in // (model.mamba_head_dim or 64)
    proj = 2 * h * (2 * d_in + 2 * groups * model.mamba_state_dim + heads) + 2 * d_in * h
    return float(proj), float(7 * d_in * model.mamba_state_dim)


def _sublayer_flops(model: ModelArch, mixer: str, mlp: str, s: int, definition: str = "current") -> dict[str, float]:
    out = dict.fromkeys(ALL_KEYS, 0.0)
    h = model.hidden_size
    g = _glu(model, definition)
    if mixer in ("A", "W"):
        out["attention_proj"], out["core_attention"] = _attention(model, mixer, s, definition)
    elif mixer == "G":
        out["mixer"], out["mixer_core"] = _gdn(model)
    elif mixer == "M":
        out["mixer"], out["mixer_core"] = _mamba(model)
    if mlp == "D":
        out["dense_mlp"] = 2.0 * h * g * model.ffn_hidden_size
    elif mlp == "E":
        k = model.moe_router_topk
        lat = model.moe_latent_size
        if lat:
            out["routed_experts"] = 2.0 * lat * g * model.moe_ffn_hidden_size * k
            out["moe_latent_proj"] = 4.0 * h * lat
        else:
            out["routed_experts"] = 2.0 * h * g * model.moe_ffn_hidden_size * k
        out["shared_experts"] = 2.0 * h * g * (model.moe_shared_expert_intermediate_size or 0)
        out["router"] = 2.0 * h * model.num_moe_experts
    return out


def _check_seq(seq_length: int) -> None:
    if not isinstance(seq_length, int) or seq_length <= 0:
        raise InputError.bad_value("seq_length", seq_length, "a positive integer")


def layer_flops(model: ModelArch, i: int, seq_length: int, definition: str = "current") -> dict[str, float]:
    """Forward FLOPs per token of decoder layer ``i`` (0-based), by component (keys :data:`ALL_KEYS`).

    Multiply by 3 for forward + backward. ``router`` is informational (not in Bridge's model FLOPs).
    """
    _check_seq(seq_length)
    _check_definition(definition)
    if not 0 <= i < model.num_layers:
        raise IndexError(f"{model.name}: layer {i} out of range 0..{model.num_layers - 1}")
    return _sublayer_flops(model, model.mixer_pattern[i], model.mlp_pattern[i], seq_length, definition)


def mtp_depth_flops(model: ModelArch, seq_length: int, definition: str = "current") -> dict[str, float]:
    """Forward FLOPs per token of one MTP depth: its layer(s) (hybrid: ``mtp_*_pattern``; else a copy of the last
    decoder layer, as Bridge counts them) plus, on the transformer path, the norms and ``eh_proj`` 2·(3h + 2h²).

    Bridge numbers MTP layers after the decoder for ``window_attn_skip_freq``; here an MTP layer takes the last
    decoder layer's mixer. The two agree for every catalog model (no sliding-window model has MTP)."""
    from moetune.perfmodel.params import mtp_block_layers

    _check_seq(seq_length)
    out = dict.fromkeys(ALL_KEYS, 0.0)
    for mixer, mlp in mtp_block_layers(model):
        for k, v in _sublayer_flops(model, mixer, mlp, seq_length, definition).items():
            out[k] += v
    if not is_hybrid_stack(model):
        h = model.hidden_size
        out["mtp_proj"] = 2.0 * (3 * h + 2 * h * h)
    return out


def logits_flops(model: ModelArch, tp: int = 1) -> float:
    """Forward FLOPs per token of the output layer(s): 2·h·V_pad·(1 + MTP depth), V padded with TP."""
    return 2.0 * model.hidden_size * model.padded_vocab_size(tp) * (1 + model.mtp_num_layers)


@dataclass(frozen=True)
class FlopsBreakdown:
    """Model FLOPs per token (forward + backward, Bridge definition), by component; ``total`` is their sum."""

    attention_proj: float
    core_attention: float
    mixer: float
    mixer_core: float
    dense_mlp: float
    routed_experts: float
    moe_latent_proj: float
    shared_experts: float
    mtp: float
    logits: float
    total: float
    seq_length: int
    tp: int
    formula: str
    definition: str
    assumptions: tuple[str, ...] = field(default_factory=tuple)


def flops_per_token(model: ModelArch, seq_length: int, tp: int = 1, definition: str = "current") -> FlopsBreakdown:
    """Bridge ``num_floating_point_operations`` / tokens for fixed-length sequences of ``seq_length``.

    ``tp`` only affects vocab padding (Bridge pads with the run's tensor-parallel size); ``definition`` selects the
    current (default) or legacy (pre-#3947) Bridge formula, see the module doc.
    """
    _check_seq(seq_length)
    _check_definition(definition)
    if tp < 1:
        raise InputError.bad_value("tp", tp, "a positive integer")
    sums = dict.fromkeys(ALL_KEYS, 0.0)
    for i in range(model.num_layers):
        for k, v in layer_flops(model, i, seq_length, definition).items():
            sums[k] += v
    mtp_total = 0.0
    if model.mtp_num_layers:
        mtp = mtp_depth_flops(model, seq_length, definition)
        mtp_total = FWD_BWD * model.mtp_num_layers * sum(mtp[k] for k in MODEL_FLOP_KEYS)
    logits = FWD_BWD * logits_flops(model, tp)
    parts = {k: FWD_BWD * sums[k] for k in MODEL_FLOP_KEYS if k != "mtp_proj"}
    total = sum(parts.values()) + mtp_total + logits
    hybrid = is_hybrid_stack(model)
    return FlopsBreakdown(
        **parts, mtp=mtp_total, logits=logits, total=total, seq_length=seq_length, tp=tp, definition=definition,
        formula="bridge.hybrid_flops" if hybrid else "bridge.transformer_flops",
        assumptions=(
            "fixed-length sequences (core factor = seq_length), causal 1/2 on core attention",
            f"vocab {model.vocab_size} padded to {model.padded_vocab_size(tp)} (divisible by "
            f"{model.make_vocab_size_divisible_by} x TP={tp})",
            "router GEMM not counted (Bridge definition)",
            *model.approximations,
        ),
    )


#: Bridge's LoRA FLOPs: frozen linears count forward + dgrad (2/3 of forward + 2x backward), core attention (no
#: weights) keeps its full factor (``flop_utils.py`` ``num_floating_point_operations``, the ``is_lora`` branch:
#: ``model_flops_frozen * (2.0 / 3.0) + model_flops_unfrozen``)
LORA_FROZEN_FACTOR = 2.0 / 3.0
#: the components without weights (core attention, SSM scan / delta-rule core): not frozen
_UNFROZEN = ("core_attention", "mixer_core")


def task_flops_per_token(model: ModelArch, seq_length: int, tp: int = 1, task: str = "pretrain",
                         definition: str = "current") -> float:
    """Model FLOPs per token of a training task as Bridge counts them: :func:`flops_per_token` for pre-training and
    full fine-tuning (SFT), and for LoRA the frozen part (every component but core attention / the mixer core) times
    :data:`LORA_FROZEN_FACTOR` plus the core attention in full (Megatron-Bridge ``training/utils/flop_utils.py``
    ``num_floating_point_operations``, LoRA branch; the adapters' own FLOPs are not counted there either). Bridge
    takes the attention term from the packed SQuAD data's mean squared sub-sequence length when the packed file is
    present; moetune has no such statistics and uses fixed-length sequences of ``seq_length``."""
    fb = flops_per_token(model, seq_length, tp, definition)
    if task != "lora":
        return fb.total
    unfrozen = sum(getattr(fb, k) for k in _UNFROZEN)
    return (fb.total - unfrozen) * LORA_FROZEN_FACTOR + unfrozen


def flops_per_step(model: ModelArch, seq_length: int, global_batch_size: int, tp: int = 1,
                   definition: str = "current") -> float:
    """Model FLOPs of one optimizer step: GBS·s tokens × :func:`flops_per_token` (Bridge calls
    ``num_floating_point_operations`` with batch_size = GBS once per step)."""
    if not isinstance(global_batch_size, int) or global_batch_size <= 0:
        raise InputError.bad_value("global_batch_size", global_batch_size, "a positive integer")
    return flops_per_token(model, seq_length, tp, definition).total * global_batch_size * seq_length

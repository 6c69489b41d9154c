"""Activation memory per decoder layer and microbatch, per component, on one rank.

What each component keeps for backward follows the tensors Megatron-Core / Transformer Engine save
(``ctx.save_for_backward``), generalising Korthikanti et al. (arXiv 2205.05198, Table 2: 34·sbh + 5·a·s²·b per
layer without parallelism) to GQA, MLA, MoE and hybrid mixers (docs/domain.md §3.2):

* norms (``TENorm`` / fused ``LayerNormLinear``): the norm input (the residual stream) and the normalised output
  (saved as the next linear's input); ``layernorm`` recompute drops the output.
* GQA attention: Q, K, V as saved by flash/fused attention (TE ``FusedAttention`` / flash-attn) plus an FP32
  log-sum-exp per head; the output O (input of ``linear_proj``). Unfused attention
  (``--attention-backend unfused`` or ``--transformer-impl local``; megatron/core/transformer/dot_product_attention.py)
  keeps the softmax output a·s² per microbatch (BF16), plus dropout mask and output when attention dropout > 0
  (Korthikanti's 5·a·s²·b).
* Mamba-2 (megatron/core/ssm/mamba_mixer.py, mamba_ssm ``mamba_split_conv1d_scan_combined``): the in_proj output
  zxBCdt, the SSM output (gated-norm input) and the out_proj input; conv and scan are recomputed in backward.
* MLA (megatron/core/transformer/multi_latent_attention.py): down-projected latents (pre-norm, sequence-sharded) and
  normalised latents (gathered, up-projection inputs), the up-projected Q/K/V (``mla_up_proj`` recompute drops them).
* Dense MLP (megatron/core/transformer/mlp.py): FC1 output (2f with GLU) saved by the fused bias-activation, the
  activation output (FC2 input).
* MoE (megatron/core/transformer/moe/{router,token_dispatcher,experts}.py): FP32 router logits/probs; the permuted
  token copies k·T·ETP·ρ saved as grouped-FC1 input; FC1 output and activation output per copy at width f/ETP; the
  routing probabilities are applied inside the activation (current MCore), so the FC2 output is not kept.
* Shared experts (shared_experts.py): as a dense MLP of width f_sh.
* Hidden dropout (bias-dropout-add): a 1-byte mask per element when ``hidden_dropout`` > 0.

Scaling (Megatron-Core): tokens per rank T = s·b/CP; norm/residual regions are split over TP with sequence
parallelism; TP-split projections hold 1/TP of the heads / width; experts process k·T_sp·ETP·ρ token copies (ρ: the
hottest expert rank's load over the mean, 1 under force-balanced routing, capped by the capacity factor). FP8
recipes store linear-layer inputs at 1 byte (TE saves the FP8 cast for wgrad).

All functions take plain hashable arguments and are cached (the planner calls them for thousands of layouts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moetune.catalog.memory_constants import const
from moetune.memo import memo
from moetune.spec.model import ModelArch

#: selective recompute modules (MCore ``--recompute-modules``)
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj")
#: fine-grained activation offloading modules (MCore ``--offload-modules``)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
                   "fused_group_mlp")

#: which saved-tensor components each offload module moves to host memory
_OFFLOAD_TARGETS: dict[str, tuple[str, ...]] = {
    "attn_norm": ("attn_norm_in",),
    "qkv_linear": ("attn_norm_out",),
    "core_attn": ("attn_qkv", "mla_up_proj", "core_attn"),
    "attn_proj": ("attn_proj_in",),
    "mlp_norm": ("mlp_norm_in",),
    "expert_fc1": ("moe_dispatched",),
    "moe_act": ("moe_fc1_out",),
    "fused_group_mlp": ("moe_dispatched", "moe_fc1_out", "moe_act"),
}

#: which components each selective recompute module drops (the module's input stays saved)
_RECOMPUTE_TARGETS: dict[str, tuple[str, ...]] = {
    "core_attn": ("core_attn",),
    "layernorm": ("attn_norm_out", "mlp_norm_out"),
    "mla_up_proj": ("mla_up_proj",),
    "mlp": ("mlp",),
    "moe_act": ("moe_act",),
    "moe": ("router", "moe_dispatched", "moe_fc1_out", "moe_act", "shared_experts"),
    "shared_experts": ("shared_experts",),
}


#: CUDA-graph scope (MCore ``cuda_graph_scope``) -> the components captured inside those graphs
GRAPH_SCOPE_COMPONENTS: dict[str, frozenset[str]] = {
    "attn": frozenset({"attn_norm_in", "attn_norm_out", "attn_qkv", "mla_up_proj", "core_attn", "attn_proj_in",
                       "attn_dropout_mask"}),
    "mamba": frozenset({"attn_norm_in", "attn_norm_out", "attn_qkv", "core_attn", "attn_proj_in",
                        "attn_dropout_mask"}),
    "mlp": frozenset({"mlp_norm_in", "mlp_norm_out", "mlp", "mlp_dropout_mask"}),
    "moe_router": frozenset({"router"}),
    "moe_preprocess": frozenset({"router"}),
    "moe": frozenset({"mlp_norm_in", "mlp_norm_out", "router", "moe_dispatched", "moe_fc1_out", "moe_act",
                      "shared_experts", "mlp_dropout_mask"}),
}


@dataclass(frozen=True, slots=True)
class ActConfig:
    """Everything besides the model that sets per-layer activation bytes (hashable cache key)."""

    seq: int
    mbs: int
    tp: int
    cp: int
    etp: int
    sp: bool
    fp8: bool
    unfused_attention: bool
    attention_dropout: bool
    hidden_dropout: bool
    routing_factor: float  #: ρ: hottest expert rank load / mean (>= 1)
    recompute: frozenset[str] = frozenset()
    offload: frozenset[str] = frozenset()
    #: EP size, read only with the allgather dispatcher (its gathered tokens); 1 otherwise (``memory.act_config``)
    ep: int = 1
    allgather_dispatcher: bool = False
    te_cross_entropy: bool = False
    #: LoRA (frozen base linears): the adapted linears (``lora_target_modules``) and the rank; None otherwise
    lora_targets: frozenset[str] | None = None
    lora_dim: int = 0
    #: hash of the fields, computed once (the config is a key of many caches; not a field of equality)
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f) for f in _ACT_FIELDS)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def tokens(self) -> float:
        """Tokens of one microbatch on this CP rank (TP ranks all see them in TP-split regions)."""
        return self.seq * self.mbs / self.cp

    @property
    def tokens_sp(self) -> float:
        """Tokens in sequence-parallel regions (norms, residual, router, dispatcher input): :func:`sp_tokens`."""
        return sp_tokens(self.seq, self.mbs, self.tp, self.cp, self.sp)


def sp_tokens(seq: int, mbs: int, tp: int, cp: int, sp: bool) -> float:
    """Tokens of one microbatch that one rank holds in sequence-parallel regions: s·b/(CP·TP) with sequence
    parallelism (TP > 1), s·b/CP without. Megatron-Core shards the sequence over CP (``get_batch_on_this_cp_rank``)
    and, with ``--sequence-parallel``, over TP outside the TP-split GEMMs (tensor_parallel/mappings.py
    ``scatter_to_sequence_parallel_region``); this is the residual stream, the router input and what the MoE token
    dispatcher receives (moe/token_dispatcher.py: ``hidden_states.view(-1, hidden)`` of the sequence-parallel shard)."""
    tokens = seq * mbs / cp
    return tokens / tp if (sp and tp > 1) else tokens


_ACT_FIELDS = tuple(f for f in ActConfig.__dataclass_fields__ if f != "_hash")


def _lin_bytes(cfg: ActConfig) -> int:
    """Bytes per element of a saved linear-layer input (FP8 recipes save the FP8 cast)."""
    return const("dtype_bytes")["fp8" if cfg.fp8 else "bf16"]


def _attention_components(model: ModelArch, mixer: str, cfg: ActConfig) -> dict[str, float]:
    b16 = const("dtype_bytes")["bf16"]
    lin = _lin_bytes(cfg)
    h, tp = model.hidden_size, cfg.tp
    t, tsp = cfg.tokens, cfg.tokens_sp
    heads = model.num_attention_heads / tp
    out: dict[str, float] = {"attn_norm_in": b16 * h * tsp, "attn_norm_out": lin * h * tsp}
    if mixer in ("A", "W"):
        if model.multi_latent_attention:
            r_q = model.q_lora_rank or 0
            r_kv = model.kv_lora_rank or 0
            d_rope = model.qk_pos_emb_head_dim or 0
            d_nope = model.qk_head_dim or 0
            d_v = model.v_head_dim or 0
            # pre-norm latents on the sequence shard + normalised (gathered) latents saved by the up-projections
            out["attn_qkv"] = b16 * (r_q + r_kv + d_rope) * tsp + lin * (r_q + r_kv) * t + b16 * d_rope * t
            out["mla_up_proj"] = b16 * heads * (2 * (d_nope + d_rope) + d_v) * t
            o_width = heads * d_v
        else:
            d = model.head_dim
            q = heads * d
            kv = max(model.query_groups / tp, 1) * d
            out["attn_qkv"] = b16 * (q + 2 * kv) * t
            o_width = q
        if cfg.unfused_attention:
            # softmax output (BF16) [+ dropout mask (1 B) and dropout output (2 B)] per head per (query, key)
            keys = min(model.window_size, cfg.seq) if (mixer == "W" and model.window_size) else cfg.seq
            per = b16 + ((1 + b16) if cfg.attention_dropout else 0)
            out["core_attn"] = per * heads * keys * t
        else:
            out["core_attn"] = const("dtype_bytes")["fp32"] * heads * t  # softmax LSE / stats
        out["attn_proj_in"] = lin * o_width * t
    elif mixer == "M":
        d_in = (model.mamba_num_heads or 0) * (model.mamba_head_dim or 0)
        g_n = (model.mamba_num_groups or 0) * (model.mamba_state_dim or 0)
        # megatron/core/ssm/mamba_mixer.py training path: the memory-efficient mamba_split_conv1d_scan_combined
        # saves only zxBCdt (in_proj output, recomputing conv and scan in backward); the gated RMSNorm keeps the
        # SSM output, out_proj its input. All TP-split.
        out["attn_qkv"] = b16 * (2 * d_in + 2 * g_n + (model.mamba_num_heads or 0)) * t / tp
        out["core_attn"] = b16 * d_in * t / tp
        out["attn_proj_in"] = lin * d_in * t / tp
    elif mixer == "G":
        qk = (model.linear_key_head_dim or 0) * (model.linear_num_key_heads or 0)
        v = (model.linear_value_head_dim or 0) * (model.linear_num_value_heads or 0)
        out["attn_qkv"] = b16 * (2 * qk + 2 * v) * t / tp
        out["core_attn"] = b16 * (2 * qk + v) * t / tp + b16 * v * t / tp
        out["attn_proj_in"] = lin * v * t / tp
    if cfg.hidden_dropout:
        out["attn_dropout_mask"] = 1.0 * h * tsp
    return out


def _mlp_components(model: ModelArch, mlp: str, cfg: ActConfig) -> dict[str, float]:
    b16 = const("dtype_bytes")["bf16"]
    lin = _lin_bytes(cfg)
    h, tp = model.hidden_size, cfg.tp
    t, tsp = cfg.tokens, cfg.tokens_sp
    glu = 2 if model.gated_linear_unit else 1
    out: dict[str, float] = {"mlp_norm_in": b16 * h * tsp, "mlp_norm_out": lin * h * tsp}
    if mlp == "D":
        f = model.ffn_hidden_size / tp
        out["mlp"] = b16 * glu * f * t + lin * f * t
    elif mlp == "E":
        e, k = model.num_moe_experts or 1, model.moe_router_topk
        out["router"] = const("router_bytes_per_expert_per_token") * e * tsp
        width_in = model.moe_latent_size or h
        copies = k * tsp * cfg.etp * cfg.routing_factor
        f = (model.moe_ffn_hidden_size or 0) / cfg.etp
        out["moe_dispatched"] = lin * width_in * copies
        # FC1 output (saved by the fused weighted activation) + the per-copy FP32 probability it applies
        out["moe_fc1_out"] = b16 * glu * f * copies + const("dtype_bytes")["fp32"] * copies
        out["moe_act"] = lin * f * copies
        if model.moe_latent_size:
            out["moe_dispatched"] += b16 * h * tsp  # latent down-projection input kept in full width
        if model.moe_shared_expert_intermediate_size:
            fs = model.moe_shared_expert_intermediate_size / tp
            out["shared_experts"] = b16 * glu * fs * t + lin * fs * t
    if cfg.hidden_dropout:
        out["mlp_dropout_mask"] = 1.0 * h * tsp
    return out


def _lora_components(model: ModelArch, mixer: str, mlp: str, cfg: ActConfig, comps: dict[str, float]) -> None:
    """LoRA's saved tensors in place of the frozen linears' inputs (``cfg.lora_targets`` set).

    A frozen linear keeps no input for backward: Transformer Engine saves it only for the wgrad GEMM
    (``transformer_engine/pytorch/module/linear.py``: ``backward_needs_input = is_grad_enabled and
    weight.requires_grad``; ``layernorm_linear.py`` saves ``ln_out`` only ``if weight.requires_grad``; the grouped
    expert linears likewise). An adapter (Megatron-Bridge ``peft/utils.py`` ``ParallelLinearAdapter``, BF16) saves its
    own input for A's wgrad - the gathered norm output (d_in per token of the TP group: Bridge's default
    ``sequence_parallel_input_regather = False`` keeps it) for ``linear_qkv`` / ``linear_fc1``, the TP-split input for
    ``linear_proj`` / ``linear_fc2`` - and the r-wide output of A (B's input). So: the norm outputs (QKV and FC1
    inputs) and the FC2 / expert-FC2 inputs drop to what an adapter keeps; the activation function's input (FC1 output)
    and the attention output O (kept by the attention kernel for its own backward) stay."""
    b16 = const("dtype_bytes")["bf16"]
    tg = cfg.lora_targets or frozenset()
    h, tp, t = model.hidden_size, cfg.tp, cfg.tokens
    r = float(cfg.lora_dim)
    glu = 2 if model.gated_linear_unit else 1
    rank_out = 0.0  # A's outputs (B's inputs), r / TP wide (ColumnParallel A) or r (RowParallel A)
    if "attn_norm_out" in comps and mixer in ("A", "W") and not model.multi_latent_attention:
        comps["attn_norm_out"] = b16 * h * t if "linear_qkv" in tg else 0.0
        rank_out += r / tp * t if "linear_qkv" in tg else 0.0
    if "attn_proj_in" in comps and "linear_proj" in tg and mixer in ("A", "W"):
        rank_out += r * t  # O itself is kept by attention (the pre-training term); the adapter adds its A output
    if mlp == "D":
        f = model.ffn_hidden_size / tp
        comps["mlp_norm_out"] = b16 * h * t if "linear_fc1" in tg else 0.0
        comps["mlp"] = b16 * glu * f * t + (b16 * f * t if "linear_fc2" in tg else 0.0)
        rank_out += sum(x for m, x in (("linear_fc1", r / tp * t), ("linear_fc2", r * t)) if m in tg)
    elif mlp == "E":
        copies = model.moe_router_topk * cfg.tokens_sp * cfg.etp * cfg.routing_factor
        f = (model.moe_ffn_hidden_size or 0) / cfg.etp
        width_in = model.moe_latent_size or h
        if "moe_dispatched" in comps:
            comps["moe_dispatched"] = b16 * width_in * copies if "linear_fc1" in tg else 0.0
        if "moe_act" in comps:
            comps["moe_act"] = b16 * f * copies if "linear_fc2" in tg else 0.0
        rank_out += sum(x for m, x in (("linear_fc1", r / cfg.etp * copies), ("linear_fc2", r * copies)) if m in tg)
        comps["mlp_norm_out"] = 0.0  # the router and the dispatcher keep the normalised tokens (moe_dispatched)
        if model.moe_shared_expert_intermediate_size and "shared_experts" in comps:
            fs = model.moe_shared_expert_intermediate_size / tp
            comps["shared_experts"] = b16 * glu * fs * t + (b16 * fs * t if "linear_fc2" in tg else 0.0)
            if "linear_fc1" in tg:
                comps["mlp_norm_out"] = b16 * h * t
    if rank_out:
        comps["lora_adapters"] = b16 * rank_out


@memo(maxsize=4096)
def layer_components(model: ModelArch, mixer: str, mlp: str, cfg: ActConfig) -> tuple[tuple[str, float], ...]:
    """Saved-for-backward bytes of one decoder layer for one microbatch on one rank, per component.

    Selective recompute removes the components its module recomputes; fine-grained offloading removes those moved to
    host memory (the few resident layers are added by the caller as a working-set term). With LoRA the frozen
    linears' inputs give way to the adapters' saved tensors (:func:`_lora_components`).
    """
    comps: dict[str, float] = {}
    if mixer != "_":
        comps.update(_attention_components(model, mixer, cfg))
    if mlp != "_":
        comps.update(_mlp_components(model, mlp, cfg))
    if cfg.lora_targets is not None:
        _lora_components(model, mixer, mlp, cfg, comps)
        comps = {k: v for k, v in comps.items() if v > 0}
    for mod in cfg.recompute:
        for name in _RECOMPUTE_TARGETS.get(mod, ()):
            comps.pop(name, None)
    for mod in cfg.offload:
        for name in _OFFLOAD_TARGETS.get(mod, ()):
            comps.pop(name, None)
    return tuple(sorted(comps.items()))


@memo(maxsize=4096)
def layer_graphed_bytes(model: ModelArch, mixer: str, mlp: str, cfg: ActConfig, scope: frozenset[str]) -> float:
    """Saved bytes of one layer/microbatch that live inside CUDA graphs of the given scope (their memory comes from
    the graphs' private pool, allocated once at capture, not per replay)."""
    if not scope:
        return 0.0
    if "full_iteration" in scope:
        return layer_bytes(model, mixer, mlp, cfg)
    names: set[str] = set()
    for sc in scope:
        if sc == "attn" and mixer not in ("A", "W"):
            continue
        if sc == "mamba" and mixer not in ("M", "G"):
            continue
        if sc == "mlp" and mlp != "D":
            continue
        if sc in ("moe", "moe_router", "moe_preprocess") and mlp != "E":
            continue
        names |= GRAPH_SCOPE_COMPONENTS.get(sc, frozenset())
    return float(sum(v for k, v in layer_components(model, mixer, mlp, cfg) if k in names))


@memo(maxsize=4096)
def layer_offloaded_bytes(model: ModelArch, mixer: str, mlp: str, cfg: ActConfig) -> float:
    """Bytes of one layer/microbatch that fine-grained offloading moves to the host (0 without offloading)."""
    if not cfg.offload:
        return 0.0
    full = dict(layer_components(model, mixer, mlp, without(cfg, offload=True)))
    kept = dict(layer_components(model, mixer, mlp, cfg))
    return sum(full.values()) - sum(kept.values())


@memo(maxsize=4096)
def layer_bytes(model: ModelArch, mixer: str, mlp: str, cfg: ActConfig) -> float:
    """Total saved bytes of one layer for one microbatch (sum of :func:`layer_components`)."""
    return float(sum(v for _, v in layer_components(model, mixer, mlp, cfg)))


@memo(maxsize=4096)
def layer_transient_bytes(model: ModelArch, mixer: str, mlp: str, cfg: ActConfig) -> float:
    """Extra bytes alive while one layer runs its backward (or forward) on top of what is saved.

    ``backward_transient_factor`` (catalog/memory.yaml) copies of the layer's largest saved tensor: the gradient of
    that tensor and of its input coexist with it (dP/dS for unfused attention, dFC1-out/dX for an MLP). Components
    dropped by recompute are rebuilt during backward, so the full (no-recompute) layer sets the size.
    """
    plain = without(cfg, recompute=True, offload=True)
    comps = dict(layer_components(model, mixer, mlp, plain))
    if not comps:
        return 0.0
    out = const("backward_transient_factor") * max(comps.values())
    if mlp == "E" and cfg.allgather_dispatcher:
        # MoEAllGatherTokenDispatcher gathers hidden states (BF16) and routing probs/map (FP32 + bool) of the whole
        # ETP x EP group before selecting the local experts' tokens (token_dispatcher.py)
        gathered = cfg.tokens_sp * cfg.ep * cfg.etp
        out = max(out, gathered * (const("dtype_bytes")["bf16"] * (model.moe_latent_size or model.hidden_size)
                                   + (const("dtype_bytes")["fp32"] + 1) * (model.num_moe_experts or 0)))
    return out


@memo(maxsize=4096)
def layer_recompute_extra_bytes(model: ModelArch, mixer: str, mlp: str, cfg: ActConfig) -> float:
    """Bytes a recomputed layer rebuilds during its backward (full layer minus what selective recompute kept)."""
    plain = without(cfg, recompute=True, offload=True)
    kept = without(cfg, offload=True)
    return layer_bytes(model, mixer, mlp, plain) - layer_bytes(model, mixer, mlp, kept)


def layer_input_bytes(model: ModelArch, cfg: ActConfig) -> float:
    """The layer input (residual stream, BF16, sequence-sharded): what full recompute keeps per layer/group."""
    return const("dtype_bytes")["bf16"] * model.hidden_size * cfg.tokens_sp


def embedding_stage_bytes(model: ModelArch, cfg: ActConfig) -> float:
    """First stage extras per microbatch: input tensors (ids, labels, masks) and the embedding-dropout mask."""
    b = const("input_tensors_bytes_per_token") * cfg.seq * cfg.mbs / cfg.cp
    if cfg.hidden_dropout:
        b += 1.0 * model.hidden_size * cfg.tokens_sp
    return b


def loss_stage_bytes(model: ModelArch, cfg: ActConfig, padded_vocab: int) -> tuple[float, float]:
    """(saved, transient) bytes of final norm + output layer + cross entropy for one microbatch.

    Saved: final-norm input and output (the output layer's input, sequence-sharded) and the FP32 softmax of the
    vocab-parallel cross entropy (megatron/core/tensor_parallel/cross_entropy.py); input tensors (labels, masks).
    Transient: the BF16 logits while the FP32 copy exists (forward) / the BF16 gradient (backward).
    With ``cross_entropy_fusion_impl='te'`` (and loss fusion on) the saved logits are BF16 and nothing is transient.
    """
    b16 = const("dtype_bytes")["bf16"]
    v_local = padded_vocab / cfg.tp
    saved = b16 * model.hidden_size * cfg.tokens_sp * 2
    saved += const("input_tensors_bytes_per_token") * cfg.seq * cfg.mbs / cfg.cp
    if cfg.te_cross_entropy:
        # TE parallel cross entropy (transformer_engine/pytorch/cross_entropy.py) writes the logits gradient into
        # the BF16 logits in forward and saves that tensor: no FP32 copy
        saved += b16 * v_local * cfg.tokens
        return saved, 0.0
    saved += const("loss_logits_bytes_retained") * v_local * cfg.tokens
    transient = const("loss_logits_bytes_transient") * v_local * cfg.tokens
    return saved, transient


def mtp_extra_bytes(model: ModelArch, cfg: ActConfig, padded_vocab: int) -> float:
    """One MTP depth besides its transformer layer(s): enorm/hnorm inputs and outputs, eh_proj input (2h, gathered
    for the column-parallel projection), its final norm and its own logits/loss
    (megatron/core/transformer/multi_token_prediction.py)."""
    b16 = const("dtype_bytes")["bf16"]
    h = model.hidden_size
    norms = 2 * (b16 * h * cfg.tokens_sp * 2)
    eh = _lin_bytes(cfg) * 2 * h * cfg.tokens_sp
    saved, _ = loss_stage_bytes(model, cfg, padded_vocab)
    return norms + eh + saved


@memo(maxsize=65536)
def without(cfg: ActConfig, recompute: bool = False, offload: bool = False) -> ActConfig:
    """``cfg`` with no selective recompute (``recompute``) and / or no fine-grained offloading (``offload``): ``cfg``
    itself where those fields are empty already (an equal config, so every function of it gives the same value),
    else one new config per value while in the table (the layer memos keyed on it compare it by identity)."""
    upd = {}
    if recompute and cfg.recompute:
        upd["recompute"] = frozenset()
    if offload and cfg.offload:
        upd["offload"] = frozenset()
    return ActConfig(**{**_asdict(cfg), **upd}) if upd else cfg


def _asdict(cfg: ActConfig) -> dict:
    return {f: getattr(cfg, f) for f in _ACT_FIELDS}

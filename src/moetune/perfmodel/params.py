"""Parameter counts of a :class:`~moetune.spec.model.ModelArch`, per layer and per component.

Counts follow the tensors Megatron-Core allocates (which are the tensors of the Hugging Face checkpoint for the
families in the catalog):

* attention (GQA/MHA) — ``linear_qkv`` h·(q + 2kv) [+ q for the output gate, ``attention_output_gate``],
  ``linear_proj`` q·h, biases (``add_qkv_bias`` / ``add_bias_linear``), per-head or full-width Q/K norms
  (``qk_layernorm``), learned softmax sinks (one per head). Source: megatron/core/transformer/attention.py
  ``SelfAttention``; HF ``Qwen3MoeAttention`` / ``GptOssAttention`` / ``OlmoeAttention``.
* MLA — ``linear_q_down_proj`` h·r_q, ``q_layernorm`` r_q, ``linear_q_up_proj`` r_q·n·d_qk (or ``linear_q_proj``
  h·n·d_qk without q-LoRA), ``linear_kv_down_proj`` h·(r_kv + d_rope), ``kv_layernorm`` r_kv, ``linear_kv_up_proj``
  r_kv·n·(d_nope + d_v), ``linear_proj`` n·d_v·h. Source: megatron/core/transformer/multi_latent_attention.py
  ``MLASelfAttention``; HF ``DeepseekV3Attention``.
* Mamba-2 — ``in_proj`` h·(2·d_in + 2·G·N + H), ``conv1d`` (d_in + 2·G·N)·(K + 1), ``dt_bias``/``A_log``/``D`` H each,
  gated ``norm`` d_in, ``out_proj`` d_in·h. Source: megatron/core/ssm/mamba_mixer.py ``MambaMixer``.
* Gated DeltaNet — ``in_proj_qkvz`` h·(2·qk + 2·v), ``in_proj_ba`` h·2·n_v, ``conv1d`` (2·qk + v)·K, ``dt_bias`` and
  ``A_log`` n_v each, ``norm`` d_v, ``out_proj`` v·h. Source: HF ``Qwen3NextGatedDeltaNet``.
* MLPs — FC1 h·f·(2 if GLU else 1), FC2 f·h, biases with ``add_bias_linear``. Source: megatron/core/transformer/mlp.py.
* MoE — router h·E (+E bias with ``add_bias_linear``, +E ``expert_bias`` buffer with
  ``moe_router_enable_expert_bias``), E routed experts, shared expert(s) of total width f_sh (+h gate with
  ``moe_shared_expert_gate``); latent MoE adds h·ℓ down and ℓ·h up projections and runs experts at width ℓ.
  Source: megatron/core/transformer/moe/{router.py,experts.py,shared_experts.py}.
* Embedding V_pad·h with V padded to a multiple of ``make_vocab_size_divisible_by`` (TP = 1), output layer the same
  unless tied. Source: megatron/training/tokenizer ``_vocab_size_with_padding``; ``LanguageModelEmbedding``.
* MTP — per depth: ``enorm`` + ``hnorm`` (h each), ``eh_proj`` 2h·h, the MTP transformer block, ``final_layernorm`` h;
  embedding and output layer are shared with the main model. Source:
  megatron/core/transformer/multi_token_prediction.py ``MultiTokenPredictionLayer``.

Conventions of :func:`count_params`:

* ``total`` includes MTP (what Megatron allocates and the optimizer updates); ``total_without_mtp`` is the main model.
  Published totals (DeepSeek-V3 671B, GLM-4.5 355B) describe the main model and are compared with
  ``total_without_mtp``; the safetensors totals in ``hf_param_counts.csv`` are models without MTP, where both agree.
* ``active`` (per token) counts routed experts as k/E of them, shared experts fully, embedding and output layer once
  each (once in total when tied), and excludes MTP (the published active counts, e.g. DeepSeek-V3 37B, exclude it);
  ``active_with_mtp`` adds the MTP block's active parameters.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from moetune.spec.model import ModelArch

# LayerNorm has weight + bias; RMSNorm only weight.
_NORM_TENSORS = {"RMSNorm": 1, "LayerNorm": 2}


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer, by component (integers)."""

    attention: int = 0
    mixer: int = 0
    norms: int = 0
    dense_mlp: int = 0
    router: int = 0
    routed_experts: int = 0
    shared_experts: int = 0
    moe_latent_proj: int = 0

    @property
    def dense(self) -> int:
        """Everything that is not a routed expert (replicated over EP; sharded over TP)."""
        return self.total - self.routed_experts

    @property
    def total(self) -> int:
        return (self.attention + self.mixer + self.norms + self.dense_mlp + self.router + self.routed_experts
                + self.shared_experts + self.moe_latent_proj)

    def active(self, model: ModelArch) -> float:
        """Parameters one token touches: routed experts scaled by k/E."""
        if self.routed_experts == 0:
            return float(self.total)
        return self.dense + self.routed_experts * model.moe_router_topk / model.num_moe_experts

    def __add__(self, other: LayerParams) -> LayerParams:
        a, b = asdict(self), asdict(other)
        return LayerParams(**{k: a[k] + b[k] for k in a})


@dataclass(frozen=True)
class ParamCounts:
    """Model parameter counts. ``by_component`` sums to ``total``."""

    total: int
    active: int
    total_without_mtp: int
    active_with_mtp: int
    by_component: dict[str, int] = field(default_factory=dict)
    assumptions: tuple[str, ...] = ()


def _norm(model: ModelArch, width: int) -> int:
    return _NORM_TENSORS[model.normalization] * width


def mlp_params(model: ModelArch, hidden_in: int, width: int) -> int:
    """One MLP hidden_in -> width -> hidden_in: FC1 (x2 with GLU) + FC2, biases with ``add_bias_linear``
    (megatron/core/transformer/mlp.py ``MLP``)."""
    fc1_out = width * (2 if model.gated_linear_unit else 1)
    n = hidden_in * fc1_out + width * hidden_in
    if model.add_bias_linear:
        n += fc1_out + hidden_in
    return n


def attention_params(model: ModelArch) -> int:
    """Self-attention block (GQA/MHA or MLA) incl. its internal norms, biases and sinks (see module doc)."""
    h = model.hidden_size
    n = model.num_attention_heads
    if model.multi_latent_attention:
        d_nope, d_rope, d_v = model.qk_head_dim, model.qk_pos_emb_head_dim or 0, model.v_head_dim
        r_kv = model.kv_lora_rank
        d_qk = d_nope + d_rope
        if model.q_lora_rank:
            q = h * model.q_lora_rank + _norm(model, model.q_lora_rank) + model.q_lora_rank * n * d_qk
        else:
            q = h * n * d_qk
        kv = h * (r_kv + d_rope) + _norm(model, r_kv) + r_kv * n * (d_nope + d_v)
        o = n * d_v * h
        total = q + kv + o + dsa_indexer_params(model)
        if model.add_bias_linear or model.add_proj_bias:
            total += h
        return total
    d = model.head_dim
    q_w = n * d
    kv_w = model.query_groups * d
    qkv_out = q_w + 2 * kv_w + (q_w if model.attention_output_gate else 0)
    total = h * qkv_out + q_w * h
    if model.add_bias_linear or model.add_qkv_bias:
        total += qkv_out
    if model.add_bias_linear or model.add_proj_bias:
        total += h
    if model.qk_layernorm:
        total += _norm(model, q_w) + _norm(model, kv_w) if model.qk_layernorm_full_width else 2 * _norm(model, d)
    if model.softmax_sinks:
        total += n
    return total


def dsa_indexer_params(model: ModelArch) -> int:
    """DeepSeek sparse attention lightning indexer (HF ``DeepseekV32Indexer``): ``wq_b`` r_q x n_i·d_i,
    ``wk`` h x d_i, ``k_norm`` LayerNorm(d_i) with bias, ``weights_proj`` h x n_i; 0 without an indexer."""
    n_i, d_i = model.dsa_indexer_n_heads, model.dsa_indexer_head_dim
    if not (n_i and d_i):
        return 0
    q_in = model.q_lora_rank or model.hidden_size
    return q_in * n_i * d_i + model.hidden_size * d_i + 2 * d_i + model.hidden_size * n_i


def mamba_params(model: ModelArch) -> int:
    """Mamba-2 mixer (megatron/core/ssm/mamba_mixer.py ``MambaMixer``; HF ``NemotronHMamba2Mixer``), or Mamba-1 with
    ``mamba_version`` 1 (HF ``JambaMambaMixer``: ``in_proj`` h·2·d_in, ``conv1d`` d_in·K, ``x_proj`` d_in·(R + 2N),
    ``dt_proj`` R·d_in + d_in, ``A_log`` d_in·N, ``D`` d_in, ``out_proj`` d_in·h, optional dt/B/C RMSNorms)."""
    h = model.hidden_size
    heads = model.mamba_num_heads
    if not (heads and model.mamba_head_dim and model.mamba_state_dim):
        raise ValueError(f"{model.name}: Mamba layers need mamba_num_heads, mamba_head_dim, mamba_state_dim")
    d_in = heads * model.mamba_head_dim
    n_state = model.mamba_state_dim
    proj_bias = model.mamba_proj_bias
    conv_bias = model.mamba_conv_bias
    if model.mamba_version == 1:
        r = model.mamba_dt_rank or -(-h // 16)
        n = h * 2 * d_in + (2 * d_in if proj_bias else 0)
        n += d_in * model.mamba_d_conv + (d_in if conv_bias else 0)
        n += d_in * (r + 2 * n_state) + r * d_in + d_in + d_in * n_state + d_in
        n += d_in * h + (h if proj_bias else 0)
        if model.mamba_inner_layernorms:
            n += r + 2 * n_state
        return n
    gn = (model.mamba_num_groups or 1) * n_state
    conv_dim = d_in + 2 * gn
    in_out = 2 * d_in + 2 * gn + heads
    in_proj = h * in_out + (in_out if proj_bias else 0)
    conv = conv_dim * model.mamba_d_conv + (conv_dim if conv_bias else 0)
    return in_proj + conv + 3 * heads + d_in + d_in * h + (h if proj_bias else 0)


def gated_deltanet_params(model: ModelArch) -> int:
    """Linear-attention mixer ('G'), by ``linear_attention_kind``:

    * gated DeltaNet (HF ``Qwen3NextGatedDeltaNet``; Megatron ``GatedDeltaNet``): ``in_proj_qkvz`` h·(2·qk + 2·v),
      ``in_proj_ba`` h·2·n_v, ``conv1d`` (2·qk + v)·K, ``dt_bias``/``A_log`` n_v, ``norm`` d_v, ``out_proj`` v·h;
    * lightning attention (HF ``MiniMaxLightningAttention``): ``qkv_proj`` h·3·n·d, ``output_gate`` h·n·d,
      ``norm`` n·d, ``out_proj`` n·d·h;
    * Kimi delta attention (HF ``KimiDeltaAttention``): q/k/v h·n·d each, ``conv1d`` 3·n·d·K, forget gate
      ``f_a_proj`` h·d + ``f_b_proj`` d·n·d + ``dt_bias`` n·d + ``A_log`` n, ``b_proj`` h·n, output gate
      ``g_a_proj`` h·d + ``g_b_proj`` d·n·d, ``o_norm`` d, ``o_proj`` n·d·h.
    """
    h = model.hidden_size
    if not (model.linear_key_head_dim and model.linear_value_head_dim and model.linear_num_key_heads
            and model.linear_num_value_heads):
        raise ValueError(f"{model.name}: gated-DeltaNet layers need linear_{{key,value}}_head_dim and head counts")
    qk = model.linear_key_head_dim * model.linear_num_key_heads
    v = model.linear_value_head_dim * model.linear_num_value_heads
    nv = model.linear_num_value_heads
    if model.linear_attention_kind == "lightning":
        return h * 3 * v + h * v + v + v * h
    if model.linear_attention_kind == "kda":
        d = model.linear_key_head_dim
        return (3 * h * v + 3 * v * model.linear_conv_kernel_dim + h * d + d * v + v + nv + h * nv + h * d + d * v
                + d + v * h)
    in_proj = h * (2 * qk + 2 * v) + h * 2 * nv
    conv = (2 * qk + v) * model.linear_conv_kernel_dim
    return in_proj + conv + 2 * nv + model.linear_value_head_dim + v * h


def _layer_params(model: ModelArch, mixer: str, mlp: str) -> LayerParams:
    h = model.hidden_size
    attention = mixer_p = dense = router = routed = shared = latent = 0
    norms = 0
    if mixer in ("A", "W"):
        attention = attention_params(model)
    elif mixer == "M":
        mixer_p = mamba_params(model)
    elif mixer == "G":
        mixer_p = gated_deltanet_params(model)
    if mixer != "_":
        norms += _norm(model, h)
    if mlp == "D":
        dense = mlp_params(model, h, model.ffn_hidden_size)
    elif mlp == "E":
        e = model.num_moe_experts
        router = h * e
        if model.add_bias_linear:
            router += e
        if model.moe_router_enable_expert_bias:
            router += e
        lat = model.moe_latent_size
        routed = e * mlp_params(model, lat or h, model.moe_ffn_hidden_size)
        if lat:
            latent = h * lat + lat * h
        if model.moe_shared_expert_intermediate_size:
            shared = mlp_params(model, h, model.moe_shared_expert_intermediate_size)
            if model.moe_shared_expert_gate:
                shared += h
    if mlp != "_" and not (model.parallel_attention_mlp and mixer != "_"):
        norms += _norm(model, h)
    if model.post_sublayer_norms:
        norms += _norm(model, h) * ((mixer != "_") + (mlp != "_"))
    return LayerParams(attention=attention, mixer=mixer_p, norms=norms, dense_mlp=dense, router=router,
                       routed_experts=routed, shared_experts=shared, moe_latent_proj=latent)


def layer_params(model: ModelArch, i: int) -> LayerParams:
    """Parameters of decoder layer ``i`` (0-based; MTP excluded), by component."""
    if not 0 <= i < model.num_layers:
        raise IndexError(f"{model.name}: layer {i} out of range 0..{model.num_layers - 1}")
    return _layer_params(model, model.mixer_pattern[i], model.mlp_pattern[i])


def mtp_block_layers(model: ModelArch) -> list[tuple[str, str]]:
    """(mixer, mlp) chars of the layers inside one MTP depth: ``mtp_{mixer,mlp}_pattern`` if given, else one layer
    of the last decoder layer's type (Megatron ``get_mtp_layer_spec`` reuses the decoder's last layer spec)."""
    if model.mtp_mixer_pattern is not None:
        mlp = model.mtp_mlp_pattern or "_" * len(model.mtp_mixer_pattern)
        return list(zip(model.mtp_mixer_pattern, mlp, strict=True))
    return [(model.mixer_pattern[-1], model.mlp_pattern[-1])]


def mtp_block_params(model: ModelArch) -> LayerParams:
    """The transformer layers of one MTP depth (without eh_proj and its norms)."""
    out = LayerParams()
    for mixer, mlp in mtp_block_layers(model):
        out = out + _layer_params(model, mixer, mlp)
    return out


def mtp_extra_params(model: ModelArch) -> int:
    """Per MTP depth, outside the transformer block: enorm + hnorm + eh_proj (2h x h) + final_layernorm."""
    h = model.hidden_size
    return 3 * _norm(model, h) + 2 * h * h


def _mtp_copies(model: ModelArch) -> int:
    """How many distinct MTP parameter sets exist (1 when all depths share one block)."""
    if model.mtp_num_layers == 0:
        return 0
    return 1 if model.mtp_use_repeated_layer else model.mtp_num_layers


def mtp_params(model: ModelArch) -> int:
    """All MTP parameters (embedding and output layer shared with the main model, as Megatron does)."""
    return _mtp_copies(model) * (mtp_extra_params(model) + mtp_block_params(model).total)


def embedding_params(model: ModelArch) -> int:
    """Input embedding: padded vocab (TP = 1) x h (``LanguageModelEmbedding.word_embeddings``)."""
    return model.padded_vocab_size(1) * model.hidden_size


def output_params(model: ModelArch) -> int:
    """Output layer (``output_layer``), 0 when tied to the embedding; plus its bias with ``output_layer_bias``."""
    bias = model.padded_vocab_size(1) if model.output_layer_bias else 0
    return (embedding_params(model) if model.untie_embeddings_and_output_weights else 0) + bias


def final_norm_params(model: ModelArch) -> int:
    """``decoder.final_layernorm``."""
    return _norm(model, model.hidden_size)


COMPONENTS = ("embedding", "output_layer", "attention", "mixer", "dense_mlp", "routed_experts", "shared_experts",
              "router", "norms", "mtp")


def count_params(model: ModelArch) -> ParamCounts:
    """Total, active-per-token and per-component parameter counts (conventions in the module doc)."""
    layers = LayerParams()
    active_layers = 0.0
    for i in range(model.num_layers):
        lp = layer_params(model, i)
        layers = layers + lp
        active_layers += lp.active(model)
    emb, out, fnorm = embedding_params(model), output_params(model), final_norm_params(model)
    mtp = mtp_params(model)
    by = {
        "embedding": emb,
        "output_layer": out,
        "attention": layers.attention,
        "mixer": layers.mixer,
        "dense_mlp": layers.dense_mlp,
        "routed_experts": layers.routed_experts,
        "shared_experts": layers.shared_experts + layers.moe_latent_proj,
        "router": layers.router,
        "norms": layers.norms + fnorm,
        "mtp": mtp,
    }
    total_main = emb + out + fnorm + layers.total
    active = round(emb + out + fnorm + active_layers)
    mtp_active = 0.0
    if model.mtp_num_layers:
        blk = LayerParams()
        act = 0.0
        for mixer, mlp in mtp_block_layers(model):
            lp = _layer_params(model, mixer, mlp)
            blk = blk + lp
            act += lp.active(model)
        mtp_active = model.mtp_num_layers * (mtp_extra_params(model) + act)
    assumptions = (
        "total includes MTP; total_without_mtp is the main model (published totals)",
        "active excludes MTP; routed experts counted k/E, shared experts, embedding and output counted fully",
        f"vocab padded to a multiple of {model.make_vocab_size_divisible_by} (TP=1)",
    )
    return ParamCounts(total=total_main + mtp, active=active, total_without_mtp=total_main,
                       active_with_mtp=round(active + mtp_active), by_component=by, assumptions=assumptions)


# --------------------------------------------------------------------------------------------------------------
# LoRA adapters (parameter-efficient fine-tuning)


@dataclass(frozen=True)
class LoraAdapter:
    """One LoRA adapter of a decoder layer: A (``d_in`` x r) then B (r x ``d_out``) next to the frozen linear
    ``module`` (Megatron-Bridge ``peft/lora.py`` ``LoRA.transform`` -> ``peft/utils.py`` ``ParallelLinearAdapter``).

    Both matrices are split over TP whatever the base layer's parallel style: for a row-parallel base
    (``linear_proj``, ``linear_fc2``: ``input_is_parallel``) ``linear_in`` is a ``RowParallelLinear`` (d_in / TP x r)
    and ``linear_out`` a ``ColumnParallelLinear`` (r x d_out / TP); for a column-parallel base (``linear_qkv``,
    ``linear_fc1``) ``linear_in`` is a ``ColumnParallelLinear`` with ``gather_output=True`` (d_in x r / TP) and
    ``linear_out`` a ``ColumnParallelLinear`` (r x d_out / TP). So one TP rank holds r (d_in + d_out) / TP.
    ``expert``: the adapter of the routed experts' grouped linear; with Bridge's default ``share_expert_adapters =
    True`` one adapter serves all local experts of an EP rank (split over ETP like the experts), and every routed
    token of the rank goes through it."""

    module: str
    d_in: int
    d_out: int
    expert: bool = False

    def params(self, dim: int) -> int:
        """r (d_in + d_out): A and B of rank ``dim`` (no biases: Bridge builds both with ``bias=False``)."""
        return dim * (self.d_in + self.d_out)


def lora_adapters(model: ModelArch, mixer: str, mlp: str, targets: tuple[str, ...]) -> tuple[LoraAdapter, ...]:
    """The LoRA adapters of a decoder layer of kind (mixer, mlp) for Bridge ``target_modules`` names.

    Bridge matches a module by its attribute name (``ModuleMatcher``): ``linear_qkv`` exists in GQA / MHA attention
    (h -> q + 2 kv [+ q with the output gate], as :func:`attention_params`), ``linear_proj`` in GQA / MHA and MLA
    attention (q (MLA: n d_v) -> h), ``linear_fc1`` / ``linear_fc2`` in the dense MLP, the shared experts and the
    routed experts (h -> f (x2 with GLU) -> h, :func:`mlp_params`). MLA's down/up projections and the Mamba /
    linear-attention projections have other names: the default targets put no adapter on them."""
    h = model.hidden_size
    out: list[LoraAdapter] = []
    if mixer in ("A", "W"):
        if model.multi_latent_attention:
            q_w = model.num_attention_heads * (model.v_head_dim or 0)
        else:
            d = model.head_dim
            q_w = model.num_attention_heads * d
            if "linear_qkv" in targets:
                kv_w = model.query_groups * d
                out.append(LoraAdapter("linear_qkv", h, q_w + 2 * kv_w + (q_w if model.attention_output_gate else 0)))
        if "linear_proj" in targets:
            out.append(LoraAdapter("linear_proj", q_w, h))
    glu = 2 if model.gated_linear_unit else 1
    widths: list[tuple[int, bool]] = []
    if mlp == "D":
        widths.append((model.ffn_hidden_size, False))
    elif mlp == "E":
        if model.moe_shared_expert_intermediate_size:
            widths.append((model.moe_shared_expert_intermediate_size, False))
        widths.append((model.moe_ffn_hidden_size or 0, True))
    for f, expert in widths:
        d_in = int(model.moe_latent_size or h) if expert else h
        if "linear_fc1" in targets:
            out.append(LoraAdapter("linear_fc1", d_in, f * glu, expert))
        if "linear_fc2" in targets:
            out.append(LoraAdapter("linear_fc2", f, d_in, expert))
    return tuple(out)

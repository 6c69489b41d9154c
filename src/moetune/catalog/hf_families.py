"""Per-family mapping of Hugging Face MoE / hybrid configs to :class:`~moetune.spec.model.ModelArch` fields.

Each builder reads one ``model_type`` the way the transformers model class (``transformers/models/<type>/
modeling_<type>.py``, v5) builds its modules, and the Megatron-Bridge bridges
(``src/megatron/bridge/models/*/*_bridge.py``) name the Megatron fields. Both the current field names and the older
ones are read (``num_local_experts`` / ``num_experts`` for Qwen3-MoE; ``mlp_layer_types`` / ``first_k_dense_replace``
for the DeepSeek family, ...). Layer patterns follow the model classes exactly:

* ``decoder_sparse_step`` / ``mlp_only_layers`` (Qwen2/3-MoE, Qwen3-Next): layer i is MoE iff i is not in
  ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0`` (step 2 gives DEDE...);
* ``first_k_dense_replace`` (DeepSeek-V2/V3/V3.2, GLM-4.5, dots.llm1, Kimi): layers ``i >= k`` are MoE (transformers
  ignores DeepSeek's ``moe_layer_freq``; AXK-style configs apply ``i % moe_layer_freq == 0``);
* ``interleave_moe_layer_step`` / ``moe_layers`` (Llama-4): MoE iff ``(i + 1) % step == 0``, or the listed layers;
* ``moe_layer_start_index`` / ``moe_layer_end_index`` / ``moe_layer_interval`` (ERNIE-4.5);
* ``attn_layer_period`` / ``attn_layer_offset`` / ``expert_layer_period`` / ``expert_layer_offset`` (Jamba);
* ``layer_types`` (full / sliding / linear attention, Mamba) and ``mlp_layer_types`` (dense / sparse) whenever the
  config carries them (what transformers 5 writes), which take precedence as they do in the model classes.

Layers moetune reads and counts exactly but prices with a stand-in formula (lightning attention, Kimi delta attention,
Mamba-1, the DSA indexer) are listed in ``ModelArch.approximations``, which every estimate prints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moetune.catalog.hf_config import MAX_EXPERTS, MAX_LAYERS, MAX_VOCAB, Cfg
from moetune.errors import InputError

Builder = Callable[[Cfg], dict[str, Any]]

_MLP_TYPES = {"dense": "D", "sparse": "E", "moe": "E"}
_ATTN_TYPES = {"full_attention": "A", "sliding_attention": "W", "attention": "A"}

APPROX_LINEAR = ("{what} layers are counted exactly but priced with the gated-DeltaNet formulas (FLOPs, activation "
                 "memory, time of the 'G' mixer): the compute and activation walls of those layers are approximate")
APPROX_MAMBA1 = ("Mamba-1 layers (Jamba) are counted exactly but priced with the Mamba-2 (SSD) formulas: the compute "
                 "and activation walls of those layers are approximate")
APPROX_DSA = ("the DeepSeek sparse-attention indexer is counted in the weights (memory exact) but its FLOPs and "
              "activations are not priced, and attention is priced dense: the compute and activation walls are "
              "approximate")


# --- shared pieces ------------------------------------------------------------------------------------------------
def trunk(c: Cfg, L: int, *, tie_default: bool = False, h_key: str | tuple[str, ...] = "hidden_size",
          vocab_key: str = "vocab_size") -> dict[str, Any]:
    """Layers, width, vocabulary, tying."""
    return dict(num_layers=L, hidden_size=c.int(h_key), vocab_size=c.int(vocab_key, hi=MAX_VOCAB),
                untie_embeddings_and_output_weights=not c.bool("tie_word_embeddings", tie_default))


def gqa(c: Cfg, h: int, *, qk_norm: bool = False, full_width_norm: bool = False, bias: bool | None = None,
        qkv_bias: bool | None = None, heads_key: str | tuple[str, ...] = "num_attention_heads",
        kv_key: str | tuple[str, ...] = "num_key_value_heads") -> dict[str, Any]:
    """GQA / MHA attention: heads, KV heads, head dim (``head_dim`` or h / heads), ``attention_bias`` on q, k, v, o."""
    heads = c.int(heads_key, hi=MAX_EXPERTS)
    kv = c.int(kv_key, heads, hi=MAX_EXPERTS)
    hd = c.int("head_dim", None)
    if hd is None:
        if h // heads < 1:
            raise c.fail("num_attention_heads", heads, f"at most hidden_size ({h}) when head_dim is not given")
        hd = h // heads
    b = c.bool("attention_bias", False) if bias is None else bias
    return dict(num_attention_heads=heads, num_query_groups=kv, kv_channels=hd,
                add_qkv_bias=b if qkv_bias is None else qkv_bias, add_proj_bias=b, qk_layernorm=qk_norm,
                qk_layernorm_full_width=full_width_norm)


def moe(c: Cfg, *, experts: str | tuple[str, ...] = ("num_experts", "num_local_experts", "n_routed_experts"),
        topk: str | tuple[str, ...] = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k"),
        width: str | tuple[str, ...] = "moe_intermediate_size", shared: int | None = None,
        shared_gate: bool = False, expert_bias: bool = False, score: str = "softmax") -> dict[str, Any]:
    """Routed experts, top-k, per-expert width, shared expert(s) of total width ``shared``.

    The router score function is the config's ``scoring_func`` when it has one (DeepSeek-V2/V3, Kimi-K2 write
    ``softmax`` / ``sigmoid``), else ``score``: the function the family's transformers router applies (e.g.
    ``Llama4TextMoe`` takes ``torch.sigmoid`` of the top-k logits), mapped to Megatron's ``moe_router_score_function``.
    """
    e = c.int(experts, hi=MAX_EXPERTS)
    func = c.raw("scoring_func", score)
    if func not in ("softmax", "sigmoid"):
        raise c.fail("scoring_func", func, "softmax or sigmoid")
    k = c.int(topk, hi=MAX_EXPERTS)
    topk_keys = (topk,) if isinstance(topk, str) else topk
    key = next((t for t in topk_keys if c.has(t)), topk_keys[0])
    return dict(num_moe_experts=e, moe_router_topk=k, moe_ffn_hidden_size=c.int(width),
                moe_shared_expert_intermediate_size=shared or None, moe_shared_expert_gate=bool(shared) and shared_gate,
                moe_router_enable_expert_bias=expert_bias, moe_router_score_function=func, _topk_key=key)


def mlp_pattern(c: Cfg, L: int, is_moe: Callable[[int], bool]) -> str:
    """``mlp_layer_types`` when present (transformers 5 writes it), else the family's legacy rule."""
    t = c.types("mlp_layer_types", L, _MLP_TYPES)
    if t is not None:
        return t
    return "".join("E" if is_moe(i) else "D" for i in range(L))


def attn_pattern(c: Cfg, L: int, allowed: dict[str, str] | None = None,
                 default: Callable[[int], str] | None = None) -> str:
    """``layer_types`` when present, else ``default(i)`` (full attention)."""
    t = c.types("layer_types", L, allowed or _ATTN_TYPES)
    if t is not None:
        return t
    return "".join(default(i) if default else "A" for i in range(L))


def window(c: Cfg, mixer: str) -> dict[str, Any]:
    return {"window_size": c.int("sliding_window")} if "W" in mixer else {}


def first_k_dense(c: Cfg, L: int, default_k: int = 0, *, freq_key: str | None = None) -> str:
    k = c.int("first_k_dense_replace", default_k, lo=0, hi=MAX_LAYERS)
    freq = c.int(freq_key, 1, hi=MAX_LAYERS) if freq_key else 1
    return mlp_pattern(c, L, lambda i: i >= k and i % freq == 0)


def qwen_sparse_step(c: Cfg, L: int, experts: int) -> str:
    """Qwen2/3-MoE rule (``Qwen3MoeDecoderLayer``): MoE iff i not in mlp_only_layers and (i + 1) % step == 0."""
    step = c.int("decoder_sparse_step", 1, hi=MAX_LAYERS)
    only = set(c.int_list("mlp_only_layers") or [])
    return mlp_pattern(c, L, lambda i: i not in only and experts > 0 and (i + 1) % step == 0)


# --- families -----------------------------------------------------------------------------------------------------
def _qwen_moe(c: Cfg, family: str, *, qwen2: bool) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    shared = c.int("shared_expert_intermediate_size", 0, lo=0) if qwen2 else 0
    kw.update(gqa(c, kw["hidden_size"], qk_norm=not qwen2,
                  qkv_bias=c.bool("qkv_bias", True) if qwen2 else None))
    if qwen2:
        kw["add_proj_bias"] = False
    kw.update(moe(c, shared=shared, shared_gate=True))
    mixer = attn_pattern(c, L)
    kw.update(family=family, ffn_hidden_size=c.int("intermediate_size", 0, lo=0), mixer_pattern=mixer,
              mlp_pattern=qwen_sparse_step(c, L, kw["num_moe_experts"]), **window(c, mixer))
    return kw


def _qwen3_next(c: Cfg, family: str = "qwen3_next") -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    interval = c.int("full_attention_interval", 4, hi=MAX_LAYERS)
    mixer = attn_pattern(c, L, {"full_attention": "A", "linear_attention": "G"},
                         lambda i: "A" if (i + 1) % interval == 0 else "G")
    shared = c.int("shared_expert_intermediate_size", 0, lo=0)
    kw.update(gqa(c, kw["hidden_size"], qk_norm=True))
    kw.update(moe(c, shared=shared, shared_gate=True))
    kw.update(
        family=family, ffn_hidden_size=c.int("intermediate_size", 0, lo=0), mixer_pattern=mixer,
        mlp_pattern=qwen_sparse_step(c, L, kw["num_moe_experts"]), attention_output_gate=True,
        linear_key_head_dim=c.int("linear_key_head_dim"), linear_value_head_dim=c.int("linear_value_head_dim"),
        linear_num_key_heads=c.int("linear_num_key_heads"), linear_num_value_heads=c.int("linear_num_value_heads"),
        linear_conv_kernel_dim=c.int("linear_conv_kernel_dim", 4),
        mtp_num_layers=c.int(("num_nextn_predict_layers", "mtp_num_hidden_layers"), 0, lo=0, hi=64),
    )
    return kw


def _mixtral_like(c: Cfg, family: str, *, width_key: str = "intermediate_size", **attn: Any) -> dict[str, Any]:
    """Every layer MoE, no shared expert (Mixtral, OLMoE, GraniteMoE, PhiMoE, MiniMax-M2, FlexOlmo)."""
    L = c.layers()
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"], **attn))
    kw.update(moe(c, width=width_key))
    mixer = attn_pattern(c, L)
    kw.update(family=family, ffn_hidden_size=c.int(width_key), mixer_pattern=mixer, mlp_pattern="E" * L,
              **window(c, mixer))
    return kw


def _mixtral(c: Cfg) -> dict[str, Any]:
    return _mixtral_like(c, "mixtral")


def _olmoe(c: Cfg) -> dict[str, Any]:
    return _mixtral_like(c, "olmoe", qk_norm=True, full_width_norm=True)


def _flex_olmo(c: Cfg) -> dict[str, Any]:
    # OLMo-2 style: full-width q/k norms, norms after attention and after the MLP (two per layer, as pre-norms)
    return _mixtral_like(c, "flex_olmo", qk_norm=True, full_width_norm=True)


def _granitemoe(c: Cfg, family: str = "granitemoe") -> dict[str, Any]:
    kw = _mixtral_like(c, family)
    shared = c.int("shared_intermediate_size", 0, lo=0)
    if shared:
        kw["moe_shared_expert_intermediate_size"] = shared
    return kw


def _phimoe(c: Cfg) -> dict[str, Any]:
    kw = _mixtral_like(c, "phimoe")
    kw.update(normalization="LayerNorm", output_layer_bias=c.bool("lm_head_bias", False))
    return kw


def _minimax_m2(c: Cfg) -> dict[str, Any]:
    kw = _mixtral_like(c, "minimax_m2", qk_norm=c.bool("use_qk_norm", True), full_width_norm=True)
    kw["moe_router_enable_expert_bias"] = True
    return kw


def _gpt_oss(c: Cfg) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"], bias=c.bool("attention_bias", True)))
    f = c.int("intermediate_size")
    mixer = attn_pattern(c, L, default=lambda i: "W" if i % 2 == 0 else "A")
    kw.update(moe(c, width="intermediate_size"))
    kw.update(family="gpt_oss", ffn_hidden_size=f, mixer_pattern=mixer, mlp_pattern="E" * L, add_bias_linear=True,
              add_qkv_bias=False, add_proj_bias=False, softmax_sinks=True, activation="swiglu_clamped",
              **window(c, mixer))
    return kw


def _mla(c: Cfg) -> dict[str, Any]:
    """Multi-latent attention fields (HF ``DeepseekV3Attention``)."""
    if c.bool("attention_bias", False):
        raise c.fail("attention_bias", True, "false (biases on the MLA projections are not modelled)")
    q_lora = c.int("q_lora_rank", None)
    return dict(multi_latent_attention=True, q_lora_rank=q_lora, kv_lora_rank=c.int("kv_lora_rank"),
                qk_head_dim=c.int("qk_nope_head_dim"), qk_pos_emb_head_dim=c.int("qk_rope_head_dim"),
                v_head_dim=c.int("v_head_dim"), kv_channels=c.int("v_head_dim"),
                num_attention_heads=c.int("num_attention_heads", hi=MAX_EXPERTS))


def _deepseek(c: Cfg, family: str = "deepseek", *, expert_bias: bool | None = None, dense_k: int = 0,
              dsa: bool = False, freq: bool = False) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    kw.update(_mla(c))
    fm = c.int("moe_intermediate_size")
    n_shared = c.int("n_shared_experts", 0, lo=0, hi=MAX_EXPERTS)
    bias = expert_bias if expert_bias is not None else True
    kw.update(moe(c, experts=("n_routed_experts", "num_experts", "num_local_experts"), shared=fm * n_shared,
                  expert_bias=bias))
    n_group = c.int("n_group", 1, hi=MAX_EXPERTS)
    mtype = c.data.get("model_type")
    kw.update(
        family=family, ffn_hidden_size=c.int("intermediate_size"), mixer_pattern="A" * L,
        mlp_pattern=first_k_dense(c, L, dense_k, freq_key="moe_layer_freq" if freq else None),
        moe_router_num_groups=n_group if n_group > 1 else None,
        moe_router_group_topk=c.int("topk_group", None, hi=MAX_EXPERTS) if n_group > 1 else None,
        mtp_num_layers=c.int("num_nextn_predict_layers", 0, lo=0, hi=64),
        # Bridge deepseek_v3_bridge / kimi bridge set 1280; DeepSeekModelProvider (V2) defaults to 3200
        make_vocab_size_divisible_by=3200 if mtype == "deepseek_v2" else 1280,
    )
    if dsa:
        kw.update(dsa_indexer_n_heads=c.int("index_n_heads"), dsa_indexer_head_dim=c.int("index_head_dim"),
                  approximations=(APPROX_DSA,))
    return kw


def _deepseek_v2(c: Cfg) -> dict[str, Any]:
    # HF DeepseekV2Moe: no e_score_correction_bias (V2 routing is greedy / group-limited softmax)
    return _deepseek(c, expert_bias=False)


def _dots1(c: Cfg) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"], qk_norm=True))
    fm = c.int("moe_intermediate_size")
    n_shared = c.int("n_shared_experts", 0, lo=0, hi=MAX_EXPERTS)
    kw.update(moe(c, experts=("n_routed_experts", "num_experts"), shared=fm * n_shared, expert_bias=True))
    mixer = attn_pattern(c, L, default=lambda i: "A")
    kw.update(family="dots1", ffn_hidden_size=c.int("intermediate_size"), mixer_pattern=mixer,
              mlp_pattern=first_k_dense(c, L), **window(c, mixer))
    return kw


def _glm4_moe(c: Cfg) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"], qk_norm=c.bool("use_qk_norm", False)))
    kw["add_proj_bias"] = False  # Glm4MoeAttention: bias on q/k/v only
    fm = c.int("moe_intermediate_size")
    n_shared = c.int("n_shared_experts", 0, lo=0, hi=MAX_EXPERTS)
    kw.update(moe(c, experts=("n_routed_experts", "num_experts"), shared=fm * n_shared, expert_bias=True))
    kw.update(family="glm4_moe", ffn_hidden_size=c.int("intermediate_size"), mixer_pattern="A" * L,
              mlp_pattern=first_k_dense(c, L), mtp_num_layers=c.int("num_nextn_predict_layers", 0, lo=0, hi=64))
    return kw


def _llama4(c: Cfg) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"]))
    step = c.int("interleave_moe_layer_step", 1, hi=MAX_LAYERS)
    listed = c.int_list("moe_layers", hi=MAX_LAYERS - 1)
    if listed is not None:
        chosen = set(listed)
        mlp = "".join("E" if i in chosen else "D" for i in range(L))
    else:  # Llama4TextConfig: moe_layers = range(step - 1, L, step)
        mlp = "".join("E" if (i + 1) % step == 0 else "D" for i in range(L))
    f_exp = c.int("intermediate_size")
    kw.update(moe(c, experts=("num_local_experts", "num_experts"), width="intermediate_size", shared=f_exp,
                  score="sigmoid"))
    kw.update(family="llama4", ffn_hidden_size=c.int("intermediate_size_mlp", f_exp), mixer_pattern="A" * L,
              mlp_pattern=mlp)
    return kw


def _ernie(c: Cfg) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L, tie_default=True)
    if c.bool("use_bias", False):
        raise c.fail("use_bias", True, "false (ERNIE's use_bias biases are not modelled)")
    kw.update(gqa(c, kw["hidden_size"], bias=False))
    start = c.int("moe_layer_start_index", 1, lo=0, hi=MAX_LAYERS)
    end = c.int("moe_layer_end_index", -1, lo=-1, hi=MAX_LAYERS)
    end = L - 1 if end == -1 else end
    interval = c.int("moe_layer_interval", 1, hi=MAX_LAYERS)
    fm = c.int("moe_intermediate_size")
    n_shared = c.int("moe_num_shared_experts", 0, lo=0, hi=MAX_EXPERTS)
    kw.update(moe(c, experts=("moe_num_experts", "num_experts"), topk=("moe_k", "num_experts_per_tok"),
                  shared=fm * n_shared, expert_bias=True))  # Ernie4_5_MoeStatics: always
    kw.update(family="ernie4_5_moe", ffn_hidden_size=c.int("intermediate_size"), mixer_pattern="A" * L,
              mlp_pattern=mlp_pattern(c, L, lambda i: (i + 1) % interval == 0 and start <= i <= end))
    return kw


def _hunyuan(c: Cfg) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"], qk_norm=c.bool("use_qk_norm", True)))

    def uniform(key: str) -> int:
        v = c.raw(key)
        if isinstance(v, list):
            vals = {c.check_int(f"{key}[{i}]", x, hi=MAX_EXPERTS) for i, x in enumerate(v)}
            if len(vals) != 1:
                raise c.fail(key, v, "the same value for every layer (per-layer expert counts are not modelled)")
            return vals.pop()
        return c.int(key, hi=MAX_EXPERTS)

    e, k = uniform("num_experts"), uniform("moe_topk")
    f = c.int("intermediate_size")
    kw.update(family="hunyuan_v1_moe", ffn_hidden_size=f, mixer_pattern="A" * L, mlp_pattern="E" * L,
              num_moe_experts=e, moe_router_topk=k, moe_ffn_hidden_size=f, moe_shared_expert_intermediate_size=f,
              _topk_key="moe_topk")
    return kw


def _dbrx(c: Cfg) -> dict[str, Any]:
    L = c.layers("n_layers")
    h = c.int("d_model")
    heads = c.int("n_heads", hi=MAX_EXPERTS)
    attn, ffn = c.sub("attn_config"), c.sub("ffn_config")
    kv = attn.int("kv_n_heads", 1, hi=MAX_EXPERTS)
    f = ffn.int("ffn_hidden_size", 3584)
    e = ffn.int("moe_num_experts", 4, hi=MAX_EXPERTS)
    k = ffn.int("moe_top_k", 1, hi=MAX_EXPERTS)
    if k > e:
        raise ffn.fail("moe_top_k", k, f"at most ffn_config.moe_num_experts ({e})")
    if h // heads < 1:
        raise c.fail("n_heads", heads, f"at most d_model ({h})")
    # DbrxBlock: LayerNorm(bias=False) = one weight vector, as RMSNorm counts it
    return dict(num_layers=L, hidden_size=h, vocab_size=c.int("vocab_size", hi=MAX_VOCAB),
                untie_embeddings_and_output_weights=not c.bool("tie_word_embeddings", False), family="dbrx",
                num_attention_heads=heads, num_query_groups=kv, kv_channels=h // heads, ffn_hidden_size=f,
                mixer_pattern="A" * L, mlp_pattern="E" * L, num_moe_experts=e, moe_router_topk=k,
                moe_ffn_hidden_size=f)


def _minimax(c: Cfg) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"]))
    # MiniMaxConfig: layer_types, else layers_block_type (legacy), else attn_type_list (0 = linear, 1 = full)
    legacy = c.raw("attn_type_list")
    if not c.has("layer_types") and isinstance(legacy, list):
        c.data = {**c.data, "layer_types": ["full_attention" if x == 1 else "linear_attention" for x in legacy]}
    mixer = attn_pattern(c, L, {"full_attention": "A", "linear_attention": "G"},
                         lambda i: "A" if (i + 1) % 2 == 0 else "G")
    kw.update(moe(c, experts=("num_local_experts", "num_experts"), width="intermediate_size"))
    kw.update(family="minimax", ffn_hidden_size=c.int("intermediate_size"), mixer_pattern=mixer, mlp_pattern="E" * L)
    if "G" in mixer:
        n, d = kw["num_attention_heads"], kw["kv_channels"]
        kw.update(linear_attention_kind="lightning", linear_key_head_dim=d, linear_value_head_dim=d,
                  linear_num_key_heads=n, linear_num_value_heads=n, approximations=(
                      APPROX_LINEAR.format(what="MiniMax lightning-attention"),))
    return kw


def _kimi_linear(c: Cfg) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    lin = c.sub("linear_attn_config")
    if not c.has("layer_types") and lin.has("full_attn_layers") and lin.has("kda_layers"):
        types: list[Any] = [None] * L
        for key, name in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            for x in lin.int_list(key, lo=1, hi=L) or []:
                types[x - 1] = name  # 1-based in the checkpoint
        c.data = {**c.data, "layer_types": types}
    mixer = attn_pattern(c, L, {"full_attention": "A", "linear_attention": "G"},
                         lambda i: "A" if i and i % 4 == 0 else "G")
    kw.update(_mla(c))
    fm = c.int("moe_intermediate_size")
    n_shared = c.int(("num_shared_experts", "n_shared_experts"), 0, lo=0, hi=MAX_EXPERTS)
    kw.update(moe(c, experts=("num_local_experts", "num_experts", "n_routed_experts"), shared=fm * n_shared,
                  expert_bias=True))
    n = lin.int("num_heads", None) or c.int("linear_num_heads", 32)
    d = lin.int("head_dim", None) or c.int("linear_head_dim", 128)
    kconv = lin.int("short_conv_kernel_size", None) or c.int("linear_conv_kernel_dim", 4)
    kw.update(family="kimi_linear", ffn_hidden_size=c.int("intermediate_size"), mixer_pattern=mixer,
              mlp_pattern=first_k_dense(c, L, 1), linear_attention_kind="kda", linear_key_head_dim=d,
              linear_value_head_dim=d, linear_num_key_heads=n, linear_num_value_heads=n, linear_conv_kernel_dim=kconv,
              make_vocab_size_divisible_by=128)
    if "G" in mixer:
        kw["approximations"] = (APPROX_LINEAR.format(what="Kimi delta-attention (KDA)"),)
    return kw


def _jamba(c: Cfg) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"], bias=False))
    ap, ao = c.int("attn_layer_period", 8, hi=MAX_LAYERS), c.int("attn_layer_offset", 4, lo=0, hi=MAX_LAYERS)
    ep, eo = c.int("expert_layer_period", 2, hi=MAX_LAYERS), c.int("expert_layer_offset", 1, lo=0, hi=MAX_LAYERS)
    if ao >= ap:
        raise c.fail("attn_layer_offset", ao, f"less than attn_layer_period ({ap})")
    if eo >= ep:
        raise c.fail("expert_layer_offset", eo, f"less than expert_layer_period ({ep})")
    mixer = attn_pattern(c, L, {"attention": "A", "mamba": "M"}, lambda i: "A" if i % ap == ao else "M")
    kw.update(moe(c, experts=("num_experts", "num_local_experts"), width="intermediate_size"))
    h = kw["hidden_size"]
    d_in = c.int("mamba_expand", 2, hi=64) * h
    dt_rank = c.raw("mamba_dt_rank", "auto")
    dt_rank = -(-h // 16) if dt_rank == "auto" else c.int("mamba_dt_rank")
    kw.update(family="jamba", ffn_hidden_size=c.int("intermediate_size"), mixer_pattern=mixer,
              mlp_pattern=mlp_pattern(c, L, lambda i: i % ep == eo), mamba_version=1,
              # Mamba-1 has no heads; d_inner is split into 64-wide "heads" so that TP divisibility checks d_inner
              mamba_num_heads=d_in // 64 if d_in % 64 == 0 else 1, mamba_head_dim=64 if d_in % 64 == 0 else d_in,
              mamba_num_groups=1, mamba_state_dim=c.int("mamba_d_state", 16),
              mamba_d_conv=c.int("mamba_d_conv", 4, hi=64), mamba_dt_rank=dt_rank, mamba_inner_layernorms=True,
              mamba_conv_bias=c.bool("mamba_conv_bias", True), mamba_proj_bias=c.bool("mamba_proj_bias", False))
    if "M" in mixer:
        kw["approximations"] = (APPROX_MAMBA1,)
    if kw["num_moe_experts"] == 1:  # JambaConfig: one "expert" is a plain MLP
        kw["mlp_pattern"] = "D" * L
    return kw


def _granitemoehybrid(c: Cfg) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"]))
    # GraniteMoeHybridConfig (v5): "linear_attention" = Mamba-2, "full_attention"; older: "mamba", "attention"
    mixer = attn_pattern(c, L, {"attention": "A", "full_attention": "A", "mamba": "M", "linear_attention": "M"},
                         lambda i: "M")
    h = kw["hidden_size"]
    shared = c.int("shared_intermediate_size", 0, lo=0)
    experts = c.int("num_local_experts", 0, lo=0, hi=MAX_EXPERTS)
    if experts:
        kw.update(moe(c, experts="num_local_experts", width="intermediate_size", shared=shared))
        mlp = "E" * L
        f = c.int("intermediate_size")
    else:  # GraniteMoeHybridDecoderLayer without experts: the shared MLP alone
        mlp, f = "D" * L, shared
    n_heads = c.int("mamba_n_heads", 128, hi=MAX_EXPERTS)
    d_in = c.int("mamba_expand", 2, hi=64) * h
    head = c.raw("mamba_d_head", "auto")
    head = d_in // n_heads if head == "auto" else c.int("mamba_d_head")
    kw.update(family="granitemoehybrid", ffn_hidden_size=f, mixer_pattern=mixer, mlp_pattern=mlp,
              mamba_num_heads=n_heads, mamba_head_dim=head, mamba_num_groups=c.int("mamba_n_groups", 1),
              mamba_state_dim=c.int("mamba_d_state", 256), mamba_d_conv=c.int("mamba_d_conv", 4, hi=64),
              mamba_conv_bias=c.bool("mamba_conv_bias", True), mamba_proj_bias=c.bool("mamba_proj_bias", False))
    return kw


_HYBRID_MIXER = {"M": "M", "*": "A", "-": "_", "E": "_"}
_HYBRID_MLP = {"M": "_", "*": "_", "-": "D", "E": "E"}


def _hybrid_chars(c: Cfg, key: str, pattern: str) -> tuple[str, str]:
    bad = sorted(set(pattern) - set(_HYBRID_MIXER))
    if bad:
        raise c.fail(key, pattern, f"only the symbols M, *, -, E (got {bad})")
    return "".join(_HYBRID_MIXER[ch] for ch in pattern), "".join(_HYBRID_MLP[ch] for ch in pattern)


_BLOCK_TYPES = {"linear_attention": "M", "mamba": "M", "moe": "E", "full_attention": "*", "attention": "*",
                "mlp": "-"}


def _block_pattern(c: Cfg, pattern_key: str, list_key: str, n: int | None = None) -> tuple[str, str] | None:
    """NemotronH layers: the legacy ``hybrid_override_pattern`` string or the transformers-5 ``layers_block_type``."""
    if c.has(pattern_key):
        pattern = c.str(pattern_key)
        if not 0 < len(pattern) <= MAX_LAYERS:
            raise c.fail(pattern_key, f"{len(pattern)} layers", f"1 to {MAX_LAYERS} layers")
        return pattern_key, pattern
    v = c.raw(list_key)
    if v is None:
        return None
    if not isinstance(v, list) or not 0 < len(v) <= MAX_LAYERS:
        raise c.fail(list_key, v, f"a list of 1 to {MAX_LAYERS} block types")
    return list_key, c.types(list_key, len(v), _BLOCK_TYPES)


def _nemotron_h(c: Cfg) -> dict[str, Any]:
    found = _block_pattern(c, "hybrid_override_pattern", "layers_block_type")
    if found is None:
        raise c.missing(("layers_block_type", "hybrid_override_pattern"))
    key, pattern = found
    L = len(pattern) if key == "layers_block_type" else c.layers("num_hidden_layers", len(pattern))
    if len(pattern) != L:
        raise c.fail(key, f"{len(pattern)} layers", f"{L} (num_hidden_layers)")
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"]))
    mixer, mlp = _hybrid_chars(c, key, pattern)
    act = c.str("mlp_hidden_act", "relu2")
    kw.update(family="nemotron_h", ffn_hidden_size=c.int("intermediate_size", 0, lo=0), mixer_pattern=mixer,
              mlp_pattern=mlp, gated_linear_unit=False, activation="squared_relu" if act == "relu2" else "gelu",
              mamba_state_dim=c.int("ssm_state_size"), mamba_head_dim=c.int("mamba_head_dim"),
              mamba_num_heads=c.int("mamba_num_heads", hi=MAX_EXPERTS), mamba_num_groups=c.int("n_groups", 1),
              mamba_d_conv=c.int("conv_kernel", 4, hi=64), add_qkv_bias=False, add_proj_bias=False)
    if "E" in mlp:
        kw.update(moe(c, experts=("n_routed_experts", "num_experts"), shared=c.int(
            "moe_shared_expert_intermediate_size", 0, lo=0), expert_bias=True))
        kw["moe_latent_size"] = c.int("moe_latent_size", None)
    depth = c.int("num_nextn_predict_layers", 0, lo=0, hi=64)
    if depth:
        found = _block_pattern(c, "mtp_hybrid_override_pattern", "mtp_layers_block_type")
        if found is None:
            raise c.missing(("mtp_layers_block_type", "mtp_hybrid_override_pattern"))
        mm, ml = _hybrid_chars(c, *found)
        kw.update(mtp_num_layers=depth, mtp_mixer_pattern=mm, mtp_mlp_pattern=ml)
    return kw


def _generic_moe(c: Cfg, family: str, *, qk_norm: bool, shared_key: str | None = None,
                 n_shared_key: str | tuple[str, ...] | None = None, expert_bias: bool = False, sinks: bool = False,
                 is_moe: Callable[[int], bool] | None = None) -> dict[str, Any]:
    """A Llama-style attention + MoE decoder read from ``layer_types`` / ``mlp_layer_types`` (Solar-Open, EXAONE-MoE,
    Hunyuan-V3, Mellum, Flint, ...): per-head q/k norms with ``qk_norm``, shared expert(s) of
    ``shared_key`` width or ``n_shared_key`` x ``moe_intermediate_size``, learned sinks with ``sinks``."""
    L = c.layers()
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"], qk_norm=qk_norm))
    fm = c.int("moe_intermediate_size")
    shared = c.int(shared_key, 0, lo=0) if shared_key else 0
    if n_shared_key:
        shared = fm * c.int(n_shared_key, 0, lo=0, hi=MAX_EXPERTS)
    kw.update(moe(c, shared=shared, expert_bias=expert_bias))
    mixer = attn_pattern(c, L)
    rule = is_moe or (lambda i: True)
    kw.update(family=family, ffn_hidden_size=c.int("intermediate_size", 0, lo=0), mixer_pattern=mixer,
              mlp_pattern=mlp_pattern(c, L, rule), softmax_sinks=sinks, **window(c, mixer))
    return kw


def _flint(c: Cfg) -> dict[str, Any]:
    kw = _generic_moe(c, "flint", qk_norm=True, shared_key="shared_expert_intermediate_size", sinks=True)
    kw["mlp_pattern"] = qwen_sparse_step(c, kw["num_layers"], kw["num_moe_experts"])  # FlintDecoderLayer: Qwen rule
    return kw


def _granitemoe_swa(c: Cfg) -> dict[str, Any]:
    kw = _granitemoe(c, "granitemoe_swa")
    kw["softmax_sinks"] = True
    return kw


def _afmoe(c: Cfg) -> dict[str, Any]:
    """AFMoE (``AfmoeDecoderLayer``): gated attention (sigmoid gate of the query width), q/k norms, norms before and
    after attention and MLP, ``num_dense_layers`` dense layers first, a learned expert bias."""
    dense = c.int("num_dense_layers", 1, lo=0, hi=MAX_LAYERS)
    every = c.int("global_attn_every_n_layers", 4, hi=MAX_LAYERS)
    if not c.has("layer_types"):
        c.data = {**c.data, "layer_types": ["sliding_attention" if (i + 1) % every else "full_attention"
                                            for i in range(c.layers())]}
    kw = _generic_moe(c, "afmoe", qk_norm=True, n_shared_key="num_shared_experts", expert_bias=True,
                      is_moe=lambda i: i >= dense)
    kw.update(attention_output_gate=True, post_sublayer_norms=True)
    return kw


def _cohere2_moe(c: Cfg) -> dict[str, Any]:
    """Cohere2-MoE (``Cohere2MoeDecoderLayer``): attention and MLP in parallel on one input norm, experts of
    ``intermediate_size``, ``num_shared_experts`` shared experts of the same width, dense prefix layers of
    ``prefix_dense_intermediate_size``."""
    L = c.layers()
    kw = trunk(c, L, tie_default=True)
    kw.update(gqa(c, kw["hidden_size"]))
    f = c.int("intermediate_size")
    n_shared = c.int("num_shared_experts", 0, lo=0, hi=MAX_EXPERTS)
    kw.update(moe(c, width="intermediate_size", shared=f * n_shared))
    k = c.int("first_k_dense_replace", 0, lo=0, hi=MAX_LAYERS)
    mlp = mlp_pattern(c, L, lambda i: i >= k)
    mixer = attn_pattern(c, L)
    kw.update(family="cohere2_moe", ffn_hidden_size=c.int("prefix_dense_intermediate_size", f) if "D" in mlp else f,
              mixer_pattern=mixer, mlp_pattern=mlp, parallel_attention_mlp=True,
              approximations=("Cohere2-MoE runs attention and MLP in parallel; they are priced one after the other "
                              "(time walls approximate; memory exact)",), **window(c, mixer))
    return kw


def _llama(c: Cfg) -> dict[str, Any]:
    L = c.layers()
    kw = trunk(c, L)
    kw.update(gqa(c, kw["hidden_size"]))
    kw.update(family="llama", ffn_hidden_size=c.int("intermediate_size"), mixer_pattern="A" * L, mlp_pattern="D" * L)
    if c.bool("mlp_bias", False):
        raise c.fail("mlp_bias", True, "false (MLP biases without attention biases are not modelled)")
    return kw


FAMILIES: dict[str, Builder] = {
    "deepseek_v2": _deepseek_v2,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "deepseek_v32": lambda c: _deepseek(c, "deepseek_v32", dsa=True),
    "glm4_moe_lite": lambda c: _deepseek(c, "glm4_moe_lite", dense_k=1),
    "glm_moe_dsa": lambda c: _deepseek(c, "glm_moe_dsa", dsa=True, dense_k=3),
    "qwen2_moe": lambda c: _qwen_moe(c, "qwen2_moe", qwen2=True),
    "qwen3_moe": lambda c: _qwen_moe(c, "qwen3_moe", qwen2=False),
    "qwen3_next": _qwen3_next,
    "qwen3_5_moe_text": lambda c: _qwen3_next(c, "qwen3_5_moe"),
    "mixtral": _mixtral,
    "gpt_oss": _gpt_oss,
    "llama4_text": _llama4,
    "llama": _llama,
    "olmoe": _olmoe,
    "flex_olmo": _flex_olmo,
    "glm4_moe": _glm4_moe,
    "granitemoe": _granitemoe,
    "granitemoeshared": lambda c: _granitemoe(c, "granitemoeshared"),
    "granitemoehybrid": _granitemoehybrid,
    "phimoe": _phimoe,
    "ernie4_5_moe": _ernie,
    "hunyuan_v1_moe": _hunyuan,
    "dots1": _dots1,
    "dbrx": _dbrx,
    "minimax": _minimax,
    "minimax_m2": _minimax_m2,
    "kimi_linear": _kimi_linear,
    "jamba": _jamba,
    "nemotron_h": _nemotron_h,
    "sarvam_mla": lambda c: _deepseek(c, "sarvam_mla", dense_k=1),
    "sarvam_moe": lambda c: {**_glm4_moe(c), "family": "sarvam_moe"},
    "solar_open": lambda c: _generic_moe(c, "solar_open", qk_norm=False, n_shared_key="n_shared_experts",
                                         expert_bias=True),
    "exaone_moe": lambda c: _generic_moe(c, "exaone_moe", qk_norm=True, n_shared_key="num_shared_experts",
                                         expert_bias=True, is_moe=lambda i: i >= c.int(
                                             "first_k_dense_replace", 1, lo=0, hi=MAX_LAYERS)),
    "hy_v3": lambda c: _generic_moe(c, "hy_v3", qk_norm=True, n_shared_key="num_shared_experts", expert_bias=True,
                                    is_moe=lambda i: i >= c.int("first_k_dense_replace", 1, lo=0, hi=MAX_LAYERS)),
    "mellum": lambda c: _generic_moe(c, "mellum", qk_norm=True),
    "flint": _flint,
    "granitemoe_swa": _granitemoe_swa,
    "afmoe": _afmoe,
    "cohere2_moe": _cohere2_moe,
    "kolibri1": lambda c: {**_generic_moe(c, "kolibri1", qk_norm=True, shared_key="shared_expert_intermediate_size",
                                          expert_bias=True), "post_sublayer_norms": True},
}
#: Multimodal / wrapper configs whose language model is the ``text_config`` of the given type.
WRAPPERS = {"llama4": "llama4_text", "qwen3_5_moe": "qwen3_5_moe_text"}
_ARCHITECTURES = {
    "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3NextForCausalLM": "qwen3_next", "MixtralForCausalLM": "mixtral", "GptOssForCausalLM": "gpt_oss",
    "Llama4ForCausalLM": "llama4_text", "Llama4ForConditionalGeneration": "llama4", "LlamaForCausalLM": "llama",
    "OlmoeForCausalLM": "olmoe", "Glm4MoeForCausalLM": "glm4_moe", "NemotronHForCausalLM": "nemotron_h",
    "KimiLinearForCausalLM": "kimi_linear", "MiniMaxText01ForCausalLM": "minimax", "MiniMaxM1ForCausalLM": "minimax",
    "MiniMaxForCausalLM": "minimax", "MiniMaxM2ForCausalLM": "minimax_m2", "JambaForCausalLM": "jamba",
    "DbrxForCausalLM": "dbrx", "PhiMoEForCausalLM": "phimoe", "PhimoeForCausalLM": "phimoe",
    "Ernie4_5_MoeForCausalLM": "ernie4_5_moe", "HunYuanMoEV1ForCausalLM": "hunyuan_v1_moe",
    "Dots1ForCausalLM": "dots1", "GraniteMoeForCausalLM": "granitemoe",
    "GraniteMoeSharedForCausalLM": "granitemoeshared", "GraniteMoeHybridForCausalLM": "granitemoehybrid",
    "FlexOlmoForCausalLM": "flex_olmo",
}
SUPPORTED_MODEL_TYPES = tuple(sorted({*FAMILIES, *WRAPPERS}))


def builder_for(c: Cfg) -> tuple[Builder, Cfg, str]:
    """(builder, the config it reads (``text_config`` for wrappers), a note for the source)."""
    mtype = c.data.get("model_type")
    if not isinstance(mtype, str):
        if mtype is not None:
            raise c.fail("model_type", mtype, "a string naming a supported model_type")
        mtype = ""
    if mtype not in FAMILIES and mtype not in WRAPPERS:
        archs = c.data.get("architectures")
        archs = archs if isinstance(archs, list) else []
        mtype = next((_ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in _ARCHITECTURES), mtype)
    note = ""
    if mtype in WRAPPERS:
        if not isinstance(c.data.get("text_config"), dict):
            raise c.missing("text_config")
        c, note = c.sub("text_config"), " (language model: text_config)"
        mtype = WRAPPERS[mtype]
    if mtype not in FAMILIES:
        raise InputError(f"{c.path}: unsupported model_type={mtype!r}: expected one of {', '.join(SUPPORTED_MODEL_TYPES)}",
                         field="model_type", value=mtype, expected="a supported model_type")
    return FAMILIES[mtype], c, note

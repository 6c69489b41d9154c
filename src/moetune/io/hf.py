"""Read a Hugging Face ``config.json`` into a :class:`~moetune.spec.model.ModelArch`.

The mapping follows the Megatron-Bridge model bridges (``src/megatron/bridge/models/*/*_bridge.py``, which build the
Megatron provider from the same HF config) and the HF ``transformers`` model code for each family:

=================  ==========================================================================================
``model_type``     notes
=================  ==========================================================================================
deepseek_v2/v3,    MLA (q_lora_rank may be null), ``first_k_dense_replace`` dense layers then MoE every
kimi_k2            ``moe_layer_freq``; shared width = ``n_shared_experts``·``moe_intermediate_size``;
                   ``noaux_tc`` routing has an expert bias; ``num_nextn_predict_layers`` → MTP depth
qwen2_moe          gated shared expert of ``shared_expert_intermediate_size``, QKV bias, ``decoder_sparse_step``
qwen3_moe          per-head q/k RMSNorm, ``mlp_only_layers`` / ``decoder_sparse_step``
qwen3_next         gated DeltaNet every layer except each ``full_attention_interval``-th (gated attention)
mixtral            every layer MoE, no shared expert
gpt_oss            ``layer_types`` sliding/full, biases, sinks, clamped SwiGLU
llama4 / _text     ``text_config``; ``interleave_moe_layer_step``; shared expert of ``intermediate_size``;
                   dense layers of ``intermediate_size_mlp``
llama              dense
olmoe              full-width q/k norm
glm4_moe           ``first_k_dense_replace``, shared experts, QKV bias, ``use_qk_norm``, expert bias, MTP
nemotron_h         ``hybrid_override_pattern`` (M Mamba-2, * attention, - MLP, E MoE), latent MoE, MTP pattern
=================  ==========================================================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moetune.errors import InputError, one_line
from moetune.spec.model import ModelArch, uniform_pattern

_MISSING = object()


class _Cfg:
    """Field access that names the file and the missing field."""

    def __init__(self, data: dict[str, Any], path: Path):
        self.data = data
        self.path = path

    def req(self, key: str) -> Any:
        v = self.data.get(key, _MISSING)
        if v is _MISSING or v is None:
            raise InputError(f"{self.path}: required field {key!r} missing from the Hugging Face config "
                             f"(model_type {self.data.get('model_type')!r})", field=key)
        return v

    def get(self, key: str, default: Any = None) -> Any:
        v = self.data.get(key)
        return default if v is None else v


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({one_line(exc)})", field="model") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                         field="model") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object (a Hugging Face config.json)", field="model")
    return data


def _name(path: Path, data: dict[str, Any]) -> str:
    if data.get("_name_or_path"):
        return str(data["_name_or_path"])
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem


def _common(c: _Cfg, L: int) -> dict[str, Any]:
    heads = c.req("num_attention_heads")
    h = c.req("hidden_size")
    out = dict(
        num_layers=L,
        hidden_size=h,
        num_attention_heads=heads,
        num_query_groups=c.get("num_key_value_heads", heads),
        kv_channels=c.get("head_dim", h // heads),
        vocab_size=c.req("vocab_size"),
        untie_embeddings_and_output_weights=not c.get("tie_word_embeddings", False),
    )
    return out


def _moe_flags(L: int, *, first_k_dense: int = 0, step: int = 1, mlp_only: list[int] | None = None) -> str:
    _, mlp = uniform_pattern(L, first_k_dense=first_k_dense, moe_layer_freq=step)
    if mlp_only:
        mlp = "".join("D" if i in set(mlp_only) else ch for i, ch in enumerate(mlp))
    return mlp


def _deepseek(c: _Cfg) -> dict[str, Any]:
    L = c.req("num_hidden_layers")
    kw = _common(c, L)
    heads = kw["num_attention_heads"]
    kw.pop("num_query_groups")
    kw["kv_channels"] = c.req("v_head_dim")
    k_dense = c.get("first_k_dense_replace", 0)
    step = c.get("moe_layer_freq", 1)
    n_shared = c.get("n_shared_experts", 0)
    fm = c.req("moe_intermediate_size")
    kw.update(
        family="deepseek",
        ffn_hidden_size=c.req("intermediate_size"),
        mixer_pattern="A" * L,
        mlp_pattern=_moe_flags(L, first_k_dense=k_dense, step=step),
        multi_latent_attention=True,
        q_lora_rank=c.get("q_lora_rank"),
        kv_lora_rank=c.req("kv_lora_rank"),
        qk_head_dim=c.req("qk_nope_head_dim"),
        qk_pos_emb_head_dim=c.req("qk_rope_head_dim"),
        v_head_dim=c.req("v_head_dim"),
        num_moe_experts=c.req("n_routed_experts"),
        moe_router_topk=c.req("num_experts_per_tok"),
        moe_ffn_hidden_size=fm,
        moe_shared_expert_intermediate_size=fm * n_shared if n_shared else None,
        moe_router_num_groups=c.get("n_group") if c.get("n_group", 1) > 1 else None,
        moe_router_group_topk=c.get("topk_group") if c.get("n_group", 1) > 1 else None,
        moe_router_enable_expert_bias=c.get("topk_method") == "noaux_tc",
        mtp_num_layers=c.get("num_nextn_predict_layers", 0),
        # Bridge deepseek_v3_bridge / kimi bridge set 1280; DeepSeekModelProvider (V2) defaults to 3200
        make_vocab_size_divisible_by=3200 if c.data.get("model_type") == "deepseek_v2" else 1280,
    )
    del heads
    return kw


def _qwen_moe(c: _Cfg, qwen2: bool) -> dict[str, Any]:
    L = c.req("num_hidden_layers")
    kw = _common(c, L)
    shared = c.get("shared_expert_intermediate_size") if qwen2 else None
    kw.update(
        family="qwen2_moe" if qwen2 else "qwen3_moe",
        ffn_hidden_size=c.req("intermediate_size"),
        mixer_pattern="A" * L,
        mlp_pattern=_moe_flags(L, step=c.get("decoder_sparse_step", 1), mlp_only=c.get("mlp_only_layers", [])),
        qk_layernorm=not qwen2,
        add_qkv_bias=qwen2 or bool(c.get("attention_bias", False)),
        num_moe_experts=c.req("num_experts"),
        moe_router_topk=c.req("num_experts_per_tok"),
        moe_ffn_hidden_size=c.req("moe_intermediate_size"),
        moe_shared_expert_intermediate_size=shared or None,
        moe_shared_expert_gate=bool(shared),
    )
    return kw


def _qwen3_next(c: _Cfg) -> dict[str, Any]:
    L = c.req("num_hidden_layers")
    kw = _common(c, L)
    interval = c.get("full_attention_interval", 4)
    types = c.get("layer_types")
    if types:
        mixer = "".join("A" if t == "full_attention" else "G" for t in types)
    else:
        mixer = "".join("A" if (i + 1) % interval == 0 else "G" for i in range(L))
    kw.update(
        family="qwen3_next",
        ffn_hidden_size=c.req("intermediate_size"),
        mixer_pattern=mixer,
        mlp_pattern=_moe_flags(L, step=c.get("decoder_sparse_step", 1), mlp_only=c.get("mlp_only_layers", [])),
        qk_layernorm=True,
        attention_output_gate=True,
        num_moe_experts=c.req("num_experts"),
        moe_router_topk=c.req("num_experts_per_tok"),
        moe_ffn_hidden_size=c.req("moe_intermediate_size"),
        moe_shared_expert_intermediate_size=c.get("shared_expert_intermediate_size") or None,
        moe_shared_expert_gate=bool(c.get("shared_expert_intermediate_size")),
        linear_key_head_dim=c.req("linear_key_head_dim"),
        linear_value_head_dim=c.req("linear_value_head_dim"),
        linear_num_key_heads=c.req("linear_num_key_heads"),
        linear_num_value_heads=c.req("linear_num_value_heads"),
        linear_conv_kernel_dim=c.get("linear_conv_kernel_dim", 4),
        mtp_num_layers=c.get("num_nextn_predict_layers", c.get("mtp_num_hidden_layers", 0)),
    )
    return kw


def _mixtral(c: _Cfg) -> dict[str, Any]:
    L = c.req("num_hidden_layers")
    kw = _common(c, L)
    f = c.req("intermediate_size")
    kw.update(family="mixtral", ffn_hidden_size=f, mixer_pattern="A" * L, mlp_pattern="E" * L,
              num_moe_experts=c.req("num_local_experts"), moe_router_topk=c.req("num_experts_per_tok"),
              moe_ffn_hidden_size=f)
    return kw


def _gpt_oss(c: _Cfg) -> dict[str, Any]:
    L = c.req("num_hidden_layers")
    kw = _common(c, L)
    types = c.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)]
    if len(types) != L:
        raise InputError.bad_value("layer_types", f"{len(types)} entries", f"{L} (num_hidden_layers)")
    f = c.req("intermediate_size")
    kw.update(family="gpt_oss", ffn_hidden_size=f,
              mixer_pattern="".join("W" if t == "sliding_attention" else "A" for t in types), mlp_pattern="E" * L,
              window_size=c.req("sliding_window") if "sliding_attention" in types else None,
              add_bias_linear=bool(c.get("attention_bias", True)), softmax_sinks=True, activation="swiglu_clamped",
              num_moe_experts=c.req("num_local_experts"), moe_router_topk=c.req("num_experts_per_tok"),
              moe_ffn_hidden_size=f)
    return kw


def _llama4(c: _Cfg) -> dict[str, Any]:
    L = c.req("num_hidden_layers")
    kw = _common(c, L)
    step = c.get("interleave_moe_layer_step", 1)
    moe_layers = c.get("moe_layers")
    if moe_layers is not None:
        mlp = "".join("E" if i in set(moe_layers) else "D" for i in range(L))
    else:  # HF Llama4TextModel: layer i is MoE iff (i + 1) % step == 0
        mlp = "".join("E" if (i + 1) % step == 0 else "D" for i in range(L))
    f_exp = c.req("intermediate_size")
    kw.update(family="llama4", ffn_hidden_size=c.get("intermediate_size_mlp", f_exp), mixer_pattern="A" * L,
              mlp_pattern=mlp, num_moe_experts=c.req("num_local_experts"),
              moe_router_topk=c.req("num_experts_per_tok"), moe_ffn_hidden_size=f_exp,
              moe_shared_expert_intermediate_size=f_exp)
    return kw


def _llama(c: _Cfg) -> dict[str, Any]:
    L = c.req("num_hidden_layers")
    kw = _common(c, L)
    kw.update(family="llama", ffn_hidden_size=c.req("intermediate_size"), mixer_pattern="A" * L,
              mlp_pattern="D" * L, add_qkv_bias=bool(c.get("attention_bias", False)))
    return kw


def _olmoe(c: _Cfg) -> dict[str, Any]:
    L = c.req("num_hidden_layers")
    kw = _common(c, L)
    f = c.req("intermediate_size")
    kw.update(family="olmoe", ffn_hidden_size=f, mixer_pattern="A" * L, mlp_pattern="E" * L, qk_layernorm=True,
              qk_layernorm_full_width=True, num_moe_experts=c.req("num_experts"),
              moe_router_topk=c.req("num_experts_per_tok"), moe_ffn_hidden_size=f)
    return kw


def _glm4_moe(c: _Cfg) -> dict[str, Any]:
    L = c.req("num_hidden_layers")
    kw = _common(c, L)
    fm = c.req("moe_intermediate_size")
    n_shared = c.get("n_shared_experts", 0)
    kw.update(family="glm4_moe", ffn_hidden_size=c.req("intermediate_size"), mixer_pattern="A" * L,
              mlp_pattern=_moe_flags(L, first_k_dense=c.get("first_k_dense_replace", 0)),
              add_qkv_bias=bool(c.get("attention_bias", False)), qk_layernorm=bool(c.get("use_qk_norm", False)),
              num_moe_experts=c.req("n_routed_experts"), moe_router_topk=c.req("num_experts_per_tok"),
              moe_ffn_hidden_size=fm, moe_shared_expert_intermediate_size=fm * n_shared if n_shared else None,
              moe_router_enable_expert_bias=True, mtp_num_layers=c.get("num_nextn_predict_layers", 0))
    return kw


_HYBRID_MIXER = {"M": "M", "*": "A", "-": "_", "E": "_"}
_HYBRID_MLP = {"M": "_", "*": "_", "-": "D", "E": "E"}


def _hybrid_chars(c: _Cfg, key: str, pattern: str) -> tuple[str, str]:
    bad = sorted(set(pattern) - set(_HYBRID_MIXER))
    if bad:
        raise InputError.bad_value(key, pattern, f"only the symbols M, *, -, E (got {bad})")
    return "".join(_HYBRID_MIXER[ch] for ch in pattern), "".join(_HYBRID_MLP[ch] for ch in pattern)


def _nemotron_h(c: _Cfg) -> dict[str, Any]:
    pattern = c.req("hybrid_override_pattern")
    L = c.get("num_hidden_layers", len(pattern))
    if len(pattern) != L:
        raise InputError.bad_value("hybrid_override_pattern", f"{len(pattern)} layers", f"{L} (num_hidden_layers)")
    kw = _common(c, L)
    mixer, mlp = _hybrid_chars(c, "hybrid_override_pattern", pattern)
    has_moe = "E" in mlp
    act = c.get("mlp_hidden_act", "relu2")
    kw.update(family="nemotron_h", ffn_hidden_size=c.get("intermediate_size", 0), mixer_pattern=mixer,
              mlp_pattern=mlp, gated_linear_unit=False, activation="squared_relu" if act == "relu2" else "gelu",
              mamba_state_dim=c.req("ssm_state_size"), mamba_head_dim=c.req("mamba_head_dim"),
              mamba_num_heads=c.req("mamba_num_heads"), mamba_num_groups=c.get("n_groups", 1),
              mamba_d_conv=c.get("conv_kernel", 4))
    if has_moe:
        kw.update(num_moe_experts=c.req("n_routed_experts"), moe_router_topk=c.req("num_experts_per_tok"),
                  moe_ffn_hidden_size=c.req("moe_intermediate_size"),
                  moe_shared_expert_intermediate_size=c.get("moe_shared_expert_intermediate_size") or None,
                  moe_latent_size=c.get("moe_latent_size"), moe_router_enable_expert_bias=True)
    depth = c.get("num_nextn_predict_layers", 0)
    if depth:
        mtp = c.req("mtp_hybrid_override_pattern")
        mm, ml = _hybrid_chars(c, "mtp_hybrid_override_pattern", mtp)
        kw.update(mtp_num_layers=depth, mtp_mixer_pattern=mm, mtp_mlp_pattern=ml)
    return kw


_FAMILIES = {
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "qwen2_moe": lambda c: _qwen_moe(c, qwen2=True),
    "qwen3_moe": lambda c: _qwen_moe(c, qwen2=False),
    "qwen3_next": _qwen3_next,
    "mixtral": _mixtral,
    "gpt_oss": _gpt_oss,
    "llama4_text": _llama4,
    "llama": _llama,
    "olmoe": _olmoe,
    "glm4_moe": _glm4_moe,
    "nemotron_h": _nemotron_h,
}
_ARCHITECTURES = {
    "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
    "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe", "Qwen3NextForCausalLM": "qwen3_next",
    "MixtralForCausalLM": "mixtral", "GptOssForCausalLM": "gpt_oss", "Llama4ForCausalLM": "llama4_text",
    "Llama4ForConditionalGeneration": "llama4", "LlamaForCausalLM": "llama", "OlmoeForCausalLM": "olmoe",
    "Glm4MoeForCausalLM": "glm4_moe", "NemotronHForCausalLM": "nemotron_h",
}
SUPPORTED_MODEL_TYPES = tuple(sorted({*_FAMILIES, "llama4"}))


def model_from_hf_dict(data: dict[str, Any], path: Path | str = "<config>") -> ModelArch:
    """A :class:`ModelArch` from an already-parsed HF config dict (see :func:`model_from_hf_config`)."""
    path = Path(path)
    mtype = data.get("model_type")
    if mtype not in _FAMILIES and mtype != "llama4":
        mtype = next((_ARCHITECTURES[a] for a in data.get("architectures") or [] if a in _ARCHITECTURES), mtype)
    name = _name(path, data)
    if mtype == "llama4":  # multimodal wrapper: the language model is in text_config
        text = data.get("text_config")
        if not isinstance(text, dict):
            raise InputError(f"{path}: required field 'text_config' missing from the Llama-4 config", field="text_config")
        data, mtype = text, "llama4_text"
    if mtype not in _FAMILIES:
        raise InputError(f"{path}: unsupported model_type {mtype!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}",
                         field="model_type", value=mtype)
    kw = _FAMILIES[mtype](_Cfg(data, path))
    kw.update(name=name, source=f"Hugging Face config {path}")
    try:
        return ModelArch.model_validate(kw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())) or "config"
        raise InputError(f"{path}: invalid value for {loc}: {err.get('msg')}", field=loc) from exc
    except (TypeError, ValueError) as exc:
        raise InputError(f"{path}: {one_line(exc)}") from exc


def model_from_hf_config(path: Path | str) -> ModelArch:
    """Read a Hugging Face ``config.json`` (families listed in the module doc) into a :class:`ModelArch`.

    Raises :class:`InputError` (one line, exit 2 in the CLI) for unreadable or malformed JSON, an unsupported
    ``model_type``, or a missing required field (named in the message).
    """
    path = Path(path)
    return model_from_hf_dict(_read(path), path)

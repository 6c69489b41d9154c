"""Convert between the nested effective-config dict (Bridge ConfigContainer names) and a :class:`moetune.spec.Job`.

* :func:`job_from_config` builds ``ModelArch`` (from model fields, or a catalog model), ``Layout`` and ``Features``
  from a config as the library sees it (after the effective-config replay); every default it fills in is listed in
  ``Job.assumptions``.
* :func:`job_to_config` is the inverse used for the planner's launch output and for :func:`moetune.io.check.check_job`.
* :func:`config_to_megatron_args` / :func:`config_to_bridge_overrides` render a config so that it round-trips through
  :func:`moetune.io.megatron_args.read_megatron_args` / Hydra overrides.

Field semantics follow Megatron-Core ``TransformerConfig`` and Megatron-LM ``arguments.py`` (hybrid patterns:
``M`` Mamba, ``*`` attention, ``E`` MoE, ``-`` MLP as in ``megatron/core/ssm/mamba_hybrid_layer_allocation.py``).
"""

from __future__ import annotations

from typing import Any

from moetune.errors import InputError
from moetune.io.effective import (
    MODEL_DEFAULTS,
    MP_DDP_FIELDS,
    MP_MODEL_FIELDS,
    MP_OPTIMIZER_FIELDS,
    OVERLAP_MODEL_FIELDS,
    effective_config,
)
from moetune.io.megatron_args import FLAGS
from moetune.overrides import format_override, format_value
from moetune.rules.engine import Env, gpu_key
from moetune.spec import Features, Job, Layout, ModelArch, System
from moetune.spec.features import (
    BRIDGE_MIXED_PRECISION,
    CUTEDSL_FUSED_GROUPED_MLP_ENV,
    FUSED_GROUPED_MLP_GLU_INTERLEAVE,
    PRECISION_ALIASES,
    env_flag_on,
)
from moetune.spec.layout import bridge_default_etp
from moetune.spec.model_fields import HYBRID_LAYER_SYMBOLS, arch_to_model_fields

#: tokenizer vocab sizes when a config gives no vocab (Megatron-LM ``megatron/training/tokenizer``): GPT-2 BPE
#: ``vocab.json`` has 50257 entries, the Llama-2 SentencePiece model 32000; ``NullTokenizer`` is ``--vocab-size`` + 1
#: (``_NullTokenizer.vocab_size`` appends the eod id) and is handled in :func:`tokenizer_vocab`.
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000}
#: SentencePiece model files by basename -> pieces (NVIDIA ``nemotron_2_256k.model`` has 256000 pieces, as its name
#: says; used by the Megatron-LM GPT/Mixtral release functional tests through ``GPTSentencePieceTokenizer``)
SENTENCEPIECE_VOCAB = {"nemotron_2_256k.model": 256000}


def _precision(model: dict, mp: Any) -> str:
    src = mp if isinstance(mp, dict) else model
    if src.get("fp4"):
        return "nvfp4"
    if src.get("fp8"):
        # fp8_recipe delayed / tensorwise / blockwise / mxfp8 (MCore Fp8Recipe); unset means delayed (MCore default)
        canon = PRECISION_ALIASES.get(str(src.get("fp8_recipe") or "delayed"), "fp8_cs")
        return canon if canon.startswith(("fp8", "mxfp8")) else "fp8_cs"
    if src.get("fp16"):
        return "fp16"
    return "bf16"


def tokenizer_vocab(tokenizer: dict | None, notes: list[str]) -> int:
    """Unpadded vocabulary of the tokenizer a config names (Megatron-LM ``build_tokenizer``): NullTokenizer
    ``--vocab-size N`` -> N+1, GPT2BPETokenizer 50257, Llama2Tokenizer 32000, GPTSentencePieceTokenizer by model file,
    HuggingFaceTokenizer by the catalog model of that name; anything else is an assumption recorded in ``notes``."""
    tok = dict(tokenizer or {})
    kind = str(tok.get("tokenizer_type") or "")
    given = tok.get("vocab_size")
    if kind == "NullTokenizer":
        if not given:
            raise InputError("tokenizer.vocab_size missing: NullTokenizer needs --vocab-size")
        notes.append(f"vocab_size {int(given) + 1}: NullTokenizer --vocab-size {int(given)} + eod (MLM _NullTokenizer)")
        return int(given) + 1
    if given:
        notes.append(f"vocab_size {int(given)} from tokenizer.vocab_size ({kind or 'tokenizer type unset'})")
        return int(given)
    model_file = str(tok.get("tokenizer_model") or "")
    if kind == "HuggingFaceTokenizer" and model_file:
        from moetune.catalog.models import get_model

        try:
            v = get_model(model_file.rstrip("/").split("/")[-1]).vocab_size
        except InputError:
            v = None
        if v:
            notes.append(f"vocab_size {v} from the catalog model {model_file!r} (HuggingFaceTokenizer)")
            return v
    base = model_file.replace("\\", "/").split("/")[-1]
    if base in SENTENCEPIECE_VOCAB:
        notes.append(f"vocab_size {SENTENCEPIECE_VOCAB[base]} from the SentencePiece model {base} ({kind})")
        return SENTENCEPIECE_VOCAB[base]
    if not kind and (tok.get("vocab_file") or tok.get("merge_file")):
        notes.append("vocab_size: tokenizer_type unset with a vocab file, GPT2BPETokenizer assumed")
        kind = "GPT2BPETokenizer"
    if kind in TOKENIZER_VOCAB:
        notes.append(f"vocab_size {TOKENIZER_VOCAB[kind]} from the {kind} vocabulary")
        return TOKENIZER_VOCAB[kind]
    fallback = TOKENIZER_VOCAB["GPT2BPETokenizer"] if not kind else 32000
    notes.append(f"vocab_size unknown: assumed {fallback} ({kind or 'no tokenizer given'}"
                 f"{', model ' + model_file if model_file else ''})")
    return fallback


def _mlm_default_ffn(h: int, gated: bool, frontend: str) -> tuple[int, str]:
    """ffn_hidden_size when unset: Megatron-LM ``validate_args`` uses int((4*h*2/3)/64)*64 with ``--swiglu`` (same
    parameter count as a 4h MLP, rounded down to 64) and 4*h otherwise; MCore ``TransformerConfig.__post_init__``
    (Bridge) always 4*h."""
    if frontend == "megatron-lm" and gated:
        return int((4 * h * 2 / 3) / 64) * 64, "MLM --swiglu default int((4*h*2/3)/64)*64"
    return 4 * h, "MCore default 4*hidden_size" if frontend != "megatron-lm" else "MLM default 4*hidden_size"


def arch_from_model_fields(m: dict, *, name: str = "config", tokenizer: dict | None = None,
                           assumptions: list[str] | None = None, frontend: str = "bridge",
                           catalog: ModelArch | None = None) -> ModelArch:
    """ModelArch from ``model.*`` fields (raises InputError naming a missing required field).

    Unset fields take the defaults of the frontend that reads them, each recorded in ``assumptions``: tied
    embeddings (MLM without ``--untie-embeddings-and-output-weights``; MCore/Bridge ``GPTModelProvider``
    ``share_embeddings_and_output_weights=True``), LayerNorm (MLM ``--normalization`` default, MCore
    ``TransformerConfig`` and Bridge ``GPTModelProvider``), ffn_hidden_size (:func:`_mlm_default_ffn`), vocabulary
    from the tokenizer (:func:`tokenizer_vocab`) padded to ``make_vocab_size_divisible_by``·TP (MLM default 128)."""
    notes = assumptions if assumptions is not None else []
    if catalog is not None:
        # a recipe names its model provider (catalog model): fields the config leaves unset are the provider's
        m = dict(m)
        for key, val in (("normalization", catalog.normalization), ("vocab_size", catalog.vocab_size),
                         ("share_embeddings_and_output_weights", not catalog.untie_embeddings_and_output_weights)):
            if m.get(key) is None:
                m[key] = val
                notes.append(f"{key} unset: {val} from the catalog model {catalog.name}")
    pattern = m.get("hybrid_layer_pattern") or m.get("hybrid_override_pattern")
    for req in ("hidden_size", "num_attention_heads") + (() if pattern else ("num_layers",)):
        if not m.get(req):
            raise InputError(f"model.{req} missing: cannot build the model architecture (give it or --model NAME)")
    if pattern:
        pattern = str(pattern).replace("|", "").replace("/", "")
        bad = set(pattern) - set(HYBRID_LAYER_SYMBOLS)
        if bad:
            raise InputError.bad_value("model.hybrid_layer_pattern", pattern, "chars M * E - G")
        mixer = "".join(HYBRID_LAYER_SYMBOLS[ch][0] for ch in pattern)
        mlp = "".join(HYBRID_LAYER_SYMBOLS[ch][1] for ch in pattern)
        nl = len(pattern)
    else:
        nl = int(m["num_layers"])
        mixer = "A" * nl
        freq = m.get("moe_layer_freq", 1)
        if m.get("num_moe_experts"):
            if isinstance(freq, list):
                if len(freq) != nl:
                    raise InputError(f"model.moe_layer_freq has {len(freq)} entries, num_layers is {nl}")
                mlp = "".join("E" if f else "D" for f in freq)
            else:
                mlp = "".join("E" if i % int(freq) == 0 else "D" for i in range(nl))
        else:
            mlp = "D" * nl
    h = int(m["hidden_size"])
    ffn = m.get("ffn_hidden_size")
    if ffn is None:
        ffn, why = _mlm_default_ffn(h, bool(m.get("gated_linear_unit")), frontend)
        notes.append(f"ffn_hidden_size unset: {why} = {ffn}")
    vocab = m.get("vocab_size") or m.get("padded_vocab_size")
    if not vocab:
        vocab = tokenizer_vocab(tokenizer, notes)
    if m.get("make_vocab_size_divisible_by") is None:
        notes.append("make_vocab_size_divisible_by unset: 128 (MLM/Bridge default; vocab padded to 128*TP)")
    tied = m.get("share_embeddings_and_output_weights")
    if tied is None:
        tied = True
        notes.append("share_embeddings_and_output_weights unset: tied (MLM without "
                     "--untie-embeddings-and-output-weights; MCore/Bridge GPTModelProvider default True)")
    norm = m.get("normalization")
    if norm is None:
        norm = "LayerNorm"
        notes.append("normalization unset: LayerNorm (MLM --normalization / MCore TransformerConfig default)")
    elif norm not in ("LayerNorm", "RMSNorm"):
        raise InputError.bad_value("model.normalization", norm, "LayerNorm or RMSNorm")
    act = str(m.get("activation_func") or ("silu" if m.get("gated_linear_unit") else "gelu")).lower()
    if "squared" in act:
        activation = "squared_relu"
    elif m.get("gated_linear_unit"):
        activation = "swiglu_clamped" if m.get("activation_func_clamp_value") else (
            "geglu" if "gelu" in act else "swiglu")
    else:
        activation = "relu" if act == "relu" else "gelu"
    is_moe = "E" in mlp
    moe_ffn = m.get("moe_ffn_hidden_size") or (ffn if is_moe else None)
    if is_moe and not m.get("moe_ffn_hidden_size"):
        notes.append(f"moe_ffn_hidden_size unset: falls back to ffn_hidden_size={ffn} (MCore)")
    mla = bool(m.get("multi_latent_attention"))
    kw: dict[str, Any] = dict(
        name=name, num_layers=nl, hidden_size=h, ffn_hidden_size=int(ffn),
        num_attention_heads=int(m["num_attention_heads"]), num_query_groups=m.get("num_query_groups"),
        kv_channels=m.get("kv_channels"), vocab_size=int(vocab),
        make_vocab_size_divisible_by=int(m.get("make_vocab_size_divisible_by") or 128),
        untie_embeddings_and_output_weights=not bool(tied),
        gated_linear_unit=bool(m.get("gated_linear_unit", activation in ("swiglu", "geglu", "swiglu_clamped"))),
        activation=activation, normalization=str(norm),
        qk_layernorm=bool(m.get("qk_layernorm")), add_bias_linear=bool(m.get("add_bias_linear", False)),
        add_qkv_bias=bool(m.get("add_qkv_bias")), mixer_pattern=mixer, mlp_pattern=mlp,
        multi_latent_attention=mla, mtp_num_layers=int(m.get("mtp_num_layers") or 0),
    )
    if mla:
        kw.update(q_lora_rank=m.get("q_lora_rank"), kv_lora_rank=m.get("kv_lora_rank") or 512,
                  qk_head_dim=m.get("qk_head_dim") or 128, qk_pos_emb_head_dim=m.get("qk_pos_emb_head_dim") or 64,
                  v_head_dim=m.get("v_head_dim") or 128)
        for k, d in (("kv_lora_rank", 512), ("qk_head_dim", 128), ("qk_pos_emb_head_dim", 64), ("v_head_dim", 128)):
            if not m.get(k):
                notes.append(f"{k} unset: MCore MLATransformerConfig default {d}")
    if is_moe:
        kw.update(num_moe_experts=int(m["num_moe_experts"]), moe_router_topk=int(m.get("moe_router_topk") or 2),
                  moe_ffn_hidden_size=int(moe_ffn),
                  moe_shared_expert_intermediate_size=m.get("moe_shared_expert_intermediate_size"),
                  moe_router_num_groups=m.get("moe_router_num_groups"),
                  moe_router_group_topk=m.get("moe_router_group_topk"), moe_latent_size=m.get("moe_latent_size"))
        if m.get("moe_router_score_function") in ("sigmoid", "sqrtsoftplus"):
            kw["moe_router_score_function"] = m["moe_router_score_function"]
        if m.get("moe_router_topk") is None:
            notes.append("moe_router_topk unset: MCore default 2")
    for k in ("mamba_state_dim", "mamba_head_dim", "mamba_num_heads", "mamba_num_groups", "linear_num_key_heads",
              "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
        if m.get(k) is not None:
            kw[k] = m[k]
    try:
        return ModelArch(**kw)
    except ValueError as e:
        from moetune.errors import validation_message

        raise InputError(f"model fields do not form a valid architecture: {validation_message(e)}") from None


def job_from_config(cfg: dict, *, system: str | System | None = None, gpus: int | None = None,
                    model: str | ModelArch | None = None) -> Job:
    """Job from a nested config (Megatron-LM or Bridge form). ``system``/``gpus``/``model`` fill what the config
    lacks (a recipe's ``_meta`` supplies them for recipe configs)."""
    from moetune.catalog.models import get_model
    from moetune.catalog.systems import get_system

    notes: list[str] = []
    ignored = cfg.get("_megatron_ignored")
    if ignored:  # moetune.io.megatron_args: real Megatron-LM flags whose value does not reach the estimate
        notes.append(f"{len(ignored)} Megatron-LM flag(s) accepted but not modelled (no effect on the memory or "
                     f"time estimate): {' '.join(ignored)}")
    meta = cfg.get("_meta") or {}
    gpus = gpus or meta.get("gpus")
    if not gpus:
        raise InputError("world size unknown: pass --gpus N")
    sysname = system or meta.get("system")
    if sysname is None:
        sysname = "DGX-H100"
        notes.append("system unknown: assumed DGX-H100")
    sysobj = sysname if isinstance(sysname, System) else get_system(sysname)
    eff = effective_config(cfg, Env(gpus=gpus, gpu=gpu_key(sysobj.gpu.name)))
    m = eff["model"]
    if isinstance(model, ModelArch):
        arch = model
    elif model is not None:
        arch = get_model(model)
    elif m.get("num_layers") or m.get("hybrid_layer_pattern"):
        try:
            base = None
            if meta.get("model"):
                try:
                    base = get_model(meta["model"])
                except InputError:
                    base = None
            arch = arch_from_model_fields(m, name=meta.get("model") or "config", tokenizer=eff.get("tokenizer"),
                                          assumptions=notes, frontend=eff.get("frontend", "bridge"), catalog=base)
        except InputError:
            if not meta.get("model"):
                raise
            arch = get_model(meta["model"])
    elif meta.get("model"):
        arch = get_model(meta["model"])
    else:
        raise InputError("model.num_layers missing: give the model fields or --model NAME")
    train = eff.get("train", {})
    gbs = train.get("global_batch_size")
    sched = train.get("step_batch_size_schedule") or train.get("rampup_batch_size")
    if not gbs and sched:
        last = str(sched if isinstance(sched, str) else " ".join(map(str, sched))).split()[-1]
        gbs = int(last.split(":")[-1]) if last.split(":")[-1].isdigit() else None
        if gbs:
            notes.append(f"global batch size from the batch-size schedule's final value {gbs}")
    if not gbs:
        raise InputError("train.global_batch_size missing")
    seq = m.get("seq_length") or (eff.get("dataset") or {}).get("seq_length")
    if not seq:
        raise InputError("model.seq_length missing")
    lay = m.get("pipeline_model_parallel_layout")
    layout = Layout(
        tp=m["tensor_model_parallel_size"], pp=m["pipeline_model_parallel_size"],
        vpp=m.get("virtual_pipeline_model_parallel_size"),
        pipeline_layout=lay if isinstance(lay, str) and not lay.startswith("<") else None,
        num_layers_in_first_pipeline_stage=m.get("num_layers_in_first_pipeline_stage"),
        num_layers_in_last_pipeline_stage=m.get("num_layers_in_last_pipeline_stage"),
        account_for_embedding_in_pipeline_split=bool(m.get("account_for_embedding_in_pipeline_split")),
        account_for_loss_in_pipeline_split=bool(m.get("account_for_loss_in_pipeline_split")),
        cp=m["context_parallel_size"], ep=m["expert_model_parallel_size"], etp=m.get("expert_tensor_parallel_size"),
    )
    features = features_from_effective(eff, notes)
    return Job(model=arch, system=sysobj, gpus=int(gpus), global_batch_size=int(gbs),
               micro_batch_size=int(train.get("micro_batch_size") or 1), seq_length=int(seq), layout=layout,
               features=features, assumptions=tuple(notes))


def cutedsl_requested(model: dict, env: dict) -> bool:
    """``Features.cutedsl_fused_grouped_mlp`` of a config: :data:`CUTEDSL_FUSED_GROUPED_MLP_ENV` on and the expert MLP built by the TE
    op fuser (``use_transformer_engine_op_fuser``: Megatron-Core ``TEGroupedMLP`` then runs FC1, the activation and
    FC2 as one ``te.ops.Sequential``, the only path TE's fusion sees; megatron/core/transformer/moe/experts.py
    ``_make_fused_ops``). Whether TE then fuses (GPU, precision, activation, sizes) is the step model's
    :func:`moetune.perfmodel.compute.fused_grouped_mlp_runs` and rules MOE-090..MOE-095."""
    return env_flag_on(env.get(CUTEDSL_FUSED_GROUPED_MLP_ENV)) and bool(model.get("use_transformer_engine_op_fuser"))


_RMODS = {"core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj", "mhc"}


def _mp_field(eff: dict, model: dict, key: str) -> Any:
    """A ``MixedPrecisionConfig`` field: from the config's ``mixed_precision`` section when it has one (Bridge
    copies it onto the model), else the model section's copy."""
    mp = eff.get("mixed_precision")
    return mp.get(key) if isinstance(mp, dict) and key in mp else model.get(key)


def features_from_effective(eff: dict, notes: list[str]) -> Features:
    m, ddp, opt = eff["model"], eff["ddp"], eff["optimizer"]
    gran = m.get("recompute_granularity")
    rmods = tuple(x for x in (m.get("recompute_modules") or []) if x in _RMODS) if gran == "selective" else ()
    dropped = [x for x in (m.get("recompute_modules") or []) if x not in _RMODS] if gran == "selective" else []
    if dropped:
        notes.append(f"recompute modules {dropped} not modelled")
    impl = m.get("cuda_graph_impl") or "none"
    scope = tuple(m.get("cuda_graph_modules") or [])
    if impl == "full_iteration":
        impl, scope = "local", ("full_iteration",)
    disp = m.get("moe_token_dispatcher_type") or "allgather"
    backend = m.get("moe_flex_dispatcher_backend") if disp == "flex" else None
    if backend not in (None, "deepep", "hybridep"):
        notes.append(f"flex backend {backend} modelled as deepep")
        backend = "deepep"
    env = eff.get("_env_vars_effective", {})

    def dt(v: Any, allowed: tuple[str, ...], default: str) -> str:
        s = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "uint8": "fp8"}.get(str(v), str(v))
        return s if s in allowed else default

    attn_backend = _enum_name(m.get("attention_backend")) or "auto"
    if attn_backend not in ("auto", "flash", "fused", "unfused", "local"):
        raise InputError.bad_value("model.attention_backend", m.get("attention_backend"),
                                   "auto, flash, fused, unfused or local (MCore AttnBackend)")
    impl_t = str(m.get("transformer_impl") or "transformer_engine")
    if impl_t not in ("transformer_engine", "local"):
        notes.append(f"transformer_impl {impl_t} modelled as transformer_engine")
        impl_t = "transformer_engine"
    ce_impl = _enum_name(m.get("cross_entropy_fusion_impl")) or "native"
    if ce_impl not in ("native", "te"):
        raise InputError.bad_value("model.cross_entropy_fusion_impl", ce_impl, "native or te")
    drop = {k: _fraction(m, k) for k in ("attention_dropout", "hidden_dropout")}
    # unfused RoPE only where RoPE runs: Megatron-LM's default position embedding is learned_absolute (and
    # validate_args then sets apply_rope_fusion False with nothing to rotate); Bridge's catalog models use RoPE
    pe = m.get("position_embedding_type") or ("learned_absolute" if eff.get("frontend") == "megatron-lm" else "rope")
    rope_fusion = not (m.get("apply_rope_fusion") is False and _enum_name(pe) in ("rope", "mrope", "yarn"))
    return Features(
        attention_backend=attn_backend, transformer_impl=impl_t, apply_rope_fusion=rope_fusion, cross_entropy_fusion_impl=ce_impl,
        cross_entropy_loss_fusion=bool(m.get("cross_entropy_loss_fusion")), **drop,
        precision=_precision(m, eff.get("mixed_precision")),
        fp8_param_gather=bool(ddp.get("fp8_param_gather")),
        first_last_layers_bf16=bool(m.get("first_last_layers_bf16")),
        fp8_dot_product_attention=bool(_mp_field(eff, m, "fp8_dot_product_attention")),
        recompute_granularity=gran, recompute_method=m.get("recompute_method"),
        recompute_num_layers=m.get("recompute_num_layers"), recompute_modules=rmods,
        fine_grained_activation_offloading=bool(m.get("fine_grained_activation_offloading")),
        offload_modules=tuple(x for x in (m.get("offload_modules") or [])
                              if x in ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1",
                                       "moe_act", "fused_group_mlp")),
        cpu_offloading=bool(m.get("cpu_offloading")), cpu_offloading_num_layers=int(m.get("cpu_offloading_num_layers")
                                                                                    or 0),
        optimizer_cpu_offload=bool(opt.get("optimizer_cpu_offload")),
        optimizer_offload_fraction=float(opt.get("optimizer_offload_fraction") or 0.0),
        moe_token_dispatcher_type=disp if disp in ("allgather", "alltoall", "flex") else "alltoall",
        moe_flex_dispatcher_backend=backend,
        moe_flex_dispatcher_num_sms=m.get("moe_flex_dispatcher_num_sms"),
        moe_grouped_gemm=bool(m.get("moe_grouped_gemm")), moe_permute_fusion=bool(m.get("moe_permute_fusion")),
        moe_router_fusion=bool(m.get("moe_router_fusion")),
        moe_router_force_load_balancing=bool(m.get("moe_router_force_load_balancing")),
        moe_expert_capacity_factor=m.get("moe_expert_capacity_factor"),
        moe_pad_expert_input_to_capacity=bool(m.get("moe_pad_expert_input_to_capacity")),
        moe_expert_rank_capacity_factor=m.get("moe_expert_rank_capacity_factor"),
        moe_paged_stash=bool(m.get("moe_paged_stash")),
        cutedsl_fused_grouped_mlp=cutedsl_requested(m, env),
        sequence_parallel=bool(m.get("sequence_parallel")),
        overlap_moe_expert_parallel_comm=bool(m.get("overlap_moe_expert_parallel_comm")),
        delay_wgrad_compute=bool(m.get("delay_wgrad_compute")),
        moe_shared_expert_overlap=bool(m.get("moe_shared_expert_overlap")),
        tp_comm_overlap=bool(m.get("tp_comm_overlap")),
        overlap_grad_reduce=bool(ddp.get("overlap_grad_reduce")),
        overlap_param_gather=bool(ddp.get("overlap_param_gather")),
        overlap_p2p_comm=bool(m.get("overlap_p2p_comm")),
        cp_comm_type=(lambda t: t if t in ("p2p", "a2a", "allgather", "a2a+p2p") else "p2p")(
            (m.get("cp_comm_type")[0] if isinstance(m.get("cp_comm_type"), list) and m.get("cp_comm_type")
             else m.get("cp_comm_type")) or "p2p"),
        cuda_graph_impl=impl, cuda_graph_scope=tuple(s for s in scope if s in ("attn", "mlp", "moe", "moe_router",
                                                                              "moe_preprocess", "mamba",
                                                                              "full_iteration")),
        use_distributed_optimizer=bool(ddp.get("use_distributed_optimizer")),
        num_distributed_optimizer_instances=int(ddp.get("num_distributed_optimizer_instances") or 1),
        use_precision_aware_optimizer=bool(opt.get("use_precision_aware_optimizer")),
        exp_avg_dtype=dt(opt.get("exp_avg_dtype"), ("fp32", "bf16", "fp16", "fp8"), "fp32"),
        exp_avg_sq_dtype=dt(opt.get("exp_avg_sq_dtype"), ("fp32", "bf16", "fp16", "fp8"), "fp32"),
        main_grads_dtype=dt(opt.get("main_grads_dtype"), ("fp32", "bf16"), "fp32"),
        main_params_dtype=dt(opt.get("main_params_dtype"), ("fp32", "fp16"), "fp32"),
        grad_reduce_in_fp32=bool(ddp.get("grad_reduce_in_fp32")),
        use_megatron_fsdp=bool(ddp.get("use_megatron_fsdp")),
        data_parallel_sharding_strategy=ddp.get("data_parallel_sharding_strategy") or "no_shard",
        expandable_segments="expandable_segments:true" in str(env.get("PYTORCH_CUDA_ALLOC_CONF", "")).lower(),
        manual_gc=bool(eff.get("train", {}).get("manual_gc")),
        **task_from_config(eff, notes),
    )


#: Bridge dataset config classes of fine-tuning data (``megatron/bridge/training/config.py`` ``FinetuningDatasetConfig``
#: and its HF subclass ``data/builders/hf_dataset.py`` ``HFDatasetConfig``); pre-training uses ``GPTDatasetConfig``
_FINETUNE_DATASETS = ("FinetuningDatasetConfig", "HFDatasetConfig")


def task_from_config(cfg: dict, notes: list[str]) -> dict[str, Any]:
    """The training task's Features fields of a Bridge config (:func:`moetune.io.load.task_updates`): a ``peft``
    section is LoRA (``_target_: megatron.bridge.peft.lora.LoRA`` with ``dim`` / ``alpha`` / ``target_modules``, or
    the scheme name ``lora`` as Bridge's ``default_peft_config`` takes it); other PEFT schemes (DoRA, canonical LoRA)
    are an error, not silently priced as LoRA. Without one, a fine-tuning dataset (:data:`_FINETUNE_DATASETS`,
    packed-sequence specs) or a recipe of task ``sft`` / ``finetune`` is a full fine-tune (``sft``). A Megatron-LM
    config is pre-training (Megatron-LM has no PEFT)."""
    from moetune.io.load import task_updates

    peft = cfg.get("peft")
    if isinstance(peft, str) and peft.strip().lower() in ("", "none", "null"):
        peft = None
    if peft is not None:
        if isinstance(peft, str):
            scheme, body = peft.strip().lower(), {}
        elif isinstance(peft, dict):
            # the reader keeps a section's class as ``_class`` (moetune.io.bridge.clean_node); raw dicts have ``_target_``
            target = str(peft.get("_class") or peft.get("_target_") or "LoRA")
            scheme, body = target.rsplit(".", 1)[-1].lower(), peft
        else:
            raise InputError.bad_value("peft", peft, "a LoRA section (_target_: megatron.bridge.peft.lora.LoRA) or null")
        if scheme != "lora":
            raise InputError.bad_value("peft", scheme, "LoRA (megatron.bridge.peft.lora.LoRA); other PEFT schemes "
                                       "are not modelled")
        up = task_updates("lora", body.get("dim"), body.get("alpha"), body.get("target_modules"), where="peft.")
        unknown = sorted(k for k in body if k not in ("_target_", "_class", "dim", "alpha", "target_modules", "dropout",
                                                       "dropout_position", "lora_A_init_method",
                                                       "lora_B_init_method", "a2a_experimental", "lora_dtype"))
        if unknown:
            notes.append(f"peft fields {unknown} not modelled (Bridge LoRA defaults assumed for them)")
        return up
    ds = cfg.get("dataset") or {}
    meta_task = str((cfg.get("_meta") or {}).get("task") or "")
    cls = str(ds.get("_class") or ds.get("_target_") or "") if isinstance(ds, dict) else ""
    finetune_ds = isinstance(ds, dict) and (any(c in cls for c in _FINETUNE_DATASETS)
                                            or ds.get("packed_sequence_specs") or ds.get("offline_packing_specs"))
    if finetune_ds or meta_task in ("sft", "finetune"):
        return {"task": "sft"}
    if meta_task in ("peft", "lora"):
        return task_updates("lora")
    return {}


def _enum_name(v: Any) -> str | None:
    """``AttnBackend.flash`` / ``'flash'`` / ``{_target_: ...AttnBackend, _args_: [...]}`` -> ``'flash'``."""
    if v is None or v == "":
        return None
    return str(v).split(".")[-1].strip().lower()


def _fraction(m: dict, key: str) -> float:
    """A dropout probability from ``model.<key>`` (MCore ``TransformerConfig`` default 0.1 is filled by
    :func:`moetune.io.effective.effective_config`)."""
    v = m.get(key)
    try:
        f = float(0.1 if v is None else v)
    except (TypeError, ValueError):
        raise InputError.bad_value(f"model.{key}", v, "a probability in [0, 1)") from None
    if not 0.0 <= f < 1.0:
        raise InputError.bad_value(f"model.{key}", v, "a probability in [0, 1)")
    return f


def job_to_config(job: Job) -> dict:
    """Bridge-form nested config for a Job (``mixed_precision`` recipe fields, overlaps on ``comm_overlap``)."""
    from moetune.io.effective import resolve_mixed_precision

    f, lay = job.features, job.layout
    model = arch_to_model_fields(job.model)
    model.update({
        "tensor_model_parallel_size": lay.tp, "pipeline_model_parallel_size": lay.pp,
        "virtual_pipeline_model_parallel_size": lay.vpp, "context_parallel_size": lay.cp,
        "expert_model_parallel_size": lay.ep, "expert_tensor_parallel_size": lay.etp,
        "pipeline_model_parallel_layout": lay.pipeline_layout,
        "num_layers_in_first_pipeline_stage": lay.num_layers_in_first_pipeline_stage,
        "num_layers_in_last_pipeline_stage": lay.num_layers_in_last_pipeline_stage,
        "account_for_embedding_in_pipeline_split": lay.account_for_embedding_in_pipeline_split,
        "account_for_loss_in_pipeline_split": lay.account_for_loss_in_pipeline_split,
        "sequence_parallel": f.sequence_parallel and lay.tp > 1, "seq_length": job.seq_length,
        "recompute_granularity": f.recompute_granularity, "recompute_method": f.recompute_method,
        "recompute_num_layers": f.recompute_num_layers,
        "recompute_modules": list(f.recompute_modules) if f.recompute_granularity == "selective" else None,
        "fine_grained_activation_offloading": f.fine_grained_activation_offloading,
        "offload_modules": list(f.offload_modules), "cpu_offloading": f.cpu_offloading,
        "cpu_offloading_num_layers": f.cpu_offloading_num_layers,
        "moe_shared_expert_overlap": f.moe_shared_expert_overlap,
        "hidden_dropout": f.hidden_dropout, "attention_dropout": f.attention_dropout,
        "attention_backend": f.attention_backend, "transformer_impl": f.transformer_impl,
        "cross_entropy_loss_fusion": f.cross_entropy_loss_fusion,
        "cross_entropy_fusion_impl": f.cross_entropy_fusion_impl,
        # the Megatron-FSDP user guide requires --no-gradient-accumulation-fusion
        "gradient_accumulation_fusion": not f.use_megatron_fsdp,
    })
    if job.model.is_moe:
        model.update({
            "moe_token_dispatcher_type": f.moe_token_dispatcher_type,
            "moe_flex_dispatcher_backend": f.moe_flex_dispatcher_backend
            if f.moe_token_dispatcher_type == "flex" else None,
            "moe_grouped_gemm": f.moe_grouped_gemm, "moe_permute_fusion": f.moe_permute_fusion,
            "moe_router_fusion": f.moe_router_fusion, "moe_router_force_load_balancing":
            f.moe_router_force_load_balancing, "moe_expert_capacity_factor": f.moe_expert_capacity_factor,
            "moe_pad_expert_input_to_capacity": f.moe_pad_expert_input_to_capacity,
            "moe_router_dtype": "fp32",
        })
        if f.moe_expert_rank_capacity_factor is not None:
            # HybridEP's static budget runs the expert MLP through the TE op fuser (TransformerConfig.__post_init__:
            # use_transformer_engine_op_fuser or moe_use_grouped_tensor; Bridge's full-iteration presets set the fuser)
            model.update(moe_expert_rank_capacity_factor=f.moe_expert_rank_capacity_factor,
                         use_transformer_engine_op_fuser=True)
        if f.moe_paged_stash:
            model["moe_paged_stash"] = True
        if f.cutedsl_fused_grouped_mlp:
            # Bridge scripts/performance/utils/overrides.py (cutedsl_fused_grouped_mlp): the op fuser with 32-wide GLU
            # interleaving (TE validate_grouped_mlp_dims), plus the EP-overlap companions it sets
            model["use_transformer_engine_op_fuser"] = True
            if job.model.gated_linear_unit:
                model["moe_mlp_glu_interleave_size"] = FUSED_GROUPED_MLP_GLU_INTERLEAVE
            if f.overlap_moe_expert_parallel_comm:
                model["high_priority_a2a_comm_stream"] = True
                if f.moe_token_dispatcher_type == "flex" and f.moe_flex_dispatcher_backend == "hybridep":
                    model["moe_hybridep_num_sms_preprocessing"] = 32
        if f.moe_flex_dispatcher_num_sms is not None:
            model["moe_flex_dispatcher_num_sms"] = f.moe_flex_dispatcher_num_sms
    if model.get("use_transformer_engine_op_fuser") and job.model.activation == "squared_relu":
        # the op fuser builds squared-ReLU experts only as TE's weighted ScaledSReLU (MCore experts.py
        # TEGroupedMLP._is_fused_impl_supported; Bridge's Nemotron-H perf recipes set it, rule MOE-095)
        model["use_fused_weighted_squared_relu"] = True
    if not f.apply_rope_fusion:
        model["apply_rope_fusion"] = False
    if f.cp_comm_type != "p2p":
        model["cp_comm_type"] = f.cp_comm_type
    impl, scope = f.cuda_graph_impl, [s for s in f.cuda_graph_scope if s != "full_iteration"]
    if "full_iteration" in f.cuda_graph_scope:
        impl, scope = "full_iteration", []
    model["cuda_graph_impl"] = impl
    model["cuda_graph_scope"] = scope or None
    if impl != "none":
        model["use_te_rng_tracker"] = True
    mp = resolve_mixed_precision(BRIDGE_MIXED_PRECISION[f.precision])
    mp["fp8_param_gather"] = f.fp8_param_gather if mp.get("fp8") or mp.get("fp4") else False
    mp["fp8_param"] = mp["fp8_param_gather"]
    mp["grad_reduce_in_fp32"] = f.grad_reduce_in_fp32
    if mp.get("fp8"):
        mp["fp8_dot_product_attention"] = f.fp8_dot_product_attention
        mp["first_last_layers_bf16"] = f.first_last_layers_bf16
        if not f.first_last_layers_bf16:
            mp["num_layers_at_start_in_bf16"] = mp["num_layers_at_end_in_bf16"] = 0
    cfg: dict[str, Any] = {
        "frontend": "bridge",
        "model": {k: v for k, v in model.items() if v is not None},
        "train": {"global_batch_size": job.global_batch_size, "micro_batch_size": job.micro_batch_size,
                  "manual_gc": f.manual_gc},
        "optimizer": {"optimizer": "adam", "use_distributed_optimizer": f.use_distributed_optimizer,
                      "use_precision_aware_optimizer": f.use_precision_aware_optimizer,
                      "main_grads_dtype": _dtn(f.main_grads_dtype), "main_params_dtype": _dtn(f.main_params_dtype),
                      "exp_avg_dtype": _dtn(f.exp_avg_dtype), "exp_avg_sq_dtype": _dtn(f.exp_avg_sq_dtype),
                      "optimizer_cpu_offload": f.optimizer_cpu_offload,
                      "optimizer_offload_fraction": f.optimizer_offload_fraction},
        "ddp": {"use_distributed_optimizer": f.use_distributed_optimizer,
                "num_distributed_optimizer_instances": f.num_distributed_optimizer_instances,
                "use_megatron_fsdp": f.use_megatron_fsdp,
                "data_parallel_sharding_strategy": f.data_parallel_sharding_strategy},
        "comm_overlap": {"tp_comm_overlap": f.tp_comm_overlap,
                         "overlap_moe_expert_parallel_comm": f.overlap_moe_expert_parallel_comm,
                         "delay_wgrad_compute": f.delay_wgrad_compute,
                         "overlap_grad_reduce": f.overlap_grad_reduce if f.use_distributed_optimizer else None,
                         "overlap_param_gather": f.overlap_param_gather if f.use_distributed_optimizer else None,
                         "overlap_p2p_comm": f.overlap_p2p_comm if lay.pp > 1 and lay.vpp else None},
        "mixed_precision": mp,
        "dist": {"use_megatron_fsdp": f.use_megatron_fsdp},
        "rerun_state_machine": {"check_for_nan_in_loss": impl != "full_iteration"},
        "env_vars": {**({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} if f.expandable_segments else {}),
                     **({CUTEDSL_FUSED_GROUPED_MLP_ENV: "1"} if f.cutedsl_fused_grouped_mlp and job.model.is_moe else {})},
        "_meta": {"model": job.model.name, "gpus": job.gpus, "system": job.system.name, "moe": job.model.is_moe},
    }
    if f.task == "lora":  # Bridge ``peft`` section (megatron/bridge/peft/lora.py ``LoRA``)
        cfg["peft"] = {"_target_": "megatron.bridge.peft.lora.LoRA", "dim": f.lora_dim, "alpha": f.lora_alpha,
                       "target_modules": list(f.lora_target_modules)}
    if f.task != "pretrain":
        cfg["_meta"]["task"] = f.task
    if not f.use_distributed_optimizer:
        cfg["ddp"]["overlap_grad_reduce"] = f.overlap_grad_reduce
    cfg["comm_overlap"] = {k: v for k, v in cfg["comm_overlap"].items() if v is not None}
    if cfg["model"].get("moe_token_dispatcher_type") != "flex":
        cfg["model"].pop("moe_flex_dispatcher_backend", None)
    return cfg


def _dtn(s: str) -> str:
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "uint8"}[s]


def env_from_job(job: Job) -> Env:
    return Env(gpus=job.gpus, system=job.system.name, gpu=gpu_key(job.system.gpu.name) or gpu_key(job.system.name),
               gpus_per_node=job.system.gpus_per_node, nvlink_domain=job.system.nvlink_domain)


# ----------------------------------------------------------------------------------------------------------------
def _reverse_flags() -> dict[str, tuple[str, str]]:
    """Config path -> (flag, type). A flag's first target claims its path; its other targets (``--te-rng-tracker``
    sets ``rng.te_rng_tracker`` and ``model.use_te_rng_tracker``) claim the paths no first target claimed."""
    rev: dict[str, tuple[str, str]] = {}
    for flag, (targets, typ) in FLAGS.items():
        path = targets[0]
        if path.startswith("mlm."):
            continue
        if path not in rev or (rev[path][1] == "nobool" and typ == "bool"):
            rev[path] = (flag, typ)
    for flag, (targets, typ) in FLAGS.items():
        for path in targets[1:]:
            if not path.startswith("mlm.") and path not in rev:
                rev[path] = (flag, typ)
    return rev


_REV = _reverse_flags()


#: DDP fields Bridge ``CommOverlapConfig.setup`` derives (training/comm_overlap.py, distributed optimizer only)
_OVERLAP_DDP_FIELDS = ("overlap_grad_reduce", "overlap_param_gather", "align_param_gather", "bucket_size")


def _bridge_sections(cfg: dict) -> dict[str, dict]:
    """The model/optimizer/ddp sections of a Bridge config with the ``mixed_precision`` recipe and the
    ``comm_overlap`` section applied, as Bridge applies them before training (``mixed_precision.py``
    ``update_config_with_precision_overrides``, ``comm_overlap.py::CommOverlapConfig.setup``; one implementation:
    :func:`moetune.io.effective.effective_config`). Megatron-LM has neither section: each of those values is a
    flag on its own (``--bf16``, ``--fp8-format``/``--fp8-recipe``, ``--tp-comm-overlap``,
    ``--overlap-moe-expert-parallel-comm``, ``--delay-wgrad-compute``, ``--overlap-grad-reduce`` ...)."""
    secs = {k: dict(cfg.get(k) or {}) for k in ("model", "optimizer", "ddp")}
    mp, co = cfg.get("mixed_precision"), cfg.get("comm_overlap")
    if cfg.get("frontend", "bridge") != "bridge" or (mp is None and not isinstance(co, dict)):
        return secs
    eff = effective_config(cfg, Env(gpus=(cfg.get("_meta") or {}).get("gpus")))
    lifted: list[tuple[tuple[str, ...], str]] = []
    if mp is not None:
        lifted += [(MP_MODEL_FIELDS, "model"), (MP_OPTIMIZER_FIELDS, "optimizer"), (MP_DDP_FIELDS, "ddp")]
    if isinstance(co, dict):
        lifted += [(OVERLAP_MODEL_FIELDS, "model"), (_OVERLAP_DDP_FIELDS, "ddp")]
    for fields, sec in lifted:
        for f in fields:
            if f in eff[sec]:
                secs[sec][f] = eff[sec][f]
    return secs


def config_to_megatron_args(cfg: dict) -> list[str]:
    """Megatron-LM argument tokens for a config (inverse of :func:`read_megatron_args`; every field
    :func:`job_to_config` writes, Bridge ``mixed_precision``/``comm_overlap`` sections included)."""
    out: list[str] = []
    lifted = _bridge_sections(cfg)
    m = lifted["model"]
    if m.get("gated_linear_unit") and str(m.get("activation_func", "silu")).lower() in ("silu", "swiglu"):
        out.append("--swiglu")
    elif "squared" in str(m.get("activation_func", "")):
        out.append("--squared-relu")
    if m.get("num_query_groups"):
        out.append("--group-query-attention")
    if m.get("recompute_granularity") == "selective" and m.get("recompute_modules") is None:
        m["recompute_modules"] = ["core_attn"]
    # MLM's ETP default is TP (Bridge's is 1 with EP>1): write the Bridge-effective value explicitly
    if m.get("expert_tensor_parallel_size") is None and m.get("num_moe_experts") \
            and cfg.get("frontend", "bridge") == "bridge":
        m["expert_tensor_parallel_size"] = bridge_default_etp(m.get("tensor_model_parallel_size") or 1,
                                                              m.get("expert_model_parallel_size") or 1)
    if m.get("pipeline_model_parallel_layout") and m.get("virtual_pipeline_model_parallel_size"):
        # Megatron-LM takes the virtual stages from the layout string and accepts at most one of
        # --pipeline-model-parallel-layout / --num-virtual-stages-per-pipeline-rank (arguments.py validate_args)
        m = {**m, "virtual_pipeline_model_parallel_size": None}
    sections = {**{k: v for k, v in cfg.items() if isinstance(v, dict)}, **lifted, "model": m}
    emitted: set[str] = set()
    for path, (flag, typ) in _REV.items():
        sec, field = path.split(".", 1)
        d = sections.get(sec)
        if flag in emitted or not isinstance(d, dict) or field not in d:
            continue
        v = d[field]
        if v is None or (isinstance(v, str) and v.startswith("<")):
            continue
        emitted.add(flag)
        if typ == "bool":
            if v:
                out.append(f"--{flag}")
        elif typ == "nobool":
            if v is False:
                out.append(f"--{flag}")
        elif typ in ("list", "intlist"):
            vals = v if isinstance(v, list) else [v]
            if vals:
                out += [f"--{flag}", *[str(x) for x in vals]]
        elif flag == "moe-layer-freq":
            out += [f"--{flag}", str(v) if isinstance(v, int) else "[" + ",".join(map(str, v)) + "]"]
        else:
            out += [f"--{flag}", _MLM_DTYPE.get(str(v), str(v)) if flag in _MLM_DTYPE_FLAGS else str(v)]
    return out


#: Bridge's optimizer dtypes are torch dtype names; Megatron-LM's flags take short names (arguments.py choices)
_MLM_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "uint8": "fp8"}
_MLM_DTYPE_FLAGS = ("main-grads-dtype", "main-params-dtype", "exp-avg-dtype", "exp-avg-sq-dtype")


def config_to_bridge_overrides(cfg: dict) -> list[str]:
    """Hydra-style ``section.field=value`` overrides for every set field (``_meta``/``frontend`` excluded)."""
    out: list[str] = []
    for sec, d in cfg.items():
        if sec.startswith("_") or sec == "frontend":
            continue
        if isinstance(d, dict):
            for k, v in d.items():
                if k.startswith("_"):
                    continue
                out.append(format_override(f"{sec}.{k}", v))
        elif d is not None:
            out.append(f"{sec}={format_value(d)}")
    return out


_ = MODEL_DEFAULTS

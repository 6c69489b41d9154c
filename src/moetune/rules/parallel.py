"""(a) Parallel sizes, divisibility, batch sizes and pipeline layout: docs/rules.md §2 (PAR-001 … PAR-047).

Sources are Megatron-Core ``parallel_state.py`` (PS), ``model_parallel_config.py`` (MPC), ``transformer_config.py``
(TC), the pipeline-layout parser and Bridge ``training/config.py`` (B/cfg); line numbers refer to the pinned
commit listed in docs/rules.md §0.
"""

from __future__ import annotations

import math

from moetune.errors import LayoutError
from moetune.rules.common import ENV, I_, RT, E, divisors, largest_divisor_at_most, lcm
from moetune.rules.engine import UNKNOWN, Ctx, all_of, any_of, rule
from moetune.spec.pipeline import even_split_error, layout_contents_error, parse_pipeline_layout, uneven_split_error

A = "parallel"


def _stage_count(c: Ctx) -> int | None:
    """Number of stages of ``pipeline_model_parallel_layout`` (string or Bridge list form) via
    :func:`moetune.spec.pipeline.parse_pipeline_layout`; None when unset or unparseable (PAR-032 reports that)."""
    lay = c.m("pipeline_model_parallel_layout")
    if lay is None or (isinstance(lay, str) and lay.startswith("<")):
        return None  # none, or recomputed by a recipe layout builder at finalize
    try:
        return len(parse_pipeline_layout(lay))
    except LayoutError:
        return None


def _layout_error(c: Ctx) -> str | None:
    """PAR-032 via :func:`moetune.spec.pipeline.layout_contents_error` (counts skipped when unknown)."""
    lay = c.m("pipeline_model_parallel_layout")
    if lay is None or (isinstance(lay, str) and lay.startswith("<")):
        return None
    try:
        stages = parse_pipeline_layout(lay)
    except LayoutError as e:
        return str(e)
    mtp = c.m("mtp_num_layers")
    known_mtp = (mtp or 0) if (c.arch_known or mtp is not None) else None
    return layout_contents_error(stages, c.num_layers, known_mtp)


def _uses_flexible_split(c: Ctx) -> bool:
    return bool(c.m("pipeline_model_parallel_layout") is not None or c.m("num_layers_in_first_pipeline_stage")
                or c.m("num_layers_in_last_pipeline_stage") or c.m("account_for_embedding_in_pipeline_split")
                or c.m("account_for_loss_in_pipeline_split"))


def _is_hybrid(c: Ctx) -> bool:
    return bool(c.m("hybrid_override_pattern") or c.m("hybrid_layer_pattern") or c.m("is_hybrid_model"))


def _heads_cp_a2a(c: Ctx) -> int | None:
    types = c.m("cp_comm_type")
    tl = types if isinstance(types, list) else [types]
    if c.cp <= 1:
        return None
    if "a2a" in tl:
        return c.cp
    if "a2a+p2p" in tl:
        h = c.m("hierarchical_context_parallel_sizes")
        return h[0] if h else None
    return None


def _uneven_pp_err(c: Ctx) -> bool:
    """PAR-028 via :func:`moetune.spec.pipeline.uneven_split_error`."""
    first, last = c.m("num_layers_in_first_pipeline_stage"), c.m("num_layers_in_last_pipeline_stage")
    if (first is None and last is None) or c.num_layers is None:
        return False
    return uneven_split_error(c.num_layers, c.pp, c.vpp or 1, first, last) is not None


def _nearest_tp(c: Ctx) -> dict:
    heads = c.m("num_attention_heads") or 1
    return {"model.tensor_model_parallel_size": largest_divisor_at_most(heads, c.tp)}


# ---------------------------------------------------------------------------------------------------------------
rule("PAR-001", A, E, "I", ["W", "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
                            "model.context_parallel_size"],
     lambda c: c.W % (c.tp * c.pp * c.cp) != 0,
     "world size is not divisible by TP*PP*CP", "B/cfg get_data_parallel_size; PS initialize_model_parallel L823",
     fix=lambda c: {"model.tensor_model_parallel_size": math.gcd(c.W, c.tp)} if c.W % c.tp else
     {"model.pipeline_model_parallel_size": math.gcd(c.W // c.tp, c.pp)} if (c.W // c.tp) % c.pp else
     {"model.context_parallel_size": math.gcd(c.W // (c.tp * c.pp), c.cp)},
     frontends=("bridge", "megatron-lm"), env=("world size",),
     detail=lambda c: f"world_size ({c.W}) is not divisible by tensor_model_parallel_size ({c.tp}) x "
                      f"pipeline_model_parallel_size ({c.pp}) x context_parallel_size ({c.cp})")
rule("PAR-002", A, E, "I", ["W", "model.expert_tensor_parallel_size", "model.expert_model_parallel_size",
                            "model.pipeline_model_parallel_size"],
     lambda c: c.W % (c.etp * c.ep * c.pp) != 0,
     "world size is not divisible by ETP*EP*PP (expert_tensor_model_pipeline_parallel size)",
     "PS initialize_model_parallel L844",
     fix=lambda c: {"model.expert_model_parallel_size": math.gcd(c.W // math.gcd(c.W, c.etp * c.pp), c.ep)}
     if c.W % (c.etp * c.pp) == 0 else {"model.expert_tensor_parallel_size": 1},
     env=("world size",),
     detail=lambda c: f"world_size ({c.W}) is not divisible by expert_tensor_model_pipeline_parallel size "
                      f"({c.etp * c.ep * c.pp})")
rule("PAR-005", A, E, "I", ["dist.use_tp_pp_dp_mapping", "model.pipeline_model_parallel_size",
                            "model.tensor_model_parallel_size", "model.context_parallel_size",
                            "model.expert_tensor_parallel_size", "model.expert_model_parallel_size"],
     lambda c: bool(c.get("dist.use_tp_pp_dp_mapping")) and not c.get("dist.use_decentralized_pg") and c.pp > 1
     and c.etp * c.ep != c.tp * c.cp,
     "with order tp-cp-ep-pp-dp the attention and expert data-parallel sizes must match (ETP*EP == TP*CP)",
     "PS L898/L904", fix={"dist.use_tp_pp_dp_mapping": False})
rule("PAR-006", A, E, "I", ["model.virtual_pipeline_model_parallel_size", "model.pipeline_model_parallel_size"],
     lambda c: c.vpp is not None and c.pp <= 1,
     "interleaved schedule (VPP) needs pipeline_model_parallel_size > 1", "PS L829",
     fix={"model.virtual_pipeline_model_parallel_size": None})
rule("PAR-007", A, E, "I", ["ddp.num_distributed_optimizer_instances", "DP", "EDP", "model.context_parallel_size"],
     lambda c: (c.get("ddp.num_distributed_optimizer_instances") or 1) > 1 and any_of(
         (c.dp * c.cp) % c.get("ddp.num_distributed_optimizer_instances") != 0,
         c.edp % c.get("ddp.num_distributed_optimizer_instances") != 0),
     "DP*CP and expert data parallel size must be divisible by the partial DistOpt shard factor "
     "(num_distributed_optimizer_instances)", "PS L922, L1447",
     fix={"ddp.num_distributed_optimizer_instances": 1}, env=("world size",),
     detail=lambda c: (f"Expert data parallel size should be divisible by partial DistOpt shard factor "
                       f"(EDP {c.edp} % {c.get('ddp.num_distributed_optimizer_instances')})")
     if c.edp % c.get("ddp.num_distributed_optimizer_instances") else
     (f"Data parallel size should be divisible by partial DistOpt shard factor "
      f"(DP*CP {c.dp * c.cp} % {c.get('ddp.num_distributed_optimizer_instances')})"))
rule("PAR-008", A, E, "C", ["model.hierarchical_context_parallel_sizes", "model.context_parallel_size"],
     lambda c: c.m("hierarchical_context_parallel_sizes") is not None
     and math.prod(c.m("hierarchical_context_parallel_sizes")) != c.cp,
     "product of hierarchical_context_parallel_sizes must equal context_parallel_size",
     "B/cfg _validate_cp_comm_type; PS L1128",
     fix=lambda c: {"model.hierarchical_context_parallel_sizes": [c.cp]})
rule("PAR-009", A, E, "C", ["model.cp_comm_type", "model.hierarchical_context_parallel_sizes"],
     lambda c: any("a2a+p2p" in str(t) for t in (c.m("cp_comm_type") if isinstance(c.m("cp_comm_type"), list)
                                                else [c.m("cp_comm_type")]))
     and c.m("hierarchical_context_parallel_sizes") is None,
     "cp_comm_type 'a2a+p2p' needs hierarchical_context_parallel_sizes (else CP traffic is silently skipped)",
     "B/cfg _validate_cp_comm_type", fix={"model.cp_comm_type": "p2p"}, frontends=("bridge", "megatron-lm"))
rule("PAR-010", A, E, "I", ["dist.use_decentralized_pg", "model.hierarchical_context_parallel_sizes"],
     lambda c: bool(c.get("dist.use_decentralized_pg")) and c.m("hierarchical_context_parallel_sizes") is not None,
     "decentralized process groups do not support hierarchical context parallelism",
     "B/init _create_pg_collection", fix={"dist.use_decentralized_pg": False})
rule("PAR-011", A, E, "C", ["model.cp_comm_type", "model.num_layers", "model.context_parallel_size"],
     lambda c: c.cp > 1 and c.m("cp_comm_type") is not None and (
         (isinstance(c.m("cp_comm_type"), list) and len(c.m("cp_comm_type")) not in (c.num_layers, 1)
          if isinstance(c.m("cp_comm_type"), list) and len(c.m("cp_comm_type")) != 1 else False)
         or not isinstance(c.m("cp_comm_type"), (str, list))),
     "per-layer cp_comm_type list must have one entry per transformer layer", "TC L2864; B/cfg _validate_cp_comm_type",
     fix={"model.cp_comm_type": "p2p"})
rule("PAR-012", A, ENV, "B", ["model.cp_comm_type", "model.context_parallel_size", "env.te"],
     lambda c: c.cp > 1 and "a2a+p2p" in str(c.m("cp_comm_type")) and c.te_below("1.12.0"),
     "hierarchical CP (a2a+p2p) needs Transformer Engine >= 1.12", "TE TEDotProductAttention.__init__",
     fix={"model.cp_comm_type": "p2p"}, env=("Transformer Engine version",))
rule("PAR-013", A, RT, "R", ["model.num_attention_heads", "model.num_query_groups", "model.tensor_model_parallel_size",
                             "model.context_parallel_size", "model.cp_comm_type"],
     lambda c: _heads_cp_a2a(c) is not None and (
         (c.m("num_attention_heads") // c.tp) % _heads_cp_a2a(c) != 0
         or max(1, (c.m("num_query_groups") or c.m("num_attention_heads")) // c.tp) % _heads_cp_a2a(c) != 0),
     "attention heads (Q and KV) per TP rank must be divisible by the CP all-to-all size",
     "TE dot_product_attention/context_parallel.py", fix={"model.cp_comm_type": "p2p"})
rule("PAR-014", A, E, "C", ["model.seq_length", "model.context_parallel_size"],
     lambda c: c.cp > 1 and c.m("seq_length") is not None and c.m("seq_length") % (2 * c.cp) != 0,
     "sequence length must be divisible by 2*context_parallel_size", "B/cfg validate L1575",
     fix=lambda c: {"model.context_parallel_size": max(d for d in divisors(c.m("seq_length") // 2) if d <= c.cp)})
rule("PAR-015", A, E, "C", ["model.context_parallel_size", "model.calculate_per_token_loss", "ddp.average_in_collective"],
     lambda c: c.cp > 1 and str(c.get("dataset._class") or "").endswith(
         ("GPTSFTDatasetConfig", "DirectHFSFTDatasetConfig", "EnergonDatasetConfig", "MockVLMSFTDatasetConfig"))
     and (not c.m("calculate_per_token_loss") or bool(c.get("ddp.average_in_collective"))),
     "finetuning with CP>1 needs calculate_per_token_loss=True and ddp.average_in_collective=False",
     "B/cfg validate L1592", fix={"model.calculate_per_token_loss": True, "ddp.average_in_collective": False})
rule("PAR-016", A, E, "C", ["model.seq_length", "dataset.seq_length"],
     lambda c: c.get("dataset.seq_length") is not None and c.m("seq_length") is not None
     and c.m("seq_length") != c.get("dataset.seq_length"),
     "model and dataset sequence lengths must match", "B/cfg validate L1645",
     fix=lambda c: {"dataset.seq_length": c.m("seq_length")})
rule("PAR-017", A, I_, "C", ["model.sequence_parallel", "model.tensor_model_parallel_size"],
     lambda c: bool(c.raw_get("model.sequence_parallel")) and c.tp <= 1,
     "sequence_parallel with TP<=1 is silently turned off (raw MCore would raise)", "MPC L504; B/tc finalize")
rule("PAR-018", A, RT, "R", ["model.sequence_parallel", "model.tensor_model_parallel_size", "model.seq_length",
                             "model.context_parallel_size"],
     lambda c: bool(c.m("sequence_parallel")) and c.tp > 1 and c.m("seq_length") is not None
     and (c.m("seq_length") // c.cp) % c.tp != 0 and not c.m("variable_seq_lengths"),
     "with sequence parallelism (seq_length/CP) must be divisible by TP", "tensor_parallel/mappings.py _split_along_first_dim",
     fix=lambda c: {"model.tensor_model_parallel_size": math.gcd(c.m("seq_length") // c.cp, c.tp)})
rule("PAR-019", A, E, "C", ["model.num_attention_heads", "model.tensor_model_parallel_size"],
     lambda c: c.m("num_attention_heads") is not None and c.m("num_attention_heads") % c.tp != 0,
     "num_attention_heads must be a multiple of tensor_model_parallel_size", "TC L1352", fix=_nearest_tp)
rule("PAR-020", A, E, "C", ["model.num_query_groups", "model.tensor_model_parallel_size"],
     lambda c: (lambda nq: nq is not None and nq % c.tp != 0 and c.tp % nq != 0)(
         c.m("num_query_groups") or c.m("num_attention_heads")),
     "num_query_groups must be a multiple or a divisor of tensor_model_parallel_size", "TC L1370",
     fix=lambda c: {"model.tensor_model_parallel_size": largest_divisor_at_most(
         c.m("num_query_groups") or c.m("num_attention_heads"), c.tp)})
rule("PAR-021", A, E, "C", ["model.experimental_attention_variant", "model.linear_num_key_heads",
                            "model.linear_num_value_heads", "model.tensor_model_parallel_size",
                            "model.context_parallel_size"],
     lambda c: c.m("experimental_attention_variant") in ("gdn", "gdn2") and c.m("linear_num_key_heads") is not None
     and (c.m("linear_num_key_heads") % (c.tp * c.cp) != 0
          or (c.m("linear_num_value_heads") or 0) % (c.tp * c.cp) != 0
          or (c.m("linear_num_value_heads") or 0) % c.m("linear_num_key_heads") != 0),
     "Gated-DeltaNet key/value head counts must divide across TP*CP", "TC L1380-1411",
     fix=lambda c: {"model.tensor_model_parallel_size": 1, "model.context_parallel_size": 1})
rule("PAR-022", A, RT, "B", ["model.ffn_hidden_size", "model.moe_shared_expert_intermediate_size",
                             "model.tensor_model_parallel_size"],
     lambda c: (c.has_dense_mlp and c.m("ffn_hidden_size") is not None and c.m("ffn_hidden_size") % c.tp != 0)
     or (c.has_shared_experts and c.m("moe_shared_expert_intermediate_size") % c.tp != 0),
     "dense MLP / shared-expert widths must be divisible by TP", "megatron/core/utils.py divide via linear layers",
     fix=lambda c: {"model.tensor_model_parallel_size": math.gcd(math.gcd(
         c.m("ffn_hidden_size") if c.has_dense_mlp and c.m("ffn_hidden_size") else c.tp,
         c.m("moe_shared_expert_intermediate_size") if c.has_shared_experts else c.tp), c.tp)})
rule("PAR-023", A, RT, "B", ["model.moe_ffn_hidden_size", "model.expert_tensor_parallel_size"],
     lambda c: c.is_moe and (c.m("moe_ffn_hidden_size") or c.m("ffn_hidden_size") or 0) % c.etp != 0,
     "expert FFN width must be divisible by expert_tensor_parallel_size", "TE grouped linear constructors (divide)",
     fix=lambda c: {"model.expert_tensor_parallel_size": math.gcd(c.m("moe_ffn_hidden_size") or c.m("ffn_hidden_size"),
                                                                  c.etp)})
rule("PAR-024", A, RT, "B", ["model.num_moe_experts", "model.expert_model_parallel_size"],
     lambda c: c.is_moe and c.num_experts > 0 and c.num_experts % c.ep != 0,
     "num_moe_experts must be divisible by expert_model_parallel_size", "moe_layer.py BaseMoELayer.__init__ L185",
     fix=lambda c: {"model.expert_model_parallel_size": math.gcd(c.num_experts, c.ep)})
rule("PAR-025", A, E, "C", ["model.expert_model_parallel_size", "model.num_moe_experts"],
     lambda c: c.ep > 1 and not c.is_moe and c.arch_known,
     "expert_model_parallel_size > 1 requires num_moe_experts", "TC L1501",
     fix={"model.expert_model_parallel_size": 1})


def _par026(c: Ctx) -> bool:
    if _uses_flexible_split(c) and not (c.m("account_for_embedding_in_pipeline_split")
                                        or c.m("account_for_loss_in_pipeline_split")):
        return False
    if _is_hybrid(c) or c.num_layers is None:
        return False
    if c.m("num_layers_in_first_pipeline_stage") or c.m("num_layers_in_last_pipeline_stage") \
            or c.m("pipeline_model_parallel_layout") is not None:
        return False
    return even_split_error(c.num_layers, c.pp, c.vpp or 1, bool(c.m("account_for_embedding_in_pipeline_split")),
                            bool(c.m("account_for_loss_in_pipeline_split"))) is not None


rule("PAR-026", A, E, "C", ["model.num_layers", "model.pipeline_model_parallel_size",
                            "model.virtual_pipeline_model_parallel_size"], _par026,
     "layers must split evenly over pipeline stages and then over virtual stages",
     "TC L2142-2168; transformer_block.py get_num_layers_to_build",
     fix=lambda c: {"model.pipeline_model_parallel_size": largest_divisor_at_most(c.num_layers, c.pp),
                    "model.virtual_pipeline_model_parallel_size": None})
rule("PAR-027", A, E, "B", ["model.num_layers", "model.pipeline_model_parallel_size",
                            "model.virtual_pipeline_model_parallel_size"],
     lambda c: c.vpp is not None and not _uses_flexible_split(c) and c.num_layers is not None
     and (c.num_layers // c.pp) % c.vpp != 0,
     "number of model chunks must be the same across all pipeline stages ((num_layers//PP) % VPP)",
     "B/gpt provide; MLM GPTModelConfig.finalize", fix={"model.virtual_pipeline_model_parallel_size": None})
rule("PAR-028", A, E, "C", ["model.num_layers_in_first_pipeline_stage", "model.num_layers_in_last_pipeline_stage",
                            "model.num_layers", "model.pipeline_model_parallel_size",
                            "model.virtual_pipeline_model_parallel_size"], _uneven_pp_err,
     "uneven pipeline split: first/last stage counts must be positive, VPP-divisible, and the middle layers must "
     "divide evenly over the middle stages", "TC L2057-2126",
     fix={"model.num_layers_in_first_pipeline_stage": None, "model.num_layers_in_last_pipeline_stage": None})
rule("PAR-029", A, E, "C", ["model.num_layers_in_first_pipeline_stage", "model.num_layers_in_last_pipeline_stage",
                            "model.account_for_embedding_in_pipeline_split", "model.account_for_loss_in_pipeline_split"],
     lambda c: (c.m("num_layers_in_first_pipeline_stage") is not None
                or c.m("num_layers_in_last_pipeline_stage") is not None)
     and bool(c.m("account_for_embedding_in_pipeline_split") or c.m("account_for_loss_in_pipeline_split")),
     "first/last stage layer counts and account_for_*_in_pipeline_split are mutually exclusive", "TC L1994",
     fix={"model.account_for_embedding_in_pipeline_split": False, "model.account_for_loss_in_pipeline_split": False})
rule("PAR-030", A, E, "C", ["model.pipeline_model_parallel_layout", "model.num_layers_in_first_pipeline_stage",
                            "model.num_layers_in_last_pipeline_stage", "model.account_for_embedding_in_pipeline_split",
                            "model.account_for_loss_in_pipeline_split"],
     lambda c: c.m("pipeline_model_parallel_layout") is not None and bool(
         c.m("num_layers_in_first_pipeline_stage") is not None or c.m("num_layers_in_last_pipeline_stage") is not None
         or c.m("account_for_embedding_in_pipeline_split") or c.m("account_for_loss_in_pipeline_split")),
     "pipeline_model_parallel_layout cannot be combined with other pipeline-split options", "TC L2011",
     fix={"model.num_layers_in_first_pipeline_stage": None, "model.num_layers_in_last_pipeline_stage": None,
          "model.account_for_embedding_in_pipeline_split": False, "model.account_for_loss_in_pipeline_split": False})
rule("PAR-031", A, E, "C", ["model.pipeline_model_parallel_layout", "model.pipeline_model_parallel_size",
                            "model.virtual_pipeline_model_parallel_size"],
     lambda c: (n := _stage_count(c)) is not None and (
         n % c.pp != 0 or (c.vpp is not None and c.vpp != n // c.pp and not (c.vpp == 1 and n == c.pp))),
     "layout stage count must be a multiple of PP and VPP must equal stages/PP",
     "pipeline_parallel_layer_layout.py PipelineParallelLayerLayout.__init__; TC L2039",
     fix=lambda c: {"model.virtual_pipeline_model_parallel_size": n // c.pp if n // c.pp > 1 else None}
     if (n := _stage_count(c)) % c.pp == 0 else {"model.pipeline_model_parallel_layout": None})
rule("PAR-032", A, E, "C", ["model.pipeline_model_parallel_layout", "model.num_layers", "model.mtp_num_layers"],
     lambda c: _layout_error(c) is not None,
     "invalid pipeline_model_parallel_layout (E first, L last, decoder count = num_layers, MTP count = "
     "mtp_num_layers, MTP after all decoders)", "PipelineParallelLayerLayout.validate_layer_layout",
     fix={"model.pipeline_model_parallel_layout": None})
rule("PAR-033", A, RT, "B", ["model.account_for_embedding_in_pipeline_split", "model.account_for_loss_in_pipeline_split",
                             "model.num_layers", "model.pipeline_model_parallel_size",
                             "model.virtual_pipeline_model_parallel_size"],
     lambda c: bool(c.m("account_for_embedding_in_pipeline_split") or c.m("account_for_loss_in_pipeline_split"))
     and c.num_layers is not None and (c.num_layers + bool(c.m("account_for_embedding_in_pipeline_split"))
                                       + bool(c.m("account_for_loss_in_pipeline_split"))) // (c.pp * (c.vpp or 1)) < 2,
     "not enough layers in the first/last virtual pipeline stage for the embedding/loss slot",
     "transformer_block.py get_num_layers_to_build",
     fix={"model.account_for_embedding_in_pipeline_split": False, "model.account_for_loss_in_pipeline_split": False})
rule("PAR-034", A, RT, "B", ["model.virtual_pipeline_model_parallel_size"],
     lambda c: _is_hybrid(c) and c.vpp is not None,
     "virtual pipeline is unsupported for hybrid (Mamba) models", "models/hybrid/hybrid_provider.py provide",
     fix={"model.virtual_pipeline_model_parallel_size": None}, frontends=("bridge",))
rule("PAR-035", A, E, "I", ["train.global_batch_size", "train.micro_batch_size", "DP"],
     lambda c: c.gbs is not None and not c.get("train.decrease_batch_size_if_needed")
     and not c.get("train.rampup_batch_size") and not c.get("train.step_batch_size_schedule")
     and any_of(c.gbs % (c.mbs * c.dp) != 0, c.nmb < 1),
     "global batch size must be divisible by micro_batch_size * DP (dense DP = W/(TP*PP*CP))",
     "num_microbatches_calculator.py ConstantNumMicroBatchesCalculator L381/L389",
     fix=lambda c: {"train.global_batch_size": max(1, c.gbs // (c.mbs * c.dp)) * c.mbs * c.dp},
     env=("world size",))
rule("PAR-036", A, E, "C", ["validation.eval_global_batch_size", "validation.eval_micro_batch_size", "DP"],
     lambda c: c.get("validation.eval_global_batch_size") is not None and (
         c.get("validation.eval_global_batch_size") % ((c.get("validation.eval_micro_batch_size") or c.mbs) * c.dp) != 0),
     "eval global batch size must be divisible by eval micro batch size * DP", "B/cfg validate L1475",
     fix=lambda c: {"validation.eval_global_batch_size": c.gbs}, env=("world size",))
rule("PAR-037", A, RT, "R", ["model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size",
                             "model.microbatch_group_size_per_vp_stage", "NMB"],
     lambda c: c.pp > 1 and c.vpp is not None and c.gbs is not None and any_of(
         c.nmb < (c.m("microbatch_group_size_per_vp_stage") or c.pp),
         (c.m("microbatch_group_size_per_vp_stage") or c.pp) < c.pp),
     "interleaved schedule needs PP <= microbatch_group_size_per_vp_stage <= number of microbatches",
     "pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving L1143",
     fix=lambda c: {"train.global_batch_size": c.pp * c.mbs * c.dp, "model.microbatch_group_size_per_vp_stage": None},
     env=("world size",))
rule("PAR-038", A, RT, "R", ["model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size",
                             "model.microbatch_group_size_per_vp_stage", "NMB"],
     lambda c: c.pp > 1 and c.vpp is not None and c.gbs is not None and all_of(
         c.nmb % (c.m("microbatch_group_size_per_vp_stage") or c.pp) > 0,
         c.nmb % (c.m("microbatch_group_size_per_vp_stage") or c.pp) < c.pp),
     "interleaved schedule: the last microbatch group would be smaller than PP (number of microbatches should be a "
     "multiple of PP)", "pipeline_parallel/schedules.py L1154",
     fix=lambda c: {"train.global_batch_size": max(1, -(-c.nmb // c.pp)) * c.pp * c.mbs * c.dp},
     env=("world size",))
rule("PAR-039", A, I_, "C", ["model.pipeline_model_parallel_size", "model.pipeline_dtype"],
     lambda c: c.pp > 1 and c.raw_get("model.pipeline_dtype") is None and c.bridge
     and not isinstance(c.raw.get("mixed_precision"), (dict, str)),
     "pipeline_dtype unset with PP>1: Bridge fills it from params_dtype", "MPC L529; B/tc finalize")
rule("PAR-040", A, E, "I", ["dist.sharp_enabled_group", "dist.use_sharp", "ddp.num_distributed_optimizer_instances"],
     lambda c: c.get("dist.sharp_enabled_group") is not None and (
         not c.get("dist.use_sharp") or c.get("dist.sharp_enabled_group") not in ("dp", "dp_replica")
         or (c.get("dist.sharp_enabled_group") == "dp_replica"
             and (c.get("ddp.num_distributed_optimizer_instances") or 1) <= 1)),
     "invalid SHARP group options (needs use_sharp; dp or dp_replica; dp_replica needs partial DistOpt)",
     "PS L783-789", fix={"dist.sharp_enabled_group": None})
rule("PAR-041", A, E, "C", ["model.tensor_parallel_num_weight_shards", "model.tensor_model_parallel_size"],
     lambda c: c.m("tensor_parallel_num_weight_shards") is not None and (
         c.m("tensor_parallel_num_weight_shards") < c.tp or c.m("tensor_parallel_num_weight_shards") % c.tp != 0),
     "GTP weight-shard count must be >= and divisible by TP", "MPC resolve_tensor_parallel_weight_shards",
     fix={"model.tensor_parallel_num_weight_shards": None})
rule("PAR-042", A, E, "I", ["model.hybrid_context_parallel", "DP", "model.context_parallel_size"],
     lambda c: bool(c.m("hybrid_context_parallel")) and (c.dp * c.cp) % 2 == 1,
     "hybrid context parallel requires an even DP*CP group", "PS L1043",
     fix={"model.hybrid_context_parallel": False}, env=("world size",))
rule("PAR-043", A, E, "C", ["dataset.enable_offline_packing", "dataset.enable_in_batch_packing", "train.micro_batch_size"],
     lambda c: (bool(c.get("dataset.enable_offline_packing")) and c.mbs > 1)
     or (bool(c.get("dataset.enable_in_batch_packing")) and c.mbs == 1)
     or (bool(c.get("dataset.enable_offline_packing")) and bool(c.get("dataset.enable_in_batch_packing"))),
     "packing mode / micro batch size mismatch (offline packing needs MBS 1, in-batch packing MBS > 1, not both)",
     "B/cfg validate L1277-1621", fix={"dataset.enable_in_batch_packing": False, "dataset.enable_offline_packing": False})
rule("PAR-044", A, E, "C", ["dataset.packing_buffer_size", "train.micro_batch_size", "model.pipeline_model_parallel_size",
                            "model.mtp_num_layers", "model.cuda_graph_impl"],
     lambda c: c.get("dataset.packing_buffer_size") is not None and (
         c.mbs != 1 or not c.m("calculate_per_token_loss") or bool(c.get("ddp.average_in_collective"))
         or (c.m("mtp_num_layers") or 0) > 0 or c.cg_impl != "none" or c.pp > 1),
     "Energon native packing needs MBS 1, per-token loss, no average_in_collective, no MTP, no CUDA graphs, PP 1",
     "B/cfg validate", fix={"dataset.packing_buffer_size": None})
rule("PAR-045", A, I_, "C", ["dataset.pad_to_max_length"],
     lambda c: c.get("dataset.pad_to_max_length") is False and (c.pp > 1 or c.ep > 1),
     "Bridge forces pad_to_max_length=True with PP>1 or EP>1", "B/cfg validate")
rule("PAR-046", A, RT, "R", ["model.num_moe_experts", "model.tensor_model_parallel_size", "model.sequence_parallel"],
     lambda c: c.is_moe and c.tp > 1 and not c.m("sequence_parallel"),
     "MoE with tensor parallelism requires sequence_parallel=True (the MoE layer raises at the first forward)",
     "moe_layer.py MoELayer.forward L637", fix={"model.sequence_parallel": True})
rule("PAR-047", A, RT, "R", ["model.cp_comm_type", "model.context_parallel_size"],
     lambda c: c.cp > 1 and "a2a+p2p" in str(c.m("cp_comm_type")) and (
         bool(c.get("dataset.packed_sequence_specs")) or bool(c.get("dataset.offline_packing_specs"))),
     "hierarchical CP (a2a+p2p) does not support THD/packed sequences", "TE AttnFuncWithCPAndKVP2P.forward",
     fix={"model.cp_comm_type": "p2p"})
rule("PAR-004", A, I_, "-", ["model.expert_model_parallel_size", "DP"],
     lambda c: c.is_moe and c.ep > 1 and all_of(c.dp is not UNKNOWN, c.ep > c.dp),
     "EP larger than DP is legal (parallel folding); only PAR-001/PAR-002 constrain the sizes", "PS initialize_model_parallel")
rule("PAR-003", A, I_, "C", ["model.expert_tensor_parallel_size", "model.expert_model_parallel_size"],
     lambda c: c.is_moe and c.raw_get("model.expert_tensor_parallel_size") is None and c.bridge and c.ep > 1
     and c.tp > 1,
     "expert_tensor_parallel_size unset: Bridge uses 1 because EP>1 (raw MCore/MLM would use TP)",
     "B/tc _set_moe_expert_tensor_parallel_default")
_ = lcm

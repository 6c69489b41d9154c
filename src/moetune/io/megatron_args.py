"""Read Megatron-LM command-line arguments into the effective-config dict (Bridge ``ConfigContainer`` field names).

Accepted forms:

* a plain argument string or file (``--num-layers 16 --hidden-size 1024 --bf16 ...``, shell line continuations ok);
* the functional-test ``model_config.yaml`` form (``MODEL_ARGS: {--flag: value}`` plus ``ENV_VARS``), as in
  ``tests/functional_tests/test_cases/*/*/model_config.yaml`` of NVIDIA/Megatron-LM.

Every flag maps to a Bridge field (``model.*``, ``train.*``, ``optimizer.*``, ``ddp.*``, ``dist.*``, ``rng.*``, ...);
the mapping follows ``megatron/training/arguments.py`` (argparse dests) and Bridge's
``megatron/bridge/training/config.py`` (where each field lives). Megatron-LM's own defaults that differ from
Megatron-Core's (``--expert-tensor-parallel-size`` -> TP, ``gradient_accumulation_fusion`` True,
``bias_dropout_fusion`` True, ...) are resolved by the effective-config replay with ``frontend='megatron-lm'``.

An unknown flag, a repeated flag with a different value, ``--x`` with ``--no-x``, or a non-numeric value for a
numeric flag raises a one-line :class:`InputError`.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from moetune.errors import InputError

# flag -> (target paths, type). Types: int, float, str, bool (store_true), nobool (store_false: sets False),
# list (nargs='+', strings), intlist, any (kept as given). A target may list several paths (all set).
_TABLE = """
tensor-model-parallel-size            model.tensor_model_parallel_size                         int
pipeline-model-parallel-size          model.pipeline_model_parallel_size                       int
virtual-pipeline-model-parallel-size  model.virtual_pipeline_model_parallel_size               int
num-virtual-stages-per-pipeline-rank  model.virtual_pipeline_model_parallel_size               int
num-layers-per-virtual-pipeline-stage mlm.num_layers_per_virtual_pipeline_stage                int
pipeline-model-parallel-layout        model.pipeline_model_parallel_layout                     str
decoder-first-pipeline-num-layers     model.num_layers_in_first_pipeline_stage                 int
decoder-last-pipeline-num-layers      model.num_layers_in_last_pipeline_stage                  int
account-for-embedding-in-pipeline-split model.account_for_embedding_in_pipeline_split          bool
account-for-loss-in-pipeline-split    model.account_for_loss_in_pipeline_split                 bool
microbatch-group-size-per-virtual-pipeline-stage model.microbatch_group_size_per_vp_stage      int
context-parallel-size                 model.context_parallel_size                              int
cp-comm-type                          model.cp_comm_type                                       list
hierarchical-context-parallel-sizes   model.hierarchical_context_parallel_sizes                intlist
hybrid-context-parallel               model.hybrid_context_parallel                            bool
expert-model-parallel-size            model.expert_model_parallel_size                         int
expert-tensor-parallel-size           model.expert_tensor_parallel_size                        int
sequence-parallel                     model.sequence_parallel                                  bool
use-tp-pp-dp-mapping                  dist.use_tp_pp_dp_mapping                                bool
distributed-backend                   dist.distributed_backend                                 str
distributed-timeout-minutes           dist.distributed_timeout_minutes                         int
use-sharp                             dist.use_sharp                                           bool
sharp-enabled-group                   dist.sharp_enabled_group                                 str
num-distributed-optimizer-instances   ddp.num_distributed_optimizer_instances                  int
use-distributed-optimizer             ddp.use_distributed_optimizer,optimizer.use_distributed_optimizer bool
overlap-grad-reduce                   ddp.overlap_grad_reduce                                  bool
overlap-param-gather                  ddp.overlap_param_gather,optimizer.overlap_param_gather  bool
align-param-gather                    ddp.align_param_gather                                   bool
overlap-param-gather-with-optimizer-step optimizer.overlap_param_gather_with_optimizer_step     bool
ddp-average-in-collective             ddp.average_in_collective                                bool
ddp-bucket-size                       ddp.bucket_size                                          int
ddp-num-buckets                       ddp.num_buckets                                          int
no-check-for-nan-in-loss-and-grad     rerun_state_machine.check_for_nan_in_loss,ddp.check_for_nan_in_grad nobool
accumulate-allreduce-grads-in-fp32    ddp.grad_reduce_in_fp32                                  bool
use-megatron-fsdp                     dist.use_megatron_fsdp,ddp.use_megatron_fsdp             bool
use-torch-fsdp2                       dist.use_torch_fsdp2                                     bool
data-parallel-sharding-strategy       ddp.data_parallel_sharding_strategy                      str
outer-dp-sharding-strategy            ddp.outer_dp_sharding_strategy                           str
megatron-fsdp-main-params-dtype       ddp.megatron_fsdp_main_params_dtype                      str
megatron-fsdp-main-grads-dtype        ddp.megatron_fsdp_main_grads_dtype                       str
megatron-fsdp-grad-comm-dtype         ddp.megatron_fsdp_grad_comm_dtype                        str
fsdp-double-buffer                    ddp.fsdp_double_buffer                                   bool
use-nccl-ub                           ddp.nccl_ub                                              bool
init-model-with-meta-device           model.init_model_with_meta_device                        bool
num-layers                            model.num_layers                                         int
hidden-size                           model.hidden_size                                        int
ffn-hidden-size                       model.ffn_hidden_size                                    int
num-attention-heads                   model.num_attention_heads                                int
num-query-groups                      model.num_query_groups                                   int
group-query-attention                 mlm.group_query_attention                                bool
kv-channels                           model.kv_channels                                        int
max-position-embeddings               model.max_position_embeddings                            int
position-embedding-type               model.position_embedding_type                            str
rotary-base                           model.rotary_base                                        float
rotary-percent                        model.rotary_percent                                     float
rotary-scaling-factor                 model.rotary_scaling_factor                              float
no-rope-fusion                        model.apply_rope_fusion                                  nobool
mscale                                model.mscale                                             float
mscale-all-dim                        model.mscale_all_dim                                     float
make-vocab-size-divisible-by          model.make_vocab_size_divisible_by                       int
vocab-size                            tokenizer.vocab_size                                     int
padded-vocab-size                     model.vocab_size                                         int
normalization                         model.normalization                                      str
norm-epsilon                          model.layernorm_epsilon                                  float
apply-layernorm-1p                    model.layernorm_zero_centered_gamma                      bool
swiglu                                mlm.swiglu                                               bool
squared-relu                          mlm.squared_relu                                         bool
untie-embeddings-and-output-weights   model.share_embeddings_and_output_weights                nobool
disable-bias-linear                   model.add_bias_linear                                    nobool
add-qkv-bias                          model.add_qkv_bias                                       bool
no-bias-gelu-fusion                   model.bias_activation_fusion                             nobool
no-bias-swiglu-fusion                 model.bias_activation_fusion                             nobool
no-bias-dropout-fusion                model.bias_dropout_fusion                                nobool
no-masked-softmax-fusion              model.masked_softmax_fusion                              nobool
no-gradient-accumulation-fusion       model.gradient_accumulation_fusion                       nobool
cross-entropy-loss-fusion             model.cross_entropy_loss_fusion                          bool
cross-entropy-fusion-impl             model.cross_entropy_fusion_impl                          str
attention-backend                     model.attention_backend                                  str
attention-softmax-in-fp32             model.attention_softmax_in_fp32                          bool
use-flash-attn                        model.use_flash_attn                                     bool
qk-layernorm                          model.qk_layernorm                                       bool
multi-latent-attention                model.multi_latent_attention                             bool
q-lora-rank                           model.q_lora_rank                                        int
kv-lora-rank                          model.kv_lora_rank                                       int
qk-head-dim                           model.qk_head_dim                                        int
qk-pos-emb-head-dim                   model.qk_pos_emb_head_dim                                int
v-head-dim                            model.v_head_dim                                         int
attention-dropout                     model.attention_dropout                                  float
hidden-dropout                        model.hidden_dropout                                     float
init-method-std                       model.init_method_std                                    float
transformer-impl                      model.transformer_impl                                   str
use-transformer-engine-op-fuser       model.use_transformer_engine_op_fuser                    bool
fp32-residual-connection              model.fp32_residual_connection                           bool
deterministic-mode                    model.deterministic_mode                                 bool
calculate-per-token-loss              model.calculate_per_token_loss                           bool
num-experts                           model.num_moe_experts                                    int
moe-ffn-hidden-size                   model.moe_ffn_hidden_size                                int
moe-layer-freq                        model.moe_layer_freq                                     any
moe-shared-expert-intermediate-size   model.moe_shared_expert_intermediate_size                int
moe-shared-expert-overlap             model.moe_shared_expert_overlap                          bool
moe-router-topk                       model.moe_router_topk                                    int
moe-router-load-balancing-type        model.moe_router_load_balancing_type                     list
moe-aux-loss-coeff                    model.moe_aux_loss_coeff                                 any
moe-z-loss-coeff                      model.moe_z_loss_coeff                                   float
moe-router-pre-softmax                model.moe_router_pre_softmax                             bool
moe-router-score-function             model.moe_router_score_function                          str
moe-router-topk-scaling-factor        model.moe_router_topk_scaling_factor                     float
moe-router-group-topk                 model.moe_router_group_topk                              int
moe-router-num-groups                 model.moe_router_num_groups                              int
moe-router-topk-limited-devices       model.moe_router_topk_limited_devices                    int
moe-router-enable-expert-bias         model.moe_router_enable_expert_bias                      bool
moe-router-bias-update-rate           model.moe_router_bias_update_rate                        float
moe-router-dtype                      model.moe_router_dtype                                   str
moe-router-fusion                     model.moe_router_fusion                                  bool
moe-router-force-load-balancing       model.moe_router_force_load_balancing                    bool
moe-router-padding-for-fp8            model.moe_router_padding_for_fp8                         bool
moe-router-padding-for-quantization   model.moe_router_padding_for_quantization                bool
moe-token-dispatcher-type             model.moe_token_dispatcher_type                          str
moe-flex-dispatcher-backend           model.moe_flex_dispatcher_backend                        str
moe-enable-deepep                     model.moe_enable_deepep                                  bool
moe-deepep-num-sms                    model.moe_deepep_num_sms                                 int
moe-hybridep-num-sms                  model.moe_hybridep_num_sms                               int
moe-grouped-gemm                      model.moe_grouped_gemm                                   bool
moe-permute-fusion                    model.moe_permute_fusion                                 bool
moe-expert-capacity-factor            model.moe_expert_capacity_factor                         float
moe-pad-expert-input-to-capacity      model.moe_pad_expert_input_to_capacity                   bool
moe-token-drop-policy                 model.moe_token_drop_policy                              str
moe-input-jitter-eps                  model.moe_input_jitter_eps                               float
moe-layer-recompute                   model.moe_layer_recompute                                bool
moe-apply-probs-on-input              model.moe_apply_probs_on_input                           bool
moe-latent-size                       model.moe_latent_size                                    int
moe-per-layer-logging                 model.moe_per_layer_logging                              bool
overlap-moe-expert-parallel-comm      model.overlap_moe_expert_parallel_comm                   bool
delay-wgrad-compute                   model.delay_wgrad_compute                                bool
mtp-num-layers                        model.mtp_num_layers                                     int
mtp-loss-scaling-factor               model.mtp_loss_scaling_factor                            float
recompute-granularity                 model.recompute_granularity                              str
recompute-method                      model.recompute_method                                   str
recompute-num-layers                  model.recompute_num_layers                               int
recompute-modules                     model.recompute_modules                                  list
recompute-activations                 mlm.recompute_activations                                bool
distribute-saved-activations          model.distribute_saved_activations                       bool
cpu-offloading                        model.cpu_offloading                                     bool
cpu-offloading-num-layers             model.cpu_offloading_num_layers                          int
fine-grained-activation-offloading    model.fine_grained_activation_offloading                 bool
offload-modules                       model.offload_modules                                    list
cuda-graph-impl                       model.cuda_graph_impl                                    str
cuda-graph-scope                      model.cuda_graph_scope                                   list
cuda-graph-modules                    model.cuda_graph_modules                                 list
cuda-graph-warmup-steps               model.cuda_graph_warmup_steps                            int
enable-cuda-graph                     model.enable_cuda_graph                                  bool
external-cuda-graph                   model.external_cuda_graph                                bool
te-rng-tracker                        rng.te_rng_tracker,model.use_te_rng_tracker              bool
tp-comm-overlap                       model.tp_comm_overlap                                    bool
overlap-p2p-communication             model.overlap_p2p_comm                                   bool
no-overlap-p2p-communication          model.overlap_p2p_comm                                   nobool
overlap-p2p-communication-warmup-flush model.overlap_p2p_comm_warmup_flush                     bool
defer-embedding-wgrad-compute         model.defer_embedding_wgrad_compute                      bool
wgrad-deferral-limit                  model.wgrad_deferral_limit                               int
bf16                                  model.bf16,optimizer.bf16                                bool
fp16                                  model.fp16,optimizer.fp16                                bool
fp8-format                            model.fp8                                                str
fp8-recipe                            model.fp8_recipe                                         str
fp8-param-gather                      model.fp8_param,ddp.fp8_param_gather                     bool
first-last-layers-bf16                model.first_last_layers_bf16                             bool
num-layers-at-start-in-bf16           model.num_layers_at_start_in_bf16                        int
num-layers-at-end-in-bf16             model.num_layers_at_end_in_bf16                          int
fp4-format                            model.fp4                                                str
fp4-recipe                            model.fp4_recipe                                         str
fp4-param-gather                      model.fp4_param                                          bool
use-precision-aware-optimizer         optimizer.use_precision_aware_optimizer                  bool
main-grads-dtype                      optimizer.main_grads_dtype                               str
main-params-dtype                     optimizer.main_params_dtype                              str
exp-avg-dtype                         optimizer.exp_avg_dtype                                  str
exp-avg-sq-dtype                      optimizer.exp_avg_sq_dtype                               str
optimizer-cpu-offload                 optimizer.optimizer_cpu_offload                          bool
optimizer-offload-fraction            optimizer.optimizer_offload_fraction                     float
optimizer                             optimizer.optimizer                                      str
lr                                    optimizer.lr                                             float
min-lr                                optimizer.min_lr                                         float
decoupled-lr                          optimizer.decoupled_lr                                   float
decoupled-min-lr                      optimizer.decoupled_min_lr                               float
weight-decay                          optimizer.weight_decay                                   float
clip-grad                             optimizer.clip_grad                                      float
adam-beta1                            optimizer.adam_beta1                                     float
adam-beta2                            optimizer.adam_beta2                                     float
adam-eps                              optimizer.adam_eps                                       float
loss-scale                            optimizer.loss_scale                                     float
lr-decay-style                        scheduler.lr_decay_style                                 str
lr-decay-iters                        scheduler.lr_decay_iters                                 int
lr-decay-samples                      scheduler.lr_decay_samples                               int
lr-warmup-fraction                    scheduler.lr_warmup_fraction                             float
lr-warmup-iters                       scheduler.lr_warmup_iters                                int
lr-warmup-samples                     scheduler.lr_warmup_samples                              int
micro-batch-size                      train.micro_batch_size                                   int
global-batch-size                     train.global_batch_size                                  int
rampup-batch-size                     train.rampup_batch_size                                  list
step-batch-size-schedule              train.step_batch_size_schedule                           str
decrease-batch-size-if-needed         train.decrease_batch_size_if_needed                      bool
train-iters                           train.train_iters                                        int
train-samples                         train.train_samples                                      int
exit-interval                         train.exit_interval                                      int
exit-duration-in-mins                 train.exit_duration_in_mins                              int
manual-gc                             train.manual_gc                                          bool
manual-gc-interval                    train.manual_gc_interval                                 int
eval-iters                            validation.eval_iters                                    int
eval-interval                         validation.eval_interval                                 int
seq-length                            model.seq_length,dataset.seq_length                      int
data-path                             dataset.data_path                                        list
data-cache-path                       dataset.path_to_cache                                    str
split                                 dataset.split                                            str
mock-data                             dataset.mock                                             bool
num-workers                           dataset.num_workers                                      int
no-mmap-bin-files                     dataset.mmap_bin_files                                   nobool
tokenizer-type                        tokenizer.tokenizer_type                                 str
tokenizer-model                       tokenizer.tokenizer_model                                str
vocab-file                            tokenizer.vocab_file                                     str
merge-file                            tokenizer.merge_file                                     str
save                                  checkpoint.save                                          str
load                                  checkpoint.load                                          str
save-interval                         checkpoint.save_interval                                 int
save-retain-interval                  checkpoint.save_retain_interval                          int
ckpt-format                           checkpoint.ckpt_format                                   str
async-save                            checkpoint.async_save                                    bool
use-persistent-ckpt-worker            checkpoint.use_persistent_ckpt_worker                    bool
dist-ckpt-strictness                  checkpoint.dist_ckpt_strictness                          str
dist-ckpt-optim-fully-reshardable     checkpoint.dist_ckpt_optim_fully_reshardable             bool
no-ckpt-fully-parallel-save           checkpoint.fully_parallel_save                           nobool
ckpt-fully-parallel-load              checkpoint.fully_parallel_load                           bool
ckpt-assume-constant-structure        checkpoint.ckpt_assume_constant_structure                bool
auto-detect-ckpt-format               checkpoint.auto_detect_ckpt_format                       bool
async-strategy                        checkpoint.async_strategy                                str
use-checkpoint-opt                    checkpoint.use_checkpoint_opt                            bool
use-checkpoint-opt_param-scheduler    checkpoint.use_checkpoint_opt_param_scheduler            bool
finetune                              checkpoint.finetune                                      bool
log-interval                          logger.log_interval                                      int
log-params-norm                       logger.log_params_norm                                   bool
log-num-zeros-in-grad                 logger.log_num_zeros_in_grad                             bool
log-throughput                        logger.log_throughput                                    bool
log-timers-to-tensorboard             logger.log_timers_to_tensorboard                         bool
log-memory-to-tensorboard             logger.log_memory_to_tensorboard                         bool
log-validation-ppl-to-tensorboard     logger.log_validation_ppl_to_tensorboard                 bool
tensorboard-dir                       logger.tensorboard_dir                                   str
timing-log-level                      logger.timing_log_level                                  int
logging-level                         logger.logging_level                                     int
wandb-project                         logger.wandb_project                                     str
wandb-exp-name                        logger.wandb_exp_name                                    str
wandb-entity                          logger.wandb_entity                                      str
wandb-save-dir                        logger.wandb_save_dir                                    str
use-mcore-models                      mlm.use_mcore_models                                     bool
seed                                  rng.seed                                                 int
"""

_TYPES = {"int", "float", "str", "bool", "nobool", "list", "intlist", "any"}


def _load_table() -> dict[str, tuple[tuple[str, ...], str]]:
    table: dict[str, tuple[tuple[str, ...], str]] = {}
    for line in _TABLE.strip().splitlines():
        flag, targets, typ = line.split()
        assert typ in _TYPES, line
        table[flag] = (tuple(targets.split(",")), typ)
    return table


FLAGS = _load_table()


def known_flags() -> list[str]:
    return sorted(FLAGS)


def _is_true(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if v is None:
        return True  # bare flag
    s = str(v).strip().lower()
    if s in ("true", "1", "yes", ""):
        return True
    if s in ("false", "0", "no"):
        return False
    return None


def _convert(flag: str, typ: str, raw: Any) -> Any:
    """Convert one raw flag value (YAML-typed or string) to the field type; one-line error otherwise."""
    if typ in ("bool", "nobool"):
        b = _is_true(raw)
        if b is None:
            raise InputError.bad_value(f"--{flag}", raw, "a store_true flag (no value, or true/false)")
        return b if typ == "bool" else not b
    if raw is None or (isinstance(raw, list) and not raw):
        raise InputError(f"--{flag}: missing value")
    if typ in ("list", "intlist"):
        items = raw if isinstance(raw, list) else _split_list(str(raw))
        if typ == "intlist":
            return [_convert(flag, "int", x) for x in items]
        return [str(x) for x in items]
    if isinstance(raw, list):
        if len(raw) != 1:
            raise InputError.bad_value(f"--{flag}", " ".join(map(str, raw)), "a single value")
        raw = raw[0]
    if typ == "int":
        if isinstance(raw, bool):
            raise InputError.bad_value(f"--{flag}", raw, "an integer")
        try:
            f = float(raw)
        except (TypeError, ValueError):
            raise InputError.bad_value(f"--{flag}", raw, "an integer") from None
        if f != int(f):
            raise InputError.bad_value(f"--{flag}", raw, "an integer")
        return int(f)
    if typ == "float":
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise InputError.bad_value(f"--{flag}", raw, "a number") from None
    if typ == "any":
        return raw
    return str(raw)


def _split_list(s: str) -> list[str]:
    s = s.strip()
    if s.startswith("[") and s.endswith("]"):
        s = s[1:-1]
    return [x.strip().strip("'\"") for x in re.split(r"[,\s]+", s) if x.strip()]


def parse_moe_layer_freq(value: Any, field: str = "--moe-layer-freq") -> int | list[int]:
    """Megatron's ``moe_freq_type``: an int, or a Python list expression such as ``([0]*3+[1]*58)``.

    Evaluated with a restricted arithmetic evaluator (list literals, ``+``, ``*``, ints) — never ``eval``.
    """
    if isinstance(value, bool):
        raise InputError.bad_value(field, value, "an int or a list expression like ([0]*1+[1]*15)")
    if isinstance(value, int):
        return value
    if isinstance(value, list):
        return [int(x) for x in value]
    text = str(value).strip()
    try:
        node = ast.parse(text, mode="eval").body
        res = _eval_list_expr(node)
    except (SyntaxError, ValueError, TypeError):
        raise InputError.bad_value(field, value, "an int or a list expression like ([0]*1+[1]*15)") from None
    if isinstance(res, list):
        return [int(x) for x in res]
    return int(res)


def _eval_list_expr(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        vals = [_eval_list_expr(e) for e in node.elts]
        return vals if isinstance(node, ast.List) else tuple(vals)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        a, b = _eval_list_expr(node.left), _eval_list_expr(node.right)
        if isinstance(a, list) and isinstance(b, int) and isinstance(node.op, ast.Mult) and b < 100000:
            return a * b
        if isinstance(a, int) and isinstance(b, list) and isinstance(node.op, ast.Mult) and a < 100000:
            return b * a
        if isinstance(a, list) and isinstance(b, list) and isinstance(node.op, ast.Add):
            return a + b
        if isinstance(a, int) and isinstance(b, int):
            return a + b if isinstance(node.op, ast.Add) else a * b
    raise ValueError("unsupported expression")


def _tokenize(text: str) -> list[tuple[str, Any]]:
    """Plain argument string -> [(flag, raw)] where raw is None (bare), a str, or a list of strs."""
    text = text.replace("\\\n", " ")
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as e:
        raise InputError(f"megatron arguments: cannot split ({e})") from None
    out: list[tuple[str, Any]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            if i == 0 or tokens[i - 1].endswith((".py", "torchrun", "python", "python3")):
                i += 1  # launcher words (python pretrain_gpt.py ...)
                continue
            raise InputError.bad_value("megatron arguments", tok, "--flag [value ...]")
        flag = tok[2:]
        if "=" in flag:
            flag, val = flag.split("=", 1)
            out.append((flag, val))
            i += 1
            continue
        vals = []
        j = i + 1
        while j < len(tokens) and not (tokens[j].startswith("--") and len(tokens[j]) > 2):
            vals.append(tokens[j])
            j += 1
        out.append((flag, None if not vals else (vals[0] if len(vals) == 1 else vals)))
        i = j
    return out


def _pairs_from_yaml(doc: dict) -> tuple[list[tuple[str, Any]], dict[str, str]]:
    args = doc.get("MODEL_ARGS")
    if not isinstance(args, dict):
        raise InputError("megatron config: expected a MODEL_ARGS mapping of --flag: value")
    pairs: list[tuple[str, Any]] = []
    for k, v in args.items():
        k = str(k)
        if not k.startswith("--"):
            raise InputError.bad_value("MODEL_ARGS key", k, "--flag")
        pairs.append((k[2:], v))
    env = {str(k): str(v) for k, v in (doc.get("ENV_VARS") or {}).items()}
    return pairs, env


def read_megatron_args(path_or_text: str | Path) -> dict:
    """Megatron-LM arguments (file path, argument string, or model_config.yaml) -> nested config dict.

    The result has ``frontend: 'megatron-lm'``; ``env_vars`` holds ``ENV_VARS`` from the YAML form.
    """
    text: str
    src = str(path_or_text)
    looks_like_args = src.lstrip().startswith("--") or "\n" in src or len(src) >= 1024
    p = None if looks_like_args else Path(src)
    if p is not None and p.is_file():
        try:
            text = p.read_text()
        except OSError as e:
            raise InputError(f"{src}: cannot read ({e.strerror})") from None
    elif p is not None and not src.lstrip().startswith("--") and (src.endswith((".yaml", ".yml", ".txt", ".sh"))):
        raise InputError(f"{src}: no such file")
    else:
        text = src
    env: dict[str, str] = {}
    pairs: list[tuple[str, Any]]
    if text.lstrip().startswith("--") or "MODEL_ARGS" not in text:
        pairs = _tokenize(text)
    else:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InputError(f"{src if p else 'megatron config'}: not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(doc, dict):
            raise InputError("megatron config: expected a mapping with MODEL_ARGS")
        pairs, env = _pairs_from_yaml(doc)
    if not pairs:
        raise InputError("megatron arguments: no --flags found")
    return args_to_config(pairs, env)


def args_to_config(pairs: list[tuple[str, Any]], env: dict[str, str] | None = None) -> dict:
    """[(flag-without-dashes, raw value)] -> nested config dict (see module doc)."""
    cfg: dict[str, Any] = {"frontend": "megatron-lm", "env_vars": dict(env or {})}
    seen: dict[str, tuple[str, Any]] = {}  # target path -> (flag, value)
    for flag, raw in pairs:
        if flag not in FLAGS:
            raise InputError(f"unknown Megatron-LM argument --{flag}")
        targets, typ = FLAGS[flag]
        value = _convert(flag, typ, raw)
        if flag == "moe-layer-freq":
            value = parse_moe_layer_freq(value)
        if flag == "moe-aux-loss-coeff":
            items = value if isinstance(value, list) else _split_list(str(value))
            try:
                nums = [float(x) for x in items]
            except ValueError:
                raise InputError.bad_value("--moe-aux-loss-coeff", raw, "a number or list of numbers") from None
            value = nums[0] if len(nums) == 1 else nums
        for path in targets:
            if path in seen and seen[path][1] != value:
                pf, pv = seen[path]
                raise InputError(f"--{flag}={value!r} contradicts --{pf}={pv!r} (both set {path})")
            seen[path] = (flag, value)
            section, field = path.split(".", 1)
            cfg.setdefault(section, {})[field] = value
    _resolve_mlm_specials(cfg)
    return cfg


def _resolve_mlm_specials(cfg: dict) -> None:
    """Flags whose meaning spans several fields (megatron/training/arguments.py ``validate_args`` and
    ``core_transformer_config_from_args``)."""
    mlm = cfg.pop("mlm", {})
    model = cfg.setdefault("model", {})
    if mlm.get("swiglu"):
        model["gated_linear_unit"] = True
        model["activation_func"] = "silu"
    if mlm.get("squared_relu"):
        if mlm.get("swiglu"):
            raise InputError("--squared-relu contradicts --swiglu")
        model["activation_func"] = "squared_relu"
    if mlm.get("recompute_activations"):
        if model.get("recompute_granularity") not in (None, "selective"):
            raise InputError("--recompute-activations contradicts --recompute-granularity "
                             f"{model['recompute_granularity']}")
        model["recompute_granularity"] = "selective"
    if not mlm.get("group_query_attention") and "num_query_groups" in model:
        # MLM ignores --num-query-groups unless --group-query-attention is given (arguments.py)
        model.pop("num_query_groups")
    per_stage = mlm.get("num_layers_per_virtual_pipeline_stage")
    if per_stage is not None:
        if "virtual_pipeline_model_parallel_size" in model:
            raise InputError("--num-layers-per-virtual-pipeline-stage contradicts --num-virtual-stages-per-pipeline-rank")
        nl, pp = model.get("num_layers"), model.get("pipeline_model_parallel_size", 1)
        if not nl or per_stage <= 0 or nl % pp or (nl // pp) % per_stage:
            raise InputError(f"--num-layers-per-virtual-pipeline-stage={per_stage}: must divide num_layers/PP "
                             f"({nl}/{pp})")
        vpp = nl // pp // per_stage
        model["virtual_pipeline_model_parallel_size"] = vpp if vpp > 1 else None
    # MLM validate_args: a single load-balancing type / aux-loss coefficient is passed on as a scalar
    for k in ("moe_router_load_balancing_type", "moe_aux_loss_coeff"):
        if isinstance(model.get(k), list) and len(model[k]) == 1:
            model[k] = model[k][0]
    if model.get("num_moe_experts") == 0:
        model["num_moe_experts"] = None  # MLM maps --num-experts 0 to None (MLM-003)
    if model.get("bf16"):
        model["params_dtype"] = "bfloat16"
        cfg.setdefault("optimizer", {})["params_dtype"] = "bfloat16"
    elif model.get("fp16"):
        model["params_dtype"] = "float16"
        cfg.setdefault("optimizer", {})["params_dtype"] = "float16"
    # --vocab-size stays on the tokenizer: the model vocabulary is the tokenizer's (NullTokenizer adds the eod id),
    # resolved with the tokenizer type by moetune.io.config_to_job.tokenizer_vocab

"""Read Megatron-LM command-line arguments into the effective-config dict (Bridge ``ConfigContainer`` field names).

Accepted forms:

* a plain argument string or file (``--num-layers 16 --hidden-size 1024 --bf16 ...``; shell quoting, ``\\``
  line continuations and ``#`` comments as bash reads them; a launcher prefix ``torchrun ... pretrain_gpt.py`` is
  skipped);
* the functional-test ``model_config.yaml`` form (``MODEL_ARGS: {--flag: value}`` plus ``ENV_VARS``), as in
  ``tests/functional_tests/test_cases/*/*/model_config.yaml`` of NVIDIA/Megatron-LM, turned into arguments the way
  ``tests/functional_tests/shell_test_utils/_run_training.sh`` does (``true`` -> the bare flag, a list -> its items
  as separate values, ``""`` -> dropped; ``false`` -> the flag is not given).

Which flags exist, and how argparse consumes their values (``store_true`` / ``store_false`` / ``--no-`` forms,
``BooleanOptionalAction``, ``nargs``, ``choices``, ``type``), comes from the generated catalog
``moetune/catalog/megatron_flags.json`` (every flag of ``megatron/training/arguments.py`` at a named Megatron-LM
commit, regenerated with ``tools/gen_megatron_flags.py``); ``allow_abbrev=False`` as Megatron's parser.
A flag Megatron does not have is an error naming the closest real one.

Flags that moetune models map to a Bridge field (``model.*``, ``train.*``, ``optimizer.*``, ``ddp.*``, ...) through
``_TABLE`` below; the mapping follows ``megatron/training/arguments.py`` (argparse dests,
``core_transformer_config_from_args``) and Bridge's ``megatron/bridge/training/config.py`` (where each field lives).
Megatron-LM's own defaults that differ from Megatron-Core's (``--expert-tensor-parallel-size`` -> TP,
``gradient_accumulation_fusion`` True, ...) are resolved by the effective-config replay with
``frontend='megatron-lm'``. Every other catalog flag is accepted, its value checked against the catalog, and listed
once in ``cfg['_megatron_ignored']`` (the estimate's assumptions say they were not modelled).

An unknown flag, a repeated flag with a different value, ``--x`` with ``--no-x``, a value of the wrong type or
outside ``choices``, a non-positive size, or top-k above the expert count raises a one-line :class:`InputError`
naming the file, the flag, the value and what was expected. Parsing is linear in the input size.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from moetune.errors import InputError
from moetune.files import load_yaml
from moetune.memo import memo

# flag -> (target paths, type). Types: int, float, str, bool (store_true), nobool (store_false: sets False),
# list (nargs='+', strings), intlist, any (kept as given). A target may list several paths (all set).
_TABLE = """
tensor-model-parallel-size            model.tensor_model_parallel_size                         int
pipeline-model-parallel-size          model.pipeline_model_parallel_size                       int
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
overlap-param-gather-with-optimizer-step optimizer.overlap_param_gather_with_optimizer_step     bool
ddp-average-in-collective             ddp.average_in_collective                                bool
ddp-bucket-size                       ddp.bucket_size                                          int
ddp-num-buckets                       ddp.num_buckets                                          int
no-check-for-nan-in-loss-and-grad     rerun_state_machine.check_for_nan_in_loss,ddp.check_for_nan_in_grad nobool
accumulate-allreduce-grads-in-fp32    ddp.grad_reduce_in_fp32                                  bool
grad-reduce-in-bf16                   mlm.grad_reduce_in_bf16                                  bool
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
moe-expert-rank-capacity-factor       model.moe_expert_rank_capacity_factor                    float
moe-paged-stash                       model.moe_paged_stash                                    bool
moe-mlp-glu-interleave-size           model.moe_mlp_glu_interleave_size                        int
high-priority-a2a-comm-stream         model.high_priority_a2a_comm_stream                      bool
moe-hybridep-num-sms-preprocessing    model.moe_hybridep_num_sms_preprocessing                 int
use-fused-weighted-squared-relu       model.use_fused_weighted_squared_relu                    bool
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
activation-func-clamp-value           model.activation_func_clamp_value                        float
moe-flex-dispatcher-num-sms           model.moe_flex_dispatcher_num_sms                        int
hybrid-layer-pattern                  model.hybrid_layer_pattern                               str
hybrid-override-pattern               model.hybrid_override_pattern                            str
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

# ------------------------------------------------------------------------------------------- what moetune models
#: Config fields the Job builder reads (moetune.io.config_to_job: ``arch_from_model_fields``, ``job_from_config``,
#: ``features_from_effective``, ``tokenizer_vocab``). A flag whose targets include one of them changes the estimate.
_TIME_ONLY = {  # read only by the step-time model (perfmodel compute/comm/schedule/host)
    "cp_comm_type", "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16",
    "grad_reduce_in_fp32", "moe_flex_dispatcher_num_sms", "overlap_grad_reduce", "overlap_p2p_comm",
    "overlap_param_gather", "tp_comm_overlap", "moe_permute_fusion", "moe_router_fusion", "moe_grouped_gemm",
    "moe_shared_expert_overlap", "manual_gc", "moe_flex_dispatcher_backend", "moe_enable_deepep",
    "apply_rope_fusion",
}
_MEMORY_ONLY = {  # read only by the memory model (perfmodel memory/activations/runtime_tail)
    "cross_entropy_fusion_impl", "cross_entropy_loss_fusion", "exp_avg_dtype", "exp_avg_sq_dtype",
    "main_params_dtype", "fine_grained_activation_offloading", "offload_modules", "optimizer_cpu_offload",
    "optimizer_offload_fraction", "transformer_impl", "use_precision_aware_optimizer",
    "num_distributed_optimizer_instances", "hidden_dropout", "attention_dropout", "moe_paged_stash",
}
_BOTH = {
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "activation_func_clamp_value",
    "add_bias_linear", "add_qkv_bias", "attention_backend", "context_parallel_size", "cpu_offloading_num_layers",
    "cuda_graph_impl", "cuda_graph_modules", "cuda_graph_scope", "data_parallel_sharding_strategy",
    "delay_wgrad_compute", "expert_model_parallel_size", "expert_tensor_parallel_size", "ffn_hidden_size",
    "fp16", "bf16", "fp4", "fp8", "fp8_param", "fp8_param_gather", "fp8_recipe", "fp4_param", "fp4_recipe",
    "global_batch_size", "hidden_size", "hybrid_layer_pattern", "hybrid_override_pattern", "kv_channels",
    "kv_lora_rank", "main_grads_dtype", "make_vocab_size_divisible_by", "merge_file", "micro_batch_size",
    "moe_expert_capacity_factor", "moe_expert_rank_capacity_factor", "moe_ffn_hidden_size", "moe_latent_size", "moe_layer_freq",
    "moe_pad_expert_input_to_capacity", "moe_router_force_load_balancing", "moe_router_group_topk",
    "moe_router_num_groups", "moe_router_topk", "moe_shared_expert_intermediate_size", "moe_token_dispatcher_type",
    "mtp_num_layers", "multi_latent_attention", "normalization", "num_attention_heads", "num_layers",
    "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage", "num_moe_experts",
    "num_query_groups", "overlap_moe_expert_parallel_comm", "vocab_size", "pipeline_model_parallel_layout",
    "pipeline_model_parallel_size", "q_lora_rank", "qk_head_dim", "qk_layernorm", "qk_pos_emb_head_dim",
    "rampup_batch_size", "recompute_granularity", "recompute_method", "recompute_modules", "recompute_num_layers",
    "seq_length", "sequence_parallel", "share_embeddings_and_output_weights", "step_batch_size_schedule",
    "tensor_model_parallel_size", "tokenizer_model", "tokenizer_type", "use_distributed_optimizer",
    "use_megatron_fsdp", "v_head_dim", "virtual_pipeline_model_parallel_size", "vocab_file",
    # mlm.* specials resolved into model fields by _resolve_mlm_specials
    "swiglu", "squared_relu", "recompute_activations", "group_query_attention",
    "num_layers_per_virtual_pipeline_stage",
}


def _effect(targets: tuple[str, ...]) -> str:
    fields = {t.split(".", 1)[1] for t in targets}
    if fields & _BOTH or (fields & _TIME_ONLY and fields & _MEMORY_ONLY):
        return "memory+time"
    if fields & _TIME_ONLY:
        return "time"
    if fields & _MEMORY_ONLY:
        return "memory"
    return "none"


#: "--flag" -> "memory" | "time" | "memory+time" for every flag whose value reaches the estimate (others: "none").
#: tools/gen_megatron_flags.py writes this into the catalog's ``models`` column.
MODELED: dict[str, str] = {f"--{f}": e for f, (t, _typ) in FLAGS.items() if (e := _effect(t)) != "none"}

#: table flags whose value is a size that must be >= 1 (MLM-003: --num-experts 0 means dense, so it is >= 0)
_POSITIVE = {
    "tensor-model-parallel-size", "pipeline-model-parallel-size", "num-virtual-stages-per-pipeline-rank",
    "num-layers-per-virtual-pipeline-stage", "context-parallel-size", "expert-model-parallel-size",
    "expert-tensor-parallel-size", "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads",
    "num-query-groups", "kv-channels", "max-position-embeddings", "make-vocab-size-divisible-by", "vocab-size",
    "padded-vocab-size", "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size", "moe-router-topk",
    "moe-router-group-topk", "moe-router-num-groups", "moe-latent-size", "q-lora-rank", "kv-lora-rank",
    "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim", "micro-batch-size", "global-batch-size", "seq-length",
    "num-distributed-optimizer-instances", "microbatch-group-size-per-virtual-pipeline-stage",
}
_NON_NEGATIVE = {"num-experts", "mtp-num-layers", "recompute-num-layers", "cpu-offloading-num-layers",
                 "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers",
                 "num-layers-at-start-in-bf16", "num-layers-at-end-in-bf16"}


def known_flags() -> list[str]:
    """Flags moetune maps to config fields (without dashes)."""
    return sorted(FLAGS)


# ------------------------------------------------------------------------------------------------------ catalog
@memo(maxsize=1)
def catalog() -> dict[str, Any]:
    """The generated Megatron-LM flag catalog (``moetune/catalog/megatron_flags.json``)."""
    text = resources.files("moetune.catalog").joinpath("megatron_flags.json").read_text(encoding="utf-8")
    return json.loads(text)


def catalog_flags() -> dict[str, dict[str, Any]]:
    """"--flag" -> its catalog record (dest, group, action, type, default, nargs, choices, models, ...)."""
    return catalog()["flags"]


def closest_flag(name: str) -> str | None:
    close = difflib.get_close_matches(name, list(catalog_flags()), n=1, cutoff=0.6)
    return close[0] if close else None


def _unknown(option: str) -> InputError:
    near = closest_flag(option)
    src = catalog()["source"]
    hint = f"; closest: {near}" if near else ""
    return InputError(f"{option}: not a Megatron-LM argument ({src['repository']}@{src['commit'][:12]}){hint}",
                      field=option, value=option, expected="a flag of megatron/training/arguments.py")


# ---------------------------------------------------------------------------------------------- value conversion
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
        raise InputError(f"--{flag}: missing value", field=f"--{flag}", expected="a value")
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
        return _to_int(f"--{flag}", raw)
    if typ == "float":
        return _to_float(f"--{flag}", raw)
    if typ == "any":
        return raw
    return str(raw)


def _to_int(field: str, raw: Any) -> int:
    if isinstance(raw, bool):
        raise InputError.bad_value(field, raw, "an integer")
    if isinstance(raw, int):
        return raw
    s = str(raw).strip()
    if re.fullmatch(r"[-+]?\d+", s):
        return int(s)
    try:
        f = float(s)
    except (TypeError, ValueError):
        raise InputError.bad_value(field, raw, "an integer") from None
    if f != f or f in (float("inf"), float("-inf")) or f != int(f):
        raise InputError.bad_value(field, raw, "an integer")
    return int(f)


def _to_float(field: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise InputError.bad_value(field, raw, "a number")
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise InputError.bad_value(field, raw, "a number") from None
    if v != v:
        raise InputError.bad_value(field, raw, "a number (not nan)")
    return v


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
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
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
        if isinstance(a, int) and isinstance(b, int) and abs(a) < 10**9 and abs(b) < 10**9:
            return a + b if isinstance(node.op, ast.Add) else a * b
    raise ValueError("unsupported expression")


# ------------------------------------------------------------------------------------------------ shell words
_WORD_RE = re.compile(r"""
    (?P<ws>[ \t\r\n\f\v]+)
  | (?P<cont>\\\n)
  | (?P<sq>'[^']*')
  | (?P<dq>"(?:[^"\\]|\\.)*")
  | (?P<esc>\\.)
  | (?P<hash>\#)
  | (?P<word>[^ \t\r\n\f\v'"\\\#]+)
  | (?P<bad>['"\\])
""", re.X | re.S)
_DQ_ESC = re.compile(r'\\([$`"\\\n])')


def shell_words(text: str) -> list[str]:
    """Split like bash does (single/double quotes, backslash escapes, ``\\<newline>`` continuations, ``#`` comments
    at the start of a word). One left-to-right regex scan: linear in the text length."""
    plain = text.replace("\\\n", " ")
    if not any(c in plain for c in "'\"\\#"):
        return plain.split()  # no quoting, escapes or comments: whitespace splitting is the whole story
    words: list[str] = []
    parts: list[str] = []
    in_word = False
    pos, n = 0, len(text)
    while pos < n:
        m = _WORD_RE.match(text, pos)
        assert m is not None  # every character matches one alternative
        kind = m.lastgroup
        pos = m.end()
        if kind == "ws" or kind == "cont":
            if in_word:
                words.append("".join(parts))
                parts, in_word = [], False
        elif kind == "hash":
            if in_word:
                parts.append("#")
            else:  # comment to end of line
                nl = text.find("\n", pos)
                pos = n if nl < 0 else nl
        elif kind == "sq":
            parts.append(m.group()[1:-1])
            in_word = True
        elif kind == "dq":
            parts.append(_DQ_ESC.sub(lambda e: "" if e.group(1) == "\n" else e.group(1), m.group()[1:-1]))
            in_word = True
        elif kind == "esc":
            parts.append(m.group()[1])
            in_word = True
        elif kind == "word":
            parts.append(m.group())
            in_word = True
        else:
            line = text.count("\n", 0, m.start()) + 1
            what = "a quote" if m.group() in "'\"" else "a backslash"
            raise InputError(f"line {line}: unterminated {m.group()!r} ({what} without its end)",
                             field="quoting", value=m.group(), expected="balanced shell quotes")
    if in_word:
        words.append("".join(parts))
    return words


# -------------------------------------------------------------------------------------------- argparse replay
_NEG_NUMBER = re.compile(r"^-(\d+|\d*\.\d+)([eE][-+]?\d+)?$")
_LAUNCHERS = ("torchrun", "python", "python3", "deepspeed", "srun", "mpirun")


def _looks_like_option(tok: str) -> bool:
    return tok.startswith("-") and len(tok) > 1 and not _NEG_NUMBER.match(tok)


def _strip_launcher(tokens: list[str]) -> list[str]:
    """Drop ``[ENV=v ...] torchrun [launcher options] script.py`` before the first Megatron flag."""
    if not tokens or tokens[0].startswith("--"):
        return tokens
    for i, tok in enumerate(tokens):  # the first word is not a flag: a launcher line up to the script
        if tok.endswith(".py"):
            return tokens[i + 1:]
    i = 0
    while i < len(tokens) and not tokens[i].startswith("-") and (
            "=" in tokens[i] or tokens[i].rsplit("/", 1)[-1] in _LAUNCHERS):
        i += 1
    return tokens[i:]


def _nargs_of(rec: dict[str, Any]) -> Any:
    action = rec.get("action", "store")
    if action in ("store_true", "store_false", "store_const", "append_const", "count", "help", "version"):
        return 0
    if action == "BooleanOptionalAction":
        return 0
    return rec.get("nargs")


def _consume(tokens: list[str]) -> list[tuple[str, list[str] | None]]:
    """Argument tokens -> [(option, values)] as argparse (``allow_abbrev=False``) groups them; values is None for
    a bare flag. Unknown options and stray values are errors."""
    flags = catalog_flags()
    out: list[tuple[str, list[str] | None]] = []
    i, n = 0, len(tokens)
    while i < n:
        tok = tokens[i]
        if not _looks_like_option(tok):
            raise InputError(f"{tok!r}: unexpected value (no flag takes it; Megatron-LM would stop with "
                             "'unrecognized arguments')", field="arguments", value=tok, expected="--flag [value ...]")
        if tok == "--":
            raise InputError("'--' ends the options: Megatron-LM takes no positional arguments", field="arguments",
                             value=tok, expected="--flag [value ...]")
        option, explicit = (tok.split("=", 1) + [None])[:2] if "=" in tok else (tok, None)
        rec = flags.get(option)
        if rec is None:
            raise _unknown(option)
        nargs = _nargs_of(rec)
        i += 1
        if nargs == 0:
            if explicit is not None:
                raise InputError.bad_value(option, explicit, f"no value ({rec.get('action')} flag)")
            out.append((option, None))
            continue
        if explicit is not None:
            vals = [explicit]
            if isinstance(nargs, int) and nargs > 1:
                raise InputError.bad_value(option, explicit, f"{nargs} values after the flag, not '='")
            out.append((option, vals))
            continue
        j = i
        while j < n and not _looks_like_option(tokens[j]):
            j += 1
        avail = tokens[i:j]
        if nargs is None or nargs == 1:
            if not avail:
                raise InputError(f"{option}: missing value (expected one argument)", field=option,
                                 expected="one value")
            take = 1
        elif nargs == "?":
            take = min(1, len(avail))
        elif nargs == "*":
            take = len(avail)
        elif nargs == "+":
            if not avail:
                raise InputError(f"{option}: missing value (expected at least one argument)", field=option,
                                 expected="one or more values")
            take = len(avail)
        elif isinstance(nargs, int):
            if len(avail) < nargs:
                raise InputError.bad_value(option, " ".join(avail), f"{nargs} values")
            take = nargs
        else:
            take = len(avail)
        out.append((option, avail[:take]))
        i += take
    return out


def _check_catalog_value(option: str, rec: dict[str, Any], values: list[str] | None) -> Any:
    """Validate a value against the catalog's type / choices (as argparse would) and return it converted."""
    if values is None:
        action = rec.get("action")
        if action == "BooleanOptionalAction":
            return bool(rec.get("stores", True))
        if action == "store_true":
            return True
        if action == "store_false":
            return False
        return rec.get("const", True)
    typ = rec.get("type")
    conv: list[Any] = []
    for v in values:
        if typ == "int":
            conv.append(_to_int(option, v))
        elif typ == "float":
            conv.append(_to_float(option, v))
        else:
            conv.append(v)
    choices = rec.get("choices")
    if isinstance(choices, list) and choices:
        for v in conv:
            if v not in choices and str(v) not in [str(c) for c in choices]:
                raise InputError.bad_value(option, v, "one of " + ", ".join(map(str, choices)))
    nargs = rec.get("nargs")
    return conv if nargs not in (None, "?") else conv[0]


# --------------------------------------------------------------------------------------------------- entry point
def _yaml_tokens(args: dict, where: str) -> list[tuple[str, list[str] | None]]:
    """A MODEL_ARGS mapping -> [(option, values)] as ``_run_training.sh`` builds the command line."""
    flags = catalog_flags()
    out: list[tuple[str, list[str] | None]] = []
    for k, v in args.items():
        k = str(k)
        if not k.startswith("--"):
            raise InputError.bad_value(f"{where} key", k, "--flag")
        option, explicit = (k.split("=", 1) + [None])[:2] if "=" in k else (k, None)
        rec = flags.get(option)
        if rec is None:
            raise _unknown(option)
        if explicit is not None:
            raise InputError.bad_value(f"{where} key", k, "--flag (the value goes after the colon)")
        nargs = _nargs_of(rec)
        if v is True or v is None:
            vals = None
        elif v is False:
            continue  # a false boolean: the flag is not given
        elif isinstance(v, list):
            vals = [_yaml_scalar(x) for x in v]
        elif isinstance(v, dict):
            raise InputError.bad_value(option, v, "a scalar or a list")
        else:
            s = _yaml_scalar(v)
            if s == "":
                continue  # yq drops empty values
            st = s.strip()
            if st.lower() == "true":
                vals = None
            elif re.fullmatch(r"\[[^\]]+\]", st):  # _run_training.sh strips the brackets, the shell splits
                vals = shell_words(st[1:-1])
            else:  # "(...)", or a value with spaces / | ( ): passed quoted, as one word
                vals = [st]
        if nargs == 0 and vals is not None:
            if len(vals) == 1 and vals[0].lower() in ("true", "false"):
                if vals[0].lower() == "false":
                    continue
                vals = None
            else:
                raise InputError.bad_value(option, v, f"true or nothing ({rec.get('action')} flag)")
        if nargs != 0 and vals is None:
            raise InputError(f"{option}: missing value", field=option, expected="a value")
        out.append((option, vals))
    return out


def _yaml_scalar(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    return str(x)


def _read_source(path_or_text: str | Path) -> tuple[str, str]:
    """(text, name for messages). A path must be a readable UTF-8 text file."""
    src = str(path_or_text)
    looks_like_args = isinstance(path_or_text, str) and (
        src.lstrip().startswith("--") or "\n" in src or len(src) >= 1024 or not src.strip())
    if looks_like_args:
        return src, "megatron arguments"
    p = Path(src)
    if p.is_dir():
        raise InputError(f"{src}: is a directory (expected a Megatron-LM argument file or model_config.yaml)",
                         field="--megatron-args", value=src, expected="a file")
    if not p.is_file():
        if isinstance(path_or_text, str) and any(c.isspace() for c in src.strip()):
            return src, "megatron arguments"  # an argument string (words), not a path
        raise InputError(f"{src}: no such file", field="--megatron-args", value=src, expected="a file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputError(f"{src}: cannot read ({e.strerror})", field="--megatron-args", value=src) from None
    if b"\x00" in data:
        raise InputError(f"{src}: binary file (NUL byte at offset {data.index(0)}); expected Megatron-LM arguments "
                         "as text", field="--megatron-args", value=src, expected="a text file")
    try:
        return data.decode("utf-8"), src
    except UnicodeDecodeError as e:
        raise InputError(f"{src}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})",
                         field="--megatron-args", value=src, expected="UTF-8 text") from None


def read_megatron_args(path_or_text: str | Path) -> dict:
    """Megatron-LM arguments (file path, argument string, or model_config.yaml) -> nested config dict.

    The result has ``frontend: 'megatron-lm'``; ``env_vars`` holds ``ENV_VARS`` from the YAML form;
    ``_megatron_ignored`` lists the given flags that do not change the estimate (each once).
    """
    text, name = _read_source(path_or_text)
    try:
        return _parse(text, name)
    except InputError as e:
        msg = str(e)
        if name != "megatron arguments" and not msg.startswith(name):
            raise InputError(f"{name}: {msg}", field=e.field, value=e.value, expected=e.expected) from None
        raise


def _parse(text: str, name: str) -> dict:
    env: dict[str, str] = {}
    stripped = text.lstrip()
    if stripped.startswith("--") or not re.search(r"^\s*MODEL_ARGS\s*:", text, re.M):
        pairs = _consume(_strip_launcher(shell_words(text)))
    else:
        try:
            doc = load_yaml(text)
        except yaml.YAMLError as e:
            raise InputError(f"not valid YAML ({' '.join(str(e).split())[:200]})", field="yaml",
                             expected="a model_config.yaml mapping") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("MODEL_ARGS"), dict):
            raise InputError("expected a MODEL_ARGS mapping of --flag: value", field="MODEL_ARGS",
                             expected="a mapping")
        pairs = _yaml_tokens(doc["MODEL_ARGS"], "MODEL_ARGS")
        envs = doc.get("ENV_VARS") or {}
        if not isinstance(envs, dict):
            raise InputError.bad_value("ENV_VARS", envs, "a mapping of NAME: value")
        env = {str(k): _yaml_scalar(v) for k, v in envs.items()}
    if not pairs:
        raise InputError("no --flags found", field="arguments", expected="--flag [value ...]")
    return args_to_config(pairs, env)


def args_to_config(pairs: list[tuple[str, Any]], env: dict[str, str] | None = None) -> dict:
    """[(flag, values)] -> nested config dict (see module doc). ``flag`` may be given with or without ``--``;
    values is None (bare flag), a string, or a list of strings."""
    flags = catalog_flags()
    cfg: dict[str, Any] = {"frontend": "megatron-lm", "env_vars": dict(env or {})}
    seen: dict[str, tuple[str, Any]] = {}  # target path -> (flag, value)
    ignored: dict[str, None] = {}
    for option, raw in pairs:
        option = option if option.startswith("--") else f"--{option}"
        rec = flags.get(option)
        if rec is None:
            raise _unknown(option)
        flag = option[2:]
        if isinstance(raw, list) and len(raw) == 1 and _nargs_of(rec) in (None, "?", 1):
            raw = raw[0]
        if flag not in FLAGS:
            _check_catalog_value(option, rec, raw if raw is None or isinstance(raw, list) else [raw])
            ignored[option] = None
            continue
        if rec.get("choices") and raw is not None:
            _check_catalog_value(option, rec, raw if isinstance(raw, list) else [raw])
        targets, typ = FLAGS[flag]
        value = _convert(flag, typ, raw)
        if flag == "moe-layer-freq":
            value = parse_moe_layer_freq(value)
        if flag == "moe-aux-loss-coeff":
            items = value if isinstance(value, list) else _split_list(str(value))
            nums = [_to_float(option, x) for x in items]
            value = nums[0] if len(nums) == 1 else nums
        if flag in _POSITIVE and isinstance(value, int) and value < 1:
            raise InputError.bad_value(option, value, "a positive integer")
        if flag in _NON_NEGATIVE and isinstance(value, int) and value < 0:
            raise InputError.bad_value(option, value, "an integer >= 0")
        if typ == "intlist" and any(v < 1 for v in value):
            raise InputError.bad_value(option, value, "positive integers")
        if option not in MODELED:
            ignored[option] = None
        for path in targets:
            if path in seen and seen[path][1] != value:
                pf, pv = seen[path]
                raise InputError(f"--{flag}={value!r} contradicts --{pf}={pv!r} (both set {path})",
                                 field=option, value=value, expected=f"one value for {path}")
            seen[path] = (flag, value)
            section, field = path.split(".", 1)
            cfg.setdefault(section, {})[field] = value
    _resolve_mlm_specials(cfg)
    _check_meaning(cfg)
    cfg["_megatron_ignored"] = list(ignored)
    return cfg


def _check_meaning(cfg: dict) -> None:
    """Values each fine alone but impossible together (Megatron's validate_args / TransformerConfig asserts)."""
    m = cfg.get("model", {})
    e, k = m.get("num_moe_experts"), m.get("moe_router_topk")
    if e and k and k > e:
        raise InputError(f"--moe-router-topk={k}: expected at most --num-experts={e} (top-k experts per token)",
                         field="--moe-router-topk", value=k, expected=f"<= {e}")
    g, ng = m.get("moe_router_group_topk"), m.get("moe_router_num_groups")
    if g and ng and g > ng:
        raise InputError(f"--moe-router-group-topk={g}: expected at most --moe-router-num-groups={ng}",
                         field="--moe-router-group-topk", value=g, expected=f"<= {ng}")
    if e and ng and e % ng:
        raise InputError(f"--moe-router-num-groups={ng}: expected a divisor of --num-experts={e}",
                         field="--moe-router-num-groups", value=ng, expected=f"a divisor of {e}")
    h, a = m.get("hidden_size"), m.get("num_attention_heads")
    if h and a and not m.get("kv_channels") and h % a:
        raise InputError(f"--hidden-size={h}: expected a multiple of --num-attention-heads={a} (or give "
                         "--kv-channels)", field="--hidden-size", value=h, expected=f"a multiple of {a}")
    q = m.get("num_query_groups")
    if a and q and a % q:
        raise InputError(f"--num-query-groups={q}: expected a divisor of --num-attention-heads={a}",
                         field="--num-query-groups", value=q, expected=f"a divisor of {a}")
    for key, flag in (("attention_dropout", "--attention-dropout"), ("hidden_dropout", "--hidden-dropout")):
        v = m.get(key)
        if v is not None and not 0.0 <= v < 1.0:
            raise InputError.bad_value(flag, v, "a probability in [0, 1)")


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
            raise InputError("--squared-relu contradicts --swiglu", field="--squared-relu")
        model["activation_func"] = "squared_relu"
    if mlm.get("recompute_activations"):
        if model.get("recompute_granularity") not in (None, "selective"):
            raise InputError("--recompute-activations contradicts --recompute-granularity "
                             f"{model['recompute_granularity']}", field="--recompute-activations")
        model["recompute_granularity"] = "selective"
    if not mlm.get("group_query_attention") and "num_query_groups" in model:
        # MLM ignores --num-query-groups unless --group-query-attention is given (arguments.py)
        model.pop("num_query_groups")
    given = [f for f, k in (("--num-layers-per-virtual-pipeline-stage", "num_layers_per_virtual_pipeline_stage"),)
             if mlm.get(k) is not None]
    if model.get("virtual_pipeline_model_parallel_size") is not None:
        given.append("--num-virtual-stages-per-pipeline-rank")
    if model.get("pipeline_model_parallel_layout") is not None:
        given.append("--pipeline-model-parallel-layout")
    if len(given) > 1:  # validate_args: "No more than one of the following arguments can be set at the same time"
        raise InputError(f"{given[0]} contradicts {given[1]} (Megatron-LM accepts at most one of "
                         "--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank, "
                         "--pipeline-model-parallel-layout)", field=given[1])
    per_stage = mlm.get("num_layers_per_virtual_pipeline_stage")
    if per_stage is not None:
        # validate_args: layers (+1 per account_for_* flag) / PP must be a multiple of the per-stage count
        if model.get("num_layers_in_first_pipeline_stage") is not None or \
                model.get("num_layers_in_last_pipeline_stage") is not None:
            raise InputError("--num-layers-per-virtual-pipeline-stage contradicts --decoder-first/last-pipeline-"
                             "num-layers (use --num-virtual-stages-per-pipeline-rank for uneven pipelines)",
                             field="--num-layers-per-virtual-pipeline-stage")
        nl, pp = model.get("num_layers"), model.get("pipeline_model_parallel_size", 1)
        nl_eff = (nl or 0) + int(bool(model.get("account_for_embedding_in_pipeline_split"))) + \
            int(bool(model.get("account_for_loss_in_pipeline_split")))
        if not nl or nl_eff % pp or (nl_eff // pp) % per_stage:
            raise InputError(f"--num-layers-per-virtual-pipeline-stage={per_stage}: must divide num_layers/PP "
                             f"({nl_eff}/{pp})", field="--num-layers-per-virtual-pipeline-stage", value=per_stage)
        vpp = nl_eff // pp // per_stage
        model["virtual_pipeline_model_parallel_size"] = vpp if vpp > 1 else None
    elif model.get("virtual_pipeline_model_parallel_size") == 1:
        model["virtual_pipeline_model_parallel_size"] = None
    if (model.get("cpu_offloading_num_layers") or 0) > 0:
        model["cpu_offloading"] = True  # validate_args: cpu_offloading_num_layers > 0 turns it on
    # MLM validate_args: a single load-balancing type / aux-loss coefficient is passed on as a scalar
    for k in ("moe_router_load_balancing_type", "moe_aux_loss_coeff"):
        if isinstance(model.get(k), list) and len(model[k]) == 1:
            model[k] = model[k][0]
    if model.get("num_moe_experts") == 0:
        model["num_moe_experts"] = None  # MLM maps --num-experts 0 to None (MLM-003)
    if model.get("bf16"):
        model["params_dtype"] = "bfloat16"
        cfg.setdefault("optimizer", {})["params_dtype"] = "bfloat16"
        # validate_args: BF16 accumulates and all-reduces gradients in FP32 (FP32 DDP grad buffers) unless
        # --grad-reduce-in-bf16 or a BF16 --main-grads-dtype
        main_grads = str(cfg["optimizer"].get("main_grads_dtype") or "fp32").lower()
        if mlm.get("grad_reduce_in_bf16"):
            cfg.setdefault("ddp", {})["grad_reduce_in_fp32"] = False
        elif main_grads in ("fp32", "float32"):
            cfg.setdefault("ddp", {})["grad_reduce_in_fp32"] = True
    elif model.get("fp16"):
        model["params_dtype"] = "float16"
        cfg.setdefault("optimizer", {})["params_dtype"] = "float16"
    # --vocab-size stays on the tokenizer: the model vocabulary is the tokenizer's (NullTokenizer adds the eod id),
    # resolved with the tokenizer type by moetune.io.config_to_job.tokenizer_vocab

"""Megatron-Bridge's theoretical memory estimator — for comparison only, never used by moetune's own estimate.

Re-implemented from docs/bridge_perf_notes.md §4 (Bridge ``src/megatron/bridge/training/utils/
theoretical_memory_utils.py``, adapted from ISEEKYAN's mbridge memory_estimator): parameters counted with the plain
GQA attention formula (MLA low-rank projections not modelled), 18 B/param without the distributed optimizer or
6 + 12/S with it (dense S = DP·CP, experts S = max(1, DP·TP·CP/(EP·ETP))), Korthikanti activations
s·b·h·(18 + 4·f_avg/h) per layer with the interleaving / microbatch factor, the output layer + CE at PP = 1, all
divided by TP·CP. It reports the most-loaded GPU and ignores fragmentation, workspaces, CUDA graphs, NCCL, DeepEP,
offloading, full recompute and routing imbalance.
"""

from __future__ import annotations

from dataclasses import dataclass

from moetune.spec.job import Job

GIB = float(1 << 30)


@dataclass(slots=True)
class BridgeEstimate:
    weight_and_optimizer_gib: float
    activation_gib: float
    total_gib: float


def bridge_theoretical_memory(job: Job) -> BridgeEstimate:
    """Bridge's estimate of the most-loaded GPU (bridge_perf_notes.md §4)."""
    m, lay = job.model, job.layout
    h = m.hidden_size
    n = m.num_attention_heads
    g = m.query_groups
    q = m.head_dim * n
    phi = 3 if (m.gated_linear_unit and m.activation in ("swiglu", "swiglu_clamped")) else 2
    v = m.padded_vocab_size(lay.tp)
    mtp = m.mtp_num_layers
    pattern = m.mlp_pattern + (m.mlp_pattern[-1] * mtp)
    n_moe = pattern.count("E")
    n_dense = len(pattern) - n_moe
    attn = 2 * h * h * (1 + g / n) * (q / h)
    ln = 4 * h
    f_sh = m.moe_shared_expert_intermediate_size or 0
    f_moe = m.moe_ffn_hidden_size or 0
    e = m.num_moe_experts or 0
    dense_layer = attn + ln + phi * h * m.ffn_hidden_size
    moe_layer_dense = attn + ln + phi * h * f_sh
    routed_layer = phi * h * f_moe * e
    p_dense = n_dense * dense_layer + n_moe * moe_layer_dense + 2 * h
    p_routed = n_moe * routed_layer
    dense_per_gpu = p_dense / (lay.pp * lay.tp) + h * v / lay.tp
    if m.untie_embeddings_and_output_weights and lay.pp == 1:
        dense_per_gpu += h * v / lay.tp
    routed_per_gpu = p_routed / (lay.pp * lay.ep * lay.expert_tp)
    dp = lay.dp(job.gpus)
    if job.features.use_distributed_optimizer:
        s_dense = dp * lay.cp
        s_exp = max(1.0, dp * lay.tp * lay.cp / (lay.ep * lay.expert_tp))
        w_opt = dense_per_gpu * (6 + 12 / s_dense) + routed_per_gpu * (6 + 12 / s_exp)
    else:
        w_opt = (dense_per_gpu + routed_per_gpu) * 18
    s, b = job.seq_length, job.micro_batch_size
    layers = m.num_layers + mtp
    f_avg = (n_dense * m.ffn_hidden_size + n_moe * (f_moe * m.moe_router_topk + f_sh)) / layers
    act = s * b * h * (18 + 4 * f_avg / h) * layers
    act += 8 * s * b * lay.pp + s * b * h * lay.pp
    vpp = lay.vpp_size
    if vpp > 1:
        act *= 1 + (lay.pp - 1) / (lay.pp * vpp)
    elif lay.pp > 1:
        act *= min(1.0, job.num_microbatches / lay.pp)
    if lay.pp == 1:
        act += 4 * s * b * h * (1 + v / h)
    act /= lay.tp * lay.cp
    return BridgeEstimate(w_opt / GIB, act / GIB, (w_opt + act) / GIB)

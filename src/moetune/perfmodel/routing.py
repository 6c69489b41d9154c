"""Expert token load: tokens on the hottest expert rank relative to the mean, one formula for memory and time.

Megatron-Core ``MoEAlltoAllTokenDispatcher.preprocess`` (megatron/core/transformer/moe/token_dispatcher.py): with
``moe_pad_expert_input_to_capacity`` ("drop and pad") every local expert is given exactly ``capacity`` tokens per
source rank, ``num_tokens_per_local_expert = full(capacity * tp_size * ep_size)``, where
``capacity = get_capacity(tokens * topk, num_experts, capacity_factor) = ceil(tokens * topk / num_experts *
capacity_factor)`` (moe_utils.py). The padded buffers are capacity_factor x the mean load whatever the routing, so
force-balanced routing (``moe_router_force_load_balancing``, which only makes the unpadded load the mean) does not
shrink them. Without padding, a capacity factor drops the tokens above capacity: the load is the routing imbalance
capped at the factor (1 under force-balancing); dropless runs carry the full imbalance (docs/domain.md §3.2-3.3).

A rank capacity factor (``moe_expert_rank_capacity_factor``, HybridEP) does not change the work: the budget is
``num_permuted_tokens = local tokens x topk x factor`` rounded up to the quantisation alignment
(``_HybridEPManager.setup_metadata``), tokens above it are dropped and the step is rerun dropless
(``PagedStashRunner.prepare_for_rerun`` in moe/paged_stash.py), and the TE op-fuser grouped GEMM takes the per-expert
counts as a device tensor (moe/experts.py ``_fused_forward``). It sets the buffers: the dispatched tokens and the
expert MLP's tensors have ``budget`` rows (:func:`expert_buffer_load`), and dispatch needs no host sync
(:func:`static_expert_shapes`).
"""

from __future__ import annotations

from moetune.catalog.memory_constants import const
from moetune.spec.features import Features


def expert_load(f: Features) -> float:
    """ρ = hottest expert rank's token load / mean load (>= 1), see the module doc."""
    c = f.moe_expert_capacity_factor
    if c is not None and f.moe_pad_expert_input_to_capacity:
        return float(c)
    if f.moe_router_force_load_balancing:
        return 1.0
    load = float(f.moe_routing_imbalance)
    if c is not None:
        load = min(load, float(c))
    return load


def rank_capacity_active(f: Features) -> bool:
    """A rank capacity factor that Megatron-Core applies: set, with the flex dispatcher's HybridEP backend
    (``TransformerConfig.__post_init__`` rejects it with any other backend; NCCL-EP is not modelled)."""
    return (f.moe_expert_rank_capacity_factor is not None and f.moe_token_dispatcher_type == "flex"
            and f.moe_flex_dispatcher_backend == "hybridep")


def static_expert_shapes(f: Features) -> bool:
    """True when the expert token counts need not reach the host: a capacity factor (the capacity is computed on the
    CPU, ``MoEAlltoAllTokenDispatcher.preprocess``) or an active rank capacity factor (HybridEP's
    ``num_permuted_tokens`` is the static budget, so ``dispatch`` skips its ``tokens_per_expert.sum()`` sync)."""
    return f.moe_expert_capacity_factor is not None or rank_capacity_active(f)


def expert_buffer_load(f: Features) -> float:
    """Rows of the per-layer expert buffers and saved expert tensors over the mean routed tokens of a rank.

    Dynamic shapes: the token load :func:`expert_load`. A rank capacity factor sizes them statically at the budget,
    ``factor`` x the mean (module doc), whatever the routing; with ``moe_paged_stash`` the saved expert tensors are
    copied into a stash pool of ``moe_paged_stash_buffer_size_factor_cuda`` x the mean tokens (Megatron-Core
    moe/paged_stash.py ``allocate_stash_buffers``, catalog memory.yaml), which then sets them. The memory reads the
    factor whatever the dispatcher (the jobs of one layout's dispatcher variants share their reserved memory,
    ``memory.reserved_features``; with another backend the factor is an error, rule MOE-044)."""
    if f.moe_expert_rank_capacity_factor is None:
        return expert_load(f)
    if f.moe_paged_stash:
        return float(const("moe_paged_stash_buffer_size_factor_cuda"))
    return float(f.moe_expert_rank_capacity_factor)

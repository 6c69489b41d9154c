"""Expert token load: tokens on the hottest expert rank relative to the mean, one formula for memory and time.

Megatron-Core ``MoEAlltoAllTokenDispatcher.preprocess`` (megatron/core/transformer/moe/token_dispatcher.py): with
``moe_pad_expert_input_to_capacity`` ("drop and pad") every local expert is given exactly ``capacity`` tokens per
source rank, ``num_tokens_per_local_expert = full(capacity * tp_size * ep_size)``, where
``capacity = get_capacity(tokens * topk, num_experts, capacity_factor) = ceil(tokens * topk / num_experts *
capacity_factor)`` (moe_utils.py). The padded buffers are capacity_factor x the mean load whatever the routing, so
force-balanced routing (``moe_router_force_load_balancing``, which only makes the unpadded load the mean) does not
shrink them. Without padding, a capacity factor drops the tokens above capacity: the load is the routing imbalance
capped at the factor (1 under force-balancing); dropless runs carry the full imbalance (docs/domain.md §3.2-3.3).
"""

from __future__ import annotations

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

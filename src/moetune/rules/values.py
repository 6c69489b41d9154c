"""(k) Impossible values (VAL-*): sizes and counts that no Megatron-Core / Bridge job can have.

Megatron reads these fields as counts (``ModelParallelConfig`` parallel sizes, ``TransformerConfig`` widths and
layer counts, Bridge ``TrainingConfig`` batch sizes) and divides by them in ``parallel_state.initialize_model_parallel``,
``TransformerConfig.__post_init__`` and the microbatch calculator; a zero or negative value either fails there or,
worse, gives a silently wrong job (``micro_batch_size: 0``). moetune reports each as an error finding naming the field
and its value, before any other rule's arithmetic on it.
"""

from __future__ import annotations

import math
from typing import Any

from moetune.rules.common import E
from moetune.rules.engine import Ctx, rule

A = "values"

_NO_FIX = object()
#: ints below this magnitude convert to float exactly (53-bit significand)
_EXACT = 2**53

#: (rule id, field path, smallest legal value, fix). Architecture and batch fields have no fix: only the user knows
#: the intended value; layout and feature counts fall back to Megatron's default.
_FIELDS: tuple[tuple[str, str, int, Any], ...] = (
    ("VAL-001", "model.tensor_model_parallel_size", 1, 1),
    ("VAL-002", "model.pipeline_model_parallel_size", 1, 1),
    ("VAL-003", "model.context_parallel_size", 1, 1),
    ("VAL-004", "model.expert_model_parallel_size", 1, 1),
    ("VAL-005", "model.expert_tensor_parallel_size", 1, 1),
    ("VAL-006", "model.virtual_pipeline_model_parallel_size", 1, None),
    ("VAL-007", "model.num_layers", 1, _NO_FIX),
    ("VAL-008", "model.hidden_size", 1, _NO_FIX),
    ("VAL-009", "model.ffn_hidden_size", 0, _NO_FIX),
    ("VAL-010", "model.num_attention_heads", 1, _NO_FIX),
    ("VAL-011", "model.num_query_groups", 1, _NO_FIX),
    ("VAL-012", "model.kv_channels", 1, _NO_FIX),
    ("VAL-013", "model.seq_length", 1, _NO_FIX),
    ("VAL-014", "model.num_moe_experts", 1, _NO_FIX),
    ("VAL-015", "model.moe_router_topk", 1, _NO_FIX),
    ("VAL-016", "model.moe_ffn_hidden_size", 1, _NO_FIX),
    ("VAL-017", "model.vocab_size", 1, _NO_FIX),
    ("VAL-018", "model.make_vocab_size_divisible_by", 1, 128),
    ("VAL-019", "model.mtp_num_layers", 0, None),
    ("VAL-020", "model.moe_shared_expert_intermediate_size", 0, None),
    ("VAL-021", "model.recompute_num_layers", 1, 1),
    ("VAL-022", "model.cpu_offloading_num_layers", 0, 0),
    ("VAL-023", "train.micro_batch_size", 1, 1),
    ("VAL-024", "train.global_batch_size", 1, _NO_FIX),
    ("VAL-025", "ddp.num_distributed_optimizer_instances", 1, 1),
    ("VAL-026", "dataset.sequence_length", 1, _NO_FIX),
    ("VAL-027", "train.train_iters", 0, _NO_FIX),
)

#: VAL rules without a fix (the test of every error rule's fix skips these, by name)
NO_FIX_RULES = frozenset(i for i, _, _, f in _FIELDS if f is _NO_FIX)


def _number(v: Any) -> float | None:
    """The numeric value of a config entry (ints, floats, digit strings); None when unset or not a number."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def _impossible(path: str, lo: int):
    def when(c: Ctx) -> bool:
        v = c.get(path)
        if v is None:
            return False
        if type(v) is int and -_EXACT < v < _EXACT:  # the usual case: float(v) is exact, finite and integral
            return v < lo
        x = _number(v)
        return x is not None and (not math.isfinite(x) or x < lo or not x.is_integer())

    return when


for _id, _path, _lo, _fix in _FIELDS:
    _name = _path.split(".", 1)[1]
    rule(_id, A, E, "C", [_path], _impossible(_path, _lo),
         f"{_name} must be {'a positive' if _lo >= 1 else 'a non-negative'} integer",
         "MCore model_parallel_config.py / transformer_config.py (counts); parallel_state.initialize_model_parallel",
         fix=None if _fix is _NO_FIX else {_path: _fix}, frontends=("bridge", "megatron-lm"))


def first_impossible(cfg: dict) -> str | None:
    """``"<field>=<value>: expected a positive integer (VAL-00N)"`` for the first impossible value of a config
    (the nested dict of a Bridge YAML or Megatron-LM arguments), or None. Used at the entrances that build a job
    (``estimate --bridge-config / --megatron-args``), where an impossible value must stop the command instead of
    being replaced by a default; ``check`` reports the same rules as findings."""
    from moetune.overrides import get_path

    for rid, path, lo, _ in _FIELDS:
        x = _number(get_path(cfg, path))
        if x is not None and (not math.isfinite(x) or x < lo or not x.is_integer()):
            what = "a positive integer" if lo >= 1 else "a non-negative integer"
            return f"{path}={get_path(cfg, path)!r}: expected {what} ({rid})"
    return None

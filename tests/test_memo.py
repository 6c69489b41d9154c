"""The one memo mechanism: bounded tables keyed on arguments, one clear(), stats; and the step / memory models give
the same answers from cold and warm tables."""

from __future__ import annotations

import pytest

import moetune.memo as memo
from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.perfmodel.memory import estimate_memory, routing_factor
from moetune.perfmodel.routing import expert_load
from moetune.perfmodel.step import estimate_time
from moetune.spec.features import Features
from moetune.spec.job import Job
from moetune.spec.layout import Layout


def test_table_is_bounded_keyed_on_arguments_and_cleared_by_one_call():
    calls = []

    @memo.memo(maxsize=2)
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    assert [square(2), square(2), square(3)] == [4, 4, 9] and calls == [2, 3]
    square(4)  # evicts 2, the least recently used
    square(2)
    assert calls == [2, 3, 4, 2]
    st = memo.stats()[f"{__name__}.test_table_is_bounded_keyed_on_arguments_and_cleared_by_one_call.<locals>.square"]
    assert (st.hits, st.misses, st.size, st.maxsize) == (1, 4, 2, 2)
    memo.clear()
    square(2)
    assert calls == [2, 3, 4, 2, 2]
    with pytest.raises(ValueError):
        memo.memo(maxsize=0)


def test_frozen_map_is_hashable_and_read_only():
    a, b = memo.FrozenMap({"x": 1, "y": 2}), memo.FrozenMap({"y": 2, "x": 1})
    assert a == b and hash(a) == hash(b) and a["x"] == 1
    with pytest.raises(TypeError):
        a["z"] = 3
    with pytest.raises(TypeError):
        a.update(z=3)


def _job(**feat) -> Job:
    return Job(model=get_model("Qwen3-30B-A3B"), system=get_system("DGX-H100"), gpus=16, global_batch_size=256,
               seq_length=4096, layout=Layout(tp=1, pp=2, ep=8), features=Features(**feat))


@pytest.mark.parametrize("feat", [
    {}, {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
    {"precision": "fp8_cs", "cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("attn",)},
])
def test_cold_and_warm_tables_give_the_same_estimates(feat):
    job = _job(**feat)
    warm_t, warm_m = estimate_time(job), estimate_memory(job)
    memo.clear()
    cold_t, cold_m = estimate_time(job), estimate_memory(job)
    assert cold_t == warm_t
    assert [s.components for s in cold_m.stages] == [s.components for s in warm_m.stages]


def test_expert_load_pads_to_capacity_even_when_force_balanced():
    """Megatron-Core drop-and-pad gives every expert ``capacity`` tokens whatever the routing, so memory and time
    both see the capacity factor; without padding force-balancing gives the mean and a factor caps the imbalance."""
    padded = Features(moe_router_force_load_balancing=True, moe_expert_capacity_factor=1.25,
                      moe_pad_expert_input_to_capacity=True)
    assert expert_load(padded) == 1.25 == routing_factor(_job(**padded.model_dump()))
    assert expert_load(Features(moe_router_force_load_balancing=True, moe_expert_capacity_factor=1.25)) == 1.0
    assert expert_load(Features(moe_routing_imbalance=1.6, moe_expert_capacity_factor=1.25)) == 1.25
    assert expert_load(Features(moe_routing_imbalance=1.6)) == 1.6
    more = estimate_memory(_job(**padded.model_dump())).stages[0].components["activations"]
    less = estimate_memory(_job(moe_router_force_load_balancing=True)).stages[0].components["activations"]
    assert more > less


def test_no_cache_outside_the_memo_mechanism():
    """functools caches and ``id()``-keyed or process-tagged memo dicts stay out of the package: moetune.memo is the
    one mechanism (issue 18)."""
    import re
    from pathlib import Path

    root = Path(memo.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "memo.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"lru_cache|functools\.cache\b|^\s*@cache\b|from functools import .*\bcache\b|_PROCESS_TAG", code):
                bad.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert not bad, "caches outside moetune.memo:\n  " + "\n  ".join(bad)

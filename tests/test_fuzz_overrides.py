"""Property test: random Hydra-style overrides with ``--json`` never produce a traceback.

Whatever the overrides (real fields with impossible values, unknown fields, malformed syntax, huge numbers, NaN,
lists, nulls), ``moetune check`` and ``moetune estimate`` either answer with JSON on stdout (exit 0/1) or refuse with
exactly one ``error:`` line on stderr (exit 2) — never a traceback or an internal error.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_fuzz_inputs import RECIPE, run

REPO = Path(__file__).resolve().parents[1]
BRIDGE_YAML = REPO / "tests" / "fixtures" / "memory_bridge_small.yaml"

FIELDS = [
    "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size", "model.context_parallel_size",
    "model.expert_model_parallel_size", "model.expert_tensor_parallel_size",
    "model.virtual_pipeline_model_parallel_size", "model.num_layers", "model.hidden_size", "model.ffn_hidden_size",
    "model.num_attention_heads", "model.num_query_groups", "model.num_moe_experts", "model.moe_router_topk",
    "model.moe_ffn_hidden_size", "model.seq_length", "model.vocab_size", "model.moe_token_dispatcher_type",
    "model.recompute_granularity", "model.recompute_num_layers", "model.cuda_graph_scope", "model.fp8",
    "model.pipeline_model_parallel_layout", "model.sequence_parallel", "train.micro_batch_size",
    "train.global_batch_size", "ddp.num_distributed_optimizer_instances", "mixed_precision",
    "comm_overlap.overlap_moe_expert_parallel_comm", "model.no_such_field", "nosection.field", "model",
]

values = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(["0", "-1", "1e30", "nan", "inf", "-inf", "null", "true", "[]", "[1,2]", "{}", "abc", "",
                     "1.5", "bf16_mixed", "flex", "full", "'", "[", "\\x00"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12),
)


@st.composite
def overrides(draw) -> list[str]:
    out = []
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        key = draw(st.one_of(st.sampled_from(FIELDS), st.text(max_size=10)))
        prefix = draw(st.sampled_from(["", "", "", "+", "~"]))
        out.append(f"{prefix}{key}={draw(values)}")
    return out


def _assert_clean(code: int, stdout: str, stderr: str) -> None:
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr[-1500:]
    assert code in (0, 1, 2), (code, stderr[-500:])
    if code == 2:
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-800:]
    else:
        json.loads(stdout)  # --json: the answer is JSON, whatever the values


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overrides())
def test_check_random_overrides_never_traceback(ovr):
    code, stdout, stderr = run(["check", "--recipe", RECIPE, *ovr, "--json"])
    _assert_clean(code, stdout, stderr)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overrides())
def test_estimate_random_overrides_never_traceback(ovr):
    code, stdout, stderr = run(["estimate", "--bridge-config", str(BRIDGE_YAML), "--gpus", "8", *ovr, "--json"])
    _assert_clean(code, stdout, stderr)


def test_meta_override_is_a_one_line_error():
    """Found by hypothesis: ``_meta=1`` replaced moetune's recipe record with an int (AttributeError in check)."""
    for ovr in ("_meta=1", "_meta.system=DGX-H100", "~_meta"):
        code, stdout, stderr = run(["check", "--recipe", RECIPE, ovr, "--json"])
        _assert_clean(code, stdout, stderr)
        assert code == 2

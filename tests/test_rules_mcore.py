"""--with-mcore: Megatron-Core's own TransformerConfig agrees with moetune (needs the extra moetune[mcore])."""

from __future__ import annotations

import pytest

from conftest import DATA

pytest.importorskip("megatron.core")
pytest.importorskip("torch")

from moetune.commands.check import run_check  # noqa: E402

pytestmark = pytest.mark.mcore


def test_golden_configs_agree_with_mcore(shared_data):
    for path in sorted((DATA / "megatron_golden").glob("*_config.yaml")):
        out = run_check(megatron_args=str(path), gpus=None if "release" in path.name else 8, with_mcore=True)
        m = out["mcore"]
        assert m["available"]
        assert m.get("verdict") in ("ok", "environment"), (path.name, m)
        if m.get("verdict") == "ok":
            assert m["agree"], (path.name, m)


@pytest.mark.parametrize("overrides,rule", [
    (["model.moe_router_topk=1", "model.moe_router_score_function=softmax",
      "model.moe_router_enable_expert_bias=false", "model.moe_router_pre_softmax=false"], "MOE-020"),
    (["model.num_attention_heads=15"], "PAR-019"),
    (["model.recompute_granularity=full"], "RCP-003"),
    (["model.moe_router_enable_expert_bias=true", "model.moe_router_score_function=softmax"], "MOE-025"),
])
def test_mcore_rejects_what_moetune_rejects(overrides, rule, shared_data):
    path = DATA / "megatron_golden" / "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_config.yaml"
    out = run_check(megatron_args=str(path), gpus=8, overrides=overrides, with_mcore=True)
    m = out["mcore"]
    assert rule in m["moetune_errors"], m
    assert m["verdict"] == "error" and m["agree"], m

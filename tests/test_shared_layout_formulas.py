"""One implementation per layout formula: the checker's PAR rules, the layout validator, the sweep and the config
emitter call the same functions of moetune.spec (pipeline split, layout contents, world size, Bridge ETP default)."""

from __future__ import annotations

import pytest

from moetune.io.check import check_config
from moetune.spec.layout import Layout, bridge_default_etp
from moetune.spec.pipeline import even_split_error, layout_contents_error, parse_pipeline_layout, uneven_split_error
from moetune.spec.validate import min_world_size_of
from moetune.sweep.phases import min_world_size
from test_rules_examples import _cfg, _env


def _fires(rule_id: str, overrides: dict, gpus: int = 16) -> bool:
    return rule_id in {f.id for f in check_config(_cfg(overrides), _env({"gpus": gpus})).errors}


@pytest.mark.parametrize(("nl", "pp", "vpp", "first", "last"), [
    (8, 2, 2, 3, None), (8, 2, None, 3, 5), (12, 3, None, 3, 3), (4, 3, None, 3, 3), (16, 4, 2, 2, 2),
    (8, 2, None, 0, None), (10, 3, None, None, 2),
])
def test_par028_is_the_pipeline_uneven_split(nl, pp, vpp, first, last):
    ov = {"model.num_layers": nl, "model.pipeline_model_parallel_size": pp,
          "model.virtual_pipeline_model_parallel_size": vpp, "model.num_layers_in_first_pipeline_stage": first,
          "model.num_layers_in_last_pipeline_stage": last}
    spec = uneven_split_error(nl, pp, vpp or 1, first, last)
    assert _fires("PAR-028", ov, gpus=8 * pp) == (spec is not None)


def test_negative_middle_split_is_an_error_in_both():
    # 3 + 3 layers in the first/last stages of a 4-layer model: MCore rejects; the checker used to pass it
    assert uneven_split_error(4, 3, 1, 3, 3) is not None
    assert _fires("PAR-028", {"model.num_layers": 4, "model.pipeline_model_parallel_size": 3,
                              "model.virtual_pipeline_model_parallel_size": None,
                              "model.num_layers_in_first_pipeline_stage": 3,
                              "model.num_layers_in_last_pipeline_stage": 3}, gpus=24)


@pytest.mark.parametrize(("nl", "pp", "vpp"), [(8, 2, 2), (9, 2, None), (12, 2, 4), (12, 2, 3), (10, 5, 2)])
def test_par026_is_the_pipeline_even_split(nl, pp, vpp):
    ov = {"model.num_layers": nl, "model.pipeline_model_parallel_size": pp,
          "model.virtual_pipeline_model_parallel_size": vpp}
    assert _fires("PAR-026", ov, gpus=8 * pp) == (even_split_error(nl, pp, vpp or 1) is not None)


@pytest.mark.parametrize("layout", ["Et*2|t*2|t*2|t*2L", "Et*2|t*2|t*2|t*3L", "t*2|Et*2|t*2|t*2L",
                                    "Et*2|t*2|t*2|t*2", "Et*2|t*2|t*2|tmtL"])
def test_par032_is_the_pipeline_layout_contents(layout):
    spec = layout_contents_error(parse_pipeline_layout(layout), 8, 0)
    assert _fires("PAR-032", {"model.pipeline_model_parallel_layout": layout}) == (spec is not None)


def test_bridge_etp_default_and_min_world_size_are_shared():
    assert Layout(tp=4, ep=1).expert_tp == bridge_default_etp(4, 1) == 4
    assert Layout(tp=4, ep=8).expert_tp == bridge_default_etp(4, 8) == 1
    # the sweep's minimum world size is PP*lcm(TP*CP, ETP*EP), not PP*max(...) (TOPO-008)
    assert min_world_size({"tp": 2, "pp": 1, "cp": 1, "ep": 3, "etp": 1}) == min_world_size_of(2, 1, 1, 3, 1) == 6
    assert min_world_size({"tp": 1, "pp": 2, "cp": 1, "ep": 8, "etp": 1}) == 16

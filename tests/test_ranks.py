"""Rank -> group mapping (Megatron default order tp-cp-ep-dp-pp) and NVLink-domain crossing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetune.errors import LayoutError
from moetune.spec.layout import Layout
from moetune.spec.ranks import (
    ALL_KINDS,
    TP_PP_DP_ORDER,
    dense_rank,
    expert_rank,
    group_stays_in_domain,
    groups_crossing_nvlink,
    rank_groups,
)
from moetune.spec.validate import min_world_size


def _megatron_groups(world_size: int, sizes: list[int], mask: list[bool]) -> list[list[int]]:
    """Independent re-derivation of ``generate_masked_orthogonal_rank_groups`` (index arithmetic, no numpy)."""
    strides = [int(np.prod(sizes[:i])) for i in range(len(sizes))]
    in_dims = [i for i, m in enumerate(mask) if m]
    out_dims = [i for i, m in enumerate(mask) if not m]
    gsize = int(np.prod([sizes[i] for i in in_dims]))
    groups = []
    for g in range(world_size // gsize):
        base, rem = 0, g
        for d in out_dims:
            base += (rem % sizes[d]) * strides[d]
            rem //= sizes[d]
        grp = []
        for j in range(gsize):
            off, rem = 0, j
            for d in in_dims:
                off += (rem % sizes[d]) * strides[d]
                rem //= sizes[d]
            grp.append(base + off)
        groups.append(grp)
    return groups


def test_topo003_worked_example():
    lay = Layout(tp=2, pp=2, ep=4, etp=1)
    assert rank_groups("tp", lay, 16).tolist()[:3] == [[0, 1], [2, 3], [4, 5]]
    assert rank_groups("dp", lay, 16).tolist()[:3] == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14]]
    assert rank_groups("pp", lay, 16).tolist()[:2] == [[0, 8], [1, 9]]
    assert rank_groups("ep", lay, 16).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert rank_groups("edp", lay, 16).tolist()[:2] == [[0, 4], [1, 5]]
    lay = Layout(tp=4, pp=2, ep=8, etp=2)
    ep = rank_groups("ep", lay, 32).tolist()
    assert ep[0] == list(range(0, 16, 2)) and ep[1] == list(range(1, 16, 2)) and ep[2] == list(range(16, 32, 2))


@pytest.mark.parametrize(
    ("layout", "w"),
    [(Layout(tp=2, cp=2, pp=2, ep=4), 16), (Layout(tp=4, cp=2, pp=3, ep=8, etp=1), 48), (Layout(tp=3, ep=2), 12)],
)
def test_matches_megatron_rank_generator(layout, w):
    dp, edp = layout.dp(w), layout.edp(w)
    dense_sizes = [layout.tp, layout.cp, 1, dp, layout.pp]  # tp-cp-ep-dp-pp with EP=1
    expert_sizes = [layout.expert_tp, 1, layout.ep, edp, layout.pp]  # CP=1
    for kind, idx in (("tp", 0), ("cp", 1), ("dp", 3), ("pp", 4)):
        mask = [i == idx for i in range(5)]
        assert rank_groups(kind, layout, w).tolist() == _megatron_groups(w, dense_sizes, mask)
    for kind, idx in (("etp", 0), ("ep", 2), ("edp", 3)):
        mask = [i == idx for i in range(5)]
        assert rank_groups(kind, layout, w).tolist() == _megatron_groups(w, expert_sizes, mask)


def test_rank_formulas():
    lay, w = Layout(tp=2, cp=2, pp=2, ep=4, etp=1), 32
    arr = np.arange(w).reshape(lay.pp, lay.dp(w), lay.cp, lay.tp)
    for p, d, c, t in itertools.product(range(lay.pp), range(lay.dp(w)), range(lay.cp), range(lay.tp)):
        assert dense_rank(t, c, d, p, lay, w) == arr[p, d, c, t]
    arr = np.arange(w).reshape(lay.pp, lay.edp(w), lay.ep, lay.expert_tp)
    for p, d, e in itertools.product(range(lay.pp), range(lay.edp(w)), range(lay.ep)):
        assert expert_rank(0, e, d, p, lay, w) == arr[p, d, e, 0]


def test_tp16_on_8_gpu_nodes_crosses():
    rep = {c.kind: c for c in groups_crossing_nvlink(Layout(tp=16), 32, 8)}
    assert rep["tp"].severity == "warning" and rep["tp"].num_crossing == 2 and rep["tp"].max_domains_spanned == 2
    assert rep["tp"].example == list(range(16))
    assert not group_stays_in_domain("tp", Layout(tp=16), 8, 32)
    assert group_stays_in_domain("tp", Layout(tp=8), 8, 32)
    assert "tp" not in {c.kind for c in groups_crossing_nvlink(Layout(tp=8), 32, 8)}


def test_ep64_on_nvl72_straddles():
    rep = {c.kind: c for c in groups_crossing_nvlink(Layout(ep=64), 128, 72)}
    ep = rep["ep"]
    assert ep.num_groups == 2 and ep.num_crossing == 1 and ep.example == list(range(64, 128))
    assert ep.rule == "TOPO-006"
    assert not group_stays_in_domain("ep", Layout(ep=64), 72, 128)
    # EP64 on exactly 64 of the 72 GPUs: one group, one domain
    assert groups_crossing_nvlink(Layout(ep=64), 64, 72) == []
    # EP72 fills the rack exactly
    assert "ep" not in {c.kind for c in groups_crossing_nvlink(Layout(ep=72), 144, 72)}


def test_bad_world_size():
    with pytest.raises(LayoutError, match="PAR-001"):
        rank_groups("tp", Layout(tp=3), 8)


@settings(max_examples=200, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 3, 4, 8, 16]),
    cp=st.sampled_from([1, 2, 3, 4]),
    pp=st.sampled_from([1, 2, 3, 4]),
    ep=st.sampled_from([1, 2, 4, 6, 8, 16, 32, 64]),
    etp=st.sampled_from([None, 1, 2, 4]),
    mult=st.integers(1, 4),
    domain=st.sampled_from([4, 8, 12, 16, 32, 36, 72]),
)
def test_closed_form_agrees_with_enumeration(tp, cp, pp, ep, etp, mult, domain):
    layout = Layout(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp)
    w = min_world_size(layout) * mult
    if w > 4096:
        return
    crossing = {c.kind for c in groups_crossing_nvlink(layout, w, domain)}
    for kind in ALL_KINDS:
        assert group_stays_in_domain(kind, layout, domain, w) == (kind not in crossing), kind
        groups = rank_groups(kind, layout, w)
        assert sorted(groups.ravel().tolist()) == list(range(w))  # each kind partitions the world


@pytest.mark.parametrize(("layout", "w"), [(Layout(tp=2, cp=2, pp=2, ep=4), 32), (Layout(tp=2, pp=3, ep=2), 24)])
def test_tp_pp_dp_order_matches_megatron(layout, w):
    dp, edp = layout.dp(w), layout.edp(w)
    dense_sizes = [layout.tp, layout.cp, 1, layout.pp, dp]  # tp-cp-ep-pp-dp
    expert_sizes = [layout.expert_tp, 1, layout.ep, layout.pp, edp]
    for kind, idx in (("tp", 0), ("cp", 1), ("pp", 3), ("dp", 4)):
        mask = [i == idx for i in range(5)]
        assert rank_groups(kind, layout, w, TP_PP_DP_ORDER).tolist() == _megatron_groups(w, dense_sizes, mask)
    for kind, idx in (("etp", 0), ("ep", 2), ("edp", 4)):
        mask = [i == idx for i in range(5)]
        assert rank_groups(kind, layout, w, TP_PP_DP_ORDER).tolist() == _megatron_groups(w, expert_sizes, mask)
    # the expert generator's PP groups coincide with the dense ones (PAR-005 holds here: TP*CP == ETP*EP)
    assert rank_groups("pp", layout, w, TP_PP_DP_ORDER).tolist() == _megatron_groups(
        w, expert_sizes, [False, False, False, True, False])


def test_tp_pp_dp_order_rejects_unequal_meshes():
    with pytest.raises(LayoutError, match="PAR-005"):
        rank_groups("tp", Layout(tp=2, pp=2, ep=8), 32, TP_PP_DP_ORDER)


@settings(max_examples=120, deadline=None)
@given(
    tpcp=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2), (8, 1), (3, 1)]),
    pp=st.sampled_from([1, 2, 3, 4]),
    etp=st.sampled_from([1, 2]),
    mult=st.integers(1, 4),
    domain=st.sampled_from([4, 8, 12, 36, 72]),
)
def test_closed_form_agrees_tp_pp_dp_order(tpcp, pp, etp, mult, domain):
    tp, cp = tpcp
    if (tp * cp) % etp:
        return
    layout = Layout(tp=tp, cp=cp, pp=pp, ep=tp * cp // etp, etp=etp)  # TP*CP == ETP*EP (PAR-005)
    w = layout.min_world_size() * mult
    crossing = {c.kind for c in groups_crossing_nvlink(layout, w, domain, order=TP_PP_DP_ORDER)}
    for kind in ALL_KINDS:
        assert group_stays_in_domain(kind, layout, domain, w, TP_PP_DP_ORDER) == (kind not in crossing), kind

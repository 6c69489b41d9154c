"""Collectives on the topology: domains, ring time, EP dispatch bytes by dispatcher."""

from __future__ import annotations

import math

import pytest

from moetune.perfmodel import comm as C
from moetune.perfmodel.calibration import default_efficiency


def test_domains_spanned():
    assert C.domains_spanned(8, 1, 8) == (1, 8)
    assert C.domains_spanned(16, 1, 8) == (2, 8)
    assert C.domains_spanned(4, 4, 8) == (2, 2)  # stride 4: 2 ranks per 8-GPU domain
    assert C.domains_spanned(64, 1, 72) == (1, 64)


def test_bus_bandwidth_uses_nics_across_domains():
    assert C.bus_bandwidth(8, 1, 8, 400.0, 40.0) == 400.0
    assert C.bus_bandwidth(16, 1, 8, 400.0, 40.0) == 320.0  # 8 NICs of the domain carry the ring
    assert C.bus_bandwidth(32, 8, 8, 400.0, 40.0) == 40.0  # one member per domain


def test_ring_seconds():
    assert C.ring_seconds(1e9, 1, 100) == 0.0
    assert C.ring_seconds(8e9, 8, 100) == pytest.approx(8e9 * 7 / 8 / 100e9)


def test_a2a_inside_one_domain_never_touches_the_nic():
    intra, inter = C.a2a_bytes(4096, 2048, 8, 8, 1, 8, "alltoall", None)
    assert inter == 0.0
    assert intra == pytest.approx(4096 * 2048 * 2 * 8 * 7 / 8)


def test_a2a_remote_share_and_deepep_dedup():
    T, h, k = 4096, 7168, 8
    _, inter_a2a = C.a2a_bytes(T, h, k, 64, 1, 8, "alltoall", None)
    assert inter_a2a == pytest.approx(T * h * 2 * k * 56 / 64)  # 87.5 % leaves the node (domain.md §4.2)
    _, inter_deepep = C.a2a_bytes(T, h, k, 64, 1, 8, "flex", "deepep")
    assert inter_deepep < inter_a2a  # one copy per remote node
    d = 8
    assert inter_deepep == pytest.approx(T * h * 2 * (d - 1) * (1 - (1 - 1 / d) ** k))


def test_allgather_dispatcher_and_no_ep():
    intra, inter = C.a2a_bytes(1024, 1024, 2, 4, 1, 8, "allgather", None)
    assert inter == 0 and intra == pytest.approx(1024 * 1024 * 2 * 4 * 3 / 4)
    assert C.a2a_bytes(1024, 1024, 2, 1, 1, 8, "alltoall", None) == (0.0, 0.0)


def test_a2a_seconds_is_the_slower_link():
    assert C.a2a_seconds(100e9, 1e9, 100, 10) == pytest.approx(1.0)
    assert C.a2a_seconds(1e9, 100e9, 100, 10) == pytest.approx(10.0)


def test_tp_collectives_per_layer():
    assert C.tp_collectives_per_layer("A", "D", 1, 1) == 0
    assert C.tp_collectives_per_layer("A", "D", 1, 4) == 4
    assert C.tp_collectives_per_layer("A", "E", 1, 4) == 2  # ETP1 MoE adds none
    assert C.tp_collectives_per_layer("A", "E", 4, 4) == 4


def test_shared_expert_tp_collectives_use_the_attention_tp_group():
    """Megatron-Core ``SharedExpertMLP`` is an ``MLP`` on ``pg_collection.tp``: with SP it all-gathers its input and
    reduce-scatters its output over the attention TP group at any ETP (shared_experts.py)."""
    assert C.tp_collectives_per_layer("A", "E", 1, 4, shared=True) == 4  # attention 2 + shared expert 2
    assert C.tp_collectives_per_layer("A", "E", 4, 4, shared=True) == 6  # + the routed experts' ETP pair
    assert C.tp_collectives_per_layer("_", "E", 1, 2, shared=True) == 2  # hybrid model's MoE-only layer
    # no TP, or a layer without a MoE block: nothing to add
    assert C.tp_collectives_per_layer("A", "E", 1, 1, shared=True) == 0
    assert C.tp_collectives_per_layer("A", "D", 1, 4, shared=True) == 4
    assert C.tp_collectives_per_layer("M", "_", 1, 4, shared=True) == 2


def test_mamba_cp_bytes_match_the_all_to_all_shapes():
    """Hand count of MambaContextParallel.pre_conv_ssm / post_conv_ssm (mamba_context_parallel.py): five cp2hp
    all-to-alls (z, x, B, C, dt) and one hp2cp (y), each keeping 1/CP of its [s/CP, b, width] input."""
    s, b, tp, cp = 8192, 1, 2, 4
    heads, hdim, groups, d_state = 64, 64, 8, 128  # Nemotron-3-Nano's mixer
    t = s * b / cp
    d_inner_tp = heads * hdim / tp                      # z, x, y: [t, 2048]
    ng_tp = groups // tp                                # 4 groups per TP rank = CP: no repeat
    widths = [d_inner_tp, d_inner_tp, ng_tp * d_state, ng_tp * d_state, heads / tp, d_inner_tp]
    want = sum(t * w * 2 * (cp - 1) / cp for w in widths)
    got = C.mamba_cp_bytes_per_layer(t, heads * hdim, heads, groups, d_state, tp, cp)
    assert got == pytest.approx(want)
    # 2 groups over TP 2 = 1 group per TP rank < CP 4: B and C are repeated 4x (group_repeat_count) before the a2a
    rep = [d_inner_tp, d_inner_tp, 1 * 4 * d_state, 1 * 4 * d_state, heads / tp, d_inner_tp]
    assert C.mamba_cp_bytes_per_layer(t, heads * hdim, heads, 2, d_state, tp, cp) == pytest.approx(
        sum(t * w * 2 * (cp - 1) / cp for w in rep))
    assert C.mamba_cp_bytes_per_layer(s * b, heads * hdim, heads, groups, d_state, tp, 1) == 0.0
    assert C.cp_bytes_per_layer(1000, 256, 1, "p2p") == 0.0
    assert C.cp_bytes_per_layer(1000, 256, 4, "p2p") == 3 * 1000 * 256 * 2


def test_pxn_hop_loads_nvlink_only_for_cross_node_nccl_a2a():
    T, h, k = 4096, 7168, 8
    intra_1dom, _ = C.a2a_bytes(T, h, k, 8, 1, 8, "alltoall", None)
    intra, inter = C.a2a_bytes(T, h, k, 16, 1, 8, "alltoall", None)
    direct = T * h * 2 * k * 7 / 16  # copies to the 7 other local ranks
    assert intra == pytest.approx(direct + inter * 7 / 8)  # 7/8 of the remote copies cross NVLink first (PXN)
    assert intra_1dom == pytest.approx(T * h * 2 * k * 7 / 8)


def test_a2a_remote_domains():
    assert C.a2a_remote_domains(8, 1, 8) == 0 and C.a2a_remote_domains(64, 1, 8) == 7
    assert C.a2a_remote_domains(16, 2, 8) == 3  # ETP 2: 4 EP ranks per 8-GPU domain


def test_a2a_network_paths():
    lat = {"nvlink": 10.0, "network": 20.0, "per_remote_peer": 0.5}
    kw = dict(scaleout_eff=0.7, wire_eff=0.87, latency_us=lat)
    nic_one, lat_one = C.a2a_network(8, 1, 8, "alltoall", None, 50.0, **kw)
    nic_nccl, lat_nccl = C.a2a_network(64, 1, 8, "alltoall", None, 50.0, **kw)
    nic_deepep, _ = C.a2a_network(64, 1, 8, "flex", "deepep", 50.0, **kw)
    nic_ag, _ = C.a2a_network(64, 1, 8, "allgather", None, 50.0, **kw)
    assert lat_one == pytest.approx(10e-6)
    assert lat_nccl == pytest.approx((20 + 0.5 * 56) * 1e-6)
    assert nic_deepep == pytest.approx(50 * 0.87)  # DeepEP README normal-kernel RDMA rate on the wire
    assert nic_ag == pytest.approx(50 * 0.7)  # the all-gather dispatcher's ring collectives keep the ring rate
    assert C.a2a_seconds(0.0, 0.0, 400.0, 40.0, 1e-5) == 0.0
    assert C.a2a_seconds(4e8, 1e8, 400.0, 40.0, 1e-5) == pytest.approx(1e-5 + 1e8 / 40e9)


def test_nccl_a2a_crosses_the_nic_at_the_rdma_wire_rate_for_any_node_count():
    """The NCCL all-to-all's inter-node bytes run at the same per-NIC wire rate as DeepEP / HybridEP internode
    (nccl-tests #267 / #290: 46-49 GB/s per NDR NIC), with no fall-off as nodes are added: the old ring-rate-times-
    fall-off gave 0.59 of line rate at 8 nodes, which prices GPT-OSS-120B 64xB200 EP64 alltoall 26 % too slow."""
    lat = {"nvlink": 10.0, "network": 20.0, "per_remote_peer": 0.5}
    kw = dict(scaleout_eff=0.7, wire_eff=0.87, latency_us=lat)
    rates = {ep: C.a2a_network(ep, 1, 8, "alltoall", None, 50.0, **kw)[0] for ep in (16, 32, 64, 128)}
    assert all(r == pytest.approx(50 * 0.87) for r in rates.values())
    for ep in (16, 64):
        assert rates[ep] == pytest.approx(C.a2a_network(ep, 1, 8, "flex", "hybridep", 50.0, **kw)[0])
    # CX-8 (800 Gb/s per GPU, DGX-B300) doubles it
    assert C.a2a_network(64, 1, 8, "alltoall", None, 100.0, **kw)[0] == pytest.approx(2 * rates[64])


@pytest.mark.parametrize("ep, dispatch_gbs, combine_gbs", [(16, 71.71, 62.95), (32, 57.69, 57.46), (64, 49.97, 49.77)])
def test_flex_internode_reproduces_the_hybrid_ep_h100_table(ep, dispatch_gbs, combine_gbs):
    """Hybrid-EP README, H100 + 400 Gb/s IB, 4096 tokens, hidden 7168, top-8 of 8 experts per rank, 16 SMs, kernel time
    of a BF16 dispatch and a combine: its 'IB bandwidth' counts each token once per node it reaches, the rank's own
    node included (``count_rdma_send_from_routing_map``). The model's wire bytes (once per remote node) at
    ``a2a_wire_eff``, its NVLink bytes and the p-norm of the two stages (``hierarchical_a2a_sharpness``) give the mean
    of the two kernel times within 5 % from two nodes to eight. At EP16 the stages take about as long as each other
    and the max of the two would be 22 % short."""
    T, h, k, nodes = 4096, 7168, 8, ep // 8
    reach = 1 - math.comb(ep * 8 - 64, k) / math.comb(ep * 8, k)  # a node of 64 experts holds one of the k
    sent = T * nodes * reach * h * 2
    measured_s = (sent / (dispatch_gbs * 1e9) + sent / (combine_gbs * 1e9)) / 2
    intra, inter = C.a2a_bytes(T, h, k, ep, 1, 8, "flex", "hybridep")
    nic, lat = C.a2a_network(ep, 1, 8, "flex", "hybridep", 50.0, scaleout_eff=0.7, wire_eff=0.87,
                             latency_us={"nvlink": 10.0, "network": 20.0, "per_remote_peer": 0.5})
    p = default_efficiency()["hierarchical_a2a_sharpness"]
    model_s = C.a2a_seconds(intra, inter, 450 * 0.8, nic, lat, p)
    assert model_s == pytest.approx(measured_s, rel=0.05)
    if ep == 16:
        assert C.a2a_seconds(intra, inter, 450 * 0.8, nic, lat) < 0.8 * measured_s


def test_a2a_stage_sharpness_is_the_max_when_one_stage_is_absent_or_dominates():
    """The p-norm of the NVLink and network stages (DeepEP / HybridEP internode) equals the one stage there is, lies
    between the max and the sum, and is the max for NCCL (infinite sharpness)."""
    assert C.a2a_seconds(4e8, 0.0, 400.0, 40.0, 0.0, 2.5) == pytest.approx(1e-3)
    assert C.a2a_seconds(0.0, 4e7, 400.0, 40.0, 0.0, 2.5) == pytest.approx(1e-3)
    both = C.a2a_seconds(4e8, 4e7, 400.0, 40.0, 0.0, 2.5)
    assert 1e-3 < both < 2e-3
    assert both == pytest.approx(1e-3 * 2 ** (1 / 2.5))
    assert C.a2a_seconds(4e8, 4e7, 400.0, 40.0, 0.0) == pytest.approx(1e-3)
    assert C.hierarchical_a2a("flex", "hybridep") and C.hierarchical_a2a("flex", "deepep")
    assert not C.hierarchical_a2a("alltoall", None) and not C.hierarchical_a2a("flex", "ncclep")


def test_group_a2a_seconds_splits_peers_by_nvlink_domain():
    """An all-to-all over a strided group: peers in the rank's NVLink domain over NVLink, the others over the NIC,
    concurrently, after each call's start-up."""
    # CP 2 at stride TP 2 on an 8-GPU domain: the one peer is local
    assert C.group_a2a_seconds(100e9, 2, 2, 8, 100.0, 10.0, 1e-3, calls=6) == pytest.approx(6e-3 + 1.0)
    # CP 4 at stride 4 spans two domains, two ranks in each: 1 of 3 peers local
    assert C.group_a2a_seconds(90e9, 4, 4, 8, 100.0, 10.0, 0.0) == pytest.approx(max(30 / 100, 60 / 10))
    assert C.group_a2a_seconds(90e9, 1, 4, 8, 100.0, 10.0, 1e-3) == 0.0

"""Collectives on the topology: TP/SP, CP, EP dispatch/combine, DP gradient/parameter traffic, PP send/recv.

Rank placement follows Megatron-Core's default order ``tp-cp-ep-dp-pp`` (tp fastest, docs/domain.md §2.3): the
dense DP group has stride TP·CP, the EP group stride ETP inside an aligned block of ETP·EP ranks, PP neighbours are
W/PP ranks apart. With G GPUs per NVLink domain, a group of n ranks with stride d spans ``ceil(n·d / G)`` domains
and keeps ``n_in = n / n_dom`` members inside each.

Bandwidth model (NCCL, nccl-tests "bus bandwidth"): a ring AG/RS/AR moves ``(n-1)/n`` of the full tensor per GPU
(all-reduce twice that) at the bus bandwidth of the slowest link class it uses. Inside a domain that is NVLink
(system ``nvlink_bw_gbs`` per direction × ``nvlink_eff``); across domains each GPU drives its own NIC and NCCL's
hierarchical rings spread the inter-domain part over the ``n_in`` NICs of a domain, so the bus bandwidth is
``min(NVLink, n_in · NIC)`` (NIC = ``scaleout_bw_gbs`` × ``scaleout_eff``).

EP dispatch/combine (per MoE layer and microbatch: one dispatch and one combine forward, and the same backward;
docs/domain.md §4.2). Each rank holds T = s·b/(TP·CP) tokens and sends k copies:

* ``alltoall`` (and ``flex`` on one domain): a copy goes to a uniformly chosen EP rank; 1/EP stays local, the
  share ``(EP − e_in)/EP`` leaves the domain (e_in = EP ranks in a domain = min(EP, G/ETP)).
* ``flex`` + DeepEP / HybridEP: a token is sent once per *remote domain* that holds any of its k experts and fanned
  out over NVLink there (DeepEP internode kernels; DeepSeek-V3 report §3.2.2). For uniform routing over D domains
  the expected number of remote domains per token is ``(D − 1)(1 − (1 − 1/D)^k)``.
* ``allgather``: the tokens of the whole ETP·EP group are all-gathered (and reduce-scattered on combine).

Dispatch moves BF16 hidden states (FP8 dispatch is not enabled in Bridge, domain.md §4.2), combine BF16.

Inter-node all-to-all (what makes cross-node EP slow; constants in efficiency.yaml with their sources):

* **Rails and PXN.** DGX/HGX nodes have one NIC per GPU on rails (systems catalog ``scaleout_bw_gbs``: ConnectX-7
  400 Gb/s = 50 GB/s, ConnectX-8 800 Gb/s = 100 GB/s per GPU). An NCCL all-to-all cannot aggregate NICs: each
  GPU's remote traffic leaves through one NIC (nccl-tests issue #267, NCCL maintainers: "the performance you should
  see is the performance of a single NIC"), and with PXN (NCCL default, ``NCCL_PXN_DISABLE=0``) a message for a
  remote GPU on another rail first crosses NVLink to the local GPU on the destination's rail, so (e_in − 1)/e_in of
  the remote bytes also load NVLink (:func:`a2a_bytes`).
* **Wire rate.** The inter-node bytes of an EP all-to-all cross each GPU's own NIC at ``a2a_wire_eff`` of its line
  rate, whichever library moves them: the NCCL all-to-all (rail-aligned through PXN, one send/recv per peer with
  messages of MBs) and the DeepEP / HybridEP RDMA kernels reach the same per-NIC rate. Sources: nccl-tests issues
  #267 and #290 (NCCL maintainers: an all-to-all across NDR 400 Gb/s nodes should reach 46-49 GB/s per NIC); the
  DeepEP README normal kernels on H800 + CX7, internode EP32 / EP64 dispatch 58 / 51 GB/s, a bandwidth that counts
  the node-local share of the tokens (3/4 and 7/8 of it cross the wire: 43.5 / 44.6 GB/s); the Hybrid-EP README H100
  IB table, kernel time, BF16 dispatch EP32 / EP64 57.7 / 50.0 GB/s, counted the same way
  (``tests/test_hybrid_ep.py count_rdma_send_from_routing_map`` keeps the local node): 43.3 / 43.7 GB/s on the
  wire. So the rate holds from 4 to 8 nodes, and one measured row agrees for NCCL: GPT-OSS-120B on 64 DGX-B200,
  EP64 ``alltoall`` (7 remote nodes), runs at 10.18 s per step, which leaves at most 5.4 s for its 8.08 s of
  all-to-all as the ring rate with a peer fall-off priced it (0.59 of line rate), and 5.5 s at ``a2a_wire_eff``.
  No fall-off with the number of nodes is applied: none of these sources shows one.
* **Latency floor.** Each all-to-all pays a fixed start-up (``a2a_latency_us``: NVLink-only vs. over the network,
  plus a per-remote-peer cost of posting one more send/recv), which dominates only for small messages per peer.
* **DeepEP / HybridEP internode.** A token crosses the network once per remote domain holding one of its experts
  (RDMA to the same-rail GPU of that node) and is forwarded over NVLink there (:func:`a2a_bytes`). One kernel runs
  both stages, which overlap only partly: their times combine as a p-norm (``hierarchical_a2a_sharpness``,
  :func:`a2a_seconds`), which matters where they are alike (EP16 on two 8-GPU nodes). The kernels hold
  ``deepep_sms`` / ``hybridep_sms`` SMs while they run (:mod:`moetune.perfmodel.step`).
"""

from __future__ import annotations

import math

BF16 = 2.0


def domains_spanned(n: int, stride: int, domain: int) -> tuple[int, int]:
    """(number of NVLink domains a group of ``n`` ranks with ``stride`` spans, members per domain)."""
    span = n * stride
    if span <= domain and domain % span == 0:
        return 1, n
    n_dom = max(1, math.ceil(span / domain))
    n_dom = min(n_dom, n)
    return n_dom, max(1, n // n_dom)


def bus_bandwidth(n: int, stride: int, domain: int, nvlink_gbs: float, nic_gbs: float) -> float:
    """Achievable bus bandwidth (GB/s) of a ring collective over this group (module doc)."""
    n_dom, n_in = domains_spanned(n, stride, domain)
    if n_dom == 1:
        return nvlink_gbs
    return min(nvlink_gbs, n_in * nic_gbs)


def ring_seconds(full_bytes: float, n: int, busbw_gbs: float) -> float:
    """All-gather or reduce-scatter of a tensor of ``full_bytes`` (the gathered size) over ``n`` ranks."""
    if n <= 1 or full_bytes <= 0:
        return 0.0
    return full_bytes * (n - 1) / n / (busbw_gbs * 1e9)


def a2a_bytes(tokens: float, hidden: float, topk: float, ep: int, etp: int, domain: int, dispatcher: str,
              backend: str | None) -> tuple[float, float]:
    """(NVLink bytes, scale-out bytes) one rank sends in one EP dispatch (or combine); see module doc."""
    if ep <= 1 and dispatcher != "allgather":
        return 0.0, 0.0
    tok_bytes = tokens * hidden * BF16
    e_in = max(1, min(ep, domain // max(etp, 1)))
    n_dom = max(1, math.ceil(ep / e_in))
    if dispatcher == "allgather":
        n = ep * etp
        n_d, n_in = domains_spanned(n, 1, domain)
        full = tok_bytes * n
        if n_d == 1:
            return full * (n - 1) / n, 0.0
        return full * (n_in - 1) / n, full * (n - n_in) / n
    copies = tok_bytes * topk
    intra = copies * (e_in - 1) / ep
    if hierarchical_a2a(dispatcher, backend) and n_dom > 1:
        remote_domains = (n_dom - 1) * (1.0 - (1.0 - 1.0 / n_dom) ** topk)
        inter = tok_bytes * remote_domains
        # copies that arrive over the NIC are forwarded to their expert rank over NVLink
        intra += copies * (ep - e_in) / ep
        return intra, inter
    inter = copies * (ep - e_in) / ep
    if n_dom > 1 and e_in > 1:
        intra += inter * (e_in - 1) / e_in  # PXN: hop to the destination's rail over NVLink first (module doc)
    return intra, inter


def a2a_remote_domains(ep: int, etp: int, domain: int) -> int:
    """NVLink domains of an EP group other than the rank's own (0 when EP fits in one domain)."""
    e_in = max(1, min(ep, domain // max(etp, 1)))
    return max(0, math.ceil(ep / e_in) - 1)


def a2a_latency_s(remote_domains: int, remote_peers: float, lat: dict[str, float]) -> float:
    """Fixed start-up of one all-to-all: ``lat['nvlink']`` us on one domain, else ``lat['network']`` us plus
    ``lat['per_remote_peer']`` us per remote peer (module doc)."""
    if remote_domains <= 0:
        return lat.get("nvlink", 0.0) * 1e-6
    return (lat.get("network", 0.0) + lat.get("per_remote_peer", 0.0) * remote_peers) * 1e-6


def hierarchical_a2a(dispatcher: str, backend: str | None) -> bool:
    """The DeepEP / HybridEP internode path: a token crosses the network once per remote domain and is forwarded over
    NVLink there, both stages inside one kernel (:func:`a2a_bytes`, :func:`a2a_seconds`)."""
    return dispatcher == "flex" and backend in ("deepep", "hybridep")


def a2a_seconds(intra_bytes: float, inter_bytes: float, nvlink_gbs: float, nic_gbs: float,
                latency_s: float = 0.0, stage_sharpness: float = math.inf) -> float:
    """NVLink and NIC transfers of an all-to-all run concurrently after the all-to-all's fixed start-up
    ``latency_s``; with the default ``stage_sharpness`` (infinite) the slower one sets the time (NCCL: independent
    send/recv pairs per peer on their own channels).

    DeepEP / HybridEP internode (:func:`hierarchical_a2a`) run both stages in one warp-specialised persistent kernel
    on a few SMs: the RDMA warp group sends to the same-rail peer of each remote node, and the G2S / S2G warp groups
    of the same blocks forward what arrived, and write the node-local tokens, over NVLink through a shared-memory
    FIFO (the Hybrid-EP implementation notes of DeepEP's hybrid-ep branch, "Hybrid-EP Kernels", dispatch: "first
    performs IB communication between peer GPUs, then each rank distributes the received inter-node data locally";
    the combine pre-reduces in the node, sends, then reduces). The stages overlap, but not perfectly: the time is the p-norm
    ``(t_nvlink^p + t_nic^p)^(1/p)`` with p = ``stage_sharpness`` (efficiency.yaml ``hierarchical_a2a_sharpness``),
    which equals the max when one stage dominates (EP32 / EP64 on 8-GPU nodes) and exceeds it most when the two are
    alike (EP16 on two 8-GPU nodes). Hybrid-EP README, H100 IB table, kernel time, 16 SMs, 4096 tokens, hidden 7168,
    top-8 of 8 experts per rank: EP16 dispatch / combine 1.63 / 1.86 ms where the max gives 1.37 ms (p 3.1 / 1.9),
    while EP32 and EP64 are at the max (tests/test_comm.py)."""
    if intra_bytes <= 0 and inter_bytes <= 0:
        return 0.0
    t_nvl, t_nic = intra_bytes / (nvlink_gbs * 1e9), inter_bytes / (nic_gbs * 1e9)
    top = max(t_nvl, t_nic)
    if stage_sharpness == math.inf or t_nvl <= 0 or t_nic <= 0:
        return latency_s + top
    p = stage_sharpness
    return latency_s + top * ((t_nvl / top) ** p + (t_nic / top) ** p) ** (1.0 / p)


def tp_collectives_per_layer(mixer: str, mlp: str, etp: int, tp: int, *, shared: bool = False) -> int:
    """Forward AG+RS pairs' count of one layer under SP: attention (AG before QKV, RS after proj) and dense MLP
    (AG before FC1, RS after FC2); a MoE block with ETP = 1 has none for its routed experts (its dispatcher moves the
    SP shards), with ETP = TP they behave like the MLP (Megatron-Core ``TransformerLayer`` with
    ``sequence_parallel``).

    ``shared``: the MoE block has a shared expert whose collectives are not overlapped. Megatron-Core's
    ``SharedExpertMLP`` (megatron/core/transformer/moe/shared_experts.py) is an ``MLP`` built on ``pg_collection.tp``,
    the attention TP group, not the expert-TP group: its column-parallel FC1 all-gathers the SP-sharded input and its
    row-parallel FC2 reduce-scatters the output, the full ``[s/CP, b, h]`` tensor each way, whatever ETP is. Only
    ``moe_shared_expert_overlap`` moves them (``pre_forward_comm`` / ``post_forward_comm``) onto the shared-expert
    stream beside the token dispatch, so callers pass ``shared=False`` then.
    """
    if tp <= 1:
        return 0
    n = 0
    if mixer != "_":
        n += 2
    if mlp == "D" or (mlp == "E" and etp > 1):
        n += 2
    if mlp == "E" and shared:
        n += 2
    return n


def mamba_cp_bytes_per_layer(tokens_local: float, d_inner: float, n_heads: float, n_groups: float, d_state: float,
                             tp: int, cp: int) -> float:
    """Bytes one rank sends in one Mamba layer's forward under context parallelism (BF16 activations).

    Megatron-Core's Mamba CP (megatron/core/ssm/mamba_context_parallel.py, ``MambaContextParallel``) swaps the
    sequence sharding of the ``in_proj`` output for head sharding before the convolution and SSM and back after it,
    with ``all_to_all_sp2hp`` / ``all_to_all_hp2sp`` over the CP group (``_all_to_all_cp2hp`` / ``_all_to_all_hp2cp``):

    * ``pre_conv_ssm``: five all-to-alls of the ``[s/CP, b, ·]`` slices z and x (``d_inner/TP`` wide each), B and C
      (``ngroups_local_tp · d_state`` wide, repeated ``group_repeat_count = CP / ngroups_local_tp`` times when a
      group is split over CP ranks, so ``max(ngroups/TP, CP) · d_state``) and dt (``nheads/TP``);
    * ``post_conv_ssm``: one all-to-all of the SSM output y back to sequence sharding, ``[s, b, d_inner/(TP·CP)]``,
      the same ``tokens_local · d_inner/TP`` elements (``MambaMixer._ssm_training``, the training path).

    An all-to-all keeps 1/CP of its input and sends the rest. ``tokens_local`` = s·b/CP (the TP group's tokens on
    this CP shard, after the SP all-gather of ``in_proj``). The backward sends the same bytes again (the callers'
    factor 2).
    """
    if cp <= 1 or tokens_local <= 0:
        return 0.0
    tp = max(tp, 1)
    width = (3 * d_inner / tp                       # z, x before; y after
             + 2 * max(n_groups / tp, cp) * d_state  # B, C (group state repeated over the CP ranks sharing a group)
             + n_heads / tp)                          # dt
    return tokens_local * width * BF16 * (cp - 1) / cp


#: all-to-all calls of one Mamba layer's forward under CP (:func:`mamba_cp_bytes_per_layer`: z, x, B, C, dt, y)
MAMBA_CP_A2AS = 6


def group_a2a_seconds(sent_bytes: float, n: int, stride: int, domain: int, nvlink_a2a_gbs: float,
                      nic_a2a_gbs: float, latency_s: float, calls: int = 1) -> float:
    """Seconds of ``calls`` NCCL all-to-alls over a group of ``n`` ranks with ``stride`` (e.g. the CP group, stride
    TP) in which one rank sends ``sent_bytes`` in all, the same to each of its n − 1 peers: the share for peers inside
    its NVLink domain crosses NVLink, the rest its NIC, concurrently (:func:`a2a_seconds`), after each call's
    start-up ``latency_s`` (:func:`a2a_latency_s`)."""
    if n <= 1 or sent_bytes <= 0:
        return 0.0
    _, n_in = domains_spanned(n, stride, domain)
    intra = sent_bytes * (n_in - 1) / (n - 1)
    return calls * latency_s + a2a_seconds(intra, sent_bytes - intra, nvlink_a2a_gbs, nic_a2a_gbs)


def cp_bytes_per_layer(tokens_local: float, kv_width: float, cp: int, cp_comm_type: str) -> float:
    """Bytes one rank sends for one attention layer's forward under context parallelism.

    ``p2p``: ring of CP−1 KV-chunk exchanges (TE ``AttnFuncWithCPAndKVP2P``); ``allgather``: all-gather of K and V;
    ``a2a``/``a2a+p2p``: four all-to-alls of Q, K, V and O (Ulysses-style, TE ``AttnFuncWithCPAndQKVOA2A``).
    ``kv_width`` is the K+V width per token on this rank.
    """
    if cp <= 1:
        return 0.0
    if cp_comm_type == "p2p":
        return (cp - 1) * tokens_local * kv_width * BF16
    if cp_comm_type == "allgather":
        return (cp - 1) * tokens_local * kv_width * BF16
    return 4 * tokens_local * kv_width * BF16 * (cp - 1) / cp


def a2a_network(ep: int, etp: int, domain: int, dispatcher: str, backend: str | None, nic_raw_gbs: float, *,
                scaleout_eff: float, wire_eff: float, latency_us: dict[str, float]) -> tuple[float, float]:
    """(NIC bandwidth in GB/s, start-up seconds) of one EP dispatch or combine of this layout (module doc): an
    all-to-all's inter-node bytes (NCCL ``alltoall`` or DeepEP / HybridEP internode) at ``wire_eff`` of the raw NIC
    rate, the same for any number of remote domains; the all-gather dispatcher's ring collectives at the ring rate
    (``scaleout_eff``)."""
    remote = a2a_remote_domains(ep, etp, domain) if ep > 1 else 0
    e_in = max(1, min(ep, domain // max(etp, 1)))
    peers = max(ep - e_in, 0)
    lat = a2a_latency_s(remote, peers, latency_us) if ep > 1 or dispatcher == "allgather" else 0.0
    if dispatcher == "allgather":
        return nic_raw_gbs * scaleout_eff, lat
    return nic_raw_gbs * wire_eff, lat

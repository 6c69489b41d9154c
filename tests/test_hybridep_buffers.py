"""HybridEP dispatch/combine buffers (runtime_tail.hybridep_buffer_bytes): the sizes DeepEP's hybrid-ep branch allocates
(csrc/hybrid_ep/config.cuh Configurer, buffer/intranode.cu, buffer/internode_doca.cu, extension/allgather.cu @94a9f8f),
the per-rank sequence-parallel token count they are sized by (activations.sp_tokens), and the tail item of a job."""

from __future__ import annotations

import pytest

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.perfmodel.activations import sp_tokens
from moetune.perfmodel.memory import act_config, estimate_memory, non_torch_gib
from moetune.perfmodel.runtime_tail import GIB, hybridep_buffer_bytes, runtime_tail
from moetune.spec import Features, Job, Layout


def _job(system: str = "GB200-NVL72", gpus: int = 8, mbs: int = 1, seq: int = 4096, backend: str = "hybridep",
         **lay) -> Job:
    f = Features(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend=backend)
    return Job(model=get_model("Qwen3-30B-A3B"), system=get_system(system), gpus=gpus, global_batch_size=256,
               micro_batch_size=mbs, seq_length=seq, layout=Layout(**(lay or dict(ep=8))), features=f)


def test_sp_tokens_is_the_sequence_parallel_shard():
    assert sp_tokens(4096, 2, 4, 2, True) == 1024  # s·b / (CP·TP)
    assert sp_tokens(4096, 2, 4, 2, False) == 4096  # no sequence parallelism: s·b / CP
    assert sp_tokens(4096, 1, 1, 1, True) == 4096  # TP 1: nothing to shard
    j = _job(tp=2, ep=4)
    cfg = act_config(j)
    assert cfg.tokens_sp == sp_tokens(j.seq_length, j.micro_batch_size, 2, 1, cfg.sp)


def test_intranode_sizes_follow_the_source_by_hand():
    # Qwen3-30B-A3B EP8 in one NVLink domain: T = 4096, H = 2048, L = 16 experts per rank, R = 8, N = 1
    t, h, l_, r = 4096, 2048, 16, 8
    m = t * r  # every token of the group may land on this rank
    combine = m * h * 2 + m * l_ * r * 4  # BF16 expert-input tokens + FP32 probs (NVLCoordinator::allocate_combine_buffers)
    scales = m * (h // 128) * 4  # the dispatch buffer's own FP32 scaling factors; tokens/probs shared with combine
    routing = (l_ * r) * m  # gathered bool routing map (CustomAllgather::allocate_ag_buffer)
    nvl, rdma = hybridep_buffer_bytes(h, t, l_, r, 1)
    assert nvl == combine + scales + routing and rdma == 0
    # without the shared buffer the dispatch side holds its own tokens and probs; FP8 tokens take one byte
    assert hybridep_buffer_bytes(h, t, l_, r, 1, shared=False)[0] == nvl + m * h * 2 + m * l_ * r * 4
    assert hybridep_buffer_bytes(h, t, l_, r, 1, shared=False, fp8=True)[0] == nvl + m * h + m * l_ * r * 4


def test_internode_adds_rdma_staging_per_remote_domain():
    t, h, l_, r, n = 4096, 7168, 4, 8, 8  # DeepSeek-V3-like EP64 over 8 DGX nodes
    nvl, rdma = hybridep_buffer_bytes(h, t, l_, r, n)
    m = t * r * n  # the NVLink side is sized by all T·R·N tokens of the group; probs are per domain (L·R wide)
    assert nvl == m * h * 2 + m * l_ * r * 4 + m * (h // 128) * 4 + (l_ * r * n) * m
    rem = n - 1
    dispatch = t * (h * 2 + l_ * r * n * 4 + h // 128 * 4) + t * rem * (h * 2 + l_ * r * 4 + h // 128 * 4)
    combine = 2 * t * rem * (h * 2 + l_ * r * 4)
    assert rdma == dispatch + combine
    assert 1.2 < rdma / GIB < 1.3


@pytest.mark.parametrize("tokens,padded", [(100, 512), (512, 512), (4100, 4160), (8192, 8192)])
def test_token_capacity_is_padded_like_the_configurer(tokens, padded):
    # Configurer: max(tokens, 512) rounded up to the 64-token combine chunk
    assert hybridep_buffer_bytes(2048, tokens, 16, 8, 1) == hybridep_buffer_bytes(2048, padded, 16, 8, 1)
    assert hybridep_buffer_bytes(2048, padded + 1, 16, 8, 1)[0] > hybridep_buffer_bytes(2048, padded, 16, 8, 1)[0]


def test_job_tail_item_scales_with_tokens_and_group():
    base = _job()
    item = next(i for i in runtime_tail(base, activation_peak_bytes=0, allocated_peak_bytes=0).items
                if i.name == "hybridep_buffers")
    assert item.kind == "non_torch" and "NVLink" in item.assumption
    assert item.gib == pytest.approx(sum(hybridep_buffer_bytes(2048, 4096, 16, 8, 1)) / GIB)
    st = estimate_memory(base).stages[0]
    assert st.components["hybridep_buffers"] == pytest.approx(item.gib)
    # twice the microbatch: twice the buffer (the non-PyTorch tail grows by it, nothing else there changes)
    assert non_torch_gib(_job(mbs=2)) - non_torch_gib(base) == pytest.approx(item.gib, rel=0.02)
    # sequence parallelism over TP 2 halves the dispatcher's input rows
    tp2 = _job(gpus=16, tp=2, ep=8, etp=1)
    assert act_config(tp2).sp
    tp2_item = next(i for i in runtime_tail(tp2, activation_peak_bytes=0, allocated_peak_bytes=0).items
                    if i.name == "hybridep_buffers")
    assert tp2_item.gib < item.gib
    # across DGX nodes (EP16 on 8-GPU domains) the RDMA staging buffers appear
    cross = _job(system="DGX-H100", gpus=16, ep=16)
    cross_item = next(i for i in runtime_tail(cross, activation_peak_bytes=0, allocated_peak_bytes=0).items
                      if i.name == "hybridep_buffers")
    assert "RDMA" in cross_item.assumption and cross_item.gib > item.gib


def test_deepep_and_alltoall_have_no_hybridep_item():
    for j in (_job(backend="deepep"), _job().with_(features=Features())):
        names = {i.name for i in runtime_tail(j, activation_peak_bytes=0, allocated_peak_bytes=0).items}
        assert "hybridep_buffers" not in names

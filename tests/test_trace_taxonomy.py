"""Kernel taxonomy table: NCCL old/new names, DeepEP/HybridEP/NVSHMEM as communication, GEMM variants, attention."""

from __future__ import annotations

import pytest

from moetune.errors import InputError
from moetune.evidence.traces.taxonomy import load_taxonomy

CASES = [
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "nccl_allreduce", "comm"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl_allreduce", "comm"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl_allgather", "comm"),
    ("ncclKernel_ReduceScatter_RING_SIMPLE_Sum_bfloat16", "nccl_reducescatter", "comm"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "nccl_sendrecv", "comm"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "nccl_sendrecv", "comm"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t", "nccl_broadcast", "comm"),
    ("ncclDevKernel_Generic", "nccl_generic", "comm"),
    ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*)", "deepep_dispatch", "comm"),
    ("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*)", "deepep_combine", "comm"),
    ("void dpsk::ep::internode::cached_notify<false>(int, int)", "deepep_notify", "comm"),
    ("void deep_ep::intranode::notify_dispatch<8>(int const*)", "deepep_notify", "comm"),
    ("void deep_ep::internode_ll::dispatch<true, 3, 7168>(void*)", "deepep_dispatch", "comm"),
    ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(int4*)", "deepep_combine", "comm"),
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*)", "deepep_layout", "compute"),
    ("hybrid_ep::dispatch_kernel<uint16_t>", "hybridep_dispatch", "comm"),
    ("HybridEP_combine_kernel", "hybridep_combine", "comm"),
    ("hybrid_ep::permute_preprocess", "hybridep_permute", "compute"),
    ("nvshmemi_transfer_rma_kernel", "nvshmem", "comm"),
    ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>(x)", "gemm_grouped_fp8", "compute"),
    ("cutlass_kernel_grouped_gemm_bf16", "gemm_grouped", "compute"),
    ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128", "gemm_fp8", "compute"),
    ("sm90_xmma_gemm_bf16f32_bf16f32_f32_tn_n_tilesize128x128x64", "gemm_dense", "compute"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "gemm_dense", "compute"),
    ("sm100_nvfp4_gemm_kernel", "gemm_fp4", "compute"),
    ("void flash::compute_attn_ws<Flash_fwd_kernel_traits<192>>", "attention_flash", "compute"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention_cudnn", "compute"),
    ("flash_mla_fwd_kernel", "attention_mla", "compute"),
    ("void layer_norm::ln_fwd_kernel<layer_norm::Kernel_traits<bf16>>", "norm", "compute"),
    ("void transformer_engine::rmsnorm_fwd_tuned_kernel<x>", "norm", "compute"),
    ("void transformer_engine::cast_transpose_kernel<x>", "fp8_cast", "compute"),
    ("void cuda::per_token_cast_to_fp8_with_channels<bf16>", "fp8_cast", "compute"),
    ("void moe_permute_row_map<int>", "router_permute", "compute"),
    ("void at::native::sbtopk::gatherTopK<float>", "router_permute", "compute"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>", "optimizer", "compute"),
    # FBGEMM's comm-compression codecs (HTA sample traces) are neither GEMMs nor FP8-training evidence
    ("void fbgemm_gpu::(anonymous namespace)::_FP8rowwise_to_float_cuda_kernel<float>(unsigned char const*)",
     "fbgemm_codec", "compute"),
    ("void fbgemm_gpu::(anonymous namespace)::_compute_FP8_quantize_cuda_kernel<float>(float const*, float const*)",
     "fbgemm_codec", "compute"),
    ("void fbgemm_gpu::(anonymous namespace)::_get_FP8_qparam_cuda_kernel<float>(float const*, int, int)",
     "fbgemm_codec", "compute"),
    ("void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_float_to_hfp8_gpu(at::Tensor const&, long)"
     "::{lambda(float)#1}, at::detail::Array<char*, 2> >(int)", "fbgemm_codec", "compute"),
    ("void at::native::quantize_tensor_per_tensor_affine_cuda<c10::quint8>(x)", "compute_other", "compute"),
    # genuine FP8 kernels: cuBLASLt (sm90 xmma e4m3, nvjet qq = FP8 inputs), TE casts/quantizers, DeepSeek casts
    ("nvjet_qqtst_128x256_128x6_2x1_2cta_v_bz_TNT", "gemm_fp8", "compute"),
    ("nvjet_qqtst_128x256_128x6_2x2_2cta_h_bz_Avec32UE8M0_Bvec32UE8M0_TNT", "gemm_fp8", "compute"),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize64x128x128_warpgroupsize1x1x1_execute_segment_k_off",
     "gemm_fp8", "compute"),
    ("void transformer_engine::detail::block_scaled_1d_cast_transpose_kernel<__nv_bfloat16, __nv_fp8_e4m3>(x)",
     "fp8_cast", "compute"),
    ("void transformer_engine::dispatch::mxfp8::quantize_kernel::quantize_mxfp8_kernel<bf16, fp8e4m3>(x)",
     "fp8_cast", "compute"),
    ("void quantize_fp8_kernel_generic<__nv_bfloat16>(x)", "fp8_cast", "compute"),
    ("void per_block_cast_to_fp8<__nv_bfloat16>(x)", "fp8_cast", "compute"),
    ("void at::native::vectorized_elementwise_kernel<4, {lambda(at::TensorIteratorBase&)#1}>", "elementwise",
     "compute"),  # 'lambda' is not the LAMB optimizer
    ("void at::native::(anonymous namespace)::_fused_adamw_kernel<float>", "optimizer", "compute"),
    ("some_unknown_kernel", "compute_other", "compute"),
]


@pytest.mark.parametrize(("name", "cls", "group"), CASES)
def test_classes(name, cls, group):
    tax = load_taxonomy()
    c = tax.classes[tax.classify(name)]
    assert (c.name, c.group) == (cls, group)


def test_comm_classes_have_kind_and_backend():
    tax = load_taxonomy()
    for c in tax.classes:
        if c.group == "comm":
            assert c.kind and c.backend, c.name


def test_runtime_patterns():
    tax = load_taxonomy()
    assert tax.runtime_kind("cudaGraphLaunch") == "graph_launch"
    assert tax.runtime_kind("cudaLaunchKernel") == "kernel_launch"
    assert tax.runtime_kind("cudaStreamSynchronize") == "sync"
    assert tax.iteration_ranges.search("ProfilerStep#12")


def test_memory_by_activity_kind():
    import numpy as np

    tax = load_taxonomy()
    cls = tax.classify_ids(["Memcpy DtoD", "k"], np.array([0, 1, 1]), np.array([1, 0, 2]))
    assert [tax.classes[i].name for i in cls] == ["memcpy", "compute_other", "memset"]


def test_custom_table_errors(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("classes:\n  - {name: x, group: nonsense, match: 'a'}\n  - {name: y, group: compute, match: '.'}\n")
    with pytest.raises(InputError, match="group"):
        load_taxonomy(bad)
    bad.write_text("classes:\n  - {name: x, group: comm, match: 'a'}\n  - {name: y, group: compute, match: '.'}\n")
    with pytest.raises(InputError, match="kind"):
        load_taxonomy(bad)
    bad.write_text("classes:\n  - {name: x, group: compute, match: '('}\n")
    with pytest.raises(InputError, match="regex"):
        load_taxonomy(bad)

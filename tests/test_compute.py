"""Compute-time kernels: GEMM roofline with tile utilisation, attention and memory-bound kernels."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moetune.perfmodel import compute as K

KW = dict(peak_quant_tflops=1979.0, eff_quant=0.6, peak_bf16_tflops=989.0, eff_bf16=0.7, knee=128.0,
          hbm_gbs=3350.0, hbm_eff=0.7, quant_bytes=1.0)


def _t(m, n, k, groups=1.0, quant=False):
    a = lambda x: np.array([float(x)])  # noqa: E731
    flops = 2.0 * m * n * k * groups
    return float(K.gemm_seconds(a(flops), a(m), a(n), a(k), a(groups), np.array([quant]), **KW)[0])


def test_large_gemm_runs_near_the_fitted_fraction_of_peak():
    m = n = k = 16384
    t = _t(m, n, k)
    achieved = 2.0 * m * n * k / t / 1e12
    util = (m / (m + 128)) ** 3
    assert abs(achieved - 989 * 0.7 * util) < 1e-6 * achieved


def test_small_m_grouped_gemm_is_weight_bandwidth_bound():
    # 64 experts with 16 tokens each: reading the weights dominates
    t = _t(16, 4096, 4096, groups=64)
    weight_bytes = 64 * 4096 * 4096 * 2
    assert t >= weight_bytes / (3350e9 * 0.7)


def test_fp8_speeds_only_quantised_gemms():
    assert _t(8192, 8192, 8192, quant=True) < _t(8192, 8192, 8192, quant=False)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 1 << 15), n=st.integers(1, 1 << 15), k=st.integers(1, 1 << 15))
def test_gemm_time_grows_with_every_dimension(m, n, k):
    t = _t(m, n, k)
    assert _t(2 * m, n, k) >= t and _t(m, 2 * n, k) >= t and _t(m, n, 2 * k) >= t


def test_precision_classes():
    assert K.precision_class("bf16", "blackwell") == "bf16"
    assert K.precision_class("fp8_cs", "hopper") == "fp8"
    assert K.precision_class("fp8_blockwise", "hopper") == "fp8"
    assert K.precision_class("mxfp8", "blackwell") == "mxfp8"
    assert K.precision_class("nvfp4", "blackwell") == "nvfp4"
    assert K.precision_class("fp8_cs", "ampere") == "bf16"
    assert K.peak_key("nvfp4") == "nvfp4" and K.peak_key("mxfp8") == "fp8"


def test_memory_kernels_and_byte_counts():
    assert K.norm_bytes(1000) == 4000
    assert K.glu_bytes(100, True) > K.glu_bytes(100, False)
    assert K.permute_bytes(1024, 8) == 2 * 9 * 1024 * 2
    assert K.mamba_bytes(4096, 8, 128, 64, 64) > 0
    t = K.memory_seconds(np.array([3350e9 * 0.7]), hbm_gbs=3350, hbm_eff=0.7)
    assert abs(t[0] - 1.0) < 1e-12


def test_mamba_cp_copy_bytes_count_the_layout_copies():
    """Hand count of the copies around MambaContextParallel's all-to-alls (mamba_context_parallel.py, mappings.py):
    split + cat before each cp2hp all-to-all, the cat of z x B C dt, the load-balancing re-order (three read + write
    passes of the sent width), the B / C repeat when groups < CP, and two passes of y after the SSM."""
    d, g, n, h = 2048, 4, 128, 32  # Nemotron-3-Nano's mixer per TP rank at TP 2
    sent = 2 * d + 2 * 4 * n + h  # CP 4 = groups: no repeat
    assert K.mamba_cp_copy_bytes(d, g, n, h, 4) == (6 * sent + 4 * d) * 2
    sent8 = 2 * d + 2 * 8 * n + h  # CP 8 > 4 groups: B and C repeated to 8 group states each
    assert K.mamba_cp_copy_bytes(d, g, n, h, 8) == (6 * sent8 + 4 * d + 2 * (4 + 8) * n) * 2
    assert K.mamba_cp_copy_bytes(d, g, n, h, 1) == 0.0


def test_wgrad_accumulation_makes_thin_expert_gemms_memory_bound():
    """128 experts with 2,048 tokens each (EP1) vs 16 experts with 16,384 (EP8), same FLOPs per GPU: the FP32
    main-gradient read + write of the wgrad epilogue scales with the experts held, not with the tokens."""
    import pytest

    from moetune.perfmodel.compute import gemm_bwd_seconds, gemm_seconds

    kw = dict(peak_quant_tflops=1979.0, eff_quant=0.6, peak_bf16_tflops=989.0, eff_bf16=0.6, knee=128.0,
              hbm_gbs=3350.0, hbm_eff=0.4, quant_bytes=1.0)

    def total(groups: float, m: float, acc: float) -> float:
        k, n = 2048.0, 1536.0
        args = (np.array([2 * m * n * k * groups]), np.array([m]), np.array([n]), np.array([k]),
                np.array([groups]), np.array([True]))
        return float(gemm_seconds(*args, **kw)[0] + gemm_bwd_seconds(*args, **kw, grad_accum_bytes=acc)[0])

    thin, fat = total(128, 2048, 8.0), total(16, 16384, 8.0)
    assert thin > fat  # same FLOPs, eight times the weight-gradient traffic
    assert total(128, 2048, 4.0) < thin  # BF16 main grads halve that traffic
    assert total(16, 16384, 4.0) == pytest.approx(fat, rel=1e-3)  # compute-bound: the epilogue is hidden

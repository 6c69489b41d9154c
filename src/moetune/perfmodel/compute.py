"""Compute time of one decoder layer: GEMMs, grouped expert GEMMs, attention kernels and memory-bound kernels.

The FLOPs come from :func:`moetune.perfmodel.flops.layer_flops` (the Megatron-Bridge definition, one
implementation); this module only adds *shapes* (how the FLOPs of a component split into GEMMs of which M/N/K on
one GPU, given TP/CP/EP/ETP and the microbatch) and *rates*:

* GEMM: ``t = max(F / (peak_p · eff_p · u(M) · u(N) · u(K)), bytes / (HBM · hbm_eff))`` — a roofline whose
  compute roof is the precision's dense peak (system catalog) times the achievable fraction ``gemm_eff.<arch>.<p>``
  and a tile-utilisation factor ``u(x) = x / (x + knee)`` per dimension (CUTLASS/cuBLAS tiles are 64–256 wide, so
  a dimension much smaller than a tile wastes the tile: Kerr et al., CUTLASS docs "efficient GEMM"). Grouped GEMMs
  (TE ``GroupedLinear`` / cuBLASLt grouped) run G experts of M = tokens-per-expert rows each, so high EP and many
  experts give small M and a weight-bandwidth-bound kernel (the memory roof reads every local expert's weights).
* Precision recipes quantise only the linear layers of attention, MLP and experts (TE ``fp8_autocast``: router,
  embedding, output layer and core attention stay BF16, domain.md §4.3); FP8-CS with ``first_last_layers_bf16``
  keeps the first and last decoder layers in BF16 (Bridge ``bf16_with_fp8_current_scaling_mixed``).
* Attention core (flash / cuDNN fused attention): Bridge-counted FLOPs (causal ½, sliding window and MLA dims
  already in them) at ``attn_eff.<arch>`` of the BF16 peak, forward + backward = 3× forward FLOPs.
* Memory-bound kernels (norms, residual adds, RoPE, SwiGLU, router softmax/top-k, permute/unpermute, FP8 casts):
  bytes moved per token from the tensors each op reads and writes (MCore/TE op list), at ``hbm_eff`` of the HBM
  bandwidth; backward moves twice the forward bytes (gradient in + gradient out).

Everything is per microbatch and per GPU; the forward is returned, backward multipliers are applied by
:mod:`moetune.perfmodel.step`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from moetune.spec.features import FUSED_GROUPED_MLP_DIM_ALIGN

#: component tags of work items (used to select what a recompute module re-runs)
TAGS = ("attn_proj", "mla_up", "core_attn", "norm", "mixer", "mlp", "mlp_act", "router", "moe_perm", "experts",
        "moe_act", "shared", "logits", "other")
TAG = {t: i for i, t in enumerate(TAGS)}

#: bytes per element of activations / weights in BF16, and of FP8/FP4 quantised operands
BF16_BYTES = 2.0
QUANT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8_delayed": 1.0, "fp8_cs": 1.0, "fp8_blockwise": 1.0, "mxfp8": 1.0,
               "nvfp4": 0.5}


def precision_class(precision: str, arch: str) -> str:
    """Key of the ``gemm_eff.<arch>.<class>`` parameter for a canonical precision (features.parse_precision).

    FP8 tensorwise, delayed and blockwise share the Hopper/Blackwell ``fp8`` class (no separate published rows);
    MXFP8 and NVFP4 are Blackwell-only classes. Ampere has no FP8 (falls back to BF16).
    """
    if precision in ("bf16", "fp16") or arch == "ampere":
        return "bf16"
    if precision in ("fp8_cs", "fp8_delayed", "fp8_blockwise"):
        return "fp8"
    if arch == "hopper":  # MXFP8/NVFP4 do not exist on Hopper: TE would reject them; treat as FP8
        return "fp8"
    return precision  # mxfp8, nvfp4


def peak_key(precision_cls: str) -> str:
    """Key of ``GPU.peak_tflops`` for a precision class."""
    return {"bf16": "bf16", "fp8": "fp8", "mxfp8": "fp8", "nvfp4": "nvfp4"}[precision_cls]


class Work(NamedTuple):
    """Forward work of a set of layers for one microbatch on one GPU (:class:`WorkList`), one row per item in the
    order added, numbers as Python floats: ``gemms`` (flops, M, N, K, groups, quantised, tag, LoRA adapter),
    ``attn`` (flops, tag) and ``mem`` (bytes, tag, streamed), tags as indices of :data:`TAGS`."""

    gemms: tuple[tuple[float, float, float, float, float, bool, int, bool], ...]
    attn: tuple[tuple[float, int], ...]
    mem: tuple[tuple[float, int, bool], ...]


@dataclass
class WorkList:
    """Forward work of a set of layers for one microbatch on one GPU, built row by row (:meth:`rows`)."""

    # GEMMs (one row per GEMM group; flops are forward FLOPs of all groups together): flops, M, N, K, groups,
    # quantised, tag, a LoRA adapter GEMM (trainable when the base is frozen)
    gemms: list[tuple[float, float, float, float, float, bool, int, bool]] = field(default_factory=list)
    attn_rows: list[tuple[float, int]] = field(default_factory=list)  # attention core (forward Bridge FLOPs), tag
    # memory-bound bytes (forward), tag, one contiguous multi-GB tensor streamed (module doc)
    mem_rows: list[tuple[float, int, bool]] = field(default_factory=list)

    def gemm(self, flops: float, m: float, n: float, k: float, *, groups: float = 1.0, quant: bool, tag: str,
             layer: int, adapter: bool = False) -> None:
        """Add a GEMM row (``layer``: the decoder layer it belongs to, for the caller's reading only)."""
        if flops <= 0:
            return
        self.gemms.append((float(flops), float(max(m, 1.0)), float(max(n, 1.0)), float(max(k, 1.0)), float(groups),
                           bool(quant), TAG[tag], bool(adapter)))

    def attn(self, flops: float, *, tag: str = "core_attn", layer: int) -> None:
        if flops > 0:
            self.attn_rows.append((float(flops), TAG[tag]))

    def mem(self, nbytes: float, *, tag: str, layer: int, stream: bool = False) -> None:
        if nbytes > 0:
            self.mem_rows.append((float(nbytes), TAG[tag], bool(stream)))

    def rows(self) -> Work:
        return Work(tuple(self.gemms), tuple(self.attn_rows), tuple(self.mem_rows))


def pairwise_sum(values: list[float]) -> float:
    """``np.sum`` of a contiguous float64 array of ``values`` with the same result bit for bit: numpy's pairwise
    summation (``pairwise_sum`` in numpy/_core/src/umath/loops_utils.h.src): below 8 elements a plain running sum
    from 0.0, up to 128 eight running sums combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) and the
    remainder added one by one, above that the two halves (the first a multiple of 8 long) summed alike and added.
    Arrays of up to 8192 elements (numpy's reduction buffer; the work rows of a layer are a few dozen at most);
    tests/test_step_fastpath.py compares it with ``np.sum``."""
    n = len(values)
    if n < 8:
        res = 0.0
        for v in values:
            res += v
        return res
    if n <= 128:
        r0, r1, r2, r3, r4, r5, r6, r7 = values[:8]
        stop = n - n % 8
        for i in range(8, stop, 8):
            r0 += values[i]
            r1 += values[i + 1]
            r2 += values[i + 2]
            r3 += values[i + 3]
            r4 += values[i + 4]
            r5 += values[i + 5]
            r6 += values[i + 6]
            r7 += values[i + 7]
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for i in range(stop, n):
            res += values[i]
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return pairwise_sum(values[:n2]) + pairwise_sum(values[n2:])


def _max(a: float, b: float) -> float:
    """``np.maximum(a, b)`` of two floats: NaN when either is NaN (``max`` would keep ``a`` when ``b`` is NaN)."""
    return a if (a >= b or a != a) else b


def gemm_row_seconds(flops: float, m: float, n: float, k: float, groups: float, quant: bool,
                     peak_quant_tflops: float, eff_quant: float, peak_bf16_tflops: float, eff_bf16: float, knee: float,
                     hbm_gbs: float, hbm_eff: float, quant_bytes: float, grad_accum_bytes: float | None = None,
                     wgrad: bool = True) -> tuple[float, float | None]:
    """(forward, backward or None) seconds of one GEMM row, every pass the roofline of the forward's FLOPs at the
    tile-utilised rate and its own HBM bytes (module doc).

    Forward: reads A (M×K) and B (K×N) in the GEMM precision, writes C (M×N) in BF16. Backward (only with
    ``grad_accum_bytes``): dgrad (dY·Wᵀ: reads dY M×N and W K×N, writes dX M×K in BF16) plus wgrad (Xᵀ·dY: reads
    X M×K and dY M×N, accumulates dW K×N into the main gradient - TE ``fuse_wgrad_accumulation`` / Megatron
    ``gradient_accumulation_fusion`` read and write the main_grad in the GEMM epilogue, ``grad_accum_bytes`` per
    weight). Where the operands dominate (few tokens per expert) the weight-gradient traffic makes wgrad
    memory-bound. ``wgrad``: False where the weight is frozen (LoRA's base linears, ``requires_grad = False``):
    Transformer Engine's linear backward then computes dgrad only (``weight.requires_grad`` gates the wgrad GEMM in
    ``transformer_engine/pytorch/module/linear.py`` ``_Linear.backward``), so the backward is one forward's FLOPs
    instead of two.

    Plain float arithmetic, each value the one numpy's elementwise operations give (IEEE double, the same operations
    in the same order; the maximum as ``np.maximum``: NaN when either side is). Python floats raise on a division by
    zero where numpy gives inf / NaN: pass ``np.float64`` row values to get numpy's results there."""
    util = (m / (m + knee)) * (n / (n + knee)) * (k / (k + knee))
    rate = (peak_quant_tflops * eff_quant if quant else peak_bf16_tflops * eff_bf16) * 1e12 * util
    t_flop = flops / rate
    bpe = quant_bytes if quant else BF16_BYTES
    bw = hbm_gbs * 1e9 * hbm_eff
    mem = groups * (bpe * (m * k + k * n) + BF16_BYTES * m * n) / bw
    fwd = _max(t_flop, mem)
    if grad_accum_bytes is None:
        return fwd, None
    dgrad = groups * (bpe * (m * n + k * n) + BF16_BYTES * m * k) / bw
    bwd = _max(t_flop, dgrad)
    if wgrad:
        wgrad_s = groups * (bpe * (m * k + m * n) + grad_accum_bytes * k * n) / bw
        return fwd, bwd + _max(t_flop, wgrad_s)
    return fwd, bwd + 0.0


def gemm_pass_seconds(flops: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray, groups: np.ndarray,
                      quant: np.ndarray, *, grad_accum_bytes: float | None = None, wgrad: np.ndarray | bool = True,
                      **rates: float) -> tuple[np.ndarray, np.ndarray | None]:
    """(forward, backward or None) seconds of each GEMM row of the columns (:func:`gemm_row_seconds` of each, with
    numpy's float64 values); ``wgrad`` per row or for all."""
    wg = np.broadcast_to(np.asarray(wgrad, bool), np.shape(flops))
    out = [gemm_row_seconds(*row, grad_accum_bytes=grad_accum_bytes, wgrad=bool(w), **rates)
           for row, w in zip(zip(np.asarray(flops, float), np.asarray(m, float), np.asarray(n, float),
                                 np.asarray(k, float), np.asarray(groups, float), np.asarray(quant, bool), strict=True),
                             wg, strict=True)]
    fwd = np.array([f for f, _ in out], float)
    return fwd, (None if grad_accum_bytes is None else np.array([b for _, b in out], float))


def gemm_seconds(flops: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray, groups: np.ndarray,
                 quant: np.ndarray, **rates: float) -> np.ndarray:
    """Forward seconds of each GEMM row (:func:`gemm_pass_seconds`)."""
    return gemm_pass_seconds(flops, m, n, k, groups, quant, **rates)[0]


def gemm_bwd_seconds(flops: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray, groups: np.ndarray,
                     quant: np.ndarray, *, grad_accum_bytes: float, **rates: float) -> np.ndarray:
    """Backward (dgrad + wgrad) seconds of each GEMM row (:func:`gemm_pass_seconds`)."""
    return gemm_pass_seconds(flops, m, n, k, groups, quant, grad_accum_bytes=grad_accum_bytes, **rates)[1]


def attention_seconds(flops: float | np.ndarray, peak_bf16_tflops: float, eff: float) -> float | np.ndarray:
    """Forward seconds of fused attention for Bridge-counted forward FLOPs."""
    return flops / (peak_bf16_tflops * 1e12 * eff)


def memory_seconds(nbytes: float | np.ndarray, hbm_gbs: float, hbm_eff: float, stream: bool = False,
                   stream_eff: float | None = None) -> float | np.ndarray:
    """Seconds of memory-bound kernels moving ``nbytes`` through HBM: ``hbm_eff`` for the per-token kernels of a
    layer (norms, activations, permutes, casts: many small launches), ``stream_eff`` for kernels flagged ``stream``
    (one tensor of many GB read or written in a single pass, e.g. the score matrix of unfused attention: such
    kernels run at the HBM streaming rate, ``hbm_stream_eff`` in efficiency.yaml)."""
    return nbytes / (hbm_gbs * 1e9 * (stream_eff if stream and stream_eff is not None else hbm_eff))


# ------------------------------------------------------------------------------------------------------------
# bytes per token of the memory-bound ops of a layer (forward, BF16 activations)
# ------------------------------------------------------------------------------------------------------------


def norm_bytes(width: float) -> float:
    """RMSNorm/LayerNorm forward: read x, write y (TE ``RMSNorm``), BF16."""
    return 2 * width * BF16_BYTES


def residual_bytes(width: float) -> float:
    """Residual add (fused bias-dropout-add): read two inputs, write one."""
    return 3 * width * BF16_BYTES


#: elementwise passes of each MLP activation over the FC1 output. SwiGLU/GeGLU/GeLU/ReLU run as one fused
#: kernel (MCore ``bias_swiglu_impl`` / TE fused activations); squared ReLU is relu then square (2 torch ops);
#: GPT-OSS's clamped SwiGLU (``x_glu.clamp``, ``x_lin.clamp``, ``sigmoid(alpha·x_glu)``, products, ``+1``) runs as
#: about five unfused torch ops (megatron/core/fusions ``fused_bias_geglu``-less path for ``glu_linear_offset``).
ACT_PASSES = {"swiglu": 1.0, "geglu": 1.0, "gelu": 1.0, "relu": 1.0, "squared_relu": 2.0, "swiglu_clamped": 5.0}


def glu_bytes(width: float, gated: bool, activation: str = "swiglu") -> float:
    """MLP activation: read FC1 output (2·width if gated), write width, once per elementwise pass."""
    return ACT_PASSES.get(activation, 1.0) * (3 if gated else 2) * width * BF16_BYTES


#: activations TE's CuTeDSL fused grouped MLP takes, in moetune's names: ``fuse_grouped_mlp_ops`` matches
#: ``ScaledSwiGLU`` and ``ScaledClampedQGeGLU`` (SwiGLU; GPT-OSS's clamped GLU) and ``fuse_srelu_ops``
#: ``ScaledSReLU`` (squared ReLU; Megatron-Core builds it with ``use_fused_weighted_squared_relu``)
#: (transformer_engine/pytorch/ops/fused/grouped_mlp.py; megatron/core/transformer/moe/experts.py
#: ``TEGroupedMLP._is_fused_impl_supported``)
FUSED_GROUPED_MLP_ACTIVATIONS = frozenset({"swiglu", "swiglu_clamped", "squared_relu"})
#: precisions whose recipe the fusion takes (``fuse_grouped_mlp_ops``: ``recipe.mxfp8() or recipe.nvfp4()``)
FUSED_GROUPED_MLP_PRECISIONS = frozenset({"mxfp8", "nvfp4"})


def fused_grouped_mlp_runs(*, requested: bool, arch: str, precision: str, etp: int, grouped_gemm: bool,
                           activation: str, d_in: int, ffn: int) -> bool:
    """Whether the routed experts run Transformer Engine's CuTeDSL fused grouped MLP
    (``Features.cutedsl_fused_grouped_mlp``): requested (``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1`` with the TE op fuser),
    an SM 10.x GPU (``_GroupedMLP_CuTeGEMMBase.is_supported``: ``get_device_compute_capability()[0] == 10``, the
    catalog's ``blackwell`` arch: B200 / GB200 sm_100, B300 / GB300 sm_103), an MXFP8 or NVFP4 recipe, one of
    :data:`FUSED_GROUPED_MLP_ACTIVATIONS`, FC1 input ``d_in`` and expert width ``ffn`` multiples of 64
    (transformer_engine/pytorch/ops/fused/grouped_mlp.py ``fuse_grouped_mlp_ops``, ``validate_grouped_mlp_dims``)
    and the op fuser's own conditions, ETP 1 and grouped GEMM (megatron/core/transformer/moe/experts.py
    ``TEGroupedMLP._is_fused_impl_supported``). Elsewhere TE leaves the op sequence unfused.

    Priced on the host only (:func:`moetune.perfmodel.host.layer_launches`, ``fused_grouped_mlp_saved`` fewer kernels).
    The fused kernels also drop the activation's own HBM pass (the epilogue applies it to FC1's accumulator), but
    :data:`ACT_PASSES` are effective values fitted with the rest of the model (5 for GPT-OSS's clamped SwiGLU where
    Megatron-Core's fused path runs 11/3, docs/time.md), and removing them for the fused rows made the held-out folds
    worse (docs/time.md "The CuTeDSL fused grouped MLP"), so the activation traffic is kept as it is."""
    return (requested and grouped_gemm and etp == 1 and arch == "blackwell"
            and precision in FUSED_GROUPED_MLP_PRECISIONS and activation in FUSED_GROUPED_MLP_ACTIVATIONS
            and d_in % FUSED_GROUPED_MLP_DIM_ALIGN == 0 and ffn % FUSED_GROUPED_MLP_DIM_ALIGN == 0)


def rope_bytes(width: float) -> float:
    """Fused RoPE on Q and K: read and write the rotated tensors."""
    return 2 * width * BF16_BYTES


#: Element passes (reads + writes, per element of the rotated tensor) of Megatron-Core's unfused RoPE
#: (``rope_utils._apply_rotary_pos_emb_bshd``, ``apply_rope_fusion`` off). Forward: ``t * cos_`` 2,
#: ``_rotate_half`` (negate one half 1, ``torch.cat`` 2), ``* sin_`` 2, the add 3 (two reads, one write), the closing
#: ``torch.cat((t, t_pass))`` 2: 12. Backward (autograd): the two multiplies 2 + 2, the negation 1, the chunk's
#: gradient concatenation 2, and the sum of the two gradients of ``t`` 3: 10. The cos/sin tables ([s, 1, 1, d]) are
#: negligible.
UNFUSED_ROPE_PASSES = (12.0, 10.0)


def unfused_rope_bytes(width: float) -> float:
    """Unfused RoPE on Q and K (:data:`UNFUSED_ROPE_PASSES`), as the forward-equivalent bytes the step model prices
    (its backward is twice the forward entry, so the entry carries a third of the forward + backward passes)."""
    fwd, bwd = UNFUSED_ROPE_PASSES
    return (fwd + bwd) / 3.0 * width * BF16_BYTES


def permute_bytes(hidden: float, topk: float) -> float:
    """MoE permute + unpermute (fused): read tokens, write k copies; read k copies, write combined tokens.

    Source: megatron/core/transformer/moe/moe_utils.py ``permute`` / ``unpermute``.
    """
    return 2 * (1 + topk) * hidden * BF16_BYTES


def router_bytes(num_experts: float, topk: float) -> float:
    """Router score (softmax/sigmoid), top-k and aux bookkeeping on FP32 logits of E experts (3 passes)."""
    return 3 * num_experts * 4.0 + 2 * topk * 8.0


def cast_bytes(elements: float, quant_bytes: float) -> float:
    """Quantise a BF16 operand (read 2 B, write the quantised bytes; TE ``cast_transpose`` also writes the
    transpose for the backward GEMM)."""
    return elements * (BF16_BYTES + 2 * quant_bytes)


def mamba_bytes(d_inner: float, ngroups: float, state: float, heads: float, head_dim: float,
                chunk: float = 128.0) -> float:
    """Forward bytes per token of a Mamba-2 mixer's memory-bound kernels (Megatron ``MambaMixer`` with the SSD
    chunked scan, Dao & Gu 2024 ``mamba_chunk_scan_combined``, chunk size 128):

    causal conv1d on x, B, C (read + write), the scan's inputs x, B, C, dt and output y, the FP32 inter-chunk
    states (H·P·N per chunk, written and read), and the gated RMSNorm on y and z.
    """
    conv = 2 * (d_inner + 2 * ngroups * state) * BF16_BYTES
    scan = (2 * d_inner + 2 * ngroups * state + heads) * BF16_BYTES
    states = 2 * heads * head_dim * state * 4.0 / chunk
    gated_norm = 3 * d_inner * BF16_BYTES
    return conv + scan + states + gated_norm


def mamba_cp_copy_bytes(d_inner: float, ngroups: float, state: float, heads: float, cp: int) -> float:
    """Forward bytes per local token (s·b/CP of them) of the layout copies around a Mamba layer's CP all-to-alls
    (widths per TP rank: ``d_inner/TP``, ``ngroups/TP``, ``heads/TP``; 0 without CP).

    Megatron-Core ``MambaContextParallel`` (megatron/core/ssm/mamba_context_parallel.py) and the all-to-all helpers
    it calls (megatron/core/tensor_parallel/mappings.py): before the SSM, ``all_to_all_sp2hp`` splits each of z, x,
    B, C, dt along the width and concatenates the pieces along the sequence (read + write of the W' = 2·d_inner +
    2·max(ngroups, CP)·state + heads elements sent), ``torch.cat`` joins the five results, and
    ``_undo_attention_load_balancing`` re-orders the sequence chunks (``torch.cat``): three read + write passes of W';
    B and C are first repeated over the CP ranks that share a group when ngroups < CP (``einops.repeat``: read
    ngroups·state, write CP·state each). After the SSM, ``_redo_attention_load_balancing`` and ``all_to_all_hp2sp``'s
    split + ``torch.cat`` are two read + write passes of y (d_inner). The backward mirrors them (3x convention).
    """
    if cp <= 1:
        return 0.0
    w_bc = max(ngroups, cp) * state
    sent = 2 * d_inner + 2 * w_bc + heads
    repeat = 2 * (ngroups + cp) * state if ngroups < cp else 0.0
    return (3 * 2 * sent + 2 * 2 * d_inner + repeat) * BF16_BYTES


def cp_correction_bytes(cp: int, out_width: float) -> float:
    """Forward bytes per local token of the per-step output merge of ring (``p2p``) context parallelism.

    TE ``AttnFuncWithCPAndKVP2P`` runs attention once per ring step (``cp`` steps) and merges each step's partial
    output into an FP32 accumulator rescaled by the softmax LSE (``flash_attn_fwd_out_correction``): per step read
    the BF16 partial output and read + write the FP32 accumulator; the backward accumulates dQ (and dKV) per step
    the same way, covered by the 3x forward convention of the step model.
    """
    if cp <= 1:
        return 0.0
    return cp * out_width * (BF16_BYTES + 2 * 4.0)


def unfused_attention_bytes(heads: float, context: float) -> float:
    """Forward bytes per token of unfused attention (Megatron ``DotProductAttention``): write the BF16 scores of
    ``heads`` × ``context`` keys, read/write them in the masked softmax, read them for the AV product."""
    return heads * context * BF16_BYTES * 4

"""A training system: GPU, node and network. Numbers come from catalog files that cite their sources."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from moetune.spec.base import FrozenSpec

#: precision keys used in ``GPU.peak_tflops`` (dense Tensor-Core peaks, no 2:4 sparsity)
PEAK_KEYS = ("bf16", "fp16", "fp8", "mxfp8", "nvfp4", "tf32")


class GPU(FrozenSpec):
    """One accelerator."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="e.g. 'H100-SXM5-80GB'.")
    arch: Literal["ampere", "hopper", "blackwell"] = Field(description="Selects legal precision recipes and kernels.")
    sm_count: int = Field(gt=0, description="Streaming multiprocessors (H100 SXM: 132).")
    hbm_gib: float = Field(gt=0, description="Usable HBM capacity in GiB (what torch reports as total memory).")
    hbm_bw_gbs: float = Field(gt=0, description="HBM bandwidth, GB/s (1e9 B/s).")
    peak_tflops: dict[str, float] = Field(description="Dense peak TFLOP/s keyed by precision (see PEAK_KEYS).")

    @field_validator("peak_tflops")
    @classmethod
    def _check_peaks(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(PEAK_KEYS))
        if unknown:
            raise ValueError(f"unknown precision key(s) {unknown}; expected some of {list(PEAK_KEYS)}")
        if "bf16" not in v:
            raise ValueError("needs a 'bf16' entry (the fallback peak for precisions the GPU lacks)")
        if any(x <= 0 for x in v.values()):
            raise ValueError("peaks must be positive TFLOP/s")
        return v


class System(FrozenSpec):
    """A cluster building block: nodes of ``gpus_per_node`` GPUs, NVLink domains of ``nvlink_domain`` GPUs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    aliases: tuple[str, ...] = ()
    gpu: GPU
    gpus_per_node: int = Field(gt=0, description="GPUs per node / tray as the launcher counts them (GB200: 4).")
    nvlink_domain: int = Field(gt=0, description="GPUs reachable over NVLink (DGX: 8, NVL72: 72).")
    nvlink_bw_gbs: float = Field(gt=0, description="NVLink bandwidth per GPU per direction, GB/s.")
    scaleout_bw_gbs: float = Field(gt=0, description="Scale-out (IB/RoCE) NIC bandwidth per GPU per direction, GB/s.")
    host_cpu: str = Field(description="Host CPU (sets the kernel-launch cost).")
    pcie_bw_gbs: float = Field(default=64.0, description="Host<->device copy bandwidth per GPU per direction, GB/s.")
    host_link_shared_with_nic: bool = Field(
        default=False, description="The GPU's host link also carries its scale-out NIC's GPUDirect RDMA traffic (x86 "
        "DGX: GPU and NIC under one PCIe switch); host copies then get what the NIC leaves.")
    host_memory_gb_per_gpu: float | None = Field(
        default=None, gt=0, description="Host (CPU) memory per GPU, GB: what activation offloading can fill. "
        "None: not known (not checked).")
    host_memory_bw_gbs_per_gpu: float | None = Field(
        default=None, gt=0, description="Peak host (CPU) DRAM bandwidth of a node per GPU, GB/s, reads and writes "
        "together: what the host copies of all GPUs of a node share. None: not known (the host link alone limits).")
    sources: dict[str, str] = Field(default_factory=dict, description="field -> datasheet / measurement it came from.")

    def peak(self, precision: str) -> float:
        """Dense peak TFLOP/s for a precision key, falling back to BF16 when the GPU lacks it."""
        return self.gpu.peak_tflops.get(precision, self.gpu.peak_tflops["bf16"])

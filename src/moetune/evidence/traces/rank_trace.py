"""The per-rank event container every trace reader fills (Kineto JSON, nsys SQLite, nsys recipe outputs).

Only the fields the analysis needs are kept, as numpy arrays (times in integer nanoseconds on the rank's own clock),
so memory stays proportional to the number of GPU activities and launches, not to the size of the file.
Names are interned: ``names[name_id]`` gives the string.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: GPU activity kinds (``RankTrace.gpu_kind``)
GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET = 0, 1, 2
GPU_KIND_NAMES = ("kernel", "memcpy", "memset")


@dataclass
class Ranges:
    """Named host-side (or GPU-side) ranges: ProfilerStep#, NVTX push/pop, user annotations."""

    name: list[str] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    tid: list[int] = field(default_factory=list)

    def add(self, name: str, start: int, end: int, tid: int = 0) -> None:
        self.name.append(name)
        self.start.append(int(start))
        self.end.append(int(end))
        self.tid.append(int(tid))

    def __len__(self) -> int:
        return len(self.name)


@dataclass
class RankTrace:
    """One rank's (one GPU's) events. All times are int64 ns."""

    source: str  # file path
    fmt: str  # "kineto" | "nsys-sqlite" | "nsys-nvtx-pushpop-csv" | "nsys-nvtx-gpu-proj-parquet"
    rank: int | None = None  # from the trace's own metadata, never from the file name
    rank_source: str = "unknown"
    world_size: int | None = None
    device: str | None = None
    backend: str | None = None
    names: list[str] = field(default_factory=list)
    # GPU activities (kernels, memcpy, memset)
    gpu_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gpu_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gpu_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    gpu_kind: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    gpu_stream: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gpu_corr: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gpu_graph: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # graph id, -1 = not a graph node
    # host launches / runtime API calls (cudaLaunchKernel, cudaGraphLaunch, cudaStreamSynchronize, ...)
    rt_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rt_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rt_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    rt_corr: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rt_tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    steps: Ranges = field(default_factory=Ranges)  # ProfilerStep# / NVTX iteration ranges (host side)
    annotations: Ranges = field(default_factory=Ranges)  # other user annotations / NVTX ranges (host side)
    gpu_annotations: Ranges = field(default_factory=Ranges)  # GPU-side annotation / projected NVTX ranges
    comm_meta: dict[int, dict] = field(default_factory=dict)  # gpu index -> collective args (Kineto NCCL args)
    forced_class: dict[int, str] = field(default_factory=dict)  # name_id -> taxonomy class (NVTX projections)
    clock_epoch_ns: int | None = None  # offset that turns this trace's ts into UTC epoch ns, when known
    notes: list[str] = field(default_factory=list)
    n_events: int = 0

    @property
    def n_gpu(self) -> int:
        return int(self.gpu_start.size)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else self.source

    def name_of(self, ids: np.ndarray) -> list[str]:
        return [self.names[i] for i in ids]


class Interner:
    """Maps strings to dense integer ids."""

    __slots__ = ("ids", "names")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def __call__(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = len(self.names)
            self.ids[s] = i
            self.names.append(s)
        return i

"""Build small synthetic Kineto traces for the trace tests (real Kineto field layout, hand-placed timings)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


class KinetoBuilder:
    def __init__(self, rank: int | None = 0, world: int = 2):
        self.events: list[dict] = []
        self.corr = 1000
        self.meta = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}
        if rank is not None:
            self.meta["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}

    def step(self, n: int, ts: float, dur: float) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                            "ts": ts, "dur": dur})

    def kernel(self, name: str, ts: float, dur: float, launch_ts: float, launch_dur: float = 2.0, stream: int = 7,
               cat: str = "kernel", runtime: str = "cudaLaunchKernel", args: dict | None = None) -> None:
        self.corr += 1
        a = {"device": 0, "stream": stream, "correlation": self.corr, "External id": self.corr}
        a.update(args or {})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                            "args": a})
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": runtime, "pid": 1, "tid": 1, "ts": launch_ts,
                            "dur": launch_dur, "args": {"correlation": self.corr, "cbid": 211}})

    def cpu_op(self, name: str, ts: float, dur: float) -> None:
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                            "args": {"External id": 1}})

    def write(self, path: Path, gz: bool = False) -> Path:
        doc = dict(self.meta)
        doc["traceEvents"] = self.events
        doc["traceName"] = str(path)
        data = json.dumps(doc, indent=1).encode()
        if gz:
            with gzip.open(path, "wb") as fh:
                fh.write(data)
        else:
            path.write_bytes(data)
        return path

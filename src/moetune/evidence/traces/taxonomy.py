"""Kernel taxonomy: regex classes from the data table ``catalog/kernel_taxonomy.yaml`` (docs/domain.md §7.3).

Classification runs once per *unique* kernel name, so it costs nothing per event. Each class has a group
(``comm`` / ``compute`` / ``memory``), and communication classes a ``kind`` (the key of ``comm_by_kind``) and a
``backend`` (nccl, deepep, hybridep, nvshmem) used as feature-activation evidence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from moetune.errors import InputError
from moetune.memo import memo

GROUPS = ("compute", "comm", "memory")
GROUP_COMPUTE, GROUP_COMM, GROUP_MEMORY = 0, 1, 2


@dataclass(frozen=True)
class KernelClass:
    name: str
    group: str
    kind: str | None = None
    backend: str | None = None
    tags: tuple[str, ...] = ()
    match: re.Pattern | None = None
    require: re.Pattern | None = None

    @property
    def group_id(self) -> int:
        return GROUPS.index(self.group)


@dataclass
class Taxonomy:
    classes: list[KernelClass]
    runtime: dict[str, re.Pattern]
    iteration_ranges: re.Pattern
    thresholds: dict[str, float]
    memcpy_class: int = -1
    memset_class: int = -1
    catch_all: int = 0
    nvtx_classes: list[tuple[str, re.Pattern]] = field(default_factory=list)
    _cache: dict[str, int] = field(default_factory=dict)

    def classify(self, name: str) -> int:
        """Index of the first matching class (the last class is a catch-all)."""
        hit = self._cache.get(name)
        if hit is not None:
            return hit
        for i, c in enumerate(self.classes):
            if c.match is None:
                continue
            if c.match.search(name) and (c.require is None or c.require.search(name)):
                self._cache[name] = i
                return i
        self._cache[name] = self.catch_all
        return self.catch_all

    def index(self, class_name: str) -> int:
        for i, c in enumerate(self.classes):
            if c.name == class_name:
                return i
        raise InputError(f"kernel taxonomy has no class {class_name!r}")

    def classify_nvtx(self, name: str) -> str:
        """Class name for an NVTX range projected onto the GPU (nsys nvtx_gpu_proj_trace)."""
        for cname, rx in self.nvtx_classes:
            if rx.search(name):
                return cname
        return self.classes[self.catch_all].name

    def classify_ids(
        self, names: list[str], name_ids: np.ndarray, kinds: np.ndarray, forced: dict[int, str] | None = None
    ) -> np.ndarray:
        """Class index per event; memcpy/memset by activity kind (kinds: 0 kernel, 1 memcpy, 2 memset)."""
        forced = forced or {}
        table = np.array(
            [self.index(forced[i]) if i in forced else self.classify(n) for i, n in enumerate(names)] or [0], np.int32
        )
        cls = table[name_ids] if name_ids.size else np.zeros(0, np.int32)
        cls = np.where(kinds == 1, self.memcpy_class, cls)
        cls = np.where(kinds == 2, self.memset_class, cls)
        return cls.astype(np.int32)

    def group_table(self) -> np.ndarray:
        return np.array([c.group_id for c in self.classes], np.int8)

    def runtime_kind(self, name: str) -> str | None:
        for kind, rx in self.runtime.items():
            if rx.search(name):
                return kind
        return None

    def tag_table(self, tag: str) -> np.ndarray:
        return np.array([tag in c.tags for c in self.classes], bool)


def _compile(rx: str | None, where: str) -> re.Pattern | None:
    if rx is None:
        return None
    try:
        return re.compile(rx)
    except re.error as exc:
        raise InputError(f"{where}: bad regex {rx!r}: {exc}") from exc


def load_taxonomy(path: str | Path | None = None) -> Taxonomy:
    """Load the taxonomy table (default: the packaged ``catalog/kernel_taxonomy.yaml``)."""
    if path is None:
        return _default()
    from moetune.files import read_text

    return _load(read_text(path, "a kernel taxonomy YAML"), str(path))


@memo(maxsize=1)
def _default() -> Taxonomy:
    text = resources.files("moetune.catalog").joinpath("kernel_taxonomy.yaml").read_text()
    return _load(text, "kernel_taxonomy.yaml")


def _load(text: str, where: str) -> Taxonomy:
    data = yaml.safe_load(text)
    classes: list[KernelClass] = []
    for i, row in enumerate(data.get("classes") or []):
        if row.get("group") not in GROUPS:
            raise InputError.bad_value(f"{where}: classes[{i}].group", row.get("group"), " | ".join(GROUPS))
        if row["group"] == "comm" and not row.get("kind"):
            raise InputError(f"{where}: comm class {row.get('name')!r} needs a kind")
        classes.append(
            KernelClass(
                name=row["name"],
                group=row["group"],
                kind=row.get("kind"),
                backend=row.get("backend"),
                tags=tuple(row.get("tags") or ()),
                match=_compile(row.get("match"), f"{where}: {row['name']}"),
                require=_compile(row.get("require"), f"{where}: {row['name']}"),
            )
        )
    if not classes or classes[-1].match is None or classes[-1].match.pattern not in (".", ".*", ""):
        raise InputError(f"{where}: the last class must be a catch-all (match: '.')")
    mem = data.get("memory_classes") or {}
    for key in ("memcpy", "memset"):
        row = mem.get(key) or {"name": key, "group": "memory"}
        classes.append(KernelClass(name=row["name"], group=row.get("group", "memory")))
    return Taxonomy(
        classes=classes,
        runtime={k: re.compile(v) for k, v in (data.get("runtime") or {}).items()},
        iteration_ranges=re.compile(data.get("iteration_ranges") or r"^ProfilerStep#\d+$"),
        thresholds={k: float(v) for k, v in (data.get("thresholds") or {}).items()},
        memcpy_class=len(classes) - 2,
        memset_class=len(classes) - 1,
        catch_all=len(classes) - 3,
        nvtx_classes=[(row["class"], re.compile(row["match"])) for row in (data.get("nvtx_classes") or [])],
    )

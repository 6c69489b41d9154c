"""The frozen measurement contract of a sweep (``contract.yaml``).

Everything that must stay fixed while one variable is tested (docs/domain.md §7.1, seeds S:wf / S:rec): software
versions and container, GPU count / SKU / topology, launcher, model, data and routing semantics with the
training-equivalent vs benchmark-only label, precision, batch shape, the parallel layout, the baseline features
(dispatcher, overlap, recompute, graph scope) and the timing windows (screen: 6-12 post-warm-up iterations;
validation: >= 50 steps with a declared window such as 41-50).

The contract is written once by ``moetune sweep init``; its SHA-256 is recorded in ``sweep.yaml`` and in every run's
``run.yaml`` so that ``moetune sweep collect`` can tell when the contract was edited after runs were generated.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from moetune.errors import InputError
from moetune.sweep.launcher import Launcher  # noqa: F401 - the contract's launcher (defined with its renderers)

#: iterations the screens drop before their window (step 1 and graph-capture steps; docs/domain.md §7.1)
DEFAULT_SCREEN_WARMUP = 2
#: post-warm-up iterations in a screen window (the seeds: 6-12)
DEFAULT_SCREEN_ITERS = 10
#: validation length and declared window (the seeds: >= 50 steps, e.g. 41-50)
DEFAULT_VALIDATE_STEPS = 50
DEFAULT_VALIDATE_WINDOW = (41, 50)


class Window(BaseModel):
    """A run length and the inclusive iteration window its step time is measured over."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(gt=0, description="train_iters of the run")
    first: int = Field(gt=0, description="first iteration of the steady window (inclusive)")
    last: int = Field(gt=0, description="last iteration of the steady window (inclusive)")

    @model_validator(mode="after")
    def _check(self) -> Window:
        if not (self.first <= self.last <= self.steps):
            raise ValueError(f"window {self.first}-{self.last} must satisfy first <= last <= steps ({self.steps})")
        return self

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def label(self) -> str:
        return f"{self.first}-{self.last} of {self.steps}"


def screen_window(warmup: int = DEFAULT_SCREEN_WARMUP, iters: int = DEFAULT_SCREEN_ITERS) -> Window:
    """Screen window: drop ``warmup`` iterations, then measure ``iters`` (6-12 per the seeds)."""
    if not 6 <= iters <= 12:
        raise InputError.bad_value("screen_iters", iters, "6-12 post-warm-up iterations (docs/domain.md §7.1)")
    return Window(steps=warmup + iters, first=warmup + 1, last=warmup + iters)


def validate_window(steps: int = DEFAULT_VALIDATE_STEPS, first: int | None = None, last: int | None = None) -> Window:
    """Validation window: >= 50 steps and a declared window (default the last 10 steps)."""
    if steps < 50:
        raise InputError.bad_value("validate_steps", steps, ">= 50 steps (docs/domain.md §7.1)")
    last = steps if last is None else last
    first = last - 9 if first is None else first
    return Window(steps=steps, first=first, last=last)


class Versions(BaseModel):
    model_config = ConfigDict(extra="allow")

    container: str = "unknown"
    megatron_bridge: str = "unknown"
    megatron_core: str = "unknown"
    transformer_engine: str = "unknown"
    pytorch: str = "unknown"
    cuda: str = "unknown"
    nccl: str = "unknown"


class Hardware(BaseModel):
    model_config = ConfigDict(extra="forbid")

    system: str
    gpu_type: str
    gpus: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    nodes: int = Field(gt=0)
    nvlink_domain: int = Field(gt=0)


class Semantics(BaseModel):
    """Data/routing semantics and the run label (docs/domain.md §7.1)."""

    model_config = ConfigDict(extra="forbid")

    label: Literal["training-equivalent", "benchmark-only"]
    data: str = Field(description="'mock' or the dataset identity")
    routing: str = Field(description="'dropless', 'force-balanced' or 'capacity=<f>'")
    reasons: list[str] = Field(default_factory=list, description="why the label is what it is")


class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")

    global_batch_size: int = Field(gt=0)
    micro_batch_size: int = Field(gt=0)
    seq_length: int = Field(gt=0)


class ContractLayout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    dp: int | None = None
    edp: int | None = None
    pipeline_layout: str | None = None


class Contract(BaseModel):
    """The frozen measurement contract."""

    schema_version: int = 1
    model: str
    model_arch: dict[str, Any] | None = Field(default=None, description="full architecture when not in the catalog")
    hardware: Hardware
    versions: Versions = Field(default_factory=Versions)
    launcher: Launcher = Field(default_factory=Launcher)
    semantics: Semantics
    precision: str
    shape: Shape
    layout: ContractLayout
    features: dict[str, Any] = Field(description="baseline features (Features field names) held fixed")
    env: dict[str, str] = Field(default_factory=dict, description="baseline environment variables")
    screen: Window
    validate_: Window = Field(alias="validate")
    dry_run_replay: bool = Field(default=False, description="True: payloads replay recorded logs, no training")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json", by_alias=True)
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)

    def sha256(self) -> str:
        return hashlib.sha256(self.to_yaml().encode()).hexdigest()

    def arch(self):
        """The model architecture (``ModelArch``): embedded, or from the catalog by name."""
        from moetune.catalog.models import get_model
        from moetune.spec.model import ModelArch

        return ModelArch.model_validate(self.model_arch) if self.model_arch else get_model(self.model)

    def graph_scope(self) -> list[str]:
        return list(self.features.get("cuda_graph_scope") or [])


def load_contract(path: Path) -> Contract:
    """Read ``contract.yaml``; one-line error naming the file and field on bad input."""
    from moetune.files import read_text

    text = read_text(path, "the sweep's contract.yaml")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping, got {type(data).__name__}")
    try:
        return Contract.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise InputError(f"{path}: field {loc}: {err['msg']}") from None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

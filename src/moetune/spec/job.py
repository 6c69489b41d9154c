"""A Job: what Megatron would run — model, system, GPU count, batch shape, layout and features."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from moetune.spec.base import FrozenSpec
from moetune.spec.features import Features
from moetune.spec.layout import Layout
from moetune.spec.model import ModelArch
from moetune.spec.system import System


class Job(FrozenSpec):
    """One training configuration. Construct through readers/catalogs; the core assumes it is valid."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelArch
    system: System
    gpus: int = Field(gt=0, description="World size W.")
    global_batch_size: int = Field(gt=0, description="GBS in sequences.")
    micro_batch_size: int = Field(default=1, gt=0, description="MBS in sequences.")
    seq_length: int = Field(gt=0, description="Tokens per sequence.")
    layout: Layout = Field(default_factory=Layout)
    features: Features = Field(default_factory=Features)
    assumptions: tuple[str, ...] = Field(default=(), description="Defaults filled in by readers, for the output.")

    @property
    def dp(self) -> int:
        return self.layout.dp(self.gpus)

    @property
    def edp(self) -> int:
        return self.layout.edp(self.gpus)

    @property
    def num_microbatches(self) -> int:
        """m = GBS / (MBS * DP) — dense DP, not EDP (docs/domain.md §2.1)."""
        return self.layout.num_microbatches(self.gpus, self.global_batch_size, self.micro_batch_size)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_length

    def with_(self, **changes) -> Job:
        """Copy with top-level fields replaced (``layout=...``, ``features=...``)."""
        return self.model_copy(update=changes)

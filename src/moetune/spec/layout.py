"""Parallel layout: TP, PP, VPP / pipeline layout, CP, EP, ETP. DP and EDP are derived from the world size.

Sources: Megatron-Core ``parallel_state.initialize_model_parallel`` (DP = W/(TP*CP*PP), expert mesh
W/PP = ETP*EP*EDP); docs/domain.md §2.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from moetune.spec.base import FrozenSpec


def bridge_default_etp(tp: int, ep: int) -> int:
    """Bridge's ``expert_tensor_parallel_size`` when unset: 1 with EP > 1, else TP (Megatron-Bridge
    ``_set_moe_expert_tensor_parallel_default``; raw MCore / Megatron-LM use TP, rules PAR-003)."""
    return 1 if ep > 1 else tp


class Layout(FrozenSpec):
    """Model-parallel sizes (Megatron-Core ``ModelParallelConfig`` names in the descriptions)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = Field(default=1, ge=1, description="tensor_model_parallel_size")
    pp: int = Field(default=1, ge=1, description="pipeline_model_parallel_size")
    vpp: int | None = Field(default=None, ge=1, description="virtual_pipeline_model_parallel_size (None = no VPP)")
    pipeline_layout: str | None = Field(
        default=None, description="pipeline_model_parallel_layout, e.g. 'Et*3|(tt|)*29m|L' (sets VPP = stages/PP)"
    )
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    cp: int = Field(default=1, ge=1, description="context_parallel_size")
    ep: int = Field(default=1, ge=1, description="expert_model_parallel_size")
    etp: int | None = Field(
        default=None, ge=1, description="expert_tensor_parallel_size (None: Bridge -> 1 if EP>1 else TP; MLM -> TP)"
    )

    @property
    def expert_tp(self) -> int:
        """ETP with the Bridge default applied (1 when EP > 1, else TP)."""
        if self.etp is not None:
            return self.etp
        return bridge_default_etp(self.tp, self.ep)

    @property
    def vpp_size(self) -> int:
        """VPP as an int (1 = not interleaved); with a ``pipeline_layout`` string and no explicit VPP, the
        layout's #stages / PP (MCore ``PipelineParallelLayerLayout`` sets VPP that way)."""
        if self.vpp is None and self.pipeline_layout is not None:
            from moetune.spec.pipeline import layout_vpp

            return layout_vpp(self.pipeline_layout, self.pp)
        return self.vpp or 1

    def min_world_size(self) -> int:
        """Smallest legal GPU count ``PP · lcm(TP·CP, ETP·EP)`` (see :func:`moetune.spec.validate.min_world_size`)."""
        from moetune.spec.validate import min_world_size_of

        return min_world_size_of(self.tp, self.cp, self.pp, self.ep, self.expert_tp)

    def num_microbatches(self, world_size: int, global_batch_size: int, micro_batch_size: int = 1) -> int:
        """m = GBS / (MBS · DP) with the dense DP (``ConstantNumMicroBatchesCalculator``; docs/domain.md §2.1)."""
        return global_batch_size // (micro_batch_size * self.dp(world_size))

    def dp(self, world_size: int) -> int:
        """Dense data-parallel size DP = W / (TP*CP*PP) (integer division; validity is checked elsewhere)."""
        return world_size // (self.tp * self.cp * self.pp)

    def edp(self, world_size: int) -> int:
        """Expert data-parallel size EDP = W / (ETP*EP*PP)."""
        return world_size // (self.expert_tp * self.ep * self.pp)

    def short(self) -> str:
        s = f"TP{self.tp} PP{self.pp}"
        if self.vpp and self.vpp > 1:
            s += f" VPP{self.vpp}"
        s += f" CP{self.cp} EP{self.ep} ETP{self.expert_tp}"
        return s

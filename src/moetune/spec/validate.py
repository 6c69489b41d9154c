"""Is a parallel layout legal for a model, a world size and a batch shape? (Megatron-Core / Bridge rules.)

Every check names the rule of docs/rules.md §2 it implements and the Megatron source that enforces it:

* PAR-001 ``W % (TP·CP·PP)`` and PAR-002 ``W % (ETP·EP·PP)`` — ``parallel_state.initialize_model_parallel``.
* PAR-019 heads % TP, PAR-020 query groups a multiple *or a divisor* of TP — ``TransformerConfig.__post_init__``.
* PAR-021 gated-DeltaNet heads % (TP·CP) — ``TransformerConfig.__post_init__``.
* Mamba heads / groups % TP — ``megatron/core/ssm/mamba_mixer.py`` (``MambaMixer.__init__`` asserts); under CP,
  heads/TP % CP and groups/TP a multiple or divisor of CP — ``megatron/core/ssm/mamba_context_parallel.py``
  (``MambaContextParallel.__init__`` asserts).
* PAR-022 dense / shared-expert widths % TP, PAR-023 expert width % ETP — ``megatron/core/utils.py::divide`` in the
  TE linear constructors.
* PAR-024 experts % EP (``BaseMoELayer.__init__``), PAR-025 EP needs experts (``TransformerConfig``).
* PAR-006, PAR-026..PAR-033 pipeline split — :mod:`moetune.spec.pipeline` (``get_num_layers_to_build``,
  ``PipelineParallelLayerLayout``). PAR-034 Bridge hybrid (Mamba) models reject VPP (``HybridModelProvider.provide``).
* PAR-014 ``s % (2·CP)`` (Bridge ``ConfigContainer.validate``); PAR-018 SP: ``(s/CP) % TP``
  (``tensor_parallel/mappings.py::_split_along_first_dim``); PAR-046 MoE with TP > 1 needs SP
  (``MoELayer.forward``).
* PAR-035 ``GBS % (MBS·DP)`` with the dense DP (``ConstantNumMicroBatchesCalculator``); PAR-037/038 the interleaved
  schedule needs ``m >= PP`` and ``m % PP == 0`` with the default ``microbatch_group_size_per_vp_stage = PP``
  (``schedules.forward_backward_pipelining_with_interleaving``).

Minimum world size: ``PP · lcm(TP·CP, ETP·EP)`` — the smallest W meeting PAR-001 and PAR-002 (PAR-004, TOPO-008).

The planner calls :func:`layout_violation` for very many candidates: it works on plain ints and raises nothing.
"""

from __future__ import annotations

from math import lcm
from typing import TYPE_CHECKING

from moetune.errors import LayoutError
from moetune.spec.pipeline import layout_vpp, stage_strings

if TYPE_CHECKING:
    from moetune.spec.job import Job
    from moetune.spec.layout import Layout
    from moetune.spec.model import ModelArch


def min_world_size(layout: Layout) -> int:
    """Smallest GPU count for a layout: ``PP · lcm(TP·CP, ETP·EP)`` (PAR-004; not ``PP·max(...)``, TOPO-008)."""
    return min_world_size_of(layout.tp, layout.cp, layout.pp, layout.ep, layout.expert_tp)


def min_world_size_of(tp: int, cp: int, pp: int, ep: int, etp: int) -> int:
    """:func:`min_world_size` on plain ints (ETP already resolved)."""
    return pp * lcm(tp * cp, etp * ep)


def world_size_violation(tp: int, cp: int, pp: int, ep: int, etp: int, w: int) -> str | None:
    """PAR-001 / PAR-002 on plain ints (ETP already resolved)."""
    if w <= 0:
        return f"gpus={w}: expected a positive world size"
    mp = tp * cp * pp
    if w % mp:
        return (
            f"world size {w} is not divisible by TP*CP*PP = {tp}*{cp}*{pp} = {mp} (PAR-001);"
            f" minimum world size is PP*lcm(TP*CP, ETP*EP) = {min_world_size_of(tp, cp, pp, ep, etp)}"
        )
    emp = etp * ep * pp
    if w % emp:
        return (
            f"world size {w} is not divisible by ETP*EP*PP = {etp}*{ep}*{pp} = {emp} (PAR-002);"
            f" minimum world size is PP*lcm(TP*CP, ETP*EP) = {min_world_size_of(tp, cp, pp, ep, etp)}"
        )
    return None


def _seq_violation(tp: int, cp: int, seq_length: int, sequence_parallel: bool | None) -> str | None:
    """PAR-014 ``s % (2·CP)`` and PAR-018 ``(s/CP) % TP`` with sequence parallelism."""
    if cp > 1 and seq_length % (2 * cp):
        return f"seq_length={seq_length} is not divisible by 2*CP={2 * cp} (PAR-014)"
    if sequence_parallel and tp > 1 and (seq_length // cp) % tp:
        return f"sequence parallel: seq_length/CP={seq_length // cp} is not divisible by TP={tp} (PAR-018)"
    return None


def _batch_violation(dp: int, pp: int, vpp: int, gbs: int, mbs: int) -> str | None:
    """PAR-035 (GBS vs MBS*DP, dense DP) and PAR-037/038 (interleaved schedule vs microbatches)."""
    if gbs % (mbs * dp):
        return f"global_batch_size={gbs} is not divisible by micro_batch_size*DP = {mbs}*{dp} = {mbs * dp} (PAR-035)"
    nmb = gbs // (mbs * dp)
    if vpp > 1 and pp > 1:
        if nmb < pp:
            return f"interleaved pipeline: {nmb} microbatches < PP={pp} (PAR-037)"
        if nmb % pp:
            return f"interleaved pipeline: {nmb} microbatches not a multiple of PP={pp} (PAR-038)"
    return None


def layout_violation_without_model(
    layout: Layout,
    gpus: int,
    *,
    global_batch_size: int | None = None,
    micro_batch_size: int | None = None,
    seq_length: int | None = None,
    sequence_parallel: bool | None = None,
) -> str | None:
    """The model-independent subset: world size (PAR-001/002), VPP needs PP > 1 (PAR-006), layout stages % PP
    (PAR-031), sequence vs CP / SP (PAR-014/018) and the batch rules (PAR-035/037/038)."""
    tp, pp, cp, ep, etp = layout.tp, layout.pp, layout.cp, layout.ep, layout.expert_tp
    msg = world_size_violation(tp, cp, pp, ep, etp, gpus)
    if msg:
        return msg
    if seq_length is not None:
        msg = _seq_violation(tp, cp, seq_length, sequence_parallel)
        if msg:
            return msg
    if layout.pipeline_layout is not None:
        try:
            vpp = layout_vpp(layout.pipeline_layout, pp)
        except LayoutError as exc:
            return str(exc)
        if layout.vpp is not None and layout.vpp != vpp:
            return f"virtual_pipeline_model_parallel_size={layout.vpp} but the layout gives {vpp} (PAR-031)"
    else:
        vpp = layout.vpp or 1
    if vpp > 1 and pp <= 1:
        return f"virtual_pipeline_model_parallel_size={vpp} needs pipeline_model_parallel_size > 1 (PAR-006)"
    if global_batch_size is not None:
        return _batch_violation(gpus // (tp * cp * pp), pp, vpp, global_batch_size, micro_batch_size or 1)
    return None


def layout_violation(
    model: ModelArch,
    layout: Layout,
    gpus: int,
    *,
    global_batch_size: int | None = None,
    micro_batch_size: int | None = None,
    seq_length: int | None = None,
    sequence_parallel: bool | None = None,
) -> str | None:
    """The first violated constraint as a one-line message, or None when the layout is legal.

    Optional arguments left as None skip the checks that need them.
    """
    tp, pp, cp, ep = layout.tp, layout.pp, layout.cp, layout.ep
    etp = layout.expert_tp
    w = gpus
    msg = world_size_violation(tp, cp, pp, ep, etp, w)
    if msg:
        return msg
    # --- attention heads vs TP / CP -----------------------------------------------------------------------
    heads = model.num_attention_heads
    if heads % tp:
        return f"num_attention_heads={heads} is not divisible by TP={tp} (PAR-019)"
    nq = model.num_query_groups or heads
    if nq % tp and tp % nq:
        return f"num_query_groups={nq} is neither a multiple nor a divisor of TP={tp} (PAR-020)"
    mixers = model.mixer_pattern
    if "G" in mixers:
        kh, vh = model.linear_num_key_heads, model.linear_num_value_heads
        if kh and kh % (tp * cp):
            return f"linear_num_key_heads={kh} is not divisible by TP*CP={tp * cp} (PAR-021)"
        if vh and vh % (tp * cp):
            return f"linear_num_value_heads={vh} is not divisible by TP*CP={tp * cp} (PAR-021)"
        if kh and vh and vh % kh:
            return f"linear_num_value_heads={vh} is not divisible by linear_num_key_heads={kh} (PAR-021)"
    if "M" in mixers:
        if model.mamba_num_heads and model.mamba_num_heads % tp:
            return f"mamba_num_heads={model.mamba_num_heads} is not divisible by TP={tp} (mamba_mixer.py)"
        if model.mamba_num_groups and model.mamba_num_groups % tp:
            return f"mamba_num_groups={model.mamba_num_groups} is not divisible by TP={tp} (mamba_mixer.py)"
        if cp > 1 and model.mamba_num_heads and (model.mamba_num_heads // tp) % cp:
            return (f"mamba_num_heads/TP={model.mamba_num_heads // tp} is not divisible by CP={cp} "
                    "(mamba_context_parallel.py)")
        ng = (model.mamba_num_groups or 0) // tp
        if cp > 1 and ng and (cp % ng if ng < cp else ng % cp):
            return (f"mamba_num_groups/TP={ng} and CP={cp}: neither divides the other (mamba_context_parallel.py)")
        if layout.vpp is not None and layout.vpp > 1:
            return f"virtual pipeline (VPP={layout.vpp}) is not supported for hybrid Mamba models in Bridge (PAR-034)"
    # --- MLP widths ----------------------------------------------------------------------------------------
    if "D" in model.mlp_pattern and model.ffn_hidden_size % tp:
        return f"ffn_hidden_size={model.ffn_hidden_size} is not divisible by TP={tp} (PAR-022)"
    experts = model.num_moe_experts if "E" in model.mlp_pattern else None
    if experts:
        sh = model.moe_shared_expert_intermediate_size
        if sh and sh % tp:
            return f"moe_shared_expert_intermediate_size={sh} is not divisible by TP={tp} (PAR-022)"
        fm = model.moe_ffn_hidden_size or model.ffn_hidden_size
        if fm % etp:
            return f"moe_ffn_hidden_size={fm} is not divisible by ETP={etp} (PAR-023)"
        if experts % ep:
            return f"num_moe_experts={experts} is not divisible by EP={ep} (PAR-024)"
    elif ep > 1:
        return f"EP={ep} needs a MoE model; {model.name} has no routed experts (PAR-025)"
    # --- pipeline split ------------------------------------------------------------------------------------
    try:
        stages = stage_strings(model, layout)
    except LayoutError as exc:
        return str(exc)
    vpp = len(stages) // pp
    # --- sequence ------------------------------------------------------------------------------------------
    if seq_length is not None:
        msg = _seq_violation(tp, cp, seq_length, sequence_parallel)
        if msg:
            return msg
    if sequence_parallel is False and experts and tp > 1:
        return f"MoE with TP={tp} requires sequence_parallel=True (PAR-046)"
    if global_batch_size is not None:
        return _batch_violation(w // (tp * cp * pp), pp, vpp, global_batch_size, micro_batch_size or 1)
    return None


def batch_violation(model: ModelArch, layout: Layout, gpus: int, global_batch_size: int,
                    micro_batch_size: int) -> str | None:
    """What :func:`layout_violation` with this batch returns for a layout that it accepts without one: its batch
    rules alone (PAR-035/037/038), every other check having passed. For the planner's enumeration, which validates
    a layout once and then each microbatch size (tests/test_plan_space.py compares both)."""
    pp = layout.pp
    vpp = len(stage_strings(model, layout)) // pp
    return _batch_violation(gpus // (layout.tp * layout.cp * pp), pp, vpp, global_batch_size, micro_batch_size)


def validate_layout(
    model: ModelArch,
    layout: Layout,
    gpus: int,
    *,
    global_batch_size: int | None = None,
    micro_batch_size: int | None = None,
    seq_length: int | None = None,
    sequence_parallel: bool | None = None,
) -> None:
    """Raise :class:`LayoutError` naming the first violated constraint (see :func:`layout_violation`)."""
    msg = layout_violation(
        model,
        layout,
        gpus,
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        seq_length=seq_length,
        sequence_parallel=sequence_parallel,
    )
    if msg is not None:
        raise LayoutError(f"{layout.short()} on {gpus} GPUs: {msg}", field="layout")


def validate_job(job: Job) -> None:
    """:func:`validate_layout` for a whole job (batch shape and SP from the job; Bridge forces SP off at TP1)."""
    validate_layout(
        job.model,
        job.layout,
        job.gpus,
        global_batch_size=job.global_batch_size,
        micro_batch_size=job.micro_batch_size,
        seq_length=job.seq_length,
        sequence_parallel=job.features.sequence_parallel and job.layout.tp > 1,
    )

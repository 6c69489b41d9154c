"""The planner's search space: layouts (TP, CP, PP, VPP / pipeline layout, EP, ETP, MBS) and feature variants.

Enumeration walks plain integers and generates only the divisor combinations of the two meshes; each point is
then confirmed by :func:`moetune.spec.validate.layout_violation` (the PAR rules of docs/rules.md §2, one
implementation); the remaining rules run on the built Job through :mod:`moetune.rules`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from moetune.perfmodel.balance import balanced_layout, stage_weights
from moetune.spec.layout import Layout
from moetune.spec.model import ModelArch
from moetune.spec.system import System
from moetune.spec.validate import batch_violation, layout_violation

#: recompute ladder in the workflow's order (docs/domain.md §6.4: narrowest boundary first, full recompute last).
#: Each entry is (granularity, modules). Modules that do not apply to the model are dropped when the ladder is built.
SELECTIVE_LADDER: tuple[tuple[str, ...], ...] = (
    ("mla_up_proj",),
    ("moe_act",),
    ("mla_up_proj", "moe_act"),
    ("moe_act", "layernorm"),
    ("mla_up_proj", "moe_act", "layernorm"),
    ("mla_up_proj", "moe_act", "layernorm", "mlp"),
    ("core_attn", "moe_act", "layernorm", "mlp"),
    ("moe",),
    ("mla_up_proj", "moe", "layernorm", "mlp"),
)


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    small, large = [], []
    for d in range(1, int(math.isqrt(n)) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]


@dataclass(frozen=True)
class LayoutPoint:
    """One layout of the search, as plain ints (``vpp`` 1 = not interleaved; ``pipeline_layout`` may be None)."""

    tp: int
    cp: int
    pp: int
    vpp: int
    ep: int
    etp: int
    mbs: int
    dp: int
    edp: int
    pipeline_layout: str | None = None

    @property
    def model_parallel(self) -> int:
        """Size of the model-parallel footprint used to prefer 'the smallest model parallelism' (S:wf)."""
        return self.tp * self.cp * self.pp * self.ep * self.etp

    def key(self) -> tuple:
        return (self.tp, self.cp, self.pp, self.vpp, self.ep, self.etp, self.mbs, self.pipeline_layout or "")


@dataclass
class SpaceLimits:
    """Bounds of the enumerated space; each bound is documented where it prunes (and ``--fix`` lifts it)."""

    max_tp: int | None = None  # default: NVLink domain (TP across NVLink is never competitive: D:pg, S:par)
    max_cp: int | None = None  # default: so that each CP shard keeps >= 1024 tokens (S:lc)
    mbs_options: tuple[int, ...] = (1, 2, 4)
    vpp_options: tuple[int, ...] | None = None  # default: all divisors of layers/PP up to 8
    fix: dict[str, int | str] = field(default_factory=dict)


def _pick(name: str, options: list[int], fix: dict) -> list[int]:
    if name in fix:
        v = int(fix[name])
        return [v]
    return options


def enumerate_layouts(model: ModelArch, system: System, gpus: int, gbs: int, seq: int,
                      limits: SpaceLimits | None = None,
                      keep: Callable[[tuple[int, int, int, int]], bool] | None = None) -> Iterator[LayoutPoint]:
    """Every layout Megatron accepts for this model, world size and batch (docs/rules.md PAR-001..PAR-038): the
    points of :func:`enumerate_meshes`, in its order."""
    for _, points in enumerate_meshes(model, system, gpus, gbs, seq, limits, keep):
        yield from points


def enumerate_meshes(model: ModelArch, system: System, gpus: int, gbs: int, seq: int,
                     limits: SpaceLimits | None = None,
                     keep: Callable[[tuple[int, int, int, int]], bool] | None = None
                     ) -> Iterator[tuple[Layout, list[LayoutPoint]]]:
    """Every layout Megatron accepts for this model, world size and batch (docs/rules.md PAR-001..PAR-038), one mesh
    and pipeline split at a time: its validated :class:`~moetune.spec.layout.Layout` (the one ``Layout(tp=, pp=,
    vpp=, pipeline_layout=, cp=, ep=, etp=)`` of its points) and its accepted points, one per microbatch size.

    ``keep((tp, cp, ep, etp))``, when given, is asked before the layouts of that group at each pipeline split are
    built and validated: only the groups it keeps are enumerated (a share of the parallel search, whose validation
    of the other shares' layouts would be wasted).

    Dense mesh TP·CP·DP·PP = W, expert mesh ETP·EP·EDP·PP = W (Parallel Folding, docs/domain.md §2.4); heads and
    query groups divisible by TP; experts divisible by EP; seq divisible by 2·CP (and by TP with SP); GBS divisible
    by MBS·DP; decoder layers split over PP·VPP stages, uniformly or with a generated uneven layout string.
    """
    lim = limits or SpaceLimits()
    fix = lim.fix
    heads, groups = model.num_attention_heads, model.query_groups
    max_tp = lim.max_tp or system.nvlink_domain
    tps = [t for t in divisors(math.gcd(heads, groups)) if t <= max_tp and seq % t == 0]
    min_shard = 1024
    max_cp = lim.max_cp or max(1, seq // min_shard)
    cps = [c for c in (1, 2, 4, 8, 16, 32, 64) if c <= max_cp and seq % (2 * c) == 0 or c == 1]
    experts = model.num_moe_experts or 1
    eps = divisors(experts) if model.is_moe else [1]
    mbs_opts = list(lim.mbs_options)
    weights = stage_weights(model, seq)
    for tp in _pick("tp", tps, fix):
        for cp in _pick("cp", cps, fix):
            if gpus % (tp * cp):
                continue
            for pp in _pick("pp", divisors(gpus // (tp * cp)), fix):
                if pp > model.num_layers or (gpus // (tp * cp)) % pp:
                    continue  # a pinned PP must still divide the world left after TP x CP
                dp = gpus // (tp * cp * pp)
                stage_world = gpus // pp
                vpp_opts = [1] if pp == 1 else (
                    list(lim.vpp_options) if lim.vpp_options else
                    [v for v in (1, 2, 3, 4, 5, 6, 8) if v * pp <= model.num_layers])
                for vpp in _pick("vpp", vpp_opts, fix):
                    stages = pp * vpp
                    if stages > 1 and model.num_layers < stages - 2:
                        continue
                    layout_str = None
                    if stages > 1:
                        if "pipeline_layout" in fix:
                            layout_str = str(fix["pipeline_layout"])
                        else:
                            layout_str = balanced_layout(model.num_layers, stages, model.mtp_num_layers,
                                                         pp=pp, layer_weights=weights[0],
                                                         mtp_weight=weights[1], loss_weight=weights[2],
                                                         embedding_weight=0.0)
                            if layout_str is None and model.num_layers % stages:
                                continue
                    # biased expert linears need ETP 1 (MOE-005; TransformerConfig.__post_init__)
                    etps = ([1] if model.add_bias_linear else sorted({1, tp})) if model.is_moe else [tp]
                    for etp in _pick("etp", etps, fix):
                        for ep in _pick("ep", eps, fix):
                            if stage_world % (etp * ep):
                                continue
                            if model.is_moe and experts % ep:
                                continue
                            if keep is not None and not keep((tp, cp, ep, etp)):
                                continue
                            edp = stage_world // (etp * ep)
                            lay = legal = None
                            points = []
                            for mbs in _pick("mbs", mbs_opts, fix):
                                if gbs % (mbs * dp):
                                    continue
                                # the full PAR rule set (one implementation: moetune.spec.validate), the layout's
                                # rules once, then the batch rules of each MBS (batch_violation: the same answer)
                                if lay is None:
                                    lay = Layout(tp=tp, pp=pp, vpp=vpp if vpp > 1 else None,
                                                 pipeline_layout=layout_str, cp=cp, ep=ep, etp=etp)
                                    legal = layout_violation(model, lay, gpus, seq_length=seq,
                                                             sequence_parallel=tp > 1) is None
                                if not legal or batch_violation(model, lay, gpus, gbs, mbs) is not None:
                                    continue
                                points.append(LayoutPoint(tp, cp, pp, vpp, ep, etp, mbs, dp, edp, layout_str))
                            if points:
                                yield lay, points

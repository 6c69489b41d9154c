"""Rank → process-group mapping in Megatron-Core's default order and the NVLink-domain crossing report.

Source: ``megatron/core/parallel_state.py`` — ``initialize_model_parallel(order="tp-cp-ep-dp-pp")`` builds two
``RankGenerator``s over ``generate_masked_orthogonal_rank_groups`` (the leftmost token varies fastest):

* dense (decoder) generator ``tp-cp-ep-dp-pp`` with EP = 1:  ``rank = tp + TP·(cp + CP·(dp + DP·pp))``;
* expert generator with CP = 1, TP → ETP, DP → EDP:           ``rank = etp + ETP·(ep + EP·(edp + EDP·pp))``.

A group of one kind holds the ranks that differ only in that coordinate (``get_ranks("tp")`` …). The same group
list can be read off a C-ordered array ``arange(W).reshape(PP, DP, CP, TP)`` by moving the group's axis last
(docs/rules.md TOPO-001/003).

NVLink crossing (TOPO-004): with ranks packed ``G`` per NVLink domain (Megatron expects "adjacent ranks on the same
box"), a group stays inside a domain iff ``r // G`` is equal for all its ranks. Closed form used by the planner
(:func:`group_stays_in_domain`): every group of a kind is a set ``{b + t + i·S}`` inside an aligned block of ``B``
consecutive ranks (TP: S=1, B=TP; CP: S=TP, B=TP·CP; DP: S=TP·CP, B=W/PP; PP: S=W/PP, B=W; ETP: S=1, B=ETP;
EP: S=ETP, B=ETP·EP; EDP: S=ETP·EP, B=W/PP). If a domain boundary falls strictly inside a block, the group starting
at the block's first offset that reaches over the boundary crosses it, so *all* groups of the kind stay inside iff
the group size is 1, or ``W ≤ G``, or ``G % B == 0``. The enumeration and the closed form are tested to agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from typing import TYPE_CHECKING, Literal

from moetune.errors import LayoutError

if TYPE_CHECKING:
    import numpy as np

    from moetune.spec.layout import Layout

GroupKind = Literal["tp", "cp", "dp", "pp", "etp", "ep", "edp"]

#: kinds whose crossing is a performance warning (docs/rules.md TOPO-005..007) vs. informational (TOPO-004)
HOT_KINDS: tuple[GroupKind, ...] = ("tp", "cp", "ep", "etp")
INFO_KINDS: tuple[GroupKind, ...] = ("dp", "edp", "pp")
ALL_KINDS: tuple[GroupKind, ...] = HOT_KINDS + INFO_KINDS

_RULE = {"tp": "TOPO-005", "etp": "TOPO-005", "ep": "TOPO-006", "cp": "TOPO-007",
         "dp": "TOPO-004", "edp": "TOPO-004", "pp": "TOPO-004"}
_WHAT = {
    "tp": "tensor-parallel all-gather/reduce-scatter every layer leaves NVLink",
    "etp": "expert tensor-parallel collectives leave NVLink",
    "ep": "MoE token dispatch/combine all-to-all goes over the scale-out network",
    "cp": "context-parallel KV exchange goes over the scale-out network",
    "dp": "gradient reduce-scatter / param all-gather spans domains (expected at scale)",
    "edp": "expert gradient reduce-scatter spans domains (expected at scale)",
    "pp": "pipeline send/recv spans domains (expected)",
}


@dataclass(frozen=True, slots=True)
class GroupCrossing:
    """One group kind whose groups leave an NVLink domain."""

    kind: GroupKind
    group_size: int
    num_groups: int
    num_crossing: int  #: groups of this kind that span more than one domain
    max_domains_spanned: int  #: most domains one group touches (e.g. moe_router_num_groups for node-limited routing)
    example: list[int] = field(default_factory=list)  #: ranks of the first crossing group
    severity: Literal["warning", "info"] = "info"
    rule: str = ""
    note: str = ""


def _sizes(layout: Layout, world_size: int) -> dict[str, int]:
    return {
        "tp": layout.tp,
        "cp": layout.cp,
        "pp": layout.pp,
        "dp": world_size // (layout.tp * layout.cp * layout.pp),
        "etp": layout.expert_tp,
        "ep": layout.ep,
        "edp": world_size // (layout.expert_tp * layout.ep * layout.pp),
    }


def dense_rank(tp: int, cp: int, dp: int, pp: int, layout: Layout, world_size: int) -> int:
    """Global rank of dense coordinates: ``tp + TP·(cp + CP·(dp + DP·pp))`` (order tp-cp-ep-dp-pp)."""
    s = _sizes(layout, world_size)
    return tp + s["tp"] * (cp + s["cp"] * (dp + s["dp"] * pp))


def expert_rank(etp: int, ep: int, edp: int, pp: int, layout: Layout, world_size: int) -> int:
    """Global rank of expert coordinates: ``etp + ETP·(ep + EP·(edp + EDP·pp))``."""
    s = _sizes(layout, world_size)
    return etp + s["etp"] * (ep + s["ep"] * (edp + s["edp"] * pp))


DEFAULT_ORDER = "tp-cp-ep-dp-pp"
#: Bridge ``dist.use_tp_pp_dp_mapping=True`` (docs/rules.md TOPO-002)
TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"
ORDERS = (DEFAULT_ORDER, TP_PP_DP_ORDER)


def _check_order(order: str, layout: Layout, world_size: int | None) -> None:
    if order not in ORDERS:
        raise LayoutError(f"rank order {order!r}: expected one of {', '.join(ORDERS)}")
    if (
        order == TP_PP_DP_ORDER
        and layout.pp > 1
        and layout.tp * layout.cp != layout.expert_tp * layout.ep
    ):
        raise LayoutError(
            f"order {order} with PP={layout.pp} needs TP*CP == ETP*EP (dense and expert PP groups must coincide,"
            f" PAR-005); got {layout.tp * layout.cp} vs {layout.expert_tp * layout.ep}"
        )


def group_lists(kind: GroupKind, layout: Layout, world_size: int, order: str = DEFAULT_ORDER) -> list[list[int]]:
    """All groups of one kind, each an ascending list of ranks, in ``RankGenerator.get_ranks`` order (pure Python:
    ``moetune layout`` needs no numpy).

    ``order`` is Megatron's rank order: the default ``tp-cp-ep-dp-pp`` or ``tp-cp-ep-pp-dp``. PP groups come
    from the dense generator (they coincide with the expert generator's in every legal configuration). The groups
    are the rows of ``arange(W).reshape(dims)`` with the group's axis moved last (module docstring).
    """
    _check_order(order, layout, world_size)
    s = _sizes(layout, world_size)
    if s["tp"] * s["cp"] * s["dp"] * s["pp"] != world_size or s["etp"] * s["ep"] * s["edp"] * s["pp"] != world_size:
        raise LayoutError(
            f"world size {world_size} is not divisible by TP*CP*PP = {s['tp'] * s['cp'] * s['pp']} and"
            f" ETP*EP*PP = {s['etp'] * s['ep'] * s['pp']} (PAR-001/PAR-002)"
        )
    pp_last = order == DEFAULT_ORDER
    if kind in ("tp", "cp", "dp", "pp"):
        names = ("pp", "dp", "cp", "tp") if pp_last else ("dp", "pp", "cp", "tp")  # C order, slowest first
    elif kind in ("etp", "ep", "edp"):
        names = ("pp", "edp", "ep", "etp") if pp_last else ("edp", "pp", "ep", "etp")
    else:
        raise ValueError(f"unknown group kind {kind!r}; expected one of {ALL_KINDS}")
    dims = [s[n] for n in names]
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    axis = names.index(kind)
    size, step = dims[axis], strides[axis]
    others = [i for i in range(len(dims)) if i != axis]
    out: list[list[int]] = []
    for idx in product(*(range(dims[i]) for i in others)):
        base = sum(j * strides[i] for i, j in zip(others, idx, strict=True))
        out.append(list(range(base, base + size * step, step)))
    return out


def rank_groups(kind: GroupKind, layout: Layout, world_size: int, order: str = DEFAULT_ORDER) -> np.ndarray:
    """:func:`group_lists` as an int array ``[num_groups, group_size]``."""
    import numpy as np

    return np.array(group_lists(kind, layout, world_size, order), dtype=np.int64)


def _block(kind: GroupKind, layout: Layout, world_size: int | None, order: str = DEFAULT_ORDER) -> tuple[int, int]:
    """(group size, aligned block size B) of a group kind (module docstring; TOPO-001/002)."""
    tp, cp, pp, ep, etp = layout.tp, layout.cp, layout.pp, layout.ep, layout.expert_tp
    if kind == "tp":
        return tp, tp
    if kind == "cp":
        return cp, tp * cp
    if kind == "etp":
        return etp, etp
    if kind == "ep":
        return ep, etp * ep
    pp_last = order == DEFAULT_ORDER
    if kind == "pp" and not pp_last:
        return pp, tp * cp * pp
    if world_size is None:
        raise ValueError(f"group kind {kind!r} needs the world size")
    if kind == "dp":
        return world_size // (tp * cp * pp), (world_size // pp if pp_last else world_size)
    if kind == "edp":
        return world_size // (etp * ep * pp), (world_size // pp if pp_last else world_size)
    if kind == "pp":
        return pp, world_size
    raise ValueError(f"unknown group kind {kind!r}; expected one of {ALL_KINDS}")


def group_stays_in_domain(
    kind: GroupKind, layout: Layout, domain: int, world_size: int | None = None, order: str = DEFAULT_ORDER
) -> bool:
    """True iff every group of ``kind`` lies inside one NVLink domain of ``domain`` GPUs (closed form, O(1)).

    ``world_size`` None means "more than one domain" (W > G); it is required for dp / edp (and pp in the
    default order).
    """
    size, block = _block(kind, layout, world_size, order)
    if size == 1:
        return True
    if world_size is not None and world_size <= domain:
        return True
    return domain % block == 0


def groups_crossing_nvlink(
    layout: Layout,
    world_size: int,
    nvlink_domain: int,
    kinds: tuple[GroupKind, ...] = ALL_KINDS,
    order: str = DEFAULT_ORDER,
) -> list[GroupCrossing]:
    """Every group kind (TP, CP, EP, ETP as warnings; DP, EDP, PP informational) with groups spanning domains.

    Enumerates the groups (:func:`group_lists`) and tests ``r // nvlink_domain`` per group (TOPO-004). Pass the
    number of ranks the job really places per domain as ``nvlink_domain`` when it is fewer than the domain holds
    (e.g. 64 of an NVL72 rack).
    """
    out: list[GroupCrossing] = []
    for kind in kinds:
        groups = group_lists(kind, layout, world_size, order)
        if len(groups[0]) == 1:
            continue
        # rows are ascending: a group crosses iff its first and last ranks lie in different domains, and the
        # distinct domains it touches = 1 + number of domain changes along the row
        crossing = [g for g in groups if g[0] // nvlink_domain != g[-1] // nvlink_domain]
        if not crossing:
            continue
        spans = 1 + max(sum(a // nvlink_domain != b // nvlink_domain for a, b in zip(g, g[1:], strict=False))
                        for g in crossing)
        out.append(
            GroupCrossing(
                kind=kind,
                group_size=len(groups[0]),
                num_groups=len(groups),
                num_crossing=len(crossing),
                max_domains_spanned=spans,
                example=list(crossing[0]),
                severity="warning" if kind in HOT_KINDS else "info",
                rule=_RULE[kind],
                note=_WHAT[kind],
            )
        )
    return out

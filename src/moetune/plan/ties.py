"""Ranking within the model's noise: distinct layouts, near-duplicates folded, ties with #1.

The step-time model is wrong by a class-dependent amount (:mod:`moetune.perfmodel.uncertainty`: the band that held
80 % of the held-out published runs). Two candidates whose bands overlap cannot be told apart by the model: the
planner calls them *ties* and says "within noise" instead of "#1 beats #2 by 0.1 %". Candidates that differ only in
the virtual pipeline size or the micro-batch size (near-duplicates: the same meshes, the same memory regime) are
folded into one line that shows the range of their step times; the line's representative is its fastest member.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def layout_key(c: Any) -> tuple:
    """What makes two candidates distinct layouts: everything in the layout but VPP and MBS."""
    lp = c.layout
    return (lp.tp, lp.cp, lp.pp, lp.ep, lp.etp, bool(c.job.features.use_megatron_fsdp))


def distinct_rank(per_layout_best: dict[tuple, float], step_s: float) -> int:
    """1 + the number of distinct layouts (as :func:`layout_key` folds them: VPP, MBS and the pipeline split set
    aside) whose best step time in ``per_layout_best`` (the planner's keys ``(tp, cp, pp, vpp, ep, etp, mbs,
    pipeline_layout)``) beats ``step_s``: the line a layout of that step time would take in ``plan``'s list."""
    best: dict[tuple, float] = {}
    for k, t in per_layout_best.items():
        d = (k[0], k[1], k[2], k[4], k[5])
        if t < best.get(d, float("inf")):
            best[d] = t
    return 1 + sum(1 for t in best.values() if t < step_s - 1e-12)


@dataclass
class TieGroup:
    """Candidates of one distinct layout (ranked order kept), and whether the group ties with #1."""

    members: list[int] = field(default_factory=list)  # indexes into the ranked candidate list
    step_min_s: float = 0.0
    step_max_s: float = 0.0
    vpp: list[int] = field(default_factory=list)
    mbs: list[int] = field(default_factory=list)
    ties_first: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"members": [i + 1 for i in self.members], "step_time_range_s": [self.step_min_s, self.step_max_s],
                "vpp": self.vpp, "mbs": self.mbs, "ties_with_first": self.ties_first}


def _band(c: Any) -> tuple[float, float]:
    b = getattr(c.time, "band", None)
    t = c.time.step_time_s
    return (b.lo_s, b.hi_s) if b is not None else (t, t)


def within_noise(a: Any, b: Any) -> bool:
    """True when the prediction bands of candidates ``a`` and ``b`` overlap (the model cannot order them)."""
    (alo, ahi), (blo, bhi) = _band(a), _band(b)
    return alo <= bhi and blo <= ahi


def group_candidates(cands: list[Any]) -> list[TieGroup]:
    """Ranked candidates -> one group per distinct layout (first-seen order = rank order of its best member)."""
    groups: dict[tuple, TieGroup] = {}
    for i, c in enumerate(cands):
        g = groups.setdefault(layout_key(c), TieGroup())
        g.members.append(i)
    first = cands[0] if cands else None
    for g in groups.values():
        ts = [cands[i].time.step_time_s for i in g.members]
        g.step_min_s, g.step_max_s = min(ts), max(ts)
        g.vpp = sorted({int(cands[i].layout.vpp or 1) for i in g.members})
        g.mbs = sorted({int(cands[i].layout.mbs) for i in g.members})
        g.ties_first = first is not None and any(within_noise(first, cands[i]) for i in g.members)
    return list(groups.values())


def verdict(a: Any, b: Any) -> str:
    """How #a relates to #b in words: "within noise" when their bands overlap, else the margin."""
    if within_noise(a, b):
        return "within noise"
    gap = (b.time.step_time_s - a.time.step_time_s) / b.time.step_time_s * 100 if b.time.step_time_s else 0.0
    return f"faster by {gap:.1f} % (beyond the prediction bands)"

"""Speed of the layout math the planner calls in its inner loop, and closed-form vs enumeration agreement.

Usage: python bench/layout_speed.py   (prints a table; no assertions)
"""

from __future__ import annotations

import itertools
import time

from moetune.catalog.models import get_model
from moetune.spec.layout import Layout
from moetune.spec.pipeline import pipeline_stages
from moetune.spec.ranks import ALL_KINDS, group_stays_in_domain, groups_crossing_nvlink
from moetune.spec.validate import layout_violation, min_world_size


def _rate(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    m = get_model("DeepSeek-V3")
    ok = Layout(tp=1, pp=8, ep=32, pipeline_layout="Et*3|(tt|)*29m|L")
    bad_w = Layout(tp=2, cp=3, ep=8)
    bad_heads = Layout(tp=3, ep=8)
    rows = [
        ("Layout(...) construction (pydantic)", _rate(lambda: Layout(tp=2, pp=8, ep=64), 20000)),
        ("layout_violation, valid, layout string + batch", _rate(
            lambda: layout_violation(m, ok, 256, global_batch_size=4096, micro_batch_size=1, seq_length=4096), 20000)),
        ("layout_violation, world size error", _rate(lambda: layout_violation(m, bad_w, 256), 20000)),
        ("layout_violation, heads error", _rate(lambda: layout_violation(m, bad_heads, 24), 20000)),
        ("min_world_size", _rate(lambda: min_world_size(ok), 50000)),
        ("group_stays_in_domain (ep)", _rate(lambda: group_stays_in_domain("ep", ok, 72, 256), 50000)),
        ("pipeline_stages DSV3 PP8 VPP4", _rate(lambda: pipeline_stages(m, ok), 2000)),
        ("groups_crossing_nvlink W=256 (all kinds)", _rate(lambda: groups_crossing_nvlink(ok, 256, 72), 200)),
        ("groups_crossing_nvlink W=4096 (all kinds)", _rate(lambda: groups_crossing_nvlink(
            Layout(tp=2, pp=16, ep=64), 4096, 8), 20)),
    ]
    print(f"{'operation':<50} {'us/call':>10}")
    print("-" * 61)
    for name, us in rows:
        print(f"{name:<50} {us:>10.2f}")

    # closed form vs enumeration over a grid of layouts, world sizes and domains
    checked = disagree = 0
    for tp, cp, pp, ep, etp, mult, dom in itertools.product(
        (1, 2, 3, 4, 8, 16), (1, 2, 3), (1, 2, 4), (1, 2, 4, 6, 8, 16, 64), (None, 1, 2), (1, 2, 3), (8, 36, 72)
    ):
        lay = Layout(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp)
        w = min_world_size(lay) * mult
        if w > 2048:
            continue
        crossing = {c.kind for c in groups_crossing_nvlink(lay, w, dom)}
        for kind in ALL_KINDS:
            checked += 1
            disagree += group_stays_in_domain(kind, lay, dom, w) == (kind in crossing)
    print()
    print(f"{'closed form vs enumeration':<50} {'cases':>10} {'disagree':>9}")
    print(f"{'group_stays_in_domain vs groups_crossing_nvlink':<50} {checked:>10} {disagree:>9}")


if __name__ == "__main__":
    main()

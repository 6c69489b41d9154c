"""Print the rule inventory (by area and severity) and the speed of the check API the planner calls.

Usage: python bench/check_bench.py
"""

from __future__ import annotations

import collections
import time

from moetune.catalog.recipes import list_recipes, recipe_config
from moetune.io.check import check_config, check_job
from moetune.io.config_to_job import job_from_config
from moetune.rules import Env, load_rules
from moetune.rules.engine import gpu_key


def main() -> None:
    rules = load_rules()
    table: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rules.values():
        table[r.area][r.severity] += 1
    sevs = ["error", "error(rt)", "error(env)", "warning", "info"]
    print(f"{'area':<12}" + "".join(f"{s:>11}" for s in sevs) + f"{'total':>8}")
    for area in sorted(table):
        c = table[area]
        print(f"{area:<12}" + "".join(f"{c[s]:>11}" for s in sevs) + f"{sum(c.values()):>8}")
    tot = collections.Counter()
    for c in table.values():
        tot.update(c)
    print(f"{'all':<12}" + "".join(f"{tot[s]:>11}" for s in sevs) + f"{sum(tot.values()):>8}")

    recipes = list_recipes()
    cfgs = [(recipe_config(r["name"]), Env.for_system(r["system"], gpus=r["gpus"], gpu=gpu_key(r["gpu"])))
            for r in recipes]
    t0 = time.perf_counter()
    n_err = sum(bool(check_config(c, e).errors) for c, e in cfgs)
    dt = time.perf_counter() - t0
    jobs = []
    for c, _ in cfgs[:60]:
        try:
            jobs.append(job_from_config(c))
        except Exception:  # noqa: BLE001 - architecture unknown for some recipes
            pass
    t1 = time.perf_counter()
    for j in jobs:
        check_job(j)
    dj = time.perf_counter() - t1
    print()
    print(f"{'call':<28}{'n':>6}{'ms/call':>10}")
    print(f"{'check_config (recipes)':<28}{len(cfgs):>6}{1000 * dt / len(cfgs):>10.2f}")
    print(f"{'check_job (recipe jobs)':<28}{len(jobs):>6}{1000 * dj / max(1, len(jobs)):>10.2f}")
    print(f"recipes with errors at their nominal GPU count: {n_err}")


if __name__ == "__main__":
    main()

"""Extract the Megatron-Bridge performance workload presets as they were when each release's table was published.

The published throughput rows (data/perf/mbridge_perf_calibration.csv) come from eight NeMo releases (25.11 ...
26.08). Until commit c8327cfc2 (2026-07-08, "remove legacy perf configs") the performance launcher built each run
from a ``WorkloadBaseConfig`` preset in ``scripts/performance/configs/<family>/<family>_workload_base_configs.py``
(parallelism, batch, CUDA graphs, flex dispatcher backend, EP A2A overlap, recompute, offloading), applied by
``scripts/performance/utils/overrides.py:set_workload_base_configs``. Those presets changed between releases (the
Qwen3-30B-A3B B200 preset gained HybridEP in 0ec1df783, 2026-02-27; the GB200/GB300 MXFP8 presets CuTeDSL fusion and
full-iteration graphs in 55443cbfb, 2026-06-10), so one current recipe cannot describe every release's rows.

For each release this tool finds the commit that first added the release's section (``## <release> NeMo Container``)
to ``docs/performance-summary.md`` - the configs the numbers were published with - and evaluates every preset module
at that commit: the ``WorkloadBaseConfig`` dataclass is taken from ``scripts/performance/utils/utils.py`` of the same
commit (by its AST), the preset module runs with its non-stdlib imports removed, and every module-level
``WorkloadBaseConfig`` value is recorded with the fields that differ from the dataclass defaults. The flex-dispatcher
device gate of the same commit (``src/megatron/bridge/training/flex_dispatcher_backend.py``: HybridEP on GB200/GB300
only until c0b9a0003, then on SM 8.x-10.x; DeepEP on Ampere/Hopper/B200/B300) is recorded per release, since
``apply_flex_dispatcher_backend`` silently keeps the recipe's dispatcher where the gate fails.

Releases published after the legacy presets were removed (26.08) have no entry: their rows are described by the
current flat recipes (src/moetune/catalog/recipes.json).

    python tools/extract_release_configs.py BRIDGE_GIT_DIR [OUT]   # default OUT: src/moetune/catalog/release_configs.json

BRIDGE_GIT_DIR is a clone (bare or not) of github.com/NVIDIA-NeMo/Megatron-Bridge with its history.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "moetune" / "catalog" / "release_configs.json"
RELEASES = ("25.11", "26.02", "26.02.01", "26.04", "26.04.01", "26.06", "26.06.01", "26.08")
SUMMARY = "docs/performance-summary.md"
UTILS = "scripts/performance/utils/utils.py"
FLEX = "src/megatron/bridge/training/flex_dispatcher_backend.py"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def release_commit(repo: Path, release: str) -> tuple[str, str] | None:
    """(commit, date) of the first commit whose performance summary has the release's section."""
    out = git(repo, "log", "--reverse", "--format=%H %ad", "--date=short", f"-S## {release} NeMo Container", "--",
              SUMMARY).split("\n")
    first = out[0].split() if out and out[0] else []
    return (first[0], first[1]) if first else None


def _dataclass_of(utils_src: str) -> type:
    """The ``WorkloadBaseConfig`` dataclass of a commit, from its class definition alone."""
    tree = ast.parse(utils_src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "WorkloadBaseConfig")
    mod = ast.Module(body=[cls], type_ignores=[])
    ns: dict = {"dataclass": dataclasses.dataclass, "field": dataclasses.field, **vars(typing)}
    exec(compile(mod, UTILS, "exec"), ns)  # noqa: S102 - a dataclass definition of the pinned commit
    return ns["WorkloadBaseConfig"]


def _presets(src: str, path: str, cls: type) -> dict[str, dict]:
    """Module-level pretraining presets (``*_PRETRAIN_CONFIG_*``) of a preset module, as {name: non-default
    fields}."""
    tree = ast.parse(src)
    keep = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            mod = getattr(node, "module", None) or ""
            if mod not in ("dataclasses", "typing"):
                continue
        keep.append(node)
    ns: dict = {"WorkloadBaseConfig": cls, "replace": dataclasses.replace, **vars(typing)}
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), ns)  # noqa: S102 - pinned upstream file
    defaults = cls()
    out = {}
    for name, val in ns.items():
        if isinstance(val, cls) and "_PRETRAIN_CONFIG_" in name and not name.startswith(("BASE_", "_")):
            fields = {f.name: getattr(val, f.name) for f in dataclasses.fields(cls)
                      if getattr(val, f.name) != getattr(defaults, f.name)}
            out[name] = fields
    return out


def _flex_gate(src: str) -> dict[str, str]:
    """Which GPUs ``apply_flex_dispatcher_backend`` accepts per backend at a commit (see module doc)."""
    hy = src.split('"hybridep"', 1)[1].split("else", 1)[0] if '"hybridep"' in src else ""
    return {"hybridep": "GB200,GB300" if '"NVIDIA GB200", "NVIDIA GB300"' in hy else "sm8x,sm9x,sm10x",
            "deepep": "sm8x,sm9x,B200,B300"}


def _presets_at(repo: Path, commit: str) -> dict[str, dict]:
    """Every pretraining preset of a commit ({} when the commit has no preset modules)."""
    files = [f for f in git(repo, "ls-tree", "-r", "--name-only", commit, "scripts/performance/configs").split()
             if f.endswith("_workload_base_configs.py")]
    if not files:
        return {}
    cls = _dataclass_of(git(repo, "show", f"{commit}:{UTILS}"))
    out: dict[str, dict] = {}
    for f in sorted(files):
        try:
            out.update(_presets(git(repo, "show", f"{commit}:{f}"), f, cls))
        except Exception as exc:  # noqa: BLE001 - an intermediate commit whose module does not run alone
            print(f"  {commit[:9]} {f}: skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
    return out


def extract(repo: Path) -> dict:
    """Per release: the presets at its publishing commit and, as ``earlier``, the preset versions of the commits
    since the previous release's publishing commit (newest first) that differ from those - a row whose layout no
    preset of the publishing commit has may have run one of them (see moetune.catalog.release_configs)."""
    releases: dict[str, dict] = {}
    prev = release_commit(repo, "25.09")
    for rel in RELEASES:
        found = release_commit(repo, rel)
        if found is None:
            continue
        commit, date = found
        window_start, prev = prev, found
        presets = _presets_at(repo, commit)
        if not presets:
            continue  # published with the flat recipes (after c8327cfc2)
        cls = _dataclass_of(git(repo, "show", f"{commit}:{UTILS}"))
        defaults = {f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)}
        seen = {(n, json.dumps(v, sort_keys=True)) for n, v in presets.items()}
        earlier = []
        span = f"{window_start[0]}..{commit}^" if window_start else f"{commit}^"
        for c in git(repo, "log", "--format=%H %ad", "--date=short", span, "--",
                     "scripts/performance/configs").splitlines():
            h, d = c.split()
            new = {}
            for n, v in _presets_at(repo, h).items():
                k = (n, json.dumps(v, sort_keys=True))
                if k not in seen:
                    seen.add(k)
                    new[n] = v
            if new:
                earlier.append({"commit": h, "date": d, "presets": new,
                                "flex_gate": _flex_gate(git(repo, "show", f"{h}:{FLEX}"))})
        releases[rel] = {"commit": commit, "date": date, "flex_gate": _flex_gate(git(repo, "show", f"{commit}:{FLEX}")),
                         "defaults": defaults, "presets": presets, "earlier": earlier}
    # each distinct preset once: releases map a preset name to its row of ``table``
    table: list[dict] = []
    index: dict[str, int] = {}
    for r in releases.values():
        for group in (r, *r["earlier"]):
            for name, fields in group["presets"].items():
                key = json.dumps(fields, sort_keys=True)
                if key not in index:
                    index[key] = len(table)
                    table.append(fields)
                group["presets"][name] = index[key]
    return {
        "table": table,
        "_source": "github.com/NVIDIA-NeMo/Megatron-Bridge: scripts/performance/configs/*/*_workload_base_configs.py "
                   "at the commit that first published each release's table in docs/performance-summary.md; "
                   "extracted by tools/extract_release_configs.py (fields that differ from WorkloadBaseConfig's "
                   "defaults; semantics: scripts/performance/utils/overrides.py set_workload_base_configs)",
        "releases": releases,
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    repo = Path(argv[0])
    out = Path(argv[1]) if len(argv) > 1 else OUT
    data = extract(repo)
    out.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"{'release':<10} {'commit':<12} {'date':<11} {'presets':>7} {'earlier':>7}  hybridep gate")
    for rel, r in data["releases"].items():
        n_old = sum(len(e["presets"]) for e in r["earlier"])
        print(f"{rel:<10} {r['commit'][:10]:<12} {r['date']:<11} {len(r['presets']):>7} {n_old:>7}  "
              f"{r['flex_gate']['hybridep']}")
    print(f"{len(data['table'])} distinct presets; wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The sweep directory: ``contract.yaml``, ``sweep.yaml`` (runs, phases, dependencies) and ``runs/<name>/``
(``run.sbatch``, ``launch.sh``, ``command.txt``, ``run.yaml``, ``logs/``, ``traces/``).

``--dry-run-replay REPLAY.yaml`` (explicit, never the default) makes every job copy a recorded log / golden-values
JSON / trace into its run directory instead of training, so the whole sweep machinery can run on a scheduler without
GPUs. REPLAY.yaml maps run names (``fnmatch`` patterns, first match wins) to ``{log: PATH, trace: PATH}``; relative
paths are resolved against REPLAY.yaml's folder.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import shutil
import tempfile
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from moetune.errors import InputError
from moetune.spec.layout import bridge_default_etp
from moetune.spec.validate import world_size_violation
from moetune.sweep.contract import (
    Contract,
    ContractLayout,
    Hardware,
    Launcher,
    Semantics,
    Shape,
    Versions,
    file_sha256,
    load_contract,
    screen_window,
    validate_window,
)
from moetune.sweep.launcher import entry_and_args, render_batch, render_launch, run_config, run_env, run_job
from moetune.sweep.phases import PHASES, RunSpec, generate_runs
from moetune.sweep.plan_input import Candidate, PlanInput

#: Features defaults (Megatron-Core dataclass defaults, spec/features.py) used when the plan omits a field
_FEATURE_DEFAULT_KEYS = ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "overlap_moe_expert_parallel_comm",
                         "delay_wgrad_compute", "recompute_granularity", "recompute_modules", "cuda_graph_impl",
                         "cuda_graph_scope", "moe_router_force_load_balancing", "moe_expert_capacity_factor")


def _features_with_defaults(feats: dict[str, Any]) -> dict[str, Any]:
    from moetune.spec.features import Features

    defaults = Features().model_dump(mode="json")
    out = {k: defaults[k] for k in _FEATURE_DEFAULT_KEYS}
    out.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in feats.items()})
    out.pop("precision", None)
    return out


def _model_info(model: str, arch: dict[str, Any] | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {"moe": True, "mla": False}
    from moetune.catalog.models import get_model
    from moetune.errors import MoetuneError
    from moetune.spec.model import ModelArch

    try:
        m = ModelArch.model_validate(arch) if arch else get_model(model)
        info.update(moe=m.is_moe, mla=m.multi_latent_attention, name=m.name)
    except (MoetuneError, ValueError):  # unknown model (ValueError: an architecture pydantic rejects): keep generic MoE defaults, recorded as an assumption
        info["assumption"] = f"model {model!r} not in the catalog: generic MoE retune candidates"
    return info


def build_contract(plan: PlanInput, cand: Candidate, *, opts: dict[str, Any]) -> tuple[Contract, dict[str, Any]]:
    """Freeze the contract from the plan request, the chosen candidate and the command-line options."""
    req = {**plan.request, **{k: v for k, v in opts.items() if v is not None and k in (
        "model", "system", "gpus", "global_batch_size", "seq_length", "precision")}}
    for key in ("model", "system", "gpus", "global_batch_size", "seq_length"):
        if req.get(key) in (None, ""):
            raise InputError(f"{plan.source}: no '{key}' in the plan's request; pass --{key.replace('_', '-')}")
    from moetune.catalog.systems import get_system
    from moetune.spec.features import parse_precision

    system = get_system(str(req["system"]))
    gpus = int(req["gpus"])
    precision = parse_precision(str(req.get("precision") or cand.features.get("precision") or "bf16"))
    feats = _features_with_defaults(cand.features)
    lay = cand.layout
    tp, pp, cp, ep = (int(lay.get(k) or 1) for k in ("tp", "pp", "cp", "ep"))
    etp = lay.get("etp")
    etp_eff = int(etp) if etp is not None else bridge_default_etp(tp, ep)
    if world_size_violation(tp, cp, pp, ep, etp_eff, gpus):
        raise InputError(f"candidate {cand.index}: layout {cand.label} does not divide {gpus} GPUs")
    reasons = []
    forced = bool(feats.get("moe_router_force_load_balancing"))
    data = opts.get("data") or "mock"
    if forced:
        reasons.append("forced load balancing (benchmark-only routing)")
    if data == "mock":
        reasons.append("mock data")
    cap = feats.get("moe_expert_capacity_factor")
    routing = "force-balanced" if forced else (f"capacity={cap}" if cap else "dropless")
    label = "benchmark-only" if reasons else "training-equivalent"
    launcher = Launcher(**{k: v for k, v in (opts.get("launcher") or {}).items() if v is not None})
    if launcher.framework == "megatron-bridge" and launcher.entry == "run_recipe" and not launcher.recipe:
        recipe = cand.launch.get("recipe") or cand.launch.get("bridge_recipe")
        if not recipe:  # never a placeholder written into every run script
            raise InputError(f"no Megatron-Bridge recipe is known for the chosen candidate ({cand.label}); pass "
                             "--recipe NAME (a Bridge recipe function, e.g. qwen3_30b_a3b_pretrain_config) or "
                             "--entry run_script", field="--recipe")
        launcher = launcher.model_copy(update={"recipe": recipe})
    versions = Versions(**(opts.get("versions") or {}))
    if launcher.container_image and versions.container == "unknown":
        versions = versions.model_copy(update={"container": launcher.container_image})
    env = cand.launch.get("env") if isinstance(cand.launch.get("env"), dict) else {}
    contract = Contract(
        model=str(req["model"]), model_arch=plan.model_arch,
        hardware=Hardware(system=system.name, gpu_type=system.gpu.name, gpus=gpus, gpus_per_node=system.gpus_per_node,
                          nodes=max(1, -(-gpus // system.gpus_per_node)), nvlink_domain=system.nvlink_domain),
        versions=versions, launcher=launcher,
        semantics=Semantics(label=label, data=data, routing=routing, reasons=reasons),
        precision=precision,
        shape=Shape(global_batch_size=int(req["global_batch_size"]), micro_batch_size=cand.mbs,
                    seq_length=int(req["seq_length"])),
        layout=ContractLayout(tp=tp, pp=pp, vpp=lay.get("vpp"), cp=cp, ep=ep, etp=etp, dp=gpus // (tp * cp * pp),
                              edp=gpus // (etp_eff * ep * pp), pipeline_layout=lay.get("pipeline_layout")),
        features=feats, env={str(k): str(v) for k, v in env.items()},
        screen=screen_window(opts.get("screen_warmup", 2), opts.get("screen_iters", 10)),
        validate=validate_window(opts.get("validate_steps", 50)),
        dry_run_replay=bool(opts.get("replay")),
    )
    info = _model_info(str(req["model"]), plan.model_arch)
    info["arch"] = system.gpu.arch
    return contract, info


def read_replay_map(path: Path) -> list[tuple[str, dict[str, str]]]:
    """REPLAY.yaml -> [(pattern, {log, trace})]; every named file must exist."""
    from moetune.files import read_text

    text = read_text(path, "the --dry-run-replay map (REPLAY.yaml)")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise InputError(f"{path}: expected a mapping of run-name patterns to {{log: PATH, trace: PATH}}")
    out = []
    for pat, spec in data.items():
        if isinstance(spec, str):
            spec = {"log": spec}
        if not isinstance(spec, dict) or not (spec.keys() <= {"log", "trace"}):
            raise InputError(f"{path}: entry {pat!r}: expected {{log: PATH, trace: PATH}}")
        res = {}
        for k, v in spec.items():
            if v is None:
                continue
            p = Path(str(v))
            p = p if p.is_absolute() else (path.parent / p)
            if not p.is_file():
                raise InputError(f"{path}: entry {pat!r}: {k} {p} does not exist")
            res[k] = str(p.resolve())
        out.append((str(pat), res))
    return out


def _replay_for(name: str, mapping: list[tuple[str, dict[str, str]]]) -> dict[str, str]:
    for pat, spec in mapping:
        if fnmatch.fnmatchcase(name, pat):
            return spec
    raise InputError(f"--dry-run-replay: no entry matches run {name!r} (add a pattern such as '*')")


def _dependencies(runs: list[RunSpec]) -> dict[str, tuple[str, list[str]]]:
    """run -> (afterok|afterany, [runs]): fit gates scale (it must fit); later phases wait for the previous one."""
    by_phase = {p: [r.name for r in runs if r.phase == p] for p in PHASES}
    deps: dict[str, tuple[str, list[str]]] = {}
    prev: list[str] = []
    for p in PHASES:
        kind = "afterok" if p == "scale" else "afterany"
        for r in by_phase[p]:
            deps[r] = (kind, list(prev))
        if by_phase[p]:
            prev = by_phase[p]
    return deps


def _run_manifest(run: RunSpec, contract_sha: str, launch: dict[str, Any], replay: dict[str, str] | None) -> dict:
    d = asdict(run)
    d["window"] = run.window.model_dump()
    d["contract_sha256"] = contract_sha
    d["launch"] = launch
    d["replay"] = replay
    return d


def write_run(out: Path, contract: Contract, contract_sha: str, run: RunSpec, replay: dict[str, str] | None,
              sweep_name: str, final_out: Path | None = None) -> dict[str, Any]:
    """Write one run's folder under ``out``; scripts name the run folder under ``final_out`` (where ``out`` is
    renamed to once the whole sweep is written; default ``out``)."""
    rdir = out / "runs" / run.name
    final_rdir = (final_out or out) / "runs" / run.name
    (rdir / "logs").mkdir(parents=True, exist_ok=True)
    (rdir / "traces").mkdir(parents=True, exist_ok=True)
    entry, args = entry_and_args(contract, run)
    env = run_env(contract, run)
    (rdir / "launch.sh").write_text(render_launch(contract, run))
    (rdir / "launch.sh").chmod(0o755)
    (rdir / "run.sbatch").write_text(render_batch(contract, run, sweep_name=sweep_name,
                                                  run_dir=str(final_rdir.resolve()),
                                                  replay=replay))
    cmd = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    (rdir / "command.txt").write_text(f"{cmd} python {entry} {' '.join(shlex.quote(a) for a in args)}\n")
    launch = {"entry": entry, "args": args, "env": env}
    cfg = run_config(contract, run)
    (rdir / "config.yaml").write_text(yaml.safe_dump({k: v for k, v in cfg.items() if k != "_meta"},
                                                     sort_keys=False))
    if contract.launcher.framework == "megatron-lm":
        (rdir / "megatron_args.txt").write_text(" ".join(shlex.quote(a) for a in args) + "\n")
    else:
        (rdir / "overrides.txt").write_text("\n".join(a for a in args if "=" in a and not a.startswith("-")) + "\n")
    manifest = _run_manifest(run, contract_sha, launch, replay)
    (rdir / "run.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return manifest


def _checked(contract: Contract, runs: list[RunSpec]) -> tuple[list[RunSpec], list[dict[str, Any]]]:
    """Run ``moetune check`` (``moetune.io.check.check_job``) on every run: a retune candidate the checker rejects is
    dropped with its findings; a rejected baseline stops init (nothing is written)."""
    from moetune.io.check import check_job

    kept, dropped = [], []
    for r in runs:
        errors = [f for f in check_job(run_job(contract, r)) if f.severity == "error"]
        if not errors:
            kept.append(r)
            continue
        why = [f"{f.id}: {f.message}" for f in errors]
        if r.phase == "retune" and r.variable:
            dropped.append({"name": r.name, "variable": r.variable, "change": r.change, "findings": why})
        else:
            raise InputError(f"run {r.name}: the chosen candidate fails `moetune check`: {why[0]}")
    names = {r.name for r in kept}
    for r in kept:  # a candidate whose reference was dropped compares against the phase reference
        if r.reference and r.reference not in names:
            r.reference = "retune-ref"
            r.notes.append("its intended reference was rejected by moetune check")
    return kept, dropped


def init_sweep(out: Path, plan: PlanInput, *, candidate: int = 0, opts: dict[str, Any],
               replay_map: Path | None = None, scale_candidates: int = 3) -> dict[str, Any]:
    """Create the sweep directory. Refuses a non-empty directory (nothing half written over an old sweep)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory (choose a new --out)")
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out}: directory exists and is not empty (choose a new --out)")
    if not 0 <= candidate < len(plan.candidates):
        raise InputError.bad_value("--candidate", candidate, f"0..{len(plan.candidates) - 1}")
    base = plan.candidates[candidate]
    mapping = read_replay_map(replay_map) if replay_map else None
    contract, info = build_contract(plan, base, opts={**opts, "replay": mapping is not None})
    runs = generate_runs(contract, base, [c for c in plan.candidates if c.index != candidate], info,
                         scale_candidates=scale_candidates)
    runs, dropped = _checked(contract, runs)
    replays = {r.name: _replay_for(r.name, mapping) for r in runs} if mapping else {}
    # everything is written into a hidden folder beside the target and renamed into place at the end: a failure
    # leaves nothing behind, and readers never see a half-written sweep
    anchor = out.resolve().parent
    while not anchor.is_dir():
        anchor = anchor.parent
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=anchor))
    except OSError as exc:
        raise InputError(f"{out}: cannot create the sweep folder ({exc.strerror})") from None
    try:
        sweep = _write_sweep(tmp, out, plan, candidate, contract, info, runs, dropped, replays, replay_map)
        out.resolve().parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sweep


def _write_sweep(tmp: Path, out: Path, plan: PlanInput, candidate: int, contract: Contract, info: dict[str, Any],
                 runs: list[RunSpec], dropped: list[dict[str, Any]], replays: dict[str, Any],
                 replay_map: Path | None) -> dict[str, Any]:
    (tmp / "contract.yaml").write_text(contract.to_yaml())
    sha = file_sha256(tmp / "contract.yaml")
    name = out.resolve().name
    manifests = [write_run(tmp, contract, sha, r, replays.get(r.name), name, final_out=out) for r in runs]
    deps = _dependencies(runs)
    sweep = {
        "name": name, "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": plan.source, "candidate": candidate, "contract_sha256": sha,
        "dry_run_replay": str(replay_map.resolve()) if replay_map else None,
        "model_info": info,
        "plan_candidates": [{"index": c.index, "label": c.label, "layout": c.layout, "mbs": c.mbs,
                             "features": c.features, "memory": c.memory, "time": c.time} for c in plan.candidates],
        "dropped_by_check": dropped,
        "runs": [{"name": m["name"], "phase": m["phase"], "variable": m["variable"], "reference": m["reference"],
                  "dir": f"runs/{m['name']}", "depends": {"type": deps[m["name"]][0], "on": deps[m["name"]][1]}}
                 for m in manifests],
    }
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
    return sweep


def _yaml_mapping(p: Path, what: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    from moetune.files import read_text

    try:
        data = yaml.safe_load(read_text(p, what))
    except yaml.YAMLError as exc:
        raise InputError(f"{p}: not valid YAML ({' '.join(str(exc).split())[:160]}); expected {what}") from None
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected {what} (a mapping), got {type(data).__name__}")
    missing = [k for k in required if k not in data]
    if missing:
        raise InputError(f"{p}: missing {', '.join(missing)}; expected {what}")
    return data


def load_sweep(d: Path) -> tuple[dict[str, Any], Contract]:
    if not d.is_dir():
        what = "no such directory" if not d.exists() else "not a directory"
        raise InputError(f"{d}: {what} (expected a sweep directory made by `moetune sweep init`)")
    if not (d / "sweep.yaml").is_file():
        raise InputError(f"{d}: not a sweep directory (no sweep.yaml; create one with `moetune sweep init`)")
    sweep = _yaml_mapping(d / "sweep.yaml", "the sweep's sweep.yaml", ("runs",))
    if not isinstance(sweep["runs"], list) or not all(isinstance(r, dict) and "name" in r for r in sweep["runs"]):
        raise InputError(f"{d / 'sweep.yaml'}: runs: expected a list of runs with a name each")
    return sweep, load_contract(d / "contract.yaml")


def load_run(d: Path, name: str) -> dict[str, Any]:
    p = d / "runs" / name / "run.yaml"
    if not p.is_file():
        raise InputError(f"{p}: missing run manifest")
    return _yaml_mapping(p, "a run manifest (run.yaml)", ("name", "window"))


def read_jobs(d: Path) -> dict[str, str]:
    """``jobs.json`` of a submitted sweep (run name -> Slurm job id); {} when nothing was submitted."""
    import json

    from moetune.files import read_text

    p = d / "jobs.json"
    if not p.is_file():
        return {}
    try:
        data = json.loads(read_text(p, "the sweep's jobs.json"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno}); expected run name -> job id") from None
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected an object run name -> job id, got {type(data).__name__}")
    return {str(k): str(v) for k, v in data.items()}

"""Python API of the config check: ``check_config(cfg, env)``, ``check_job(job, env)``, fix resolution."""

from __future__ import annotations

import importlib
from typing import Any

from moetune.errors import InputError, MoetuneError
from moetune.io.overrides import apply_overrides
from moetune.rules.effective import effective_config, normalize_input
from moetune.rules.engine import REGISTRY, CheckResult, Ctx, Env, Finding, Rule, evaluate

AREA_MODULES = ("values", "parallel", "topology", "moe", "overlap", "recompute", "cudagraph", "precision", "offload", "fsdp",
                "mlm")
_loaded = False


def load_rules() -> dict[str, Rule]:
    """Import every area module (registers its rules) and return the registry."""
    global _loaded
    if not _loaded:
        for name in AREA_MODULES:
            try:
                importlib.import_module(f"moetune.rules.{name}")
            except ModuleNotFoundError as e:  # an area not written yet
                if e.name != f"moetune.rules.{name}":
                    raise
        _loaded = True
    return REGISTRY


_ORDER = {s: i for i, s in enumerate(("error", "error-at-build", "error-at-first-step", "depends-on-environment",
                                      "warning", "info"))}


def check_config(cfg: dict, env: Env | None = None) -> CheckResult:
    """Replay the effective config (docs/rules.md §0.3) and evaluate every rule."""
    env = env or Env()
    rules = load_rules()
    try:
        raw = normalize_input(cfg)
        eff = effective_config(raw, env)
    except (TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError, OverflowError) as e:
        if isinstance(e, MoetuneError):
            raise
        # a value of a type the replay cannot use, in a field no type check names: still one line, exit 2
        raise InputError(f"config: a field holds a value of the wrong type ({e.__class__.__name__}: "
                         f"{' '.join(str(e).split())[:160]}); expected the Megatron-Core / Bridge field types") from None
    ctx = Ctx(eff, env, raw)
    findings = evaluate(rules.values(), ctx)
    findings.sort(key=lambda f: (_ORDER[f.severity], f.id))
    notes = [f"{rid}: {text}" for rid, text in eff.get("_notes", [])]
    return CheckResult(findings=findings, effective=eff, notes=notes)


def check_job(job: Any, env: Env | None = None) -> list[Finding]:
    """Findings for a :class:`moetune.spec.Job` (fast path used by the planner)."""
    from moetune.io.config_to_job import env_from_job, job_to_config

    return check_config(job_to_config(job), env or env_from_job(job)).findings


def resolve_fixes(cfg: dict, env: Env | None = None, max_rounds: int = 8) -> tuple[dict[str, Any], CheckResult]:
    """Apply the fixes of fixable error findings repeatedly; returns (all overrides, final result)."""
    cur = normalize_input(cfg)
    applied: dict[str, Any] = {}
    res = check_config(cur, env)
    for _ in range(max_rounds):
        fixes: dict[str, Any] = {}
        for f in res.errors:
            if f.fix:
                for k, v in f.fix.items():
                    fixes.setdefault(k, v)
        fixes = {k: v for k, v in fixes.items() if applied.get(k, object()) != v}
        if not fixes:
            break
        applied.update(fixes)
        cur = apply_overrides(cur, fixes)
        res = check_config(cur, env)
    return applied, res

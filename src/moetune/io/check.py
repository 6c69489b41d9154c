"""Check a config or a Job against every rule: ``check_config(cfg, env)``, ``check_job(job, env)``,
``resolve_fixes(cfg, env)``.

The config is first replayed into the effective config Megatron-Core / Bridge will see
(:func:`moetune.io.effective.effective_config`, docs/rules.md §0.3), then the rules evaluate it
(:func:`moetune.rules.check.check_effective`).
"""

from __future__ import annotations

from typing import Any

from moetune.errors import InputError, MoetuneError
from moetune.io.config_to_job import env_from_job, job_to_config
from moetune.io.effective import effective_config, normalize_input
from moetune.overrides import apply_overrides
from moetune.rules.check import check_effective
from moetune.rules.engine import CheckResult, Env, Finding


def check_config(cfg: dict, env: Env | None = None, owned: bool = False) -> CheckResult:
    """Replay the effective config (docs/rules.md §0.3) and evaluate every rule. ``owned``: ``cfg`` was built for
    this call alone (:func:`check_job`), so it is not copied first (:func:`moetune.io.effective.normalize_input`)."""
    env = env or Env()
    try:
        raw = normalize_input(cfg, owned)
        eff = effective_config(raw, env)
    except (TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError, OverflowError) as e:
        if isinstance(e, MoetuneError):
            raise
        # a value of a type the replay cannot use, in a field no type check names: still one line, exit 2
        raise InputError(f"config: a field holds a value of the wrong type ({e.__class__.__name__}: "
                         f"{' '.join(str(e).split())[:160]}); expected the Megatron-Core / Bridge field types") from None
    return check_effective(eff, env, raw)


def check_job(job: Any, env: Env | None = None) -> list[Finding]:
    """Findings for a :class:`moetune.spec.Job` (fast path used by the planner)."""
    return check_config(job_to_config(job), env or env_from_job(job), owned=True).findings


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

"""The rule registry and its evaluation on an effective config: ``load_rules()``, ``check_effective(eff, env, raw)``.

Reading a config as Megatron-Core / Bridge will see it (the effective-config replay, docs/rules.md §0.3) is input
handling and lives in :mod:`moetune.io.effective`; :mod:`moetune.io.check` chains the two (``check_config``,
``check_job``, ``resolve_fixes``).
"""

from __future__ import annotations

import importlib

from moetune.memo import memo
from moetune.rules.engine import REGISTRY, CheckResult, Ctx, Env, Rule, evaluate

AREA_MODULES = ("values", "parallel", "topology", "moe", "overlap", "recompute", "cudagraph", "precision", "offload", "fsdp",
                "mlm")
_loaded = False


def load_rules() -> dict[str, Rule]:
    """Import every area module (registers its rules) and return the registry."""
    global _loaded
    if not _loaded:
        for name in AREA_MODULES:
            importlib.import_module(f"moetune.rules.{name}")
        _loaded = True
    return REGISTRY


@memo(maxsize=8)
def rules_for(frontend: str, registered: int) -> tuple[Rule, ...]:
    """The registered rules that apply to ``frontend``, in registration order. ``registered``: the size of the
    registry, part of the key because registering a rule grows it (a rule is never removed or replaced)."""
    return tuple(r for r in load_rules().values() if frontend in r.frontends)


_ORDER = {s: i for i, s in enumerate(("error", "error-at-build", "error-at-first-step", "depends-on-environment",
                                      "warning", "info"))}


def check_effective(eff: dict, env: Env, raw: dict) -> CheckResult:
    """Evaluate every rule on the effective config ``eff`` (``raw``: the config as written), findings sorted by
    severity then id; the replay's notes (``eff["_notes"]``) become ``RULE: text`` lines."""
    ctx = Ctx(eff, env, raw)
    findings = evaluate(rules_for(ctx.frontend, len(load_rules())), ctx)
    findings.sort(key=lambda f: (_ORDER[f.severity], f.id))
    notes = [f"{rid}: {text}" for rid, text in eff.get("_notes", [])]
    return CheckResult(findings=findings, effective=eff, notes=notes)

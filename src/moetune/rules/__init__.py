"""Pre-flight config rules for Megatron-Core / Megatron-Bridge MoE training (docs/rules.md)."""

from moetune.rules.check import check_config, check_job, load_rules, resolve_fixes
from moetune.rules.engine import UNKNOWN, CheckResult, Env, Finding, Rule

__all__ = ["UNKNOWN", "CheckResult", "Env", "Finding", "Rule", "check_config", "check_job", "load_rules",
           "resolve_fixes"]

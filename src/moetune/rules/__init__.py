"""Pre-flight config rules for Megatron-Core / Megatron-Bridge MoE training (docs/rules.md).

The rules evaluate an effective config; :mod:`moetune.io.check` reads a config or Job into one and checks it.
"""

from moetune.rules.check import check_effective, load_rules
from moetune.rules.engine import UNKNOWN, CheckResult, Env, Finding, Rule

__all__ = ["UNKNOWN", "CheckResult", "Env", "Finding", "Rule", "check_effective", "load_rules"]

"""MCP resources: moetune's catalogs as JSON documents an agent can read without calling a tool.

Models and systems are the ``catalog`` commands' own ``--json`` rows (one source); recipes, rules and efficiency
parameters are read from the same catalog modules the commands use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moetune import service


@dataclass(frozen=True)
class ResourceSpec:
    uri: str
    name: str
    description: str
    read: Callable[[], Any]


def _models() -> Any:
    return service.run("catalog models", {})


def _systems() -> Any:
    return service.run("catalog systems", {})


def _recipes() -> Any:
    from moetune.catalog.recipes import list_recipes, recipes_source

    return {"source": recipes_source(), "recipes": list_recipes()}


def _rules() -> Any:
    from moetune.rules.check import load_rules

    out = []
    for r in load_rules().values():
        if r.fix is None:
            fix: Any = None
        elif callable(r.fix):
            fix = "computed from the config (run `check` with fix=true to get the overrides)"
        else:
            fix = dict(r.fix)
        out.append({"id": r.id, "area": r.area, "severity": r.severity, "stage": r.stage, "fields": list(r.fields),
                    "message": r.text, "fix": fix, "source": r.source, "frontends": list(r.frontends),
                    "depends_on": list(r.env)})
    return {"count": len(out), "severities": "library severity: error (config/init), error(rt) (runtime), "
            "error(env) (environment), warning, info; stage C=config, I=init, B=build, R=run", "rules": out}


def _efficiency() -> Any:
    from moetune.perfmodel.calibration import default_efficiency

    eff = default_efficiency()
    return {
        "params": {k: {"value": eff.values[k], "prior": s.prior, "bounds": [s.lo, s.hi], "fixed": s.fixed,
                       "source": s.source} for k, s in eff.specs.items()},
        "constants": eff.constants,
        "prior_weight": eff.prior_weight,
        "fit": getattr(eff, "fit_info", None),
    }


RESOURCES: tuple[ResourceSpec, ...] = (
    ResourceSpec("moetune://catalog/models", "models",
                 "Catalog model architectures with exact total and active parameter counts (= `catalog` kind=models).",
                 _models),
    ResourceSpec("moetune://catalog/systems", "systems",
                 "Catalog systems: GPUs per node, NVLink domain, HBM, dense peak TFLOP/s per precision, with sources "
                 "(= `catalog` kind=systems).", _systems),
    ResourceSpec("moetune://catalog/recipes", "Bridge recipes",
                 "Megatron-Bridge performance recipes moetune embeds (name, model, task, GPUs, system, precision), "
                 "with the Bridge commit they were read from.", _recipes),
    ResourceSpec("moetune://catalog/rules", "rules",
                 "Every Megatron-Core / Megatron-Bridge rule `check` evaluates: id, area, severity, fields, message, "
                 "fix and the library source it paraphrases.", _rules),
    ResourceSpec("moetune://catalog/efficiency", "efficiency parameters",
                 "The step-time model's efficiency parameters (value, prior, bounds, source) and constants, and how "
                 "they were fitted.", _efficiency),
)

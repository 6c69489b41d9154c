"""The typed description of a training job (model, system, shape, layout, features).

The names below are loaded on first use (PEP 562), so importing one submodule (``moetune.spec.layout`` for
``moetune layout``) does not build every model class.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_HOME = {"Features": "features", "parse_precision": "features", "Job": "job", "Layout": "layout",
         "ModelArch": "model", "GPU": "system", "System": "system"}

__all__ = ["Features", "GPU", "Job", "Layout", "ModelArch", "System", "parse_precision"]

if TYPE_CHECKING:
    from moetune.spec.features import Features, parse_precision
    from moetune.spec.job import Job
    from moetune.spec.layout import Layout
    from moetune.spec.model import ModelArch
    from moetune.spec.system import GPU, System


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(import_module(f"moetune.spec.{_HOME[name]}"), name)
    raise AttributeError(f"module 'moetune.spec' has no attribute {name!r}")

"""The typed description of a training job (model, system, shape, layout, features)."""

from moetune.spec.features import Features, parse_precision
from moetune.spec.job import Job
from moetune.spec.layout import Layout
from moetune.spec.model import ModelArch
from moetune.spec.system import GPU, System

__all__ = ["Features", "GPU", "Job", "Layout", "ModelArch", "System", "parse_precision"]

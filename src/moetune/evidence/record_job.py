"""The Job a run record describes: its printed configuration (flat ``section.field`` keys) as a nested config, and
the catalog system of the GPU it names. Shared by the run summary (:mod:`moetune.evidence.steady`, model TFLOP/s)
and the A/B comparison (:mod:`moetune.evidence.compare`, ranking differences by predicted effect)."""

from __future__ import annotations

from typing import Any

from moetune.catalog.systems import list_systems
from moetune.evidence.logs.model import RunRecord
from moetune.io.config_to_job import job_from_config
from moetune.spec.job import Job


def config_tree(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"model.tensor_model_parallel_size": 2}`` -> ``{"model": {"tensor_model_parallel_size": 2}}`` (one level,
    as run records print them)."""
    out: dict[str, Any] = {}
    for k, v in flat.items():
        sec, dot, leaf = k.partition(".")
        if dot:
            out.setdefault(sec, {})[leaf] = v
        else:
            out[k] = v
    return out


def system_for(rec: RunRecord) -> str | None:
    """Catalog system for the GPU a run record names (e.g. ``H100`` -> ``DGX-H100``), if any."""
    gpu = str(rec.meta.get("gpu") or rec.config.get("gpu") or "").upper()
    if not gpu:
        return None
    for s in list_systems():
        if s.name.upper() in (f"DGX-{gpu}", f"{gpu}-NVL72"):
            return s.name
    return None


def job_for(flat: dict[str, Any], rec: RunRecord, gpus: int) -> Job:
    """The Job of the flat configuration ``flat`` (a record's own, or a variant of it) on ``gpus`` GPUs of the
    record's system (raises a one-line InputError when the configuration lacks what a Job needs)."""
    return job_from_config(config_tree(flat), gpus=gpus, system=system_for(rec))

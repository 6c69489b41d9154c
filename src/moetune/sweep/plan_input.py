"""Read the sweep's starting point: a ``moetune plan --json`` document or a baseline config file.

PLAN.json shape (issue 6): ``{"candidates": [{"layout": {"tp","pp","vpp","cp","ep","etp","dp","edp","mbs"},
"features": {...}, "memory": {...}, "time": {...}, "launch": {...}}], "searched", "feasible", "seconds"}``.
The request (model, system, GPU count, GBS, sequence, precision) is read from a top-level ``request`` (or ``job``)
object or from the candidate's ``launch``; anything missing must come from the command line. Extra keys are
ignored so the reader keeps working as the planner grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from moetune.errors import InputError, MoetuneError

LAYOUT_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "pipeline_layout")


@dataclass
class Candidate:
    """One planner candidate (or the baseline config) in the form the sweep generator needs."""

    index: int
    layout: dict[str, Any]
    mbs: int
    features: dict[str, Any]
    memory: dict[str, Any] = field(default_factory=dict)
    time: dict[str, Any] = field(default_factory=dict)
    launch: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        lay = self.layout
        s = f"TP{lay.get('tp', 1)} PP{lay.get('pp', 1)}"
        if (lay.get("vpp") or 1) > 1:
            s += f" VPP{lay['vpp']}"
        s += f" CP{lay.get('cp', 1)} EP{lay.get('ep', 1)} ETP{lay.get('etp') or '-'} MBS{self.mbs}"
        return s

    def predicted(self) -> dict[str, float | None]:
        """Predicted step time / throughput / peak memory, tolerant of the planner's exact key names."""
        return {
            "step_time_s": _num(self.time, "step_time_s", "step_s", "step_time"),
            "tokens_per_s_per_gpu": _num(self.time, "tokens_per_s_per_gpu", "tokens_per_s_gpu"),
            "tflops_per_gpu": _num(self.time, "tflops_per_gpu", "model_tflops_per_gpu", "tflops"),
            "peak_gib": _num(self.memory, "peak_allocated_gib", "peak_gib", "max_peak_gib", "peak"),
            "headroom_gib": _num(self.memory, "headroom_gib", "headroom"),
        }


@dataclass
class PlanInput:
    request: dict[str, Any]
    candidates: list[Candidate]
    source: str
    searched: int | None = None
    feasible: int | None = None
    model_arch: dict[str, Any] | None = None  # a model that is not in the catalog (read from a config)


def _num(d: dict[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, dict):
            v = v.get("median", v.get("value"))
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    return None


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < 1:
        raise InputError.bad_value(where, value, "a positive integer")
    return int(value)


def read_plan(path: Path) -> PlanInput:
    """Parse PLAN.json; one-line errors name the file and the field."""
    from moetune.files import decode_text, read_bytes

    raw = decode_text(read_bytes(path, "the output of `moetune plan --json`"), str(path), "JSON text")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("candidates"), list):
        raise InputError(f"{path}: expected an object with a 'candidates' list (output of `moetune plan --json`)")
    if not data["candidates"]:
        raise InputError(f"{path}: 'candidates' is empty (the planner found nothing that fits)")
    cands = []
    for i, c in enumerate(data["candidates"]):
        where = f"{path.name}: candidates[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("layout"), dict):
            raise InputError(f"{where}: expected an object with a 'layout' object")
        lay_in = c["layout"]
        layout: dict[str, Any] = {}
        for k in LAYOUT_FIELDS:
            v = lay_in.get(k)
            if v is None:
                continue
            layout[k] = v if k == "pipeline_layout" else _int(v, f"{where}.layout.{k}")
        if layout.get("vpp") == 1:  # the planner writes VPP 1 for 'not interleaved'
            del layout["vpp"]
        for k in ("tp", "pp", "cp", "ep"):
            layout.setdefault(k, 1)
        mbs = _int(lay_in.get("mbs", c.get("mbs", 1)), f"{where}.layout.mbs")
        feats = c.get("features") or {}
        if not isinstance(feats, dict):
            raise InputError(f"{where}.features: expected an object")
        cands.append(Candidate(index=i, layout=layout, mbs=mbs, features=dict(feats),
                               memory=c.get("memory") if isinstance(c.get("memory"), dict) else {},
                               time=c.get("time") if isinstance(c.get("time"), dict) else {},
                               launch=c.get("launch") if isinstance(c.get("launch"), dict) else {}))
    req = data.get("request") or data.get("job") or {}
    if not isinstance(req, dict):
        raise InputError(f"{path}: 'request' must be an object")
    req = dict(req)
    # the planner spells the shape 'gbs'/'seq' and lists 'precisions'; accept both spellings
    for short, long in (("gbs", "global_batch_size"), ("seq", "seq_length")):
        if short in req and long not in req:
            req[long] = req[short]
    if "precision" not in req and isinstance(req.get("precisions"), list) and req["precisions"]:
        req["precision"] = req["precisions"][0]
    return PlanInput(request=req, candidates=cands, source=str(path),
                     searched=data.get("searched"), feasible=data.get("feasible"))


def read_baseline(path: Path, *, system: str | None = None, gpus: int | None = None,
                  model: str | None = None) -> PlanInput:
    """A baseline config (Bridge YAML, Megatron-LM args / model_config.yaml, moetune job JSON) as a one-candidate
    plan, through the config readers that ``moetune check`` uses."""
    from moetune.io.config_to_job import job_from_config
    from moetune.io.load import load_config as load_input

    if not path.is_file():
        raise InputError(f"{path}: no such file (expected a baseline config)")
    cfg = load_input(str(path), None, None)
    job = job_from_config(cfg, system=system, gpus=gpus, model=model)
    layout = {k: getattr(job.layout, k, None) for k in LAYOUT_FIELDS}
    layout = {k: v for k, v in layout.items() if v is not None}
    if layout.get("vpp") == 1:
        del layout["vpp"]
    feats = job.features.model_dump(mode="json")
    req = {"model": job.model.name, "system": job.system.name, "gpus": job.gpus,
           "global_batch_size": job.global_batch_size, "seq_length": job.seq_length,
           "precision": job.features.precision}
    arch = None
    from moetune.catalog.models import get_model

    try:
        get_model(job.model.name)
    except MoetuneError:  # not a catalog model: the plan input carries its architecture
        arch = job.model.model_dump(mode="json")
    return PlanInput(request=req, candidates=[Candidate(0, layout, job.micro_batch_size, feats)], source=str(path),
                     model_arch=arch)

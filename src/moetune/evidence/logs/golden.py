"""Megatron-LM functional-test golden values (``golden_values_<env>_<platform>.json``) as a run record.

Format (NVIDIA/Megatron-LM ``tests/functional_tests``): ``{metric: {start_step, end_step, step_interval,
values: {step: value}}}`` with metrics ``lm loss``, ``num-zeros``, ``mem-allocated-bytes``,
``mem-max-allocated-bytes``, ``iteration-time`` (seconds) and sometimes ``mtp_1 loss``. ``"nan"`` strings mean the
value was not recorded. The ``mem-*`` values come from the TensorBoard writer, which lives only on rank
``world_size - 1`` (``megatron/training/global_vars.py::_set_tensorboard_writer``): memory is the *last* rank's.

The run's configuration is the ``model_config.yaml`` next to the golden file (Megatron's tree layout) or
``case_<case>_config.yaml`` (this project's data layout), read with :func:`moetune.io.megatron_args.read_megatron_args`
when that reader is installed, else as the raw ``MODEL_ARGS`` mapping.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Any

import orjson

from moetune.errors import InputError, MoetuneError
from moetune.evidence.logs.model import FLAG_CHECKPOINT, FLAG_SEGMENT_START, MemoryReport, RunRecord
from moetune.evidence.logs.values import flatten

_PLATFORM = re.compile(r"golden_values_((?:dev|lts)_[\w\-]+?)\.json$|_golden(?:_((?:dev|lts)_[\w\-]+?))?\.json$")
_METRIC_COLUMNS = {"lm loss": "loss", "iteration-time": "elapsed_s", "num-zeros": "num_zeros"}


def looks_like_golden(doc: Any) -> bool:
    return isinstance(doc, dict) and bool(doc) and all(
        isinstance(v, dict) and isinstance(v.get("values"), dict) for v in doc.values())


def _f(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def read_golden(path: Path, doc: Any) -> RunRecord:
    """Build a :class:`RunRecord` from a parsed golden-values document."""
    if not looks_like_golden(doc):
        raise InputError(f"{path}: JSON is not a Megatron golden-values file (expected {{metric: {{start_step, "
                         "end_step, step_interval, values: {step: value}}}}})", field="log", value=str(path))
    rec = RunRecord(path=str(path), source="megatron-golden")
    steps: set[int] = set()
    for metric in doc.values():
        for k in metric["values"]:
            try:
                steps.add(int(k))
            except (TypeError, ValueError):
                raise InputError.bad_value(f"{path}: step", k, "an integer step number") from None
    if not steps:
        return rec
    order = sorted(steps)
    per_metric = {name: {int(k): _f(v) for k, v in m["values"].items()} for name, m in doc.items()}
    interval = int(next(iter(doc.values())).get("step_interval") or 1)
    # a step where every metric is missing or "nan" was not run (shortened ``_sm`` runs keep the full step range)
    order = [s for s in order if any(math.isfinite(v.get(s, math.nan)) for v in per_metric.values())]
    for i, step in enumerate(order):
        row: dict[str, float] = {"iteration": float(step), "line": 0.0, "segment": 0.0,
                                 "train_iters": float(order[-1]), "skipped": 0.0, "nan": 0.0,
                                 "flags": float(FLAG_SEGMENT_START if i == 0 else 0)}
        extra: dict[str, float] = {}
        for name, values in per_metric.items():
            v = values.get(step, math.nan)
            col = _METRIC_COLUMNS.get(name)
            if col:
                row[col] = v
            elif name.endswith("loss"):
                extra[name] = v
        lm = per_metric.get("lm loss", {}).get(step)
        row["loss_missing"] = 0.0
        if lm is not None and not math.isfinite(lm):
            row["nan"] = 1.0  # recorded as nan while other metrics of the step were recorded
        rec.iterations.append(row, extra or None)
    rec.lines = len(order)
    rec.recognised_lines = len(order)
    mem = {}
    for key, name in (("mem-max-allocated-bytes", "max allocated"), ("mem-allocated-bytes", "allocated")):
        vals = [v for v in per_metric.get(key, {}).values() if math.isfinite(v)]
        if vals:
            mem[name] = max(vals) if name.startswith("max") else per_metric[key][max(per_metric[key])]
    if mem:
        rec.memory_reports.append(MemoryReport(0, None, order[-1], "bytes", mem))
    rec.meta["log_interval"] = interval
    rec.meta["memory_rank"] = "last (world_size - 1)"
    m = _PLATFORM.search(path.name)
    platform = (m.group(1) or m.group(2)) if m else None
    case = path.name.split("_golden")[0]
    rec.meta.update(_index_row(path))
    if platform and "platform" not in rec.meta:
        rec.meta["platform"] = platform
    cfg_path = _config_path(path, case)
    if cfg_path is not None:
        rec.config, rec.config_source = _read_config(cfg_path)
        rec.meta["config_file"] = str(cfg_path)
    _flag_checkpoint_steps(rec)
    return rec


def _flag_checkpoint_steps(rec: RunRecord) -> None:
    """Flag the step after each checkpoint save (``--save-interval``): a golden file has no log line for the save,
    but the interval that follows it can carry the save (e.g. 1.9 s -> 2.9 s after step 25 of
    gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading, save interval 25)."""
    si = rec.config.get("checkpoint.save_interval", rec.config.get("save_interval"))
    try:
        si = int(si)
    except (TypeError, ValueError):
        return
    if si <= 0:
        return
    it = rec.iterations.col("iteration")
    for i, step in enumerate(it):
        if step > 1 and (int(step) - 1) % si == 0:
            rec.iterations.set_flag(i, FLAG_CHECKPOINT)
            rec.meta.setdefault("checkpoint_steps", []).append(int(step) - 1)


def _config_path(path: Path, case: str) -> Path | None:
    for cand in (path.with_name(f"{case}_config.yaml"), path.with_name("model_config.yaml")):
        if cand.is_file():
            return cand
    return None


def _index_row(path: Path) -> dict[str, Any]:
    """Platform/GPU from an ``index.csv`` next to the golden (this project's data layout), if present."""
    idx = path.with_name("index.csv")
    if not idx.is_file():
        return {}
    try:
        with open(idx, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("file") == path.name:
                    return {k: row[k] for k in ("platform", "gpu", "case") if row.get(k)}
    except (OSError, csv.Error, UnicodeDecodeError):
        return {}
    return {}


def _read_config(cfg_path: Path) -> tuple[dict[str, Any], str]:
    from moetune.io.megatron_args import read_megatron_args

    try:
        cfg = read_megatron_args(cfg_path)
        return flatten({k: v for k, v in cfg.items() if k not in ("frontend",)}), "megatron-model-config"
    except MoetuneError:  # the reader is stricter than a log summary needs: fall back to the raw flags
        pass
    import yaml

    try:
        doc = yaml.safe_load(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}, "unreadable"
    args = (doc or {}).get("MODEL_ARGS") or {}
    out = {str(k).lstrip("-").replace("-", "_"): v for k, v in args.items()}
    for k, v in ((doc or {}).get("ENV_VARS") or {}).items():
        out[f"env_vars.{k}"] = v
    return out, "megatron-model-config(raw)"


def read_golden_path(path: Path) -> RunRecord:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})", field="log", value=str(path)) from None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})", field="log", value=str(path)) from None
    return read_golden(path, doc)

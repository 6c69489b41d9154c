"""Rule engine: declarative rule entries evaluated on the effective config.

A :class:`Rule` is data: id, area, library severity and stage (docs/rules.md §0.1 vocabulary), the fields it reads,
a condition over a :class:`Ctx`, a paraphrased message, an optional fix (override path -> value, or a function of
the context returning such a mapping) and the library source it paraphrases. Conditions return ``True`` (rule
fires), ``False``/``None``-free falsy (does not fire) or :data:`UNKNOWN` when the verdict needs a part of the
target environment (world size, GPU, library versions, env vars) that was not given; such findings are reported
with severity ``depends-on-environment``.

Output severities: ``error`` (library rejects at config/init), ``error-at-build`` (model construction),
``error-at-first-step`` (first training step), ``depends-on-environment``, ``warning``, ``info``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from moetune.errors import MoetuneError
from moetune.overrides import get_path

LIB_SEVERITIES = ("error", "error(rt)", "error(env)", "warning", "info")
SEVERITIES = ("error", "error-at-build", "error-at-first-step", "depends-on-environment", "warning", "info")
ERROR_SEVERITIES = ("error", "error-at-build", "error-at-first-step")
AREAS = ("parallel", "topology", "moe", "overlap", "recompute", "cuda_graphs", "precision", "offload", "fsdp",
         "mlm", "guidance", "values")


class UnknownTruth(TypeError):
    """Raised when a condition asks for the truth of an unknown environment value."""


class _Unknown:
    """Tri-state 'cannot tell without the environment'. Arithmetic and comparisons propagate it; asking for its
    truth value raises :class:`UnknownTruth`, which the engine turns into a ``depends-on-environment`` verdict.
    Conditions therefore test config parts first and environment parts last."""

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "UNKNOWN"

    def __json__(self) -> None:
        """JSON: unknown without the environment -> null (``moetune.output`` serialiser protocol)."""
        return None

    def __bool__(self) -> bool:
        raise UnknownTruth("unknown environment value")

    def _prop(self, *_: Any) -> Any:
        return self

    __mod__ = __rmod__ = __add__ = __radd__ = __mul__ = __rmul__ = __floordiv__ = __rfloordiv__ = _prop
    __sub__ = __rsub__ = __truediv__ = __rtruediv__ = _prop
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _prop


UNKNOWN: Any = _Unknown()


def all_of(*vals: Any) -> Any:
    """Tri-state AND: False if any is False, UNKNOWN if any unknown, else True."""
    unknown = False
    for v in vals:
        if v is UNKNOWN:
            unknown = True
        elif not v:
            return False
    return UNKNOWN if unknown else True


def any_of(*vals: Any) -> Any:
    """Tri-state OR."""
    unknown = False
    for v in vals:
        if v is UNKNOWN:
            unknown = True
        elif v:
            return True
    return UNKNOWN if unknown else False


def vtuple(v: str) -> tuple:
    """'2.10.0.dev0' -> (2, 10, 0, -1); 'dev'/'rc' sort before the release (PEP 440 order for these cases)."""
    parts: list[int] = []
    for tok in re.split(r"[.+]", str(v).strip().lstrip("v")):
        m = re.match(r"^(\d+)(.*)$", tok)
        if m:
            parts.append(int(m.group(1)))
            if m.group(2):
                parts.append(-1)
                break
        elif tok.startswith(("dev", "rc", "a", "b")):
            parts.append(-1)
            break
        else:
            break
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


#: GPU key -> (compute capability, device-name prefix) used by the hardware gates (MOE-058/059, PRC-008).
#: Source: NVIDIA CUDA GPUs compute-capability table; Bridge flex_dispatcher_backend.py device-name checks.
GPU_CC: dict[str, tuple[tuple[int, int], str]] = {
    "a100": ((8, 0), "NVIDIA A100"), "h100": ((9, 0), "NVIDIA H100"), "h200": ((9, 0), "NVIDIA H200"),
    "h20": ((9, 0), "NVIDIA H20"), "b200": ((10, 0), "NVIDIA B200"), "gb200": ((10, 0), "NVIDIA GB200"),
    "b300": ((10, 3), "NVIDIA B300"), "gb300": ((10, 3), "NVIDIA GB300"), "rtx6000": ((12, 0), "NVIDIA RTX PRO 6000"),
    "l40s": ((8, 9), "NVIDIA L40S"), "v100": ((7, 0), "Tesla V100"),
}


def gpu_key(name: str | None) -> str | None:
    """Normalise a GPU/system name ('DGX-GB200', 'H100-SXM5-80GB', 'b200') to a :data:`GPU_CC` key."""
    if not name:
        return None
    s = name.lower().replace("-", "").replace("_", "").replace(" ", "")
    for key in sorted(GPU_CC, key=len, reverse=True):
        if key in s:
            return key
    return None


@dataclass
class Env:
    """Target environment; every field may be unknown (None)."""

    gpus: int | None = None
    system: str | None = None
    gpu: str | None = None  # GPU_CC key
    gpus_per_node: int | None = None
    nvlink_domain: int | None = None
    torch: str | None = None
    te: str | None = None
    mcore: str | None = None
    bridge: str | None = None
    vars: dict[str, str] = field(default_factory=dict)

    @classmethod
    def for_system(cls, system: str | None = None, gpus: int | None = None, **kw: Any) -> Env:
        """Env from a catalog system name (GPU, node and NVLink-domain size from the system catalog when known)."""
        env = cls(gpus=gpus, system=system, **kw)
        if system:
            from moetune.catalog.systems import get_system

            try:
                sysobj = get_system(system)
                env.system = sysobj.name
                env.gpu = env.gpu or gpu_key(sysobj.gpu.name) or gpu_key(sysobj.name)
                env.gpus_per_node = env.gpus_per_node or sysobj.gpus_per_node
                env.nvlink_domain = env.nvlink_domain or sysobj.nvlink_domain
            except MoetuneError:  # unknown system: keep what the name tells
                env.gpu = env.gpu or gpu_key(system)
        return env


@dataclass
class Finding:
    id: str
    severity: str
    message: str
    fields: dict[str, Any]
    fix: dict[str, Any] | None
    source: str
    area: str = ""
    stage: str = ""

    def as_dict(self) -> dict:
        return {"id": self.id, "severity": self.severity, "message": self.message, "fields": self.fields,
                "fix": self.fix, "source": self.source}

    @property
    def is_error(self) -> bool:
        return self.severity in ERROR_SEVERITIES


Fix = dict[str, Any] | Callable[["Ctx"], dict[str, Any] | None] | None


@dataclass(frozen=True)
class Rule:
    """One declarative rule entry (see module doc)."""

    id: str
    area: str
    severity: str  # library severity, docs/rules.md §0.1
    stage: str  # C, I, B, R
    fields: tuple[str, ...]
    when: Callable[[Ctx], Any]
    text: str
    source: str
    fix: Fix = None
    frontends: tuple[str, ...] = ("bridge", "megatron-lm")
    env: tuple[str, ...] = ()  # environment parts the verdict may depend on (for documentation / output)
    detail: Callable[[Ctx], str] | None = None  # optional rendering of the library's own message with values

    def __post_init__(self) -> None:
        assert self.severity in LIB_SEVERITIES, self.id
        assert self.area in AREAS, self.id
        assert self.stage in ("C", "I", "B", "R", "-"), self.id

    @property
    def is_error_rule(self) -> bool:
        return self.severity.startswith("error")

    def output_severity(self, verdict: Any) -> str:
        if verdict is UNKNOWN:
            return "depends-on-environment" if self.is_error_rule else self.severity
        if self.severity in ("warning", "info"):
            return self.severity
        if self.severity == "error":
            return "error"
        return {"B": "error-at-build", "R": "error-at-first-step"}.get(self.stage, "error")


REGISTRY: dict[str, Rule] = {}


def rule(id: str, area: str, severity: str, stage: str, fields: Iterable[str], when: Callable[[Ctx], Any],
         text: str, source: str, fix: Fix = None, frontends: tuple[str, ...] | None = None,
         env: tuple[str, ...] = (), detail: Callable[[Ctx], str] | None = None) -> Rule:
    """Register one rule (called at import time by the area modules)."""
    if frontends is None:
        frontends = ("bridge",) if source.startswith("B/") else ("bridge", "megatron-lm")
    r = Rule(id=id, area=area, severity=severity, stage=stage, fields=tuple(fields), when=when, text=text,
             source=source, fix=fix, frontends=frontends, env=env, detail=detail)
    if id in REGISTRY:
        raise ValueError(f"duplicate rule id {id}")
    REGISTRY[id] = r
    return r


class _once:  # noqa: N801 - used as a decorator, like ``property``
    """A :class:`Ctx` property computed on its first read and kept in the instance ``__dict__``, which shadows this
    non-data descriptor from then on (``functools.cached_property`` without its lock). A context is built per check
    and nothing changes the config or environment it reads while the rules run, so every later read would compute
    the same value; a read that raises stores nothing and raises again on the next read."""

    def __init__(self, f: Callable[[Any], Any]):
        self.f = f
        self.name = f.__name__
        self.__doc__ = f.__doc__

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:
            return self
        v = obj.__dict__[self.name] = self.f(obj)
        return v


_ABSENT: Any = object()


def _read(got: dict[str, Any], cfg: dict, path: str) -> Any:
    """``get_path(cfg, path)``, :data:`_ABSENT` where the path is missing, kept in ``got`` (a :class:`Ctx`'s reads;
    its methods look there first). A two-part path through plain dicts is read directly, as ``get_path`` would."""
    sec, dot, key = path.partition(".")
    node = cfg.get(sec, _ABSENT) if type(cfg) is dict else _ABSENT
    if dot and type(node) is dict and "." not in key:
        v = node.get(key, _ABSENT)
    else:
        v = get_path(cfg, path, _ABSENT)
    got[path] = v
    return v


class Ctx:
    """Read access to the effective config and environment for rule conditions. The config and environment are
    read-only while the rules run, so the scalar properties (:class:`_once`) and :meth:`get` keep what they read."""

    def __init__(self, eff: dict, env: Env, raw: dict | None = None):
        self._got: dict[str, Any] = {}  # path -> value read from eff (:meth:`get`)
        self._raw_got: dict[str, Any] = {}  # path -> value read from raw (:meth:`raw_get`)
        self.eff = eff
        self.env = env
        self.raw = raw if raw is not None else eff
        self.model: dict = eff.get("model", {})
        self.frontend: str = eff.get("frontend", "bridge")
        self.envvars: dict[str, str] = eff.get("_env_vars_effective", {})
        self.vars_known: bool = bool(eff.get("_env_vars_known", False))

    # --- plain access -------------------------------------------------------------------------------------
    def get(self, path: str, default: Any = None) -> Any:
        v = self._got.get(path, self)
        if v is self:
            v = _read(self._got, self.eff, path)
        return default if v is _ABSENT else v

    def m(self, name: str, default: Any = None) -> Any:
        v = self.model.get(name, default)
        return default if v is None and default is not None else v

    def raw_get(self, path: str, default: Any = None) -> Any:
        v = self._raw_got.get(path, self)
        if v is self:
            v = _read(self._raw_got, self.raw, path)
        return default if v is _ABSENT else v

    def raw_has(self, path: str) -> bool:
        v = self._raw_got.get(path, self)
        if v is self:
            v = _read(self._raw_got, self.raw, path)
        return v is not _ABSENT

    @_once
    def bridge(self) -> bool:
        return self.frontend == "bridge"

    # --- parallel sizes -----------------------------------------------------------------------------------
    @_once
    def tp(self) -> int:
        return int(self.m("tensor_model_parallel_size", 1) or 1)

    @_once
    def pp(self) -> int:
        return int(self.m("pipeline_model_parallel_size", 1) or 1)

    @_once
    def vpp(self) -> int | None:
        return self.m("virtual_pipeline_model_parallel_size")

    @_once
    def cp(self) -> int:
        return int(self.m("context_parallel_size", 1) or 1)

    @_once
    def ep(self) -> int:
        return int(self.m("expert_model_parallel_size", 1) or 1)

    @_once
    def etp(self) -> int:
        v = self.m("expert_tensor_parallel_size")
        return int(v) if v is not None else self.tp

    @_once
    def W(self) -> Any:  # noqa: N802
        return self.env.gpus if self.env.gpus else UNKNOWN

    @_once
    def dp(self) -> Any:
        W = self.W
        if W is UNKNOWN:
            return UNKNOWN
        return W // (self.tp * self.pp * self.cp) if W % (self.tp * self.pp * self.cp) == 0 else UNKNOWN

    @_once
    def edp(self) -> Any:
        W = self.W
        if W is UNKNOWN:
            return UNKNOWN
        d = self.etp * self.ep * self.pp
        return W // d if W % d == 0 else UNKNOWN

    @_once
    def mbs(self) -> int:
        return int(self.get("train.micro_batch_size", 1) or 1)

    @_once
    def gbs(self) -> int | None:
        return self.get("train.global_batch_size")

    @_once
    def nmb(self) -> Any:
        dp, gbs = self.dp, self.gbs
        if dp is UNKNOWN or gbs is None:
            return UNKNOWN
        return gbs // (self.mbs * dp)

    # --- model shape --------------------------------------------------------------------------------------
    @_once
    def num_experts(self) -> int | None:
        return self.m("num_moe_experts")

    @property
    def meta(self) -> dict:
        return self.eff.get("_meta") or {}

    @_once
    def arch_known(self) -> bool:
        """False when the architecture comes from a Hugging Face config at run time (recipes without provider
        values): arch-dependent rules then skip fields that are None instead of judging MCore defaults."""
        return not self.meta.get("arch_unknown", False)

    @_once
    def is_moe(self) -> bool:
        return self.num_experts is not None or bool(self.meta.get("moe"))

    @_once
    def num_layers(self) -> int | None:
        return self.m("num_layers")

    @_once
    def moe_layer_flags(self) -> list[int] | None:
        """Per-layer MoE flags from ``moe_layer_freq`` (int N: layer i is MoE iff i % N == 0); kept, so read only."""
        nl, f = self.num_layers, self.m("moe_layer_freq", 1)
        if not self.is_moe or not nl:
            return None
        if isinstance(f, int) and not isinstance(f, bool) and f > 0:
            return [1 if i % f == 0 else 0 for i in range(nl)]
        if isinstance(f, list):
            return list(map(int, f))
        return None

    @_once
    def all_layers_moe(self) -> bool:
        flags = self.moe_layer_flags
        return bool(flags) and all(flags)

    @_once
    def has_dense_mlp(self) -> bool:
        flags = self.moe_layer_flags
        return not self.is_moe or (flags is not None and not all(flags))

    @_once
    def has_shared_experts(self) -> bool:
        v = self.m("moe_shared_expert_intermediate_size")
        return self.is_moe and v is not None and v > 0

    @_once
    def dispatcher(self) -> str:
        return self.m("moe_token_dispatcher_type", "allgather")

    @_once
    def flex_backend(self) -> str | None:
        return self.m("moe_flex_dispatcher_backend") if self.dispatcher == "flex" else None

    @_once
    def ep_overlap(self) -> bool:
        return bool(self.m("overlap_moe_expert_parallel_comm"))

    @property
    def rmods(self) -> list[str]:
        """Effective selective recompute modules (empty unless granularity is selective)."""
        if self.m("recompute_granularity") != "selective":
            return []
        return list(self.m("recompute_modules") or [])

    @_once
    def cg_impl(self) -> str:
        return self.m("cuda_graph_impl", "none") or "none"

    @property
    def cg_mods(self) -> list[str]:
        v = self.m("cuda_graph_modules") or []
        return [v] if isinstance(v, str) else list(v)

    @_once
    def per_layer_graph(self) -> bool:
        return self.cg_impl in ("local", "transformer_engine")

    @_once
    def te_graph(self) -> bool:
        return self.cg_impl == "transformer_engine"

    @_once
    def full_iter_graph(self) -> bool:
        return self.cg_impl == "full_iteration"

    @_once
    def fp8(self) -> Any:
        return self.m("fp8")

    @_once
    def fp4(self) -> Any:
        return self.m("fp4")

    @_once
    def fsdp(self) -> bool:
        return bool(self.get("dist.use_megatron_fsdp") or self.get("ddp.use_megatron_fsdp"))

    @_once
    def fsdp_version(self) -> int:
        return int(self.get("ddp.megatron_fsdp_version", 1) or 1)

    @_once
    def dist_opt(self) -> bool:
        return bool(self.get("ddp.use_distributed_optimizer") or self.get("optimizer.use_distributed_optimizer"))

    # --- environment --------------------------------------------------------------------------------------
    def _below(self, have: str | None, need: str) -> Any:
        if not have:
            return UNKNOWN
        return vtuple(have) < vtuple(need)

    def pkg_missing(self, backend: str | None) -> Any:
        """Tri-state: is the package a flex backend needs missing? (``env.vars['MOETUNE_HAS_<BACKEND>']`` = 0/1)."""
        v = self.env.vars.get(f"MOETUNE_HAS_{str(backend).upper()}")
        if v is None:
            return UNKNOWN
        return v in ("0", "false", "False")

    def te_below(self, v: str) -> Any:
        return self._below(self.env.te, v)

    def torch_below(self, v: str) -> Any:
        return self._below(self.env.torch, v)

    def mcore_below(self, v: str) -> Any:
        return self._below(self.env.mcore, v)

    @_once
    def gpu(self) -> str | None:
        return self.env.gpu

    def cc(self) -> tuple[int, int] | None:
        return GPU_CC[self.env.gpu][0] if self.env.gpu in GPU_CC else None

    def gpu_is(self, pred: Callable[[tuple[int, int], str], bool]) -> Any:
        """Tri-state predicate on (compute capability, device name)."""
        if self.env.gpu not in GPU_CC:
            return UNKNOWN
        cc, name = GPU_CC[self.env.gpu]
        return bool(pred(cc, name))

    def var(self, name: str) -> Any:
        """Effective env var value; None when known to be unset; UNKNOWN when the process environment is unknown."""
        if name in self.envvars:
            return str(self.envvars[name])
        return None if self.vars_known else UNKNOWN

    # --- rendering ----------------------------------------------------------------------------------------
    def value(self, path: str) -> Any:
        if path == "W":
            return self.env.gpus
        if path.startswith("env."):
            key = path[4:]
            if hasattr(self.env, key) and key != "vars":
                return getattr(self.env, key)
            v = self.var(key)
            return None if v is UNKNOWN else v
        if path in ("DP", "EDP", "NMB"):
            v = {"DP": self.dp, "EDP": self.edp, "NMB": self.nmb}[path]
            return None if v is UNKNOWN else v
        if path == "model.expert_tensor_parallel_size":
            return self.etp if self.is_moe or self.m("expert_tensor_parallel_size") is not None else None
        return self.get(path)


@dataclass
class CheckResult:
    findings: list[Finding]
    effective: dict
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.is_error]

    def by_severity(self) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {s: [] for s in SEVERITIES}
        for f in self.findings:
            out[f.severity].append(f)
        return out

    def as_dict(self) -> dict:
        return {"findings": [f.as_dict() for f in self.findings], "effective": public_effective(self.effective)}


def public_effective(eff: dict) -> dict:
    return {k: v for k, v in eff.items() if not k.startswith("_")}


def evaluate(rules: Iterable[Rule], ctx: Ctx) -> list[Finding]:
    """Findings of the ``rules`` whose condition holds or cannot be decided without the environment, in rule order.
    ``rules``: those that apply to ``ctx.frontend`` (:func:`moetune.rules.check.rules_for`)."""
    out: list[Finding] = []
    for r in rules:
        try:
            verdict = r.when(ctx)
        except UnknownTruth:
            verdict = UNKNOWN
        except (TypeError, ValueError, ZeroDivisionError, KeyError, AttributeError):
            # a malformed value the rule cannot interpret: the type/value rules report it; do not crash
            continue
        if verdict is not UNKNOWN and not verdict:
            continue
        vals = {f: ctx.value(f) for f in r.fields}
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in vals.items())
        msg = f"{r.text} ({shown})" if shown else r.text
        if r.detail is not None and verdict is not UNKNOWN:
            try:
                msg = f"{r.detail(ctx)}: {msg}"
            except (TypeError, ValueError, ZeroDivisionError, KeyError, AttributeError, UnknownTruth):
                pass
        if verdict is UNKNOWN and r.is_error_rule:
            missing = ", ".join(r.env) if r.env else "the target environment"
            msg = f"depends on {missing}: {msg}"
        fix = None
        if r.fix is not None:
            try:
                fix = r.fix(ctx) if callable(r.fix) else dict(r.fix)
            except (TypeError, ValueError, ZeroDivisionError, KeyError, AttributeError):
                fix = None
        out.append(Finding(id=r.id, severity=r.output_severity(verdict), message=msg, fields=vals, fix=fix or None,
                           source=r.source, area=r.area, stage=r.stage))
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float) and math.isfinite(v) and v == int(v) and abs(v) < 1e15:
        return repr(v)
    if isinstance(v, list) and len(v) > 8:
        return f"[{', '.join(map(str, v[:6]))}, … ({len(v)} items)]"
    return repr(v) if isinstance(v, str) else str(v)

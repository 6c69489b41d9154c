"""The checker's fast paths give the findings of the plain evaluation.

A :class:`moetune.rules.engine.Ctx` keeps what it reads during one check (its scalar properties, the config paths
read through ``get`` / ``raw_get`` / ``raw_has``); the oracle here is the same context with every property computed
afresh on every read and every path read with ``get_path``, as before. The rewritten rule helpers (the memoised
NVLink-domain test of the topology rules, PAR-031's stage count) are compared with their former code, kept here.
The corpus: every configuration a few plans test, the recipe catalog (with and without its environment) and the
example configs of every error rule (both frontends, with and without the environment)."""

from __future__ import annotations

import math

import pytest

from moetune.catalog.models import get_model
from moetune.catalog.recipes import list_recipes, recipe_config
from moetune.catalog.systems import get_system
from moetune.errors import LayoutError
from moetune.io.config_to_job import env_from_job, job_to_config
from moetune.io.effective import effective_config, normalize_input
from moetune.overrides import apply_overrides, get_path
from moetune.plan import search as P
from moetune.rules import Env, load_rules
from moetune.rules import topology as TOPO
from moetune.rules.engine import UNKNOWN, Ctx, UnknownTruth, _once, evaluate, gpu_key
from moetune.spec.pipeline import parse_pipeline_layout
from test_rules_examples import EXAMPLES, _cfg, _env


class PlainCtx(Ctx):
    """The oracle: nothing kept between reads (properties recomputed, paths read with ``get_path``)."""

    def get(self, path, default=None):
        return get_path(self.eff, path, default)

    def raw_get(self, path, default=None):
        return get_path(self.raw, path, default)

    def raw_has(self, path):
        sentinel = object()
        return get_path(self.raw, path, sentinel) is not sentinel


ONCE = [name for name, attr in vars(Ctx).items() if isinstance(attr, _once)]
for _name in ONCE:
    setattr(PlainCtx, _name, property(vars(Ctx)[_name].f))


def _plan_configs(model: str, gpus: int, gbs: int, **kw) -> list[tuple[dict, Env]]:
    req = P.PlanRequest(model=get_model(model), system=get_system(kw.pop("system", "DGX-H100")), gpus=gpus,
                        global_batch_size=gbs, seq_length=4096, workers=1, **kw)
    s = P.Search(req)
    s.run()
    jobs = s.tested_jobs()
    return [(job_to_config(j), env_from_job(j)) for j in jobs[:: max(1, len(jobs) // 150)]]


def _corpus() -> list[tuple[dict, Env]]:
    out = _plan_configs("Qwen3-30B-A3B", 16, 512)
    out += _plan_configs("DeepSeek-V2-Lite", 16, 512, precisions=("fp8_cs",))
    out += _plan_configs("Llama-3-8B", 16, 256, system="DGX-B200")
    for r in list_recipes()[::3]:
        cfg = recipe_config(r["name"])
        out += [(cfg, Env.for_system(r["system"], gpus=r["gpus"], gpu=gpu_key(r["gpu"]))), (cfg, Env())]
    for overrides, env_changes in EXAMPLES.values():
        for frontend in ("bridge", "megatron-lm"):
            cfg = _cfg({**overrides, "frontend": frontend})
            out += [(cfg, _env(env_changes)), (cfg, Env(gpus=16))]
    return out


def _contexts() -> list[tuple[dict, Env, dict]]:
    out = []
    for cfg, env in CORPUS:
        try:
            raw = normalize_input(cfg)
            out.append((effective_config(raw, env), env, raw))
        except (TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError, OverflowError):
            pass  # check_config reports these as one input error before any rule runs
    return out


CORPUS = _corpus()
CONTEXTS = _contexts()


def _rules(eff: dict) -> list:
    """The rules of the config's frontend (the plain filter, as ``evaluate`` did before ``rules_for``)."""
    return [r for r in load_rules().values() if eff.get("frontend", "bridge") in r.frontends]


def _rows(findings) -> list[tuple]:
    return [(f.id, f.severity, f.message, f.fields, f.fix, f.source, f.area, f.stage) for f in findings]


def _outcome(fn, *args):
    """What ``fn(*args)`` returns, or the type of what it raises."""
    try:
        return ("=", fn(*args))
    except Exception as e:  # noqa: BLE001 - the exception type is part of the behaviour compared
        return ("raises", type(e))


def test_the_corpus_exercises_the_rules():
    fired = {f.id for eff, env, raw in CONTEXTS for f in evaluate(_rules(eff), Ctx(eff, env, raw))}
    assert len(CONTEXTS) > 900 and len(fired) > 250


def test_kept_reads_give_the_plain_findings():
    """Every rule's finding (id, severity, message, shown fields, fix, source) on every context of the corpus."""
    for eff, env, raw in CONTEXTS:
        rules = _rules(eff)
        assert _rows(evaluate(rules, Ctx(eff, env, raw))) == _rows(evaluate(rules, PlainCtx(eff, env, raw)))


def test_kept_properties_equal_fresh_ones():
    """Each kept property read twice equals the plain property (same value, or the same exception each time)."""
    assert {"tp", "pp", "ep", "etp", "dp", "nmb", "is_moe", "has_dense_mlp", "flex_backend", "fsdp"} <= set(ONCE)
    for eff, env, raw in CONTEXTS[::5]:
        kept, plain = Ctx(eff, env, raw), PlainCtx(eff, env, raw)
        for name in ONCE:
            want = _outcome(getattr, plain, name)
            assert _outcome(getattr, kept, name) == want == _outcome(getattr, kept, name), name


def test_rules_of_a_frontend_are_the_filtered_registry(monkeypatch):
    """``rules_for`` (memoised) lists the registry's rules of a frontend in order, a rule registered later included."""
    from moetune.rules import engine
    from moetune.rules.check import rules_for

    reg = load_rules()
    for frontend in ("bridge", "megatron-lm", "other"):
        assert list(rules_for(frontend, len(reg))) == [r for r in reg.values() if frontend in r.frontends]
    monkeypatch.setattr(engine, "REGISTRY", dict(reg))
    monkeypatch.setattr("moetune.rules.check.REGISTRY", engine.REGISTRY)
    extra = engine.rule("TEST-001", "values", "info", "-", [], lambda c: True, "a test rule", "tests",
                        frontends=("megatron-lm",))
    assert rules_for("megatron-lm", len(load_rules()))[-1] is extra
    assert extra not in rules_for("bridge", len(load_rules()))


def test_kept_path_reads_equal_get_path():
    """``get`` / ``raw_get`` / ``raw_has`` read twice (with and without a default) equal ``get_path`` on present,
    missing, section and too-deep paths."""
    sentinel = object()
    for eff, env, raw in CONTEXTS[::7]:
        paths = [f"{s}.{k}" for s, sec in eff.items() if isinstance(sec, dict) for k in sec]
        paths += list(eff) + ["model.no_such_field", "no_such_section.x", "model.num_layers.deeper", "frontend.x"]
        c = Ctx(eff, env, raw)
        for path in paths:
            for default in (None, 7, None):
                assert c.get(path, default) is get_path(eff, path, default)
                assert c.raw_get(path, default) is get_path(raw, path, default)
                assert c.raw_has(path) is (get_path(raw, path, sentinel) is not sentinel)


def _old_stays(c: Ctx, kind: str):
    """topology._stays before the memo."""
    from moetune.spec.layout import Layout
    from moetune.spec.ranks import group_stays_in_domain

    dom = c.env.nvlink_domain or UNKNOWN
    if dom is UNKNOWN:
        return UNKNOWN
    lay = Layout(tp=c.tp, pp=c.pp, cp=c.cp, ep=c.ep, etp=c.etp)
    order = "tp-cp-ep-pp-dp" if c.get("dist.use_tp_pp_dp_mapping") else "tp-cp-ep-dp-pp"
    try:
        return group_stays_in_domain(kind, lay, dom, world_size=c.env.gpus, order=order)
    except (ValueError, TypeError):
        return UNKNOWN


@pytest.mark.parametrize("domain", [None, 4, 8, 72, 8.0])
def test_memoised_domain_test_equals_the_former_one(domain):
    """topology._stays (memoised on the sizes) against its former code, for every group kind, on every context
    with several NVLink-domain sizes (an unset one, and one of a type the memo does not key on)."""
    from dataclasses import replace

    for eff, env, raw in CONTEXTS[::2]:
        env = replace(env, nvlink_domain=domain)
        for kind in ("tp", "cp", "ep", "etp", "dp", "edp", "pp"):
            c = PlainCtx(eff, env, raw)
            assert _outcome(TOPO._stays, c, kind) == _outcome(_old_stays, c, kind), kind


def _old_stages(c: Ctx):
    lay = c.m("pipeline_model_parallel_layout")
    if lay is None or (isinstance(lay, str) and lay.startswith("<")):
        return None
    try:
        return [list(st) for st in parse_pipeline_layout(lay)]
    except LayoutError:
        return None


def _old_par031(c: Ctx):
    return _old_stages(c) is not None and (
        len(_old_stages(c)) % c.pp != 0
        or (c.vpp is not None and c.vpp != len(_old_stages(c)) // c.pp
            and not (c.vpp == 1 and len(_old_stages(c)) == c.pp)))


def _old_par031_fix(c: Ctx):
    return {"model.virtual_pipeline_model_parallel_size": (len(_old_stages(c)) // c.pp)
            if len(_old_stages(c)) // c.pp > 1 else None} \
        if len(_old_stages(c)) % c.pp == 0 else {"model.pipeline_model_parallel_layout": None}


LAYOUTS = [None, "<recipe>", "Et|tL", "Ett|tt|tt|tL", "Et*3|(tt|)*29m|L", "Ett|tt|tt|t|tL", [["embedding", "decoder"],
           ["decoder", "loss"]], "[['embedding'], ['decoder', 'loss']]", "Ex|L", "", [["bogus"]], 3]


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
def test_stage_count_rule_equals_its_former_code(layout):
    """PAR-031 (condition and fix) reads the stage count once; the former code parsed the layout up to four
    times. Both agree on layouts of several stage counts, VPP sizes and unparseable or odd values."""
    rule = load_rules()["PAR-031"]
    env = Env(gpus=16)
    for pp in (1, 2, 4):
        for vpp in (None, 1, 2, 4):
            cfg = apply_overrides(_cfg({}), {"model.pipeline_model_parallel_size": pp,
                                             "model.virtual_pipeline_model_parallel_size": vpp,
                                             "model.pipeline_model_parallel_layout": layout})
            raw = normalize_input(cfg)
            try:
                eff = effective_config(raw, env)
            except (TypeError, ValueError, AttributeError):
                continue
            c = Ctx(eff, env, raw)
            assert _outcome(rule.when, c) == _outcome(_old_par031, c)
            assert _outcome(rule.fix, c) == _outcome(_old_par031_fix, c)


def _old_impossible(path: str, lo: int):
    from moetune.rules.values import _number

    def when(c: Ctx) -> bool:
        x = _number(c.get(path))
        return x is not None and (not math.isfinite(x) or x < lo or not x.is_integer())

    return when


@pytest.mark.parametrize("value", [None, 0, 1, 2, -1, -4, 7, 2**53 - 1, 2**53, -(2**53), 10**400, True, False, 0.0,
                                   1.0, 1.5, -2.0, float("nan"), float("inf"), "3", " 4 ", "0", "abc", "1e400", [1],
                                   {"a": 1}])
def test_impossible_value_rules_equal_their_former_code(value):
    """VAL-* (an int compared directly, everything else through ``_number``) against the former condition."""
    from moetune.rules.values import _FIELDS

    for rid, path, lo, _ in _FIELDS[:3] + _FIELDS[8:9] + _FIELDS[18:19]:
        cfg = {"model": {}, "train": {}, "ddp": {}, "dataset": {}}
        section, name = path.split(".")
        cfg[section][name] = value
        c = Ctx(cfg, Env())
        assert _outcome(load_rules()[rid].when, c) == _outcome(_old_impossible(path, lo), c), (rid, value)


@pytest.mark.parametrize("model", [{}, {"fp8": "hybrid"}, {"fp8": None, "bf16": True}, {"tp_comm_overlap": True},
                                   {"batch_p2p_comm": False, "params_dtype": "float32"}, None, "x"])
def test_rewritten_on_model_equals_the_per_field_reads(model):
    """PRC-002 / OVL-013 read the raw model section once; the former code read each field with raw_has / raw_get."""
    from moetune.rules.common import rewritten_on_model
    from moetune.rules.precision import MP_FIELDS_ON_MODEL

    fields = MP_FIELDS_ON_MODEL + ("tp_comm_overlap", "batch_p2p_comm", "overlap_p2p_comm")
    raw = {"model": model} if model is not None else {}
    for eff_model in ({}, {"fp8": "hybrid", "bf16": False, "tp_comm_overlap": True}, {"batch_p2p_comm": True}):
        c = Ctx({"model": eff_model}, Env(), raw)
        old = any(c.raw_has(f"model.{f}") and c.raw_get(f"model.{f}") != c.m(f) for f in fields)
        assert rewritten_on_model(c, fields) is old


def test_unknown_truth_is_not_kept():
    """A property whose computation asks for the truth of UNKNOWN raises again on the next read (nothing stored)."""

    class Probe(Ctx):
        @_once
        def asks(self):
            return bool(UNKNOWN)

    c = Probe({"model": {}}, Env())
    for _ in range(2):
        with pytest.raises(UnknownTruth):
            c.asks  # noqa: B018
    assert "asks" not in vars(c)

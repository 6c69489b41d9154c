"""HybridEP's rank capacity factor and paged stash (``moe_expert_rank_capacity_factor``, ``moe_paged_stash``) and the
planner's whole-iteration CUDA-graph variant that needs them for a dropless MoE: one vocabulary (estimate flags,
``plan --fix`` keys, Bridge / Megatron-LM loaders and emitters, release presets), the check rules (CG-029, MOE-044),
the pricing (expert buffers sized by the budget or the stash, no per-layer host sync) and where the planner offers
the variant."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from moetune.catalog.memory_constants import const
from moetune.catalog.models import get_model
from moetune.catalog.release_configs import preset_features, release_preset
from moetune.catalog.systems import get_system
from moetune.cli import app
from moetune.errors import InputError
from moetune.io.check import check_job
from moetune.io.config_to_job import config_to_bridge_overrides, job_from_config, job_to_config
from moetune.io.load import adapt_features, feature_args, parse_fix
from moetune.perfmodel import activations as act
from moetune.perfmodel.memory import act_config
from moetune.perfmodel.routing import expert_buffer_load, expert_load, rank_capacity_active, static_expert_shapes
from moetune.perfmodel.step import estimate_time
from moetune.plan import search as P
from moetune.plan.launch import launch_for
from moetune.plan.space import LayoutPoint
from moetune.spec import Features, Job, Layout

RUNNER = CliRunner()
HYBRIDEP = dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep")
FULL = dict(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",))


def _job(features: dict, *, model: str = "Qwen3-30B-A3B", system: str = "GB200-NVL72", layout: dict | None = None
         ) -> Job:
    return Job(model=get_model(model), system=get_system(system), gpus=8, global_batch_size=256, micro_batch_size=1,
               seq_length=4096, layout=Layout(**(layout or dict(tp=1, pp=1, ep=8))), features=Features(**features))


def _ids(job: Job) -> dict[str, str]:
    return {f.id: str(f.severity) for f in check_job(job)}


# --- vocabulary ---------------------------------------------------------------------------------------------------


def test_estimate_flags_set_the_fields_and_bad_values_exit_2():
    base = ["estimate", "--model", "Qwen3-30B-A3B", "--system", "GB200-NVL72", "--gpus", "8", "--gbs", "256",
            "--seq", "4096", "--ep", "8", "--dispatcher", "hybridep", "--recipe", "none", "--json"]
    res = RUNNER.invoke(app, [*base, "--rank-capacity-factor", "1.5", "--paged-stash"], catch_exceptions=False)
    assert res.exit_code == 0, res.output[-2000:]
    f = json.loads(res.stdout)["job"]["features"]
    assert f["moe_expert_rank_capacity_factor"] == 1.5 and f["moe_paged_stash"] is True
    for bad in ("0", "-1", "abc", "nan"):
        with pytest.raises(InputError, match="--rank-capacity-factor") as ei:
            RUNNER.invoke(app, [*base, "--rank-capacity-factor", bad], catch_exceptions=False)
        assert ei.value.exit_code == 2 and "\n" not in str(ei.value), bad


def test_fix_keys_and_reproduce_flags():
    fix = parse_fix("rank_capacity_factor=1.5,paged_stash=1")
    assert fix == {"rank_capacity_factor": "1.5", "paged_stash": 1}
    assert parse_fix("moe_expert_rank_capacity_factor=none") == {"rank_capacity_factor": "none"}
    with pytest.raises(Exception, match="rank-capacity-factor"):
        parse_fix("rank_capacity_factor=0")
    args = feature_args(Features(**HYBRIDEP, moe_expert_rank_capacity_factor=1.5, moe_paged_stash=True))
    assert "--rank-capacity-factor 1.5" in args and "--paged-stash" in args
    args = feature_args(Features())
    assert "--rank-capacity-factor none" in args and "--no-paged-stash" in args


def test_bridge_and_megatron_configs_round_trip_and_launch_carries_them():
    job = _job({**HYBRIDEP, **FULL, "precision": "mxfp8", "moe_expert_rank_capacity_factor": 1.5,
                "moe_paged_stash": True})
    cfg = job_to_config(job)
    m = cfg["model"]
    assert m["moe_expert_rank_capacity_factor"] == 1.5 and m["moe_paged_stash"] is True
    assert m["use_transformer_engine_op_fuser"] is True and m["cuda_graph_impl"] == "full_iteration"
    back = job_from_config(cfg, system=job.system, gpus=job.gpus)
    assert back.features.moe_expert_rank_capacity_factor == 1.5 and back.features.moe_paged_stash
    ov = config_to_bridge_overrides(cfg)
    assert "model.moe_expert_rank_capacity_factor=1.5" in ov and "model.moe_paged_stash=true" in ov
    launch = launch_for(job)
    assert "model.moe_expert_rank_capacity_factor=1.5" in launch["bridge_overrides_tuning"]
    assert "model.use_transformer_engine_op_fuser=true" in launch["bridge_overrides_tuning"]
    assert "--moe-expert-rank-capacity-factor" in launch["megatron_args"]
    # not set: nothing emitted (dynamic shapes)
    plain = job_to_config(_job(HYBRIDEP))["model"]
    assert "moe_expert_rank_capacity_factor" not in plain and "moe_paged_stash" not in plain


def test_adapt_features_drops_a_budget_the_dispatcher_cannot_run():
    f = Features(**HYBRIDEP, moe_expert_rank_capacity_factor=1.5, moe_paged_stash=True)
    m = get_model("Qwen3-30B-A3B")
    kept = adapt_features(f, m, Layout(tp=1, pp=1, ep=8))
    assert kept.moe_expert_rank_capacity_factor == 1.5 and kept.moe_paged_stash
    dropped = adapt_features(f, m, Layout(tp=1, pp=1, ep=1))  # no expert group: alltoall, so no HybridEP budget
    assert dropped.moe_expert_rank_capacity_factor is None and not dropped.moe_paged_stash
    pinned = adapt_features(f, m, Layout(tp=1, pp=1, ep=1), given={"rank_capacity_factor"})
    assert pinned.moe_expert_rank_capacity_factor == 1.5


def test_release_presets_of_full_iteration_moe_carry_the_budget():
    """Bridge 26.06 ``set_full_iter_cg_configs``: the DeepSeek-V3 GB300 preset (PP2 VP8 EP32, full_iteration,
    HybridEP) runs factor 1.5 with the paged stash; a TE-scoped preset leaves both unset."""
    p = release_preset("DeepSeek-V3", "DGX-GB300", "mxfp8", "26.06", gpus=256, tp=1, pp=2, cp=1, vp=8, ep=32,
                       etp=None, gbs=2048, mbs=1)
    assert p is not None and p.fields["cuda_graph_impl"] == "full_iteration"
    upd, _ = preset_features(p, "GB300")
    recipe = const("full_iteration_moe_recipe")
    assert upd["moe_expert_rank_capacity_factor"] == recipe["moe_expert_rank_capacity_factor"] == 1.5
    assert upd["moe_paged_stash"] is True and upd["moe_flex_dispatcher_backend"] == "hybridep"
    p = release_preset("Qwen3-30B-A3B", "DGX-B200", "mxfp8", "26.02.01", gpus=8, tp=1, pp=1, cp=1, vp=None, ep=8,
                       etp=None, gbs=512, mbs=4)
    upd, _ = preset_features(p, "B200")
    assert upd["moe_expert_rank_capacity_factor"] is None and upd["moe_paged_stash"] is False


# --- rules ----------------------------------------------------------------------------------------------------------


def test_cg029_warns_for_dynamic_shapes_only_and_moe044_needs_hybridep():
    dynamic = _ids(_job({**HYBRIDEP, **FULL}))
    assert dynamic.get("CG-029", "").startswith("warn")
    supported = _ids(_job({**HYBRIDEP, **FULL, "moe_expert_rank_capacity_factor": 1.5, "moe_paged_stash": True}))
    assert "CG-029" not in supported and "MOE-044" not in supported and "OFF-019" not in supported
    assert not [i for i, s in supported.items() if s.startswith("error")], supported
    deepep = _ids(_job({"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep", **FULL,
                        "moe_expert_rank_capacity_factor": 1.5}))
    assert deepep.get("MOE-044", "").startswith("error")
    stash_alone = _ids(_job({**HYBRIDEP, **FULL, "moe_paged_stash": True}))
    assert stash_alone.get("OFF-019", "").startswith("error") and "CG-029" in stash_alone


# --- pricing ----------------------------------------------------------------------------------------------------


def test_budget_sets_the_expert_buffers_not_the_load():
    dyn = Features(**HYBRIDEP, moe_routing_imbalance=1.3)
    cap = dyn.model_copy(update={"moe_expert_rank_capacity_factor": 1.5})
    stash = cap.model_copy(update={"moe_paged_stash": True})
    deepep = cap.model_copy(update={"moe_flex_dispatcher_backend": "deepep"})
    assert expert_load(dyn) == expert_load(cap) == expert_load(stash) == 1.3  # dropless: the work is the routing's
    assert expert_buffer_load(dyn) == 1.3 and expert_buffer_load(cap) == 1.5
    assert expert_buffer_load(stash) == const("moe_paged_stash_buffer_size_factor_cuda") == 1.2
    assert not rank_capacity_active(deepep)  # MCore rejects it (MOE-044); its memory still reads the factor
    assert static_expert_shapes(cap) and not static_expert_shapes(dyn) and not static_expert_shapes(deepep)


def test_saved_expert_tensors_scale_with_the_budget():
    m = get_model("Qwen3-30B-A3B")
    balanced = dict(**HYBRIDEP, moe_router_force_load_balancing=True)

    def moe_bytes(**upd) -> float:
        cfg = act_config(_job({**balanced, **upd}))
        comps = dict(act.layer_components(m, "A", "E", cfg))
        return comps["moe_dispatched"] + comps["moe_act"]

    mean = moe_bytes()
    assert moe_bytes(moe_expert_rank_capacity_factor=1.5) == pytest.approx(1.5 * mean)
    assert moe_bytes(moe_expert_rank_capacity_factor=1.5, moe_paged_stash=True) == pytest.approx(1.2 * mean)


def test_static_budget_removes_the_per_layer_host_sync():
    """Eager HybridEP: dropless dispatch syncs once per MoE layer (``tokens_per_expert.sum()``); with the budget it
    does not, so the host wall can only shrink; compute and communication are unchanged."""
    dyn = estimate_time(_job(HYBRIDEP))
    cap = estimate_time(_job({**HYBRIDEP, "moe_expert_rank_capacity_factor": 1.5}))
    assert cap.step_time_s <= dyn.step_time_s
    assert cap.walls["compute"].seconds == pytest.approx(dyn.walls["compute"].seconds)


# --- planner ---------------------------------------------------------------------------------------------------


def _req(model: str, **kw) -> P.PlanRequest:
    return P.PlanRequest(model=get_model(model), system=get_system("GB200-NVL72"), gpus=8, global_batch_size=256,
                         seq_length=4096, dispatchers=("alltoall", "deepep", "hybridep"), **kw)


def _full(variants: list[dict]) -> list[dict]:
    return [v for v in variants if v["cuda_graph_scope"] == ("full_iteration",)]


def test_planner_offers_full_iteration_only_where_legal():
    req = _req("Qwen3-30B-A3B")
    lp = LayoutPoint(tp=1, cp=1, pp=1, vpp=1, ep=8, etp=1, mbs=1, dp=8, edp=1)
    none = P._recompute_options(req.model, "none")[0][1]
    full_rec = dict(P._recompute_options(req.model, "full"))[99]
    by_disp = {d["moe_flex_dispatcher_backend"] or d["moe_token_dispatcher_type"]: _full(P._graph_variants(req, none, d))
               for d in P._dispatcher_variants(req, lp)}
    assert by_disp["alltoall"] == [] and by_disp["deepep"] == []
    recipe = const("full_iteration_moe_recipe")
    (v,) = by_disp["hybridep"]
    assert v["moe_expert_rank_capacity_factor"] == recipe["moe_expert_rank_capacity_factor"]
    assert v["moe_paged_stash"] == recipe["moe_paged_stash"] and v["cuda_graph_impl"] == "local"
    hyb = next(d for d in P._dispatcher_variants(req, lp) if d["moe_flex_dispatcher_backend"] == "hybridep")
    assert _full(P._graph_variants(req, full_rec, hyb))  # full recompute: whole-iteration graph still legal
    assert all(v["moe_expert_rank_capacity_factor"] is None for v in P._graph_variants(req, none, hyb)
               if v["cuda_graph_scope"] != ("full_iteration",))
    assert not _full(P._graph_variants(_req("Qwen3-30B-A3B", explore_graphs=False), none, hyb))
    dense = _req("Llama-3-8B")
    (d,) = _full(P._graph_variants(dense, none, P._dispatcher_variants(dense, lp)[0]))
    assert d["moe_expert_rank_capacity_factor"] is None and not d["moe_paged_stash"]
    # every variant the planner prices for HybridEP passes the checker without errors
    for v in P._graph_variants(req, none, hyb):
        job = P._job(req, lp, P._base_features(req.model, "bf16", lp).model_copy(update={**none, **hyb, **v}))
        errors = [f.id for f in check_job(job) if str(f.severity).startswith("error")]
        assert not errors and "CG-029" not in _ids(job), (v, errors)


def test_pins_are_kept():
    req = _req("Qwen3-30B-A3B", fix=parse_fix("cuda_graph_scope=full_iteration,rank_capacity_factor=2"))
    hyb = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}
    (v,) = P._graph_variants(req, P._recompute_options(req.model, "none")[0][1], hyb)
    assert v["cuda_graph_scope"] == ("full_iteration",) and v["moe_expert_rank_capacity_factor"] == 2.0
    assert v["moe_paged_stash"] is True  # the recipe's companion, not pinned


def test_service_mcp_and_web_share_the_flags():
    """The MCP / web service reads the estimate command's own options: the same arguments give the CLI's numbers,
    and a bad factor is the same one-line exit-2 error."""
    from moetune import service

    props = service.schema("estimate")["properties"]
    assert "rank_capacity_factor" in props and "paged_stash" in props
    args = {"model": "Qwen3-30B-A3B", "system": "GB200-NVL72", "gpus": 8, "gbs": 256, "seq": 4096, "ep": 8,
            "dispatcher": "hybridep", "cuda_graph_scope": "full_iteration", "rank_capacity_factor": "1.5",
            "paged_stash": True, "recipe": "none"}
    got = service.run("estimate", args)
    flags = [f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')}={v}" for k, v in args.items()]
    res = RUNNER.invoke(app, ["estimate", *flags, "--json"], catch_exceptions=False)
    cli = json.loads(res.stdout)
    assert got["time"]["step_time_s"] == cli["time"]["step_time_s"]
    assert got["memory"]["stages"] == cli["memory"]["stages"]
    assert got["job"]["features"]["moe_paged_stash"] is True
    with pytest.raises(service.CommandError) as ei:
        service.run("estimate", {**args, "rank_capacity_factor": "0"})
    assert ei.value.exit_code == 2 and "--rank-capacity-factor" in str(ei.value)


def test_no_whole_iteration_graph_with_activation_offloading():
    """Layer CPU offloading with a whole-iteration graph is documented as unsupported (CG-011w) and fine-grained
    offloading needs settings the planner does not search (CG-020): the option's updates carry the offloading."""
    dense = _req("Llama-3-8B")
    lp = LayoutPoint(tp=1, cp=1, pp=1, vpp=1, ep=1, etp=1, mbs=1, dp=8, edp=8)
    disp = P._dispatcher_variants(dense, lp)[0]
    none = P._recompute_options(dense.model, "none")[0][1]
    assert _full(P._graph_variants(dense, none, disp))
    for extra in ({"cpu_offloading": True, "cpu_offloading_num_layers": 4}, P.OFFLOAD_UPDATES):
        assert not _full(P._graph_variants(dense, {**none, **extra}, disp)), extra


def test_sweep_harness_carries_the_budget():
    from moetune.sweep.overrides import harness_flags

    kw = dict(precision="mxfp8", gbs=256, mbs=1, seq=4096, steps=10, gpus=8, gpus_per_node=4, gpu="gb200",
              family="qwen", recipe="qwen3_30b_a3b")
    lay = {"tp": 1, "pp": 1, "ep": 8}
    feats = {**HYBRIDEP, **FULL, "moe_expert_rank_capacity_factor": 1.5, "moe_paged_stash": True}
    args = harness_flags(lay, feats, **kw)
    assert "model.moe_expert_rank_capacity_factor=1.5" in args and "model.moe_paged_stash=true" in args
    assert "model.use_transformer_engine_op_fuser=true" in args
    plain = harness_flags(lay, {**HYBRIDEP, "moe_expert_rank_capacity_factor": None, "moe_paged_stash": False}, **kw)
    assert not [a for a in plain if "rank_capacity" in a or "paged_stash" in a or "op_fuser" in a]

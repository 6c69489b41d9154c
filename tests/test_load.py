"""The one loader (moetune.io.load): Bridge recipes as input, Megatron's pipeline splits, one feature vocabulary.

Commands run in-process through typer's CliRunner (the CLI contract: flags and ``--json`` output); error paths run
the real ``python -m moetune`` for the exit code and the one-line message.
"""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from conftest import run_cli
from moetune.catalog.models import get_model
from moetune.catalog.recipes import list_recipes, recipe_config
from moetune.catalog.systems import get_system
from moetune.cli import app
from moetune.errors import InputError
from moetune.io.check import check_config
from moetune.io.config_to_job import job_to_config
from moetune.io.load import FIX_KEYS, FeatureChoices, JobFlags, choice_updates, fix_choices, load_job, parse_fix
from moetune.rules.engine import Env
from moetune.spec.pipeline import stage_strings
from moetune.spec.validate import layout_violation, world_size_violation

RUNNER = CliRunner()


def invoke(*args: str) -> dict:
    res = RUNNER.invoke(app, [*args, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output[-2000:]
    return json.loads(res.stdout)


def _in_catalog(name: str, kind: str) -> bool:
    try:
        (get_model if kind == "model" else get_system)(name)
    except InputError:
        return False
    return True


PRETRAIN = [r for r in list_recipes() if r["task"] == "pretrain" and r["variant"] is None
            and _in_catalog(r["model"], "model") and _in_catalog(r["system"], "system")]


def _own_layout_error(name: str) -> str | None:
    """What Megatron rejects in a recipe at its own GPU count (PAR-001/002), or None."""
    lay = recipe_config(name)["model"]
    tp, cp, pp, ep = (lay.get(k) or 1 for k in ("tensor_model_parallel_size", "context_parallel_size",
                                                "pipeline_model_parallel_size", "expert_model_parallel_size"))
    etp = lay.get("expert_tensor_parallel_size") or (1 if ep > 1 else tp)
    return world_size_violation(tp, cp, pp, ep, etp, next(r["gpus"] for r in PRETRAIN if r["name"] == name))


@pytest.mark.parametrize("name", [r["name"] for r in PRETRAIN])
def test_estimate_every_flat_perf_recipe(name):
    """Must show: ``moetune estimate --recipe NAME --json`` for every current flat pretrain perf recipe whose model
    and system are in the catalog returns memory and time; a recipe whose own layout does not divide its GPU count
    is a one-line layout error naming the rule."""
    bad = _own_layout_error(name)
    if bad is not None:
        res = RUNNER.invoke(app, ["estimate", "--recipe", name, "--json"])
        assert isinstance(res.exception, InputError) and "PAR-00" in str(res.exception), bad
        return
    out = invoke("estimate", "--recipe", name)
    assert out["memory"]["stages"] and out["memory"]["capacity_gib"] > 0
    assert out["time"]["step_time_s"] > 0 and out["time"]["model_tflops_per_gpu"] > 0
    assert any(name in a for a in out["assumptions"])


def test_most_recipes_estimate():
    legal = [r["name"] for r in PRETRAIN if _own_layout_error(r["name"]) is None]
    assert len(PRETRAIN) >= 100 and len(legal) >= 0.9 * len(PRETRAIN)


def test_recipes_command_lists_and_filters():
    out = invoke("recipes", "--model", "qwen3-30b-a3b", "--system", "DGX-H100", "--precision", "bf16")
    assert out["count"] >= 1
    for r in out["recipes"]:
        assert r["model"] == "Qwen3-30B-A3B" and r["precision"] == "BF16" and r["system"] == "DGX-H100"
        assert {"tp", "pp", "ep"} <= set(r["layout"]) and "dispatcher" in r["features"]
    everything = invoke("recipes")
    assert everything["count"] == len(list_recipes())
    gb = invoke("recipes", "--system", "GB200-NVL72", "--gpus", "256")
    assert gb["count"] and all(r["gpus"] == 256 and "b200" not in r["gpu"].replace("gb200", "") for r in gb["recipes"])


def test_unknown_recipe_is_one_line_with_the_closest_name():
    p = run_cli("estimate", "--recipe", "qwen3_30b_a3b_pretrain_16gpu_h100_bf17_config")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "closest" in p.stderr and "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_flags_start_from_the_recipe_and_recipe_none_from_library_defaults():
    args = ("estimate", "--model", "Qwen3-30B-A3B", "--gpus", "16", "--gbs", "1024", "--seq", "4096", "--ep", "16")
    auto = invoke(*args)
    assert any("qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config" in a for a in auto["assumptions"])
    assert auto["job"]["features"]["moe_router_force_load_balancing"] is False  # natural routing unless asked
    lib = invoke(*args, "--recipe", "none")
    assert any("library defaults" in a for a in lib["assumptions"])
    rec = invoke("estimate", "--recipe", "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config")
    assert rec["job"]["features"] == {**auto["job"]["features"], "moe_router_force_load_balancing": True}
    drop = lambda lay: {k: v for k, v in lay.items() if k != "etp"}  # noqa: E731 - ETP 1 = Bridge default at EP>1
    assert drop(rec["job"]["layout"]) == drop(auto["job"]["layout"]) and rec["job"]["layout"]["etp"] in (1, None)


def test_recipe_with_overrides_and_flags():
    base = invoke("estimate", "--recipe", "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config")
    out = invoke("estimate", "--recipe", "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config",
                 "model.expert_model_parallel_size=8", "--recompute", "full", "--gbs", "512")
    assert out["job"]["layout"]["ep"] == 8 and out["job"]["global_batch_size"] == 512
    assert out["job"]["features"]["recompute_granularity"] == "full"
    assert base["job"]["features"]["recompute_granularity"] is None


# ----- pipeline splits --------------------------------------------------------------------------------------------


def test_published_row_with_uneven_layers_estimates():
    """The issue's example: 94 layers over PP4 x VPP12 (Bridge's recipe accounts for embedding and loss)."""
    out = invoke("estimate", "--model", "Qwen3-235B-A22B", "--system", "GB300-NVL72", "--gpus", "256", "--gbs",
                 "8192", "--seq", "4096", "--precision", "mxfp8", "--tp", "1", "--pp", "4", "--vpp", "12", "--ep", "32")
    lay = out["job"]["layout"]
    assert lay["account_for_embedding_in_pipeline_split"] and lay["account_for_loss_in_pipeline_split"]
    assert any("pipeline split from the Bridge recipe" in a for a in out["assumptions"])
    assert "model.account_for_embedding_in_pipeline_split=true" in out["launch"]["bridge_overrides_tuning"]
    assert out["time"]["step_time_s"] > 0


@pytest.mark.parametrize("model,gpus,pp,vpp", [("DeepSeek-V3", 1024, 8, None), ("Kimi-K2", 1024, 16, None),
                                                ("Llama-3.1-405B", 512, 16, None), ("DeepSeek-V3", 512, 4, 2)])
def test_no_even_split_uses_the_planners_balanced_layout(model, gpus, pp, vpp):
    args = ["estimate", "--model", model, "--gpus", str(gpus), "--gbs", "4096", "--seq", "4096", "--pp", str(pp),
            "--recipe", "none"]
    if vpp:
        args += ["--vpp", str(vpp)]
    if get_model(model).is_moe:
        args += ["--ep", "32"]
    out = invoke(*args)
    text = out["job"]["layout"]["pipeline_layout"]
    assert text and any("FLOPs-balanced" in a and text in a for a in out["assumptions"])
    assert f"model.pipeline_model_parallel_layout={text}" in out["launch"]["bridge_overrides_tuning"]
    from moetune.plan.space import SpaceLimits, enumerate_layouts

    m = get_model(model)
    planned = {lp.pipeline_layout for lp in enumerate_layouts(
        m, get_system("DGX-H100"), gpus, 4096, 4096,
        SpaceLimits(fix={"pp": pp, "vpp": vpp or 1, "tp": 1, "cp": 1, "ep": 32 if m.is_moe else 1, "mbs": 1}))}
    assert planned == {text}


def test_explicit_split_flags_follow_megatron():
    base = ["estimate", "--model", "DeepSeek-V3", "--gpus", "1024", "--gbs", "4096", "--seq", "4096", "--pp", "8",
            "--ep", "64", "--recipe", "none"]
    out = invoke(*base, "--num-layers-in-first-pipeline-stage", "7", "--num-layers-in-last-pipeline-stage", "6")
    lay = out["job"]["layout"]
    assert (lay["num_layers_in_first_pipeline_stage"], lay["num_layers_in_last_pipeline_stage"]) == (7, 6)
    assert lay["pipeline_layout"] is None
    bad = run_cli(*base, "--num-layers-in-first-pipeline-stage", "8", "--num-layers-in-last-pipeline-stage", "8")
    assert bad.returncode == 2 and "PAR-028" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    both = run_cli(*base, "--num-layers-in-first-pipeline-stage", "7", "--account-for-loss-in-pipeline-split")
    assert both.returncode == 2 and "PAR-029" in both.stderr


@pytest.mark.parametrize("layers_pp_vpp_acc", [(94, 4, 12, (True, True)), (94, 4, 1, (False, False)),
                                               (61, 8, 1, (True, True)), (62, 8, 1, (True, True)),
                                               (48, 4, 3, (False, True)), (126, 16, 1, (True, True)),
                                               (126, 16, 1, (False, False)), (61, 4, 2, (True, False))])
def test_rules_engine_par026_agrees_with_the_split(layers_pp_vpp_acc):
    """PAR-026/027 of the rules engine and spec.pipeline (Megatron's get_num_layers_to_build) give one answer."""
    layers, pp, vpp, (acc_e, acc_l) = layers_pp_vpp_acc
    model = get_model("Qwen3-235B-A22B").model_copy(update={"num_layers": layers, "mixer_pattern": "A" * layers,
                                                           "mlp_pattern": "E" * layers})
    fl = JobFlags(model=model, gpus=pp * 32, gbs=1024, seq=4096, pp=pp, vpp=vpp, ep=32, recipe="none")
    from moetune.io.load import SplitFlags

    fl = JobFlags(**{**fl.__dict__, "split": SplitFlags(account_embedding=acc_e, account_loss=acc_l)})
    try:
        job = load_job(fl)
        legal = layout_violation(job.model, job.layout, job.gpus) is None
        cfg = job_to_config(job)
    except InputError:
        legal, cfg = False, None
    total = layers + acc_e + acc_l
    even = total % pp == 0 and (total // pp) % vpp == 0
    if not (acc_e or acc_l) and not even:  # no split given: the FLOPs-balanced layout string, legal
        assert legal and job.layout.pipeline_layout
        return
    assert legal == even
    if cfg is not None:
        ids = {f.id for f in check_config(cfg, Env(gpus=pp * 32)).findings}
        assert ("PAR-026" in ids or "PAR-027" in ids) == (not legal)
        if legal:
            assert len(stage_strings(job.model, job.layout)) == pp * vpp


# ----- one vocabulary ---------------------------------------------------------------------------------------------

_FLAG_FOR = {"fsdp": ("--fsdp", "1"), "ep_overlap": ("--ep-overlap", "1"), "delay_wgrad": ("--delay-wgrad", "1"),
             "tp_comm_overlap": ("--no-tp-comm-overlap", "0"), "recompute": ("--recompute", "moe_act,layernorm"),
             "offload": ("--offload-modules", "expert_fc1,moe_act"), "cuda_graph_scope": ("--cuda-graph-scope",
                                                                                       "attn,moe_router"),
             "dispatcher": ("--dispatcher", "hybridep")}


@pytest.mark.parametrize("key", sorted(_FLAG_FOR))
def test_fix_keys_mean_the_estimate_flags(key):
    """Every feature key ``plan --fix`` pins is an estimate flag with the same meaning (one parser)."""
    flag, value = _FLAG_FOR[key]
    fix_val = value.replace(",", "+")
    pinned = parse_fix(f"{key}={fix_val}")
    assert key in FIX_KEYS
    pipeline = ["--pp", "1"] if key == "fsdp" else ["--pp", "2", "--vpp", "2"]  # Megatron-FSDP replaces PP
    args = ["estimate", "--model", "Qwen3-30B-A3B", "--gpus", "16", "--gbs", "256", "--seq", "4096", "--ep", "8",
            "--tp", "2", *pipeline, "--recipe", "none"]
    args += [flag] if flag.startswith(("--fsdp", "--ep-overlap", "--delay-wgrad", "--no-")) else [flag, value]
    feats = invoke(*args)["job"]["features"]
    for k, v in choice_updates(fix_choices(pinned)).items():
        assert feats[k] == (list(v) if isinstance(v, tuple) else v), k


def test_bad_fix_and_flag_values_are_one_line_errors():
    with pytest.raises(InputError, match="closest"):
        parse_fix("ep_overlapp=1")
    with pytest.raises(InputError, match="recompute"):
        parse_fix("recompute=everything")
    with pytest.raises(InputError, match="dispatcher"):
        choice_updates(FeatureChoices(dispatcher="nccl"))
    p = run_cli("estimate", "--model", "Qwen3-30B-A3B", "--gpus", "8", "--gbs", "64", "--seq", "4096",
                "--cuda-graph-scope", "everything")
    assert p.returncode == 2 and "--cuda-graph-scope" in p.stderr


def test_seq_length_alias_and_precision_names():
    a = invoke("estimate", "--model", "OLMoE-1B-7B", "--gpus", "8", "--gbs", "64", "--seq-length", "2048",
               "--precision", "FP8-CS", "--recipe", "none")
    b = invoke("estimate", "--model", "OLMoE-1B-7B", "--gpus", "8", "--gbs", "64", "--seq", "2048",
               "--precision", "fp8_cs", "--recipe", "none")
    assert a["time"] == b["time"] and a["job"]["seq_length"] == 2048


def test_reproduce_line_parses_back():
    out = invoke("plan", "--model", "OLMoE-1B-7B", "--gpus", "8", "--gbs", "64", "--seq", "2048", "--top", "1")
    line = out["candidates"][0]["reproduce"]
    assert line.startswith("moetune estimate ") and "--recipe" in line
    est = invoke(*shlex.split(line)[1:])
    assert est["time"]["step_time_s"] == out["candidates"][0]["time"]["step_time_s"]


# ----- models without a Bridge perf recipe start from the perf launcher's common settings ---------------------------


def _published(model: str, system: str, gpus: int, precision: str, **lay):
    from moetune.io.load import build_published_job

    kw = {"gbs": 128, "mbs": 1, "seq": 8192, "tp": 4, "pp": 8, "cp": 1, "vp": 4, "ep": 1, **lay}
    return build_published_job(model=get_model(model), system=system, gpus=gpus, precision=precision, **kw)


def test_published_llama_job_gets_the_perf_launchers_common_settings():
    """Llama has no perf recipe in the catalog: its published job reduces gradients in BF16 (4 -> 2 bytes of main
    grads), gathers FP8 params under MXFP8 as Bridge's precision config does, and uses expandable segments."""
    from moetune.io.load import PERF_COMMON
    from moetune.perfmodel.memory import grad_buffer_bytes

    job = _published("LLAMA3.1_405B", "GB300", 256, "mxfp8", pp=8, cp=2)
    f = job.features
    assert {k: getattr(f, k) for k in PERF_COMMON} == PERF_COMMON
    assert f.grad_reduce_in_fp32 is False and grad_buffer_bytes(f) == 2
    assert f.fp8_param_gather is True and f.expandable_segments is True
    assert f.hidden_dropout == 0.0 and f.tp_comm_overlap is True
    assert any("perf launcher's common settings" in a for a in job.assumptions)
    bf16 = _published("LLAMA3.1_405B", "GB300", 256, "bf16", pp=8, cp=2).features
    assert bf16.fp8_param_gather is False and bf16.grad_reduce_in_fp32 is False


def test_published_job_of_a_model_with_a_recipe_keeps_the_recipe_features():
    """A model with a perf recipe prices from the recipe, which already carries the common settings."""
    from moetune.io.load import PERF_COMMON, find_perf_recipe, recipe_job

    model, system = get_model("DeepSeek-V3"), get_system("GB200")
    assert find_perf_recipe(model, system, 256, "mxfp8") is not None
    job = _published("DeepSeek-V3", "GB200", 256, "mxfp8", tp=1, pp=4, vp=4, ep=64)
    rjob, _ = recipe_job(model, system, 256, "mxfp8")
    for k in ("grad_reduce_in_fp32", "recompute_modules", "moe_flex_dispatcher_backend", "cuda_graph_scope",
              "main_grads_dtype", *PERF_COMMON):
        assert getattr(job.features, k) == getattr(rjob.features, k), k
    assert not any("perf launcher's common settings" in a for a in job.assumptions)


def test_llama_estimate_and_plan_start_from_the_perf_common_settings_recipe_none_from_library_defaults():
    args = ("--model", "LLAMA3_70B", "--system", "GB200", "--gpus", "64", "--gbs", "128", "--seq", "8192",
            "--precision", "mxfp8")
    est = invoke("estimate", *args, "--tp", "2", "--pp", "4", "--vpp", "5")
    f = est["job"]["features"]
    assert f["grad_reduce_in_fp32"] is False and f["manual_gc"] is True and f["fp8_param_gather"] is True
    assert f["cross_entropy_fusion_impl"] == "te" and f["expandable_segments"] is True
    assert any("perf launcher's common settings" in a for a in est["assumptions"])
    lib = invoke("estimate", *args, "--tp", "2", "--pp", "4", "--vpp", "5", "--recipe", "none")
    assert lib["job"]["features"]["grad_reduce_in_fp32"] is True and lib["job"]["features"]["manual_gc"] is False
    assert est["memory"]["peak_allocated_gib"] < lib["memory"]["peak_allocated_gib"]  # BF16 main grads
    plan = invoke("plan", *args, "--top", "1")
    top = plan["candidates"][0]
    assert top["features"]["grad_reduce_in_fp32"] is False and top["features"]["manual_gc"] is True
    launch = [x for k in ("bridge_overrides", "bridge_overrides_tuning") for x in top["launch"][k]]
    assert "mixed_precision.grad_reduce_in_fp32=false" in launch and "train.manual_gc=true" in launch
    # the reproduce line names the same start, so estimate rebuilds the candidate's job
    assert top["reproduce"].endswith("--recipe perf-common")
    again = invoke(*shlex.split(top["reproduce"])[1:])
    assert again["job"]["features"] == top["features"]
    assert again["time"]["step_time_s"] == pytest.approx(top["time"]["step_time_s"])

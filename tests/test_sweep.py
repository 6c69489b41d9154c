"""Sweep generation, scripts, submit dry-run and the parts of collect that need no log reader."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.conftest import REPO, run_cli

from moetune.sweep.collect import _dispatcher_check, _undeclared_changes, collect_sweep
from moetune.sweep.phases import min_world_size
from moetune.sweep.plan_input import read_plan
from moetune.sweep.sweepdir import init_sweep

PLAN = REPO / "tests" / "fixtures" / "sweep" / "PLAN.json"


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sw") / "s"
    init_sweep(d, read_plan(PLAN), opts={})
    return d


def _manifests(d: Path) -> dict[str, dict]:
    return {p.parent.name: yaml.safe_load(p.read_text()) for p in (d / "runs").glob("*/run.yaml")}


def test_phases_and_windows(sweep_dir):
    sweep = yaml.safe_load((sweep_dir / "sweep.yaml").read_text())
    phases = [r["phase"] for r in sweep["runs"]]
    assert phases == sorted(phases, key=["fit", "scale", "profile", "retune", "validate"].index)
    m = _manifests(sweep_dir)
    assert 6 <= m["retune-ref"]["window"]["last"] - m["retune-ref"]["window"]["first"] + 1 <= 12
    v = m["validate-winner"]["window"]
    assert v["steps"] >= 50 and (v["first"], v["last"]) == (41, 50)
    assert m["profile-base"]["profile"] is True
    # fit runs the layout on its minimal world size: PP2 x max(TP1xCP1, EP8xETP1) = 16 here
    assert m["fit-base"]["gpus"] == min_world_size({"tp": 1, "pp": 2, "cp": 1, "ep": 8, "etp": 1}) == 16


def test_retune_changes_one_variable(sweep_dir):
    m = _manifests(sweep_dir)
    retune = {k: v for k, v in m.items() if v["phase"] == "retune" and k != "retune-ref"}
    variables = {v["variable"] for v in retune.values()}
    assert {"dispatcher", "ep_overlap", "delay_wgrad", "recompute", "cuda_graphs", "precision",
            "layout.vpp"} <= variables
    for name, man in retune.items():
        assert _undeclared_changes(man, m[man["reference"]]) == [], name
    # delayed wgrad is its own candidate, compared against plain EP overlap
    dw = m["retune-delay-wgrad"]
    assert dw["reference"] == "retune-ep-overlap" and dw["features"]["overlap_moe_expert_parallel_comm"]
    assert m["retune-ep-overlap"]["features"]["delay_wgrad_compute"] is False
    # H100: both DeepEP and HybridEP are tested; the intended backend is recorded for proof
    assert m["retune-dispatcher-deepep"]["intended"]["dispatcher"] == "deepep"


def test_scripts_are_valid_bash_and_launch_bridge(sweep_dir):
    for p in list((sweep_dir / "runs").glob("*/run.sbatch")) + list((sweep_dir / "runs").glob("*/launch.sh")):
        r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
        assert r.returncode == 0, (p, r.stderr)
    sb = (sweep_dir / "runs/retune-dispatcher-hybridep/run.sbatch").read_text()
    assert "#SBATCH --nodes=2" in sb and "#SBATCH --gpus-per-node=8" in sb and "srun " in sb
    assert "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8" in sb
    assert "NO TRAINING" not in sb  # replay is never the default
    la = (sweep_dir / "runs/retune-dispatcher-hybridep/launch.sh").read_text()
    assert "scripts/training/run_recipe.py" in la and "qwen3_30b_a3b_pretrain_config" in la
    assert "model.moe_token_dispatcher_type=flex" in la and "model.moe_flex_dispatcher_backend=hybridep" in la
    prof = (sweep_dir / "runs/profile-base/launch.sh").read_text()
    assert "nsys profile" in prof and "profiling.use_nsys_profiler=true" in prof


def test_megatron_lm_and_harness_launchers(tmp_path):
    r = run_cli("sweep", "init", "--from-plan", str(PLAN), "--out", str(tmp_path / "mlm"), "--framework",
                "megatron-lm", "--container-image", "nvcr.io/nvidia/pytorch:25.09-py3", "--account", "acct",
                "--partition", "batch", "--profiler", "torch", "--json")
    assert r.returncode == 0, r.stderr
    la = (tmp_path / "mlm/runs/retune-ep-overlap/launch.sh").read_text()
    assert "pretrain_gpt.py" in la and "--overlap-moe-expert-parallel-comm" in la and "--expert-model-parallel-size" in la
    sb = (tmp_path / "mlm/runs/retune-ep-overlap/run.sbatch").read_text()
    assert "--container-image=nvcr.io/nvidia/pytorch:25.09-py3" in sb and "#SBATCH --account=acct" in sb
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in sb
    assert "--use-pytorch-profiler" in (tmp_path / "mlm/runs/profile-base/launch.sh").read_text()
    r = run_cli("sweep", "init", "--from-plan", str(PLAN), "--out", str(tmp_path / "h"), "--entry", "run_script",
                "--model-family", "qwen", "--model-recipe", "qwen3_30b_a3b")
    assert r.returncode == 0, r.stderr
    la = (tmp_path / "h/runs/retune-dispatcher-deepep/launch.sh").read_text()
    assert "scripts/performance/run_script.py" in la and "--moe_flex_dispatcher_backend" in la and "-g" in la
    for p in (tmp_path / "h/runs").glob("*/*.s*"):
        assert subprocess.run(["bash", "-n", str(p)]).returncode == 0


def test_submit_dry_run_has_phase_dependencies(sweep_dir):
    r = run_cli("sweep", "submit", str(sweep_dir), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    cmds = json.loads(r.stdout)["commands"]
    by_run = {c.split("/runs/")[1].split("/")[0]: c for c in cmds}
    assert "--dependency" not in by_run["fit-base"]
    assert "--dependency=afterok:<fit-base>" in by_run["scale-c0"]
    assert "afterany:" in by_run["validate-winner"] and "<retune-ref>" in by_run["validate-winner"]


def test_bad_inputs_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"nothing": 1}')
    for args in (["sweep", "init", "--from-plan", str(bad), "--out", str(tmp_path / "x")],
                 ["sweep", "init", "--from-plan", str(tmp_path / "missing.json"), "--out", str(tmp_path / "y")],
                 ["sweep", "init", "--from-plan", str(PLAN), "--out", str(tmp_path / "z"), "--candidate", "9"],
                 ["sweep", "status", str(tmp_path)],
                 ["report", str(bad), "--html", str(tmp_path / "r.html")]):
        r = run_cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.strip().startswith("error:") and len(r.stderr.strip().splitlines()) == 1
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "z").exists()


def test_replay_map_must_cover_every_run(tmp_path, shared_data):
    m = tmp_path / "R.yaml"
    m.write_text(yaml.safe_dump({"fit-*": {"log": str(shared_data / "logs/log_iteration_1.txt")}}))
    r = run_cli("sweep", "init", "--from-plan", str(PLAN), "--out", str(tmp_path / "s"), "--dry-run-replay", str(m))
    assert r.returncode == 2 and "no entry matches run 'scale-c0'" in r.stderr


def test_edited_contract_is_reported(tmp_path):
    d = tmp_path / "s"
    init_sweep(d, read_plan(PLAN), opts={})
    c = d / "contract.yaml"
    c.write_text(c.read_text().replace("global_batch_size: 256", "global_batch_size: 512"))
    res = collect_sweep(d)
    assert res["contract_ok"] is False
    run = res["runs"][0]
    assert not run["accepted"]
    assert any("edited after the sweep was generated" in s for s in run["reasons"])
    assert any("no training log" in s for s in run["reasons"])
    assert (d / "collect/calibration.csv").is_file()


def test_dispatcher_proof_rules():
    nccl_only = {"backends": ["nccl", "nccl_alltoall"], "cuda_graphs": False, "fp8": False}
    assert _dispatcher_check("deepep", None, nccl_only, None)["status"] == "fail"
    assert "no deepep kernels" in _dispatcher_check("deepep", None, nccl_only, None)["reason"]
    assert _dispatcher_check("deepep", None, {"backends": ["deepep"]}, None)["status"] == "pass"
    assert _dispatcher_check("hybridep", None, None, None)["status"] == "unverified"
    fb = {"signals": [{"kind": "dispatcher_fallback", "line": 12, "text": "DeepEP is not supported; using alltoall"}]}
    assert _dispatcher_check("deepep", fb, None, None)["status"] == "fail"
    assert _dispatcher_check("alltoall", None, {"backends": ["deepep"]}, None)["status"] == "fail"


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash missing")
def test_replay_is_explicit_flag_in_help():
    r = run_cli("sweep", "init", "--help")
    assert r.returncode == 0 and "--dry-run-replay" in r.stdout


def test_every_generated_config_passes_moetune_check(sweep_dir):
    from moetune.io.check import check_config
    from moetune.rules import Env

    configs = sorted((sweep_dir / "runs").glob("*/config.yaml"))
    assert len(configs) == len(list((sweep_dir / "runs").glob("*/run.sbatch")))
    for p in configs:
        cfg = yaml.safe_load(p.read_text())
        cfg["_meta"] = {"gpus": 16, "system": "DGX-H100"}
        errors = [f for f in check_config(cfg, Env()).findings if f.severity == "error"]
        assert errors == [], (p.parent.name, [f.message for f in errors])
    r = run_cli("check", str(sweep_dir / "runs/retune-delay-wgrad/config.yaml"), "--system", "DGX-H100",
                "--gpus", "16", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr


def test_checker_drops_illegal_retune_candidates(tmp_path):
    plan = json.loads(PLAN.read_text())
    plan["candidates"][0]["layout"]["vpp"] = None  # PP2 without VPP: EP overlap is illegal (OVL-002)
    p = tmp_path / "P.json"
    p.write_text(json.dumps(plan))
    sweep = init_sweep(tmp_path / "s", read_plan(p), opts={})
    dropped = {d["name"]: d for d in sweep["dropped_by_check"]}
    assert "retune-ep-overlap" in dropped and any("OVL-002" in f for f in dropped["retune-ep-overlap"]["findings"])
    assert "retune-ep-overlap" not in {r["name"] for r in sweep["runs"]}


def test_reads_real_planner_output(tmp_path):
    """A trimmed `moetune plan --json` document (Qwen3-30B-A3B, 16 x DGX-H100) as the planner writes it."""
    real = REPO / "tests" / "fixtures" / "sweep" / "PLAN_real.json"
    plan = read_plan(real)
    assert plan.request["global_batch_size"] == 256 and plan.request["precision"] == "bf16"
    c0 = plan.candidates[0]
    assert "vpp" not in c0.layout  # VPP 1 = not interleaved
    assert c0.predicted()["step_time_s"] > 0 and c0.predicted()["peak_gib"] > 0
    sweep = init_sweep(tmp_path / "s", plan, opts={})
    assert sweep["runs"][0]["name"] == "fit-base"
    r = run_cli("report", str(real), "--md", str(tmp_path / "r.md"))
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "r.md").read_text()
    assert "optimizer_state" in md and "comm_ep" in md


def test_single_job_script_for_the_planner(tmp_path):
    from moetune.catalog.models import get_model
    from moetune.catalog.systems import get_system
    from moetune.spec.job import Job
    from moetune.spec.layout import Layout
    from moetune.sweep.contract import Launcher
    from moetune.sweep.slurm import render_bridge_script

    job = Job(model=get_model("Qwen3-30B-A3B"), system=get_system("DGX-H100"), gpus=16, global_batch_size=256,
              seq_length=4096, layout=Layout(ep=8))
    text = render_bridge_script(job=job, recipe="qwen3_30b_a3b_pretrain_config",
                                overrides=["model.expert_model_parallel_size=8", "'model.recompute_modules=[moe_act]'"],
                                env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, nodes=2,
                                launcher=Launcher(container_image="nvcr.io/nvidia/nemo:25.11", account="a"))
    p = tmp_path / "job.sbatch"
    p.write_text(text)
    assert subprocess.run(["bash", "-n", str(p)]).returncode == 0
    assert "#SBATCH --nodes=2" in text and "--container-image=nvcr.io/nvidia/nemo:25.11" in text
    assert "run_recipe.py --recipe qwen3_30b_a3b_pretrain_config" in text and "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text


def test_baseline_from_megatron_golden_config(tmp_path, shared_data):
    cfg = shared_data / "megatron_golden/case_gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4_config.yaml"
    d = tmp_path / "s"
    r = run_cli("sweep", "init", "--baseline", str(cfg), "--system", "DGX-H100", "--gpus", "8", "--out", str(d),
                "--framework", "megatron-lm", "--json")
    assert r.returncode == 0, r.stderr
    contract = yaml.safe_load((d / "contract.yaml").read_text())
    assert contract["layout"]["tp"] == 2 and contract["layout"]["ep"] == 4 and contract["shape"]["global_batch_size"] == 32
    assert contract["model_arch"]["num_layers"] == 12  # proxy model, not in the catalog: embedded in the contract
    la = (d / "runs/retune-ref/launch.sh").read_text()
    assert "--num-layers" in la and "--expert-model-parallel-size" in la and "--overlap-moe-expert-parallel-comm" in la

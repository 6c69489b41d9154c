"""A real Slurm cluster runs a generated sweep whose payload replays recorded logs/traces (``--dry-run-replay``),
then ``sweep status``/``collect``/``report`` decide and report. Needs the one-node cluster from
``.ci/setup-slurm.sh``; skipped cleanly when it is not running."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from tests.conftest import DATA, REPO, run_cli

pytestmark = pytest.mark.slurm

PLAN = REPO / "tests" / "fixtures" / "sweep" / "PLAN.json"
G = "megatron_golden/case_{}_golden.json"


def _slurm_up() -> bool:
    if not shutil.which("sinfo") or not shutil.which("sbatch"):
        return False
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (subprocess.TimeoutExpired, OSError):
        return False
    return p.returncode == 0 and any(s.startswith(("idle", "mix", "alloc")) for s in p.stdout.split())


def replay_map(tmp: Path) -> Path:
    """Which recorded artifact each run replays (first matching pattern wins)."""
    m = {
        # NaN loss (Falcon-40B log: iteration 3385 has no lm loss) -> rejected
        "retune-recompute-*": {"log": str(DATA / "logs/log_nan_1.txt")},
        # Mixtral 16xH100 log at GBS 128 while the contract says 256 -> contract broken
        "retune-delay-wgrad": {"log": str(DATA / "logs/log_iteration_1.txt")},
        # intended HybridEP, but the trace has only NCCL SendRecv all-to-all -> dispatcher did not run
        "retune-dispatcher-hybridep": {"log": str(DATA / G.format("gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4")),
                                       "trace": str(DATA / "traces/hta_trace_filter_sampled_rank-1.json.gz")},
        # intended DeepEP and the real DeepSeek-V3 trace shows DeepEP kernels -> accepted
        "retune-dispatcher-deepep": {"log": str(DATA / G.format("gpt3_mcore_te_tp1_pp1_te_4experts_groupedGEMM_op_fuser")),
                                     "trace": str(DATA / "traces/deepseek_profile_data_train.json")},
        "retune-ep-overlap": {"log": str(DATA / G.format(
            "gpt3_mcore_te_tp2_pp1_te_8experts2parallel_ddp_average_in_collective"))},
        "profile-base": {"log": str(DATA / G.format(
            "gpt3_mcore_te_tp2_pp1_te_8experts2parallel_overlap_grad_reduce_param_gather_groupedGEMM")),
                         "trace": str(DATA / "traces/hta_trace_filter_sampled_rank-0.json.gz")},
        "validate-*": {"log": str(DATA / G.format("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed"))},
        "*": {"log": str(DATA / G.format(
            "gpt3_mcore_te_tp2_pp1_te_8experts2parallel_overlap_grad_reduce_param_gather_groupedGEMM"))},
    }
    p = tmp / "REPLAY.yaml"
    p.write_text(yaml.safe_dump(m, sort_keys=False))
    return p


def _wait(d: Path, timeout: float = 75.0) -> dict:
    t0 = time.monotonic()
    while True:
        r = run_cli("sweep", "status", str(d), "--json")
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        if st["all_finished"]:
            return st
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"sweep not finished after {timeout}s: {[(x['run'], x['state']) for x in st['runs']]}")
        time.sleep(1.0)


def test_replayed_sweep_on_real_slurm(tmp_path, shared_data):
    if not _slurm_up():
        pytest.skip("no local Slurm cluster (run .ci/setup-slurm.sh)")
    d = tmp_path / "sweep"
    r = run_cli("sweep", "init", "--from-plan", str(PLAN), "--out", str(d),
                "--dry-run-replay", str(replay_map(tmp_path)), "--json")
    assert r.returncode == 0, r.stderr
    sweep = json.loads(r.stdout)
    names = [x["name"] for x in sweep["runs"]]
    assert {"fit-base", "profile-base", "retune-ref", "retune-delay-wgrad", "validate-winner"} <= set(names)
    script = (d / "runs/retune-ref/run.sbatch").read_text()
    assert "--dry-run-replay: NO TRAINING" in script and "srun" in script
    assert "run_recipe.py" in (d / "runs/retune-ref/launch.sh").read_text()

    r = run_cli("sweep", "submit", str(d), "--json")
    assert r.returncode == 0, r.stderr
    jobs = json.loads(r.stdout)["submitted"]
    assert set(jobs) == set(names) and all(j.isdigit() for j in jobs.values())
    # scale waits for fit with afterok; validate waits for every retune run
    dep = subprocess.run(["scontrol", "show", "job", jobs["validate-winner"]], capture_output=True, text=True).stdout
    assert "Dependency=" in dep

    st = _wait(d)
    assert all(x["state"] == "COMPLETED" for x in st["runs"]), st["runs"]
    assert (d / "runs/retune-recompute-narrower/logs/train.log").read_text() == \
        (shared_data / "logs/log_nan_1.txt").read_text()
    assert (d / "runs/retune-dispatcher-deepep/traces/deepseek_profile_data_train.json").is_file()

    pytest.importorskip("moetune.evidence.steady", reason="log readers (helper F) not installed")
    r = run_cli("sweep", "collect", str(d), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    runs = {x["run"]: x for x in res["runs"]}
    nan = runs["retune-recompute-narrower"]
    assert not nan["accepted"] and any("NaN" in s or "non-finite" in s for s in nan["reasons"]), nan["reasons"]
    gbs = runs["retune-delay-wgrad"]
    assert not gbs["accepted"] and any("global batch size 128" in s for s in gbs["reasons"]), gbs["reasons"]
    ab = {a["b"]: a for a in res["ab"]}
    assert ab["retune-delay-wgrad"]["verdict"] == "not_comparable"
    assert runs["retune-ref"]["accepted"], runs["retune-ref"]["reasons"]
    assert runs["validate-winner"]["accepted"], runs["validate-winner"]["reasons"]
    assert runs["validate-winner"]["window"] == [41, 50]
    csv_text = (d / "collect/runs.csv").read_text().splitlines()
    assert csv_text[0].startswith("release,model,task,system,num_gpus,precision,gbs,mbs,seq_len,tp,pp")
    assert len(csv_text) == len(names) + 1
    import csv

    cal = list(csv.DictReader((d / "collect/calibration.csv").open()))
    assert cal and all(r["status"] == "accepted" and float(r["model_tflops_per_gpu"]) > 0 for r in cal)
    assert all(r["predicted_step_time_s"] for r in cal if r["run"] == "retune-ref")

    html = tmp_path / "report.html"
    r = run_cli("report", str(d), "--html", str(html), "--md", str(tmp_path / "report.md"))
    assert r.returncode == 0, r.stderr
    text = html.read_text()
    assert "global batch size 128" in text and "<svg" in text and "Evidence bundle" in text

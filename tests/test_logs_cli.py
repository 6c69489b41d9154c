"""CLI: ``moetune logs`` / ``diagnose`` / ``compare`` JSON shapes and exit codes (real subprocesses)."""

from __future__ import annotations

import json

from conftest import DATA, run_cli

LOGS = DATA / "logs"
GOLD = DATA / "megatron_golden"
CASE = "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_golden"


def test_logs_json_shape(shared_data):
    r = run_cli("logs", str(LOGS / "log_iteration_1.txt"), str(GOLD / f"{CASE}.json"), "--gpus", "16",
                "--seq-length", "4096", "--json")
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)["runs"]
    assert len(runs) == 2
    for run in runs:
        for key in ("file", "steady_window", "step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "loss",
                    "memory", "config"):
            assert key in run
        assert set(run["step_time_s"]) >= {"median", "mean", "ci"}
        assert set(run["loss"]) >= {"finite", "nan_iterations", "skipped_iterations"}
        assert "median" in run["tflops_per_gpu"]
    it1 = runs[0]
    # tokens/s/GPU = GBS * seq / step / GPUs with the printed GBS 128 and the given seq / GPU count
    assert it1["tokens_per_s_per_gpu"] == 128 * 4096 / it1["step_time_s"]["median"] / 16
    assert it1["tflops_per_gpu"]["median"] == 236.0


def test_logs_window_and_human_view(shared_data):
    r = run_cli("logs", str(GOLD / f"{CASE}.json"), "--window", "41-50", "--json")
    run = json.loads(r.stdout)["runs"][0]
    assert run["steady_window"] == [41, 50] and run["window_source"] == "declared"
    r = run_cli("logs", str(LOGS / "log_bridge_iteration_memory_1.txt"))
    assert r.returncode == 0 and "steady window" in r.stdout


def test_logs_without_iterations_exit_1(shared_data):
    r = run_cli("logs", str(LOGS / "log_oom_message_1.txt"), "--json")
    assert r.returncode == 1 and r.stdout == ""
    assert "no training iterations" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_unreadable_or_non_log_exit_2(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "blob.log").write_bytes(b"\x00\x01\x02binary")
    for args in (("logs", str(tmp_path / "missing.log")), ("logs", str(tmp_path / "notes.txt")),
                 ("diagnose", str(tmp_path / "blob.log")), ("compare", str(tmp_path / "notes.txt"),
                                                             str(tmp_path / "notes.txt"))):
        r = run_cli(*args, "--json")
        assert r.returncode == 2, (args, r.stderr)
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error:")
        assert "Traceback" not in r.stderr


def test_diagnose_json_shape(shared_data):
    r = run_cli("diagnose", str(LOGS / "log_nccl_timeout_2.txt"), str(LOGS / "log_assert_overlap_mtp_1.txt"),
                "--json")
    assert r.returncode == 0, r.stderr
    findings = json.loads(r.stdout)["findings"]
    assert [f["kind"] for f in findings] == ["nccl_timeout", "nccl_timeout", "config_assertion"]
    for f in findings:
        assert set(f) >= {"kind", "summary", "evidence", "cause", "confirm", "fixes"}
        assert all(set(e) >= {"line", "text"} for e in f["evidence"])
    assert "OVL-008" in findings[2]["rule_ids"]


def test_compare_json_shape(shared_data):
    r = run_cli("compare", str(GOLD / f"{CASE}.json"), str(GOLD / f"{CASE}_dev_dgxh100_dgxc.json"), "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    assert set(c) >= {"verdict", "delta_pct", "ci_pct", "contract", "explanations"}
    assert c["verdict"] == "regression" and c["contract"]["ok"] is True and c["contract"]["violations"] == []
    assert len(c["ci_pct"]) == 2 and c["ci_pct"][0] < c["delta_pct"] < c["ci_pct"][1]
    r = run_cli("compare", str(GOLD / f"{CASE}.json"), str(GOLD / f"{CASE}.json"), "--window-a", "10-29",
                "--window-b", "30-49", "--json")
    assert json.loads(r.stdout)["verdict"] == "no_change"
    r = run_cli("compare", str(LOGS / "log_oom_message_1.txt"), str(GOLD / f"{CASE}.json"))
    assert r.returncode == 1 and "no training iterations" in r.stderr

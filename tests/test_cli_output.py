"""Output a person and a pipe can use: ranking lines within 100 columns, headers and names never cut, one MFU
statement, free memory (not the required minimum) in the report, no dispatcher for a dense model, errors that name
what was given (a folder is a folder, not an unknown model)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from test_fuzz_inputs import PLAN, run

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "data" / "traces" / "deepseek_profile_data_train.json"


@pytest.fixture(scope="module")
def dense_plan() -> tuple[str, dict]:
    args = ["plan", "--model", "Llama-3-8B", "--system", "DGX-H100", "--gpus", "8", "--gbs", "256", "--seq", "4096",
            "--top", "3"]
    code, human, _ = run(args)
    assert code == 0
    code, js, _ = run([*args, "--json"])
    assert code == 0
    return human, json.loads(js)


def test_plan_ranking_lines_fit_100_columns(dense_plan):
    human, _ = dense_plan
    # copyable lines (the reproduce command) are never wrapped or cut, so they are exempt from the width
    ranking = [ln for ln in human.splitlines() if (re.match(r"#\d+ TP", ln) or ln.startswith("    "))
               and "reproduce:" not in ln]
    assert ranking and all(len(ln) <= 100 for ln in ranking), [ln for ln in ranking if len(ln) > 100]
    assert "wall: " in human and "VPPNone" not in human


def test_dense_model_lists_no_dispatcher(dense_plan):
    human, doc = dense_plan
    assert doc["request"]["dispatchers"] == []
    for c in doc["candidates"]:  # (features keep every field: a candidate's reproduce line rebuilds it exactly)
        assert not any("dispatcher" in o for o in c["launch"]["bridge_overrides_tuning"])
    # the ranking names no dispatcher (the reproduce line spells every estimate flag, so it is left out here)
    assert "alltoall" not in "\n".join(ln for ln in human.splitlines() if "reproduce:" not in ln)


def test_plan_and_estimate_state_one_fit_rule(dense_plan):
    _, doc = dense_plan
    c = doc["candidates"][0]
    lay = c["layout"]
    # the candidate's own features (its reproduce line: e.g. layer-level CPU offloading, which plain flags lack)
    argv = shlex.split(c["reproduce"])[1:]
    assert argv[0] == "estimate" and f"--tp {lay['tp']}" in c["reproduce"] and f"--pp {lay['pp']}" in c["reproduce"]
    code, out, _ = run([*argv, "--json"])
    assert code == 0
    est = json.loads(out)["memory"]
    assert doc["request"]["min_headroom_gib"] == pytest.approx(est["headroom_gib"])
    free = est["capacity_gib"] - max(st["device_gib"] for st in est["stages"])
    assert est["fits"] and free >= est["headroom_gib"]


def test_mfu_is_said_once_for_bf16():
    code, out, _ = run(["estimate", "--model", "Qwen3-30B-A3B", "--gpus", "16", "--gbs", "1024", "--seq", "4096",
                        "--ep", "16"])
    assert code == 0
    assert out.count("of BF16 peak") == 1 and "of bf16 peak" not in out


def test_trace_headers_and_catalog_names_are_not_cut():
    code, out, _ = run(["trace", str(TRACE)])
    assert code == 0
    assert "domin…" not in out and "dominant" in out
    code, out, _ = run(["catalog", "models"])
    assert code == 0 and "…" not in out
    for name in ("Llama-4-Maverick", "DeepSeek-V2-Lite", "Qwen3-Next-80B-A3B", "Nemotron-3.5-Lightning"):
        assert name in out, name
    code, out, _ = run(["catalog", "systems"])
    assert code == 0 and "…" not in out


def test_report_candidates_show_free_memory(tmp_path):
    md = tmp_path / "r.md"
    code, _, err = run(["report", str(PLAN), "--md", str(md)])
    assert code == 0, err
    text = md.read_text()
    assert "free GiB" in text and "headroom GiB" not in text
    plan = json.loads(PLAN.read_text())
    m = plan["candidates"][0]["memory"]
    assert f"{m['capacity_gib'] - m['peak_gib']:.1f}" in text.replace(",", "")


def test_a_folder_is_named_as_a_folder():
    code, _, err = run(["estimate", "--model", str(REPO / "data"), "--gpus", "8", "--gbs", "64", "--seq", "512"])
    assert code == 2 and "closest" not in err and "no such file" not in err
    assert "folder" in err or "directory" in err
    code, _, err = run(["check", str(REPO / "data")])
    assert code == 2 and "no such file" not in err and "directory" in err


def test_binary_input_names_the_file_and_the_byte(tmp_path):
    p = tmp_path / "cfg.yaml"
    p.write_bytes(b"model:\n  hidden_size: \xff\n")
    code, _, err = run(["estimate", "--bridge-config", str(p), "--gpus", "8"])
    assert code == 2 and str(p) in err and "0xff" in err and "codec" not in err

"""``moetune layout`` CLI: JSON keys, meshes, lcm minimum, NVLink crossing, errors as one line with exit 2."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli


def _json(*args: str) -> dict:
    res = run_cli("layout", *args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_json_keys_and_values():
    rep = _json("--gpus", "32", "--tp", "2", "--pp", "2", "--ep", "8", "--gbs", "64", "--mbs", "2")
    for key in ("dp", "edp", "num_microbatches", "min_gpus", "attention_mesh", "moe_mesh", "groups_crossing_nvlink"):
        assert key in rep
    assert (rep["dp"], rep["edp"], rep["num_microbatches"], rep["min_gpus"]) == (8, 2, 4, 16)
    assert rep["attention_mesh"]["shape"] == "TP2×CP1×DP8×PP2"
    assert rep["moe_mesh"]["shape"] == "ETP1×EP8×EDP2×PP2"
    assert rep["system"] == "DGX-H100"


def test_lcm_min_gpus():
    assert _json("--gpus", "24", "--tp", "2", "--cp", "3", "--ep", "8")["min_gpus"] == 24
    assert _json("--gpus", "12", "--tp", "4", "--ep", "6")["min_gpus"] == 12


def test_tp16_crossing_on_dgx():
    rep = _json("--gpus", "32", "--tp", "16", "--system", "DGX-H100")
    tp = [c for c in rep["groups_crossing_nvlink"] if c["group"] == "tp"]
    assert tp and tp[0]["severity"] == "warning" and tp[0]["num_crossing"] == 2
    rep = _json("--gpus", "32", "--tp", "16", "--system", "GB200-NVL72")
    assert not [c for c in rep["groups_crossing_nvlink"] if c["group"] == "tp"]


def test_ep64_on_nvl72():
    rep = _json("--gpus", "128", "--ep", "64", "--system", "DGX-GB200")
    ep = [c for c in rep["groups_crossing_nvlink"] if c["group"] == "ep"][0]
    assert ep["num_crossing"] == 1 and ep["example"][0] == 64 and ep.get("example_truncated")


def test_model_pipeline_view():
    rep = _json("--gpus", "256", "--pp", "8", "--ep", "32", "--model", "DeepSeek-V3",
                "--pipeline-layout", "Et*3|(tt|)*29m|L", "--gbs", "4096", "--seq", "4096")
    assert rep["vpp"] == 4 and len(rep["pipeline"]) == 8
    assert sum(r["num_layers"] for r in rep["pipeline"]) == 61
    assert rep["pipeline"][6]["chunks"][3]["mtp_layers"] == 1


def test_human_view_prints_both_meshes():
    res = run_cli("layout", "--gpus", "16", "--tp", "2", "--ep", "8")
    assert res.returncode == 0
    assert "Attention: TP2 × CP1 × DP8 × PP1" in res.stdout
    assert "MoE:       ETP1 × EP8 × EDP2 × PP1" in res.stdout


_BAD = [
    (["--gpus", "16", "--tp", "2", "--cp", "3", "--ep", "8"], "PAR-001"),
    (["--gpus", "24", "--tp", "2", "--cp", "3", "--ep", "16"], "PAR-002"),
    (["--gpus", "8", "--vpp", "2"], "PAR-006"),
    (["--gpus", "16", "--tp", "2", "--gbs", "12"], "PAR-035"),
    (["--gpus", "16", "--pp", "2", "--pipeline-layout", "Et|t|tL"], "PAR-031"),
    (["--gpus", "16", "--pp", "2", "--pipeline-layout", "Et|tx"], "unknown layer character"),
    (["--gpus", "8", "--ep", "6", "--model", "DeepSeek-V3"], "PAR-002"),
    (["--gpus", "24", "--ep", "6", "--model", "DeepSeek-V3"], "PAR-024"),
    (["--gpus", "16", "--pp", "16", "--model", "DeepSeek-V3"], "PAR-026"),
    (["--gpus", "8", "--cp", "4", "--seq", "4100"], "PAR-014"),
    (["--gpus", "8", "--tp", "8", "--seq", "4100"], "PAR-018"),
    (["--gpus", "8", "--tp", "2", "--model", "Qwen3-30B-A3B", "--no-sequence-parallel"], "PAR-046"),
    (["--gpus", "0"], "--gpus"),
    (["--gpus", "8", "--tp", "-2"], "--tp"),
    (["--gpus", "8", "--system", "DGX-Z900"], "unknown system"),
    (["--gpus", "8", "--model", "NoSuchModel"], "unknown model"),
    (["--gpus", "eight"], "--gpus"),
]


@pytest.mark.parametrize(("args", "needle"), _BAD)
def test_bad_input_in_process(args, needle):
    """Same code path as the CLI (``cli.main``), in-process: exit code 2 and one ``error:`` line."""
    import contextlib
    import io

    from moetune.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        main(["layout", *args, "--json"])
    assert info.value.code == 2
    assert out.getvalue() == ""
    assert needle in " ".join(err.getvalue().split())


@pytest.mark.parametrize(("args", "needle"), [_BAD[0], _BAD[5], _BAD[12], _BAD[14], _BAD[16]])
def test_bad_input_one_line_exit_2(args, needle):
    res = run_cli("layout", *args, "--json")
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]
    assert "Traceback" not in res.stderr


def test_ranks_per_domain_and_order():
    rep = _json("--gpus", "128", "--ep", "64", "--system", "GB200-NVL72", "--ranks-per-domain", "64")
    assert rep["ranks_per_domain"] == 64
    assert not [c for c in rep["groups_crossing_nvlink"] if c["group"] == "ep"]
    rep = _json("--gpus", "32", "--tp", "2", "--pp", "2", "--ep", "2", "--tp-pp-dp-mapping")
    assert rep["rank_order"] == "tp-cp-ep-pp-dp"
    res = run_cli("layout", "--gpus", "32", "--tp", "2", "--pp", "2", "--ep", "8", "--tp-pp-dp-mapping", "--json")
    assert res.returncode == 2 and "PAR-005" in res.stderr and res.stdout == ""
    res = run_cli("layout", "--gpus", "16", "--ranks-per-domain", "9", "--json")
    assert res.returncode == 2 and "--ranks-per-domain" in res.stderr

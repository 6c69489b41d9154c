"""Log readers on every real excerpt in data/logs (values from data/README.md section b), the
Megatron golden-values JSON, and synthetic robustness cases (wrapping, ANSI, ranks, restarts, config dumps)."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import DATA
from moetune.errors import InputError
from moetune.evidence.logs import read_run
from moetune.evidence.logs.model import FLAG_PROFILED, FLAG_TRUNCATED
from moetune.evidence.steady import loss_health, parse_window, steady_window, summarize_run

LOGS = DATA / "logs"
GOLD = DATA / "megatron_golden"
MIB = 2**20
GIB = 2**30


def col(rec, name):
    return [float(x) for x in rec.iterations.col(name)]


def approx(values, expected, rel=1e-6):
    assert len(values) == len(expected)
    for v, e in zip(values, expected, strict=True):
        assert v == pytest.approx(e, rel=rel)


# ------------------------------------------------------------------------------------------- per-file expectations
def check_iteration_1(rec):
    approx(col(rec, "elapsed_s"), [5.4449, 5.5338, 5.7186])
    approx(col(rec, "tflops"), [239.8, 236.0, 228.4])
    approx(col(rec, "loss"), [1.825991, 1.875063, 1.834162])
    approx(list(rec.iterations.col("load_balancing_loss")), [1.019746, 1.020033, 1.018004])
    approx(col(rec, "grad_norm"), [1.426, 1.327, 1.611])
    approx(col(rec, "num_zeros"), [0.0, 0.0, 0.0])
    approx(col(rec, "lr"), [8.6e-6, 8.8e-6, 9.0e-6])
    assert col(rec, "skipped") == [0, 0, 0] and col(rec, "nan") == [0, 0, 0]
    assert col(rec, "gbs") == [128] * 3
    s = summarize_run(rec)
    assert s.steady_window == [43, 45] and s.step_time_s["median"] == pytest.approx(5.5338)
    assert s.loss["finite"] and s.loss["skipped_iterations"] == 0


def check_theoretical_1(rec):
    th = rec.theoretical_memory[0]
    assert th.weight_and_optimizer_mib == 46038.57 and th.activation_mib is None
    shard = rec.parameter_counts["parameters in most loaded shard"]
    assert shard == 6.4367
    # Bridge/Megatron: bytes per parameter with the distributed optimizer = 6 + 12/DP (DP = 8 here), MB = MiB
    assert th.weight_and_optimizer_mib == pytest.approx(shard * 1e9 * (6 + 12 / 8) / MIB, rel=1e-3)
    mem = rec.memory_reports[0]
    assert (mem.rank, mem.after_iteration, mem.unit) == (0, 20, "MB")
    assert mem.values_bytes["max allocated"] == pytest.approx(75078.4326171875 * MIB)
    assert mem.values_bytes["reserved"] == pytest.approx(75682.0 * MIB)
    assert col(rec, "skipped") == [10, 5, 0, 0, 1]
    assert math.isnan(col(rec, "loss")[0])  # all 10 iterations skipped: Megatron prints no lm loss
    health = loss_health(rec)
    assert health["skipped_iterations"] == 16 and health["finite"] and health["nan_iterations"] == []
    assert col(rec, "loss_scale")[-2:] == [262144.0, 131072.0]  # one more overflow at iteration 50
    s = summarize_run(rec)
    assert s.steady_window == [30, 40]
    assert s.memory["peak_max_allocated_gib"] == pytest.approx(75078.4326171875 * MIB / GIB)


def check_theoretical_2(rec):
    th = rec.theoretical_memory[0]
    assert th.weight_and_optimizer_mib == 41434.72
    assert th.weight_and_optimizer_mib == pytest.approx(6.4367e9 * (6 + 12 / 16) / MIB, rel=1e-3)
    assert rec.memory_reports[0].values_bytes["max allocated"] == pytest.approx(70522.5751953125 * MIB)
    s = summarize_run(rec)
    assert s.step_time_s["median"] == pytest.approx(14.1976)  # slower than the 8-GPU run (12.05 s)


def check_bridge(rec):
    assert rec.source == "megatron-bridge"
    assert col(rec, "iteration") == [10, 20]
    approx(col(rec, "elapsed_s"), [13.2127, 14.2603])
    approx(col(rec, "loss"), [4.474437, 0.08797448])
    approx(col(rec, "grad_norm"), [0.704, 0.170])
    assert col(rec, "gbs") == [512, 512] and col(rec, "skipped") == [0, 0] and col(rec, "nan") == [0, 0]
    mem = rec.memory_reports[0]
    assert mem.values_bytes["allocated"] == pytest.approx(11908.05029296875 * MIB)
    assert mem.values_bytes["max allocated"] == pytest.approx(12712.43603515625 * MIB)
    st_ = rec.step_time
    approx(col_st(st_, "elapsed_s"), [14.26, 16.85])
    approx(col_st(st_, "tflops"), [58.2, 49.3])
    flags = [int(x) for x in st_.col("flags")]
    assert not flags[0] & FLAG_PROFILED and flags[1] & FLAG_PROFILED
    s = summarize_run(rec)
    assert s.bridge_step_time_s["median"] == pytest.approx(14.26)
    assert s.bridge_step_time_s["excluded_profiled"] == [16.85]
    assert s.tflops_per_gpu["median"] == pytest.approx(58.2)


def col_st(tab, name):
    return [float(x) for x in tab.col(name)]


def check_nemo_1(rec):
    assert rec.source == "nemo"
    assert col(rec, "iteration") == list(range(9))
    assert col(rec, "loss")[0] == 11.02 and col(rec, "loss")[-1] == 7.113
    assert col(rec, "gbs") == [32] * 9
    s = summarize_run(rec)
    assert s.samples == 0 and s.step_time_s["median"] is None  # no timing field in these lines
    assert s.loss["finite"]


def check_nemo_2(rec):
    assert rec.source == "nemo"
    approx(col(rec, "elapsed_s"), [0.03146, 0.03163, 0.03215, 0.03157, 0.0317, 0.03147])
    approx(col(rec, "loss"), [1.233, 1.288, 1.333, 1.245, 1.375, 1.34])  # val_loss is not the training loss
    assert summarize_run(rec).step_time_s["median"] == pytest.approx(0.0316, abs=5e-4)


def check_regression(rec):
    approx(col(rec, "elapsed_s")[:4], [86.5452, 87.8716, 89.4748, 89.0752])
    s = summarize_run(rec)
    assert s.level_shift["at_iteration"] == 182
    assert s.level_shift["before_s"] == pytest.approx(88.4734) and s.level_shift["after_s"] == pytest.approx(127.3999)
    assert s.loss["finite"]


def check_timers_minmax(rec):
    t = rec.timers["forward-backward"]
    assert (t.last_min_ms, t.last_max_ms) == (4687.59, 4725.48)
    assert (rec.timers["model-and-optimizer-setup"].last_min_ms, rec.timers["model-and-optimizer-setup"].last_max_ms) \
        == (416.54, 452.18)
    assert rec.timers["forward-compute"].last_max_ms == 2652.14
    assert col(rec, "skipped") == [10] and col(rec, "tflops") == [11.2]


def check_skipped_timers(rec):
    assert col(rec, "skipped") == [10] and col(rec, "loss_scale") == [8388608.0]
    assert rec.timers["forward-compute"].last_max_ms == 193.77
    assert rec.timers["optimizer"].last_max_ms == 63.01
    assert rec.timers["model-and-optimizer-setup"].last_max_ms == 294.0


def check_nan_1(rec):
    assert col(rec, "iteration") == [3383, 3384, 3385]
    flags = [int(x) for x in rec.iterations.col("flags")]
    assert flags[2] & FLAG_TRUNCATED
    health = loss_health(rec)
    assert health["nan_iterations"] == [3385] and health["nan_counter_total"] == 0 and not health["finite"]


def check_nan_2(rec):
    health = loss_health(rec)
    assert health["nan_iterations"] == [5426, 5427, 5428] and health["nan_counter_total"] == 0
    assert all(math.isnan(x) for x in col(rec, "grad_norm"))
    approx(col(rec, "tflops"), [78.36, 78.77, 78.71])


def check_fs_theoretical(rec):
    th = rec.theoretical_memory[0]
    assert (th.weight_and_optimizer_mib, th.activation_mib, th.total_mib, th.source) == \
        (46983.28, 8989.01, 55972.29, "flagscale")
    assert rec.parameter_counts["parameters in most loaded shard"] == 4.1055
    assert not rec.has_iterations


def signal_check(kind, **data):
    def check(rec):
        sigs = rec.signals_of(kind)
        assert sigs, f"no {kind} signal"
        for k, v in data.items():
            assert sigs[0].data.get(k) == v, (k, sigs[0].data)
    return check


def check_nccl_1(rec):
    sigs = rec.signals_of("nccl_watchdog")
    assert {s.data["rank"] for s in sigs} == {0, 1, 2}
    assert all(s.data["op"] == "ALLREDUCE" and s.data["seq"] == 305 and s.data["numel_in"] == 1 and
               s.data["timeout_ms"] == 600000 for s in sigs)
    assert rec.signal_counts["nccl_connection_closed"] == 6


def check_nccl_2(rec):
    wd = rec.signals_of("nccl_watchdog")
    assert [(s.data["op"], s.data["seq"]) for s in wd] == [("ALLTOALL_BASE", 146), ("_ALLGATHER_BASE", 70)]
    lw = rec.signals_of("nccl_last_work")[0].data
    assert (lw["work"], lw["last_enqueued"], lw["last_completed"], lw["pg"]) == (146, 154, 145, 11)
    assert 8 in rec.ranks_seen


def check_nccl_3(rec):
    wd = rec.signals_of("nccl_watchdog")
    assert {s.data["rank"] for s in wd} == {3, 7} and all(s.data["seq"] == 4486 for s in wd)
    lw = rec.signals_of("nccl_last_work")[0].data
    assert (lw["last_enqueued"], lw["last_completed"]) == (4489, 4485)


def check_nccl_4(rec):
    d = rec.signals_of("nccl_watchdog")[0].data
    assert (d["op"], d["numel_in"], d["numel_out"], d["ran_ms"], d["pg"]) == \
        ("_REDUCE_SCATTER_BASE", 7_098_994_688, 443_687_168, 882722, 1)
    assert rec.signals_of("nccl_error")


def check_deepep(rec):
    recv = [s.data.get("num_recv_tokens") for s in rec.signals_of("deepep") if "num_recv_tokens" in s.data]
    assert recv == [-1, -1]
    assert sorted(s.data["rank"] for s in rec.signals_of("deepep") if "rank" in s.data) == [6, 14]


def check_deepep_traceback(rec):
    tb = rec.signals_of("traceback_unterminated")
    assert tb and tb[0].rank == 5
    assert any("token_dispatcher.py:826 in dispatch" in f for f in tb[0].frames)
    assert "fused_dispatch(" in tb[0].frames[-1]


def exception_check(typ, fragment, rank=None):
    def check(rec):
        ex = rec.signals_of("exception")
        assert ex and ex[0].data["type"] == typ and fragment in ex[0].data["message"]
        if rank is not None:
            assert ex[0].rank == rank
    return check


def check_oom_tb_1(rec):
    d = rec.signals_of("oom")[0].data
    assert d["requested"] == pytest.approx(2.29 * GIB) and d["capacity"] == pytest.approx(31.72 * GIB)
    assert d["allocated"] == pytest.approx(19.22 * GIB) and d["reserved"] == pytest.approx(28.32 * GIB)
    assert any("allreduce_params" in f for f in rec.signals_of("oom")[0].frames)


def check_oom_tb_2(rec):
    assert not rec.signals_of("oom")  # the excerpt ends before the OOM line: no invented OOM
    tb = rec.signals_of("traceback_unterminated")
    assert tb and any("train_step" in f for f in tb[0].frames)


def check_oom_msg_1(rec):
    d = rec.signals_of("oom")[0].data
    assert d["requested"] == pytest.approx(6.37 * GIB) and d["capacity"] == pytest.approx(79.11 * GIB)
    assert d["allocated"] == pytest.approx(68.61 * GIB)
    assert d["reserved_unallocated"] == pytest.approx(5.63 * GIB)


def check_oom_msg_2(rec):
    d = rec.signals_of("oom")[0].data
    assert d["requested"] == pytest.approx(786 * MIB) and d["allocated"] == pytest.approx(28.82 * GIB)
    assert d["reserved"] == pytest.approx(29.97 * GIB)


EXPECTED = {
    "log_iteration_1.txt": check_iteration_1,
    "log_iteration_theoretical_memory_1.txt": check_theoretical_1,
    "log_iteration_theoretical_memory_2.txt": check_theoretical_2,
    "log_bridge_iteration_memory_1.txt": check_bridge,
    "log_nemo_iteration_1.txt": check_nemo_1,
    "log_nemo_iteration_2.txt": check_nemo_2,
    "log_regression_slowdown_1.txt": check_regression,
    "log_timers_minmax_1.txt": check_timers_minmax,
    "log_skipped_timers_1.txt": check_skipped_timers,
    "log_nan_1.txt": check_nan_1,
    "log_nan_2.txt": check_nan_2,
    "log_theoretical_memory_1.txt": check_fs_theoretical,
    "log_nccl_timeout_1.txt": check_nccl_1,
    "log_nccl_timeout_2.txt": check_nccl_2,
    "log_nccl_timeout_3.txt": check_nccl_3,
    "log_nccl_timeout_4.txt": check_nccl_4,
    "log_deepep_dispatch_timeout_1.txt": check_deepep,
    "log_dispatcher_deepep_traceback_1.txt": check_deepep_traceback,
    "log_dispatcher_error_1.txt": exception_check("RuntimeError", "is invalid for input of size 0", rank=11),
    "log_assert_overlap_mtp_1.txt": exception_check("AssertionError", "MTP layernum only supports 1"),
    "log_assert_distopt_instances_1.txt": exception_check("AssertionError", "partial DistOpt shard factor"),
    "log_assert_world_size_ep_1.txt": exception_check("RuntimeError", "world_size (8) is not divisible"),
    "log_oom_traceback_1.txt": check_oom_tb_1,
    "log_oom_traceback_2.txt": check_oom_tb_2,
    "log_oom_message_1.txt": check_oom_msg_1,
    "log_oom_message_2.txt": check_oom_msg_2,
}


def test_every_shared_log_has_an_expectation(shared_data):
    names = {p.name for p in (shared_data / "logs").glob("log_*.txt")}
    assert names == set(EXPECTED), f"untested: {sorted(names - set(EXPECTED))}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shared_log(shared_data, name):
    rec = read_run(shared_data / "logs" / name)
    assert rec.recognised_lines > 0
    EXPECTED[name](rec)


# ------------------------------------------------------------------------------------------- golden JSON
def test_golden_json_run_record(shared_data):
    rec = read_run(GOLD / "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_golden.json")
    assert rec.source == "megatron-golden" and len(rec.iterations) == 50
    assert col(rec, "elapsed_s")[0] == 73.10019  # step 1: the warm-up outlier
    assert rec.meta["platform"] == "dev_dgx_h100" and rec.meta["gpu"] == "H100"
    assert rec.config["model.tensor_model_parallel_size"] == 2
    assert rec.config["model.expert_model_parallel_size"] == 4
    s = summarize_run(rec)
    assert 1 not in range(s.steady_window[0], s.steady_window[1] + 1)
    assert s.layout["tp"] == 2 and s.layout["ep"] == 4 and s.layout["seq_length"] == 4096
    assert s.memory["peak_max_allocated_gib"] == pytest.approx(
        max(rec.memory_reports[0].values_bytes["max allocated"], 0) / GIB)
    assert s.memory["rank_note"].startswith("last")


def test_golden_nan_strings_are_missing_timings_not_nan_losses(shared_data):
    rec = read_run(GOLD / "case_gpt3_7b_tp1_pp4_memory_speed_golden.json")
    s = summarize_run(rec)
    assert s.loss["finite"] and s.excluded_counts["no step time"] > 0
    # a shortened _sm run keeps the full step range with every metric "nan": those steps are dropped
    rec = read_run(GOLD / "case_gpt3_15b_8t_release_sm_golden.json")
    assert loss_health(rec)["finite"]


# ------------------------------------------------------------------------------------------- robustness
MLM_LINE = (LOGS / "log_iteration_1.txt").read_text().splitlines()[0]


def _renumber(line: str, it: int) -> str:
    import re

    return re.sub(r"iteration\s+\d+/", f"iteration {it:8d}/", line)


def test_interleaved_ranks_ansi_crlf_restart_duplicates(tmp_path):
    lines = []
    for it in range(1, 31):
        lines.append(f"[rank15]: {_renumber(MLM_LINE, it)}")
        lines.append(f"\x1b[32m[rank{it % 8}]: host:1:2 [0] NCCL INFO [Service thread] Connection closed by "
                     f"localRank {it % 8}\x1b[0m")
        if it == 12:
            lines.append(f"[rank7]: {_renumber(MLM_LINE, it)}")  # the same line from another rank
    lines.append("[before the start of training step] datetime: 2024-09-03 15:52:43")
    for it in range(21, 41):  # resumed from a checkpoint at 20
        lines.append(_renumber(MLM_LINE, it))
    p = tmp_path / "mixed.log"
    p.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    rec = read_run(p)
    assert len(rec.iterations) == 50 and rec.segments == 2
    assert 15 in rec.ranks_seen or 7 in rec.ranks_seen
    s = summarize_run(rec)
    reasons = {e["reason"] for e in s.excluded}
    assert "warm-up after restart" in reasons and "warm-up (first logged iteration of the run)" in reasons
    assert rec.signal_counts["nccl_connection_closed"] == 30
    assert all("\x1b" not in sig.text for sig in rec.signals)


def test_gzip_and_truncated_last_line(tmp_path):
    text = "\n".join(_renumber(MLM_LINE, i) for i in range(1, 6)) + "\n" + _renumber(MLM_LINE, 6)[:150]
    p = tmp_path / "run.log.gz"
    p.write_bytes(gzip.compress(text.encode()))
    rec = read_run(p)
    assert len(rec.iterations) == 6 and rec.truncated_last_line
    assert int(rec.iterations.col("flags")[-1]) & FLAG_TRUNCATED


def test_profiler_checkpoint_and_graph_flags(tmp_path):
    lines = [_renumber(MLM_LINE, i) for i in range(1, 4)]
    lines += ["saving checkpoint at iteration       3 to /ckpt", _renumber(MLM_LINE, 4), _renumber(MLM_LINE, 5),
              "Capture range started in the application.", _renumber(MLM_LINE, 6),
              "Capture range ended in the application.", _renumber(MLM_LINE, 7), _renumber(MLM_LINE, 8),
              "> capturing CUDA graphs for the decoder", _renumber(MLM_LINE, 9), _renumber(MLM_LINE, 10)]
    p = tmp_path / "flags.log"
    p.write_text("\n".join(lines) + "\n")
    w = steady_window(read_run(p))
    reasons = {e["iteration"]: e["reason"] for e in w.excluded}
    assert reasons[4] == "checkpoint save" and reasons[6] == "profiler capture" and reasons[7] == "profiler capture"
    assert reasons[9] == "CUDA-graph capture"
    assert 5 in w.iterations and 8 in w.iterations


def test_bridge_gb_memory_versions_and_config_dumps(tmp_path):
    text = "\n".join([
        "Megatron-Core version: 0.14.0rc5",
        "Transformer Engine version: 2.7.0",
        "host:1:1 [0] NCCL INFO NCCL version 2.27.3+cuda12.9",
        "------- Task Configuration -------",
        "model:",
        "  tensor_model_parallel_size: 2",
        "  expert_model_parallel_size: 8",
        "  moe_token_dispatcher_type: flex",
        "  moe_flex_dispatcher_backend: deepep",
        "  seq_length: 4096",
        "train:",
        "  global_batch_size: 256",
        "  micro_batch_size: 1",
        "----------------------------------",
        "------------------------ arguments ------------------------",
        "  world_size ...................................... 64",
        "  pipeline_model_parallel_size .................... 4",
        "  bf16 ............................................ True",
        "-------------------- end of arguments ---------------------",
        "[Rank 3] (after 10 iterations) memory (GB) | mem-allocated-gigabytes: 41.2 | mem-active-gigabytes: 41.2 | "
        "mem-inactive-gigabytes: 1.1 | mem-reserved-gigabytes: 60.5 | mem-max-allocated-gigabytes: 58.31 | "
        "mem-max-active-gigabytes: 58.3 | mem-max-inactive-gigabytes: 2.2 | mem-max-reserved-gigabytes: 61.0 | "
        "mem-alloc-retires: 0 | mem-allocated-count: 12345",
        "Theoretical memory footprints: weight and optimizer=20480.00 MB, activation=10240.00 MB, total=30720.00 MB",
        "Step Time : 3.21s GPU utilization: 612.4MODEL_TFLOP/s/GPU",
    ]) + "\n"
    p = tmp_path / "bridge.log"
    p.write_text(text)
    rec = read_run(p)
    assert rec.versions == {"megatron-core": "0.14.0rc5", "transformer-engine": "2.7.0", "nccl": "2.27.3+cuda12.9"}
    assert rec.config["model.tensor_model_parallel_size"] == 2 and rec.config["train.global_batch_size"] == 256
    assert rec.config["world_size"] == 64 and rec.config["bf16"] is True
    mem = rec.memory_reports[0]
    assert mem.rank == 3 and mem.unit == "GB"
    assert mem.values_bytes["max allocated"] == pytest.approx(58.31e9)  # decimal GB (BPN §3)
    assert mem.values_bytes["alloc retires"] == 0 and mem.values_bytes["allocated count"] == 12345
    assert rec.theoretical_memory[0].total_mib == 30720.0
    assert float(rec.step_time.col("tflops")[0]) == 612.4
    from moetune.evidence.contract import contract_fields

    f = contract_fields(rec)
    assert (f["tp"], f["ep"], f["pp"], f["gpus"], f["dispatcher"], f["precision"]) == (2, 8, 4, 64, "flex:deepep",
                                                                                         "bf16")


def test_bad_inputs(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_run(tmp_path / "missing.log")
    with pytest.raises(InputError, match="directory"):
        read_run(tmp_path)
    (tmp_path / "bin.log").write_bytes(b"\x7fELF\x00\x00\x01")
    with pytest.raises(InputError, match="binary"):
        read_run(tmp_path / "bin.log")
    (tmp_path / "notes.txt").write_text("just some notes\nnothing to see here\n")
    with pytest.raises(InputError, match="no training-log lines"):
        read_run(tmp_path / "notes.txt")
    (tmp_path / "x.json").write_text('{"a": 1}')
    with pytest.raises(InputError, match="golden-values"):
        read_run(tmp_path / "x.json")
    with pytest.raises(InputError, match="--window"):
        parse_window("50-41")


# ------------------------------------------------------------------------------------------- properties
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(width=st.integers(min_value=60, max_value=200), idx=st.integers(min_value=0, max_value=2))
def test_terminal_wrapping_is_rejoined(tmp_path, width, idx):
    """A line wrapped at any terminal width (trailing blanks of each piece stripped) parses like the original."""
    line = (LOGS / "log_iteration_1.txt").read_text().splitlines()[idx]
    pieces = [line[i:i + width].rstrip() for i in range(0, len(line), width)]
    assume(all(len(pc) >= 40 for pc in pieces[:-1]))
    p = tmp_path / f"wrapped_{width}_{idx}.log"
    p.write_text("\n".join(pieces) + "\n")
    ref = tmp_path / f"plain_{idx}.log"
    ref.write_text(line + "\n")
    a, b = read_run(p).iterations, read_run(ref).iterations
    assert len(a) == 1
    for name in ("iteration", "elapsed_s", "tflops", "lr", "gbs", "loss", "loss_scale", "grad_norm", "skipped", "nan"):
        assert a.col(name)[0] == b.col(name)[0] or (np.isnan(a.col(name)[0]) and np.isnan(b.col(name)[0]))
    assert a.col("load_balancing_loss")[0] == b.col("load_balancing_loss")[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ranks=st.lists(st.integers(min_value=0, max_value=63), min_size=5, max_size=30))
def test_other_ranks_chatter_does_not_change_iterations(tmp_path, ranks):
    lines = []
    for i, r in enumerate(ranks, 1):
        lines.append(_renumber(MLM_LINE, i))
        lines.append(f"[rank{r}]: host:1:2 [{r % 8}] NCCL INFO [Service thread] Connection closed by localRank {r}")
        lines.append(f"[rank{r}]:   File \"/opt/megatron/core/foo.py\", line {r}, in bar")
    p = tmp_path / f"ranks_{len(ranks)}_{sum(ranks)}.log"
    p.write_text("\n".join(lines) + "\n")
    rec = read_run(p)
    assert col(rec, "iteration") == list(range(1, len(ranks) + 1))
    assert set(col(rec, "elapsed_s")) == {5.4449}


def test_golden_checkpoint_step_excluded(shared_data):
    rec = read_run(GOLD / "case_gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading_golden.json")
    w = steady_window(rec)
    assert {"iteration": 26, "reason": "checkpoint save"} in w.excluded  # --save-interval 25
    assert 26 not in w.iterations and 25 in w.iterations


def test_tflops_computed_from_model_flops_when_not_printed(shared_data):
    pytest.importorskip("moetune.io.config_to_job")
    flops = pytest.importorskip("moetune.perfmodel.flops")
    from moetune.io.config_to_job import job_from_config

    rec = read_run(GOLD / "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_golden.json")
    s = summarize_run(rec, gpus=8)
    assert s.tokens_per_s_per_gpu == pytest.approx(32 * 4096 / s.step_time_s["median"] / 8)
    nested: dict = {}
    for k, v in rec.config.items():
        sec, _, leaf = k.partition(".")
        nested.setdefault(sec, {})[leaf] = v
    job = job_from_config(nested, gpus=8, system="DGX-H100")
    fpt = flops.flops_per_token(job.model, 4096, 2).total
    assert s.tflops_per_gpu["median"] == pytest.approx(s.tokens_per_s_per_gpu * fpt / 1e12)
    assert s.tflops_per_gpu["source"].startswith("computed")
    assert summarize_run(rec).tflops_per_gpu["median"] is None  # GPU count unknown: nothing invented


def test_world_size_line_and_gpu_name(tmp_path):
    text = (
        "using world size: 64, data-parallel size: 8, context-parallel size: 1, hierarchical context-parallel sizes: "
        "None, tensor-model-parallel size: 2, encoder-tensor-model-parallel size: 0, pipeline-model-parallel size: 4\n"
        "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |\n"
        + MLM_LINE + "\n")
    p = tmp_path / "world.log"
    p.write_text(text)
    rec = read_run(p)
    assert rec.config["world_size"] == 64 and rec.config["tensor_model_parallel_size"] == 2
    assert rec.config["pipeline_model_parallel_size"] == 4 and rec.meta["gpu"] == "H100"
    s = summarize_run(rec, seq_length=4096)
    assert s.layout["gpus"] == 64 and s.tokens_per_s_per_gpu == pytest.approx(128 * 4096 / 5.4449 / 64)


def test_bare_bridge_print_yaml_dump(tmp_path):
    """ConfigContainer.print_yaml() is ``print(yaml.safe_dump(cfg.to_dict()))``: sorted keys, no header."""
    import yaml

    cfg = {"_target_": "megatron.bridge.training.config.ConfigContainer",
           "model": {"_target_": "megatron.bridge.models.DeepSeekV3ModelProvider", "tensor_model_parallel_size": 1,
                     "expert_model_parallel_size": 64, "pipeline_model_parallel_size": 16,
                     "moe_token_dispatcher_type": "alltoall", "seq_length": 4096, "cuda_graph_scope": ["attn"]},
           "train": {"global_batch_size": 8192, "micro_batch_size": 1}}
    dump = yaml.safe_dump(cfg, default_flow_style=False)
    text = "[NeMo I 2025-10-02 22:50:00 run:42] --- Final Configuration ---\n" + dump + MLM_LINE + "\n"
    for name, body in (("header.log", text), ("bare.log", dump + MLM_LINE + "\n")):
        p = tmp_path / name
        p.write_text(body)
        rec = read_run(p)
        assert rec.config["model.expert_model_parallel_size"] == 64, name
        assert rec.config["model.cuda_graph_scope"] == ["attn"] and rec.config["train.global_batch_size"] == 8192
        assert len(rec.iterations) == 1 and rec.source == "megatron-bridge"


def test_allocator_thresholds_set_once_and_not_over_the_users(monkeypatch):
    from moetune.evidence.logs import alloc

    monkeypatch.setattr(alloc, "_done", False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert alloc.settle_thresholds() is False and alloc._done  # the user's setting stands
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(alloc, "_done", False)
    assert alloc.settle_thresholds() is alloc._glibc()  # (the values glibc's own adjustment reaches; harmless to repeat)
    assert alloc.settle_thresholds() is False  # once per process

"""``diagnose`` on every real excerpt in data/logs: finding kind, evidence lines, cause details, fixes."""

from __future__ import annotations

import pytest

from conftest import DATA
from moetune.evidence.diagnose import ASSERTION_TABLE, KINDS, diagnose_paths, diagnose_run, match_assertion
from moetune.evidence.logs import read_run

LOGS = DATA / "logs"

#: file -> the finding kinds expected, in order of severity
KIND_EXPECTED = {
    "log_assert_distopt_instances_1.txt": ["config_assertion"],
    "log_assert_overlap_mtp_1.txt": ["config_assertion"],
    "log_assert_world_size_ep_1.txt": ["config_assertion"],
    "log_bridge_iteration_memory_1.txt": ["profiler_window"],
    "log_deepep_dispatch_timeout_1.txt": ["dispatcher_failure"],
    "log_dispatcher_deepep_traceback_1.txt": ["dispatcher_failure"],
    "log_dispatcher_error_1.txt": ["dispatcher_failure"],
    "log_iteration_1.txt": [],
    "log_iteration_theoretical_memory_1.txt": ["skipped_iterations"],
    "log_iteration_theoretical_memory_2.txt": ["skipped_iterations"],
    "log_nan_1.txt": ["nan_loss"],
    "log_nan_2.txt": ["nan_loss"],
    "log_nccl_timeout_1.txt": ["nccl_timeout"],
    "log_nccl_timeout_2.txt": ["nccl_timeout", "nccl_timeout"],
    "log_nccl_timeout_3.txt": ["nccl_timeout"],
    "log_nccl_timeout_4.txt": ["nccl_timeout"],
    "log_nemo_iteration_1.txt": [],
    "log_nemo_iteration_2.txt": [],
    "log_oom_message_1.txt": ["oom"],
    "log_oom_message_2.txt": ["oom"],
    "log_oom_traceback_1.txt": ["oom"],
    "log_oom_traceback_2.txt": ["python_error"],
    "log_regression_slowdown_1.txt": ["throughput_drop"],
    "log_skipped_timers_1.txt": ["skipped_iterations"],
    "log_theoretical_memory_1.txt": [],
    "log_timers_minmax_1.txt": ["skipped_iterations"],
}


def test_every_shared_log_has_a_diagnosis_expectation(shared_data):
    assert {p.name for p in (shared_data / "logs").glob("log_*.txt")} == set(KIND_EXPECTED)


@pytest.mark.parametrize("name", sorted(KIND_EXPECTED))
def test_kinds(shared_data, name):
    findings = diagnose_paths([shared_data / "logs" / name])
    assert [f.kind for f in findings] == KIND_EXPECTED[name]
    for f in findings:
        assert f.kind in KINDS and f.summary and f.cause and f.confirm and f.fixes
        assert f.evidence and all(e.line >= 1 and e.text for e in f.evidence)


def one(name, kind):
    found = [f for f in diagnose_run(read_run(LOGS / name)) if f.kind == kind]
    assert found, f"{name}: no {kind}"
    return found[0]


@pytest.mark.parametrize("name,rule", [
    ("log_assert_overlap_mtp_1.txt", "OVL-008"),
    ("log_assert_distopt_instances_1.txt", "PAR-007"),
    ("log_assert_world_size_ep_1.txt", "PAR-002"),
])
def test_config_assertions_map_to_rule_ids(shared_data, name, rule):
    f = one(name, "config_assertion")
    assert rule in f.rule_ids and rule in f.summary
    assert f.evidence[-1].text.startswith(("AssertionError", "RuntimeError"))


def test_assertion_table_cites_rule_ids_of_the_rule_catalogue(shared_data):
    from moetune.rules.check import load_rules
    ids = set(load_rules())
    for pat in ASSERTION_TABLE:
        for rid in pat.rule_ids:
            assert rid in ids, rid
    assert match_assertion("nothing to see") is None


def test_oom_fragmentation_and_phase(shared_data):
    f = one("log_oom_traceback_1.txt", "oom")
    assert f.data["fragmentation"] and f.data["phase"].startswith("backward")
    assert "expandable_segments" in f.fixes[0]
    assert "recompute" in f.fixes[1] and "layout" in f.fixes[2] and "offload" in f.fixes[3]
    assert f.evidence[-1].line == 15
    f = one("log_oom_message_1.txt", "oom")
    assert f.data["fragmentation"] and "6.37 GiB" in f.summary and "68.61 GiB" in f.summary


def test_nccl_groups_and_queue_depth(shared_data):
    f = one("log_nccl_timeout_2.txt", "nccl_timeout")
    assert f.data["op"] == "ALLTOALL_BASE" and f.data["seq"] == 146 and f.data["pg"] == [11]
    assert (f.data["last_enqueued"], f.data["last_completed"]) == (154, 145)
    assert f.data["group"].startswith("EP all-to-all")
    f = one("log_nccl_timeout_4.txt", "nccl_timeout")
    assert f.data["group_size"] == 16 and f.data["group"].startswith("DP gradient reduce-scatter")
    f = one("log_nccl_timeout_1.txt", "nccl_timeout")
    assert f.data["group"].startswith("scalar all-reduce") and f.data["ranks"] == [0, 1, 2]
    f = one("log_nccl_timeout_3.txt", "nccl_timeout")
    assert f.data["ranks"] == [3, 7] and f.data["last_enqueued"] == 4489


def test_dispatcher_failures(shared_data):
    f = one("log_deepep_dispatch_timeout_1.txt", "dispatcher_failure")
    assert f.data["ranks"] == [6, 14] and any("NVSHMEM" in x for x in f.fixes)
    f = one("log_dispatcher_deepep_traceback_1.txt", "dispatcher_failure")
    assert "DeepEP" in f.summary
    f = one("log_dispatcher_error_1.txt", "dispatcher_failure")
    assert "size 0" in f.summary and f.data["rank"] == 11
    assert any("hidden_shape" in e.text for e in f.evidence)


def test_nan_evidence_is_the_iteration_line(shared_data):
    f = one("log_nan_1.txt", "nan_loss")
    assert f.data["nan_iterations"] == [3385] and f.data["counters_zero"]
    assert f.evidence[0].line == 3 and "3385/" in f.evidence[0].text


def test_throughput_drop_and_profiler(shared_data):
    f = one("log_regression_slowdown_1.txt", "throughput_drop")
    assert f.data["at_iteration"] == 182 and f.data["ratio"] == pytest.approx(127.3999 / 88.4734)
    assert [e.line for e in f.evidence] == [4, 5]
    f = one("log_bridge_iteration_memory_1.txt", "profiler_window")
    assert f.data["profiled_s"] == [16.85] and f.data["unprofiled_median_s"] == pytest.approx(14.26)


def test_skipped_iterations_warmup_vs_later(shared_data):
    early = one("log_iteration_theoretical_memory_2.txt", "skipped_iterations")
    assert early.severity == "info" and early.data["skipped_total"] == 15
    late = one("log_iteration_theoretical_memory_1.txt", "skipped_iterations")
    assert late.severity == "warning" and 50 in late.data["skipped_at"]


def test_loss_spike_on_a_golden_with_a_spike(shared_data):
    rec = read_run(DATA / "megatron_golden" / "case_gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading_golden"
                                             ".json")
    spikes = [f for f in diagnose_run(rec) if f.kind == "loss_spike"]
    # lm loss 10.08 (step 8) -> 11.32 (step 12): +12 % over the recent median, far outside its spread
    assert spikes and spikes[0].data["iterations"][0] == 12
    healthy = read_run(DATA / "megatron_golden" / "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_golden.json")
    assert not diagnose_run(healthy)

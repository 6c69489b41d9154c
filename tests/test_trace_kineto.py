"""Kineto reader: every shared trace reads; truncated/corrupt files give one-line errors with a byte offset."""

from __future__ import annotations

import gzip

import pytest

from conftest import DATA, run_cli
from moetune.errors import InputError
from moetune.evidence.traces.analyze import analyze_paths
from moetune.evidence.traces.kineto import read_kineto

TRACES = DATA / "traces"
ALL = sorted(p.name for p in TRACES.glob("*")) if TRACES.is_dir() else []


@pytest.mark.parametrize("name", [n for n in ALL if n.endswith((".json", ".json.gz"))])
def test_every_kineto_trace_reads(shared_data, name):
    tr = read_kineto(TRACES / name)
    assert tr.n_events > 0
    assert tr.gpu_start.size == tr.gpu_end.size == tr.gpu_name.size
    assert (tr.gpu_end >= tr.gpu_start).all()


@pytest.mark.parametrize("name", [n for n in ALL if not n.endswith(".csv")])
def test_every_shared_trace_analyses(shared_data, name):
    rep = analyze_paths(TRACES / name)
    assert rep.ranks
    for r in rep.ranks:
        if r.has_gpu_events:
            assert r.compute_s <= r.busy_s + 1e-12 <= r.window_s + 2e-12
            assert abs(r.hidden_comm_s + r.exposed_comm_s - r.comm_s) < 1e-9
            b = r.wall_breakdown
            parts = (b.compute_s + b.exposed_comm_s + b.exposed_memory_s + b.host_bound_idle_s + b.dependency_idle_s
                     + b.unattributed_idle_s)
            assert abs(parts - r.window_s) < 1e-9


def test_index_agrees_with_reader(shared_data):
    import csv

    rows = {r["file"]: r for r in csv.DictReader(open(TRACES / "traces_index.csv"))}
    for name in ("deepseek_profile_data_train.json", "hta_trace_filter_sampled_rank-0.json.gz",
                 "tracelens_b200_eager_trace.json.gz"):
        tr = read_kineto(TRACES / name)
        assert int((tr.gpu_kind == 0).sum()) == int(rows[name]["n_kernels"])
        assert str(tr.rank) == rows[name]["rank"]
        kt = (tr.gpu_end - tr.gpu_start)[tr.gpu_kind == 0].sum() / 1e3
        assert kt == pytest.approx(float(rows[name]["all_kernel_time_us"]), rel=1e-3)


def test_rank_from_metadata_not_filename(shared_data, tmp_path):
    # the control trace is rank 3 of 8 whatever the file is called
    assert read_kineto(TRACES / "hta_trace_diff_control_control.json.gz").rank == 3
    assert read_kineto(TRACES / "hta_distributed_info_unavailable_distributed_info_not_found.json.gz").rank is None


def test_truncated_json_names_file_and_offset(shared_data, tmp_path):
    raw = (TRACES / "deepseek_profile_data_train.json").read_bytes()
    bad = tmp_path / "trunc.json"
    bad.write_bytes(raw[:1_000_000])
    with pytest.raises(InputError) as ei:
        read_kineto(bad)
    assert str(bad) in str(ei.value) and "byte offset 1000000" in str(ei.value)


def test_corrupt_json_exact_offset(shared_data, tmp_path):
    raw = bytearray((TRACES / "deepseek_profile_data_train.json").read_bytes())
    at = raw.index(b'"ts"', 500_000) + 6
    raw[at : at + 2] = b"@@"
    bad = tmp_path / "corrupt.json"
    bad.write_bytes(bytes(raw))
    with pytest.raises(InputError) as ei:
        read_kineto(bad)
    assert f"byte offset {at}" in str(ei.value)


def test_truncated_gzip(shared_data, tmp_path):
    raw = (TRACES / "hta_trace_filter_sampled_rank-0.json.gz").read_bytes()
    bad = tmp_path / "t.json.gz"
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError, match=r"t\.json\.gz: truncated or corrupt .*byte offset"):
        read_kineto(bad)


def test_not_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("hello")
    with pytest.raises(InputError, match="byte offset 0"):
        read_kineto(p)
    p.write_text("")
    with pytest.raises(InputError, match="empty"):
        read_kineto(p)


def test_cli_corrupt_exit_2_one_line(shared_data, tmp_path):
    bad = tmp_path / "trunc.json.gz"
    with gzip.open(bad, "wb") as fh:
        fh.write((TRACES / "deepseek_profile_data_train.json").read_bytes()[:200_000])
    r = run_cli("trace", str(bad), "--json")
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "trunc.json.gz" in lines[0] and "byte offset" in lines[0]


def test_cpu_only_trace_says_so(shared_data):
    rep = analyze_paths(TRACES / "hta_cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    r = rep.ranks[0]
    assert r.rank == 34 and not r.has_gpu_events and r.comm_compute_overlap_pct is None
    assert any("no GPU events" in n for n in r.notes)
    out = run_cli("trace", str(TRACES / "hta_cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"))
    assert out.returncode == 0 and "no GPU events" in out.stdout


def _ijson_only(path):
    from moetune.evidence.traces import kineto

    col = kineto._Collector(kineto.RankTrace(source=str(path), fmt="kineto"))
    n = kineto._read_ijson(path, "traceEvents.item", col, False)
    return n, col


@pytest.mark.parametrize("name", ["deepseek_profile_data_train.json", "hta_nccl_parser_config_nccl_data.json.gz",
                                  "tracelens_b200_eager_trace.json.gz"])
def test_fast_splitter_matches_ijson(shared_data, name):
    tr = read_kineto(TRACES / name)
    n, col = _ijson_only(TRACES / name)
    assert n == tr.n_events
    assert list(col.g[0]) == list(tr.gpu_start) and list(col.g[2]) == list(tr.gpu_name)
    assert list(col.r[3]) == list(tr.rt_corr)
    assert col.tr.steps.name == tr.steps.name and col.tr.annotations.name == tr.annotations.name


def test_fast_splitter_escapes_and_braces_in_strings(tmp_path):
    import orjson

    from trace_synth import KinetoBuilder

    b = KinetoBuilder()
    b.step(1, 0, 100)
    b.cpu_op('weird "quoted" {brace} [x] \\ name \\"', 1, 2)
    b.kernel('void at::native::kernel<{lambda(at::TensorIteratorBase&)#1}>"\\', 10, 5, launch_ts=2)
    b.kernel("ncclDevKernel_AllGather_RING_LL", 12, 5, launch_ts=3, stream=9)
    doc = dict(b.meta, traceEvents=b.events)
    p = tmp_path / "compact.json"
    p.write_bytes(orjson.dumps(doc))  # one line, no spaces
    tr = read_kineto(p)
    n, col = _ijson_only(p)
    assert tr.n_events == n == len(b.events)
    assert tr.names[tr.gpu_name[0]].endswith('#1}>"\\')
    assert list(col.g[0]) == list(tr.gpu_start)
    assert len(tr.steps) == 1


def test_object_without_trace_events_and_empty_events(tmp_path):
    p = tmp_path / "nte.json"
    p.write_text('{"foo": 1}')
    with pytest.raises(InputError, match="no traceEvents"):
        read_kineto(p)
    p.write_text('{"traceEvents": []}')
    rep = analyze_paths(p)
    assert not rep.ranks[0].has_gpu_events


def test_chrome_array_format(tmp_path):
    p = tmp_path / "arr.json"
    p.write_text('[{"ph":"X","cat":"kernel","name":"ncclDevKernel_AllReduce","ts":10,"dur":5,'
                 '"args":{"stream":7,"correlation":1}},{"ph":"X","cat":"kernel","name":"sm90_xmma_gemm","ts":8,'
                 '"dur":5,"args":{"stream":8,"correlation":2}}]')
    r = analyze_paths(p).ranks[0]
    assert r.comm_compute_overlap_pct == pytest.approx(60.0)

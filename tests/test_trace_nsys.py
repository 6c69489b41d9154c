"""Nsight Systems readers: SQLite export (schema of nsys 2024-2026 exports, rows in random order) and the recipe
outputs shipped in data/traces (nvtx_pushpop_trace CSV.xz, nvtx_gpu_proj_trace / device-metadata parquet)."""

from __future__ import annotations

import random
import sqlite3

import pytest

from conftest import DATA, run_cli
from moetune.errors import InputError
from moetune.evidence.traces.analyze import analyze_paths
from moetune.evidence.traces.nsys import read_nsys_sqlite

TRACES = DATA / "traces"
EPOCH = 1_760_000_000_000_000_000
PID = 4242
GPID = PID << 24
GTID = (PID << 24) | 4243

SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
  globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER,
  launchType INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER,
  graphNodeId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
  globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL,
  callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER, graphNodeId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
  globalPid INTEGER, syncType INTEGER NOT NULL, eventId INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
  domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
  int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
"""

STRINGS = {1: "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 2: "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
           3: "cudaLaunchKernel", 4: "cudaMemcpyAsync", 5: "void deep_ep::intranode::dispatch<8>(int4*)",
           6: "iteration 1", 7: "iteration 2"}


def build(path, seed: int, devices=(0,)):
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", list(STRINGS.items()))
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (EPOCH,))
    kern, rt, mc = [], [], []
    corr = 0
    for dev in devices:
        for it in range(2):
            base = it * 1_000_000
            for s, e, nid, stream, launch in ((0, 100_000, 1, 7, -10_000), (50_000, 150_000, 2, 20, -8_000),
                                              (160_000, 200_000, 5, 21, 155_000)):
                corr += 1
                kern.append((base + s, base + e, dev, 1, None, stream, corr, GPID, nid, nid, nid, 0, 1, 1, 1, 1, 1, 1,
                             None))
                rt.append((base + launch, base + launch + 2000, 0, GTID, corr, 3, 0, None))
            corr += 1
            mc.append((base + 120_000, base + 130_000, dev, 1, 22, corr, GPID, 4096, 8, 2, 2, None))
            rt.append((base - 6_000, base - 4_000, 0, GTID, corr, 4, 0, None))
    rng = random.Random(seed)
    for rows in (kern, rt, mc):
        rng.shuffle(rows)
    con.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({','.join('?' * 19)})", kern)
    con.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES ({','.join('?' * 8)})", rt)
    con.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES ({','.join('?' * 12)})", mc)
    nv = [(-20_000, 900_000, 59, None, None, None, None, GTID, None, 6, 0),
          (980_000, 1_900_000, 59, None, None, None, "iteration 2", GTID, None, None, 0),
          (1_950_000, 2_100_000, 59, None, None, None, "iteration 3", GTID, None, None, 0)]
    rng.shuffle(nv)
    con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, rangeId, category, color, text, globalTid, "
                    "endGlobalTid, textId, domainId) VALUES (?,?,?,?,?,?,?,?,?,?,?)", nv)
    con.commit()
    con.close()
    return path


def test_sqlite_analysis_and_row_order_independence(tmp_path):
    reps = [analyze_paths(build(tmp_path / f"r{s}.sqlite", seed=s)) for s in (1, 2)]
    a, b = (r.ranks[0].model_dump(exclude={"source"}) for r in reps)
    assert a == b  # rows were inserted in different orders
    r = reps[0].ranks[0]
    assert r.format == "nsys-sqlite" and r.iterations == 2 and r.iteration_source.startswith("NVTX")
    assert r.comm_by_kind.keys() == {"nccl_allreduce", "deepep_dispatch"}
    # all-reduce [50,150) µs vs GEMM [0,100): half hidden by compute; a memcpy runs beside it for 10 µs
    assert r.comm_by_kind["nccl_allreduce"] == pytest.approx(2 * 100e-6)
    assert r.exposed_comm_by_kind["nccl_allreduce"] == pytest.approx(2 * 50e-6)
    assert r.exposed_comm_beside_memcpy_s == pytest.approx(2 * 10e-6)
    assert r.features.dispatcher == "deepep"
    # gap [150,160) µs before the DeepEP kernel launched at 155 µs (returns 157): 7 µs launch-starved
    assert r.idle.host_bound_s >= 2 * 7e-6 - 1e-12


def test_sqlite_two_devices_two_ranks_and_utc_rebase(tmp_path):
    tr = read_nsys_sqlite(build(tmp_path / "two.sqlite", seed=3, devices=(0, 1)))
    assert len(tr) == 2
    assert all(t.gpu_start.min() >= EPOCH for t in tr)  # rebased on TARGET_INFO_SESSION_START_TIME.utcEpochNs
    assert tr[0].rank is None  # nsys carries no rank: never invented


def test_sqlite_truncated_and_not_sqlite(tmp_path):
    p = build(tmp_path / "ok.sqlite", seed=1)
    raw = p.read_bytes()
    bad = tmp_path / "trunc.sqlite"
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError, match=rf"trunc\.sqlite: truncated SQLite file at byte offset {len(raw) // 2}"):
        read_nsys_sqlite(bad)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 10)
    r = run_cli("trace", str(junk), "--json")
    assert r.returncode == 2 and "junk.sqlite" in r.stderr and "byte offset 0" in r.stderr


def test_recipe_outputs(shared_data):
    rep = analyze_paths(TRACES / "nsysjax_pax_fsdp4_4proc_proc1_nvtx_pushpop_trace.csv.xz")
    r = rep.ranks[0]
    assert not r.has_gpu_events and any("no GPU" in n for n in r.notes)
    assert any("NCCL API ranges" in n for n in r.notes)
    rep = analyze_paths(TRACES / "nsysjax_pax_fsdp4_4proc_proc0_nvtx_gpu_proj_trace.parquet")
    r = rep.ranks[0]
    assert r.rank == 0 and r.has_gpu_events
    assert {"nccl_allreduce", "nccl_allgather", "nccl_reducescatter"} <= set(r.comm_by_kind)
    meta = analyze_paths(TRACES / "nsysjax_pax_fsdp4_4proc_proc0_device-metadata.parquet").ranks[0]
    assert meta.device == "NVIDIA A100-SXM4-40GB" and not meta.has_gpu_events

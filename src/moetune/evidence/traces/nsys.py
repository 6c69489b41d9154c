"""Readers for Nsight Systems exports: the SQLite export (``nsys export --type sqlite``) and the recipe outputs
(``nvtx_pushpop_trace`` CSV(.xz), ``nvtx_gpu_proj_trace`` parquet, ``device-metadata`` parquet).

SQLite tables used (docs/anchors.md §4d; NVIDIA "SQLite export schema"): ``CUPTI_ACTIVITY_KIND_KERNEL`` (start, end
[ns], deviceId, streamId, correlationId, globalPid, demangledName/shortName → ``StringIds``), ``…_MEMCPY``,
``…_MEMSET``, ``…_RUNTIME`` (correlationId, nameId, globalTid), ``…_SYNCHRONIZATION``, ``NVTX_EVENTS`` (text or
textId, start, end, globalTid; eventType 59 push/pop, 60 start/end), ``TARGET_INFO_SESSION_START_TIME.utcEpochNs``
(rebases every timestamp to UTC so reports of different hosts share one clock, domain.md §7.2 step 6).
Nsight 2025.6+ no longer guarantees row order: every query sorts explicitly. ``globalPid``/``globalTid`` encode the
process id in bits 24..47.
"""

from __future__ import annotations

import lzma
import os
import sqlite3
from pathlib import Path

import numpy as np

from moetune.errors import InputError
from moetune.evidence.traces.rank_trace import GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET, Interner, RankTrace
from moetune.evidence.traces.taxonomy import load_taxonomy

_SQLITE_MAGIC = b"SQLite format 3\x00"
#: CUPTI_ActivityMemcpyKind (cupti_activity.h)
_COPY_KIND = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP"}
_NVTX_RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange


def _pid(global_id: np.ndarray) -> np.ndarray:
    return (global_id >> 24) & 0xFFFFFF


def _check_sqlite_file(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(100)
    if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
        raise InputError(f"{path}: not an SQLite database (bad header) at byte offset 0", field=str(path), value=0,
                         expected="an nsys SQLite export")
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    if pages and page * pages > size:
        raise InputError(
            f"{path}: truncated SQLite file at byte offset {size} (header declares {page * pages} bytes)",
            field=str(path), value=size, expected="a complete nsys SQLite export",
        )


def _q(con: sqlite3.Connection, sql: str) -> list[tuple]:
    return con.execute(sql).fetchall()


def read_nsys_sqlite(path: str | Path) -> list[RankTrace]:
    """One RankTrace per (process, GPU) found in an nsys SQLite export."""
    path = Path(path)
    _check_sqlite_file(path)
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return _read(con, path)
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{path}: corrupt SQLite export ({exc}); byte offset unknown within {os.path.getsize(path)} "
                         "bytes", field=str(path), value=None, expected="a readable nsys SQLite export") from exc


def _read(con: sqlite3.Connection, path: Path) -> list[RankTrace]:
    tables = {r[0] for r in _q(con, "SELECT name FROM sqlite_master WHERE type IN ('table','view')")}
    if not tables & {"CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds"}:
        raise InputError(f"{path}: SQLite file without nsys tables (CUPTI_ACTIVITY_KIND_*, NVTX_EVENTS, StringIds)",
                         field=str(path), value=sorted(tables)[:5], expected="an nsys SQLite export")
    strings = dict(_q(con, "SELECT id, value FROM StringIds")) if "StringIds" in tables else {}
    epoch = 0
    if "TARGET_INFO_SESSION_START_TIME" in tables:
        row = _q(con, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
        epoch = int(row[0][0]) if row and row[0][0] is not None else 0

    def cols(t: str) -> set[str]:
        return {r[1] for r in _q(con, f"PRAGMA table_info({t})")} if t in tables else set()

    names = Interner()
    rows: list[tuple] = []  # start, end, name_id, kind, stream, corr, device, gpid, graph
    kcols = cols("CUPTI_ACTIVITY_KIND_KERNEL")
    if kcols:
        name_col = "demangledName" if "demangledName" in kcols else "shortName"
        graph = "graphId" if "graphId" in kcols else ("graphNodeId" if "graphNodeId" in kcols else "NULL")
        for s, e, nid, stream, corr, dev, gpid, g in _q(
            con,
            f"SELECT start, end, {name_col}, streamId, correlationId, deviceId, globalPid, {graph} "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start, end",
        ):
            rows.append((s, e, names(str(strings.get(nid, nid))), GPU_KERNEL, stream, corr, dev, gpid,
                         -1 if g is None else g))
    mcols = cols("CUPTI_ACTIVITY_KIND_MEMCPY")
    if mcols:
        for s, e, ck, stream, corr, dev, gpid in _q(
            con,
            "SELECT start, end, copyKind, streamId, correlationId, deviceId, globalPid "
            "FROM CUPTI_ACTIVITY_KIND_MEMCPY ORDER BY start, end",
        ):
            rows.append((s, e, names(f"Memcpy {_COPY_KIND.get(ck, ck)}"), GPU_MEMCPY, stream, corr, dev, gpid, -1))
    if cols("CUPTI_ACTIVITY_KIND_MEMSET"):
        for s, e, stream, corr, dev, gpid in _q(
            con,
            "SELECT start, end, streamId, correlationId, deviceId, globalPid "
            "FROM CUPTI_ACTIVITY_KIND_MEMSET ORDER BY start, end",
        ):
            rows.append((s, e, names("Memset"), GPU_MEMSET, stream, corr, dev, gpid, -1))
    rt: list[tuple] = []
    if cols("CUPTI_ACTIVITY_KIND_RUNTIME"):
        for s, e, nid, corr, gtid in _q(
            con,
            "SELECT start, end, nameId, correlationId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY start, end",
        ):
            rt.append((s, e, names(str(strings.get(nid, nid))), corr, gtid))
    nvtx: list[tuple] = []
    ncols = cols("NVTX_EVENTS")
    if ncols:
        text_id = "textId" if "textId" in ncols else "NULL"
        for s, e, text, tid_, gtid in _q(
            con,
            f"SELECT start, end, text, {text_id}, globalTid FROM NVTX_EVENTS "
            f"WHERE eventType IN {_NVTX_RANGE_TYPES} AND end IS NOT NULL ORDER BY start, end",
        ):
            label = text if text is not None else strings.get(tid_, "")
            nvtx.append((s, e, str(label), gtid or 0))
    n_sync = _q(con, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")[0][0] \
        if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" in tables else 0
    device_names = {}
    if "TARGET_INFO_GPU" in tables and {"id", "name"} <= cols("TARGET_INFO_GPU"):
        device_names = dict(_q(con, "SELECT id, name FROM TARGET_INFO_GPU"))

    tax = load_taxonomy()
    g = np.array(rows, dtype=np.int64).reshape(-1, 9) if rows else np.zeros((0, 9), np.int64)
    r = np.array(rt, dtype=np.int64).reshape(-1, 5) if rt else np.zeros((0, 5), np.int64)
    keys = sorted({(int(p), int(d)) for p, d in zip(_pid(g[:, 7]), g[:, 6], strict=True)})
    out: list[RankTrace] = []
    multi = len(keys) > 1
    if not keys:  # host-side only: one trace per process seen in NVTX / runtime
        pids = sorted({int(x) for x in _pid(np.array([n[3] for n in nvtx] + list(r[:, 4]), np.int64))}) or [0]
        keys = [(p, -1) for p in pids]
    for pid, dev in keys:
        tr = RankTrace(source=str(path), fmt="nsys-sqlite")
        m = (_pid(g[:, 7]) == pid) & (g[:, 6] == dev) if g.size else np.zeros(0, bool)
        sub = g[m]
        order = np.lexsort((sub[:, 1], sub[:, 0]))
        sub = sub[order]
        tr.gpu_start, tr.gpu_end = sub[:, 0] + epoch, sub[:, 1] + epoch
        tr.gpu_name = sub[:, 2].astype(np.int32)
        tr.gpu_kind = sub[:, 3].astype(np.int8)
        tr.gpu_stream, tr.gpu_corr, tr.gpu_graph = sub[:, 4], sub[:, 5], sub[:, 8]
        rm = _pid(r[:, 4]) == pid if r.size else np.zeros(0, bool)
        rs = r[rm]
        rs = rs[np.lexsort((rs[:, 1], rs[:, 0]))]
        tr.rt_start, tr.rt_end = rs[:, 0] + epoch, rs[:, 1] + epoch
        tr.rt_name = rs[:, 2].astype(np.int32)
        tr.rt_corr, tr.rt_tid = rs[:, 3], rs[:, 4] & 0xFFFFFF
        for s, e, label, gtid in nvtx:
            if int(_pid(np.int64(gtid))) != pid:
                continue
            target = tr.steps if tax.iteration_ranges.search(label) else tr.annotations
            target.add(label, s + epoch, e + epoch, gtid & 0xFFFFFF)
        tr.names = names.names
        tr.clock_epoch_ns = epoch or None
        tr.device = device_names.get(dev) if dev >= 0 else None
        if multi:
            tr.notes.append(f"process {pid}, CUDA device {dev} of {len(keys)} (process, device) pairs in this report")
        tr.rank_source = "unknown (nsys exports carry no rank; ranks are (process, device) pairs)"
        tr.n_events = int(sub.shape[0] + rs.shape[0])
        if n_sync:
            tr.notes.append(f"{n_sync} CUPTI synchronization records in the report")
        out.append(tr)
    return out


# ------------------------------------------------------------------------------------------- nsys recipe outputs
def read_nsys_recipe(path: str | Path) -> list[RankTrace]:
    """nsys recipe outputs shipped as CSV(.xz) or parquet."""
    path = Path(path)
    low = path.name.lower()
    if low.endswith(".parquet"):
        return _read_parquet(path)
    return _read_pushpop_csv(path)


def _read_pushpop_csv(path: Path) -> list[RankTrace]:
    """``nsys stats -r nvtx_pushpop_trace`` CSV: NVTX push/pop ranges on the host (no GPU activity)."""
    import csv
    import io

    opener = lzma.open if path.name.lower().endswith(".xz") else open
    tax = load_taxonomy()
    by_pid: dict[int, RankTrace] = {}
    n = 0
    try:
        with opener(path, "rt", newline="") as fh:
            rd = csv.reader(fh)
            header = next(rd, None)
            need = ("Start (ns)", "End (ns)", "Name", "PID", "TID")
            if not header or any(h not in header for h in need):
                raise InputError(f"{path}: not an nsys nvtx_pushpop_trace CSV (header {header!r:.120}); expected "
                                 f"columns {', '.join(need)}", field=str(path), value=header, expected=str(need))
            ix = {h: header.index(h) for h in need}
            for row in rd:
                n += 1
                try:
                    s, e = int(row[ix["Start (ns)"]]), int(row[ix["End (ns)"]])
                    pid, tid = int(row[ix["PID"]]), int(row[ix["TID"]])
                except (ValueError, IndexError) as exc:
                    raise InputError(f"{path}: bad row {n + 1} ({exc})", field=str(path), value=row[:4],
                                     expected="integer Start/End/PID/TID") from exc
                tr = by_pid.setdefault(pid, RankTrace(source=str(path), fmt="nsys-nvtx-pushpop-csv"))
                name = row[ix["Name"]]
                (tr.steps if tax.iteration_ranges.search(name) else tr.annotations).add(name, s, e, tid)
    except (EOFError, lzma.LZMAError, OSError) as exc:
        raise InputError(f"{path}: truncated or corrupt xz/CSV stream ({exc}) after {n} rows",
                         field=str(path), value=n, expected="a complete .csv.xz") from exc
    except (UnicodeDecodeError, csv.Error, io.UnsupportedOperation) as exc:
        raise InputError(f"{path}: not a CSV text file ({exc})", field=str(path), value=None, expected="CSV") from exc
    out = []
    for pid, tr in sorted(by_pid.items()):
        tr.n_events = len(tr.annotations) + len(tr.steps)
        tr.notes.append(f"process {pid}: {tr.n_events} NVTX host ranges; nvtx_pushpop_trace has no GPU activity")
        tr.notes.extend(_nvtx_summary(tr))
        out.append(tr)
    if not out:
        out.append(RankTrace(source=str(path), fmt="nsys-nvtx-pushpop-csv", notes=["empty nvtx_pushpop_trace CSV"]))
    return out


def _nvtx_summary(tr: RankTrace, top: int = 3) -> list[str]:
    tot: dict[str, int] = {}
    for nm, s, e in zip(tr.annotations.name, tr.annotations.start, tr.annotations.end, strict=True):
        key = nm.split("#")[0].rstrip(":")
        tot[key] = tot.get(key, 0) + (e - s)
    nccl = sum(v for k, v in tot.items() if k.upper().startswith("NCCL"))
    best = sorted(tot.items(), key=lambda kv: -kv[1])[:top]
    lines = [f"NCCL API ranges (host): {nccl / 1e6:.3f} ms in total"] if nccl else []
    lines.append("largest NVTX ranges (host, summed): " + "; ".join(f"{k} {v / 1e6:.1f} ms" for k, v in best))
    return lines


def _read_parquet(path: Path) -> list[RankTrace]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is in the test extra
        raise InputError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from exc
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for damaged files
        raise InputError(f"{path}: corrupt or truncated parquet ({str(exc).splitlines()[0]}); byte offset "
                         f"{os.path.getsize(path)} is the end of the file", field=str(path), value=None,
                         expected="a parquet file") from exc
    cols = set(table.column_names)
    if {"Projected Start", "Projected Duration", "Name"} <= cols:
        return _read_gpu_proj(path, table)
    if any("TARGET_INFO_GPU" in c for c in cols):
        tr = RankTrace(source=str(path), fmt="nsys-device-metadata-parquet")
        name_col = next((c for c in table.column_names if "TARGET_INFO_GPU" in c and c.endswith("'name')")), None)
        if name_col:
            tr.device = str(table.column(name_col)[0])
        tr.notes.append("nsys device-metadata table: device properties only, no GPU activity")
        return [tr]
    raise InputError(f"{path}: parquet is neither nvtx_gpu_proj_trace nor device-metadata (columns "
                     f"{sorted(cols)[:6]})", field=str(path), value=sorted(cols)[:6],
                     expected="an nsys recipe output")


def _read_gpu_proj(path: Path, table) -> list[RankTrace]:
    """``nvtx_gpu_proj_trace``: NVTX ranges projected onto the GPU (span of the GPU ops each range launched).

    Leaf ranges (no children) with GPU work become pseudo GPU activities classified by the taxonomy's
    ``nvtx_classes`` from "<parent> > <range>". Spans may include gaps, so busy time is an upper bound.
    """
    tax = load_taxonomy()
    d = table.to_pydict()
    n = len(d["Name"])
    get = d.get
    rank_col = get("Rank") or [None] * n
    parent_name = {}
    rid, pid_ = get("RangeId") or [None] * n, get("ParentId") or [None] * n
    for i in range(n):
        if rid[i] is not None:
            parent_name[rid[i]] = d["Name"][i]
    nchild = get("NumChild") or [0] * n
    nops = get("NumGPUOps") or [1] * n
    by_rank: dict[object, list[int]] = {}
    for i in range(n):
        if d["Name"][i] is None or (nchild[i] or 0) > 0 or (nops[i] or 0) <= 0 or d["Projected Duration"][i] <= 0:
            continue
        by_rank.setdefault(rank_col[i], []).append(i)
    out = []
    for rank, idx in sorted(by_rank.items(), key=lambda kv: (kv[0] is None, kv[0])):
        names = Interner()
        tr = RankTrace(source=str(path), fmt="nsys-nvtx-gpu-proj-parquet")
        if isinstance(rank, int):
            tr.rank, tr.rank_source = rank, "nvtx_gpu_proj_trace Rank column"
        starts, ends, nid = [], [], []
        for i in idx:
            label = d["Name"][i]
            parent = parent_name.get(pid_[i]) if pid_[i] is not None else None
            full = f"{parent} > {label}" if parent else label
            k = names(label.split("#")[0] if not tax.classify_nvtx(full).startswith("nccl") else full)
            if k not in tr.forced_class:
                tr.forced_class[k] = tax.classify_nvtx(full)
            starts.append(d["Projected Start"][i])
            ends.append(d["Projected Start"][i] + d["Projected Duration"][i])
            nid.append(k)
        tr.gpu_start = np.array(starts, np.int64)
        tr.gpu_end = np.array(ends, np.int64)
        tr.gpu_name = np.array(nid, np.int32)
        tr.gpu_kind = np.zeros(len(idx), np.int8)
        tr.gpu_stream = np.zeros(len(idx), np.int64)
        tr.gpu_corr = np.full(len(idx), -1, np.int64)
        tr.gpu_graph = np.full(len(idx), -1, np.int64)
        tr.names = names.names
        tr.n_events = n
        tr.notes.append("GPU activity = NVTX leaf ranges projected onto the GPU (nvtx_gpu_proj_trace): spans, not "
                        "kernels; busy/comm times are upper bounds; no launch records, so idle cannot be split")
        out.append(tr)
    if not out:
        out.append(RankTrace(source=str(path), fmt="nsys-nvtx-gpu-proj-parquet",
                             notes=["nvtx_gpu_proj_trace without projected GPU work"]))
    return out

"""Streaming reader for PyTorch profiler / Kineto Chrome-trace JSON (``.json``, ``.json.gz``).

The file is never loaded whole: events stream through ijson (C backend ``yajl2_c`` when available) and only the
fields the analysis needs are appended to compact typed arrays (``array.array``), so peak memory is proportional to
the number of GPU activities and runtime calls, not to the file size. CPU operators and Python frames (the bulk of a
Kineto file) are dropped on the fly except ``ProfilerStep#N`` ranges and user annotations.

Format facts (Kineto ``ChromeTraceLogger``, pytorch/kineto libkineto/src/output_json.cpp; HTA
hta/common/trace_parser.py): ``ts``/``dur`` are microseconds (fractional for ns-resolution traces); GPU activities are
``cat`` = ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` with ``args.stream``, ``args.device``, ``args.correlation``;
host launches are ``cuda_runtime`` / ``cuda_driver`` events sharing ``args.correlation``; the rank is
``distributedInfo.rank`` (never the file name); NCCL kernels carry ``Collective name``, ``In msg nelems``,
``Group size``, ``Process Group Name`` args.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from array import array
from pathlib import Path

import ijson
import numpy as np
import orjson

from moetune.errors import InputError
from moetune.evidence.traces.rank_trace import GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET, Interner, RankTrace

try:  # the C backend is ~3x faster than the Python ones
    _IJ = ijson.get_backend("yajl2_c")
except Exception:  # pragma: no cover - depends on the wheel
    _IJ = ijson

_GPU_CATS = {"kernel": GPU_KERNEL, "gpu_memcpy": GPU_MEMCPY, "gpu_memset": GPU_MEMSET, "Kernel": GPU_KERNEL}
_RT_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
_STEP_CATS = {"cpu_op", "user_annotation", "Operator", "python_function"}
_COMM_ARGS = {
    "Collective name": "collective",
    "In msg nelems": "in_nelems",
    "Out msg nelems": "out_nelems",
    "Group size": "group_size",
    "dtype": "dtype",
    "Process Group Name": "pg_name",
    "Process Group Description": "pg_desc",
    "Process Group Ranks": "pg_ranks",
}
_WINDOW = 1 << 17
_SAW_EVENTS = "\x00traceEvents"  # marker key set by _read_metadata  # bytes of recent input kept to locate a parse error exactly



# ------------------------------------------------------------------------------------------- fast event splitter
class _FallBack(Exception):
    """The fast splitter met a layout it does not handle: re-read with ijson (which also locates errors)."""


_CHUNK = 1 << 22
_LUT = np.zeros(256, np.int8)
_LUT[ord("{")] = 1
_LUT[ord("[")] = 1
_LUT[ord("}")] = -1
_LUT[ord("]")] = -1
_IS_BRACE = np.zeros(256, bool)
_IS_BRACE[[ord(c) for c in "{}[]"]] = True
_ALLOWED = np.zeros(256, bool)  # bytes legal outside JSON strings
_ALLOWED[[ord(c) for c in '{}[]:,"0123456789+-.eE \t\r\ntruefalsn']] = True
_QUOTE, _BSLASH = ord('"'), ord("\\")
_REL = re.compile(
    rb'"cat"\s*:\s*"(?:kernel|gpu_memcpy|gpu_memset|cuda_runtime|cuda_driver|user_annotation|gpu_user_annotation'
    rb'|Kernel|Runtime|Driver)"'
)
_STEP = re.compile(rb'"name"\s*:\s*"ProfilerStep')
_TE = re.compile(rb'"traceEvents"\s*:\s*\[')


def _scan(buf: bytes, depth0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions of braces/brackets outside strings and the nesting depth after each of them.

    Also a cheap validity screen: outside strings only JSON punctuation, numbers, whitespace and the letters of
    true/false/null may appear; anything else (a corrupt byte) aborts the fast path so that ijson reports it.
    """
    arr = np.frombuffer(buf, np.uint8)
    isq = arr == _QUOTE
    qpos = np.flatnonzero(isq)
    if qpos.size:
        prev = arr[np.maximum(qpos - 1, 0)] == _BSLASH
        for k in np.flatnonzero(prev):
            j, n = int(qpos[k]) - 1, 0
            while j >= 0 and buf[j] == _BSLASH:
                n += 1
                j -= 1
            if n % 2 == 1:
                isq[qpos[k]] = False
    inside = np.cumsum(isq, dtype=np.uint8) & 1  # uint8 wraps, parity survives
    outside = (inside == 0) & ~isq
    if (outside & ~_ALLOWED[arr]).any():
        raise _FallBack
    spos = np.flatnonzero(outside & _IS_BRACE[arr])
    delta = _LUT[arr[spos]].astype(np.int32)
    depth = depth0 + np.cumsum(delta)
    return spos, delta, depth


def _fast_events(fh, counter: list[int]):
    """Yield the relevant events (dicts) of a Kineto JSON object, skipping the others without building them."""
    head = fh.read(_CHUNK)
    m = _TE.search(head)
    if m is None:
        raise _FallBack
    spos, _, depth = _scan(head[: m.start()], 0)
    if depth.size == 0 or depth[-1] != 1:  # "traceEvents" must be a key of the top-level object
        raise _FallBack
    carry = head[m.end() :]
    done = False
    while not done:
        chunk = fh.read(_CHUNK)
        buf = carry + chunk if chunk else carry
        if not buf.strip():
            raise _FallBack  # array never closed: truncated
        spos, delta, depth = _scan(buf, 1)
        zero = np.flatnonzero(depth <= 0)
        if zero.size and depth[zero[0]] < 0:
            raise _FallBack
        ends = spos[(delta < 0) & (depth == 1)]
        starts = spos[(delta > 0) & (depth == 2)]
        close = spos[(delta < 0) & (depth == 0)]
        if close.size:
            done = True
            limit = int(close[0])
            ends = ends[ends < limit]
            starts = starts[starts < limit]
        if ends.size == 0:
            if not chunk or done:
                if done and starts.size == 0:
                    break
                raise _FallBack
            carry = buf
            continue
        last = int(ends[-1])
        starts = starts[starts < last]
        if starts.size != ends.size:
            raise _FallBack
        counter[0] += int(ends.size)
        hits = [h.start() for h in _REL.finditer(buf, 0, last + 1)]
        hits += [h.start() for h in _STEP.finditer(buf, 0, last + 1)]
        if hits:
            hp = np.array(hits, np.int64)
            ev = np.unique(np.searchsorted(starts, hp, side="right") - 1)
            ev = ev[ev >= 0]
            for i in ev:
                try:
                    yield orjson.loads(buf[starts[i] : ends[i] + 1])
                except orjson.JSONDecodeError as exc:
                    raise _FallBack from exc
        if done:
            break
        if not chunk:
            raise _FallBack
        carry = buf[last + 1 :]


class _CountingReader(io.RawIOBase):
    """File wrapper that counts bytes handed to the parser and keeps a short tail to locate errors."""

    def __init__(self, fh) -> None:
        self.fh = fh
        self.pos = 0
        self.tail = b""
        self.tail_base = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        if data:
            if len(self.tail) + len(data) > _WINDOW:
                keep = self.tail[-max(_WINDOW - len(data), 0) :] if len(data) < _WINDOW else b""
                self.tail_base = self.pos - len(keep)
                self.tail = keep + data
            else:
                self.tail += data
            self.pos += len(data)
        return data

    def readinto(self, b) -> int:  # pragma: no cover - ijson uses read()
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _open(path: Path):
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    head = raw.read(2)
    raw.seek(0)
    if head == b"\x1f\x8b":
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")
    return raw, raw


def _error_offset(msg: str, rd: _CountingReader) -> int:
    """Byte offset (in the decompressed JSON text) of a yajl parse error, from its context snippet."""
    lines = msg.split("\n")
    if "premature EOF" in msg or len(lines) < 3:
        return rd.pos
    context, caret = lines[1], lines[2]
    col = caret.find("^")
    snippet = context.strip()
    if not snippet or col < 0:
        return rd.pos
    lead = len(context) - len(context.lstrip())
    window = rd.tail.replace(b"\n", b" ").replace(b"\t", b" ").replace(b"\r", b" ")
    at = window.rfind(snippet.encode("utf-8", "replace"))
    if at < 0:
        return rd.pos
    return max(rd.tail_base + at + (col - lead) - 1, 0)  # yajl points just past the offending byte


def _fail(path: Path, what: str, offset: int, compressed: bool) -> InputError:
    unit = "byte offset (decompressed)" if compressed else "byte offset"
    return InputError(f"{path}: {what} at {unit} {offset}", field=str(path), value=offset, expected="valid trace JSON")


def _first_char(path: Path) -> tuple[str, bool]:
    raw, fh = _open(path)
    try:
        chunk = fh.read(4096)
    except (OSError, EOFError, zlib.error) as exc:
        raise _fail(path, f"corrupt gzip stream ({exc})", 0, True) from exc
    finally:
        raw.close()
    stripped = chunk.lstrip()
    return (chunk.decode("latin-1")[len(chunk) - len(stripped) : len(chunk) - len(stripped) + 1], fh is not raw)


def _read_metadata(path: Path) -> dict:
    """Top-level keys before ``traceEvents`` (Kineto writes distributedInfo/deviceProperties first)."""
    raw, fh = _open(path)
    meta: dict = {}
    try:
        builder = None
        key = None
        for prefix, event, value in _IJ.parse(fh):
            if prefix == "" and event == "map_key":
                if builder is not None and key is not None:
                    meta[key] = builder.value
                builder = None
                key = value
                if key == "traceEvents":
                    meta[_SAW_EVENTS] = True
                    break
                builder = ijson.ObjectBuilder()
                continue
            if builder is not None and prefix != "":
                builder.event(event, value)
            elif builder is not None and prefix == key:
                builder.event(event, value)
            elif prefix == "" and event == "end_map":
                if builder is not None and key is not None:
                    meta[key] = builder.value
                break
            if prefix == key and event not in ("start_map", "start_array", "end_map", "end_array"):
                pass
    except (ijson.JSONError, OSError, EOFError, zlib.error):
        pass  # reported with an offset by the event pass
    finally:
        raw.close()
    return meta


class _Collector:
    """Appends the needed fields of relevant events to compact typed arrays."""

    def __init__(self, tr: RankTrace) -> None:
        self.tr = tr
        tr.steps.__init__()
        tr.annotations.__init__()
        tr.gpu_annotations.__init__()
        self.names = Interner()
        self.g = (array("q"), array("q"), array("i"), array("b"), array("q"), array("q"))
        self.r = (array("q"), array("q"), array("i"), array("q"), array("q"))
        self.comm_meta: dict[int, dict] = {}
        self.devices: set = set()
        self.n = 0

    def consume(self, events) -> None:
        g_ts, g_end, g_name, g_kind, g_stream, g_corr = self.g
        r_ts, r_end, r_name, r_corr, r_tid = self.r
        names, tr, comm_meta, devices = self.names, self.tr, self.comm_meta, self.devices
        for e in events:
            self.n += 1
            cat = e.get("cat")
            if cat is None:
                continue
            kind = _GPU_CATS.get(cat)
            if kind is not None:
                ts, dur = e.get("ts"), e.get("dur")
                if ts is None or dur is None:
                    continue
                args = e.get("args") or {}
                t0 = round(ts * 1000.0)
                g_ts.append(t0)
                g_end.append(t0 + max(round(dur * 1000.0), 0))
                name = e.get("name") or ""
                g_name.append(names(name))
                g_kind.append(kind)
                s = args.get("stream", -1)
                g_stream.append(s if isinstance(s, int) else -1)
                c = args.get("correlation", -1)
                g_corr.append(c if isinstance(c, int) else -1)
                devices.add(args.get("device"))
                if "Collective name" in args or (kind == GPU_KERNEL and "ccl" in name[:12]):
                    comm_meta[len(g_ts) - 1] = {v: args[k] for k, v in _COMM_ARGS.items() if k in args}
            elif cat in _RT_CATS:
                ts, dur = e.get("ts"), e.get("dur")
                if ts is None or dur is None:
                    continue
                args = e.get("args") or {}
                t0 = round(ts * 1000.0)
                r_ts.append(t0)
                r_end.append(t0 + max(round(dur * 1000.0), 0))
                r_name.append(names(e.get("name") or ""))
                c = args.get("correlation", -1)
                r_corr.append(c if isinstance(c, int) else -1)
                tid = e.get("tid", 0)
                r_tid.append(tid if isinstance(tid, int) else 0)
            elif cat in _STEP_CATS or cat == "gpu_user_annotation":
                name = e.get("name") or ""
                ts, dur = e.get("ts"), e.get("dur")
                if ts is None or dur is None or e.get("ph", "X") != "X":
                    continue
                t0 = round(ts * 1000.0)
                t1 = t0 + round(dur * 1000.0)
                tid = e.get("tid", 0)
                if cat == "gpu_user_annotation":
                    tr.gpu_annotations.add(name, t0, t1)
                elif name.startswith("ProfilerStep"):
                    tr.steps.add(name, t0, t1, tid if isinstance(tid, int) else 0)
                elif cat == "user_annotation":
                    tr.annotations.add(name, t0, t1)


def _read_ijson(path: Path, prefix: str, col: _Collector, compressed: bool) -> int:
    raw, fh = _open(path)
    rd = _CountingReader(fh)
    try:
        col.consume(_IJ.items(rd, prefix, use_float=True))
    except ijson.JSONError as exc:
        raise _fail(path, f"truncated or corrupt JSON ({str(exc).splitlines()[0]})", _error_offset(str(exc), rd),
                    compressed) from exc
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise InputError(
            f"{path}: truncated or corrupt gzip stream ({exc}) at byte offset {raw.tell()} (compressed; "
            f"{rd.pos} bytes decompressed)", field=str(path), value=raw.tell(), expected="a complete .json.gz"
        ) from exc
    except (TypeError, AttributeError, ValueError) as exc:
        raise _fail(path, f"not a Chrome trace event ({exc})", rd.pos, compressed) from exc
    finally:
        raw.close()
    return col.n


def read_kineto(path: str | Path) -> RankTrace:
    """Read one Kineto trace file into a :class:`RankTrace` (raises :class:`InputError` on a bad file)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file", field="path", value=str(path), expected="an existing trace file")
    if path.stat().st_size == 0:
        raise _fail(path, "empty file", 0, False)
    first, compressed = _first_char(path)
    if first not in ("{", "["):
        raise _fail(path, f"not JSON (starts with {first!r})", 0, compressed)
    meta = _read_metadata(path) if first == "{" else {}
    prefix = "traceEvents.item" if first == "{" else "item"

    tr = RankTrace(source=str(path), fmt="kineto")
    col = _Collector(tr)
    done = False
    if first == "{":
        raw, fh = _open(path)
        counter = [0]
        try:
            col.consume(_fast_events(fh, counter))
            n = counter[0]
            done = True
        except (_FallBack, EOFError, gzip.BadGzipFile, zlib.error, OSError, TypeError, AttributeError, ValueError):
            col = _Collector(tr)
        finally:
            raw.close()
    if not done:
        n = _read_ijson(path, prefix, col, compressed)
    if first == "{" and not meta.pop(_SAW_EVENTS, False):
        raise _fail(path, "no traceEvents array (not a Kineto/Chrome trace)", 0, compressed)
    names, comm_meta, devices = col.names, col.comm_meta, col.devices
    g_ts, g_end, g_name, g_kind, g_stream, g_corr = col.g
    r_ts, r_end, r_name, r_corr, r_tid = col.r
    tr.n_events = n
    tr.names = names.names
    tr.gpu_start = np.frombuffer(g_ts, np.int64).copy()
    tr.gpu_end = np.frombuffer(g_end, np.int64).copy()
    tr.gpu_name = np.frombuffer(g_name, np.int32).copy()
    tr.gpu_kind = np.frombuffer(g_kind, np.int8).copy()
    tr.gpu_stream = np.frombuffer(g_stream, np.int64).copy()
    tr.gpu_corr = np.frombuffer(g_corr, np.int64).copy()
    tr.gpu_graph = np.full(tr.gpu_start.size, -1, np.int64)
    tr.rt_start = np.frombuffer(r_ts, np.int64).copy()
    tr.rt_end = np.frombuffer(r_end, np.int64).copy()
    tr.rt_name = np.frombuffer(r_name, np.int32).copy()
    tr.rt_corr = np.frombuffer(r_corr, np.int64).copy()
    tr.rt_tid = np.frombuffer(r_tid, np.int64).copy()
    tr.comm_meta = comm_meta
    _apply_meta(tr, meta, devices)
    return tr


def _apply_meta(tr: RankTrace, meta: dict, devices: set) -> None:
    dist = meta.get("distributedInfo")
    if isinstance(dist, dict):
        if isinstance(dist.get("rank"), int):
            tr.rank = int(dist["rank"])
            tr.rank_source = "distributedInfo.rank"
        if isinstance(dist.get("world_size"), int):
            tr.world_size = int(dist["world_size"])
        tr.backend = dist.get("backend")
    props = meta.get("deviceProperties")
    devices.discard(None)
    if isinstance(props, list) and props:
        names = {p.get("id"): p.get("name") for p in props if isinstance(p, dict)}
        dev = next(iter(devices)) if len(devices) == 1 else None
        tr.device = names.get(dev) or next((v for v in names.values() if v), None)
    if len(devices) > 1:
        tr.notes.append(f"GPU events on {len(devices)} devices {sorted(map(str, devices))}; analysed as one rank")
    base = meta.get("baseTimeNanoseconds")
    if isinstance(base, int):
        tr.clock_epoch_ns = base


def file_size(path: str | Path) -> int:
    return os.path.getsize(path)

"""Log-line recognisers: one small recogniser per kind of line, in two ordered registries.

A line that no open record or block claims (see :class:`moetune.evidence.logs.parser.Parser`) is offered to the
recognisers of :data:`RECORDS` in order, then to those of :data:`SIGNALS`; the first whose trigger literal occurs in
the line *and* whose handler returns True takes it. Triggers are plain byte literals (``literal in line`` is a
``memchr``-speed test), so a line reaches a regex only when it contains the literal that regex needs. A handler
returning False lets the line go on to the next recogniser (a version banner may also name a GPU, …). Which
recognisers a line reaches depends on its bytes alone, so each read answers that without a test per trigger where it
can (:class:`LineRoutes`): one search of the alternation of all the registry's triggers sends a line holding none straight to the trigger-less recognisers, and a line seen again in the read is offered to the
candidates remembered for its bytes.

Adding a log format is one registration::

    @recogniser(RECORDS, "my_format", b"MYFMT step")
    def _my_format(p: Parser, line_no: int, line: bytes) -> bool:
        ...  # fill p.rec; return True when the line was yours

Formats: megatron/training/training.py ``training_log``, ``report_memory``, ``report_theoretical_memory``,
``Timers.log``; megatron/bridge/training/utils/train_utils.py; PyTorch ``ProcessGroupNCCL`` watchdog messages;
``c10/cuda/CUDACachingAllocator.cpp`` OOM messages; NeMo/Lightning progress lines (patterns in :mod:`.patterns`).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moetune.evidence.logs import patterns as P
from moetune.evidence.logs.model import FLAG_CHECKPOINT, FLAG_EVAL, FLAG_GRAPH_CAPTURE, FLAG_PROFILED, TheoreticalMemory
from moetune.evidence.logs.values import dec

#: a handler: (parser, 1-based line number, line bytes without its newline) -> the line was taken
Handler = Callable[[Any, int, bytes], bool]

#: restart / profiler marks (besides the FLAG_* bits) resolved against the iteration rows at the end
MARK_RESTART = -1
MARK_PROFILE_START = -2
MARK_PROFILE_STOP = -3


@dataclass(frozen=True, slots=True)
class Recogniser:
    """One kind of log line: its name, the literals that trigger it (any of them; none = every line) and its
    handler."""

    name: str
    triggers: tuple[bytes, ...]
    handle: Handler


#: lines a read remembers having seen once, and lines whose candidate recognisers it remembers (each set is
#: emptied when full: a log repeats a bounded set of lines — timer headers, the same frames on every rank)
MAX_SEEN_LINES = 4096
MAX_MEMO_LINES = 1024
#: longer lines are not remembered
MAX_MEMO_LINE_BYTES = 512


def candidates(registry: list[Recogniser], line: bytes) -> tuple[Recogniser, ...]:
    """The recognisers ``line`` is offered to, in order: those without triggers and those with one in the line."""
    return tuple(r for r in registry if not r.triggers or any(t in line for t in r.triggers))


class LineRoutes:
    """What one read knows of the lines it offers to one registry: the registry's recognisers as the read found them,
    one alternation regex of all their triggers (longest first), the lines seen once, and the candidate recognisers
    (:func:`candidates`) of lines seen twice. It lives on the read's parser (one per registry), so nothing outlives
    the read; both line sets are bounded (:data:`MAX_SEEN_LINES`, :data:`MAX_MEMO_LINES`)."""

    __slots__ = ("recognisers", "any_trigger", "untriggered", "seen", "memo")

    def __init__(self, registry: list[Recogniser]) -> None:
        self.recognisers = tuple(registry)
        lits = sorted({t for r in self.recognisers for t in r.triggers}, key=len, reverse=True)
        self.any_trigger = re.compile(b"|".join(re.escape(t) for t in lits) or b"(?!)")
        self.untriggered = tuple(r for r in self.recognisers if not r.triggers)
        self.seen: set[bytes] = set()
        self.memo: dict[bytes, tuple[Recogniser, ...]] = {}

    def offered_to(self, line: bytes) -> tuple[Recogniser, ...] | None:
        """:func:`candidates` where it is known cheaply, else None (the caller tries the triggers one by one): a line
        remembered at its second sight, or a line without any trigger (one search of :attr:`any_trigger`)."""
        if len(line) <= MAX_MEMO_LINE_BYTES:
            cands = self.memo.get(line)
            if cands is not None:
                return cands
            if line in self.seen:
                if len(self.memo) >= MAX_MEMO_LINES:
                    self.memo.clear()
                cands = self.memo[line] = candidates(self.recognisers, line)
                return cands
            if len(self.seen) >= MAX_SEEN_LINES:
                self.seen.clear()
            self.seen.add(line)
        return self.untriggered if self.any_trigger.search(line) is None else None


#: record lines (iterations, memory, timers, configuration, versions …), offered first
RECORDS: list[Recogniser] = []
#: failure and window signals (profiler, checkpoints, NCCL, OOM, tracebacks …), offered after RECORDS
SIGNALS: list[Recogniser] = []


def recogniser(registry: list[Recogniser], name: str, *triggers: bytes) -> Callable[[Handler], Handler]:
    """Register the decorated handler at the end of ``registry`` (order matters: first taker wins)."""

    def deco(fn: Handler) -> Handler:
        registry.append(Recogniser(name, tuple(triggers), fn))
        return fn

    return deco


def offer(registry: list[Recogniser], parser: Any, line_no: int, line: bytes,
          routes: LineRoutes | None = None) -> bool:
    """Offer ``line`` to each recogniser of ``registry`` in order; True when one took it.

    Which recognisers a line reaches depends on its bytes alone (a trigger in it, or none declared), so a
    read's :class:`LineRoutes` for the registry answers it without a search per trigger where it can: a line seen
    before (at its second sight, :func:`candidates` once) is offered to its remembered candidates; a line in which
    one search of the alternation regex (:attr:`LineRoutes.any_trigger`) finds no trigger goes only to the
    recognisers without triggers. The handlers called, and their order, are those of the plain loop."""
    if routes is not None:
        cands = routes.offered_to(line)
        if cands is not None:
            for r in cands:
                if r.handle(parser, line_no, line):
                    return True
            return False
        registry = routes.recognisers  # type: ignore[assignment]
    for r in registry:  # runs for every line no open record or block takes: kept flat
        for t in r.triggers:
            if t in line:
                if r.handle(parser, line_no, line):
                    return True
                break
        else:
            if not r.triggers and r.handle(parser, line_no, line):
                return True
    return False


# ---------------------------------------------------------------------------------------------------- records
@recogniser(RECORDS, "iteration", b"iteration")
def _iteration(p: Any, line_no: int, line: bytes) -> bool:
    """Megatron-LM / Bridge ``iteration N/ M | key: value | …`` and NeMo ``Training epoch E, iteration N/M | …``
    (possibly the first physical line of a terminal-wrapped record)."""
    return p.iteration_line(line_no, line)


@recogniser(RECORDS, "memory_report_at_iteration", b"(after")
def _memory_at_iteration(p: Any, line_no: int, line: bytes) -> bool:
    """``[Rank r] (after N iterations) memory (MB) | …`` (Megatron ``report_memory``; Bridge GB form)."""
    if b"iteration" in line and b"memory" in line:
        p.memory_line(line_no, line)
        return True
    return False


@recogniser(RECORDS, "evaluation", b"validation loss at iteration", b"validation loss at the end")
def _evaluation(p: Any, line_no: int, line: bytes) -> bool:
    if b"iteration" not in line:
        return False
    p.mark(line_no, FLAG_EVAL)
    p.event(line_no, "evaluation", line)
    return True


@recogniser(RECORDS, "checkpoint_at_iteration", b"checkpoint")
def _checkpoint_at_iteration(p: Any, line_no: int, line: bytes) -> bool:
    if b"iteration" not in line:
        return False
    return _checkpoint(p, line_no, line)


@recogniser(RECORDS, "nccl_info", b"NCCL INFO")
def nccl_info(p: Any, line_no: int, line: bytes) -> bool:
    """NCCL_DEBUG=INFO chatter: only connection-closed and version lines matter."""
    if b"Connection closed by localRank" in line:
        p.capped(line_no, "nccl_connection_closed", line)
    elif b"NCCL version" in line:
        _version(p, line_no, line)
    else:
        p.rec.recognised_lines += 1
    return True


@recogniser(RECORDS, "bridge_step_time", b"Step Time")
def _step_time(p: Any, line_no: int, line: bytes) -> bool:
    """Bridge rank-0 ``Step Time : 1.23s GPU utilization: 456.7MODEL_TFLOP/s/GPU``."""
    m = P.STEP_TIME.search(line)
    if m is None:
        return False
    p.step_time(line_no, float(m.group(1)), float(m.group(2)) if m.group(2) else None)
    return True


@recogniser(RECORDS, "theoretical_memory", b"Theoretical memory")
def _theoretical(p: Any, line_no: int, line: bytes) -> bool:
    """``Theoretical memory footprints: weight and optimizer=… MB, activation=… MB, total=… MB``."""
    m = P.THEORETICAL.search(line)
    if m is not None:
        p.rec.recognised_lines += 1
        p.rec.theoretical_memory.append(TheoreticalMemory(
            line_no, float(m.group(2)), float(m.group(3)) if m.group(3) else None,
            float(m.group(4)) if m.group(4) else None, "flagscale" if m.group(1) else "megatron"))
    return True


@recogniser(RECORDS, "memory_report", b"(after")
def _memory(p: Any, line_no: int, line: bytes) -> bool:
    if b"memory" not in line:
        return False
    p.memory_line(line_no, line)
    return True


@recogniser(RECORDS, "timer_block", P.TIMER_BLOCK_HEAD)
def _timer_block(p: Any, line_no: int, line: bytes) -> bool:
    """``(min, max) time across ranks (ms):`` opens a block of ``name ....: (min, max)`` lines."""
    p.open_block("timers", line_no)
    return True


@recogniser(RECORDS, "timers_single_line", b"time (ms)")
def _single_line_timers(p: Any, line_no: int, line: bytes) -> bool:
    """Megatron's one-line ``time (ms) | name: x | name: y`` timer form."""
    body, _ = p.rank(line)
    idx = body.find(b"time (ms)")
    p.rec.recognised_lines += 1
    for seg in body[idx + 9:].split(b"|"):
        m = P.TIMER_SINGLE_LINE.search(seg)
        if m:
            p.timer(line_no, m.group(1).decode("utf-8", "replace").strip(), None, float(m.group(2)))
    return True


@recogniser(RECORDS, "parameter_count", b"in billions")
def _parameter_count(p: Any, line_no: int, line: bytes) -> bool:
    """``Number of parameters in billions: 671.0``."""
    m = P.PARAM_COUNT.search(line)
    if m is None:
        return False
    p.rec.parameter_counts[dec(m.group(1)).strip()] = float(m.group(2))
    p.rec.recognised_lines += 1
    return True


@recogniser(RECORDS, "arguments_or_config_block", b"---")
def _block_start(p: Any, line_no: int, line: bytes) -> bool:
    """``------ arguments ------`` (Megatron args dump) or ``--- Final Configuration ---`` (Bridge YAML dump)."""
    body, _ = p.rank(line)
    if P.ARGS_START.match(body):
        p.open_block("args", line_no)
    elif P.CONFIG_START.search(body):
        p.open_block("config", line_no)
    else:
        return False
    return True


@recogniser(RECORDS, "bare_config_dump", P.CONFIG_TARGET)
def _bare_config(p: Any, line_no: int, line: bytes) -> bool:
    """A bare ``ConfigContainer.print_yaml()`` dump starting with ``_target_: megatron.bridge…``."""
    if not line.startswith(P.CONFIG_TARGET):
        return False
    p.open_block("config", line_no, line)
    return True


@recogniser(RECORDS, "training_start", b"before the start of training step")
def _training_start(p: Any, line_no: int, line: bytes) -> bool:
    """``[before the start of training step]``: after iterations, a restart."""
    p.rec.recognised_lines += 1
    if p.rows_seen:
        p.mark(line_no, MARK_RESTART)
        p.event(line_no, "restart", line)
    return True


_VERSION_NAMES = {
    "megatron-core": "megatron-core", "megatroncore": "megatron-core", "megatron_core": "megatron-core",
    "megatron core": "megatron-core", "mcore": "megatron-core", "megatron-bridge": "megatron-bridge",
    "megatronbridge": "megatron-bridge", "megatron_bridge": "megatron-bridge", "megatron bridge": "megatron-bridge",
    "megatron-lm": "megatron-lm", "megatronlm": "megatron-lm", "megatron_lm": "megatron-lm",
    "megatron lm": "megatron-lm", "transformer-engine": "transformer-engine",
    "transformerengine": "transformer-engine", "transformer_engine": "transformer-engine",
    "transformer engine": "transformer-engine", "pytorch": "torch", "torch": "torch", "nccl": "nccl",
    "nemo": "nemo", "cuda": "cuda", "cudnn": "cudnn", "deepep": "deepep", "nvshmem": "nvshmem",
    "container": "container", "apex": "apex",
}


@recogniser(RECORDS, "version", b"ersion")
def _version(p: Any, line_no: int, line: bytes) -> bool:
    """Version banners (``NCCL version 2.21.5``, ``megatron-core version: 0.16.0`` …); never takes the line."""
    versions = p.rec.versions
    m = P.NCCL_VERSION.search(line)
    if m:
        versions.setdefault("nccl", m.group(1).decode("utf-8", "replace"))
        p.rec.recognised_lines += 1
        return False
    for m in P.VERSION.finditer(line):
        raw = m.group(1).decode("utf-8", "replace").lower()
        name = _VERSION_NAMES.get(raw.replace("_", "-"), _VERSION_NAMES.get(raw))
        if name:
            versions.setdefault(name, m.group(2).decode("utf-8", "replace"))
            p.rec.recognised_lines += 1
    return False


@recogniser(RECORDS, "world_size", b"using world size:")
def _world_size(p: Any, line_no: int, line: bytes) -> bool:
    """Megatron's ``using world size: W, data-parallel size: D, ..., tensor-model-parallel size: T, ...``."""
    rec = p.rec
    rec.recognised_lines += 1
    for m in P.WORLD_FIELD.finditer(line):
        name = m.group(1).decode("utf-8", "replace").strip().removeprefix("using").strip()
        name = name.replace("-", "_").replace(" ", "_")
        rec.config.setdefault("world_size" if name == "world" else f"{name}_size", int(m.group(2)))
    rec.config_source = rec.config_source or "megatron-world-size-line"
    return True


@recogniser(RECORDS, "gpu_name", b"NVIDIA ")
def _gpu_name(p: Any, line_no: int, line: bytes) -> bool:
    """A GPU product name (``NVIDIA H100 80GB HBM3``); never takes the line."""
    meta = p.rec.meta
    if "gpu" not in meta:
        m = P.GPU_NAME.search(line)
        if m:
            meta["gpu"] = m.group(1).decode("utf-8", "replace")
            meta["gpu_name"] = dec(m.group(0)).strip()
    return False


# ---------------------------------------------------------------------------------------------------- signals
_PROFILE_START = (b"capture range started", b"profiler start", b"start profil", b"cudaprofilerstart",
                  b"completed stage: warm up")
_PROFILE_STOP = (b"capture range ended", b"profiler stop", b"stop profil", b"cudaprofilerstop",
                 b"completed stage: collection")
_PROFILE_REPORT = (b"nsys-rep", b"nsys-report", b"qdstrm")


@recogniser(SIGNALS, "profiler", b"Capture range", b"nsys", b"Profil", b"profil")
def _profiler(p: Any, line_no: int, line: bytes) -> bool:
    """nsys capture ranges / torch-profiler windows (their iterations are flagged ``profiled``)."""
    low = line.lower()
    if any(t in low for t in _PROFILE_START):
        p.profiling = True
        p.mark(line_no, MARK_PROFILE_START)
        p.event(line_no, "profile_start", line)
        return True
    if any(t in low for t in _PROFILE_STOP):
        p.profiling = False
        p.mark(line_no, MARK_PROFILE_STOP)
        p.step_flags |= FLAG_PROFILED
        p.event(line_no, "profile_stop", line)
        return True
    if any(t in low for t in _PROFILE_REPORT):
        p.step_flags |= FLAG_PROFILED
        p.event(line_no, "profile_report", line)
        return True
    return False


@recogniser(SIGNALS, "checkpoint", b"checkpoint")
def _checkpoint(p: Any, line_no: int, line: bytes) -> bool:
    """Checkpoint save (flags the next iteration) / load (after iterations: a restart)."""
    low = line.lower()
    if b"saving checkpoint" in low or b"saved checkpoint" in low:
        p.mark(line_no, FLAG_CHECKPOINT)
        p.event(line_no, "checkpoint_save", line)
    elif b"loading checkpoint" in low or b"loaded checkpoint" in low:
        p.event(line_no, "checkpoint_load", line)
        if p.rows_seen:
            p.mark(line_no, MARK_RESTART)
    return True


@recogniser(SIGNALS, "graph_capture", b"raph")
def _graph_capture(p: Any, line_no: int, line: bytes) -> bool:
    low = line.lower()
    if (b"cuda graph" in low or b"cudagraph" in low or b"cuda_graph" in low) and \
            (b"captur" in low or b"warmup" in low or b"warm up" in low):
        p.mark(line_no, FLAG_GRAPH_CAPTURE)
        p.event(line_no, "graph_capture", line)
        return True
    return False


def _pg_name(pg: Any) -> str | None:
    return pg.group(3).decode("utf-8", "replace") if pg and pg.group(3) else None


@recogniser(SIGNALS, "nccl_watchdog", b"Watchdog", b"watchdog")
def _watchdog(p: Any, line_no: int, line: bytes) -> bool:
    """``Watchdog caught collective operation timeout: WorkNCCL(SeqNum=…, OpType=…) ran for … milliseconds``."""
    m = P.WATCHDOG.search(line)
    if m is None:
        return False
    body, rank = p.rank(line)
    mr = P.WATCHDOG_RANK.search(line)
    pg = P.PG_TAG.search(line)
    data = {"seq": int(m.group(1)), "op": m.group(2).decode("utf-8", "replace"),
            "numel_in": int(m.group(3)) if m.group(3) else None,
            "numel_out": int(m.group(4)) if m.group(4) else None,
            "timeout_ms": int(m.group(5)) if m.group(5) else None, "ran_ms": int(m.group(6)),
            "rank": int(mr.group(1)) if mr else rank, "pg": int(pg.group(1)) if pg else None, "pg_name": _pg_name(pg)}
    p.signal(line_no, "nccl_watchdog", body, rank, data=data)
    return True


@recogniser(SIGNALS, "nccl_last_work", b"Watchdog", b"watchdog")
def _last_work(p: Any, line_no: int, line: bytes) -> bool:
    """The watchdog's ``at work: N, last enqueued NCCL work: N, last completed NCCL work: N``."""
    m = P.LAST_WORK.search(line)
    if m is None:
        return False
    body, rank = p.rank(line)
    pg = P.PG_TAG.search(line)
    data = {"work": int(m.group(1)), "last_enqueued": int(m.group(2)), "last_completed": int(m.group(3)),
            "pg": int(pg.group(1)) if pg else None, "pg_rank": int(pg.group(4)) if pg else None,
            "pg_name": _pg_name(pg)}
    p.signal(line_no, "nccl_last_work", body, rank, data=data)
    return True


def oom_data(body: bytes) -> dict[str, Any]:
    """Numbers of a CUDA caching-allocator OOM message (c10/cuda/CUDACachingAllocator.cpp), in bytes."""
    u = P.UNITS
    d: dict[str, Any] = {}
    m = P.OOM_TRIED.search(body)
    if m:
        d["requested"] = float(m.group(1)) * u[m.group(2)]
    m = P.OOM_OLD.search(body)
    if m:
        d["gpu"] = int(m.group(1))
        d["capacity"] = float(m.group(2)) * u[m.group(3)]
        d["allocated"] = float(m.group(4)) * u[m.group(5)]
        d["free"] = float(m.group(6)) * u[m.group(7)]
        d["reserved"] = float(m.group(10)) * u[m.group(11)]
        d["reserved_unallocated"] = d["reserved"] - d["allocated"]
    m = P.OOM_NEW_TOTAL.search(body)
    if m:
        d["gpu"] = int(m.group(1))
        d["capacity"] = float(m.group(2)) * u[m.group(3)]
        d["free"] = float(m.group(4)) * u[m.group(5)]
    m = P.OOM_NEW_INUSE.search(body)
    if m:
        d["process_in_use"] = float(m.group(1)) * u[m.group(2)]
    m = P.OOM_NEW_ALLOC.search(body)
    if m:
        d["allocated"] = float(m.group(1)) * u[m.group(2)]
    m = P.OOM_NEW_RESERVED.search(body)
    if m:
        d["reserved_unallocated"] = float(m.group(1)) * u[m.group(2)]
        if "allocated" in d:
            d["reserved"] = d["allocated"] + d["reserved_unallocated"]
    return d


@recogniser(SIGNALS, "oom", b"out of memory", b"OutOfMemory")
def _oom(p: Any, line_no: int, line: bytes) -> bool:
    """``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate …`` (with the traceback above it)."""
    body, rank = p.rank(line)
    p.signal(line_no, "oom", body, rank, frames=p.take_frames(rank), data=oom_data(body), context=True)
    return True


@recogniser(SIGNALS, "deepep", b"num_recv_tokens", b"moe_recv_expert_counter", b"DeepEP", b"deep_ep", b"HybridEP",
            b"hybrid_ep")
def _deepep(p: Any, line_no: int, line: bytes) -> bool:
    """DeepEP / HybridEP dispatcher messages (a traceback frame naming deep_ep is left to the frame recogniser)."""
    body, rank = p.rank(line)
    if b'File "' in body:
        return False
    m = P.DEEPEP_RECV.search(body)
    data = {"num_recv_tokens": int(m.group(1))} if m else {}
    if b"Global rank:" in body:
        try:
            data["rank"] = int(body.split(b"Global rank:")[1].split(b",")[0])
        except ValueError:
            pass
    p.signal(line_no, "deepep", body, rank, data=data)
    return True


@recogniser(SIGNALS, "traceback_start", b"Traceback (most recent call last)")
def _traceback_start(p: Any, line_no: int, line: bytes) -> bool:
    _, rank = p.rank(line)
    p.frames[rank] = deque(maxlen=16)
    p.tb_open[rank] = line_no
    p.rec.recognised_lines += 1
    return True


@recogniser(SIGNALS, "traceback_frame", b'File "')
def _traceback_frame(p: Any, line_no: int, line: bytes) -> bool:
    """``File "x.py", line 12, in f`` (kept per rank, attached to the exception that ends the traceback)."""
    m = P.FRAME.search(line)
    if m is None:
        return False
    _, rank = p.rank(line)
    fr = p.frames.get(rank)
    if fr is None:
        fr = p.frames[rank] = deque(maxlen=16)
        p.tb_open[rank] = line_no
    fr.append(f"{m.group(1).decode('utf-8', 'replace')}:{int(m.group(2))} in "
              f"{m.group(3).decode('utf-8', 'replace')}")
    p.rec.recognised_lines += 1
    return True


_ERROR_TRIGGERS = (b"Error", b"Exception", b"error")
_NCCL_ERRORS = (b"DistBackendError", b"NCCL error", b"ncclInternalError", b"ncclSystemError",
                b"ncclUnhandledCudaError", b"ncclRemoteError")


@recogniser(SIGNALS, "exception", *_ERROR_TRIGGERS)
def _exception(p: Any, line_no: int, line: bytes) -> bool:
    """``SomeError: message`` ending a traceback (AssertionError, RuntimeError, DistBackendError …)."""
    body, rank = p.rank(line)
    m = P.EXCEPTION_LINE.match(body)
    if m is None:
        return False
    p.signal(line_no, "exception", body, rank, frames=p.take_frames(rank),
             data={"type": m.group(1).decode("utf-8", "replace"), "message": dec(m.group(2) or b"").strip()},
             context=True)
    return True


@recogniser(SIGNALS, "nccl_error", *_ERROR_TRIGGERS)
def _nccl_error(p: Any, line_no: int, line: bytes) -> bool:
    body, rank = p.rank(line)
    if not any(t in body for t in _NCCL_ERRORS):
        return False
    p.signal(line_no, "nccl_error", body, rank, context=True)
    return True


@recogniser(SIGNALS, "nccl_warn", b"NCCL WARN")
def _nccl_warn(p: Any, line_no: int, line: bytes) -> bool:
    p.capped(line_no, "nccl_warn", line)
    return True


@recogniser(SIGNALS, "nccl_unique_id", b"ncclUniqueId")
def _nccl_unique_id(p: Any, line_no: int, line: bytes) -> bool:
    if b"NCCL" not in line:
        return False
    body, rank = p.rank(line)
    p.signal(line_no, "nccl_unique_id", body, rank)
    return True


@recogniser(SIGNALS, "process_exit", b"exitcode", b"exit code", b"SIGKILL", b"SIGTERM", b"Killed", b"Signal 9")
def _process_exit(p: Any, line_no: int, line: bytes) -> bool:
    """torchrun / launcher exit lines (``exitcode: -9``, ``Signal 9 (SIGKILL)``, ``Killed``)."""
    if P.EXITCODE.search(line) is None and b"Killed" not in line:
        return False
    body, rank = p.rank(line)
    p.signal(line_no, "process_exit", body, rank)
    return True


@recogniser(SIGNALS, "traceback_code")
def _traceback_code(p: Any, line_no: int, line: bytes) -> bool:
    """A source line printed under a traceback frame: appended to that frame (``frame :: code``)."""
    if not p.frames:
        return False
    body, rank = p.rank(line)
    fr = p.frames.get(rank)
    if not fr:
        return False
    code = body.strip()
    if code and code.strip(b"^~ ") and len(code) <= 300 and " :: " not in fr[-1]:
        fr[-1] = fr[-1] + " :: " + code.decode("utf-8", "replace")
    return True

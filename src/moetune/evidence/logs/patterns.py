"""Precompiled patterns for the log formats (bytes regexes; lines are decoded only when kept as evidence).

Formats (docs/bridge_perf_notes.md §3, megatron/training/training.py ``training_log``, ``report_memory``,
``report_theoretical_memory``, ``Timers.log``; megatron/bridge/training/utils/train_utils.py; PyTorch
``ProcessGroupNCCL`` watchdog messages; ``c10/cuda/CUDACachingAllocator.cpp`` OOM messages; NeMo/Lightning progress
lines). Every pattern is guarded in the reader by a cheap ``in`` test on a literal it contains.
"""

from __future__ import annotations

import re

ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")

# rank / launcher prefixes: "[rank5]:", "2025-06-19 16:18 [rank5]:", "[default3]:", "3: " (srun --label)
RANK_PREFIX = re.compile(
    rb"^\s*(?:\d{4}-\d\d-\d\d[ T][\d:.,]+\s*)?(?:\[(?:rank|default|Rank)\s*(\d+)\]\s*:|(\d{1,5}):\s)\s?"
)

# Megatron / Bridge iteration line: " [ts] iteration       10/      50 | …"
ITER_HEAD = re.compile(rb"(?:^|[\s\]|])iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
# the same match without the leading alternation, which keeps ``re`` from using the literal "iteration" to skip
# ahead (5x faster); :func:`iter_head` re-applies the boundary test
_ITER_HEAD_LITERAL = re.compile(rb"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_ITER_HEAD_BEFORE = frozenset(b" \t\n\r\f\v]|")


def iter_head(text: bytes) -> re.Match[bytes] | None:
    """``ITER_HEAD.search(text)`` with the same end and groups (the match starts at "iteration")."""
    m = _ITER_HEAD_LITERAL.search(text)
    while m is not None:
        s = m.start()
        if s == 0 or text[s - 1] in _ITER_HEAD_BEFORE:
            return m
        m = _ITER_HEAD_LITERAL.search(text, s + 1)
    return None
# NeMo / Lightning: "Training epoch 0, iteration 3/9 | …"
NEMO_HEAD = re.compile(rb"Training epoch\s+(\d+),\s*iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
# one "| key: value" field
FIELD = re.compile(rb"([^|:]+?)\s*:\s*([^|]*?)\s*(?=\||$)")

STEP_TIME = re.compile(rb"Step Time\s*:\s*([\d.]+)\s*s(?:\s+GPU utilization:\s*([\d.]+)\s*(?:MODEL_)?TFLOP)?")

MEMORY_HEAD = re.compile(
    rb"\[Rank\s+(\d+)\]\s*\(after\s+(\d+)\s+iterations\)\s*memory\s*\((MB|GB|GiB|MiB|bytes)\)"
)
MEMORY_FIELD = re.compile(rb"\|\s*([A-Za-z][\w\- ]*?)\s*:\s*([\d.eE+\-]+)")

THEORETICAL = re.compile(
    rb"(\[FS\]\s*)?Theoretical memory footprints:\s*weight and optimizer=\s*([\d.]+)\s*MB"
    rb"(?:,\s*activation=\s*([\d.]+)\s*MB)?(?:,\s*total=\s*([\d.]+)\s*MB)?"
)
PARAM_COUNT = re.compile(rb"Number of (.+?) in billions:\s*([\d.]+)")

TIMER_BLOCK_HEAD = b"time across ranks"
TIMER_MINMAX = re.compile(rb"^\s*([\w\-/ ]+?)\s*\.{2,}:?\s*\(\s*([\d.]+)\s*,\s*([\d.]+)\s*\)")
TIMER_SINGLE_LINE = re.compile(rb"([\w\-/]+(?: [\w\-/]+)*)\s*:\s*([\d.]+)")

ARGS_START = re.compile(rb"^-+\s*arguments\s*-+\s*$")
ARGS_END = re.compile(rb"^-+\s*end of arguments\s*-+\s*$")
ARGS_ITEM = re.compile(rb"^\s*(\w+)\s\.{2,}\s(.*?)\s*$")
# "--- Final Configuration ---" / "------- Task Configuration -------" (possibly after a logger prefix), then the
# YAML of ConfigContainer.print_yaml() (yaml.safe_dump: sorted keys, so a top-level "_target_:" comes first)
CONFIG_START = re.compile(rb"-{3,}\s*([\w ]*[Cc]onfig(?:uration|Container)?[\w ]*)\s*-{3,}\s*$")
CONFIG_TARGET = b"_target_: megatron.bridge"
YAML_TOP = re.compile(rb"^[A-Za-z_][\w.\-]*:(?:\s|$)")
YAML_NESTED = re.compile(rb"^\s+(?:-\s|[\w.\-'\"]+:(?:\s|$))|^-\s")
DASH_LINE = re.compile(rb"^\s*-{5,}\s*$")

VERSION = re.compile(
    rb"(?i)\b(megatron[-_ ]?core|mcore|megatron[-_ ]?bridge|megatron[-_ ]?lm|transformer[-_ ]?engine|"
    rb"pytorch|torch|nccl|nemo|cuda|cudnn|deepep|nvshmem|container|apex)\b[\w\s.]{0,12}?version\s*[:=]?\s*v?"
    rb"(\d+\.\d+[\w.+\-]*)"
)
NCCL_VERSION = re.compile(rb"NCCL version\s+(\d+\.\d+\.\d+[\w.+\-]*)")

# failure signals
WATCHDOG = re.compile(
    rb"WorkNCCL\(SeqNum=(\d+),\s*OpType=(\w+)(?:,\s*NumelIn=(\d+),\s*NumelOut=(\d+))?"
    rb"(?:,\s*Timeout\(ms\)=(\d+))?\)\s*ran for\s*(\d+)\s*milliseconds"
)
WATCHDOG_RANK = re.compile(rb"\[Rank\s+(\d+)\]\s*Watchdog")
PG_TAG = re.compile(rb"\[PG(?: ID)?\s+(\d+)(?:\s+PG GUID\s+(\d+))?(?:\(([\w:]+)\))?\s+Rank\s+(\d+)\]")
LAST_WORK = re.compile(
    rb"at work:\s*(\d+),\s*last enqueued NCCL work:\s*(\d+),\s*last completed NCCL work:\s*(-?\d+)"
)

OOM_TRIED = re.compile(rb"Tried to allocate\s+([\d.]+)\s*(GiB|MiB|KiB|GB|MB|B)")
OOM_OLD = re.compile(
    rb"\(GPU\s+(\d+);\s*([\d.]+)\s*(GiB|MiB)\s+total capacity;\s*([\d.]+)\s*(GiB|MiB)\s+already allocated;"
    rb"\s*([\d.]+)\s*(GiB|MiB|KiB|bytes)\s+free;\s*(?:([\d.]+)\s*(GiB|MiB)\s+allowed;\s*)?([\d.]+)\s*(GiB|MiB)"
    rb"\s+reserved"
)
OOM_NEW_TOTAL = re.compile(
    rb"GPU\s+(\d+)\s+has a total capac\w*ty of\s+([\d.]+)\s*(GiB|MiB)\s+of which\s+([\d.]+)\s*(GiB|MiB|KiB)\s+is free"
)
OOM_NEW_INUSE = re.compile(rb"this process has\s+([\d.]+)\s*(GiB|MiB)\s+memory in use")
OOM_NEW_ALLOC = re.compile(rb"Of the allocated memory\s+([\d.]+)\s*(GiB|MiB)\s+is allocated by PyTorch")
OOM_NEW_RESERVED = re.compile(rb"([\d.]+)\s*(GiB|MiB|KiB)\s+is reserved by PyTorch but unallocated")

EXCEPTION_LINE = re.compile(rb"^\s*(?:[\w.]+\.)?([A-Z]\w*(?:Error|Exception|Interrupt))(?::\s?(.*))?$")
FRAME = re.compile(rb'File "([^"]+)", line (\d+), in (\S+)')
DEEPEP_RECV = re.compile(rb"num_recv_tokens:\s*(-?\d+)")
EXITCODE = re.compile(rb"exitcode\s*:\s*(-?\d+)|exit code\s*:?\s*(-?\d+)|[Ss]ignal\s+(\d+)\s*\((SIG\w+)\)")

# Megatron's "using world size: 8, data-parallel size: 1, ..., tensor-model-parallel size: 2, ..." line
WORLD_FIELD = re.compile(rb"([a-z][a-z\- ]*?)\s+size:\s*(\d+)")
# GPU product names as printed by nvidia-smi / torch.cuda.get_device_name
GPU_NAME = re.compile(rb"NVIDIA\s+((?:GB|[ABHL])\d{2,3}[A-Z]?)\b(?:[ -]\d+GB)?(?:[ -][A-Z]{2,5}\d?)?")

UNITS = {b"GiB": 2**30, b"MiB": 2**20, b"KiB": 2**10, b"GB": 1e9, b"MB": 1e6, b"B": 1, b"bytes": 1}

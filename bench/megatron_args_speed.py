"""Speed of the Megatron-LM argument reader (``moetune.io.megatron_args.read_megatron_args``) on large inputs.

Prints one row per input shape and size: seconds, MB/s, and the time ratio to the previous size (a linear reader
keeps the ratio near the size ratio; the former ``shlex``-based reader went from 9 s at 1 MB to 85 s at 3 MB on one
long line). Inputs are generated in a temporary folder:

* ``long-token``: one line, ``--data-path`` followed by a single multi-megabyte path;
* ``many-values``: one line, ``--data-path`` followed by many weighted paths (``1.0 /data/shard_i``);
* ``quoted-values``: as ``many-values`` with every path single-quoted and a comment line (the full shell-word
  scanner instead of the plain whitespace split);
* ``many-lines``: many ``\\``-continued lines of real flags (repeated with the same value);
* ``yaml``: a functional-test ``model_config.yaml`` whose ``--data-path`` value is one long string.

Run: ``PYTHONPATH=src python bench/megatron_args_speed.py [--sizes 0.25,1,3]``
"""

from __future__ import annotations

import argparse
import shlex
import tempfile
import time
from pathlib import Path

from moetune.io.megatron_args import read_megatron_args

BASE = ("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
        "--micro-batch-size 2 --global-batch-size 16 --num-experts 4 --moe-router-topk 2 --bf16 ")


def make(shape: str, nbytes: int) -> str:
    if shape == "long-token":
        return BASE + "--data-path /" + "d" * nbytes + "\n"
    if shape == "many-values":
        one = "1.0 /data/shard_0000000 "
        return BASE + "--data-path " + one * (nbytes // len(one)) + "\n"
    if shape == "quoted-values":
        one = "1.0 '/data/shard_0000000' "
        return "# blend\n" + BASE + "--data-path " + one * (nbytes // len(one)) + "\n"
    if shape == "many-lines":
        line = "  --hidden-size 512 --num-attention-heads 8 --lr 0.0001 \\\n"
        return BASE + "\\\n" + line * (nbytes // len(line)) + "  --seq-length 1024\n"
    if shape == "yaml":
        head = "ENV_VARS:\n  CUDA_DEVICE_MAX_CONNECTIONS: 1\nMODEL_ARGS:\n"
        flags = "".join(f"  {f}: {v}\n" for f, v in zip(BASE.split()[::2], BASE.split()[1::2], strict=False)) + "  --bf16: true\n"
        return head + flags + '  --data-path: "/' + "d" * nbytes + '"\n'
    raise ValueError(shape)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="0.25,1,3", help="input sizes in MB")
    ap.add_argument("--with-shlex", action="store_true",
                    help="also time shlex.split (the former tokenizer) on inputs up to 1 MB")
    a = ap.parse_args()
    sizes = [float(x) for x in a.sizes.split(",")]
    head = f"{'shape':<14} {'MB':>6} {'seconds':>8} {'MB/s':>7} {'x prev':>7}"
    print(head + (f" {'shlex s':>8}" if a.with_shlex else ""))
    with tempfile.TemporaryDirectory() as tmp:
        for shape in ("long-token", "many-values", "quoted-values", "many-lines", "yaml"):
            prev = None
            for mb in sizes:
                path = Path(tmp) / f"{shape}.{'yaml' if shape == 'yaml' else 'txt'}"
                path.write_text(make(shape, int(mb * 2**20)))
                real_mb = path.stat().st_size / 2**20
                t0 = time.perf_counter()
                cfg = read_megatron_args(path)
                dt = time.perf_counter() - t0
                assert cfg["model"]["num_layers"] == 4
                ratio = f"{dt / prev:7.1f}" if prev else f"{'':>7}"
                row = f"{shape:<14} {real_mb:6.2f} {dt:8.3f} {real_mb / dt:7.1f} {ratio}"
                if a.with_shlex:
                    if mb <= 1 and shape != "yaml":
                        t0 = time.perf_counter()
                        shlex.split(path.read_text(), comments=True)
                        row += f" {time.perf_counter() - t0:8.2f}"
                    else:
                        row += f" {'-':>8}"
                print(row)
                prev = dt


if __name__ == "__main__":
    main()

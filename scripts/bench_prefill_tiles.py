"""Multiply-adds per second of the 16-bit prefill tiles on a synthetic file's own matrices.

    python scripts/bench_prefill_tiles.py PATH.gguf [--rows 512,65] [--threads 2]

One matrix per (shape, type) of the file's first layers (read with gguf.GGUFReader) goes
through `quant_matmul_wide` at each row count; each figure is the median of interleaved
rounds, in G multiply-adds per second, so the types and shapes compare within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's Folio

from kernels import cpu  # noqa: E402
from kernels.cpu import quant  # noqa: E402


def matrices(path: str) -> dict[tuple[str, int, int], tuple[torch.Tensor, int, int]]:
    """(role, type, n) -> (uint8 weight [n, row bytes], type id, k): one per kind."""
    found = {}
    for t in GGUFReader(path).tensors:
        role = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name.split(".")[0]
        if len(t.shape) != 2:
            continue
        k, n = (int(d) for d in t.shape)
        key = (role, int(t.tensor_type), n)
        if key not in found:
            w = torch.from_numpy(np.array(t.data).view(np.uint8).reshape(n, -1))
            found[key] = (w, int(t.tensor_type), k)
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--rows", default="512,65")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip", default="token_embd", help="roles left out, comma-separated")
    args = ap.parse_args()
    if not cpu.available():
        raise SystemExit(f"the native CPU library is not loaded: {cpu.status()}")
    torch.set_num_threads(args.threads)
    skip = set(args.skip.split(","))
    mats = {key: v for key, v in matrices(args.path).items() if key[0] not in skip}
    rows = [int(r) for r in args.rows.split(",")]
    times: dict[tuple, list[float]] = {}
    xs = {(m, k): torch.randn(m, k) for m in rows for (_, _, k) in mats.values()}
    for _ in range(args.rounds):
        for key, (w, type_id, k) in mats.items():
            for m in rows:
                x = xs[(m, k)]
                start = time.perf_counter()
                quant.quant_matmul_wide(x, w, type_id, k)
                times.setdefault((key, m), []).append(time.perf_counter() - start)
    for (role, type_id, n), (_, _, k) in mats.items():
        rates = []
        for m in rows:
            t = statistics.median(times[((role, type_id, n), m)])
            rates.append(f"m={m}: {m * n * k / t / 1e9:6.1f} G/s ({t * 1e3:7.2f} ms)")
        print(f"{role:12s} type {type_id:2d} {n:6d} x {k:5d}  " + "  ".join(rates))


if __name__ == "__main__":
    main()

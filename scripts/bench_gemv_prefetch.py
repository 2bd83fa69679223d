"""Decode step time at several prefetch distances of the native GEMVs, in one process.

    python scripts/bench_gemv_prefetch.py PATH.gguf [--distances 2048,4096,8192]
        [--steps 10] [--rounds 5] [--threads 2]

The distance (isa.cpp's g_gemv_prefetch_bytes, chosen per CPU vendor) is switched
between blocks of decode steps of one request, the blocks interleaved over the rounds,
so each distance sees the same machine and the same contexts; each figure is the mean
step in ms. Use it to choose the distance for a CPU kind not measured yet.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's Folio

from engine import LLM, SamplingParams  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from kernels import cpu  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--distances", default="2048,4096,8192")
    ap.add_argument("--steps", type=int, default=10, help="decode steps per block")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    distances = [int(d) for d in args.distances.split(",")]
    torch.set_num_threads(args.threads)
    llm = LLM(args.path, EngineConfig(device="cpu", max_model_len=2048))
    if not cpu.available():
        raise SystemExit(f"the native CPU library is not loaded: {cpu.status()}")
    ops = cpu.ops()
    default = ops.gemv_prefetch()
    engine = llm.engine
    tokens = args.steps * args.rounds * len(distances) + 8
    engine.add_request(list(range(1000, 1512)),
                       SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True), "r")
    for _ in range(6):  # the prompt, then a few steps to warm up
        engine.step()
    times: dict[int, list[float]] = {d: [] for d in distances}
    try:
        for _ in range(args.rounds):
            for d in distances:
                ops.set_gemv_prefetch(d)
                for _ in range(args.steps):
                    start = time.perf_counter()
                    engine.step()
                    times[d].append(time.perf_counter() - start)
    finally:
        ops.set_gemv_prefetch(default)
    print(f"default distance on this CPU: {default} bytes")
    for d, ts in times.items():
        print(f"{d:6d} bytes ahead: {statistics.mean(ts) * 1e3:8.2f} ms a step")


if __name__ == "__main__":
    main()

"""The native key block writer (`write_key_blocks`, kernels/cpu/csrc/attention/key_blocks.cpp)
as a decode step calls it: for each of 16 layers of a Llama-3.2-1B shape (8 KV heads, head
size 64, int8 in 64-token blocks) one new key goes into an open block whose earlier rows
its slot of exact keys holds, and the block is encoded again. Between steps 256 MiB are
streamed through the caches, as a step's weights evict its slots in the engine (`--warm`
leaves them cached). Each figure is the best of its rounds, in microseconds per 16
layers, at a few rows of the block; `null` is an op call that writes nothing (the call's
own cost, Python's included). Random keys: timings only.

    python scripts/bench_key_blocks_cpu.py --threads 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's Folio

from kernels import allocate_kv_cache  # noqa: E402
from kernels.cpu import available, ops, status  # noqa: E402
from kernels.kv_format import format_named  # noqa: E402

LAYERS, NKV, HD, BLOCK, BLOCKS, SLOTS = 16, 8, 64, 64, 8, 4
ROWS = (10, 40, 62)  # the new key's row in its block


def plan(row: int | None) -> tuple[torch.Tensor, ...]:
    """A StagePlan's tensors (kernels/key_stage.py) for one new key at `row` of block 5,
    its earlier rows in slot 0 and the block kept there; None: an empty plan."""
    if row is None:
        empty = torch.empty(0, dtype=torch.int64)
        return (empty,) * 6

    def ints(v: int) -> torch.Tensor:
        return torch.tensor([v], dtype=torch.int64)

    # tokens, dest, blocks, filled, carry, keep_slot
    return ints(0), ints(row), ints(5), ints(row + 1), ints(0), ints(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warm", action="store_true", help="no streaming between steps")
    args = parser.parse_args()
    if not available():
        print(f"the native library is not loaded: {status()}", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    pool = allocate_kv_cache(LAYERS, BLOCKS, BLOCK, NKV, HD, format_named("int8").storage,
                             "cpu", True)
    exact = [torch.randn(SLOTS, BLOCK, NKV, HD, generator=gen).half() for _ in range(LAYERS)]
    key = torch.randn(1, NKV, HD, generator=gen)
    stream = torch.ones(64 * 1024 * 1024)  # 256 MiB
    plans = {str(row): plan(row) for row in ROWS} | {"null": plan(None)}
    write = ops().write_key_blocks
    best = dict.fromkeys(plans, float("inf"))
    for _ in range(args.rounds):
        for label, tensors in plans.items():
            if not args.warm:
                stream.add_(1.0)
            start = time.perf_counter()
            for layer in range(LAYERS):
                write(key, pool[layer, 0], exact[layer], *tensors)
            best[label] = min(best[label], time.perf_counter() - start)
    print(f"{args.threads} threads, {'warm' if args.warm else 'streamed'} caches; best of "
          f"{args.rounds} rounds, us per {LAYERS} layers by the new key's row:")
    print("  " + ", ".join(f"{label} {seconds * 1e6:.0f}" for label, seconds in best.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

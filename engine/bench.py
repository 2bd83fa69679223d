"""``folio bench WORKLOAD``: Folio's speed and memory, measured on this machine.

``python -m engine.bench scheduler`` times one schedule step plus the block bookkeeping
(mark computed, append the sampled token, register full blocks) with 64 running
sequences, without a model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from engine.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler


def bench_scheduler(num_seqs: int = 64, prompt_len: int = 200, steps: int = 400) -> dict:
    """Median time of one decode step's scheduling and bookkeeping."""
    block_size = 16
    blocks_per_seq = (prompt_len + steps) // block_size + 2
    bm = BlockManager(num_seqs * blocks_per_seq, block_size, bytes_per_block=1)
    sched = Scheduler(bm, max_num_seqs=num_seqs, max_num_batched_tokens=num_seqs * prompt_len)
    params = SamplingParams(max_tokens=steps + 10, temperature=0)
    for i in range(num_seqs):
        sched.add_request(f"r{i}", [(i * 7919 + j) % 32000 for j in range(prompt_len)], params)
    out = sched.schedule()  # the prefill of every prompt, not timed
    sched.mark_computed(out)
    for item in out.scheduled:
        item.seq.append_token(1)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        out = sched.schedule()
        sched.mark_computed(out)
        for item in out.scheduled:
            item.seq.append_token(step % 32000)
        times.append(time.perf_counter() - t0)
        assert len(out.scheduled) == num_seqs
    median = statistics.median(times)
    return {
        "workload": "scheduler",
        "running_seqs": num_seqs,
        "steps": steps,
        "median_ms": round(median * 1e3, 4),
        "p90_ms": round(sorted(times)[int(0.9 * len(times))] * 1e3, 4),
        "target_ms": 1.0,
        "met": median <= 1e-3,
    }


WORKLOADS = {"scheduler": bench_scheduler}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="folio bench", description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS) + ["kernels"])
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args, rest = parser.parse_known_args(argv)
    if args.workload == "kernels":
        from kernels.bench import main as kernels_main

        return kernels_main(rest)
    result = WORKLOADS[args.workload]()
    for key, value in result.items():
        print(f"{key:>14}: {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

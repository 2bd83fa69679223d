"""``folio bench scheduler``: one decode step's scheduling and block bookkeeping with many
running sequences (default 64), without a model.

Builds its own ``KVCacheManager`` and ``Scheduler`` (``engine.core``) with a pool big enough
for every sequence, prefills all prompts in one untimed schedule, then times ``steps``
decode steps of ``schedule()``, ``mark_computed`` and appending one token per sequence;
reports the median and the 90th percentile.
"""

from __future__ import annotations

import statistics
import time

from engine.bench.setup import Target
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.scheduler import Scheduler
from engine.sampling_params import SamplingParams


def bench_scheduler(num_seqs: int = 64, prompt_len: int = 200, steps: int = 400) -> dict:
    """Median time of one decode step's scheduling and bookkeeping."""
    block_size = 16
    blocks_per_seq = (prompt_len + steps) // block_size + 2
    kv = KVCacheManager.build([KVGroupSpec((0,))], [num_seqs * blocks_per_seq], block_size,
                              bytes_per_layer_block=1)
    sched = Scheduler(kv, max_num_seqs=num_seqs, max_num_batched_tokens=num_seqs * prompt_len)
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
    median_ms = round(statistics.median(times) * 1e3, 4)
    row = {"running_seqs": num_seqs, "steps": steps, "median_ms": median_ms,
           "p90_ms": round(sorted(times)[int(0.9 * len(times))] * 1e3, 4)}
    return {"workload": "scheduler", "setup": {"model": "none"}, "rows": [row], "summary": {},
            "targets": [Target("scheduler step (ms)", median_ms, 1.0, "<=").as_dict()],
            "notes": []}

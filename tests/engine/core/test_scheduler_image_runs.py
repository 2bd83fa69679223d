"""The scheduler and bidirectional image runs (ImageSpan.joint, Gemma 3's image
tokens): no prefill chunk ends inside a run, a chunk that would start inside one (after
a prefix hit) waits for a step with room for the rest, and a run longer than a step is
refused before the request is queued."""

from __future__ import annotations

import pytest

from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.scheduler import Scheduler, whole_runs
from engine.core.sequence import ImageSpan, Sequence
from engine.sampling_params import SamplingParams


def image(lo: int, hi: int) -> ImageSpan:
    return ImageSpan(lo - 2, hi + 1, b"k", None, joint=(lo, hi))


def seq_with(images, computed: int = 0) -> Sequence:
    seq = Sequence(0, "r", 0, list(range(100)), 100)
    seq.images = tuple(images)
    seq.num_computed_tokens = computed
    return seq


def test_whole_runs_cuts_before_a_run_and_waits_inside_one():
    seq = seq_with([image(10, 26), image(40, 56)])
    assert whole_runs(seq, 8) == 8  # ends before the first run
    assert whole_runs(seq, 10) == 10  # ends where it starts
    assert whole_runs(seq, 20) == 10  # would cut it: stops before it
    assert whole_runs(seq, 26) == 26  # holds it whole
    assert whole_runs(seq, 50) == 40  # cuts the second one
    assert whole_runs(seq_with([image(10, 26)], computed=24), 1) == 0  # inside: waits
    assert whole_runs(seq_with([image(10, 26)], computed=24), 2) == 2
    assert whole_runs(seq_with([ImageSpan(10, 30, b"k")]), 20) == 20  # a causal image


def scheduler(budget: int) -> Scheduler:
    kv = KVCacheManager.build([KVGroupSpec((0,))], [64], 4)
    return Scheduler(kv, max_num_batched_tokens=budget)


def test_chunks_never_end_inside_a_run():
    sched = scheduler(12)
    request = sched.add_request("r", list(range(40)), SamplingParams(max_tokens=1))
    request.seqs[0].images = (image(6, 16), image(20, 30))
    chunks = []
    while request.seqs[0].num_uncomputed_tokens:
        out = sched.schedule()
        [item] = out.scheduled
        chunks.append((item.seq.num_computed_tokens, item.num_new_tokens))
        sched.mark_computed(out)
    assert chunks == [(0, 6), (6, 12), (18, 12), (30, 10)]


def test_a_run_longer_than_a_step_is_refused_by_name():
    with pytest.raises(ValueError, match="10 tokens .* max_num_batched_tokens=8"):
        scheduler(8).check_images((image(6, 16),))
    scheduler(10).check_images((image(6, 16),))

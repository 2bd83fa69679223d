"""A request whose prefix hit is on disk waits in the scheduler's ``loading`` state while
the running requests keep stepping: exact block ids and ref counts while it waits and
once its reads are in, abort and preemption while loading (blocks freed, reads
cancelled), and a read that fails its checks (the request admitted again, the block
recomputed). The engine's part (the reader thread, the copies) is played by hand."""

from __future__ import annotations

from engine.core.block_hashes import hash_block
from engine.core.block_pool import BlockPool
from engine.core.disk_loads import LoadState
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.scheduler import Scheduler
from engine.core.sequence import Request, SequenceStatus
from engine.sampling_params import SamplingParams

BS = 2
HISTORY = [5, 6, 7, 8, 9, 10]  # three full blocks on disk
DECODE = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)


class Shelf:
    """The disk: hash -> tokens; ``bad`` hashes fail their check when read."""

    def __init__(self, kept: dict[bytes, tuple[int, ...]]) -> None:
        self.kept = kept
        self.bad: set[bytes] = set()

    def has(self, block_hash: bytes) -> bool:
        return block_hash in self.kept and block_hash not in self.bad


def history_on_disk() -> tuple[dict[bytes, tuple[int, ...]], list[bytes]]:
    kept, hashes, parent = {}, [], None
    for i in range(0, len(HISTORY), BS):
        tokens = tuple(HISTORY[i:i + BS])
        parent = hash_block(parent, tokens)
        kept[parent] = tokens
        hashes.append(parent)
    return kept, hashes


def setup(num_blocks: int = 10) -> tuple[Scheduler, BlockPool, Shelf, list[bytes]]:
    kept, hashes = history_on_disk()
    shelf = Shelf(kept)
    kv = KVCacheManager.build([KVGroupSpec((0,))], [num_blocks], BS, lower_tiers=[shelf])
    return Scheduler(kv, max_num_batched_tokens=16), kv.pools[0], shelf, hashes


def step(sched: Scheduler) -> list[str]:
    """One step; the scheduled requests' ids in order. Each finished prompt samples a
    token (the same one), as the engine would."""
    out = sched.schedule()
    sched.mark_computed(out)
    for item in out.scheduled:
        if item.samples:
            item.seq.append_token(1)
    return [item.seq.request_id for item in out.scheduled]


def finish_reads(sched: Scheduler, shelf: Shelf, reads=None) -> list:
    """The reader and the engine's copies: each read checked, then reported."""
    kv = sched.kv
    reads = kv.loads.take_new() if reads is None else reads
    for read in reads:
        kv.finish_read(read.ticket, read.block_hash not in shelf.bad)
    return reads


def running_decoder(sched: Scheduler) -> Request:
    """A request with a prompt of its own, prefilled and decoding."""
    request = sched.add_request("a", [1, 2, 3], DECODE)
    assert step(sched) == ["a"]
    return request


def test_a_request_waits_for_its_disk_blocks_while_another_decodes():
    sched, pool, shelf, hashes = setup()
    running_decoder(sched)  # blocks 0 and 1
    b = sched.add_request("b", [*HISTORY, 11], DECODE)
    assert step(sched) == ["a"]  # b admitted, but only a runs
    seq = b.seqs[0]
    assert sched.loading == [b] and seq.status is SequenceStatus.LOADING
    # Three blocks taken for the disk hits, one for the last token; held, not cached.
    assert sched.kv.block_tables(seq)[0] == [2, 3, 4, 5] and seq.num_computed_tokens == 6
    assert [pool.blocks[i].ref_count for i in range(6)] == [1, 1, 1, 1, 1, 1]
    assert all(pool.blocks[i].block_hash is None for i in (2, 3, 4))
    assert pool.lookup(hashes[0], (5, 6)) is None
    reads = sched.kv.loads.take_new()
    assert [(r.block_id, r.block_hash) for r in reads] == list(zip([2, 3, 4], hashes,
                                                                   strict=True))
    # Reads not in yet: a keeps decoding, step after step.
    assert [step(sched) for _ in range(3)] == [["a"]] * 3
    finish_reads(sched, shelf, reads[:2])
    assert step(sched) == ["a"] and sched.loading == [b]
    finish_reads(sched, shelf, reads[2:])
    assert step(sched) == ["a", "b"]  # the step after the last read: b prefills the rest
    assert sched.loading == [] and seq.status is SequenceStatus.RUNNING
    assert [pool.lookup(h, tuple(HISTORY[2 * i:2 * i + 2])).block_id
            for i, h in enumerate(hashes)] == [2, 3, 4]
    assert b.num_cached_tokens == b.num_disk_tokens == 6
    assert seq.num_computed_tokens == 7 and seq.num_output_tokens == 1


def test_abort_while_loading_frees_the_blocks_and_cancels_the_reads():
    sched, pool, shelf, hashes = setup()
    running_decoder(sched)
    sched.add_request("b", [*HISTORY, 11], DECODE)
    step(sched)
    reads = sched.kv.loads.take_new()
    sched.abort("b")
    assert sched.loading == [] and "b" not in sched.requests
    assert [pool.blocks[i].ref_count for i in range(6)] == [1, 1, 0, 0, 0, 0]
    assert all(sched.kv.loads.get(r.ticket) is None for r in reads)
    assert sorted(sched.kv.loads.take_cancelled()) == [r.ticket for r in reads]
    finish_reads(sched, shelf, reads)  # late results change nothing
    assert all(h not in pool.cached for h in hashes) and step(sched) == ["a"]


def test_a_read_that_fails_its_checks_is_recomputed():
    sched, pool, shelf, hashes = setup()
    b = sched.add_request("b", [*HISTORY, 11], DECODE)
    step(sched)
    assert sched.loading == [b]
    shelf.bad.add(hashes[1])  # found damaged when read
    finish_reads(sched, shelf)
    assert sched.kv.load_state(b.seqs[0]) is LoadState.FAILED
    # Freed and admitted again at once: the first block now in memory, the second a
    # miss (recomputed, with the third that follows it).
    assert step(sched) == ["b"]
    seq = b.seqs[0]
    # The block read before the failure still counts as from disk.
    assert sched.loading == [] and b.num_cached_tokens == b.num_disk_tokens == 2
    assert seq.num_computed_tokens == 7
    assert pool.lookup(hashes[0], (5, 6)).block_id == sched.kv.block_tables(seq)[0][0]


def test_preemption_frees_a_loading_request_first():
    sched, pool, shelf, _ = setup(num_blocks=6)
    a = running_decoder(sched)  # blocks 0, 1
    sched.add_request("b", [*HISTORY, 11], DECODE)
    step(sched)  # b holds 2..5: the pool is full
    reads = sched.kv.loads.take_new()
    # a's next block: b gives its blocks back (its reads cancelled), a keeps running.
    while len(sched.kv.block_tables(a.seqs[0])[0]) == 2:
        assert step(sched)[0] == "a"
    assert "b" in [r.request_id for r in sched.waiting] and sched.loading == []
    assert all(sched.kv.loads.get(r.ticket) is None for r in reads)
    assert sched.num_preemptions == 1

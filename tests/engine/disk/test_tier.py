"""DiskTier over a real store and KV cache manager, the runner's block copies played by a
dict: blocks evicted in a step are copied out and written before the step goes on, a
restart's prefix hit is read back into its placed blocks, closing saves every cached
block once (closing again writes nothing), and the exit hook closes the tiers alive then
but not one whose engine still runs on another thread."""

from __future__ import annotations

import threading

from engine.core.disk_loads import LoadState
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.sequence import Sequence
from engine.disk import tier as tier_module
from engine.disk.group import GroupDisk
from engine.disk.store import DiskStore
from engine.disk.tier import DiskTier
from tests.engine.core.admission import allocate

BS = 2


class Blocks:
    """The runner's pool: block id -> its bytes (a block's content is its tokens)."""

    def __init__(self) -> None:
        self.content: dict[int, bytes] = {}

    def block_bytes(self, group: int, block_id: int) -> bytes:
        return self.content[block_id]

    def fill_block(self, group: int, block_id: int, payload: bytes) -> None:
        self.content[block_id] = payload


def open_tier(root, num_blocks: int = 4) -> tuple[DiskTier, Blocks]:
    store = DiskStore(root, 1 << 20)
    views = [GroupDisk(store, "fp", 0, BS)]
    kv = KVCacheManager.build([KVGroupSpec((0,))], [num_blocks], BS, lower_tiers=views)
    blocks = Blocks()
    return DiskTier(store, views, kv, blocks), blocks


def computed(tier: DiskTier, blocks: Blocks, seq: Sequence) -> None:
    """``seq``'s prompt computed (its blocks hold its tokens), cached and freed."""
    assert allocate(tier.kv, seq) is not None
    for i, block_id in enumerate(tier.kv.block_tables(seq)[0]):
        blocks.content[block_id] = bytes(seq.token_ids[i * BS:(i + 1) * BS])
    seq.num_computed_tokens = seq.num_tokens
    tier.kv.commit_computed(seq)
    tier.kv.free(seq)


def test_evicted_blocks_are_saved_before_the_step_and_read_back_after_a_restart(tmp_path):
    tier, blocks = open_tier(tmp_path)
    computed(tier, blocks, Sequence(0, "a", 0, [1, 2, 3, 4, 5], 5))
    # Another prompt takes every block: the cached (1, 2) and (3, 4) are evicted.
    assert allocate(tier.kv, Sequence(1, "b", 0, [9] * 8, 8)) == 0
    tier.before_forward()
    tier.flush()
    assert tier.stats().written_blocks == 2

    reopened, fresh = open_tier(tmp_path)
    seq = Sequence(0, "a", 0, [1, 2, 3, 4, 5], 5)
    assert allocate(reopened.kv, seq) == 4 and seq.num_disk_tokens == 4
    assert reopened.loading
    reopened.before_forward()
    while reopened.kv.load_state(seq) is LoadState.LOADING:
        reopened.copy_reads(wait_s=0.05)
    table = reopened.kv.block_tables(seq)[0]
    assert [fresh.content[b] for b in table[:2]] == [bytes([1, 2]), bytes([3, 4])]
    assert not reopened.loading and reopened.stats().hit_blocks == 2


def test_closing_saves_every_cached_block_once(tmp_path):
    tier, blocks = open_tier(tmp_path)
    computed(tier, blocks, Sequence(0, "a", 0, [1, 2, 3, 4, 5], 5))
    tier.close()
    assert tier.stats().written_blocks == 2 and len(list(tmp_path.rglob("*.kvb"))) == 2
    tier.close()
    assert tier.stats().written_blocks == 2


def test_the_exit_hook_skips_a_tier_driven_by_another_live_thread(tmp_path):
    mine, blocks = open_tier(tmp_path / "mine")
    computed(mine, blocks, Sequence(0, "a", 0, [1, 2, 3], 3))
    busy, busy_blocks = open_tier(tmp_path / "busy")
    computed(busy, busy_blocks, Sequence(0, "a", 0, [1, 2, 3], 3))
    release = threading.Event()
    worker = threading.Thread(target=lambda: (busy.begin_step(), release.wait(30)))
    worker.start()
    try:
        while busy._driver is not worker:
            pass
        tier_module._close_at_exit()
    finally:
        release.set()
        worker.join()
    assert mine.stats().written_blocks == 1 and busy.stats().written_blocks == 0
    tier_module._close_at_exit()  # the worker is gone: its tier is kept now
    assert busy.stats().written_blocks == 1

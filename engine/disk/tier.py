"""DiskTier: the KV cache's disk tier as one object, between the KV cache's bookkeeping
and the files.

What it owns: the store (`store.py`, the files), each KV group's view of it
(`group.py`'s `GroupDisk`, handed to ``KVCacheManager.build`` as that group's lower tier:
engine/core/tier_blocks.py decides from it what to save and what a hit is), the
background reader (`reader.py`) and the traffic between them and the KV cache, which
the engine drives between steps:

- ``begin_step``: the reads that came in are copied into their blocks and reported (a
  ticket cancelled meanwhile is dropped: its block may be someone else's by now), before
  the scheduler looks at who still waits (``copy_reads`` alone, waiting for one, when a
  step has nothing else to do);
- ``before_forward``, each step once scheduled: the cached blocks the step evicted are
  copied out and queued for writing (before the forward or a block move writes into
  them), then the reads the KV cache queued (engine/core/disk_loads.py) go to the reader;
- ``preload``: a chat's blocks loaded ahead of its next turn;
- ``close``: every cached block the disk lacks is saved and the writes waited for.

Block bytes move through the runner (`BlockCopier`), which owns the pool tensors.

At interpreter exit every tier still alive is closed (held weakly, so an engine dropped
before is collected as ever): a script that never calls ``close`` keeps its blocks too.
A tier whose steps run on another thread still alive then (a worker never shut down)
is skipped: saving while that thread evicts and rewrites blocks could file one block's
K/V under another's hash. A worker that is shut down closes its engine itself.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Sequence
from typing import Protocol

from engine.core.disk_loads import LoadState
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.kv_stats import DiskTierStats
from engine.core.sequence import Sequence as Seq
from engine.core.tier_blocks import Save
from engine.disk.group import GroupDisk
from engine.disk.reader import DiskReader
from engine.disk.store import DiskStore

log = logging.getLogger(__name__)

# How long a wait for a read lasts before the caller looks again (a step with nothing
# else to do, a preload).
READ_WAIT_S = 0.05


class BlockCopier(Protocol):
    """A block's bytes out of and into its group's pool (`ModelRunner`)."""

    def block_bytes(self, group: int, block_id: int) -> bytes: ...

    def fill_block(self, group: int, block_id: int, payload: bytes) -> None: ...


class DiskTier:
    def __init__(self, store: DiskStore, groups: Sequence[GroupDisk], kv: KVCacheManager,
                 blocks: BlockCopier) -> None:
        """``groups[g]``: KV group g's view of ``store``, the lower tier ``kv`` was built
        with."""
        if len(groups) != len(kv.managers):
            raise ValueError(f"groups: one per KV group ({len(kv.managers)}), "
                             f"got {len(groups)}")
        self.store = store
        self.groups = list(groups)
        self.kv = kv
        self.blocks = blocks
        self.reader = DiskReader()
        self._driver: threading.Thread | None = None  # the thread that steps the engine
        _alive.add(self)

    @property
    def enabled(self) -> bool:
        """False once the store turned itself off (a failing disk) or was never on."""
        return self.store.enabled

    @property
    def loading(self) -> bool:
        """Whether any read is outstanding."""
        return self.kv.loads.pending

    # ------------------------------------------------------------------- steps
    def begin_step(self) -> None:
        """Before a step is scheduled: the reads that are in copied into their blocks."""
        self._driver = threading.current_thread()
        if self.kv.loads.pending:
            self.copy_reads()

    def before_forward(self) -> None:
        """Once a step is scheduled: its evicted blocks saved, its reads submitted."""
        self._save(self.kv.take_saves())
        loads = self.kv.loads
        for ticket in loads.take_cancelled():
            self.reader.cancel(ticket)
        for read in loads.take_new():
            self.reader.submit(read.ticket, self.groups[read.group], read.block_hash,
                               read.token_ids)

    def copy_reads(self, wait_s: float = 0.0) -> None:
        """Copy the finished reads into their blocks (between steps, before any forward
        reads them); with ``wait_s``, wait that long for one while any is out."""
        kv = self.kv
        for ticket, payload in self.reader.poll(wait_s):
            read = kv.loads.get(ticket)
            if read is None:
                continue
            if payload is not None:
                self.blocks.fill_block(read.group, read.block_id, payload)
            kv.finish_read(ticket, payload is not None)

    def preload(self, seq: Seq) -> int:
        """Load ``seq``'s prefix blocks found on disk into free blocks now, as cached
        blocks nothing holds (`KVCacheManager.preload`), and wait for them. Returns the
        tokens loaded; 0 when the tier is off or the pool has no room."""
        if not self.enabled:
            return 0
        self._driver = threading.current_thread()
        loaded = self.kv.preload(seq)
        # Blocks the loads took from the free queue may have held cached prefixes: they
        # are saved first, as a step would, before any read lands in them.
        self.before_forward()
        while self.kv.load_state(seq) is LoadState.LOADING:
            self.copy_reads(wait_s=READ_WAIT_S)  # each block as it comes
        return loaded

    def _save(self, saves: Sequence[Sequence[Save]]) -> None:
        """Copy each group's (block id, hash, tokens) out and queue its file."""
        for g, group_saves in enumerate(saves):
            disk = self.groups[g]
            for block_id, block_hash, token_ids in group_saves:
                disk.save(block_hash, token_ids, self.blocks.block_bytes(g, block_id))

    # ------------------------------------------------------------------- whole
    def save_cached(self) -> None:
        """Queue every cached block the disk lacks (not waiting for the writes)."""
        self._save(self.kv.unsaved_cached())

    def flush(self) -> None:
        """Wait until every queued block is written."""
        self.store.flush()

    def close(self) -> None:
        """Keep every cached block on disk and wait for the writes; the tier may still
        be used afterwards, and closing again saves only what is new."""
        self.save_cached()
        self.flush()

    def clear(self) -> None:
        """Remove every block file of the tier (the memory panel's Clear)."""
        self.store.clear()

    def stats(self) -> DiskTierStats:
        return self.store.stats(self.kv.disk_hit_tokens)


_alive: weakref.WeakSet[DiskTier] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for tier in list(_alive):
        driver = tier._driver
        if (driver is not None and driver is not threading.current_thread()
                and driver.is_alive()):
            log.warning("KV disk tier: not saved at exit, its engine still runs on %s",
                        driver.name)
            continue
        try:
            tier.close()
        except Exception:  # the other tiers are still kept
            log.exception("KV disk tier: keeping the cached blocks at exit failed")

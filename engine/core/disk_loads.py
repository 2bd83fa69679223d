"""Blocks on their way in from the disk tier: which sequence waits for which reads.

A prefix hit that uses blocks found on disk takes free blocks for them at admission
(held by the sequence, not yet in the prefix cache) and queues one `DiskRead` per block.
The engine hands the reads to a background reader (engine/disk/reader.py) and
the sequence waits in the scheduler (``LOADING``) while the running requests keep
stepping; each finished read is copied into its block at the start of a later step and
reported here (`DiskLoads.finish`), then the block is registered in the prefix cache.
A read that fails its checks fails the sequence's load: the scheduler frees the
sequence (the blocks already read stay cached) and admits it again, which now
recomputes what the bad file held.

Freeing a sequence (abort, preemption) cancels its reads: a ticket no longer here is a
result the engine drops, never copied into a block that may belong to someone else by
then.

A load-ahead (a chat opened before its next turn, ``KVCacheManager.preload``) is a
sequence that holds its loaded blocks only until the last read is in; then they are
cached, free, for that turn's lookup to find.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.sequence import Sequence

if TYPE_CHECKING:
    from engine.core.kind_managers import SingleKindManager


class LoadState(enum.Enum):
    NONE = "none"  # no read outstanding, none failed
    LOADING = "loading"
    FAILED = "failed"  # a read failed its checks: recompute from there


@dataclass(slots=True, frozen=True)
class DiskRead:
    """Read the file of block ``block_hash`` of KV group ``group`` into block ``block_id``."""

    ticket: int
    group: int
    block_id: int
    block_hash: bytes
    token_ids: tuple[int, ...]


class DiskLoads:
    """The reads of every KV group: ``managers[g]`` keeps group g's blocks."""

    def __init__(self, managers: Seq[SingleKindManager] = ()) -> None:
        self.managers = list(managers)
        self._tickets = itertools.count()
        self._reads: dict[int, tuple[DiskRead, Sequence]] = {}
        self._by_seq: dict[int, set[int]] = {}  # seq id -> outstanding tickets
        self._failed: set[int] = set()  # seq ids whose load failed
        # Of a load not over or failed: the (group, block id) reads already in.
        self._done: dict[int, list[tuple[int, int]]] = {}
        self._new: list[DiskRead] = []
        self._cancelled: list[int] = []
        # Load-ahead sequences whose reads are out: seq id -> (sequence, placed blocks).
        self._preloads: dict[int, tuple[Sequence, list[list[int]]]] = {}

    @property
    def pending(self) -> bool:
        """Whether any read is outstanding."""
        return bool(self._reads)

    def add(self, seq: Sequence, group: int, block_id: int, block_hash: bytes,
            token_ids: tuple[int, ...]) -> None:
        read = DiskRead(next(self._tickets), group, block_id, block_hash, token_ids)
        self._reads[read.ticket] = (read, seq)
        self._by_seq.setdefault(seq.seq_id, set()).add(read.ticket)
        self._new.append(read)

    def take_new(self) -> list[DiskRead]:
        """Reads queued since the last call (to hand to the reader)."""
        new, self._new = self._new, []
        return new

    def take_cancelled(self) -> list[int]:
        """Tickets cancelled since the last call (the reader may skip them)."""
        cancelled, self._cancelled = self._cancelled, []
        return cancelled

    def get(self, ticket: int) -> DiskRead | None:
        """The read of ``ticket``; None once cancelled (its result must be dropped)."""
        entry = self._reads.get(ticket)
        return None if entry is None else entry[0]

    def finish(self, ticket: int, ok: bool) -> tuple[DiskRead, Sequence] | None:
        entry = self._reads.pop(ticket, None)
        if entry is None:
            return None
        read, seq = entry
        tickets = self._by_seq[seq.seq_id]
        tickets.discard(ticket)
        if ok:
            self._done.setdefault(seq.seq_id, []).append((read.group, read.block_id))
        else:
            self._failed.add(seq.seq_id)
        if not tickets:
            del self._by_seq[seq.seq_id]
            if seq.seq_id not in self._failed:
                self._done.pop(seq.seq_id, None)  # a whole load: the blocks are its own
        return entry

    def state(self, seq: Sequence) -> LoadState:
        if seq.seq_id in self._failed:
            return LoadState.FAILED
        return LoadState.LOADING if seq.seq_id in self._by_seq else LoadState.NONE

    def clear(self, seq: Sequence) -> list[tuple[int, int]]:
        """Cancel ``seq``'s outstanding reads and forget a failure (it is freed).
        Returns the (group, block id) reads of an unfinished or failed load that were
        in: read from disk for nothing yet (the next request to use them counts them)."""
        self._failed.discard(seq.seq_id)
        done = self._done.pop(seq.seq_id, [])
        for ticket in self._by_seq.pop(seq.seq_id, ()):
            del self._reads[ticket]
            self._cancelled.append(ticket)
        self._new = [r for r in self._new if r.ticket in self._reads]
        return done

    # ------------------------------------------------------ over the KV groups
    def queue(self, seq: Sequence) -> None:
        """A read for each block the groups' pools placed for ``seq``."""
        for g, m in enumerate(self.managers):
            for block_id, hit in m.tier.take_placed():
                self.add(seq, g, block_id, hit.block_hash, hit.token_ids)

    def start_preload(self, seq: Sequence, loaded: list[list[int]]) -> bool:
        """Track the load-ahead ``seq`` of the blocks ``loaded`` (per group); returns
        whether it is already over (no read out): the caller then frees ``seq``."""
        self._preloads[seq.seq_id] = (seq, loaded)
        return self._end_preload(seq)

    def _end_preload(self, seq: Sequence) -> bool:
        """Once no read of a preload is out: its loaded blocks are cached and free."""
        if self.state(seq) is LoadState.LOADING:
            return False
        _, loaded = self._preloads.pop(seq.seq_id)
        for m, blocks in zip(self.managers, loaded, strict=True):
            # Still unused, whether loaded now or before; a failed read holds nothing.
            m.tier.preloaded.update(b for b in blocks
                                    if m.pool.blocks[b].block_hash is not None)
        return True

    def finish_read(self, ticket: int, ok: bool) -> Sequence | None:
        """The read of ``ticket`` is over: its content is in its block (``ok``), or it
        failed its checks. A cancelled ticket changes nothing. Returns the load-ahead
        sequence this read ended, for the caller to free."""
        entry = self.finish(ticket, ok)
        if entry is None:
            return None
        read, seq = entry
        if ok:
            self.managers[read.group].loaded(read.block_id, read.block_hash, read.token_ids)
        if seq.seq_id in self._preloads:
            if not ok:
                self.clear(seq)  # the rest are of no use to a failed load-ahead
            return seq if self._end_preload(seq) else None
        if self.state(seq) is LoadState.NONE:  # the whole load is in
            for m in self.managers:
                m.load_done(seq)
        return None

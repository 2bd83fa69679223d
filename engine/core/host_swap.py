"""Swapping a request's candidates to the host pool and back, one KV group at a time:
blocks the candidates share map to one host block, and a null entry (a block a window
released) moves nothing."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

from engine.core.sequence import Sequence

if TYPE_CHECKING:
    from engine.core.block_pool import BlockPool


class HostSwap:
    """The swap half of `SingleKindManager`, which gives it ``pool``, ``table``,
    ``_set_table``, ``free`` and the swapped sequences' ``host_tables``."""

    pool: BlockPool
    # Swapped sequences' host tables (None: a null entry, nothing to move).
    host_tables: dict[int, list[int | None]]

    def blocks_held(self, seqs: Seq[Sequence]) -> int:
        return len({b for s in seqs for b in self.table(s)} - {self.pool.null_id})

    def host_blocks_held(self, seqs: Seq[Sequence]) -> int:
        return len({b for s in seqs for b in self.host_tables[s.seq_id]} - {None})

    def swap_out(self, seqs: Seq[Sequence]) -> list[tuple[int, int]]:
        """Move ``seqs`` (one request's candidates) to the host pool; blocks they share
        map to one host block. Returns (device block, host block) pairs to copy."""
        pool = self.pool
        mapping: dict[int, int] = {}
        for seq in seqs:
            table: list[int | None] = []
            for block_id in self.table(seq):
                if block_id == pool.null_id:
                    table.append(None)
                elif block_id in mapping:
                    pool.hold_host(mapping[block_id])
                    table.append(mapping[block_id])
                else:
                    mapping[block_id] = pool.take_host()
                    table.append(mapping[block_id])
            self.free(seq)
            self.host_tables[seq.seq_id] = table
        return list(mapping.items())

    def swap_in(self, seqs: Seq[Sequence]) -> list[tuple[int, int]]:
        """Bring ``seqs`` back from the host pool. Returns (host, device) pairs."""
        pool = self.pool
        mapping: dict[int, int] = {}
        for seq in seqs:
            table = []
            for host_id in self.host_tables.pop(seq.seq_id):
                if host_id is None:
                    table.append(pool.null_id)
                    continue
                if host_id not in mapping:
                    mapping[host_id] = pool.take().block_id
                else:
                    pool.blocks[mapping[host_id]].ref_count += 1
                table.append(mapping[host_id])
                pool.release_host(host_id)
            self._set_table(seq, table)
        return list(mapping.items())

    def free_host(self, seq: Sequence) -> None:
        for host_id in self.host_tables.pop(seq.seq_id, []):
            if host_id is not None:
                self.pool.release_host(host_id)

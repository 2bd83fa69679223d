"""The paged KV block manager: ref-counted blocks, prefix cache, copy-on-write, swap.

Pure bookkeeping: no torch, no Qt. The model runner applies what this decides (the
copy-on-write pairs and the swap mappings) to the real cache tensors.

A chat turn with two candidates, block_size 4, after the prompt (6 tokens) was
prefilled and forked, and each candidate then wrote one token::

    prompt  t0 t1 t2 t3 | t4 t5
    seq A   [ block 0  ] [ block 1: t4 t5 a0 . ]
    seq B   [ block 0  ] [ block 2: t4 t5 b0 . ]   block 2 = copy of block 1 (CoW)
            ref count 2    ref count 1 each

Block 0 is full, so it carries a hash: hash(parent hash, its tokens). When both
sequences finish, their blocks go back to the free queue but keep their hashes; the
next turn, whose prompt starts with t0..t3, finds block 0 again (prefix cache).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from collections.abc import Sequence as Seq

from engine.core.free_block_queue import Block, FreeBlockQueue
from engine.core.kv_stats import KVStats, pool_stats
from engine.core.sequence import NO_BLOCK, Sequence

__all__ = ["NO_BLOCK", "BlockManager", "hash_block"]


def hash_block(parent: bytes | None, token_ids: Seq[int]) -> bytes:
    """Stable across processes (unlike ``hash``): the parent's hash, then the tokens."""
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(b",".join(str(t).encode() for t in token_ids))
    return h.digest()


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_host_blocks: int = 0,
        enable_prefix_caching: bool = True,
        bytes_per_block: int = 0,
        group: int = 0,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.block_size = block_size
        self.group = group  # which of a sequence's block tables this manager keeps
        self.num_blocks = num_blocks
        self.bytes_per_block = bytes_per_block
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, Block] = {}
        self.cow_pairs: list[tuple[int, int]] = []  # (src, dst), drained by the scheduler
        # Host pool for swap preemption: block id -> ref count; no prefix cache there.
        self.num_host_blocks = num_host_blocks
        self.host_free: list[int] = list(range(num_host_blocks - 1, -1, -1))
        self.host_refs: dict[int, int] = {}
        self.host_tables: dict[int, list[int]] = {}
        self.prefix_hit_tokens = 0
        self.prefix_query_tokens = 0

    # ----------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _table(self, seq: Sequence) -> list[int]:
        tables = seq.block_tables
        while len(tables) <= self.group:
            tables.append([])
        return tables[self.group]

    def _set_table(self, seq: Sequence, table: list[int]) -> None:
        self._table(seq)
        seq.block_tables[self.group] = table

    # -------------------------------------------------------------- allocation
    def allocate(self, seq: Sequence, hit_tokens: int | None = None) -> int | None:
        """Give ``seq`` blocks for all its tokens, reusing cached prefix blocks (at most
        ``hit_tokens`` of them: KV groups agree on one hit length).

        Returns the number of tokens found in the prefix cache (their K/V need no
        compute), or None, changing nothing, when the pool cannot serve.
        """
        plan = self.plan_allocation(seq, hit_tokens)
        if self.allocation_cost(plan) > self.num_free_blocks:
            return None
        return self.apply_allocation(seq, plan)

    def plan_allocation(self, seq: Sequence,
                        hit_tokens: int | None = None) -> tuple[list[Block | None], int]:
        """The prefix blocks to reuse (None: a placeholder) and how many new blocks."""
        assert not self._table(seq), f"{seq.label} already holds blocks"
        hits: list[Block | None] = list(self._lookup_prefix(seq))
        if hit_tokens is not None:
            hits = hits[:hit_tokens // self.block_size]
        return hits, self.blocks_needed(seq.num_tokens) - len(hits)

    def allocation_cost(self, plan: tuple[list[Block | None], int]) -> int:
        """Free blocks a plan takes: its new blocks and the cached ones it revives."""
        hits, num_new = plan
        return num_new + sum(1 for b in hits if b is not None and b.ref_count == 0)

    def apply_allocation(self, seq: Sequence, plan: tuple[list[Block | None], int]) -> int:
        hits, num_new = plan
        table = []
        for block in hits:
            if block is None:
                table.append(NO_BLOCK)
                continue
            if block.ref_count == 0:
                self.free_queue.remove(block)
            block.ref_count += 1
            table.append(block.block_id)
        table += [self._take_free_block().block_id for _ in range(num_new)]
        self._set_table(seq, table)
        cached_tokens = len(hits) * self.block_size
        seq.num_computed_tokens = cached_tokens
        self.prefix_hit_tokens += cached_tokens
        self.prefix_query_tokens += seq.num_tokens
        return cached_tokens

    def hit_tokens(self, seq: Sequence, limit: int | None = None) -> int:
        """Prompt tokens this pool could serve from its prefix cache (at most ``limit``)."""
        hit = len(self._lookup_prefix(seq)) * self.block_size
        return hit if limit is None else min(hit, limit)

    def _lookup_prefix(self, seq: Sequence) -> list[Block]:
        hits: list[Block] = []
        for i in range(self._num_lookup_blocks(seq)):
            block = self._cached_block(seq, i)
            if block is None:
                break
            hits.append(block)
        return hits

    def _num_lookup_blocks(self, seq: Sequence) -> int:
        if not self.enable_prefix_caching:
            return 0
        # The last token is always recomputed so that there are logits to sample from.
        num_full = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, num_full)
        return num_full

    def _cached_block(self, seq: Sequence, i: int) -> Block | None:
        """The cached block holding ``seq``'s full block ``i``, if any."""
        block = self.cached.get(seq.block_hashes[i])
        tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
        return block if block is not None and block.token_ids == tokens else None

    def _extend_hashes(self, seq: Sequence, num_full: int) -> None:
        bs = self.block_size
        for i in range(len(seq.block_hashes), num_full):
            parent = seq.block_hashes[i - 1] if i else None
            seq.block_hashes.append(hash_block(parent, seq.token_ids[i * bs:(i + 1) * bs]))

    def _take_free_block(self) -> Block:
        block = self.free_queue.popleft()
        if block.block_hash is not None:  # lazy eviction of a cached prefix block
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None
            block.token_ids = None
        block.ref_count = 1
        return block

    def can_append(self, seqs: Seq[Sequence]) -> bool:
        """Whether ``append_slots`` can serve each of ``seqs`` one more token."""
        return sum(self._blocks_to_append(s) for s in seqs) <= self.num_free_blocks

    def _blocks_to_append(self, seq: Sequence) -> int:
        """Exactly what append_slots takes: new blocks, and a copy of each shared block
        it writes (for a decode, at most one of the two)."""
        table = self._table(seq)
        missing = max(0, self.blocks_needed(self._append_target(seq)) - len(table))
        return missing + len(self._shared_to_write(seq, table))

    def _append_target(self, seq: Sequence) -> int:
        """Tokens ``append_slots`` gives room for: all of them (a sliding group: fewer)."""
        return seq.num_tokens

    def append_slots(self, seq: Sequence) -> bool:
        """Make room for ``seq``'s tokens not yet computed (its new decode token).

        Writing into a block shared with another sequence copies it first: the copy
        is recorded in ``cow_pairs``. Returns False, changing nothing, when out of
        blocks.
        """
        table = self._table(seq)
        needed = self.blocks_needed(self._append_target(seq)) - len(table)
        shared = self._shared_to_write(seq, table)
        if needed + len(shared) > self.num_free_blocks:
            return False
        for i in shared:
            src = self.blocks[table[i]]
            dst = self._take_free_block()
            src.ref_count -= 1
            table[i] = dst.block_id
            self.cow_pairs.append((src.block_id, dst.block_id))
        table += [self._take_free_block().block_id for _ in range(max(needed, 0))]
        return True

    def _shared_to_write(self, seq: Sequence, table: list[int]) -> list[int]:
        """Indices of the shared blocks the next tokens are written into (copy first)."""
        first_write = seq.num_computed_tokens // self.block_size
        return [i for i in range(first_write, len(table)) if self.blocks[table[i]].ref_count > 1]

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent (no new block)."""
        table = list(self._table(parent))
        self._set_table(child, table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens
        for block_id in table:
            if block_id != NO_BLOCK:
                self.blocks[block_id].ref_count += 1

    def commit_computed(self, seq: Sequence) -> None:
        """Register ``seq``'s blocks that are now full and computed in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        table = self._table(seq)
        num_full = min(seq.num_computed_tokens // bs, len(table))
        self._extend_hashes(seq, num_full)
        for i in range(num_full - 1, -1, -1):
            if table[i] == NO_BLOCK:
                break  # released out of a window, like every block before it
            block = self.blocks[table[i]]
            if block.block_hash is not None:
                break  # every block before a registered one is registered too
            block_hash = seq.block_hashes[i]
            if block_hash in self.cached:
                continue  # the same content already lives in another block
            block.block_hash = block_hash
            block.token_ids = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            self.cached[block_hash] = block

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references. Blocks reaching zero go back to the free queue,
        tail first so a chat's end is evicted before its beginning; blocks holding
        nothing reusable go to the head, to be reused first."""
        self._release(reversed(self._table(seq)))
        self._set_table(seq, [])
        seq.num_computed_tokens = 0

    def _release(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block, in this order, queueing those at zero."""
        for block_id in block_ids:
            if block_id == NO_BLOCK:
                continue
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                if block.block_hash is None:
                    self.free_queue.appendleft(block)
                else:
                    self.free_queue.append(block)

    def take_cow_pairs(self) -> list[tuple[int, int]]:
        pairs, self.cow_pairs = self.cow_pairs, []
        return pairs

    # -------------------------------------------------------------------- swap
    def can_swap_out(self, seqs: Seq[Sequence]) -> bool:
        held = {b for s in seqs for b in self._table(s)} - {NO_BLOCK}
        return len(held) <= len(self.host_free)

    def swap_out(self, seqs: Seq[Sequence]) -> list[tuple[int, int]]:
        """Move ``seqs`` (one request's candidates) to the host pool; blocks they share
        map to one host block. Returns (device block, host block) pairs to copy."""
        mapping: dict[int, int] = {}
        for seq in seqs:
            table = []
            for block_id in self._table(seq):
                if block_id == NO_BLOCK:
                    table.append(NO_BLOCK)
                    continue
                if block_id not in mapping:
                    mapping[block_id] = self.host_free.pop()
                host_id = mapping[block_id]
                self.host_refs[host_id] = self.host_refs.get(host_id, 0) + 1
                table.append(host_id)
            num_computed = seq.num_computed_tokens
            self.free(seq)
            seq.num_computed_tokens = num_computed
            self.host_tables[seq.seq_id] = table
        return list(mapping.items())

    def can_swap_in(self, seqs: Seq[Sequence], reserve: int = 0) -> bool:
        """Whether ``seqs`` fit back on the device with ``reserve`` blocks to spare."""
        needed = len({b for s in seqs for b in self.host_tables[s.seq_id]} - {NO_BLOCK})
        return needed + reserve <= self.num_free_blocks

    def swap_in(self, seqs: Seq[Sequence]) -> list[tuple[int, int]]:
        """Bring ``seqs`` back from the host pool. Returns (host, device) pairs."""
        mapping: dict[int, int] = {}
        for seq in seqs:
            table = []
            for host_id in self.host_tables.pop(seq.seq_id):
                if host_id == NO_BLOCK:
                    table.append(NO_BLOCK)
                    continue
                if host_id not in mapping:
                    mapping[host_id] = self._take_free_block().block_id
                else:
                    self.blocks[mapping[host_id]].ref_count += 1
                table.append(mapping[host_id])
                self.host_refs[host_id] -= 1
                if self.host_refs[host_id] == 0:
                    del self.host_refs[host_id]
                    self.host_free.append(host_id)
            self._set_table(seq, table)
        return list(mapping.items())

    def free_host(self, seq: Sequence) -> None:
        for host_id in self.host_tables.pop(seq.seq_id, []):
            if host_id == NO_BLOCK:
                continue
            self.host_refs[host_id] -= 1
            if self.host_refs[host_id] == 0:
                del self.host_refs[host_id]
                self.host_free.append(host_id)

    # ------------------------------------------------------------------- stats
    def stats(self, holders: Iterable[Sequence] = (), with_blocks: bool = True) -> KVStats:
        """The pool as the memory panel shows it (`kv_stats.pool_stats`). ``holders`` are
        the sequences that hold device blocks (the engine's request table knows them; this
        class keeps no registry of its own): they label each block's owners and measure
        the slots in use."""
        return pool_stats(self, holders, with_blocks)

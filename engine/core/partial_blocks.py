"""Reuse of a sequence's last, partial block by the next prompt that extends it.

A sequence that leaves (finished, or preempted by recompute) usually ends inside a block:
its last block holds fewer than ``block_size`` computed tokens. Without this, a chat's
next turn recomputes those tokens (up to ``block_size - 1`` of them), since the prefix
cache keeps full blocks only. So when that block loses its last holder, it stays in the
pool's cache map under ``partial_hash(parent, tokens)`` as an evictable entry, queued
like a freed full block. A later prompt whose tokens after its full-block hit start with
those tokens takes a fresh block, gets the cached block's K/V copied in (a copy pair,
applied before the step's forward) and skips them.

Copy on reuse, never sharing: the cached block is only ever read, so it cannot change
under its key, and no copy-on-write rule changes. It is held from the allocation until
the copy pairs are drained (``BlockPool.copy_sources``): a block taken in between can
never be it, whatever order the runner applies the step's moves in.

Not for linear-attention state: a hybrid model's state snapshots exist at full block
boundaries only, so a partial block's K/V would come without a state to go with it (the
KV cache manager turns reuse off there).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence as Seq

from engine.core.block_hashes import extend_hashes, image_keys
from engine.core.block_pool import BlockPool
from engine.core.free_block_queue import Block
from engine.core.kind_managers import SingleKindManager
from engine.core.sequence import Sequence

# One candidate of a partial hit: its length in tokens, its cache key, its tokens.
Candidate = tuple[int, bytes, tuple[int, ...]]


def partial_hash(parent: bytes | None, token_ids: Seq[int], extra: bytes = b"") -> bytes:
    """Apart from every full block's hash (another personalization), stable across
    processes: the parent's hash (None: the first block), then the tokens, then the
    keys of the images they hold part of (block_hashes.image_keys)."""
    h = hashlib.blake2b(parent or b"", digest_size=16, person=b"folio-partial")
    h.update(b",".join(str(t).encode() for t in token_ids))
    if extra:
        h.update(b"|images:" + extra)
    return h.digest()


def keep_partial(pool: BlockPool, seq: Sequence, table: list[int]) -> None:
    """Cache ``seq``'s last block under its computed tokens, if it is partial and ``seq``
    is its last holder (a block still held by another candidate may yet be written)."""
    bs = pool.block_size
    k, num = divmod(seq.num_computed_tokens, bs)
    if not num or k >= len(table) or table[k] == pool.null_id or len(seq.block_hashes) < k:
        return
    block = pool.blocks[table[k]]
    if block.ref_count != 1 or block.block_hash is not None:
        return
    tokens = tuple(seq.token_ids[k * bs:k * bs + num])
    extra = image_keys(seq, k * bs, k * bs + num)
    pool.register(block, partial_hash(seq.block_hashes[k - 1] if k else None, tokens, extra),
                  tokens)


def candidates(seq: Sequence, hit_tokens: int, block_size: int) -> list[Candidate]:
    """The keys a partial block after a full-block hit of ``hit_tokens`` may be cached
    under, longest first; the prompt's last token is never among them (it is computed
    so that there are logits to sample from)."""
    k = hit_tokens // block_size
    if len(seq.block_hashes) < k:
        return []
    parent = seq.block_hashes[k - 1] if k else None
    longest = min(block_size - 1, seq.num_tokens - 1 - hit_tokens)
    out = []
    for num in range(longest, 0, -1):
        tokens = tuple(seq.token_ids[hit_tokens:hit_tokens + num])
        extra = image_keys(seq, hit_tokens, hit_tokens + num)
        out.append((num, partial_hash(parent, tokens, extra), tokens))
    return out


def find_partial(pools: Seq[BlockPool], found: list[Candidate]
                 ) -> tuple[int, list[Block]] | None:
    """The longest candidate cached in every pool: its length and each pool's block."""
    for num, key, tokens in found:
        blocks = [pool.lookup(key, tokens) for pool in pools]
        if all(b is not None for b in blocks):
            return num, blocks  # type: ignore[return-value]
    return None


def extra_cost(block: Block | None) -> int:
    """Free blocks that holding ``block`` for its copy takes (one when it is free; none
    for no block)."""
    return 1 if block is not None and block.ref_count == 0 else 0


def hold(pool: BlockPool, block: Block) -> None:
    """Keep ``block`` until its copy is drained (before the new blocks are taken: a
    free one may be the free queue's head)."""
    pool.touch(block)
    pool.copy_sources.append(block.block_id)


def release_sources(pool: BlockPool) -> None:
    """The step's copies are drained: the held partial blocks go back, still cached."""
    sources, pool.copy_sources = pool.copy_sources, []
    pool.release(sources)


# ------------------------------------------------------------ over the KV groups
def options(pools: Seq[BlockPool], seq: Sequence, hit: int, enabled: bool
            ) -> list[tuple[int, list[Block | None]]]:
    """The tokens of the longest partial block cached after ``hit`` in every pool with
    each pool's block, then none (0 and Nones); only none where reuse is not ``enabled``."""
    none: tuple[int, list[Block | None]] = (0, [None] * len(pools))
    found = enabled and find_partial(pools, candidates(seq, hit, pools[0].block_size))
    return [found, none] if found else [none]  # type: ignore[list-item]


def hold_sources(managers: Seq[SingleKindManager], sources: Seq[Block | None]) -> None:
    """Hold each group's partial block (if any) until its copy is drained."""
    for m, src in zip(managers, sources, strict=True):
        if src is not None:
            hold(m.pool, src)


def copy_in(managers: Seq[SingleKindManager], sources: Seq[Block | None], seq: Sequence,
            hit: int) -> None:
    """Each group's partial block copied into ``seq``'s first block after the ``hit``."""
    for m, src in zip(managers, sources, strict=True):
        if src is not None:
            m.cow_pairs.append((src.block_id, m.table(seq)[hit // m.block_size]))


def keep_partials(managers: Seq[SingleKindManager], seq: Sequence) -> None:
    """``keep_partial`` in every group for a leaving ``seq``."""
    bs = managers[0].block_size
    extend_hashes(seq, seq.num_computed_tokens // bs, bs)
    for m in managers:
        keep_partial(m.pool, seq, m.table(seq))

"""Reuse of the first tokens of a cached block by a prompt that shares only those.

The prefix cache matches whole blocks. Two cases leave tokens behind a full-block hit
that another block already holds:
- a sequence that leaves (finished, or preempted by recompute) usually ends inside a
  block, so a chat's next turn would recompute up to ``block_size - 1`` tokens;
- a prompt that parts from a cached prompt inside a block (a new chat with the same
  system prompt and image but another question; an edited last message) would recompute
  the tokens of that block it shares.
So a leaving sequence's last, partial block stays in the pool's cache map under
``partial_hash(parent, tokens)`` as an evictable entry, queued like a freed full block,
and every cached block, full or partial, is indexed by the hash before it
(``BlockPool.children``). After a full-block hit, the longest run of the prompt's next
tokens that a block cached after the same parent starts with (the same images in them:
``Block.images``) is taken: a fresh block gets that block's K/V copied in (a copy pair,
applied before the step's forward) and those tokens are skipped.

Copy on reuse, never sharing: the cached block is only ever read (full cached blocks are
never written; partial ones have no holder), so it cannot change under its key, and no
copy-on-write rule changes. It is held from the allocation until the copy pairs are
drained (``BlockPool.copy_sources``): a block taken in between can never be it, whatever
order the runner applies the step's moves in.

An int8 or int4 pool reuses partial cached blocks only
(``KVCacheManager.partial_from_full`` False): a block's keys are quantized over all its
rows (kernels/kv_key_centers.py, kernels/kv_key_channels.py), so the first rows of a full
block would come back rounded by the rows after them, where the last block of a leaving
sequence has its rows' exact keys beside the pool (kernels/key_stage.py) and writes on as
if it had never left.

Not for linear-attention state: a hybrid model's state snapshots exist at full block
boundaries only, so a partial block's K/V would come without a state to go with it (the
KV cache manager turns reuse off there). Blocks read back from the tier below have no
parent recorded, so only their whole-block hits count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence as Seq
from itertools import zip_longest

from engine.core.block_hashes import block_images, extend_hashes, image_keys
from engine.core.block_pool import BlockPool
from engine.core.free_block_queue import Block
from engine.core.kind_managers import SingleKindManager
from engine.core.sequence import Sequence


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
    parent = seq.block_hashes[k - 1] if k else None
    if pool.register(block, partial_hash(parent, tokens, image_keys(seq, k * bs, k * bs + num)),
                     tokens):
        pool.index_child(block, parent, block_images(seq, k * bs, k * bs + num))


def shared_run(block: Block, tokens: tuple[int, ...],
               images: tuple[tuple[int, int, bytes], ...]) -> int:
    """How many of ``tokens`` (with ``images``, offsets as ``Block.images``) ``block``
    starts with, its images there the same."""
    held = block.token_ids or ()
    run = 0
    for mine, theirs in zip(tokens, held, strict=False):
        if mine != theirs:
            break
        run += 1
    return _agreeing(block.images, images, run)


def _agreeing(held: tuple[tuple[int, int, bytes], ...],
              wanted: tuple[tuple[int, int, bytes], ...], run: int) -> int:
    """``run`` cut at the first image of the run that the two differ in (another image,
    or an image on one side only): its tokens are not the same K/V."""
    mine = [(first, min(end, run), key) for first, end, key in held if first < run]
    theirs = [(first, min(end, run), key) for first, end, key in wanted if first < run]
    for a, b in zip_longest(mine, theirs):
        if a != b:
            return min(x[0] for x in (a, b) if x is not None)
    return run


def find_partial(pools: Seq[BlockPool], seq: Sequence, hit: int, from_full: bool = True
                 ) -> tuple[int, list[Block]] | None:
    """The longest run of ``seq``'s tokens after a full-block hit of ``hit`` tokens that
    a block cached after the same parent holds in every pool, with each pool's block
    (the first listed of the longest); the prompt's last token is never in it (it is
    computed so that there are logits to sample from). ``from_full`` False: partial
    cached blocks only."""
    bs = pools[0].block_size
    k = hit // bs
    if len(seq.block_hashes) < k:
        return None
    parent = seq.block_hashes[k - 1] if k else b""
    longest = min(bs - 1, seq.num_tokens - 1 - hit)
    if longest < 1:
        return None
    tokens = tuple(seq.token_ids[hit:hit + longest])
    images = block_images(seq, hit, hit + longest)
    run = longest
    chosen: list[Block] = []
    for pool in pools:
        best: Block | None = None
        best_run = 0
        for block in pool.children.get(parent, {}).values():
            if not from_full and not pool.is_partial(block):
                continue
            this = min(shared_run(block, tokens, images), run)
            if this > best_run:
                best, best_run = block, this
        if best is None:
            return None
        run = best_run
        chosen.append(best)
    return run, chosen


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
def options(pools: Seq[BlockPool], seq: Sequence, hit: int, enabled: bool,
            from_full: bool = True) -> list[tuple[int, list[Block | None]]]:
    """The tokens of the longest partial block cached after ``hit`` in every pool with
    each pool's block, then none (0 and Nones); only none where reuse is not ``enabled``;
    ``from_full``: as find_partial's."""
    none: tuple[int, list[Block | None]] = (0, [None] * len(pools))
    found = enabled and find_partial(pools, seq, hit, from_full)
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

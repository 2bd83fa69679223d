"""The LRU queue of free KV blocks: an intrusive doubly linked list.

Allocation pops from the head (the least recently freed block); freeing appends at
the tail. A prefix-cache hit on a free block takes it out of the middle in O(1),
which is why this is a linked list threaded through the blocks themselves rather
than a deque.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Block:
    """One physical KV block. ``block_hash`` is set once the block is full, computed
    and registered in the prefix cache; it survives freeing until the block is reused."""

    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    token_ids: tuple[int, ...] | None = None  # the tokens behind block_hash, checked on a hit
    # In the pool's index of blocks by the hash before them (``BlockPool.children``): that
    # hash (b"" for a first block), None when not indexed; and the images its tokens hold
    # part of, as (first, end, content key) offsets within the block.
    after: bytes | None = None
    images: tuple[tuple[int, int, bytes], ...] = ()
    prev: Block | None = None
    next: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_count}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """head <-> b3 <-> b7 <-> b1 <-> tail: b3 is evicted next, b1 was freed last."""

    def __init__(self, blocks: list[Block]) -> None:
        self._head = Block(-1)
        self._tail = Block(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Block]:
        node = self._head.next
        while node is not self._tail:
            assert node is not None
            yield node
            node = node.next

    def append(self, block: Block) -> None:
        self._insert_after(self._tail.prev, block)

    def appendleft(self, block: Block) -> None:
        self._insert_after(self._head, block)

    def popleft(self) -> Block:
        block = self._head.next
        if block is self._tail or block is None:
            raise IndexError("no free block")
        self.remove(block)
        return block

    def remove(self, block: Block) -> None:
        assert block.prev is not None and block.next is not None, "block is not in the queue"
        block.prev.next = block.next
        block.next.prev = block.prev
        block.prev = block.next = None
        self._len -= 1

    def contains(self, block: Block) -> bool:
        return block.prev is not None

    def _insert_after(self, anchor: Block | None, block: Block) -> None:
        assert anchor is not None and anchor.next is not None
        assert block.prev is None and block.next is None, "block is already queued"
        block.prev = anchor
        block.next = anchor.next
        anchor.next.prev = block
        anchor.next = block
        self._len += 1

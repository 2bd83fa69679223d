"""FreeBlockQueue: the intrusive doubly linked LRU list of free blocks."""

from __future__ import annotations

import random

import pytest

from engine.core.free_block_queue import Block, FreeBlockQueue


def ids(queue: FreeBlockQueue) -> list[int]:
    return [b.block_id for b in queue]


def make(n: int) -> tuple[list[Block], FreeBlockQueue]:
    blocks = [Block(i) for i in range(n)]
    return blocks, FreeBlockQueue(blocks)


def test_starts_in_the_given_order() -> None:
    _, queue = make(5)
    assert ids(queue) == [0, 1, 2, 3, 4]
    assert len(queue) == 5


def test_empty_queue() -> None:
    queue = FreeBlockQueue([])
    assert len(queue) == 0
    assert ids(queue) == []
    with pytest.raises(IndexError, match="no free block"):
        queue.popleft()


def test_popleft_takes_the_head_and_unlinks_it() -> None:
    blocks, queue = make(3)
    block = queue.popleft()
    assert block is blocks[0]
    assert (block.prev, block.next) == (None, None)
    assert not queue.contains(block)
    assert ids(queue) == [1, 2]
    assert len(queue) == 2


def test_append_goes_to_the_tail_and_appendleft_to_the_head() -> None:
    blocks, queue = make(3)
    first, second = queue.popleft(), queue.popleft()
    queue.append(first)
    assert ids(queue) == [2, 0]
    queue.appendleft(second)
    assert ids(queue) == [1, 2, 0]
    assert len(queue) == 3
    assert queue.popleft() is blocks[1]


@pytest.mark.parametrize("victim, rest", [(0, [1, 2, 3]), (2, [0, 1, 3]), (3, [0, 1, 2])])
def test_remove_from_head_middle_and_tail(victim: int, rest: list[int]) -> None:
    blocks, queue = make(4)
    queue.remove(blocks[victim])
    assert ids(queue) == rest
    assert len(queue) == 3
    assert not queue.contains(blocks[victim])
    # The neighbours were relinked both ways: walking backwards from the tail agrees.
    backwards = []
    node = queue._tail.prev
    while node is not queue._head:
        backwards.append(node.block_id)
        node = node.prev
    assert backwards == rest[::-1]


def test_removed_block_can_be_queued_again() -> None:
    blocks, queue = make(3)
    queue.remove(blocks[1])
    queue.append(blocks[1])
    assert ids(queue) == [0, 2, 1]


def test_queueing_a_queued_block_is_an_internal_error() -> None:
    blocks, queue = make(2)
    with pytest.raises(AssertionError, match="already queued"):
        queue.append(blocks[0])


def test_removing_an_unqueued_block_is_an_internal_error() -> None:
    blocks, queue = make(2)
    queue.popleft()
    with pytest.raises(AssertionError, match="not in the queue"):
        queue.remove(blocks[0])


def test_matches_a_list_under_random_operations() -> None:
    rng = random.Random(7)
    blocks, queue = make(12)
    model = list(range(12))
    out: list[int] = []
    for _ in range(2000):
        op = rng.randrange(4)
        if op == 0 and model:
            popped = queue.popleft()
            assert popped.block_id == model.pop(0)
            out.append(popped.block_id)
        elif op == 1 and out:
            b = out.pop(rng.randrange(len(out)))
            queue.append(blocks[b])
            model.append(b)
        elif op == 2 and out:
            b = out.pop(rng.randrange(len(out)))
            queue.appendleft(blocks[b])
            model.insert(0, b)
        elif op == 3 and model:
            b = model.pop(rng.randrange(len(model)))
            queue.remove(blocks[b])
            out.append(b)
        assert ids(queue) == model
        assert len(queue) == len(model)
        assert all(queue.contains(blocks[b]) for b in model)
        assert not any(queue.contains(blocks[b]) for b in out)


"""kernels/key_stage.py: which slot holds which open block's exact keys, and the key
writes made from them."""

import pytest
import torch

from kernels import allocate_kv_cache
from kernels.key_stage import NO_ROWS, POOL_ROWS, KeyStage, KeyStages
from kernels.kv_format import INT4

BS = 32


def pool(num_blocks: int = 8, layers: int = 2) -> torch.Tensor:
    return allocate_kv_cache(layers, num_blocks, BS, 2, 64, INT4.storage, "cpu", head_major=True)


def slots(*runs: tuple[int, int, int]) -> torch.Tensor:
    """(block, first row, rows) runs -> a slot mapping."""
    return torch.tensor([b * BS + r for b, first, n in runs for r in range(first, first + n)])


def test_open_blocks_take_slots_full_ones_free_them():
    stage = KeyStage(pool(), slots=3)
    plan = stage.plan(slots((2, 0, 32), (5, 0, 7)))  # block 2 fills; 5 stays open
    assert plan.blocks.tolist() == [2, 5] and plan.filled.tolist() == [32, 7]
    assert stage.held() == {5: (0, 7)}
    assert plan.keep[0].tolist() == [1] and plan.keep[1].tolist() == [0]
    plan = stage.plan(slots((5, 7, 1), (6, 0, 3)))
    assert plan.from_slot[0].tolist() == [0] and plan.from_slot[1].tolist() == [0]
    assert stage.held() == {5: (0, 8), 6: (1, 3)}
    stage.plan(slots((5, 8, 24)))  # block 5 fills: its slot is free again
    assert stage.held() == {6: (1, 3)}
    stage.plan(slots((7, 0, 1)))
    assert stage.held() == {6: (1, 3), 7: (0, 1)}  # the freed slot first


def test_the_least_recently_written_block_gives_up_its_slot():
    stage = KeyStage(pool(), slots=2)
    stage.plan(slots((1, 0, 3)))
    stage.plan(slots((2, 0, 3)))
    stage.plan(slots((1, 3, 1)))  # block 1 written again: block 2 is now the oldest
    stage.plan(slots((3, 0, 1)))
    assert stage.held() == {1: (0, 4), 3: (1, 1)}
    plan = stage.plan(slots((2, 3, 1)))  # its slot went: its rows come from the pool
    assert plan.from_pool.tolist() == [0] and plan.from_slot[0].numel() == 0
    assert stage.held() == {3: (1, 1), 2: (0, 4)}


def test_a_step_that_leaves_more_blocks_open_than_slots_is_refused():
    stage = KeyStage(pool(), slots=1)
    with pytest.raises(RuntimeError, match="slots"):
        stage.plan(slots((1, 0, 3), (2, 0, 3)))


def test_a_block_written_in_two_runs_is_refused():
    stage = KeyStage(pool(), slots=2)
    with pytest.raises(ValueError, match="two runs"):
        stage.plan(slots((1, 0, 3), (2, 0, 1), (1, 3, 1)))


def test_the_plan_is_made_once_per_slot_mapping():
    stage = KeyStage(pool(), slots=2)
    mapping = slots((1, 0, 3))
    assert stage.plan(mapping) is stage.plan(mapping)
    assert stage.held() == {1: (0, 3)}


def test_copies_carry_the_slot_and_forgotten_blocks_lose_it():
    stage = KeyStage(pool(), slots=3)
    stage.plan(slots((1, 0, 5)))
    stage.exact[:, 0] = 1.5
    stage.copy([1, 4], [2, 3])  # block 4 holds no slot: block 3's is dropped
    assert stage.held() == {1: (0, 5), 2: (1, 5)}
    assert (stage.exact[:, 1] == 1.5).all()
    stage.forget([1])
    assert stage.held() == {2: (1, 5)}
    plan = stage.plan(slots((1, 5, 1)))
    assert plan.from_pool.tolist() == [0]


def test_pools_whose_keys_are_rows_need_no_stage():
    for dtype in (torch.float8_e4m3fn, torch.float16):
        pool = allocate_kv_cache(1, 2, BS, 1, 64, dtype, "cpu", head_major=True)
        with pytest.raises(ValueError, match="needs no stage"):
            KeyStage(pool, slots=1)


def test_a_block_encodes_the_same_however_its_rows_came():
    """Token at a time, with the block's slot evicted once (rows back from the pool), or
    in one write: the same key bytes as encode_keys of the rows, rows from the pool aside
    (they carry one more rounding)."""
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(BS, 2, 64, generator=gen) * 3 + 1
    one, many = pool(4, 1), pool(4, 1)
    stages = KeyStages()
    stage_one, stage_many = KeyStage(one, 1), KeyStage(many, 1)
    stages.attach(stage_one)
    stages.attach(stage_many)
    stages.write(keys[:20], one[0, 0], slots((2, 0, 20)))
    for r in range(20):
        stages.write(keys[r:r + 1], many[0, 0], slots((2, r, 1)))
    want = INT4.encode_keys(keys[None], torch.tensor([20]))[0]
    assert torch.equal(one[0, 0, 2].view(torch.uint8), want)
    assert torch.equal(many[0, 0, 2].view(torch.uint8), want)
    assert not one[0, 0, [0, 1, 3]].view(torch.uint8).any()
    stage_many.forget([2])
    stages.write(keys[20:21], many[0, 0], slots((2, 20, 1)))
    decoded = INT4.decode_keys(many[0, 0, 2:3])[0, :21]  # rotated, as quantized
    rotated = INT4.rotate(keys[:21])
    step = (rotated.amax(0) - rotated.amin(0)) / 15
    # Twice rounded (the rows from the pool, then the block again): within a step.
    assert ((decoded - rotated).abs() <= step * 1.1).all()


def test_a_pool_without_a_stage_is_named():
    with pytest.raises(ValueError, match="KeyStage"):
        KeyStages().write(torch.zeros(1, 2, 64), pool()[0, 0], slots((0, 0, 1)))


def test_a_swapped_block_keeps_its_slot_through_the_host_pool():
    stage = KeyStage(pool(), slots=3)
    stage.plan(slots((1, 0, 5), (2, 0, 32)))
    stage.move([1, 2], [0, 3], to_host=True)  # device 1 -> host 0
    assert stage.held() == {-1: (0, 5)}
    stage.plan(slots((1, 0, 2)))  # device block 1 reused by another sequence
    stage.move([0], [6], to_host=False)  # host 0 -> device 6
    assert stage.held() == {1: (1, 2), 6: (0, 5)}
    plan = stage.plan(slots((6, 5, 1)))
    assert plan.from_slot[1].tolist() == [0]


def test_the_plan_says_per_block_where_its_rows_come_from_and_go():
    stage = KeyStage(pool(), slots=2)
    stage.plan(slots((1, 0, 5)))
    stage.forget([2])
    plan = stage.plan(slots((1, 5, 1), (2, 3, 29), (3, 0, 2)))
    assert plan.carry.tolist() == [0, POOL_ROWS, NO_ROWS]
    assert plan.keep_slot.tolist() == [0, -1, 1]

"""The native key writer of int4 and int8 pools (write_key_blocks,
kernels/cpu/csrc/attention/key_blocks.cpp) against the PyTorch one
(kernels/key_stage.write_keys): steps planned by a KeyStage over full and partial blocks,
earlier rows from a slot, from the pool or none, open blocks kept in slots, head sizes 64
and 128, blocks of 32 (int4) and 64 slots, one to four KV heads.

The op Hadamard-rotates the new keys itself (kv_rows.h's butterflies), torch by a matrix
product: the two can differ in a value's last float32 bit, and a value that lands on a
float16 rounding boundary then rounds to neighbouring float16s (a few in ten thousand at
head size 128), which can move a code by one where it lies on a code boundary, or a
channel's parameters (int8: its center) where it is the channel's extreme. So random
keys are compared within that; the encoding itself is held to the bytes: keys whose
rotation is exact in both (head size 64: multiples of 1/4 and a scale of 1/8), and blocks
re-encoded from their slot's or pool's rows alone (no new keys, no rotation)."""

from __future__ import annotations

import pytest
import torch

import kernels.cpu
from kernels import allocate_kv_cache
from kernels.cpu.attention import CpuBackend, write_key_blocks
from kernels.key_stage import NO_ROWS, POOL_ROWS, KeyStage, StagePlan, write_keys
from kernels.kv_format import INT4, INT8, KVFormat
from kernels.kv_key_centers import center_codes
from kernels.kv_key_channels import key_params

SLOTS = 3


def runs(bs: int, *spans: tuple[int, int, int]) -> torch.Tensor:
    """(block, first row, rows) runs -> a slot mapping."""
    return torch.tensor([b * bs + r for b, first, n in spans for r in range(first, first + n)])


def steps(bs: int) -> list[torch.Tensor | list[int]]:
    """Slot mappings of a pool's steps; a list: blocks the stage forgets (their rows then
    come from the pool)."""
    return [
        runs(bs, (0, 0, bs), (1, 0, 5)),  # a full block and an open one, no earlier rows
        runs(bs, (1, 5, 1), (2, 0, 1)),  # a decode from the slot; a new block
        [1],
        runs(bs, (1, 6, 1), (3, 0, bs - 3)),  # rows from the pool
        # Block 2 fills, giving its slot back, and block 4 keeps its rows there: the op
        # must have read block 2's slot first.
        runs(bs, (2, 1, bs - 1), (4, 0, 3)),
        # Padding tokens (slot -1) between the written ones; block 3 from its slot.
        torch.tensor([-1, 3 * bs + bs - 3, -1, 4 * bs + 3, 4 * bs + 4, -1]),
    ]


def run_both(fmt: KVFormat, hd: int, bs: int, nkv: int, keys_for, compare) -> None:
    """Each step written by both writers from the same pool and slots (the PyTorch
    writer's, carried on), the key given to the op as a view of a wider q/k/v row as
    the fused layer's is; compare(got, want) per step on (pool, slots) after it."""
    pool = allocate_kv_cache(1, 6, bs, nkv, hd, fmt.storage, "cpu", head_major=True)
    stage = KeyStage(pool, SLOTS)
    gen = torch.Generator().manual_seed(hd + bs + nkv)
    for step in steps(bs):
        if isinstance(step, list):
            stage.forget(step)
            continue
        plan = stage.plan(step)
        key = keys_for(len(step), gen)
        qkv = torch.cat([torch.randn(len(step), 2, hd, generator=gen), key], 1)
        want = (pool[0, 0].clone(), stage.exact[0].clone())
        got = (pool[0, 0].clone(), stage.exact[0].clone())
        write_keys(want[1], key, want[0], plan)
        write_key_blocks(got[1], qkv[:, 2:], got[0], plan)
        compare(got, want, plan)
        pool[0, 0].copy_(want[0])
        stage.exact[0].copy_(want[1])


def kept(exact: torch.Tensor, plan: StagePlan) -> list[torch.Tensor]:
    """The rows each kept block holds in its slot (the rest of a slot is never read)."""
    index, slots = plan.keep
    return [exact[s, :plan.filled[i]] for i, s in zip(index.tolist(), slots.tolist(),
                                                      strict=True)]


# (format, head size, block size, KV heads)
SHAPES = [(INT4, 64, 32, 1), (INT4, 64, 64, 3), (INT4, 128, 32, 2), (INT4, 128, 64, 4),
          (INT8, 64, 64, 1), (INT8, 64, 64, 3), (INT8, 128, 64, 2), (INT8, 128, 64, 4)]
IDS = [f"{f.name}-{hd}-{bs}-{nkv}" for f, hd, bs, nkv in SHAPES]


def code_step(fmt: KVFormat, rows: torch.Tensor, hd: int) -> torch.Tensor:
    """How far one code moves a decoded key, broadcastable over [B, bs, nkv, hd]: an
    int4 channel's step; an int8 row's scale plus a center code's unit (a channel whose
    extreme moved shifts its center by one)."""
    if fmt is INT4:
        return key_params(rows, hd)[1][:, None]
    scale = (rows[..., hd:hd + 2].contiguous().view(torch.int16) & 0x7FFF).view(torch.float16)
    unit = center_codes(rows, hd)[1][:, None] / 127
    return scale.float() + unit


@pytest.mark.parametrize(("fmt", "hd", "bs", "nkv"), SHAPES, ids=IDS)
def test_keys_whose_rotation_is_exact_write_the_same_bytes(fmt, hd, bs, nkv):
    """Keys of quarter steps: their Hadamard sums are exact in float32 and, at head size
    64, so is the scale of 1/8, so both writers rotate to the same values and the bytes
    must be equal. (At 128 the scale 1/sqrt(128) rounds: the keys there are zero but for
    the first element of each run, which one rounding maps alike in both.)"""

    def keys(n, gen):
        k = torch.randint(-8, 9, (n, nkv, hd), generator=gen).float() / 4
        if hd == 128:
            k[..., 1:] = 0
        return k

    def compare(got, want, plan):
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
        for g, w in zip(kept(got[1], plan), kept(want[1], plan), strict=True):
            assert torch.equal(g, w)

    run_both(fmt, hd, bs, nkv, keys, compare)


@pytest.mark.parametrize(("fmt", "hd", "bs", "nkv"), SHAPES, ids=IDS)
def test_random_keys_write_the_same_blocks_but_for_the_rotations_last_bits(fmt, hd, bs, nkv):
    """Random keys: every key decodes within one code of the PyTorch writer's, and all
    but a few codes (the module docstring's rounding boundaries) are equal; the slots'
    rows within a float16 step."""
    diffs = []

    def keys(n, gen):
        return torch.randn(n, nkv, hd, generator=gen) * 2 + 0.5

    def compare(got, want, plan):
        blocks = plan.blocks
        g, w = got[0][blocks].view(torch.uint8), want[0][blocks].view(torch.uint8)
        diffs.append((g != w).sum().item() / g.numel())
        step = code_step(fmt, w, hd)
        decoded_g, decoded_w = fmt.decode_keys(g), fmt.decode_keys(w)
        assert ((decoded_g - decoded_w).abs() <= step * 1.01 + 1e-6).all()
        for gs, ws in zip(kept(got[1], plan), kept(want[1], plan), strict=True):
            # A float16 step apart, or the rotation's float32 error (absolute, at the
            # scale of the row's sums) where the value is near 0; and few of them.
            torch.testing.assert_close(gs.float(), ws.float(), rtol=2 ** -10, atol=2 ** -16)
            assert (gs != ws).float().mean() < 0.01

    run_both(fmt, hd, bs, nkv, keys, compare)
    assert max(diffs) < 0.005


@pytest.mark.parametrize(("fmt", "hd", "bs", "nkv"), SHAPES, ids=IDS)
@pytest.mark.parametrize("carry", ["slot", "pool"])
def test_a_block_encodes_from_its_earlier_rows_to_the_codecs_bytes(fmt, hd, bs, nkv, carry):
    """No new keys (nothing rotated): the op encodes a block's rows from a slot of known
    float16 rows, or from its decoded pool rows, to the codec's bytes exactly, for
    partial and full blocks; a kept block's slot gets the rows as float16."""
    gen = torch.Generator().manual_seed(7)
    pool = allocate_kv_cache(1, 4, bs, nkv, hd, fmt.storage, "cpu", head_major=True)
    k_cache = pool[0, 0]
    rows = (torch.randn(4, bs, nkv, hd, generator=gen) * 3 + 1).half().float()
    k_cache.view(torch.uint8).copy_(fmt.encode_key_block(rows, torch.full((4,), bs)))
    exact = (torch.randn(SLOTS, bs, nkv, hd, generator=gen) * 2).half()
    filled = torch.tensor([bs, 7, bs // 2])
    blocks = torch.tensor([3, 0, 2])
    if carry == "slot":
        source = exact[[2, 0, 1]].float()
        carried = torch.tensor([2, 0, 1])
    else:
        source = fmt.decode_keys(k_cache[blocks])
        carried = torch.full((3,), POOL_ROWS)
    # From the slots: two blocks swap theirs (each slot read before it is written).
    keep_slot = torch.tensor([-1, 1, 2] if carry == "pool" else [-1, 1, 0])
    none = torch.zeros(0, dtype=torch.int64)
    want = fmt.encode_key_block(source, filled)
    # POOL_ROWS's rows, and so the slots they are kept in, as the PyTorch writer keeps them.
    want_slots = source.half()
    untouched = k_cache[1].clone()
    kernels.cpu.ops().write_key_blocks(torch.zeros(0, nkv, hd), k_cache, exact, none, none,
                                       blocks, filled, carried, keep_slot)
    assert torch.equal(k_cache[blocks].view(torch.uint8), want)
    assert torch.equal(k_cache[1], untouched)
    for i, slot in enumerate(keep_slot.tolist()):
        if slot >= 0:
            assert torch.equal(exact[slot, :filled[i]], want_slots[i, :filled[i]])


def test_a_plan_the_stage_would_not_make_is_refused():
    """No earlier rows for a block whose first new row is not its first: the op would
    encode rows nobody wrote."""
    pool = allocate_kv_cache(1, 2, 32, 1, 64, INT4.storage, "cpu", head_major=True)
    exact = torch.zeros(1, 32, 1, 64, dtype=torch.float16)
    one = torch.tensor([0])
    with pytest.raises(RuntimeError, match="StagePlan"):
        kernels.cpu.ops().write_key_blocks(torch.zeros(1, 1, 64), pool[0, 0], exact, one,
                                           torch.tensor([5]), one, torch.tensor([6]),
                                           torch.tensor([NO_ROWS]), torch.tensor([-1]))
    with pytest.raises(RuntimeError, match="float32"):
        kernels.cpu.ops().write_key_blocks(torch.zeros(1, 1, 64, dtype=torch.float16),
                                           pool[0, 0], exact, one, one, one, one,
                                           torch.tensor([NO_ROWS]), torch.tensor([-1]))
    small = allocate_kv_cache(1, 2, 32, 1, 64, INT8.storage, "cpu", head_major=True)
    with pytest.raises(RuntimeError, match="at least 64 slots"):
        kernels.cpu.ops().write_key_blocks(torch.zeros(1, 1, 64), small[0, 0], exact, one,
                                           one, one, one, torch.tensor([NO_ROWS]),
                                           torch.tensor([-1]))
    floats = allocate_kv_cache(1, 2, 32, 1, 64, torch.float16, "cpu", head_major=True)
    with pytest.raises(RuntimeError, match="int4 .uint8. or int8"):
        kernels.cpu.ops().write_key_blocks(torch.zeros(1, 1, 64), floats[0, 0], exact, one,
                                           one, one, one, torch.tensor([NO_ROWS]),
                                           torch.tensor([-1]))


def test_the_backend_and_its_fallback_write_through_one_stage():
    """CpuBackend's stages write with the op; its PyTorch fallback (a bfloat16 key) finds
    the same stage and writes the same blocks, the key taken as float32."""
    backend = CpuBackend()
    assert backend._fallback.key_stages is backend.key_stages
    assert backend.key_stages.writer is write_key_blocks
    gen = torch.Generator().manual_seed(9)
    pools = [allocate_kv_cache(1, 2, 32, 2, 64, INT4.storage, "cpu", head_major=True)
             for _ in range(2)]
    for pool in pools:
        backend.key_stages.attach(KeyStage(pool, 1))
    key = (torch.randint(-8, 9, (10, 2, 64), generator=gen).float() / 4).bfloat16()
    value = torch.randn(10, 2, 64, generator=gen).bfloat16()
    mapping = torch.arange(32, 42)
    backend.write_kv(key, value, pools[0][0, 0], pools[0][0, 1], mapping)
    backend.write_kv(key.float(), value.float(), pools[1][0, 0], pools[1][0, 1], mapping)
    assert pools[0][0, 0].view(torch.uint8).any()
    assert torch.equal(pools[0][0, 0], pools[1][0, 0])

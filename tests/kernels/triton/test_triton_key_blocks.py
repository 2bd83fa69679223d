"""The Triton key-block encoders against kernels/kv_key_centers.py's (int8) and
kernels/kv_key_channels.py's (int4) `encode_key_block`, byte for byte. Interpreted on CPU,
compiled on CUDA."""

from __future__ import annotations

import pytest
import torch

from kernels import allocate_kv_cache
from kernels import kv_key_centers as centers
from kernels.kv_format import format_named
from kernels.kv_key_channels import encode_key_block
from kernels.triton.key_blocks import encode_key_blocks
from tests.kernels.paged_cases import DEVICE

INT4 = format_named("int4")
INT8 = format_named("int8")


def _raw_keys(n: int, bs: int, nkv: int, hd: int, seed: int) -> torch.Tensor:
    """Keys as a model's look: per-channel offsets, a wide channel, a block of zeros
    (M = W = 0), a block of one repeated row (every half-width 0), ties."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((n, bs, nkv, hd), generator=gen)
    x += torch.randn((1, 1, nkv, hd), generator=gen) * 4
    x[..., 5] *= 40
    x[1] = 0.0
    x[2] = x[2, :1]
    x[3] = torch.round(x[3] * 4) / 4  # quarter steps: midpoints and codes on ties
    return x


def _keys(n: int, bs: int, nkv: int, hd: int, seed: int) -> torch.Tensor:
    """_raw_keys, rotated for odd seeds (either is a block's input)."""
    x = _raw_keys(n, bs, nkv, hd, seed)
    return INT4.rotate(x) if seed % 2 else x


@pytest.mark.parametrize("hd,bs", [(64, 32), (80, 32), (128, 64), (256, 32)])
def test_encode_key_blocks_writes_encode_key_block_bytes(hd, bs):
    n, nkv = 6, 2
    keys = _keys(n, bs, nkv, hd, seed=hd + bs)
    filled = torch.tensor([bs, bs, bs, bs, 1, bs // 2 + 3])
    row = INT4.row_len(hd)
    want = encode_key_block(keys, filled, row)
    pool = allocate_kv_cache(1, 9, bs, nkv, hd, INT4.storage, DEVICE, head_major=False)[0, 0]
    gen = torch.Generator().manual_seed(1)
    pool.copy_(torch.randint(0, 256, pool.shape, generator=gen, dtype=torch.uint8))
    before = pool.clone()
    ids = torch.tensor([7, 0, 3, 8, 2, 5])
    encode_key_blocks(keys.to(DEVICE), filled.to(DEVICE), pool, ids.to(DEVICE))
    got = pool[ids.to(DEVICE)].cpu()
    if DEVICE.type == "cpu":  # the interpreter computes as torch does
        assert torch.equal(got, want)
    else:
        assert (got != want).float().mean() < 1e-3
        torch.testing.assert_close(INT4.decode_keys(got), INT4.decode_keys(want), atol=0.1,
                                   rtol=0)
    others = torch.ones(9, dtype=torch.bool)
    others[ids] = False
    assert torch.equal(pool[others.to(DEVICE)], before[others.to(DEVICE)])


def test_encode_key_blocks_from_float16_keys():
    keys = _keys(4, 32, 1, 64, seed=3).half()
    filled = torch.tensor([32, 7, 32, 32])
    pool = torch.zeros((4, 32, 1, INT4.row_len(64)), dtype=torch.uint8, device=DEVICE)
    encode_key_blocks(keys.to(DEVICE), filled.to(DEVICE), pool, torch.arange(4, device=DEVICE))
    want = encode_key_block(keys, filled, INT4.row_len(64))
    if DEVICE.type == "cpu":
        assert torch.equal(pool.cpu(), want)


def test_encode_key_blocks_refuses_what_it_cannot_write():
    keys = torch.zeros((1, 32, 1, 64), device=DEVICE)
    one = torch.ones(1, dtype=torch.int64, device=DEVICE)
    fp8 = torch.zeros((1, 32, 1, 66), dtype=torch.float8_e4m3fn, device=DEVICE)
    with pytest.raises(ValueError, match="int8 and int4 pools, got a fp8 pool"):
        encode_key_blocks(keys, one, fp8, one - 1)
    int8 = torch.zeros((1, 32, 1, INT8.row_len(64)), dtype=torch.int8, device=DEVICE)
    with pytest.raises(ValueError, match="int8 keys need blocks of at least 64"):
        encode_key_blocks(keys, one, int8, one - 1)
    int8 = torch.zeros((1, 64, 1, 66), dtype=torch.int8, device=DEVICE)  # fp8's row length
    with pytest.raises(ValueError, match="in int8 rows"):
        encode_key_blocks(torch.zeros((1, 64, 1, 64), device=DEVICE), one, int8, one - 1)
    pool = torch.zeros((1, 16, 1, INT4.row_len(64)), dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="at least 32"):
        encode_key_blocks(keys[:, :16], one, pool, one - 1)
    pool = torch.zeros((1, 32, 1, INT4.row_len(60)), dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="divisible by 8"):
        encode_key_blocks(keys[..., :60], one, pool, one - 1)


# int8: keys around their block's centers (kernels/kv_key_centers.py).


def _int8_keys(n: int, bs: int, nkv: int, hd: int, seed: int) -> torch.Tensor:
    """Rotated keys as a model's look: per-channel offsets (M's bits in the first rows'
    scale signs), a wide channel; a block of zeros (M = 0: no centers, every scale 0), a
    block of one repeated row (every residual the row's own rounding), a block on quarter
    steps (midpoints, centers and codes on ties), a block whose largest midpoint is no
    float16 (M rounded up), and a block of negative offsets only."""
    x = _raw_keys(n, bs, nkv, hd, seed)
    x[4] = x[4] * 0.01 + 1.0003
    x[5] = -x[5].abs() - 2.0
    return INT8.rotate(x) if seed % 2 else x


@pytest.mark.parametrize("hd,bs", [(64, 64), (128, 128), (96, 64), (200, 64), (128, 64)])
def test_encode_int8_key_blocks_writes_encode_key_block_bytes(hd, bs):
    """Every filled count that matters: 1 (a block's first token), 15, 16, 17 (M's last
    sign bit and the first row without one), 64 (the fewest rows a block has) and a full
    block; blocks written among others of random bytes, which stay as they were."""
    nkv = 2
    filled = torch.tensor([bs, bs, bs, bs, bs, bs, 1, 15, 16, 17, 64, bs - 1])
    n = filled.numel()
    keys = _int8_keys(n, bs, nkv, hd, seed=hd + bs)
    keys[6:] = keys[:6]  # the same kinds of blocks, filled in part
    row = INT8.row_len(hd)
    want = centers.encode_key_block(keys, filled, row)
    assert want.shape == (n, bs, nkv, row)
    pool = allocate_kv_cache(1, n + 3, bs, nkv, hd, INT8.storage, DEVICE,
                             head_major=False)[0, 0]
    gen = torch.Generator().manual_seed(1)
    pool.view(torch.uint8).copy_(torch.randint(0, 256, pool.shape, generator=gen,
                                               dtype=torch.uint8))
    before = pool.clone()
    ids = torch.randperm(n + 3, generator=gen)[:n]
    encode_key_blocks(keys.to(DEVICE), filled.to(DEVICE), pool, ids.to(DEVICE))
    got = pool[ids.to(DEVICE)].view(torch.uint8).cpu()
    if DEVICE.type == "cpu":  # the interpreter computes as torch does
        assert torch.equal(got, want)
    else:
        assert (got != want).float().mean() < 1e-3
        torch.testing.assert_close(INT8.decode_keys(got.view(torch.int8)),
                                   INT8.decode_keys(want.view(torch.int8)), atol=0.05,
                                   rtol=0)
    others = torch.ones(n + 3, dtype=torch.bool)
    others[ids] = False
    assert torch.equal(pool[others.to(DEVICE)].view(torch.uint8),
                       before[others.to(DEVICE)].view(torch.uint8))
    # What the bytes hold: the filled rows decode near their keys, and M's bits are in the
    # first rows' scales.
    decoded = INT8.decode_keys(want.view(torch.int8))
    for i, f in enumerate(filled.tolist()):
        err = (decoded[i, :f] - keys[i, :f]).abs().max()
        assert err <= keys[i, :f].abs().max() / 100 + 1e-6
    assert (want[:, :16, :, hd + 1] >= 0x80).any()


def test_encode_int8_key_blocks_from_float16_keys():
    keys = _int8_keys(6, 64, 1, 64, seed=3).half()
    filled = torch.tensor([64, 7, 64, 64, 16, 33])
    pool = torch.zeros((6, 64, 1, INT8.row_len(64)), dtype=torch.int8, device=DEVICE)
    encode_key_blocks(keys.to(DEVICE), filled.to(DEVICE), pool, torch.arange(6, device=DEVICE))
    want = centers.encode_key_block(keys, filled, INT8.row_len(64))
    if DEVICE.type == "cpu":
        assert torch.equal(pool.view(torch.uint8).cpu(), want)
    else:
        assert (pool.view(torch.uint8).cpu() != want).float().mean() < 1e-3

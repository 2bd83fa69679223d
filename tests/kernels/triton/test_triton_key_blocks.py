"""The Triton int4 key-block encoder against kernels/kv_key_channels.py's
`encode_key_block`, byte for byte, and as the attention kernels and `decode_keys` read it.
Interpreted on CPU, compiled on CUDA."""

from __future__ import annotations

import pytest
import torch

from kernels import allocate_kv_cache
from kernels.kv_format import format_named
from kernels.kv_key_channels import encode_key_block
from kernels.triton.key_blocks import encode_key_blocks
from tests.kernels.paged_cases import DEVICE

INT4 = format_named("int4")


def _keys(n: int, bs: int, nkv: int, hd: int, seed: int) -> torch.Tensor:
    """Rotated keys as a model's look: per-channel offsets, a wide channel, a block of
    zeros (M = W = 0), a block of one repeated row (every half-width 0), ties."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((n, bs, nkv, hd), generator=gen)
    x += torch.randn((1, 1, nkv, hd), generator=gen) * 4
    x[..., 5] *= 40
    x[1] = 0.0
    x[2] = x[2, :1]
    x[3] = torch.round(x[3] * 4) / 4  # quarter steps: midpoints and codes on ties
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
    int8 = torch.zeros((1, 32, 1, 66), dtype=torch.int8, device=DEVICE)
    with pytest.raises(ValueError, match="int4 pools"):
        encode_key_blocks(keys, one, int8, one - 1)
    pool = torch.zeros((1, 16, 1, INT4.row_len(64)), dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="at least 32"):
        encode_key_blocks(keys[:, :16], one, pool, one - 1)
    pool = torch.zeros((1, 32, 1, INT4.row_len(60)), dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="divisible by 8"):
        encode_key_blocks(keys[..., :60], one, pool, one - 1)

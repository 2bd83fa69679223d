"""kernels/kv_key_channels.py: int4 keys per channel over a block, byte for byte."""

import pytest
import torch

from kernels import kv_key_channels as channels
from kernels.kv_format import INT4

ROW = INT4.row_len(64)  # 35: 32 bytes of codes, 3 of the block's parameters


def region(rows: torch.Tensor, hd: int = 64) -> torch.Tensor:
    """Block rows [bs, nkv, row] -> head 0's parameter bytes, row after row."""
    return rows[:, 0, hd // 2:].reshape(-1)


def test_a_block_by_hand():
    """Channel 0 runs 0..15 over the block's 32 tokens, channel 1 is constant at 2.0,
    the rest are zero: M is 2.0 (channel 1's midpoint), channel 0 takes codes 0..15."""
    keys = torch.zeros(1, 32, 1, 64)
    keys[0, :, 0, 0] = torch.arange(32) / 2  # 0, 0.5, .. 15.5
    keys[0, :, 0, 1] = 2.0
    rows = channels.encode_key_block(keys, torch.tensor([32]), ROW)[0]
    params = region(rows)
    top, widest = params[:4].view(torch.float16).tolist()
    assert top == 7.75  # channel 0's midpoint, the largest
    assert widest == 7.75  # its half-width; its midpoint codes exactly (31 steps of 0.25)
    bits = ((params[4:].long()[:, None] >> torch.arange(8)) & 1).reshape(-1)
    field = lambda start, width: int((bits[start:start + width] << torch.arange(width)).sum())  # noqa: E731
    assert field(0, 6) == 31 + 31  # channel 0: m = 31
    assert field(6, 6) == 31 + 8  # channel 1: 2.0 / 0.25
    assert field(12, 6) == 31  # a zero channel
    assert field(6 * 64, 5) == 0  # channel 0 is the widest
    assert field(6 * 64 + 5, 5) == 31  # a constant channel: the narrowest range
    codes = torch.stack([rows[:, 0, :32] & 15, rows[:, 0, :32] >> 4], -1).reshape(32, 64)
    assert codes[[0, 1, 2, 31], 0].tolist() == [0, 0, 1, 15]  # 0, 0.5, 1.0, 15.5 in steps of 31/30
    decoded = channels.decode_key_block(rows[None], 64)[0, :, 0]
    assert (decoded[:, 0] - keys[0, :, 0, 0]).abs().max() <= 15.5 / 15 / 2 + 1e-6
    # 16 levels have no middle one: a constant channel is off by half its (least) step.
    least_step = 2 * 7.75 * channels.HALF_SCALES[31] / 15
    assert decoded[:, 1].sub(2.0).abs().max() <= least_step / 2 + 1e-6


@pytest.mark.parametrize("hd", [64, 80, 96, 128, 256])
def test_decode_is_within_half_a_step_of_each_channel(hd):
    torch.manual_seed(0)
    offsets, widths = torch.randn(hd) * 4, torch.rand(hd) * 3
    keys = (torch.randn(3, 32, 2, hd) * widths + offsets).half().float()
    rows = channels.encode_key_block(keys, torch.tensor([32, 32, 32]), INT4.row_len(hd))
    back = channels.decode_key_block(rows, hd)
    span = keys.amax(1) - keys.amin(1)  # [3, 2, hd]
    # A channel's step covers its range (and the midpoint's rounding) in 15 steps, its
    # half-width rounded up by at most 2^(1/8).
    bound = (span / 15 * 2 ** 0.125 + 0.25 * keys.abs().amax((1, 3))[..., None] / 31)
    assert ((back - keys).abs() <= bound[:, None] / 2 + 1e-4).all()


def test_rows_after_filled_are_ignored_and_left_zero():
    torch.manual_seed(1)
    keys = torch.randn(2, 32, 2, 64)
    noisy = keys.clone()
    noisy[0, 5:] = 1e4  # beyond filled: must not move the parameters
    a = channels.encode_key_block(keys, torch.tensor([5, 32]), ROW)
    b = channels.encode_key_block(noisy, torch.tensor([5, 32]), ROW)
    assert torch.equal(a, b)
    assert not a[0, 5:, :, :32].any()  # no codes where no token is


def test_a_block_needs_32_rows():
    with pytest.raises(ValueError, match="at least 32"):
        channels.encode_key_block(torch.zeros(1, 16, 1, 64), torch.tensor([16]), ROW)


def test_a_zero_block_decodes_to_zero():
    rows = channels.encode_key_block(torch.zeros(1, 32, 2, 64), torch.tensor([32]), ROW)
    assert not channels.decode_key_block(rows, 64).any()


def test_parameters_fit_the_spare_bytes_of_32_rows():
    for hd in (64, 80, 96, 128, 256):
        spare = INT4.row_len(hd) - hd // 2
        assert channels.param_bytes(hd) + 1 <= 32 * spare
    assert channels.HALF_SCALES[0] == 1.0 and channels.HALF_SCALES[8] == 0.5

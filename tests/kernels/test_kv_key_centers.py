"""kernels/kv_key_centers.py: int8 keys around their block's centers, byte for byte."""

import pytest
import torch

from kernels import kv_key_centers as centers
from kernels.kv_format import INT8

ROW = INT8.row_len(64)  # 67: 64 codes, the float16 scale, one byte of the block's centers


def test_a_block_by_hand():
    """Channel 0 runs 0..31.5 over the block's 64 tokens, channel 1 is constant at -2.0,
    the rest are zero: M is 15.75 (channel 0's midpoint), so channel 1's center codes
    -2.0 / (15.75 / 127) to -16, and the rows keep what the centers leave."""
    keys = torch.zeros(1, 64, 1, 64)
    keys[0, :, 0, 0] = torch.arange(64) / 2
    keys[0, :, 0, 1] = -2.0
    rows = centers.encode_key_block(keys, torch.tensor([64]), ROW)[0, :, 0]  # [64, 67]
    m, top = centers.center_codes(rows[:, None][None], 64)
    assert top.item() == 15.75
    assert m[0, 0, :3].tolist() == [127, -16, 0]
    # M's float16 bits, one a row in the sign bits of rows 0..15's scales.
    sign_bits = (rows[:16, 65] >> 7).long()
    assert int((sign_bits << torch.arange(16)).sum()) == int(
        torch.tensor(15.75, dtype=torch.float16).view(torch.int16))
    assert not (rows[16:, 65] >> 7).any()
    # Row 0: channel 0 sits 15.75 below its center, the largest residual: code -127.
    assert rows[0, :64].view(torch.int8)[0].item() == -127
    # The spare byte of row c is channel c's center code.
    assert rows[:, 66].view(torch.int8)[:3].tolist() == [127, -16, 0]
    decoded = centers.decode_key_block(rows[None, :, None], 64)[0, :, 0]
    unit = 15.75 / 127
    assert (decoded[:, 1] - -2.0).abs().max() <= unit / 2 + 1e-6
    scale = 15.75 / 127  # row 0's scale is at least its residual over 127
    assert (decoded[:, 0] - keys[0, :, 0, 0]).abs().max() <= scale / 2 * 1.001 + 1e-6


@pytest.mark.parametrize("hd", [64, 80, 96, 128, 256])
def test_decode_is_within_half_a_code_of_each_row(hd):
    torch.manual_seed(0)
    offsets, widths = torch.randn(hd) * 4, torch.rand(hd) * 3
    keys = (torch.randn(3, 64, 2, hd) * widths + offsets).half().float()
    rows = centers.encode_key_block(keys, torch.tensor([64, 64, 64]), INT8.row_len(hd))
    back = centers.decode_key_block(rows, hd)
    center = centers.key_centers(rows, hd)[:, None]  # [3, 1, 2, hd]
    # A row's step is its largest residual over 127 (rounded to float16).
    step = (keys - center).abs().amax(-1, keepdim=True) / 127 * (1 + 2 ** -10)
    assert ((back - keys).abs() <= step / 2 + 1e-5).all()


def test_centers_take_away_the_channels_offsets():
    """Keys with large per-channel offsets: the rows' residual, and with it their error,
    is what the offsets leave, not the offsets themselves."""
    torch.manual_seed(2)
    keys = (torch.randn(1, 64, 1, 64) * 0.1 + torch.randn(64) * 8).half().float()
    rows = centers.encode_key_block(keys, torch.tensor([64]), ROW)
    error = (centers.decode_key_block(rows, 64) - keys).abs().max()
    as_rows = INT8.decode(INT8.encode(keys))  # the rotation aside, a row's own scale
    plain = (as_rows - INT8.rotate(keys)).abs().max()
    assert error < plain / 10


def test_rows_after_filled_are_ignored_and_left_zero():
    torch.manual_seed(1)
    keys = torch.randn(2, 64, 2, 64)
    noisy = keys.clone()
    noisy[0, 5:] = 1e4  # beyond filled: must not move the centers
    a = centers.encode_key_block(keys, torch.tensor([5, 64]), ROW)
    b = centers.encode_key_block(noisy, torch.tensor([5, 64]), ROW)
    assert torch.equal(a, b)
    assert not a[0, 5:, :, :64].any()  # no codes where no token is
    assert not (a[0, 5:, :, 64:66].contiguous().view(torch.int16) & 0x7FFF).any()  # nor scales


def test_a_block_needs_64_rows_and_the_spare_bytes():
    with pytest.raises(ValueError, match="at least 64"):
        centers.encode_key_block(torch.zeros(1, 32, 1, 64), torch.tensor([32]), ROW)
    with pytest.raises(ValueError, match="need at least 67 bytes"):
        centers.encode_key_block(torch.zeros(1, 64, 1, 64), torch.tensor([64]), 66)


def test_a_zero_block_decodes_to_zero():
    rows = centers.encode_key_block(torch.zeros(1, 64, 2, 64), torch.tensor([64]), ROW)
    assert not centers.decode_key_block(rows, 64).any()


@pytest.mark.parametrize("hd", [64, 80, 128, 256])
def test_rows_keep_a_center_code_per_channel(hd):
    assert INT8.row_len(hd) == hd + 2 + -(-hd // 64)
    assert INT8.head_size(INT8.row_len(hd)) == hd
    assert centers.MIN_BLOCK_SIZE * centers.spare_bytes(hd) >= hd

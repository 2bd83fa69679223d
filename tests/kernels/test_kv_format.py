"""kernels/kv_format.py: the rows each KV format keeps, byte for byte."""

import pytest
import torch

from kernels.kv_format import (
    FLOAT16,
    FP8,
    INT4,
    INT8,
    KV_FORMAT_NAMES,
    format_named,
    format_of,
    int4_group,
    rotate,
    rotation_block,
)


def test_names_and_tags_round_trip():
    for name in KV_FORMAT_NAMES:
        fmt = format_named(name)
        pool = torch.zeros(2, 3, fmt.row_len(64), dtype=fmt.storage)
        assert format_of(pool) is fmt
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        format_named("q8_0")


@pytest.mark.parametrize("hd", [64, 80, 96, 128, 256])
def test_row_lengths(hd):
    assert FLOAT16.row_len(hd) == hd
    assert FP8.row_len(hd) == hd + 2
    # int8: codes, a scale, and the byte(s) a key row's block keeps its centers in
    # (kernels/kv_key_centers.py), one per 64 elements.
    assert INT8.row_len(hd) == {64: 67, 80: 84, 96: 100, 128: 132, 256: 262}[hd]
    # int4: the longer of a value row (codes, a scale per group) and a key row (codes and
    # its share of the block's parameters, kernels/kv_key_channels.py).
    assert hd // 2 + 2 * (hd // int4_group(hd)) <= INT4.row_len(hd)
    assert INT4.row_len(hd) == {64: 35, 80: 44, 96: 53, 128: 70, 256: 140}[hd]
    for fmt in (INT8, FP8, INT4):
        assert fmt.head_size(fmt.row_len(hd)) == hd


def test_bytes_per_token_against_float16():
    for hd in (64, 128, 256):
        assert INT8.row_bytes(hd) / FLOAT16.row_bytes(hd) <= 0.53
        assert INT4.row_bytes(hd) / FLOAT16.row_bytes(hd) <= 0.28


def test_int8_row_layout_by_hand():
    row = torch.tensor([[1.0, -2.0, 0.5, 0.0]])
    stored = INT8.encode(INT8.rotate(row))  # rotated twice: the row itself is stored
    assert stored.dtype == torch.int8 and stored.shape == (1, 7)  # and a spare byte
    assert stored[0, 6].item() == 0
    scale = torch.tensor(2.0 / 127).to(torch.float16)
    assert stored[0, 4:6].view(torch.float16).item() == scale.item()
    assert stored[0, :4].tolist() == torch.round(row[0] / scale.float()).to(torch.int8).tolist()
    assert stored[0, 1].item() == -127


def test_int4_row_layout_by_hand():
    row = torch.zeros(1, 64)
    row[0, 0] = 7.0
    stored = INT4.encode(INT4.rotate(row))  # rotated twice: the row itself is stored
    codes = torch.stack([stored[0, :32] & 15, stored[0, :32] >> 4], -1).reshape(64)
    # q4_0's signed scale: the largest element takes the code -8 (stored 0).
    assert codes[0].item() == 0 and (codes[1:] == 8).all()
    assert stored[0, 32:34].view(torch.float16).item() == -0.875
    assert stored.shape == (1, 35) and stored[0, 34].item() == 0  # the key rows' length


def test_int4_scale_takes_the_largest_magnitude_with_its_sign_the_positive_on_a_tie():
    rows = torch.zeros(3, 64)
    rows[0, 5], rows[0, 9] = -4.0, 2.0  # the negative one is larger
    rows[1, 5], rows[1, 9] = -4.0, 4.0  # a tie: the positive one
    rows[2, 5], rows[2, 9] = 1.0, -0.5
    stored = INT4.encode(INT4.rotate(rows))
    assert stored[:, 32:34].contiguous().view(torch.float16).flatten().tolist() == [
        0.5, -0.5, -0.125]
    codes = torch.stack([stored[:, :32] & 15, stored[:, :32] >> 4], -1).reshape(3, 64)
    assert codes[0, 5].item() == 0 and codes[0, 9].item() == 12  # -8 and 4
    assert codes[1, 9].item() == 0 and codes[1, 5].item() == 15  # -8 and +8 clamped to 7
    assert codes[2, 5].item() == 0 and codes[2, 9].item() == 12


@pytest.mark.parametrize("fmt,tol", [(INT8, 0.01), (FP8, 0.07), (INT4, 0.2)])
@pytest.mark.parametrize("hd", [64, 128, 96])
def test_decode_inverts_encode_within_the_step(fmt, tol, hd):
    torch.manual_seed(0)
    x = torch.randn(5, 3, hd) * 4
    back = fmt.rotate(fmt.decode(fmt.encode(x)))
    err = (back - x).norm(dim=-1) / x.norm(dim=-1)
    assert err.max().item() < tol


def test_zero_rows_stay_zero():
    for fmt in (INT8, FP8, INT4):
        assert (fmt.decode(fmt.encode(torch.zeros(2, 64))) == 0).all()


@pytest.mark.parametrize("hd", [64, 96, 128, 256])
def test_rotation_is_orthogonal_and_its_own_inverse(hd):
    torch.manual_seed(1)
    q, k = torch.randn(4, hd, dtype=torch.float64), torch.randn(4, hd, dtype=torch.float64)
    assert torch.allclose(rotate(rotate(q)), q, atol=1e-12)
    assert torch.allclose((rotate(q) * rotate(k)).sum(-1), (q * k).sum(-1), atol=1e-12)
    assert rotation_block(hd) == {64: 64, 96: 32, 128: 128, 256: 256}[hd]

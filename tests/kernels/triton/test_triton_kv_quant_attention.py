"""The Triton attention kernels reading int8, fp8 and int4 pools in place, against the
PyTorch reference (and, with sinks, the float64 naive oracle) run over float pools that
hold `format.decode_keys` / `format.decode` of the same bytes
(tests/kernels/triton/kv_quant_cases.py); the backend's rotation against the reference
over the unrotated values. int8 and int4 pools have blocks of 64 and 32 tokens or more
(their keys are encoded a block at a time: int8's around each channel's center over the
block, int4's per channel): their cases take those where fp8 takes 16, and their own cases
cross block boundaries in every kernel, over keys with per-channel offsets (far-off
centers). Interpreted on CPU, compiled on CUDA."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from kernels.key_stage import KeyStage
from kernels.kv_format import format_named
from kernels.kv_key_channels import HALF_SCALES
from kernels.triton.backend import TritonBackend
from kernels.triton.decode import paged_block_offsets, paged_decode, slot_offsets
from kernels.triton.kv_quant import _half_scale, _int4_keys, _int8_centers, as_bytes, key_scale
from kernels.triton.prefill import paged_prefill
from kernels.triton.shared_prefix import find_shared_prefix_groups, shared_prefix_decode
from tests.kernels.paged_cases import (
    DEVICE,
    DTYPES,
    assert_matches,
    make_case,
    naive_attention,
    reference_attention,
)
from tests.kernels.reference.test_reference_sinks import sinks_for
from tests.kernels.triton.kv_quant_cases import (
    QUANTIZED,
    block_size_for,
    quantize_case,
    quantized_case,
)

# (seq_lens, num_kv_heads, group, head_size, block_size, num_splits): GQA 1 / 3 / 4 / 8,
# head 64 / 80 (int4: one group of 80, rotated in blocks of 16) / 128 / 256, contexts
# on and around block boundaries, one split and split-K.
DECODE_CASES = [
    ([1, 15, 16, 17], 2, 1, 64, 16, 1),
    ([33, 300], 1, 4, 128, 16, 3),
    ([17, 64], 2, 8, 256, 32, 2),
    ([40, 31, 1], 1, 3, 80, 16, 1),
]


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("seq_lens,nkv,group,head_size,block_size,num_splits", DECODE_CASES,
                         ids=[f"case{i}" for i in range(len(DECODE_CASES))])
def test_decode_reads_quantized_pools(name, seq_lens, nkv, group, head_size, block_size,
                                      num_splits):
    case, oracle = quantized_case(name, seq_lens, [1] * len(seq_lens), num_kv_heads=nkv,
                                  group=group, head_size=head_size,
                                  block_size=block_size_for(name, block_size))
    out = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                       num_splits=num_splits)
    assert_matches(out, reference_attention(oracle))


# One case per dtype (bfloat16 runs compiled only): each case compiles its own kernels.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", QUANTIZED)
def test_decode_in_each_query_dtype(name, dtype):
    case, oracle = quantized_case(name, [16, 200], [1, 1], num_kv_heads=2, group=4,
                                  head_size=128, block_size=block_size_for(name, 16),
                                  dtype=dtype, seed=8)
    out = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                       num_splits=2)
    assert_matches(out, reference_attention(oracle))


def _close_to_naive(out, oracle, window, softcap, sinks):
    expected = naive_attention(oracle, window, softcap, sinks)
    torch.testing.assert_close(out.double().cpu(), expected.double().cpu(), atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize("name", QUANTIZED)
def test_decode_with_window_softcap_and_sinks(name):
    case, oracle = quantized_case(name, [1, 17, 33, 300], [1] * 4, num_kv_heads=2, group=2,
                                  head_size=64, block_size=block_size_for(name, 16), seed=1)
    sinks = sinks_for(4).to(DEVICE)
    out = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                       num_splits=3, sliding_window=17, logit_softcap=5.0, sinks=sinks)
    _close_to_naive(out, oracle, 17, 5.0, sinks)


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("seq_lens,q_lens,nkv,group,head_size", [
    ([17, 100, 33], [17, 30, 1], 2, 2, 64),  # a prompt, a chunk after a prefix, a decode row
    ([16, 48], [16, 16], 1, 4, 128),
])
def test_prefill_reads_quantized_pools(name, seq_lens, q_lens, nkv, group, head_size):
    case, oracle = quantized_case(name, seq_lens, q_lens, num_kv_heads=nkv, group=group,
                                  head_size=head_size, block_size=block_size_for(name, 16),
                                  seed=2)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale)
    assert_matches(out, reference_attention(oracle))


@pytest.mark.parametrize("name", QUANTIZED)
def test_prefill_with_window_softcap_and_sinks(name):
    case, oracle = quantized_case(name, [17, 100, 33], [17, 30, 1], num_kv_heads=2, group=2,
                                  head_size=64, block_size=block_size_for(name, 16), seed=3)
    sinks = sinks_for(4).to(DEVICE)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                        sliding_window=40, logit_softcap=5.0, sinks=sinks)
    _close_to_naive(out, oracle, 40, 5.0, sinks)


@pytest.mark.parametrize("name", QUANTIZED)
def test_shared_prefix_decode_reads_quantized_pools(name):
    # Candidates 0, 2 and 3 share a 3-block prompt; 1 is alone.
    bs = block_size_for(name, 16)
    lens = {16: [53, 23, 49, 64], 32: [101, 45, 97, 128], 64: [197, 71, 193, 256]}[bs]
    case, oracle = quantized_case(name, lens, [1] * 4, num_kv_heads=2, group=3, head_size=64,
                                  block_size=bs, shared={2: (0, 3), 3: (0, 3)}, seed=4)
    groups = find_shared_prefix_groups(case.meta.block_tables, case.meta.seq_lens, bs)
    assert [g.seq_indices for g in groups] == [(0, 2, 3)]
    out = shared_prefix_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                               groups, num_splits=2, logit_softcap=5.0)
    assert_matches(out, reference_attention(oracle, logit_softcap=5.0))


@pytest.mark.parametrize("name", QUANTIZED)
def test_backend_writes_then_attends_a_mixed_batch(name):
    """Through TritonBackend as the engine calls it: the step's new K/V written into the
    pool (rotated there), then a prompt chunk and a decode row attended (the query rotated
    and the output rotated back), against the reference over the decoded values in the
    original space. int4: the write takes the values, the pool's key stage the keys of the
    blocks written (the block whose earlier rows it never saw encoded again from their
    decoded rows)."""
    fmt = format_named(name)
    bs = block_size_for(name, 16)
    base = make_case([40, 21], [8, 1], num_kv_heads=2, group=2, head_size=64, block_size=bs,
                     seed=5)
    meta = base.meta
    # Each sequence's new tokens are its last q_len positions.
    slots = []
    for i, (seq_len, q_len) in enumerate(zip([40, 21], [8, 1], strict=True)):
        for pos in range(seq_len - q_len, seq_len):
            slots.append(int(meta.block_tables[i, pos // bs]) * bs + pos % bs)
    slots = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    gen = torch.Generator().manual_seed(6)
    new_k = torch.randn((9, 2, 64), generator=gen).to(DEVICE)
    new_v = torch.randn((9, 2, 64), generator=gen).to(DEVICE)
    if fmt.keys_by_block:
        exact = base.k_cache.clone()
        exact.view(-1, 2, 64)[slots] = new_k
        base = dataclasses.replace(base, k_cache=exact)
    case, _ = quantize_case(base, fmt)
    backend = TritonBackend(shared_prefix=True, min_shared_blocks=1)
    if fmt.keys_by_block:  # a pool [layers, 2, ...] for the stage
        pool = torch.stack([case.k_cache, case.v_cache])[None]
        backend.key_stages.attach(KeyStage(pool, slots=2))
        case = dataclasses.replace(case, k_cache=pool[0, 0], v_cache=pool[0, 1])
    backend.write_kv(new_k, new_v, case.k_cache, case.v_cache, slots)
    out = backend.attention(case.query, case.k_cache, case.v_cache, meta, case.scale)
    # Unrotated values: rotate is its own inverse.
    keys = fmt.rotate(fmt.decode_keys(case.k_cache))
    values = fmt.rotate(fmt.decode(case.v_cache))
    oracle = type(base)(base.query, keys, values, meta, base.scale)
    assert_matches(out, reference_attention(oracle))
    # The decoded pool is near the float values it encodes (the write went where it should).
    # (Back in the original space a row's rounding errors mix: bounds of a few steps.)
    key_bound = {"int8": 0.03, "fp8": 0.3, "int4": 0.8}[name]
    assert (keys.reshape(-1, 2, 64)[slots] - new_k).abs().max().item() < key_bound
    value_bound = {"int8": 0.05, "fp8": 0.3, "int4": 0.8}[name]
    assert (values.reshape(-1, 2, 64)[slots] - new_v).abs().max().item() < value_bound


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_backend_shared_prefix_decode_over_a_quantized_pool(name, monkeypatch):
    fmt = format_named(name)
    bs = block_size_for(name, 16)
    # Two shared blocks, then each its own.
    base = make_case([2 * bs + 6, 2 * bs + 8], [1, 1], num_kv_heads=1, group=2,
                     head_size=128, block_size=bs, shared={1: (0, 2)}, seed=7)
    case, _ = quantize_case(base, fmt)
    calls = []
    monkeypatch.setattr("kernels.triton.backend.shared_prefix_decode",
                        lambda *a, **k: calls.append(1) or shared_prefix_decode(*a, **k))
    out = TritonBackend(shared_prefix=True, min_shared_blocks=2).attention(
        case.query, case.k_cache, case.v_cache, case.meta, case.scale)
    assert calls == [1]
    oracle = type(base)(base.query, fmt.rotate(fmt.decode_keys(case.k_cache)),
                        fmt.rotate(fmt.decode(case.v_cache)), base.meta, base.scale)
    assert_matches(out, reference_attention(oracle))


def test_quantized_pool_of_the_wrong_head_size_is_refused():
    case, _ = quantized_case("int8", [17], [1], num_kv_heads=1, group=2, head_size=64,
                             block_size=64)
    with pytest.raises(ValueError, match="do not fit KV heads"):
        paged_decode(case.query[:, :, :62].contiguous(), case.k_cache, case.v_cache,
                     case.meta, case.scale)
    with pytest.raises(ValueError, match="v_cache dtype"):
        paged_decode(case.query, case.k_cache, case.v_cache.view(torch.uint8), case.meta,
                     case.scale)


def test_kernel_bench_cells_over_quantized_pools():
    """`folio bench kernels --kv int8,fp8` (the rows of `make gpu-check`): the cell's
    runner decodes over the encoded pools."""
    from kernels.bench import Shape, _quantized_runner, parse_args

    assert parse_args(["--kv", "int8,fp8"]).kv_formats == ("int8", "fp8")
    assert parse_args([]).kv_formats == ()
    with pytest.raises(SystemExit):
        parse_args(["--kv", "float16"])
    base = make_case([40, 17], [1, 1], num_kv_heads=2, group=4, head_size=64, block_size=16)
    _, oracle = quantize_case(base, format_named("fp8"))
    run = _quantized_runner("fp8", base.scale)(base.query, base.k_cache, base.v_cache,
                                               base.meta, Shape("test", 8, 2, 64), 40)
    assert_matches(run(), reference_attention(oracle))


# int4: keys per channel over a block's tokens, so a K tile decodes with the parameters of
# whichever blocks it spans.


@triton.jit
def _key_tile_probe(k_ptr, bt_ptr, out_ptr, lo, hi, kvh, stride_kb, stride_kt, stride_kh,
                    HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                    HEAD_PAD: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = lo + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hi
    offs_d = tl.arange(0, HEAD_PAD)
    mask = n_mask[:, None] & (offs_d < HEAD_SIZE)[None, :]
    blk = paged_block_offsets(bt_ptr, offs_n, n_mask, stride_kb, BLOCK_SIZE)
    tok = slot_offsets(blk, offs_n, stride_kt, BLOCK_SIZE)
    keys = _int4_keys(k_ptr + kvh * stride_kh, tok, blk, stride_kt, offs_d, n_mask, mask,
                      HEAD_SIZE)
    tl.store(out_ptr + (offs_n - lo)[:, None] * HEAD_SIZE + offs_d[None, :], keys, mask=mask)


def assert_key_tiles_decode_as_decode_keys(name: str, probe, head_size: int, block_size: int,
                                           seed: int, **launch) -> None:
    """Tiles starting anywhere in a block and spanning several, read by `probe` (a key
    tile's decode), bit for bit as `decode_keys`: keys with per-channel offsets, a wide
    channel, a block of zeros and one filled part way (the key stage's open block), in
    a shuffled block table."""
    fmt = format_named(name)
    gen = torch.Generator().manual_seed(seed)
    nkv, blocks = 2, 4
    exact = torch.randn((blocks, block_size, nkv, head_size), generator=gen)
    exact += torch.randn((1, 1, nkv, head_size), generator=gen) * 4  # per-channel offsets
    exact[..., 3] *= 30  # a wide channel
    exact[2] = 0.0
    pool = fmt.encode_keys(exact)
    pool[3] = fmt.encode_keys(exact[3:], torch.tensor([block_size // 2 + 3]))[0]
    if name == "int8":  # M's bits are there, which a scale read with its sign would flip
        assert (pool.view(torch.uint8)[[0, 1, 3], :16, :, head_size + 1] >= 0x80).any()
    pool = pool.to(DEVICE)
    table = torch.tensor([1, 3, 2, 0], dtype=torch.int32, device=DEVICE)  # shuffled
    expected = fmt.decode_keys(pool.cpu())[table.long().cpu()].reshape(-1, nkv, head_size)
    b = as_bytes(pool)
    seq_len = blocks * block_size
    for lo, block_n in [(0, 64), (block_size - 5, 64), (block_size + 1, 32), (seq_len - 7, 16)]:
        hi = min(lo + block_n, seq_len)
        for kvh in range(nkv):
            out = torch.full((block_n, head_size), float("nan"), device=DEVICE)
            probe[(1,)](b, table, out, lo, hi, kvh, b.stride(0), b.stride(1), b.stride(2),
                        HEAD_SIZE=head_size, BLOCK_SIZE=block_size,
                        HEAD_PAD=triton.next_power_of_2(head_size), BLOCK_N=block_n, **launch)
            assert torch.equal(out[:hi - lo].cpu(), expected[lo:hi, kvh])


@pytest.mark.parametrize("head_size,block_size", [(64, 32), (80, 32), (128, 64), (256, 32)])
def test_int4_key_tiles_decode_as_decode_keys(head_size, block_size):
    """int4 keys per channel: a block of zeros has M = W = 0."""
    assert_key_tiles_decode_as_decode_keys("int4", _key_tile_probe, head_size, block_size, 11)


@triton.jit
def _half_scale_probe(s_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, _half_scale(tl.load(s_ptr + offs)))


def test_int4_half_scales_are_the_table():
    codes = torch.arange(len(HALF_SCALES), dtype=torch.int32, device=DEVICE)
    out = torch.empty(len(HALF_SCALES), dtype=torch.float32, device=DEVICE)
    _half_scale_probe[(1,)](codes, out, N=len(HALF_SCALES))
    assert torch.equal(out.cpu(), torch.tensor(HALF_SCALES, dtype=torch.float32))


BOUNDARIES = [31, 32, 33, 63, 64, 65]


INT8_BOUNDARIES = [63, 64, 65, 127, 128, 129, 130]
# Keys encoded a block at a time: int4 per channel, int8 around its centers (its keys with
# per-channel offsets, so that a reader dropping the centers is far off).
KEY_OFFSETS = {"int4": 0.0, "int8": 3.0}


@pytest.mark.parametrize("name,seq_lens,nkv,group,head_size,block_size,num_splits", [
    ("int4", BOUNDARIES, 2, 4, 64, 32, 1),
    ("int4", BOUNDARIES, 1, 2, 64, 32, 3),  # splits of 64 tokens: some start mid-block
    ("int4", [31, 63, 64, 65, 129], 1, 3, 128, 64, 2),
    ("int4", [33, 65], 2, 2, 80, 32, 1),
    ("int8", INT8_BOUNDARIES, 2, 4, 64, 64, 1),
    ("int8", [63, 64, 65, 130, 200], 1, 2, 64, 64, 3),  # splits starting mid-block
    ("int8", [63, 127, 128, 129, 257], 1, 3, 128, 128, 2),
    ("int8", [65, 130], 2, 2, 96, 64, 1),
], ids=["int4-bs32", "int4-bs32-splits", "int4-bs64-h128", "int4-h80", "int8-bs64",
        "int8-bs64-splits", "int8-bs128-h128", "int8-h96"])
def test_decode_across_block_boundaries(name, seq_lens, nkv, group, head_size, block_size,
                                        num_splits):
    case, oracle = quantized_case(name, seq_lens, [1] * len(seq_lens), num_kv_heads=nkv,
                                  group=group, head_size=head_size, block_size=block_size,
                                  key_offsets=KEY_OFFSETS[name], seed=12)
    out = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                       num_splits=num_splits)
    assert_matches(out, reference_attention(oracle))


@pytest.mark.parametrize("name,seq_lens,q_lens,nkv,group,head_size,block_size", [
    # A whole prompt, a chunk after a prefix starting mid-block, decode rows at boundaries.
    ("int4", [33, 65, 64, 31, 96], [33, 34, 1, 1, 1], 2, 2, 64, 32),
    ("int4", [65, 130], [65, 3], 1, 4, 128, 64),
    ("int8", [65, 130, 64, 63, 129], [65, 67, 1, 1, 1], 2, 2, 64, 64),
    ("int8", [130, 257], [130, 3], 1, 4, 128, 128),
], ids=["int4-bs32", "int4-bs64-h128", "int8-bs64", "int8-bs128-h128"])
def test_mixed_prefill_across_block_boundaries(name, seq_lens, q_lens, nkv, group, head_size,
                                               block_size):
    case, oracle = quantized_case(name, seq_lens, q_lens, num_kv_heads=nkv, group=group,
                                  head_size=head_size, block_size=block_size,
                                  key_offsets=KEY_OFFSETS[name], seed=13)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale)
    assert_matches(out, reference_attention(oracle))


def test_int4_prefill_window_starting_mid_block():
    case, oracle = quantized_case("int4", [65, 100], [65, 7], num_kv_heads=1, group=2,
                                  head_size=64, block_size=32, seed=14)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                        sliding_window=21, logit_softcap=5.0)
    _close_to_naive(out, oracle, 21, 5.0, None)


def test_int4_shared_prefix_decode_in_64_token_blocks():
    # 0 and 2 share two 64-token blocks; 1 shares one with them, then goes its own way.
    case, oracle = quantized_case("int4", [150, 65, 129], [1] * 3, num_kv_heads=2, group=2,
                                  head_size=64, block_size=64, shared={1: (0, 1), 2: (0, 2)},
                                  seed=15)
    groups = find_shared_prefix_groups(case.meta.block_tables, case.meta.seq_lens, 64)
    assert groups
    out = shared_prefix_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                               groups, num_splits=1)
    assert_matches(out, reference_attention(oracle))


# int8: keys around their block's centers (kernels/kv_key_centers.py), so a K tile reads
# the centers, and M from the first rows' scale signs, of whichever blocks it spans.


@triton.jit
def _int8_key_tile_probe(k_ptr, bt_ptr, out_ptr, lo, hi, kvh, stride_kb, stride_kt,
                         stride_kh, HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                         HEAD_PAD: tl.constexpr, BLOCK_N: tl.constexpr):
    """The keys the scores of key_scores stand for, decoded as the decoder does: center
    (m * unit) plus code * |scale|."""
    offs_n = lo + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hi
    offs_d = tl.arange(0, HEAD_PAD)
    mask = n_mask[:, None] & (offs_d < HEAD_SIZE)[None, :]
    k_head = k_ptr + kvh * stride_kh
    blk = paged_block_offsets(bt_ptr, offs_n, n_mask, stride_kb, BLOCK_SIZE)
    tok = slot_offsets(blk, offs_n, stride_kt, BLOCK_SIZE)
    m, unit = _int8_centers(k_head, blk, stride_kt, offs_d, n_mask, mask, HEAD_SIZE)
    codes = tl.load(k_head + tok[:, None] + offs_d[None, :], mask=mask, other=0)
    codes = codes.to(tl.int8, bitcast=True).to(tl.float32)
    scale = key_scale(k_head + tok + HEAD_SIZE, n_mask)
    keys = m * unit[:, None] + codes * scale[:, None]
    tl.store(out_ptr + (offs_n - lo)[:, None] * HEAD_SIZE + offs_d[None, :], keys, mask=mask)


@pytest.mark.parametrize("head_size,block_size", [(64, 64), (96, 64), (128, 128), (256, 64)])
def test_int8_key_tiles_decode_as_decode_keys(head_size, block_size):
    """int8 keys around their centers: M's bits in the first rows' scale signs; a block
    of zeros has M = 0."""
    assert_key_tiles_decode_as_decode_keys("int8", _int8_key_tile_probe, head_size,
                                           block_size, 21, enable_fp_fusion=False)


def test_int8_prefill_window_starting_mid_block():
    case, oracle = quantized_case("int8", [130, 200], [130, 7], num_kv_heads=1, group=2,
                                  head_size=64, block_size=64, key_offsets=3.0, seed=24)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                        sliding_window=41, logit_softcap=5.0)
    _close_to_naive(out, oracle, 41, 5.0, None)


def test_int8_shared_prefix_decode_in_128_token_blocks():
    # 0 and 2 share two 128-token blocks; 1 shares one with them, then goes its own way.
    case, oracle = quantized_case("int8", [300, 129, 257], [1] * 3, num_kv_heads=2, group=2,
                                  head_size=64, block_size=128,
                                  shared={1: (0, 1), 2: (0, 2)}, key_offsets=3.0, seed=25)
    groups = find_shared_prefix_groups(case.meta.block_tables, case.meta.seq_lens, 128)
    assert groups
    out = shared_prefix_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                               groups, num_splits=1)
    assert_matches(out, reference_attention(oracle))


def test_int8_scores_need_the_centers():
    """The oracle tells a reader that drops the centers (or reads a scale with its sign):
    over keys with per-channel offsets, attention over the decoded keys without their
    centers is far from attention over the keys."""
    case, oracle = quantized_case("int8", [130], [1], num_kv_heads=1, group=2, head_size=64,
                                  block_size=64, key_offsets=3.0, seed=26)
    fmt = format_named("int8")
    pool = case.k_cache.view(torch.uint8).cpu()
    hd = fmt.head_size(pool.shape[-1])
    codes = pool[..., :hd].contiguous().view(torch.int8).float()
    scale = pool[..., hd:hd + 2].contiguous().view(torch.int16) & 0x7FFF
    no_centers = codes * scale.view(torch.float16).float()
    wrong = dataclasses.replace(oracle, k_cache=no_centers.to(oracle.k_cache))
    out = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale)
    assert_matches(out, reference_attention(oracle))
    assert (reference_attention(wrong) - out).abs().max().item() > 1e-2

"""The C++ paged attention and KV write over quantized pools (int8, fp8, int4:
kernels/kv_format.py) against the PyTorch reference run over the same pools decoded to
float32 (the query rotated before and the output rotated back after, as the op does
inside): GQA ratios, head sizes, block-boundary lengths, windows, soft-caps, sinks, shared
prefixes, mixed prefill and decode, on every ISA path; the write against `encode`. An
int4 pool's keys are a block's channels (kernels/kv_key_channels.py): its pools are
encoded a block at a time (`encode_keys`), in blocks of 32 slots or more, and the write
leaves its key rows alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels.cpu
from engine.layers.native import native_pool
from kernels import allocate_kv_cache
from kernels.cpu.attention import CpuBackend
from kernels.key_stage import KeyStage
from kernels.kv_format import FP8, INT4, INT8, int4_group, rotate
from kernels.kv_key_channels import HALF_SCALES, key_params
from kernels.reference.backend import TorchBackend
from tests.kernels.paged_cases import make_case
from tests.kernels.reference.test_reference_sinks import sinks_for

FORMATS = {"int8": INT8, "fp8": FP8, "int4": INT4}
# The kernel reads the same decoded values as the reference; int4 adds the query's and the
# output's rotations (a transform per head in another summation order); int8's decode rows
# on AVX-512 take their scores from the query as int16 codes (a step of 1/32767 of its
# largest element: about 1e-5 of a score, against int8's own 1/254).
TOLERANCE = {"int8": 1e-4, "fp8": 1e-5, "int4": 3e-5}


@pytest.fixture(params=list(FORMATS))
def fmt(request):
    return FORMATS[request.param]


def block_sizes(fmt) -> tuple[int, ...]:
    """The block sizes a format's cases run at: the engine's default 16, and an int8 or
    int4 pool's smallest (its key blocks' parameters need min_block_size rows) and one
    twice that."""
    least = fmt.min_block_size
    return (least, 2 * least) if fmt.keys_by_block else (16,)


def quantized(case, fmt):
    """The case with its pools encoded into fmt's storage, in the same memory order (a
    head-major case stays head-major), and the case over those pools decoded (the
    reference's input): keys a whole block at a time (int4's per channel)."""
    num_blocks, block_size, nkv, hd = case.k_cache.shape
    head_major = case.k_cache.stride(2) > case.k_cache.stride(0)
    pools = allocate_kv_cache(1, num_blocks, block_size, nkv, hd, fmt.storage, "cpu",
                              head_major)[0]
    pools[0].copy_(fmt.encode_keys(case.k_cache))
    pools[1].copy_(fmt.encode(case.v_cache))
    stored = dataclasses.replace(case, k_cache=pools[0], v_cache=pools[1])
    decoded = dataclasses.replace(case, k_cache=fmt.decode_keys(pools[0]),
                                  v_cache=fmt.decode(pools[1]))
    return stored, decoded


def check(case, fmt, window=None, softcap=None, sinks=None):
    stored, decoded = quantized(case, fmt)
    query = case.query.clone()
    out = CpuBackend().attention(stored.query, stored.k_cache, stored.v_cache, stored.meta,
                                 stored.scale, sliding_window=window, logit_softcap=softcap,
                                 sinks=sinks)
    assert torch.equal(case.query, query)  # int4's rotation works on a copy
    ref = TorchBackend().attention(fmt.rotate(decoded.query), decoded.k_cache,
                                   decoded.v_cache, decoded.meta, decoded.scale,
                                   sliding_window=window, logit_softcap=softcap, sinks=sinks)
    tol = TOLERANCE[fmt.name]
    torch.testing.assert_close(out, fmt.rotate(ref), rtol=tol, atol=tol)


@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_mixed_prefill_and_decode_at_block_boundaries(isa_path, fmt, head_size, group):
    for bs in block_sizes(fmt):
        case = make_case([bs - 1, bs, bs + 1, 2 * bs + 1, 4 * bs + 6], [1, 16, 5, 1, 40],
                         num_kv_heads=2, group=group, head_size=head_size, block_size=bs,
                         seed=group, head_major=group != 4)
        check(case, fmt)


# Lengths as (blocks, slots past them): a block's last slot, a full block, the next
# block's first slot, two blocks' worth around, and a long mix.
BOUNDARIES = [[(1, -1)], [(1, 0)], [(1, 1)], [(2, 1)], [(2, -1), (2, 0), (2, 1)],
              [(1, -1), (1, 0), (1, 1), (2, 0), (2, 1), (18, 12)]]


@pytest.mark.parametrize("lengths", BOUNDARIES)
def test_decode_at_block_boundaries(isa_path, fmt, lengths):
    for bs in block_sizes(fmt):
        seq_lens = [blocks * bs + past for blocks, past in lengths]
        case = make_case(seq_lens, [1] * len(seq_lens), num_kv_heads=2, group=4,
                         head_size=64, block_size=bs, head_major=True)
        check(case, fmt)


@pytest.mark.parametrize("head_size", [80, 96])
def test_other_head_sizes(isa_path, fmt, head_size):
    """A head size that is no multiple of 64: int4 keeps one scale for the whole head and
    rotates blocks of 16 (80) or 32 (96) elements."""
    bs = block_sizes(fmt)[0]
    case = make_case([40, 57, 20, 2 * bs + 1], [1, 23, 1, bs + 3], num_kv_heads=2, group=4,
                     head_size=head_size, block_size=bs, seed=head_size)
    check(case, fmt)


@pytest.mark.parametrize("window", [1, 17, 40])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_sliding_window_softcap_and_sinks(isa_path, fmt, window, softcap):
    bs = block_sizes(fmt)[0]
    case = make_case([33, 100, 17, 64], [1, 30, 17, 1], num_kv_heads=2, group=4, head_size=64,
                     block_size=bs, seed=window, head_major=True)
    check(case, fmt, window, softcap)
    check(case, fmt, window, softcap, sinks=sinks_for(8))


@pytest.mark.parametrize("threads", [1, 2])
def test_shared_prefixes_and_split_keys(isa_path, fmt, threads):
    """Candidates sharing a prompt's blocks (read once for all of them), and one long
    sequence whose keys split over the threads, merged by log-sum-exp."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        bs = block_sizes(fmt)[0]
        lengths = [512 + bs * (i % 3) + i for i in range(4)]
        shared = make_case(lengths, [1] * 4, num_kv_heads=2, group=8, head_size=64,
                           block_size=bs, shared={i: (0, 512 // bs) for i in range(1, 4)},
                           seed=3)
        check(shared, fmt)
        check(shared, fmt, softcap=4.0, sinks=sinks_for(16))
        long = make_case([1500], [1], num_kv_heads=2, group=4, head_size=128, block_size=bs,
                         head_major=True)
        check(long, fmt)
        check(long, fmt, window=700)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("times", [1, 2])
def test_blocks_of_several_sub_blocks(isa_path, fmt, times):
    """Blocks of 32 and 64 slots (int4's, int8's 64 and 128; any pool's where
    EngineConfig.block_size says so) take the tiles 16 slots at a time (an int8 or int4 key
    block decoded once for them all):
    prefill and decode rows around a sub-block, a block and a span of 256 keys, windows
    starting inside a sub-block, soft-caps, sinks, shared prompts and split keys."""
    bs = times * max(32, fmt.min_block_size)
    for group in (2, 8):
        case = make_case([bs - 1, bs + 17, 2 * bs + 1, 257, 600], [1, 16, 5, 1, 40],
                         num_kv_heads=2, group=group, head_size=64, block_size=bs,
                         seed=group + bs, head_major=group == 8)
        check(case, fmt)
        check(case, fmt, window=40, softcap=5.0, sinks=sinks_for(2 * group))
        check(case, fmt, window=7)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        shared = make_case([512 + bs * (i % 3) + i for i in range(4)], [1] * 4,
                           num_kv_heads=2, group=8, head_size=64, block_size=bs,
                           shared={i: (0, 512 // bs) for i in range(1, 4)}, seed=3)
        check(shared, fmt, softcap=4.0, sinks=sinks_for(16))
        long = make_case([1500], [1], num_kv_heads=2, group=4, head_size=128, block_size=bs,
                         head_major=True)
        check(long, fmt, window=700)
    finally:
        torch.set_num_threads(previous)


def codes_and_scales(stored: torch.Tensor, fmt, hd: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes as int or e4m3 steps, scales as float, the bytes after the scales) of rows
    [..., row_len]."""
    raw = stored.contiguous().view(torch.uint8)
    if fmt is INT4:
        packed = raw[..., : hd // 2]
        codes = torch.stack([packed & 15, packed >> 4], -1).flatten(-2).int()
        end = hd // 2 + 2 * (hd // int4_group(hd))
        scales = raw[..., hd // 2: end].contiguous().view(torch.float16).float()
        return codes, scales, raw[..., end:]
    if fmt is FP8:
        # e4m3 codes of one sign are ordered as their magnitudes: a step is 1 apart.
        bits = raw[..., :hd].int()
        codes = torch.where(bits >= 128, -(bits - 128), bits)
    else:
        codes = raw[..., :hd].view(torch.int8).int()
    scales = raw[..., hd:hd + 2].contiguous().view(torch.float16).float()
    return codes, scales, raw[..., hd + 2:]


def assert_encoded(got: torch.Tensor, rows: torch.Tensor, fmt) -> None:
    """got [..., row_len] as fmt.encode(rows) writes it, but for rare codes a step apart
    (rounding ties after another summation order) and scales a float16 step apart; an int4
    row's padding after its scales zero, as encode's."""
    hd = rows.shape[-1]
    got_codes, got_scales, got_pad = codes_and_scales(got, fmt, hd)
    want_codes, want_scales, want_pad = codes_and_scales(fmt.encode(rows), fmt, hd)
    diff = (got_codes - want_codes).abs()
    assert diff.max().item() <= 1
    assert diff.count_nonzero().item() <= max(2, diff.numel() // 1000)
    torch.testing.assert_close(got_scales, want_scales, rtol=2**-10, atol=0)
    assert torch.equal(got_pad, want_pad)


def random_bytes(pool: torch.Tensor, seed: int) -> None:
    """pool's bytes random (an int4 key pool as the key stage left it: the write must not
    touch it)."""
    gen = torch.Generator().manual_seed(seed)
    pool.view(torch.uint8).copy_(torch.randint(0, 256, pool.shape, generator=gen,
                                               dtype=torch.uint8))


@pytest.mark.parametrize("head_size", [64, 128, 256, 80])
@pytest.mark.parametrize("head_major", [False, True])
def test_write_kv_quantizes_as_encode(isa_path, fmt, head_size, head_major):
    """Each token's rows quantized as encode does them; an int4 pool's values only, its key
    rows (a block's channels, written a block at a time) left byte for byte."""
    gen = torch.Generator().manual_seed(head_size)
    bs = block_sizes(fmt)[0]
    blocks = 24 * 16 // bs
    pools = allocate_kv_cache(1, blocks, bs, 2, head_size, fmt.storage, "cpu", head_major)[0]
    if fmt.keys_by_block:
        random_bytes(pools[0], head_size)
    keys_before = pools[0].clone()
    key, value = torch.randn(2, 300, 2, head_size, generator=gen) * 3
    key[0, 0] = 0.0  # a zero row: scale 0, codes 0
    value[1, 1, :3] = torch.tensor([1e4, -2e4, 1e-6])  # outliers
    value[2, 0] = 0.0
    slots = torch.randperm(blocks * bs, generator=gen)[:300]
    slots[5] = -1
    keep = slots >= 0
    # The op itself: the backend hands an int4 pool's keys to its stage afterwards (below).
    kernels.cpu.ops().write_kv(key, value, pools[0], pools[1], slots)
    written = ((value, pools[1]),) if fmt.keys_by_block else ((key, pools[0]),
                                                                  (value, pools[1]))
    for rows, pool in written:
        assert_encoded(pool.flatten(0, 1)[slots[keep]], rows[keep], fmt)
    untouched = torch.ones(blocks * bs, dtype=torch.bool)
    untouched[slots[keep]] = False
    if fmt.keys_by_block:
        assert torch.equal(pools[0].view(torch.uint8), keys_before.view(torch.uint8))
        assert (pools[1].flatten(0, 1)[untouched].view(torch.uint8) == 0).all()
    else:
        assert (pools.flatten(1, 2)[:, untouched].view(torch.uint8) == 0).all()


def test_rotary_write_kv_rotates_then_quantizes(isa_path, fmt):
    from engine.layers.rotary import apply_rotary

    gen = torch.Generator().manual_seed(7)
    angles = torch.randn(4, 32, generator=gen)
    cos = torch.cat((angles.cos(), angles.cos()), -1)[:, None]
    sin = torch.cat((-angles.sin(), angles.sin()), -1)[:, None]
    qkv = torch.randn(4, 4 + 2, 64, generator=gen)
    want_q, want_k = apply_rotary(qkv[:, :4], cos, sin), apply_rotary(qkv[:, 4:5], cos, sin)
    bs = block_sizes(fmt)[0]
    pools = allocate_kv_cache(1, 2, bs, 1, 64, fmt.storage, "cpu", True)[0]
    if fmt.keys_by_block:
        random_bytes(pools[0], 7)
    keys_before = pools[0].clone()
    slots = torch.tensor([0, 5, -1, bs + 1])
    kernels.cpu.ops().rotary_write_kv(qkv[:, :4], qkv[:, 4:5], qkv[:, 5:], cos, sin,
                                      pools[0], pools[1], slots)
    torch.testing.assert_close(qkv[:, :4], want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(qkv[:, 4:5], want_k, rtol=1e-5, atol=1e-5)
    written = [0, 5, bs + 1]
    if fmt.keys_by_block:  # q and k rotated all the same; the key rows left alone
        assert torch.equal(pools[0].view(torch.uint8), keys_before.view(torch.uint8))
    else:
        assert_encoded(pools[0].flatten(0, 1)[written], qkv[[0, 1, 3], 4:5], fmt)
    assert_encoded(pools[1].flatten(0, 1)[written], qkv[[0, 1, 3], 5:], fmt)


def test_the_backend_writes_int4_keys_through_the_stage(isa_path):
    """write_kv and rotary_write_kv: the op writes the value rows, the pool's stage the
    key blocks, equal to encode_keys of the (rotary-turned) keys so far: but for a code
    here and there, since the stage's writer (write_key_blocks) rotates the keys with its
    own butterflies, encode_keys with torch's matrix product (tests/kernels/cpu/
    test_key_blocks.py)."""
    from engine.layers.rotary import apply_rotary

    gen = torch.Generator().manual_seed(3)
    pool = allocate_kv_cache(1, 3, 32, 2, 64, INT4.storage, "cpu", True)
    backend = CpuBackend()
    backend.key_stages.attach(KeyStage(pool, slots=1))
    key, value = torch.randn(2, 40, 2, 64, generator=gen).unbind(0)
    backend.write_kv(key[:30], value[:30], pool[0, 0], pool[0, 1], torch.arange(32, 62))
    angles = torch.randn(10, 32, generator=gen)
    cos = torch.cat((angles.cos(), angles.cos()), -1)[:, None]
    sin = torch.cat((-angles.sin(), angles.sin()), -1)[:, None]
    query, turned = torch.randn(10, 4, 64, generator=gen), key[30:].clone()
    backend.rotary_write_kv(query, turned, value[30:].clone(), cos, sin, pool[0, 0],
                            pool[0, 1], torch.tensor([62, 63, *range(64, 72)]))
    torch.testing.assert_close(turned, apply_rotary(key[30:], cos, sin), rtol=1e-5, atol=1e-5)
    rows = torch.zeros(2, 32, 2, 64)
    rows.view(64, 2, 64)[:40] = torch.cat([key[:30], turned])
    want = INT4.encode_keys(rows, torch.tensor([32, 8]))
    got = pool[0, 0, 1:3].view(torch.uint8)
    assert (got != want).float().mean() < 0.005
    step = key_params(want, 64)[1][:, None]
    assert ((INT4.decode_keys(got) - INT4.decode_keys(want)).abs() <= step * 1.01).all()
    assert not pool[0, 0, 0].view(torch.uint8).any()


@pytest.mark.parametrize("kind", ["write", "attention"])
@pytest.mark.parametrize("fmt", [INT4, INT8], ids=lambda f: f.name)
def test_pools_need_blocks_of_their_formats_least_slots(kind, fmt):
    """An int4 or int8 key block keeps its parameters in its rows' spare bytes (int4: 32
    rows' worth, int8: 64): a pool of smaller blocks has no room for them, and the ops say
    so rather than read past a block."""
    pools = allocate_kv_cache(1, 4, 16, 2, 64, fmt.storage, "cpu", True)[0]
    with pytest.raises(RuntimeError, match=f"at least {fmt.min_block_size} slots"):
        if kind == "write":
            CpuBackend().write_kv(torch.zeros(1, 2, 64), torch.zeros(1, 2, 64), pools[0],
                                  pools[1], torch.tensor([3]))
        else:
            case = make_case([20], [1], num_kv_heads=2, group=2, head_size=64, block_size=16)
            CpuBackend().attention(case.query, pools[0], pools[1], case.meta, 1.0)


def test_the_int4_key_half_scales_are_the_codecs():
    """The half-width scales the kernels decode int4 keys with are
    kv_key_channels.HALF_SCALES bit for bit (so are their keys: the attention tests)."""
    table = kernels.cpu.ops().int4_key_half_scales()
    assert torch.equal(table, torch.tensor(HALF_SCALES, dtype=torch.float32))


@pytest.mark.parametrize("head_size", [64, 96, 128, 256])
def test_the_rotation_is_its_own_inverse(head_size):
    """kv_format's rotation (which the op's rotation is checked against through every int4
    attention test above) is orthogonal and symmetric: twice is the identity, and an int4
    value row written by the kernel decodes, rotated back, to within its quantization
    step."""
    gen = torch.Generator().manual_seed(head_size)
    x = torch.randn(50, head_size, generator=gen)
    torch.testing.assert_close(rotate(rotate(x)), x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((rotate(x) * rotate(x)).sum(-1), (x * x).sum(-1))
    pools = allocate_kv_cache(1, 2, INT4.min_block_size, 1, head_size, torch.uint8, "cpu",
                              True)[0]
    kernels.cpu.ops().write_kv(x[:, None], x[:, None], pools[0], pools[1], torch.arange(50))
    back = rotate(INT4.decode(pools[1].flatten(0, 1)[:50, 0]))
    step = INT4.decode(pools[1].flatten(0, 1)[:50, 0]).abs().amax(-1, keepdim=True) / 7
    assert ((back - x).abs() <= step * head_size**0.5).all()
    assert (back - x).norm() / x.norm() < 0.2


def test_block_moves_carry_rows_as_bytes(fmt):
    """copy_blocks and swap_blocks on quantized pools (index_copy_ has no float8 kernel on
    the CPU): the moved rows' bytes are the source's."""
    backend = CpuBackend()
    bs = block_sizes(fmt)[0]
    pool = allocate_kv_cache(2, 6, bs, 2, 64, fmt.storage, "cpu", True)
    gen = torch.Generator().manual_seed(0)
    pool.view(torch.uint8).copy_(torch.randint(0, 256, pool.shape, generator=gen,
                                               dtype=torch.uint8))
    before = pool.clone()
    backend.copy_blocks(pool, torch.tensor([0, 3]), torch.tensor([1, 4]))
    raw, old = pool.view(torch.uint8), before.view(torch.uint8)
    assert torch.equal(raw[:, :, [1, 4]], old[:, :, [0, 3]])
    assert torch.equal(raw[:, :, [0, 2, 3, 5]], old[:, :, [0, 2, 3, 5]])
    host = allocate_kv_cache(2, 3, bs, 2, 64, fmt.storage, "cpu", True)
    backend.swap_blocks(pool, host, torch.tensor([5, 2]), torch.tensor([0, 2]))
    assert torch.equal(host.view(torch.uint8)[:, :, [0, 2]], raw[:, :, [5, 2]])


def test_the_native_paths_take_quantized_pools(fmt):
    bs = block_sizes(fmt)[0]
    pool = allocate_kv_cache(1, 2, bs, 2, 64, fmt.storage, "cpu", True)[0]
    assert native_pool(pool[0])
    assert CpuBackend._native(torch.zeros(1, 4, 64), pool[0], pool[1])
    with pytest.raises(RuntimeError, match="rows for head size 128"):
        case = make_case([20], [1], num_kv_heads=2, group=2, head_size=128, block_size=bs)
        CpuBackend().attention(case.query, pool[0], pool[1], case.meta, 1.0)

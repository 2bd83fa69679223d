"""The C++ paged attention (CpuBackend) against the PyTorch reference backend: mixed
prefill/decode batches, GQA, head sizes, lengths at block boundaries, windows, soft-caps,
shared and shuffled block tables, split-K on few sequences, and the KV write."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels import allocate_kv_cache, get_backend
from kernels.cpu.attention import CpuBackend
from kernels.reference.backend import TorchBackend, write_kv_ref
from tests.kernels.paged_cases import make_case, reference_attention

RTOL = ATOL = 1e-5


def half_pool(case):
    """The case over its pool rounded to float16 (strides kept: head-major stays so), as
    the engine's default CPU pool holds K/V; the reference reads it in float32 too."""
    return dataclasses.replace(case, k_cache=case.k_cache.to(torch.float16),
                               v_cache=case.v_cache.to(torch.float16))


def check(case, window=None, softcap=None):
    """The kernel against the reference over the case's float32 pool and its float16 one."""
    for pooled in (case, half_pool(case)):
        ref = reference_attention(pooled, window, softcap)
        out = CpuBackend().attention(pooled.query, pooled.k_cache, pooled.v_cache, pooled.meta,
                                     pooled.scale, sliding_window=window,
                                     logit_softcap=softcap)
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_mixed_prefill_and_decode_at_block_boundaries(isa_path, head_size, group):
    lengths = [15, 16, 17, 32, 33]
    case = make_case(lengths, [1, 16, 5, 1, 33], num_kv_heads=2, group=group,
                     head_size=head_size, block_size=16, seed=group)
    check(case)


@pytest.mark.parametrize("head_size", [64, 80])
@pytest.mark.parametrize("group", [1, 2])
def test_every_count_of_decode_rows(isa_path, head_size, group):
    """Tasks of fewer than 16 rows (tokens x query heads) take their scores and value sums
    in tiles of 1 to 4 rows: every remainder, over partial first and last blocks; head
    size 80 is a multiple of 16 but not of 32 (the narrower value tiles)."""
    case = make_case([40, 41, 57, 23, 70], [1, 2, 3, 7, 15], num_kv_heads=2, group=group,
                     head_size=head_size, block_size=16, seed=head_size + group)
    check(case)


@pytest.mark.parametrize("head_size", [33, 72, 80])
def test_prefill_rows_at_other_head_sizes(isa_path, head_size):
    """Prefill tiles (16 rows or more: the keys transposed) where the head size is not a
    multiple of 64 (80: one value vector at a time), not of 16 (72: the keys transposed
    in plain C++) or odd (33), over partial first and last blocks."""
    case = make_case([40, 57], [23, 40], num_kv_heads=2, group=2, head_size=head_size,
                     block_size=16, seed=head_size)
    check(case)


@pytest.mark.parametrize("lengths", [[15], [16], [17], [32], [33], [15, 16, 17, 32, 33]])
def test_decode_at_block_boundaries(isa_path, lengths):
    case = make_case(lengths, [1] * len(lengths), num_kv_heads=3, group=3, head_size=64,
                     block_size=16)
    check(case)


@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("window", [None, 100])
def test_decode_rows_over_several_spans(isa_path, head_size, block_size, window):
    """Decode rows (fewer than the transposed path's 16) take the online softmax over spans
    of 16 blocks and keep their value sums in registers: lengths around one span (256 keys
    of 16-slot blocks) and across several, a window that starts inside a span; 8-slot
    blocks keep one block per span."""
    case = make_case([255, 256, 257, 600], [1, 1, 1, 1], num_kv_heads=2, group=3,
                     head_size=head_size, block_size=block_size, seed=head_size + block_size)
    check(case, window)


@pytest.mark.parametrize("block_size", [32, 64])
def test_blocks_of_several_sub_blocks(isa_path, block_size):
    """Blocks of 32 and 64 slots (EngineConfig.block_size) take the transposed and
    key-by-key paths 16 slots at a time, spans of 256 keys: lengths around a sub-block, a
    block and a span, prefill and decode rows in one batch, windows that start inside a
    sub-block, soft-caps, head sizes whose keys transpose in plain C++ (72) or take one
    value vector at a time (80), shared prompts and split keys."""
    bs = block_size
    lengths = [bs - 1, bs + 17, 2 * bs + 1, 255, 257, 600]
    for head_size, group in ((64, 4), (128, 1), (72, 2), (80, 3)):
        case = make_case(lengths, [1, 16, 5, 1, 40, 1], num_kv_heads=2, group=group,
                         head_size=head_size, block_size=bs, seed=head_size + bs,
                         head_major=group != 1)
        check(case)
        check(case, window=40, softcap=5.0)
        check(case, window=7)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for n, group in ((4, 3), (3, 8)):
            shared = make_case([512 + bs * (i % 3) + i for i in range(n)], [1] * n,
                               num_kv_heads=2, group=group, head_size=64, block_size=bs,
                               shared={i: (0, 512 // bs) for i in range(1, n)}, seed=n)
            check(shared, softcap=4.0)
        long = make_case([2049], [1], num_kv_heads=3, group=3, head_size=64, block_size=bs,
                         head_major=True)
        check(long)
        check(long, window=700)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("window", [1, 7, 16, 17, 40])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_sliding_window_and_softcap(isa_path, window, softcap):
    case = make_case([33, 100, 17, 64], [1, 30, 17, 1], num_kv_heads=2, group=4, head_size=64,
                     block_size=16, seed=window)
    check(case, window, softcap)


def test_softcap_alone_on_a_long_prefill(isa_path):
    case = make_case([300], [120], num_kv_heads=1, group=2, head_size=128, block_size=16)
    check(case, softcap=2.0)


def test_shared_prefix_blocks_and_consecutive_tables(isa_path):
    shared = make_case([70, 70, 75], [1, 1, 1], num_kv_heads=2, group=3, head_size=64,
                       block_size=16, shared={1: (0, 4), 2: (0, 4)})
    check(shared)
    in_place = make_case([70, 33], [1, 20], num_kv_heads=2, group=3, head_size=64,
                         block_size=16, consecutive=True, head_major=True)
    check(in_place)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("softcap", [None, 4.0])
def test_candidates_read_their_shared_prompt_once(isa_path, threads, softcap):
    """A decode step of one prompt's candidates (their tables start with the same blocks):
    the shared blocks in key splits over every candidate's rows, each candidate's own
    blocks apart, merged by log-sum-exp. The tables share 32 blocks, but one candidate's
    newest token lies in block 31 (length 500), so only 31 are read as shared (each row
    keeps its newest key in its own part); lengths apart by a block or two; groups of 3
    (rows under the transposed path's 16) and 8 (over it)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n, group in ((4, 3), (6, 8)):
            lengths = [512 + 16 * (i % 3) + i for i in range(n)]
            lengths[1] = 500
            case = make_case(lengths, [1] * n, num_kv_heads=2, group=group, head_size=64,
                             block_size=16, shared={i: (0, 32) for i in range(1, n)},
                             seed=n)
            check(case, softcap=softcap)
            check(case, window=100)  # windows take the per-sequence plan
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("threads", [1, 2])
def test_split_k_on_one_long_sequence(isa_path, threads):
    """1 sequence x 3 KV heads: the keys split into block ranges merged by log-sum-exp."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        case = make_case([2049], [1], num_kv_heads=3, group=3, head_size=64, block_size=16,
                         head_major=True)
        check(case)
        check(case, window=700)
        check(case, softcap=10.0)
    finally:
        torch.set_num_threads(previous)


def test_non_float32_pools_run_the_reference():
    case = make_case([40, 17], [1, 17], num_kv_heads=2, group=2, head_size=64, block_size=16)
    query, k, v = case.query.bfloat16(), case.k_cache.bfloat16(), case.v_cache.bfloat16()
    out = CpuBackend().attention(query, k, v, case.meta, case.scale)
    ref = TorchBackend().attention(query, k, v, case.meta, case.scale)
    torch.testing.assert_close(out, ref)


def test_bad_heads_and_options_raise_value_errors():
    case = make_case([20], [1], num_kv_heads=2, group=2, head_size=64, block_size=16)
    backend = CpuBackend()
    with pytest.raises(ValueError, match="multiple of KV heads"):
        backend.attention(case.query[:, :3], case.k_cache, case.v_cache, case.meta, 1.0)
    with pytest.raises(ValueError, match="sliding_window"):
        backend.attention(case.query, case.k_cache, case.v_cache, case.meta, 1.0,
                          sliding_window=0)
    with pytest.raises(ValueError, match="logit_softcap"):
        backend.attention(case.query, case.k_cache, case.v_cache, case.meta, 1.0,
                          logit_softcap=-1.0)


@pytest.mark.parametrize("head_major", [False, True])
def test_write_kv_matches_the_reference_and_skips_minus_one(head_major):
    gen = torch.Generator().manual_seed(0)
    pools = [allocate_kv_cache(1, 6, 16, 2, 64, torch.float32, "cpu", head_major)[0]
             for _ in range(2)]
    fused = torch.randn(5, 4 + 2 * 2, 64, generator=gen)  # a q/k/v projection's output
    key, value = fused[:, 4:6], fused[:, 6:]
    slots = torch.tensor([3, -1, 40, 95, 16])
    write_kv_ref(key, value, pools[0][0], pools[0][1], slots)
    CpuBackend().write_kv(key, value, pools[1][0], pools[1][1], slots)
    torch.testing.assert_close(pools[1], pools[0], rtol=0, atol=0)


@pytest.mark.parametrize("head_major", [False, True])
def test_write_kv_to_a_float16_pool_rounds_as_torch(isa_path, head_major):
    """Float32 K/V into a float16 pool: each element as torch's .to(torch.float16) rounds
    it (ties to even, past 65504 an infinity), a head size that is no multiple of the
    vector width included."""
    gen = torch.Generator().manual_seed(2)
    for head_size in (64, 20):
        pools = [allocate_kv_cache(1, 6, 16, 2, head_size, torch.float16, "cpu", head_major)[0]
                 for _ in range(2)]
        key, value = torch.randn(2, 5, 2, head_size, generator=gen) * 3
        key[0, 0, :3] = torch.tensor([7e4, -1e5, 2.0**-20])  # overflow, a subnormal
        value[1, 1, :2] = torch.tensor([float("inf"), 65519.0])
        slots = torch.tensor([3, -1, 40, 95, 16])
        write_kv_ref(key, value, pools[0][0], pools[0][1], slots)
        CpuBackend().write_kv(key, value, pools[1][0], pools[1][1], slots)
        assert torch.equal(pools[1], pools[0])
        assert pools[1][0].flatten(0, 1)[3, 0, :2].isinf().all()


def test_rotary_write_kv_rotates_in_place_and_writes(isa_path):
    from engine.layers.rotary import apply_partial_rotary, apply_rotary

    gen = torch.Generator().manual_seed(1)
    for rotary_dim in (64, 48):
        angles = torch.randn(4, rotary_dim // 2, generator=gen)
        cos = torch.cat((angles.cos(), angles.cos()), -1)[:, None]
        sin = torch.cat((-angles.sin(), angles.sin()), -1)[:, None]
        qkv = torch.randn(4, 3 + 2, 64, generator=gen)
        rotate = apply_rotary if rotary_dim == 64 else apply_partial_rotary
        want_q, want_k = rotate(qkv[:, :3], cos, sin), rotate(qkv[:, 3:4], cos, sin)
        pools = allocate_kv_cache(1, 2, 16, 1, 64, torch.float32, "cpu", True)[0]
        CpuBackend().rotary_write_kv(qkv[:, :3], qkv[:, 3:4], qkv[:, 4:], cos, sin, pools[0],
                                     pools[1], torch.tensor([0, 5, -1, 31]))
        torch.testing.assert_close(qkv[:, :3], want_q, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(qkv[:, 3:4], want_k, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(pools[0].flatten(0, 1)[[0, 5, 31]], want_k[[0, 1, 3]])
        torch.testing.assert_close(pools[1].flatten(0, 1)[[0, 5, 31]], qkv[[0, 1, 3], 4:])
        halves = allocate_kv_cache(1, 2, 16, 1, 64, torch.float16, "cpu", True)[0]
        key = qkv[:, 3:4].clone()
        CpuBackend().rotary_write_kv(qkv[:, :3].clone(), key, qkv[:, 4:], cos, sin, halves[0],
                                     halves[1], torch.tensor([0, 5, -1, 31]))
        assert torch.equal(halves[0].flatten(0, 1)[[0, 5, 31]], key[[0, 1, 3]].half())
        assert torch.equal(halves[1].flatten(0, 1)[[0, 5, 31]], qkv[[0, 1, 3], 4:].half())


def test_get_backend_defaults_to_cpu_and_copies_blocks_like_the_reference(monkeypatch):
    monkeypatch.delenv("FOLIO_ATTENTION_BACKEND", raising=False)
    backend = get_backend("cpu")
    assert isinstance(backend, CpuBackend) and backend.name == "cpu" and backend.head_major_kv
    pool = torch.randn(2, 2, 5, 4, 1, 8)
    want = pool.clone()
    TorchBackend().copy_blocks(want, torch.tensor([0, 3]), torch.tensor([1, 4]))
    backend.copy_blocks(pool, torch.tensor([0, 3]), torch.tensor([1, 4]))
    torch.testing.assert_close(pool, want, rtol=0, atol=0)


def test_one_backend_over_consecutive_steps_reads_each_steps_metadata():
    """The backend converts a step's index tensors once for all its layers: the next step's
    metadata (other lengths, other tables, int64 as a caller may pass them) must be read
    afresh, and a layer repeating a step's metadata must get the same result."""
    backend = CpuBackend()
    first = make_case([17, 40], [1, 1], num_kv_heads=2, group=2, head_size=64, block_size=16,
                      seed=1)
    second = make_case([90, 5, 33], [1, 1, 1], num_kv_heads=2, group=2, head_size=64,
                       block_size=16, seed=2)
    second.meta.block_tables = second.meta.block_tables.long()
    second.meta.seq_lens = second.meta.seq_lens.long()
    for case in (first, first, second, first):
        out = backend.attention(case.query, case.k_cache, case.v_cache, case.meta, case.scale)
        torch.testing.assert_close(out, reference_attention(case), rtol=RTOL, atol=ATOL)

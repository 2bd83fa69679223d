"""Per-row key limits (AttentionMetadata.key_ends: a bidirectional run such as Gemma 3's
image tokens) in the C++ paged attention (CpuBackend) against the naive float64 oracle:
the transposed and key-by-key paths, split-K tiles, sliding windows and soft-caps,
float32 and float16 pools, on every ISA path."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu.attention import CpuBackend
from tests.kernels.paged_cases import make_case, naive_attention, with_runs

BATCH = ([300, 48, 64, 33], [45, 48, 16, 1])
RUNS = {0: [(260, 280), (282, 300)], 1: [(3, 40)], 2: [(40, 60)]}


def check(case, window=None, softcap=None, atol=1e-5):
    out = CpuBackend().attention(case.query, case.k_cache, case.v_cache, case.meta,
                                 case.scale, sliding_window=window, logit_softcap=softcap)
    expected = naive_attention(case, window, softcap)
    torch.testing.assert_close(out.double(), expected.double(), atol=atol, rtol=atol)


@pytest.mark.parametrize("window", [None, 7, 16, 40])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_runs_see_their_end(isa_path, window, softcap):
    # Groups of 8 with 4+ tokens take the transposed path, groups of 1 the key-by-key one.
    for group in (1, 8):
        case = with_runs(make_case(*BATCH, num_kv_heads=2, group=group, head_size=64,
                                   block_size=16, seed=group, head_major=True), RUNS)
        check(case, window, softcap)


@pytest.mark.parametrize("block_size", [32, 64])
def test_runs_over_blocks_of_several_sub_blocks(isa_path, block_size):
    """Blocks of 32 and 64 slots, taken 16 at a time: a run's end inside a sub-block."""
    for group in (1, 8):
        case = with_runs(make_case(*BATCH, num_kv_heads=2, group=group, head_size=64,
                                   block_size=block_size, seed=group, head_major=True), RUNS)
        check(case)
        check(case, 16, 5.0)


def test_a_float16_pool(isa_path):
    case = with_runs(make_case(*BATCH, num_kv_heads=2, group=4, head_size=64, block_size=16,
                               head_major=True), RUNS)
    case.k_cache.copy_(case.k_cache.half().float())
    case.v_cache.copy_(case.v_cache.half().float())
    half = type(case)(case.query, case.k_cache.half(), case.v_cache.half(), case.meta,
                      case.scale)
    out = CpuBackend().attention(half.query, half.k_cache, half.v_cache, half.meta,
                                 half.scale, sliding_window=16)
    torch.testing.assert_close(out.double(), naive_attention(case, 16).double(), atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_one_long_chunk_split_over_its_keys(isa_path, threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        case = with_runs(make_case([1500], [300], num_kv_heads=1, group=2, head_size=64,
                                   block_size=16), {0: [(1210, 1466)]})
        check(case)
        check(case, window=512)
    finally:
        torch.set_num_threads(previous)


def test_a_limit_before_its_row_is_refused():
    case = make_case([40], [8], num_kv_heads=1, group=1, head_size=64, block_size=16)
    bad = with_runs(case, {0: [(34, 36)]})
    bad.meta.key_ends[0] = 30  # row 0 sits at position 32
    with pytest.raises(RuntimeError, match="key_ends"):
        CpuBackend().attention(bad.query, bad.k_cache, bad.v_cache, bad.meta, bad.scale)

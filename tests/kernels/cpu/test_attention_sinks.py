"""Attention sinks in the C++ paged attention (CpuBackend) against the naive float64
oracle that appends each head's sink logit to the softmax: rows normalized in a task and
rows merged from key splits (split-K, the candidates' shared prompt), with sliding
windows and soft-caps off and on, on every ISA path."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu.attention import CpuBackend
from tests.kernels.paged_cases import make_case, naive_attention
from tests.kernels.reference.test_reference_sinks import sinks_for


def check(case, sinks, window=None, softcap=None):
    out = CpuBackend().attention(case.query, case.k_cache, case.v_cache, case.meta,
                                 case.scale, sliding_window=window, logit_softcap=softcap,
                                 sinks=sinks)
    expected = naive_attention(case, window, softcap, sinks)
    torch.testing.assert_close(out.double(), expected.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 7, 40])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_mixed_batch_with_sinks(isa_path, window, softcap):
    # Groups of 8 with 4+ tokens take the transposed path, groups of 2 the key-by-key one.
    for group in (2, 8):
        case = make_case([33, 100, 17, 64], [1, 30, 17, 1], num_kv_heads=2, group=group,
                         head_size=64, block_size=16, seed=group, head_major=True)
        check(case, sinks_for(2 * group), window, softcap)


@pytest.mark.parametrize("block_size", [32, 64])
def test_sinks_over_blocks_of_several_sub_blocks(isa_path, block_size):
    """Blocks of 32 and 64 slots (taken 16 at a time): both paths, a window, a soft-cap,
    split keys and a shared prompt."""
    for group in (2, 8):
        case = make_case([33, 100, 17, 200], [1, 30, 17, 1], num_kv_heads=2, group=group,
                         head_size=64, block_size=block_size, seed=group, head_major=True)
        check(case, sinks_for(2 * group))
        check(case, sinks_for(2 * group), 40, 5.0)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        long = make_case([2049], [1], num_kv_heads=3, group=3, head_size=64,
                         block_size=block_size, head_major=True)
        check(long, sinks_for(9), window=700, softcap=10.0)
        shared = make_case([512, 520, 530], [1, 1, 1], num_kv_heads=2, group=3,
                           head_size=64, block_size=block_size,
                           shared={1: (0, 512 // block_size), 2: (0, 512 // block_size)})
        check(shared, sinks_for(6))
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("threads", [1, 2])
def test_split_rows_merge_with_the_sink(isa_path, threads):
    """One long sequence split over its keys, and candidates reading a shared prompt:
    the sink joins the log-sum-exp merge once, not once per split."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        long = make_case([2049], [1], num_kv_heads=3, group=3, head_size=64, block_size=16,
                         head_major=True)
        check(long, sinks_for(9))
        check(long, sinks_for(9), window=700, softcap=10.0)
        shared = make_case([512, 520, 530], [1, 1, 1], num_kv_heads=2, group=3,
                           head_size=64, block_size=16, shared={1: (0, 32), 2: (0, 32)})
        check(shared, sinks_for(6))
    finally:
        torch.set_num_threads(previous)


def test_bad_sinks_raise_value_errors():
    case = make_case([20], [1], num_kv_heads=2, group=2, head_size=64, block_size=16)
    with pytest.raises(ValueError, match="sinks must have shape"):
        CpuBackend().attention(case.query, case.k_cache, case.v_cache, case.meta, 1.0,
                               sinks=torch.zeros(2))

"""Varlen paged prefill kernel against the PyTorch reference (interpreted on CPU,
compiled on CUDA)."""

from __future__ import annotations

import pytest

from kernels.triton.backend import TritonBackend
from kernels.triton.prefill import paged_prefill
from tests.kernels.paged_cases import (
    DTYPES,
    assert_matches,
    make_case,
    reference_attention,
)

# (seq_lens after the step, q_lens, num_kv_heads, group, head_size, block_size, shared)
# q_len == seq_len is a fresh prompt, q_len < seq_len a chunk after cached blocks (a
# chunked prefill or a prefix-cache hit), q_len == 1 a decode row in a mixed batch.
PREFILL_CASES = [
    ([17], [17], 1, 1, 64, 16, None),
    ([1], [1], 2, 8, 80, 32, None),
    ([1030], [20], 1, 3, 128, 16, None),
    ([16, 15, 17], [16, 15, 17], 2, 3, 64, 32, None),
    ([1100, 16, 40], [1, 16, 9], 1, 8, 64, 16, {2: (1, 1)}),
    ([17, 33, 15], [5, 1, 15], 1, 1, 128, 16, {1: (0, 1)}),
    ([1, 15, 16, 17, 40, 33, 64, 5], [1, 15, 1, 17, 8, 1, 30, 5], 1, 3, 80, 16,
     {4: (3, 1), 6: (4, 2)}),
    ([20, 17, 16, 64, 15, 33, 48, 1], [20, 2, 16, 1, 7, 33, 1, 1], 2, 1, 128, 32,
     {3: (2, 1), 5: (3, 1)}),
    ([64, 40, 17, 16, 47, 2, 31, 80], [3, 40, 1, 16, 12, 2, 31, 1], 1, 8, 64, 32,
     {7: (0, 2)}),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "seq_lens,q_lens,nkv,group,head_size,block_size,shared", PREFILL_CASES,
    ids=[f"case{i}" for i in range(len(PREFILL_CASES))],
)
def test_prefill_matches_reference(seq_lens, q_lens, nkv, group, head_size, block_size,
                                   shared, dtype):
    case = make_case(seq_lens, q_lens, num_kv_heads=nkv, group=group, head_size=head_size,
                     block_size=block_size, dtype=dtype, shared=shared)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale)
    assert_matches(out, reference_attention(case))


def test_prefill_of_decode_rows_equals_reference():
    # A batch of one-token rows through the prefill kernel: the mixed-batch path for them.
    case = make_case([1, 16, 70], [1, 1, 1], num_kv_heads=1, group=3, head_size=64,
                     block_size=16)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale)
    assert_matches(out, reference_attention(case))


def test_prefill_head_size_256():
    case = make_case([50, 9], [30, 9], num_kv_heads=1, group=2, head_size=256, block_size=16)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale)
    assert_matches(out, reference_attention(case))


def test_backend_sends_mixed_batches_to_the_prefill_kernel(monkeypatch):
    case = make_case([17, 40], [17, 1], num_kv_heads=1, group=3, head_size=64, block_size=16)
    calls = []
    monkeypatch.setattr("kernels.triton.backend.paged_prefill",
                        lambda *a, **k: calls.append("prefill") or paged_prefill(*a, **k))
    monkeypatch.setattr("kernels.triton.backend.paged_decode",
                        lambda *a, **k: pytest.fail("mixed batch went to decode"))
    out = TritonBackend().attention(case.query, case.k_cache, case.v_cache, case.meta,
                                    case.scale)
    assert calls == ["prefill"]
    assert_matches(out, reference_attention(case))


def test_prefill_rejects_mismatched_metadata():
    case = make_case([17, 5], [17, 5], num_kv_heads=1, group=2, head_size=64, block_size=16)
    case.meta.query_start_loc = case.meta.query_start_loc[:2]
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale)
    with pytest.raises(ValueError, match="nq must be a multiple"):
        paged_prefill(case.query[:, :1], case.k_cache.repeat(1, 1, 2, 1),
                      case.v_cache.repeat(1, 1, 2, 1), case.meta, case.scale)

"""Shared-prompt (cascade) decode equals the plain split-K decode and the reference."""

from __future__ import annotations

import pytest
import torch

from kernels.triton import shared_prefix as triton_shared_prefix
from kernels.triton.backend import TritonBackend
from kernels.triton.decode import paged_decode
from kernels.triton.shared_prefix import (
    SharedPrefixGroup,
    find_shared_prefix_groups,
    shared_prefix_decode,
)
from tests.kernels.paged_cases import (
    DTYPES,
    assert_matches,
    make_case,
    reference_attention,
)


def _candidates_case(dtype=torch.float32, block_size=16, head_size=64, group=3, long=66):
    # Two requests forked into candidates plus a lone sequence: request A (seqs 0, 2, 5)
    # shares a 3-block prompt, request B (seqs 1, 3) a `long`-block one (66 blocks: more
    # than 1,000 tokens).
    lens = [3 * block_size + 5, long * block_size + 2, 3 * block_size + 1,
            long * block_size + 17, 23, 3 * block_size]
    shared = {2: (0, 3), 5: (0, 3), 3: (1, long)}
    return make_case(lens, [1] * 6, num_kv_heads=2, group=group, head_size=head_size,
                     block_size=block_size, dtype=dtype, shared=shared, seed=11)


def test_find_shared_prefix_groups():
    case = _candidates_case(long=9)
    groups = find_shared_prefix_groups(case.meta.block_tables, case.meta.seq_lens, 16)
    assert groups == [SharedPrefixGroup((0, 2, 5), 3), SharedPrefixGroup((1, 3), 9)]
    assert find_shared_prefix_groups(case.meta.block_tables, case.meta.seq_lens, 16,
                                     min_shared_blocks=4) == [SharedPrefixGroup((1, 3), 9)]


def test_find_shared_prefix_groups_counts_only_full_common_blocks():
    tables = torch.tensor([[7, 8, 9, 1], [7, 8, 2, 0], [7, 8, 9, 3], [5, 0, 0, 0]],
                          dtype=torch.int32)
    # Seq 1 diverges after two blocks; seq 2 has only 2.5 blocks of context.
    lens = torch.tensor([64, 40, 40, 16], dtype=torch.int32)
    assert find_shared_prefix_groups(tables, lens, 16) == [SharedPrefixGroup((0, 1, 2), 2)]


def test_find_shared_prefix_groups_puts_each_sequence_in_its_deepest_group():
    # Candidates 0-3 share a 5-block prompt; requests 4 and 5 share only the first two
    # blocks (a cached system prompt) with them and with each other; 6 shares nothing.
    prompt = [10, 11, 12, 13, 14]
    tables = torch.tensor([prompt + [20], prompt + [21], prompt + [22], prompt + [23],
                           [10, 11, 30, 31, 32, 33], [10, 11, 40, 0, 0, 0],
                           [50, 51, 52, 53, 54, 55]], dtype=torch.int32)
    lens = torch.tensor([90, 90, 85, 81, 96, 40, 96], dtype=torch.int32)
    assert find_shared_prefix_groups(tables, lens, 16) == [
        SharedPrefixGroup((0, 1, 2, 3), 5), SharedPrefixGroup((4, 5), 2)]
    assert find_shared_prefix_groups(tables, lens, 16, min_shared_blocks=3) == [
        SharedPrefixGroup((0, 1, 2, 3), 5)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size,head_size,group,num_splits,long",
                         [(16, 64, 3, 1, 66), (32, 128, 1, 3, 20), (16, 80, 8, 2, 12)])
def test_shared_prefix_decode_equals_plain_decode(block_size, head_size, group, num_splits,
                                                  long, dtype):
    case = _candidates_case(dtype, block_size, head_size, group, long)
    groups = find_shared_prefix_groups(case.meta.block_tables, case.meta.seq_lens, block_size)
    assert len(groups) == 2
    cascade = shared_prefix_decode(case.query, case.k_cache, case.v_cache, case.meta,
                                   case.scale, groups, num_splits=num_splits)
    plain = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                         num_splits=num_splits)
    assert_matches(cascade, plain)
    assert_matches(cascade, reference_attention(case))


def test_shared_prefix_decode_with_a_group_wider_than_one_program(monkeypatch):
    # 5 candidates with 8 query heads per KV head: 40 rows, cut into programs of 16 rows.
    monkeypatch.setattr(triton_shared_prefix, "MAX_TILE_ROWS", 16)
    lens = [40, 37, 33, 47, 32]
    case = make_case(lens, [1] * 5, num_kv_heads=1, group=8, head_size=64, block_size=16,
                     shared={i: (0, 2) for i in range(1, 5)}, seed=12)
    groups = [SharedPrefixGroup((0, 1, 2, 3, 4), 2)]
    out = shared_prefix_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                               groups, num_splits=1)
    assert_matches(out, reference_attention(case))


def test_private_part_may_be_empty():
    # Both sequences end exactly at the end of the shared blocks (seq_len = 2 blocks).
    case = make_case([32, 32], [1, 1], num_kv_heads=1, group=2, head_size=64, block_size=16,
                     shared={1: (0, 2)}, seed=13)
    out = shared_prefix_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                               [SharedPrefixGroup((0, 1), 2)], num_splits=2)
    assert_matches(out, reference_attention(case))


@pytest.mark.parametrize("switch", ["argument", "environment"])
def test_backend_switch_routes_decode_through_shared_prefix(switch, monkeypatch):
    case = _candidates_case(long=9)
    if switch == "environment":
        monkeypatch.setenv("FOLIO_SHARED_PREFIX", "1")
        backend = TritonBackend(min_shared_blocks=1)
    else:
        monkeypatch.delenv("FOLIO_SHARED_PREFIX", raising=False)
        backend = TritonBackend(shared_prefix=True, min_shared_blocks=1)
    seen = []

    def spy(*args, **kwargs):
        seen.append(args[5])
        return shared_prefix_decode(*args, **kwargs)

    monkeypatch.setattr("kernels.triton.backend.shared_prefix_decode", spy)
    for _ in range(2):  # a second layer of the same step reuses the groups
        out = backend.attention(case.query, case.k_cache, case.v_cache, case.meta, case.scale)
        assert_matches(out, reference_attention(case))
    assert seen[0] == [SharedPrefixGroup((0, 2, 5), 3), SharedPrefixGroup((1, 3), 9)]
    assert seen[1] is seen[0]


def test_backend_switch_is_off_by_default(monkeypatch):
    monkeypatch.delenv("FOLIO_SHARED_PREFIX", raising=False)
    monkeypatch.setattr("kernels.triton.backend.shared_prefix_decode",
                        lambda *a, **k: pytest.fail("shared-prefix decode without the switch"))
    case = _candidates_case(long=9)
    out = TritonBackend().attention(case.query, case.k_cache, case.v_cache, case.meta,
                                    case.scale)
    assert_matches(out, reference_attention(case))


def test_shared_prefix_decode_rejects_overlapping_groups():
    case = _candidates_case(long=9)
    groups = [SharedPrefixGroup((0, 2), 3), SharedPrefixGroup((2, 5), 3)]
    with pytest.raises(ValueError, match="in two groups"):
        shared_prefix_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                             groups)

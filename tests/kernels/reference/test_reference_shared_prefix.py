"""The reference's decode over sequences that share their first blocks (candidates of one
prompt): the shared blocks are read once and merged with each sequence's own tail by
log-sum-exp; it must equal the naive oracle, and be taken only when blocks are shared."""

from __future__ import annotations

import pytest
import torch

from kernels.reference.step_plan import StepPlan
from tests.kernels.paged_cases import (
    assert_matches,
    make_case,
    naive_attention,
    reference_attention,
)

BLOCK = 16


def plan_of(case):
    return StepPlan.build(case.meta, case.k_cache.shape[1], case.k_cache.device, None)


@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("head_size", [64, 80])
@pytest.mark.parametrize("seq_lens, shared_blocks", [
    ([65, 70, 96], 4),            # tails of 1, 6 and 32 tokens after 4 shared blocks
    ([49, 49, 49, 49], 3),        # each tail just the newest token: 48 = 3 blocks shared
    ([130, 40], 2),               # one long candidate, one short
])
@pytest.mark.parametrize("softcap", [None, 20.0])
def test_shared_blocks_decode_equals_the_oracle(group, head_size, seq_lens, shared_blocks,
                                                softcap):
    shared = {i: (0, shared_blocks) for i in range(1, len(seq_lens))}
    case = make_case(seq_lens, [1] * len(seq_lens), num_kv_heads=2, group=group,
                     head_size=head_size, block_size=BLOCK, shared=shared,
                     seed=len(seq_lens) + group)
    decode = plan_of(case).decode
    assert decode.shared is not None
    # The newest token of every sequence stays in its own tail.
    assert decode.shared.num_tokens == min(shared_blocks, (min(seq_lens) - 1) // BLOCK) * BLOCK
    assert_matches(reference_attention(case, logit_softcap=softcap),
                   naive_attention(case, logit_softcap=softcap))


def test_unrelated_sequences_take_the_batched_path():
    case = make_case([40, 70], [1, 1], num_kv_heads=2, group=2, head_size=64,
                     block_size=BLOCK)
    assert plan_of(case).decode.shared is None
    assert_matches(reference_attention(case), naive_attention(case))


def test_a_mixed_step_decodes_its_candidates_through_the_shared_blocks():
    """Two candidates decoding next to a prefill chunk of another sequence."""
    case = make_case([80, 90, 37], [1, 1, 5], num_kv_heads=1, group=4, head_size=64,
                     block_size=BLOCK, shared={1: (0, 5)})
    plan = plan_of(case)
    assert plan.decode is not None and plan.decode.shared is not None
    assert_matches(reference_attention(case), naive_attention(case))


def test_shared_blocks_in_bfloat16_stay_within_its_tolerance():
    case = make_case([100, 120, 140], [1, 1, 1], num_kv_heads=2, group=2, head_size=64,
                     block_size=BLOCK, dtype=torch.bfloat16, shared={1: (0, 6), 2: (0, 6)})
    assert plan_of(case).decode.shared is not None
    assert_matches(reference_attention(case), naive_attention(case))

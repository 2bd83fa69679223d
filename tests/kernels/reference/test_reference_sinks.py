"""Attention sinks in the PyTorch reference (prefill chunks, batched and single decode,
the candidates' shared-prefix decode) against the naive float64 oracle that appends each
head's sink logit to the softmax (tests/kernels/paged_cases.naive_attention), with
sliding windows and soft-caps off and on; and against transformers' gpt-oss eager
attention on a dense batch."""

from __future__ import annotations

import pytest
import torch

from kernels import check_sinks
from kernels.reference.backend import TorchBackend
from tests.kernels.paged_cases import make_case, naive_attention, reference_attention

pytestmark = pytest.mark.usefixtures("single_torch_thread")

# (seq_lens, q_lens, shared): decode, one long decode, chunks mixed with decode rows, and
# candidates whose tables share their first 4 blocks (the shared-prefix path).
BATCHES = {
    "decode": ([1, 15, 16, 17, 33, 140], [1] * 6, None),
    "single_decode": ([300], [1], None),
    "mixed": ([17, 1, 150, 64, 33], [1, 1, 23, 1, 17], None),
    "candidates": ([70, 72, 75], [1, 1, 1], {1: (0, 4), 2: (0, 4)}),
}


def sinks_for(num_q_heads: int, seed: int = 0) -> torch.Tensor:
    """Sink logits from well below to well above the scores' range, so that some heads
    give most of their weight to the sink and others almost none."""
    gen = torch.Generator().manual_seed(seed)
    return torch.linspace(-4.0, 6.0, num_q_heads)[torch.randperm(num_q_heads, generator=gen)]


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("window", [None, 7, 40], ids=["full", "w7", "w40"])
@pytest.mark.parametrize("softcap", [None, 5.0], ids=["nocap", "cap5"])
def test_sinks_match_the_appended_logit_oracle(batch, window, softcap):
    seq_lens, q_lens, shared = BATCHES[batch]
    case = make_case(seq_lens, q_lens, num_kv_heads=2, group=3, head_size=64, block_size=16,
                     shared=shared, head_major=True)
    sinks = sinks_for(6)
    out = reference_attention(case, window, softcap, sinks)
    torch.testing.assert_close(out.double(), naive_attention(case, window, softcap, sinks)
                               .double(), atol=1e-5, rtol=1e-5)
    # The sinks take weight off the keys: without them the output differs.
    plain = reference_attention(case, window, softcap)
    assert (out - plain).abs().max() > 1e-2


def test_a_very_large_sink_leaves_nearly_nothing_and_a_very_small_one_no_change():
    case = make_case([40, 17], [1, 17], num_kv_heads=1, group=2, head_size=64, block_size=16)
    big = reference_attention(case, sinks=torch.full((2,), 80.0))
    assert big.abs().max() < 1e-20
    tiny = reference_attention(case, sinks=torch.full((2,), -80.0))
    torch.testing.assert_close(tiny, reference_attention(case))


def test_bad_sinks_are_rejected_by_name():
    case = make_case([20], [1], num_kv_heads=2, group=2, head_size=64, block_size=16)
    backend = TorchBackend()
    with pytest.raises(ValueError, match=r"sinks must have shape \(4,\)"):
        backend.attention(case.query, case.k_cache, case.v_cache, case.meta, 1.0,
                          sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="sinks must be a float tensor"):
        check_sinks(torch.zeros(4, dtype=torch.int64), 4)
    check_sinks(None, 4)


@pytest.mark.parametrize("window", [None, 6])
def test_matches_transformers_gpt_oss_eager_attention(window):
    """One sequence prefilled whole: the reference over the paged pool equals gpt-oss's
    eager_attention_forward (its sinks concatenated to the masked scores) in float32."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    case = make_case([29], [29], num_kv_heads=2, group=2, head_size=64, block_size=16)
    sinks = sinks_for(4, seed=1)
    positions = torch.arange(29)
    k = case.k_cache[case.meta.block_tables[0].long()[positions // 16], positions % 16]
    v = case.v_cache[case.meta.block_tables[0].long()[positions // 16], positions % 16]
    seen = positions[None, :] <= positions[:, None]
    if window is not None:
        seen &= positions[None, :] > positions[:, None] - window
    mask = torch.zeros(seen.shape).masked_fill(~seen, float("-inf"))[None, None]

    class Module(torch.nn.Module):
        num_key_value_groups = 2
        training = False

    module = Module()
    module.sinks = sinks
    expected, _ = eager_attention_forward(
        module, case.query.transpose(0, 1)[None], k.transpose(0, 1)[None],
        v.transpose(0, 1)[None], mask, scaling=case.scale)
    out = reference_attention(case, window, None, sinks)
    torch.testing.assert_close(out, expected[0], atol=1e-5, rtol=1e-5)

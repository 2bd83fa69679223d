"""The PyTorch reference's sliding window and logit soft-cap against a naive float64
oracle (tests/kernels/paged_cases.naive_attention): K/V gathered token by token, the full
score matrix, an explicit mask, the soft-cap and a softmax.

The rule (transformers 5.x, masking_utils.sliding_window_overlay, combined with the causal
mask by sliding_window_causal_mask_function for Gemma 2/3 and Mistral's
create_sliding_window_causal_mask): the query at position p sees key k iff
p - W < k <= p, that is W keys with its own. Soft-cap (Gemma 2's eager_attention_forward):
scale, then c * tanh(score / c), then the mask."""

from __future__ import annotations

import pytest
import torch

from kernels import check_attention_options, effective_window
from kernels.reference.backend import TorchBackend, paged_attention_ref
from kernels.reference.step_plan import sliding_window_mask
from tests.kernels.paged_cases import (
    make_case,
    naive_attention,
    poison_before_window,
    reference_attention,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

BLOCK_SIZE = 16
# Smaller than a block, one block, several blocks (17 = one block and one token), larger
# than every context (the plain path).
WINDOWS = [5, 16, 17, 40, 1000]
SOFTCAPS = [None, 50.0, 5.0]

# (seq_lens, q_lens): block-boundary contexts (15, 16, 17, 32, 33, 48) and longer ones.
BATCHES = {
    "decode": ([1, 15, 16, 17, 32, 33, 48, 300], [1] * 8),
    "single_decode": ([300], [1]),
    "chunks": ([300, 48, 17, 64], [45, 48, 2, 16]),
    "mixed": ([17, 1, 300, 16, 64, 33], [1, 1, 23, 16, 1, 17]),
}
# (group, head_size, pool layout): GQA 1/2/4, head 64 and 96 (not a power of two),
# shuffled blocks gathered, or consecutive blocks read in place from a head-major pool.
SHAPES = [
    (1, 64, "shuffled"),
    (2, 96, "consecutive"),
    (4, 64, "head_major"),
    (4, 96, "consecutive"),
]


def _case(batch: str, group: int, head_size: int, layout: str, dtype=torch.float32,
          seed: int = 0):
    seq_lens, q_lens = BATCHES[batch]
    return make_case(seq_lens, q_lens, num_kv_heads=2, group=group, head_size=head_size,
                     block_size=BLOCK_SIZE, dtype=dtype, seed=seed,
                     consecutive=layout == "consecutive",
                     head_major=layout in ("consecutive", "head_major"))


def _check(out: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> None:
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected.double(), atol=atol, rtol=atol)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"g{g}-h{h}-{lay}" for g, h, lay in SHAPES])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("softcap", SOFTCAPS, ids=["nocap", "cap50", "cap5"])
@pytest.mark.parametrize("window", WINDOWS, ids=[f"w{w}" for w in WINDOWS])
def test_reference_matches_naive_oracle(window, softcap, batch, shape):
    case = _case(batch, *shape)
    out = reference_attention(case, sliding_window=window, logit_softcap=softcap)
    _check(out, naive_attention(case, window, softcap))


@pytest.mark.parametrize("softcap", [50.0, 5.0])
def test_softcap_without_window_matches_naive_oracle(softcap):
    case = _case("mixed", 2, 64, "shuffled", seed=1)
    _check(reference_attention(case, logit_softcap=softcap),
           naive_attention(case, None, softcap))


def test_options_change_the_output():
    # The cases above would pass with the options ignored only if they did nothing.
    case = _case("mixed", 2, 64, "shuffled", seed=2)
    plain = reference_attention(case)
    for options in (dict(sliding_window=5), dict(logit_softcap=5.0)):
        assert (reference_attention(case, **options) - plain).abs().max() > 1e-2


def test_window_of_w_sees_w_keys_with_its_own():
    # Query positions 3 and 4 of a 5-token context, W = 2: keys (2, 3) and (3, 4).
    expected = torch.tensor([[False, False, True, True, False],
                             [False, False, False, True, True]])
    assert torch.equal(sliding_window_mask(2, 5, 2, 0, torch.device("cpu")), expected)
    # The same rows, keys from position 2 on.
    assert torch.equal(sliding_window_mask(2, 5, 2, 2, torch.device("cpu")), expected[:, 2:])
    # W = 1: each token sees itself alone.
    case = make_case([20], [20], num_kv_heads=1, group=1, head_size=64, block_size=16)
    out = reference_attention(case, sliding_window=1)
    keys = case.meta.block_tables[0].long()
    values = case.v_cache[keys].flatten(0, 1)[:20]  # [20, 1, 64]
    torch.testing.assert_close(out, values)


def test_bfloat16_with_options_matches_oracle():
    case = _case("mixed", 4, 96, "head_major", dtype=torch.bfloat16, seed=3)
    out = reference_attention(case, sliding_window=17, logit_softcap=5.0)
    _check(out, naive_attention(case, 17, 5.0), atol=2e-2)


def test_functional_reference_equals_backend():
    case = _case("mixed", 2, 64, "shuffled", seed=4)
    out = paged_attention_ref(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                              sliding_window=17, logit_softcap=50.0)
    assert torch.equal(out, reference_attention(case, 17, 50.0))


def test_one_backend_alternates_windowed_and_global_layers():
    # Gemma-style steps: sliding and global layers interleave with one metadata object.
    backend = TorchBackend()
    for seed, batch in enumerate(("mixed", "decode", "mixed")):
        case = _case(batch, 2, 64, "shuffled", seed=seed)
        for window, softcap in ((16, 50.0), (None, 50.0), (16, None), (5, None), (None, None)):
            out = backend.attention(case.query, case.k_cache, case.v_cache, case.meta,
                                    case.scale, sliding_window=window, logit_softcap=softcap)
            _check(out, naive_attention(case, window, softcap))


@pytest.mark.parametrize("placeholder", [None, 2**30], ids=["nan_block", "past_the_pool"])
@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("layout", ["shuffled", "consecutive"])
@pytest.mark.parametrize("batch", ["decode", "single_decode", "chunks", "mixed"])
def test_blocks_before_the_window_are_never_read(batch, layout, softcap, placeholder):
    # NaN blocks catch a read that is masked; an id past the pool, one that is gathered
    # and then sliced off.
    case = _case(batch, 2, 64, layout, seed=5)
    window = 17
    poisoned, count = poison_before_window(case, window, placeholder)
    assert count > 0
    out = reference_attention(poisoned, window, softcap)
    assert torch.isfinite(out).all()
    assert torch.equal(out, reference_attention(case, window, softcap))


@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_bad_window_is_rejected(window):
    case = _case("single_decode", 1, 64, "shuffled")
    with pytest.raises(ValueError, match="sliding_window"):
        reference_attention(case, sliding_window=window)


@pytest.mark.parametrize("softcap", [0.0, -1.0])
def test_bad_softcap_is_rejected(softcap):
    case = _case("single_decode", 1, 64, "shuffled")
    with pytest.raises(ValueError, match="logit_softcap"):
        reference_attention(case, logit_softcap=softcap)


def test_option_helpers():
    check_attention_options(None, None)
    check_attention_options(4096, 50.0)
    assert effective_window(None, 10) is None
    assert effective_window(10, 10) is None  # a window as long as the context hides nothing
    assert effective_window(9, 10) == 9


@pytest.mark.parametrize("q_len", [50, 7, 1])
@pytest.mark.parametrize("window, softcap", [(17, 50.0), (5, 5.0), (16, None)])
def test_matches_transformers_gemma2_eager_attention(q_len, window, softcap):
    # transformers' own mask function and Gemma 2's eager attention (scale, soft-cap,
    # mask, fp32 softmax) on the dense K/V of one sequence: our last q_len rows must
    # equal its last q_len rows.
    masking_utils = pytest.importorskip("transformers.masking_utils")
    gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2")
    seq_len, group = 50, 2
    case = make_case([seq_len], [q_len], num_kv_heads=2, group=group, head_size=64,
                     block_size=BLOCK_SIZE, seed=6)
    positions = torch.arange(seq_len)
    blocks = case.meta.block_tables[0].long()[positions // BLOCK_SIZE]
    keys = case.k_cache[blocks, positions % BLOCK_SIZE].transpose(0, 1)[None]  # [1, nkv, L, hd]
    values = case.v_cache[blocks, positions % BLOCK_SIZE].transpose(0, 1)[None]
    gen = torch.Generator().manual_seed(7)
    query = torch.randn(seq_len, case.query.shape[1], 64, generator=gen)
    query[seq_len - q_len:] = case.query
    mask_fn = masking_utils.sliding_window_causal_mask_function(window)
    seen = mask_fn(0, 0, positions[:, None], positions[None, :])
    additive = torch.zeros(seq_len, seq_len).masked_fill(~seen, float("-inf"))[None, None]
    module = type("Attn", (), {"num_key_value_groups": group, "training": False,
                               "head_dim": 64})()
    expected, _ = gemma2.eager_attention_forward(
        module, query.transpose(0, 1)[None], keys, values, additive, scaling=case.scale,
        softcap=softcap)  # [1, L, nq, hd]
    out = reference_attention(case, sliding_window=window, logit_softcap=softcap)
    torch.testing.assert_close(out, expected[0, seq_len - q_len:], atol=1e-5, rtol=1e-5)

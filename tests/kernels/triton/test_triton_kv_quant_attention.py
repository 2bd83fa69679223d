"""The Triton attention kernels reading int8, fp8 and int4 pools in place, against the
PyTorch reference (and, with sinks, the float64 naive oracle) run over float pools that
hold `format.decode` of the same bytes (tests/kernels/triton/kv_quant_cases.py); the
backend's int4 rotation against the reference over the unrotated values. Interpreted on
CPU, compiled on CUDA."""

from __future__ import annotations

import pytest
import torch

from kernels.kv_format import format_named
from kernels.triton.backend import TritonBackend
from kernels.triton.decode import paged_decode
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
from tests.kernels.triton.kv_quant_cases import QUANTIZED, quantize_case, quantized_case

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
                                  group=group, head_size=head_size, block_size=block_size)
    out = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                       num_splits=num_splits)
    assert_matches(out, reference_attention(oracle))


# One case per dtype (bfloat16 runs compiled only): each case compiles its own kernels.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", QUANTIZED)
def test_decode_in_each_query_dtype(name, dtype):
    case, oracle = quantized_case(name, [16, 200], [1, 1], num_kv_heads=2, group=4,
                                  head_size=128, block_size=16, dtype=dtype, seed=8)
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
                                  head_size=64, block_size=16, seed=1)
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
                                  head_size=head_size, block_size=16, seed=2)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale)
    assert_matches(out, reference_attention(oracle))


@pytest.mark.parametrize("name", QUANTIZED)
def test_prefill_with_window_softcap_and_sinks(name):
    case, oracle = quantized_case(name, [17, 100, 33], [17, 30, 1], num_kv_heads=2, group=2,
                                  head_size=64, block_size=16, seed=3)
    sinks = sinks_for(4).to(DEVICE)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                        sliding_window=40, logit_softcap=5.0, sinks=sinks)
    _close_to_naive(out, oracle, 40, 5.0, sinks)


@pytest.mark.parametrize("name", QUANTIZED)
def test_shared_prefix_decode_reads_quantized_pools(name):
    # Candidates 0, 2 and 3 share a 3-block prompt; 1 is alone.
    lens = [53, 23, 49, 64]
    case, oracle = quantized_case(name, lens, [1] * 4, num_kv_heads=2, group=3, head_size=64,
                                  block_size=16, shared={2: (0, 3), 3: (0, 3)}, seed=4)
    groups = find_shared_prefix_groups(case.meta.block_tables, case.meta.seq_lens, 16)
    assert [g.seq_indices for g in groups] == [(0, 2, 3)]
    out = shared_prefix_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                               groups, num_splits=2, logit_softcap=5.0)
    assert_matches(out, reference_attention(oracle, logit_softcap=5.0))


@pytest.mark.parametrize("name", QUANTIZED)
def test_backend_writes_then_attends_a_mixed_batch(name):
    """Through TritonBackend as the engine calls it: the step's new K/V written into the
    pool (int4 rotated there), then a prompt chunk and a decode row attended (int4: the
    query rotated and the output rotated back), against the reference over the decoded
    values in the original space."""
    fmt = format_named(name)
    base = make_case([40, 21], [8, 1], num_kv_heads=2, group=2, head_size=64, block_size=16,
                     seed=5)
    case, _ = quantize_case(base, fmt)
    meta = base.meta
    # Each sequence's new tokens are its last q_len positions.
    slots = []
    for i, (seq_len, q_len) in enumerate(zip([40, 21], [8, 1], strict=True)):
        for pos in range(seq_len - q_len, seq_len):
            slots.append(int(meta.block_tables[i, pos // 16]) * 16 + pos % 16)
    gen = torch.Generator().manual_seed(6)
    new_k = torch.randn((9, 2, 64), generator=gen).to(DEVICE)
    new_v = torch.randn((9, 2, 64), generator=gen).to(DEVICE)
    backend = TritonBackend(shared_prefix=True, min_shared_blocks=1)
    backend.write_kv(new_k, new_v, case.k_cache, case.v_cache,
                     torch.tensor(slots, dtype=torch.int64, device=DEVICE))
    out = backend.attention(case.query, case.k_cache, case.v_cache, meta, case.scale)
    # Unrotated values: rotate is its own inverse (the identity for the 8-bit formats).
    oracle = type(base)(base.query, fmt.rotate(fmt.decode(case.k_cache)),
                        fmt.rotate(fmt.decode(case.v_cache)), meta, base.scale)
    assert_matches(out, reference_attention(oracle))
    # The decoded pool is near the float values it encodes (the write went where it should).
    k_flat = fmt.rotate(fmt.decode(case.k_cache)).reshape(-1, 2, 64)
    error = (k_flat[torch.tensor(slots)] - new_k).abs().max().item()
    assert error < {"int8": 0.03, "fp8": 0.3, "int4": 0.8}[name]


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_backend_shared_prefix_decode_over_a_quantized_pool(name, monkeypatch):
    fmt = format_named(name)
    base = make_case([70, 72], [1, 1], num_kv_heads=1, group=2, head_size=128, block_size=16,
                     shared={1: (0, 4)}, seed=7)
    case, _ = quantize_case(base, fmt)
    calls = []
    monkeypatch.setattr("kernels.triton.backend.shared_prefix_decode",
                        lambda *a, **k: calls.append(1) or shared_prefix_decode(*a, **k))
    out = TritonBackend(shared_prefix=True, min_shared_blocks=2).attention(
        case.query, case.k_cache, case.v_cache, case.meta, case.scale)
    assert calls == [1]
    oracle = type(base)(base.query, fmt.rotate(fmt.decode(case.k_cache)),
                        fmt.rotate(fmt.decode(case.v_cache)), base.meta, base.scale)
    assert_matches(out, reference_attention(oracle))


def test_quantized_pool_of_the_wrong_head_size_is_refused():
    case, _ = quantized_case("int8", [17], [1], num_kv_heads=1, group=2, head_size=64,
                             block_size=16)
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

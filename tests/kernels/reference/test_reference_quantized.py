"""The PyTorch reference over quantized KV pools (int8, int4, fp8: kernels/kv_format.py):
attention reading a quantized pool equals attention over a float pool holding what the
quantized one decodes to (unrotated, for int4), in prefill chunks, batched and single
decode, mixed batches, GQA, sliding windows, soft-caps, sinks and the candidates'
shared-prefix decode; write_kv stores `encode`'s bytes (an int4 pool's keys, a block at
a time through its stage: `encode_keys`'); copies and swaps move rows as they are."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels import allocate_kv_cache
from kernels.key_stage import KeyStage
from kernels.kv_format import FP8, INT4, INT8, KVFormat
from kernels.reference.backend import TorchBackend, copy_blocks_ref, swap_blocks_ref
from tests.kernels.paged_cases import PagedCase, make_case, reference_attention
from tests.kernels.reference.test_reference_sinks import sinks_for

pytestmark = pytest.mark.usefixtures("single_torch_thread")

FORMATS = [INT8, INT4, FP8]
# (seq_lens, q_lens, shared)
BATCHES = {
    "prefill": ([48, 17, 64], [48, 2, 16], None),
    "decode": ([1, 15, 16, 17, 33, 140], [1] * 6, None),
    "single_decode": ([300], [1], None),
    "mixed": ([17, 1, 150, 64, 33], [1, 1, 23, 1, 17], None),
    "candidates": ([70, 72, 75], [1, 1, 1], {1: (0, 4), 2: (0, 4)}),
}
# (group, head_size, layout): GQA 1/2/4; 96 is not a power of two (int4: one scale per
# head, three 32-element rotation blocks); 128 keeps two int4 groups.
SHAPES = [(1, 64, "shuffled"), (2, 96, "head_major"), (4, 128, "head_major"),
          (4, 64, "consecutive")]


def quantized_case(case: PagedCase, fmt: KVFormat, head_major: bool) -> tuple[PagedCase,
                                                                                PagedCase]:
    """(the case over a `fmt` pool holding its K/V encoded, the case over a float32 pool
    holding what that pool decodes to, rotated back)."""
    num_blocks, block_size, num_kv_heads, head_size = case.k_cache.shape
    pools = allocate_kv_cache(1, num_blocks, block_size, num_kv_heads, head_size,
                              fmt.storage, "cpu", head_major=head_major)[0]
    k_pool, v_pool = pools[0], pools[1]
    k_pool.view(torch.uint8).copy_(fmt.encode_keys(case.k_cache).view(torch.uint8))
    v_pool.view(torch.uint8).copy_(fmt.encode(case.v_cache).view(torch.uint8))
    plain = [fmt.rotate(fmt.decode_keys(k_pool)), fmt.rotate(fmt.decode(v_pool))]
    return (dataclasses.replace(case, k_cache=k_pool, v_cache=v_pool),
            dataclasses.replace(case, k_cache=plain[0], v_cache=plain[1]))


def _case(batch: str, group: int, head_size: int, layout: str, fmt: KVFormat):
    seq_lens, q_lens, shared = BATCHES[batch]
    if shared and fmt.keys_by_block:  # the same 64 tokens in blocks of 32 or 64
        shared = {i: (source, n * 16 // block_size(fmt)) for i, (source, n) in shared.items()}
    if shared and layout == "consecutive":
        layout = "head_major"  # shared blocks are not one run per sequence
    case = make_case(seq_lens, q_lens, num_kv_heads=2, group=group, head_size=head_size,
                     block_size=block_size(fmt), shared=shared,
                     consecutive=layout == "consecutive")
    return quantized_case(case, fmt, head_major=layout != "shuffled")


def block_size(fmt: KVFormat) -> int:
    """16, as the engine's blocks; int4's keys need blocks of 32, int8's of 64."""
    return max(16, fmt.min_block_size)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"g{s[0]}-hd{s[1]}-{s[2]}")
def test_quantized_pool_reads_as_its_decoded_values(fmt, batch, shape):
    quantized, plain = _case(batch, *shape, fmt)
    out = reference_attention(quantized)
    torch.testing.assert_close(out, reference_attention(plain), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("batch", ["prefill", "decode", "mixed", "candidates"])
@pytest.mark.parametrize("window", [None, 7, 40], ids=["full", "w7", "w40"])
@pytest.mark.parametrize("softcap", [None, 5.0], ids=["nocap", "cap5"])
def test_windows_softcaps_and_sinks_over_quantized_pools(fmt, batch, window, softcap):
    quantized, plain = _case(batch, 3, 64, "head_major", fmt)
    for sinks in (None, sinks_for(6)):
        out = reference_attention(quantized, window, softcap, sinks)
        expected = reference_attention(plain, window, softcap, sinks)
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("fmt,tolerance", [(INT8, 0.005), (FP8, 0.02), (INT4, 0.08)],
                         ids=["int8", "fp8", "int4"])
def test_quantized_attention_stays_near_the_float_pool(fmt, tolerance):
    """The quantization error itself, against the unquantized K/V (random normal): the
    mean error is a few percent of the outputs' mean size (about 0.29) or less; a wrong
    scale, nibble order or a missing rotation back is off by about that whole size."""
    case = make_case([300, 48, 17], [1, 48, 1], num_kv_heads=2, group=2, head_size=128,
                     block_size=block_size(fmt))
    quantized, _ = quantized_case(case, fmt, head_major=True)
    error = (reference_attention(quantized) - reference_attention(case)).abs().mean()
    assert error < tolerance


@pytest.mark.parametrize("fmt", [FP8], ids=lambda f: f.name)
@pytest.mark.parametrize("head_major", [False, True], ids=["blocks", "head_major"])
def test_write_kv_stores_the_encoded_rows(fmt, head_major):
    gen = torch.Generator().manual_seed(1)
    pools = allocate_kv_cache(1, 6, 16, 2, 128, fmt.storage, "cpu", head_major=head_major)[0]
    key, value = torch.randn(2, 20, 2, 128, generator=gen).unbind(0)
    slots = torch.randperm(6 * 16, generator=gen)[:20]
    slots[3] = -1  # a padding token: skipped
    TorchBackend().write_kv(key, value, pools[0], pools[1], slots)
    flat = [pool.flatten(0, 1).view(torch.uint8) for pool in pools]
    keep = slots >= 0
    assert torch.equal(flat[0][slots[keep]], fmt.encode(key[keep]).view(torch.uint8))
    assert torch.equal(flat[1][slots[keep]], fmt.encode(value[keep]).view(torch.uint8))
    untouched = torch.ones(6 * 16, dtype=torch.bool)
    untouched[slots[keep]] = False
    assert not flat[0][untouched].any()


@pytest.mark.parametrize("fmt", [INT4, INT8], ids=lambda f: f.name)
@pytest.mark.parametrize("head_major", [False, True], ids=["blocks", "head_major"])
def test_write_kv_encodes_keys_by_block_through_the_stage(fmt, head_major):
    """Two sequences on blocks 3, 1 and 4, 0: a prefill chunk, then a token at a time,
    then a chunk across a block boundary; the key blocks equal `encode_keys` of all the
    rows so far, the value rows `encode`'s, every other row untouched."""
    gen = torch.Generator().manual_seed(1)
    bs = fmt.min_block_size
    n = 2 * bs + 6
    pool = allocate_kv_cache(1, 6, bs, 2, 64, fmt.storage, "cpu", head_major=head_major)
    backend = TorchBackend()
    backend.key_stages.attach(KeyStage(pool, slots=2))
    key, value = torch.randn(2, 2, n, 2, 64, generator=gen).unbind(0)
    tables = [[3, 1, 5], [4, 0, 2]]
    steps = [(0, 20), *((p, p + 1) for p in range(20, 30)), (30, n)]
    for start, end in steps:
        slots = torch.tensor([tables[s][p // bs] * bs + p % bs
                              for s in range(2) for p in range(start, end)])
        keys, values = (torch.cat([x[s, start:end] for s in range(2)]) for x in (key, value))
        backend.write_kv(keys, values, pool[0, 0], pool[0, 1], slots)
    k_pool, v_pool = (pool[0, i].view(torch.uint8) for i in range(2))
    for s in range(2):
        blocks = torch.tensor(tables[s])
        want = torch.zeros(3, bs, 2, 64)
        want.view(3 * bs, 2, 64)[:n] = key[s]
        expected = fmt.encode_keys(want, torch.tensor([bs, bs, 6]))
        assert torch.equal(k_pool[blocks], expected.view(torch.uint8))
        values = v_pool[blocks].flatten(0, 1)
        assert torch.equal(values[:n], fmt.encode(value[s]).view(torch.uint8))
        assert not values[n:].any()


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_copies_and_swaps_move_quantized_rows_as_they_are(fmt):
    gen = torch.Generator().manual_seed(2)
    device_pool = allocate_kv_cache(2, 5, 8, 2, 64, fmt.storage, "cpu", head_major=True)
    host_pool = allocate_kv_cache(2, 3, 8, 2, 64, fmt.storage, "cpu", head_major=True)
    device_pool.view(torch.uint8).copy_(fmt.encode(torch.randn(
        2, 2, 5, 8, 2, 64, generator=gen)).view(torch.uint8))
    before = device_pool.view(torch.uint8).clone()
    copy_blocks_ref(device_pool, torch.tensor([0, 1]), torch.tensor([3, 4]))
    after = device_pool.view(torch.uint8)
    assert torch.equal(after[:, :, 3:5], before[:, :, 0:2])
    assert torch.equal(after[:, :, :3], before[:, :, :3])
    swap_blocks_ref(device_pool, host_pool, torch.tensor([2, 4]), torch.tensor([1, 0]))
    host = host_pool.view(torch.uint8)
    assert torch.equal(host[:, :, 1], before[:, :, 2]) and torch.equal(host[:, :, 0],
                                                                       before[:, :, 1])
    device_pool.zero_()
    swap_blocks_ref(host_pool, device_pool, torch.tensor([1]), torch.tensor([0]))
    assert torch.equal(device_pool.view(torch.uint8)[:, :, 0], before[:, :, 2])


def test_swap_refuses_pools_of_two_formats():
    a = allocate_kv_cache(1, 2, 8, 1, 64, torch.int8, "cpu", head_major=True)  # rows of 67
    b = allocate_kv_cache(1, 2, 8, 1, 65, torch.float8_e4m3fn, "cpu", head_major=True)
    with pytest.raises(ValueError, match="same KV format"):
        swap_blocks_ref(a, b, torch.tensor([0]), torch.tensor([0]))

"""The PyTorch paged-attention backend against naive dense attention computed from each
sequence's contiguous K/V (never through a block table)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from kernels import AttentionMetadata, allocate_kv_cache, get_backend
from kernels.reference.backend import TorchBackend, paged_attention_ref
from kernels.reference.block_reads import block_ids, heads_of_blocks
from kernels.reference.step_plan import causal_mask

pytestmark = pytest.mark.usefixtures("single_torch_thread")

BLOCK_SIZE = 16
HEAD_SIZE = 32
NUM_KV_HEADS = 2
CONTEXT_LENS = [1, 15, 16, 17, 300]


def dense_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """query [q_len, nq, hd] are the last q_len positions of keys/values [seq_len, nkv, hd]."""
    q_len, num_q_heads, _ = query.shape
    seq_len, num_kv_heads, _ = keys.shape
    group = num_q_heads // num_kv_heads
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.double(), k) * scale
    query_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
    scores = scores.masked_fill(torch.arange(seq_len)[None, :] > query_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@dataclass(slots=True)
class Helpers:
    """The conftest helpers Batch uses (fixtures, so passed in rather than imported)."""

    build_metadata: Callable[..., AttentionMetadata]
    shuffled_tables: Callable[..., list[list[int]]]


class Batch:
    """Random contiguous K/V per sequence, scattered into a pool of random garbage.

    head_major: the pool in kernels.allocate_kv_cache's head-major memory order.
    consecutive: each sequence's blocks are consecutive ids (read as a view, not gathered).
    """

    def __init__(self, helpers: Helpers, seq_lens: list[int], q_lens: list[int], group: int,
                 dtype: torch.dtype = torch.float32, shared_blocks: int = 0,
                 seed: int = 0, head_major: bool = False, consecutive: bool = False) -> None:
        gen = torch.Generator().manual_seed(seed)
        counts = [-(-n // BLOCK_SIZE) for n in seq_lens]
        num_blocks = sum(counts) + 5
        if consecutive:
            starts = [2 + sum(counts[:i]) for i in range(len(counts))]
            self.tables = [list(range(a, a + n)) for a, n in zip(starts, counts, strict=True)]
        else:
            self.tables = helpers.shuffled_tables(counts, num_blocks, gen)
        if shared_blocks:
            # Sequence 1 starts with sequence 0's first blocks (a forked prompt).
            self.tables[1][:shared_blocks] = self.tables[0][:shared_blocks]
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
        self.k_cache = torch.randn(shape, generator=gen).to(dtype)
        self.v_cache = torch.randn(shape, generator=gen).to(dtype)
        self.keys, self.values = [], []
        for i, length in enumerate(seq_lens):
            k = torch.randn(length, NUM_KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
            v = torch.randn(length, NUM_KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
            if i == 1 and shared_blocks:
                prefix = shared_blocks * BLOCK_SIZE
                k[:prefix], v[:prefix] = self.keys[0][:prefix], self.values[0][:prefix]
            for pos in range(length):
                block = self.tables[i][pos // BLOCK_SIZE]
                self.k_cache[block, pos % BLOCK_SIZE] = k[pos]
                self.v_cache[block, pos % BLOCK_SIZE] = v[pos]
            self.keys.append(k)
            self.values.append(v)
        if head_major:
            for name in ("k_cache", "v_cache"):
                pool = allocate_kv_cache(1, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE,
                                         dtype, "cpu", head_major=True)[0, 0]
                setattr(self, name, pool.copy_(getattr(self, name)))
        cached = [s - q for s, q in zip(seq_lens, q_lens, strict=True)]
        self.meta = helpers.build_metadata(self.tables, cached, q_lens, BLOCK_SIZE)
        num_q_heads = NUM_KV_HEADS * group
        self.query = torch.randn(sum(q_lens), num_q_heads, HEAD_SIZE, generator=gen).to(dtype)
        self.q_lens = q_lens
        self.scale = HEAD_SIZE**-0.5

    def expected(self) -> torch.Tensor:
        outs, start = [], 0
        for k, v, q_len in zip(self.keys, self.values, self.q_lens, strict=True):
            outs.append(dense_attention(self.query[start:start + q_len], k, v, self.scale))
            start += q_len
        return torch.cat(outs)

    def run(self) -> torch.Tensor:
        return TorchBackend().attention(self.query, self.k_cache, self.v_cache, self.meta,
                                        self.scale)


@pytest.fixture
def make_batch(build_attention_metadata, shuffled_block_tables) -> Callable[..., Batch]:
    """Batch(seq_lens, q_lens, group, dtype=, shared_blocks=, seed=)."""
    return functools.partial(Batch, Helpers(build_attention_metadata, shuffled_block_tables))


def check(batch: Batch, atol: float = 1e-5) -> None:
    out = batch.run()
    assert out.shape == batch.query.shape and out.dtype == batch.query.dtype
    torch.testing.assert_close(out.double(), batch.expected(), atol=atol, rtol=atol)


# Pool memory order x block ids: gathered from shuffled blocks or read in place.
LAYOUTS = pytest.mark.parametrize("head_major, consecutive",
                                  [(False, False), (True, False), (True, True)])


@LAYOUTS
@pytest.mark.parametrize("group", [1, 3])
def test_decode_batch_matches_dense(make_batch, group, head_major, consecutive):
    check(make_batch(CONTEXT_LENS, [1] * len(CONTEXT_LENS), group, head_major=head_major,
                     consecutive=consecutive))


@LAYOUTS
@pytest.mark.parametrize("seq_len", CONTEXT_LENS)
@pytest.mark.parametrize("group", [1, 3])
def test_single_sequence_decode_matches_dense(make_batch, seq_len, group, head_major,
                                              consecutive):
    check(make_batch([seq_len], [1], group, seed=seq_len, head_major=head_major,
                     consecutive=consecutive))


@pytest.mark.parametrize("group", [1, 3])
def test_full_prefill_matches_dense(make_batch, group):
    check(make_batch(CONTEXT_LENS, CONTEXT_LENS, group))


@LAYOUTS
@pytest.mark.parametrize("group", [1, 3])
def test_chunks_with_cached_prefix_match_dense(make_batch, group, head_major, consecutive):
    # Chunk sizes that end mid-block, exactly on a boundary, and span several blocks.
    check(make_batch([15, 16, 17, 300, 40], [7, 16, 2, 45, 33], group, seed=1,
                     head_major=head_major, consecutive=consecutive))


@LAYOUTS
@pytest.mark.parametrize("group", [1, 3])
def test_mixed_prefill_and_decode_batch_matches_dense(make_batch, group, head_major,
                                                      consecutive):
    check(make_batch([17, 1, 40, 16, 300], [1, 1, 23, 16, 1], group, seed=2,
                     head_major=head_major, consecutive=consecutive))


def test_head_major_pool_is_indexed_like_a_contiguous_one():
    pool = allocate_kv_cache(2, 5, 4, 3, 8, torch.float32, "cpu", head_major=True)
    assert pool.shape == (2, 2, 5, 4, 3, 8) and not pool.any()
    # Each KV head of a layer is one run of slots over the whole pool.
    assert pool.stride() == (2 * 3 * 5 * 4 * 8, 3 * 5 * 4 * 8, 4 * 8, 8, 5 * 4 * 8, 1)
    plain = allocate_kv_cache(2, 5, 4, 3, 8, torch.float32, "cpu", head_major=False)
    assert plain.shape == pool.shape and plain.is_contiguous()
    # Consecutive blocks are read in place, in either layout; head-major rows are dense.
    for cache in (pool, plain):
        context = heads_of_blocks(cache[1, 0], slice(2, 4), 5)
        assert context.shape == (3, 5, 8)
        assert context.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()
    assert heads_of_blocks(pool[1, 0], slice(2, 4), 5)[0].is_contiguous()


def test_cache_ops_on_a_head_major_pool_equal_those_on_a_contiguous_one():
    gen = torch.Generator().manual_seed(9)
    plain = allocate_kv_cache(2, 6, 4, 2, 8, torch.float32, "cpu", head_major=False)
    plain.copy_(torch.randn(plain.shape, generator=gen))
    pools = [plain, allocate_kv_cache(2, 6, 4, 2, 8, torch.float32, "cpu", head_major=True)]
    pools[1].copy_(plain)
    key, value = torch.randn(2, 2, 2, 8, generator=gen)
    backend = TorchBackend()
    for pool in pools:
        backend.write_kv(key, value, pool[1, 0], pool[1, 1], torch.tensor([5, 22]))
        backend.copy_blocks(pool, torch.tensor([1, 5]), torch.tensor([3, 0]))
        host = torch.zeros(2, 2, 2, 4, 2, 8)
        backend.swap_blocks(pool, host, torch.tensor([3, 4]), torch.tensor([1, 0]))
        backend.swap_blocks(host, pool, torch.tensor([0]), torch.tensor([2]))
    assert torch.equal(pools[0], pools[1])
    assert torch.equal(pools[1][1, 0, 1, 1], key[0]) and torch.equal(pools[1][1, 1, 5, 2], value[1])


@pytest.mark.parametrize("q_lens", [[1, 1], [1, 9]])
def test_shared_prefix_blocks_match_dense(make_batch, q_lens):
    batch = make_batch([40, 45], q_lens, group=3, shared_blocks=2, seed=3)
    assert batch.tables[0][:2] == batch.tables[1][:2]
    check(batch)


@pytest.mark.parametrize("q_lens", [[1, 20, 33, 1], [1, 1, 1, 1]])
def test_bfloat16_matches_dense_within_bf16_precision(make_batch, q_lens):
    batch = make_batch([17, 300, 33, 5], q_lens, group=3, dtype=torch.bfloat16, seed=4)
    check(batch, atol=2e-2)


def test_functional_oracle_equals_backend(make_batch):
    batch = make_batch([17, 40], [5, 40], group=3, seed=5)
    expected = batch.run()
    out = paged_attention_ref(batch.query, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert torch.equal(out, expected)


def test_heads_of_blocks_follow_the_block_table(make_batch):
    batch = make_batch([40], [1], group=1, seed=6)
    ids = block_ids(batch.meta.block_tables[0], 3, batch.k_cache.device)
    assert torch.equal(heads_of_blocks(batch.k_cache, ids, 40), batch.keys[0].transpose(0, 1))


def test_causal_mask_aligns_new_tokens_to_the_end():
    assert causal_mask(1, 5, torch.device("cpu")) is None
    expected = torch.tensor([[True, True, True, True, False],
                             [True, True, True, True, True]])
    assert torch.equal(causal_mask(2, 5, torch.device("cpu")), expected)


def test_write_kv_scatters_to_slots_and_skips_minus_one():
    k_cache = torch.zeros(4, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(3, NUM_KV_HEADS, HEAD_SIZE)
    value = torch.randn(3, NUM_KV_HEADS, HEAD_SIZE)
    slots = torch.tensor([2 * BLOCK_SIZE + 5, -1, 0 * BLOCK_SIZE + 15])
    TorchBackend().write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache[2, 5], key[0]) and torch.equal(v_cache[2, 5], value[0])
    assert torch.equal(k_cache[0, 15], key[2]) and torch.equal(v_cache[0, 15], value[2])
    written = torch.zeros(4, BLOCK_SIZE, dtype=torch.bool)
    written[2, 5] = written[0, 15] = True
    assert int(k_cache.abs().sum(dim=(2, 3)).ne(0).sum()) == 2
    assert bool(k_cache[~written].eq(0).all()) and bool(v_cache[~written].eq(0).all())


def test_write_kv_on_a_layer_view_of_the_full_cache():
    kv_cache = torch.zeros(3, 2, 4, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    key, value = torch.randn(2, 1, NUM_KV_HEADS, HEAD_SIZE).unbind(0)
    TorchBackend().write_kv(key, value, kv_cache[1, 0], kv_cache[1, 1], torch.tensor([17]))
    assert torch.equal(kv_cache[1, 0, 1, 1], key[0])
    assert torch.equal(kv_cache[1, 1, 1, 1], value[0])
    assert int(kv_cache.ne(0).sum()) == 2 * NUM_KV_HEADS * HEAD_SIZE


def test_copy_blocks_copies_every_layer_and_reads_sources_first():
    kv_cache = torch.randn(3, 2, 6, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    before = kv_cache.clone()
    # Block 2 is both a destination and a source: it must be copied out before it changes.
    TorchBackend().copy_blocks(kv_cache, torch.tensor([1, 2]), torch.tensor([2, 4]))
    assert torch.equal(kv_cache[:, :, 2], before[:, :, 1])
    assert torch.equal(kv_cache[:, :, 4], before[:, :, 2])
    for block in (0, 1, 3, 5):
        assert torch.equal(kv_cache[:, :, block], before[:, :, block])


def test_copy_blocks_with_nothing_to_copy_is_a_no_op():
    kv_cache = torch.randn(1, 2, 3, BLOCK_SIZE, 1, 4)
    before = kv_cache.clone()
    empty = torch.tensor([], dtype=torch.int64)
    TorchBackend().copy_blocks(kv_cache, empty, empty)
    assert torch.equal(kv_cache, before)


def test_swap_blocks_out_and_back_in():
    device_pool = torch.randn(2, 2, 6, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    host_pool = torch.zeros(2, 2, 3, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    original = device_pool.clone()
    backend = TorchBackend()
    backend.swap_blocks(device_pool, host_pool, torch.tensor([5, 1]), torch.tensor([0, 2]))
    assert torch.equal(host_pool[:, :, 0], original[:, :, 5])
    assert torch.equal(host_pool[:, :, 2], original[:, :, 1])
    assert bool(host_pool[:, :, 1].eq(0).all())
    device_pool[:, :, [1, 5]] = 0.0
    backend.swap_blocks(host_pool, device_pool, torch.tensor([0, 2]), torch.tensor([3, 0]))
    assert torch.equal(device_pool[:, :, 3], original[:, :, 5])
    assert torch.equal(device_pool[:, :, 0], original[:, :, 1])
    assert torch.equal(device_pool[:, :, 2], original[:, :, 2])


def test_swap_blocks_rejects_mismatched_layouts():
    with pytest.raises(ValueError, match="differ beyond num_blocks"):
        TorchBackend().swap_blocks(torch.zeros(2, 2, 4, 16, 2, 8), torch.zeros(2, 2, 4, 16, 1, 8),
                                   torch.tensor([0]), torch.tensor([0]))


def test_query_heads_must_be_a_multiple_of_kv_heads(make_batch):
    batch = make_batch([5], [1], group=1)
    query = torch.randn(1, 3, HEAD_SIZE)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        paged_attention_ref(query, batch.k_cache, batch.v_cache, batch.meta, batch.scale)


def test_get_backend_picks_the_reference_on_cpu_without_the_native_kernels(monkeypatch):
    monkeypatch.delenv("FOLIO_ATTENTION_BACKEND", raising=False)
    monkeypatch.setattr("kernels.cpu.available", lambda: False)
    backend = get_backend("cpu")
    assert isinstance(backend, TorchBackend) and backend.name == "torch"


def test_the_environment_still_picks_the_reference_on_cpu(monkeypatch):
    monkeypatch.setenv("FOLIO_ATTENTION_BACKEND", "torch")
    assert isinstance(get_backend("cpu"), TorchBackend)


def test_one_backend_serves_successive_steps_and_layers(make_batch):
    backend = TorchBackend()
    first = make_batch([17, 300], [1, 1], group=3, seed=7)
    second = make_batch([40, 2, 16], [1, 1, 1], group=3, seed=8)
    for batch in (first, second, first):
        for _ in range(2):  # two layers of one step share the metadata object
            out = backend.attention(batch.query, batch.k_cache, batch.v_cache, batch.meta,
                                    batch.scale)
            torch.testing.assert_close(out.double(), batch.expected(), atol=1e-5, rtol=1e-5)


def test_one_backend_writes_with_successive_slot_mappings():
    backend = TorchBackend()
    k_cache = torch.zeros(2, BLOCK_SIZE, 1, 4)
    v_cache = torch.zeros_like(k_cache)
    for slots in (torch.tensor([3, -1]), torch.tensor([20, 4])):
        key = torch.randn(2, 1, 4)
        backend.write_kv(key, key, k_cache, v_cache, slots)
        for row, slot in enumerate(slots.tolist()):
            if slot >= 0:
                assert torch.equal(k_cache.view(-1, 1, 4)[slot], key[row])
    assert int(k_cache.ne(0).any(dim=(2, 3)).sum()) == 3

"""Triton KV-cache writes, copy-on-write block copies and swaps (interpreted on CPU,
compiled on CUDA)."""

from __future__ import annotations

import pytest
import torch

from kernels.reference.backend import TorchBackend
from kernels.triton.backend import TritonBackend
from kernels.triton.cache import copy_blocks, swap_blocks, write_kv
from tests.kernels.paged_cases import DEVICE, DTYPES


def _pool(num_layers: int, num_blocks: int, block_size: int, nkv: int, head_size: int,
          dtype: torch.dtype, seed: int, device: torch.device = DEVICE) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (num_layers, 2, num_blocks, block_size, nkv, head_size)
    return torch.randn(shape, generator=gen).to(device, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size,nkv,head_size", [(16, 3, 64), (32, 2, 80), (16, 1, 128)])
def test_write_kv_stores_each_token_at_its_slot(block_size, nkv, head_size, dtype):
    kv = _pool(1, 6, block_size, nkv, head_size, dtype, seed=1)
    k_cache, v_cache = kv[0, 0], kv[0, 1]
    before = kv.clone()
    # The key comes out of a fused projection: a strided view, not a contiguous tensor.
    fused = torch.randn(5, 2 * nkv, head_size, generator=torch.Generator().manual_seed(2))
    fused = fused.to(DEVICE, dtype)
    key, value = fused[:, :nkv], fused[:, nkv:]
    slots = [3 * block_size + 1, -1, 0, 6 * block_size - 1, block_size]
    backend = TritonBackend()
    backend.write_kv(key, value, k_cache, v_cache,
                     torch.tensor(slots, dtype=torch.int64, device=DEVICE))
    expected = before.clone()
    for t, slot in enumerate(slots):
        if slot >= 0:
            expected[0, 0, slot // block_size, slot % block_size] = key[t]
            expected[0, 1, slot // block_size, slot % block_size] = value[t]
    assert torch.equal(kv, expected)
    reference = before.clone()
    TorchBackend().write_kv(key, value, reference[0, 0], reference[0, 1],
                            torch.tensor(slots, dtype=torch.int64, device=DEVICE))
    assert torch.equal(kv, reference)


def test_write_kv_with_every_slot_skipped_changes_nothing():
    kv = _pool(1, 2, 16, 1, 64, torch.float32, seed=3)
    before = kv.clone()
    key = torch.ones(3, 1, 64, device=DEVICE)
    write_kv(key, key, kv[0, 0], kv[0, 1], torch.full((3,), -1, dtype=torch.int64,
                                                      device=DEVICE))
    assert torch.equal(kv, before)


def test_write_kv_rejects_a_short_slot_mapping():
    kv = _pool(1, 2, 16, 1, 64, torch.float32, seed=3)
    key = torch.ones(3, 1, 64, device=DEVICE)
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv(key, key, kv[0, 0], kv[0, 1], torch.zeros(2, dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES)
def test_copy_blocks_copies_every_layer_and_leaves_the_rest(dtype):
    kv = _pool(3, 8, 16, 2, 80, dtype, seed=4)
    before = kv.clone()
    src = torch.tensor([1, 5, 1], dtype=torch.int64, device=DEVICE)
    dst = torch.tensor([6, 0, 7], dtype=torch.int64, device=DEVICE)
    TritonBackend().copy_blocks(kv, src, dst)
    expected = before.clone()
    expected[:, :, [6, 0, 7]] = before[:, :, [1, 5, 1]]
    assert torch.equal(kv, expected)
    reference = before.clone()
    TorchBackend().copy_blocks(reference, src, dst)
    assert torch.equal(kv, reference)


def test_copy_blocks_of_an_empty_list_is_a_no_op():
    kv = _pool(1, 2, 16, 1, 64, torch.float32, seed=5)
    before = kv.clone()
    empty = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    copy_blocks(kv, empty, empty)
    assert torch.equal(kv, before)


def test_copy_blocks_rejects_mismatched_id_lists():
    kv = _pool(1, 4, 16, 1, 64, torch.float32, seed=5)
    with pytest.raises(ValueError, match="equal length"):
        copy_blocks(kv, torch.tensor([0, 1]), torch.tensor([2]))


def _swap_case(host: torch.device, dtype: torch.dtype) -> None:
    device_pool = _pool(2, 9, 16, 2, 64, dtype, seed=6)
    host_pool = _pool(2, 5, 16, 2, 64, dtype, seed=7, device=host)
    device_before, host_before = device_pool.clone(), host_pool.clone()
    ref_device, ref_host = device_pool.clone(), host_pool.clone()
    moves = [  # out to the host pool, then back into other device blocks
        (device_pool, host_pool, ref_device, ref_host, [8, 2, 4], [0, 3, 1]),
        (host_pool, device_pool, ref_host, ref_device, [3, 0], [5, 6]),
    ]
    for src, dst, ref_src, ref_dst, src_ids, dst_ids in moves:
        TritonBackend().swap_blocks(src, dst, torch.tensor(src_ids), torch.tensor(dst_ids))
        TorchBackend().swap_blocks(ref_src, ref_dst, torch.tensor(src_ids),
                                   torch.tensor(dst_ids))
        assert torch.equal(device_pool, ref_device) and torch.equal(host_pool, ref_host)
    expected_host = host_before.clone()
    expected_host[:, :, [0, 3, 1]] = device_before[:, :, [8, 2, 4]].to(host)
    expected_device = device_before.clone()
    expected_device[:, :, [5, 6]] = device_before[:, :, [2, 8]]
    assert torch.equal(host_pool, expected_host)
    assert torch.equal(device_pool, expected_device)


def test_swap_blocks_between_pools_on_one_device():
    _swap_case(DEVICE, torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device and host pool")
@pytest.mark.parametrize("dtype", DTYPES)
def test_swap_blocks_between_device_and_host(dtype):
    _swap_case(torch.device("cpu"), dtype)


def test_swap_blocks_rejects_pools_of_different_shape():
    a = _pool(2, 4, 16, 2, 64, torch.float32, seed=8)
    b = _pool(2, 4, 16, 1, 64, torch.float32, seed=9)
    with pytest.raises(ValueError, match="pools differ"):
        swap_blocks(a, b, torch.tensor([0]), torch.tensor([1]))

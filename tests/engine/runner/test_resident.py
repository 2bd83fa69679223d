"""The KV pool's resident bytes: the pages the OS holds, measured with mincore, against
the kernel's page table and against the blocks a request wrote in a model loaded here."""

from __future__ import annotations

import math
import mmap
import struct
import sys

import pytest

from engine import LLM, SamplingParams
from engine.runner import resident
from engine.runner.resident import PAGE_SIZE, resident_bytes, resident_range_bytes
from tests.engine.tiny_models import random_prompt, save_tiny_model

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/pagemap")


def kernel_resident(address: int, length: int) -> int:
    """Bytes of [address, address + length) the kernel holds pages for, from the page
    table (/proc/self/pagemap: bit 63 of a page's entry says it is present): an oracle
    apart from mincore. The range need not be a mapping of its own, as /proc/self/smaps
    would need: the kernel merges an anonymous mapping with a like neighbour."""
    first, end = address // PAGE_SIZE, -(-(address + length) // PAGE_SIZE)
    with open("/proc/self/pagemap", "rb") as table:
        table.seek(first * 8)
        entries = table.read((end - first) * 8)
    present = sum(entry >> 63 for entry in struct.unpack(f"<{end - first}Q", entries))
    return present * PAGE_SIZE


def _address(buffer: mmap.mmap) -> int:
    import ctypes

    anchor = ctypes.c_char.from_buffer(buffer)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


@linux
def test_pages_count_once_written():
    pages = 64
    buffer = mmap.mmap(-1, pages * PAGE_SIZE)
    address = _address(buffer)
    assert resident_range_bytes(address, pages * PAGE_SIZE) == 0
    buffer[3 * PAGE_SIZE] = 1
    buffer[10 * PAGE_SIZE + 17] = 1
    assert resident_range_bytes(address, pages * PAGE_SIZE) == 2 * PAGE_SIZE
    assert kernel_resident(address, pages * PAGE_SIZE) == 2 * PAGE_SIZE
    # A range that starts inside a page counts that page.
    assert resident_range_bytes(address + 3 * PAGE_SIZE + 5, 8) == PAGE_SIZE
    assert resident_range_bytes(address, 0) == 0


def test_device_memory_counts_whole_and_views_once():
    import torch

    pool = torch.empty(2, 1024, device="meta")  # stands in for a CUDA pool: no pages
    assert resident_bytes([pool, pool[1], pool.permute(1, 0)]) == 2 * 1024 * 4


def test_no_mincore_means_no_figure(monkeypatch):
    import torch

    monkeypatch.setattr(resident, "_mincore", lambda: None)
    assert resident_bytes([torch.zeros(1024)]) is None


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("models") / "tiny")
    # head size 16 in float32: a 64-token block of one layer's K or V head is 4 KiB.
    # float32 K/V: one block of one head is then one 4 KiB page.
    return LLM(str(path), num_gpu_blocks=32, block_size=64, dtype="float32", device="cpu",
               kv_cache_dtype="float32")


@linux
@pytest.mark.skipif(PAGE_SIZE != 4096, reason="the exact count assumes 4 KiB pages")
def test_the_pool_is_resident_only_where_a_request_wrote(llm):
    shape = llm.engine.runner.shape
    [pool] = llm.engine.runner.kv_caches
    start, length = pool.untyped_storage().data_ptr(), pool.untyped_storage().nbytes()
    assert shape.block_size * shape.head_size * pool.element_size() == PAGE_SIZE
    before = llm.memory_stats()
    assert before.kv_pool_bytes == (32 + 1) * shape.bytes_per_block  # and the null block
    # Nothing written yet (no warm-up forward at load): nothing resident.
    assert before.kv_pool_resident_bytes == 0 == kernel_resident(start, length)
    assert before.other_bytes == (before.process_rss_bytes - before.weights_bytes
                                  - before.kv_pool_resident_bytes)

    out = llm.generate([random_prompt(1, 100)], SamplingParams(max_tokens=40,
                                                                ignore_eos=True))[0]
    written = len(out.prompt_token_ids) + 40 - 1  # the last token sampled is not computed
    after = llm.memory_stats()
    assert after.kv_pool_resident_bytes == math.ceil(written / 64) * shape.bytes_per_block
    assert after.kv_pool_resident_bytes == kernel_resident(start, length)
    assert after.kv_pool_bytes == before.kv_pool_bytes
    assert after.other_bytes == (after.process_rss_bytes - after.weights_bytes
                                 - after.kv_pool_resident_bytes)

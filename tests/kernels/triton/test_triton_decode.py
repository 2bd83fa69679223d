"""Split-K paged decode kernel against the PyTorch reference (interpreted on CPU,
compiled on CUDA)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from kernels.triton import decode as triton_decode
from kernels.triton.backend import TritonBackend
from kernels.triton.decode import (
    choose_num_splits,
    paged_block_offsets,
    paged_decode,
    slot_offsets,
)
from tests.kernels.paged_cases import (
    DEVICE,
    DTYPES,
    assert_matches,
    make_case,
    reference_attention,
)

# (seq_lens, num_kv_heads, group, head_size, block_size, num_splits, shared blocks)
# A pairwise cover of batch {1, 3, 8}, GQA {1, 3, 8}, head {64, 80, 128}, block {16, 32},
# split-K off / on, shuffled / shared tables; contexts include 1, 15, 16, 17 and > 1000.
DECODE_CASES = [
    ([1], 1, 1, 64, 16, 1, None),
    ([17], 2, 3, 128, 32, 2, None),
    ([1100], 1, 8, 80, 16, 3, None),
    ([15, 16, 17], 2, 1, 80, 32, 1, {2: (1, 1)}),
    ([1030, 1, 16], 1, 3, 64, 16, 4, None),
    ([33, 17, 16], 1, 8, 128, 16, 2, {1: (0, 1), 2: (0, 1)}),
    ([1, 15, 16, 17, 40, 64, 2, 31], 1, 3, 80, 16, 1, {4: (3, 1), 5: (4, 2)}),
    ([5, 15, 16, 17, 48, 33, 9, 1], 2, 1, 128, 32, 3, {5: (4, 1)}),
    ([40, 17, 16, 64, 15, 1, 20, 47], 1, 8, 64, 32, 2, {3: (0, 1), 6: (1, 1)}),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "seq_lens,nkv,group,head_size,block_size,num_splits,shared", DECODE_CASES,
    ids=[f"case{i}" for i in range(len(DECODE_CASES))],
)
def test_decode_matches_reference(seq_lens, nkv, group, head_size, block_size, num_splits,
                                  shared, dtype):
    case = make_case(seq_lens, [1] * len(seq_lens), num_kv_heads=nkv, group=group,
                     head_size=head_size, block_size=block_size, dtype=dtype, shared=shared)
    out = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                       num_splits=num_splits)
    assert_matches(out, reference_attention(case))


@pytest.mark.parametrize("head_size", [96, 256])
def test_decode_other_head_sizes(head_size):
    case = make_case([40, 3], [1, 1], num_kv_heads=1, group=2, head_size=head_size,
                     block_size=16)
    out = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                       num_splits=2)
    assert_matches(out, reference_attention(case))


def test_more_splits_than_tokens_leaves_empty_splits_harmless():
    # 6 splits of one 64-token tile each: the 17-token sequence fills only the first.
    case = make_case([300, 17], [1, 1], num_kv_heads=1, group=2, head_size=64, block_size=16)
    out = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                       num_splits=6)
    assert_matches(out, reference_attention(case))


def test_split_k_equals_single_split():
    case = make_case([1030, 200], [1, 1], num_kv_heads=1, group=3, head_size=64,
                     block_size=32, seed=3)
    one = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                       num_splits=1)
    many = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                        num_splits=5)
    assert_matches(many, one)


def test_backend_sends_decode_batches_to_the_decode_kernel(monkeypatch):
    case = make_case([17, 40], [1, 1], num_kv_heads=1, group=3, head_size=64, block_size=16)
    calls = []
    monkeypatch.setattr("kernels.triton.backend.paged_decode",
                        lambda *a, **k: calls.append("decode") or paged_decode(*a, **k))
    monkeypatch.setattr("kernels.triton.backend.paged_prefill",
                        lambda *a, **k: pytest.fail("decode batch went to prefill"))
    out = TritonBackend(shared_prefix=False).attention(case.query, case.k_cache, case.v_cache,
                                                       case.meta, case.scale)
    assert calls == ["decode"]
    assert_matches(out, reference_attention(case))


@triton.jit
def _offsets_probe(bt_ptr, out_ptr, n, stride_block, stride_slot, BLOCK_SIZE: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n
    blk = paged_block_offsets(bt_ptr, offs, mask, stride_block, BLOCK_SIZE)
    tl.store(out_ptr + offs, slot_offsets(blk, offs, stride_slot, BLOCK_SIZE), mask=mask)


def test_token_offsets_do_not_overflow_int32():
    # A pool of 2**21 blocks of 16 x 8 x 128 elements: block ids near the top put the
    # offset far past 2**31 without allocating anything that large.
    block_size, stride_slot = 16, 8 * 128
    stride_block = block_size * stride_slot
    table = torch.tensor([2**21 - 1, 2**20 + 3, 0, 2**17], dtype=torch.int32, device=DEVICE)
    out = torch.zeros(64, dtype=torch.int64, device=DEVICE)
    n = 4 * block_size
    _offsets_probe[(1,)](table, out, n, stride_block, stride_slot, BLOCK_SIZE=block_size,
                         BLOCK_N=64)
    expected = [int(table[p // block_size]) * stride_block + (p % block_size) * stride_slot
                for p in range(n)]
    assert max(expected) > 2**33
    assert out.tolist() == expected


def test_choose_num_splits(monkeypatch):
    monkeypatch.setattr(triton_decode, "_sm_count", lambda index: 132)
    cuda = torch.device("cuda", 0)
    assert choose_num_splits(1, 8, 32768, cuda) == 33  # 264 programs wanted / 8
    assert choose_num_splits(1, 3, 512, cuda) == 2  # at most one split per 256 tokens
    assert choose_num_splits(1, 8, 100, cuda) == 1
    assert choose_num_splits(64, 8, 32768, cuda) == 1  # the batch fills the GPU alone
    assert choose_num_splits(1, 1, 10**6, cuda) == triton_decode.MAX_SPLITS
    assert choose_num_splits(1, 8, 32768, torch.device("cpu")) == 1


def test_decode_rejects_bad_inputs():
    case = make_case([17], [1], num_kv_heads=1, group=2, head_size=64, block_size=16)
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                     num_splits=0)
    with pytest.raises(ValueError, match="dtype"):
        paged_decode(case.query.double(), case.k_cache, case.v_cache, case.meta, case.scale)
    with pytest.raises(ValueError, match="multiple of nkv"):
        paged_decode(case.query[:, :1].repeat(1, 3, 1), case.k_cache.repeat(1, 1, 2, 1),
                     case.v_cache.repeat(1, 1, 2, 1), case.meta, case.scale)
    with pytest.raises(ValueError, match="sequences"):
        paged_decode(case.query.repeat(2, 1, 1), case.k_cache, case.v_cache, case.meta,
                     case.scale)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA the benchmark really runs")
def test_kernel_bench_needs_cuda(capsys):
    from kernels.bench import main

    assert main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA every test runs compiled")
def test_every_kernel_compiles_for_hopper():
    # The interpreter runs the kernels as numpy; a GPU build type-checks them for real.
    # It needs a process where TRITON_INTERPRET is unset, since @triton.jit reads it.
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    code = ("from tests.kernels.paged_cases import compile_every_kernel_for_hopper as c; "
            "print(len(c()))")
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "3"

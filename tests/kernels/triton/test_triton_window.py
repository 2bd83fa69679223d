"""Sliding window and logit soft-cap in the Triton kernels (split-K decode, varlen
prefill, shared-prefix decode) against the PyTorch reference, itself checked against a
naive oracle in tests/kernels/reference/test_reference_window.py. Interpreted on CPU,
compiled on CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.triton import decode as triton_decode
from kernels.triton.backend import TritonBackend
from kernels.triton.decode import paged_decode
from kernels.triton.prefill import paged_prefill
from kernels.triton.shared_prefix import shared_prefix_decode
from tests.kernels.paged_cases import (
    DTYPES,
    assert_matches,
    make_case,
    naive_attention,
    poison_before_window,
    reference_attention,
)

# (seq_lens, num_kv_heads, group, head_size, block_size, num_splits, window, softcap)
# Windows below a block (5), of one block (16), one block and a token (17), several
# blocks (40, 100), beyond the context (2000); GQA 1/2/4; head 64 and 96 (padded to 128);
# contexts on and around block boundaries; one split and split-K.
DECODE_CASES = [
    ([1, 15, 16, 17, 33], 2, 1, 64, 16, 1, 5, None),
    ([16, 32, 48, 300], 1, 4, 96, 16, 3, 16, 50.0),
    ([17, 31, 64], 2, 2, 64, 16, 2, 17, 5.0),
    ([300], 1, 2, 96, 32, 3, 40, None),
    ([1030, 40, 1], 1, 4, 64, 16, 4, 100, 5.0),
    ([15, 300], 2, 2, 96, 16, 1, 2000, 50.0),
    ([200, 65], 1, 1, 64, 32, 1, None, 5.0),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "seq_lens,nkv,group,head_size,block_size,num_splits,window,softcap", DECODE_CASES,
    ids=[f"case{i}" for i in range(len(DECODE_CASES))],
)
def test_decode_with_options_matches_reference(seq_lens, nkv, group, head_size, block_size,
                                               num_splits, window, softcap, dtype):
    case = make_case(seq_lens, [1] * len(seq_lens), num_kv_heads=nkv, group=group,
                     head_size=head_size, block_size=block_size, dtype=dtype, seed=21)
    out = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                       num_splits=num_splits, sliding_window=window, logit_softcap=softcap)
    assert_matches(out, reference_attention(case, window, softcap))


# (seq_lens, q_lens, num_kv_heads, group, head_size, block_size, window, softcap)
# Fresh prompts, chunks after a cached prefix, one-token rows in mixed batches; BLOCK_Q
# tiles longer and shorter than the window.
PREFILL_CASES = [
    ([40], [40], 1, 1, 64, 16, 5, None),
    ([100, 17], [100, 17], 2, 2, 96, 16, 16, 50.0),
    ([300, 48, 17], [45, 48, 2], 1, 4, 64, 16, 17, 5.0),
    ([17, 1, 300, 16, 64], [1, 1, 23, 16, 1], 2, 2, 64, 32, 40, None),
    ([130, 33, 70], [1, 17, 70], 1, 4, 96, 16, 100, 5.0),
    ([64, 20], [30, 1], 2, 1, 64, 16, 2000, 50.0),
    ([90, 15], [90, 1], 1, 2, 64, 16, None, 5.0),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "seq_lens,q_lens,nkv,group,head_size,block_size,window,softcap", PREFILL_CASES,
    ids=[f"case{i}" for i in range(len(PREFILL_CASES))],
)
def test_prefill_with_options_matches_reference(seq_lens, q_lens, nkv, group, head_size,
                                                block_size, window, softcap, dtype):
    case = make_case(seq_lens, q_lens, num_kv_heads=nkv, group=group, head_size=head_size,
                     block_size=block_size, dtype=dtype, seed=22)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                        sliding_window=window, logit_softcap=softcap)
    assert_matches(out, reference_attention(case, window, softcap))


def test_kernels_match_the_naive_oracle_directly():
    # Guards against the reference and the kernels sharing one mistake.
    case = make_case([17, 1, 100], [1, 1, 30], num_kv_heads=1, group=2, head_size=64,
                     block_size=16, seed=23)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                        sliding_window=17, logit_softcap=5.0)
    torch.testing.assert_close(out, naive_attention(case, 17, 5.0), atol=1e-4, rtol=1e-4)
    decode = make_case([17, 1, 100], [1, 1, 1], num_kv_heads=1, group=2, head_size=64,
                       block_size=16, seed=23)
    out = paged_decode(decode.query, decode.k_cache, decode.v_cache, decode.meta,
                       decode.scale, num_splits=2, sliding_window=17, logit_softcap=5.0)
    torch.testing.assert_close(out, naive_attention(decode, 17, 5.0), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [5, 17, 40])
def test_decode_never_reads_blocks_before_the_window(window, num_splits):
    case = make_case([15, 16, 17, 100, 300, 33], [1] * 6, num_kv_heads=1, group=2,
                     head_size=64, block_size=16, seed=24)
    poisoned, count = poison_before_window(case, window)
    assert count > 0
    out = paged_decode(poisoned.query, poisoned.k_cache, poisoned.v_cache, poisoned.meta,
                       poisoned.scale, num_splits=num_splits, sliding_window=window,
                       logit_softcap=5.0)
    assert torch.isfinite(out).all()
    clean = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                         num_splits=num_splits, sliding_window=window, logit_softcap=5.0)
    assert torch.equal(out, clean)


def test_prefill_never_reads_blocks_before_the_window():
    case = make_case([300, 17, 100, 64], [40, 1, 1, 64], num_kv_heads=1, group=2,
                     head_size=64, block_size=16, seed=25)
    poisoned, count = poison_before_window(case, 17)
    assert count > 0
    out = paged_prefill(poisoned.query, poisoned.k_cache, poisoned.v_cache, poisoned.meta,
                        poisoned.scale, sliding_window=17)
    assert torch.isfinite(out).all()
    clean = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                          sliding_window=17)
    assert torch.equal(out, clean)


def test_split_k_covers_only_the_window(monkeypatch):
    # On CUDA the splits are sized from the tokens attended: the window, not the context.
    seen = []
    real = triton_decode.choose_num_splits
    monkeypatch.setattr(triton_decode, "choose_num_splits",
                        lambda seqs, nkv, tokens, device: seen.append(tokens)
                        or real(seqs, nkv, tokens, device))
    case = make_case([300, 40], [1, 1], num_kv_heads=1, group=2, head_size=64, block_size=16)
    paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                 sliding_window=64)
    paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale)
    assert seen == [64, 300]


def _candidates(window_blocks: int = 3):
    # Candidates 0, 2 share a 3-block prompt; 1 stands alone.
    return make_case([53, 40, 49], [1, 1, 1], num_kv_heads=2, group=2, head_size=64,
                     block_size=16, shared={2: (0, window_blocks)}, seed=26)


def test_backend_sends_windowed_decode_to_the_plain_decode_kernel(monkeypatch):
    case = _candidates()
    calls = []
    monkeypatch.setattr("kernels.triton.backend.paged_decode",
                        lambda *a, **k: calls.append(k) or paged_decode(*a, **k))
    monkeypatch.setattr("kernels.triton.backend.shared_prefix_decode",
                        lambda *a, **k: pytest.fail("windowed decode went to the cascade"))
    backend = TritonBackend(shared_prefix=True, min_shared_blocks=1)
    out = backend.attention(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                            sliding_window=20, logit_softcap=5.0)
    assert calls == [dict(sliding_window=20, logit_softcap=5.0)]
    assert_matches(out, reference_attention(case, 20, 5.0))


def test_backend_keeps_the_cascade_when_the_window_covers_every_context(monkeypatch):
    case = _candidates()
    calls = []
    monkeypatch.setattr("kernels.triton.backend.shared_prefix_decode",
                        lambda *a, **k: calls.append(k) or shared_prefix_decode(*a, **k))
    backend = TritonBackend(shared_prefix=True, min_shared_blocks=1)
    out = backend.attention(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                            sliding_window=53, logit_softcap=5.0)
    assert calls == [dict(logit_softcap=5.0)]
    assert_matches(out, reference_attention(case, None, 5.0))


def test_backend_mixed_batch_with_options_goes_to_prefill():
    case = make_case([17, 100], [17, 1], num_kv_heads=1, group=4, head_size=96,
                     block_size=16, seed=27)
    out = TritonBackend().attention(case.query, case.k_cache, case.v_cache, case.meta,
                                    case.scale, sliding_window=16, logit_softcap=5.0)
    assert_matches(out, reference_attention(case, 16, 5.0))


def test_kernels_reject_bad_options():
    case = make_case([17], [1], num_kv_heads=1, group=2, head_size=64, block_size=16)
    with pytest.raises(ValueError, match="sliding_window"):
        paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                     sliding_window=0)
    with pytest.raises(ValueError, match="logit_softcap"):
        paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                      logit_softcap=-1.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA every test runs compiled")
def test_option_kernels_compile_for_hopper():
    # As test_every_kernel_compiles_for_hopper, with SLIDING and SOFTCAP on.
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    code = ("from tests.kernels.paged_cases import compile_option_kernels_for_hopper as c; "
            "print(len(c()))")
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "1"


def test_kernel_bench_takes_a_window():
    from kernels.bench import parse_args

    assert parse_args([]).window == 4096
    assert parse_args(["--window", "0"]).window == 0
    with pytest.raises(SystemExit):
        parse_args(["--window", "-1"])

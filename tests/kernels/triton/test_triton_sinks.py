"""Attention sinks in the Triton kernels (split-K decode with one split and several,
varlen prefill) against the naive float64 oracle that appends each head's sink logit to
the softmax, with sliding windows and soft-caps off and on; the backend keeps a step with
sinks off the shared-prefix kernel. Interpreted on CPU, compiled on CUDA."""

from __future__ import annotations

import pytest
import torch

from kernels.triton import backend as triton_backend
from kernels.triton.backend import TritonBackend
from kernels.triton.decode import paged_decode
from kernels.triton.prefill import paged_prefill
from tests.kernels.paged_cases import make_case, naive_attention
from tests.kernels.reference.test_reference_sinks import sinks_for


def _close(out, case, window, softcap, sinks):
    expected = naive_attention(case, window, softcap, sinks.to(out.device))
    torch.testing.assert_close(out.double().cpu(), expected.double().cpu(), atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window,softcap", [(None, None), (17, None), (None, 5.0), (40, 5.0)])
def test_decode_with_sinks(num_splits, window, softcap):
    case = make_case([1, 17, 33, 300], [1] * 4, num_kv_heads=2, group=2, head_size=64,
                     block_size=16)
    sinks = sinks_for(4).to(case.query.device)
    out = paged_decode(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                       num_splits=num_splits, sliding_window=window, logit_softcap=softcap,
                       sinks=sinks)
    _close(out, case, window, softcap, sinks)


@pytest.mark.parametrize("window,softcap", [(None, None), (7, None), (None, 5.0), (40, 5.0)])
def test_prefill_with_sinks(window, softcap):
    case = make_case([17, 100, 33], [17, 30, 1], num_kv_heads=2, group=2, head_size=64,
                     block_size=16)
    sinks = sinks_for(4).to(case.query.device)
    out = paged_prefill(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                        sliding_window=window, logit_softcap=softcap, sinks=sinks)
    _close(out, case, window, softcap, sinks)


def test_backend_with_sinks_skips_the_shared_prefix_kernel(monkeypatch):
    case = make_case([70, 72], [1, 1], num_kv_heads=1, group=2, head_size=64,
                     block_size=16, shared={1: (0, 4)})
    sinks = sinks_for(2).to(case.query.device)

    def refuse(*args, **kwargs):
        raise AssertionError("the shared-prefix kernel takes no sinks")

    monkeypatch.setattr(triton_backend, "shared_prefix_decode", refuse)
    backend = TritonBackend(shared_prefix=True, min_shared_blocks=2)
    out = backend.attention(case.query, case.k_cache, case.v_cache, case.meta, case.scale,
                            sinks=sinks)
    _close(out, case, None, None, sinks)

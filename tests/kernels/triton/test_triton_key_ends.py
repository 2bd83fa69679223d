"""Per-row key limits (AttentionMetadata.key_ends: a bidirectional run such as Gemma 3's
image tokens) through the Triton backend: a prefill step with them takes the PyTorch
reference on the device (the Triton kernels are causal) and matches the naive float64
oracle. On CUDA where there is one; on the CPU the backend's dispatch runs the same way."""

from __future__ import annotations

import pytest
import torch

from kernels.triton.backend import TritonBackend
from tests.kernels.paged_cases import make_case, naive_attention, with_runs

RUNS = {0: [(260, 280), (282, 300)], 1: [(3, 40)], 2: [(40, 60)]}


@pytest.mark.parametrize("window,softcap", [(None, None), (16, None), (40, 5.0)])
def test_a_prefill_step_with_runs(window, softcap):
    case = with_runs(make_case([300, 48, 64, 33], [45, 48, 16, 1], num_kv_heads=2, group=2,
                               head_size=64, block_size=16), RUNS)
    out = TritonBackend().attention(case.query, case.k_cache, case.v_cache, case.meta,
                                    case.scale, sliding_window=window, logit_softcap=softcap)
    expected = naive_attention(case, window, softcap)
    torch.testing.assert_close(out.double().cpu(), expected.double().cpu(), atol=1e-4,
                               rtol=1e-4)

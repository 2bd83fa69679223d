"""Per-row key limits (AttentionMetadata.key_ends: a bidirectional run such as Gemma 3's
image tokens) in the PyTorch reference against the naive float64 oracle: each run's
rows see the run's end, every other row is causal, under sliding windows and soft-caps;
runs in the middle of a chunk, opening among the cached tokens (a prefix hit that ends
inside an image) and closing the chunk."""

from __future__ import annotations

import pytest
import torch

from kernels.reference.backend import TorchBackend
from kernels.reference.step_plan import key_end_mask
from tests.kernels.paged_cases import make_case, naive_attention, with_runs

pytestmark = pytest.mark.usefixtures("single_torch_thread")

# seq_lens, q_lens and each sequence's runs [lo, hi) by position.
BATCH = ([300, 48, 64, 33], [45, 48, 16, 1])
RUNS = {0: [(260, 280), (282, 300)], 1: [(3, 40)], 2: [(40, 60)]}


def runs_case(group: int, seed: int = 0):
    return with_runs(make_case(*BATCH, num_kv_heads=2, group=group, head_size=64,
                               block_size=16, seed=seed, head_major=True), RUNS)


@pytest.mark.parametrize("window", [None, 5, 16, 40])
@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("group", [1, 4])
def test_runs_see_their_end(window, softcap, group):
    case = runs_case(group)
    out = TorchBackend().attention(case.query, case.k_cache, case.v_cache, case.meta,
                                   case.scale, sliding_window=window, logit_softcap=softcap)
    torch.testing.assert_close(out.double(), naive_attention(case, window, softcap).double(),
                               atol=1e-5, rtol=1e-5)


def test_the_limits_change_the_runs_rows_only():
    case = runs_case(2)
    causal = make_case(*BATCH, num_kv_heads=2, group=2, head_size=64, block_size=16,
                       head_major=True)
    ours = TorchBackend().attention(case.query, case.k_cache, case.v_cache, case.meta,
                                    case.scale)
    plain = TorchBackend().attention(causal.query, causal.k_cache, causal.v_cache,
                                     causal.meta, causal.scale)
    differs = (ours - plain).abs().amax((1, 2)) > 1e-6
    # Chunk rows: sequence 0 starts at 255 (rows 0..44), 1 at 0 (45..92), 2 at 48 (93..108).
    # A run's last row sees what causal attention sees; every other row of it more.
    expected = torch.zeros(len(differs), dtype=torch.bool)
    for first_row, first_pos, runs in ((0, 255, RUNS[0]), (45, 0, RUNS[1]),
                                       (93, 48, RUNS[2])):
        for lo, hi in runs:
            lo = max(lo, first_pos)
            expected[first_row + lo - first_pos:first_row + hi - 1 - first_pos] = True
    assert torch.equal(differs, expected)


def test_key_end_mask_is_the_gemma3_rule():
    # Positions 4..7 new; the run [4, 7) sees key 6 from every row; window 3.
    mask = key_end_mask(4, 8, torch.tensor([7, 7, 7, 8]), 3, 0, torch.device("cpu"))
    assert mask.int().tolist() == [[0, 0, 1, 1, 1, 1, 1, 0],
                                   [0, 0, 0, 1, 1, 1, 1, 0],
                                   [0, 0, 0, 0, 1, 1, 1, 0],
                                   [0, 0, 0, 0, 0, 1, 1, 1]]

"""The gated delta rule's Triton kernels (interpreted on CPU, compiled on CUDA) against the
PyTorch path (engine/layers/delta_rule.py) and transformers' Qwen3.5 torch functions, in
float32: the recurrent step over pool slots, the varlen chunked prefill with chunk tails,
a prompt split into launches at arbitrary points, decode continuing a prefill, snapshots
at block boundaries, and the chunk tables."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from engine.layers import delta_rule
from kernels.triton.delta_rule_chunk import CHUNK, chunk_layout, chunked_prefill
from kernels.triton.delta_rule_decode import recurrent_step
from tests.kernels.paged_cases import DEVICE

TOL = dict(atol=2e-5, rtol=1e-4)


def inputs(tokens: int, hk: int, hv: int, dk: int, dv: int, seed: int):
    """Raw q, k [T, Hk, Dk] (as the conv leaves them), v, and a gate decaying ~0.25 a
    token (so a 64-token chunk still carries some of its start)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(tokens, hk, dk, generator=gen) for _ in range(2))
    v = torch.randn(tokens, hv, dv, generator=gen)
    g = -0.5 * torch.rand(tokens, hv, generator=gen)
    beta = torch.rand(tokens, hv, generator=gen)
    return [t.to(DEVICE) for t in (q, k, v, g, beta)]


def states(slots: int, hv: int, dk: int, dv: int, seed: int) -> torch.Tensor:
    return torch.randn(slots, hv, dk, dv, generator=torch.Generator().manual_seed(seed)
                       ).to(DEVICE)


def transformers_chunk(q, k, v, g, beta, state):
    """transformers' chunked rule over one sequence [T, ...] -> (out [T, Hv, Dv], state)."""
    out, final = hf.torch_chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], initial_state=state[None],
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    return out[0], final[0]


def torch_prefill(q, k, v, g, beta, state, hv, tiled=False):
    pq, pk = delta_rule.prepare_qk(q, k, hv, tiled)
    return delta_rule.chunked_prefill(pq, pk, v, g, beta, state)


@pytest.mark.parametrize("hk,hv,dk,dv,tiled", [(2, 4, 16, 16, False), (2, 4, 8, 24, True),
                                               (1, 2, 128, 128, False)])
def test_recurrent_step_equals_torch_and_transformers(hk, hv, dk, dv, tiled):
    q, k, v, g, beta = inputs(3, hk, hv, dk, dv, seed=1)
    pool = states(6, hv, dk, dv, seed=2)
    before = pool.clone()
    slots = torch.tensor([4, 0, 2], device=DEVICE)
    out = recurrent_step(q, k, v, g, beta, pool, slots, tiled)
    pq, pk = delta_rule.prepare_qk(q, k, hv, tiled)
    ref_out, ref_state = delta_rule.recurrent_step(pq, pk, v, g, beta, before[slots])
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(pool[slots], ref_state, **TOL)
    assert torch.equal(pool[[1, 3, 5]], before[[1, 3, 5]])  # other slots untouched
    if not tiled:
        theirs, their_state = hf.torch_recurrent_gated_delta_rule(
            q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
            initial_state=before[slots], output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(out, theirs[:, 0], **TOL)
        torch.testing.assert_close(pool[slots], their_state, **TOL)


def test_varlen_prefill_with_chunk_tails_equals_transformers():
    """Three sequences in one launch: two chunks and a tail, a lone short chunk, a chunk
    and a tail; one resumes its slot's state, two start from zeros."""
    hk, hv, dk, dv = 1, 2, 16, 16
    lens, slots, resumes = [CHUNK + 6, 5, CHUNK + 30], [3, 0, 5], [True, False, False]
    rows = [(sum(lens[:i]), sum(lens[:i + 1])) for i in range(3)]
    q, k, v, g, beta = inputs(sum(lens), hk, hv, dk, dv, seed=3)
    pool = states(6, hv, dk, dv, seed=4)
    before = pool.clone()
    out = torch.zeros_like(v)
    chunked_prefill(q, k, v, g, beta, pool,
                    chunk_layout(rows, slots, resumes, None, DEVICE), out)
    for (r0, r1), slot, resume in zip(rows, slots, resumes, strict=True):
        start = before[slot] if resume else torch.zeros_like(before[slot])
        part = [t[r0:r1] for t in (q, k, v, g, beta)]
        theirs, their_state = transformers_chunk(*part, start)
        torch.testing.assert_close(out[r0:r1], theirs, **TOL)
        torch.testing.assert_close(pool[slot], their_state, **TOL)
        ours, our_state = torch_prefill(*part, start, hv)
        torch.testing.assert_close(out[r0:r1], ours, **TOL)
        torch.testing.assert_close(pool[slot], our_state, **TOL)
    assert torch.equal(pool[[1, 2, 4]], before[[1, 2, 4]])


def test_prefill_at_key_head_128_with_a_padded_value_head():
    """Qwen3.5's key head size (128) and a value head (24) that pads to 32 columns, with a
    chunk tail: transformers' result, and nothing written past the real columns."""
    hk, hv, dk, dv, tokens = 1, 2, 128, 24, CHUNK + 7
    q, k, v, g, beta = inputs(tokens, hk, hv, dk, dv, seed=9)
    pool = states(2, hv, dk, dv, seed=10)
    before = pool.clone()
    out = torch.zeros_like(v)
    chunked_prefill(q, k, v, g, beta, pool, chunk_layout([(0, tokens)], [1], [True], None,
                                                         DEVICE), out)
    theirs, their_state = transformers_chunk(q, k, v, g, beta, before[1])
    torch.testing.assert_close(out, theirs, **TOL)
    torch.testing.assert_close(pool[1], their_state, **TOL)
    assert torch.equal(pool[0], before[0])


@pytest.mark.parametrize("cuts", [[1, 67], [63, 64, 65]])
def test_prompt_split_at_arbitrary_points_then_decode_equals_one_run(cuts):
    """A 100-token prompt in successive launches resuming one slot, then three decode
    steps: the same outputs and state as transformers' single run over all 103 tokens."""
    hk, hv, dk, dv, total = 2, 2, 16, 16, 103
    q, k, v, g, beta = inputs(total, hk, hv, dk, dv, seed=5)
    pool = torch.zeros(2, hv, dk, dv, device=DEVICE)
    out = torch.zeros_like(v)
    bounds = [0, *cuts, total - 3]
    for i, (r0, r1) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        chunked_prefill(q, k, v, g, beta, pool, chunk_layout([(r0, r1)], [1], [i > 0], None,
                                                             DEVICE), out)
    slot = torch.tensor([1], device=DEVICE)
    for t in range(total - 3, total):
        out[t:t + 1] = recurrent_step(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1],
                                      beta[t:t + 1], pool, slot)
    theirs, their_state = transformers_chunk(q, k, v, g, beta,
                                             torch.zeros(hv, dk, dv, device=DEVICE))
    torch.testing.assert_close(out, theirs, **TOL)
    torch.testing.assert_close(pool[1], their_state, **TOL)
    assert not pool[0].any()


def test_snapshots_equal_the_torch_path_at_their_boundaries():
    """Snapshots at the start, inside a chunk, at a chunk's edge, inside the tail and at
    the end, in llama.cpp's tiled head order: each snapshot slot holds the PyTorch path's
    state after that many tokens."""
    hk, hv, dk, dv, tokens = 2, 4, 8, 8, 80
    q, k, v, g, beta = inputs(tokens, hk, hv, dk, dv, seed=6)
    pool = states(8, hv, dk, dv, seed=7)
    before = pool.clone()
    snapshots = [(0, 6), (16, 2), (64, 3), (72, 5), (80, 4)]
    out = torch.zeros_like(v)
    chunked_prefill(q, k, v, g, beta, pool,
                    chunk_layout([(0, tokens)], [1], [True], [snapshots], DEVICE), out,
                    tiled=True)
    for offset, snap in snapshots[1:]:
        _, expected = torch_prefill(*(t[:offset] for t in (q, k, v, g, beta)), before[1],
                                    hv, tiled=True)
        torch.testing.assert_close(pool[snap], expected, **TOL)
    torch.testing.assert_close(pool[6], before[1])
    torch.testing.assert_close(pool[1], pool[4])
    assert torch.equal(pool[[0, 7]], before[[0, 7]])


def test_chunk_layout_files_snapshots_under_their_chunks():
    layout = chunk_layout([(10, 150), (0, 3)], [7, 8], [True, False],
                          [[(16, 1), (16, 2), (64, 5), (100, 3)], [(0, 4)]],
                          torch.device("cpu"))
    assert layout.chunk_start.tolist() == [10, 74, 138, 0]
    assert layout.chunk_len.tolist() == [64, 64, 12, 3]
    # Offset 64 ends the first chunk; 100 is 36 rows into the second.
    assert layout.chunk_first_snapshot.tolist() == [0, 3, 4, 4, 5]
    assert layout.snapshot_rows.tolist() == [16, 16, 64, 36, 0]
    assert layout.snapshot_slot.tolist() == [1, 2, 5, 3, 4]
    assert layout.seq_first_chunk.tolist() == [0, 3, 4]
    assert layout.seq_slot.tolist() == [7, 8]
    assert layout.seq_resume.tolist() == [1, 0]


def test_bad_layouts_and_shapes_are_refused():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="seq_rows"):
        chunk_layout([(4, 4)], [0], [False], None, cpu)
    with pytest.raises(ValueError, match="snapshots"):
        chunk_layout([(0, 4)], [0], [False], [[(5, 1)]], cpu)
    q, k, v, g, beta = inputs(2, 1, 2, 8, 8, seed=8)
    with pytest.raises(ValueError, match="states"):
        recurrent_step(q, k, v, g, beta, torch.zeros(2, 2, 8, 8, dtype=torch.float64,
                                                     device=DEVICE),
                       torch.tensor([0, 1], device=DEVICE))
    with pytest.raises(ValueError, match="query and key"):
        recurrent_step(q, k[:, :, :4], v, g, beta, torch.zeros(2, 2, 8, 8, device=DEVICE),
                       torch.tensor([0, 1], device=DEVICE))

"""engine/runner/cuda_graphs.py where no GPU is: batch-size bucketing, the static buffers'
padding, which steps qualify, and the fallback when a capture fails. Replay itself is
tested on CUDA in test_cuda_graphs_cuda.py."""

from __future__ import annotations

import logging

import pytest
import torch

from engine.core.scheduler_output import ScheduledSeq, SchedulerOutput
from engine.core.sequence import Sequence
from engine.runner.cuda_graphs import (
    BATCH_SIZES,
    CudaGraphRunner,
    StaticInputs,
    backend_is_capturable,
    decode_step_fits,
    padded_batch_size,
)
from kernels import AttentionMetadata
from kernels.reference.backend import TorchBackend
from kernels.triton.backend import TritonBackend

CPU = torch.device("cpu")


@pytest.mark.parametrize("rows, size", [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32),
                                        (33, 64), (64, 64), (65, None)])
def test_a_batch_pads_up_to_the_next_captured_size(rows, size):
    assert padded_batch_size(rows) == size


def test_bucketing_follows_the_given_sizes_and_rejects_an_empty_batch():
    assert padded_batch_size(3, (1, 3, 6)) == 3 and padded_batch_size(4, (1, 3, 6)) == 6
    with pytest.raises(ValueError, match="num_seqs must be >= 1"):
        padded_batch_size(0)
    assert BATCH_SIZES == (1, 2, 4, 8, 16, 32, 64)


def decode_meta(tables: list[list[int]], lens: list[int], block_size: int = 4):
    """A decode step's metadata: each row's one new token at position len - 1."""
    width = max(len(t) for t in tables)
    slots = [t[(n - 1) // block_size] * block_size + (n - 1) % block_size
             for t, n in zip(tables, lens, strict=True)]
    meta = AttentionMetadata(
        query_start_loc=torch.arange(len(lens) + 1, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                  dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=1, max_seq_len=max(lens))
    ids = torch.tensor([11 * (i + 1) for i in range(len(lens))])
    return ids, torch.tensor(lens) - 1, meta


def test_fill_copies_the_step_and_pads_the_rest():
    static = StaticInputs.allocate(8, 6, CPU)
    ids, pos, meta = decode_meta([[3, 7], [5], [9, 2, 4]], [6, 2, 11])
    assert static.fill(ids, pos, meta) == 3
    assert static.input_ids.tolist() == [11, 22, 33, 0, 0, 0, 0, 0]
    assert static.positions.tolist() == [5, 1, 10, 0, 0, 0, 0, 0]
    # Pad rows: a one-token context in block 0 whose K/V write is skipped.
    assert static.slot_mapping.tolist() == [29, 21, 18, -1, -1, -1, -1, -1]
    assert static.seq_lens.tolist() == [6, 2, 11, 1, 1, 1, 1, 1]
    assert static.block_tables[:3, :3].tolist() == [[3, 7, 0], [5, 0, 0], [9, 2, 4]]
    assert static.block_tables[3:, 0].tolist() == [0] * 5

    ids4, pos4, meta4 = static.views(4, block_size=4)
    assert ids4.tolist() == [11, 22, 33, 0] and pos4.shape == (4,)
    assert meta4.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert meta4.block_tables.shape == (4, 6) and meta4.slot_mapping.shape == (4,)
    # The widest context the buffers hold, whatever this step's longest row.
    assert (meta4.max_query_len, meta4.max_seq_len) == (1, 24) and meta4.is_decode_only
    # Views share the buffers: the next fill is what a captured graph reads.
    static.fill(*decode_meta([[8]], [3])[:2], decode_meta([[8]], [3])[2])
    assert meta4.seq_lens.tolist() == [3, 1, 1, 1] and meta4.slot_mapping[1].item() == -1


def test_fill_refuses_a_step_wider_or_longer_than_the_buffers():
    static = StaticInputs.allocate(2, 2, CPU)
    with pytest.raises(ValueError, match=r"3 rows x 1 blocks does not fit .*\(2 x 2\)"):
        static.fill(*decode_meta([[1], [2], [3]], [1, 1, 1]))
    with pytest.raises(ValueError, match=r"1 rows x 3 blocks"):
        static.fill(*decode_meta([[1, 2, 3]], [9]))
    with pytest.raises(ValueError, match="max_batch and max_blocks must be >= 1"):
        StaticInputs.allocate(0, 4, CPU)


def step_of(*items: tuple[int, int, int]) -> SchedulerOutput:
    """items: (num_tokens, num_computed_tokens, num_new_tokens) per scheduled sequence."""
    scheduled = []
    for i, (tokens, computed, new) in enumerate(items):
        seq = Sequence(i, f"r{i}", 0, list(range(tokens)), min(tokens, 4), computed)
        scheduled.append(ScheduledSeq(seq, new, [[]]))
    return SchedulerOutput(scheduled=scheduled)


def test_only_decode_only_steps_that_fit_qualify():
    decode = step_of((9, 8, 1), (5, 4, 1), (30, 29, 1))
    assert decode_step_fits(decode, num_groups=1, max_batch=64)
    assert not decode_step_fits(decode, num_groups=2, max_batch=64)  # Gemma's KV groups
    assert not decode_step_fits(decode, num_groups=1, max_batch=2)  # past the largest size
    assert not decode_step_fits(step_of((9, 8, 1), (20, 4, 16)), 1, 64)  # a prefill chunk
    # One token that is not the last: a chunk of a prompt, nothing to sample.
    assert not decode_step_fits(step_of((9, 8, 1), (20, 18, 1)), 1, 64)
    assert not decode_step_fits(SchedulerOutput(), 1, 64)


def test_only_tritons_plain_decode_on_cuda_is_captured():
    cuda = torch.device("cuda", 0)  # a device object needs no GPU
    assert backend_is_capturable(TritonBackend(shared_prefix=False), cuda)
    # The cascade finds its groups on the host, a graph would freeze one step's groups.
    assert not backend_is_capturable(TritonBackend(shared_prefix=True), cuda)
    assert not backend_is_capturable(TorchBackend(), cuda)
    assert not backend_is_capturable(TritonBackend(shared_prefix=False), CPU)


def test_a_failed_capture_warns_once_and_leaves_every_later_step_eager(caplog):
    calls = []

    def step(ids, pos, meta):
        calls.append(ids.shape[0])
        return torch.zeros(ids.shape[0], 5)

    # On a machine without CUDA, torch.cuda.Stream raises: the capture's real failure.
    runner = CudaGraphRunner(step, CPU, block_size=4, max_blocks=4)
    decode = step_of((9, 8, 1), (5, 4, 1), (3, 2, 1))
    ids, pos, meta = decode_meta([[1, 2, 3], [4, 5], [6]], [9, 5, 3])
    assert runner.fits(decode, num_groups=1)
    with caplog.at_level(logging.WARNING, logger="engine.runner.cuda_graphs"):
        assert runner.run(ids, pos, meta) is None
    assert runner.failed and not runner.graphs and not runner.fits(decode, num_groups=1)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "4-row decode step failed" in warnings[0].getMessage()
    assert "decoding eagerly" in warnings[0].getMessage()


def test_a_table_wider_than_the_buffers_runs_eagerly_without_capturing():
    runner = CudaGraphRunner(lambda *a: pytest.fail("no capture"), CPU, 4, max_blocks=2)
    assert runner.run(*decode_meta([[1, 2, 3]], [10])) is None
    assert not runner.failed and not runner.graphs


def test_the_engine_on_the_cpu_builds_no_graph_runner(tiny_dir):
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    engine = LLMEngine(str(tiny_dir), EngineConfig(device="cpu", num_gpu_blocks=32))
    assert engine.config.cuda_graphs and engine.runner.graphs is None


def test_an_engine_whose_capture_fails_decodes_eagerly_with_the_same_tokens(tiny_dir, caplog):
    from engine import LLM, SamplingParams

    plain = LLM(str(tiny_dir), device="cpu", num_gpu_blocks=64)
    hooked = LLM(str(tiny_dir), device="cpu", num_gpu_blocks=64)
    runner = hooked.engine.runner
    # The runner's own hook, on a device where every capture fails (no CUDA here).
    runner.graphs = CudaGraphRunner(runner._decode_logits, CPU, runner.shape.block_size,
                                    max_blocks=8)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9], [40, 41, 42]]
    with caplog.at_level(logging.WARNING, logger="engine.runner.cuda_graphs"):
        got = hooked.generate(prompts, params)
    want = plain.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert runner.graphs.failed and len(caplog.records) == 1

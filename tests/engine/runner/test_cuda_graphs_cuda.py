"""CUDA-graph decode against eager decode on a CUDA GPU (skipped without one): the same
tokens, token for token, for a batch whose contexts grow step by step, after preemption,
and for candidates sharing their prompt's blocks. float32, so that the decode kernel's
split count (frozen at the widest context in a graph) cannot flip a greedy token."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.tiny_models import random_prompt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def pair(tiny_dir, **config):
    """(graphs, eager) engines of the same model and pool on the GPU."""
    common = dict(device="cuda", dtype="float32", attention_backend="triton") | config
    return (LLM(str(tiny_dir), cuda_graphs=True, **common),
            LLM(str(tiny_dir), cuda_graphs=False, **common))


def tokens(outputs):
    return [[c.token_ids for c in out.outputs] for out in outputs]


def test_graph_decode_equals_eager_over_a_batch_of_growing_contexts(tiny_dir):
    graphs, eager = pair(tiny_dir, num_gpu_blocks=256)
    # Four requests of different lengths; all four decode together for 60 steps, each
    # step's contexts one longer and crossing block boundaries at different steps.
    prompts = [random_prompt(i, 5 + 13 * i) for i in range(4)]
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    got, want = graphs.generate(prompts, params), eager.generate(prompts, params)
    assert tokens(got) == tokens(want)
    runner = graphs.engine.runner.graphs
    assert runner is not None and not runner.failed and 4 in runner.graphs
    assert eager.engine.runner.graphs is None


def test_graph_decode_equals_eager_after_preemption(tiny_dir):
    graphs, eager = pair(tiny_dir, num_gpu_blocks=24)
    prompts = [random_prompt(i, 20 + i) for i in range(6)]
    params = SamplingParams(max_tokens=120, temperature=0, ignore_eos=True)
    got, want = graphs.generate(prompts, params), eager.generate(prompts, params)
    assert graphs.engine.scheduler.num_preemptions > 0
    assert tokens(got) == tokens(want)
    assert graphs.engine.runner.graphs.graphs  # some steps replayed


def test_graph_decode_equals_eager_for_candidates_sharing_blocks(tiny_dir):
    graphs, eager = pair(tiny_dir, num_gpu_blocks=256)
    prompt = random_prompt(3, 70)  # four full 16-token blocks shared by every candidate
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=40, ignore_eos=True)
    got, want = graphs.generate([prompt], params), eager.generate([prompt], params)
    assert tokens(got) == tokens(want)
    assert len({tuple(t) for t in tokens(got)[0]}) == 4
    assert 4 in graphs.engine.runner.graphs.graphs

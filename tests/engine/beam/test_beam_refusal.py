"""Which models run no beam search, said before any request (``beam_search_refusal``, the
app greys its choice out with it) and as the same reason when one is asked for."""

from __future__ import annotations

import pytest

from engine import LLM, BeamSearchParams
from tests.engine.tiny_models import save_tiny_model, tiny_qwen35_config


def test_a_dense_model_runs_beam_search(llm):
    assert llm.engine.beam_search_refusal() is None


def test_a_hybrid_model_says_why_before_and_when_asked(tmp_path):
    hybrid = LLM(str(save_tiny_model(tmp_path / "qwen35", tiny_qwen35_config())),
                 num_gpu_blocks=32, max_model_len=128)
    reason = hybrid.engine.beam_search_refusal()
    assert reason is not None and "linear-attention" in reason
    with pytest.raises(ValueError) as err:
        hybrid.beam_search([[1, 2, 3]], BeamSearchParams(2, 4))
    assert str(err.value) == f"BeamSearchParams: {reason}"
    assert not hybrid.engine.has_unfinished_requests()

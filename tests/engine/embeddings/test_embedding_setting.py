"""``EngineConfig.embedding_model``: the engine's prompt builder ranks long documents with
the embedder it names (the same instance ``/v1/embeddings`` uses: one load a process); a
path that is no embedding model fails the load before the chat model is read."""

from __future__ import annotations

import pytest

from engine import LLM, EngineConfig
from engine.embeddings import load_embedder
from tests.engine.embeddings.tiny_embedders import save_tiny_bert


def test_the_engine_retrieves_with_the_embedding_model_it_names(tiny_dir, tmp_path):
    bert = save_tiny_bert(tmp_path / "bge")
    with LLM(str(tiny_dir), num_gpu_blocks=64, embedding_model=str(bert)) as llm:
        assert llm.engine.prompts.attachments.embedder is load_embedder(bert)
    with LLM(str(tiny_dir), num_gpu_blocks=64) as llm:
        assert llm.engine.prompts.attachments.embedder is None


def test_a_bad_embedding_model_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="embedding_model"):
        EngineConfig(embedding_model="  ")
    with pytest.raises(ValueError, match="embedding_model: .*no such file"):
        LLM("/no/such/chat-model-either", embedding_model=str(tmp_path / "nope"))

"""``EngineConfig.embedding_model``: the engine's prompt builder ranks long documents with
the embedder it names (the same instance ``/v1/embeddings`` uses: one load a process); a
path that is no embedding model fails the load before the chat model is read."""

from __future__ import annotations

import pytest

from engine import LLM, EngineConfig, SamplingParams
from engine.chat.attachments import RETRIEVAL
from engine.chat.request import ChatRequest
from engine.documents import file_data_url
from engine.embeddings import load_embedder
from tests.engine.embeddings.tiny_embedders import save_tiny_bert


def test_the_engine_retrieves_with_the_embedding_model_it_names(tiny_dir, tmp_path):
    bert = save_tiny_bert(tmp_path / "bge")
    text = "\n\n".join(f"Paragraph {i} about the pump and its valves." for i in range(300))
    part = {"type": "file", "file": {"file_data": file_data_url(text.encode(), "text/plain"),
                                     "filename": "long.txt"}}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "valves?"}]}]
    with LLM(str(tiny_dir), num_gpu_blocks=64, max_model_len=1024,
             embedding_model=str(bert)) as llm:
        attachments = llm.engine.prompts.attachments
        assert attachments.embedder is load_embedder(bert)
        out = llm.chat(messages, SamplingParams(max_tokens=2, temperature=0))
        assert out.outputs[0].token_ids and attachments.vectors.computed == 1
        assert [d.mode for d in llm.engine.prompts.build(ChatRequest(messages)).documents] \
            == [RETRIEVAL]
        assert attachments.vectors.computed == 1  # the second build embedded nothing
    with LLM(str(tiny_dir), num_gpu_blocks=64) as llm:
        assert llm.engine.prompts.attachments.embedder is None


def test_a_bad_embedding_model_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="embedding_model"):
        EngineConfig(embedding_model="  ")
    with pytest.raises(ValueError, match="embedding_model: .*no such file"):
        LLM("/no/such/chat-model-either", embedding_model=str(tmp_path / "nope"))

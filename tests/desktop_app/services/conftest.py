"""A real ``folio serve`` (engine.serve, in this process) over a tiny random model: what
the remote-model tests talk to when they need a real OpenAI-compatible server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def tiny_served(tiny_model_path):
    from engine import LLM, EngineWorker
    from engine.serve.server import start_in_background
    llm = LLM(str(tiny_model_path), num_gpu_blocks=256, max_model_len=512)
    worker = EngineWorker(llm).start()
    server = start_in_background(worker)
    yield SimpleNamespace(url=server.url + "/v1", root=server.url, model=llm.model_name,
                          worker=worker, server=server)
    server.stop()
    worker.shutdown()

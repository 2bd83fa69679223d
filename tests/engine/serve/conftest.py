"""Servers for the API tests: ``folio serve``'s app on a free loopback port, over the
starter model (what a user runs) or a tiny random model (fast, for load and errors)."""

from __future__ import annotations

import pytest

from engine import LLM, EngineWorker
from engine.serve.app import ServeSettings
from engine.serve.server import start_in_background
from tests.engine.tiny_models import save_tiny_model

API_KEY = "test-key-123"


class Served:
    """A running server, its worker and LLM; ``client()`` is the official openai client."""

    def __init__(self, llm: LLM, settings: ServeSettings | None = None) -> None:
        self.llm = llm
        self.worker = EngineWorker(llm).start()
        self.server = start_in_background(self.worker, settings=settings)
        self.url = self.server.url
        self.model = llm.model_name

    def client(self, api_key: str = "unused", **kwargs):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0,
                             **kwargs)

    def async_client(self, api_key: str = "unused"):
        import openai

        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0)

    @property
    def metrics(self):
        return self.server.app.state.metrics

    def stop(self) -> None:
        self.server.stop()
        self.worker.shutdown()


@pytest.fixture(scope="module")
def starter_llm():
    return LLM("starter")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def tiny_llm_at(path) -> LLM:
    # A float32 pool (not the CPU's float16 default): the logprob tests hold it to
    # transformers' float32 logits at 1e-4.
    return LLM(str(path), num_gpu_blocks=256, max_model_len=512, kv_cache_dtype="float32")


@pytest.fixture(scope="module")
def tiny_llm(tiny_path):
    return tiny_llm_at(tiny_path)


@pytest.fixture(scope="module")
def tiny_served(tiny_llm):
    served = Served(tiny_llm, ServeSettings(max_body_bytes=64 * 1024, max_waiting=8))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def keyed_served(tiny_path):
    # Its own engine: two workers must never step one LLM.
    served = Served(tiny_llm_at(tiny_path), ServeSettings(api_key=API_KEY))
    yield served
    served.stop()

"""``folio serve`` over a library of models loaded on demand (HostedModels on a
ModelHost): /v1/models with each one's state, loading on the first request, 404 for an
unknown name, two models streaming at once, keep_alive, idle unloading, won't-fit."""

from __future__ import annotations

import asyncio

import httpx2 as httpx
import pytest
from transformers import Qwen2Config

from engine.config import EngineConfig
from engine.hosting import ModelHost
from engine.hosting.library import ModelLibrary
from engine.loaders.catalog import model_info
from engine.serve.models import HostedModels
from engine.serve.server import start_in_background
from tests.engine.tiny_models import save_tiny_model, tiny_llama_config

CONFIG = EngineConfig(num_gpu_blocks=64, kv_cache_dtype="float32", max_model_len=512)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("library")
    base = tiny_llama_config()
    qwen = Qwen2Config(vocab_size=base.vocab_size, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=1024, tie_word_embeddings=True,
                       bos_token_id=256, eos_token_id=258)
    save_tiny_model(root / "tiny-llama", base, seed=1)
    save_tiny_model(root / "tiny-qwen", qwen, seed=2)
    (root / "notes").mkdir()  # neither a model folder nor a .gguf: not listed
    return root


def only_the_folder(paths):
    return [model_info(p) for p in paths]


class Hosted:
    def __init__(self, models_dir, budget_bytes=None, keep_alive_s=300.0) -> None:
        self.clock = Clock()
        self.library = ModelLibrary(models_dirs=[models_dir], list_models=only_the_folder)
        self.host = ModelHost(CONFIG, budget_bytes, keep_alive_s=keep_alive_s,
                              clock=self.clock, load=self.library.loader(CONFIG),
                              estimate=self.library.estimator(CONFIG))
        self.server = start_in_background(HostedModels(self.host, self.library, "tiny-llama"))
        self.url = self.server.url

    def get(self, path: str):
        return httpx.get(self.url + path, timeout=60)

    def chat(self, model: str, **fields):
        body = {"model": model, "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 6, "temperature": 0, **fields}
        return httpx.post(self.url + "/v1/chat/completions", json=body, timeout=120)

    def states(self) -> dict[str, str]:
        return {card["id"]: card["status"] for card in self.get("/v1/models").json()["data"]}

    def stop(self) -> None:
        self.server.stop()
        self.host.shutdown()


@pytest.fixture(scope="module")
def hosted(models_dir):
    served = Hosted(models_dir)
    yield served
    served.stop()


def test_models_are_listed_and_loaded_on_their_first_request(hosted):
    assert hosted.states() == {"tiny-llama": "unloaded", "tiny-qwen": "unloaded"}
    reply = hosted.chat("tiny-qwen")
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "tiny-qwen"
    assert reply.json()["usage"]["completion_tokens"] == 6
    assert hosted.states() == {"tiny-llama": "unloaded", "tiny-qwen": "loaded"}
    (model,) = hosted.get("/v1/status").json()["models"]
    assert model["id"] == "tiny-qwen" and model["running"] == 0
    assert model["weights_bytes"] > 0 and model["kv_bytes"] > 0
    assert model["total_bytes"] == model["weights_bytes"] + model["kv_bytes"]
    assert model["idle_s"] == 0.0 and model["keep_alive_s"] == 300.0
    metrics = hosted.get("/metrics").text
    assert 'folio_model_loaded{model="tiny-qwen"} 1.0' in metrics
    assert 'folio_model_loaded{model="tiny-llama"} 0.0' in metrics
    assert 'folio_model_idle_seconds{model="tiny-qwen"} 0.0' in metrics
    # The one-model server's KV figures, over the loaded models (the app reads them).
    assert 'folio_kv_blocks{state="free"} 64.0' in metrics
    assert "folio_kv_blocks_total 64.0" in metrics
    assert 'folio_model_kv_blocks{model="tiny-qwen",state="free"} 64.0' in metrics


def test_an_unknown_model_is_openais_404(hosted):
    reply = hosted.chat("gpt-9")
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error", "model_not_found", "model")
    assert "gpt-9" in error["message"] and "tiny-llama" in error["message"]


def test_a_bad_keep_alive_is_a_400_naming_it(hosted):
    reply = hosted.chat("tiny-llama", keep_alive="soon")
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "keep_alive"


def test_two_models_stream_at_once(hosted):
    import openai

    client = openai.AsyncOpenAI(base_url=hosted.url + "/v1", api_key="unused", max_retries=0)

    async def stream(model: str) -> tuple[str, str]:
        chunks = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=6,
            temperature=0, stream=True)
        text, names = "", set()
        async for chunk in chunks:
            names.add(chunk.model)
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        return text, "".join(names)

    async def both():
        return await asyncio.gather(stream("tiny-llama"), stream("tiny-qwen"))

    (llama_text, llama_name), (qwen_text, qwen_name) = asyncio.run(both())
    assert (llama_name, qwen_name) == ("tiny-llama", "tiny-qwen")
    # Each stream is its own model's greedy reply, as a request of its own gives.
    for model, text in (("tiny-llama", llama_text), ("tiny-qwen", qwen_text)):
        assert hosted.chat(model).json()["choices"][0]["message"]["content"] == text
    assert hosted.states() == {"tiny-llama": "loaded", "tiny-qwen": "loaded"}


def test_keep_alive_zero_unloads_after_the_request_and_idle_models_are_reaped(hosted):
    assert hosted.chat("tiny-llama", keep_alive=0).status_code == 200
    assert hosted.states()["tiny-llama"] == "unloaded"
    assert hosted.chat("tiny-llama", keep_alive="1m").status_code == 200
    assert hosted.chat("tiny-qwen", keep_alive="10m").status_code == 200
    hosted.clock.now += 60
    assert hosted.host.reap() == ["tiny-llama"]
    assert hosted.states() == {"tiny-llama": "unloaded", "tiny-qwen": "loaded"}


def test_a_model_over_the_budget_is_a_503_saying_why(models_dir):
    served = Hosted(models_dir, budget_bytes=4096)
    try:
        reply = served.chat("tiny-llama")
        assert reply.status_code == 503
        error = reply.json()["error"]
        assert error["code"] == "model_wont_fit"
        assert "more than the whole memory budget" in error["message"]
        assert served.states()["tiny-llama"] == "unloaded"
    finally:
        served.stop()


def test_a_model_answers_to_its_engines_name_too(hosted, models_dir):
    (card,) = [c for c in hosted.get("/v1/models").json()["data"] if c["id"] == "tiny-qwen"]
    assert card["max_model_len"] == 512  # CONFIG's, below the model's 1,024
    assert hosted.library.resolve("tiny-qwen") == "tiny-qwen"
    assert hosted.library.name_of(str(models_dir / "tiny-qwen")) == "tiny-qwen"

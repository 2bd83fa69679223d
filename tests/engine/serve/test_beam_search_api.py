"""vLLM's ``use_beam_search`` on /v1/completions and /v1/chat/completions: the choices
are the engine's best beams, best first; combinations that make no sense are a 400
naming the field."""

from __future__ import annotations

import httpx2 as httpx
import pytest

from engine.beam.params import BeamSearchParams
from tests.engine.serve.conftest import tiny_llm_at

PROMPT = [5, 17, 99, 3, 64, 201, 12]
MESSAGES = [{"role": "user", "content": "Rename x to y"}]


@pytest.fixture(scope="module")
def reference(tiny_path):
    """A second engine over the same model (the served one belongs to its worker)."""
    return tiny_llm_at(tiny_path)


def post(served, path: str, body: dict) -> httpx.Response:
    return httpx.post(served.url + path, json={"model": served.model, **body}, timeout=60)


def test_text_completion_returns_the_best_n_of_best_of_beams(tiny_served, reference):
    body = {"prompt": PROMPT, "max_tokens": 10, "n": 2, "best_of": 4,
            "use_beam_search": True, "length_penalty": 0.5, "early_stopping": "never",
            "temperature": 0}
    response = post(tiny_served, "/v1/completions", body)
    assert response.status_code == 200, response.text
    [expected] = reference.beam_search([PROMPT], BeamSearchParams(
        4, 10, 0.5, "never", num_returned=2))
    choices = response.json()["choices"]
    assert [c["text"] for c in choices] == [o.text for o in expected.outputs]
    assert len(choices) == 2
    usage = response.json()["usage"]
    assert usage["completion_tokens"] == sum(len(o.token_ids) for o in expected.outputs)


def test_chat_completion_beams(tiny_served, reference):
    body = {"messages": MESSAGES, "max_tokens": 8, "n": 3, "use_beam_search": True}
    response = post(tiny_served, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    [expected] = reference.beam_search(MESSAGES, BeamSearchParams(3, 8))
    assert [c["message"]["content"] for c in response.json()["choices"]] == \
        [o.text for o in expected.outputs]
    assert [c["index"] for c in response.json()["choices"]] == [0, 1, 2]


@pytest.mark.parametrize(("path", "extra", "field"), [
    ("/v1/completions", {"use_beam_search": True, "stream": True}, "stream"),
    ("/v1/completions", {"use_beam_search": True, "logprobs": 2}, "logprobs"),
    ("/v1/completions", {"use_beam_search": True, "seed": 3}, "seed"),
    ("/v1/completions", {"use_beam_search": True, "temperature": 0.7}, "temperature"),
    ("/v1/completions", {"use_beam_search": True, "top_p": 0.5}, "top_p"),
    ("/v1/completions", {"length_penalty": 2.0}, "length_penalty"),
    ("/v1/completions", {"early_stopping": True}, "early_stopping"),
    ("/v1/completions", {"best_of": 3}, "best_of"),  # still best_of == n without beams
    ("/v1/chat/completions", {"use_beam_search": True, "stream": True}, "stream"),
    ("/v1/chat/completions", {"use_beam_search": True,
                              "response_format": {"type": "json_object"}}, "response_format"),
])
def test_refused_combinations(tiny_served, path, extra, field):
    base = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": MESSAGES}
    response = post(tiny_served, path, {**base, "max_tokens": 4, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"]


def test_n_above_best_of_is_invalid(tiny_served):
    response = post(tiny_served, "/v1/completions", {
        "prompt": PROMPT, "max_tokens": 4, "n": 3, "best_of": 2, "use_beam_search": True})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "n"


def test_tools_are_refused_with_beam_search():
    from engine.sampling_params import SamplingParams
    from engine.serve.beam import beam_search_params
    from engine.serve.fields import UnsupportedField
    from engine.serve.protocol import ChatCompletionRequest

    body = ChatCompletionRequest(model="m", messages=MESSAGES, use_beam_search=True)
    with pytest.raises(UnsupportedField) as refused:
        beam_search_params(body, SamplingParams(max_tokens=4), tools=True)
    assert refused.value.field == "tools"
    # Without a limit, the rest of the context is the beams' limit.
    assert beam_search_params(body, SamplingParams(max_tokens=None), room=50).max_tokens == 50

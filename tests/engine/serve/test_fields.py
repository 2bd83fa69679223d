"""Every field of OpenAI's chat and text completion requests is honoured, ignored where
that cannot change the reply, or refused with a 400 naming it: never dropped in silence.
The lists are OpenAI's API reference; fields the installed openai client knows beyond
them must be refused too (a field no one classified is a field Folio does not do)."""

from __future__ import annotations

import json

import httpx2 as httpx
import pytest

from engine import LLM
from engine.serve import fields
from engine.serve.protocol import ChatCompletionRequest, CompletionRequest
from tests.engine.serve.conftest import Served
from tests.engine.tools.tool_models import save_tool_model

HONOURED, IGNORED, REFUSED = "honoured", "ignored", "refused"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

# field: (a value that would change the reply or the promise, outcome, check of the body)
CHAT = {
    "messages": ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], HONOURED,
                 None),
    "model": (None, HONOURED, None),  # the served one (a wrong one is a 404: test_errors)
    "n": (2, HONOURED, lambda body: len(body["choices"]) == 2),
    "temperature": (0, HONOURED, None),
    "top_p": (0.5, HONOURED, None),
    "max_tokens": (2, HONOURED, lambda body: body["usage"]["completion_tokens"] <= 2),
    "max_completion_tokens": (2, HONOURED,
                              lambda body: body["usage"]["completion_tokens"] <= 2),
    "stop": (["\n"], HONOURED, lambda body: "\n" not in body["choices"][0]["message"][
        "content"]),
    "seed": (7, HONOURED, None),
    "stream": (False, HONOURED, None),
    "stream_options": ({"include_usage": True, "include_obfuscation": True}, HONOURED, None),
    "logprobs": (True, HONOURED, lambda body: body["choices"][0]["logprobs"]["content"]),
    "top_logprobs": (0, HONOURED, None),
    "frequency_penalty": (0.5, REFUSED, None),
    "presence_penalty": (0.5, REFUSED, None),
    "logit_bias": ({"50": 100}, REFUSED, None),
    "response_format": ({"type": "json_schema", "json_schema": {
        "name": "pick", "schema": {"enum": ["y", "n"]}}}, HONOURED,
        lambda body: json.loads(body["choices"][0]["message"]["content"]) in ("y", "n")),
    # On a model whose template takes tools (the tiny ChatML one has no place for them).
    "tools": ([TOOL], HONOURED, lambda body: body["choices"][0]["message"]["role"]),
    "tool_choice": ("required", HONOURED, None),
    "parallel_tool_calls": (False, HONOURED, None),
    # A reasoning model's switch (test_reasoning_api); other templates ignore it.
    "chat_template_kwargs": ({"enable_thinking": False}, HONOURED, None),
    "functions": ([{"name": "f", "parameters": {}}], REFUSED, None),
    "function_call": ("auto", REFUSED, None),
    "audio": ({"voice": "alloy", "format": "wav"}, REFUSED, None),
    "modalities": (["text", "audio"], REFUSED, None),
    "prediction": ({"type": "content", "content": "hello"}, HONOURED, None),
    # Passed to the chat template (test_reasoning_api); templates without it ignore it.
    "reasoning_effort": ("low", HONOURED, None),
    "verbosity": ("low", REFUSED, None),
    "web_search_options": ({"search_context_size": "low"}, REFUSED, None),
    "moderation": ({"model": "omni-moderation-latest"}, REFUSED, None),
    "store": (True, REFUSED, None),
    "service_tier": ("flex", REFUSED, None),
    "prompt_cache_retention": ("24h", REFUSED, None),
    "prompt_cache_options": ({"ttl": "1h"}, REFUSED, None),
    "user": ("user-1", IGNORED, None),
    "safety_identifier": ("hash-1", IGNORED, None),
    "metadata": ({"project": "x"}, IGNORED, None),
    "prompt_cache_key": ("k", IGNORED, None),
}
# What Folio does anyway, spelled out by a client: accepted.
CHAT_DEFAULTS = {"tools": [], "tool_choice": "none", "response_format": {"type": "text"},
                 "logit_bias": {}, "frequency_penalty": 0, "presence_penalty": 0.0,
                 "modalities": ["text"], "store": False, "service_tier": "auto",
                 "functions": [], "function_call": "none", "logprobs": False,
                 "prompt_cache_retention": "in_memory"}
TEXT = {
    "model": (None, HONOURED, None),
    "prompt": ([1, 2, 3], HONOURED, lambda body: body["usage"]["prompt_tokens"] == 3),
    "n": (2, HONOURED, lambda body: len(body["choices"]) == 2),
    "temperature": (0, HONOURED, None),
    "top_p": (0.5, HONOURED, None),
    "max_tokens": (2, HONOURED, lambda body: body["usage"]["completion_tokens"] <= 2),
    "stop": ("\n", HONOURED, None),
    "seed": (7, HONOURED, None),
    "stream": (False, HONOURED, None),
    "stream_options": ({"include_usage": True}, HONOURED, None),
    "logprobs": (3, HONOURED, lambda body: body["choices"][0]["logprobs"]["tokens"]),
    "echo": (True, REFUSED, None),
    "suffix": ("the end", REFUSED, None),
    "best_of": (3, REFUSED, None),
    "frequency_penalty": (0.5, REFUSED, None),
    "presence_penalty": (0.5, REFUSED, None),
    "logit_bias": ({"50": 100}, REFUSED, None),
    "user": ("user-1", IGNORED, None),
}
EXTENSIONS = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2, "ignore_eos": True}
# Honoured fields that need a model with a tool format, and what they go with.
TOOL_FIELDS = {"tools": {}, "tool_choice": {"tools": [TOOL]},
               "parallel_tool_calls": {"tools": [TOOL]}}


@pytest.fixture(scope="module")
def tools_served(tmp_path_factory):
    path = save_tool_model(tmp_path_factory.mktemp("qwen") / "model", "qwen2")
    served = Served(LLM(str(path), num_gpu_blocks=128, max_model_len=1024))
    yield served
    served.stop()


def post(served, path: str, body: dict) -> httpx.Response:
    return httpx.post(served.url + path, json=body, timeout=60)


def chat(served, **extra) -> dict:
    return {"model": served.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, **extra}


def text(served, **extra) -> dict:
    return {"model": served.model, "prompt": "hi", "max_tokens": 4, **extra}


def assert_refused(response, field: str) -> None:
    assert response.status_code == 400, (field, response.text)
    error = response.json()["error"]
    assert field in error["message"] and error["param"] == field
    assert error["code"] == "unsupported_parameter"


def client_fields(params_module) -> set[str]:
    base = params_module.CompletionCreateParamsBase
    return set(base.__annotations__) | {"stream"}


def test_the_lists_cover_the_openai_clients_fields_or_it_refuses_the_rest(tiny_served):
    """A field of the installed openai client that these lists do not know is one Folio
    does not know either: refused by name, never dropped."""
    from openai.types import completion_create_params as text_params
    from openai.types.chat import completion_create_params as chat_params

    for known, params, path, body in ((CHAT, chat_params, "/v1/chat/completions", chat),
                                      (TEXT, text_params, "/v1/completions", text)):
        for name in sorted(client_fields(params) - set(known)):
            assert_refused(post(tiny_served, path, body(tiny_served, **{name: "x"})), name)


@pytest.mark.parametrize(("request_model", "table", "honoured", "ignored", "default_only"), [
    (ChatCompletionRequest, CHAT, fields.HONOURED_CHAT, fields.IGNORED_CHAT,
     fields.DEFAULT_ONLY_CHAT),
    (CompletionRequest, TEXT, fields.HONOURED_TEXT, fields.IGNORED_TEXT,
     fields.DEFAULT_ONLY_TEXT),
])
def test_each_field_is_classified_once(request_model, table, honoured, ignored, default_only):
    groups = [set(honoured), set(ignored), set(default_only), set(fields.EXTENSIONS)]
    assert sum(len(g) for g in groups) == len(set().union(*groups))  # no field twice
    assert set().union(*groups) == set(request_model.model_fields)
    # The test's table and the server's agree on every OpenAI field.
    assert set(table) == set(request_model.model_fields) - set(fields.EXTENSIONS)
    for name, (_, outcome, _) in table.items():
        assert (name in honoured) == (outcome == HONOURED), name
        assert (name in ignored) == (outcome == IGNORED), name


@pytest.mark.parametrize(("path", "body", "name"), [
    *[("/v1/chat/completions", chat, name) for name in CHAT],
    *[("/v1/completions", text, name) for name in TEXT],
])
def test_each_field_is_honoured_or_refused(tiny_served, request, path, body, name):
    value, outcome, check = (CHAT if body is chat else TEXT)[name]
    served = tiny_served
    extra = {}
    if body is chat and name in TOOL_FIELDS:
        served, extra = request.getfixturevalue("tools_served"), TOOL_FIELDS[name]
    payload = body(served) if value is None else body(served, **{name: value}, **extra)
    response = post(served, path, payload)
    if outcome == REFUSED:
        assert_refused(response, name)
        return
    assert response.status_code == 200, (name, response.text)
    if check is not None:
        assert check(response.json()), (name, response.json())


def test_default_values_of_refused_fields_pass(tiny_served):
    response = post(tiny_served, "/v1/chat/completions", chat(tiny_served, **CHAT_DEFAULTS))
    assert response.status_code == 200, response.text
    response = post(tiny_served, "/v1/completions", text(
        tiny_served, n=2, best_of=2, echo=False, suffix="", logit_bias={}))
    assert response.status_code == 200, response.text


def test_vllms_sampling_extensions_are_honoured(tiny_served):
    body = chat(tiny_served, **EXTENSIONS, temperature=1.0, max_tokens=6)
    assert post(tiny_served, "/v1/chat/completions", body).json()["usage"][
        "completion_tokens"] == 6  # ignore_eos: the tiny model never stops early
    params = ChatCompletionRequest.model_validate(body).sampling_params(16)
    assert (params.top_k, params.min_p, params.repetition_penalty, params.ignore_eos) == (
        5, 0.1, 1.2, True)
    off = ChatCompletionRequest.model_validate(chat(tiny_served, top_k=-1))
    assert off.sampling_params(16).top_k == 0  # vLLM's -1: off


def test_a_chat_without_max_tokens_runs_up_to_the_context(tiny_served):
    body = chat(tiny_served, ignore_eos=True)
    del body["max_tokens"]
    assert ChatCompletionRequest.model_validate(body).sampling_params(None).max_tokens is None
    reply = post(tiny_served, "/v1/chat/completions", body).json()
    usage = reply["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == tiny_served.llm.max_model_len
    assert reply["choices"][0]["finish_reason"] == "length"  # OpenAI's word for the end


@pytest.mark.parametrize(("path", "extra", "field"), [
    ("/v1/chat/completions", {"foo": 1}, "foo"),
    ("/v1/chat/completions", {"stream_options": {"include_usage": True, "x": 1}},
     "stream_options.x"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "lang": "en"}]},
     "messages.0.lang"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "name": "bob"}]},
     "messages.0.name"),
    ("/v1/chat/completions", {"messages": [{"role": "function", "content": "42"}]},
     "messages.0.role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"},
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
     "messages.0.content.1.type"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]},
     "messages.0.content.0.cache_control"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None,
                                            "function_call": {"name": "f"}}]},
     "messages.0.function_call"),
    ("/v1/completions", {"best_of": 3, "n": 2}, "best_of"),
    ("/v1/completions", {"top_logprobs": 2}, "top_logprobs"),
])
def test_unknown_and_unsupported_fields_anywhere_are_refused_by_name(tiny_served, path,
                                                                     extra, field):
    body = (chat if "chat" in path else text)(tiny_served, **extra)
    assert_refused(post(tiny_served, path, body), field)

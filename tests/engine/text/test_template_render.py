"""render_chat against transformers' apply_chat_template: every chat template Folio ships or
tests with, and templates written to reach each part of the environment, over chats with
tool calls and results, reasoning under each of its names, None values and content parts;
the same text or the same refusal."""

from __future__ import annotations

import pytest
from jinja2 import TemplateError
from jinja2.exceptions import SecurityError

from engine.text.template_render import render_chat, select_template
from engine.text.turn_formats import FORMATS
from tests.engine.text.reasoning.thinking_models import HARMONY_TEMPLATE, THINK_TEMPLATE
from tests.engine.tiny_models import CHATML, byte_level_tokenizer
from tests.engine.tools.tool_models import (
    HERMES_TEMPLATE,
    LLAMA3_TEMPLATE,
    MISTRAL_TEMPLATE,
    PHI4_TEMPLATE,
)
from tests.engine.vision.test_idefics3_engine import PARTS_TEMPLATE

TOOLS = [{"type": "function", "function": {
    "name": "weather", "description": "Météo <now>",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = {"id": "c1", "type": "function",
        "function": {"name": "weather", "arguments": {"city": "Zürich"}}}
CHATS = {
    "one user turn": [{"role": "user", "content": "Hi"}],
    "system and turns": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Why?"}],
    "tool call and result": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "weather"}],
    "None values": [{"role": "user", "content": "Hi", "name": None},
                    {"role": "assistant", "content": "Yo", "tool_calls": None}],
    "reasoning_content": [{"role": "user", "content": "2+2?"},
                          {"role": "assistant", "content": "4", "reasoning_content": "add"}],
    "thinking": [{"role": "user", "content": "2+2?"},
                 {"role": "assistant", "content": "4", "thinking": "add"}],
    "reasoning": [{"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "</think>4", "reasoning": "sum"}],
    "content parts": [{"role": "user", "content": [{"type": "image"},
                                                   {"type": "text", "text": "What?"}]}],
}
# Each reaches parts of the environment the shipped templates do not.
FEATURES = (
    "{% set ns = namespace(n=0, seen=[]) %}{% for m in messages %}"
    "{% if loop.index > 3 %}{% break %}{% endif %}{% if m.role == 'system' %}{% continue %}"
    "{% endif %}{% set ns.n = ns.n + 1 %}{% generation %}{% set hidden = 1 %}"
    "{{ m.role }}:{{ m.content | tojson }}{% endgeneration %}{{ hidden is defined }}"
    "{% endfor %}{{ ns.n }}{{ dict(b=2, a=1) | tojson(sort_keys=True) }}"
    "{{ dict.fromkeys(['x'], 0) | tojson(separators=(',', ':')) }}"
    "{{ {'é': '<b>&'} | tojson }}{{ tools | tojson(indent=2) }}{{ documents }}"
    "{{ strftime_now('%Y') }}{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token }}"
    "{% for m in messages %}{{ 'tool_calls' in m }}{{ 'name' in m }}{{ m.thinking }}"
    "{{ m.reasoning_content }}{{ m.reasoning }}{% endfor %}{{ add_generation_prompt }}"
    "{{ enable_thinking is defined }}{{ ''.__class__ }}{{ dict.items is defined }}\n"
    "    {% if messages %}indented blocks lose their indent{% endif %}\n"
)
REFUSES = "{{ raise_exception('no ' + messages[0].role) }}"
UNDERSCORE = "{% set ns = namespace(_hidden=1) %}{{ ns }}"
TEMPLATES = {
    "chatml": CHATML, "hermes": HERMES_TEMPLATE, "llama3": LLAMA3_TEMPLATE,
    "mistral": MISTRAL_TEMPLATE, "phi4": PHI4_TEMPLATE, "think": THINK_TEMPLATE,
    "harmony-test": HARMONY_TEMPLATE, "parts": PARTS_TEMPLATE, "features": FEATURES,
    "refuses": REFUSES, "underscore": UNDERSCORE,
    **{f"format-{name}": f.template for name, f in FORMATS.items()},
}


def transformers_render(template, chat, **kwargs):
    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = template
    return tokenizer.apply_chat_template(chat, tokenize=False, **kwargs)


def outcome(render_fn, *args, **kwargs):
    try:
        return render_fn(*args, **kwargs)
    except Exception as exc:  # the same kind of refusal (test_refusals checks the words)
        return type(exc).__name__


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_each_template_renders_each_chat_as_transformers_does(template):
    source = TEMPLATES[template]
    special = byte_level_tokenizer().special_tokens_map
    for name, chat in CHATS.items():
        for kwargs in ({"add_generation_prompt": True}, {"add_generation_prompt": False},
                       {"add_generation_prompt": True, "tools": TOOLS},
                       {"add_generation_prompt": True, "enable_thinking": False,
                        "reasoning_effort": "low"}):
            theirs = outcome(transformers_render, source, chat, **kwargs)
            ours = outcome(render_chat, source, chat, **{**special, **kwargs})
            assert ours == theirs, (template, name, kwargs)


def test_the_features_template_reaches_what_it_tests():
    text = render_chat(FEATURES, CHATS["None values"] + CHATS["reasoning"],
                       add_generation_prompt=True, tools=TOOLS, bos_token="<s>")
    assert "user:\"Hi\"False" in text  # generation body kept, its assignment scoped
    assert '{"a": 1, "b": 2}{"x":0}{"é": "<b>&"}' in text
    assert "FalseFalse" in text  # the None keys were dropped
    assert "sumsumsum" in text  # reasoning under every name


def test_refusals_are_jinja_errors():
    with pytest.raises(TemplateError, match="no user"):
        render_chat(REFUSES, CHATS["one user turn"])
    with pytest.raises(SecurityError, match="underscore"):
        render_chat(UNDERSCORE, CHATS["one user turn"])


def test_the_callers_messages_are_left_as_they_were():
    chat = [{"role": "assistant", "content": "4", "reasoning": "sum", "tool_calls": None}]
    assert "sumsum" in render_chat(FEATURES, chat)
    assert chat == [{"role": "assistant", "content": "4", "reasoning": "sum",
                     "tool_calls": None}]


def test_named_templates_and_empty_chats():
    named = {"default": "d", "tool_use": "t"}
    assert select_template(named) == "d"
    assert select_template(named, TOOLS) == "t"
    assert select_template({"default": "d"}, TOOLS) == "d"
    with pytest.raises(ValueError, match="none is the default"):
        select_template({"rag": "r"})
    with pytest.raises(ValueError, match="no chat template"):
        select_template(None)
    with pytest.raises(ValueError, match="at least one message"):
        render_chat(CHATML, [])


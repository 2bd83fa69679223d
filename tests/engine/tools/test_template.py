"""Tools, calls and results through each family's chat template (``ChatTokenizer`` with
``tools=``, messages prepared by ``engine/tools/template.py``), on the tiny tokenizers of
``tool_models.py``."""

from __future__ import annotations

import copy
import json

import pytest

from engine.text.chat_template import ChatTokenizer
from engine.tools.registry import tool_format
from engine.tools.template import TemplateToolError, TemplateTools, prepare
from tests.engine.tools.tool_models import (
    ARGUMENTS,
    CALL_REPLIES,
    FAMILIES,
    TOOL_FAMILIES,
    WEATHER_TOOL,
    tool_tokenizer,
)

CALL_ID = "abcDEF123"  # 9 alphanumerics: Mistral's templates take no other
RESULT = '{"temperature": 18}'
QUESTION = {"role": "user", "content": "Weather in Paris?"}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": CALL_ID, "type": "function",
     "function": {"name": "get_weather", "arguments": ARGUMENTS}}]}
ANSWER = {"role": "tool", "tool_call_id": CALL_ID, "content": RESULT}
# How each template shows a tool result.
RESULTS = {
    "qwen2": f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>",
    "llama": f"<|start_header_id|>ipython<|end_header_id|>\n\n{RESULT}<|eot_id|>",
    "mistral": '[TOOL_RESULTS] {"content": ' + json.dumps(RESULT) + f', "call_id": '
               f'"{CALL_ID}"}}[/TOOL_RESULTS]',
    "phi3": f"<|tool|>{RESULT}<|end|>",
}
RESULTS["qwen3"] = RESULTS["qwen2"]


def render(family: str, messages: list[dict], tools=None) -> str:
    hf = tool_tokenizer(family)
    chat = ChatTokenizer(hf)
    fmt = tool_format(family, hf.chat_template)
    prepared = prepare(copy.deepcopy(messages), tools, fmt, TemplateTools.of(hf.chat_template))
    return chat.decode(chat.encode_chat(prepared, tools=tools), skip_special_tokens=False)


@pytest.mark.parametrize("family", TOOL_FAMILIES)
def test_each_family_has_its_format_for_its_template(family):
    fmt = tool_format(family, FAMILIES[family][1])
    assert fmt is not None
    assert fmt.name == {"qwen2": "hermes", "qwen3": "hermes", "llama": "llama3_json",
                        "mistral": "mistral", "phi3": "phi4_mini"}[family]


@pytest.mark.parametrize("family", TOOL_FAMILIES)
def test_the_tools_reach_the_prompt(family):
    text = render(family, [QUESTION], [WEATHER_TOOL])
    assert '"name": "get_weather"' in text and "The weather in a city now" in text
    assert text.index("get_weather") < text.index("Weather in Paris?")
    if family == "phi3":  # on the system message, as Phi-4-mini's template reads them
        assert text.startswith('<|system|><|tool|>[{"name": "get_weather"')


@pytest.mark.parametrize("family", TOOL_FAMILIES)
def test_calls_and_results_are_rendered_as_the_family_writes_them(family):
    text = render(family, [QUESTION, CALL, ANSWER], [WEATHER_TOOL])
    call = CALL_REPLIES[family]
    if family == "mistral":  # its template writes the id the model never does
        call = call[:-2] + f', "id": "{CALL_ID}"}}]'
    assert call in text
    assert RESULTS[family] in text
    assert text.index(call) < text.index(RESULTS[family])


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "phi3"])
def test_a_call_shown_back_extends_the_prompt_it_answered(family):
    """What the prefix cache needs of an agent loop: the first request's prompt and the
    model's own call are where the second request's prompt starts."""
    first = render(family, [QUESTION], [WEATHER_TOOL])
    second = render(family, [QUESTION, CALL, ANSWER], [WEATHER_TOOL])
    assert second.startswith(first + CALL_REPLIES[family])


def test_a_template_without_tools_refuses_them():
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    caps = TemplateTools.of(plain)
    assert caps == TemplateTools(False, False)
    with pytest.raises(TemplateToolError, match="no place for tools") as error:
        prepare([QUESTION], [WEATHER_TOOL], None, caps)
    assert error.value.field == "tools"
    with pytest.raises(TemplateToolError) as error:
        prepare([QUESTION, CALL, ANSWER], None, None, caps)
    assert error.value.field == "messages.1.tool_calls"


def test_arguments_reach_the_template_as_a_mapping():
    caps = TemplateTools(True, True)
    prepared = prepare([QUESTION, CALL], None, None, caps)
    assert prepared[1]["tool_calls"][0]["function"]["arguments"] == json.loads(ARGUMENTS)
    assert CALL["tool_calls"][0]["function"]["arguments"] == ARGUMENTS  # not changed


def test_a_template_that_raises_is_a_value_error_naming_messages():
    two = copy.deepcopy(CALL)
    two["tool_calls"].append(copy.deepcopy(two["tool_calls"][0]))
    with pytest.raises(ValueError, match="messages: .*single tool-calls"):
        render("llama", [QUESTION, two, ANSWER], [WEATHER_TOOL])

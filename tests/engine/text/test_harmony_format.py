"""gpt-oss's harmony turn format: a gpt-oss GGUF without a chat template renders its chats
in it, token for token as the format writes them (the expected texts below are written
from OpenAI's harmony spec: the renderer's system message, the system prompt as the
developer's instructions, the tools as ``namespace functions``, replies as their final
message, calls to ``functions.NAME`` ended by ``<|call|>``, results from
``functions.NAME to=assistant``), and stops a reply at a call as at its end."""

from __future__ import annotations

import pytest

from engine.loaders import load_model_files
from engine.models import family_of
from engine.text.chat_template import chat_tokenizer_for
from engine.text.template_render import render_chat
from engine.text.turn_formats import FORMATS, FROM_FAMILY, check_template
from tests.engine.harmony_gguf import HARMONY_SPECIALS, write_harmony_gguf

pytestmark = pytest.mark.usefixtures("single_torch_thread")

SYSTEM = ("<|start|>system<|message|>You are ChatGPT, a large language model trained by "
          "OpenAI.\nKnowledge cutoff: 2024-06\n\nReasoning: {effort}\n\n# Valid channels: "
          "analysis, commentary, final. Channel must be included for every message.{calls}"
          "<|end|>")
TOOLS_LINE = "\nCalls to these tools must go to the commentary channel: 'functions'."
CHAT = [{"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "How are you?"}]
CHAT_TEXT = (SYSTEM.format(effort="medium", calls="")
             + "<|start|>developer<|message|># Instructions\n\nAnswer in French.<|end|>"
             "<|start|>user<|message|>Hello<|end|>"
             "<|start|>assistant<|channel|>final<|message|>Bonjour !<|end|>"
             "<|start|>user<|message|>How are you?<|end|><|start|>assistant")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.\nNow, not tomorrow.",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "The city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"lat": {"type": ["number", "null"]}},
                  "required": ["lat"]}}}}}
NOW = {"type": "function", "function": {"name": "now", "description": "",
                                        "parameters": {"type": "object", "properties": {}}}}
TOOLS_TEXT = (
    "# Tools\n\n## functions\n\nnamespace functions {\n\n"
    "// The weather in a city.\n// Now, not tomorrow.\n"
    "type get_weather = (_: {\n"
    "// The city's name\n"
    "city: string,\n"
    "unit?: \"celsius\" | \"fahrenheit\", // default: celsius\n"
    "days?: number,\n"
    "tags?: string[],\n"
    "where?: {\n"
    "    lat: number | null,\n"
    "    },\n"
    "}) => any;\n\n"
    "type now = () => any;\n\n"
    "} // namespace functions")
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL_CHAT = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\": \"clear\"}"}]
TOOL_CHAT_TEXT = (
    SYSTEM.format(effort="medium", calls=TOOLS_LINE)
    + "<|start|>developer<|message|>" + TOOLS_TEXT + "<|end|>"
    "<|start|>user<|message|>Weather in Paris?<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    "<|message|>{\"city\": \"Paris\"}<|call|>"
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
    "{\"sky\": \"clear\"}<|end|><|start|>assistant")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = write_harmony_gguf(tmp_path_factory.mktemp("harmony") / "gpt-oss.gguf")
    loaded = load_model_files(path)
    assert not loaded.tokenizer.chat_template
    return chat_tokenizer_for(loaded.tokenizer, family_of(loaded.config).turn_format)


def ids_of(tok, text: str) -> list[int]:
    """The text's ids with each harmony marker its one special token."""
    ids = tok.encode(text, add_special_tokens=False)
    markers = set(tok.hf.convert_tokens_to_ids(HARMONY_SPECIALS))
    assert sum(i in markers for i in ids) == sum(text.count(m) for m in HARMONY_SPECIALS)
    return ids


def test_a_gpt_oss_file_without_a_template_renders_a_chat_in_harmony(tokenizer):
    assert tokenizer.template_source == FROM_FAMILY
    assert tokenizer.encode_chat(CHAT) == ids_of(tokenizer, CHAT_TEXT)


def test_tools_calls_and_results_in_harmony(tokenizer):
    tools = [WEATHER, NOW]
    ids = tokenizer.encode_chat(TOOL_CHAT, tools=tools)
    assert ids == ids_of(tokenizer, TOOL_CHAT_TEXT)
    # The result's function is named by the result too; a call given as JSON text reads
    # the same.
    named = [TOOL_CHAT[0], {**TOOL_CHAT[1], "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {**TOOL_CHAT[2], "name": "get_weather"}]
    assert tokenizer.encode_chat(named, tools=tools) == ids


def test_an_answered_turn_keeps_its_final_message_only_and_a_chat_ends_on_return(tokenizer):
    template = tokenizer.hf.chat_template
    reply = {"role": "assistant", "content": "Il fait beau."}
    done = render_chat(template, [*TOOL_CHAT, reply])
    assert done.endswith("<|start|>assistant<|channel|>final<|message|>Il fait beau.<|return|>")
    # An answered turn's reasoning is dropped; the turn in progress keeps its call's.
    thought = {**TOOL_CHAT[1], "reasoning_content": "Look it up."}
    answered = [TOOL_CHAT[0], thought, TOOL_CHAT[2], reply, {"role": "user", "content": "Merci"}]
    assert "Look it up." not in render_chat(template, answered, add_generation_prompt=True)
    ongoing = render_chat(template, [TOOL_CHAT[0], thought, TOOL_CHAT[2]],
                          add_generation_prompt=True)
    assert ("<|start|>assistant<|channel|>analysis<|message|>Look it up.<|end|><|start|>"
            "assistant<|channel|>commentary to=functions.get_weather") in ongoing
    # The format's ends of a reply: <|return|>, and a call's <|call|>.
    ends = set(tokenizer.hf.convert_tokens_to_ids(["<|return|>", "<|call|>"]))
    assert ends <= tokenizer.eos_token_ids
    assert tokenizer.hf.convert_tokens_to_ids("<|end|>") not in tokenizer.eos_token_ids
    assert tokenizer.end_of_turn_token_id == tokenizer.hf.convert_tokens_to_ids("<|return|>")


@pytest.mark.parametrize("effort", ["low", "medium", "high", None])
def test_reasoning_effort_goes_into_the_system_message(tokenizer, effort):
    """Each level the API and the app pass (engine.text.reasoning.options), through the
    chat tokenizer; unset, harmony's default (medium)."""
    ids = tokenizer.encode_chat(CHAT[1:2], reasoning_effort=effort)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.startswith(SYSTEM.format(effort=effort or "medium", calls=""))
    assert text.endswith("<|start|>user<|message|>Hello<|end|><|start|>assistant")
    assert "<|start|>developer" not in text  # no instructions, no tools: no developer message


def test_an_effort_the_format_has_no_level_for_is_refused(tokenizer):
    with pytest.raises(ValueError, match="reasoning_effort must be one of 'low', 'medium', "
                                         "'high', got 'max'"):
        tokenizer.encode_chat(CHAT[1:2], reasoning_effort="max")


def test_a_result_for_a_call_never_made_is_refused_naming_it(tokenizer):
    orphan = [TOOL_CHAT[0], {"role": "tool", "tool_call_id": "call_9", "content": "x"}]
    with pytest.raises(ValueError, match="call_9"):
        tokenizer.encode_chat(orphan, tools=[WEATHER])


def test_the_format_passes_the_template_check():
    assert check_template(FORMATS["harmony"].template).endswith(
        "<|start|>user<|message|>How are you?<|end|><|start|>assistant")

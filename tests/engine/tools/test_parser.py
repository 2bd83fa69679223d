"""Each family's tool parser on scripted streams: whole calls, the same reply cut at every
position (markers split across deltas), several calls, malformed JSON given back as the
text it was, and text that only looks like a call."""

from __future__ import annotations

import json
import random

import pytest

from engine.outputs import CallArguments, CallStart, TextDelta
from engine.tools.events import assemble
from engine.tools.format import ToolFormat
from engine.tools.hermes import HERMES
from engine.tools.llama3 import LLAMA3_JSON
from engine.tools.mistral import MISTRAL
from engine.tools.parser import ToolParser
from engine.tools.phi4 import PHI4_MINI

WEATHER = {"city": "Paris", "unit": "celsius"}
TIME = {"zone": "Europe/Paris"}

# format: (one call, several calls, malformed replies); the calls are (name, arguments).
CASES: dict[str, tuple[ToolFormat, str, str, list[str]]] = {
    "hermes": (
        HERMES,
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
        '{"zone": "Europe/Paris"}}\n</tool_call>',
        ['<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
         'Sure.\n<tool_call>\n{"arguments": {}}\n</tool_call>',
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'],
    ),
    "llama3_json": (
        LLAMA3_JSON,
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": '
        '"celsius"}}; {"name": "get_time", "parameters": {"zone": "Europe/Paris"}}',
        ['{"name": "get_weather", "parameters": {"city": "Paris"}',
         '{"name": "get_weather", "parameters": [1, 2]}',
         '<|python_tag|>brave_search.call(query="weather in Paris")'],
    ),
    "mistral": (
        MISTRAL,
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"celsius"}}]',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"celsius"}}, {"name": "get_time", "arguments": {"zone": "Europe/Paris"}}]',
        ['[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city" "Paris"}}]',
         '[TOOL_CALLS] I cannot call that.',
         '[TOOL_CALLS] []'],
    ),
    "phi4_mini": (
        PHI4_MINI,
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"celsius"}}]<|/tool_call|>',
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"celsius"}}, {"name": "get_time", "arguments": {"zone": "Europe/Paris"}}]'
        '<|/tool_call|>',
        ['<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris",}}]'
         '<|/tool_call|>',
         '<|tool_call|>[{"name": 7, "arguments": {}}]<|/tool_call|>'],
    ),
}
FORMATS = list(CASES)


def feed(fmt: ToolFormat, text: str, cuts=(), max_calls=None):
    """The events of ``text`` fed in the pieces ``cuts`` makes, and the parser."""
    parser = ToolParser(fmt, max_calls)
    events, start = [], 0
    for cut in [*cuts, len(text)]:
        events += parser.feed(text[start:cut])
        start = cut
    return events + parser.finish(), parser


def summary(events):
    text, calls = assemble(events)
    return text, [(c.name, json.loads(c.arguments), c.arguments) for c in calls]


def check_order(events) -> None:
    """Per call: its start (id, name) first, then its argument pieces, never interleaved
    with text."""
    started: set[int] = set()
    for event in events:
        if isinstance(event, CallStart):
            assert event.index == len(started) and event.id and event.name
            started.add(event.index)
        elif isinstance(event, CallArguments):
            assert event.index == max(started)


@pytest.mark.parametrize("name", FORMATS)
def test_a_whole_call(name):
    fmt, one, _, _ = CASES[name]
    events, parser = feed(fmt, one)
    text, calls = summary(events)
    assert calls == [("get_weather", WEATHER, calls[0][2])]
    assert text == ("Let me look." if name == "hermes" else "")
    assert parser.calls == 1 and not parser.malformed
    check_order(events)


@pytest.mark.parametrize("name", FORMATS)
def test_several_calls(name):
    fmt, _, several, _ = CASES[name]
    events, parser = feed(fmt, several)
    text, calls = summary(events)
    assert [(n, a) for n, a, _ in calls] == [("get_weather", WEATHER), ("get_time", TIME)]
    assert text == "" and parser.calls == 2
    ids = [e.id for e in events if isinstance(e, CallStart)]
    assert len(set(ids)) == 2
    check_order(events)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("which", ["one", "several"])
def test_cut_at_every_position_gives_the_same_reply(name, which):
    fmt, one, several, _ = CASES[name]
    reply = one if which == "one" else several
    whole = summary(feed(fmt, reply)[0])
    for at in range(len(reply) + 1):
        events, _ = feed(fmt, reply, [at])
        assert summary(events) == whole, at
        check_order(events)
    # A delta per character: every marker split at every place at once.
    events, _ = feed(fmt, reply, range(1, len(reply)))
    assert summary(events) == whole
    pieces = [e.text for e in events if isinstance(e, CallArguments) and e.index == 0]
    assert len(pieces) == len(whole[1][0][2])  # the arguments arrive as they were written
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(reply)), 6))
        assert summary(feed(fmt, reply, cuts)[0]) == whole, cuts


@pytest.mark.parametrize(("name", "k"), [(n, k) for n in FORMATS
                                         for k in range(len(CASES[n][3]))])
def test_malformed_json_comes_back_as_the_text_it_was(name, k):
    fmt, _, _, malformed = CASES[name]
    reply = malformed[k]
    for cuts in ([], range(1, len(reply)), [len(reply) // 2]):
        events, parser = feed(fmt, reply, cuts)
        assert summary(events) == (reply, [])
        assert parser.calls == 0 and parser.malformed


@pytest.mark.parametrize("name", FORMATS)
def test_parallel_calls_off_keeps_the_first_call(name):
    fmt, _, several, _ = CASES[name]
    events, parser = feed(fmt, several + " and more", max_calls=1)
    assert [(n, a) for n, a, _ in summary(events)[1]] == [("get_weather", WEATHER)]
    assert parser.done and summary(events)[0] == ""


@pytest.mark.parametrize("name", FORMATS)
def test_plain_text_passes_unchanged(name):
    fmt = CASES[name][0]
    reply = 'The weather in Paris is {"mild": true}; < 20 degrees [roughly].  \n'
    for cuts in ([], range(1, len(reply))):
        events, parser = feed(fmt, reply, cuts)
        assert summary(events) == (reply, []) and not parser.malformed
        assert all(isinstance(e, TextDelta) for e in events)


def test_text_streams_at_once_and_holds_back_only_a_possible_marker():
    parser = ToolParser(HERMES)
    assert parser.feed("Hello") == [TextDelta("Hello")]
    assert parser.feed(" there <tool") == [TextDelta(" there")]
    assert parser.feed("box> is not a marker") == [TextDelta(" <toolbox> is not a marker")]
    assert parser.finish() == []


def test_llama_reads_a_bare_object_only_where_a_call_can_start():
    # Prose first: the JSON in it is an example, not a call.
    reply = 'Call it like {"name": "get_weather", "parameters": {}}'
    assert summary(feed(LLAMA3_JSON, reply)[0]) == (reply, [])
    # Whitespace before the call is no prose.
    text, calls = summary(feed(LLAMA3_JSON, '\n\n{"name": "get_time", "parameters": {}}')[0])
    assert text == "" and calls[0][:2] == ("get_time", {})


def test_arguments_written_as_a_json_string_are_read():
    reply = '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}</tool_call>'
    text, calls = summary(feed(HERMES, reply)[0])
    assert calls == [("get_time", {"zone": "UTC"}, '{"zone": "UTC"}')]


def test_a_region_the_model_never_closed_is_read_when_its_json_is_whole():
    reply = '<tool_call>\n{"name": "get_time", "arguments": {}}\n'
    assert summary(feed(HERMES, reply)[0])[1][0][:2] == ("get_time", {})


def test_mistral_call_ids_are_nine_alphanumerics():
    events, _ = feed(MISTRAL, CASES["mistral"][1])
    ids = [e.id for e in events if isinstance(e, CallStart)]
    assert all(len(i) == 9 and i.isalnum() for i in ids)


def test_a_forced_start_and_named_prefix_read_as_a_call():
    for fmt in (HERMES, LLAMA3_JSON, MISTRAL, PHI4_MINI):
        rest = {"hermes": '{"zone": "UTC"}}\n</tool_call>',
                "llama3_json": '{"zone": "UTC"}}',
                "mistral": '{"zone": "UTC"}}]',
                "phi4_mini": '{"zone": "UTC"}}]<|/tool_call|>'}[fmt.name]
        text, calls = summary(feed(fmt, fmt.prefix("get_time") + rest)[0])
        assert (text, [c[:2] for c in calls]) == ("", [("get_time", {"zone": "UTC"})]), fmt

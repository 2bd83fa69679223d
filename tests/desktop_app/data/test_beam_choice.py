"""A chat's beam search as the engine's params (data.beam_choice): the chat's width,
length penalty and max tokens (else the room the context has left), the template's stops;
each case that cannot run refused by name; sampling left as it was."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from desktop_app.data.beam_choice import (
    NO_JSON,
    NO_ROOM,
    NO_TOOLS,
    beam_width,
    replies_of,
    turn_params,
)
from desktop_app.data.settings import ChatSettings
from engine.beam.params import BeamSearchParams
from engine.sampling_params import SamplingParams


def built(tool_format=None, call_format=None, stop_ids=(7,)):
    """What turn_params reads of a ChatPrompt: its tool formats and its stops."""

    def sampling(params: SamplingParams) -> SamplingParams:
        return SamplingParams(n=params.n, temperature=params.temperature,
                              max_tokens=params.max_tokens, stop_token_ids=list(stop_ids),
                              skip_special_tokens=False)

    return SimpleNamespace(call_format=call_format,
                           plan=SimpleNamespace(tool_format=tool_format), sampling=sampling)


def test_sampling_is_the_chats_sampling_params():
    chat = ChatSettings(num_candidates=3, temperature=0.3)
    params = turn_params(chat, built(), 100)
    assert params == chat.to_sampling_params()
    assert (replies_of(params), beam_width(params)) == (3, 0)
    assert turn_params(chat, None, 100, 1).n == 1  # a server's model samples as ever


def test_a_beam_search_of_the_chats_width():
    chat = ChatSettings(beam_search=True, beam_width=5, length_penalty=0.7, max_tokens=40)
    params = turn_params(chat, built(), 100)
    assert params == BeamSearchParams(5, 40, 0.7, stop_token_ids=[7],
                                      skip_special_tokens=False)
    assert (replies_of(params), beam_width(params)) == (5, 5)
    # A continued reply goes on with the best beam only.
    best = turn_params(chat, built(), 100, 1)
    assert (best.num_returned, replies_of(best), beam_width(best)) == (1, 1, 5)
    # Max tokens past the context, or "up to the context": the room left.
    assert turn_params(chat, built(), 25).max_tokens == 25
    assert turn_params(ChatSettings(beam_search=True), built(), 60).max_tokens == 60


@pytest.mark.parametrize("chat, prompt, room, refusal, message", [
    (ChatSettings(beam_search=True, json_mode=True), built(), 100, None, NO_JSON),
    (ChatSettings(beam_search=True), built(tool_format="hermes"), 100, None, NO_TOOLS),
    (ChatSettings(beam_search=True), built(call_format="call"), 100, None, NO_TOOLS),
    (ChatSettings(beam_search=True), built(), 0, None, NO_ROOM),
    (ChatSettings(beam_search=True), built(), 100, "no beams here",
     "Beam search: no beams here"),
    (ChatSettings(beam_search=True), None, 100, None, "Beam search: this model runs none"),
])
def test_what_cannot_run_is_refused_by_name(chat, prompt, room, refusal, message):
    with pytest.raises(ValueError) as err:
        turn_params(chat, prompt, room, refusal=refusal)
    assert str(err.value) == message


@pytest.mark.parametrize("field, value", [
    ("beam_width", 1), ("beam_width", 9), ("beam_width", 2.0), ("beam_search", 1),
    ("length_penalty", 5.5), ("length_penalty", "1"),
])
def test_chat_settings_name_a_bad_beam_field(field, value):
    with pytest.raises(ValueError, match=f"ChatSettings.{field} must be"):
        ChatSettings(**{field: value})

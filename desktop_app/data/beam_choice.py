"""A chat's "Beam search" (``ChatSettings.beam_search``): the engine params of its turns,
and what the choice means for the other settings. No Qt.

With it on, a turn is a deterministic beam search (engine/beam) of the chat's width and
length penalty, run by the engine like any request; its finished beams come back best
first and are the turn's candidates side by side. Nothing streams: the engine sends the
beams once the search ends. The sampling settings (temperature, top-p, top-k, min-p,
repetition penalty, seed, candidates) do not apply to it (``SAMPLING_ONLY``). A reply
constrained to JSON, a chat whose model may call tools, and a server's model (its replies
stream; vLLM's ``use_beam_search`` answers in one piece) are refused by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from desktop_app.data.settings import ChatSettings
    from engine.beam.params import BeamSearchParams
    from engine.chat import ChatPrompt
    from engine.sampling_params import SamplingParams

METRIC = "beam_width"  # a reply's metrics: the width of the search that wrote it
# ChatSettings fields a beam search ignores, and why (the settings form's tooltip).
SAMPLING_ONLY = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed",
                 "num_candidates")
SAMPLING_ONLY_NOTE = ("Not used with beam search: a beam search ranks every token by the "
                      "model's own log-probabilities, the same way every time, and its "
                      "width sets the candidates")
NO_JSON = ("Beam search: a beam search's reply is not constrained to JSON; turn "
           "\"Answer in JSON\" off, or beam search off, for this chat")
NO_TOOLS = ("Beam search: a beam search's reply calls no tools; turn this chat's tools "
            "off, or beam search off")
NO_ROOM = "Beam search: the prompt leaves no room in the context for a reply"


def turn_params(settings: ChatSettings, prompt: ChatPrompt | None, room: int,
                n: int | None = None, refusal: str | None = None
                ) -> SamplingParams | BeamSearchParams:
    """The engine params of one turn under ``settings``: its SamplingParams, or with beam
    search on its BeamSearchParams. ``prompt``: the turn as the engine built it (None: a
    server's model, sent the messages); ``room``: the tokens the context has left after
    it; ``n``: the replies wanted (None: the chat's candidates, or every beam; 1 for a
    continued reply: the best beam); ``refusal``: why the model runs no beam search
    (``EngineBridge.beam_search_refusal``). Raises ValueError saying why a beam search
    cannot run."""
    if not settings.beam_search:
        return settings.to_sampling_params(n)
    from engine.beam.params import BeamSearchParams
    from engine.sampling_params import SamplingParams

    if refusal is not None or prompt is None:
        raise ValueError(f"Beam search: {refusal or 'this model runs none'}")
    if settings.json_mode:
        raise ValueError(NO_JSON)
    if prompt.call_format is not None or prompt.plan.tool_format is not None:
        raise ValueError(NO_TOOLS)  # the model is offered tools: its replies may call
    max_tokens = min(settings.max_tokens or room, room)
    if max_tokens < 1:
        raise ValueError(NO_ROOM)
    # The stops and special-token handling the prompt's template needs, as for sampling.
    reading = prompt.sampling(SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens))
    return BeamSearchParams(settings.beam_width, max_tokens, float(settings.length_penalty),
                            stop=list(reading.stop),
                            stop_token_ids=list(reading.stop_token_ids),
                            ignore_eos=reading.ignore_eos,
                            skip_special_tokens=reading.skip_special_tokens,
                            num_returned=n)


def replies_of(params) -> int:
    """How many replies a turn under ``params`` writes: its candidates, or its beams."""
    width = getattr(params, "beam_width", None)
    if width is None:
        return params.n
    return params.num_returned or width


def beam_width(params) -> int:
    """The width of a beam search's params, 0 for sampling."""
    return getattr(params, "beam_width", 0) or 0

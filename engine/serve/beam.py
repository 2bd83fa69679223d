"""vLLM's ``use_beam_search`` extension on chat and text completions: the request's
fields as `BeamSearchParams`, or a 400 naming the field that makes no sense with it.

The beam width is ``best_of`` where a text completion sets it, else ``n``; the best ``n``
beams come back as the choices, best first. Beam search is deterministic and answers in
one piece, so the fields that sample (a temperature other than 0 or 1, top_p, top_k,
min_p, a repetition penalty, a seed), ``stream``, ``logprobs``, tools and
``response_format`` are refused with it. ``length_penalty`` and ``early_stopping`` (True,
False or "never", as transformers defines them) are refused without it.
"""

from __future__ import annotations

from engine.beam.params import BeamSearchParams
from engine.sampling_params import SamplingParams
from engine.serve.fields import UnsupportedField
from engine.tools.request import InvalidField


def beam_search_params(body, params: SamplingParams, tools: bool = False,
                       room: int | None = None) -> BeamSearchParams | None:
    """``body``'s beam search, or None where it asks for none. ``params``: its sampling
    fields as the prompt needs them (a chat's stop tokens added); ``tools``: whether the
    chat offers tools; ``room``: the tokens left in the context, the limit when the
    request sets none."""
    if not body.use_beam_search:
        if body.length_penalty != 1.0:
            raise UnsupportedField("length_penalty", "length_penalty applies to beam "
                                   "search only: set use_beam_search")
        if body.early_stopping is not False:
            raise UnsupportedField("early_stopping", "early_stopping applies to beam "
                                   "search only: set use_beam_search")
        return None
    refused = [
        ("stream", body.stream, "beam search answers in one piece"),
        ("tools", tools, "a beam search's reply calls no tools"),
        ("response_format", params.response_format is not None,
         "a beam search's reply is not constrained"),
        ("logprobs", params.logprobs is not None, "beams carry no per-token logprobs"),
        ("temperature", params.temperature not in (0, 1),
         "beam search is deterministic: leave temperature at 0 or 1"),
        ("top_p", params.top_p != 1, "beam search ranks every token"),
        ("top_k", params.top_k != 0, "beam search ranks every token"),
        ("min_p", params.min_p != 0, "beam search ranks every token"),
        ("repetition_penalty", params.repetition_penalty != 1,
         "beam search ranks the model's own log-probabilities"),
        ("seed", params.seed is not None, "beam search is deterministic"),
    ]
    for field, bad, why in refused:
        if bad:
            raise UnsupportedField(field, f"{field} is not supported with "
                                   f"use_beam_search: {why}")
    width = getattr(body, "best_of", None) or params.n
    if params.n > width:
        raise InvalidField("n", f"n={params.n} beams cannot come back from a beam search "
                           f"of width best_of={width}")
    max_tokens = params.max_tokens if params.max_tokens is not None else room
    if max_tokens is None or max_tokens < 1:
        raise InvalidField("max_tokens", "the prompt leaves no room for a reply")
    try:
        return BeamSearchParams(width, max_tokens, body.length_penalty, body.early_stopping,
                                list(params.stop), list(params.stop_token_ids),
                                params.ignore_eos, params.skip_special_tokens,
                                num_returned=params.n)
    except ValueError as exc:
        raise InvalidField("n" if "beam_width" in str(exc) else "use_beam_search",
                           str(exc)) from exc

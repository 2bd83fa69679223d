"""A step's sampled tokens appended to their candidates, and when each candidate ends.

Per token: the sequence takes it, its grammar (structured output) takes it, then the
finish checks run in this order, the first that holds ending the candidate:

    "stop"     an end-of-sequence token (unless ``ignore_eos``; a grammar that is done
               ends the reply even then), a ``stop_token_ids`` token, a stop string in
               the text (cut where it starts, never shown), a grammar that took its
               last token, or a reply reader whose last allowed tool call is made
    "length"   ``max_tokens`` output tokens (None: no such limit)
    "context"  the context is full (``max_model_len``)

The text that comes of the token (the detokenizer's delta, minus what a stop string may
still claim) goes to the candidate's text and its reply reader; a candidate that ends
gets its held-back text, its reader finished and the scheduler told. A `TokenEvent`
carries the delta and the reader's parts, and every token when log-probabilities are
asked for.
"""

from __future__ import annotations

import time

from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.outputs import Event, TokenEvent, TokenLogprobs
from engine.requests import RequestState
from engine.sampling_driver import Sampled
from engine.sampling_params import SamplingParams


class Stops:
    def __init__(self, tokenizer, max_model_len: int, scheduler: Scheduler) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.scheduler = scheduler

    def append(self, sampled: Sampled, counts: dict[str, int]) -> list[Event]:
        """Append each sampled token, counting it in ``counts`` (request id -> tokens
        this step); returns the step's token events."""
        now = time.perf_counter()
        events: list[Event] = []
        after_draft = sampled.after_draft
        for i, (seq, state, params, token, logprobs, matcher) in enumerate(zip(
                sampled.seqs, sampled.states, sampled.params, sampled.tokens,
                sampled.logprobs, sampled.matchers, strict=True)):
            if seq.is_finished:
                continue  # it ended on an earlier token of a verified run (engine/spec)
            if after_draft and after_draft[i]:
                self.scheduler.accept_draft(seq)
            token = int(token)
            seq.append_token(token)
            counts[seq.request_id] = counts.get(seq.request_id, 0) + 1
            # The mask allowed only tokens the grammar accepts; once it has taken its stop
            # token the reply is complete, even with ignore_eos.
            complete = matcher is not None and (not matcher.accept(token) or matcher.done)
            event = self._after_token(state, seq, params, token, now, logprobs, complete)
            if event is not None:
                events.append(event)
        return events

    def _after_token(
        self, state: RequestState, seq: Sequence, params: SamplingParams, token: int,
        now: float, logprobs: TokenLogprobs | None, complete: bool,
    ) -> TokenEvent | None:
        request = state.request
        cand = state.candidates[seq.index]
        if cand.first_token_time is None:
            cand.first_token_time = now
            if request.first_token_time is None:
                request.first_token_time = now
        reason = None
        is_eos = token in self.tokenizer.eos_token_ids and (complete or not params.ignore_eos)
        if is_eos or token in params.stop_token_ids:
            reason, delta = "stop", ""  # the stop token's own text is not shown
        else:
            stopped, delta = cand.stop.check(cand.detokenizer.add(token))
            if stopped or complete:
                reason = "stop"
        if reason is None and params.max_tokens is not None \
                and seq.num_output_tokens >= params.max_tokens:
            reason = "length"
        elif reason is None and seq.num_tokens >= self.max_model_len:
            reason = "context"
        if reason is not None and not cand.stop.stopped:
            delta += cand.drain()
        cand.text += delta
        reader = state.readers[seq.index]
        parts = reader.feed(delta, 1, now)
        if reader.done:
            reason = "stop"  # its last allowed tool call is made: the rest would be dropped
        if reason is not None:
            parts += reader.finish(now)
            cand.finish_time = now
            self.scheduler.finish_seq(seq, reason)
        if logprobs is not None:
            cand.logprobs.append(logprobs)
            # Every token is reported, its text held back or not.
            return TokenEvent(seq.request_id, seq.index, delta, [token], [logprobs],
                              tuple(parts))
        if not delta and not parts:
            return None
        return TokenEvent(seq.request_id, seq.index, delta, [token], parts=tuple(parts))

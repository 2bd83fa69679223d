"""Response bodies and server-sent event chunks in OpenAI's shapes.

``Shape`` holds what every body of one request repeats (its id, kind, model, creation
time); ``completion_body`` builds the one-piece answer, ``EventStream`` the streamed one:
``data: {chunk}`` lines, each candidate's final chunk with its finish reason, optionally a
usage chunk, then ``data: [DONE]``. Log-probabilities, for requests that ask, are shaped
by ``logprobs.py``. A chat reply arrives read by the engine (``engine/chat/reply.py``): each
``TokenEvent``'s parts become ``delta``s, ``reasoning_content`` for thinking (DeepSeek's
and vLLM's name), ``content`` for text, a call's ``{"index", "id", "type", "function":
{"name", "arguments": ""}}`` then ``{"index", "function": {"arguments": piece}}``, which
the openai client adds up to the call; not streamed, the finished candidate's
``ReplyMessage`` makes ``message``. A reply with calls finishes ``"tool_calls"``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.responses import StreamingResponse

from engine.outputs import (
    CallStart,
    CompletionOutput,
    ErrorEvent,
    FinishedEvent,
    ReplyEvent,
    ReplyMessage,
    RequestOutput,
    TextDelta,
    Thinking,
    TokenEvent,
)
from engine.serve.logprobs import LogprobsFormat, TokenTexts


@dataclass(slots=True, frozen=True)
class Shape:
    kind: str  # "chat" or "text"
    request_id: str
    model: str
    created: int

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.request_id

    def chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        body = {"id": self.id, "object": "chat.completion.chunk" if self.kind == "chat"
                else "text_completion", "created": self.created, "model": self.model,
                "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body

    def text_delta(self, index: int, text: str, logprobs: dict | None = None) -> dict:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None}

    def chat_delta(self, index: int, delta: dict, first: bool,
                   logprobs: dict | None = None) -> dict:
        delta = {"role": "assistant", **delta} if first else delta
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}

    def last(self, index: int, reason: str) -> dict:
        """``reason``: OpenAI's finish reason, already mapped."""
        if self.kind == "text":
            return {"index": index, "text": "", "logprobs": None, "finish_reason": reason}
        return {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}


def finish_reason(output: CompletionOutput) -> str:
    # The engine says "stop" (end of text, stop string or token, or a reply's last allowed
    # call), "length" (max_tokens), "context" (the context's end) or "abort"; OpenAI knows
    # "stop", "length" and "tool_calls".
    if output.finish_reason in ("length", "context"):
        return "length"
    return "tool_calls" if output.reply is not None and output.reply.calls else "stop"


def delta(part: ReplyEvent) -> dict:
    """One read part of a reply as a chat chunk's ``delta``."""
    if isinstance(part, Thinking):
        return {"reasoning_content": part.text}
    if isinstance(part, TextDelta):
        return {"content": part.text}
    if isinstance(part, CallStart):
        return {"tool_calls": [{"index": part.index, "id": part.id, "type": "function",
                                "function": {"name": part.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": part.index, "function": {"arguments": part.text}}]}


def message(reply: ReplyMessage) -> dict:
    """A finished candidate's chat ``message``: its answer, its thinking where its template
    shows reasoning, its calls."""
    body: dict = {"role": "assistant", "content": reply.content or (None if reply.calls
                                                                       else "")}
    if reply.reasoning is not None:
        body["reasoning_content"] = reply.reasoning or None
    if reply.calls:
        body["tool_calls"] = [{"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}}
                              for c in reply.calls]
    return body


def usage(output: RequestOutput) -> dict:
    """``completion_tokens`` counts every generated token, the thinking's too; a reply read
    for thinking says how many of them it was, and a speculative one how many drafts were
    kept and rejected (``completion_tokens_details``)."""
    m = output.metrics
    completion = sum(len(c.token_ids) for c in output.outputs)
    body = {"prompt_tokens": m.num_prompt_tokens, "completion_tokens": completion,
            "total_tokens": m.num_prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": m.num_cached_tokens}}
    thought = [c.reply.thinking_tokens for c in output.outputs
               if c.reply is not None and c.reply.thinking_tokens is not None]
    details = {}
    if thought:
        details["reasoning_tokens"] = sum(thought)
    if m.num_draft_tokens:
        # Predicted Outputs' counts: drafts the model kept and those it rejected (from the
        # request's prediction and from prompt lookup alike, engine/spec).
        details["accepted_prediction_tokens"] = m.num_accepted_draft_tokens
        details["rejected_prediction_tokens"] = m.num_draft_tokens - m.num_accepted_draft_tokens
    if details:
        body["completion_tokens_details"] = details
    return body


def model_card(llm) -> dict:
    return {"id": llm.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "folio", "max_model_len": llm.max_model_len}


def completion_body(shape: Shape, output: RequestOutput, texts: TokenTexts) -> dict:
    logprobs = LogprobsFormat(shape.kind, texts)
    if shape.kind == "chat":
        choices = [{"index": c.index, "message": message(c.reply),
                    "logprobs": logprobs(c.index, c.logprobs),
                    "finish_reason": finish_reason(c)} for c in output.outputs]
        kind = "chat.completion"
    else:
        choices = [{"index": c.index, "text": c.text, "logprobs": logprobs(c.index, c.logprobs),
                    "finish_reason": finish_reason(c)} for c in output.outputs]
        kind = "text_completion"
    return {"id": shape.id, "object": kind, "created": shape.created, "model": shape.model,
            "choices": choices, "usage": usage(output)}


def sse(body: dict | str) -> bytes:
    data = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class EventStream(StreamingResponse):
    """A streamed completion. However the response ends (done, client gone, error), the
    request is cancelled in the engine if it still runs, so no block stays held."""

    def __init__(self, stream, first, shape: Shape, include_usage: bool,
                 on_finished: Callable[[RequestOutput], None], metrics,
                 texts: TokenTexts) -> None:
        self._stream = stream
        self._metrics = metrics
        metrics.running += 1
        chunks = _chunks(stream, first, shape, include_usage, on_finished,
                         LogprobsFormat(shape.kind, texts))
        super().__init__(chunks,
                         media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._metrics.running -= 1
            await self._stream.__aexit__(None, None, None)


async def _chunks(stream, first, shape: Shape, include_usage: bool,
                  on_finished: Callable[[RequestOutput], None],
                  logprobs: LogprobsFormat) -> AsyncIterator[bytes]:
    started: set[int] = set()
    event = first
    while True:
        if isinstance(event, TokenEvent) and shape.kind == "chat":
            entries = logprobs(event.index, event.logprobs)
            # A token the reader held back still reports its log-probabilities.
            deltas = [delta(part) for part in event.parts] or ([{}] if entries else [])
            for k, piece in enumerate(deltas):
                yield sse(shape.chunk([shape.chat_delta(event.index, piece,
                                                        event.index not in started,
                                                        entries if k == 0 else None)]))
                started.add(event.index)
        elif isinstance(event, TokenEvent):
            yield sse(shape.chunk([shape.text_delta(event.index, event.text,
                                                    logprobs(event.index, event.logprobs))]))
        elif isinstance(event, FinishedEvent):
            output = event.output
            on_finished(output)
            yield sse(shape.chunk([shape.last(c.index, finish_reason(c))
                                   for c in output.outputs]))
            if include_usage:
                yield sse(shape.chunk([], usage(output)))
            break
        elif isinstance(event, ErrorEvent):
            # Headers are sent already: the error travels as an event, as OpenAI does.
            yield sse({"error": {"message": event.message, "type": "server_error",
                                 "param": None, "code": None}})
            break
        event = await stream.next_event()
    yield sse("[DONE]")

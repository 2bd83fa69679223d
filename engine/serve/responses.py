"""Response bodies and server-sent event chunks in OpenAI's shapes.

``Shape`` holds what every body of one request repeats (its id, kind, model, creation
time); ``completion_body`` builds the one-piece answer, ``EventStream`` the streamed one:
``data: {chunk}`` lines, each candidate's final chunk with its finish reason, optionally a
usage chunk, then ``data: [DONE]``. Log-probabilities, for requests that ask, are shaped
by ``logprobs.py``; replies read for thinking and tool calls by ``tool_replies.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.responses import StreamingResponse

from engine.outputs import ErrorEvent, FinishedEvent, RequestOutput, TokenEvent
from engine.serve.logprobs import LogprobsFormat, TokenTexts
from engine.serve.tool_replies import ToolReplies


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

    def delta(self, index: int, text: str, first: bool, logprobs: dict | None = None) -> dict:
        if self.kind == "text":
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None}
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}

    def chat_delta(self, index: int, delta: dict, first: bool,
                   logprobs: dict | None = None) -> dict:
        delta = {"role": "assistant", **delta} if first else delta
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}

    def last(self, index: int, reason: str) -> dict:
        """``reason``: OpenAI's finish reason, already mapped."""
        if self.kind == "text":
            return {"index": index, "text": "", "logprobs": None, "finish_reason": reason}
        return {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}


def finish_reason(reason: str | None) -> str:
    # The engine says "stop" (end of text, stop string or token), "length" (max_tokens),
    # "context" (the context's end) or "abort"; OpenAI knows "stop" and "length".
    return "length" if reason in ("length", "context") else "stop"


def usage(output: RequestOutput, replies: ToolReplies | None = None) -> dict:
    """``completion_tokens`` counts every generated token, the thinking's too; a reply read
    for thinking says how many of them it was (``completion_tokens_details``)."""
    m = output.metrics
    completion = sum(len(c.token_ids) for c in output.outputs)
    body = {"prompt_tokens": m.num_prompt_tokens, "completion_tokens": completion,
            "total_tokens": m.num_prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": m.num_cached_tokens}}
    reasoning = replies.reasoning_tokens if replies is not None else None
    if reasoning is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return body


def model_card(llm) -> dict:
    return {"id": llm.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "folio", "max_model_len": llm.max_model_len}


def completion_body(shape: Shape, output: RequestOutput, texts: TokenTexts,
                    tools: ToolReplies | None = None) -> dict:
    logprobs = LogprobsFormat(shape.kind, texts)
    if shape.kind == "chat" and tools is not None:
        choices = [{"index": c.index, "message": tools.message(c.index),
                    "logprobs": logprobs(c.index, c.logprobs),
                    "finish_reason": tools.finish_reason(c.index, c.finish_reason)}
                   for c in output.outputs]
        kind = "chat.completion"
    elif shape.kind == "chat":
        choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "logprobs": logprobs(c.index, c.logprobs),
                    "finish_reason": finish_reason(c.finish_reason)} for c in output.outputs]
        kind = "chat.completion"
    else:
        choices = [{"index": c.index, "text": c.text, "logprobs": logprobs(c.index, c.logprobs),
                    "finish_reason": finish_reason(c.finish_reason)} for c in output.outputs]
        kind = "text_completion"
    return {"id": shape.id, "object": kind, "created": shape.created, "model": shape.model,
            "choices": choices, "usage": usage(output, tools)}


def sse(body: dict | str) -> bytes:
    data = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class EventStream(StreamingResponse):
    """A streamed completion. However the response ends (done, client gone, error), the
    request is cancelled in the engine if it still runs, so no block stays held."""

    def __init__(self, stream, first, shape: Shape, include_usage: bool,
                 on_finished: Callable[[RequestOutput], None], metrics,
                 texts: TokenTexts, tools: ToolReplies | None = None) -> None:
        self._stream = stream
        self._metrics = metrics
        metrics.running += 1
        chunks = _chunks(stream, first, shape, include_usage, on_finished,
                         LogprobsFormat(shape.kind, texts), tools)
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
                  logprobs: LogprobsFormat,
                  tools: ToolReplies | None) -> AsyncIterator[bytes]:
    started: set[int] = set()
    event = first
    while True:
        if isinstance(event, TokenEvent) and tools is not None:
            entries = logprobs(event.index, event.logprobs)
            # A token held back by the parser still reports its log-probabilities.
            deltas = (tools.deltas(event.index, event.text, len(event.token_ids))
                      or ([{}] if entries else []))
            for k, delta in enumerate(deltas):
                yield sse(shape.chunk([shape.chat_delta(event.index, delta,
                                                        event.index not in started,
                                                        entries if k == 0 else None)]))
                started.add(event.index)
            if tools.all_done:
                stream.cancel()  # what follows would be dropped; its FinishedEvent comes
        elif isinstance(event, TokenEvent):
            yield sse(shape.chunk([shape.delta(event.index, event.text,
                                               event.index not in started,
                                               logprobs(event.index, event.logprobs))]))
            started.add(event.index)
        elif isinstance(event, FinishedEvent):
            output = event.output
            on_finished(output)
            if tools is not None:
                for c in output.outputs:
                    for delta in tools.finish(c.index):
                        yield sse(shape.chunk([shape.chat_delta(c.index, delta,
                                                                c.index not in started)]))
                        started.add(c.index)
            reasons = [tools.finish_reason(c.index, c.finish_reason) if tools is not None else
                       finish_reason(c.finish_reason) for c in output.outputs]
            yield sse(shape.chunk([shape.last(c.index, reason)
                                   for c, reason in zip(output.outputs, reasons, strict=True)]))
            if include_usage:
                yield sse(shape.chunk([], usage(output, tools)))
            break
        elif isinstance(event, ErrorEvent):
            # Headers are sent already: the error travels as an event, as OpenAI does.
            yield sse({"error": {"message": event.message, "type": "server_error",
                                 "param": None, "code": None}})
            break
        event = await stream.next_event()
    yield sse("[DONE]")

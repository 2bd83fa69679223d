"""One chat turn sent to a remote server, streamed back as the engine's events.

A turn with n candidates asks for n choices in one streamed chat completion. A server
that answers fewer choices than asked (it ignores ``n``) gets the missing candidates as
parallel requests of one choice each; one that refuses ``n > 1`` outright gets all n that
way. A server that runs one request at a time gets them one after another instead
(remote_pacing.py). Every stream is read on its own daemon thread. The callback hears
TokenEvents, then exactly one FinishedEvent or ErrorEvent, and never a token after it.

Cancel ends the request at once (finish reason "abort", partial texts kept) and shuts
the HTTP connections down, so the server sees the client leave and stops generating.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import asdict

import openai

from desktop_app.data.attachments import openai_content
from desktop_app.data.json_mode import openai_response_format
from desktop_app.services.remote_client import describe_failure
from desktop_app.services.remote_pacing import SERIAL_SERVERS, RemoteMetrics, Replay, is_busy
from engine.outputs import (
    CompletionOutput,
    ErrorEvent,
    FinishedEvent,
    ReplyMessage,
    RequestMetrics,
    RequestOutput,
    TextDelta,
    TokenEvent,
)

# Chunks that carried candidate 0 alone after which a server has plainly ignored n.
EARLY_SPLIT_CHUNKS = 16
MAX_TEMPERATURE = 2.0  # what the OpenAI API (and so vLLM, SGLang, folio serve) accept


def request_body(model: str, messages: list[dict], params, n: int, seed: int | None) -> dict:
    """The chat-completions arguments for these SamplingParams. top_k, min_p and
    repetition_penalty are not OpenAI fields: they go as extras, which vLLM, SGLang and
    folio serve honour, and only when they change something."""
    body: dict = {
        "model": model, "messages": messages, "n": n, "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": min(float(params.temperature), MAX_TEMPERATURE),
        "top_p": float(params.top_p),
    }
    if params.max_tokens is not None:  # absent: up to the context, as OpenAI's API has it
        body["max_tokens"] = params.max_tokens
    if seed is not None:
        body["seed"] = seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.response_format is not None:
        body["response_format"] = openai_response_format(params.response_format)
    extra = {}
    if params.top_k:
        extra["top_k"] = params.top_k
    if params.min_p:
        extra["min_p"] = params.min_p
    if params.repetition_penalty != 1.0:
        extra["repetition_penalty"] = params.repetition_penalty
    if extra:
        body["extra_body"] = extra
    return body


def _abort(stream) -> None:
    """Shut the stream's socket (wakes a read blocked in another thread), then close."""
    with contextlib.suppress(Exception):
        network = stream.response.extensions.get("network_stream")
        sock = network.get_extra_info("socket") if network is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        stream.close()


class RemoteRequest:
    def __init__(self, request_id: str, llm, messages, params, on_event) -> None:
        self.request_id = request_id
        self._llm = llm
        # The exact token ids of earlier replies stay home; attachments go as OpenAI's
        # parts (an image as an image_url data URL, a document as a file part).
        self._messages = [{"role": m["role"], "content": openai_content(m["content"])}
                          for m in messages]
        self._params = params
        self._on_event = on_event
        n = params.n
        self.texts = [""] * n
        self.reasons: list[str | None] = [None] * n
        self._chunks = [0] * n
        self._lock = threading.RLock()
        self._ended = False
        self._parts = 0
        self._launched = 0
        self._streams: list = []
        # One part at a time, the rest waiting here, once the server is known to run one
        # request at a time; _noticed: this turn found that out.
        self._serial = SERIAL_SERVERS.knows(llm.base_url)
        self._noticed = False
        self._waiting: list[tuple[list[int], int | None]] = []
        self._replays: dict[int, Replay] = {}
        self._prompt_tokens = self._cached_tokens = self._completion_tokens = 0
        self._started = time.perf_counter()
        self._first_token_at: float | None = None

    @property
    def ended(self) -> bool:
        return self._ended

    def start(self) -> None:
        self._launch(list(range(self._params.n)), self._params.seed)

    def cancel(self) -> None:
        with self._lock:
            if not self._ended:
                self._end(FinishedEvent(self.request_id, self._output("abort")))

    # -- parts: one HTTP stream each ------------------------------------------------------
    def _launch(self, candidates: list[int], seed: int | None) -> None:
        with self._lock:
            if self._ended:
                return
            if self._serial and self._parts:
                self._waiting.append((candidates, seed))
                return
            self._parts += 1
            self._launched += 1
            number = self._launched
        threading.Thread(target=self._run_part, args=(candidates, seed, number), daemon=True,
                         name=f"folio-remote-{self.request_id}").start()

    def _split(self, candidates: list[int], seed: int | None) -> None:
        """Each candidate as its own one-choice request (seeded like the engine does)."""
        for c in candidates:
            self._launch([c], None if seed is None else seed + c)

    def _contended(self, number: int) -> bool:
        """Whether another part of this turn ran beside part ``number``: what a server
        that runs one request at a time answers with a cut stream or a "busy"."""
        with self._lock:  # after the switch to one at a time, never: no endless retries
            return self._parts > 1 or self._launched > number

    def _one_at_a_time(self, candidates: list[int], shown: list[int]) -> None:
        """Run ``candidates`` again after the others, one part at a time from now on;
        those in ``shown`` streamed text already, which their new run replays. Each is
        seeded as before: a part's seed is its first candidate's, the turn's seed plus
        its index."""
        with self._lock:
            if not self._serial:
                self._serial = self._noticed = True
                SERIAL_SERVERS.remember(self._llm.base_url)
            for c in shown:
                self._replays[c] = Replay(self.texts[c])
        self._split(candidates, self._params.seed)

    def _run_part(self, candidates: list[int], seed: int | None, number: int) -> None:
        index_map = dict(enumerate(candidates))  # the server's choice index -> candidate
        client = self._llm.client()
        streamed = False
        seen: set[int] = set()
        try:
            body = request_body(self._llm.model_name, self._messages, self._params,
                                len(candidates), seed)
            stream = client.chat.completions.create(**body)
            with self._lock:
                if self._ended:
                    _abort(stream)
                    return
                self._streams.append(stream)
            lonely = 0
            for chunk in stream:
                if self._ended:
                    break
                self._take_usage(getattr(chunk, "usage", None))
                for choice in chunk.choices or ():
                    candidate = index_map.get(choice.index)
                    if candidate is None:
                        continue
                    seen.add(candidate)
                    text = choice.delta.content if choice.delta is not None else None
                    if text:
                        streamed = True
                        self._token(candidate, text)
                    if choice.finish_reason:
                        self._finish(candidate, choice.finish_reason)
                if len(index_map) > 1 and seen == {candidates[0]} and not self._serial:
                    lonely += 1
                    if lonely >= EARLY_SPLIT_CHUNKS:  # the server ignores n: don't wait
                        index_map = {0: candidates[0]}
                        self._split(candidates[1:], seed)
            unfinished = [c for c in index_map.values() if self.reasons[c] is None]
            cut = [c for c in unfinished if c in seen]
            if self._ended:
                pass
            elif (cut or not seen) and unfinished and self._contended(number):
                # Cut (or never begun) as another part started: the server runs one
                # request at a time.
                self._one_at_a_time(unfinished, cut)
            elif cut:  # no finish reason: the server went away
                self._fail(f"The server at {self._llm.base_url} could not be reached (the "
                           "connection closed before the reply finished). Check that the "
                           "server is running.")
            elif seen and unfinished:  # fewer choices than asked
                self._split(unfinished, seed)
        except openai.BadRequestError as exc:
            if len(candidates) > 1 and not streamed and not self._ended:
                self._split(candidates, seed)  # e.g. a server that refuses n > 1
            else:
                self._fail(describe_failure(exc, self._llm.base_url))
        except Exception as exc:  # noqa: BLE001 - reported to the user, never raised
            if self._ended:
                pass
            elif (is_busy(exc) or not isinstance(exc, openai.APIStatusError)) and \
                    self._contended(number):
                # "Busy" beside another part, or the connection dropped as one started.
                unfinished = [c for c in index_map.values() if self.reasons[c] is None]
                self._one_at_a_time(unfinished, [c for c in unfinished if c in seen])
            else:
                self._fail(describe_failure(exc, self._llm.base_url, midway=streamed))
        finally:
            with contextlib.suppress(Exception):
                client.close()
            self._part_done()

    # -- events (under the lock: nothing reaches the callback after the end) ---------------
    def _token(self, candidate: int, text: str) -> None:
        with self._lock:
            if self._ended:
                return
            if self._first_token_at is None:
                self._first_token_at = time.perf_counter()
            self._chunks[candidate] += 1
            replay = self._replays.get(candidate)
            if replay is not None:
                text = replay.take(text)
                self.texts[candidate] = replay.text
            else:
                self.texts[candidate] += text
            if text:
                # The server's text is the answer (a remote reply is not read for
                # thinking or calls: remote chats get no tools).
                self._on_event(TokenEvent(self.request_id, candidate, text, [],
                                          parts=(TextDelta(text),)))

    def _finish(self, candidate: int, reason: str) -> None:
        with self._lock:
            self.reasons[candidate] = "length" if reason == "length" else "stop"
            replay = self._replays.pop(candidate, None)
            if replay is not None:  # its new run is the reply, shorter or different
                self.texts[candidate] = replay.fresh

    def _take_usage(self, usage) -> None:
        if usage is None:
            return
        details = getattr(usage, "prompt_tokens_details", None)
        with self._lock:
            self._prompt_tokens = max(self._prompt_tokens, usage.prompt_tokens or 0)
            self._completion_tokens += usage.completion_tokens or 0
            cached = getattr(details, "cached_tokens", None) or 0
            self._cached_tokens = max(self._cached_tokens, cached)

    def _part_done(self) -> None:
        with self._lock:
            self._parts -= 1
            if self._parts or self._ended:
                return
            if self._waiting:
                self._launch(*self._waiting.pop(0))
            else:
                self._end(FinishedEvent(self.request_id, self._output("stop")))

    def _fail(self, message: str) -> None:
        with self._lock:
            if not self._ended:
                self._end(ErrorEvent(self.request_id, message))

    def _end(self, event) -> None:
        self._ended = True
        streams, self._streams = self._streams, []
        try:
            self._on_event(event)
        finally:
            for stream in streams:
                _abort(stream)

    def _output(self, unfinished_reason: str) -> RequestOutput:
        outputs = [CompletionOutput(i, text, [], self.reasons[i] or unfinished_reason,
                                    reply=ReplyMessage(text))
                   for i, text in enumerate(self.texts)]
        return RequestOutput(self.request_id, [], outputs, True, self._metrics())

    def _metrics(self) -> RequestMetrics:
        now = time.perf_counter()
        generated = self._completion_tokens or sum(self._chunks)
        first = self._first_token_at
        per_candidate = generated / max(1, len(self.texts))
        decode = (per_candidate - 1) / (now - first) if first and now > first and \
            per_candidate > 1 else 0.0
        figures = RequestMetrics(num_prompt_tokens=self._prompt_tokens,
                                 num_cached_tokens=self._cached_tokens,
                                 num_generated_tokens=generated,
                                 ttft_s=(first - self._started) if first else 0.0,
                                 decode_tok_s=decode, total_s=now - self._started)
        if not self._noticed:  # the note's key only on the turn it speaks of
            return figures
        return RemoteMetrics(**asdict(figures), candidates_one_at_a_time=True)

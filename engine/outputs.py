"""What the engine hands back: finished outputs, metrics and streaming events, and the
typed events of a reply as it is read (text, thinking, tool calls: engine/chat/reply.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestMetrics:
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache
    num_disk_tokens: int = 0  # of those, the tokens loaded from the disk tier
    num_generated_tokens: int = 0
    ttft_s: float = 0.0  # arrival to first token
    decode_tok_s: float = 0.0  # tokens per second after the first, per candidate
    total_s: float = 0.0
    # Speculative decoding: draft tokens the model checked, and those it kept.
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0

    @property
    def num_computed_prompt_tokens(self) -> int:
        return self.num_prompt_tokens - self.num_cached_tokens

    @property
    def draft_acceptance(self) -> float | None:
        """The share of drafts kept; None where nothing was drafted."""
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_draft_tokens / self.num_draft_tokens


@dataclass(slots=True, frozen=True)
class TokenLogprobs:
    """A generated token's log-probability and the ``top`` most probable tokens as
    (token id, log-probability), most probable first. Both come from log_softmax of the
    model's own logits, before repetition penalty, temperature and top-k/p/min-p (as
    vLLM's default), so they describe the model, not the sampler's settings; the chosen
    token may be outside ``top``."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True, frozen=True)
class TextDelta:
    """Answer text."""

    text: str


@dataclass(slots=True, frozen=True)
class Thinking:
    """The model's thinking, split off its answer where its chat template shows it."""

    text: str


@dataclass(slots=True, frozen=True)
class CallStart:
    """A tool call's id and name (OpenAI's ``delta.tool_calls`` order: then its arguments)."""

    index: int  # the call's place in the reply, from 0
    id: str
    name: str


@dataclass(slots=True, frozen=True)
class CallArguments:
    index: int
    text: str  # a piece of the arguments' JSON text


ReplyEvent = TextDelta | Thinking | CallStart | CallArguments


@dataclass(slots=True, frozen=True)
class ToolCall:
    """A whole call, as a finished reply carries it."""

    id: str
    name: str
    arguments: str  # JSON text of an object


@dataclass(slots=True, frozen=True)
class ReplyMessage:
    """A finished candidate as the front ends show it. ``reasoning`` and
    ``thinking_tokens`` are None where the reply was not read for thinking (its template
    shows none), "" and 0 where it was and the model did not think."""

    content: str
    reasoning: str | None = None
    calls: tuple[ToolCall, ...] = ()
    thinking_tokens: int | None = None
    thinking_s: float = 0.0


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    # "stop" (end of text, a stop string or token), "length" (max_tokens), "context" (the
    # context, or the KV pool, is full) or "abort" (cancelled).
    finish_reason: str | None = None
    # One per token_ids entry (the stop token's too) when SamplingParams.logprobs is set.
    logprobs: list[TokenLogprobs] | None = None
    # The reply read: its answer, thinking and calls (the plain text for a completion).
    reply: ReplyMessage | None = None
    # A beam search's beam (engine/beam): its summed log-probability and its
    # length-penalized score, by which the beams are ordered; None otherwise.
    cumulative_logprob: float | None = None
    score: float | None = None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics = field(default_factory=RequestMetrics)


@dataclass(slots=True)
class TokenEvent:
    """New output for one candidate: `text` is the raw delta since the last event (what
    a text completion shows), `parts` the same delta read (answer, thinking, tool calls:
    what a chat shows). A request with SamplingParams.logprobs hears of every token,
    held-back text or not (`text` may be empty then), with `logprobs` one per `token_ids`
    entry."""

    request_id: str
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None = None
    parts: tuple[ReplyEvent, ...] = ()


@dataclass(slots=True)
class FinishedEvent:
    request_id: str
    output: RequestOutput


@dataclass(slots=True)
class ErrorEvent:
    request_id: str
    message: str
    # The request itself was refused (a prompt longer than the context, bad token ids):
    # the caller's fault, nothing ran. False for a failure while generating.
    rejected: bool = False


@dataclass(slots=True, frozen=True)
class PromptProgress:
    """A chunk of a request's prompt was read (prefilled): ``done`` of its ``total``
    prompt tokens have K/V now, ``cached`` of them found in the prefix cache (or loaded
    from disk) at admission, so counted as done from the start. One per chunk, for the
    prompt only (its candidates share it); the chunk that ends the prompt reports
    ``done == total`` and precedes the first token's event. A consumer that shows no
    progress ignores it."""

    request_id: str
    done: int
    total: int
    cached: int = 0


Event = TokenEvent | FinishedEvent | ErrorEvent | PromptProgress


@dataclass(slots=True, frozen=True)
class ActivityEvent:
    """The worker started running requests (busy) or has none left (idle)."""

    busy: bool

"""What the engine hands back: finished outputs, metrics and streaming events."""

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

    @property
    def num_computed_prompt_tokens(self) -> int:
        return self.num_prompt_tokens - self.num_cached_tokens


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


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics = field(default_factory=RequestMetrics)


@dataclass(slots=True)
class TokenEvent:
    """New text for one candidate; `text` is the delta since the last event. A request
    with SamplingParams.logprobs hears of every token, held-back text or not (`text` may
    be empty then), with `logprobs` one per `token_ids` entry."""

    request_id: str
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None = None


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


Event = TokenEvent | FinishedEvent | ErrorEvent


@dataclass(slots=True, frozen=True)
class ActivityEvent:
    """The worker started running requests (busy) or has none left (idle)."""

    busy: bool

"""Per-request sampling settings, validated when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.validation import FieldChecker

_check = FieldChecker("SamplingParams")
MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs
# A seed is a signed 64-bit integer, the range OpenAI's and vLLM's APIs accept.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
RESPONSE_TYPES = ("json_object", "json_schema")
# Speculative decoding (engine/spec). "ngram": prompt lookup, drafts copied from the
# request's own tokens and from its ``prediction``; "draft": the engine's draft model
# (EngineConfig.speculative="draft:PATH"); "mtp": the model's own multi-token-prediction
# head (Qwen3.5's, EngineConfig.speculative="mtp"). A request may also say "off" (decode
# plainly, whatever the engine does).
SPECULATIVE_METHODS = ("ngram", "draft", "mtp")
DRAFT_PREFIX = "draft:"


def draft_path(speculative) -> str | None:
    """The draft model's path of ``"draft:PATH"`` (EngineConfig.speculative's form), else
    None (another method, or no path)."""
    if not isinstance(speculative, str) or not speculative.startswith(DRAFT_PREFIX):
        return None
    return speculative[len(DRAFT_PREFIX):].strip() or None
SPECULATIVE_OFF = "off"


@dataclass(slots=True, frozen=True)
class ResponseFormat:
    """What a reply must be: any JSON object (``json_object``) or a JSON value valid
    against ``schema`` (``json_schema``), as OpenAI's ``response_format`` says it.
    ``engine/grammar`` compiles it to the token mask the sampler applies."""

    type: str
    schema: dict | None = None
    name: str = ""  # the schema's name, shown to the user; never read by the grammar

    def __post_init__(self) -> None:
        check = FieldChecker("ResponseFormat")
        check(self.type in RESPONSE_TYPES, "type", self.type, f"one of {RESPONSE_TYPES}")
        if self.type == "json_schema":
            check(isinstance(self.schema, dict), "schema", self.schema,
                  "a JSON schema object for type json_schema")
        else:
            check(self.schema is None, "schema", self.schema, "None for type json_object")
        check(isinstance(self.name, str), "name", self.name, "a string")


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    # None: up to the context (the reply ends with "context" where the context is full).
    max_tokens: int | None = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # Log-probabilities of each generated token and of the `logprobs` most probable
    # alternatives (0: the chosen token's alone), from the model's own logits; None:
    # nothing is computed.
    logprobs: int | None = None
    # False shows special tokens in the reply's text: tool-call markers such as Llama's
    # <|python_tag|> or Mistral's [TOOL_CALLS] are special tokens, and the server's tool
    # parser must see them. End-of-turn and stop tokens stay out of the text either way.
    skip_special_tokens: bool = True
    # Constrains the reply to JSON (engine/grammar); None: free text.
    response_format: ResponseFormat | None = None
    # The text the reply is expected to be (OpenAI's Predicted Outputs, e.g. a file to be
    # returned with a few edits), or its token ids: its tokens are drafted and verified,
    # so what matches costs a fraction of a decode step. It never changes the reply, only
    # its speed.
    prediction: str | list[int] | None = None
    # This request's speculative method (SPECULATIVE_METHODS, or "off"); None: the
    # engine's (EngineConfig.speculative), or "ngram" when a prediction is given.
    speculative: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        _check.types(self, integers=("n", "top_k", "max_tokens", "seed", "logprobs"),
                     numbers=("temperature", "top_p", "min_p", "repetition_penalty"))
        _check(isinstance(self.n, int) and self.n >= 1, "n", self.n, "an integer >= 1")
        _check(self.temperature >= 0, "temperature", self.temperature, ">= 0")
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", self.top_k,
               "an integer >= 0 (0 turns it off)")
        _check(0 <= self.min_p <= 1, "min_p", self.min_p, "in [0, 1]")
        _check(self.repetition_penalty > 0, "repetition_penalty", self.repetition_penalty,
               "> 0 (1 turns it off)")
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens",
               self.max_tokens, "an integer >= 1 or None (up to the context)")
        _check(self.seed is None or SEED_MIN <= self.seed <= SEED_MAX, "seed", self.seed,
               f"an integer in [{SEED_MIN}, {SEED_MAX}] or None")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", self.stop,
               "a list of non-empty strings")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
               "stop_token_ids", self.stop_token_ids, "a list of token ids >= 0")
        _check(isinstance(self.skip_special_tokens, bool), "skip_special_tokens",
               self.skip_special_tokens, "True or False")
        _check(self.response_format is None or isinstance(self.response_format, ResponseFormat),
               "response_format", self.response_format, "a ResponseFormat or None")
        _check(self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
               self.logprobs, f"an integer in [0, {MAX_LOGPROBS}] or None")
        _check(self.prediction is None or isinstance(self.prediction, str) or (
            isinstance(self.prediction, list)
            and all(isinstance(t, int) and t >= 0 for t in self.prediction)),
            "prediction", self.prediction, "a string, a list of token ids >= 0, or None")
        _check(self.speculative is None
               or self.speculative in (*SPECULATIVE_METHODS, SPECULATIVE_OFF), "speculative",
               self.speculative, f"one of {(*SPECULATIVE_METHODS, SPECULATIVE_OFF)} or None")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


"""What the engine keeps of each admitted request beside the scheduler's: per candidate
its streaming text, generator, reply reader and grammar state (`RequestState`), how a
prompt becomes ids (`chat_prompt`), and the `RequestOutput` built from it all.

Every candidate's parts are made at admission (`candidate_parts`), before the scheduler
sees the request, so neither admission nor the later fork can fail half-way and leave
the scheduler holding a request the engine's table does not know.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.chat import PLAIN, ChatPrompt, ChatRequest, PromptBuilder, ReplyReader
from engine.core.sequence import Request
from engine.grammar import Grammars, Matcher
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from engine.runner.sampler import make_generator
from engine.sampling_params import SamplingParams
from engine.text.candidate import CandidateText

# Text, token ids, chat messages (built with the model's template), a ChatRequest, or a
# prompt a front end built already (PromptBuilder: the ids it measured are the ids run).
Prompt = str | list[int] | list[dict] | ChatRequest | ChatPrompt


@dataclass(slots=True)
class RequestState:
    """An admitted request and, per candidate index, what the engine keeps beside the
    scheduler's sequence."""

    request: Request
    candidates: list[CandidateText]
    generators: list[torch.Generator]
    readers: list[ReplyReader]  # each candidate's reply read: text, thinking, calls
    # Each candidate's grammar state (structured output); empty for free text.
    matchers: list[Matcher] = field(default_factory=list)
    chat: bool = False  # a chat prompt: its replies' ids are remembered by their text

    def matcher(self, index: int) -> Matcher | None:
        return self.matchers[index] if self.matchers else None


def chat_prompt(prompt: Prompt, tokenizer, prompts: PromptBuilder) -> ChatPrompt:
    """``prompt`` as ids with how its replies are read (a chat's through ``prompts``);
    ValueError for what cannot be a prompt."""
    if isinstance(prompt, ChatPrompt):
        return prompt
    if isinstance(prompt, ChatRequest):
        return prompts.build(prompt)
    if isinstance(prompt, str):
        return ChatPrompt(tokenizer.encode(prompt), PLAIN)
    if prompt and isinstance(prompt[0], dict):
        return prompts.build(ChatRequest(prompt))
    if not all(isinstance(t, int) for t in prompt):
        raise ValueError("prompt must be text, a list of token ids or a list of messages")
    return ChatPrompt(list(prompt), PLAIN)


def candidate_parts(built: ChatPrompt, params: SamplingParams, tokenizer, grammars: Grammars,
                    grammar=None) -> tuple[list, list, list, list]:
    """Each of ``params.n`` candidates' text state, generator, reply reader and (for a
    ``response_format``) grammar matcher, in `RequestState`'s order; a ValueError (a
    `GrammarError` for a schema that cannot be enforced) before anything is kept.
    ``grammar``: the format compiled already, else it is compiled here."""
    fmt, matchers = params.response_format, []
    if fmt is not None:
        grammar = grammar or grammars.compile(fmt)
        matchers = [grammars.matcher(fmt, grammar) for _ in range(params.n)]
    generators = [make_generator(params.seed, i) for i in range(params.n)]
    stops = [*params.stop, *tokenizer.stop_strings]
    texts = [CandidateText.start(tokenizer, built.ids, stops, params.logprobs is not None,
                                 params.skip_special_tokens) for _ in range(params.n)]
    readers = [built.plan.reader(fmt is not None) for _ in range(params.n)]
    return texts, generators, readers, matchers


def request_output(state: RequestState) -> RequestOutput:
    """What the request has so far (all of it once finished)."""
    request = state.request
    outputs = []
    for seq in request.seqs:
        cand = state.candidates[seq.index]
        reader = state.readers[seq.index]
        # An aborted candidate's held text is its reply's too.
        reader.finish(time.perf_counter())
        outputs.append(
            CompletionOutput(seq.index, cand.text, list(seq.output_token_ids),
                             seq.finish_reason,
                             None if cand.logprobs is None else list(cand.logprobs),
                             reader.message())
        )
    return RequestOutput(request.request_id, list(request.prompt_token_ids), outputs,
                         request.is_finished, _metrics(state))


def _metrics(state: RequestState) -> RequestMetrics:
    request = state.request
    now = time.perf_counter()
    generated = sum(s.num_output_tokens for s in request.seqs)
    m = RequestMetrics(
        num_prompt_tokens=request.num_prompt_tokens,
        num_cached_tokens=request.num_cached_tokens,
        num_disk_tokens=request.num_disk_tokens,
        num_generated_tokens=generated,
        total_s=now - request.arrival_time,
        num_draft_tokens=request.num_draft_tokens,
        num_accepted_draft_tokens=request.num_accepted_draft_tokens,
    )
    if request.first_token_time is not None:
        m.ttft_s = request.first_token_time - request.arrival_time
        rates = []
        for seq in request.seqs:
            cand = state.candidates[seq.index]
            span = (cand.finish_time or now) - (cand.first_token_time or now)
            if seq.num_output_tokens > 1 and span > 0:
                rates.append((seq.num_output_tokens - 1) / span)
        m.decode_tok_s = sum(rates) / len(rates) if rates else 0.0
    return m

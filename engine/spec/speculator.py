"""The engine's speculation: drafts for each decoding candidate after a step, and the
verify step's rows turned into the tokens each candidate keeps.

A request speculates with ``SamplingParams.speculative`` (or the engine's method when it
names none, ``"off"`` for none); a ``prediction`` makes it speculate with prompt lookup
even where the engine does not. With a draft model (engine/spec/draft_model.py) every
candidate that asks is drafted for in one batch of the draft's forwards. A model with a
recurrent state (linear-attention layers) speculates too: the verify step keeps the state
after each of its tokens, and the state after the last kept one runs on
(engine/core/linear_state_manager.py). Beam searches decode plainly.

Per candidate it keeps the draft length controller and the lookup indexes; per request,
the drafted and accepted counts (``Request.num_draft_tokens``, ``num_accepted_draft_tokens``)
that its metrics report.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import ScheduledSeq
from engine.core.sequence import Request, Sequence, SequenceStatus
from engine.outputs import TokenLogprobs
from engine.requests import RequestState
from engine.runner.logprobs import token_logprobs
from engine.runner.sampler import Sampler
from engine.sampling_driver import Sampled
from engine.sampling_params import SPECULATIVE_OFF, SamplingParams
from engine.spec.draft_length import DraftLength
from engine.spec.draft_model import DraftModel
from engine.spec.mtp import MTPProposer
from engine.spec.ngram import OwnTokens, Prediction
from engine.spec.verify import verify

# The most drafts a candidate with a prediction checks in one step (the measured gain
# grows up to here on the starter with the exact reply predicted: docs/BENCHMARKS.md),
# and its first step's.
PREDICTION_DRAFTS = 32
PREDICTION_FIRST = 8


@dataclass(slots=True)
class _Candidate:
    length: DraftLength
    own: OwnTokens = field(default_factory=OwnTokens)
    prediction: Prediction | None = None


@dataclass(slots=True)
class _Speculating:
    request: Request
    prediction_ids: list[int]
    drafted: bool  # by the draft model (else by prompt lookup alone)
    candidates: dict[int, _Candidate] = field(default_factory=dict)


class Speculator:
    def __init__(self, method: str | None, num_tokens: int, max_model_len: int,
                 draft: DraftModel | MTPProposer | None = None) -> None:
        """``method``: the engine's ("ngram", "draft", "mtp" or None); ``draft``: the
        proposer of method "draft" (engine/spec/draft_model.py) or "mtp"
        (engine/spec/mtp.py)."""
        self.method = method
        self.num_tokens = num_tokens
        self.max_model_len = max_model_len
        self.draft = draft
        self._requests: dict[str, _Speculating] = {}

    # ----------------------------------------------------------------- requests
    def method_for(self, params: SamplingParams) -> str | None:
        """The method ``params`` speculates with here (None: plain decode); ValueError
        for a draft model this engine has not loaded."""
        if params.speculative == "draft" and getattr(self.draft, "method", None) != "draft":
            raise ValueError("SamplingParams.speculative: 'draft' needs an engine started "
                             "with a draft model (EngineConfig.speculative='draft:PATH')")
        if params.speculative == "mtp" and getattr(self.draft, "method", None) != "mtp":
            raise ValueError("SamplingParams.speculative: 'mtp' needs an engine started "
                             "with EngineConfig.speculative='mtp' on a model with an MTP head")
        if params.speculative == SPECULATIVE_OFF:
            return None
        if params.speculative is not None:
            return params.speculative
        return self.method if self.method is not None or params.prediction is None else "ngram"

    def add(self, request: Request, prediction_ids: list[int]) -> None:
        method = self.method_for(request.params)
        if method is not None:
            self._requests[request.request_id] = _Speculating(request, prediction_ids,
                                                              method in ("draft", "mtp"))
            if method == "mtp" and self.draft is not None:
                self.draft.track(request)  # the MTP head reads its hidden states

    def drop(self, request_id: str) -> None:
        if self._requests.pop(request_id, None) is not None and self.draft is not None:
            self.draft.drop_request(request_id)

    # ------------------------------------------------------------------- drafts
    def propose(self) -> None:
        """Drafts for each candidate whose next step decodes one token: from its
        prediction where the reply follows it, else from the draft model (all of them in
        one batch) or the request's own tokens."""
        wanted: list[tuple[Sequence, int]] = []
        for spec in self._requests.values():
            request = spec.request
            for seq in request.seqs:
                if seq.is_finished and spec.drafted and self.draft is not None:
                    self.draft.drop(seq)  # a candidate that ended before the others
                if not _decoding(seq) or seq.draft_token_ids:
                    continue  # its drafts, if any, still wait for a step
                cand = spec.candidates.get(seq.index)
                if cand is None:
                    # A client's prediction is the text it expects: drafts follow it as
                    # far as the model agrees, past the engine's usual limit.
                    length = DraftLength(max(self.num_tokens, PREDICTION_DRAFTS),
                                         PREDICTION_FIRST) if spec.prediction_ids \
                        else DraftLength(self.num_tokens)
                    cand = spec.candidates[seq.index] = _Candidate(
                        length,
                        prediction=Prediction(spec.prediction_ids) if spec.prediction_ids
                        else None)
                k = min(cand.length.next(), self._room(seq, request.params))
                if spec.drafted:
                    seq.draft_token_ids = self._predicted(cand, seq, k)
                    if not seq.draft_token_ids and k:
                        wanted.append((seq, k))
                else:
                    seq.draft_token_ids = self._predicted(cand, seq, k) or \
                        cand.own.propose(seq.token_ids, k)
        if wanted and self.draft is not None:
            drafts = self.draft.propose(wanted)
            for seq, _k in wanted:
                seq.draft_token_ids = drafts.get(seq.seq_id, [])

    def _room(self, seq: Sequence, params: SamplingParams) -> int:
        """Drafts that can still become reply tokens: within the context and max_tokens
        (the model's own token after them counts too)."""
        room = self.max_model_len - seq.num_tokens - 1
        if params.max_tokens is not None:
            room = min(room, params.max_tokens - seq.num_output_tokens - 1)
        return max(room, 0)

    @staticmethod
    def _predicted(cand: _Candidate, seq: Sequence, k: int) -> list[int]:
        """Drafts from the request's prediction, where the reply follows it."""
        if cand.prediction is None:
            return []
        return cand.prediction.propose(seq.output_token_ids, k)

    # ------------------------------------------------------------------- verify
    def verify(self, logits: torch.Tensor, items: list[ScheduledSeq],
               requests: dict[str, RequestState], sampler: Sampler) -> Sampled:
        """``logits``: each item's rows (its last token's, then one per draft), in order.
        One entry per token to append, a candidate's in reply order."""
        out = Sampled([], [], [], [], [], [])
        row = 0
        for item in items:
            seq, k = item.seq, item.num_drafts
            rows = logits[row:row + k + 1]
            row += k + 1
            state = requests[seq.request_id]
            params = state.request.params
            matcher = state.matcher(seq.index)
            tokens, kept = verify(rows, seq, list(seq.draft_token_ids), params, matcher,
                                  sampler)
            logprobs: list[TokenLogprobs | None] = token_logprobs(
                rows[:len(tokens)], tokens, [params.logprobs] * len(tokens))
            n = len(tokens)
            out.seqs += [seq] * n
            out.states += [state] * n
            out.params += [params] * n
            out.matchers += [matcher] * n
            out.tokens = [*out.tokens, *tokens]
            out.logprobs += logprobs
            out.after_draft += [i > 0 for i in range(n)]
            self._record(state.request, seq, k, kept)
        return out

    def _record(self, request: Request, seq: Sequence, drafted: int, kept: int) -> None:
        request.num_draft_tokens += drafted
        request.num_accepted_draft_tokens += kept
        spec = self._requests.get(request.request_id)
        if spec is not None and seq.index in spec.candidates:
            spec.candidates[seq.index].length.update(drafted, kept)

    @staticmethod
    def settle(items: Iterable[ScheduledSeq], scheduler: Scheduler) -> None:
        """After the verified tokens went to their candidates (each kept draft counted as
        computed as the token after it went in): the rejected drafts' blocks go back."""
        for item in items:
            scheduler.settle_drafts(item.seq)


def _decoding(seq: Sequence) -> bool:
    """Its next step computes one reply token: past its prompt (a prompt's last token,
    left by a chunked prefill, is sampled plainly: that is where candidates fork)."""
    return (seq.status is SequenceStatus.RUNNING and seq.num_uncomputed_tokens == 1
            and seq.num_computed_tokens >= seq.num_prompt_tokens)

"""Beam search inside the engine's steps: the table of beam requests, and each step's
beams turned into forks and frees of the paged KV cache.

A beam request enters the scheduler as one sequence (its prompt) with ``n = 1``, so it
never forks by itself; its beams are that request's sequences. A step's forward runs
every beam of every request (and any other request) in one batch; the engine hands the
beams' logit rows here (``take``) before it samples the rest. Once every running beam
of a request has its row (the scheduler may run some of them a step later, or recompute
them after a preemption), `BeamSelector` picks the continuations and the beams move:

- a running beam no continuation extends finishes (``Scheduler.finish_seq``): it frees
  only its own references, so blocks its siblings share stay;
- a beam extended by k continuations forks k - 1 times (``Scheduler.fork_seq``: every
  block shared, the partial tail block copied on the next write), then each of the k
  takes its token;

so after every step the beams hold exactly the blocks of their distinct prefixes. When
the search is over the request is ended (``Scheduler.abort``: the running beams' blocks
freed) and its `FinishedEvent` carries the finished beams, best first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from engine.beam.params import BeamSearchParams
from engine.beam.select import BeamSelector, Hypothesis
from engine.chat import ChatPrompt
from engine.core.scheduler import Scheduler
from engine.core.sequence import Request, Sequence
from engine.outputs import CompletionOutput, Event, FinishedEvent, RequestMetrics, RequestOutput


@dataclass(slots=True, eq=False)
class BeamRequest:
    request: Request
    built: ChatPrompt
    params: BeamSearchParams
    selector: BeamSelector
    running: list[Sequence]  # best first
    cumulative: list[float]
    # Each running beam's next-token log-probabilities, by seq_id, until all have one.
    pending: dict[int, torch.Tensor] = field(default_factory=dict)
    next_index: int = 1  # the label index the next forked beam takes
    stops: list[str] = field(default_factory=list)  # the params' and the tokenizer's


class BeamSearcher:
    def __init__(self, scheduler: Scheduler, tokenizer, max_model_len: int) -> None:
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.requests: dict[str, BeamRequest] = {}

    def add(self, request: Request, built: ChatPrompt, params: BeamSearchParams) -> None:
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= set(self.tokenizer.eos_token_ids)
        self.requests[request.request_id] = BeamRequest(
            request, built, params, BeamSelector(params, frozenset(stop_ids)),
            [request.seqs[0]], [0.0],
            stops=[*params.stop, *self.tokenizer.stop_strings])

    def holders(self) -> Iterator[Sequence]:
        """Every beam that may hold blocks (for the block map's owners)."""
        for beam in self.requests.values():
            yield from beam.request.seqs

    # ------------------------------------------------------------------- steps
    def take(self, logits: torch.Tensor, seqs: list[Sequence],
             counts: dict[str, int]) -> tuple[torch.Tensor, list[Sequence], list[Event]]:
        """Keep the beams' rows of a step's logits (``logits[i]`` is ``seqs[i]``'s),
        move the beams of every request whose rows are all in; returns the other
        sequences' rows and sequences, and the finished searches' events."""
        keep: list[int] = []
        touched: list[BeamRequest] = []
        for row, seq in enumerate(seqs):
            beam = self.requests.get(seq.request_id)
            if beam is None:
                keep.append(row)
                continue
            beam.pending[seq.seq_id] = torch.log_softmax(logits[row].float(), dim=-1)
            if beam not in touched:
                touched.append(beam)
        events: list[Event] = []
        for beam in touched:
            if all(s.seq_id in beam.pending for s in beam.running):
                counts[beam.request.request_id] = len(beam.running)
                event = self._advance(beam)
                if event is not None:
                    events.append(event)
        if len(keep) == len(seqs):
            return logits, seqs, events
        return logits[keep], [seqs[i] for i in keep], events

    def reap(self) -> list[Event]:
        """Searches whose beams the scheduler ended (the pool cannot hold them): each
        finishes with the beams it has, their running ones ended by "context"."""
        events: list[Event] = []
        for beam in list(self.requests.values()):
            if beam.running and all(s.is_finished for s in beam.running):
                for seq, cum in zip(beam.running, beam.cumulative, strict=True):
                    out = seq.output_token_ids
                    score = cum / max(1, len(out)) ** beam.params.length_penalty
                    beam.selector.add(Hypothesis(list(out), cum, score, "context"))
                events.append(self._finish(beam))
        return events

    def _advance(self, beam: BeamRequest) -> FinishedEvent | None:
        running = beam.running
        logprobs = torch.stack([beam.pending.pop(s.seq_id) for s in running])
        outputs = [s.output_token_ids for s in running]
        choice = beam.selector.step(logprobs, beam.cumulative, outputs,
                                    lambda parent, token: self._ends(beam, running[parent],
                                                                     token))
        if choice.done:
            return self._finish(beam)
        children = [0] * len(running)
        for c in choice.running:
            children[c.parent] += 1
        # Dropped beams first: their blocks are free before the forks need room.
        for seq, k in zip(running, children, strict=True):
            if k == 0:
                self.scheduler.finish_seq(seq, "dropped")
        taken = [False] * len(running)
        new_running: list[Sequence] = []
        for c in choice.running:
            parent = running[c.parent]
            if taken[c.parent]:
                seq = self.scheduler.fork_seq(beam.request, parent, beam.next_index)
                beam.next_index += 1
            else:
                taken[c.parent] = True
                seq = parent
            new_running.append(seq)
        for seq, c in zip(new_running, choice.running, strict=True):
            seq.append_token(c.token)
        beam.running = new_running
        beam.cumulative = [c.cumulative_logprob for c in choice.running]
        beam.request.seqs = [s for s in beam.request.seqs if not s.is_finished]
        return None

    def _ends(self, beam: BeamRequest, seq: Sequence, token: int) -> str | None:
        if token in beam.selector.stop_ids:
            return "stop"
        if beam.stops and self._stop_string(beam, seq, token) is not None:
            return "stop"
        if seq.num_output_tokens + 1 >= beam.params.max_tokens:
            return "length"
        if seq.num_tokens + 1 >= self.max_model_len:
            return "context"
        return None

    def _stop_string(self, beam: BeamRequest, seq: Sequence, token: int) -> int | None:
        """Where a stop string starts in the text of ``seq``'s output plus ``token``,
        None if none appears."""
        text = self.tokenizer.decode([*seq.output_token_ids, token],
                                     beam.params.skip_special_tokens)
        starts = [text.find(s) for s in beam.stops if s in text]
        return min(starts) if starts else None

    # -------------------------------------------------------------- finishing
    def abort(self, request_id: str) -> RequestOutput | None:
        """End a search now: the beams finished so far, its blocks freed."""
        beam = self.requests.get(request_id)
        if beam is None:
            return None
        return self._finish(beam).output

    def _finish(self, beam: BeamRequest) -> FinishedEvent:
        request = beam.request
        del self.requests[request.request_id]
        self.scheduler.abort(request.request_id)  # frees every running beam's blocks
        kept = beam.selector.finished[:beam.params.num_returned]
        outputs = [self._output(beam, i, hyp) for i, hyp in enumerate(kept)]
        now = time.perf_counter()
        metrics = RequestMetrics(
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=request.num_cached_tokens,
            num_disk_tokens=request.num_disk_tokens,
            num_generated_tokens=sum(len(o.token_ids) for o in outputs),
            total_s=now - request.arrival_time)
        return FinishedEvent(request.request_id, RequestOutput(
            request.request_id, list(request.prompt_token_ids), outputs, True, metrics))

    def _output(self, beam: BeamRequest, index: int, hyp: Hypothesis) -> CompletionOutput:
        ids = hyp.token_ids
        shown = ids[:-1] if ids and ids[-1] in beam.selector.stop_ids else ids
        text = self.tokenizer.decode(shown, beam.params.skip_special_tokens)
        starts = [text.find(s) for s in beam.stops if s in text]
        text = text[:min(starts)] if starts else text
        reader = beam.built.plan.reader(False)
        now = time.perf_counter()
        reader.feed(text, len(ids), now)
        reader.finish(now)
        return CompletionOutput(index, text, list(ids), hyp.finish_reason, None,
                                reader.message(), hyp.cumulative_logprob, hyp.score)

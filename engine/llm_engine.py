"""LLMEngine: requests in, one step at a time, token deltas and finished outputs out.

Its parts are assembled by engine/build.py. Per request it keeps a `RequestState`
(engine/requests.py: each candidate's text, generator, reply reader and grammar state,
and the output built from them). A step runs the scheduled forward, samples
(engine/sampling_driver.py: rows, grammar masks, the fork into candidates), appends the
tokens and checks when candidates end (engine/stops.py); the disk tier (engine/disk)
copies blocks in and out between steps. A beam search (``BeamSearchParams``) is a
request whose rows go to engine/beam instead of the sampler; its beams fork and free in
the same batch.

Not thread-safe: ``engine.worker.EngineWorker`` drives it from one thread. A context
manager: ``with LLMEngine(...) as engine:`` closes it (its cached blocks to disk) on exit.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import torch

from engine.beam.params import BeamSearchParams
from engine.beam.searcher import BeamSearcher
from engine.build import assemble
from engine.chat import ChatPrompt
from engine.config import EngineConfig
from engine.core.kv_stats import KVStats
from engine.core.scheduler_output import ScheduledSeq, SchedulerOutput
from engine.core.sequence import Sequence
from engine.disk.tier import READ_WAIT_S
from engine.outputs import Event, FinishedEvent, PromptProgress, RequestOutput
from engine.requests import (
    Prompt,
    RequestState,
    candidate_parts,
    chat_prompt,
    request_output,
)
from engine.runner.memory import MemoryStats, memory_stats
from engine.runner.sampler import Sampler
from engine.sampling_driver import Sampled, sample
from engine.sampling_params import SamplingParams
from engine.spec.draft_model import DraftModel, draft_config
from engine.spec.mtp import MTPProposer, build_mtp
from engine.spec.speculator import Speculator
from engine.stops import Stops


class LLMEngine:
    def __init__(
        self,
        model: str | Path = "starter",
        config: EngineConfig | None = None,
        progress: Callable[[str, float], None] | None = None,
    ) -> None:
        parts = assemble(model, config or EngineConfig(), progress)
        self.config = parts.config
        self.resolved_device = parts.resolved_device
        self.model_name = parts.model_name
        self.hf_config = parts.hf_config
        self.tokenizer = parts.tokenizer
        self.prompts = parts.prompts
        self.grammars = parts.grammars
        self.weights_bytes, self.expert_bytes = parts.weights_bytes, parts.expert_bytes
        self.max_model_len = parts.max_model_len
        self.kv_groups = parts.kv_groups
        self.runner = parts.runner
        self.kv_cache = parts.kv_cache
        self.scheduler = parts.scheduler
        self.disk = parts.disk
        self.sampler = Sampler()
        self._stops = Stops(self.tokenizer, self.max_model_len, self.scheduler)
        # Beam search requests (engine/beam), beside the request table.
        self._beams = BeamSearcher(self.scheduler, self.tokenizer, self.max_model_len)
        # Speculative decoding (engine/spec): drafts for decoding candidates after each
        # step.
        draft = self._load_draft(progress) or self._load_mtp(parts)
        method = draft.method if draft is not None else self.config.speculative
        self._speculator = Speculator(method, self.config.num_speculative_tokens,
                                      self.max_model_len, draft=draft)
        # The request table: every request not yet finished, by id. It labels the blocks'
        # owners in kv_stats and holds each candidate's text state.
        self._requests: dict[str, RequestState] = {}
        # Request id -> tokens sampled for it by the last step (StepLoop's hooks read it).
        self.last_step_tokens: dict[str, int] = {}
        self._ids = itertools.count()
        if self.config.warm_up and self.max_model_len > 2:
            if progress:
                progress("warming up", 0.0)
            self._warm_up()
        if progress:
            progress("ready", 1.0)

    def _load_draft(self, progress) -> DraftModel | None:
        """The draft model of ``speculative="draft:PATH"``, on the target's device with a
        pool of its own; its weights count in ``weights_bytes``."""
        path = self.config.draft_model
        if path is None:
            return None
        if progress:
            progress("loading the draft model", 0.0)
        parts = assemble(path, draft_config(self.config, self.max_model_len))
        draft = DraftModel(parts, self.tokenizer, self.model_name)
        self.weights_bytes += draft.weights_bytes
        return draft

    def _load_mtp(self, parts) -> MTPProposer | None:
        """The model's MTP head of ``speculative="mtp"`` (ValueError naming the model
        when it has none), with a pool of its own; its weights count in
        ``weights_bytes``."""
        if self.config.speculative != "mtp":
            return None
        mtp = build_mtp(parts)
        self.weights_bytes += mtp.weights_bytes
        return mtp

    def _warm_up(self) -> None:
        """A prompt shorter than a block and one decode token: the first forward's
        one-time costs (weights paged in, kernels' first calls, the pool's first pages)
        are paid now. No full block is computed and its partial one is not kept, so
        nothing is cached or saved to disk; the prefix counters are put back."""
        n = max(1, min(8, self.config.block_size - 1, self.max_model_len - 2))
        params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
        with self.kv_cache.unrecorded():
            request_id = self.add_request([0] * n, params, "warm-up")
            while request_id in self._requests:
                self.step()

    # -------------------------------------------------------------- disk tier
    def close(self) -> None:
        """Keep every cached block on disk (the model unloads, the app quits) and wait
        for the writes. The engine may still be used afterwards; closing again is
        harmless. A tier never closed is closed at interpreter exit (engine/disk/tier.py)."""
        if self.disk is not None:
            self.disk.close()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def clear_disk(self) -> None:
        """Remove every block file of the disk tier (the memory panel's Clear)."""
        if self.disk is not None:
            self.disk.clear()

    def preload(self, prompt: Prompt) -> int:
        """Load ``prompt``'s prefix blocks found on disk into free blocks now, between
        steps, as prefix-cache entries (a chat opened after a restart): the request that
        sends it next finds them in memory. Returns the prompt tokens loaded; 0 without
        the disk tier or when the pool has no room for them."""
        if self.disk is None or not self.disk.enabled:
            return 0
        ids = self.encode(prompt)
        return self.disk.preload(Sequence(-1, "preload", 0, ids, len(ids)))

    # ---------------------------------------------------------------- requests
    def build(self, prompt: Prompt) -> ChatPrompt:
        """``prompt`` as ids with how its replies are read (a chat's through
        ``self.prompts``); ValueError for what cannot be a prompt."""
        return chat_prompt(prompt, self.tokenizer, self.prompts)

    def encode(self, prompt: Prompt) -> list[int]:
        return self.build(prompt).ids

    def add_request(
        self, prompt: Prompt, params: SamplingParams | BeamSearchParams | None = None,
        request_id: str | None = None, grammar=None,
    ) -> str:
        """Queue a request. Admission is a transaction: everything that can fail (the
        prompt's ids, the grammar, state slots, each candidate's generator and text
        state, the scheduler's own checks) fails before anything is queued, with a
        ValueError naming what was wrong and nothing left behind.

        ``grammar``: ``params.response_format`` compiled by ``self.grammars.compile`` on
        the caller's thread (the worker's callers do): without it the format is compiled
        here, which is for a caller that steps the engine itself.

        ``BeamSearchParams`` queue a beam search (engine/beam): its FinishedEvent carries
        the finished beams, best first, and no token events come before it."""
        built = self.build(prompt)
        if isinstance(params, BeamSearchParams):
            return self._add_beam_search(built, params, request_id)
        params = built.sampling(params or SamplingParams())
        request_id = request_id or f"req-{next(self._ids)}"
        ids = self._in_vocab(built.ids, "prompt token ids")
        slots = self.kv_cache.state_slots
        if slots and params.n > slots:
            # Each candidate needs a linear-attention state slot at once.
            raise ValueError(f"SamplingParams.n: {params.n} candidates need as many state "
                             f"slots, but this model's state pool has {slots}")
        texts, generators, readers, matchers = candidate_parts(
            built, params, self.tokenizer, self.grammars, grammar)
        prediction_ids = self._prediction_ids(params)
        self._speculator.method_for(params)  # refuses a method this engine cannot run
        self.scheduler.check_images(built.images)
        # The last step that can refuse; from here on nothing raises.
        request = self.scheduler.add_request(request_id, ids, params)
        self._speculator.add(request, prediction_ids)
        request.seqs[0].generator = generators[0]
        request.seqs[0].images = built.images
        self._requests[request_id] = RequestState(request, texts, generators, readers,
                                                  matchers, built.request is not None)
        return request_id

    def _prediction_ids(self, params: SamplingParams) -> list[int]:
        """A request's prediction as token ids: its text tokenized, or the ids given."""
        if not params.prediction:
            return []
        if isinstance(params.prediction, str):
            return self.tokenizer.encode(params.prediction, add_special_tokens=False)
        return list(self._in_vocab(params.prediction, "SamplingParams.prediction: token ids"))

    def _in_vocab(self, ids: list[int], what: str) -> list[int]:
        """``ids``, or a ValueError saying ``what`` must be in the model's vocabulary."""
        vocab = self.hf_config.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            raise ValueError(f"{what} must be in [0, {vocab})")
        return ids

    def _add_beam_search(self, built: ChatPrompt, params: BeamSearchParams,
                         request_id: str | None) -> str:
        request_id = request_id or f"req-{next(self._ids)}"
        self._in_vocab(built.ids, "prompt token ids")
        refusal = self.beam_search_refusal()
        if refusal is not None:
            raise ValueError(f"BeamSearchParams: {refusal}")
        self.scheduler.check_images(built.images)
        request = self.scheduler.add_request(request_id, built.ids, params.scheduling())
        request.seqs[0].images = built.images
        self._beams.add(request, built, params)
        return request_id

    def beam_search_refusal(self) -> str | None:
        """Why this model runs no beam search, None where it does (a front end greys
        the choice out with it before any request)."""
        if self.kv_cache.state_slots:
            # A beam forked mid-reply would need its own copy of the recurrent state.
            return "beam search does not run on models with linear-attention layers yet"
        return None

    def request_ids(self) -> list[str]:
        """The requests not yet finished."""
        return [*self._requests, *self._beams.requests]

    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request now and free its blocks; None for an id the engine does not hold.
        The scheduler lets go of the request even where freeing its blocks fails."""
        if request_id in self._beams.requests:
            return self._beams.abort(request_id)
        state = self._requests.pop(request_id, None)
        self._speculator.drop(request_id)
        request = self.scheduler.abort(request_id)
        if request is None or state is None:
            return None
        return request_output(state)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests or self._beams.requests)

    # -------------------------------------------------------------------- step
    def step(self) -> list[Event]:
        """Run one scheduled step; return the prompts' progress, the token deltas and
        the finished requests."""
        disk = self.disk
        if disk is not None:
            disk.begin_step()
        out = self.scheduler.schedule()
        if disk is not None:
            disk.before_forward()
        events: list[Event] = []
        self.last_step_tokens = {}
        if out.is_empty and disk is not None and disk.loading:
            # Only loads to wait for: wait for the next read instead of spinning.
            disk.copy_reads(wait_s=READ_WAIT_S)
        elif not out.is_empty:
            logits = self.runner.execute(out)
            sampled = [item for item in out.scheduled if item.samples]
            events += self._prompt_progress(out)
            self.scheduler.mark_computed(out)
            if logits is not None:
                events += self._sample(logits, sampled)
        if self._beams.requests:
            events += self._beams.reap()  # searches the scheduler ended (out of room)
        for request in self.scheduler.remove_finished():
            state = self._requests.pop(request.request_id, None)
            self._speculator.drop(request.request_id)
            if state is not None:
                output = request_output(state)
                if state.chat:
                    self.prompts.remember(output)
                events.append(FinishedEvent(request.request_id, output))
        self._speculator.propose()
        return events

    def _prompt_progress(self, out: SchedulerOutput) -> list[PromptProgress]:
        """A PromptProgress per request whose prompt this step read a chunk of, before
        its first token: a prompt read again after a preemption mid-reply reports none
        (its reply is showing already). Read before ``mark_computed`` moves the counts."""
        events: list[PromptProgress] = []
        for item in out.scheduled:
            seq = item.seq
            state = self._requests.get(seq.request_id)
            if seq.index != 0 or state is None or \
                    seq.num_computed_tokens >= seq.num_prompt_tokens:
                continue
            request = state.request
            if request.first_token_time is not None:
                continue
            done = min(seq.num_computed_tokens + item.num_new_tokens, seq.num_prompt_tokens)
            events.append(PromptProgress(seq.request_id, done, seq.num_prompt_tokens,
                                         request.num_cached_tokens))
        return events

    def _sample(self, logits: torch.Tensor, items: list[ScheduledSeq]) -> list[Event]:
        """``logits``: the rows of ``items`` (ModelRunner.execute's order). Candidates that
        verified drafts keep what engine/spec accepts; the others sample one token."""
        verifying = [item for item in items if item.num_drafts]
        verified = None
        if verifying:
            plain_rows, draft_rows, row = [], [], 0
            for item in items:
                rows = range(row, row + item.num_sampled_rows)
                (draft_rows if item.num_drafts else plain_rows).extend(rows)
                row += item.num_sampled_rows
            verified = self._speculator.verify(logits[draft_rows], verifying, self._requests,
                                               self.sampler)
            logits = logits[plain_rows]
        seqs = [item.seq for item in items if not item.num_drafts]
        beam_events: list[Event] = []
        if self._beams.requests and seqs:
            logits, seqs, beam_events = self._beams.take(logits, seqs, self.last_step_tokens)
        sampled = sample(logits, seqs, self._requests, self.scheduler, self.sampler) \
            if seqs else Sampled([], [], [], [], [], [])
        if verified is not None:
            sampled.extend(verified)
        events = beam_events + self._stops.append(sampled, self.last_step_tokens)
        if verified is not None:
            self._speculator.settle(verifying, self.scheduler)
        return events

    # ------------------------------------------------------------------- stats
    def kv_stats(self, with_blocks: bool = True) -> KVStats:
        holders = itertools.chain(
            (seq for state in self._requests.values() for seq in state.request.seqs),
            self._beams.holders())
        stats = self.kv_cache.stats(holders, with_blocks)
        if self.disk is not None:
            stats.disk = self.disk.stats()
        return stats

    def memory_stats(self) -> MemoryStats:
        shape = self.runner.shape
        return memory_stats(self.runner.device, self.weights_bytes, self.runner.kv_caches,
                            self.resolved_device.status_line, self.expert_bytes,
                            self.runner.state_pool_bytes, shape.format.name,
                            shape.bytes_per_token,
                            self.runner.images.cache.nbytes if self.runner.images else 0)

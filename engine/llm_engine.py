"""LLMEngine: requests in, token deltas and finished outputs out, one step at a time.

It ties the pieces together: the scheduler (what runs), the model runner (the forward),
the sampler (the next tokens; their log-probabilities for requests that ask), and per
candidate its streaming text (``engine/text/candidate.py``).
Not thread-safe: ``engine.worker.EngineWorker`` drives it from one thread.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.chat import PLAIN, ChatPrompt, ChatRequest, PromptBuilder, ReplyReader
from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec, group_layers
from engine.core.kv_stats import KVStats
from engine.core.scheduler import Scheduler
from engine.core.sequence import Request, Sequence
from engine.disk.group import GroupDisk, fingerprint, model_identity
from engine.disk.store import DiskStore, kv_cache_root
from engine.disk.tier import READ_WAIT_S, DiskTier
from engine.grammar import Grammars, Matcher, token_masks
from engine.layers.moe.sparse import expert_bytes
from engine.layers.weights import set_activation_bits
from engine.outputs import (
    CompletionOutput,
    Event,
    FinishedEvent,
    RequestMetrics,
    RequestOutput,
    TokenEvent,
    TokenLogprobs,
)
from engine.runner.device import resolve_device
from engine.runner.heap import keep_freed_memory
from engine.runner.kv_cache import KVShape, group_blocks, num_blocks_for
from engine.runner.logprobs import token_logprobs
from engine.runner.memory import MemoryStats, memory_stats
from engine.runner.model_runner import ModelRunner
from engine.runner.sampler import Sampler, SamplingRow, make_generator
from engine.runner.state_pool import state_slots
from engine.sampling_params import SamplingParams
from engine.text.candidate import CandidateText
from engine.text.chat_template import chat_tokenizer_for

# Text, token ids, chat messages (built with the model's template), a ChatRequest, or a
# prompt a front end built already (PromptBuilder: the ids it measured are the ids run).
Prompt = str | list[int] | list[dict] | ChatRequest | ChatPrompt


@dataclass(slots=True)
class _RequestState:
    """An admitted request and, per candidate index, what the engine keeps beside the
    scheduler's sequence. All n candidates' parts are made at admission, before the
    scheduler sees the request, so neither admission nor the later fork can fail half-way
    and leave the scheduler holding a request this table does not know."""

    request: Request
    candidates: list[CandidateText]
    generators: list[torch.Generator]
    readers: list[ReplyReader]  # each candidate's reply read: text, thinking, calls
    # Each candidate's grammar state (structured output); empty for free text.
    matchers: list[Matcher] = field(default_factory=list)
    chat: bool = False  # a chat prompt: its replies' ids are remembered by their text

    def matcher(self, index: int) -> Matcher | None:
        return self.matchers[index] if self.matchers else None


class LLMEngine:
    def __init__(
        self,
        model: str | Path = "starter",
        config: EngineConfig | None = None,
        progress: Callable[[str, float], None] | None = None,
    ) -> None:
        from engine.loaders import load_model_files
        from engine.loaders.catalog import resolve_model
        from engine.models import build_model, family_of
        from kernels import get_backend

        self.config = config = config or EngineConfig()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        # Device, compute dtype and attention backend: one decision (runner/device.py).
        self.resolved_device = resolved = resolve_device(config)
        device, dtype = resolved.device, resolved.dtype
        if device.type == "cpu":
            keep_freed_memory()  # a prefill's activations reused, not faulted again
        path = resolve_model(str(model))
        loaded = load_model_files(path, dtype=dtype, progress=progress,
                                  keep_quantized=config.weights == "stored")
        self.model_name = loaded.name
        self.hf_config = loaded.config
        family = family_of(loaded.config)
        self.tokenizer = chat_tokenizer_for(loaded.tokenizer, family.turn_format,
                                            config.chat_template)
        # The one prompt builder every front end uses (engine/chat).
        self.prompts = PromptBuilder(self.tokenizer, family.model_type)
        # Structured output; its tokenizer table is built on the first constrained request.
        self.grammars = Grammars(loaded.tokenizer, loaded.config.vocab_size,
                                 sorted(self.tokenizer.eos_token_ids))
        if progress:
            progress("building the model", 0.0)
        net = build_model(loaded.config, dtype, device)
        net.load_weights(loaded.weights)
        set_activation_bits(net, config.cpu_activation_bits)
        self.weights_bytes = net.weight_bytes()
        self.expert_bytes = expert_bytes(net)
        context = net.max_context_len
        self.max_model_len = min(config.max_model_len or context, context)
        shape = KVShape.of_model(net, config.block_size, resolved.kv_dtype)
        num_blocks = num_blocks_for(config, shape, device, self.max_model_len)
        backend = get_backend(device, resolved.backend)
        windows = net.layer_windows()
        linear = net.linear_layers()
        self.kv_groups = (group_layers(windows, self.max_model_len, linear) if config.kv_groups
                          or linear else [KVGroupSpec(tuple(range(len(windows))))])
        attention_groups = [g for g in self.kv_groups if not g.linear]
        counts = group_blocks(config, shape, num_blocks, attention_groups)
        slot_bytes, live_slots = 0, 1
        if linear:
            slot_bytes = net.deltanet_shape.state_bytes(dtype.itemsize) * len(linear)
            total, live_slots = state_slots(config, slot_bytes, num_blocks *
                                            shape.bytes_per_block)
            counts.append(total)
        self.runner = ModelRunner(net, shape, self.kv_groups, counts, config.num_host_blocks,
                                  backend, device, config.cuda_graphs, self.max_model_len)
        store = DiskStore(kv_cache_root(), config.kv_disk_bytes) if config.kv_disk_bytes \
            else None
        groups = self._open_disk_tier(store, path, shape) if store else None
        self.kv_cache = KVCacheManager.build(
            self.kv_groups, counts, config.block_size, num_host_blocks=config.num_host_blocks,
            enable_prefix_caching=config.enable_prefix_caching,
            group_block_bytes=[0 if g.linear else shape.block_bytes(g.layers)
                               for g in self.kv_groups],
            lookahead=config.max_num_batched_tokens, state_slot_bytes=slot_bytes,
            live_state_slots=live_slots, lower_tiers=groups)
        self.disk = DiskTier(store, groups, self.kv_cache, self.runner) if store else None
        self.scheduler = Scheduler(
            self.kv_cache, config.max_num_seqs, config.max_num_batched_tokens,
            self.max_model_len,
        )
        self.sampler = Sampler()
        # The request table: every request not yet finished, by id. It labels the blocks'
        # owners in kv_stats and holds each candidate's text state.
        self._requests: dict[str, _RequestState] = {}
        # Request id -> tokens sampled for it by the last step (StepLoop's hooks read it).
        self.last_step_tokens: dict[str, int] = {}
        self._ids = itertools.count()
        if config.warm_up and self.max_model_len > 2:
            if progress:
                progress("warming up", 0.0)
            self._warm_up()
        if progress:
            progress("ready", 1.0)

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

    def _open_disk_tier(self, store, path, shape: KVShape) -> list[GroupDisk]:
        """Each group's pool and the runner over one store; the fingerprint names what a
        block's K/V depends on (model file, compute and KV dtype, weights mode, kernels'
        layout, block and head shapes) and, per group, its layers and window."""
        config, runner = self.config, self.runner
        model = (model_identity(path), str(self.resolved_device.dtype), str(shape.dtype),
                 config.weights,
                 config.cpu_activation_bits, self.resolved_device.device.type,
                 type(runner.backend).__name__, runner.backend.head_major_kv,
                 shape.block_size, shape.num_kv_heads, shape.head_size, shape.layer_heads)
        groups = []
        for g, spec in enumerate(self.kv_groups):
            # A linear group's "blocks" are state snapshots: their layout is the state's.
            layout = repr(self.runner.model.deltanet_shape) if spec.linear else spec.window
            groups.append(GroupDisk(store, fingerprint(model, spec.layers, spec.linear,
                                                       layout),
                                    g, runner.block_payload_bytes(g)))
        return groups

    def close(self) -> None:
        """Keep every cached block on disk (the model unloads, the app quits) and wait
        for the writes. The engine may still be used afterwards."""
        if self.disk is not None:
            self.disk.close()

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
        if isinstance(prompt, ChatPrompt):
            return prompt
        if isinstance(prompt, ChatRequest):
            return self.prompts.build(prompt)
        if isinstance(prompt, str):
            return ChatPrompt(self.tokenizer.encode(prompt), PLAIN)
        if prompt and isinstance(prompt[0], dict):
            return self.prompts.build(ChatRequest(prompt))
        if not all(isinstance(t, int) for t in prompt):
            raise ValueError("prompt must be text, a list of token ids or a list of messages")
        return ChatPrompt(list(prompt), PLAIN)

    def encode(self, prompt: Prompt) -> list[int]:
        return self.build(prompt).ids

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None,
        grammar=None,
    ) -> str:
        """Queue a request. Admission is a transaction: everything that can fail (the
        prompt's ids, the grammar, state slots, each candidate's generator and text
        state, the scheduler's own checks) fails before anything is queued, with a
        ValueError naming what was wrong and nothing left behind.

        ``grammar``: ``params.response_format`` compiled by ``self.grammars.compile`` on
        the caller's thread (the worker's callers do): without it the format is compiled
        here, which is for a caller that steps the engine itself."""
        built = self.build(prompt)
        chat = built.request is not None
        params = built.sampling(params or SamplingParams())
        request_id = request_id or f"req-{next(self._ids)}"
        ids = built.ids
        vocab = self.hf_config.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        slots = self.kv_cache.state_slots
        if slots and params.n > slots:
            # Each candidate needs a linear-attention state slot at once.
            raise ValueError(f"SamplingParams.n: {params.n} candidates need as many state "
                             f"slots, but this model's state pool has {slots}")
        # A schema that cannot be enforced is a GrammarError (ValueError).
        fmt, matchers = params.response_format, []
        if fmt is not None:
            grammar = grammar or self.grammars.compile(fmt)
            matchers = [self.grammars.matcher(fmt, grammar) for _ in range(params.n)]
        generators = [make_generator(params.seed, i) for i in range(params.n)]
        candidates = [self._new_candidate(ids, params) for _ in range(params.n)]
        readers = [built.plan.reader(params.response_format is not None)
                   for _ in range(params.n)]
        # The last step that can refuse; from here on nothing raises.
        request = self.scheduler.add_request(request_id, ids, params)
        request.seqs[0].generator = generators[0]
        self._requests[request_id] = _RequestState(request, candidates, generators, readers,
                                                   matchers, chat)
        return request_id

    def _new_candidate(self, prompt_ids: list[int], params: SamplingParams) -> CandidateText:
        return CandidateText.start(self.tokenizer, prompt_ids,
                                   [*params.stop, *self.tokenizer.stop_strings],
                                   params.logprobs is not None, params.skip_special_tokens)

    def request_ids(self) -> list[str]:
        """The requests not yet finished."""
        return list(self._requests)

    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request now and free its blocks; None for an id the engine does not hold.
        The scheduler lets go of the request even where freeing its blocks fails."""
        state = self._requests.pop(request_id, None)
        request = self.scheduler.abort(request_id)
        if request is None or state is None:
            return None
        return self._output(state)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    # -------------------------------------------------------------------- step
    def step(self) -> list[Event]:
        """Run one scheduled step; return the token deltas and finished requests."""
        disk = self.disk
        if disk is not None and disk.loading:
            disk.copy_reads()
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
            self.scheduler.mark_computed(out)
            if logits is not None:
                events += self._sample(logits, [item.seq for item in sampled])
        for request in self.scheduler.remove_finished():
            state = self._requests.pop(request.request_id, None)
            if state is not None:
                output = self._output(state)
                if state.chat:
                    self.prompts.remember(output)
                events.append(FinishedEvent(request.request_id, output))
        return events

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[Event]:
        rows: list[int] = []
        targets: list[Sequence] = []
        for row, seq in enumerate(seqs):
            state = self._requests[seq.request_id]
            request = state.request
            candidates = [seq]
            if seq.needs_fork:
                # Every candidate's generator, text and grammar state was made at
                # admission: the fork only splits the blocks.
                candidates = self.scheduler.fork(request)
                for child in candidates[1:]:
                    child.generator = state.generators[child.index]
            rows += [row] * len(candidates)
            targets += candidates
        params = [self._requests[s.request_id].request.params for s in targets]
        matchers = [self._requests[s.request_id].matcher(s.index) for s in targets]
        masks = token_masks(matchers, logits.shape[-1])
        sampling_rows = [
            SamplingRow(p, s.generator, s.token_ids, allowed)
            for p, s, allowed in zip(params, targets, masks, strict=True)
        ]
        row_logits = logits[rows]
        tokens = self.sampler(row_logits, sampling_rows)
        logprobs = token_logprobs(row_logits, tokens, [p.logprobs for p in params])
        now = time.perf_counter()
        events: list[Event] = []
        for seq, p, token, lp, matcher in zip(targets, params, tokens, logprobs, matchers,
                                              strict=True):
            token = int(token)
            seq.append_token(token)
            counts = self.last_step_tokens
            counts[seq.request_id] = counts.get(seq.request_id, 0) + 1
            # The mask allowed only tokens the grammar accepts; once it has taken its stop
            # token the reply is complete, even with ignore_eos.
            complete = matcher is not None and (not matcher.accept(token) or matcher.done)
            event = self._after_token(seq, p, token, now, lp, complete)
            if event is not None:
                events.append(event)
        return events

    def _after_token(
        self, seq: Sequence, params: SamplingParams, token: int, now: float,
        logprobs: TokenLogprobs | None, complete: bool = False,
    ) -> TokenEvent | None:
        state = self._requests[seq.request_id]
        request = state.request
        cand = state.candidates[seq.index]
        if cand.first_token_time is None:
            cand.first_token_time = now
            if request.first_token_time is None:
                request.first_token_time = now
        reason = None
        is_eos = token in self.tokenizer.eos_token_ids and (complete or not params.ignore_eos)
        if is_eos or token in params.stop_token_ids:
            reason, delta = "stop", ""  # the stop token's own text is not shown
        else:
            stopped, delta = cand.stop.check(cand.detokenizer.add(token))
            if stopped or complete:
                reason = "stop"
        if reason is None and seq.num_output_tokens >= params.max_tokens:
            reason = "length"
        elif reason is None and seq.num_tokens >= self.max_model_len:
            reason = "context"
        if reason is not None and not cand.stop.stopped:
            delta += cand.drain()
        cand.text += delta
        reader = state.readers[seq.index]
        parts = reader.feed(delta, 1, now)
        if reader.done:
            reason = "stop"  # its last allowed tool call is made: the rest would be dropped
        if reason is not None:
            parts += reader.finish(now)
            cand.finish_time = now
            self.scheduler.finish_seq(seq, reason)
        if logprobs is not None:
            cand.logprobs.append(logprobs)
            # Every token is reported, its text held back or not.
            return TokenEvent(seq.request_id, seq.index, delta, [token], [logprobs],
                              tuple(parts))
        if not delta and not parts:
            return None
        return TokenEvent(seq.request_id, seq.index, delta, [token], parts=tuple(parts))

    def _output(self, state: _RequestState) -> RequestOutput:
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
        return RequestOutput(
            request.request_id, list(request.prompt_token_ids), outputs, request.is_finished,
            self._metrics(state),
        )

    def _metrics(self, state: _RequestState) -> RequestMetrics:
        request = state.request
        now = time.perf_counter()
        generated = sum(s.num_output_tokens for s in request.seqs)
        m = RequestMetrics(
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=request.num_cached_tokens,
            num_disk_tokens=request.num_disk_tokens,
            num_generated_tokens=generated,
            total_s=now - request.arrival_time,
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

    # ------------------------------------------------------------------- stats
    def kv_stats(self, with_blocks: bool = True) -> KVStats:
        holders = (seq for state in self._requests.values() for seq in state.request.seqs)
        stats = self.kv_cache.stats(holders, with_blocks)
        if self.disk is not None:
            stats.disk = self.disk.stats()
        return stats

    def memory_stats(self) -> MemoryStats:
        return memory_stats(self.runner.device, self.weights_bytes, self.runner.kv_caches,
                            self.resolved_device.status_line, self.expert_bytes,
                            self.runner.state_pool_bytes)


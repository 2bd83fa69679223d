"""Continuous batching: which sequences run in the next step, and with how many tokens.

Each step first serves the running requests (one decode token per candidate, or the
next chunk of a prompt still prefilling), then brings back swapped requests, then
admits waiting ones, all under ``max_num_batched_tokens`` and ``max_num_seqs``.
When the pool runs out of blocks, the most recently admitted request is preempted:
swapped to the host pool when one is configured, else freed and requeued at the front
of the waiting queue to be recomputed (its blocks stay in the prefix cache, so the
recompute is often cheap). A recomputed request with several candidates comes back
one candidate first; the others join once the shared prompt is cached again.

A request whose prefix hit uses blocks on disk waits in ``loading`` (its blocks taken,
their reads in the background) while the running requests keep stepping; it runs from
the first step after its last read is in. A read that fails its checks sends it back to
the front of the waiting queue, to be admitted again without that block (recomputed).

The scheduler alone moves a sequence's progress (``num_computed_tokens``): the KV cache
reports what it found (a prefix hit, blocks to read from disk) and the scheduler starts
the sequence there, advances it after each step, and starts it over when it frees its
blocks for a recompute. A swap keeps its progress.
"""

from __future__ import annotations

import itertools
from collections import deque

from engine.core.disk_loads import LoadState
from engine.core.kv_protocol import KVCache
from engine.core.parking import active, has_parked, unpark
from engine.core.scheduler_output import ScheduledSeq, SchedulerOutput, add_moves
from engine.core.sequence import ImageSpan, Request, Sequence, SequenceStatus


class RequestTooLargeError(ValueError):
    """A request that could never run: longer than the context or the whole pool."""


class Scheduler:
    def __init__(
        self,
        kv_cache: KVCache,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 512,
        max_model_len: int | None = None,
    ) -> None:
        self.kv = kv_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order
        self.swapped: deque[Request] = deque()
        self.loading: list[Request] = []  # admitted, waiting for their disk reads
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self.num_preemptions = 0

    # ---------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt_token_ids: list[int], params) -> Request:
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("prompt must have at least one token")
        n = len(prompt_token_ids)
        if self.max_model_len is not None and n >= self.max_model_len:
            raise RequestTooLargeError(
                f"The prompt has {n} tokens but the model's context holds {self.max_model_len}"
                " (including at least one reply token). Shorten the chat or start a new one."
            )
        if self.kv.blocks_needed(n + 1) > self.kv.num_blocks:
            raise RequestTooLargeError(
                f"The prompt has {n} tokens but the whole KV pool holds "
                f"{self.kv.num_blocks * self.kv.block_size - 1} plus a reply token. "
                "Give the engine a larger KV cache budget or shorten the prompt."
            )
        seq = Sequence(next(self._seq_ids), request_id, 0, list(prompt_token_ids), n)
        seq.needs_fork = params.n > 1
        seq.fork_width = params.n
        request = Request(request_id, list(prompt_token_ids), params, [seq])
        self.requests[request_id] = request
        self.waiting.append(request)
        return request

    def check_images(self, images: tuple[ImageSpan, ...]) -> None:
        """The ValueError for a prompt whose bidirectional image run (ImageSpan.joint)
        cannot be computed in one step: a run is never split between prefill chunks."""
        for span in images:
            if span.joint is not None and \
                    span.joint[1] - span.joint[0] > self.max_num_batched_tokens:
                raise ValueError(
                    f"an image takes {span.joint[1] - span.joint[0]} tokens that attend to "
                    "each other and must be computed in one step, but a step holds "
                    f"max_num_batched_tokens={self.max_num_batched_tokens}; raise it")

    def fork(self, request: Request) -> list[Sequence]:
        """Split a request's prefilled prompt into its n candidates (no new block).

        Call it in the step whose chunk ended the prompt, before the parent's first
        token is appended; before or after ``mark_computed`` both work."""
        parent = request.seqs[0]
        parent.needs_fork = False
        for index in range(1, request.params.n):
            child = Sequence(next(self._seq_ids), request.request_id, index,
                             list(parent.token_ids), parent.num_prompt_tokens,
                             status=SequenceStatus.RUNNING, images=parent.images)
            self.kv.fork(parent, child)
            # That step computed the whole prompt for every candidate, even if
            # mark_computed has not advanced the parent yet (it never sees the children).
            child.num_computed_tokens = parent.num_prompt_tokens
            request.seqs.append(child)
        return request.seqs

    def fork_seq(self, request: Request, parent: Sequence, index: int) -> Sequence:
        """A copy of ``parent`` (a beam search's beam, engine/beam) that shares all its
        blocks (no new block: the partial tail is copied on the next write) and its
        progress; candidate ``index`` of ``request``, running from the next step."""
        child = Sequence(next(self._seq_ids), request.request_id, index,
                         list(parent.token_ids), parent.num_prompt_tokens,
                         status=parent.status, images=parent.images)
        self.kv.fork(parent, child)
        child.num_computed_tokens = parent.num_computed_tokens
        request.seqs.append(child)
        return child

    def finish_seq(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.kv.free(seq)
        self.kv.free_host(seq)

    def abort(self, request_id: str) -> Request | None:
        """End a request now and free its blocks at once."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        request.aborted = True
        try:
            for seq in request.seqs:
                if not seq.is_finished:
                    self.finish_seq(seq, "abort")
        finally:
            # Even where freeing a sequence failed, the (aborted, so finished) request
            # leaves every queue: one the engine no longer knows is never scheduled again.
            self.remove_finished()
        return request

    def remove_finished(self) -> list[Request]:
        done = [r for r in self.requests.values() if r.is_finished]
        for request in done:
            del self.requests[request.request_id]
            for queue in (self.running, self.waiting, self.swapped, self.loading):
                if request in queue:
                    queue.remove(request)
        return done

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped or self.loading)

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        num_seqs = 0
        gone: set[str] = set()  # preempted or ended earlier in this step
        self._end_loads()
        for request in list(self.running):
            if request.request_id in gone:
                continue
            if self._make_room(request, out):
                unpark(request, self.kv.block_size, self._allocate)
            else:
                gone.add(request.request_id)
            gone.update(out.preempted)
        live = [s for r in self.running for s in active(r)]
        # Decode tokens first, so that a long prompt's chunk never stalls the chats
        # already streaming.
        decodes = [s for s in live if s.num_uncomputed_tokens == 1]
        prefills = [s for s in live if s.num_uncomputed_tokens > 1]
        for seq in decodes + prefills:
            if budget == 0 or num_seqs == self.max_num_seqs:
                break
            drafted = bool(seq.draft_token_ids)
            take = min(seq.num_uncomputed_tokens + len(seq.draft_token_ids), budget)
            if take and not whole_runs(seq, take):  # an image run that fits a later step
                continue
            take = whole_runs(seq, take)
            del seq.draft_token_ids[max(0, take - 1):]  # drafts past the budget wait
            item = ScheduledSeq(seq, take, self.kv.block_tables(seq))
            if drafted:  # state slots were taken for the drafts: those scheduled keep theirs
                item.draft_state_slots = self.kv.draft_state_slots(seq, item.num_drafts)
            out.scheduled.append(item)
            budget -= take
            num_seqs += 1
        if not out.preempted:
            budget, num_seqs = self._swap_in(out, budget, num_seqs)
        parked = any(has_parked(r) for r in self.running)
        if not out.preempted and not self.swapped and not parked:
            self._admit(out, budget, num_seqs)
        out.cow_pairs = self.kv.take_cow_pairs()
        return out

    def _end_loads(self) -> None:
        """Loading requests whose reads are all in run from this step on; one whose read
        failed goes back to the front of the waiting queue."""
        for request in list(self.loading):
            leader = request.live_seqs[0]
            state = self.kv.load_state(leader)
            if state is LoadState.LOADING:
                continue
            self.loading.remove(request)
            if state is LoadState.FAILED:
                self._restart(leader)
                self.waiting.appendleft(request)
                continue
            self._start(request)

    def _start(self, request: Request) -> None:
        leader = request.live_seqs[0]
        if not request.admitted_once:
            request.admitted_once = True
            request.num_cached_tokens = leader.num_computed_tokens
            request.num_disk_tokens = leader.num_disk_tokens
        leader.status = SequenceStatus.RUNNING
        unpark(request, self.kv.block_size, self._allocate)
        self.running.append(request)

    def _make_room(self, request: Request, out: SchedulerOutput) -> bool:
        """Blocks for this step's tokens of ``request``, preempting later requests (or this
        one) as needed. Returns whether ``request`` still runs this step."""
        seqs = active(request)
        while not self._append(seqs):
            if any(seq.draft_token_ids for seq in seqs):
                # Drafts are a guess: out of room, they are halved, then gone, before
                # anything is preempted (a hybrid model's few spare state slots still
                # take a few drafts).
                for seq in seqs:
                    self._drop_drafts(seq, len(seq.draft_token_ids) // 2)
                continue
            if self.loading:  # its reads are the cheapest to give up
                self._preempt_loading(self.loading[-1], out)
                continue
            victim = self.running[-1]
            if victim is request and len(self.running) == 1:
                # Alone and still out of room: the request has outgrown the pool, the
                # context that fits in memory is full.
                for seq in request.live_seqs:
                    self.finish_seq(seq, "context")
                out.finished.append(request)
                self.running.remove(request)
                return False
            self._preempt(victim, out)
            if victim is request:
                return False
        return True

    def _append(self, seqs: list[Sequence]) -> bool:
        """Room for each of ``seqs``' next tokens, or nothing changed. One sequence (the
        usual case) asks once: append_slots is all or nothing by itself, and planning it
        twice is most of a decode step's bookkeeping."""
        if len(seqs) == 1:
            return self.kv.append_slots(seqs[0])
        if not self.kv.can_append(seqs):
            return False
        for seq in seqs:
            ok = self.kv.append_slots(seq)
            assert ok, "can_append promised room"
        return True

    def _drop_drafts(self, seq: Sequence, keep: int) -> None:
        """Keep ``seq``'s first ``keep`` drafts; the blocks an earlier step took for the
        others go back (a sequence then left out of the step would hold them past its
        tokens). A sequence without drafts is left as it is: mid-prefill, its blocks past
        the computed tokens are its prompt's."""
        if len(seq.draft_token_ids) > keep:
            del seq.draft_token_ids[keep:]
            self.kv.trim(seq)

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        self.running.remove(request)
        self.num_preemptions += 1
        out.preempted.append(request.request_id)
        seqs = active(request)  # parked candidates hold no blocks and stay parked
        for seq in seqs:  # the blocks taken for its drafts are not swapped out
            self._drop_drafts(seq, 0)
        if self.kv.num_host_blocks and self.kv.can_swap_out(seqs):
            add_moves(out.swap_out, self.kv.swap_out(seqs))
            for seq in seqs:
                seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(request)
            return
        for seq in seqs:
            self._restart(seq)
        self.waiting.appendleft(request)

    def _preempt_loading(self, request: Request, out: SchedulerOutput) -> None:
        """Free a loading request's blocks (its reads cancelled); admitted again later."""
        self.loading.remove(request)
        self.num_preemptions += 1
        out.preempted.append(request.request_id)
        self._restart(request.live_seqs[0])
        self.waiting.appendleft(request)

    def _swap_in(self, out: SchedulerOutput, budget: int, num_seqs: int) -> tuple[int, int]:
        while self.swapped and budget > 0 and num_seqs < self.max_num_seqs:
            request = self.swapped[0]
            seqs = [s for s in request.live_seqs if s.status is SequenceStatus.SWAPPED]
            # Room for one new block per sequence too, unless it runs alone: then it may
            # take the whole pool, better than waiting forever for room.
            if not self.kv.can_swap_in(seqs, reserve=len(seqs) if self.running else 0):
                break
            self.swapped.popleft()
            add_moves(out.swap_in, self.kv.swap_in(seqs))
            for seq in seqs:
                seq.status = SequenceStatus.RUNNING
                # Out of room only when alone: the next step's _make_room ends it.
                if not self.kv.append_slots(seq):
                    continue
                budget, num_seqs = self._schedule_chunk(out, seq, budget, num_seqs)
            self.running.append(request)
        return budget, num_seqs

    def _schedule_chunk(self, out: SchedulerOutput, seq: Sequence, budget: int,
                        num_seqs: int) -> tuple[int, int]:
        if budget > 0 and num_seqs < self.max_num_seqs:
            take = min(seq.num_uncomputed_tokens, budget)
            if take and not whole_runs(seq, take):  # an image run that fits a later step
                return budget, num_seqs
            take = whole_runs(seq, take)
            out.scheduled.append(ScheduledSeq(seq, take, self.kv.block_tables(seq)))
            budget -= take
            num_seqs += 1
        return budget, num_seqs

    def _admit(self, out: SchedulerOutput, budget: int, num_seqs: int) -> None:
        while self.waiting and budget > 0 and num_seqs < self.max_num_seqs:
            request = self.waiting[0]
            # A recomputed request with several candidates comes back leader first; the
            # others join once the prompt is in the cache again (see parking.unpark).
            leader = request.live_seqs[0]
            if not self._allocate(leader):
                break
            self.waiting.popleft()
            for seq in request.live_seqs[1:]:
                seq.status = SequenceStatus.PARKED
            if self.kv.load_state(leader) is LoadState.LOADING:
                leader.status = SequenceStatus.LOADING
                self.loading.append(request)
                continue  # takes no budget until its blocks are in
            self._start(request)
            for seq in active(request):
                budget, num_seqs = self._schedule_chunk(out, seq, budget, num_seqs)
            if has_parked(request):
                break  # its parked candidates come before anything still waiting

    def _allocate(self, seq: Sequence) -> bool:
        """Blocks for ``seq``, which starts after the prefix hit the KV cache found."""
        hit = self.kv.allocate(seq)
        if hit is None:
            return False
        seq.num_computed_tokens = hit.num_tokens
        seq.num_disk_tokens = hit.num_disk_tokens
        return True

    def _restart(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks to recompute it: it waits, with nothing computed, for its
        next admission's prefix hit."""
        self.kv.free(seq)  # before the reset: a partial last block is cached by it
        seq.num_computed_tokens = 0
        seq.draft_token_ids.clear()
        seq.status = SequenceStatus.WAITING

    # ------------------------------------------------------------ after a step
    def mark_computed(self, out: SchedulerOutput) -> None:
        """The step ran: advance each sequence and register its newly full blocks."""
        for item in out.scheduled:
            # Drafts' K/V is written but counts only once accepted (``settle_drafts``).
            item.seq.num_computed_tokens += item.num_new_tokens - item.num_drafts
            self.kv.commit_computed(item.seq)

    def accept_draft(self, seq: Sequence) -> None:
        """The last token appended to ``seq`` was one of its drafts, which the model
        kept: its K/V, written by the verify step, counts as computed (a block it fills
        joins the prefix cache, as a plain decode step would make it join)."""
        if seq.num_computed_tokens >= seq.num_tokens:
            raise ValueError(f"{seq.label}: no kept draft left to count")
        seq.num_computed_tokens += 1
        self.kv.commit_computed(seq)

    def rewind(self, seq: Sequence, num_tokens: int) -> None:
        """Cut ``seq`` back to its first ``num_tokens`` tokens (a draft model's sequence
        whose drafts the target rejected, engine/spec/draft_model.py): the K/V it keeps
        stops there (or at the start of a cached block it would otherwise write into) and
        the blocks past it go back. Only for models without sliding windows or recurrent
        state, whose earlier blocks are all still held."""
        if not 0 < num_tokens <= seq.num_tokens:
            raise ValueError(f"{seq.label}: cannot keep {num_tokens} of {seq.num_tokens} tokens")
        computed = self.kv.rewind_point(seq, min(seq.num_computed_tokens, num_tokens))
        del seq.token_ids[num_tokens:]
        del seq.block_hashes[num_tokens // self.kv.block_size:]
        seq.draft_token_ids.clear()
        seq.num_computed_tokens = computed
        self.kv.trim(seq)

    def settle_drafts(self, seq: Sequence) -> None:
        """After a verify step: the blocks taken for the drafts the model rejected go back
        to the pool (the next step computes the model's own token)."""
        seq.draft_token_ids.clear()
        if not seq.is_finished:
            self.kv.trim(seq)


def whole_runs(seq: Sequence, take: int) -> int:
    """``take`` cut back so that the chunk does not end inside a bidirectional image run
    (ImageSpan.joint): to the run's start, or 0 when the chunk would start inside it
    (a prefix hit that ends in an image) and cannot hold the rest of it."""
    start = seq.num_computed_tokens
    end = start + take
    for span in seq.images:
        if span.joint is not None and span.joint[0] < end < span.joint[1]:
            return max(span.joint[0], start) - start
    return take


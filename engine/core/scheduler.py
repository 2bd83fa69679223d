"""Continuous batching: which sequences run in the next step, and with how many tokens.

Each step first serves the running requests (one decode token per candidate, or the
next chunk of a prompt still prefilling), then brings back swapped requests, then
admits waiting ones, all under ``max_num_batched_tokens`` and ``max_num_seqs``.
When the pool runs out of blocks, the most recently admitted request is preempted:
swapped to the host pool when one is configured, else freed and requeued at the front
of the waiting queue to be recomputed (its blocks stay in the prefix cache, so the
recompute is often cheap). A recomputed request with several candidates comes back
one candidate first; the others join once the shared prompt is cached again.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus


class RequestTooLargeError(ValueError):
    """A request that could never run: longer than the context or the whole pool."""


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens computed this step, starting at seq.num_computed_tokens
    # The chunk reaches the sequence's last token, so its logits are sampled.
    samples: bool = field(init=False)

    def __post_init__(self) -> None:
        self.samples = self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    cow_pairs: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) device blocks
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, host)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host, device)
    preempted: list[str] = field(default_factory=list)  # request ids
    finished: list[SequenceGroup] = field(default_factory=list)  # ended by the scheduler

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.swap_out and not self.swap_in


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 512,
        max_model_len: int | None = None,
    ) -> None:
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []  # in admission order
        self.swapped: deque[SequenceGroup] = deque()
        self.groups: dict[str, SequenceGroup] = {}
        self._seq_ids = itertools.count()
        self.num_preemptions = 0

    # ---------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt_token_ids: list[int], params) -> SequenceGroup:
        if request_id in self.groups:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("prompt must have at least one token")
        n = len(prompt_token_ids)
        if self.max_model_len is not None and n >= self.max_model_len:
            raise RequestTooLargeError(
                f"The prompt has {n} tokens but the model's context holds {self.max_model_len}"
                " (including at least one reply token). Shorten the chat or start a new one."
            )
        if self.bm.blocks_needed(n + 1) > self.bm.num_blocks:
            raise RequestTooLargeError(
                f"The prompt has {n} tokens but the whole KV pool holds "
                f"{self.bm.num_blocks * self.bm.block_size - 1} plus a reply token. "
                "Give the engine a larger KV cache budget or shorten the prompt."
            )
        seq = Sequence(next(self._seq_ids), request_id, 0, list(prompt_token_ids), n)
        seq.needs_fork = params.n > 1
        group = SequenceGroup(request_id, list(prompt_token_ids), params, [seq])
        self.groups[request_id] = group
        self.waiting.append(group)
        return group

    def fork(self, group: SequenceGroup) -> list[Sequence]:
        """Split a request's prefilled prompt into its n candidates (no new block).

        Call it in the step whose chunk ended the prompt, before the parent's first
        token is appended; before or after ``mark_computed`` both work."""
        parent = group.seqs[0]
        parent.needs_fork = False
        for index in range(1, group.params.n):
            child = Sequence(next(self._seq_ids), group.request_id, index,
                             list(parent.token_ids), parent.num_prompt_tokens,
                             status=SequenceStatus.RUNNING)
            self.bm.fork(parent, child)
            # That step computed the whole prompt for every candidate, even if
            # mark_computed has not advanced the parent yet (it never sees the children).
            child.num_computed_tokens = parent.num_prompt_tokens
            group.seqs.append(child)
        return group.seqs

    def finish_seq(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.bm.free(seq)
        self.bm.free_host(seq)

    def abort(self, request_id: str) -> SequenceGroup | None:
        """End a request now and free its blocks at once."""
        group = self.groups.get(request_id)
        if group is None:
            return None
        group.aborted = True
        for seq in group.seqs:
            if not seq.is_finished:
                self.finish_seq(seq, "abort")
        self.remove_finished()
        return group

    def remove_finished(self) -> list[SequenceGroup]:
        done = [g for g in self.groups.values() if g.is_finished]
        for group in done:
            del self.groups[group.request_id]
            for queue in (self.running, self.waiting, self.swapped):
                if group in queue:
                    queue.remove(group)
        return done

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        num_seqs = 0
        gone: set[str] = set()  # preempted or ended earlier in this step
        for group in list(self.running):
            if group.request_id in gone:
                continue
            if self._make_room(group, out):
                self._unpark(group)
            else:
                gone.add(group.request_id)
            gone.update(out.preempted)
        live = [s for g in self.running for s in _active(g)]
        # Decode tokens first, so that a long prompt's chunk never stalls the chats
        # already streaming.
        decodes = [s for s in live if s.num_uncomputed_tokens == 1]
        prefills = [s for s in live if s.num_uncomputed_tokens > 1]
        for seq in decodes + prefills:
            if budget == 0 or num_seqs == self.max_num_seqs:
                break
            take = min(seq.num_uncomputed_tokens, budget)
            out.scheduled.append(ScheduledSeq(seq, take))
            budget -= take
            num_seqs += 1
        if not out.preempted:
            budget, num_seqs = self._swap_in(out, budget, num_seqs)
        parked = any(_has_parked(g) for g in self.running)
        if not out.preempted and not self.swapped and not parked:
            self._admit(out, budget, num_seqs)
        out.cow_pairs = self.bm.take_cow_pairs()
        return out

    def _make_room(self, group: SequenceGroup, out: SchedulerOutput) -> bool:
        """Blocks for this step's tokens of ``group``, preempting later groups (or this
        one) as needed. Returns whether ``group`` still runs this step."""
        seqs = _active(group)
        while not self.bm.can_append(seqs):
            victim = self.running[-1]
            if victim is group and len(self.running) == 1:
                # Alone and still out of room: the request has outgrown the pool, the
                # context that fits in memory is full.
                for seq in group.live_seqs:
                    self.finish_seq(seq, "context")
                out.finished.append(group)
                self.running.remove(group)
                return False
            self._preempt(victim, out)
            if victim is group:
                return False
        for seq in seqs:
            ok = self.bm.append_slots(seq)
            assert ok, "can_append promised room"
        return True

    def _preempt(self, group: SequenceGroup, out: SchedulerOutput) -> None:
        self.running.remove(group)
        self.num_preemptions += 1
        out.preempted.append(group.request_id)
        seqs = _active(group)  # parked candidates hold no blocks and stay parked
        if self.bm.num_host_blocks and self.bm.can_swap_out(seqs):
            out.swap_out += self.bm.swap_out(seqs)
            for seq in seqs:
                seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(group)
            return
        for seq in seqs:
            self.bm.free(seq)
            seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(group)

    def _swap_in(self, out: SchedulerOutput, budget: int, num_seqs: int) -> tuple[int, int]:
        while self.swapped and budget > 0 and num_seqs < self.max_num_seqs:
            group = self.swapped[0]
            seqs = [s for s in group.live_seqs if s.status is SequenceStatus.SWAPPED]
            # Room for one new block per sequence too, unless it runs alone: then it may
            # take the whole pool, better than waiting forever for room.
            if not self.bm.can_swap_in(seqs, reserve=len(seqs) if self.running else 0):
                break
            self.swapped.popleft()
            out.swap_in += self.bm.swap_in(seqs)
            for seq in seqs:
                seq.status = SequenceStatus.RUNNING
                # Out of room only when alone: the next step's _make_room ends it.
                if not self.bm.append_slots(seq):
                    continue
                budget, num_seqs = self._schedule_chunk(out, seq, budget, num_seqs)
            self.running.append(group)
        return budget, num_seqs

    def _schedule_chunk(self, out: SchedulerOutput, seq: Sequence, budget: int,
                        num_seqs: int) -> tuple[int, int]:
        if budget > 0 and num_seqs < self.max_num_seqs:
            take = min(seq.num_uncomputed_tokens, budget)
            out.scheduled.append(ScheduledSeq(seq, take))
            budget -= take
            num_seqs += 1
        return budget, num_seqs

    def _admit(self, out: SchedulerOutput, budget: int, num_seqs: int) -> None:
        while self.waiting and budget > 0 and num_seqs < self.max_num_seqs:
            group = self.waiting[0]
            # A recomputed request with several candidates comes back leader first; the
            # others join once the prompt is in the cache again (see _unpark).
            leader = group.live_seqs[0]
            if self.bm.allocate(leader) is None:
                break
            self.waiting.popleft()
            if not group.admitted_once:
                group.admitted_once = True
                group.num_cached_tokens = leader.num_computed_tokens
            leader.status = SequenceStatus.RUNNING
            for seq in group.live_seqs[1:]:
                seq.status = SequenceStatus.PARKED
            self._unpark(group)
            self.running.append(group)
            for seq in _active(group):
                budget, num_seqs = self._schedule_chunk(out, seq, budget, num_seqs)
            if _has_parked(group):
                break  # its parked candidates come before anything still waiting

    def _unpark(self, group: SequenceGroup) -> None:
        """Give blocks to the parked candidates of a request preempted by recompute.

        Allocated together, each would recompute the shared prompt into blocks of its
        own (none is in the cache until computed), needing far more room than the
        request held: it might never fit again. So they wait until an active candidate
        has computed the prompt's full blocks, then find them in the prefix cache."""
        if not _has_parked(group):
            return
        parked = [s for s in group.seqs if s.status is SequenceStatus.PARKED]
        active = _active(group)
        prompt_blocks_end = group.num_prompt_tokens // self.bm.block_size * self.bm.block_size
        if active and all(s.num_computed_tokens < prompt_blocks_end for s in active):
            return
        if not active:  # every active candidate finished first: a new leader
            parked = parked[:1]
        for seq in parked:
            if self.bm.allocate(seq) is None:
                return
            seq.status = SequenceStatus.RUNNING

    # ------------------------------------------------------------ after a step
    def mark_computed(self, out: SchedulerOutput) -> None:
        """The step ran: advance each sequence and register its newly full blocks."""
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            self.bm.commit_computed(item.seq)


def _active(group: SequenceGroup) -> list[Sequence]:
    """The group's candidates that hold blocks (not finished, swapped out or parked)."""
    return [s for s in group.seqs if s.status is SequenceStatus.RUNNING]


def _has_parked(group: SequenceGroup) -> bool:
    """Whether some candidate of a running group still waits for its blocks (never so
    with one sequence, the common case, checked first: it is the leader)."""
    return len(group.seqs) > 1 and any(s.status is SequenceStatus.PARKED for s in group.seqs)

"""Parked candidates: a request with several candidates that was preempted by recompute
comes back leader first, the others parked (holding no blocks) until the shared prompt
is in the prefix cache again.

Allocated together, each candidate would recompute the shared prompt into blocks of its
own (none is in the cache until computed), needing far more room than the request held:
it might never fit again. So they wait until an active candidate has computed the
prompt's full blocks, then find them in the prefix cache.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.sequence import Request, Sequence, SequenceStatus


def active(request: Request) -> list[Sequence]:
    """The request's candidates that hold blocks (not finished, swapped out or parked)."""
    return [s for s in request.seqs if s.status is SequenceStatus.RUNNING]


def has_parked(request: Request) -> bool:
    """Whether some candidate of a running request still waits for its blocks (never so
    with one sequence, the common case, checked first: it is the leader)."""
    return len(request.seqs) > 1 and any(s.status is SequenceStatus.PARKED for s in request.seqs)


def unpark(request: Request, block_size: int, allocate: Callable[[Sequence], bool]) -> None:
    """Give blocks to ``request``'s parked candidates once an active one has computed
    the prompt's full blocks (or none is active any more). ``allocate``: the scheduler's,
    which starts a sequence after its prefix hit; False when there is no room."""
    if not has_parked(request):
        return
    parked = [s for s in request.seqs if s.status is SequenceStatus.PARKED]
    running = active(request)
    prompt_blocks_end = request.num_prompt_tokens // block_size * block_size
    if running and all(s.num_computed_tokens < prompt_blocks_end for s in running):
        return
    if not running:  # every active candidate finished first: a new leader
        parked = parked[:1]
    for seq in parked:
        if not allocate(seq):
            return
        seq.status = SequenceStatus.RUNNING

"""What the scheduler does around the KV cache, for the tests that drive the KV cache
without one: a sequence starts after the prefix hit its allocation found
(``allocate``), a forked one where its parent is (``fork``), and one freed to be
recomputed starts over from nothing (``restart``); and the admission step both KV state
machines (test_kv_state_machine.py, test_state_machine_hybrid.py) take: allocate, wait
for the disk reads, and on a failed read free and allocate again (the bad file now a
miss); then the prompt's prefill, step by step, where asked."""

from __future__ import annotations

from collections.abc import Callable

from engine.core.disk_loads import LoadState
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.sequence import Sequence


def allocate(kv: KVCacheManager, seq: Sequence) -> int | None:
    """``kv.allocate(seq)`` with its hit applied as the scheduler applies it; the tokens
    of the hit, or None when there was no room."""
    hit = kv.allocate(seq)
    if hit is None:
        return None
    seq.num_computed_tokens = hit.num_tokens
    seq.num_disk_tokens = hit.num_disk_tokens
    return hit.num_tokens


def fork(kv: KVCacheManager, parent: Sequence, child: Sequence) -> None:
    """``kv.fork``, the child starting where its parent is, as the scheduler starts it."""
    kv.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens


def restart(kv: KVCacheManager, seq: Sequence) -> None:
    """Free ``seq`` to be recomputed, as the scheduler does."""
    kv.free(seq)
    seq.num_computed_tokens = 0


def admit(kv: KVCacheManager, seq: Sequence, attempt: Callable[[], bool],
          step: Callable[[Sequence], bool], live: list[Sequence], prefill: bool) -> bool:
    """``attempt()`` allocates ``seq`` once with its machine's checks, applying the copies
    and finishing the reads as the runner does: False when ``seq`` was not admitted (no
    room, or the machine gave it up). Returns whether ``seq`` joined ``live``."""
    while True:
        if not attempt():
            return False
        if kv.load_state(seq) is LoadState.FAILED:
            restart(kv, seq)
            continue
        assert kv.load_state(seq) is LoadState.NONE
        break
    live.append(seq)
    while prefill and seq.num_uncomputed_tokens and step(seq):
        pass
    return True

"""The admission step both KV state machines (test_kv_state_machine.py,
test_state_machine_hybrid.py) take as the scheduler does: allocate, wait for the disk
reads, and on a failed read free and allocate again (the bad file now a miss); then the
prompt's prefill, step by step, where asked."""

from __future__ import annotations

from collections.abc import Callable

from engine.core.disk_loads import LoadState
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.sequence import Sequence


def admit(kv: KVCacheManager, seq: Sequence, attempt: Callable[[], bool],
          step: Callable[[Sequence], bool], live: list[Sequence], prefill: bool) -> bool:
    """``attempt()`` allocates ``seq`` once with its machine's checks, applying the copies
    and finishing the reads as the runner does: False when ``seq`` was not admitted (no
    room, or the machine gave it up). Returns whether ``seq`` joined ``live``."""
    while True:
        if not attempt():
            return False
        if kv.load_state(seq) is LoadState.FAILED:
            kv.free(seq)
            continue
        assert kv.load_state(seq) is LoadState.NONE
        break
    live.append(seq)
    while prefill and seq.num_uncomputed_tokens and step(seq):
        pass
    return True

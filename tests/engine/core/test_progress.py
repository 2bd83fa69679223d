"""The scheduler alone moves a sequence's progress (``num_computed_tokens``, and the
``num_disk_tokens`` of its prefix hit): the KV cache reports what it found and leaves
the sequence as it was; the scheduler starts a sequence after its hit, advances it after
each step, keeps it across a swap and starts it over when it is freed to be recomputed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import engine.core
from engine.core.kv_cache_manager import KVCacheManager, KVGroupSpec
from engine.core.kv_protocol import PrefixHit
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceStatus
from engine.sampling_params import SamplingParams

CORE = Path(engine.core.__file__).parent
OWNER = CORE / "scheduler.py"
PROGRESS = ("num_computed_tokens", "num_disk_tokens")


def progress_writes(source: str) -> list[int]:
    """Lines that set a progress field of some object: an attribute target of an
    assignment (plain, augmented, annotated, unpacked), a ``setattr`` naming it, or a
    keyword of ``replace`` (``dataclasses.replace``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Call):
            named = [a for a in node.args[1:2] if isinstance(a, ast.Constant)]
            if (isinstance(node.func, ast.Name) and node.func.id == "setattr"
                    and any(a.value in PROGRESS for a in named)):
                lines.append(node.lineno)
            if isinstance(node.func, ast.Name | ast.Attribute) and ast.unparse(
                    node.func).endswith("replace"):
                lines += [kw.value.lineno for kw in node.keywords if kw.arg in PROGRESS]
        lines += [t.lineno for target in targets for t in ast.walk(target)
                  if isinstance(t, ast.Attribute) and t.attr in PROGRESS]
    return lines


def test_the_scan_sees_every_way_of_setting_progress():
    source = """
seq.num_computed_tokens = 0
a.b.num_computed_tokens += 1
x, seq.num_disk_tokens = 1, 2
seq.num_computed_tokens: int = 3
setattr(seq, "num_computed_tokens", 4)
replace(seq, num_disk_tokens=5)
num_computed_tokens = seq.num_computed_tokens  # a read and a local: no write
Metrics(num_disk_tokens=seq.num_disk_tokens)  # another object's field
"""
    assert progress_writes(source) == [2, 3, 4, 5, 6, 7]


def test_only_the_scheduler_sets_a_sequences_progress():
    writers = {path.name: lines for path in sorted(CORE.rglob("*.py")) if path != OWNER
               if (lines := progress_writes(path.read_text()))}
    assert writers == {}, "the KV cache reports what it found; the scheduler writes"
    assert progress_writes(OWNER.read_text()), "the scan no longer sees the scheduler's writes"


# ---------------------------------------------------------------- the KV cache reports
def one_kind(num_blocks: int = 8, num_host_blocks: int = 0) -> KVCacheManager:
    return KVCacheManager.build([KVGroupSpec((0,))], [num_blocks], 4,
                                num_host_blocks=num_host_blocks)


def computed(kv: KVCacheManager, seq: Sequence) -> None:
    """What the scheduler does after a step that computed all of ``seq``."""
    seq.num_computed_tokens = seq.num_tokens
    kv.commit_computed(seq)


def test_allocate_returns_the_hit_it_found_and_leaves_the_sequence_alone():
    kv = one_kind()
    first = Sequence(0, "a", 0, list(range(1, 11)), 10)
    assert kv.allocate(first) == PrefixHit(0, 0)
    assert first.num_computed_tokens == 0
    computed(kv, first)
    kv.free(first)
    assert first.num_computed_tokens == 10  # freeing is no reset: the scheduler's call
    # Two full blocks and the partial block's two tokens (8, 9 -> ids 9, 10) are found.
    second = Sequence(1, "b", 0, list(range(1, 13)), 12)
    second.num_computed_tokens = 5  # whatever it was: allocate does not touch it
    assert kv.allocate(second) == PrefixHit(10, 0)
    assert second.num_computed_tokens == 5 and second.num_disk_tokens == 0
    assert kv.prefix_hit_tokens == 10


def test_fork_swap_and_preload_leave_progress_alone():
    kv = one_kind(num_host_blocks=8)
    parent = Sequence(0, "a", 0, [1, 2, 3, 4, 5, 6], 6)
    kv.allocate(parent)
    computed(kv, parent)
    child = Sequence(1, "a", 1, list(parent.token_ids), 6)
    kv.fork(parent, child)
    assert child.num_computed_tokens == 0  # the scheduler starts it where it belongs
    kv.swap_out([parent])
    assert parent.num_computed_tokens == 6
    kv.swap_in([parent])
    assert parent.num_computed_tokens == 6
    ahead = Sequence(2, "preload", 0, [1, 2, 3, 4, 5, 6, 7], 7)
    kv.preload(ahead)
    assert ahead.num_computed_tokens == 0


# ---------------------------------------------------------- the scheduler applies it
def reported(kv: KVCacheManager) -> list[tuple[Sequence, PrefixHit | None]]:
    """Every (sequence, hit) ``kv.allocate`` returns from now on."""
    found: list[tuple[Sequence, PrefixHit | None]] = []
    allocate = kv.allocate

    def spy(seq: Sequence) -> PrefixHit | None:
        hit = allocate(seq)
        found.append((seq, hit))
        return hit

    kv.allocate = spy  # type: ignore[method-assign]
    return found


def step(sched: Scheduler):
    out = sched.schedule()
    sched.mark_computed(out)
    for item in out.scheduled:
        if item.samples:
            item.seq.append_token(7)
    return out


def test_the_scheduler_starts_a_sequence_after_the_reported_hit():
    kv = one_kind()
    sched = Scheduler(kv)
    params = SamplingParams(max_tokens=1, temperature=0)
    a = sched.add_request("a", list(range(1, 11)), params)
    step(sched)
    sched.finish_seq(a.seqs[0], "length")  # its partial last block stays cached
    sched.remove_finished()
    found = reported(kv)
    b = sched.add_request("b", list(range(1, 13)), params)
    out = sched.schedule()
    [(seq, hit)] = found
    assert seq is b.seqs[0] and hit == PrefixHit(10, 0)
    assert seq.num_computed_tokens == 10 and b.num_cached_tokens == 10
    [item] = out.scheduled
    assert (item.seq, item.num_new_tokens) == (seq, 2)


@pytest.mark.parametrize("host", [0, 4])
def test_preemption_restarts_a_recompute_and_keeps_a_swap(host: int):
    """Two requests fill the pool's 4 blocks; the first one's next block preempts the
    second: swapped (its progress kept) with a host pool, else freed to recompute (its
    progress reset), then admitted again after the hit it gets then."""
    kv = one_kind(num_blocks=4, num_host_blocks=host)
    sched = Scheduler(kv)
    params = SamplingParams(max_tokens=8, temperature=0)
    sched.add_request("a", list(range(1, 8)), params)
    b = sched.add_request("b", list(range(101, 108)), params).seqs[0]
    step(sched)  # both prompts
    step(sched)  # a decode each: 8 computed, 2 blocks full
    found = reported(kv)
    out = step(sched)
    assert out.preempted == ["b"]
    if host:
        assert b.status is SequenceStatus.SWAPPED and b.num_computed_tokens == 8
        return
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0
    sched.abort("a")  # room for b
    out = sched.schedule()
    # Its first block is still cached; the second went to a for its third.
    [(seq, hit)] = found
    assert seq is b and hit == PrefixHit(4, 0) and b.status is SequenceStatus.RUNNING
    assert b.num_computed_tokens == 4
    [item] = out.scheduled
    assert (item.seq, item.num_new_tokens) == (b, b.num_tokens - 4)
